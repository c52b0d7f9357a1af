// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// kernels::count_true and kernels::masked_select (stream compaction with a parallel scan:
// each selected element's output position is the number of true mask elements before it).
#include "kokkos/kernel_support.hpp"

#include <depot/storage/element_kernels.hpp>

#include <string>

namespace depot {
namespace ops::detail {
namespace {

void check_mask(const char* what, const array_ref& mask)
{
  DEPOT_EXPECTS(mask.type == dtype::bool_ || mask.type == dtype::uint8,
                std::string{what} + ": the mask must be bool (or uint8), got " + std::string{to_string(mask.type)});
}

template <class D, class U, class I>
void select_kernel(const array_ref& dst, const array_ref& src, const array_ref& mask, stream_ref<D> stream)
{
  const array_ref* arrays[2] = {&src, &mask};
  const auto s = coalesce<2>(arrays);
  const bool dense = s.rank <= 1 && (s.rank == 0 || (s.strides[0][0] == 1 && s.strides[1][0] == 1));
  auto* d = static_cast<U*>(dst.data);
  const I dstride = static_cast<I>(dst.strides[0]);
  const auto* v = static_cast<const U*>(src.data);
  const auto* m = static_cast<const std::uint8_t*>(mask.data);
  const I n = static_cast<I>(src.numel());
  Kokkos::parallel_scan("depot::masked_select", make_range<D, I>(stream, n),
                        KOKKOS_LAMBDA(I i, I & before, const bool final) {
                          I off[2] = {i, i};
                          if (!dense) s.offsets(i, off);
                          const bool take = m[off[1]] != 0;
                          if (final && take) d[before * dstride] = v[off[0]];
                          before += take ? 1 : 0;
                        });
}

// GPU compaction of dense src and mask: teams of 256 threads own chunks of 4096 elements
// (16 consecutive per thread). Pass 1: each team's count (a team scan of the threads'
// counts). An exclusive scan over the chunk counts gives each chunk's first output. Pass 2:
// each thread writes its selected elements from its chunk's base plus its team prefix.
constexpr int select_team = 256;
constexpr int select_per_thread = 16;

// True elements among m[base, base + select_per_thread) that lie below n.
KOKKOS_INLINE_FUNCTION std::int64_t count_run(const std::uint8_t* m, std::int64_t base, std::int64_t n)
{
  std::int64_t c = 0;
  for (int k = 0; k < select_per_thread; ++k) c += (base + k < n && m[base + k] != 0) ? 1 : 0;
  return c;
}

template <class D, class U>
void select_dense_gpu(U* dst, const U* src, const std::uint8_t* m, std::int64_t n, stream_ref<D> stream)
{
  if constexpr (is_gpu_v<D>) {
    constexpr std::int64_t chunk = std::int64_t{select_team} * select_per_thread;
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    DEPOT_EXPECTS(chunks < (std::int64_t{1} << 31), "depot::masked_select: too many elements for one launch");
    scratch_buffer<D> buf{static_cast<std::size_t>(chunks) * sizeof(std::int64_t), stream};
    std::int64_t* counts = buf.template as<std::int64_t>();
    using policy = Kokkos::TeamPolicy<exec_space<D>>;
    using member = typename policy::member_type;
    const auto inst = D::kokkos::instance(stream);
    Kokkos::parallel_for("depot::masked_select_count", policy(inst, static_cast<int>(chunks), select_team),
                         KOKKOS_LAMBDA(const member& t) {
                           const std::int64_t base = t.league_rank() * chunk + std::int64_t{t.team_rank()} * select_per_thread;
                           const std::int64_t c = count_run(m, base, n);
                           const std::int64_t before = t.team_scan(c);
                           if (t.team_rank() == t.team_size() - 1) counts[t.league_rank()] = before + c;
                         });
    Kokkos::parallel_scan("depot::masked_select_scan", make_range<D, std::int64_t>(stream, chunks),
                          KOKKOS_LAMBDA(std::int64_t i, std::int64_t & running, const bool final) {
                            const std::int64_t c = counts[i];
                            if (final) counts[i] = running;
                            running += c;
                          });
    Kokkos::parallel_for("depot::masked_select", policy(inst, static_cast<int>(chunks), select_team),
                         KOKKOS_LAMBDA(const member& t) {
                           const std::int64_t base = t.league_rank() * chunk + std::int64_t{t.team_rank()} * select_per_thread;
                           const std::int64_t c = count_run(m, base, n);
                           std::int64_t out = counts[t.league_rank()] + t.team_scan(c);
                           for (int k = 0; k < select_per_thread; ++k) {
                             const std::int64_t i = base + k;
                             if (i < n && m[i] != 0) dst[out++] = src[i];
                           }
                         });
  }
}

}  // namespace
}  // namespace ops::detail

template <device D>
std::int64_t kernels::count_true(const array_ref& mask, stream_ref<D> stream)
{
  ops::detail::check_mask("depot::count_true", mask);
  const std::int64_t n = mask.numel();
  if (n == 0) return 0;
  ops::ensure_kokkos();
  const array_ref* arrays[1] = {&mask};
  const auto s = ops::detail::coalesce<1>(arrays);
  const auto* m = static_cast<const std::uint8_t*>(mask.data);
  std::int64_t count = 0;
  Kokkos::parallel_reduce(
      "depot::count_true", ops::detail::make_range<D, std::int64_t>(stream, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & c) {
        std::int64_t off[1];
        s.offsets(i, off);
        c += m[off[0]] != 0 ? 1 : 0;
      },
      count);
  ops::detail::wait(stream);
  return count;
}

template <device D>
void kernels::masked_select(const array_ref& dst, const array_ref& src, const array_ref& mask, stream_ref<D> stream)
{
  ops::detail::check_mask("depot::masked_select", mask);
  DEPOT_EXPECTS(src.same_shape(mask), "depot::masked_select: the mask " + mask.to_string() +
                                          " does not have the source's shape " + src.to_string());
  DEPOT_EXPECTS(dst.type == src.type, "depot::masked_select: dtypes differ: destination " +
                                          std::string{to_string(dst.type)} + ", source " +
                                          std::string{to_string(src.type)});
  DEPOT_EXPECTS(dst.rank == 1, "depot::masked_select: the destination must be 1-D, got " + dst.to_string());
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const std::int64_t selected = count_true<D>(mask, stream);
  DEPOT_EXPECTS(dst.shape[0] == selected, "depot::masked_select: the destination has " + std::to_string(dst.shape[0]) +
                                              " elements but the mask selects " + std::to_string(selected));
  if (selected == 0) return;
  const bool small = n < (std::int64_t{1} << 31) && std::abs(dst.strides[0]) * selected < (std::int64_t{1} << 31);
  const bool dense = src.is_contiguous() && mask.is_contiguous() && dst.strides[0] == 1;
  const auto run = [&](auto tag) {
    using U = typename decltype(tag)::type;
    if (is_gpu_v<D> && dense) {
      ops::detail::select_dense_gpu<D, U>(static_cast<U*>(dst.data), static_cast<const U*>(src.data),
                                          static_cast<const std::uint8_t*>(mask.data), n, stream);
    } else if (small) {
      ops::detail::select_kernel<D, U, std::int32_t>(dst, src, mask, stream);
    } else {
      ops::detail::select_kernel<D, U, std::int64_t>(dst, src, mask, stream);
    }
  };
  switch (size_of(src.type)) {
    case 1: return run(type_tag<std::uint8_t>{});
    case 2: return run(type_tag<std::uint16_t>{});
    case 4: return run(type_tag<std::uint32_t>{});
    default: return run(type_tag<std::uint64_t>{});
  }
}

template <device D>
void kernels::fence(stream_ref<D> stream)
{
  ops::ensure_kokkos();
  ops::detail::wait(stream);
}

#define DEPOT_MASKED_DEFINE(D)                                                         \
  template void kernels::fence<D>(stream_ref<D>);                                      \
  template std::int64_t kernels::count_true<D>(const array_ref&, stream_ref<D>);       \
  template void kernels::masked_select<D>(const array_ref&, const array_ref&, const array_ref&, stream_ref<D>);
DEPOT_MASKED_DEFINE(host)
#if DEPOT_HAS_CUDA
DEPOT_MASKED_DEFINE(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_MASKED_DEFINE(hip)
#endif

}  // namespace depot
