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

// A contiguous host buffer of T in one of two ownership modes. Managed: owns memory from
// pool<host>(), with an atomic reference count shared by every copy; freed when the last
// handle goes. External: a view of memory someone else owns; never freed, never counted.
// Copying shares (managed) or aliases (external); moving transfers. The count is
// thread-safe; the elements are not synchronised. An empty storage tracks nothing.
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

  host_storage(const host_storage& other) noexcept
      : data_{other.data_}, size_{other.size_}, refs_{other.refs_}, external_{other.external_}
  {
    if (refs_ != nullptr) refs_->fetch_add(1, std::memory_order_relaxed);
  }
  host_storage(host_storage&& other) noexcept
      : data_{std::exchange(other.data_, nullptr)},
        size_{std::exchange(other.size_, 0)},
        refs_{std::exchange(other.refs_, nullptr)},
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
    std::swap(refs_, other.refs_);
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
  [[nodiscard]] bool is_refcounted() const noexcept { return refs_ != nullptr; }
  // Handles sharing this buffer; 0 when not tracked (external or empty).
  [[nodiscard]] std::size_t ref_count() const noexcept
  {
    return refs_ == nullptr ? 0 : refs_->load(std::memory_order_acquire);
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
      refs_ = new std::atomic<std::size_t>{1};
    } catch (...) {
      pool<host>().deallocate(data_);
      throw;
    }
    size_ = n;
  }

  void release() noexcept
  {
    // The buffer came from pool<host>(), so its deallocate cannot refuse it.
    if (refs_ != nullptr && refs_->fetch_sub(1, std::memory_order_acq_rel) == 1) {
      try {
        pool<host>().deallocate(data_);
      } catch (...) {
      }
      delete refs_;
    }
    data_ = nullptr;
    refs_ = nullptr;
    size_ = 0;
  }

  void check_span(std::size_t i, std::size_t w) const
  {
    if (i > size_ || w > size_ - i) {
      throw index_error(static_cast<std::int64_t>(i + w - 1), -1, static_cast<std::int64_t>(size_));
    }
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::atomic<std::size_t>* refs_ = nullptr;
  bool external_ = false;
};

}  // namespace depot
