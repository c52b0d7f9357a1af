// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/pool.hpp>

#include <cstdint>
#include <string>

namespace depot {

// A scope that measures an allocator's memory use: construction resets the peaks (current
// values are never touched), peak_memory() is the highest allocated bytes since, and
// memory_summary() the allocator's table. Not thread-safe itself; the allocator is.
template <device D>
class profile_memory {
 public:
  explicit profile_memory(caching_allocator<D>& allocator = pool<D>())
      : allocator_{allocator}, start_{allocator.stats().allocated_bytes.all.current}
  {
    allocator_.reset_peak_stats();
  }
  profile_memory(const profile_memory&) = delete;
  profile_memory& operator=(const profile_memory&) = delete;

  [[nodiscard]] std::int64_t peak_memory() const { return allocator_.stats().allocated_bytes.all.peak; }
  // Allocated bytes now minus at the start of the scope.
  [[nodiscard]] std::int64_t growth() const
  {
    return allocator_.stats().allocated_bytes.all.current - start_;
  }
  [[nodiscard]] std::string memory_summary() const { return allocator_.summary(); }

 private:
  caching_allocator<D>& allocator_;
  std::int64_t start_;
};

}  // namespace depot
