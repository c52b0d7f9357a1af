// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The device tags every device-generic test runs on: TEST_CASE_TEMPLATE(name, D,
// DEPOT_TEST_DEVICES). The host backend always; the GPU backend of this build as well.
#include <depot/config.hpp>
#include <depot/hal/device.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

#if DEPOT_HAS_CUDA
#define DEPOT_TEST_DEVICES depot::host, depot::cuda
#elif DEPOT_HAS_HIP
#define DEPOT_TEST_DEVICES depot::host, depot::hip
#else
#define DEPOT_TEST_DEVICES depot::host
#endif

namespace depot::test {

// Fixed seeds for randomised tests; printed so that a failure can be replayed.
// DEPOT_TEST_SEED=N (a decimal or 0x number) gives every randomised test seed N instead,
// to explore beyond the fixed ones; a value that is not a number stops the run, saying so.
inline std::uint64_t seed(const char* test_name, std::uint64_t value)
{
  if (const char* env = std::getenv("DEPOT_TEST_SEED"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 0);
    if (errno != 0 || end == env || *end != '\0' || *env == '-') {
      std::fprintf(stderr, "DEPOT_TEST_SEED='%s' is not a number (valid: 0 to 2^64-1, decimal or 0x hex)\n", env);
      std::exit(2);
    }
    value = v;
  }
  std::printf("[seed] %s: %llu\n", test_name, static_cast<unsigned long long>(value));
  return value;
}

// Waits until `finished` reaches `count` (threads that count themselves out as they end).
// Threads still running after 120 s are deadlocked and cannot be joined: says so on stderr
// and aborts the test run.
inline void wait_or_abort(const std::atomic<int>& finished, int count, const char* what)
{
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (finished.load() < count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (finished.load() < count) {
    std::fprintf(stderr, "%s: %d of %d threads still waiting after 120 s\n", what, count - finished.load(), count);
    std::abort();
  }
}

}  // namespace depot::test
