// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace depot {

// Settings of a caching_allocator. Built in code, or parsed from the environment variable
// DEPOT_ALLOC_CONF ("key:value,key:value"). Parsing rejects unknown keys and bad values
// with depot::invalid_argument naming the key, the value and the valid range; nothing is
// ever silently ignored. A plain value type.
struct allocator_config {
  // Blocks larger than this are never split (limits fragmentation by large blocks).
  // Key max_split_size (bytes, KiB/MiB/GiB suffixes, >= 1MiB) or max_split_size_mb (MiB).
  // Default: no limit.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // With max_split_size set, a request of at least max_split_size takes a cached block
  // (which is never split) only if that block is at most this much larger; the rest of the
  // block is lost to the request while it lives. Key max_non_split_rounding (bytes, with
  // suffixes, at most 1TiB) or max_non_split_rounding_mb (MiB). Default 20 MiB.
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  // Round requests above 1 MiB up to one of N divisions of their power-of-two interval
  // (0: off, else a power of two in [1, 64]), for every size unless
  // roundup_power2_intervals is given. Key roundup_power2_divisions:N.
  unsigned roundup_power2_divisions = 0;
  // Divisions by request size, in place of the one number above when not empty (PyTorch's
  // list form): each interval rounds the requests above the previous one's `up_to` (the
  // first: above 1 MiB) up to its own, the last may reach SIZE_MAX ("all larger"), and
  // requests above the last `up_to` are not rounded. Key roundup_power2_divisions:[256:1,
  // 512:2,1024:4,>:8] (bounds in MiB or with a unit, powers of two in [1MiB, 2^50 bytes],
  // increasing; ">" last): 1 division up to 256 MiB, 2 up to 512 MiB, 4 up to 1 GiB, 8 above.
  struct roundup_interval {
    std::size_t up_to = 0;  // a power of two in [1 MiB, 2^50], or SIZE_MAX (only last)
    unsigned divisions = 0;  // 0 or 1: not rounded, else a power of two in [2, 64]
  };
  std::vector<roundup_interval> roundup_power2_intervals;
  // When reserved memory exceeds this fraction of the allowed total, free cached segments
  // are released before growing (0: off, else (0, 1)). Key garbage_collection_threshold.
  double garbage_collection_threshold = 0.0;
  // Cached memory kept when empty_cache(keep) trims automatically: the allocator releases
  // whole free segments beyond this many bytes after a free. Key release_threshold (bytes,
  // with suffixes) or release_threshold_mb (MiB).
  // Default: keep everything until empty_cache().
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  // When a stream's cache has no fitting block, a whole free segment of another live
  // stream's cache (the smallest that fits) is taken over before the allocator grows only
  // if growing would take the reserved memory past this many bytes: 0 (the default, as
  // RMM's pool) always. Below it the allocator grows, as PyTorch's does, and takes one over
  // only when growing is refused (per_process_memory_fraction, the upstream). A live
  // stream's segment orders the taker's stream after all of the work queued on it (an
  // event and a wait); growing instead costs memory (one thread on 4 streams with requests
  // to 64 MiB and 1 GiB live reserved 12 GiB with no threshold, 2.7 GiB with 0). Destroyed
  // streams' whole free segments are always taken over (all at once) before growing. Key
  // steal_threshold (bytes, with suffixes, or `unlimited`) or steal_threshold_mb (MiB).
  std::size_t steal_threshold = 0;
  // Reserved memory may not exceed this fraction of the device's total ((0, 1]).
  // Key per_process_memory_fraction.
  double per_process_memory_fraction = 1.0;
  // Events kept in the trace ring buffer (0: no trace). Key trace_capacity.
  std::size_t trace_capacity = 0;
  // How far (bytes) a figure of a thread's unpublished changes may drift from the
  // allocator's shared statistics before the thread publishes them (also after 256
  // operations, at once on segment changes, and as the thread exits; a thread that was
  // the last to publish keeps drifting, unchecked, until one of those). stats() is always
  // exact, and so are peaks while one thread allocates (on any streams); with several
  // threads at work at once a peak may be off by this much per other thread, or by up to
  // 256 operations' changes of a thread that ran alone and kept them (0: publish every
  // operation, exact peaks, one shared write per operation). Key stats_batch (bytes, with
  // suffixes, at most 1TiB). Default 16 MiB.
  std::size_t stats_batch = std::size_t{16} << 20;
  // Freed small blocks (64 KiB or less) of each stream's cache wait unmerged, up to this
  // many bytes per cache, for the next request of the same rounded size: such a free and
  // reuse skip the free index and the merging with neighbours. They count as cached
  // (inactive, split) at once, and are merged when a request of the cache finds no free
  // block, before memory is released (empty_cache, release_threshold, out-of-memory
  // retries), when another stream takes segments over, and when the stream is destroyed;
  // snapshots show them as free blocks beside free neighbours. 0: every free merges at
  // once. Key small_reuse_bytes (bytes, with suffixes, at most 64 MiB). Default 1 MiB.
  std::size_t small_reuse_bytes = std::size_t{1} << 20;
  // Large-pool memory of each stream comes from one expandable segment: a range of
  // addresses as large as the allowed total, reserved once, into which memory is mapped in
  // pages (2 MiB on the host and on current GPUs) as it is needed and unmapped from its end
  // when free (empty_cache, release_threshold, out-of-memory retries), so blocks of growing
  // sizes reuse one contiguous range instead of stranding the segments of earlier sizes.
  // max_split_size does not apply to its blocks. Where the upstream cannot map memory (no
  // virtual memory management, pinned host memory, test upstreams) the allocator makes
  // ordinary segments and summary() says so. Key expandable_segments (true / false).
  bool expandable_segments = false;
  // Each stream cache's lock biases itself to a thread that takes it many times in a row
  // (the thread running that stream): that thread then takes it with plain stores, where
  // an unbiased take is an atomic compare-exchange (lock+unlock 2-4 ns biased, 8-10 ns
  // not, on the H200 hosts' Xeons: ~12 ns of a 0.1-0.2 us allocate+free pair). Another
  // thread's take revokes the bias with one
  // process-wide barrier (membarrier(2), a few microseconds; stats() and snapshot() pay one
  // for all the caches they revoke). Linux only (never biased elsewhere or where
  // membarrier is refused). Key biased_locks (true / false).
  bool biased_locks = true;
  // The null stream (0) names the calling thread's per-thread default stream, as in code
  // built with `nvcc --default-stream per-thread` (depot cannot see how its caller was
  // built): a cache per thread, as for cudaStreamPerThread / hipStreamPerThread, whose
  // handle (0x2) backend calls then get. Key null_stream_per_thread (true / false).
  bool null_stream_per_thread = false;

  // Parses "key:value,..." on top of the defaults (a key given twice: the last wins; both
  // forms of roundup_power2_divisions are one key). Throws depot::invalid_argument.
  [[nodiscard]] static allocator_config parse(std::string_view text);
  // Throws depot::invalid_argument naming the first field outside its range (as above); the
  // allocators check their settings with it, so a config built in code is held to the same
  // ranges as a parsed one.
  void validate() const;
  // parse(getenv("DEPOT_ALLOC_CONF")), or the defaults when it is unset or empty.
  [[nodiscard]] static allocator_config from_environment();

  // The settings as "key:value,..." (parse(to_string()) gives the same settings).
  [[nodiscard]] std::string to_string() const;
};

}  // namespace depot
