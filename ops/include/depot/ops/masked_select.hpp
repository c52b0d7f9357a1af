// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

namespace depot::ops {

// The elements of src where mask (bool, src's shape) is true, in row-major order, as a new
// 1-D contiguous view: a count ("depot::count_true", synchronises: the size must be known
// to allocate) and a compaction by parallel scan ("depot::masked_select").
template <class T, device D>
[[nodiscard]] strided_view<T, D> masked_select(const strided_view<T, D>& src, const strided_view<bool, D>& mask,
                                               stream_ref<D> stream = {})
{
  DEPOT_EXPECTS(src.get_layout().rank() == mask.get_layout().rank() && src.ref().same_shape(mask.ref()),
                "depot::ops::masked_select: the mask " + mask.get_layout().to_string() +
                    " does not have the source's shape " + src.get_layout().to_string());
  const std::int64_t n = kernels::count_true<D>(mask.ref(), stream);
  auto out = strided_view<T, D>::empty({n});
  kernels::masked_select<D>(out.ref(), src.ref(), mask.ref(), stream);
  return out;
}

}  // namespace depot::ops
