// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Questions the tests ask of an allocator snapshot. A pointer no segment holds fails the
// test that asked.
#include <doctest/doctest.h>

#include <depot/pool/allocator_snapshot.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace depot::test {

// The capture pool of the snapshot's segment that holds p (0: a stream's cache holds it).
inline std::uint64_t capture_pool_of(const allocator_snapshot& snap, const void* p)
{
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (const auto& seg : snap.segments) {
    if (at >= seg.address && at < seg.address + seg.size) return seg.capture_pool;
  }
  FAIL("no segment holds the pointer");
  return 0;
}

// How many of the snapshot's segments are held by the cache of stream key `stream` (the
// handle as a number), of the small pool or the large one only where `small_pool` says.
inline std::size_t segments_on(const allocator_snapshot& snap, std::uintptr_t stream,
                               std::optional<bool> small_pool = std::nullopt)
{
  std::size_t n = 0;
  for (const auto& seg : snap.segments) {
    n += seg.stream == stream && (!small_pool || seg.small_pool == *small_pool) ? 1 : 0;
  }
  return n;
}

}  // namespace depot::test
