// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/allocator_config.hpp>
#include <depot/pool/detail/allocator_core.hpp>
#include <depot/pool/device_upstream.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/memory_stats.hpp>
#include <depot/pool/oom_handler.hpp>
#include <depot/pool/trace_event.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace depot {

// A stream-ordered caching allocator for one device of backend D. Requests are rounded to
// 512 bytes; requests up to 1 MiB come from a small pool of 2 MiB segments, larger ones from
// a large pool; free blocks are split and coalesced; finding a block is O(1).
// Stream semantics: memory freed on stream S is reusable at once by later work on S; use on
// other streams is declared with record_stream() and delays reuse until their events
// complete. Thread-safe; threads on different streams do not share a lock on a cache hit;
// a fork() while threads are inside leaves the child (one thread) a whole allocator, its
// locks free (atfork handlers hold them across the fork). Owns its segments and returns
// them to the upstream in empty_cache() and on destruction.
template <device D>
class caching_allocator {
 public:
  // Device memory of `device`, configured by `config` (by default from DEPOT_ALLOC_CONF;
  // a bad setting throws depot::invalid_argument here).
  explicit caching_allocator(int device = 0,
                             allocator_config config = allocator_config::from_environment())
      : caching_allocator(std::make_unique<device_upstream<D>>(device), config)
  {
  }
  // Any upstream (the pinned host pool, a limiting upstream in tests).
  caching_allocator(std::unique_ptr<upstream_resource> upstream, allocator_config config)
      : core_{std::move(upstream), config, is_gpu_v<D>}
  {
  }

  // A block of at least `bytes` bytes, 512-byte aligned, usable on `stream` in stream order.
  // bytes == 0 gives nullptr. Throws depot::out_of_memory after waiting for pending frees,
  // releasing the cache and asking the out-of-memory handler, if one is set.
  [[nodiscard]] void* allocate(std::size_t bytes, stream_ref<D> stream = {})
  {
    return core_.allocate(bytes, stream.native());
  }
  // count elements of element_size bytes; the product is checked (no wrap-around).
  [[nodiscard]] void* allocate(std::size_t count, std::size_t element_size, stream_ref<D> stream)
  {
    DEPOT_EXPECTS(element_size == 0 || count <= std::numeric_limits<std::size_t>::max() / element_size,
                  "depot: allocation of " + std::to_string(count) + " elements of " +
                      std::to_string(element_size) + " bytes overflows size_t");
    return core_.allocate(count * element_size, stream.native());
  }
  // Frees on the stream the block was allocated on. nullptr is a no-op; a pointer that is
  // not live here (double free, foreign) throws depot::invalid_argument and changes nothing.
  void deallocate(void* ptr) { core_.deallocate(ptr, nullptr, false, 0); }
  // Frees in the order of `stream` (if it is not the allocation's, as if record_stream).
  void deallocate(void* ptr, stream_ref<D> stream) { core_.deallocate(ptr, stream.native(), true, 0); }
  // As above, checking `bytes` against the size that was allocated.
  void deallocate(void* ptr, std::size_t bytes, stream_ref<D> stream)
  {
    core_.deallocate(ptr, stream.native(), true, bytes == 0 ? 0 : bytes);
  }
  // Declares that work on `stream` uses the block; its reuse waits for that work.
  void record_stream(void* ptr, stream_ref<D> stream) { core_.record_stream(ptr, stream.native()); }
  // Graph capture (CUDA and HIP graphs; captured_graph<D> does all of this for one graph).
  // begin_capture: work queued on `stream` from now on is captured (call it just before the
  // backend's capture begins). Allocations on `stream` then come from a capture pool: a new
  // one (pool 0), or `pool`, an earlier begin_capture's result not yet released, each call
  // one more use of it. Its memory serves only captures into it until its last use is given
  // back, so a replay never finds it reused. While any capture is under way, no allocator
  // of backend D in the process queries or waits for an event, synchronises, frees memory
  // or takes memory over from another stream (CUDA's global capture mode forbids these on
  // every thread), and begin_capture returns once they finished what they had under way:
  // frees that other streams' work must wait for get their events when the last capture
  // ends, empty_cache() throws, and a request the upstream refuses throws out_of_memory
  // at once. Memory a graph uses that was
  // allocated outside its capture is the caller's to keep allocated while it may run.
  // depot::invalid_argument, changing nothing, for a stream that is capturing already or
  // a pool that is not live or is capturing.
  [[nodiscard]] std::uint64_t begin_capture(stream_ref<D> stream, std::uint64_t pool = 0)
  {
    return core_.begin_capture(stream.native(), pool);
  }
  // After the backend's capture on `stream` ended: its allocations come from the stream's
  // own cache again; the pool keeps the blocks of the capture (freed ones too).
  void end_capture(stream_ref<D> stream) { core_.end_capture(stream.native()); }
  // Gives back one use of a capture pool: no graph of that use will run again. At its
  // last use the allocator waits for the device's work (replays under way), and the pool's
  // memory is the allocator's to reuse anywhere (after the last capture, if one is under
  // way). depot::invalid_argument, changing nothing, for a pool that is not live here, or
  // for its last use while it captures.
  void release_capture_pool(std::uint64_t pool) { core_.release_capture_pool(pool); }
  // The capture pools with uses left: (pool, capturing now).
  [[nodiscard]] std::vector<std::pair<std::uint64_t, bool>> capture_pools() const { return core_.capture_pools(); }

  // Makes the live block at `ptr` (a pointer allocate() returned) openable by other
  // processes on this machine (depot::ipc_mapping<D>), as PyTorch shares CUDA tensors. An
  // ordinary segment is then released only while no other process maps it (importers count
  // themselves in a file the handle names), so a mapping never outlives the memory; a
  // block of an expandable segment is shared
  // by its pages' file descriptors (a page's kept open while a live exported block is on
  // it: deallocate closes them, so the handle cannot be opened after), and a mapping holds
  // those pages itself. The block is reused after deallocate as usual, so keep it
  // allocated while others use it. depot::invalid_argument for a pointer that is not a live
  // block here; depot::error on the host backend, which cannot share memory.
  [[nodiscard]] ipc_handle ipc_export(void* ptr) { return core_.ipc_export(ptr); }

  [[nodiscard]] memory_stats stats() const { return core_.stats(); }
  [[nodiscard]] allocator_snapshot snapshot() const { return core_.snapshot(); }
  [[nodiscard]] std::vector<trace_event> trace() const { return core_.trace(); }
  [[nodiscard]] std::string trace_json() const { return core_.trace_json(); }
  [[nodiscard]] std::string summary() const { return core_.summary(); }
  // Returns every whole free segment to the upstream; live blocks are untouched.
  void empty_cache() { core_.empty_cache(); }
  // Peaks become the current values; nothing else changes.
  void reset_peak_stats() { core_.reset_peak_stats(); }
  // Totals, counters and peaks restart; current values (live memory) are kept.
  void reset_memory_stats() { core_.reset_memory_stats(); }
  // Keep the last `events` allocation events (0: stop tracing).
  void set_trace_capacity(std::size_t events) { core_.set_trace_capacity(events); }
  // Called when a request fails after the allocator's own retries, before out_of_memory is
  // thrown; returning true tries the request again (depot::oom_handler). An empty handler
  // removes it. Thread-safe; a call under way keeps the handler it started with.
  void set_oom_handler(oom_handler handler) { core_.set_oom_handler(std::move(handler)); }
  [[nodiscard]] const allocator_config& config() const noexcept { return core_.config(); }
  // The page expandable segments map (0: large blocks come from ordinary segments, because
  // expandable_segments is off or the upstream cannot map memory into reserved addresses).
  [[nodiscard]] std::size_t expandable_page() const noexcept { return core_.expandable_page(); }
  [[nodiscard]] device_id device() const noexcept { return core_.device(); }

 private:
  detail::allocator_core core_;
};

}  // namespace depot
