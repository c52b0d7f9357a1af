// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The seeds' memory API as free functions over pool<D>(device):
// depot::memory_allocated<depot::cuda>(), depot::empty_cache<depot::hip>(1), ...
#include <depot/hal/device.hpp>
#include <depot/pool/oom_handler.hpp>
#include <depot/pool/pool.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace depot {

template <device D>
[[nodiscard]] std::int64_t memory_allocated(int device = 0)
{
  return pool<D>(device).stats().allocated_bytes.all.current;
}
template <device D>
[[nodiscard]] std::int64_t max_memory_allocated(int device = 0)
{
  return pool<D>(device).stats().allocated_bytes.all.peak;
}
template <device D>
[[nodiscard]] std::int64_t memory_reserved(int device = 0)
{
  return pool<D>(device).stats().reserved_bytes.all.current;
}
template <device D>
[[nodiscard]] std::int64_t max_memory_reserved(int device = 0)
{
  return pool<D>(device).stats().reserved_bytes.all.peak;
}
template <device D>
[[nodiscard]] std::int64_t memory_cached(int device = 0)
{
  return pool<D>(device).stats().cached_bytes.all.current;
}
template <device D>
[[nodiscard]] std::int64_t max_memory_cached(int device = 0)
{
  return pool<D>(device).stats().cached_bytes.all.peak;
}
template <device D>
[[nodiscard]] memory_stats get_memory_stats(int device = 0)
{
  return pool<D>(device).stats();
}
template <device D>
[[nodiscard]] std::string memory_summary(int device = 0)
{
  return pool<D>(device).summary();
}
template <device D>
[[nodiscard]] allocator_snapshot memory_snapshot(int device = 0)
{
  return pool<D>(device).snapshot();
}
template <device D>
void empty_cache(int device = 0)
{
  pool<D>(device).empty_cache();
}
template <device D>
void reset_peak_stats(int device = 0)
{
  pool<D>(device).reset_peak_stats();
}
template <device D>
void reset_memory_stats(int device = 0)
{
  pool<D>(device).reset_memory_stats();
}
// The out-of-memory handler of pool<D>(device) (an empty one removes it).
template <device D>
void set_oom_handler(oom_handler handler, int device = 0)
{
  pool<D>(device).set_oom_handler(std::move(handler));
}

}  // namespace depot
