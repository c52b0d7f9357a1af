// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Internal to ops/: the Kokkos spaces each device tag names (the tags declare `kokkos`,
// this defines it), and the execution-space instance that runs on a depot stream. Works
// with Kokkos 3.4 and newer (HIP moved out of Kokkos::Experimental in 4.0).
#include <Kokkos_Core.hpp>

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>

#if DEPOT_HAS_CUDA && !defined(KOKKOS_ENABLE_CUDA)
#error "depot was configured with -Dgpu=cuda but this Kokkos has no CUDA backend"
#endif
#if DEPOT_HAS_HIP && !defined(KOKKOS_ENABLE_HIP)
#error "depot was configured with -Dgpu=hip but this Kokkos has no HIP backend"
#endif

namespace depot::ops::detail {
#if defined(KOKKOS_ENABLE_HIP)
#if KOKKOS_VERSION >= 40000
using kokkos_hip = Kokkos::HIP;
using kokkos_hip_space = Kokkos::HIPSpace;
#else
using kokkos_hip = Kokkos::Experimental::HIP;
using kokkos_hip_space = Kokkos::Experimental::HIPSpace;
#endif
#endif
}  // namespace depot::ops::detail

struct depot::host::kokkos {
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using memory_space = Kokkos::HostSpace;
  // Host streams complete work at once; the default instance serves them all.
  static execution_space instance(stream_ref<host>) { return execution_space{}; }
};

#if DEPOT_HAS_CUDA
struct depot::cuda::kokkos {
  using execution_space = Kokkos::Cuda;
  using memory_space = Kokkos::CudaSpace;
  static execution_space instance(stream_ref<cuda> s)
  {
    return s.is_default() ? execution_space{}
                          : execution_space{static_cast<cudaStream_t>(s.native())};
  }
};
#endif

#if DEPOT_HAS_HIP
struct depot::hip::kokkos {
  using execution_space = depot::ops::detail::kokkos_hip;
  using memory_space = depot::ops::detail::kokkos_hip_space;
  static execution_space instance(stream_ref<hip> s)
  {
    return s.is_default() ? execution_space{}
                          : execution_space{static_cast<hipStream_t>(s.native())};
  }
};
#endif
