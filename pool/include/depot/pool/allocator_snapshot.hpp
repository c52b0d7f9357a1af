// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/native_handle.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace depot {

// State of one block inside a segment.
enum class block_state : std::uint8_t {
  allocated = 0,     // handed out to a caller
  pending_free = 1,  // freed, waiting for events of other streams that used it
  free = 2,          // in the cache, reusable
  unmapped = 3,      // addresses of an expandable segment with no memory behind them (a hole)
};

// A state's name in snapshots' JSON and summaries (read back by parse_snapshot).
[[nodiscard]] constexpr std::string_view to_string(block_state s) noexcept
{
  switch (s) {
    case block_state::allocated: return "allocated";
    case block_state::pending_free: return "pending_free";
    case block_state::free: return "free";
    case block_state::unmapped: return "unmapped";
  }
  return "unknown";
}

struct block_info {
  std::uintptr_t address = 0;
  std::size_t size = 0;       // bytes the block spans
  std::size_t requested = 0;  // bytes asked for (0 unless allocated or pending)
  block_state state = block_state::free;
  // A free small block kept unmerged for the next request of its size
  // (allocator_config::small_reuse_bytes): the one kind of free block that may lie beside
  // another free block.
  bool kept = false;
};

// One upstream allocation and the blocks it is cut into, in address order.
struct segment_info {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  bool small_pool = false;
  std::uintptr_t stream = 0;  // the stream whose cache holds it (0: default stream)
  bool exported = false;      // shared with other processes (ipc_handle): an ordinary segment
                              // is kept while importers map it, an expandable one has live
                              // exported blocks on it (pages with open descriptors)
  std::int64_t importers = 0;  // an exported ordinary segment: other processes mapping it now
  // The graph capture pool that holds it (caching_allocator::begin_capture; 0: none, a
  // stream's cache holds it and `stream` says whose).
  std::uint64_t capture_pool = 0;
  // An expandable segment: `size` bytes mapped from `address` on, of `reserved` bytes of
  // addresses (0 for an ordinary segment). Its blocks tile `size` bytes plus those of its
  // blocks of state unmapped (pages unmapped inside it, e.g. by empty_cache()).
  std::size_t reserved = 0;
  std::vector<block_info> blocks;
};

// Every segment of a caching_allocator at one moment, taken under its locks. Its sums
// equal the statistics taken at the same moment: reserved = sum of segment sizes,
// allocated = sum of allocated + pending block sizes, and so on (unmapped blocks count in
// none of them).
struct allocator_snapshot {
  device_id device;
  std::vector<segment_info> segments;

  // The snapshot as JSON (format in README "Snapshot and trace JSON").
  [[nodiscard]] std::string to_json() const;
};

}  // namespace depot
