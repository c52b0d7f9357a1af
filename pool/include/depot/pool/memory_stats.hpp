// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>
#include <string>

namespace depot {

// One quantity as the allocator tracks it: its value now, its highest value since the
// last peak reset, and the running totals added and removed (allocated - freed == current
// since the last full reset). Bytes or counts.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
};

// A stat for all blocks and separately for the small pool (requests <= 1 MiB, carved from
// 2 MiB segments) and the large pool.
struct stat_array {
  stat all;
  stat small;
  stat large;
};

// A consistent copy of a caching_allocator's statistics (taken under its locks).
// Definitions: allocated = bytes handed out (rounded sizes); requested = bytes asked for;
// reserved = bytes held from the upstream (segments); cached = reserved - allocated;
// active = allocated + freed blocks still waiting for their streams' events;
// inactive_split = free blocks that are pieces of a partly used segment (not releasable).
// Current values and totals are exact; a peak is exact while one thread allocates (on any
// streams; threads one after another count as one: a thread publishes its changes as it
// exits), else within allocator_config::stats_batch per other thread at work at once
// (see allocator_config::stats_batch for the one wider case).
struct memory_stats {
  stat_array allocated_bytes;
  stat_array requested_bytes;
  stat_array reserved_bytes;
  stat_array cached_bytes;
  stat_array active_bytes;
  stat_array inactive_split_bytes;
  stat_array num_allocations;  // live allocations (current) and calls (allocated)
  stat_array num_segments;
  std::int64_t num_cache_hits = 0;
  std::int64_t num_cache_misses = 0;
  double cache_hit_rate = 0.0;  // hits / (hits + misses); 0 before the first allocation
  std::int64_t peak_allocated = 0;  // allocated_bytes.all.peak
  std::int64_t peak_cached = 0;     // cached_bytes.all.peak
  std::int64_t num_alloc_retries = 0;  // upstream failures followed by a cache flush + retry
  std::int64_t num_ooms = 0;           // out_of_memory thrown to callers (not those a handler recovered)
  // Whole free segments moved from one stream's cache to another's that missed, in place
  // of new memory: a destroyed stream's (all at once), or a live stream's (one per miss);
  // and the events recorded on live streams to order those moves after their work (a move
  // the taking stream is already ordered after needs none, nor does one from a stream
  // found with no work left; a destroyed stream's fence is recorded once, when it is
  // destroyed). Each event is a record and a stream wait.
  std::int64_t num_segments_moved = 0;
  std::int64_t num_move_events = 0;
  // Moves from a live stream whose lifetime depot cannot see (a raw handle never
  // registered with stream_registry): each waited for the whole device on the host, which
  // registering the stream turns into an event.
  std::int64_t num_move_syncs = 0;
  std::int64_t largest_free_block = 0;
  // 1 - largest free block / total free bytes: 0 when the free memory is one piece (or
  // there is none), near 1 when it is scattered in pieces too small for big requests.
  double fragmentation = 0.0;
};

}  // namespace depot
