// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstddef>
#include <cstdint>

namespace depot::ops {

// fill<D>(data, n, value, stream): sets n contiguous elements of memory of device D to
// value, as a Kokkos kernel ("depot::fill") ordered on `stream`. Returns once the kernel is
// queued (the host backend returns when done). n == 0 does nothing; a null `data` with
// n > 0 is depot::invalid_argument. Defined for float, double, int32, int64, uint8.
template <device D, class T>
void fill(T* data, std::size_t n, T value, stream_ref<D> stream = {});

// Sets every element of `dst` (any strides, any dtype) to `value`, as the kernel
// "depot::fill" queued on `stream`.
template <class T, device D>
void fill(const strided_view<T, D>& dst, T value, stream_ref<D> stream = {})
{
  kernels::fill<D>(dst.ref(), &value, stream);
}

#define DEPOT_OPS_FILL_DECLARE(D, T) \
  extern template void fill<D, T>(T*, std::size_t, T, stream_ref<D>);
#define DEPOT_OPS_FILL_DECLARE_ALL(D)          \
  DEPOT_OPS_FILL_DECLARE(D, float)             \
  DEPOT_OPS_FILL_DECLARE(D, double)            \
  DEPOT_OPS_FILL_DECLARE(D, std::int32_t)      \
  DEPOT_OPS_FILL_DECLARE(D, std::int64_t)      \
  DEPOT_OPS_FILL_DECLARE(D, std::uint8_t)

DEPOT_OPS_FILL_DECLARE_ALL(host)
#if DEPOT_HAS_CUDA
DEPOT_OPS_FILL_DECLARE_ALL(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_OPS_FILL_DECLARE_ALL(hip)
#endif

}  // namespace depot::ops
