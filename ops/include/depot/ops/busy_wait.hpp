// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>

#include <chrono>

namespace depot::ops {

// busy_wait<D>(duration, stream): a one-thread Kokkos kernel ("depot::busy_wait") that spins
// for `duration` in the order of `stream`: a stand-in for compute in benchmarks and tests.
// GPUs time it with the device's wall clock (CUDA %globaltimer, HIP wall_clock64); the host
// backend spins on std::chrono::steady_clock in the calling thread and returns when done.
// Otherwise returns once the kernel is queued. A duration outside [0, 60 s] is
// depot::invalid_argument.
template <device D>
void busy_wait(std::chrono::nanoseconds duration, stream_ref<D> stream = {});

extern template void busy_wait<host>(std::chrono::nanoseconds, stream_ref<host>);
#if DEPOT_HAS_CUDA
extern template void busy_wait<cuda>(std::chrono::nanoseconds, stream_ref<cuda>);
#endif
#if DEPOT_HAS_HIP
extern template void busy_wait<hip>(std::chrono::nanoseconds, stream_ref<hip>);
#endif

}  // namespace depot::ops
