// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/backend_runtime.hpp>
#include <depot/hal/device_properties.hpp>
#include <depot/hal/ipc_memory_handle.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/native_handle.hpp>

#include <cstddef>
#include <cstdint>

namespace depot::hal {

// The host backend: one device (index 0), memory from the C++ heap aligned to 512 bytes,
// "pinned" memory is ordinary memory. Streams and events are real objects with identity,
// but work submitted to a stream completes before the call returns, so queries are always
// true and waits return at once. Thread-safe.
class host_runtime {
 public:
  static constexpr std::size_t alignment = 512;

  static int device_count() noexcept { return 1; }
  static int current_device() noexcept { return 0; }
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
  // Whole pages of anonymous memory of their own (mmap), for segments of the caching
  // allocators (device and pinned); unmap_segment gives them back to the system at once
  // (bytes: as mapped). Not the heap: glibc keeps freed heap memory resident, so
  // empty_cache() would lower memory_reserved() and not the process's memory. A segment
  // of segment_alignment bytes or more starts at a multiple of it (a transparent huge
  // page boundary, as CUDA and HIP align large allocations); a smaller one at a page.
  static constexpr std::size_t segment_alignment = std::size_t{2} << 20;
  static void* map_segment(std::size_t bytes, int device);
  static void unmap_segment(void* ptr, std::size_t bytes) noexcept;
  // Always false: the host backend has no page-locked memory apart from other memory (its
  // "asynchronous" copies are synchronous memcpy), so staging code keeps its staged path.
  static bool is_pinned(const void*) noexcept { return false; }

  static void copy(void* dst, const void* src, std::size_t bytes);
  static void copy_async(void* dst, const void* src, std::size_t bytes, native_stream stream);
  static void copy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                              std::size_t bytes, native_stream stream);
  static void set_async(void* dst, int value, std::size_t bytes, native_stream stream);
  static bool can_access_peer(int device, int peer);
  static void enable_peer_access(int device, int peer);

  static constexpr bool has_ipc = false;  // host memory is process-private
  static ipc_memory_handle ipc_export(void* allocation, int device);
  static void* ipc_open(const ipc_memory_handle& handle, int device);
  static void ipc_close(void* ptr, int device) noexcept;
  // Virtual memory (see backend_runtime): 2 MiB pages of
  // anonymous memory, addresses reserved with mmap(PROT_NONE): the caching allocator's expandable segments.
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

static_assert(backend_runtime<host_runtime>);

}  // namespace depot::hal
