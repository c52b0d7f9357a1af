// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// An upstream for the allocator's tests: the device's memory with a byte limit, counting
// what the allocator holds of it (bytes, reserved ranges, events), with switches that make
// it refuse one kind of call or another.
#include <doctest/doctest.h>

#include <depot/hal/device.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/pool/device_upstream.hpp>
#include <depot/pool/upstream_resource.hpp>

#include <fcntl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace depot::test {

// A checking upstream: device memory of D with a byte limit; counts what is outstanding so
// a test can prove nothing leaks, and can report a chosen total for fraction limits.
template <depot::device D>
class limiting_upstream final : public depot::upstream_resource {
 public:
  struct counters {
    std::atomic<std::int64_t> outstanding{0};  // bytes allocated or mapped, not given back
    std::atomic<int> allocations{0};
    std::atomic<int> failures{0};
    std::atomic<int> reservations{0};  // address ranges reserved, not given back
    std::atomic<int> maps{0};          // vm_map calls that succeeded
    std::atomic<int> events{0};        // events recorded, not destroyed
  };
  limiting_upstream(std::size_t limit, std::shared_ptr<counters> c, std::size_t reported_total = 0)
      : limit_{limit}, total_{reported_total}, c_{std::move(c)}
  {
  }
  void* allocate(std::size_t bytes) override
  {
    if (static_cast<std::size_t>(c_->outstanding.load()) + bytes > limit_) {
      ++c_->failures;
      throw depot::out_of_memory("limiting upstream: over its limit", bytes, device());
    }
    void* p = inner_.allocate(bytes);
    c_->outstanding += static_cast<std::int64_t>(bytes);
    ++c_->allocations;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override
  {
    c_->outstanding -= static_cast<std::int64_t>(bytes);
    inner_.deallocate(p, bytes);
  }
  depot::memory_info memory() override
  {
    return total_ == 0 ? inner_.memory() : depot::memory_info{total_, total_};
  }
  depot::device_id device() const noexcept override { return inner_.device(); }
  depot::native_event record_event(depot::native_stream s) override
  {
    if (fail_events) throw depot::error("test: event refused", "record_event", __FILE__, __LINE__, 1, "test");
    const depot::native_event e = inner_.record_event(s);
    ++c_->events;
    return e;
  }
  bool fail_events = false;
  // Virtual memory: mapped bytes count against the limit as allocations do.
  std::size_t vm_page() override { return vm ? inner_.vm_page() : 0; }
  void* vm_reserve(std::size_t bytes) override
  {
    if (fail_reserve) throw depot::out_of_memory("limiting upstream: no addresses", bytes, device());
    void* p = inner_.vm_reserve(bytes);
    ++c_->reservations;
    return p;
  }
  std::uint64_t vm_map(void* addr, std::size_t bytes) override
  {
    if (on_map) on_map();
    if (fail_maps_with_error) throw depot::error("test: map refused", "vm_map", __FILE__, __LINE__, 1, "test");
    if (static_cast<std::size_t>(c_->outstanding.load()) + bytes > limit_) {
      ++c_->failures;
      throw depot::out_of_memory("limiting upstream: over its limit", bytes, device());
    }
    const std::uint64_t h = inner_.vm_map(addr, bytes);
    c_->outstanding += static_cast<std::int64_t>(bytes);
    ++c_->maps;
    return h;
  }
  void vm_unmap(void* addr, std::size_t bytes, std::uint64_t h) noexcept override
  {
    c_->outstanding -= static_cast<std::int64_t>(bytes);
    inner_.vm_unmap(addr, bytes, h);
  }
  void vm_release(void* addr, std::size_t bytes) noexcept override
  {
    --c_->reservations;
    inner_.vm_release(addr, bytes);
  }
  // Sharing pages: with stand_in_exports, each export is a new descriptor of /dev/null (so
  // the allocator's bookkeeping of page descriptors runs on any backend); exports_left
  // limits how many succeed.
  int vm_export(std::uint64_t h) override
  {
    if (!stand_in_exports) return inner_.vm_export(h);
    if (exports_left == 0) throw depot::error("test: export refused", "vm_export", __FILE__, __LINE__, 1, "test");
    --exports_left;
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    exported.push_back(fd);
    return fd;
  }
  // Sharing ordinary segments: with stand_in_exports, a made-up backend handle.
  depot::ipc_memory_handle ipc_export(void* segment) override
  {
    if (!stand_in_exports) return inner_.ipc_export(segment);
    depot::ipc_memory_handle m;
    std::memcpy(m.bytes.data(), &segment, sizeof segment);
    return m;
  }
  bool stand_in_exports = false;
  int exports_left = -1;     // < 0: no limit
  std::vector<int> exported;  // every descriptor vm_export gave (the allocator closes them)
  bool vm = true;                     // false: as an upstream that cannot map memory
  bool fail_maps_with_error = false;  // vm_map throws depot::error (not out of memory)
  bool fail_reserve = false;          // vm_reserve finds no addresses
  std::function<void()> on_map;       // called at each vm_map first (under the cache's lock)
  bool event_done(depot::native_event e) override { return inner_.event_done(e); }
  bool stream_done(depot::native_stream s) override { return inner_.stream_done(s); }
  void wait_event(depot::native_event e) override { inner_.wait_event(e); }
  void stream_wait(depot::native_stream s, depot::native_event e) override { inner_.stream_wait(s, e); }
  void destroy_event(depot::native_event e) noexcept override
  {
    inner_.destroy_event(e);
    --c_->events;
  }
  void synchronize_device() override { inner_.synchronize_device(); }

 private:
  depot::device_upstream<D> inner_{0};
  std::size_t limit_;
  std::size_t total_;
  std::shared_ptr<counters> c_;
};

}  // namespace depot::test
