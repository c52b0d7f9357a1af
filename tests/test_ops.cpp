// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/kokkos_runtime.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

template <depot::device D, class T>
void check_fill(std::size_t n, T value)
{
  CAPTURE(n);
  using rt = depot::runtime<D>;
  // Room for a guard element on each side; poison everything first.
  const std::size_t bytes = (n + 2) * sizeof(T);
  void* raw = rt::allocate(bytes, 0);
  std::vector<unsigned char> poison(bytes, 0xCD);
  rt::copy(raw, poison.data(), bytes);
  T* data = static_cast<T*>(raw) + 1;

  depot::stream<D> s;
  depot::ops::fill<D, T>(data, n, value, s);
  s.synchronize();

  std::vector<T> back(n + 2);
  rt::copy(back.data(), raw, bytes);
  rt::deallocate(raw, 0);
  T guard;
  std::memset(&guard, 0xCD, sizeof guard);
  CHECK(std::memcmp(&back.front(), &guard, sizeof(T)) == 0);
  CHECK(std::memcmp(&back.back(), &guard, sizeof(T)) == 0);
  std::size_t wrong = 0;
  for (std::size_t i = 1; i <= n; ++i) wrong += back[i] == value ? 0 : 1;
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("ops: fill writes exactly the requested elements", D, DEPOT_TEST_DEVICES)
{
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000003}}) {
    check_fill<D, float>(n, 3.25F);
    check_fill<D, double>(n, -1.5e300);
    check_fill<D, std::int32_t>(n, -7);
    check_fill<D, std::int64_t>(n, std::int64_t{1} << 40);
    check_fill<D, std::uint8_t>(n, std::uint8_t{0x7E});
  }
  CHECK(depot::ops::kokkos_is_initialized());
}

TEST_CASE_TEMPLATE("ops: fill of nothing, and of a null pointer", D, DEPOT_TEST_DEVICES)
{
  depot::ops::fill<D, float>(nullptr, 0, 1.0F);  // nothing to do
  try {
    depot::ops::fill<D, float>(nullptr, 5, 1.0F);
    FAIL("fill of a null pointer was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(std::string{e.what()}.find("n = 5") != std::string::npos);
  }
}

TEST_CASE("ops: Kokkos describes its spaces")
{
  depot::ops::ensure_kokkos();
  const std::string text = depot::ops::kokkos_description();
  MESSAGE(text);
  CHECK(text.rfind("Kokkos ", 0) == 0);
#if DEPOT_HAS_CUDA
  CHECK(text.find("Cuda") != std::string::npos);
#elif DEPOT_HAS_HIP
  CHECK(text.find("HIP") != std::string::npos);
#else
  CHECK(text.find("OpenMP") != std::string::npos);
#endif
}
