// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

namespace depot::ops {

// dst[i] = value wherever mask[i] (bool, dst's shape), as "depot::masked_fill" queued on
// `stream`. Elements where the mask is false are not touched.
template <class T, device D>
void masked_fill(const strided_view<T, D>& dst, const strided_view<bool, D>& mask, T value, stream_ref<D> stream = {})
{
  kernels::masked_fill<D>(dst.ref(), mask.ref(), &value, stream);
}

}  // namespace depot::ops
