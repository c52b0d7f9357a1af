// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace depot {

// Numbered from 0 without gaps: the trace readers find every kind by counting up through
// to_string() until it answers "unknown" (a new kind: here and in to_string() only).
enum class trace_kind : std::uint8_t {
  allocate = 0,         // a block handed out (cache hit or miss)
  free = 1,             // a block returned (lifetime_ns set)
  segment_allocate = 2, // memory taken from the upstream
  segment_free = 3,     // memory returned to the upstream
  out_of_memory = 4,    // an allocation that failed after the allocator's retries (an out-of-memory
                        // handler may then have it tried again: one event per failure)
  segment_map = 5,      // memory mapped in an expandable segment: at its end, or into a hole
  segment_unmap = 6,    // memory unmapped from an expandable segment: its end, or inside (a hole)
  segment_move = 7,     // a whole free segment moved from another stream's cache (from_stream) to
                        // that of `stream`, which missed (memory_stats::num_segments_moved)
};

[[nodiscard]] constexpr std::string_view to_string(trace_kind k) noexcept
{
  switch (k) {
    case trace_kind::allocate: return "alloc";
    case trace_kind::free: return "free";
    case trace_kind::segment_allocate: return "segment_alloc";
    case trace_kind::segment_free: return "segment_free";
    case trace_kind::segment_map: return "segment_map";
    case trace_kind::segment_unmap: return "segment_unmap";
    case trace_kind::segment_move: return "segment_move";
    case trace_kind::out_of_memory: return "oom";
  }
  return "unknown";
}

// One entry of the allocator's trace ring buffer. Times are steady-clock nanoseconds.
struct trace_event {
  trace_kind kind = trace_kind::allocate;
  std::uint64_t time_ns = 0;
  std::uintptr_t address = 0;
  std::size_t size = 0;       // block or segment bytes
  std::size_t requested = 0;  // bytes asked for (allocate, free, out_of_memory)
  std::uintptr_t stream = 0;
  std::uint64_t thread = 0;   // a hash of the calling thread's id
  bool cache_hit = false;     // allocate: served from the cache without the upstream
  std::uint64_t lifetime_ns = 0;  // free: time since its allocate
  std::uintptr_t from_stream = 0;  // segment_move: the stream whose cache gave the segment
};

}  // namespace depot
