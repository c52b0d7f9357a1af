// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/storage.hpp>

#include <atomic>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// Managed (unified) memory of one GPU of backend D: one address, valid on the host and on
// every device; pages migrate on demand or by prefetch. Allocated by the backend
// (cudaMallocManaged / hipMallocManaged), not by the pool, and never larger than the device
// has free at that moment (depot::out_of_memory giving both numbers; managed memory could
// oversubscribe and evict, depot does not ask it to). Copies share the buffer through an
// atomic count; the last handle frees it (the backend's free waits for the device). The host
// may touch the elements while kernels run only where runtime<D>::concurrent_managed_access
// says so; otherwise synchronise first. The count is thread-safe; the elements are not
// synchronised. GPU backends only: managed_storage<T, depot::host> does not compile (host
// memory is reachable from the host already: use host_storage<T>).
template <class T, device D>
class managed_storage {
  static_assert(is_gpu_v<D>, "depot::managed_storage is for GPU devices (depot::cuda, depot::hip); "
                             "host memory needs no unified address: use depot::host_storage<T>");
  static_assert(std::is_trivially_copyable_v<T>, "managed_storage holds trivially copyable elements");

 public:
  using value_type = T;

  managed_storage() noexcept = default;

  // n uninitialised elements on `device`. depot::invalid_argument for a device index out of
  // range, a device without managed memory, or n * sizeof(T) beyond size_t;
  // depot::out_of_memory when more than the device's free memory is asked for.
  explicit managed_storage(std::size_t n, int device = 0)
  {
    runtime<D>::check_device(device);
    DEPOT_EXPECTS(n <= std::numeric_limits<std::size_t>::max() / sizeof(T),
                  "depot::managed_storage: " + std::to_string(n) + " elements of " + std::to_string(sizeof(T)) +
                      " bytes overflow size_t");
    void* mem = runtime<D>::allocate_managed(n * sizeof(T), device);  // also checks support
    if (n == 0) return;
    try {
      ctrl_ = new control{{1}, device, mem};
    } catch (...) {
      runtime<D>::deallocate_managed(mem, device);
      throw;
    }
    data_ = static_cast<T*>(mem);
    size_ = n;
  }

  managed_storage(const managed_storage& other) noexcept : data_{other.data_}, size_{other.size_}, ctrl_{other.ctrl_}
  {
    if (ctrl_ != nullptr) ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  managed_storage(managed_storage&& other) noexcept
      : data_{std::exchange(other.data_, nullptr)},
        size_{std::exchange(other.size_, 0)},
        ctrl_{std::exchange(other.ctrl_, nullptr)}
  {
  }
  managed_storage& operator=(managed_storage other) noexcept
  {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(ctrl_, other.ctrl_);
    return *this;
  }
  ~managed_storage() { drop(ctrl_); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] int device() const noexcept { return ctrl_ == nullptr ? 0 : ctrl_->device; }
  // Host access (see the class comment about concurrent device work).
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return data_[i]; }
  [[nodiscard]] T& at(std::size_t i) const
  {
    if (i >= size_) throw index_error(static_cast<std::int64_t>(i), -1, static_cast<std::int64_t>(size_));
    return data_[i];
  }
  [[nodiscard]] bool is_refcounted() const noexcept { return ctrl_ != nullptr; }
  [[nodiscard]] std::size_t ref_count() const noexcept
  {
    return ctrl_ == nullptr ? 0 : ctrl_->refs.load(std::memory_order_acquire);
  }
  [[nodiscard]] managed_storage share() const noexcept { return *this; }

  // A new managed buffer on the same device with the same elements (synchronous copy).
  [[nodiscard]] managed_storage deep_copy() const
  {
    managed_storage out{size_, device()};
    if (size_ > 0) runtime<D>::copy(out.data_, data_, size_ * sizeof(T));
    return out;
  }

  // Migrates the pages to the device, or to the host, in the order of `s` (a hint: the
  // data stay valid everywhere either way).
  void prefetch_to_device(stream_ref<D> s = {}) const
  {
    if (size_ > 0) runtime<D>::prefetch_managed(data_, size_ * sizeof(T), device(), s.native());
  }
  void prefetch_to_host(stream_ref<D> s = {}) const
  {
    if (size_ > 0) runtime<D>::prefetch_managed(data_, size_ * sizeof(T), -1, s.native());
  }

  // The same buffer as storage<T, D> (what strided views, DLPack and ops take), counted:
  // the managed memory lives until the last handle of either kind goes.
  [[nodiscard]] storage<T, D> as_storage() const
  {
    if (ctrl_ == nullptr) return storage<T, D>{};
    ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
    auto release = [](void* context, void*) noexcept { drop(static_cast<control*>(context)); };
    try {
      return storage<T, D>{device_storage<T, D>{data_, size_, ctrl_->device, release, ctrl_}};
    } catch (...) {
      drop(ctrl_);
      throw;
    }
  }

 private:
  struct control {
    std::atomic<std::size_t> refs;
    int device;
    void* memory;
  };

  static void drop(control* c) noexcept
  {
    // deallocate_managed is noexcept: a free has no one to report a failure to.
    if (c != nullptr && c->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      runtime<D>::deallocate_managed(c->memory, c->device);
      delete c;
    }
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  control* ctrl_ = nullptr;
};

}  // namespace depot
