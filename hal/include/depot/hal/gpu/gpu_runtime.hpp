// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/backend_runtime.hpp>
#include <depot/hal/device_properties.hpp>
#include <depot/hal/ipc_memory_handle.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/native_handle.hpp>

#include <cstddef>
#include <cstdint>

namespace depot::hal {

// The one GPU backend, written once over a name table `Api` (cuda_api or hip_api, each
// defined in its backend's folder, the only place its runtime header is included). All
// functions are thread-safe; allocate/copy/etc. act on the device given, not on whatever
// device the calling thread has current (the thread's current device is restored).
// Failures throw depot::error with the call text and clear the backend's error state.
template <class Api>
class gpu_runtime {
 public:
  static int device_count() noexcept;
  static int current_device();
  static void set_device(int device);
  static void check_device(int device);
  static device_properties properties(int device);
  static memory_info memory(int device);

  static void* allocate(std::size_t bytes, int device);
  static void deallocate(void* ptr, int device) noexcept;
  static void* allocate_async(std::size_t bytes, int device, native_stream stream);
  static void deallocate_async(void* ptr, int device, native_stream stream) noexcept;
  static void set_async_release_threshold(int device, std::size_t bytes);
  static void* allocate_pinned(std::size_t bytes);
  static void deallocate_pinned(void* ptr) noexcept;
  // Whether ptr is page-locked host memory, which the device's copy engines read directly
  // (so an asynchronous copy from it needs no staging). False for null or pageable memory.
  static bool is_pinned(const void* ptr) noexcept;

  // Managed (unified) memory, reachable from the host and from every device (GPU-only; not
  // part of backend_runtime). supports_managed_memory: the device can allocate it at all;
  // concurrent_managed_access: the host may touch it while kernels run (otherwise only
  // after a synchronisation). allocate_managed never asks for more than memory(device)
  // reports free: depot::out_of_memory with both numbers instead, and nothing allocated;
  // depot::invalid_argument on a device without managed memory. prefetch_managed migrates
  // [ptr, ptr + bytes) to `device` (-1: the host) in the order of `stream`.
  static bool supports_managed_memory(int device);
  static bool concurrent_managed_access(int device);
  static void* allocate_managed(std::size_t bytes, int device);
  static void deallocate_managed(void* ptr, int device) noexcept;
  static void prefetch_managed(const void* ptr, std::size_t bytes, int device, native_stream stream);

  static void copy(void* dst, const void* src, std::size_t bytes);
  static void copy_async(void* dst, const void* src, std::size_t bytes, native_stream stream);
  static void copy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                              std::size_t bytes, native_stream stream);
  static void set_async(void* dst, int value, std::size_t bytes, native_stream stream);
  static bool can_access_peer(int device, int peer);
  static void enable_peer_access(int device, int peer);

  static constexpr bool has_ipc = true;
  static ipc_memory_handle ipc_export(void* allocation, int device);
  static void* ipc_open(const ipc_memory_handle& handle, int device);
  static void ipc_close(void* ptr, int device) noexcept;
  // Virtual memory (see backend_runtime): the caching allocator's expandable segments.
  static std::size_t vm_page(int device);
  static void* vm_reserve(std::size_t bytes, int device);
  static std::uint64_t vm_map(void* addr, std::size_t bytes, int device);
  static void vm_unmap(void* addr, std::size_t bytes, std::uint64_t handle, int device) noexcept;
  static void vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles, int device);
  static void vm_release(void* addr, std::size_t bytes, int device) noexcept;
  static int vm_export(std::uint64_t handle, int device);
  static void* vm_import(const int* fds, std::size_t count, std::size_t page, int device);
  static void vm_close_import(void* addr, std::size_t count, std::size_t page, int device) noexcept;

  static native_stream create_stream(int device);
  static void destroy_stream(native_stream stream, int device) noexcept;
  static void synchronize_stream(native_stream stream);
  static bool query_stream(native_stream stream);

  static native_event create_event(int device, bool timing);
  static void destroy_event(native_event event, int device) noexcept;
  static void record_event(native_event event, native_stream stream);
  static bool query_event(native_event event);
  static void synchronize_event(native_event event);
  static void wait_event(native_stream stream, native_event event);
  static float elapsed_ms(native_event start, native_event stop);

  static void begin_capture(native_stream stream);
  static native_graph end_capture(native_stream stream);
  static void launch_graph(native_graph graph, native_stream stream);
  static void destroy_graph(native_graph graph) noexcept;
  static bool stream_capturing(native_stream stream);

  static void synchronize(int device);
};

static_assert(backend_runtime<gpu_runtime<struct cuda_api>>);

// Definitions live in the library, one explicit instantiation per enabled GPU backend.
#if DEPOT_HAS_CUDA
extern template class gpu_runtime<cuda_api>;
#endif
#if DEPOT_HAS_HIP
extern template class gpu_runtime<hip_api>;
#endif

}  // namespace depot::hal
