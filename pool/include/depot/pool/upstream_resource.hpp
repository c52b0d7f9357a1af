// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/ipc_memory_handle.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/native_handle.hpp>

#include <cstddef>

namespace depot {

// Where a caching_allocator gets its segments and how it orders work on streams.
// allocate() throws depot::out_of_memory when it cannot; deallocate() never throws.
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

  // A new event recorded on `stream`.
  [[nodiscard]] virtual native_event record_event(native_stream stream) = 0;
  [[nodiscard]] virtual bool event_done(native_event event) = 0;
  virtual void wait_event(native_event event) = 0;  // blocks the host
  // Work queued on `stream` after this waits for `event` (does not block the host).
  virtual void stream_wait(native_stream stream, native_event event) = 0;
  virtual void destroy_event(native_event event) noexcept = 0;
  // Blocks until all work on the device is done (whatever streams it was queued on).
  virtual void synchronize_device() = 0;
  // The interprocess handle of a segment (a pointer allocate() returned). By default, and
  // for upstreams whose memory is process-private, throws depot::error saying so.
  [[nodiscard]] virtual ipc_memory_handle ipc_export(void* segment)
  {
    (void)segment;
    throw error("depot: " + device().to_string() +
                    " caching allocator: this upstream's memory cannot be shared with another "
                    "process (only CUDA and HIP device memory can)",
                "ipc_export", __FILE__, __LINE__, 0, "not_supported");
  }
};

}  // namespace depot
