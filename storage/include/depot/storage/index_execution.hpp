// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Internal: runs index plans (index_planner.hpp) for strided_view::index / index_put through
// the element kernels (element_kernels.hpp). Included by strided_view.hpp; not a public API.
// Everything here is synchronous: it returns when the kernels are complete. Every check
// (the planner's, the value's shape, the kernels' own index validation) runs before the
// first write.
#include <depot/hal/index_error.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/index_planner.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace depot::detail {

// A host vector copied into new contiguous storage of D with `shape`.
template <class U, device D, class V>
strided_view<U, D> upload(const std::vector<V>& values, layout::extents shape)
{
  static_assert(sizeof(U) == sizeof(V));
  auto out = strided_view<U, D>::empty(shape);
  if (!values.empty()) runtime<D>::copy(out.data(), values.data(), values.size() * sizeof(V));
  return out;
}

// Device-side temporaries of one execution (kept until the kernels are complete).
template <device D>
struct index_scratch {
  strided_view<std::int64_t, D> indices;
  strided_view<bool, D> mask;
};

// The index array of an index_select plan as a 1-D array in memory of D: the array itself
// when it lives on D and can be seen as 1-D, else an int64 copy (uploaded from the host when
// it lives elsewhere).
template <device D>
array_ref index_on_device(const index_item& it, index_scratch<D>& scratch)
{
  const array_ref& a = it.ref();
  const std::int64_t n = a.numel();
  const layout::extents flat{&n, 1};
  if (it.device() != D::kind) {
    scratch.indices = upload<std::int64_t, D>(it.host_indices(), flat);
    return scratch.indices.ref();
  }
  const layout l{layout::extents{a.shape.data(), static_cast<std::size_t>(a.rank)},
                 layout::extents{a.strides.data(), static_cast<std::size_t>(a.rank)}, 0};
  if (const auto v = l.view_as(flat)) {
    array_ref r = a;
    r.rank = 1;
    r.shape[0] = n;
    r.strides[0] = v->stride(0);
    return r;
  }
  scratch.indices = strided_view<std::int64_t, D>::empty(l.shape());
  kernels::copy<D>(scratch.indices.ref(), a, stream_ref<D>{});
  return array_ref::vector(scratch.indices.data(), dtype::int64, n);
}

// The mask of a mask plan in memory of D (its own shape and strides).
template <device D>
array_ref mask_on_device(const index_item& it, index_scratch<D>& scratch)
{
  if (it.device() == D::kind) return it.ref();
  const array_ref& a = it.ref();
  scratch.mask = upload<bool, D>(it.host_mask(), layout::extents{a.shape.data(), static_cast<std::size_t>(a.rank)});
  return scratch.mask.ref();
}

// The mask broadcast over the plan's source view (stride 0 outside the masked dimensions).
inline array_ref mask_over_source(const array_ref& mask, const index_plan& plan)
{
  array_ref r = mask;
  r.rank = plan.source.rank();
  for (int d = 0; d < r.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const int j = d - plan.dim;
    const bool masked = j >= 0 && j < mask.rank;
    r.shape[u] = plan.source.size(d);
    r.strides[u] = masked ? mask.strides[static_cast<std::size_t>(j)] : 0;
  }
  return r;
}

// An array in the plan's result order seen in its source order: the batch dimensions
// (index_select: the index array's) merged into one and put at plan.dim. std::nullopt when
// the batch dimensions cannot be merged without a copy.
inline std::optional<array_ref> in_source_order(const array_ref& r, const index_plan& plan)
{
  const int b0 = plan.batch_pos;
  const int b1 = plan.batch_pos + plan.batch_rank;
  std::int64_t size = 1;
  std::int64_t stride = 1;
  bool empty = false;
  for (int d = b0; d < b1; ++d) {
    const auto u = static_cast<std::size_t>(d);
    size *= r.shape[u];
    empty = empty || r.shape[u] == 0;
  }
  // Mergeable: each dimension of size > 1 steps over the next ones exactly.
  std::int64_t expected = 0;
  bool have = false;
  for (int d = b1 - 1; d >= b0 && !empty; --d) {
    const auto u = static_cast<std::size_t>(d);
    if (r.shape[u] == 1) continue;
    if (!have) {
      stride = r.strides[u];
      expected = r.strides[u] * r.shape[u];
      have = true;
    } else {
      if (r.strides[u] != expected) return std::nullopt;
      expected *= r.shape[u];
    }
  }
  array_ref out = r;
  out.rank = 0;
  for (int d = 0; d < r.rank; ++d) {
    if (d >= b0 && d < b1) continue;
    out.shape[static_cast<std::size_t>(out.rank)] = r.shape[static_cast<std::size_t>(d)];
    out.strides[static_cast<std::size_t>(out.rank)] = r.strides[static_cast<std::size_t>(d)];
    ++out.rank;
  }
  for (int d = out.rank; d > plan.dim; --d) {
    out.shape[static_cast<std::size_t>(d)] = out.shape[static_cast<std::size_t>(d - 1)];
    out.strides[static_cast<std::size_t>(d)] = out.strides[static_cast<std::size_t>(d - 1)];
  }
  out.shape[static_cast<std::size_t>(plan.dim)] = size;
  out.strides[static_cast<std::size_t>(plan.dim)] = stride;
  ++out.rank;
  return out;
}

// Runs a gather/scatter and reports a bad index against the dimension of x, not of the
// source view the kernel saw.
template <class F>
void with_x_dimension(const index_plan& plan, F&& f)
{
  try {
    f();
  } catch (const index_error& e) {
    throw index_error(e.index(), plan.x_dim, e.size(), e.position());
  }
}

template <class T, device D>
T* storage_base(const strided_view<T, D>& x) noexcept
{
  return x.data() - x.get_layout().offset();
}

// `value` (any layout) broadcast to the plan's shape, NumPy's assignment rule: leading
// dimensions of size 1 are dropped, then right-aligned dimensions must match or be 1.
template <class T, device D>
layout broadcast_value(const strided_view<T, D>& value, const index_plan& plan, const index_expr& expr)
{
  const layout& v = value.get_layout();
  int lead = 0;
  while (v.rank() - lead > plan.rank && v.size(lead) == 1) ++lead;
  const int vr = v.rank() - lead;
  bool ok = vr <= plan.rank;
  std::vector<std::int64_t> shape(plan.shape.begin(), plan.shape.begin() + plan.rank);
  std::vector<std::int64_t> strides(static_cast<std::size_t>(plan.rank), 0);
  for (int j = 0; ok && j < vr; ++j) {
    const int d = plan.rank - vr + j;
    const std::int64_t s = v.size(lead + j);
    if (s == plan.shape[static_cast<std::size_t>(d)]) {
      strides[static_cast<std::size_t>(d)] = v.stride(lead + j);
    } else if (s != 1) {
      ok = false;
    }
  }
  DEPOT_EXPECTS(ok, "depot::index_put: could not broadcast the value of shape " +
                        shape_string(v.shape().data(), v.rank()) + " into shape " +
                        shape_string(plan.shape.data(), plan.rank) + " (x" + expr.to_string() + ")");
  return layout{shape, strides, v.offset()};
}

template <class T, device D>
strided_view<T, D> index_read(const strided_view<T, D>& x, const index_expr& expr)
{
  const index_plan plan = plan_index(x.get_layout(), dtype_of_v<T>, expr, index_op::read, D::kind);
  const stream_ref<D> stream{};
  T* base = storage_base(x);
  index_scratch<D> scratch;
  switch (plan.route) {
    case index_route::strided: return {x.get_storage(), plan.source};
    case index_route::index_select: {
      auto out = strided_view<T, D>::empty(plan.shape_span());
      const array_ref idx = index_on_device<D>(*plan.index, scratch);
      const array_ref dst = *in_source_order(out.ref(), plan);  // contiguous: always mergeable
      const array_ref src = array_ref::of(base, dtype_of_v<T>, plan.source);
      with_x_dimension(plan, [&] { kernels::gather<D>(dst, src, plan.dim, idx, stream); });
      kernels::fence<D>(stream);
      return out;
    }
    case index_route::mask: {
      const array_ref mask = mask_on_device<D>(*plan.index, scratch);
      const std::int64_t count = kernels::count_true<D>(mask, stream);
      std::vector<std::int64_t> shape(plan.shape.begin(), plan.shape.begin() + plan.rank);
      shape[static_cast<std::size_t>(plan.batch_pos)] = count;
      auto out = strided_view<T, D>::empty(shape);
      if (out.numel() > 0) {
        const array_ref src = array_ref::of(base, dtype_of_v<T>, plan.source);
        kernels::masked_select<D>(array_ref::vector(out.data(), dtype_of_v<T>, out.numel()), src,
                                  mask_over_source(mask, plan), stream);
      }
      kernels::fence<D>(stream);
      return out;
    }
    case index_route::offsets: {
      auto out = strided_view<T, D>::empty(plan.shape_span());
      if (out.numel() > 0) {
        const auto offsets = upload<std::int64_t, D>(plan.offsets, plan.shape_span());
        const auto n = static_cast<std::int64_t>(x.get_storage().size());
        kernels::take<D>(out.ref(), array_ref::vector(base, dtype_of_v<T>, n), offsets.ref(), plan.lo, plan.hi,
                         stream);
        kernels::fence<D>(stream);
      }
      return out;
    }
  }
  return {};
}

template <class T, device D, device D2>
void index_assign(const strided_view<T, D>& x, const index_expr& expr, const strided_view<T, D2>& y)
{
  const index_plan plan = plan_index(x.get_layout(), dtype_of_v<T>, expr, index_op::assign, D::kind);
  const stream_ref<D> stream{};
  T* base = storage_base(x);
  // The value on D, never sharing memory with x (NumPy copies an overlapping value first).
  strided_view<T, D> value;
  if constexpr (std::is_same_v<D, D2>) {
    const bool aliases = y.numel() > 0 && storage_base(y) == base;
    value = aliases ? y.clone() : y;
  } else {
    value = y.template to<D>();
  }
  const layout vb = broadcast_value(value, plan, expr);
  array_ref src = array_ref::of(storage_base(value), dtype_of_v<T>, vb);
  index_scratch<D> scratch;
  switch (plan.route) {
    case index_route::strided:
      if (plan.numel() == 0) return;
      kernels::copy<D>(array_ref::of(base, dtype_of_v<T>, plan.source), src, stream);
      break;
    case index_route::index_select: {
      auto s = in_source_order(src, plan);
      strided_view<T, D> dense;
      if (!s) {  // a broadcast the kernel cannot see in source order: make it dense first
        dense = strided_view<T, D>::empty(plan.shape_span());
        kernels::copy<D>(dense.ref(), src, stream);
        s = in_source_order(dense.ref(), plan);
      }
      const array_ref idx = index_on_device<D>(*plan.index, scratch);
      const array_ref dst = array_ref::of(base, dtype_of_v<T>, plan.source);
      with_x_dimension(plan, [&] { kernels::scatter<D>(dst, plan.dim, idx, *s, scatter_mode::assign, stream); });
      break;
    }
    case index_route::mask:  // the planner never picks it for assignments
    case index_route::offsets: {
      if (plan.numel() == 0) return;
      const auto offsets = upload<std::int64_t, D>(plan.offsets, plan.shape_span());
      const auto n = static_cast<std::int64_t>(x.get_storage().size());
      kernels::put<D>(array_ref::vector(base, dtype_of_v<T>, n), offsets.ref(), plan.lo, plan.hi, src,
                      scatter_mode::assign, stream);
      break;
    }
  }
  kernels::fence<D>(stream);
}

template <class T, device D>
void index_fill(const strided_view<T, D>& x, const index_expr& expr, const T& value)
{
  const index_plan plan = plan_index(x.get_layout(), dtype_of_v<T>, expr, index_op::fill, D::kind);
  const stream_ref<D> stream{};
  T* base = storage_base(x);
  index_scratch<D> scratch;
  // A one-element source on D, seen with zero strides (scatter / put of a scalar).
  auto scalar_source = [&](strided_view<T, D>& cell, layout::extents shape) {
    auto one = strided_view<T, host>::empty(layout::extents{});
    *one.data() = value;
    cell = one.template to<D>();
    array_ref r = array_ref::of(cell.data(), dtype_of_v<T>, layout::contiguous(shape));
    for (int d = 0; d < r.rank; ++d) r.strides[static_cast<std::size_t>(d)] = 0;
    return r;
  };
  switch (plan.route) {
    case index_route::strided:
      kernels::fill<D>(array_ref::of(base, dtype_of_v<T>, plan.source), &value, stream);
      break;
    case index_route::mask: {
      const array_ref mask = mask_on_device<D>(*plan.index, scratch);
      kernels::masked_fill<D>(array_ref::of(base, dtype_of_v<T>, plan.source), mask_over_source(mask, plan), &value,
                              stream);
      break;
    }
    case index_route::index_select: {
      const array_ref idx = index_on_device<D>(*plan.index, scratch);
      std::vector<std::int64_t> shape(plan.source.shape().begin(), plan.source.shape().end());
      shape[static_cast<std::size_t>(plan.dim)] = idx.shape[0];
      strided_view<T, D> cell;
      const array_ref src = scalar_source(cell, shape);
      const array_ref dst = array_ref::of(base, dtype_of_v<T>, plan.source);
      with_x_dimension(plan, [&] { kernels::scatter<D>(dst, plan.dim, idx, src, scatter_mode::assign, stream); });
      break;
    }
    case index_route::offsets: {
      if (plan.numel() == 0) return;
      const auto offsets = upload<std::int64_t, D>(plan.offsets, plan.shape_span());
      strided_view<T, D> cell;
      const array_ref src = scalar_source(cell, plan.shape_span());
      const auto n = static_cast<std::int64_t>(x.get_storage().size());
      kernels::put<D>(array_ref::vector(base, dtype_of_v<T>, n), offsets.ref(), plan.lo, plan.hi, src,
                      scatter_mode::assign, stream);
      break;
    }
  }
  kernels::fence<D>(stream);
}

}  // namespace depot::detail
