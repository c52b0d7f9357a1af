// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstdint>
#include <vector>

namespace depot::ops {

// index_select: dst = src with dimension `dim` taken at `index` (1-D int32 or int64 of
// device D; negative values count from the end as in NumPy), as "depot::gather". dst must
// have src's shape with size index.numel() along dim. Every index is validated before
// anything is written: depot::index_error names the first bad one, its position and the
// valid range. Synchronises (the validation reads a result).
template <class T, class I, device D>
void gather(const strided_view<T, D>& dst, const strided_view<T, D>& src, int dim, const strided_view<I, D>& index,
            stream_ref<D> stream = {})
{
  kernels::gather<D>(dst.ref(), src.ref(), dim, index.ref(), stream);
}

// As above, into a new contiguous view.
template <class T, class I, device D>
[[nodiscard]] strided_view<T, D> index_select(const strided_view<T, D>& src, int dim, const strided_view<I, D>& index,
                                              stream_ref<D> stream = {})
{
  DEPOT_EXPECTS(dim >= 0 && dim < src.rank(), "depot::ops::index_select: dimension " + std::to_string(dim) +
                                                  " is out of range for rank " + std::to_string(src.rank()));
  DEPOT_EXPECTS(index.rank() == 1, "depot::ops::index_select: the index must be 1-D, got rank " +
                                       std::to_string(index.rank()));
  std::vector<std::int64_t> shape(src.shape().begin(), src.shape().end());
  shape[static_cast<std::size_t>(dim)] = index.numel();
  auto out = strided_view<T, D>::empty(layout::extents{shape.data(), shape.size()});
  kernels::gather<D>(out.ref(), src.ref(), dim, index.ref(), stream);
  return out;
}

}  // namespace depot::ops
