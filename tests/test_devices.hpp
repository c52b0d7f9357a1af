// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The device tags every device-generic test runs on: TEST_CASE_TEMPLATE(name, D,
// DEPOT_TEST_DEVICES). The host backend always; the GPU backend of this build as well.
#include <depot/config.hpp>
#include <depot/hal/device.hpp>

#include <cstdint>
#include <cstdio>

#if DEPOT_HAS_CUDA
#define DEPOT_TEST_DEVICES depot::host, depot::cuda
#elif DEPOT_HAS_HIP
#define DEPOT_TEST_DEVICES depot::host, depot::hip
#else
#define DEPOT_TEST_DEVICES depot::host
#endif

namespace depot::test {

// Fixed seeds for randomised tests; printed so that a failure can be replayed.
inline std::uint64_t seed(const char* test_name, std::uint64_t value)
{
  std::printf("[seed] %s: %llu\n", test_name, static_cast<unsigned long long>(value));
  return value;
}

}  // namespace depot::test
