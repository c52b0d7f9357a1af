// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// ops/ kernels against plain reference loops on the host: random shapes, strides (slices
// with steps, permutations, negative steps), every dtype; outputs poisoned first so an
// unwritten element fails, and elements outside the output checked untouched.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/error.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/stream_registry.hpp>
#include <depot/ops/copy.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/gather.hpp>
#include <depot/ops/masked_fill.hpp>
#include <depot/ops/masked_select.hpp>
#include <depot/ops/kokkos_runtime.hpp>
#include <depot/ops/scatter.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/strided_view.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using depot::array_ref;
using depot::dtype;
using depot::layout;

// A byte buffer on device D holding `n` elements of `t`, with a host mirror.
template <depot::device D>
struct buffer {
  dtype type;
  std::int64_t n;
  depot::storage<std::uint8_t, D> mem;
  buffer(dtype t, std::int64_t count)
      : type{t}, n{count}, mem{static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * depot::size_of(t)}
  {
  }
  [[nodiscard]] void* base() const
  {
    if constexpr (std::is_same_v<D, depot::host>) {
      return mem.host_ptr();
    } else {
      return mem.device_ptr();
    }
  }
  [[nodiscard]] std::vector<std::uint8_t> read() const
  {
    std::vector<std::uint8_t> out(mem.size());
    depot::runtime<D>::copy(out.data(), base(), out.size());
    return out;
  }
  void write(const std::vector<std::uint8_t>& bytes) const { depot::runtime<D>::copy(base(), bytes.data(), bytes.size()); }
  [[nodiscard]] array_ref ref(const layout& l) const { return array_ref::of(base(), type, l); }
};

// Random bytes that are valid values of t (bool: 0 or 1; floats: finite, small).
std::vector<std::uint8_t> random_values(dtype t, std::int64_t n, std::mt19937_64& rng)
{
  const std::size_t es = depot::size_of(t);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * es);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(static_cast<std::int64_t>(rng() % 200) - 100) / (depot::is_floating_point(t) ? 4.0 : 1.0);
    depot::visit_dtype(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T x;
      if constexpr (std::is_same_v<T, bool>) {
        x = (rng() & 1) != 0;
      } else if constexpr (std::is_same_v<T, depot::float16> || std::is_same_v<T, depot::bfloat16>) {
        x = T{static_cast<float>(v)};
      } else {
        x = static_cast<T>(v);
      }
      std::memcpy(out.data() + static_cast<std::size_t>(i) * es, &x, es);
    });
  }
  return out;
}

// The host reference of a conversion (what ops' convert does).
void convert_one(dtype to, void* dst, dtype from, const void* src)
{
  depot::visit_dtype(from, [&](auto ftag) {
    using F = typename decltype(ftag)::type;
    F f;
    std::memcpy(&f, src, sizeof(F));
    depot::visit_dtype(to, [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      T t;
      if constexpr (std::is_same_v<F, depot::float16> || std::is_same_v<F, depot::bfloat16>) {
        const float x = static_cast<float>(f);
        if constexpr (std::is_same_v<T, depot::float16> || std::is_same_v<T, depot::bfloat16>) t = T{x};
        else if constexpr (std::is_same_v<T, bool>) t = x != 0.0F;
        else if constexpr (std::is_integral_v<T>) t = static_cast<T>(static_cast<std::int64_t>(x));
        else t = static_cast<T>(x);
      } else if constexpr (std::is_same_v<T, depot::float16> || std::is_same_v<T, depot::bfloat16>) {
        t = T{static_cast<float>(f)};
      } else if constexpr (std::is_same_v<T, bool>) {
        t = f != F{0};
      } else if constexpr (std::is_floating_point_v<F> && std::is_integral_v<T>) {
        t = static_cast<T>(static_cast<std::int64_t>(f));  // what ops' convert does
      } else {
        t = static_cast<T>(f);
      }
      std::memcpy(dst, &t, sizeof(T));
    });
  });
}

// Element offsets of l in row-major order.
std::vector<std::int64_t> offsets_of(const layout& l)
{
  std::vector<std::int64_t> out;
  const std::int64_t n = l.numel();
  out.reserve(static_cast<std::size_t>(n));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(l.rank()), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t off = l.offset();
    for (int d = 0; d < l.rank(); ++d) off += idx[static_cast<std::size_t>(d)] * l.stride(d);
    out.push_back(off);
    for (int d = l.rank() - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < l.size(d)) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  return out;
}

// A random view of `shape` inside a larger contiguous base: each dimension sliced with a
// random start and step (sometimes negative), then a random permutation undone so the
// view's shape is `shape`. Returns the layout and the base element count.
std::pair<layout, std::int64_t> random_layout(const std::vector<std::int64_t>& shape, std::mt19937_64& rng, bool dense = false)
{
  const int r = static_cast<int>(shape.size());
  std::vector<int> perm(static_cast<std::size_t>(r));
  for (int d = 0; d < r; ++d) perm[static_cast<std::size_t>(d)] = d;
  if (!dense) std::shuffle(perm.begin(), perm.end(), rng);
  // Base shape in permuted order, with room for steps and starts.
  std::vector<std::int64_t> base(static_cast<std::size_t>(r)), step(static_cast<std::size_t>(r)), start(static_cast<std::size_t>(r));
  for (int k = 0; k < r; ++k) {
    const std::int64_t n = shape[static_cast<std::size_t>(perm[static_cast<std::size_t>(k)])];
    const std::int64_t s = dense ? 1 : 1 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t extra = dense ? 0 : static_cast<std::int64_t>(rng() % 3);
    step[static_cast<std::size_t>(k)] = (!dense && rng() % 4 == 0) ? -s : s;
    base[static_cast<std::size_t>(k)] = std::max<std::int64_t>(n, 1) * s + extra;
    start[static_cast<std::size_t>(k)] = extra;
  }
  layout l = layout::contiguous(layout::extents{base.data(), base.size()});
  std::int64_t total = l.numel();
  for (int k = 0; k < r; ++k) {
    const auto u = static_cast<std::size_t>(k);
    const std::int64_t n = shape[static_cast<std::size_t>(perm[u])];
    const std::int64_t s = step[u];
    if (s > 0) {
      l = l.slice(k, start[u], start[u] + n * s, s);
    } else {
      const std::int64_t first = start[u] + (n - 1) * (-s);
      const std::int64_t stop = first - n * (-s);
      l = l.slice(k, first, n == 0 ? first : (stop < 0 ? layout::slice_end : stop), s);
    }
  }
  std::vector<int> inverse(static_cast<std::size_t>(r));
  for (int k = 0; k < r; ++k) inverse[static_cast<std::size_t>(perm[static_cast<std::size_t>(k)])] = k;
  l = l.permute(std::span<const int>{inverse.data(), inverse.size()});
  for (int d = 0; d < r; ++d) REQUIRE(l.size(d) == shape[static_cast<std::size_t>(d)]);
  return {l, total};
}

std::vector<std::int64_t> random_shape(std::mt19937_64& rng, int max_rank = 4, std::int64_t max_size = 9)
{
  const int r = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_rank));
  std::vector<std::int64_t> s(static_cast<std::size_t>(r));
  for (auto& n : s) n = static_cast<std::int64_t>(rng() % static_cast<unsigned>(max_size + 1));
  if (rng() % 3 == 0) {
    for (auto& n : s) n = std::max<std::int64_t>(n, 1);  // no empty dimension most of the time
  }
  return s;
}

constexpr std::uint8_t poison = 0xCD;

}  // namespace

TEST_CASE_TEMPLATE("ops: copy between any layouts and dtypes matches a reference loop", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops copy", 20261122)};
  for (int trial = 0; trial < 400; ++trial) {
    const auto shape = random_shape(rng);
    const dtype st = depot::all_dtypes[rng() % depot::all_dtypes.size()];
    const dtype dt = trial % 2 == 0 ? st : depot::all_dtypes[rng() % depot::all_dtypes.size()];
    auto [sl, sn] = random_layout(shape, rng, trial % 7 == 0);
    auto [dl, dn] = random_layout(shape, rng, trial % 5 == 0);
    CAPTURE(trial);
    CAPTURE(sl.to_string());
    CAPTURE(dl.to_string());
    buffer<D> src{st, sn}, dst{dt, dn};
    const auto sv = random_values(st, sn, rng);
    src.write(sv);
    std::vector<std::uint8_t> expect(dst.mem.size(), poison);
    dst.write(expect);
    const auto so = offsets_of(sl), dof = offsets_of(dl);
    for (std::size_t k = 0; k < so.size(); ++k) {
      convert_one(dt, expect.data() + dof[k] * static_cast<std::int64_t>(depot::size_of(dt)), st,
                  sv.data() + so[k] * static_cast<std::int64_t>(depot::size_of(st)));
    }
    depot::kernels::copy<D>(dst.ref(dl), src.ref(sl), {});
    depot::kernels::fence<D>({});
    REQUIRE(dst.read() == expect);
  }
}

TEST_CASE_TEMPLATE("ops: permuted copies take the tiled path and match", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops transpose", 7)};
  // Shapes whose strides are whole 4-byte words for 1- and 2-byte dtypes take the packed
  // GPU path (with partial tiles and partial words at the edges); the others do not.
  for (auto shape : {std::vector<std::int64_t>{37, 45}, std::vector<std::int64_t>{3, 64, 33},
                     std::vector<std::int64_t>{130, 9}, std::vector<std::int64_t>{2, 3, 40, 50},
                     std::vector<std::int64_t>{300, 260}, std::vector<std::int64_t>{3, 200, 132},
                     std::vector<std::int64_t>{2, 130, 66}, std::vector<std::int64_t>{129, 68}}) {
    for (dtype t : {dtype::uint8, dtype::float16, dtype::float32, dtype::float64}) {
      const layout sl = layout::contiguous(layout::extents{shape.data(), shape.size()});
      // The destination's fastest dimension is the source's first (a transpose of the last two).
      const int r = static_cast<int>(shape.size());
      std::vector<std::int64_t> tshape = shape;
      std::swap(tshape[static_cast<std::size_t>(r - 1)], tshape[static_cast<std::size_t>(r - 2)]);
      const layout dl = layout::contiguous(layout::extents{tshape.data(), tshape.size()}).transpose(r - 1, r - 2);
      buffer<D> src{t, sl.numel()}, dst{t, dl.numel()};
      const auto sv = random_values(t, sl.numel(), rng);
      src.write(sv);
      dst.write(std::vector<std::uint8_t>(dst.mem.size(), poison));
      depot::kernels::copy<D>(dst.ref(dl), src.ref(sl), {});
      depot::kernels::fence<D>({});
      std::vector<std::uint8_t> expect(dst.mem.size(), poison);
      const auto so = offsets_of(sl), dof = offsets_of(dl);
      const std::size_t es = depot::size_of(t);
      for (std::size_t k = 0; k < so.size(); ++k) {
        std::memcpy(expect.data() + static_cast<std::size_t>(dof[k]) * es, sv.data() + static_cast<std::size_t>(so[k]) * es, es);
      }
      CHECK(dst.read() == expect);
    }
  }
}

TEST_CASE_TEMPLATE("ops: fill and masked_fill write exactly their elements", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops fill", 99)};
  for (int trial = 0; trial < 200; ++trial) {
    auto shape = random_shape(rng, 4, trial % 10 == 0 ? 300 : 9);
    if (shape.size() > 2 && trial % 10 == 0) shape.resize(2);
    const dtype t = depot::all_dtypes[rng() % depot::all_dtypes.size()];
    auto [l, n] = random_layout(shape, rng, trial % 3 == 0);
    CAPTURE(l.to_string());
    buffer<D> b{t, n};
    b.write(std::vector<std::uint8_t>(b.mem.size(), poison));
    const auto value = random_values(t, 1, rng);
    std::vector<std::uint8_t> expect(b.mem.size(), poison);
    const std::size_t es = depot::size_of(t);
    if (trial % 2 == 0) {
      depot::kernels::fill<D>(b.ref(l), value.data(), {});
      for (auto off : offsets_of(l)) std::memcpy(expect.data() + static_cast<std::size_t>(off) * es, value.data(), es);
    } else {
      auto [ml, mn] = random_layout(shape, rng);
      buffer<D> mask{dtype::bool_, mn};
      const auto mv = random_values(dtype::bool_, mn, rng);
      mask.write(mv);
      depot::kernels::masked_fill<D>(b.ref(l), mask.ref(ml), value.data(), {});
      const auto lo = offsets_of(l), mo = offsets_of(ml);
      for (std::size_t k = 0; k < lo.size(); ++k) {
        if (mv[static_cast<std::size_t>(mo[k])]) std::memcpy(expect.data() + static_cast<std::size_t>(lo[k]) * es, value.data(), es);
      }
    }
    depot::kernels::fence<D>({});
    REQUIRE(b.read() == expect);
  }
}

TEST_CASE_TEMPLATE("ops: gather and scatter along a dimension match reference loops", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops gather/scatter", 4242)};
  for (int trial = 0; trial < 300; ++trial) {
    auto shape = random_shape(rng, 3, 9);
    if (trial % 6 == 0) shape = {static_cast<std::int64_t>(5 + rng() % 20), 64};  // rows: the 16-byte path
    const int r = static_cast<int>(shape.size());
    const int dim = static_cast<int>(rng() % static_cast<unsigned>(r));
    const dtype t = trial % 6 == 0 ? dtype::float32 : depot::all_dtypes[rng() % depot::all_dtypes.size()];
    const dtype it = rng() % 2 ? dtype::int32 : dtype::int64;
    const std::int64_t extent = shape[static_cast<std::size_t>(dim)];
    const std::int64_t m = extent == 0 ? 0 : static_cast<std::int64_t>(rng() % 12);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(m));
    for (auto& v : idx) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(2 * extent)) - extent;  // [-extent, extent)
    std::vector<std::uint8_t> idx_bytes(static_cast<std::size_t>(std::max<std::int64_t>(m, 1)) * depot::size_of(it));
    for (std::int64_t j = 0; j < m; ++j) {
      if (it == dtype::int32) {
        const auto v = static_cast<std::int32_t>(idx[static_cast<std::size_t>(j)]);
        std::memcpy(idx_bytes.data() + j * 4, &v, 4);
      } else {
        std::memcpy(idx_bytes.data() + j * 8, &idx[static_cast<std::size_t>(j)], 8);
      }
    }
    buffer<D> index{it, m};
    index.write(idx_bytes);
    const layout il = layout::contiguous({m});
    auto oshape = shape;
    oshape[static_cast<std::size_t>(dim)] = m;
    auto [sl, sn] = random_layout(shape, rng, trial % 6 == 0);
    auto [ol, on] = random_layout(oshape, rng, trial % 6 == 0);
    CAPTURE(trial);
    CAPTURE(sl.to_string());
    CAPTURE(ol.to_string());
    CAPTURE(dim);
    const std::size_t es = depot::size_of(t);
    const auto so = offsets_of(sl), oo = offsets_of(ol);
    // Row-major position in the output -> position in the source (dim replaced by the index).
    std::vector<std::int64_t> ostrides(static_cast<std::size_t>(r)), sstrides(static_cast<std::size_t>(r));
    std::int64_t a = 1, b = 1;
    for (int d = r - 1; d >= 0; --d) {
      ostrides[static_cast<std::size_t>(d)] = a;
      sstrides[static_cast<std::size_t>(d)] = b;
      a *= oshape[static_cast<std::size_t>(d)];
      b *= shape[static_cast<std::size_t>(d)];
    }
    auto source_pos = [&](std::int64_t k) {
      std::int64_t pos = 0;
      for (int d = 0; d < r; ++d) {
        std::int64_t c = k / ostrides[static_cast<std::size_t>(d)] % oshape[static_cast<std::size_t>(d)];
        if (d == dim) c = idx[static_cast<std::size_t>(c)] < 0 ? idx[static_cast<std::size_t>(c)] + extent : idx[static_cast<std::size_t>(c)];
        pos += c * sstrides[static_cast<std::size_t>(d)];
      }
      return pos;
    };
    // gather
    {
      buffer<D> src{t, sn}, out{t, on};
      const auto sv = random_values(t, sn, rng);
      src.write(sv);
      std::vector<std::uint8_t> expect(out.mem.size(), poison);
      out.write(expect);
      for (std::size_t k = 0; k < oo.size(); ++k) {
        std::memcpy(expect.data() + static_cast<std::size_t>(oo[k]) * es,
                    sv.data() + static_cast<std::size_t>(so[static_cast<std::size_t>(source_pos(static_cast<std::int64_t>(k)))]) * es, es);
      }
      depot::kernels::gather<D>(out.ref(ol), src.ref(sl), dim, index.ref(il), {});
      depot::kernels::fence<D>({});
      REQUIRE(out.read() == expect);
    }
    // scatter: assign with unique indices; add and add_deterministic with repeats (integers
    // exact; floats exact for the deterministic mode, whose order is the index order).
    for (auto mode : {depot::scatter_mode::assign, depot::scatter_mode::add, depot::scatter_mode::add_deterministic}) {
      if (mode != depot::scatter_mode::assign && t == dtype::bool_) continue;
      if (mode == depot::scatter_mode::add && depot::is_floating_point(t)) continue;  // order-dependent rounding
      std::vector<std::int64_t> wrapped(idx.size());
      for (std::size_t j = 0; j < idx.size(); ++j) wrapped[j] = idx[j] < 0 ? idx[j] + extent : idx[j];
      auto sorted = wrapped;
      std::sort(sorted.begin(), sorted.end());
      if (mode == depot::scatter_mode::assign && std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) continue;
      buffer<D> dst{t, sn}, src{t, on};
      const auto dv = random_values(t, sn, rng);
      const auto sv = random_values(t, on, rng);
      dst.write(dv);
      src.write(sv);
      std::vector<std::uint8_t> expect = dv;
      for (std::size_t k = 0; k < oo.size(); ++k) {
        std::uint8_t* target = expect.data() + static_cast<std::size_t>(so[static_cast<std::size_t>(source_pos(static_cast<std::int64_t>(k)))]) * es;
        const std::uint8_t* value = sv.data() + static_cast<std::size_t>(oo[k]) * es;
        if (mode == depot::scatter_mode::assign) {
          std::memcpy(target, value, es);
        } else {
          depot::visit_dtype(t, [&](auto tag) {
            using T = typename decltype(tag)::type;
            if constexpr (!std::is_same_v<T, bool>) {
              T x, y;
              std::memcpy(&x, target, sizeof(T));
              std::memcpy(&y, value, sizeof(T));
              T z;
              if constexpr (std::is_same_v<T, depot::float16> || std::is_same_v<T, depot::bfloat16>) z = T{static_cast<float>(x) + static_cast<float>(y)};
              else z = static_cast<T>(x + y);
              std::memcpy(target, &z, sizeof(T));
            }
          });
        }
      }
      depot::kernels::scatter<D>(dst.ref(sl), dim, index.ref(il), src.ref(ol), mode, {});
      depot::kernels::fence<D>({});
      CAPTURE(static_cast<int>(mode));
      REQUIRE(dst.read() == expect);
    }
  }
}

TEST_CASE_TEMPLATE("ops: out-of-range indices are refused before anything is written", D, DEPOT_TEST_DEVICES)
{
  buffer<D> src{dtype::float32, 12}, out{dtype::float32, 8}, index{dtype::int64, 2};
  const layout sl = layout::contiguous({3, 4}), ol = layout::contiguous({2, 4}), il = layout::contiguous({2});
  const std::vector<std::uint8_t> before(out.mem.size(), poison);
  out.write(before);
  for (std::int64_t bad : {3, -4, 1000}) {
    std::vector<std::int64_t> idx{1, bad};
    std::vector<std::uint8_t> bytes(16);
    std::memcpy(bytes.data(), idx.data(), 16);
    index.write(bytes);
    try {
      depot::kernels::gather<D>(out.ref(ol), src.ref(sl), 0, index.ref(il), {});
      FAIL("a bad index was accepted");
    } catch (const depot::index_error& e) {
      CHECK(e.index() == bad);
      CHECK(e.position() == 1);
      CHECK(e.dimension() == 0);
      CHECK(e.size() == 3);
      CHECK(std::string{e.what()}.find("valid: -3..2") != std::string::npos);
    }
    CHECK(out.read() == before);
    CHECK_THROWS_AS(depot::kernels::scatter<D>(src.ref(sl), 0, index.ref(il), out.ref(ol), depot::scatter_mode::add, {}),
                    depot::index_error);
  }
  // Shape, dtype and rank mismatches.
  CHECK_THROWS_AS(depot::kernels::gather<D>(out.ref(layout::contiguous({2, 3})), src.ref(sl), 0, index.ref(il), {}),
                  depot::invalid_argument);
  CHECK_THROWS_AS(depot::kernels::gather<D>(out.ref(ol), src.ref(sl), 2, index.ref(il), {}), depot::invalid_argument);
  buffer<D> fidx{dtype::float32, 2};
  CHECK_THROWS_AS(depot::kernels::gather<D>(out.ref(ol), src.ref(sl), 0, fidx.ref(il), {}), depot::invalid_argument);
  buffer<D> other{dtype::float64, 8};
  CHECK_THROWS_AS(depot::kernels::gather<D>(other.ref(ol), src.ref(sl), 0, index.ref(il), {}), depot::invalid_argument);
  CHECK_THROWS_AS(depot::kernels::copy<D>(out.ref(ol), src.ref(sl), {}), depot::invalid_argument);
  buffer<D> b{dtype::bool_, 8};
  CHECK_THROWS_AS(depot::kernels::scatter<D>(b.ref(sl.slice(0, 0, 2)), 0, index.ref(il), b.ref(ol), depot::scatter_mode::add, {}),
                  depot::invalid_argument);
  CHECK(out.read() == before);
}

TEST_CASE_TEMPLATE("ops: take and put by element offsets", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops take/put", 31)};
  const std::int64_t n = 1000, m = 257;
  buffer<D> base{dtype::int32, n}, out{dtype::int32, m}, offs{dtype::int64, m};
  const auto bv = random_values(dtype::int32, n, rng);
  base.write(bv);
  std::vector<std::int64_t> o(static_cast<std::size_t>(m));
  for (auto& v : o) v = static_cast<std::int64_t>(rng() % 1000);
  std::vector<std::uint8_t> ob(static_cast<std::size_t>(m) * 8);
  std::memcpy(ob.data(), o.data(), ob.size());
  offs.write(ob);
  const layout ml = layout::contiguous({m});
  depot::kernels::take<D>(out.ref(ml), base.ref(layout::contiguous({n})), offs.ref(ml), 0, n - 1, {});
  depot::kernels::fence<D>({});
  const auto got = out.read();
  for (std::int64_t k = 0; k < m; ++k) {
    REQUIRE(std::memcmp(got.data() + k * 4, bv.data() + o[static_cast<std::size_t>(k)] * 4, 4) == 0);
  }
  // put with accumulation, both modes, against a host sum.
  for (auto mode : {depot::scatter_mode::add, depot::scatter_mode::add_deterministic}) {
    base.write(bv);
    depot::kernels::put<D>(base.ref(layout::contiguous({n})), offs.ref(ml), 0, n - 1, out.ref(ml), mode, {});
    depot::kernels::fence<D>({});
    std::vector<std::int32_t> expect(static_cast<std::size_t>(n));
    std::memcpy(expect.data(), bv.data(), static_cast<std::size_t>(n) * 4);
    for (std::int64_t k = 0; k < m; ++k) {
      std::int32_t v;
      std::memcpy(&v, got.data() + k * 4, 4);
      expect[static_cast<std::size_t>(o[static_cast<std::size_t>(k)])] += v;
    }
    const auto after = base.read();
    REQUIRE(std::memcmp(after.data(), expect.data(), static_cast<std::size_t>(n) * 4) == 0);
  }
  // An offset outside [lo, hi]: refused, nothing written.
  o[100] = n;
  std::memcpy(ob.data(), o.data(), ob.size());
  offs.write(ob);
  base.write(bv);
  CHECK_THROWS_WITH_AS(depot::kernels::put<D>(base.ref(layout::contiguous({n})), offs.ref(ml), 0, n - 1, out.ref(ml),
                                              depot::scatter_mode::assign, {}),
                       doctest::Contains("position 100"), depot::invalid_argument);
  CHECK(base.read() == bv);
}

TEST_CASE_TEMPLATE("ops: masked_select compacts in order, including empty selections", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops masked_select", 5)};
  for (int trial = 0; trial < 120; ++trial) {
    auto shape = random_shape(rng, 3, trial % 10 == 0 ? 200 : 9);
    const dtype t = depot::all_dtypes[rng() % depot::all_dtypes.size()];
    auto [sl, sn] = random_layout(shape, rng);
    auto [ml, mn] = random_layout(shape, rng);
    buffer<D> src{t, sn}, mask{dtype::bool_, mn};
    const auto sv = random_values(t, sn, rng);
    auto mv = random_values(dtype::bool_, mn, rng);
    if (trial % 7 == 0) std::fill(mv.begin(), mv.end(), 0);  // nothing selected
    src.write(sv);
    mask.write(mv);
    const auto so = offsets_of(sl), mo = offsets_of(ml);
    std::vector<std::uint8_t> expect;
    const std::size_t es = depot::size_of(t);
    for (std::size_t k = 0; k < so.size(); ++k) {
      if (mv[static_cast<std::size_t>(mo[k])]) {
        expect.insert(expect.end(), sv.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(so[k]) * es),
                      sv.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(so[k] + 1) * es));
      }
    }
    const std::int64_t count = depot::kernels::count_true<D>(mask.ref(ml), {});
    REQUIRE(count * static_cast<std::int64_t>(es) == static_cast<std::int64_t>(expect.size()));
    buffer<D> out{t, count};
    depot::kernels::masked_select<D>(out.ref(layout::contiguous({count})), src.ref(sl), mask.ref(ml), {});
    depot::kernels::fence<D>({});
    auto got = out.read();
    got.resize(expect.size());
    REQUIRE(got == expect);
  }
  // Through the typed API, and a mask of the wrong shape.
  auto x = depot::strided_view<float, D>::empty({4, 5});
  depot::ops::fill(x, 2.5F);
  auto m = depot::strided_view<bool, D>::empty({4, 5});
  depot::ops::fill(m, false);
  depot::ops::fill(m.slice(1, 0, 5, 2), true);
  const auto picked = depot::ops::masked_select(x, m);
  CHECK(picked.numel() == 12);
  for (float v : picked.to_host_vector()) CHECK(v == 2.5F);
  auto wrong = depot::strided_view<bool, D>::empty({5, 4});
  CHECK_THROWS_AS((void)depot::ops::masked_select(x, wrong), depot::invalid_argument);
}

TEST_CASE_TEMPLATE("ops: masked_select on dense inputs: chunk edges, alignment, densities, every size", D,
                   DEPOT_TEST_DEVICES)
{
  // The dense GPU path works in chunks of 4096 elements and 16-element runs read as 16-byte
  // words: sizes around those edges, offsets that misalign the source or the mask, masks
  // that select nothing, everything or a random share, and each element size.
  std::mt19937_64 rng{depot::test::seed("ops masked_select dense", 6)};
  const std::int64_t sizes[] = {1, 15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5, 100003};
  const dtype types[] = {dtype::uint8, dtype::int16, dtype::float32, dtype::float64};
  int trial = 0;
  for (const std::int64_t n : sizes) {
    for (const dtype t : types) {
      ++trial;
      const std::int64_t soff = trial % 2, moff = (trial / 2) % 2 * 3;
      buffer<D> src{t, n + soff}, mask{dtype::bool_, n + moff};
      const auto sv = random_values(t, n + soff, rng);
      auto mv = random_values(dtype::bool_, n + moff, rng);
      const int density = trial % 4;  // 0: none, 1: all, else random
      for (std::int64_t i = moff; i < n + moff; ++i) {
        if (density < 2) mv[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(density);
      }
      src.write(sv);
      mask.write(mv);
      const std::size_t es = depot::size_of(t);
      std::vector<std::uint8_t> expect;
      for (std::int64_t i = 0; i < n; ++i) {
        if (mv[static_cast<std::size_t>(i + moff)] != 0) {
          const auto at = sv.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i + soff) * es);
          expect.insert(expect.end(), at, at + static_cast<std::ptrdiff_t>(es));
        }
      }
      const auto count = static_cast<std::int64_t>(expect.size() / es);
      CAPTURE(n);
      const std::string tname{depot::to_string(t)};
      CAPTURE(tname);
      CAPTURE(soff);
      CAPTURE(moff);
      const std::int64_t shape1[1] = {n}, unit[1] = {1};
      const layout sl{layout::extents{shape1}, layout::extents{unit}, soff};
      const layout ml{layout::extents{shape1}, layout::extents{unit}, moff};
      REQUIRE(depot::kernels::count_true<D>(mask.ref(ml), {}) == count);
      buffer<D> out{t, count + 1};
      const std::vector<std::uint8_t> poison(static_cast<std::size_t>(count + 1) * es, 0xA5);
      out.write(poison);
      // A destination of the wrong length is refused with nothing written.
      const std::string says = "but the mask selects " + std::to_string(count);
      CHECK_THROWS_WITH_AS(depot::kernels::masked_select<D>(out.ref(layout::contiguous({count + 1})), src.ref(sl),
                                                            mask.ref(ml), {}),
                           doctest::Contains(says.c_str()), depot::invalid_argument);
      CHECK(out.read() == poison);
      depot::kernels::masked_select<D>(out.ref(layout::contiguous({count})), src.ref(sl), mask.ref(ml), {});
      depot::kernels::fence<D>({});
      auto got = out.read();
      REQUIRE(std::equal(expect.begin(), expect.end(), got.begin()));
      // The element after the selection stays poisoned.
      CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(expect.size()), got.end(),
                        [](std::uint8_t b) { return b == 0xA5; }));
    }
  }
}

TEST_CASE_TEMPLATE("ops: typed API: copy with conversion, index_select, index_add", D, DEPOT_TEST_DEVICES)
{
  auto a = depot::strided_view<std::int32_t, D>::empty({3, 4});
  depot::ops::fill(a, 7);
  auto b = depot::strided_view<double, D>::empty({4, 3});
  depot::ops::copy(b, a.transpose(0, 1));
  for (double v : b.to_host_vector()) CHECK(v == 7.0);
  auto idx = depot::strided_view<std::int64_t, D>::empty({2});
  depot::ops::fill(idx.slice(0, 0, 1), std::int64_t{-1});
  depot::ops::fill(idx.slice(0, 1, 2), std::int64_t{0});
  const auto rows = depot::ops::index_select(b, 0, idx);
  CHECK(rows.numel() == 6);
  depot::ops::index_add(b, 0, idx, rows);
  const auto h = b.to_host_vector();
  CHECK(h[0] == 14.0);
  CHECK(h[3] == 7.0);
  CHECK(h[9] == 14.0);
}

TEST_CASE_TEMPLATE("ops: more than 2^32 elements take the 64-bit paths", D, DEPOT_TEST_DEVICES)
{
  if constexpr (!depot::is_gpu_v<D>) {
    MESSAGE("host: skipped here (4 GiB per buffer); runs on the GPU backend");
  } else {
    const std::int64_t n = (std::int64_t{1} << 32) + 1000;
    auto x = depot::strided_view<std::uint8_t, D>::empty({n});
    depot::ops::fill(x, std::uint8_t{3});
    depot::ops::fill(x.slice(0, n - 7, n), std::uint8_t{9});
    auto tail = x.slice(0, n - 10, n).to_host_vector();
    CHECK(tail == std::vector<std::uint8_t>{3, 3, 3, 9, 9, 9, 9, 9, 9, 9});
    auto idx = depot::strided_view<std::int64_t, D>::empty({2});
    depot::ops::fill(idx.slice(0, 0, 1), n - 1);
    depot::ops::fill(idx.slice(0, 1, 2), std::int64_t{-(n - 5)});  // element 5
    CHECK(depot::ops::index_select(x, 0, idx).to_host_vector() == std::vector<std::uint8_t>{9, 3});
    auto m = depot::strided_view<bool, D>::empty({n});
    depot::ops::fill(m, false);
    depot::ops::fill(m.slice(0, n - 3, n), true);
    CHECK(depot::ops::masked_select(x, m).to_host_vector() == std::vector<std::uint8_t>{9, 9, 9});
    x = {};
    m = {};
    // A transpose of 2^32 + 29 million bytes: the packed tiles with 64-bit tile origins,
    // partial tiles and partial words on both edges. Every element is checked.
    const std::int64_t rows = (std::int64_t{1} << 24) + 4, cols = 260;
    auto pattern = [](std::int64_t i, std::int64_t j) { return static_cast<std::uint8_t>(i * 7 + j * 13 + (i >> 8)); };
    std::vector<std::uint8_t> host(static_cast<std::size_t>(rows * cols));
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) host[static_cast<std::size_t>(i * cols + j)] = pattern(i, j);
    }
    auto a = depot::strided_view<std::uint8_t, D>::empty({rows, cols});
    depot::runtime<D>::copy(a.data(), host.data(), host.size());
    const auto at = a.transpose(0, 1).contiguous().to_host_vector();  // [cols, rows]
    REQUIRE(at.size() == host.size());
    std::int64_t wrong = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      for (std::int64_t i = 0; i < rows; ++i) wrong += at[static_cast<std::size_t>(j * rows + i)] != pattern(i, j);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE_TEMPLATE("ops: float scatter-add of rows (the vector-atomic path) sums exactly on integers", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("ops scatter-add rows", 77)};
  const std::int64_t rows = 10, cols = 64, m = 25;
  std::vector<float> dst_h(static_cast<std::size_t>(rows * cols)), src_h(static_cast<std::size_t>(m * cols));
  for (auto& v : dst_h) v = static_cast<float>(rng() % 100);
  for (auto& v : src_h) v = static_cast<float>(static_cast<int>(rng() % 200) - 100);  // integers: sums exact in any order
  std::vector<std::int64_t> idx_h(static_cast<std::size_t>(m));
  for (auto& v : idx_h) v = static_cast<std::int64_t>(rng() % rows) - (rng() % 2 ? rows : 0);
  auto dst = depot::strided_view<float, D>::empty({rows, cols});
  auto src = depot::strided_view<float, D>::empty({m, cols});
  auto idx = depot::strided_view<std::int64_t, D>::empty({m});
  depot::runtime<D>::copy(dst.data(), dst_h.data(), dst_h.size() * 4);
  depot::runtime<D>::copy(src.data(), src_h.data(), src_h.size() * 4);
  depot::runtime<D>::copy(idx.data(), idx_h.data(), idx_h.size() * 8);
  auto expect = dst_h;
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t r = idx_h[static_cast<std::size_t>(j)] < 0 ? idx_h[static_cast<std::size_t>(j)] + rows : idx_h[static_cast<std::size_t>(j)];
    for (std::int64_t c = 0; c < cols; ++c) expect[static_cast<std::size_t>(r * cols + c)] += src_h[static_cast<std::size_t>(j * cols + c)];
  }
  depot::ops::index_add(dst, 0, idx, src);
  CHECK(dst.to_host_vector() == expect);
  // The same sums through the deterministic mode, twice: identical bits.
  depot::runtime<D>::copy(dst.data(), dst_h.data(), dst_h.size() * 4);
  depot::ops::scatter(dst, 0, idx, src, depot::scatter_mode::add_deterministic);
  CHECK(dst.to_host_vector() == expect);
}

// The ops that reduce or scan (the index check before a gather, masked_select, count)
// called from a thread other than the one that initialised Kokkos: they run, or, on the
// host with Kokkos 3.x's OpenMP backend (host state per thread), each is refused with a
// depot::error naming the cause and the remedy, where Kokkos threw a bare runtime_error
// ("parallel_reduce ERROR: in parallel or not initialized"); the same calls from this
// thread run.
TEST_CASE_TEMPLATE("ops: reductions and scans from another thread run, or are refused with the cause", D,
                   DEPOT_TEST_DEVICES)
{
  depot::ops::ensure_kokkos();  // on this thread
  auto b = depot::strided_view<double, D>::empty({4, 3});
  depot::ops::fill(b, 7.0);
  auto idx = depot::strided_view<std::int64_t, D>::empty({2});
  depot::ops::fill(idx, std::int64_t{1});
  auto m = depot::strided_view<bool, D>::empty({12});
  depot::ops::fill(m, true);
  const auto run_all = [&] {
    CHECK(depot::ops::index_select(b, 0, idx).numel() == 6);
    CHECK(depot::ops::masked_select(b.view({-1}), m).numel() == 12);
  };
  int refused = 0, failed = 0, ran = 0;
  std::string message;
  std::thread t{[&] {
    const auto attempt = [&](auto f) {
      try {
        f();
        ++ran;
      } catch (const depot::error& e) {
        ++refused;
        message = e.what();
      } catch (...) {
        ++failed;
      }
    };
    attempt([&] { (void)depot::ops::index_select(b, 0, idx); });
    attempt([&] { (void)depot::ops::masked_select(b.view({-1}), m); });
  }};
  t.join();
  const std::string kokkos = depot::ops::kokkos_description();
  MESSAGE(kokkos << ": " << ran << " ran, " << refused << " refused on another thread");
  CHECK(failed == 0);
  CHECK(ran + refused == 2);
  if (refused > 0) {
    CAPTURE(message);
    CHECK(ran == 0);
    CHECK_FALSE(depot::is_gpu_v<D>);  // (a GPU's reductions need no host thread state)
    CHECK(kokkos.rfind("Kokkos 3.", 0) == 0);
    CHECK(message.find("only on the thread that initialised Kokkos") != std::string::npos);
    CHECK(message.rfind("depot::", 0) == 0);  // the op's label first (masked_select counts first)
  }
  run_all();  // this thread: they run
}

// Reductions and scans launched at once by two threads on one stream (the default stream,
// a depot::stream, and on a GPU the per-thread default stream's handle, whose instance every
// thread shares): each thread gets its own count and its own elements, never the other's
// (a Kokkos instance has one scratch area: ops::detail::scratch_guard). The threads' masks
// select different counts of different values, so a result crossed over shows. Where
// Kokkos runs host reductions only on its initialising thread (Kokkos 3.x, OpenMP), the
// other thread is refused (the case above) and this thread's results are still checked.
TEST_CASE_TEMPLATE("ops: reductions and scans from two threads at once on one stream give each its own result", D,
                   DEPOT_TEST_DEVICES)
{
  depot::ops::ensure_kokkos();
  constexpr std::int64_t n = 4096;
  constexpr int rounds = depot::is_gpu_v<D> ? 200 : 50;  // (the host's: for a 2-core CI machine)
  struct side {
    std::int64_t selected;
    double value;
  };
  const auto make = [](side w) {
    auto src = depot::strided_view<double, D>::empty({n});
    depot::ops::fill(src, w.value);
    auto mask = depot::strided_view<bool, D>::empty({n});
    depot::ops::fill(mask, false);
    depot::ops::fill(mask.slice(0, 0, w.selected), true);
    return std::make_pair(src, mask);
  };
  depot::stream<D> own;
  std::vector<depot::stream_ref<D>> streams{depot::stream_ref<D>{}, own.ref()};
  if constexpr (depot::is_gpu_v<D>) {
    streams.push_back(depot::stream_ref<D>{reinterpret_cast<depot::native_stream>(depot::per_thread_stream_handle)});
  }
  for (const depot::stream_ref<D> s : streams) {
    CAPTURE(reinterpret_cast<std::uintptr_t>(s.native()));
    const side mine{1000, 1.0}, theirs{3000, 2.0};
    const auto [src_a, mask_a] = make(mine);
    const auto [src_b, mask_b] = make(theirs);
    auto idx = depot::strided_view<std::int64_t, D>::empty({n});
    depot::ops::fill(idx, std::int64_t{n - 1});
    (void)depot::ops::masked_select(src_a, mask_a, s);  // (this thread makes the stream's instance)
    // One thread's rounds: masked_select (a count, then a scan) and index_select (an index
    // check: a reduction), every result checked. What goes wrong is counted, with the first
    // exception's text, never thrown on (doctest's assertions are for this thread, and a
    // count crossed over can throw: a destination of the other's size, a huge one); a
    // refusal of the host thread (Kokkos 3.x) ends the rounds.
    struct outcome {
      int wrong = 0;
      bool refused = false;
      std::string first;
    };
    const auto work = [&](const side w, const depot::strided_view<double, D>& src,
                          const depot::strided_view<bool, D>& mask, outcome& o) {
      for (int r = 0; r < rounds; ++r) {
        try {
          const auto out = depot::ops::masked_select(src, mask, s);
          (void)depot::ops::index_select(src, 0, idx, s);
          s.synchronize();
          const auto h = out.to_host_vector();
          if (out.numel() != w.selected || std::count(h.begin(), h.end(), w.value) != w.selected) ++o.wrong;
        } catch (const std::exception& e) {
          if (std::string{e.what()}.find("only on the thread that initialised Kokkos") != std::string::npos) {
            o.refused = true;
            return;
          }
          ++o.wrong;
          if (o.first.empty()) o.first = e.what();
        } catch (...) {
          ++o.wrong;
        }
      }
    };
    outcome a, b;
    std::thread t{[&] { work(theirs, src_b, mask_b, b); }};
    work(mine, src_a, mask_a, a);
    t.join();
    const std::string other = b.refused ? "was refused" : "ran";
    MESSAGE(depot::ops::kokkos_description() << ", stream " << s.native() << ": the other thread " << other);
    CAPTURE(a.first);
    CAPTURE(b.first);
    CHECK(a.wrong == 0);
    CHECK(b.wrong == 0);
    CHECK_FALSE(a.refused);
    if (b.refused) CHECK_FALSE(depot::is_gpu_v<D>);  // (only the host's are refused: the case above)
  }
}

// A stream's Kokkos instance (with its device scratch memory) is made on the stream's first
// kernel and goes as the stream closes: a program that makes and destroys streams keeps
// none of theirs (it kept every one, and each launch walked them all). A depot::stream's
// destruction closes it; a raw handle's owner says so with stream_registry::closing(). The
// host's streams share Kokkos' default instance (none kept).
TEST_CASE_TEMPLATE("ops: a stream's Kokkos instance is dropped as the stream closes", D, DEPOT_TEST_DEVICES)
{
  depot::ops::ensure_kokkos();
  constexpr std::int64_t n = 1000;
  auto src = depot::strided_view<double, D>::empty({n});
  depot::ops::fill(src, 1.0);
  auto mask = depot::strided_view<bool, D>::empty({n});
  depot::ops::fill(mask, false);
  depot::ops::fill(mask.slice(0, 0, 300), true);
  const std::size_t before = depot::ops::kept_instances<D>();
  const std::size_t one = depot::is_gpu_v<D> ? 1 : 0;  // what a live stream adds
  constexpr int rounds = 100;
  for (int r = 0; r < rounds; ++r) {
    CAPTURE(r);
    depot::stream<D> s;
    // A kernel, then a reduction and a scan (the scratch area's users: masked_select, its result checked).
    auto dst = depot::strided_view<double, D>::empty({n});
    depot::ops::fill(dst, 0.0, s.ref());
    const auto out = depot::ops::masked_select(src, mask, s.ref());
    s.synchronize();
    REQUIRE(out.numel() == 300);
    REQUIRE(depot::ops::kept_instances<D>() == before + one);
  }
  CHECK(depot::ops::kept_instances<D>() == before);
  // A raw handle: kept while its owner uses it, dropped by closing().
  const depot::native_stream raw = depot::runtime<D>::create_stream(0);
  const depot::stream_ref<D> r{raw};
  depot::ops::fill(src, 2.0, r);
  r.synchronize();
  CHECK(depot::ops::kept_instances<D>() == before + one);
  depot::stream_registry::closing(depot::device_id::of<D>(0), raw);
  CHECK(depot::ops::kept_instances<D>() == before);
  depot::runtime<D>::destroy_stream(raw, 0);
  // Another backend's stream closing with the same handle drops nothing of this one's.
  if constexpr (depot::is_gpu_v<D>) {
    const depot::stream<D> kept;
    depot::ops::fill(src, 3.0, kept.ref());
    kept.synchronize();
    depot::stream_registry::closing(depot::device_id{depot::device_kind::host, 0}, kept.native());
    CHECK(depot::ops::kept_instances<D>() == before + 1);
    const auto h = src.to_host_vector();
    CHECK(std::count(h.begin(), h.end(), 3.0) == n);
  }
}

// Many live streams at once: each keeps one instance, found by every thread that launches
// on it (threads launching on the same streams at once), and each goes as its stream closes,
// in any order, the others' still serving. (The instances are made on this thread: Kokkos
// 3.x with the OpenMP host backend makes one on the thread that initialised it alone.)
TEST_CASE_TEMPLATE("ops: many live streams keep one instance each, closed in any order", D, DEPOT_TEST_DEVICES)
{
  depot::ops::ensure_kokkos();
  constexpr int n_streams = 16;
  constexpr int threads = 4;
  constexpr std::int64_t per = 256;  // elements of each (thread, stream) slice
  std::mt19937_64 rng{depot::test::seed("ops many streams", 1207)};
  const std::size_t before = depot::ops::kept_instances<D>();
  const std::size_t one = depot::is_gpu_v<D> ? 1 : 0;
  std::vector<std::unique_ptr<depot::stream<D>>> streams;
  for (int k = 0; k < n_streams; ++k) streams.push_back(std::make_unique<depot::stream<D>>());
  auto out = depot::strided_view<double, D>::empty({threads, n_streams, per});
  depot::ops::fill(out, -1.0);
  depot::synchronize<D>();
  // First kernels in a shuffled order (the table's sorted slots filled out of order).
  std::vector<int> order(n_streams);
  for (int k = 0; k < n_streams; ++k) order[static_cast<std::size_t>(k)] = k;
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int k = order[i];
    depot::ops::fill(out.select(0, 0).select(0, k), 0.0, streams[static_cast<std::size_t>(k)]->ref());
    REQUIRE(depot::ops::kept_instances<D>() == before + one * (i + 1));
  }
  // Every thread on every stream, all at once: thread t writes t * 100 + k on stream k.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (int j = 0; j < n_streams; ++j) {
          const int k = (j + t * 5 + round) % n_streams;
          depot::ops::fill(out.select(0, t).select(0, k), t * 100.0 + k, streams[static_cast<std::size_t>(k)]->ref());
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& s : streams) s->synchronize();
  CHECK(depot::ops::kept_instances<D>() == before + one * n_streams);
  const auto h = out.to_host_vector();
  for (int t = 0; t < threads; ++t) {
    for (int k = 0; k < n_streams; ++k) {
      const auto at = h.begin() + (static_cast<std::ptrdiff_t>(t) * n_streams + k) * per;
      CHECK_MESSAGE(std::count(at, at + per, t * 100.0 + k) == per, "thread " << t << ", stream " << k);
    }
  }
  // Closed in another order; after each, every stream left still launches (a reduction and a scan too).
  auto mask = depot::strided_view<bool, D>::empty({per});
  depot::ops::fill(mask, true);
  depot::synchronize<D>();
  std::shuffle(order.begin(), order.end(), rng);
  std::size_t left = n_streams;
  for (const int k : order) {
    streams[static_cast<std::size_t>(k)].reset();
    --left;
    REQUIRE(depot::ops::kept_instances<D>() == before + one * left);
    for (int j = 0; j < n_streams; ++j) {
      if (streams[static_cast<std::size_t>(j)] == nullptr) continue;
      const auto& s = *streams[static_cast<std::size_t>(j)];
      const auto row = out.select(0, 1).select(0, j);
      depot::ops::fill(row, static_cast<double>(left), s.ref());
      const auto picked = depot::ops::masked_select(row, mask, s.ref());
      s.synchronize();
      REQUIRE(picked.numel() == per);
      const auto v = picked.to_host_vector();
      REQUIRE(std::count(v.begin(), v.end(), static_cast<double>(left)) == per);
    }
  }
  CHECK(depot::ops::kept_instances<D>() == before);
}
