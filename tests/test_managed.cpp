// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Managed (unified) memory exists on GPU backends only: these tests are compiled in GPU
// builds and run where a device is present. (managed_storage<T, depot::host> is refused at
// compile time; the meson test managed-host-refused checks the message.)
#include "test_devices.hpp"

#if DEPOT_HAS_CUDA || DEPOT_HAS_HIP

#include <doctest/doctest.h>

#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/storage/dynamic_storage.hpp>
#include <depot/storage/managed_storage.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if DEPOT_HAS_CUDA
#define DEPOT_TEST_GPU depot::cuda
#else
#define DEPOT_TEST_GPU depot::hip
#endif

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class D>
bool has_managed_device()
{
  if (depot::device_count<D>() == 0) {
    MESSAGE("no " << D::name << " device: managed tests skipped");
    return false;
  }
  if (!depot::runtime<D>::supports_managed_memory(0)) {
    CHECK_THROWS_AS((depot::managed_storage<float, D>{16}), depot::invalid_argument);
    MESSAGE(D::name << ":0 has no managed memory: only the refusal was tested");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("managed: host and device reach the same elements", D, DEPOT_TEST_GPU)
{
  if (!has_managed_device<D>()) return;
  const std::size_t n = 1 << 20;
  depot::managed_storage<std::int32_t, D> m{n};
  CHECK(m.size() == n);
  CHECK(m.device() == 0);
  for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<std::int32_t>(i);  // host writes
  // A device kernel (through the typed storage) adds to what the host wrote.
  depot::dynamic_storage d{m.as_storage()};
  CHECK(d.device() == depot::device_id::of<D>());
  CHECK(d.data_ptr() == m.data());
  depot::dynamic_storage ones{n, depot::dtype::int32, depot::device_id::of<D>()};
  ones.fill_(5);
  d.copy_(ones);  // a device-side copy into managed memory
  depot::synchronize<D>();
  CHECK(m[0] == 5);
  CHECK(m[n - 1] == 5);
  // The host writes again; a device copy out of managed memory sees it.
  m[123] = -9;
  const depot::dynamic_storage copy = d.to(depot::device_id::of<D>());
  const auto back = copy.to_vector<std::int32_t>();
  CHECK(back[123] == -9);
  CHECK(back[124] == 5);
  // Prefetch is a hint: the data stay valid either way.
  depot::stream<D> s;
  m.prefetch_to_device(s.ref());
  s.synchronize();
  m.prefetch_to_host(s.ref());
  s.synchronize();
  CHECK(m[123] == -9);
  MESSAGE(D::name << ":0 concurrent managed access: " << depot::runtime<D>::concurrent_managed_access(0));
}

TEST_CASE_TEMPLATE("managed: never asks for more than the device has free", D, DEPOT_TEST_GPU)
{
  if (!has_managed_device<D>()) return;
  const auto info = depot::get_memory_info<D>(0);
  const std::size_t ask = info.free_bytes + (std::size_t{1} << 30);
  try {
    depot::managed_storage<std::uint8_t, D> m{ask};
    FAIL("a managed allocation beyond free memory succeeded");
  } catch (const depot::out_of_memory& e) {
    CHECK(e.requested_bytes() == ask);
    CHECK(e.device() == depot::device_id::of<D>());
    CHECK(contains(e.what(), std::to_string(ask) + " bytes) refused"));
    CHECK(contains(e.what(), "free of"));
  }
  const auto after = depot::get_memory_info<D>(0);
  CHECK(after.total_bytes == info.total_bytes);
  // Elements whose bytes overflow size_t, and bad devices: invalid_argument.
  CHECK_THROWS_AS((depot::managed_storage<double, D>{std::size_t{1} << 62}), depot::invalid_argument);
  CHECK_THROWS_AS((depot::managed_storage<float, D>{16, depot::device_count<D>()}), depot::invalid_argument);
  CHECK_THROWS_AS((depot::managed_storage<float, D>{16, -1}), depot::invalid_argument);
  CHECK_THROWS_AS(depot::runtime<D>::prefetch_managed(nullptr, 16, 0, nullptr), depot::invalid_argument);
}

TEST_CASE_TEMPLATE("managed: counted like device storage; deep copies are independent", D, DEPOT_TEST_GPU)
{
  if (!has_managed_device<D>()) return;
  const auto free_before = depot::get_memory_info<D>(0).free_bytes;
  {
    depot::managed_storage<float, D> a{1000};
    CHECK(a.ref_count() == 1);
    {
      auto b = a;
      auto c = a.share();
      CHECK(a.ref_count() == 3);
      CHECK(c.data() == a.data());
      auto moved = std::move(b);
      CHECK(a.ref_count() == 3);
      CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    }
    CHECK(a.ref_count() == 1);
    a[7] = 3.5F;
    auto deep = a.deep_copy();
    CHECK(deep.data() != a.data());
    CHECK(deep[7] == 3.5F);
    deep[7] = -1.0F;
    CHECK(a[7] == 3.5F);
    // The typed storage keeps the managed buffer alive after the managed handle goes.
    depot::storage<float, D> typed = a.as_storage();
    CHECK(a.ref_count() == 2);
    a = {};
    CHECK(typed.size() == 1000);
    depot::strided_view<float, D> v{typed, depot::layout::contiguous({1000})};
    CHECK(v.to_host_vector()[7] == 3.5F);
    CHECK_THROWS_AS((void)a.at(0), depot::index_error);
  }
  depot::synchronize<D>();
  // Everything was returned (the driver's accounting is coarse: allow 64 MiB).
  const auto free_after = depot::get_memory_info<D>(0).free_bytes;
  CHECK(free_after + (std::size_t{64} << 20) >= free_before);
  depot::managed_storage<int, D> empty{0};
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
  CHECK_FALSE(empty.is_refcounted());
}

#endif  // DEPOT_HAS_CUDA || DEPOT_HAS_HIP
