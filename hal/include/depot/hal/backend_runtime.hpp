// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_properties.hpp>
#include <depot/hal/ipc_memory_handle.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/native_handle.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace depot::hal {

// The operations every backend provides, as static functions of one class. All are
// thread-safe. Device indices are checked (depot::invalid_argument); failures throw
// depot::error, failed allocations depot::out_of_memory; destroy/free functions are
// noexcept. Asynchronous functions are ordered on the stream they take. allocate_async is
// the backend's own stream-ordered allocator (cudaMallocAsync / hipMallocAsync; the heap on
// the host), kept as the baseline the caching allocator is measured against.
//
// Interprocess sharing: has_ipc says whether the backend can share device memory with
// another process; ipc_export gives the handle of an allocation made by allocate() (its
// start), ipc_open maps one exported by another process (to the allocation's start) and
// ipc_close unmaps it. Without has_ipc they throw depot::error saying so.
//
// Virtual memory (the caching allocator's expandable segments): vm_page(d) is the size and
// alignment in which memory is mapped, 0 when device d cannot map memory into a reserved
// address range. vm_reserve reserves n bytes of addresses (a multiple of vm_page; nothing
// mapped, nothing accessible); vm_map maps n bytes of new memory at an address inside a
// reservation, readable and writable by device d, and returns the handle vm_unmap takes
// (depot::out_of_memory when the device has no room, nothing mapped); vm_unmap unmaps and
// frees exactly one vm_map's range; vm_release gives back a reservation with nothing mapped.
// vm_map_pages maps `count` pages of `page` bytes from an address, each its own memory (one
// vm_unmap each, with handles[i]), at once: all of them, or none and the error.
// Sharing mapped pages (has_ipc backends): vm_export gives a new file descriptor of this
// process for one vm_map's memory (the caller closes it); vm_import maps `count` pages whose
// descriptors (this process's, still the caller's to close) are given, contiguously at new
// addresses, readable and writable by d, keeping the memory alive until vm_close_import
// unmaps them (`n` = count * page bytes).
//
// Graphs of captured work: begin_capture starts capturing a stream in global mode (work
// queued there is recorded, not run; other threads may not make unsafe calls meanwhile);
// end_capture ends it and returns the instantiated graph (depot::error when the capture was
// invalidated); launch_graph runs one on a stream, destroy_graph destroys it;
// stream_capturing says whether a capture is under way on a stream. Without graphs (the
// host) the first three throw depot::error "not_supported" and stream_capturing is false.
template <class R>
concept backend_runtime = requires(void* p, const void* cp, std::size_t n, int d, native_stream s,
                                   native_event e, native_graph g, bool b, const ipc_memory_handle& h,
                                   std::uint64_t u, std::uint64_t* us, const int* fds) {
  { R::has_ipc } -> std::convertible_to<bool>;
  { R::ipc_export(p, d) } -> std::same_as<ipc_memory_handle>;
  { R::ipc_open(h, d) } -> std::same_as<void*>;
  { R::ipc_close(p, d) } noexcept -> std::same_as<void>;
  { R::vm_page(d) } -> std::same_as<std::size_t>;
  { R::vm_reserve(n, d) } -> std::same_as<void*>;
  { R::vm_map(p, n, d) } -> std::same_as<std::uint64_t>;
  { R::vm_unmap(p, n, u, d) } noexcept -> std::same_as<void>;
  { R::vm_map_pages(p, n, n, us, d) } -> std::same_as<void>;
  { R::vm_release(p, n, d) } noexcept -> std::same_as<void>;
  { R::vm_export(u, d) } -> std::same_as<int>;
  { R::vm_import(fds, n, n, d) } -> std::same_as<void*>;
  { R::vm_close_import(p, n, n, d) } noexcept -> std::same_as<void>;
  { R::device_count() } -> std::same_as<int>;
  { R::current_device() } -> std::same_as<int>;
  { R::set_device(d) } -> std::same_as<void>;
  { R::check_device(d) } -> std::same_as<void>;
  { R::properties(d) } -> std::same_as<device_properties>;
  { R::memory(d) } -> std::same_as<memory_info>;
  { R::allocate(n, d) } -> std::same_as<void*>;
  { R::deallocate(p, d) } noexcept -> std::same_as<void>;
  { R::allocate_async(n, d, s) } -> std::same_as<void*>;
  { R::deallocate_async(p, d, s) } noexcept -> std::same_as<void>;
  { R::set_async_release_threshold(d, n) } -> std::same_as<void>;
  { R::allocate_pinned(n) } -> std::same_as<void*>;
  { R::deallocate_pinned(p) } noexcept -> std::same_as<void>;
  { R::is_pinned(p) } noexcept -> std::same_as<bool>;
  { R::copy(p, cp, n) } -> std::same_as<void>;
  { R::copy_async(p, cp, n, s) } -> std::same_as<void>;
  { R::copy_peer_async(p, d, cp, d, n, s) } -> std::same_as<void>;
  { R::set_async(p, d, n, s) } -> std::same_as<void>;
  { R::can_access_peer(d, d) } -> std::same_as<bool>;
  { R::enable_peer_access(d, d) } -> std::same_as<void>;
  { R::create_stream(d) } -> std::same_as<native_stream>;
  { R::destroy_stream(s, d) } noexcept -> std::same_as<void>;
  { R::synchronize_stream(s) } -> std::same_as<void>;
  { R::query_stream(s) } -> std::same_as<bool>;
  { R::create_event(d, b) } -> std::same_as<native_event>;
  { R::destroy_event(e, d) } noexcept -> std::same_as<void>;
  { R::record_event(e, s) } -> std::same_as<void>;
  { R::query_event(e) } -> std::same_as<bool>;
  { R::synchronize_event(e) } -> std::same_as<void>;
  { R::wait_event(s, e) } -> std::same_as<void>;
  { R::elapsed_ms(e, e) } -> std::same_as<float>;
  { R::begin_capture(s) } -> std::same_as<void>;
  { R::end_capture(s) } -> std::same_as<native_graph>;
  { R::launch_graph(g, s) } -> std::same_as<void>;
  { R::destroy_graph(g) } noexcept -> std::same_as<void>;
  { R::stream_capturing(s) } -> std::same_as<bool>;
  { R::synchronize(d) } -> std::same_as<void>;
};

}  // namespace depot::hal
