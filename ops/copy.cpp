// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// kernels::copy: contiguous same-dtype copies go to the backend's memcpy on the stream;
// permuted copies (the destination's fastest dimension is not the source's) go through
// tiles staged in team scratch (shared) memory, so both sides are read and written along
// their fastest dimension; everything else, and dtype conversion, is an elementwise walk
// over coalesced dimensions with 32-bit index math where it fits.
#include "kokkos/kernel_support.hpp"

#include <depot/storage/element_kernels.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace depot {
namespace ops::detail {
namespace {

template <class D, class To, class From, class I>
void copy_elements(To* dst, const From* src, const strided_shape<2>& s, I n, bool dense, stream_ref<D> stream)
{
  if (dense) {
    Kokkos::parallel_for("depot::copy", make_range<D, I>(stream, n),
                         KOKKOS_LAMBDA(I i) { dst[i] = convert<To>(src[i]); });
    return;
  }
  Kokkos::parallel_for("depot::copy", make_range<D, I>(stream, n), KOKKOS_LAMBDA(I i) {
    I off[2];
    s.offsets(i, off);
    dst[off[0]] = convert<To>(src[off[1]]);
  });
}

template <class D, class To, class From>
void copy_converting(const array_ref& dst, const array_ref& src, stream_ref<D> stream)
{
  const array_ref* arrays[2] = {&dst, &src};
  const auto s = coalesce<2>(arrays);
  const std::int64_t n = dst.numel();
  const bool dense = s.rank <= 1 && (s.rank == 0 || (s.strides[0][0] == 1 && s.strides[1][0] == 1));
  auto* d = static_cast<To*>(dst.data);
  const auto* f = static_cast<const From*>(src.data);
  if (fits_int32(s, n)) {
    copy_elements<D, To, From, std::int32_t>(d, f, s, static_cast<std::int32_t>(n), dense, stream);
  } else {
    copy_elements<D, To, From, std::int64_t>(d, f, s, n, dense, stream);
  }
}

// A permuted copy: in iteration order, the destination is dense along the last dimension
// and the source along dimension `k`. The other dimensions form a batch.
struct transpose_shape {
  std::int64_t rows = 0;  // extent of dimension k
  std::int64_t cols = 0;  // extent of the last dimension
  std::int64_t dst_row_stride = 0;
  std::int64_t src_col_stride = 0;
  strided_shape<2> batch;  // offsets of each batch in dst and src
  std::int64_t batches = 1;
};

constexpr int tile = 64;
constexpr int tile_rows_per_pass = 4;  // a team of 64 x 4 threads moves a 64 x 64 tile in 16 passes

template <class D, class U, class I>
void copy_transposed_gpu(U* dst, const U* src, const transpose_shape& t, stream_ref<D> stream)
{
  using policy = Kokkos::TeamPolicy<exec_space<D>>;
  using member = typename policy::member_type;
  const I rows = static_cast<I>(t.rows), cols = static_cast<I>(t.cols);
  const I tiles_r = (rows + tile - 1) / tile;
  const I tiles_c = (cols + tile - 1) / tile;
  const std::int64_t league = std::int64_t{tiles_r} * tiles_c * t.batches;
  const I dst_row = static_cast<I>(t.dst_row_stride), src_col = static_cast<I>(t.src_col_stride);
  const std::size_t scratch = sizeof(U) * tile * (tile + 1);
  const auto batch = t.batch;
  DEPOT_EXPECTS(league < (std::int64_t{1} << 31), "depot::copy: too many tiles for one launch");
  Kokkos::parallel_for(
      "depot::copy_transpose",
      policy(D::kokkos::instance(stream), static_cast<int>(league), tile * tile_rows_per_pass)
          .set_scratch_size(0, Kokkos::PerTeam(scratch)),
      KOKKOS_LAMBDA(const member& m) {
        U* buf = static_cast<U*>(m.team_shmem().get_shmem(scratch));
        I id = static_cast<I>(m.league_rank());
        const I tc = id % tiles_c;
        id /= tiles_c;
        const I tr = id % tiles_r;
        const I b = id / tiles_r;
        I off[2] = {0, 0};
        if (batch.rank > 0) batch.offsets(b, off);
        const int x = m.team_rank() % tile;
        const int y = m.team_rank() / tile;
        const I r0 = tr * tile;
        const I c0 = tc * tile;
        // Read: neighbouring threads read neighbouring rows (the source's dense direction).
        const I r = r0 + x;
        if (r < rows) {
          const U* s = src + off[1] + r;
          for (int p = y; p < tile; p += tile_rows_per_pass) {
            const I c = c0 + p;
            if (c < cols) buf[x * (tile + 1) + p] = s[c * src_col];
          }
        }
        m.team_barrier();
        // Write: neighbouring threads write neighbouring columns (the destination's).
        const I c = c0 + x;
        if (c < cols) {
          U* d = dst + off[0] + c;
          for (int p = y; p < tile; p += tile_rows_per_pass) {
            const I rr = r0 + p;
            if (rr < rows) d[rr * dst_row] = buf[p * (tile + 1) + x];
          }
        }
      });
}

// 1- and 2-byte elements: every global access is a whole 4-byte word (V = 4 / sizeof(U)
// elements), so a warp reads and writes 128 contiguous bytes, as it does for 4-byte
// elements (one element per thread would move 32 or 64). A thread loads V words from V
// neighbouring source columns (a V x V block), transposes the block in registers, and
// stores V words, one per row, to scratch; the write phase reads scratch row by row, one
// word per thread. Tiles are 32V x 32V elements; scratch is [32V rows][32 words] with the
// word column XOR-swizzled by the storing thread's row block, so the stores and the loads
// each hit 32 distinct banks. Needs word-aligned rows on both sides (packable()); partial
// words at the edges go element by element.
template <class D, class U, class IT, class I>
void copy_transposed_packed_gpu(U* dst, const U* src, const transpose_shape& t, stream_ref<D> stream)
{
  // IT: the index type of tile origins (32 bits when the whole tensor fits); I: offsets
  // inside one tile. Tensors of more than 2^31 elements keep 32-bit arithmetic per word
  // where the strides allow (packed_index_fits()). Each thread moves only 64 bytes each
  // way, so the per-thread setup counts: 64-bit origins cost about 5 % at 1 GiB.
  using policy = Kokkos::TeamPolicy<exec_space<D>>;
  using member = typename policy::member_type;
  using W = std::uint32_t;
  constexpr int V = 4 / static_cast<int>(sizeof(U));
  constexpr int bits = 8 * static_cast<int>(sizeof(U));
  constexpr W lane = (W{1} << bits) - 1;
  constexpr int T = 32 * V;
  constexpr int passes = 8;  // a team of 32 x 8 threads
  const std::int64_t rows = t.rows, cols = t.cols;
  const std::int64_t tiles_r = (rows + T - 1) / T;
  const std::int64_t tiles_c = (cols + T - 1) / T;
  const std::int64_t league = tiles_r * tiles_c * t.batches;
  DEPOT_EXPECTS(league < (std::int64_t{1} << 31), "depot::copy: too many tiles for one launch");
  const int grid_c = static_cast<int>(tiles_c), grid_r = static_cast<int>(tiles_r);
  const IT dst_row_t = static_cast<IT>(t.dst_row_stride), src_col_t = static_cast<IT>(t.src_col_stride);
  const IT rows_t = static_cast<IT>(rows), cols_t = static_cast<IT>(cols);
  const I dst_row = static_cast<I>(t.dst_row_stride), src_col = static_cast<I>(t.src_col_stride);
  const std::size_t scratch = sizeof(W) * T * 32;
  const auto batch = t.batch;
  Kokkos::parallel_for(
      "depot::copy_transpose",
      policy(D::kokkos::instance(stream), static_cast<int>(league), 32 * passes)
          .set_scratch_size(0, Kokkos::PerTeam(scratch)),
      KOKKOS_LAMBDA(const member& m) {
        W* buf = static_cast<W*>(m.team_shmem().get_shmem(scratch));
        int id = m.league_rank();
        const int tc = id % grid_c;
        id /= grid_c;
        const int tr = id % grid_r;
        const int b = id / grid_r;
        IT off[2] = {0, 0};
        if (batch.rank > 0) batch.offsets(static_cast<IT>(b), off);
        const IT r0 = static_cast<IT>(tr) * T;
        const IT c0 = static_cast<IT>(tc) * T;
        const U* src_tile = src + off[1] + c0 * src_col_t + r0;  // element (r0, c0)
        U* dst_tile = dst + off[0] + r0 * dst_row_t + c0;
        const I rows_here = static_cast<I>(rows_t - r0 < T ? rows_t - r0 : T);
        const I cols_here = static_cast<I>(cols_t - c0 < T ? cols_t - c0 : T);
        const int x = m.team_rank() % 32;
        const int y = m.team_rank() / 32;
        // Read: thread x takes rows V x ... V x + V - 1 of columns V q ... V q + V - 1.
        const I r = static_cast<I>(V * x);
        for (int q = y; q < 32; q += passes) {
          W w[V];
          for (int k = 0; k < V; ++k) {
            const I col = static_cast<I>(V * q + k);
            w[k] = 0;
            if (col >= cols_here || r >= rows_here) continue;
            const U* s = src_tile + col * src_col + r;
            if (r + V <= rows_here) {
              w[k] = *reinterpret_cast<const W*>(s);
            } else {
              for (int j = 0; r + j < rows_here; ++j) w[k] |= W{s[j]} << (bits * j);
            }
          }
          for (int j = 0; j < V; ++j) {  // row r + j, columns V q ... V q + V - 1
            W o = 0;
            for (int k = 0; k < V; ++k) o |= ((w[k] >> (bits * j)) & lane) << (bits * k);
            buf[(V * x + j) * 32 + (q ^ x)] = o;
          }
        }
        m.team_barrier();
        // Write: thread x takes columns V x ... V x + V - 1 of each row.
        const I c = static_cast<I>(V * x);
        for (int p = y; p < T; p += passes) {
          if (p >= rows_here || c >= cols_here) break;
          const W o = buf[p * 32 + (x ^ (p / V))];
          U* d = dst_tile + static_cast<I>(p) * dst_row + c;
          if (c + V <= cols_here) {
            *reinterpret_cast<W*>(d) = o;
          } else {
            for (int k = 0; c + k < cols_here; ++k) d[k] = static_cast<U>((o >> (bits * k)) & lane);
          }
        }
      });
}

// Whether offsets inside one packed tile fit in 32 bits.
template <class U>
bool packed_index_fits(const transpose_shape& t) noexcept
{
  constexpr std::int64_t T = 32 * (4 / static_cast<std::int64_t>(sizeof(U)));
  constexpr std::int64_t limit = (std::int64_t{1} << 31) - 1;
  return std::abs(t.src_col_stride) * T + T < limit && std::abs(t.dst_row_stride) * T + T < limit;
}

// Whether every word the packed kernel touches is 4-byte aligned on both sides.
template <class U>
bool packable(const U* dst, const U* src, const transpose_shape& t) noexcept
{
  constexpr auto s = static_cast<std::int64_t>(sizeof(U));
  bool ok = reinterpret_cast<std::uintptr_t>(dst) % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 4 == 0 &&
            t.dst_row_stride * s % 4 == 0 && t.src_col_stride * s % 4 == 0;
  for (int d = 0; d < t.batch.rank; ++d) {
    ok = ok && t.batch.strides[0][d] * s % 4 == 0 && t.batch.strides[1][d] * s % 4 == 0;
  }
  return ok;
}

template <class D, class U>
void copy_transposed(U* dst, const U* src, const transpose_shape& t, stream_ref<D> stream)
{
  const std::int64_t tiles_r = (t.rows + tile - 1) / tile;
  const std::int64_t tiles_c = (t.cols + tile - 1) / tile;
  const std::int64_t league = tiles_r * tiles_c * t.batches;
  if constexpr (is_gpu_v<D>) {
    bool small = t.rows * t.cols * t.batches < (std::int64_t{1} << 31) && league < (std::int64_t{1} << 31);
    for (int a = 0; a < 2 && small; ++a) {
      std::int64_t reach = std::abs(a == 0 ? t.dst_row_stride : std::int64_t{1}) * (t.rows - 1) +
                           std::abs(a == 0 ? std::int64_t{1} : t.src_col_stride) * (t.cols - 1);
      for (int d = 0; d < t.batch.rank; ++d) reach += std::abs(t.batch.strides[a][d]) * (t.batch.shape[d] - 1);
      small = reach < (std::int64_t{1} << 31);
    }
    if constexpr (sizeof(U) < 4) {
      if (packable(dst, src, t)) {
        if (small) {
          copy_transposed_packed_gpu<D, U, std::int32_t, std::int32_t>(dst, src, t, stream);
        } else if (packed_index_fits<U>(t)) {
          copy_transposed_packed_gpu<D, U, std::int64_t, std::int32_t>(dst, src, t, stream);
        } else {
          copy_transposed_packed_gpu<D, U, std::int64_t, std::int64_t>(dst, src, t, stream);
        }
        return;
      }
    }
    if (small) {
      copy_transposed_gpu<D, U, std::int32_t>(dst, src, t, stream);
    } else {
      copy_transposed_gpu<D, U, std::int64_t>(dst, src, t, stream);
    }
  } else {
    // Host: one tile per iteration, walked so that both sides stay in cache.
    Kokkos::parallel_for("depot::copy_transpose", make_range<D, std::int64_t>(stream, league),
                         [=](std::int64_t id) {
                           const std::int64_t tc = id % tiles_c;
                           id /= tiles_c;
                           const std::int64_t tr = id % tiles_r;
                           const std::int64_t b = id / tiles_r;
                           std::int64_t off[2] = {0, 0};
                           if (t.batch.rank > 0) t.batch.offsets(b, off);
                           const std::int64_t r_end = std::min(t.rows, (tr + 1) * tile);
                           const std::int64_t c_end = std::min(t.cols, (tc + 1) * tile);
                           for (std::int64_t r = tr * tile; r < r_end; ++r) {
                             for (std::int64_t c = tc * tile; c < c_end; ++c) {
                               dst[off[0] + r * t.dst_row_stride + c] = src[off[1] + r + c * t.src_col_stride];
                             }
                           }
                         });
  }
}

// The permuted-copy shape, when the copy is one.
bool as_transpose(const strided_shape<2>& s, transpose_shape& t)
{
  const int r = s.rank;
  if (r < 2 || s.strides[0][r - 1] != 1 || s.strides[1][r - 1] == 1) return false;
  int k = -1;
  for (int d = 0; d < r - 1; ++d) {
    if (s.strides[1][d] == 1) k = d;
  }
  if (k < 0 || s.shape[k] < 8 || s.shape[r - 1] < 8) return false;
  t.rows = s.shape[k];
  t.cols = s.shape[r - 1];
  t.dst_row_stride = s.strides[0][k];
  t.src_col_stride = s.strides[1][r - 1];
  t.batch = {};
  for (int d = 0; d < r - 1; ++d) {
    if (d == k) continue;
    t.batch.shape[t.batch.rank] = s.shape[d];
    t.batch.strides[0][t.batch.rank] = s.strides[0][d];
    t.batch.strides[1][t.batch.rank] = s.strides[1][d];
    ++t.batch.rank;
    t.batches *= s.shape[d];
  }
  return true;
}

template <class D, class U>
void copy_same(const array_ref& dst, const array_ref& src, stream_ref<D> stream)
{
  const array_ref* arrays[2] = {&dst, &src};
  const auto s = coalesce<2>(arrays);
  const std::int64_t n = dst.numel();
  if (s.rank <= 1 && (s.rank == 0 || (s.strides[0][0] == 1 && s.strides[1][0] == 1))) {
    runtime<D>::copy_async(dst.data, src.data, static_cast<std::size_t>(n) * sizeof(U), stream.native());
    return;
  }
  transpose_shape t;
  if (as_transpose(s, t)) {
    copy_transposed<D, U>(static_cast<U*>(dst.data), static_cast<const U*>(src.data), t, stream);
    return;
  }
  copy_converting<D, U, U>(dst, src, stream);
}

template <class D>
void copy_dispatch(const array_ref& dst, const array_ref& src, stream_ref<D> stream)
{
  if (dst.type == src.type) {
    switch (size_of(dst.type)) {
      case 1: return copy_same<D, std::uint8_t>(dst, src, stream);
      case 2: return copy_same<D, std::uint16_t>(dst, src, stream);
      case 4: return copy_same<D, std::uint32_t>(dst, src, stream);
      default: return copy_same<D, std::uint64_t>(dst, src, stream);
    }
  }
  visit_dtype(dst.type, [&](auto to) {
    visit_dtype(src.type, [&](auto from) {
      copy_converting<D, typename decltype(to)::type, typename decltype(from)::type>(dst, src, stream);
    });
  });
}

}  // namespace
}  // namespace ops::detail

template <device D>
void kernels::copy(const array_ref& dst, const array_ref& src, stream_ref<D> stream)
{
  DEPOT_EXPECTS(dst.same_shape(src), "depot::copy: shapes differ: destination " + dst.to_string() +
                                         ", source " + src.to_string());
  if (dst.numel() == 0) return;
  DEPOT_EXPECTS(dst.data != nullptr && src.data != nullptr, "depot::copy: null data");
  if (dst.data == src.data && dst.type == src.type && dst.strides == src.strides) return;
  ops::ensure_kokkos();
  ops::detail::copy_dispatch<D>(dst, src, stream);
}

template void kernels::copy<host>(const array_ref&, const array_ref&, stream_ref<host>);
#if DEPOT_HAS_CUDA
template void kernels::copy<cuda>(const array_ref&, const array_ref&, stream_ref<cuda>);
#endif
#if DEPOT_HAS_HIP
template void kernels::copy<hip>(const array_ref&, const array_ref&, stream_ref<hip>);
#endif

}  // namespace depot
