// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/storage/index_item.hpp>
#include <depot/storage/layout.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace depot {

// What an index plan does (index_planner.hpp decides):
//   view    - reading with basic indexing only: the result aliases x (no copy, no kernel)
//   gather  - reading with advanced indexing: a new contiguous array
//   scatter - writing a tensor into advanced positions
//   copy    - writing a tensor into a view region (basic indexing only)
//   fill    - writing one scalar: into a view region, under a mask, or into advanced
//             positions (there as a scatter of a zero-stride one-element source)
enum class index_plan_kind : std::uint8_t { view, gather, scatter, copy, fill };

// Which kernels run it (element_kernels.hpp):
//   strided      - none (view) or kernels::copy / kernels::fill on the region
//   index_select - one index array along one dimension of `source`: kernels::gather /
//                  kernels::scatter (the fast path; the index stays on the device and the
//                  kernel validates it before anything is written)
//   mask         - one boolean mask over dimensions of `source`: kernels::count_true +
//                  masked_select (read) or kernels::masked_fill (fill)
//   offsets      - everything else: int64 element offsets computed and validated on the host
//                  (index values are read there), uploaded, then kernels::take / kernels::put
enum class index_route : std::uint8_t { strided, index_select, mask, offsets };

// What the plan is for: reading x[expr], x[expr] = tensor, x[expr] = scalar.
enum class index_op : std::uint8_t { read, assign, fill };

[[nodiscard]] constexpr const char* to_string(index_plan_kind k) noexcept
{
  switch (k) {
    case index_plan_kind::view: return "view";
    case index_plan_kind::gather: return "gather";
    case index_plan_kind::scatter: return "scatter";
    case index_plan_kind::copy: return "copy";
    case index_plan_kind::fill: return "fill";
  }
  return "unknown";
}
[[nodiscard]] constexpr const char* to_string(index_route r) noexcept
{
  switch (r) {
    case index_route::strided: return "strided";
    case index_route::index_select: return "index_select";
    case index_route::mask: return "mask";
    case index_route::offsets: return "offsets";
  }
  return "unknown";
}

// The result of planning x[expr] for a layout and dtype: a plain value (host data only,
// plus shared handles on the expression's index arrays). Made by plan_index(); executed by
// strided_view::index / index_put. Shapes are in NumPy's result order.
struct index_plan {
  index_plan_kind kind = index_plan_kind::view;
  index_route route = index_route::strided;

  // The shape of x[expr] (what a read returns, what an assigned value broadcasts to). On the
  // mask route the masked dimension (at batch_pos) is -1: its size, the mask's count of true
  // elements, is known only on the device (mask_compaction).
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
  // view, and copy/fill on the strided route: the region's strides in x's storage (elements).
  // Otherwise the row-major strides of a contiguous array of `shape` (-1 where they depend on
  // the mask's unknown count).
  std::array<std::int64_t, max_rank> strides{};
  // strided route: the region's first element; other routes: source's first element.
  std::int64_t offset = 0;       // in elements from the start of x's storage
  std::int64_t byte_offset = 0;  // the same in bytes

  // index_select and mask routes: x after basic indexing, with the advanced dimensions kept
  // in place (the view the kernel runs on); strided route: the region itself.
  layout source{};
  int dim = -1;          // index_select: dimension of `source` the index runs along; mask: the
                         // first dimension of `source` the mask covers; -1 otherwise
  int x_dim = -1;        // the dimension of x that `dim` is (for error messages)
  int batch_rank = 0;    // rank of the broadcast index shape (index_select: the index array's)
  int batch_pos = 0;     // where those dimensions start in `shape` (0 when NumPy moves them to
                         // the front because advanced indices are separated)
  std::optional<index_item> index;  // index_select: the index array; mask: the mask

  // offsets route: one int64 element offset (from the start of x's storage) per element of
  // `shape`, row-major; all lie in [lo, hi].
  std::vector<std::int64_t> offsets;
  std::int64_t lo = 0;
  std::int64_t hi = 0;

  bool mask_compaction = false;  // a read that compacts a mask (count_true + masked_select)
  bool host_read = false;        // the planner read index values on the host (synchronised)
  std::size_t temp_bytes = 0;    // device scratch the execution needs (index uploads, offsets,
                                 // one-element fill sources, contiguous index copies); not
                                 // counting the result of a gather or the assigned value

  [[nodiscard]] std::span<const std::int64_t> shape_span() const noexcept
  {
    return {shape.data(), static_cast<std::size_t>(rank)};
  }
  [[nodiscard]] std::span<const std::int64_t> strides_span() const noexcept
  {
    return {strides.data(), static_cast<std::size_t>(rank)};
  }
  // Elements of the result; -1 when it depends on a mask's count.
  [[nodiscard]] std::int64_t numel() const noexcept
  {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
      if (shape[static_cast<std::size_t>(d)] < 0) return -1;
      n *= shape[static_cast<std::size_t>(d)];
    }
    return n;
  }

  // "gather via offsets: shape [2, 3] strides [3, 1] offset 0 (0 bytes), temp 48 bytes"
  [[nodiscard]] std::string to_string() const
  {
    auto list = [&](const std::array<std::int64_t, max_rank>& a) {
      std::string s = "[";
      for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(a[static_cast<std::size_t>(d)]);
      return s + "]";
    };
    std::string s = std::string{depot::to_string(kind)} + " via " + depot::to_string(route) + ": shape " + list(shape) +
                    " strides " + list(strides) + " offset " + std::to_string(offset) + " (" +
                    std::to_string(byte_offset) + " bytes)";
    if (dim >= 0) s += ", dim " + std::to_string(dim) + " of " + source.to_string();
    if (mask_compaction) s += ", mask compaction";
    if (route == index_route::offsets) s += ", " + std::to_string(offsets.size()) + " offsets";
    return s + ", temp " + std::to_string(temp_bytes) + " bytes";
  }
};

}  // namespace depot
