// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/storage/layout.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using depot::layout;
constexpr auto end = layout::slice_end;

// The element offsets of a layout in row-major order of its index space.
std::vector<std::int64_t> offsets(const layout& l)
{
  std::vector<std::int64_t> out;
  const int r = l.rank();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  const std::int64_t n = l.numel();
  for (std::int64_t k = 0; k < n; ++k) {
    out.push_back(l.offset_of(layout::extents{idx.data(), idx.size()}));
    for (int d = r - 1; d >= 0; --d) {
      auto& i = idx[static_cast<std::size_t>(d)];
      if (++i < l.size(d)) break;
      i = 0;
    }
  }
  return out;
}

std::vector<std::int64_t> seq(std::initializer_list<std::int64_t> v) { return v; }

}  // namespace

TEST_CASE("layout: Python slicing of one dimension, as NumPy does it")
{
  const layout x = layout::contiguous({10});
  CHECK(offsets(x.slice(0, 2, 8, 3)) == seq({2, 5}));
  CHECK(offsets(x.slice(0, end, end, -1)) == seq({9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK(offsets(x.slice(0, -3, end)) == seq({7, 8, 9}));
  CHECK(offsets(x.slice(0, 8, 2, -2)) == seq({8, 6, 4}));
  CHECK(offsets(x.slice(0, -100, 100)) == seq({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  CHECK(offsets(x.slice(0, 5, 5)).empty());
  CHECK(offsets(x.slice(0, 7, 3)).empty());
  CHECK(offsets(x.slice(0, end, end, -4)) == seq({9, 5, 1}));
  CHECK(offsets(x.slice(0, -1, -11, -1)) == seq({9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK(offsets(x.slice(0, 100, end, -1)) == seq({9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK(offsets(x.slice(0, end, -100, -1)) == seq({9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK(offsets(x.slice(0, 3, end, 100)) == seq({3}));
  CHECK(x.slice(0, 2, 8, 3).stride(0) == 3);
  CHECK_THROWS_AS((void)x.slice(0, 0, 5, 0), depot::invalid_argument);
  CHECK_THROWS_AS((void)x.slice(1, 0, 5), depot::invalid_argument);
}

TEST_CASE("layout: indexing, select, transpose and permute")
{
  const layout x = layout::contiguous({2, 3, 4});
  CHECK(x.numel() == 24);
  CHECK(x.is_contiguous());
  CHECK(x.offset_of({1, 2, 3}) == 23);
  CHECK(x.offset_of({-1, -1, -1}) == 23);  // negative indices count from the end
  CHECK(x.offset_of({0, -3, 0}) == 0);
  try {
    (void)x.offset_of({0, 3, 0});
    FAIL("index 3 of size 3 was accepted");
  } catch (const depot::index_error& e) {
    CHECK(std::string{e.what()} == "depot: index 3 is out of bounds for dimension 1 with size 3");
  }
  CHECK_THROWS_AS((void)x.offset_of({0, -4, 0}), depot::index_error);
  CHECK_THROWS_AS((void)x.offset_of({0, 0}), depot::invalid_argument);

  const layout row = x.select(0, 1);  // x[1]
  CHECK(row.rank() == 2);
  CHECK(row.offset() == 12);
  CHECK(offsets(row.select(1, -1)) == seq({15, 19, 23}));  // x[1, :, -1]
  CHECK_THROWS_AS((void)x.select(2, 4), depot::index_error);

  const layout t = x.transpose(0, 2);  // shape (4, 3, 2)
  CHECK(t.size(0) == 4);
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.offset_of({3, 2, 1}) == x.offset_of({1, 2, 3}));
  const layout p = x.permute({2, 0, 1});  // shape (4, 2, 3)
  CHECK(p.size(0) == 4);
  CHECK(p.size(1) == 2);
  CHECK(p.offset_of({3, 1, 2}) == x.offset_of({1, 2, 3}));
  CHECK_THROWS_AS((void)x.permute({0, 0, 1}), depot::invalid_argument);
  CHECK_THROWS_AS((void)x.permute({0, 1}), depot::invalid_argument);
  CHECK_THROWS_AS((void)x.permute({0, 1, 3}), depot::invalid_argument);
}

TEST_CASE("layout: reshape is a view when the strides allow, and says so when not")
{
  const layout a = layout::contiguous({4, 6});
  const auto flat = a.view_as({-1});
  REQUIRE(flat);
  CHECK(flat->size(0) == 24);
  CHECK(offsets(*flat) == offsets(a));

  const layout every_other = a.slice(1, 0, 6, 2);  // a[:, ::2]: elements 0, 2, ..., 22
  const auto strided = every_other.view_as({12});  // a view with stride 2, as in NumPy
  REQUIRE(strided);
  CHECK(strided->stride(0) == 2);
  CHECK(offsets(*strided) == offsets(every_other));

  const layout cols = a.slice(1, 0, 3);  // a[:, :3]: shape (4, 3), strides (6, 1)
  CHECK_FALSE(cols.view_as({12}));       // rows are not adjacent: needs a copy
  const auto split = cols.view_as({2, 2, 3});
  REQUIRE(split);
  CHECK(offsets(*split) == offsets(cols));
  const auto ones = cols.view_as({4, 1, 3, 1});
  REQUIRE(ones);
  CHECK(offsets(*ones) == offsets(cols));

  const layout t = a.transpose(0, 1);  // (6, 4)
  CHECK_FALSE(t.view_as({24}));
  const auto same = t.view_as({6, 4});
  REQUIRE(same);
  CHECK(offsets(*same) == offsets(t));

  CHECK_THROWS_AS((void)a.view_as({5, 5}), depot::invalid_argument);
  CHECK_THROWS_AS((void)a.view_as({-1, -1}), depot::invalid_argument);
  CHECK_THROWS_AS((void)a.view_as({7, -1}), depot::invalid_argument);
  const layout empty = layout::contiguous({0, 5});
  const auto e = empty.view_as({5, 0, 3});
  REQUIRE(e);
  CHECK(e->numel() == 0);
}

TEST_CASE("layout: random views agree with their source element by element")
{
  std::mt19937_64 rng{depot::test::seed("layout random views", 8128)};
  for (int trial = 0; trial < 500; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    std::vector<std::int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<std::int64_t>(rng() % 5));
    layout l = layout::contiguous(layout::extents{shape.data(), shape.size()});
    // A few random slices and a transpose.
    for (int k = 0; k < 2; ++k) {
      const int d = static_cast<int>(rng() % static_cast<unsigned>(rank));
      const std::int64_t n = l.size(d);
      const std::int64_t step = (rng() % 2 ? 1 : -1) * (1 + static_cast<std::int64_t>(rng() % 2));
      l = l.slice(d, static_cast<std::int64_t>(rng() % (n + 1)) - (step < 0 ? 0 : 0), end, step);
    }
    if (rank > 1) l = l.transpose(0, rank - 1);
    const auto before = offsets(l);
    CAPTURE(l.to_string());
    // Reshape to the flat shape and back: when it is a view, it must see the same elements.
    if (const auto flat = l.view_as({-1})) {
      CHECK(offsets(*flat) == before);
    } else {
      CHECK_FALSE(l.is_contiguous());
    }
    std::vector<std::int64_t> split;
    for (int d = 0; d < l.rank(); ++d) {
      split.push_back(l.size(d));
      split.push_back(1);
    }
    if (split.size() <= static_cast<std::size_t>(depot::max_rank)) {
      const auto v = l.view_as(layout::extents{split.data(), split.size()});
      REQUIRE(v);  // inserting size-1 dimensions is always a view
      CHECK(offsets(*v) == before);
    }
  }
}

TEST_CASE("layout: bad shapes are refused without wrapping")
{
  const std::vector<std::int64_t> nine(9, 2);
  CHECK_THROWS_AS((void)layout::contiguous(layout::extents{nine.data(), nine.size()}), depot::invalid_argument);
  CHECK_THROWS_AS((void)layout::contiguous({3, -1}), depot::invalid_argument);
  CHECK_THROWS_AS((void)layout::contiguous({std::int64_t{1} << 40, std::int64_t{1} << 40}),
                  depot::invalid_argument);
  const std::vector<std::int64_t> shape{4, 4};
  const std::vector<std::int64_t> strides{std::int64_t{1} << 62, 1};
  CHECK_THROWS_AS((layout{layout::extents{shape.data(), 2}, layout::extents{strides.data(), 2}, 0}),
                  depot::invalid_argument);
  const std::vector<std::int64_t> one{4};
  CHECK_THROWS_AS((layout{layout::extents{shape.data(), 2}, layout::extents{one.data(), 1}, 0}),
                  depot::invalid_argument);
  CHECK_THROWS_AS((layout{layout::extents{shape.data(), 2}, layout::extents{shape.data(), 2}, -1}),
                  depot::invalid_argument);
  const std::vector<std::int64_t> neg{-4, 1};
  const layout reversed{layout::extents{shape.data(), 2}, layout::extents{neg.data(), 2}, 12};
  CHECK(reversed.min_offset() == 0);
  CHECK(reversed.max_offset() == 15);
  CHECK(layout{}.numel() == 1);
  CHECK(layout{}.offset_of(layout::extents{}) == 0);
}
