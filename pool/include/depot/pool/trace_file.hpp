// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/trace_event.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace depot {

// An allocation trace read back from a file: depot's own trace JSON ("depot.trace.v1",
// written by caching_allocator::trace_json()) or RMM's CSV allocation log ("rmm.csv",
// columns Thread,Time,Action,Pointer,Size,Stream). Events are in file order, oldest first.
// A plain value type; reading never touches an allocator or a device.
struct recorded_trace {
  std::string format;  // "depot.trace.v1" or "rmm.csv"
  std::string device;  // as recorded ("cuda:0"); "cuda" for RMM logs, which do not say
  std::vector<trace_event> events;

  // The trace as depot.trace.v1 JSON (read_trace(to_json()) gives the same events; RMM
  // traces come back as depot traces).
  [[nodiscard]] std::string to_json() const;
};

// Reads `file`, detecting its format from its content: a JSON object is a depot trace, a
// first line starting "Thread," an RMM CSV log. Throws depot::invalid_argument naming the
// file and where it is wrong: the line (and column) for CSV and JSON syntax errors, the
// event index and field for a depot trace whose events are malformed. A truncated file is
// reported as such. Unknown JSON keys are skipped (forward compatibility).
//
// depot.trace.v1 events need "kind" and "size" and "address"; "time_ns", "requested",
// "stream", "thread" (default 0; requested defaults to size for alloc, free and oom),
// "cache_hit" and "lifetime_ns" are optional. RMM actions: allocate, free (or deallocate)
// and "allocate failure"; Time is "HH:MM:SS.ffffff" (RMM's spdlog pattern) or seconds
// with a fraction; pointers and streams are hex ("0x...") or decimal. For RMM frees whose
// allocation is in the log, lifetime_ns is filled in.
[[nodiscard]] recorded_trace read_trace(const std::filesystem::path& file);

// As read_trace(), from text in memory; `name` stands for the file name in messages.
[[nodiscard]] recorded_trace parse_trace(std::string_view text, std::string_view name = "<memory>");

// Reads a depot.snapshot.v1 file (allocator_snapshot::to_json()). Throws
// depot::invalid_argument naming the file and the segment, block and field that is wrong.
[[nodiscard]] allocator_snapshot read_snapshot(const std::filesystem::path& file);

// As read_snapshot(), from text in memory.
[[nodiscard]] allocator_snapshot parse_snapshot(std::string_view text, std::string_view name = "<memory>");

}  // namespace depot
