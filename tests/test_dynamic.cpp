// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/storage/dynamic_storage.hpp>
#include <depot/storage/dynamic_view.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using depot::dtype;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class F>
std::string message_of(F&& f)
{
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// The reference conversion, written out independently of ops/: static_cast, except that
// float16 and bfloat16 go through float and anything converts to bool as != 0.
template <class To, class From>
To reference_convert(From v)
{
  if constexpr (std::is_same_v<From, depot::float16> || std::is_same_v<From, depot::bfloat16>) {
    return reference_convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From{0};
  } else if constexpr (std::is_same_v<To, depot::float16> || std::is_same_v<To, depot::bfloat16>) {
    return To{static_cast<float>(v)};
  } else {
    return static_cast<To>(v);
  }
}

// How the tests hold elements on the host: std::vector<bool> has no data(), so bool
// elements are read and written as their bytes.
template <class T>
using host_elem = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;

// The elements of `s` as raw host bytes (in its own dtype).
std::vector<unsigned char> host_bytes(const depot::dynamic_storage& s)
{
  std::vector<unsigned char> out(s.nbytes());
  auto h = s.to(depot::device_id{});
  if (!out.empty()) std::memcpy(out.data(), h.data_ptr(), out.size());
  return out;
}

// Source values for a conversion from `From` into `To` for which static_cast is defined:
// integers convert modularly, so any value; a float into an unsigned integer only when it
// is not negative; into a narrow integer only within its range.
template <class From, class To>
std::vector<host_elem<From>> sources()
{
  std::vector<double> raw;
  if constexpr (std::is_same_v<From, bool>) {
    return {0, 1, 1, 0};
  } else if constexpr (std::is_integral_v<From>) {
    std::vector<std::int64_t> v{0, 1, 2, 7, 100, 127};
    if constexpr (std::is_signed_v<From>) v.insert(v.end(), {-1, -7, -128});
    if constexpr (sizeof(From) >= 2) v.insert(v.end(), {300, 1000, 32767});
    if constexpr (sizeof(From) >= 4) v.insert(v.end(), {70000, 16777217, 2147483647});
    if constexpr (sizeof(From) >= 8) v.insert(v.end(), {std::int64_t{1} << 40, (std::int64_t{1} << 53) + 1});
    if constexpr (std::is_signed_v<From> && sizeof(From) >= 2) v.insert(v.end(), {-300, -32768});
    std::vector<From> out;
    for (auto x : v) out.push_back(static_cast<From>(x));
    return out;
  } else {
    raw = {0.0, 0.5, 1.0, 2.75, 7.25, 100.5, 126.9375};
    constexpr bool into_unsigned = std::is_integral_v<To> && std::is_unsigned_v<To> && !std::is_same_v<To, bool>;
    if constexpr (!into_unsigned) raw.insert(raw.end(), {-0.5, -1.75, -100.25, -127.5});
    if constexpr (!std::is_integral_v<To> || sizeof(To) >= 2 || std::is_same_v<To, bool>) raw.insert(raw.end(), {250.5, 255.0});
    if constexpr (!std::is_integral_v<To> || sizeof(To) >= 4 || std::is_same_v<To, bool>) raw.insert(raw.end(), {60000.0, 65504.0});
    if constexpr (!std::is_integral_v<To> && sizeof(From) >= 4) raw.insert(raw.end(), {1.0 / 3.0, 1e-3, 3.0e38, 1e-30});
    if constexpr (std::is_same_v<From, double> && std::is_same_v<To, double>) raw.push_back(1e300);
    std::vector<From> out;
    for (double x : raw) {
      if constexpr (std::is_same_v<From, double>) {
        out.push_back(x);
      } else {
        out.push_back(static_cast<From>(static_cast<float>(x)));
      }
    }
    return out;
  }
}

template <class T>
depot::dynamic_storage host_storage_of(const std::vector<T>& values, dtype type = depot::dtype_of_v<T>)
{
  REQUIRE(size_of(type) == sizeof(T));
  depot::dynamic_storage s{values.size(), type};
  if (!values.empty()) std::memcpy(s.data_ptr(), values.data(), values.size() * sizeof(T));
  return s;
}

template <class T>
std::vector<host_elem<T>> host_values(const depot::dynamic_storage& s)
{
  REQUIRE(s.dtype() == depot::dtype_of_v<T>);
  const auto bytes = host_bytes(s);
  std::vector<host_elem<T>> out(s.size());
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template <class T>
bool same_bits(const T& a, const T& b)
{
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(const T& v)
{
  if constexpr (std::is_same_v<T, depot::float16> || std::is_same_v<T, depot::bfloat16>) {
    return std::to_string(static_cast<float>(v));
  } else {
    return std::to_string(v);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("dynamic: sizes, dtype, device and the reference count", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  const auto base = depot::memory_allocated<D>();
  {
    depot::dynamic_storage a{10, dtype::float16, dev};
    CHECK(a.size() == 10);
    CHECK(a.dtype() == dtype::float16);
    CHECK(a.device() == dev);
    CHECK(a.nbytes() == 20);
    CHECK(a.data_ptr() != nullptr);
    CHECK(a.ref_count() == 1);
    CHECK(a.to_string() == "float16[10] on " + dev.to_string());
    CHECK(depot::memory_allocated<D>() > base);
    {
      depot::dynamic_storage b = a;  // copies share
      auto c = a.share();
      CHECK(a.ref_count() == 3);
      CHECK(c.data_ptr() == a.data_ptr());
      c = c;  // NOLINT(misc-redundant-expression): self-assignment keeps the count
      CHECK(a.ref_count() == 3);
      depot::dynamic_storage d = std::move(b);
      CHECK(a.ref_count() == 3);
      CHECK(b.size() == 0);  // NOLINT(bugprone-use-after-move)
      CHECK(b.data_ptr() == nullptr);
      CHECK(b.ref_count() == 0);
      auto deep = a.deep_copy();
      CHECK(deep.ref_count() == 1);
      CHECK(deep.data_ptr() != a.data_ptr());
      CHECK(deep.dtype() == dtype::float16);
      CHECK(deep.device() == dev);
    }
    CHECK(a.ref_count() == 1);
  }
  CHECK(depot::memory_allocated<D>() == base);  // the last handle returned the buffer
  depot::dynamic_storage none{0, dtype::int8, dev};
  CHECK(none.size() == 0);
  CHECK(none.data_ptr() == nullptr);
  CHECK(none.device() == dev);
  CHECK_FALSE(none.is_refcounted());
  CHECK(none.to(dev).size() == 0);
  none.fill_(3).zero_().resize_(0);
  depot::dynamic_storage dflt;
  CHECK(dflt.size() == 0);
  CHECK(dflt.dtype() == dtype::float32);
  CHECK(dflt.device() == depot::device_id{});
}

TEST_CASE_TEMPLATE("dynamic: fill_ stores the value in every dtype", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  for (dtype t : depot::all_dtypes) {
    CAPTURE(depot::to_string(t));
    depot::dynamic_storage s{37, t, dev};
    depot::visit_dtype(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      // (value, what static_cast gives for it in T)
      const auto expect_all = [&](depot::scalar v, T want) {
        CAPTURE(v.to_string());
        s.fill_(v);
        const auto got = host_values<T>(s);
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (!same_bits<host_elem<T>>(got[i], static_cast<host_elem<T>>(want))) {
            FAIL_CHECK("element " << i << " is " << show(got[i]) << ", expected " << show(want));
            break;
          }
        }
      };
      expect_all(true, T{static_cast<T>(1)});
      expect_all(false, T{});
      expect_all(7, static_cast<T>(7));
      expect_all(std::uint64_t{100}, static_cast<T>(100));
      if constexpr (std::is_same_v<T, bool>) {
        expect_all(0.25, true);  // non-zero is true
        expect_all(-3, true);
        expect_all(std::nan(""), true);
      } else if constexpr (std::is_integral_v<T>) {
        expect_all(2.75, static_cast<T>(2));  // truncates toward zero
        expect_all(std::numeric_limits<T>::max(), std::numeric_limits<T>::max());
        expect_all(std::numeric_limits<T>::lowest(), std::numeric_limits<T>::lowest());
        if constexpr (std::is_signed_v<T>) expect_all(-2.75, static_cast<T>(-2));
      } else {
        expect_all(2.75, static_cast<T>(2.75F));
        expect_all(-0.5, static_cast<T>(-0.5F));
        expect_all(std::numeric_limits<double>::infinity(), static_cast<T>(std::numeric_limits<float>::infinity()));
        if constexpr (std::is_same_v<T, double>) expect_all(0.1, 0.1);
        if constexpr (std::is_same_v<T, float>) expect_all(0.1, 0.1F);  // rounded once
        if constexpr (std::is_same_v<T, depot::float16>) {
          expect_all(65504.0, depot::float16::from_bits(0x7bff));  // the largest finite half
          expect_all(1.0 / 3.0, depot::float16::from_bits(0x3555));
        }
        if constexpr (std::is_same_v<T, depot::bfloat16>) expect_all(1.0 / 3.0, depot::bfloat16::from_bits(0x3eab));
      }
    });
    s.zero_();
    for (unsigned char b : host_bytes(s)) REQUIRE(b == 0);
  }
}

TEST_CASE("dynamic: fill_ refuses a value the dtype cannot hold and writes nothing")
{
  const double inf = std::numeric_limits<double>::infinity();
  struct refused {
    dtype type;
    depot::scalar value;
    const char* says;
  };
  const refused cases[] = {
      {dtype::int8, 300, "300 cannot be stored as int8 without overflow: the range of int8 is [-128, 127]"},
      {dtype::int8, -129, "[-128, 127]"},
      {dtype::uint8, -1, "-1 cannot be stored as uint8"},
      {dtype::uint16, 65536, "[0, 65535]"},
      {dtype::int32, std::nan(""), "no NaN or infinity"},
      {dtype::int64, inf, "no NaN or infinity"},
      {dtype::int64, 9223372036854775808.0, "int64 without overflow"},  // 2^63
      {dtype::int64, std::numeric_limits<std::uint64_t>::max(), "int64"},
      {dtype::uint64, 18446744073709551616.0, "uint64"},  // 2^64
      {dtype::uint64, -0.0 - 1.0, "uint64"},
      {dtype::float16, 1e6, "overflows to infinity in float16"},
      {dtype::float16, 65520.0, "float16"},  // rounds to infinity
      {dtype::bfloat16, 1e39, "bfloat16"},
      {dtype::float32, 1e39, "float32"},
      {dtype::float32, -1e300, "float32"},
  };
  for (const auto& c : cases) {
    CAPTURE(depot::to_string(c.type));
    CAPTURE(c.value.to_string());
    depot::dynamic_storage s{5, c.type};
    s.fill_(1);
    const auto before = host_bytes(s);
    CHECK_THROWS_AS(s.fill_(c.value), depot::invalid_argument);
    CHECK(contains(message_of([&] { s.fill_(c.value); }), c.says));
    CHECK(host_bytes(s) == before);
  }
  // The edges that do fit.
  depot::dynamic_storage u8{3, dtype::uint8};
  CHECK_NOTHROW(u8.fill_(255));
  CHECK_NOTHROW(u8.fill_(-0.75));  // truncates to 0
  CHECK(host_values<std::uint8_t>(u8) == std::vector<std::uint8_t>{0, 0, 0});
  depot::dynamic_storage i64{2, dtype::int64};
  CHECK_NOTHROW(i64.fill_(-9223372036854775808.0));
  CHECK(host_values<std::int64_t>(i64)[1] == std::numeric_limits<std::int64_t>::min());
  depot::dynamic_storage u64{2, dtype::uint64};
  CHECK_NOTHROW(u64.fill_(std::numeric_limits<std::uint64_t>::max()));
  CHECK(host_values<std::uint64_t>(u64)[0] == std::numeric_limits<std::uint64_t>::max());
  depot::dynamic_storage f16{2, dtype::float16};
  CHECK_NOTHROW(f16.fill_(std::nan("")));  // NaN and infinity are values of a float
  CHECK(std::isnan(static_cast<float>(host_values<depot::float16>(f16)[0])));
  CHECK_NOTHROW(f16.fill_(-inf));
  CHECK(static_cast<float>(host_values<depot::float16>(f16)[1]) == -std::numeric_limits<float>::infinity());
}

namespace {

// Converts `values` of From, placed on `from`, into To on `to` and compares every element
// with reference_convert.
template <class From, class To>
void check_conversion(depot::device_id from, depot::device_id to)
{
  const auto values = sources<From, To>();
  const auto src = host_storage_of(values, depot::dtype_of_v<From>).to(from);
  depot::dynamic_storage dst{values.size(), depot::dtype_of_v<To>, to};
  dst.fill_(false);
  dst.copy_(src);
  const auto got = host_values<To>(dst);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const To want = reference_convert<To>(static_cast<From>(values[i]));
    if (!same_bits<host_elem<To>>(got[i], static_cast<host_elem<To>>(want))) {
      FAIL_CHECK(depot::to_string(depot::dtype_of_v<From>)
                 << " " << show(values[i]) << " -> " << depot::to_string(depot::dtype_of_v<To>) << ": got "
                 << show(got[i]) << ", static_cast gives " << show(want) << " (" << from.to_string() << " -> "
                 << to.to_string() << ")");
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("dynamic: copy_ converts between every pair of dtypes as static_cast does", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  const auto host = depot::device_id{};
  int pairs = 0;
  for (dtype from : depot::all_dtypes) {
    for (dtype to : depot::all_dtypes) {
      depot::visit_dtype(from, [&](auto f) {
        depot::visit_dtype(to, [&](auto t) {
          using F = typename decltype(f)::type;
          using T = typename decltype(t)::type;
          check_conversion<F, T>(dev, dev);
          if constexpr (depot::is_gpu_v<D>) {
            check_conversion<F, T>(host, dev);  // staged on the device, converted there
            check_conversion<F, T>(dev, host);
          }
          ++pairs;
        });
      });
    }
  }
  CHECK(pairs == 13 * 13);
  // A few conversions spelled out (the table above compares with reference_convert).
  depot::dynamic_storage wide = host_storage_of(std::vector<std::int16_t>{300, -1, 127}).to(dev);
  depot::dynamic_storage narrow{3, dtype::uint8, dev};
  narrow.copy_(wide);
  CHECK(host_values<std::uint8_t>(narrow) == std::vector<std::uint8_t>{44, 255, 127});  // modular
  depot::dynamic_storage fl = host_storage_of(std::vector<float>{-1.75F, 0.25F, 65519.0F}).to(dev);
  depot::dynamic_storage as_int{3, dtype::int32, dev};
  as_int.copy_(fl);
  CHECK(as_int.to_vector<std::int32_t>() == std::vector<std::int32_t>{-1, 0, 65519});  // truncates
  depot::dynamic_storage as_half{3, dtype::float16, dev};
  as_half.copy_(fl);
  CHECK(as_half.to_vector<float>() == std::vector<float>{-1.75F, 0.25F, 65504.0F});  // rounds to nearest
  depot::dynamic_storage as_bool{3, dtype::bool_, dev};
  as_bool.copy_(fl);
  CHECK(host_values<bool>(as_bool) == std::vector<std::uint8_t>{1, 1, 1});
}

TEST_CASE_TEMPLATE("dynamic: float16 and bfloat16 round trips", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  // Exact in half: small integers, powers of two down to the subnormals, the largest finite.
  const std::vector<float> exact_half{0.0F, -0.0F, 1.0F, -2.0F, 0.5F, 1024.0F, 65504.0F, -65504.0F,
                                      std::ldexp(1.0F, -14), std::ldexp(1.0F, -24), 3.140625F, 2047.0F};
  // Exact in bfloat16: 8 significant bits, float's exponent range.
  const std::vector<float> exact_bf16{0.0F, 1.0F, -3.0F, 255.0F, std::ldexp(1.5F, 126), std::ldexp(1.0F, -126), 3.140625F,
                                      std::ldexp(1.0F, 100), -std::ldexp(1.0F, -20)};
  const auto round_trip = [&](const std::vector<float>& values, dtype via, dtype back) -> depot::dynamic_storage {
    const auto src = host_storage_of(values).to(dev);
    depot::dynamic_storage mid{values.size(), via, dev};
    mid.copy_(src);
    depot::dynamic_storage out{values.size(), back, dev};
    out.copy_(mid);
    return out;
  };
  for (dtype back : {dtype::float32, dtype::float64}) {
    CAPTURE(depot::to_string(back));
    const auto h = round_trip(exact_half, dtype::float16, back).template to_vector<double>();
    const auto b = round_trip(exact_bf16, dtype::bfloat16, back).template to_vector<double>();
    for (std::size_t i = 0; i < exact_half.size(); ++i) CHECK(h[i] == static_cast<double>(exact_half[i]));
    for (std::size_t i = 0; i < exact_bf16.size(); ++i) CHECK(b[i] == static_cast<double>(exact_bf16[i]));
  }
  // What is not exact rounds to nearest: within half an ulp (2^-11 and 2^-8 relative).
  std::mt19937 rng(static_cast<std::mt19937::result_type>(depot::test::seed("dynamic: half round trips", 4242)));
  std::uniform_real_distribution<float> dist(-1000.0F, 1000.0F);
  std::vector<float> random(257);
  for (float& x : random) x = dist(rng);
  const auto h = round_trip(random, dtype::float16, dtype::float32).template to_vector<float>();
  const auto b = round_trip(random, dtype::bfloat16, dtype::float32).template to_vector<float>();
  for (std::size_t i = 0; i < random.size(); ++i) {
    CHECK(std::fabs(h[i] - random[i]) <= std::fabs(random[i]) * std::ldexp(1.0F, -11) + std::ldexp(1.0F, -25));
    CHECK(std::fabs(b[i] - random[i]) <= std::fabs(random[i]) * std::ldexp(1.0F, -8));
    CHECK(h[i] == static_cast<float>(depot::float16{random[i]}));  // the same rounding as the type itself
    CHECK(b[i] == static_cast<float>(depot::bfloat16{random[i]}));
  }
}

TEST_CASE_TEMPLATE("dynamic: to() moves elements between devices and keeps the dtype", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  std::vector<std::int16_t> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int16_t>(i * 37 - 9000);
  const auto h = host_storage_of(values);
  const auto d = h.to(dev);
  CHECK(d.device() == dev);
  CHECK(d.dtype() == dtype::int16);
  CHECK(d.data_ptr() != h.data_ptr());
  const auto back = d.to(depot::device_id{});
  CHECK(host_values<std::int16_t>(back) == values);
  // Independent copies: filling the device copy leaves the host one.
  auto d2 = d;
  d2.fill_(-1);
  CHECK(host_values<std::int16_t>(h) == values);
  CHECK(host_values<std::int16_t>(d) == std::vector<std::int16_t>(1000, -1));  // d and d2 share
  // copy_from_host / copy_to_host / to_vector convert.
  std::vector<double> in(1000, 2.5);
  auto f = depot::dynamic_storage{1000, dtype::int32, dev};
  f.copy_from_host(std::span<const double>{in});
  CHECK(f.to_vector<std::int64_t>() == std::vector<std::int64_t>(1000, 2));
  auto flags = std::make_unique<bool[]>(1000);
  f.copy_to_host(std::span<bool>{flags.get(), 1000});
  CHECK(flags[999]);
}

TEST_CASE_TEMPLATE("dynamic: resize_ keeps the first elements and detaches from shared handles", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  std::vector<std::int32_t> values(100);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int32_t>(i);
  depot::dynamic_storage s = host_storage_of(values).to(dev);
  depot::dynamic_storage other = s;  // shares the old buffer
  auto typed = s.as<std::int32_t, D>();
  CHECK(s.ref_count() == 3);
  s.resize_(150);
  CHECK(s.size() == 150);
  CHECK(s.ref_count() == 1);      // a new buffer, held by this handle only
  CHECK(other.ref_count() == 2);  // the old one: `other` and `typed`
  CHECK(other.size() == 100);
  const auto grown = host_values<std::int32_t>(s);
  CHECK(std::vector<std::int32_t>(grown.begin(), grown.begin() + 100) == values);
  s.fill_(9);
  CHECK(host_values<std::int32_t>(other) == values);  // the old buffer is untouched
  s.resize_(10);
  CHECK(host_values<std::int32_t>(s) == std::vector<std::int32_t>(10, 9));
  const void* before = s.data_ptr();
  s.resize_(10);  // same size: nothing changes
  CHECK(s.data_ptr() == before);
  s.resize_(0);
  CHECK(s.size() == 0);
  CHECK(s.data_ptr() == nullptr);
  s.resize_(4);
  CHECK(s.size() == 4);

  // Absurd sizes: refused, and nothing changes.
  depot::dynamic_storage t = host_storage_of(values).to(dev);
  (void)t.as<std::int32_t, D>();  // (a temporary typed handle, gone at once)
  const void* data = t.data_ptr();
  CHECK_THROWS_AS(t.resize_(std::numeric_limits<std::size_t>::max()), depot::invalid_argument);
  CHECK_THROWS_AS(t.resize_(std::numeric_limits<std::size_t>::max() / 2), depot::invalid_argument);
  CHECK(contains(message_of([&] { t.resize_(std::numeric_limits<std::size_t>::max() / 2); }), "overflow"));
  CHECK_THROWS_AS(t.resize_(std::size_t{1} << 58), depot::out_of_memory);  // 2^60 bytes
  CHECK(t.size() == 100);
  CHECK(t.data_ptr() == data);
  CHECK(host_values<std::int32_t>(t) == values);
  CHECK_THROWS_AS((depot::dynamic_storage{std::size_t{1} << 61, dtype::int64, dev}), depot::invalid_argument);
}

TEST_CASE_TEMPLATE("dynamic: as<T>() views the same bytes and keeps them alive", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  const auto base = depot::memory_allocated<D>();
  {
    depot::storage<float, D> typed;
    {
      depot::dynamic_storage s{64, dtype::float32, dev};
      s.fill_(1.5);
      typed = s.as<float, D>();
      CHECK(s.ref_count() == 2);
      CHECK(typed.size() == 64);
      const void* p = nullptr;
      if constexpr (depot::is_gpu_v<D>) {
        p = typed.device_ptr();
      } else {
        p = typed.host_ptr();
      }
      CHECK(p == s.data_ptr());
      // Wrong element type or device kind: refused, naming both.
      CHECK_THROWS_AS(((void)s.as<double, D>()), depot::invalid_argument);
      CHECK(contains(message_of([&] { (void)s.as<std::int32_t, D>(); }), "as<int32>(): the storage holds float32"));
      if constexpr (depot::is_gpu_v<D>) {
        CHECK_THROWS_AS((void)s.as<float>(), depot::invalid_argument);
        CHECK(contains(message_of([&] { (void)s.as<float>(); }), "is on " + dev.to_string()));
      }
      CHECK(s.ref_count() == 2);  // failed calls took no count
    }
    // The dynamic handle is gone; the typed one keeps the buffer.
    CHECK(depot::memory_allocated<D>() > base);
    depot::dynamic_storage again{typed};  // and back: shares once more
    CHECK(again.dtype() == dtype::float32);
    CHECK(again.device() == dev);
    CHECK(again.to_vector<float>() == std::vector<float>(64, 1.5F));
  }
  CHECK(depot::memory_allocated<D>() == base);
}

TEST_CASE("dynamic: a typed storage's buffer is shared, an external one stays external")
{
  depot::storage<std::uint16_t> typed{8};
  for (std::size_t i = 0; i < 8; ++i) typed.host_ptr()[i] = static_cast<std::uint16_t>(i);
  {
    depot::dynamic_storage d{typed};
    CHECK(typed.ref_count() == 2);
    CHECK(d.dtype() == dtype::uint16);
    CHECK(d.data_ptr() == typed.host_ptr());
    d.fill_(5);
    CHECK(typed.host_ptr()[7] == 5);  // one buffer
  }
  CHECK(typed.ref_count() == 1);
  std::vector<double> owner(4, 1.0);
  depot::dynamic_storage ext{depot::storage<double>{depot::host_storage<double>{owner.data(), owner.size()}}};
  CHECK(ext.is_external());
  CHECK_FALSE(ext.is_refcounted());
  CHECK(ext.ref_count() == 0);
  CHECK_THROWS_AS((void)ext.share(), depot::invalid_argument);
  ext.fill_(-2);
  CHECK(owner[3] == -2.0);
  auto copy = ext.deep_copy();
  CHECK(copy.is_refcounted());
  CHECK(copy.to_vector<double>() == owner);
  CHECK(ext.as<double>().host_ptr() == owner.data());  // still the owner's memory
}

TEST_CASE("dynamic: bad input is refused with a clear message")
{
  // An unknown dtype, by value or by name.
  CHECK_THROWS_AS((depot::dynamic_storage{4, static_cast<dtype>(42)}), depot::invalid_argument);
  CHECK(contains(message_of([] { depot::dynamic_storage s{4, static_cast<dtype>(42)}; }), "dtype value 42"));
  CHECK(contains(message_of([] { (void)depot::dtype_from_string("float128"); }), "valid: bool, int8"));
  // Devices: the host has index 0 only; a GPU backend this build lacks names the option.
  CHECK(contains(message_of([] { depot::dynamic_storage s{4, dtype::int8, depot::device_id{depot::device_kind::host, 1}}; }),
                 "host device index 1 is out of range"));
#if !DEPOT_HAS_CUDA
  CHECK(contains(message_of([] { depot::dynamic_storage s{4, dtype::int8, depot::device_id::parse("cuda:0")}; }),
                 "no cuda backend (configure with -Dgpu=cuda)"));
#else
  CHECK_THROWS_AS((depot::dynamic_storage{4, dtype::int8, depot::device_id::parse("cuda:99")}), depot::invalid_argument);
#endif
#if !DEPOT_HAS_HIP
  CHECK(contains(message_of([] { depot::dynamic_storage s{4, dtype::int8, depot::device_id::parse("hip:0")}; }),
                 "no hip backend"));
#endif
  CHECK(contains(message_of([] {
                   depot::dynamic_storage s{4, dtype::int8, depot::device_id{static_cast<depot::device_kind>(9), 0}};
                 }),
                 "is not a device kind"));
  // Mismatched sizes: nothing written.
  depot::dynamic_storage a{4, dtype::float32};
  a.fill_(3);
  const depot::dynamic_storage b{5, dtype::int64};
  CHECK_THROWS_AS(a.copy_(b), depot::invalid_argument);
  CHECK(contains(message_of([&] { a.copy_(b); }), "destination float32[4] on host:0, source int64[5] on host:0"));
  CHECK(a.to_vector<float>() == std::vector<float>(4, 3.0F));
  std::vector<float> three(3);
  CHECK_THROWS_AS(a.copy_to_host(std::span<float>{three}), depot::invalid_argument);
  CHECK_THROWS_AS(a.copy_from_host(std::span<const float>{three}), depot::invalid_argument);
  // Copying a storage into itself (or a handle sharing it) is allowed and changes nothing.
  auto same = a;
  a.copy_(same);
  CHECK(a.to_vector<float>() == std::vector<float>(4, 3.0F));
}

TEST_CASE("dynamic: copies and releases from several threads end at the right count")
{
  const auto base = depot::memory_allocated<depot::host>();
  {
    depot::dynamic_storage shared{1000, dtype::float64};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&shared] {
        for (int i = 0; i < 20000; ++i) {
          depot::dynamic_storage copy = shared;
          auto typed = copy.as<double>();
          (void)typed;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(shared.ref_count() == 1);
  }
  CHECK(depot::memory_allocated<depot::host>() == base);
}

TEST_CASE_TEMPLATE("dynamic: views alias, convert and copy across layouts and devices", D, DEPOT_TEST_DEVICES)
{
  if (depot::device_count<D>() == 0) return;
  const depot::device_id dev = depot::device_id::of<D>();
  std::vector<std::int32_t> values(24);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int32_t>(i);
  const depot::dynamic_view v{host_storage_of(values).to(dev), depot::layout::contiguous({4, 6})};
  CHECK(v.device() == dev);
  CHECK(v.dtype() == dtype::int32);
  // Transposed, read back in row-major order and converted.
  const auto t = v.transpose(0, 1).to_host_vector<double>();
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 4; ++c) CHECK(t[static_cast<std::size_t>(r * 4 + c)] == c * 6 + r);
  }
  // A strided fill is seen through the base view; a clone is independent.
  auto clone = v.clone();
  v.slice(1, 0, 6, 2).fill_(-1);  // v[:, ::2] = -1
  const auto after = v.to_host_vector<std::int32_t>();
  CHECK(after[0] == -1);
  CHECK(after[1] == 1);
  CHECK(after[22] == -1);
  CHECK(clone.to_host_vector<std::int32_t>() == values);
  // Into another dtype and layout, across devices: a host float64 source into the
  // transposed device view as int16.
  auto dst = depot::dynamic_view::empty({6, 4}, dtype::int16, dev);
  std::vector<double> src_values(24);
  for (std::size_t i = 0; i < 24; ++i) src_values[i] = static_cast<double>(i) + 0.75;
  const depot::dynamic_view src{host_storage_of(src_values), depot::layout::contiguous({4, 6})};
  dst.transpose(0, 1).copy_(src);  // dst[c, r] = int16(src[r, c])
  const auto d = dst.to_host_vector<std::int32_t>();
  CHECK(d[static_cast<std::size_t>(5 * 4 + 3)] == 3 * 6 + 5);  // dst[5, 3] = src[3, 5] = 23.75 -> 23
  CHECK(d[1] == 6);
  // Overlapping views of one storage: as if the source were read first.
  auto rows = depot::dynamic_view{host_storage_of(values).to(dev), depot::layout::contiguous({4, 6})};
  rows.slice(0, 1, 4).copy_(rows.slice(0, 0, 3));  // rows[1:] = rows[:3]
  const auto shifted = rows.to_host_vector<std::int32_t>();
  CHECK(shifted[6] == 0);
  CHECK(shifted[23] == 17);
  // reshape copies when it must; view refuses then.
  CHECK_THROWS_AS((void)v.transpose(0, 1).view({24}), depot::invalid_argument);
  const auto flat = v.transpose(0, 1).reshape({24});
  CHECK(flat.is_contiguous());
  CHECK(flat.to_host_vector<std::int32_t>()[1] == v.to_host_vector<std::int32_t>()[6]);
  CHECK(v.view({2, 12}).get_storage().data_ptr() == v.get_storage().data_ptr());
}

TEST_CASE("dynamic: views refuse bad shapes and layouts")
{
  const auto a = depot::dynamic_view::empty({3, 4}, dtype::float32);
  auto b = depot::dynamic_view::empty({4, 3}, dtype::float64);
  b.fill_(2);
  CHECK(contains(message_of([&] { b.copy_(a); }), "shapes differ: destination float64"));
  CHECK(b.to_host_vector<double>() == std::vector<double>(12, 2.0));  // untouched
  CHECK_THROWS_AS((depot::dynamic_view{a.get_storage(), depot::layout::contiguous({3, 5})}), depot::invalid_argument);
  CHECK(contains(message_of([&] { (void)depot::dynamic_view{a.get_storage(), depot::layout::contiguous({13})}; }),
                 "of a storage of 12 elements"));
  auto i8 = depot::dynamic_view::empty({2}, dtype::int8);
  CHECK_THROWS_AS(i8.fill_(128), depot::invalid_argument);
  CHECK_THROWS_AS((void)a.slice(0, 0, 3, 0), depot::invalid_argument);
}
