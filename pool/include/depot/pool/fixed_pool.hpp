// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/device_id.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_address.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>
#include <depot/pool/oom_handler.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace depot {

// What a fixed_pool reports. hit_rate = hits / (hits + misses), where a miss is a request
// that failed with depot::out_of_memory (every block in use, and the out-of-memory handler,
// if one is set, declined). largest_free_run is the longest run of adjacent free blocks, in
// blocks; fragmentation = 1 - largest_free_run / free_blocks.
struct fixed_pool_stats {
  std::size_t pool_size = 0;
  std::size_t block_size = 0;
  std::size_t total_blocks = 0;
  std::size_t used_blocks = 0;
  std::size_t free_blocks = 0;
  std::size_t peak_used_blocks = 0;
  std::int64_t hits = 0;
  std::int64_t misses = 0;
  double hit_rate = 0.0;
  std::size_t largest_free_run = 0;
  double fragmentation = 0.0;
};

// A pre-sized pool of equal blocks of device memory of backend D (the Kitsune seed's
// MemoryPool): one upstream allocation made up front, cut into pool_size / block_size
// blocks of block_size bytes (rounded up to 256, the alignment of every block). allocate()
// and deallocate() are O(1) and never touch the backend; when every block is in use,
// allocate() asks the out-of-memory handler, if one is set, then throws
// depot::out_of_memory. Thread-safe (one mutex, held across a fork() so
// that the child finds the pool whole). Owns its memory.
template <device D>
class fixed_pool {
 public:
  static constexpr std::size_t alignment = 256;

  fixed_pool(std::size_t pool_size, std::size_t block_size, int device = 0) : device_{device}
  {
    DEPOT_EXPECTS(block_size > 0, "depot::fixed_pool: block_size must be at least 1 byte");
    DEPOT_EXPECTS(block_size <= (std::size_t{1} << 48),
                  "depot::fixed_pool: block_size " + std::to_string(block_size) +
                      " exceeds 2^48 bytes");
    block_size_ = (block_size + alignment - 1) / alignment * alignment;
    DEPOT_EXPECTS(pool_size >= block_size_,
                  "depot::fixed_pool: pool_size " + std::to_string(pool_size) +
                      " is smaller than one block of " + std::to_string(block_size_) + " bytes");
    blocks_ = pool_size / block_size_;
    pool_size_ = blocks_ * block_size_;
    // The device memory first (a pool larger than the device is refused before any
    // bookkeeping of its size is made), given back if the bookkeeping then fails: the
    // constructor throws, and no destructor would run.
    base_ = static_cast<std::byte*>(runtime<D>::allocate(pool_size_, device));
    try {
      used_.assign(blocks_, false);
      free_.reserve(blocks_);
    } catch (...) {
      runtime<D>::deallocate(base_, device);
      throw;
    }
    for (std::size_t i = blocks_; i-- > 0;) free_.push_back(i);  // lowest address first (reserved)
  }
  fixed_pool(const fixed_pool&) = delete;
  fixed_pool& operator=(const fixed_pool&) = delete;
  // Returns the whole allocation; blocks still in use become invalid.
  ~fixed_pool() { runtime<D>::deallocate(base_, device_); }

  // A free block. When every block is in use: the out-of-memory handler, if one is set, is
  // called with the exception and the attempt (1, 2, ...) with no lock held (it may free
  // blocks of this pool), and true tries again; otherwise, or on false, throws
  // depot::out_of_memory (counted as a miss).
  [[nodiscard]] void* allocate()
  {
    for (unsigned attempt = 1;; ++attempt) {
      std::shared_ptr<const oom_handler> handler;
      {
        std::lock_guard g{mu_};
        if (!free_.empty()) [[likely]] {
          const std::size_t i = free_.back();
          free_.pop_back();
          used_[i] = true;
          ++hits_;
          peak_used_ = std::max(peak_used_, blocks_ - free_.size());
          return base_ + i * block_size_;
        }
        handler = on_oom_;
        if (handler == nullptr) {
          ++misses_;
          throw exhausted();
        }
      }
      const out_of_memory error = exhausted();
      if (!(*handler)(error, attempt)) {
        std::lock_guard g{mu_};
        ++misses_;
        throw error;
      }
    }
  }

  // Sets what allocate() calls when every block is in use (see oom_handler); an empty
  // function removes it. Thread-safe; a call under way keeps the handler it started with.
  void set_oom_handler(oom_handler handler)
  {
    auto h = handler ? std::make_shared<const oom_handler>(std::move(handler)) : nullptr;
    std::lock_guard g{mu_};
    on_oom_.swap(h);
  }

  // nullptr is a no-op (as for the caching allocators). A pointer that is not a block of
  // this pool, or a block that is not in use, throws depot::invalid_argument and changes
  // nothing.
  void deallocate(void* ptr)
  {
    if (ptr == nullptr) return;
    std::lock_guard g{mu_};
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    const auto b = reinterpret_cast<std::uintptr_t>(base_);
    const bool inside = p >= b && p < b + pool_size_ && (p - b) % block_size_ == 0;
    const std::size_t i = inside ? (p - b) / block_size_ : 0;
    DEPOT_EXPECTS(inside && used_[i],
                  "depot::fixed_pool: " + format_address(p) +
                      (inside ? " is a block that is not in use (double free?)"
                              : " is not a block of this pool"));
    used_[i] = false;
    free_.push_back(i);
  }

  // Orders the free blocks so that the next allocations come lowest address first, in
  // ascending runs. Blocks in use never move (their addresses are held by callers).
  void defragment()
  {
    std::lock_guard g{mu_};
    std::sort(free_.begin(), free_.end(), std::greater<>{});
  }

  [[nodiscard]] fixed_pool_stats get_stats() const
  {
    std::lock_guard g{mu_};
    fixed_pool_stats s;
    s.pool_size = pool_size_;
    s.block_size = block_size_;
    s.total_blocks = blocks_;
    s.free_blocks = free_.size();
    s.used_blocks = blocks_ - free_.size();
    s.peak_used_blocks = peak_used_;
    s.hits = hits_;
    s.misses = misses_;
    s.hit_rate = hits_ + misses_ > 0 ? static_cast<double>(hits_) / static_cast<double>(hits_ + misses_) : 0.0;
    std::size_t run = 0;
    for (bool u : used_) {
      run = u ? 0 : run + 1;
      s.largest_free_run = std::max(s.largest_free_run, run);
    }
    s.fragmentation = s.free_blocks > 0
                          ? 1.0 - static_cast<double>(s.largest_free_run) / static_cast<double>(s.free_blocks)
                          : 0.0;
    return s;
  }

  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return blocks_; }
  [[nodiscard]] void* data() const noexcept { return base_; }

 private:
  out_of_memory exhausted() const
  {
    return out_of_memory("depot::fixed_pool " + device_id::of<D>(device_).to_string() + ": all " +
                             std::to_string(blocks_) + " blocks of " + format_bytes(block_size_) + " are in use",
                         block_size_, device_id::of<D>(device_));
  }

  int device_;
  std::size_t block_size_ = 0;
  std::size_t blocks_ = 0;
  std::size_t pool_size_ = 0;
  std::byte* base_ = nullptr;
  mutable detail::fork_leaf_mutex mu_;
  std::vector<std::size_t> free_;  // a stack of free block indices
  std::vector<bool> used_;
  std::size_t peak_used_ = 0;
  std::int64_t hits_ = 0;
  std::int64_t misses_ = 0;
  std::shared_ptr<const oom_handler> on_oom_;  // under mu_; copied out before a call
};

}  // namespace depot
