// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/trace_file.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

namespace depot::memviz {

// What depot-memviz found in a trace, for its own report and for the page's header.
// Peaks are over the whole trace; allocated counts blocks alive when the trace began (seen
// through their frees), reserved counts segments the trace saw.
struct trace_summary {
  std::size_t events = 0;
  std::size_t allocations = 0;     // bands: every block handed out or freed in the trace
  std::size_t before_trace = 0;    // freed in the trace, allocated before it began
  std::size_t never_freed = 0;     // still alive when the trace ends
  std::size_t out_of_memory = 0;
  std::size_t segment_moves = 0;   // whole free segments moved between streams' caches
  std::uint64_t span_ns = 0;
  std::size_t peak_allocated = 0;
  std::size_t peak_reserved = 0;
  double peak_fragmentation = 0.0;
  double final_fragmentation = 0.0;  // after the last event (the pool's stats().fragmentation then)
  bool has_segments = false;       // segment events present (RMM logs have none)
};

// The page's "trace" object: every allocation's lifetime (varint-packed, base64) and the
// allocated / reserved / fragmentation series and the live bytes per size class and per
// stream, aggregated into time buckets at several resolutions (format in page.js,
// decode_trace). Reads only the trace; events are taken in file order, their times made
// non-decreasing.
[[nodiscard]] nlohmann::json trace_page_data(const recorded_trace& trace, trace_summary& summary);

// The page's "snapshot" object: segments and their blocks, varint-packed.
[[nodiscard]] nlohmann::json snapshot_page_data(const allocator_snapshot& snapshot);

}  // namespace depot::memviz
