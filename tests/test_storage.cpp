// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/stream.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/host_storage.hpp>
#include <depot/storage/storage.hpp>

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

bool contains(const std::string& text, const std::string& part)
{
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("storage: host_storage counts copies, shares, moves and releases")
{
  const auto base = depot::memory_allocated<depot::host>();
  {
    depot::host_storage<float> a{100};
    CHECK(a.size() == 100);
    CHECK(a.is_refcounted());
    CHECK_FALSE(a.is_external());
    CHECK(a.ref_count() == 1);
    CHECK(depot::memory_allocated<depot::host>() == base + 512);  // 400 bytes, rounded
    {
      depot::host_storage<float> b = a;  // copy shares
      CHECK(a.ref_count() == 2);
      auto c = a.share();
      CHECK(a.ref_count() == 3);
      CHECK(c.data() == a.data());
      c = c;  // NOLINT(misc-redundant-expression): self-assignment keeps the count
      CHECK(a.ref_count() == 3);
      depot::host_storage<float> d = std::move(b);  // move transfers
      CHECK(a.ref_count() == 3);
      CHECK(b.size() == 0);  // NOLINT(bugprone-use-after-move)
      CHECK(b.ref_count() == 0);
      CHECK(b.data() == nullptr);
    }
    CHECK(a.ref_count() == 1);
    a[3] = 1.5F;
    auto deep = a.deep_copy();
    CHECK(deep.ref_count() == 1);
    CHECK(deep.data() != a.data());
    CHECK(deep[3] == 1.5F);
    deep[3] = 9.0F;  // independent
    CHECK(a[3] == 1.5F);
  }
  CHECK(depot::memory_allocated<depot::host>() == base);  // the last handle freed it
  depot::host_storage<double> empty;
  CHECK(empty.size() == 0);
  CHECK_FALSE(empty.is_refcounted());
  CHECK(empty.ref_count() == 0);
  CHECK(depot::host_storage<double>{0}.ref_count() == 0);
}

TEST_CASE("storage: external host storage is never counted nor freed")
{
  std::vector<int> owner(10);
  std::iota(owner.begin(), owner.end(), 0);
  const auto base = depot::memory_allocated<depot::host>();
  {
    depot::host_storage<int> ext{owner.data(), owner.size()};
    CHECK(ext.is_external());
    CHECK_FALSE(ext.is_refcounted());
    CHECK(ext.ref_count() == 0);
    CHECK(ext.data() == owner.data());
    auto alias = ext;  // aliases, still not counted
    CHECK(alias.ref_count() == 0);
    alias[2] = 42;
    CHECK(owner[2] == 42);
    try {
      (void)ext.share();
      FAIL("share() of external storage succeeded");
    } catch (const depot::invalid_argument& e) {
      CHECK(contains(e.what(), "external"));
    }
    auto managed = ext.deep_copy();
    CHECK(managed.ref_count() == 1);
    CHECK_FALSE(managed.is_external());
    managed[0] = -1;
    CHECK(owner[0] == 0);
    CHECK(depot::memory_allocated<depot::host>() == base + 512);
    depot::host_storage<int> copied{owner.data(), owner.size(), true};
    CHECK(copied.ref_count() == 1);
    CHECK(copied[9] == 9);
  }
  CHECK(depot::memory_allocated<depot::host>() == base);
  CHECK(owner[9] == 9);  // external memory untouched by the handles' destruction
  CHECK_THROWS_AS((depot::host_storage<int>{nullptr, 3}), depot::invalid_argument);
  depot::host_storage<int> none{nullptr, 0};
  CHECK(none.size() == 0);
}

TEST_CASE("storage: checked access and SIMD-width loads and stores")
{
  depot::host_storage<float> s{5};
  for (std::size_t i = 0; i < 5; ++i) s[i] = static_cast<float>(i);
  CHECK(s.at(4) == 4.0F);
  try {
    (void)s.at(5);
    FAIL("at(5) of 5 elements succeeded");
  } catch (const depot::index_error& e) {
    CHECK(std::string{e.what()} == "depot: index 5 is out of bounds for a buffer with size 5");
    CHECK(e.index() == 5);
    CHECK(e.size() == 5);
  }
  const auto v = s.load<4>(1);
  CHECK(v[0] == 1.0F);
  CHECK(v[3] == 4.0F);
  s.store<2>(3, {7.0F, 8.0F});
  CHECK(s[4] == 8.0F);
  CHECK_THROWS_AS((void)s.load<4>(2), depot::index_error);
  CHECK_THROWS_AS(s.store<2>(4, {0.0F, 0.0F}), depot::index_error);
  CHECK_THROWS_AS((void)s.load<1>(std::numeric_limits<std::size_t>::max()), depot::index_error);
  CHECK(s[4] == 8.0F);  // nothing written by the refused store
  CHECK_THROWS_AS(depot::host_storage<double>{std::numeric_limits<std::size_t>::max() / 4},
                  depot::invalid_argument);
}

TEST_CASE("storage: concurrent copies and releases end at the right count, without leaks")
{
  const auto base = depot::memory_allocated<depot::host>();
  {
    depot::host_storage<std::uint64_t> shared{1 << 16};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&shared] {
        for (int i = 0; i < 20000; ++i) {
          depot::host_storage<std::uint64_t> a = shared;
          depot::host_storage<std::uint64_t> b = a.share();
          a = b;
          depot::host_storage<std::uint64_t> c = std::move(b);
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(shared.ref_count() == 1);
  }
  CHECK(depot::memory_allocated<depot::host>() == base);
}

TEST_CASE_TEMPLATE("storage: device_storage shares, copies on a stream and returns its memory", D,
                   DEPOT_TEST_DEVICES)
{
  const auto base = depot::memory_allocated<D>();
  depot::stream<D> s;
  depot::stream<D> other;  // streams outlive the storage whose work they carry
  std::vector<int> host(1000);
  std::iota(host.begin(), host.end(), 7);
  {
    depot::device_storage<int, D> d{host.size(), 0, s};
    CHECK(d.ref_count() == 1);
    CHECK(d.stream() == depot::stream_ref<D>{s});
    CHECK(depot::memory_allocated<D>() == base + 4096);
    d.copy_from_host(host.data(), s);
    auto copy = d.deep_copy();  // on the allocation stream
    auto shared = d.share();
    CHECK(d.ref_count() == 2);
    CHECK(shared.data() == d.data());
    CHECK(copy.data() != d.data());
    std::vector<int> back(host.size(), -1);
    copy.copy_to_host(back.data(), s);
    s.synchronize();
    CHECK(back == host);
    d.record_use(other);  // released in other's order
    CHECK(d.stream() == depot::stream_ref<D>{other});
    other.synchronize();
  }
  s.synchronize();
  CHECK(depot::memory_allocated<D>() == base);
  depot::device_storage<int, D> empty;
  CHECK(empty.size() == 0);
  CHECK(empty.ref_count() == 0);
  CHECK_THROWS_AS((depot::device_storage<int, D>{16, -1}), depot::invalid_argument);
  CHECK_THROWS_AS((depot::device_storage<double, D>{std::numeric_limits<std::size_t>::max() / 4}),
                  depot::invalid_argument);
}

template <class S>
concept has_host_ptr = requires(const S& s) { s.host_ptr(); };
template <class S>
concept has_device_ptr = requires(const S& s) { s.device_ptr(); };

TEST_CASE_TEMPLATE("storage: storage<T, D> picks its implementation by device", D, DEPOT_TEST_DEVICES)
{
  using S = depot::storage<float, D>;
  if constexpr (std::is_same_v<D, depot::host>) {
    static_assert(std::is_same_v<typename S::impl_type, depot::host_storage<float>>);
    static_assert(has_host_ptr<S> && !has_device_ptr<S>);
  } else {
    static_assert(std::is_same_v<typename S::impl_type, depot::device_storage<float, D>>);
    static_assert(has_device_ptr<S> && !has_host_ptr<S>);
  }
  S s{256};
  CHECK(s.size() == 256);
  CHECK(S::is_cuda() == (D::kind == depot::device_kind::cuda));
  CHECK(S::is_hip() == (D::kind == depot::device_kind::hip));
  auto t = s.share();
  CHECK(s.ref_count() == 2);
  auto u = s.deep_copy();
  CHECK(u.ref_count() == 1);
  depot::synchronize<D>();
}
