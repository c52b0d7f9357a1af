// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>

#include <cstdio>

namespace {

// A GPU build run on a machine where its backend sees no device would test nothing of the
// GPU: that is a failure, not a pass.
template <depot::device D>
bool gpu_present()
{
  const int n = depot::device_count<D>();
  std::printf("[devices] %.*s: %d\n", static_cast<int>(D::name.size()), D::name.data(), n);
  if (n > 0) return true;
  std::fprintf(stderr, "depot-tests: this build has the %.*s backend but no %.*s device is "
                       "visible; run on a GPU machine\n",
               static_cast<int>(D::name.size()), D::name.data(),
               static_cast<int>(D::name.size()), D::name.data());
  return false;
}

}  // namespace

int main(int argc, char** argv)
{
  std::printf("[devices] host: %d\n", depot::device_count<depot::host>());
#if DEPOT_HAS_CUDA
  if (!gpu_present<depot::cuda>()) return 2;
#endif
#if DEPOT_HAS_HIP
  if (!gpu_present<depot::hip>()) return 2;
#endif
  doctest::Context context(argc, argv);
  return context.run();
}
