// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Internal to ops/: a gather or scatter along one dimension seen as
// [other dimensions] x [index] x [inner], where `inner` is the last coalesced dimension after
// `dim` and every other dimension joins `outer` (any order of visiting elements is correct).
#include "kokkos/kernel_support.hpp"

#include <string>

namespace depot::ops::detail {

struct gather_shape {
  strided_shape<2> outer;  // [0] = the indexed-into side ("dst" of the gather's output), [1] = the other
  std::int64_t index_n = 0, extent = 0, index_stride = 0;
  std::int64_t dst_dim_stride = 0, src_dim_stride = 0;
  std::int64_t inner_n = 1, dst_inner_stride = 0, src_inner_stride = 0;

  // `dense` is the array with index_n along dim (gather: dst; scatter: src); `indexed` has
  // `extent` along dim (gather: src; scatter: dst).
  static gather_shape make(const char* what, const array_ref& dense, const array_ref& indexed, int dim,
                           const array_ref& index)
  {
    DEPOT_EXPECTS(dense.rank == indexed.rank && dense.rank >= 1,
                  std::string{what} + ": ranks differ or are 0: " + dense.to_string() + " and " + indexed.to_string());
    DEPOT_EXPECTS(dim >= 0 && dim < indexed.rank, std::string{what} + ": dimension " + std::to_string(dim) +
                                                      " is out of range for rank " + std::to_string(indexed.rank) +
                                                      " (valid: 0.." + std::to_string(indexed.rank - 1) + ")");
    DEPOT_EXPECTS(index.rank == 1, std::string{what} + ": the index must be 1-D, got " + index.to_string());
    for (int d = 0; d < dense.rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const std::int64_t want = d == dim ? index.shape[0] : indexed.shape[u];
      DEPOT_EXPECTS(dense.shape[u] == want, std::string{what} + ": size " + std::to_string(dense.shape[u]) +
                                                " of dimension " + std::to_string(d) + " of " + dense.to_string() +
                                                " should be " + std::to_string(want) + " (index " +
                                                index.to_string() + ", indexed array " + indexed.to_string() + ")");
    }
    gather_shape g;
    const auto ud = static_cast<std::size_t>(dim);
    g.index_n = index.shape[0];
    g.index_stride = index.strides[0];
    g.extent = indexed.shape[ud];
    g.dst_dim_stride = dense.strides[ud];
    g.src_dim_stride = indexed.strides[ud];
    // Inner dimensions coalesced jointly; the last becomes `inner`, the rest join `outer`.
    array_ref a = dense, b = indexed;
    a.rank = b.rank = 0;
    for (int d = 0; d < dense.rank; ++d) {
      if (d == dim) continue;
      const auto u = static_cast<std::size_t>(d);
      const auto k = static_cast<std::size_t>(a.rank);
      a.shape[k] = b.shape[k] = dense.shape[u];
      a.strides[k] = dense.strides[u];
      b.strides[k] = indexed.strides[u];
      ++a.rank;
      ++b.rank;
    }
    const array_ref* arrays[2] = {&a, &b};
    auto rest = coalesce<2>(arrays);
    // Take the last coalesced dimension as inner only if it came from after `dim`.
    int after = 0;
    for (int d = dim + 1; d < dense.rank; ++d) after += dense.shape[static_cast<std::size_t>(d)] != 1;
    if (after > 0 && rest.rank > 0) {
      const int last = rest.rank - 1;
      g.inner_n = rest.shape[last];
      g.dst_inner_stride = rest.strides[0][last];
      g.src_inner_stride = rest.strides[1][last];
      rest.rank = last;
    }
    g.outer = rest;
    return g;
  }

  [[nodiscard]] bool fits_int32() const
  {
    const std::int64_t n = outer.shape_numel() * index_n * inner_n;
    if (n >= (std::int64_t{1} << 31) || extent >= (std::int64_t{1} << 31)) return false;
    for (int a = 0; a < 2; ++a) {
      std::int64_t reach = 0;
      for (int d = 0; d < outer.rank; ++d) reach += std::abs(outer.strides[a][d]) * (outer.shape[d] - 1);
      reach += std::abs(a == 0 ? dst_dim_stride : src_dim_stride) * ((a == 0 ? index_n : extent) - 1);
      reach += std::abs(a == 0 ? dst_inner_stride : src_inner_stride) * (inner_n - 1);
      if (reach >= (std::int64_t{1} << 31)) return false;
    }
    return std::abs(index_stride) * index_n < (std::int64_t{1} << 31);
  }

  // True when every offset is a multiple of `width` bytes and the inner block is dense.
  [[nodiscard]] bool can_widen(const void* p, const void* q, std::size_t es, std::size_t width) const
  {
    if (es >= width || inner_n <= 1 || dst_inner_stride != 1 || src_inner_stride != 1) return false;
    const auto w = static_cast<std::int64_t>(width);
    const auto e = static_cast<std::int64_t>(es);
    auto aligned = [&](std::int64_t stride_elems) { return (stride_elems * e) % w == 0; };
    if (reinterpret_cast<std::uintptr_t>(p) % width || reinterpret_cast<std::uintptr_t>(q) % width) return false;
    if (!aligned(inner_n) || !aligned(dst_dim_stride) || !aligned(src_dim_stride)) return false;
    for (int a = 0; a < 2; ++a) {
      for (int d = 0; d < outer.rank; ++d) {
        if (!aligned(outer.strides[a][d])) return false;
      }
    }
    return true;
  }
  void widen(std::size_t es, std::size_t width)
  {
    const auto f = static_cast<std::int64_t>(width / es);
    inner_n /= f;
    dst_dim_stride /= f;
    src_dim_stride /= f;
    for (int a = 0; a < 2; ++a) {
      for (int d = 0; d < outer.rank; ++d) outer.strides[a][d] /= f;
    }
  }
};

}  // namespace depot::ops::detail
