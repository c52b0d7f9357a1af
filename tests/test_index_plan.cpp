// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Index plans: kinds, shapes, strides and offsets of many expressions against NumPy's results
// (hand-computed; numpy is not a test dependency), every plan kind executed on every device,
// random expressions against a plain host reference (multi-index arithmetic, no strides),
// and bad input: the exact error type, an informative message, nothing written.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/storage/index_planner.hpp>
#include <depot/storage/strided_view.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using depot::index_plan_kind;
using depot::index_route;
using depot::layout;
using depot::none;
using depot::slice;
using i64 = std::int64_t;
using shape_t = std::vector<i64>;
using ivec = std::vector<i64>;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A contiguous host view of `shape` holding 0, 1, 2, ...
template <class T = float>
depot::strided_view<T> iota(std::initializer_list<i64> shape)
{
  auto v = depot::strided_view<T>::empty(shape);
  for (i64 i = 0; i < v.numel(); ++i) v.data()[i] = static_cast<T>(i);
  return v;
}

template <class T, depot::device D = depot::host>
depot::strided_view<T, D> make(const shape_t& shape, const std::vector<T>& values)
{
  auto h = depot::strided_view<T>::empty(shape);
  std::copy(values.begin(), values.end(), h.data());
  return h.template to<D>();
}

template <depot::device D = depot::host>
depot::strided_view<bool, D> make_mask(const shape_t& shape, const std::vector<int>& bits)
{
  auto h = depot::strided_view<bool>::empty(shape);
  for (std::size_t i = 0; i < bits.size(); ++i) h.data()[i] = bits[i] != 0;
  return h.template to<D>();
}

template <class T = float>
std::vector<T> vals(std::initializer_list<i64> v)
{
  std::vector<T> out;
  for (i64 x : v) out.push_back(static_cast<T>(x));
  return out;
}

shape_t shape_of(const depot::index_plan& p) { return {p.shape.begin(), p.shape.begin() + p.rank}; }
shape_t strides_of(const depot::index_plan& p) { return {p.strides.begin(), p.strides.begin() + p.rank}; }
template <class V>
shape_t shape_of_view(const V& v)
{
  return {v.shape().begin(), v.shape().end()};
}

depot::index_plan plan(const layout& l, const depot::index_expr& e, depot::index_op op = depot::index_op::read)
{
  return depot::plan_index(l, depot::dtype::float32, e, op);
}

// ---------------------------------------------------------------------------------------
// The host reference: NumPy's rules written with multi-indices (no strides, no layouts).

struct ref_item {
  enum kind { integer, slc, newaxis, ellipsis, array, mask } k;
  i64 value = 0;
  slice s{};
  shape_t shape{};
  ivec values{};  // array values, or mask bits
};

struct ref_result {
  shape_t shape;
  ivec positions;  // row-major positions in x (logical, row-major), one per result element
};

i64 numel(const shape_t& s)
{
  i64 n = 1;
  for (i64 v : s) n *= v;
  return n;
}

// CPython's slice.indices().
std::pair<i64, i64> py_slice(const slice& s, i64 n)
{
  const i64 step = s.step.value_or(1);
  const i64 lower = step < 0 ? -1 : 0;
  const i64 upper = step < 0 ? n - 1 : n;
  auto fix = [&](std::optional<i64> v, i64 dflt) {
    if (!v) return dflt;
    i64 x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = lower;
    } else if (x >= upper) {
      x = upper;
    }
    return x;
  };
  const i64 start = fix(s.start, step < 0 ? upper : lower);
  const i64 stop = fix(s.stop, step < 0 ? lower : upper);
  i64 count = 0;
  if (step > 0 && stop > start) count = (stop - start - 1) / step + 1;
  if (step < 0 && start > stop) count = (start - stop - 1) / (-step) + 1;
  return {start, count};
}

ref_result reference(const shape_t& xs, const std::vector<ref_item>& items_in)
{
  const int n = static_cast<int>(xs.size());
  // Masks become their nonzero() arrays; 0-d masks stay (they index no dimension).
  struct adv {
    shape_t shape;
    ivec values;
    bool no_dim = false;
  };
  struct entry {
    ref_item::kind k;
    i64 value = 0;
    slice s{};
    int advanced = -1;  // index into advs
  };
  std::vector<adv> advs;
  std::vector<entry> entries;
  int used = 0;
  for (const auto& it : items_in) used += it.k == ref_item::integer || it.k == ref_item::slc || it.k == ref_item::array ? 1
                                          : it.k == ref_item::mask ? static_cast<int>(it.shape.size())
                                                                   : 0;
  for (const auto& it : items_in) {
    if (it.k == ref_item::mask) {
      const int r = static_cast<int>(it.shape.size());
      if (r == 0) {
        advs.push_back({{it.values[0] ? 1 : 0}, ivec(it.values[0] ? 1 : 0, 0), true});
        entries.push_back({ref_item::array, 0, {}, static_cast<int>(advs.size()) - 1});
        continue;
      }
      std::vector<ivec> nz(static_cast<std::size_t>(r));
      for (i64 p = 0; p < numel(it.shape); ++p) {
        if (!it.values[static_cast<std::size_t>(p)]) continue;
        i64 rest = p;
        ivec at(static_cast<std::size_t>(r));
        for (int j = r - 1; j >= 0; --j) {
          at[static_cast<std::size_t>(j)] = rest % it.shape[static_cast<std::size_t>(j)];
          rest /= it.shape[static_cast<std::size_t>(j)];
        }
        for (int j = 0; j < r; ++j) nz[static_cast<std::size_t>(j)].push_back(at[static_cast<std::size_t>(j)]);
      }
      for (int j = 0; j < r; ++j) {
        advs.push_back({{static_cast<i64>(nz[static_cast<std::size_t>(j)].size())}, nz[static_cast<std::size_t>(j)]});
        entries.push_back({ref_item::array, 0, {}, static_cast<int>(advs.size()) - 1});
      }
      continue;
    }
    if (it.k == ref_item::array) {
      advs.push_back({it.shape, it.values});
      entries.push_back({ref_item::array, 0, {}, static_cast<int>(advs.size()) - 1});
      continue;
    }
    if (it.k == ref_item::ellipsis) {
      entries.push_back({ref_item::ellipsis});
      for (int k = 0; k < n - used; ++k) entries.push_back({ref_item::slc});
      continue;
    }
    entries.push_back({it.k, it.value, it.s});
  }
  int counted = 0;
  for (const auto& e : entries) counted += e.k == ref_item::integer || e.k == ref_item::slc || (e.k == ref_item::array && !advs[static_cast<std::size_t>(e.advanced)].no_dim);
  for (int k = counted; k < n; ++k) entries.push_back({ref_item::slc});
  const bool has_adv = !advs.empty();
  if (has_adv) {  // integers join the advanced indices as 0-d arrays
    for (auto& e : entries) {
      if (e.k == ref_item::integer) {
        advs.push_back({{}, {e.value}});
        e.k = ref_item::array;
        e.advanced = static_cast<int>(advs.size()) - 1;
      }
    }
  }
  // Broadcast shape, and whether the advanced entries are adjacent.
  std::size_t br = 0;
  for (const auto& a : advs) br = std::max(br, a.shape.size());
  shape_t b(br, 1);
  for (const auto& a : advs) {
    for (std::size_t j = 0; j < a.shape.size(); ++j) {
      i64& t = b[br - a.shape.size() + j];
      if (a.shape[j] != 1) t = a.shape[j];
    }
  }
  int first = -1, last = -1, basic_before = 0;
  for (int i = 0; i < static_cast<int>(entries.size()); ++i) {
    if (entries[static_cast<std::size_t>(i)].k == ref_item::array) {
      if (first < 0) first = i;
      last = i;
    }
  }
  bool adjacent = true;
  for (int i = first + 1; i < last; ++i) adjacent = adjacent && entries[static_cast<std::size_t>(i)].k == ref_item::array;
  for (int i = 0; i < first; ++i) {
    const auto k = entries[static_cast<std::size_t>(i)].k;
    basic_before += k == ref_item::slc || k == ref_item::newaxis;
  }
  // Result dimensions: each a basic entry (index into entries) or a batch dimension (-1 - j).
  std::vector<int> rdims;
  std::vector<int> basic;
  for (int i = 0; i < static_cast<int>(entries.size()); ++i) {
    const auto k = entries[static_cast<std::size_t>(i)].k;
    if (k == ref_item::slc || k == ref_item::newaxis) basic.push_back(i);
  }
  const int pos = has_adv ? (adjacent ? basic_before : 0) : 0;
  for (int i = 0; i < static_cast<int>(basic.size()); ++i) {
    if (has_adv && i == pos) {
      for (int j = 0; j < static_cast<int>(br); ++j) rdims.push_back(-1 - j);
    }
    rdims.push_back(basic[static_cast<std::size_t>(i)]);
  }
  if (has_adv && pos == static_cast<int>(basic.size())) {
    for (int j = 0; j < static_cast<int>(br); ++j) rdims.push_back(-1 - j);
  }
  // Per x dimension: which entry drives it.
  std::vector<int> driver;
  for (int i = 0; i < static_cast<int>(entries.size()); ++i) {
    const auto& e = entries[static_cast<std::size_t>(i)];
    if (e.k == ref_item::integer || e.k == ref_item::slc || (e.k == ref_item::array && !advs[static_cast<std::size_t>(e.advanced)].no_dim)) {
      driver.push_back(i);
    }
  }
  ref_result r;
  for (int d : rdims) {
    if (d < 0) {
      r.shape.push_back(b[static_cast<std::size_t>(-1 - d)]);
    } else {
      const auto& e = entries[static_cast<std::size_t>(d)];
      if (e.k == ref_item::newaxis) {
        r.shape.push_back(1);
      } else {
        int xd = static_cast<int>(std::find(driver.begin(), driver.end(), d) - driver.begin());
        r.shape.push_back(py_slice(e.s, xs[static_cast<std::size_t>(xd)]).second);
      }
    }
  }
  const i64 total = numel(r.shape);
  ivec at(r.shape.size(), 0);
  for (i64 k = 0; k < total; ++k) {
    i64 rest = k;
    for (std::size_t j = r.shape.size(); j-- > 0;) {
      at[j] = rest % r.shape[j];
      rest /= r.shape[j];
    }
    ivec bidx(br);
    std::vector<i64> entry_index(entries.size(), 0);
    for (std::size_t j = 0; j < rdims.size(); ++j) {
      if (rdims[j] < 0) {
        bidx[static_cast<std::size_t>(-1 - rdims[j])] = at[j];
      } else {
        entry_index[static_cast<std::size_t>(rdims[j])] = at[j];
      }
    }
    i64 p = 0;
    for (int xd = 0; xd < n; ++xd) {
      const int ei = driver[static_cast<std::size_t>(xd)];
      const auto& e = entries[static_cast<std::size_t>(ei)];
      const i64 size = xs[static_cast<std::size_t>(xd)];
      i64 idx = 0;
      if (e.k == ref_item::integer) {
        idx = e.value < 0 ? e.value + size : e.value;
      } else if (e.k == ref_item::slc) {
        const i64 step = e.s.step.value_or(1);
        idx = py_slice(e.s, size).first + entry_index[static_cast<std::size_t>(ei)] * step;
      } else {
        const auto& a = advs[static_cast<std::size_t>(e.advanced)];
        i64 flat = 0;
        for (std::size_t j = 0; j < a.shape.size(); ++j) {
          const i64 bj = a.shape[j] == 1 ? 0 : bidx[br - a.shape.size() + j];
          flat = flat * a.shape[j] + bj;
        }
        idx = a.values[static_cast<std::size_t>(flat)];
        if (idx < 0) idx += size;
      }
      p = p * size + idx;
    }
    r.positions.push_back(p);
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Expressions held twice: as depot::index_items (arrays on device D) and as ref_items.

template <depot::device D>
struct dual_expr {
  depot::index_expr expr;
  std::vector<ref_item> ref;
  void integer(i64 v)
  {
    expr.push_back(v);
    ref.push_back({ref_item::integer, v});
  }
  void slc(slice s)
  {
    expr.push_back(s);
    ref.push_back({ref_item::slc, 0, s});
  }
  void newaxis()
  {
    expr.push_back(depot::newaxis);
    ref.push_back({ref_item::newaxis});
  }
  void ellipsis()
  {
    expr.push_back(depot::ellipsis);
    ref.push_back({ref_item::ellipsis});
  }
  // where: 0 host vector (1-D only), 1 int64 view on D, 2 int32 view on D, 3 strided int64 on D
  void array(const shape_t& shape, const ivec& values, int where)
  {
    if (where == 0 && shape.size() == 1) {
      expr.push_back(values);
    } else if (where == 2) {
      std::vector<std::int32_t> v32(values.begin(), values.end());
      expr.push_back(make<std::int32_t, D>(shape, v32));
    } else if (where == 3) {
      // Every other element of a larger array: a non-contiguous index array.
      shape_t big = shape;
      big.back() *= 2;
      std::vector<i64> spread(static_cast<std::size_t>(numel(big)), 1000000);
      for (std::size_t i = 0; i < values.size(); ++i) spread[2 * i] = values[i];
      auto v = make<i64, D>(big, spread);
      expr.push_back(v.slice(static_cast<int>(shape.size()) - 1, 0, layout::slice_end, 2));
    } else {
      expr.push_back(make<i64, D>(shape, values));
    }
    ref.push_back({ref_item::array, 0, {}, shape, values});
  }
  void mask(const shape_t& shape, const ivec& bits, bool on_host)
  {
    std::vector<int> b(bits.begin(), bits.end());
    if (on_host) {
      expr.push_back(make_mask<depot::host>(shape, b));
    } else {
      expr.push_back(make_mask<D>(shape, b));
    }
    ref.push_back({ref_item::mask, 0, {}, shape, bits});
  }
  void mask0(bool on)
  {
    expr.push_back(on);
    ref.push_back({ref_item::mask, 0, {}, {}, {on ? 1 : 0}});
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Plans against NumPy (a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)).

TEST_CASE("index: basic indexing plans a view (shape, strides, offsets as NumPy)")
{
  const layout x = layout::contiguous({2, 3, 4});
  {  // a[1]
    const auto p = plan(x, {1});
    CHECK(p.kind == index_plan_kind::view);
    CHECK(p.route == index_route::strided);
    CHECK(shape_of(p) == shape_t{3, 4});
    CHECK(strides_of(p) == shape_t{4, 1});
    CHECK(p.offset == 12);
    CHECK(p.byte_offset == 48);
    CHECK(p.temp_bytes == 0);
    CHECK_FALSE(p.host_read);
  }
  {  // a[1:, ::-1, 1:-1:2] -> shape (1, 3, 1), element strides (12, -4, 2), first element 21
    const auto p = plan(x, {slice(1, none), slice(none, none, -1), slice(1, -1, 2)});
    CHECK(p.kind == index_plan_kind::view);
    CHECK(shape_of(p) == shape_t{1, 3, 1});
    CHECK(strides_of(p) == shape_t{12, -4, 2});
    CHECK(p.offset == 21);
    CHECK(p.byte_offset == 84);
  }
  {  // a[..., 0]
    const auto p = plan(x, {depot::ellipsis, 0});
    CHECK(shape_of(p) == shape_t{2, 3});
    CHECK(strides_of(p) == shape_t{12, 4});
    CHECK(p.offset == 0);
  }
  {  // a[None, 0, ..., None]
    const auto p = plan(x, {depot::newaxis, 0, depot::ellipsis, depot::newaxis});
    CHECK(shape_of(p) == shape_t{1, 3, 4, 1});
    CHECK(strides_of(p) == shape_t{0, 4, 1, 0});
  }
  {  // a[-1, -2, -3] -> a 0-d view of element 17
    const auto p = plan(x, {-1, -2, -3});
    CHECK(p.rank == 0);
    CHECK(p.offset == 17);
  }
  {  // a[5:10]: clamped, empty
    const auto p = plan(x, {slice(5, 10)});
    CHECK(shape_of(p) == shape_t{0, 3, 4});
  }
  {  // a[::-2, 2:0:-1, -100:100]
    const auto p = plan(x, {slice(none, none, -2), slice(2, 0, -1), slice(-100, 100)});
    CHECK(shape_of(p) == shape_t{1, 2, 4});
    CHECK(strides_of(p) == shape_t{-24, -4, 1});
    CHECK(p.offset == 12 + 8);
  }
  {  // a[()] and a[...]: the whole array
    CHECK(shape_of(plan(x, depot::index_expr{})) == shape_t{2, 3, 4});
    CHECK(shape_of(plan(x, {depot::ellipsis})) == shape_t{2, 3, 4});
  }
  {  // on a non-contiguous layout: a.transpose(2, 0, 1)[1:3, :, 2]
    const layout t = x.permute({2, 0, 1});
    const auto p = plan(t, {slice(1, 3), slice(), 2});
    CHECK(shape_of(p) == shape_t{2, 2});
    CHECK(strides_of(p) == shape_t{1, 12});
    CHECK(p.offset == 1 + 8);
  }
  {  // writes: COPY of a tensor, FILL of a scalar, on the same region
    const auto c = plan(x, {1, slice(0, 2)}, depot::index_op::assign);
    CHECK(c.kind == index_plan_kind::copy);
    CHECK(shape_of(c) == shape_t{2, 4});
    CHECK(c.offset == 12);
    const auto f = plan(x, {1, slice(0, 2)}, depot::index_op::fill);
    CHECK(f.kind == index_plan_kind::fill);
    CHECK(f.route == index_route::strided);
  }
}

TEST_CASE("index: advanced indexing plans follow NumPy's placement rules")
{
  const layout x = layout::contiguous({2, 3, 4});
  {  // a[:, [0, 2]] -> (2, 2, 4): one index array, the index_select fast path
    const auto p = plan(x, {slice(), ivec{0, 2}});
    CHECK(p.kind == index_plan_kind::gather);
    CHECK(p.route == index_route::index_select);
    CHECK(shape_of(p) == shape_t{2, 2, 4});
    CHECK(strides_of(p) == shape_t{8, 4, 1});
    CHECK(p.dim == 1);
    CHECK(p.x_dim == 1);
    CHECK(p.batch_pos == 1);
    CHECK_FALSE(p.host_read);  // the kernel validates the indices on the device
  }
  {  // a[0, :, [1, 2]] -> (2, 3): the integer and the array are separated by a slice
    const auto p = plan(x, {0, slice(), ivec{1, 2}});
    CHECK(p.route == index_route::index_select);
    CHECK(shape_of(p) == shape_t{2, 3});
    CHECK(p.batch_pos == 0);
    CHECK(p.dim == 1);
    CHECK(p.x_dim == 2);
    CHECK(p.offset == 0);
  }
  {  // a[:, 0, [1, 2]] -> (2, 2): adjacent, in place
    const auto p = plan(x, {slice(), 0, ivec{1, 2}});
    CHECK(shape_of(p) == shape_t{2, 2});
    CHECK(p.batch_pos == 1);
  }
  {  // a[1, [[0], [2]]] -> (2, 1, 4): a 2-D index array
    const auto p = plan(x, {1, depot::strided_view<i64>{make<i64>({2, 1}, {0, 2})}});
    CHECK(p.route == index_route::index_select);
    CHECK(shape_of(p) == shape_t{2, 1, 4});
    CHECK(p.offset == 12);
  }
  {  // a[[0, 1], [1, 2]] -> (2, 4): several arrays, element offsets
    const auto p = plan(x, {ivec{0, 1}, ivec{1, 2}});
    CHECK(p.kind == index_plan_kind::gather);
    CHECK(p.route == index_route::offsets);
    CHECK(shape_of(p) == shape_t{2, 4});
    CHECK(p.offsets == ivec{4, 5, 6, 7, 20, 21, 22, 23});
    CHECK(p.temp_bytes == 8 * 8);
    CHECK(p.host_read);
    CHECK(p.lo == 0);
    CHECK(p.hi == 23);
  }
  {  // a[[[0], [1]], [1, 2]] -> (2, 2, 4): (2, 1) and (2,) broadcast to (2, 2)
    const auto p = plan(x, {depot::strided_view<i64>{make<i64>({2, 1}, {0, 1})}, ivec{1, 2}});
    CHECK(shape_of(p) == shape_t{2, 2, 4});
    CHECK(p.offsets[0] == 4);    // a[0, 1, 0]
    CHECK(p.offsets[4] == 8);    // a[0, 2, 0]
    CHECK(p.offsets[8] == 16);   // a[1, 1, 0]
    CHECK(p.offsets[15] == 23);  // a[1, 2, 3]
  }
  {  // a[[0, 1], :, [1, 2]] -> (2, 3) = [[1, 5, 9], [14, 18, 22]]
    const auto p = plan(x, {ivec{0, 1}, slice(), ivec{1, 2}});
    CHECK(shape_of(p) == shape_t{2, 3});
    CHECK(p.offsets == ivec{1, 5, 9, 14, 18, 22});
  }
  {  // a[[0, 1], None, [1, 2]] -> (2, 1, 4): newaxis separates them too
    const auto p = plan(x, {ivec{0, 1}, depot::newaxis, ivec{1, 2}});
    CHECK(shape_of(p) == shape_t{2, 1, 4});
    CHECK(p.batch_pos == 0);
  }
  {  // a[:, [0], ..., [0]]: an ellipsis standing for no dimension still separates -> (1, 2)
    const auto p = plan(x, {slice(), ivec{0}, depot::ellipsis, ivec{0}});
    CHECK(shape_of(p) == shape_t{1, 2});
    CHECK(p.offsets == ivec{0, 12});
  }
  {  // a[:, [0], [0]] (adjacent) -> (2, 1)
    const auto p = plan(x, {slice(), ivec{0}, ivec{0}});
    CHECK(shape_of(p) == shape_t{2, 1});
  }
  {  // a[[], :] and a[:, []] -> empty selections
    CHECK(shape_of(plan(x, {ivec{}})) == shape_t{0, 3, 4});
    CHECK(shape_of(plan(x, {slice(), ivec{}, ivec{}})) == shape_t{2, 0});
  }
  {  // negative indices wrap: a[[-1, -2], -1] -> [[20..23]... ] offsets of a[1, 2], a[0, 2]
    const auto p = plan(x, {ivec{-1, -2}, -1});
    CHECK(shape_of(p) == shape_t{2, 4});
    CHECK(p.route == index_route::index_select);
    CHECK(p.offset == 8);
  }
  {  // writes: SCATTER of a tensor, FILL of a scalar into advanced positions
    const auto s = plan(x, {ivec{0, 1}, ivec{1, 2}}, depot::index_op::assign);
    CHECK(s.kind == index_plan_kind::scatter);
    const auto f = plan(x, {slice(), ivec{0, 2}}, depot::index_op::fill);
    CHECK(f.kind == index_plan_kind::fill);
    CHECK(f.route == index_route::index_select);
    CHECK(f.temp_bytes == 4);  // the one-element source
  }
}

TEST_CASE("index: boolean masks plan compaction or element offsets")
{
  const layout x = layout::contiguous({2, 3, 4});
  std::vector<int> bits(24);
  for (int i = 0; i < 24; ++i) bits[static_cast<std::size_t>(i)] = i % 5 == 0;
  {  // a[a % 5 == 0]: a mask of the full shape -> (count,), count known on the device
    const auto p = plan(x, {make_mask({2, 3, 4}, bits)});
    CHECK(p.kind == index_plan_kind::gather);
    CHECK(p.route == index_route::mask);
    CHECK(p.mask_compaction);
    CHECK(shape_of(p) == shape_t{-1});
    CHECK(p.numel() == -1);
    CHECK_FALSE(p.host_read);
  }
  {  // a[:, [True, False, True]] -> (2, count, 4)
    const auto p = plan(x, {slice(), make_mask({3}, {1, 0, 1})});
    CHECK(p.route == index_route::mask);
    CHECK(shape_of(p) == shape_t{2, -1, 4});
    CHECK(strides_of(p) == shape_t{-1, 4, 1});
    CHECK(p.dim == 1);
  }
  {  // a[1, [True, False, True]] -> (count, 4): integer and mask adjacent
    const auto p = plan(x, {1, make_mask({3}, {1, 0, 1})});
    CHECK(p.route == index_route::mask);
    CHECK(shape_of(p) == shape_t{-1, 4});
    CHECK(p.offset == 12);
  }
  {  // a[m] = scalar: a masked fill
    const auto p = plan(x, {make_mask({2, 3, 4}, bits)}, depot::index_op::fill);
    CHECK(p.kind == index_plan_kind::fill);
    CHECK(p.route == index_route::mask);
    CHECK_FALSE(p.mask_compaction);
  }
  {  // a[m] = tensor: the mask becomes element offsets on the host
    const auto p = plan(x, {make_mask({2, 3, 4}, bits)}, depot::index_op::assign);
    CHECK(p.kind == index_plan_kind::scatter);
    CHECK(p.route == index_route::offsets);
    CHECK(p.offsets == ivec{0, 5, 10, 15, 20});
  }
  {  // a[[True, False], :, [0, 3]] -> (2, 3) = [[0, 4, 8], [3, 7, 11]]: mask and array
    const auto p = plan(x, {make_mask({2}, {1, 0}), slice(), ivec{0, 3}});
    CHECK(p.route == index_route::offsets);
    CHECK(shape_of(p) == shape_t{2, 3});
    CHECK(p.offsets == ivec{0, 4, 8, 3, 7, 11});
  }
  {  // a[0, :, [True, False, True, False]] -> (2, 3): separated, so offsets (count first)
    const auto p = plan(x, {0, slice(), make_mask({4}, {1, 0, 1, 0})});
    CHECK(p.route == index_route::offsets);
    CHECK(shape_of(p) == shape_t{2, 3});
    CHECK(p.offsets == ivec{0, 4, 8, 2, 6, 10});
  }
  {  // a[True] -> (1, 2, 3, 4); a[False] -> (0, 2, 3, 4); a[0, True] -> (1, 3, 4)
    CHECK(shape_of(plan(x, {true})) == shape_t{1, 2, 3, 4});
    CHECK(shape_of(plan(x, {false})) == shape_t{0, 2, 3, 4});
    CHECK(shape_of(plan(x, {0, true})) == shape_t{1, 3, 4});
  }
  {  // a[m23, 1:3] with a (2, 3) mask -> (count, 2), offsets when assigning
    const auto p = plan(x, {make_mask({2, 3}, {0, 1, 0, 0, 0, 1}), slice(1, 3)}, depot::index_op::assign);
    CHECK(shape_of(p) == shape_t{2, 2});
    CHECK(p.offsets == ivec{5, 6, 21, 22});
  }
}

TEST_CASE("index: bad expressions are refused with the values named")
{
  const layout x = layout::contiguous({2, 3, 4});
  // Out of range: depot::index_error naming the index, dimension and size.
  try {
    (void)plan(x, {0, 3});
    FAIL("no error");
  } catch (const depot::index_error& e) {
    CHECK(e.index() == 3);
    CHECK(e.dimension() == 1);
    CHECK(e.size() == 3);
    CHECK(contains(e.what(), "index 3 is out of bounds for dimension 1 with size 3"));
  }
  CHECK_THROWS_AS((void)plan(x, {-3}), depot::index_error);
  try {  // an array value on the offsets route: its position in the index array
    (void)plan(x, {ivec{0, 1}, ivec{1, -4}});
    FAIL("no error");
  } catch (const depot::index_error& e) {
    CHECK(e.index() == -4);
    CHECK(e.dimension() == 1);
    CHECK(e.position() == 1);
    CHECK(contains(e.what(), "index -4 is out of bounds for dimension 1 with size 3 (valid: -3..2) at position 1"));
  }
  auto refused = [&](const depot::index_expr& e, const std::string& part) {
    try {
      (void)plan(x, e);
      FAIL("no error for " << e.to_string());
    } catch (const depot::invalid_argument& err) {
      INFO(err.what());
      CHECK(contains(err.what(), part));
    }
  };
  refused({0, 0, 0, 0}, "too many indices: the array has rank 3 but 4 dimensions are indexed");
  refused({make_mask({2, 3, 4, 1}, std::vector<int>(24, 1))}, "too many indices");
  refused({depot::ellipsis, 0, depot::ellipsis}, "single ellipsis");
  refused({make_mask({3}, {1, 0, 1})}, "boolean index did not match indexed array along dimension 0; dimension is 2 "
                                      "but corresponding boolean dimension is 3");
  refused({slice(), make_mask({3, 5}, std::vector<int>(15, 0))}, "along dimension 2; dimension is 4");
  refused({ivec{0, 1}, ivec{0, 1, 2}}, "shape mismatch: indexing arrays could not be broadcast together with shapes [2] [3]");
  refused({slice(0, 2, 0)}, "slice step cannot be zero");
  refused({depot::newaxis, depot::newaxis, depot::newaxis, depot::newaxis, depot::newaxis, depot::newaxis},
          "exceeds the maximum of 8");
  // Float index arrays (the type-erased entry point; strided_view<float> is a compile error).
  auto f = std::make_shared<std::vector<float>>(std::vector<float>{0.f, 1.f});
  const auto fr = depot::array_ref::vector(f->data(), depot::dtype::float32, 2);
  try {
    (void)depot::index_item::from_array(fr, depot::device_kind::host, f);
    FAIL("no error");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "index arrays must be int32 or int64 (or bool for a mask), got float32"));
  }
  auto u8 = std::make_shared<std::vector<std::uint8_t>>(2, 0);
  CHECK_THROWS_AS((void)depot::index_item::from_array(depot::array_ref::vector(u8->data(), depot::dtype::uint8, 2),
                                                      depot::device_kind::host, u8),
                  depot::invalid_argument);
  // The type-erased entry point accepts int32 arrays and bool masks.
  auto i32 = std::make_shared<std::vector<std::int32_t>>(std::vector<std::int32_t>{1, 0});
  const auto it = depot::index_item::from_array(depot::array_ref::vector(i32->data(), depot::dtype::int32, 2),
                                                depot::device_kind::host, i32);
  CHECK(it.host_indices() == ivec{1, 0});
  CHECK(shape_of(plan(x, {it, it})) == shape_t{2, 4});
}

// ---------------------------------------------------------------------------------------
// Execution on every device.

TEST_CASE_TEMPLATE("index: every plan kind runs on the device", D, DEPOT_TEST_DEVICES)
{
  auto fresh = [] { return iota<float>({2, 3, 4}).template to<D>(); };
  const std::vector<float> a = iota<float>({2, 3, 4}).to_host_vector();
  auto idx64 = make<i64, D>({2}, {1, 2});
  auto idx32 = make<std::int32_t, D>({2}, {2, 0});
  SUBCASE("view")
  {
    auto x = fresh();
    auto v = x.index({0, slice(), 1});
    CHECK(v.to_host_vector() == vals({1, 5, 9}));
    CHECK(v.get_storage().ref_count() >= 2);  // shares x's storage
  }
  SUBCASE("gather: index_select with device, int32, host and 2-D index arrays")
  {
    auto x = fresh();
    depot::strided_view<float, D> g = x[{0, slice(), idx64}];
    CHECK(shape_of_view(g) == shape_t{2, 3});
    CHECK(g.to_host_vector() == vals({1, 5, 9, 2, 6, 10}));
    CHECK(x.index({slice(), idx32}).to_host_vector() ==
          vals({8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15}));
    CHECK(x.index({1, 1, ivec{-1, 0, 3}}).to_host_vector() == vals({19, 16, 19}));
    auto two_d = make<i64, D>({2, 2}, {0, 1, 1, 0});
    const auto t = x.index({two_d});
    CHECK(shape_of_view(t) == shape_t{2, 2, 3, 4});
    CHECK(t.index({1, 0, 2, 3}).to_host_vector() == vals({23}));
    CHECK(x.index({ivec{}}).numel() == 0);
  }
  SUBCASE("gather: mask compaction, masks on the device and on the host")
  {
    auto x = fresh();
    std::vector<int> bits(24);
    for (int i = 0; i < 24; ++i) bits[static_cast<std::size_t>(i)] = i % 5 == 0;
    auto m = make_mask<D>({2, 3, 4}, bits);
    depot::strided_view<float, D> r = x[m];
    CHECK(r.to_host_vector() == vals({0, 5, 10, 15, 20}));
    auto m3 = make_mask<depot::host>({3}, {1, 0, 1});
    const auto r2 = x.index({slice(), m3});
    CHECK(shape_of_view(r2) == shape_t{2, 2, 4});
    CHECK(r2.to_host_vector() == vals({0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23}));
    CHECK(x.index({make_mask<D>({2, 3, 4}, std::vector<int>(24, 0))}).numel() == 0);
  }
  SUBCASE("gather: element offsets")
  {
    auto x = fresh();
    CHECK(x.index({ivec{0, 1}, slice(), idx64}).to_host_vector() == vals({1, 5, 9, 14, 18, 22}));
    CHECK(x.index({make_mask<D>({2}, {1, 0}), slice(), ivec{0, 3}}).to_host_vector() == vals({0, 4, 8, 3, 7, 11}));
    CHECK(shape_of_view(x.index({true})) == shape_t{1, 2, 3, 4});
  }
  SUBCASE("copy and fill on a strided region")
  {
    auto x = fresh();
    x[{1, slice(none, none, -1), 0}] = make<float, depot::host>({3}, vals({-1, -2, -3}));
    x[{0, 1}] = 7.0f;
    std::vector<float> want = a;
    want[12 + 8] = -1;
    want[12 + 4] = -2;
    want[12 + 0] = -3;
    for (int i = 4; i < 8; ++i) want[static_cast<std::size_t>(i)] = 7;
    CHECK(x.to_host_vector() == want);
    // Broadcasting: a (4,) row into (3, 4); a (1, 1, 4) value (leading 1s dropped).
    x.index_put({0}, make<float, D>({4}, vals({9, 8, 7, 6})));
    x.index_put({1, 0}, make<float, D>({1, 1, 4}, vals({5, 5, 5, 5})));
    CHECK(x.index({0, 2}).to_host_vector() == vals({9, 8, 7, 6}));
    CHECK(x.index({1, 0}).to_host_vector() == vals({5, 5, 5, 5}));
    // An overlapping value is copied first: x[1] = x[0] shifted.
    auto y = fresh();
    y.index_put({slice(1, none)}, y.index({slice(none, -1)}));
    CHECK(y.index({1}).to_host_vector() == y.index({0}).to_host_vector());
  }
  SUBCASE("fill: mask, index_select and offsets")
  {
    auto x = fresh();
    std::vector<int> bits(24);
    for (int i = 0; i < 24; ++i) bits[static_cast<std::size_t>(i)] = i % 5 == 0;
    x[make_mask<D>({2, 3, 4}, bits)] = -1.0f;
    x[{slice(), slice(), idx32}] = -2.0f;
    x[{ivec{0, 1}, ivec{1, 1}, ivec{3, 3}}] = -3.0f;
    std::vector<float> want = a;
    for (int i = 0; i < 24; ++i) {
      if (i % 5 == 0) want[static_cast<std::size_t>(i)] = -1;
      if (i % 4 == 2 || i % 4 == 0) want[static_cast<std::size_t>(i)] = -2;
    }
    want[7] = -3;
    want[19] = -3;
    CHECK(x.to_host_vector() == want);
  }
  SUBCASE("scatter: index_select and offsets, values from another device")
  {
    auto x = fresh();
    x[{slice(), idx64}] = make<float, depot::host>({2, 2, 4}, std::vector<float>(16, -1.0f));
    CHECK(x.index({slice(), slice(1, none)}).to_host_vector() == std::vector<float>(16, -1.0f));
    x.index_put({0, slice(), idx32}, make<float, D>({2, 1}, vals({100, 200})));  // (2, 1) into (2, 3)
    CHECK(x.index({0, 0}).to_host_vector() == vals({200, 1, 100, 3}));
    CHECK(x.index({0, 1}).to_host_vector() == vals({200, -1, 100, -1}));
    x.index_put({ivec{1, 0}, ivec{0, 0}, ivec{-1, 1}}, make<float, D>({2}, vals({50, 60})));
    CHECK(x.index({1, 0, 3}).to_host_vector() == vals({50}));
    CHECK(x.index({0, 0, 1}).to_host_vector() == vals({60}));
    x[make_mask<D>({2, 3, 4}, std::vector<int>(24, 1))] = iota<float>({24}).template to<D>();
    CHECK(x.to_host_vector() == a);
  }
  SUBCASE("x[e] = z[f] through two proxies")
  {
    auto x = fresh();
    auto z = fresh();
    x[{0}] = z[{1}];
    CHECK(x.index({0}).to_host_vector() == z.index({1}).to_host_vector());
  }
}

TEST_CASE_TEMPLATE("index: bad input writes nothing, on every device", D, DEPOT_TEST_DEVICES)
{
  auto x = iota<float>({2, 3, 4}).template to<D>();
  const auto before = x.to_host_vector();
  auto bad_dev = make<i64, D>({3}, {0, 5, 1});
  // index_select route: the kernel finds the bad value; the error names x's dimension.
  try {
    x.index_put({0, slice(), bad_dev}, 1.0f);
    FAIL("no error");
  } catch (const depot::index_error& e) {
    CHECK(e.index() == 5);
    CHECK(e.dimension() == 2);
    CHECK(e.size() == 4);
    CHECK(e.position() == 1);
    CHECK(contains(e.what(), "index 5 is out of bounds for dimension 2 with size 4"));
  }
  CHECK_THROWS_AS((x[{slice(), slice(), bad_dev}] = make<float, D>({2, 3, 3}, std::vector<float>(18, 1.f))),
                  depot::index_error);
  CHECK_THROWS_AS((void)x.index({bad_dev}), depot::index_error);
  // offsets route
  CHECK_THROWS_AS(x.index_put({ivec{0, 2}, 0}, 1.0f), depot::index_error);
  CHECK_THROWS_AS(x.index_put({ivec{0, 1}, ivec{0, 3}}, make<float, D>({4}, vals({1, 2, 3, 4}))), depot::index_error);
  // basic route
  CHECK_THROWS_AS(x.index_put({2}, 1.0f), depot::index_error);
  // value shapes that do not broadcast
  try {
    x.index_put({0}, make<float, D>({2, 4}, std::vector<float>(8, 1.f)));
    FAIL("no error");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "could not broadcast the value of shape [2, 4] into shape [3, 4]"));
  }
  CHECK_THROWS_AS(x.index_put({ivec{0, 1}, ivec{0, 1}}, make<float, D>({3, 4}, std::vector<float>(12, 1.f))),
                  depot::invalid_argument);
  CHECK_THROWS_AS(x.index_put({make_mask<D>({3}, {1, 1, 1})}, 1.0f), depot::invalid_argument);
  CHECK(x.to_host_vector() == before);
}

// ---------------------------------------------------------------------------------------
// Random expressions against the reference.

TEST_CASE_TEMPLATE("index: random expressions match the host reference", D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("index: random expressions", 20240611)};
  auto uni = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>{lo, hi}(rng); };
  int checked_reads = 0, checked_assigns = 0, checked_fills = 0;
  int routes[4] = {0, 0, 0, 0};
  for (int iter = 0; iter < 400; ++iter) {
    // x: a random shape, seen through a permutation and a slice of a larger base.
    const int rank = static_cast<int>(uni(1, 4));
    shape_t xs(static_cast<std::size_t>(rank));
    for (auto& s : xs) s = uni(0, 10) == 0 ? 0 : uni(1, 4);
    shape_t big = xs;
    for (auto& s : big) s += 1;
    auto base = iota<float>({1}).reshape({1});  // placeholder, replaced below
    {
      auto h = depot::strided_view<float>::empty(big);
      for (i64 i = 0; i < h.numel(); ++i) h.data()[i] = static_cast<float>(i);
      base = h;
    }
    auto xd = base.template to<D>();
    for (int d = 0; d < rank; ++d) xd = xd.slice(d, 1, layout::slice_end);  // offset, non-contiguous
    std::vector<int> perm(static_cast<std::size_t>(rank));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    // Permute the base's big shape so that the permuted view has shape xs.
    {
      depot::layout l = xd.get_layout();
      shape_t ps, st;
      std::vector<int> inv(static_cast<std::size_t>(rank));
      for (int d = 0; d < rank; ++d) inv[static_cast<std::size_t>(perm[static_cast<std::size_t>(d)])] = d;
      (void)inv;
      for (int d = 0; d < rank; ++d) {
        ps.push_back(l.size(perm[static_cast<std::size_t>(d)]));
        st.push_back(l.stride(perm[static_cast<std::size_t>(d)]));
      }
      xd = depot::strided_view<float, D>{xd.get_storage(), layout{ps, st, l.offset()}};
      xs = ps;
    }
    const std::vector<float> logical = xd.to_host_vector();

    // A random expression.
    dual_expr<D> e;
    const bool use_ellipsis = uni(0, 3) == 0;
    int dims_left = rank;
    bool ellipsis_done = false;
    const int n_items = static_cast<int>(uni(0, rank + 1));
    shape_t bshape;  // a common broadcast shape for the arrays
    const int brank = static_cast<int>(uni(1, 2));
    for (int j = 0; j < brank; ++j) bshape.push_back(uni(0, 6) == 0 ? 0 : uni(1, 3));
    int cur = 0;  // x dimension the next consuming item indexes (ignoring an ellipsis' width)
    for (int k = 0; k < n_items; ++k) {
      const i64 choice = uni(0, 9);
      if (use_ellipsis && !ellipsis_done && choice == 0) {
        e.ellipsis();
        ellipsis_done = true;
        // the ellipsis takes what the later items leave; we stop consuming here to keep it simple
        dims_left = static_cast<int>(uni(0, dims_left));  // the items after it index the last dims_left dims
        cur = rank - dims_left;
        continue;
      }
      if (choice == 1) {
        e.newaxis();
        continue;
      }
      if (choice == 2 && uni(0, 4) == 0) {
        e.mask0(uni(0, 1) == 1);
        continue;
      }
      if (dims_left == 0) break;
      const i64 size = xs[static_cast<std::size_t>(cur)];
      if (choice <= 4) {  // slice
        auto bound = [&]() -> std::optional<i64> {
          if (uni(0, 3) == 0) return std::nullopt;
          return uni(-size - 2, size + 2);
        };
        std::optional<i64> step;
        if (uni(0, 1)) step = uni(1, 3) * (uni(0, 2) == 0 ? -1 : 1);
        e.slc(slice(bound(), bound(), step));
        ++cur;
        --dims_left;
      } else if (choice <= 5 && size > 0) {  // integer
        e.integer(uni(-size, size - 1));
        ++cur;
        --dims_left;
      } else if (choice <= 7 && size > 0) {  // index array of a shape broadcastable to bshape
        shape_t s = bshape;
        for (auto& v : s) {
          if (uni(0, 2) == 0) v = 1;
        }
        if (uni(0, 2) == 0 && s.size() > 1) s.erase(s.begin());
        ivec values(static_cast<std::size_t>(numel(s)));
        for (auto& v : values) v = uni(-size, size - 1);
        e.array(s, values, static_cast<int>(uni(0, 3)));
        ++cur;
        --dims_left;
      } else if (choice <= 9) {  // a mask over 1 or 2 dimensions
        const int mr = static_cast<int>(std::min<i64>(uni(1, 2), dims_left));
        shape_t s(xs.begin() + cur, xs.begin() + cur + mr);
        ivec bits(static_cast<std::size_t>(numel(s)));
        for (auto& b : bits) b = uni(0, 2) == 0 ? 0 : 1;
        e.mask(s, bits, uni(0, 1) == 1);
        cur += mr;
        dims_left -= mr;
      }
    }
    // After an ellipsis, the items must index exactly the dimensions planned for them.
    for (; ellipsis_done && dims_left > 0; --dims_left) e.slc(slice());

    // Broadcast failures are legitimate: both sides must agree.
    std::optional<ref_result> want;
    bool ref_ok = true;
    {
      // shapes: arrays broadcast-compatible by construction except mask counts and 0-d masks
      try {
        // Quick broadcast check mirroring NumPy, through the reference's own computation
        std::vector<shape_t> shapes;
        for (const auto& it : e.ref) {
          if (it.k == ref_item::array) shapes.push_back(it.shape);
          if (it.k == ref_item::mask) {
            i64 c = 0;
            for (i64 b : it.values) c += b != 0;
            if (it.shape.empty()) {
              shapes.push_back({c});
            } else {
              for (std::size_t j = 0; j < it.shape.size(); ++j) shapes.push_back({c});
            }
          }
        }
        std::size_t br = 0;
        for (const auto& s : shapes) br = std::max(br, s.size());
        shape_t b(br, 1);
        for (const auto& s : shapes) {
          for (std::size_t j = 0; j < s.size(); ++j) {
            i64& t = b[br - s.size() + j];
            if (s[j] == t || s[j] == 1) continue;
            if (t != 1) throw std::runtime_error("broadcast");
            t = s[j];
          }
        }
        want = reference(xs, e.ref);
        if (want->shape.size() > static_cast<std::size_t>(depot::max_rank)) ref_ok = false;
      } catch (const std::runtime_error&) {
        ref_ok = false;
      }
    }
    INFO("iteration " << iter << ": x shape " << layout::contiguous(xs).to_string() << " expr " << e.expr.to_string());
    if (!ref_ok) {
      CHECK_THROWS_AS((void)xd.index(e.expr), depot::invalid_argument);
      continue;
    }
    const auto p = depot::plan_index(xd.get_layout(), depot::dtype::float32, e.expr);
    ++routes[static_cast<int>(p.route)];

    // Read.
    const auto r = xd.index(e.expr);
    REQUIRE(shape_of_view(r) == want->shape);
    std::vector<float> expect;
    for (i64 pos : want->positions) expect.push_back(logical[static_cast<std::size_t>(pos)]);
    CHECK(r.to_host_vector() == expect);
    ++checked_reads;

    // Fill: every target gets -7; everything else unchanged.
    {
      auto y = xd.clone();
      y.index_put(e.expr, -7.0f);
      std::vector<float> w = logical;
      for (i64 pos : want->positions) w[static_cast<std::size_t>(pos)] = -7.0f;
      CHECK(y.to_host_vector() == w);
      ++checked_fills;
    }
    // Assign distinct values (only where the targets are distinct: repeated targets have no
    // defined winner).
    std::set<i64> distinct(want->positions.begin(), want->positions.end());
    if (distinct.size() == want->positions.size()) {
      auto y = xd.clone();
      std::vector<float> v(want->positions.size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = -1000.0f - static_cast<float>(i);
      y.index_put(e.expr, make<float, D>(want->shape, v));
      std::vector<float> w = logical;
      for (std::size_t i = 0; i < v.size(); ++i) w[static_cast<std::size_t>(want->positions[i])] = v[i];
      CHECK(y.to_host_vector() == w);
      ++checked_assigns;
    }
  }
  MESSAGE("reads " << checked_reads << ", fills " << checked_fills << ", assigns " << checked_assigns << "; routes strided "
                   << routes[0] << ", index_select " << routes[1] << ", mask " << routes[2] << ", offsets " << routes[3]);
  CHECK(checked_reads > 300);
  CHECK(routes[0] > 20);
  CHECK(routes[1] > 20);
  CHECK(routes[2] > 10);
  CHECK(routes[3] > 20);
}
