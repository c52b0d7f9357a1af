// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The CUDA name table for the shared GPU implementation. The only header that includes
// CUDA's runtime API; included only by files in hal/cuda/.
#include <cuda_runtime_api.h>

#include <depot/hal/device_kind.hpp>

#include "../gpu/gpu_api_table.hpp"

#include <cstddef>
#include <string>

namespace depot::hal {

struct cuda_api {
  using properties_t = cudaDeviceProp;
  using attribute_t = cudaDeviceAttr;
  static constexpr device_kind kind = device_kind::cuda;
  static constexpr const char* name = "CUDA";
  static constexpr attribute_t memory_clock_khz = cudaDevAttrMemoryClockRate;
  static constexpr attribute_t memory_bus_bits = cudaDevAttrGlobalMemoryBusWidth;
  static constexpr attribute_t managed_memory = cudaDevAttrManagedMemory;
  static constexpr attribute_t concurrent_managed_access = cudaDevAttrConcurrentManagedAccess;

  DEPOT_GPU_API_TABLE(cuda)

  static error_t malloc_host(void** p, std::size_t n) { return cudaMallocHost(p, n); }
  static error_t free_host(void* p) { return cudaFreeHost(p); }
  // Page-locked host memory (allocated pinned or registered); pageable memory reads false.
  static bool is_page_locked(const void* p)
  {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  // Migrates managed memory to `device` (-1: the host) in the order of `s`. CUDA 13 names
  // the destination with a cudaMemLocation; earlier versions with a device number.
  static error_t prefetch(const void* p, std::size_t n, int device, stream_t s)
  {
#if CUDART_VERSION >= 13000
    cudaMemLocation where{};
    where.type = device < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    where.id = device < 0 ? 0 : device;
    return cudaMemPrefetchAsync(p, n, where, 0, s);
#else
    return cudaMemPrefetchAsync(p, n, device < 0 ? cudaCpuDeviceId : device, s);
#endif
  }
  static std::string arch_name(const properties_t& p)
  {
    return "sm_" + std::to_string(p.major * 10 + p.minor);
  }
};

}  // namespace depot::hal
