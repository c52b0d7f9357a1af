// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// kernels::scatter (index_copy / index_add along a dimension) and kernels::put (by element
// offsets). Assignment moves bits (16-byte words for dense aligned rows); atomic addition
// uses the hardware's atomics (a compare-and-swap loop for 1- and 2-byte types); the
// deterministic mode groups the sources of each target in index order (a stable counting
// sort of the indices on the host) and adds each group in that order, one thread per target
// element, so the bits do not depend on scheduling.
#include "kokkos/gather_shape.hpp"
#include "kokkos/kernel_support.hpp"

#include <depot/storage/element_kernels.hpp>

#include <numeric>
#include <string>
#include <vector>

namespace depot {
namespace ops::detail {
namespace {

// Four floats added as one: Hopper (sm_90) has a 16-byte vector atomic add; elsewhere four
// scalar atomics.
struct alignas(16) float4_add {
  float v[4];
};

KOKKOS_INLINE_FUNCTION void atomic_add_vec(float4_add* p, const float4_add& x)
{
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(x.v[0], x.v[1], x.v[2], x.v[3]));
#else
  for (int k = 0; k < 4; ++k) Kokkos::atomic_add(&p->v[k], x.v[k]);
#endif
}

// In a scatter's gather_shape, [0] is the source (dense along dim) and [1] the destination.
template <class D, class U, class X, class I, bool Add>
void scatter_kernel(U* dst, const U* src, const X* idx, const gather_shape& g, stream_ref<D> stream)
{
  const I inner = static_cast<I>(g.inner_n);
  const I nidx = static_cast<I>(g.index_n);
  const I n = static_cast<I>(g.outer.shape_numel() * g.index_n * g.inner_n);
  const I extent = static_cast<I>(g.extent);
  const I idx_stride = static_cast<I>(g.index_stride);
  const I src_dim = static_cast<I>(g.dst_dim_stride);
  const I dst_dim = static_cast<I>(g.src_dim_stride);
  const I src_in = static_cast<I>(g.dst_inner_stride);
  const I dst_in = static_cast<I>(g.src_inner_stride);
  const auto outer = g.outer;
  const bool single_outer = g.outer.rank == 0;
  Kokkos::parallel_for(Add ? "depot::scatter_add" : "depot::scatter", make_range<D, I>(stream, n), KOKKOS_LAMBDA(I i) {
    const I q = i / inner;
    const I c = i - q * inner;
    const I o = q / nidx;
    const I j = q - o * nidx;
    I v = static_cast<I>(idx[j * idx_stride]);
    if (v < 0) v += extent;
    I off[2] = {0, 0};
    if (!single_outer) outer.offsets(o, off);
    U* target = dst + off[1] + v * dst_dim + c * dst_in;
    const U value = src[off[0] + j * src_dim + c * src_in];
    if constexpr (Add && std::is_same_v<U, float4_add>) {
      atomic_add_vec(target, value);
    } else if constexpr (Add) {
      atomic_add_any(target, value);
    } else {
      *target = value;
    }
  });
}

// Targets grouped in index order: order[starts[t]..starts[t+1]) are the source positions of
// target targets[t], ascending.
struct grouping {
  std::vector<std::int64_t> targets, starts, order;
};

grouping group_by_target(const std::vector<std::int64_t>& target_of)
{
  grouping g;
  const std::size_t n = target_of.size();
  g.order.resize(n);
  std::iota(g.order.begin(), g.order.end(), std::int64_t{0});
  std::stable_sort(g.order.begin(), g.order.end(),
                   [&](std::int64_t a, std::int64_t b) { return target_of[static_cast<std::size_t>(a)] < target_of[static_cast<std::size_t>(b)]; });
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t t = target_of[static_cast<std::size_t>(g.order[k])];
    if (k == 0 || t != g.targets.back()) {
      g.targets.push_back(t);
      g.starts.push_back(static_cast<std::int64_t>(k));
    }
  }
  g.starts.push_back(static_cast<std::int64_t>(n));
  return g;
}

// The values of an index array (any strides, int32/int64), wrapped, on the host.
template <class D>
std::vector<std::int64_t> indices_on_host(const array_ref& index, std::int64_t extent, stream_ref<D> stream)
{
  const std::int64_t n = index.numel();
  const std::size_t es = size_of(index.type);
  const std::int64_t stride = index.rank == 1 ? index.strides[0] : 1;
  const std::int64_t lo = std::min<std::int64_t>(0, stride * (n - 1));
  const std::int64_t span = std::abs(stride) * (n - 1) + 1;
  std::vector<unsigned char> raw(static_cast<std::size_t>(span) * es);
  wait(stream);
  runtime<D>::copy(raw.data(), static_cast<const unsigned char*>(index.data) + lo * static_cast<std::int64_t>(es), raw.size());
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const std::size_t at = static_cast<std::size_t>(j * stride - lo) * es;
    std::int64_t v;
    if (es == 4) {
      std::int32_t w;
      std::memcpy(&w, raw.data() + at, 4);
      v = w;
    } else {
      std::memcpy(&v, raw.data() + at, 8);
    }
    out[static_cast<std::size_t>(j)] = wrap_index(v, extent);
  }
  return out;
}

template <class D>
struct device_grouping {
  scratch_buffer<D> buf;
  std::int64_t groups;
  const std::int64_t* targets;
  const std::int64_t* starts;
  const std::int64_t* order;
  device_grouping(const grouping& g, stream_ref<D> stream)
      : buf{(g.targets.size() + g.starts.size() + g.order.size()) * sizeof(std::int64_t), stream},
        groups{static_cast<std::int64_t>(g.targets.size())}
  {
    auto* p = buf.template as<std::int64_t>();
    runtime<D>::copy(p, g.targets.data(), g.targets.size() * sizeof(std::int64_t));
    runtime<D>::copy(p + g.targets.size(), g.starts.data(), g.starts.size() * sizeof(std::int64_t));
    runtime<D>::copy(p + g.targets.size() + g.starts.size(), g.order.data(), g.order.size() * sizeof(std::int64_t));
    targets = p;
    starts = p + g.targets.size();
    order = starts + g.starts.size();
  }
};

template <class D, class T>
void scatter_add_deterministic(const array_ref& dst, const array_ref& src, const array_ref& index,
                               const gather_shape& g, stream_ref<D> stream)
{
  const device_grouping<D> dg{group_by_target(indices_on_host<D>(index, g.extent, stream)), stream};
  auto* d = static_cast<T*>(dst.data);
  const auto* s = static_cast<const T*>(src.data);
  const std::int64_t inner = g.inner_n;
  const std::int64_t outer_n = g.outer.shape_numel();
  const auto outer = g.outer;
  const std::int64_t src_dim = g.dst_dim_stride, dst_dim = g.src_dim_stride;
  const std::int64_t src_in = g.dst_inner_stride, dst_in = g.src_inner_stride;
  const std::int64_t* targets = dg.targets;
  const std::int64_t* starts = dg.starts;
  const std::int64_t* order = dg.order;
  const std::int64_t n = dg.groups * outer_n * inner;
  Kokkos::parallel_for("depot::scatter_add_deterministic", make_range<D, std::int64_t>(stream, n),
                       KOKKOS_LAMBDA(std::int64_t i) {
                         const std::int64_t c = i % inner;
                         const std::int64_t q = i / inner;
                         const std::int64_t o = q % outer_n;
                         const std::int64_t t = q / outer_n;
                         std::int64_t off[2] = {0, 0};
                         outer.offsets(o, off);
                         T* target = d + off[1] + targets[t] * dst_dim + c * dst_in;
                         T acc = *target;
                         for (std::int64_t k = starts[t]; k < starts[t + 1]; ++k) {
                           acc = add_values(acc, s[off[0] + order[k] * src_dim + c * src_in]);
                         }
                         *target = acc;
                       });
  wait(stream);  // dg's buffers go back to the pool on the stream; the host copies above are done
}

template <class D, class X>
void scatter_dispatch(const array_ref& dst, const array_ref& src, const array_ref& index, gather_shape g,
                      scatter_mode mode, stream_ref<D> stream)
{
  const auto* idx = static_cast<const X*>(index.data);
  if (mode == scatter_mode::assign) {
    const std::size_t es = size_of(dst.type);
    const auto run = [&](auto tag) {
      using U = typename decltype(tag)::type;
      if (g.fits_int32()) {
        scatter_kernel<D, U, X, std::int32_t, false>(static_cast<U*>(dst.data), static_cast<const U*>(src.data), idx, g, stream);
      } else {
        scatter_kernel<D, U, X, std::int64_t, false>(static_cast<U*>(dst.data), static_cast<const U*>(src.data), idx, g, stream);
      }
    };
    if (g.can_widen(src.data, dst.data, es, 16)) {
      g.widen(es, 16);
      return run(type_tag<word16>{});
    }
    switch (es) {
      case 1: return run(type_tag<std::uint8_t>{});
      case 2: return run(type_tag<std::uint16_t>{});
      case 4: return run(type_tag<std::uint32_t>{});
      default: return run(type_tag<std::uint64_t>{});
    }
  }
  DEPOT_EXPECTS(dst.type != dtype::bool_, "depot::scatter: addition is not defined for bool");
  if (mode == scatter_mode::add && dst.type == dtype::float32 && g.can_widen(src.data, dst.data, 4, 16)) {
    g.widen(4, 16);  // rows of float4: one vector atomic per 16 bytes where the GPU has them
    if (g.fits_int32()) {
      scatter_kernel<D, float4_add, X, std::int32_t, true>(static_cast<float4_add*>(dst.data),
                                                           static_cast<const float4_add*>(src.data), idx, g, stream);
    } else {
      scatter_kernel<D, float4_add, X, std::int64_t, true>(static_cast<float4_add*>(dst.data),
                                                           static_cast<const float4_add*>(src.data), idx, g, stream);
    }
    return;
  }
  visit_dtype(dst.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) {
      if (mode == scatter_mode::add_deterministic) {
        scatter_add_deterministic<D, T>(dst, src, index, g, stream);
      } else if (g.fits_int32()) {
        scatter_kernel<D, T, X, std::int32_t, true>(static_cast<T*>(dst.data), static_cast<const T*>(src.data), idx, g, stream);
      } else {
        scatter_kernel<D, T, X, std::int64_t, true>(static_cast<T*>(dst.data), static_cast<const T*>(src.data), idx, g, stream);
      }
    }
  });
}

template <class D, class T>
void put_typed(const array_ref& base, const array_ref& offsets, const array_ref& src, scatter_mode mode,
               stream_ref<D> stream)
{
  auto* b = static_cast<T*>(base.data);
  const auto* s = static_cast<const T*>(src.data);
  if (mode == scatter_mode::add_deterministic) {
    // Offsets to the host, grouped by target; one thread per target adds in position order.
    const std::int64_t n = src.numel();
    scratch_buffer<D> tmp{static_cast<std::size_t>(n) * sizeof(std::int64_t), stream};
    array_ref dense = array_ref::of(tmp.template as<std::int64_t>(), dtype::int64,
                                    layout::contiguous(layout::extents{offsets.shape.data(), static_cast<std::size_t>(offsets.rank)}));
    kernels::copy<D>(dense, offsets, stream);  // row-major: position k is src's element k
    std::vector<std::int64_t> host(static_cast<std::size_t>(n));
    wait(stream);
    runtime<D>::copy(host.data(), tmp.template as<std::int64_t>(), host.size() * sizeof(std::int64_t));
    const device_grouping<D> dg{group_by_target(host), stream};
    const array_ref* arrays[1] = {&src};
    const auto ss = coalesce<1>(arrays);
    const std::int64_t* targets = dg.targets;
    const std::int64_t* starts = dg.starts;
    const std::int64_t* order = dg.order;
    Kokkos::parallel_for("depot::put_add_deterministic", make_range<D, std::int64_t>(stream, dg.groups),
                         KOKKOS_LAMBDA(std::int64_t t) {
                           T acc = b[targets[t]];
                           for (std::int64_t k = starts[t]; k < starts[t + 1]; ++k) {
                             std::int64_t off[1];
                             ss.offsets(order[k], off);
                             acc = add_values(acc, s[off[0]]);
                           }
                           b[targets[t]] = acc;
                         });
    wait(stream);
    return;
  }
  const array_ref* arrays[2] = {&src, &offsets};
  const auto sh = coalesce<2>(arrays);
  const auto* o = static_cast<const std::int64_t*>(offsets.data);
  const bool add = mode == scatter_mode::add;
  Kokkos::parallel_for(add ? "depot::put_add" : "depot::put", make_range<D, std::int64_t>(stream, src.numel()),
                       KOKKOS_LAMBDA(std::int64_t i) {
                         std::int64_t off[2];
                         sh.offsets(i, off);
                         T* target = b + o[off[1]];
                         const T value = s[off[0]];
                         if (add) {
                           if constexpr (!std::is_same_v<T, bool>) atomic_add_any(target, value);
                         } else {
                           *target = value;
                         }
                       });
}

}  // namespace
}  // namespace ops::detail

template <device D>
void kernels::scatter(const array_ref& dst, int dim, const array_ref& index, const array_ref& src, scatter_mode mode,
                      stream_ref<D> stream)
{
  DEPOT_EXPECTS(dst.type == src.type, "depot::scatter: dtypes differ: destination " +
                                          std::string{to_string(dst.type)} + ", source " +
                                          std::string{to_string(src.type)});
  DEPOT_EXPECTS(mode == scatter_mode::assign || dst.type != dtype::bool_,
                "depot::scatter: addition is not defined for bool");
  const auto g = ops::detail::gather_shape::make("depot::scatter", src, dst, dim, index);
  ops::detail::check_indices<D>(index, dst.shape[static_cast<std::size_t>(dim)], dim, stream);
  if (src.numel() == 0) return;
  if (index.type == dtype::int32) {
    ops::detail::scatter_dispatch<D, std::int32_t>(dst, src, index, g, mode, stream);
  } else {
    ops::detail::scatter_dispatch<D, std::int64_t>(dst, src, index, g, mode, stream);
  }
}

template <device D>
void kernels::put(const array_ref& base, const array_ref& offsets, std::int64_t lo, std::int64_t hi,
                  const array_ref& src, scatter_mode mode, stream_ref<D> stream)
{
  DEPOT_EXPECTS(base.type == src.type, "depot::put: dtypes differ: destination " +
                                           std::string{to_string(base.type)} + ", source " +
                                           std::string{to_string(src.type)});
  DEPOT_EXPECTS(src.same_shape(offsets), "depot::put: offsets " + offsets.to_string() +
                                             " do not have the source's shape " + src.to_string());
  DEPOT_EXPECTS(mode == scatter_mode::assign || base.type != dtype::bool_, "depot::put: addition is not defined for bool");
  if (src.numel() == 0) return;
  ops::ensure_kokkos();
  ops::detail::check_offsets<D>(offsets, lo, hi, stream);
  visit_dtype(base.type, [&](auto tag) { ops::detail::put_typed<D, typename decltype(tag)::type>(base, offsets, src, mode, stream); });
}

#define DEPOT_SCATTER_DEFINE(D)                                                                              \
  template void kernels::scatter<D>(const array_ref&, int, const array_ref&, const array_ref&, scatter_mode, \
                                    stream_ref<D>);                                                          \
  template void kernels::put<D>(const array_ref&, const array_ref&, std::int64_t, std::int64_t,              \
                                const array_ref&, scatter_mode, stream_ref<D>);
DEPOT_SCATTER_DEFINE(host)
#if DEPOT_HAS_CUDA
DEPOT_SCATTER_DEFINE(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_SCATTER_DEFINE(hip)
#endif

}  // namespace depot
