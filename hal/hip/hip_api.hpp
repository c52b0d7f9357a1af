// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The HIP name table for the shared GPU implementation. The only header that includes
// HIP's runtime API; included only by files in hal/hip/. Compiled by the host compiler
// (no device code), on the AMD platform.
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#include <depot/hal/device_kind.hpp>

#include "../gpu/gpu_api_table.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace depot::hal {

struct hip_api {
  using properties_t = hipDeviceProp_t;
  using attribute_t = hipDeviceAttribute_t;
  static constexpr device_kind kind = device_kind::hip;
  static constexpr const char* name = "HIP";
  static constexpr attribute_t memory_clock_khz = hipDeviceAttributeMemoryClockRate;
  static constexpr attribute_t memory_bus_bits = hipDeviceAttributeMemoryBusWidth;
  static constexpr attribute_t managed_memory = hipDeviceAttributeManagedMemory;
  static constexpr attribute_t concurrent_managed_access = hipDeviceAttributeConcurrentManagedAccess;

  DEPOT_GPU_API_TABLE(hip)

  static error_t malloc_host(void** p, std::size_t n)
  {
    return hipHostMalloc(p, n, hipHostMallocDefault);
  }
  static error_t free_host(void* p) { return hipHostFree(p); }
  // Page-locked host memory (allocated pinned or registered); pageable memory reads false
  // (older HIP reports it as an error, which is cleared). ROCm 6 renamed memoryType to type.
  static bool is_page_locked(const void* p)
  {
    hipPointerAttribute_t a{};
    if (hipPointerGetAttributes(&a, p) != hipSuccess) {
      (void)hipGetLastError();
      return false;
    }
#if HIP_VERSION_MAJOR >= 6
    return a.type == hipMemoryTypeHost;
#else
    return a.memoryType == hipMemoryTypeHost;
#endif
  }
  // Migrates managed memory to `device` (-1: the host) in the order of `s`.
  static error_t prefetch(const void* p, std::size_t n, int device, stream_t s)
  {
    return hipMemPrefetchAsync(p, n, device < 0 ? hipCpuDeviceId : device, s);
  }
  // Virtual memory (expandable segments): HIP's hipMem* virtual-memory calls.
  using vm_handle_t = hipMemGenericAllocationHandle_t;
  static hipMemAllocationProp vm_prop(int device)
  {
    hipMemAllocationProp p{};
    p.type = hipMemAllocationTypePinned;
    p.location.type = hipMemLocationTypeDevice;
    p.location.id = device;
    return p;
  }
  static error_t vm_granularity(std::size_t* g, int device)
  {
    const hipMemAllocationProp p = vm_prop(device);
    return hipMemGetAllocationGranularity(g, &p, hipMemAllocationGranularityMinimum);
  }
  static error_t vm_reserve(void** p, std::size_t n, std::size_t align)
  {
    return hipMemAddressReserve(p, n, align, nullptr, 0);
  }
  static error_t vm_free_address(void* p, std::size_t n) { return hipMemAddressFree(p, n); }
  // Pages exportable as POSIX file descriptors or plain (the choice and its remembered
  // fallback: gpu_runtime_impl.hpp).
  static error_t vm_create(vm_handle_t* h, std::size_t n, int device, bool exportable)
  {
    hipMemAllocationProp p = vm_prop(device);
    if (exportable) p.requestedHandleType = hipMemHandleTypePosixFileDescriptor;
    return hipMemCreate(h, n, &p, 0);
  }
  static error_t vm_export(int* fd, vm_handle_t h)
  {
    return hipMemExportToShareableHandle(fd, h, hipMemHandleTypePosixFileDescriptor, 0);
  }
  static error_t vm_import(vm_handle_t* h, int fd)
  {
    return hipMemImportFromShareableHandle(h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                           hipMemHandleTypePosixFileDescriptor);
  }
  static error_t vm_release_handle(vm_handle_t h) { return hipMemRelease(h); }
  static error_t vm_map(void* p, std::size_t n, vm_handle_t h) { return hipMemMap(p, n, 0, h, 0); }
  static error_t vm_unmap(void* p, std::size_t n) { return hipMemUnmap(p, n); }
  static error_t vm_set_access(void* p, std::size_t n, int device)
  {
    hipMemAccessDesc a{};
    a.location.type = hipMemLocationTypeDevice;
    a.location.id = device;
    a.flags = hipMemAccessFlagsProtReadWrite;
    return hipMemSetAccess(p, n, &a, 1);
  }
  static std::uint64_t vm_bits(vm_handle_t h) noexcept { return reinterpret_cast<std::uintptr_t>(h); }
  static vm_handle_t vm_handle(std::uint64_t bits) noexcept
  {
    return reinterpret_cast<vm_handle_t>(static_cast<std::uintptr_t>(bits));
  }
  // "gfx90a:sramecc+:xnack-" -> "gfx90a"
  static std::string arch_name(const properties_t& p)
  {
    std::string arch{p.gcnArchName, ::strnlen(p.gcnArchName, sizeof p.gcnArchName)};
    return arch.substr(0, arch.find(':'));
  }
};

}  // namespace depot::hal
