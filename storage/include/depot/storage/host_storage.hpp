// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/pool/pool.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// A contiguous host buffer of T in one of three ownership modes. Managed: owns memory from
// pool<host>(), with an atomic reference count shared by every copy; freed when the last
// handle goes. External: a view of memory someone else owns; never freed, never counted.
// Adopted: memory owned elsewhere (a DLPack tensor, say), counted like managed storage,
// and handed back through a release callback when the last handle goes. Copying shares
// (managed, adopted) or aliases (external); moving transfers. The count is thread-safe;
// the elements are not synchronised. An empty managed storage tracks nothing.
template <class T>
class host_storage {
  static_assert(std::is_trivially_copyable_v<T>, "host_storage holds trivially copyable elements");

 public:
  using value_type = T;

  host_storage() noexcept = default;

  // n elements, uninitialised, managed.
  explicit host_storage(std::size_t n) { allocate(n); }

  // copy = false: an external view of [ptr, ptr + n). copy = true: a managed deep copy.
  host_storage(T* ptr, std::size_t n, bool copy = false)
  {
    DEPOT_EXPECTS(ptr != nullptr || n == 0,
                  "depot::host_storage: null pointer with " + std::to_string(n) + " elements");
    if (copy) {
      allocate(n);
      if (n > 0) std::memcpy(data_, ptr, n * sizeof(T));
    } else {
      data_ = ptr;
      size_ = n;
      external_ = true;
    }
  }

  // Adopts [ptr, ptr + n): counted; release(context, ptr) runs once, when the last handle
  // goes (it must not throw). Tracked even when n == 0, so the release always happens.
  using release_fn = void (*)(void* context, void* ptr) noexcept;
  host_storage(T* ptr, std::size_t n, release_fn release, void* context)
  {
    DEPOT_EXPECTS(ptr != nullptr || n == 0,
                  "depot::host_storage: null pointer with " + std::to_string(n) + " elements");
    DEPOT_EXPECTS(release != nullptr, "depot::host_storage: adopted memory needs a release function");
    ctrl_ = new control{{1}, release, context};
    data_ = ptr;
    size_ = n;
  }

  host_storage(const host_storage& other) noexcept
      : data_{other.data_}, size_{other.size_}, ctrl_{other.ctrl_}, external_{other.external_}
  {
    if (ctrl_ != nullptr) ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  host_storage(host_storage&& other) noexcept
      : data_{std::exchange(other.data_, nullptr)},
        size_{std::exchange(other.size_, 0)},
        ctrl_{std::exchange(other.ctrl_, nullptr)},
        external_{std::exchange(other.external_, false)}
  {
  }
  host_storage& operator=(host_storage other) noexcept
  {
    swap(other);
    return *this;
  }
  ~host_storage() { release(); }

  void swap(host_storage& other) noexcept
  {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(ctrl_, other.ctrl_);
    std::swap(external_, other.external_);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return data_[i]; }
  // Checked access: depot::index_error outside [0, size()).
  [[nodiscard]] T& at(std::size_t i) const
  {
    if (i >= size_) throw index_error(static_cast<std::int64_t>(i), -1, static_cast<std::int64_t>(size_));
    return data_[i];
  }

  // W consecutive elements from i (a SIMD-width access); checked.
  template <std::size_t W>
  [[nodiscard]] std::array<T, W> load(std::size_t i) const
  {
    check_span(i, W);
    std::array<T, W> out;
    std::memcpy(out.data(), data_ + i, W * sizeof(T));
    return out;
  }
  template <std::size_t W>
  void store(std::size_t i, const std::array<T, W>& values) const
  {
    check_span(i, W);
    std::memcpy(data_ + i, values.data(), W * sizeof(T));
  }

  [[nodiscard]] bool is_external() const noexcept { return external_; }
  [[nodiscard]] bool is_refcounted() const noexcept { return ctrl_ != nullptr; }
  // Handles sharing this buffer; 0 when not tracked (external or empty).
  [[nodiscard]] std::size_t ref_count() const noexcept
  {
    return ctrl_ == nullptr ? 0 : ctrl_->refs.load(std::memory_order_acquire);
  }
  // A new handle on the same data. External storage cannot be shared (nothing keeps it
  // alive): depot::invalid_argument.
  [[nodiscard]] host_storage share() const
  {
    DEPOT_EXPECTS(!external_, "depot::host_storage::share(): the storage is external (not owned "
                              "by depot, nothing keeps it alive); use deep_copy()");
    return *this;
  }
  // A managed copy of the data with a count of 1.
  [[nodiscard]] host_storage deep_copy() const { return host_storage{data_, size_, true}; }

 private:
  void allocate(std::size_t n)
  {
    DEPOT_EXPECTS(n <= std::numeric_limits<std::size_t>::max() / sizeof(T),
                  "depot::host_storage: " + std::to_string(n) + " elements of " +
                      std::to_string(sizeof(T)) + " bytes overflow size_t");
    if (n == 0) return;
    data_ = static_cast<T*>(pool<host>().allocate(n * sizeof(T)));
    try {
      ctrl_ = new control{{1}, nullptr, nullptr};
    } catch (...) {
      pool<host>().deallocate(data_);
      throw;
    }
    size_ = n;
  }

  void release() noexcept
  {
    // A managed buffer came from pool<host>(), so its deallocate cannot refuse it.
    if (ctrl_ != nullptr && ctrl_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (ctrl_->release != nullptr) {
        ctrl_->release(ctrl_->context, raw_data());
      } else {
        try {
          pool<host>().deallocate(raw_data());
        } catch (...) {
        }
      }
      delete ctrl_;
    }
    data_ = nullptr;
    ctrl_ = nullptr;
    size_ = 0;
  }

  // The buffer as the pool and release callbacks see it (host_storage<const T>, a read-only
  // view such as a read-only mapped file, still releases it).
  [[nodiscard]] void* raw_data() const noexcept { return const_cast<void*>(static_cast<const void*>(data_)); }

  void check_span(std::size_t i, std::size_t w) const
  {
    if (i > size_ || w > size_ - i) {
      throw index_error(static_cast<std::int64_t>(i + w - 1), -1, static_cast<std::int64_t>(size_));
    }
  }

  struct control {
    std::atomic<std::size_t> refs;
    release_fn release;  // nullptr: managed (pool memory)
    void* context;
  };

  T* data_ = nullptr;
  std::size_t size_ = 0;
  control* ctrl_ = nullptr;
  bool external_ = false;
};

}  // namespace depot
