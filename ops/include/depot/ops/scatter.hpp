// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

namespace depot::ops {

// The inverse of gather: for each i, dst.select(dim, index[i]) (op)= src.select(dim, i),
// where op is assignment (index_copy), atomic addition (index_add), or addition in index
// order (scatter_mode::add_deterministic: the same bits every run). src must have dst's
// shape with size index.numel() along dim. Indices are validated before anything is
// written (depot::index_error); synchronises.
template <class T, class I, device D>
void scatter(const strided_view<T, D>& dst, int dim, const strided_view<I, D>& index, const strided_view<T, D>& src,
             scatter_mode mode = scatter_mode::assign, stream_ref<D> stream = {})
{
  kernels::scatter<D>(dst.ref(), dim, index.ref(), src.ref(), mode, stream);
}

template <class T, class I, device D>
void index_add(const strided_view<T, D>& dst, int dim, const strided_view<I, D>& index, const strided_view<T, D>& src,
               stream_ref<D> stream = {})
{
  kernels::scatter<D>(dst.ref(), dim, index.ref(), src.ref(), scatter_mode::add, stream);
}

}  // namespace depot::ops
