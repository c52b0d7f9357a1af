// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace {

// A host view of `shape` holding 0, 1, 2, ... in row-major order.
depot::strided_view<int> iota_view(std::initializer_list<std::int64_t> shape)
{
  auto v = depot::strided_view<int>::empty(shape);
  int* p = v.data();
  std::iota(p, p + v.numel(), 0);
  return v;
}

std::vector<int> ints(std::initializer_list<int> v) { return v; }

constexpr std::int64_t layout_end() { return depot::layout::slice_end; }

}  // namespace

TEST_CASE("view: views alias their storage, clones do not")
{
  auto v = iota_view({2, 3});
  auto flat = v.view({-1});
  flat.at({4}) = 70;
  CHECK(v.at({1, 1}) == 70);  // the write is seen through the other view
  auto c = v.clone();
  c.at({0, 0}) = -5;
  CHECK(v.at({0, 0}) == 0);   // the clone has its own storage
  CHECK(v.get_storage().ref_count() == 2);  // v and flat
  CHECK(c.get_storage().ref_count() == 1);
  CHECK(v.to_host_vector() == ints({0, 1, 2, 3, 70, 5}));
  CHECK(v.at({-1, -1}) == 5);
  CHECK_THROWS_AS((void)v.at({2, 0}), depot::index_error);
}

TEST_CASE("view: transposes, slices and reshapes")
{
  auto v = iota_view({2, 3});
  const auto t = v.transpose(0, 1);  // 3 x 2
  CHECK(t.to_host_vector() == ints({0, 3, 1, 4, 2, 5}));
  CHECK_FALSE(t.is_contiguous());
  CHECK_THROWS_AS((void)t.view({6}), depot::invalid_argument);  // needs a copy
  const auto r = t.reshape({6});  // so reshape copies
  CHECK(r.is_contiguous());
  CHECK(r.to_host_vector() == ints({0, 3, 1, 4, 2, 5}));
  CHECK(r.get_storage().host_ptr() != v.get_storage().host_ptr());
  const auto same = v.reshape({3, 2});  // a view: no copy
  CHECK(same.get_storage().host_ptr() == v.get_storage().host_ptr());
  CHECK(v.slice(1, 2, layout_end(), -1).to_host_vector() == ints({2, 1, 0, 5, 4, 3}));
  CHECK(v.select(0, 1).to_host_vector() == ints({3, 4, 5}));
  CHECK(v.permute({1, 0}).to_host_vector() == t.to_host_vector());
  CHECK(v.transpose(0, 1).flatten().to_host_vector() == ints({0, 3, 1, 4, 2, 5}));
  CHECK(v.transpose(0, 1).contiguous().is_contiguous());
  CHECK(v.contiguous().get_storage().host_ptr() == v.get_storage().host_ptr());
}

TEST_CASE("view: bad views and copies are refused")
{
  depot::storage<int> small{5};
  CHECK_THROWS_AS((depot::strided_view<int>{small, depot::layout::contiguous({2, 3})}),
                  depot::invalid_argument);
  auto v = iota_view({2, 3});
  auto w = iota_view({3, 2});
  CHECK_THROWS_AS(v.copy_(w), depot::invalid_argument);
  CHECK(v.to_host_vector() == ints({0, 1, 2, 3, 4, 5}));  // nothing written
  CHECK_THROWS_AS((void)v.select(1, 3), depot::index_error);
  CHECK_THROWS_AS((void)v.reshape({4, 2}), depot::invalid_argument);
}

TEST_CASE_TEMPLATE("view: copies across devices and into strided destinations", D, DEPOT_TEST_DEVICES)
{
  const auto src = iota_view({4, 5});
  // To the device and back, through a transpose on the device side.
  const auto dev = src.template to<D>();
  CHECK(dev.is_contiguous());
  CHECK(dev.to_host_vector() == src.to_host_vector());
  const auto dev_t = dev.transpose(0, 1);
  CHECK(dev_t.to_host_vector() == src.transpose(0, 1).to_host_vector());
  const auto back = dev_t.template to<depot::host>();
  CHECK(back.to_host_vector() == src.transpose(0, 1).to_host_vector());
  CHECK(dev_t.clone().to_host_vector() == src.transpose(0, 1).to_host_vector());

  // Write a 2 x 2 block into the middle of a device matrix; the rest stays as it was.
  auto target = depot::strided_view<int, D>::empty({4, 4});
  target.copy_(depot::strided_view<int>::empty({4, 4}).copy_(iota_view({4, 4}).slice(0, 0, 4)));
  auto block = iota_view({2, 2});
  for (int i = 0; i < 4; ++i) block.data()[i] = 100 + i;
  target.slice(0, 1, 3).slice(1, 1, 3).copy_(block);
  CHECK(target.to_host_vector() ==
        ints({0, 1, 2, 3, 4, 100, 101, 7, 8, 102, 103, 11, 12, 13, 14, 15}));
  // A reversed, strided source into a contiguous device view.
  auto rev = depot::strided_view<int, D>::empty({4});
  rev.copy_(iota_view({8}).slice(0, layout_end(), layout_end(), -2));
  CHECK(rev.to_host_vector() == ints({7, 5, 3, 1}));
  depot::synchronize<D>();
}
