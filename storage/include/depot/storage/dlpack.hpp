// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// DLPack interop: how depot's buffers reach PyTorch, CuPy, JAX and NumPy without a copy.
#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/storage/layout.hpp>
#include <depot/storage/strided_view.hpp>

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

namespace depot {

// The DLPack element type of T (arithmetic types of 8 to 64 bits).
template <class T>
[[nodiscard]] constexpr DLDataType dlpack_dtype() noexcept
{
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "DLPack export supports integer and floating-point element types");
  const auto bits = static_cast<std::uint8_t>(sizeof(T) * 8);
  if constexpr (std::is_floating_point_v<T>) return DLDataType{kDLFloat, bits, 1};
  if constexpr (std::is_signed_v<T>) return DLDataType{kDLInt, bits, 1};
  return DLDataType{kDLUInt, bits, 1};
}

template <device D>
[[nodiscard]] constexpr DLDeviceType dlpack_device_type() noexcept
{
  if constexpr (D::kind == device_kind::cuda) return kDLCUDA;
  if constexpr (D::kind == device_kind::hip) return kDLROCM;
  return kDLCPU;
}

namespace detail {
template <class T, device D>
struct dlpack_export {
  strided_view<T, D> view;  // keeps the storage alive until the consumer's deleter runs
  std::array<std::int64_t, max_rank> shape{};
  std::array<std::int64_t, max_rank> strides{};
  DLManagedTensor tensor{};
};
}  // namespace detail

// Exports a view, zero-copy. The returned tensor holds a reference to the view's storage
// until its deleter is called (by the consumer, exactly once). data is the view's first
// element and byte_offset 0, as PyTorch and CuPy export (PyTorch's importer ignores
// byte_offset, so a base pointer plus an offset would be misread); strides are in elements.
template <class T, device D>
[[nodiscard]] DLManagedTensor* to_dlpack(const strided_view<T, D>& view)
{
  auto* ctx = new detail::dlpack_export<T, D>{view};
  const layout& l = view.get_layout();
  for (int d = 0; d < l.rank(); ++d) {
    ctx->shape[static_cast<std::size_t>(d)] = l.size(d);
    ctx->strides[static_cast<std::size_t>(d)] = l.stride(d);
  }
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = view.data();
  int device_index = 0;
  if constexpr (is_gpu_v<D>) device_index = view.get_storage().impl().device();
  t.device = DLDevice{dlpack_device_type<D>(), device_index};
  t.ndim = l.rank();
  t.dtype = dlpack_dtype<T>();
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx;
  ctx->tensor.deleter = [](DLManagedTensor* self) {
    delete static_cast<detail::dlpack_export<T, D>*>(self->manager_ctx);
  };
  return &ctx->tensor;
}

// Imports a DLPack tensor as a view of device D and element type T, zero-copy. On success
// depot owns the tensor: its deleter runs once, when the last depot handle on it goes. On
// failure (null tensor, element type, device kind or index, rank above max_rank, an offset
// that is not a whole number of elements) depot::invalid_argument is thrown and the caller
// still owns the tensor.
template <class T, device D>
[[nodiscard]] strided_view<T, D> from_dlpack(DLManagedTensor* tensor)
{
  DEPOT_EXPECTS(tensor != nullptr, "depot::from_dlpack: null tensor");
  const DLTensor& t = tensor->dl_tensor;
  const DLDataType want = dlpack_dtype<T>();
  DEPOT_EXPECTS(t.dtype.code == want.code && t.dtype.bits == want.bits && t.dtype.lanes == 1,
                "depot::from_dlpack: the tensor's element type (code " + std::to_string(t.dtype.code) +
                    ", " + std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) +
                    " lanes) is not the one asked for (code " + std::to_string(want.code) + ", " +
                    std::to_string(want.bits) + " bits)");
  const bool host_kind = t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost ||
                         t.device.device_type == kDLROCMHost;
  const bool kind_ok = is_gpu_v<D> ? t.device.device_type == dlpack_device_type<D>() : host_kind;
  DEPOT_EXPECTS(kind_ok, "depot::from_dlpack: the tensor lives on DLPack device type " +
                             std::to_string(t.device.device_type) + ", not on " + std::string{D::name});
  if constexpr (is_gpu_v<D>) runtime<D>::check_device(t.device.device_id);
  DEPOT_EXPECTS(t.ndim >= 0 && t.ndim <= max_rank,
                "depot::from_dlpack: rank " + std::to_string(t.ndim) + " is outside [0, " +
                    std::to_string(max_rank) + "]");
  DEPOT_EXPECTS(t.byte_offset % sizeof(T) == 0,
                "depot::from_dlpack: byte_offset " + std::to_string(t.byte_offset) +
                    " is not a multiple of the element size " + std::to_string(sizeof(T)));
  const auto rank = static_cast<std::size_t>(t.ndim);
  std::array<std::int64_t, max_rank> strides{};
  if (t.strides != nullptr) {
    for (std::size_t d = 0; d < rank; ++d) strides[d] = t.strides[d];
  } else {
    const layout c = layout::contiguous(layout::extents{t.shape, rank});
    for (std::size_t d = 0; d < rank; ++d) strides[d] = c.stride(static_cast<int>(d));
  }
  // The elements reached, relative to data + byte_offset: negative strides reach below it.
  const layout rel{layout::extents{t.shape, rank}, layout::extents{strides.data(), rank}, 0};
  std::int64_t lo = 0;
  std::int64_t hi = -1;
  if (rel.numel() > 0) {
    lo = 0;
    hi = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::int64_t reach = strides[d] * (t.shape[d] - 1);
      (reach < 0 ? lo : hi) += reach;
    }
  }
  T* first = static_cast<T*>(t.data) + t.byte_offset / sizeof(T);
  T* base = first + lo;
  const auto count = static_cast<std::size_t>(hi - lo + 1);
  const layout l{layout::extents{t.shape, rank}, layout::extents{strides.data(), rank}, -lo};
  auto release = [](void* context, void*) noexcept {
    auto* self = static_cast<DLManagedTensor*>(context);
    if (self->deleter != nullptr) self->deleter(self);
  };
  if constexpr (is_gpu_v<D>) {
    return strided_view<T, D>{storage<T, D>{device_storage<T, D>{base, count, t.device.device_id, release, tensor}}, l};
  } else {
    return strided_view<T, D>{storage<T, D>{host_storage<T>{base, count, release, tensor}}, l};
  }
}

}  // namespace depot
