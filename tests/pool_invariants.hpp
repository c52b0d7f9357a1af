// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The allocator's invariants as the tests check them: every statistic against a snapshot
// taken with it (per pool: reserved, allocated, requested, active, inactive split bytes,
// allocations, segments) and the snapshot's structure (blocks tile each segment, free
// neighbours merged, holes only in expandable segments).
#include <doctest/doctest.h>

#include <depot/hal/device.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/memory_stats.hpp>

#include <cstddef>
#include <cstdint>

namespace depot::test {

// Every statistic against the snapshot taken with it, and the allocator's structure.
inline void check_invariants(const depot::memory_stats& s, const depot::allocator_snapshot& snap)
{
  struct sums {
    std::int64_t reserved = 0, allocated = 0, active = 0, requested = 0, split = 0, blocks = 0,
                 segments = 0;
  } pool[2];  // [0] large, [1] small
  for (const auto& seg : snap.segments) {
    sums& p = pool[seg.small_pool ? 1 : 0];
    p.reserved += static_cast<std::int64_t>(seg.size);
    ++p.segments;
    std::uintptr_t expect = seg.address;
    std::size_t unmapped = 0;
    bool previous_free = false, previous_unmapped = false, previous_kept = false;
    REQUIRE_FALSE(seg.blocks.empty());
    for (const auto& b : seg.blocks) {
      REQUIRE(b.address == expect);  // blocks tile the segment
      expect += b.size;
      REQUIRE(b.size % 512 == 0);
      if (b.state == depot::block_state::unmapped) {  // a hole: whole pages, of an expandable segment
        REQUIRE(seg.reserved != 0);
        REQUIRE(b.requested == 0);
        REQUIRE_FALSE(previous_unmapped);  // holes beside each other are merged
        REQUIRE(&b != &seg.blocks.back());  // the range ends below a hole
        unmapped += b.size;
        previous_unmapped = true;
        previous_free = false;
        previous_kept = false;
        continue;
      }
      previous_unmapped = false;
      const bool is_free = b.state == depot::block_state::free;
      // free neighbours are always merged, but for blocks kept for reuse at their size
      REQUIRE_FALSE((is_free && previous_free && !b.kept && !previous_kept));
      REQUIRE((!b.kept || (is_free && seg.small_pool)));
      previous_free = is_free;
      previous_kept = b.kept;
      if (b.state == depot::block_state::allocated) {
        p.allocated += static_cast<std::int64_t>(b.size);
        p.requested += static_cast<std::int64_t>(b.requested);
        ++p.blocks;
      }
      if (!is_free) p.active += static_cast<std::int64_t>(b.size);
      if (is_free && seg.blocks.size() > 1) p.split += static_cast<std::int64_t>(b.size);
    }
    REQUIRE(expect == seg.address + seg.size + unmapped);
  }
  auto check = [](const depot::stat_array& a, std::int64_t large, std::int64_t small) {
    CHECK(a.large.current == large);
    CHECK(a.small.current == small);
    CHECK(a.all.current == large + small);
    CHECK(a.all.peak >= a.all.current);
  };
  check(s.reserved_bytes, pool[0].reserved, pool[1].reserved);
  check(s.allocated_bytes, pool[0].allocated, pool[1].allocated);
  check(s.requested_bytes, pool[0].requested, pool[1].requested);
  check(s.active_bytes, pool[0].active, pool[1].active);
  check(s.inactive_split_bytes, pool[0].split, pool[1].split);
  check(s.num_allocations, pool[0].blocks, pool[1].blocks);
  check(s.num_segments, pool[0].segments, pool[1].segments);
  CHECK(s.cached_bytes.all.current == s.reserved_bytes.all.current - s.allocated_bytes.all.current);
  CHECK(s.fragmentation >= 0.0);
  CHECK(s.fragmentation < 1.0);
}

template <depot::device D>
void check_invariants(const depot::caching_allocator<D>& a)
{
  check_invariants(a.stats(), a.snapshot());
}

// The free small blocks a snapshot marks kept for reuse at their size
// (allocator_config::small_reuse_bytes): how many, and their bytes. Checks that each is
// free with no requested size.
struct kept_blocks {
  std::size_t blocks = 0;
  std::int64_t bytes = 0;
};

inline kept_blocks kept_in(const depot::allocator_snapshot& snap)
{
  kept_blocks k;
  for (const auto& seg : snap.segments) {
    for (const auto& b : seg.blocks) {
      if (b.kept) {
        CHECK(b.state == depot::block_state::free);
        CHECK(b.requested == 0);
        ++k.blocks;
        k.bytes += static_cast<std::int64_t>(b.size);
      }
    }
  }
  return k;
}

}  // namespace depot::test
