// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// plan_index(layout, dtype, expr, op, device): host code that turns a NumPy index expression
// into an index_plan (index_plan.hpp). The rules are NumPy's basic and advanced indexing:
//
//  - Integers select (removing the dimension; negative values count from the end), slices
//    keep it (Python's clamping rules), depot::newaxis adds a dimension of 1, one
//    depot::ellipsis stands for as many full slices as needed; dimensions not named are
//    full slices. Basic indexing only: a VIEW (zero-copy) for reads.
//  - Index arrays (int32/int64, any rank) broadcast together with each other and with the
//    index lists of boolean masks (a k-d mask over k dimensions acts as its k nonzero()
//    arrays); integers join them as 0-d arrays. When the advanced indices (integers
//    included) are adjacent, the broadcast dimensions replace them in place; when a slice,
//    newaxis or ellipsis separates them, the broadcast dimensions go first. A 0-d mask
//    (`true` / `false`) adds a dimension of 1 / 0. Reads become a GATHER (a new array).
//  - Writes: a tensor into a basic region is a COPY, into advanced positions a SCATTER; a
//    scalar is a FILL everywhere (see index_plan.hpp for the kernels). The value broadcasts
//    to the shape of x[expr] (leading dimensions of size 1 of the value are dropped, as in
//    NumPy). Repeated indices in a write: one of the writes wins, unspecified which (NumPy:
//    in practice the last).
//
// Errors, thrown before anything is read or written on the device: an out-of-range integer
// or index-array value is depot::index_error naming the value, the dimension of x, its size
// and (for arrays) the position in the index array; everything else (too many indices, two
// ellipses, a mask whose shape does not match the dimensions it covers, index arrays that do
// not broadcast, a zero step, a result of rank > 8, index arrays that are not int32/int64)
// is depot::invalid_argument naming the values.
//
// Differences from NumPy (also in README.md, "Indexing"):
//  - Out-of-range indices raise depot::index_error (std::out_of_range); NumPy's other
//    IndexErrors (too many indices, mask shape mismatch) are depot::invalid_argument.
//  - At most depot::max_rank (8) dimensions, in x, in the result and in index arrays.
//  - Index arrays are int32 or int64 only (NumPy: any integer type); float arrays and
//    other dtypes are refused (at compile time for strided_view, at run time for
//    index_item::from_array).
//  - A 0-d index array acts as an integer, so the result is a VIEW (NumPy returns a copy with
//    the same shape and values).
//  - Assigning with repeated indices: which write wins is unspecified.
//  - Index values are validated before anything is written; NumPy may have written part of
//    a result before an error in some paths.
#include <depot/hal/expects.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/index_expr.hpp>
#include <depot/storage/index_plan.hpp>
#include <depot/storage/layout.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace depot {

namespace detail {

inline std::string shape_string(const std::int64_t* s, int rank)
{
  std::string out = "[";
  for (int d = 0; d < rank; ++d) out += (d ? ", " : "") + std::to_string(s[d]);
  return out + "]";
}

inline std::int64_t index_mul(std::int64_t a, std::int64_t b)
{
  std::int64_t r = 0;
  DEPOT_EXPECTS(!__builtin_mul_overflow(a, b, &r),
                "depot::index: " + std::to_string(a) + " x " + std::to_string(b) + " overflows int64");
  return r;
}

// Python's slice.indices() for an extent n: first element and count (step checked).
inline std::pair<std::int64_t, std::int64_t> slice_range(const slice& s, std::int64_t n)
{
  const std::int64_t step = s.checked_step();
  auto bound = [](const std::optional<std::int64_t>& v) {
    if (!v) return layout::slice_end;
    return *v == layout::slice_end ? layout::slice_end - 1 : *v;  // an explicit huge bound clamps
  };
  const layout one = layout::contiguous({n}).slice(0, bound(s.start), bound(s.stop), step);
  return {one.size(0) > 0 ? one.offset() : 0, one.size(0)};
}

// An advanced index after planning: its extent and stride in x, the dimension of x it
// indexes (-1 for a 0-d mask), and its values on the host (for the offsets route).
struct planned_fancy {
  const index_item* item = nullptr;
  int x_dim = -1;
  std::int64_t extent = 1;
  std::int64_t stride = 0;
  int mask_axis = -1;  // masks: which axis of the mask; -1 for arrays
  int vdim = -1;       // its dimension in the source view (-1 for a 0-d mask)
  std::vector<std::int64_t> shape;   // index shape (arrays: their shape; masks: [count])
  std::vector<std::int64_t> values;  // offsets route: the (wrapped) indices, row-major
};

}  // namespace detail

// Plans x[expr] for a layout `x` of elements of `type`, for reading (op = read), assigning a
// tensor (assign) or a scalar (fill) on device family `target` (which decides whether index
// arrays on another device count as uploads in temp_bytes). Index values are read on the host
// only on the offsets route and for 0-d index arrays (plan.host_read says so). Thread-safe
// (no shared state); throws as the header comment says, before anything is written.
[[nodiscard]] inline index_plan plan_index(const layout& x, dtype type, const index_expr& expr,
                                           index_op op = index_op::read, device_kind target = device_kind::host)
{
  using kind = index_item::kind;
  const int n = x.rank();
  const auto items = expr.items();
  const auto es = static_cast<std::int64_t>(size_of(type));
  index_plan plan;
  auto where = [&] { return " (indexing " + x.to_string() + " with " + expr.to_string() + ")"; };

  // 1. Classify; 0-d index arrays act as integers.
  struct entry {
    kind k;
    const index_item* item;
    std::int64_t value;
  };
  std::vector<entry> entries;
  int consumed = 0;
  int ellipses = 0;
  int n_arrays = 0;
  int n_masks = 0;
  int n_bool0 = 0;
  for (const index_item& it : items) {
    switch (it.get_kind()) {
      case kind::integer: entries.push_back({kind::integer, &it, it.integer()}); ++consumed; break;
      case kind::slice:
        (void)it.get_slice().checked_step();
        entries.push_back({kind::slice, &it, 0});
        ++consumed;
        break;
      case kind::newaxis: entries.push_back({kind::newaxis, &it, 0}); break;
      case kind::ellipsis:
        DEPOT_EXPECTS(++ellipses <= 1, "depot::index: an index can only have a single ellipsis ('...')" + where());
        entries.push_back({kind::ellipsis, &it, 0});
        break;
      case kind::array:
        DEPOT_EXPECTS(it.ref().type == dtype::int32 || it.ref().type == dtype::int64,
                      "depot::index: index arrays must be int32 or int64, got " +
                          std::string{to_string(it.ref().type)} + where());
        if (it.ref().rank == 0) {
          entries.push_back({kind::integer, &it, it.host_indices().at(0)});
          plan.host_read = true;
        } else {
          entries.push_back({kind::array, &it, 0});
          ++n_arrays;
        }
        ++consumed;
        break;
      case kind::mask:
        DEPOT_EXPECTS(it.ref().type == dtype::bool_,
                      "depot::index: masks must be bool, got " + std::string{to_string(it.ref().type)} + where());
        entries.push_back({kind::mask, &it, 0});
        if (it.ref().rank == 0) {
          ++n_bool0;
        } else {
          ++n_masks;
          consumed += it.ref().rank;
        }
        break;
    }
  }
  DEPOT_EXPECTS(consumed <= n, "depot::index: too many indices: the array has rank " + std::to_string(n) + " but " +
                                   std::to_string(consumed) + " dimensions are indexed" + where());
  const bool has_fancy = n_arrays + n_masks + n_bool0 > 0;

  // 2. Walk the entries: basic outputs, the source view (advanced dimensions kept in place)
  // and the advanced indices; NumPy's rule for where the broadcast dimensions go.
  struct dimension {
    std::int64_t size;
    std::int64_t stride;
  };
  std::vector<dimension> out;     // basic result dimensions, in order
  std::vector<dimension> vdims;   // the source view
  std::vector<detail::planned_fancy> fancy;
  std::int64_t offset = x.offset();
  int curr = 0;
  int result_dim = 0;
  int consec = 0;
  int consec_status = -1;  // -1 none yet, 0 in a run of advanced indices, 1 run ended, 2 separated
  auto keep = [&](std::int64_t size, std::int64_t stride) {
    out.push_back({size, stride});
    vdims.push_back({size, stride});
    ++result_dim;
  };
  for (const entry& e : entries) {
    const bool advanced = e.k == kind::array || e.k == kind::mask || (e.k == kind::integer && has_fancy);
    if (advanced) {
      if (consec_status == -1) {
        consec = result_dim;
        consec_status = 0;
      } else if (consec_status == 1) {
        consec_status = 2;
        consec = 0;
      }
    } else if (consec_status == 0) {
      consec_status = 1;
    }
    switch (e.k) {
      case kind::integer: {
        const std::int64_t size = x.size(curr);
        const std::int64_t i = e.value < 0 ? e.value + size : e.value;
        if (i < 0 || i >= size) throw index_error(e.value, curr, size);
        offset += i * x.stride(curr);
        ++curr;
        break;
      }
      case kind::slice: {
        const auto [first, count] = detail::slice_range(e.item->get_slice(), x.size(curr));
        const std::int64_t step = e.item->get_slice().checked_step();
        if (count > 0) offset += first * x.stride(curr);
        keep(count, detail::index_mul(x.stride(curr), step));
        ++curr;
        break;
      }
      case kind::newaxis: keep(1, 0); break;
      case kind::ellipsis:
        for (int k = 0; k < n - consumed; ++k, ++curr) keep(x.size(curr), x.stride(curr));
        break;
      case kind::array: {
        detail::planned_fancy f;
        f.item = e.item;
        f.x_dim = curr;
        f.extent = x.size(curr);
        f.stride = x.stride(curr);
        f.vdim = static_cast<int>(vdims.size());
        f.shape.assign(e.item->ref().shape.begin(), e.item->ref().shape.begin() + e.item->ref().rank);
        fancy.push_back(std::move(f));
        vdims.push_back({x.size(curr), x.stride(curr)});
        ++curr;
        break;
      }
      case kind::mask: {
        const array_ref& m = e.item->ref();
        if (m.rank == 0) {
          detail::planned_fancy f;
          f.item = e.item;
          fancy.push_back(std::move(f));
          break;
        }
        for (int j = 0; j < m.rank; ++j) {
          const std::int64_t have = x.size(curr + j);
          const std::int64_t want = m.shape[static_cast<std::size_t>(j)];
          DEPOT_EXPECTS(have == want, "depot::index: boolean index did not match indexed array along dimension " +
                                          std::to_string(curr + j) + "; dimension is " + std::to_string(have) +
                                          " but corresponding boolean dimension is " + std::to_string(want) +
                                          " (mask shape " + detail::shape_string(m.shape.data(), m.rank) + ")" +
                                          where());
        }
        for (int j = 0; j < m.rank; ++j, ++curr) {
          detail::planned_fancy f;
          f.item = e.item;
          f.x_dim = curr;
          f.extent = x.size(curr);
          f.stride = x.stride(curr);
          f.mask_axis = j;
          f.vdim = static_cast<int>(vdims.size());
          fancy.push_back(std::move(f));
          vdims.push_back({x.size(curr), x.stride(curr)});
        }
        break;
      }
    }
  }
  for (; curr < n; ++curr) keep(x.size(curr), x.stride(curr));  // the implicit trailing ellipsis

  auto set_shape = [&](const std::vector<std::int64_t>& shape) {
    DEPOT_EXPECTS(shape.size() <= static_cast<std::size_t>(max_rank),
                  "depot::index: the result would have rank " + std::to_string(shape.size()) +
                      ", more than the maximum of " + std::to_string(max_rank) + where());
    plan.rank = static_cast<int>(shape.size());
    std::copy(shape.begin(), shape.end(), plan.shape.begin());
  };
  auto set_contiguous_strides = [&] {
    std::int64_t stride = 1;
    bool unknown = false;
    for (int d = plan.rank - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      plan.strides[u] = unknown ? -1 : stride;
      if (plan.shape[u] < 0) {
        unknown = true;
      } else {
        stride = detail::index_mul(stride, std::max<std::int64_t>(plan.shape[u], 1));
      }
    }
  };
  auto source_layout = [&] {
    std::vector<std::int64_t> shape;
    std::vector<std::int64_t> strides;
    for (const auto& d : vdims) {
      shape.push_back(d.size);
      strides.push_back(d.stride);
    }
    DEPOT_EXPECTS(shape.size() <= static_cast<std::size_t>(max_rank),
                  "depot::index: rank " + std::to_string(shape.size()) + " exceeds the maximum of " +
                      std::to_string(max_rank) + where());
    return layout{shape, strides, offset};
  };

  // 3. Basic indexing only: a strided region of x.
  if (!has_fancy) {
    plan.kind = op == index_op::read ? index_plan_kind::view
                : op == index_op::assign ? index_plan_kind::copy : index_plan_kind::fill;
    plan.route = index_route::strided;
    plan.source = source_layout();
    plan.rank = plan.source.rank();
    for (int d = 0; d < plan.rank; ++d) {
      plan.shape[static_cast<std::size_t>(d)] = plan.source.size(d);
      plan.strides[static_cast<std::size_t>(d)] = plan.source.stride(d);
    }
    plan.offset = offset;
    plan.byte_offset = detail::index_mul(offset, es);
    return plan;
  }

  plan.kind = op == index_op::read ? index_plan_kind::gather
              : op == index_op::assign ? index_plan_kind::scatter : index_plan_kind::fill;
  plan.batch_pos = consec_status == 2 ? 0 : consec;
  plan.offset = offset;
  plan.byte_offset = detail::index_mul(offset, es);

  // 4a. One index array: index_select along its dimension of the source view.
  if (n_arrays == 1 && n_masks == 0 && n_bool0 == 0) {
    const detail::planned_fancy& f = fancy.front();
    plan.route = index_route::index_select;
    plan.source = source_layout();
    plan.dim = f.vdim;
    plan.x_dim = f.x_dim;
    plan.batch_rank = static_cast<int>(f.shape.size());
    plan.index = *f.item;
    std::vector<std::int64_t> shape;
    for (int d = 0; d < plan.source.rank(); ++d) {
      if (d != plan.dim) shape.push_back(plan.source.size(d));
    }
    shape.insert(shape.begin() + plan.batch_pos, f.shape.begin(), f.shape.end());
    set_shape(shape);
    set_contiguous_strides();
    const array_ref& idx = f.item->ref();
    const std::int64_t count = idx.numel();
    if (f.item->device() != target) {
      plan.temp_bytes += static_cast<std::size_t>(count) * sizeof(std::int64_t);
    } else {
      const layout l{std::span<const std::int64_t>{idx.shape.data(), static_cast<std::size_t>(idx.rank)},
                     std::span<const std::int64_t>{idx.strides.data(), static_cast<std::size_t>(idx.rank)},
                     0};
      if (idx.rank > 1 && !l.view_as({count})) plan.temp_bytes += static_cast<std::size_t>(count) * sizeof(std::int64_t);
    }
    if (op == index_op::fill) plan.temp_bytes += size_of(type);
    return plan;
  }

  // 4b. One mask whose count lands where its dimensions are: compaction on the device.
  if (n_masks == 1 && n_arrays == 0 && n_bool0 == 0 && op != index_op::assign) {
    int p = -1;
    for (const auto& f : fancy) {
      if (f.mask_axis == 0) p = f.vdim;
    }
    if (plan.batch_pos == p) {
      const detail::planned_fancy& f = fancy.front();
      plan.route = index_route::mask;
      plan.source = source_layout();
      plan.dim = p;
      plan.x_dim = f.x_dim;
      plan.batch_rank = 1;
      plan.index = *f.item;
      plan.mask_compaction = op == index_op::read;
      const int k = f.item->ref().rank;
      std::vector<std::int64_t> shape;
      for (int d = 0; d < plan.source.rank(); ++d) {
        if (d == p) shape.push_back(-1);
        if (d < p || d >= p + k) shape.push_back(plan.source.size(d));
      }
      set_shape(shape);
      set_contiguous_strides();
      if (f.item->device() != target) plan.temp_bytes += static_cast<std::size_t>(f.item->ref().numel());
      return plan;
    }
  }

  // 4c. The general case: read the indices, validate, broadcast, compute element offsets.
  plan.route = index_route::offsets;
  plan.host_read = true;
  {
    const index_item* last_mask = nullptr;
    std::vector<std::vector<std::int64_t>> nonzero;  // per axis of the current mask
    for (auto& f : fancy) {
      if (f.mask_axis < 0 && f.x_dim >= 0) {  // an index array
        f.values = f.item->host_indices();
        for (std::size_t i = 0; i < f.values.size(); ++i) {
          std::int64_t& v = f.values[i];
          if (v < -f.extent || v >= f.extent) throw index_error(v, f.x_dim, f.extent, static_cast<std::int64_t>(i));
          if (v < 0) v += f.extent;
        }
        continue;
      }
      if (f.x_dim < 0) {  // a 0-d mask: [0] or []
        const bool on = f.item->host_mask().at(0) != 0;
        f.shape = {on ? 1 : 0};
        f.values.assign(on ? 1 : 0, 0);
        continue;
      }
      if (f.item != last_mask) {  // the mask's nonzero(), once per mask
        last_mask = f.item;
        const array_ref& m = f.item->ref();
        const std::vector<std::uint8_t> bits = f.item->host_mask();
        nonzero.assign(static_cast<std::size_t>(m.rank), {});
        std::vector<std::int64_t> at(static_cast<std::size_t>(m.rank), 0);
        for (std::uint8_t b : bits) {
          if (b != 0) {
            for (int j = 0; j < m.rank; ++j) nonzero[static_cast<std::size_t>(j)].push_back(at[static_cast<std::size_t>(j)]);
          }
          for (int j = m.rank - 1; j >= 0; --j) {
            if (++at[static_cast<std::size_t>(j)] < m.shape[static_cast<std::size_t>(j)]) break;
            at[static_cast<std::size_t>(j)] = 0;
          }
        }
      }
      f.values = nonzero[static_cast<std::size_t>(f.mask_axis)];
      f.shape = {static_cast<std::int64_t>(f.values.size())};
    }
  }

  // Broadcast the index shapes (right-aligned, NumPy's rule).
  std::size_t brank = 0;
  for (const auto& f : fancy) brank = std::max(brank, f.shape.size());
  DEPOT_EXPECTS(brank <= static_cast<std::size_t>(max_rank),
                "depot::index: index arrays of rank " + std::to_string(brank) + " exceed the maximum of " +
                    std::to_string(max_rank) + where());
  std::vector<std::int64_t> batch(brank, 1);
  for (const auto& f : fancy) {
    const std::size_t r = f.shape.size();
    for (std::size_t j = 0; j < r; ++j) {
      std::int64_t& b = batch[brank - r + j];
      const std::int64_t s = f.shape[j];
      if (s == b || s == 1) continue;
      if (b == 1) {
        b = s;
        continue;
      }
      std::string shapes;
      for (const auto& g : fancy) shapes += " " + detail::shape_string(g.shape.data(), static_cast<int>(g.shape.size()));
      throw invalid_argument("depot::index: shape mismatch: indexing arrays could not be broadcast together with shapes" +
                             shapes + where());
    }
  }
  std::vector<std::int64_t> shape;
  for (const auto& d : out) shape.push_back(d.size);
  shape.insert(shape.begin() + plan.batch_pos, batch.begin(), batch.end());
  set_shape(shape);
  set_contiguous_strides();
  plan.batch_rank = static_cast<int>(brank);

  // Per index in the broadcast shape: the sum of index * stride over the advanced indices.
  std::int64_t bn = 1;
  for (std::int64_t b : batch) bn = detail::index_mul(bn, b);
  std::vector<std::int64_t> batch_off(static_cast<std::size_t>(bn), 0);
  for (const auto& f : fancy) {
    // The array's row-major strides, right-aligned in the batch shape (0 where it broadcasts).
    std::vector<std::int64_t> st(brank, 0);
    std::int64_t s = 1;
    for (std::size_t j = f.shape.size(); j-- > 0;) {
      st[brank - f.shape.size() + j] = f.shape[j] == 1 ? 0 : s;
      s *= f.shape[j];
    }
    std::vector<std::int64_t> at(brank, 0);
    std::int64_t src = 0;
    for (std::int64_t i = 0; i < bn; ++i) {
      batch_off[static_cast<std::size_t>(i)] += f.values[static_cast<std::size_t>(src)] * f.stride;
      for (std::size_t j = brank; j-- > 0;) {
        src += st[j];
        if (++at[j] < batch[j]) break;
        src -= st[j] * at[j];
        at[j] = 0;
      }
    }
  }

  // Every result element: offset + basic part + batch part, row-major over `shape`.
  const std::int64_t total = plan.numel();
  plan.offsets.resize(static_cast<std::size_t>(total));
  plan.temp_bytes += static_cast<std::size_t>(total) * sizeof(std::int64_t);
  if (op == index_op::fill) plan.temp_bytes += size_of(type);
  if (total > 0) {
    // Result dimensions: (size, basic stride, batch stride in batch_off).
    struct rdim {
      std::int64_t size, stride, bstride;
    };
    std::vector<rdim> rd;
    for (int d = 0; d < static_cast<int>(out.size()); ++d) rd.push_back({out[static_cast<std::size_t>(d)].size, out[static_cast<std::size_t>(d)].stride, 0});
    std::vector<rdim> bd;
    std::int64_t bs = 1;
    for (std::size_t j = brank; j-- > 0;) {
      bd.insert(bd.begin(), rdim{batch[j], 0, bs});
      bs *= batch[j];
    }
    rd.insert(rd.begin() + plan.batch_pos, bd.begin(), bd.end());
    std::vector<std::int64_t> at(rd.size(), 0);
    std::int64_t off = offset;
    std::int64_t b = 0;
    for (std::int64_t i = 0; i < total; ++i) {
      plan.offsets[static_cast<std::size_t>(i)] = off + batch_off[static_cast<std::size_t>(b)];
      for (std::size_t j = rd.size(); j-- > 0;) {
        off += rd[j].stride;
        b += rd[j].bstride;
        if (++at[j] < rd[j].size) break;
        off -= rd[j].stride * at[j];
        b -= rd[j].bstride * at[j];
        at[j] = 0;
      }
    }
    const auto [lo, hi] = x.offset_range();
    plan.lo = lo;
    plan.hi = hi;
  }
  return plan;
}

}  // namespace depot
