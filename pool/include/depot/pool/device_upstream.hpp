// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>
#include <depot/pool/upstream_resource.hpp>

#include <cstddef>
#include <mutex>
#include <type_traits>
#include <vector>

namespace depot {

// Device memory of backend D straight from the HAL (cudaMalloc / hipMalloc / on the host,
// pages mapped for each segment and unmapped when it is freed: never the heap, which would
// keep them resident after empty_cache()), with D's events. `pinned = true` takes pinned host memory instead (cudaMallocHost /
// hipHostMalloc), still ordered by D's streams: the upstream of the pinned host pool.
// Thread-safe, fork() included (the HAL is; its one lock is a fork_leaf_mutex). Destroyed
// events are kept (up to 64) and recorded again: an event taken from the backend costs more
// driver calls than recording one.
template <device D>
class device_upstream final : public upstream_resource {
 public:
  explicit device_upstream(int device = 0, bool pinned = false) : device_{device}, pinned_{pinned}
  {
    runtime<D>::check_device(device);
  }
  device_upstream(const device_upstream&) = delete;
  device_upstream& operator=(const device_upstream&) = delete;
  ~device_upstream() override
  {
    for (native_event e : spare_events_) runtime<D>::destroy_event(e, device_);
  }

  [[nodiscard]] void* allocate(std::size_t bytes) override
  {
    if constexpr (std::is_same_v<D, host>) {
      return runtime<host>::map_segment(bytes, device_);  // pinned or not: pages of their own
    } else {
      return pinned_ ? runtime<D>::allocate_pinned(bytes) : runtime<D>::allocate(bytes, device_);
    }
  }
  void deallocate(void* ptr, std::size_t bytes) noexcept override
  {
    if constexpr (std::is_same_v<D, host>) {
      runtime<host>::unmap_segment(ptr, bytes);
    } else if (pinned_) {
      runtime<D>::deallocate_pinned(ptr);
    } else {
      runtime<D>::deallocate(ptr, device_);
    }
  }
  [[nodiscard]] memory_info memory() override
  {
    return pinned_ ? runtime<host>::memory(0) : runtime<D>::memory(device_);
  }
  [[nodiscard]] device_id device() const noexcept override
  {
    return pinned_ ? device_id{device_kind::host, 0} : device_id::of<D>(device_);
  }
  [[nodiscard]] device_id stream_device() const noexcept override
  {
    return pinned_ ? device_id{D::kind, -1} : device_id::of<D>(device_);
  }
  [[nodiscard]] native_event record_event(native_stream stream) override
  {
    native_event e = nullptr;
    {
      const std::lock_guard g{events_mu_};
      if (!spare_events_.empty()) {
        e = spare_events_.back();
        spare_events_.pop_back();
      }
    }
    if (e == nullptr) e = runtime<D>::create_event(device_, false);
    try {
      // A wait queued on an earlier record of a reused event keeps waiting for that one.
      runtime<D>::record_event(e, stream);
    } catch (...) {
      destroy_event(e);
      throw;
    }
    return e;
  }
  [[nodiscard]] bool event_done(native_event event) override { return runtime<D>::query_event(event); }
  [[nodiscard]] bool stream_done(native_stream stream) override { return runtime<D>::query_stream(stream); }
  void wait_event(native_event event) override { runtime<D>::synchronize_event(event); }
  void stream_wait(native_stream stream, native_event event) override
  {
    runtime<D>::wait_event(stream, event);
  }
  void destroy_event(native_event event) noexcept override
  {
    if (event == nullptr) return;
    {
      const std::lock_guard g{events_mu_};
      if (spare_events_.size() < k_spare_events) {
        spare_events_.push_back(event);  // (reserved: never throws)
        return;
      }
    }
    runtime<D>::destroy_event(event, device_);
  }
  void synchronize_device() override { runtime<D>::synchronize(device_); }
  [[nodiscard]] ipc_memory_handle ipc_export(void* segment) override
  {
    if (pinned_) return upstream_resource::ipc_export(segment);  // pinned host: process-private
    return runtime<D>::ipc_export(segment, device_);
  }

  // Device memory only: pinned host memory is not mapped through reservations.
  [[nodiscard]] std::size_t vm_page() override { return pinned_ ? 0 : runtime<D>::vm_page(device_); }
  [[nodiscard]] void* vm_reserve(std::size_t bytes) override
  {
    if (pinned_) return upstream_resource::vm_reserve(bytes);
    return runtime<D>::vm_reserve(bytes, device_);
  }
  [[nodiscard]] std::uint64_t vm_map(void* addr, std::size_t bytes) override
  {
    if (pinned_) return upstream_resource::vm_map(addr, bytes);
    return runtime<D>::vm_map(addr, bytes, device_);
  }
  void vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles) override
  {
    if (pinned_) return upstream_resource::vm_map_pages(addr, page, count, handles);
    runtime<D>::vm_map_pages(addr, page, count, handles, device_);
  }
  void vm_unmap(void* addr, std::size_t bytes, std::uint64_t handle) noexcept override
  {
    runtime<D>::vm_unmap(addr, bytes, handle, device_);
  }
  void vm_release(void* addr, std::size_t bytes) noexcept override { runtime<D>::vm_release(addr, bytes, device_); }
  [[nodiscard]] int vm_export(std::uint64_t handle) override
  {
    if (pinned_) return upstream_resource::vm_export(handle);
    return runtime<D>::vm_export(handle, device_);
  }

 private:
  static constexpr std::size_t k_spare_events = 64;
  int device_;
  bool pinned_;
  detail::fork_leaf_mutex events_mu_;  // held across a fork (a leaf: taken under no other)
  std::vector<native_event> spare_events_ = [] {
    std::vector<native_event> v;
    v.reserve(k_spare_events);
    return v;
  }();
};

}  // namespace depot
