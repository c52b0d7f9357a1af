// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The CUDA name table for the shared GPU implementation. The only header that includes
// CUDA's runtime API; included only by files in hal/cuda/.
#include <cuda.h>  // driver types of the virtual-memory calls (taken through cudart's entry points)
#include <cuda_runtime_api.h>

#include <depot/hal/device_kind.hpp>

#include "../gpu/gpu_api_table.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

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
  // Virtual memory (expandable segments): the driver's cuMem* calls, found through cudart's
  // entry-point query so the library does not link libcuda itself. The driver's error
  // numbers of these calls (invalid value, out of memory, not supported, ...) are the
  // runtime's, so they pass through as error_t.
  using vm_handle_t = CUmemGenericAllocationHandle;
  struct vm_driver {
    decltype(&::cuDeviceGetAttribute) attribute = nullptr;
    decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&::cuMemAddressReserve) reserve = nullptr;
    decltype(&::cuMemAddressFree) free_address = nullptr;
    decltype(&::cuMemCreate) create = nullptr;
    decltype(&::cuMemRelease) release = nullptr;
    decltype(&::cuMemMap) map = nullptr;
    decltype(&::cuMemUnmap) unmap = nullptr;
    decltype(&::cuMemSetAccess) set_access = nullptr;
    decltype(&::cuMemExportToShareableHandle) export_fd = nullptr;  // optional: sharing pages
    decltype(&::cuMemImportFromShareableHandle) import_fd = nullptr;
    bool found = false;
  };
  static const vm_driver& driver()
  {
    static const vm_driver d = [] {
      vm_driver v;
      const auto get = [](const char* name, auto& fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult r{};
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &r);
#else
        const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &r);
#endif
        if (e != cudaSuccess || r != cudaDriverEntryPointSuccess || p == nullptr) {
          (void)cudaGetLastError();
          return false;
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        return true;
      };
      v.found = get("cuDeviceGetAttribute", v.attribute) && get("cuMemGetAllocationGranularity", v.granularity) &&
                get("cuMemAddressReserve", v.reserve) && get("cuMemAddressFree", v.free_address) &&
                get("cuMemCreate", v.create) && get("cuMemRelease", v.release) && get("cuMemMap", v.map) &&
                get("cuMemUnmap", v.unmap) && get("cuMemSetAccess", v.set_access);
      if (!get("cuMemExportToShareableHandle", v.export_fd) || !get("cuMemImportFromShareableHandle", v.import_fd)) {
        v.export_fd = nullptr;
        v.import_fd = nullptr;
      }
      return v;
    }();
    return d;
  }
  static CUmemAllocationProp vm_prop(int device)
  {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    return p;
  }
  static error_t vm_granularity(std::size_t* g, int device)
  {
    const vm_driver& d = driver();
    if (!d.found) return cudaErrorNotSupported;
    int supported = 0;
    if (auto r = d.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
        r != CUDA_SUCCESS) {
      return static_cast<error_t>(r);
    }
    if (supported == 0) return cudaErrorNotSupported;
    const CUmemAllocationProp p = vm_prop(device);
    return static_cast<error_t>(d.granularity(g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  }
  static error_t vm_reserve(void** p, std::size_t n, std::size_t align)
  {
    CUdeviceptr a = 0;
    const CUresult r = driver().reserve(&a, n, align, 0, 0);
    *p = reinterpret_cast<void*>(a);
    return static_cast<error_t>(r);
  }
  static error_t vm_free_address(void* p, std::size_t n)
  {
    return static_cast<error_t>(driver().free_address(reinterpret_cast<CUdeviceptr>(p), n));
  }
  // Pages exportable as POSIX file descriptors or plain (the choice and its remembered
  // fallback: gpu_runtime_impl.hpp); no export entry point counts as not supported.
  static error_t vm_create(vm_handle_t* h, std::size_t n, int device, bool exportable)
  {
    CUmemAllocationProp p = vm_prop(device);
    if (exportable) {
      if (driver().export_fd == nullptr) return cudaErrorNotSupported;
      p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    }
    return static_cast<error_t>(driver().create(h, n, &p, 0));
  }
  static error_t vm_export(int* fd, vm_handle_t h)
  {
    if (driver().export_fd == nullptr) return cudaErrorNotSupported;
    return static_cast<error_t>(driver().export_fd(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
  static error_t vm_import(vm_handle_t* h, int fd)
  {
    if (driver().import_fd == nullptr) return cudaErrorNotSupported;
    return static_cast<error_t>(driver().import_fd(h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  }
  static error_t vm_release_handle(vm_handle_t h) { return static_cast<error_t>(driver().release(h)); }
  static error_t vm_map(void* p, std::size_t n, vm_handle_t h)
  {
    return static_cast<error_t>(driver().map(reinterpret_cast<CUdeviceptr>(p), n, 0, h, 0));
  }
  static error_t vm_unmap(void* p, std::size_t n)
  {
    return static_cast<error_t>(driver().unmap(reinterpret_cast<CUdeviceptr>(p), n));
  }
  static error_t vm_set_access(void* p, std::size_t n, int device)
  {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return static_cast<error_t>(driver().set_access(reinterpret_cast<CUdeviceptr>(p), n, &a, 1));
  }
  static std::uint64_t vm_bits(vm_handle_t h) noexcept { return h; }
  static vm_handle_t vm_handle(std::uint64_t bits) noexcept { return bits; }
  static std::string arch_name(const properties_t& p)
  {
    return "sm_" + std::to_string(p.major * 10 + p.minor);
  }
};

}  // namespace depot::hal
