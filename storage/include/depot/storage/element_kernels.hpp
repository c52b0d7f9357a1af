// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The element kernels the storage layer needs (copy_, fill_, contiguous(), clone(), index
// plans). Declared here, below ops/, and defined by ops/ as Kokkos kernels in the same
// library (libdepot always contains both), so storage never includes Kokkos and ops
// depends only downward. Users call them through <depot/ops/...>, which checks arguments
// first; these entry points check too (they are the last line before a kernel launch).
//
// Common rules: every array_ref lies in memory of device D; work is ordered on `stream`
// and may still run when a function returns, except where it says it synchronises
// (functions that must read a result or validate indices do). Bad input throws before
// anything is written: depot::invalid_argument (shape, dtype, rank), depot::index_error
// (the first out-of-range index, its position and the valid range).
#include <depot/hal/device.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/array_ref.hpp>

#include <cstdint>

namespace depot {

// How scatter combines source elements with the destination.
enum class scatter_mode : std::uint8_t {
  assign,             // dst[idx] = src (the last writer wins when indices repeat: unspecified which)
  add,                // dst[idx] += src with atomics (float sums may differ in the last bits run to run)
  add_deterministic,  // dst[idx] += src in a fixed order: the same bits every run
};

namespace kernels {

// dst[...] = value for every element; `value` points at one element of dst.type.
template <device D>
void fill(const array_ref& dst, const void* value, stream_ref<D> stream);

// dst = src elementwise (same shape; any strides; dtype conversion as static_cast, with
// float16/bfloat16 through float and bool as != 0). Overlapping dst and src is not allowed
// unless they are identical.
template <device D>
void copy(const array_ref& dst, const array_ref& src, stream_ref<D> stream);

// index_select: dst = src with dimension `dim` replaced by index (1-D, int32 or int64;
// negative values count from the end as in NumPy). dst.shape = src.shape with
// shape[dim] = index.numel(). Validates the indices first (synchronises).
template <device D>
void gather(const array_ref& dst, const array_ref& src, int dim, const array_ref& index, stream_ref<D> stream);

// The inverse of gather: dst.select(dim, index[i]) (op)= src.select(dim, i). Validates the
// indices first (synchronises).
template <device D>
void scatter(const array_ref& dst, int dim, const array_ref& index, const array_ref& src, scatter_mode mode,
             stream_ref<D> stream);

// take / put by element offsets (the index plans' general GATHER / SCATTER): offsets is an
// int64 array of dst's (take) or src's (put) shape holding element offsets from base.data,
// each within [lo, hi]; base is the source (take) or destination (put), rank ignored.
template <device D>
void take(const array_ref& dst, const array_ref& base, const array_ref& offsets, std::int64_t lo, std::int64_t hi,
          stream_ref<D> stream);
template <device D>
void put(const array_ref& base, const array_ref& offsets, std::int64_t lo, std::int64_t hi, const array_ref& src,
         scatter_mode mode, stream_ref<D> stream);

// The number of true elements of a bool mask (synchronises).
template <device D>
std::int64_t count_true(const array_ref& mask, stream_ref<D> stream);

// Compaction: dst (1-D, count_true(mask) elements) = the elements of src where mask is
// true, in row-major order. mask has src's shape.
template <device D>
void masked_select(const array_ref& dst, const array_ref& src, const array_ref& mask, stream_ref<D> stream);

// dst[i] = value where mask[i] (mask of dst's shape; `value` is one element of dst.type).
template <device D>
void masked_fill(const array_ref& dst, const array_ref& mask, const void* value, stream_ref<D> stream);

// Waits until the work these kernels queued on `stream` is complete.
template <device D>
void fence(stream_ref<D> stream);

}  // namespace kernels
}  // namespace depot
