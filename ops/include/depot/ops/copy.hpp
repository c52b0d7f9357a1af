// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

namespace depot::ops {

// dst = src elementwise on device D, queued on `stream`: same shape, any strides on either
// side, any two dtypes (converted as static_cast; float16/bfloat16 through float; to bool
// as != 0). Contiguous same-dtype copies are the backend's memcpy; permuted copies go
// through tiles ("depot::copy_transpose"); the rest is "depot::copy". Different shapes:
// depot::invalid_argument before anything is written. Devices must match (compile time).
template <class To, class From, device D>
void copy(const strided_view<To, D>& dst, const strided_view<From, D>& src, stream_ref<D> stream = {})
{
  kernels::copy<D>(dst.ref(), src.ref(), stream);
}

}  // namespace depot::ops
