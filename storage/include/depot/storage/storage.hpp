// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/host_storage.hpp>

#include <cstddef>
#include <type_traits>

namespace depot {

// The accelerator data container: the Device parameter chooses, at compile time, host
// storage (depot::host) or device storage (depot::cuda, depot::hip). host_ptr() exists only
// for the host and device_ptr() only for a GPU: asking for the other is a compile error.
// Copies share the buffer (see host_storage and device_storage for ownership).
template <class T, device D = host>
class storage {
 public:
  using value_type = T;
  using device_type = D;
  using impl_type = std::conditional_t<std::is_same_v<D, host>, host_storage<T>, device_storage<T, D>>;

  storage() = default;
  explicit storage(std::size_t n) : impl_(n) {}
  explicit storage(impl_type impl) noexcept : impl_(std::move(impl)) {}

  [[nodiscard]] std::size_t size() const noexcept { return impl_.size(); }
  [[nodiscard]] T* host_ptr() const noexcept
    requires std::is_same_v<D, host>
  {
    return impl_.data();
  }
  [[nodiscard]] T* device_ptr() const noexcept
    requires is_gpu_v<D>
  {
    return impl_.data();
  }
  [[nodiscard]] static constexpr bool is_cuda() noexcept { return D::kind == device_kind::cuda; }
  [[nodiscard]] static constexpr bool is_hip() noexcept { return D::kind == device_kind::hip; }
  [[nodiscard]] std::size_t ref_count() const noexcept { return impl_.ref_count(); }
  [[nodiscard]] storage share() const { return storage{impl_.share()}; }
  [[nodiscard]] storage deep_copy() const { return storage{impl_.deep_copy()}; }
  [[nodiscard]] const impl_type& impl() const noexcept { return impl_; }
  [[nodiscard]] impl_type& impl() noexcept { return impl_; }

 private:
  impl_type impl_;
};

}  // namespace depot
