// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/ipc_memory_handle.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/native_handle.hpp>

#include <cstddef>
#include <cstdint>

namespace depot {

// Where a caching_allocator gets its segments and how it orders work on streams.
// allocate() throws depot::out_of_memory when it cannot; deallocate(ptr, bytes), given the
// size that allocate() was given (the caching allocator always passes it), never throws and
// returns only once no queued work can touch the memory (cudaFree and hipFree wait for the
// device); vm_unmap() need not wait: the allocator waits first for the work that may use
// the pages.
// The event functions make a block freed on one stream safe to reuse on another.
// Implementations must be thread-safe.
class upstream_resource {
 public:
  upstream_resource() = default;
  upstream_resource(const upstream_resource&) = delete;
  upstream_resource& operator=(const upstream_resource&) = delete;
  virtual ~upstream_resource() = default;

  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual memory_info memory() = 0;
  [[nodiscard]] virtual device_id device() const noexcept = 0;
  // Whose streams order this memory's work: a backend and device (index -1: any device of
  // the backend, as for pinned host memory that every GPU's streams use). The events below
  // take those streams; stream_registry's closings of other backends are not this one's.
  [[nodiscard]] virtual device_id stream_device() const noexcept { return device(); }

  // A new event recorded on `stream`.
  [[nodiscard]] virtual native_event record_event(native_stream stream) = 0;
  [[nodiscard]] virtual bool event_done(native_event event) = 0;
  virtual void wait_event(native_event event) = 0;  // blocks the host
  // Work queued on `stream` after this waits for `event` (does not block the host).
  virtual void stream_wait(native_stream stream, native_event event) = 0;
  virtual void destroy_event(native_event event) noexcept = 0;
  // Blocks until all work on the device is done (whatever streams it was queued on).
  virtual void synchronize_device() = 0;
  // Whether all work queued on `stream` so far is done, without blocking (a live stream
  // only; asked with no graph capture under way). false: still running, or not known (the
  // default, for an upstream that cannot tell: the allocator then orders by an event).
  [[nodiscard]] virtual bool stream_done(native_stream stream)
  {
    (void)stream;
    return false;
  }
  // Virtual memory, for expandable segments (allocator_config::expandable_segments).
  // vm_page(): the size and alignment in which memory is mapped; 0 (the default) when this
  // upstream cannot map memory into reserved addresses, and the allocator then makes
  // ordinary segments. vm_reserve: addresses only (a multiple of vm_page). vm_map: `bytes`
  // of new memory at `addr` inside a reservation, the handle vm_unmap takes; throws
  // depot::out_of_memory when there is no room (nothing mapped). vm_unmap undoes exactly one
  // vm_map; vm_release gives back a reservation with nothing mapped in it.
  [[nodiscard]] virtual std::size_t vm_page() { return 0; }
  [[nodiscard]] virtual void* vm_reserve(std::size_t bytes)
  {
    (void)bytes;
    throw_not_supported("vm_reserve", k_no_vm);
  }
  [[nodiscard]] virtual std::uint64_t vm_map(void* addr, std::size_t bytes)
  {
    (void)addr;
    (void)bytes;
    throw_not_supported("vm_map", k_no_vm);
  }
  // `count` pages of `page` bytes from addr, each its own vm_map (handles[i] for its
  // vm_unmap), all or none: by default one vm_map per page, undone on an error.
  virtual void vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles)
  {
    auto* const b = static_cast<unsigned char*>(addr);
    std::size_t done = 0;
    try {
      for (; done < count; ++done) handles[done] = vm_map(b + done * page, page);
    } catch (...) {
      while (done-- > 0) vm_unmap(b + done * page, page, handles[done]);
      throw;
    }
  }
  virtual void vm_unmap(void* addr, std::size_t bytes, std::uint64_t handle) noexcept
  {
    (void)addr;
    (void)bytes;
    (void)handle;
  }
  virtual void vm_release(void* addr, std::size_t bytes) noexcept
  {
    (void)addr;
    (void)bytes;
  }
  // A new file descriptor of this process for one vm_map's memory (its handle), which another
  // process can take (pidfd_getfd) and map; the caller closes it. By default, and for
  // upstreams whose memory is process-private, throws depot::error saying so.
  [[nodiscard]] virtual int vm_export(std::uint64_t handle)
  {
    (void)handle;
    throw_not_supported("vm_export", "this upstream's memory cannot be shared with another process (only "
                                     "CUDA and HIP device memory can)");
  }
  // The interprocess handle of a segment (a pointer allocate() returned). By default, and
  // for upstreams whose memory is process-private, throws depot::error saying so.
  [[nodiscard]] virtual ipc_memory_handle ipc_export(void* segment)
  {
    (void)segment;
    throw_not_supported("ipc_export", "this upstream's memory cannot be shared with another process (only "
                                      "CUDA and HIP device memory can)");
  }

  // fork() support (the allocator's atfork handlers): hold every lock of this upstream that
  // an allocator's operation may take, after the allocator's own; give them back in the
  // parent, make them anew in the child (one thread: the forking one). An upstream with
  // no lock of its own leaves both as they are; one whose locks are leaves (taken under no
  // other) can make them detail::fork_leaf_mutex instead, as depot's own upstreams do.
  virtual void fork_hold() noexcept {}
  virtual void fork_release(bool child) noexcept { (void)child; }

 private:
  static constexpr const char* k_no_vm =
      "this upstream cannot map memory into reserved addresses (no expandable segments)";
  // depot::error "not_supported" naming this upstream's device and what it cannot do.
  [[noreturn]] void throw_not_supported(const char* call, const char* what)
  {
    throw error("depot: " + device().to_string() + " caching allocator: " + what, call, __FILE__, __LINE__, 0,
                "not_supported");
  }
};

}  // namespace depot
