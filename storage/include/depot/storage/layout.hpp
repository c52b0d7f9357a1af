// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>
#include <depot/hal/index_error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace depot {

inline constexpr int max_rank = 8;

// Where the elements of a strided view sit in its storage: a shape, strides in elements
// (any sign, 0 for broadcast), and an offset in elements, for up to max_rank dimensions.
// A plain value type; every operation returns a new layout and checks its input (bad
// dimensions, out-of-range indices and sizes whose products overflow are refused with
// depot::invalid_argument or depot::index_error). Semantics follow NumPy's basic indexing.
class layout {
 public:
  using extents = std::span<const std::int64_t>;

  layout() = default;  // rank 0: one element at offset 0

  // Row-major (C order) contiguous layout of `shape`.
  [[nodiscard]] static layout contiguous(extents shape)
  {
    layout l;
    l.set_rank(static_cast<int>(shape.size()));
    std::int64_t stride = 1;
    for (int d = l.rank_ - 1; d >= 0; --d) {
      const std::int64_t n = shape[static_cast<std::size_t>(d)];
      DEPOT_EXPECTS(n >= 0, "depot::layout: size " + std::to_string(n) + " of dimension " +
                                std::to_string(d) + " is negative");
      l.shape_[static_cast<std::size_t>(d)] = n;
      l.strides_[static_cast<std::size_t>(d)] = stride;
      stride = checked_mul(stride, std::max<std::int64_t>(n, 1));
    }
    return l;
  }
  [[nodiscard]] static layout contiguous(std::initializer_list<std::int64_t> shape)
  {
    return contiguous(extents{shape.begin(), shape.size()});
  }

  layout(extents shape, extents strides, std::int64_t offset) : offset_{offset}
  {
    DEPOT_EXPECTS(shape.size() == strides.size(),
                  "depot::layout: " + std::to_string(shape.size()) + " sizes but " +
                      std::to_string(strides.size()) + " strides");
    set_rank(static_cast<int>(shape.size()));
    DEPOT_EXPECTS(offset >= 0, "depot::layout: offset " + std::to_string(offset) + " is negative");
    for (int d = 0; d < rank_; ++d) {
      const auto i = static_cast<std::size_t>(d);
      DEPOT_EXPECTS(shape[i] >= 0, "depot::layout: size " + std::to_string(shape[i]) +
                                       " of dimension " + std::to_string(d) + " is negative");
      shape_[i] = shape[i];
      strides_[i] = strides[i];
    }
    (void)numel();  // refuses shapes whose element count overflows
    (void)offset_range();  // and layouts whose offsets do
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] extents shape() const noexcept { return {shape_.data(), static_cast<std::size_t>(rank_)}; }
  [[nodiscard]] extents strides() const noexcept { return {strides_.data(), static_cast<std::size_t>(rank_)}; }
  [[nodiscard]] std::int64_t size(int dim) const { return shape_[checked_dim(dim)]; }
  [[nodiscard]] std::int64_t stride(int dim) const { return strides_[checked_dim(dim)]; }
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }

  [[nodiscard]] std::int64_t numel() const
  {
    std::int64_t n = 1;
    for (int d = 0; d < rank_; ++d) n = checked_mul(n, shape_[static_cast<std::size_t>(d)]);
    return n;
  }

  // True when the elements are dense and in row-major order (size-1 dimensions and empty
  // layouts ignore strides, as in NumPy and PyTorch).
  [[nodiscard]] bool is_contiguous() const noexcept
  {
    std::int64_t expected = 1;
    for (int d = rank_ - 1; d >= 0; --d) {
      const auto i = static_cast<std::size_t>(d);
      if (shape_[i] == 0) return true;
      if (shape_[i] != 1 && strides_[i] != expected) return false;
      expected *= shape_[i];
    }
    return true;
  }

  // Lowest and highest element offsets the layout touches ({offset, offset} when empty).
  // Storage must hold [first, second] for the view to be valid.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> offset_range() const
  {
    std::int64_t lo = offset_;
    std::int64_t hi = offset_;
    if (numel() == 0) return {lo, hi};
    for (int d = 0; d < rank_; ++d) {
      const auto i = static_cast<std::size_t>(d);
      const std::int64_t reach = checked_mul(strides_[i], shape_[i] - 1);
      (strides_[i] < 0 ? lo : hi) = checked_add(strides_[i] < 0 ? lo : hi, reach);
    }
    return {lo, hi};
  }
  [[nodiscard]] std::int64_t min_offset() const { return offset_range().first; }
  [[nodiscard]] std::int64_t max_offset() const { return offset_range().second; }

  // Offset of one element; negative indices count from the end (NumPy). Out of range:
  // depot::index_error naming the index, the dimension and its size.
  [[nodiscard]] std::int64_t offset_of(extents index) const
  {
    DEPOT_EXPECTS(static_cast<int>(index.size()) == rank_,
                  "depot::layout: " + std::to_string(index.size()) + " indices for a rank-" +
                      std::to_string(rank_) + " layout");
    std::int64_t at = offset_;
    for (int d = 0; d < rank_; ++d) {
      at += wrap(index[static_cast<std::size_t>(d)], d) * strides_[static_cast<std::size_t>(d)];
    }
    return at;
  }
  [[nodiscard]] std::int64_t offset_of(std::initializer_list<std::int64_t> index) const
  {
    return offset_of(extents{index.begin(), index.size()});
  }

  // x[..., start:stop:step, ...] along `dim`, with Python's rules: negative start/stop count
  // from the end, out-of-range bounds are clamped, step may be negative, never 0.
  // Use slice_end for an open stop ("x[start:]" or, with a negative step, "x[start::-1]").
  static constexpr std::int64_t slice_end = INT64_MAX;
  [[nodiscard]] layout slice(int dim, std::int64_t start, std::int64_t stop, std::int64_t step = 1) const
  {
    const auto i = checked_dim(dim);
    DEPOT_EXPECTS(step != 0, "depot::layout: slice step must not be 0");
    DEPOT_EXPECTS(step != INT64_MIN, "depot::layout: slice step is too large in magnitude");
    const std::int64_t n = shape_[i];
    auto clamp = [&](std::int64_t v, bool is_start) {
      if (v == slice_end) return step > 0 ? n : (is_start ? n - 1 : std::int64_t{-1});
      if (v < 0) v = v < -n ? (step > 0 ? 0 : -1) : v + n;
      if (v >= n) v = step > 0 ? n : n - 1;
      return v;
    };
    const std::int64_t b = start == slice_end ? (step > 0 ? 0 : n - 1) : clamp(start, true);
    const std::int64_t e = clamp(stop, false);
    std::int64_t count = 0;
    if (step > 0 && e > b) count = (e - b + step - 1) / step;
    if (step < 0 && e < b) count = (b - e + (-step) - 1) / (-step);
    layout out = *this;
    out.shape_[i] = count;
    out.strides_[i] = checked_mul(strides_[i], step);
    if (count > 0) out.offset_ = checked_add(offset_, checked_mul(b, strides_[i]));
    return out;
  }

  // x[..., index, ...]: removes `dim` (negative index counts from the end).
  [[nodiscard]] layout select(int dim, std::int64_t index) const
  {
    const auto i = checked_dim(dim);
    const std::int64_t at = wrap(index, dim);
    layout out;
    out.rank_ = rank_ - 1;
    out.offset_ = offset_ + at * strides_[i];
    for (int d = 0, o = 0; d < rank_; ++d) {
      if (d == dim) continue;
      out.shape_[static_cast<std::size_t>(o)] = shape_[static_cast<std::size_t>(d)];
      out.strides_[static_cast<std::size_t>(o)] = strides_[static_cast<std::size_t>(d)];
      ++o;
    }
    return out;
  }

  [[nodiscard]] layout transpose(int d0, int d1) const
  {
    const auto a = checked_dim(d0);
    const auto b = checked_dim(d1);
    layout out = *this;
    std::swap(out.shape_[a], out.shape_[b]);
    std::swap(out.strides_[a], out.strides_[b]);
    return out;
  }

  // Dimension d of the result is dimension order[d] of this layout; `order` must be a
  // permutation of [0, rank).
  [[nodiscard]] layout permute(std::span<const int> order) const
  {
    DEPOT_EXPECTS(static_cast<int>(order.size()) == rank_,
                  "depot::layout: permute of a rank-" + std::to_string(rank_) + " layout got " +
                      std::to_string(order.size()) + " dimensions");
    std::array<bool, max_rank> seen{};
    layout out = *this;
    for (int d = 0; d < rank_; ++d) {
      const int from = order[static_cast<std::size_t>(d)];
      DEPOT_EXPECTS(from >= 0 && from < rank_ && !seen[static_cast<std::size_t>(from)],
                    "depot::layout: permute order is not a permutation of [0, " +
                        std::to_string(rank_) + ")");
      seen[static_cast<std::size_t>(from)] = true;
      out.shape_[static_cast<std::size_t>(d)] = shape_[static_cast<std::size_t>(from)];
      out.strides_[static_cast<std::size_t>(d)] = strides_[static_cast<std::size_t>(from)];
    }
    return out;
  }
  [[nodiscard]] layout permute(std::initializer_list<int> order) const
  {
    return permute(std::span<const int>{order.begin(), order.size()});
  }

  // The same elements seen with `new_shape` (one entry may be -1: inferred) without
  // copying, when the strides allow it (NumPy's no-copy reshape rule); std::nullopt when a
  // copy would be needed. A shape with a different element count is invalid_argument.
  [[nodiscard]] std::optional<layout> view_as(extents new_shape) const
  {
    std::array<std::int64_t, max_rank> target{};
    const int rank = resolve_shape(new_shape, target);
    layout out;
    out.rank_ = rank;
    out.offset_ = offset_;
    for (int d = 0; d < rank; ++d) out.shape_[static_cast<std::size_t>(d)] = target[static_cast<std::size_t>(d)];
    if (numel() == 0 || is_contiguous()) {
      layout c = contiguous(out.shape());
      c.offset_ = offset_;
      return c;
    }
    // Walk old and new dimensions in chunks whose products agree; each old chunk must be
    // itself contiguous (stride[k] == stride[k+1] * size[k+1]).
    int oi = 0;
    int ni = 0;
    while (oi < rank_ && ni < rank) {
      std::int64_t np = target[static_cast<std::size_t>(ni)];
      std::int64_t op = shape_[static_cast<std::size_t>(oi)];
      int oj = oi + 1;
      int nj = ni + 1;
      while (np != op) {
        if (np < op) {
          np *= target[static_cast<std::size_t>(nj++)];
        } else {
          op *= shape_[static_cast<std::size_t>(oj++)];
        }
      }
      for (int k = oi; k < oj - 1; ++k) {
        const auto u = static_cast<std::size_t>(k);
        if (strides_[u] != strides_[u + 1] * shape_[u + 1]) return std::nullopt;
      }
      std::int64_t stride = strides_[static_cast<std::size_t>(oj - 1)];
      for (int k = nj - 1; k >= ni; --k) {
        out.strides_[static_cast<std::size_t>(k)] = stride;
        stride *= target[static_cast<std::size_t>(k)];
      }
      oi = oj;
      ni = nj;
    }
    for (; ni < rank; ++ni) out.strides_[static_cast<std::size_t>(ni)] = 1;  // trailing size-1
    return out;
  }
  [[nodiscard]] std::optional<layout> view_as(std::initializer_list<std::int64_t> new_shape) const
  {
    return view_as(extents{new_shape.begin(), new_shape.size()});
  }

  friend bool operator==(const layout& a, const layout& b) noexcept
  {
    if (a.rank_ != b.rank_ || a.offset_ != b.offset_) return false;
    for (int d = 0; d < a.rank_; ++d) {
      const auto i = static_cast<std::size_t>(d);
      if (a.shape_[i] != b.shape_[i] || a.strides_[i] != b.strides_[i]) return false;
    }
    return true;
  }

  [[nodiscard]] std::string to_string() const
  {
    std::string s = "layout(shape=[";
    for (int d = 0; d < rank_; ++d) s += (d ? ", " : "") + std::to_string(shape_[static_cast<std::size_t>(d)]);
    s += "], strides=[";
    for (int d = 0; d < rank_; ++d) s += (d ? ", " : "") + std::to_string(strides_[static_cast<std::size_t>(d)]);
    return s + "], offset=" + std::to_string(offset_) + ")";
  }

 private:
  void set_rank(int rank)
  {
    DEPOT_EXPECTS(rank <= max_rank, "depot::layout: rank " + std::to_string(rank) +
                                        " exceeds the maximum of " + std::to_string(max_rank));
    rank_ = rank;
  }

  [[nodiscard]] std::size_t checked_dim(int dim) const
  {
    DEPOT_EXPECTS(dim >= 0 && dim < rank_, "depot::layout: dimension " + std::to_string(dim) +
                                               " is out of range for rank " + std::to_string(rank_) +
                                               ", valid dimensions are [0, " + std::to_string(rank_) + ")");
    return static_cast<std::size_t>(dim);
  }

  [[nodiscard]] std::int64_t wrap(std::int64_t index, int dim) const
  {
    const std::int64_t n = shape_[checked_dim(dim)];
    const std::int64_t i = index < 0 ? index + n : index;
    if (i < 0 || i >= n) throw index_error(index, dim, n);
    return i;
  }

  // new_shape with its -1 resolved into `out`; checks the element count.
  int resolve_shape(extents new_shape, std::array<std::int64_t, max_rank>& out) const
  {
    DEPOT_EXPECTS(new_shape.size() <= static_cast<std::size_t>(max_rank),
                  "depot::layout: rank " + std::to_string(new_shape.size()) + " exceeds the maximum of " +
                      std::to_string(max_rank));
    const std::int64_t total = numel();
    int infer = -1;
    std::int64_t known = 1;
    for (std::size_t d = 0; d < new_shape.size(); ++d) {
      const std::int64_t n = new_shape[d];
      if (n == -1) {
        DEPOT_EXPECTS(infer < 0, "depot::layout: only one dimension can be -1 in a reshape");
        infer = static_cast<int>(d);
        continue;
      }
      DEPOT_EXPECTS(n >= 0, "depot::layout: size " + std::to_string(n) + " in a reshape is negative");
      known = checked_mul(known, n);
      out[d] = n;
    }
    if (infer >= 0) {
      DEPOT_EXPECTS(known != 0 && total % known == 0,
                    "depot::layout: cannot infer -1 in a reshape of " + std::to_string(total) +
                        " elements into blocks of " + std::to_string(known));
      out[static_cast<std::size_t>(infer)] = total / known;
    } else {
      DEPOT_EXPECTS(known == total, "depot::layout: cannot reshape " + std::to_string(total) +
                                        " elements into a shape of " + std::to_string(known));
    }
    return static_cast<int>(new_shape.size());
  }

  static std::int64_t checked_mul(std::int64_t a, std::int64_t b)
  {
    std::int64_t r = 0;
    DEPOT_EXPECTS(!__builtin_mul_overflow(a, b, &r),
                  "depot::layout: " + std::to_string(a) + " x " + std::to_string(b) + " overflows int64");
    return r;
  }
  static std::int64_t checked_add(std::int64_t a, std::int64_t b)
  {
    std::int64_t r = 0;
    DEPOT_EXPECTS(!__builtin_add_overflow(a, b, &r),
                  "depot::layout: " + std::to_string(a) + " + " + std::to_string(b) + " overflows int64");
    return r;
  }

  int rank_ = 0;
  std::array<std::int64_t, max_rank> shape_{};
  std::array<std::int64_t, max_rank> strides_{};
  std::int64_t offset_ = 0;
};

}  // namespace depot
