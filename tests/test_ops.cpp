// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/kokkos_runtime.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
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
    // Values whose bytes are all the same (the backend's memset on a GPU), odd counts and
    // addresses off 16 bytes included (the guard element shifts them by one element).
    check_fill<D, float>(n, 0.0F);
    check_fill<D, double>(n, 0.0);
    check_fill<D, std::int32_t>(n, -1);
    check_fill<D, std::int64_t>(n, std::int64_t{0x0101010101010101});
  }
  CHECK(depot::ops::kokkos_is_initialized());
}

// Fills by the backend's memset (uniform bytes) and by a kernel, queued in turn on one
// stream with no wait between them, land in that order.
TEST_CASE_TEMPLATE("ops: memset fills and kernel fills on one stream land in stream order", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  constexpr std::size_t n = (std::size_t{1} << 22) + 5;  // large enough to still run when the next is queued
  void* raw = rt::allocate(n * sizeof(float), 0);
  auto* p = static_cast<float*>(raw);
  depot::stream<D> s;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    const bool memset_last = round % 2 == 0;
    depot::ops::fill<D, float>(p, n, memset_last ? 2.5F : 0.0F, s);
    depot::ops::fill<D, float>(p + 1, n - 2, memset_last ? 0.0F : 2.5F, s);
    s.synchronize();
    std::vector<float> back(n);
    rt::copy(back.data(), raw, n * sizeof(float));
    const float inner = memset_last ? 0.0F : 2.5F, outer = memset_last ? 2.5F : 0.0F;
    CHECK(back.front() == outer);
    CHECK(back.back() == outer);
    CHECK(std::count(back.begin() + 1, back.end() - 1, inner) == static_cast<std::ptrdiff_t>(n - 2));
  }
  rt::deallocate(raw, 0);
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

// A stream's first kernel launched from a thread other than the one that initialised
// Kokkos: it runs (Kokkos 4 and newer, and any host backend), or, where Kokkos 3.x with the
// OpenMP host backend refuses to make the stream's execution-space instance there (its
// host state is per thread; found by the GPU run of a pool test), depot::error names the
// stream, the cause and the remedy; the kernel launched from this thread then runs, and
// the instance made here serves the other thread too.
TEST_CASE_TEMPLATE("ops: a stream's first kernel from another thread runs, or is refused with the cause", D,
                   DEPOT_TEST_DEVICES)
{
  depot::ops::ensure_kokkos();  // on this thread, as an application's start would
  using rt = depot::runtime<D>;
  constexpr std::size_t n = 4096;
  auto* data = static_cast<std::int32_t*>(rt::allocate(n * sizeof(std::int32_t), 0));
  const auto all_equal = [&](std::int32_t v) {
    std::vector<std::int32_t> back(n);
    rt::copy(back.data(), data, n * sizeof(std::int32_t));
    return std::count(back.begin(), back.end(), v) == static_cast<std::ptrdiff_t>(n);
  };
  depot::stream<D> s;  // new: no kernel ran on it yet
  bool refused = false, failed = false;
  std::string message;
  const auto fill_from_a_thread = [&](std::int32_t v) {
    std::thread t{[&] {
      try {
        depot::ops::fill<D, std::int32_t>(data, n, v, s);
        s.synchronize();
      } catch (const depot::error& e) {
        refused = true;
        message = e.what();
      } catch (...) {
        failed = true;
      }
    }};
    t.join();
  };
  fill_from_a_thread(7);
  const std::string kokkos = depot::ops::kokkos_description();
  const std::string outcome = refused ? ": a new stream's instance refused on another thread" : ": ran on another thread";
  MESSAGE(kokkos << outcome);
  CHECK_FALSE(failed);
  if (refused) {
    CHECK(depot::is_gpu_v<D>);  // (the host's default instance serves every stream)
    CHECK(kokkos.rfind("Kokkos 3.", 0) == 0);
    CHECK(message.find("only on the thread that initialised Kokkos") != std::string::npos);
    CHECK(message.find(std::to_string(reinterpret_cast<std::uintptr_t>(s.native()))) != std::string::npos);
    depot::ops::fill<D, std::int32_t>(data, n, 5, s);  // from this thread: the instance made here
    s.synchronize();
    CHECK(all_equal(5));
    refused = false;
    fill_from_a_thread(7);  // and it serves the other thread
    CHECK_FALSE(refused);
    CHECK_FALSE(failed);
  }
  CHECK(all_equal(7));
  // A zero fill (the backend's memset on a GPU) as a new stream's first op makes its
  // instance here too, as a kernel would: a kernel from another thread then runs there.
  {
    depot::stream<D> s2;
    depot::ops::fill<D, std::int32_t>(data, n, 0, s2);
    s2.synchronize();
    CHECK(all_equal(0));
    bool ran = false;
    std::string why;
    std::thread t{[&] {
      try {
        depot::ops::fill<D, std::int32_t>(data, n, 9, s2);
        s2.synchronize();
        ran = true;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }};
    t.join();
    CHECK_MESSAGE(ran, why);
    CHECK(all_equal(9));
  }
  rt::deallocate(data, 0);
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
