// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>
#include <depot/pool/upstream_resource.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>

namespace depot {

// A device that exists only as bookkeeping: allocate() hands out fake addresses (never
// dereferenceable, never reused, 512-byte aligned) and throws depot::out_of_memory once
// `capacity` bytes are taken, each allocation charged in multiples of `granularity` (2 MiB
// by default, as CUDA backs allocations). Events are always complete: work is instant.
// Lets a caching_allocator replay a trace recorded on an 80 GB GPU on the CPU to ask
// whether it fits in 40 GB. Thread-safe (fork() included); counts usage, peak, failures and
// bad frees.
class simulated_upstream final : public upstream_resource {
 public:
  struct usage {
    std::size_t used = 0;       // bytes taken now (charged, i.e. rounded to the granularity)
    std::size_t peak = 0;       // most bytes taken at once
    std::size_t allocations = 0;
    std::size_t failures = 0;   // allocate() calls refused for lack of capacity
    std::size_t bad_frees = 0;  // deallocate() of an address this upstream did not hand out
  };

  explicit simulated_upstream(std::size_t capacity, device_id device = {device_kind::cuda, 0},
                              std::size_t granularity = std::size_t{2} << 20)
      : capacity_{capacity}, granularity_{granularity}, device_{device}
  {
    DEPOT_EXPECTS(capacity > 0, "depot: simulated_upstream capacity must be > 0 bytes");
    DEPOT_EXPECTS(granularity > 0 && (granularity & (granularity - 1)) == 0,
                  "depot: simulated_upstream granularity must be a power of two >= 1, got " +
                      std::to_string(granularity));
  }

  [[nodiscard]] void* allocate(std::size_t bytes) override
  {
    const std::size_t unit = std::max<std::size_t>(granularity_, 512);
    const std::size_t charged = bytes == 0 ? unit : round_up(bytes, std::max<std::size_t>(granularity_, 1));
    std::lock_guard g{mu_};
    if (charged > capacity_ - u_.used || charged == 0) {
      ++u_.failures;
      throw out_of_memory("depot: simulated " + device_.to_string() + " of " + format_bytes(capacity_) +
                              ": cannot take " + format_bytes(bytes) + " more (" + format_bytes(u_.used) +
                              " in use)",
                          bytes, device_);
    }
    const std::uintptr_t address = next_;
    next_ += round_up(charged, unit);
    live_.emplace(address, charged);
    u_.used += charged;
    u_.peak = std::max(u_.peak, u_.used);
    ++u_.allocations;
    return reinterpret_cast<void*>(address);
  }
  void deallocate(void* ptr, std::size_t) noexcept override
  {
    // Never throws (a free path): a foreign address is counted, not fatal.
    std::lock_guard g{mu_};
    const auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == live_.end()) {
      ++u_.bad_frees;
      return;
    }
    u_.used -= it->second;
    live_.erase(it);
  }
  [[nodiscard]] memory_info memory() override
  {
    std::lock_guard g{mu_};
    return {capacity_ - u_.used, capacity_};
  }
  [[nodiscard]] device_id device() const noexcept override { return device_; }

  [[nodiscard]] native_event record_event(native_stream) override
  {
    std::lock_guard g{mu_};
    return reinterpret_cast<native_event>(++events_);  // never null
  }
  [[nodiscard]] bool event_done(native_event) override { return true; }
  [[nodiscard]] bool stream_done(native_stream) override { return true; }
  void wait_event(native_event) override {}
  void stream_wait(native_stream, native_event) override {}
  void destroy_event(native_event) noexcept override {}
  void synchronize_device() override {}

  [[nodiscard]] usage current_usage() const
  {
    std::lock_guard g{mu_};
    return u_;
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }

 private:
  static std::size_t round_up(std::size_t n, std::size_t to)
  {
    return n > std::numeric_limits<std::size_t>::max() - (to - 1) ? 0 : (n + to - 1) / to * to;
  }

  const std::size_t capacity_;
  const std::size_t granularity_;
  const device_id device_;
  mutable detail::fork_leaf_mutex mu_;  // held across a fork (a leaf: taken under no other)
  usage u_;
  std::uintptr_t next_ = std::uintptr_t{1} << 44;  // far from anything real
  std::uintptr_t events_ = 0;
  std::unordered_map<std::uintptr_t, std::size_t> live_;
};

}  // namespace depot
