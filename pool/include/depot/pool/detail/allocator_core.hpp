// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The caching allocator's algorithm, written once for every backend: caching_allocator<D>
// is a typed front over this. Not for direct use.
#include <depot/hal/native_handle.hpp>
#include <depot/pool/allocator_config.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/memory_stats.hpp>
#include <depot/pool/oom_handler.hpp>
#include <depot/pool/trace_event.hpp>
#include <depot/pool/upstream_resource.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace depot::detail {

class allocator_core {
 public:
  // `asynchronous`: whether streams of this backend can run behind the host (false for
  // the host backend, where a freed block is reusable on any stream at once).
  allocator_core(std::unique_ptr<upstream_resource> upstream, allocator_config config,
                 bool asynchronous);
  allocator_core(const allocator_core&) = delete;
  allocator_core& operator=(const allocator_core&) = delete;
  ~allocator_core();

  [[nodiscard]] void* allocate(std::size_t bytes, native_stream stream);
  // `stream_given`: the free is ordered on `stream` (else on the stream of the allocation).
  // `expected_bytes`: the size-taking overload's size (0: not given).
  void deallocate(void* ptr, native_stream stream, bool stream_given, std::size_t expected_bytes);
  void record_stream(void* ptr, native_stream stream);
  // Graph capture (caching_allocator's begin_capture, end_capture, release_capture_pool).
  [[nodiscard]] std::uint64_t begin_capture(native_stream stream, std::uint64_t pool);
  void end_capture(native_stream stream);
  void release_capture_pool(std::uint64_t pool);
  // The capture pools not yet released: (pool, whether it is capturing now).
  [[nodiscard]] std::vector<std::pair<std::uint64_t, bool>> capture_pools() const;
  [[nodiscard]] ipc_handle ipc_export(void* ptr);

  [[nodiscard]] memory_stats stats() const;
  [[nodiscard]] allocator_snapshot snapshot() const;
  // For tests: whether the directory of segments by address (what a free that finds its
  // block in neither cache it tries first asks) lists every segment, with its range and
  // the cache that holds it, and nothing else, and every cache's count of its segments is
  // right. Empty when so, else the first difference. Takes every lock, as snapshot().
  [[nodiscard]] std::string check_directory() const;
  // For tests: whether every small segment's bitmap of free blocks (a bit at each free
  // block's head, what a free asks to merge its neighbours) and its entries' distances
  // back to the previous block agree with its blocks, walked by their sizes. Empty when
  // so, else the first difference. Takes every lock, as snapshot().
  [[nodiscard]] std::string check_small_bits() const;
  // For tests: how many stream caches this allocator has made (streams' and capture
  // pools'); a closed stream's cache with no block in use is taken over by a new stream,
  // not made anew.
  [[nodiscard]] std::size_t stream_caches() const;
  // For tests: how many threads' statistics deltas this allocator holds (one per thread
  // that worked on it; an exited thread's is taken over by the next new thread, or goes
  // where 64 others are free).
  [[nodiscard]] std::size_t thread_deltas() const;
  [[nodiscard]] std::vector<trace_event> trace() const;
  [[nodiscard]] std::string trace_json() const;
  [[nodiscard]] std::string summary() const;
  void empty_cache();
  void reset_peak_stats();
  void reset_memory_stats();
  void set_trace_capacity(std::size_t events);
  void set_oom_handler(oom_handler handler);
  [[nodiscard]] const allocator_config& config() const noexcept;
  [[nodiscard]] std::size_t expandable_page() const noexcept;
  [[nodiscard]] device_id device() const noexcept;

 private:
  friend void install_fork_handlers();  // (fork_hooks.hpp) registers impl's atfork handlers
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace depot::detail
