// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// kernels::gather (index_select), kernels::take, and the index validation every gather and
// scatter runs first. A gather whose inner block (the dimensions after `dim`) is dense in
// source and destination and 16-byte aligned moves 16-byte words; index arithmetic is
// 32-bit when every offset fits.
#include "kokkos/kernel_support.hpp"
#include "kokkos/gather_shape.hpp"

#include <depot/storage/element_kernels.hpp>

#include <string>

namespace depot {
namespace ops::detail {

namespace {
template <class D, class X>
void check_indices_typed(const array_ref& index, std::int64_t extent, int dim, stream_ref<D> stream)
{
  const std::int64_t n = index.numel();
  const array_ref* arrays[1] = {&index};
  const auto s = coalesce<1>(arrays);
  const X* p = static_cast<const X*>(index.data);
  std::int64_t first_bad = n;
  const scratch_guard<D> guard{stream, "depot::check_indices"};
  Kokkos::parallel_reduce(
      "depot::check_indices", guard.range_of(n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & lowest) {
        std::int64_t off[1];
        s.offsets(i, off);
        const auto v = static_cast<std::int64_t>(p[off[0]]);
        if ((v < -extent || v >= extent) && i < lowest) lowest = i;
      },
      Kokkos::Min<std::int64_t>(first_bad));
  guard.wait();
  if (first_bad < n) {
    std::int64_t off[1];
    s.offsets(first_bad, off);
    const X bad = copy_one<D>(p + off[0]);  // (waited for above)
    throw index_error(static_cast<std::int64_t>(bad), dim, extent, first_bad);
  }
}
}  // namespace

template <class D>
void check_indices(const array_ref& index, std::int64_t extent, int dim, stream_ref<D> stream)
{
  DEPOT_EXPECTS(index.type == dtype::int32 || index.type == dtype::int64,
                "depot: index arrays must be int32 or int64, got " + std::string{to_string(index.type)});
  if (index.numel() == 0) return;
  ensure_kokkos();
  if (index.type == dtype::int32) {
    check_indices_typed<D, std::int32_t>(index, extent, dim, stream);
  } else {
    check_indices_typed<D, std::int64_t>(index, extent, dim, stream);
  }
}

namespace {

template <class D, class U, class X, class I>
void gather_kernel(U* dst, const U* src, const X* idx, const gather_shape& g, stream_ref<D> stream)
{
  const I inner = static_cast<I>(g.inner_n);
  const I nidx = static_cast<I>(g.index_n);
  const I n = static_cast<I>(g.outer.shape_numel() * g.index_n * g.inner_n);
  const I extent = static_cast<I>(g.extent);
  const I idx_stride = static_cast<I>(g.index_stride);
  const I dst_dim = static_cast<I>(g.dst_dim_stride);
  const I src_dim = static_cast<I>(g.src_dim_stride);
  const I dst_in = static_cast<I>(g.dst_inner_stride);
  const I src_in = static_cast<I>(g.src_inner_stride);
  const auto outer = g.outer;
  const bool single_outer = g.outer.rank == 0;
  Kokkos::parallel_for("depot::gather", make_range<D, I>(stream, n), KOKKOS_LAMBDA(I i) {
    const I q = i / inner;
    const I c = i - q * inner;
    const I o = q / nidx;
    const I j = q - o * nidx;
    I v = static_cast<I>(idx[j * idx_stride]);
    if (v < 0) v += extent;
    I off[2] = {0, 0};
    if (!single_outer) outer.offsets(o, off);
    dst[off[0] + j * dst_dim + c * dst_in] = src[off[1] + v * src_dim + c * src_in];
  });
}

template <class D, class U, class X>
void gather_typed(const array_ref& dst, const array_ref& src, const array_ref& index, const gather_shape& g,
                  stream_ref<D> stream)
{
  const auto* idx = static_cast<const X*>(index.data);
  if (g.fits_int32()) {
    gather_kernel<D, U, X, std::int32_t>(static_cast<U*>(dst.data), static_cast<const U*>(src.data), idx, g, stream);
  } else {
    gather_kernel<D, U, X, std::int64_t>(static_cast<U*>(dst.data), static_cast<const U*>(src.data), idx, g, stream);
  }
}

template <class D, class X>
void gather_dispatch(const array_ref& dst, const array_ref& src, const array_ref& index, gather_shape g,
                     stream_ref<D> stream)
{
  const std::size_t es = size_of(dst.type);
  if (g.can_widen(dst.data, src.data, es, 16)) {
    g.widen(es, 16);
    return gather_typed<D, word16, X>(dst, src, index, g, stream);
  }
  switch (es) {
    case 1: return gather_typed<D, std::uint8_t, X>(dst, src, index, g, stream);
    case 2: return gather_typed<D, std::uint16_t, X>(dst, src, index, g, stream);
    case 4: return gather_typed<D, std::uint32_t, X>(dst, src, index, g, stream);
    default: return gather_typed<D, std::uint64_t, X>(dst, src, index, g, stream);
  }
}

template <class D, class U, class I>
void take_kernel(const array_ref& dst, const array_ref& base, const array_ref& offsets, stream_ref<D> stream)
{
  const array_ref* arrays[2] = {&dst, &offsets};
  const auto s = coalesce<2>(arrays);
  auto* d = static_cast<U*>(dst.data);
  const auto* b = static_cast<const U*>(base.data);
  const auto* o = static_cast<const std::int64_t*>(offsets.data);
  Kokkos::parallel_for("depot::take", make_range<D, I>(stream, static_cast<I>(dst.numel())), KOKKOS_LAMBDA(I i) {
    I off[2];
    s.offsets(i, off);
    d[off[0]] = b[o[off[1]]];
  });
}

}  // namespace

template <class D>
void check_offsets(const array_ref& offsets, std::int64_t lo, std::int64_t hi, stream_ref<D> stream)
{
  DEPOT_EXPECTS(offsets.type == dtype::int64, "depot: element offsets must be int64, got " +
                                                  std::string{to_string(offsets.type)});
  DEPOT_EXPECTS(lo <= hi, "depot: empty offset range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const std::int64_t n = offsets.numel();
  if (n == 0) return;
  const array_ref* arrays[1] = {&offsets};
  const auto s = coalesce<1>(arrays);
  const auto* p = static_cast<const std::int64_t*>(offsets.data);
  std::int64_t first_bad = n;
  const scratch_guard<D> guard{stream, "depot::check_offsets"};
  Kokkos::parallel_reduce(
      "depot::check_offsets", guard.range_of(n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & lowest) {
        std::int64_t off[1];
        s.offsets(i, off);
        const std::int64_t v = p[off[0]];
        if ((v < lo || v > hi) && i < lowest) lowest = i;
      },
      Kokkos::Min<std::int64_t>(first_bad));
  guard.wait();
  if (first_bad < n) {
    std::int64_t off[1];
    s.offsets(first_bad, off);
    const std::int64_t bad = copy_one<D>(p + off[0]);  // (waited for above)
    throw invalid_argument("depot: element offset " + std::to_string(bad) + " at position " +
                           std::to_string(first_bad) + " is outside the valid range [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
  }
}

#define DEPOT_CHECK_DEFINE(D)                                                                    \
  template void check_indices<D>(const array_ref&, std::int64_t, int, stream_ref<D>);            \
  template void check_offsets<D>(const array_ref&, std::int64_t, std::int64_t, stream_ref<D>);
DEPOT_CHECK_DEFINE(host)
#if DEPOT_HAS_CUDA
DEPOT_CHECK_DEFINE(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_CHECK_DEFINE(hip)
#endif

}  // namespace ops::detail

template <device D>
void kernels::gather(const array_ref& dst, const array_ref& src, int dim, const array_ref& index, stream_ref<D> stream)
{
  DEPOT_EXPECTS(dst.type == src.type, "depot::gather: dtypes differ: destination " +
                                          std::string{to_string(dst.type)} + ", source " +
                                          std::string{to_string(src.type)});
  const auto g = ops::detail::gather_shape::make("depot::gather", dst, src, dim, index);
  ops::detail::check_indices<D>(index, src.shape[static_cast<std::size_t>(dim)], dim, stream);
  if (dst.numel() == 0) return;
  if (index.type == dtype::int32) {
    ops::detail::gather_dispatch<D, std::int32_t>(dst, src, index, g, stream);
  } else {
    ops::detail::gather_dispatch<D, std::int64_t>(dst, src, index, g, stream);
  }
}

template <device D>
void kernels::take(const array_ref& dst, const array_ref& base, const array_ref& offsets, std::int64_t lo,
                   std::int64_t hi, stream_ref<D> stream)
{
  DEPOT_EXPECTS(dst.type == base.type, "depot::take: dtypes differ: destination " +
                                           std::string{to_string(dst.type)} + ", source " +
                                           std::string{to_string(base.type)});
  DEPOT_EXPECTS(dst.same_shape(offsets), "depot::take: offsets " + offsets.to_string() +
                                             " do not have the destination's shape " + dst.to_string());
  if (dst.numel() == 0) return;
  ops::ensure_kokkos();
  ops::detail::check_offsets<D>(offsets, lo, hi, stream);
  const bool small = dst.numel() < (std::int64_t{1} << 31);
  const auto run = [&](auto tag) {
    using U = typename decltype(tag)::type;
    if (small) {
      ops::detail::take_kernel<D, U, std::int32_t>(dst, base, offsets, stream);
    } else {
      ops::detail::take_kernel<D, U, std::int64_t>(dst, base, offsets, stream);
    }
  };
  switch (size_of(dst.type)) {
    case 1: return run(type_tag<std::uint8_t>{});
    case 2: return run(type_tag<std::uint16_t>{});
    case 4: return run(type_tag<std::uint32_t>{});
    default: return run(type_tag<std::uint64_t>{});
  }
}

#define DEPOT_GATHER_DEFINE(D)                                                                                  \
  template void kernels::gather<D>(const array_ref&, const array_ref&, int, const array_ref&, stream_ref<D>); \
  template void kernels::take<D>(const array_ref&, const array_ref&, const array_ref&, std::int64_t,         \
                                 std::int64_t, stream_ref<D>);
DEPOT_GATHER_DEFINE(host)
#if DEPOT_HAS_CUDA
DEPOT_GATHER_DEFINE(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_GATHER_DEFINE(hip)
#endif

}  // namespace depot
