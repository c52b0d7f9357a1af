// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>
#include <depot/storage/bfloat16.hpp>
#include <depot/storage/float16.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace depot {

// The element types depot stores, known at run time (the type-erased layer, DLPack, ops'
// dispatch). Each has one C++ type (dtype_type_t) and a fixed size; names are NumPy's.
enum class dtype : std::uint8_t {
  bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64,
};

inline constexpr std::array all_dtypes{dtype::bool_,  dtype::int8,    dtype::int16,    dtype::int32,  dtype::int64,
                                       dtype::uint8,  dtype::uint16,  dtype::uint32,   dtype::uint64, dtype::float16,
                                       dtype::bfloat16, dtype::float32, dtype::float64};

namespace detail {
template <dtype> struct dtype_type;
template <> struct dtype_type<dtype::bool_> { using type = bool; };
template <> struct dtype_type<dtype::int8> { using type = std::int8_t; };
template <> struct dtype_type<dtype::int16> { using type = std::int16_t; };
template <> struct dtype_type<dtype::int32> { using type = std::int32_t; };
template <> struct dtype_type<dtype::int64> { using type = std::int64_t; };
template <> struct dtype_type<dtype::uint8> { using type = std::uint8_t; };
template <> struct dtype_type<dtype::uint16> { using type = std::uint16_t; };
template <> struct dtype_type<dtype::uint32> { using type = std::uint32_t; };
template <> struct dtype_type<dtype::uint64> { using type = std::uint64_t; };
template <> struct dtype_type<dtype::float16> { using type = depot::float16; };
template <> struct dtype_type<dtype::bfloat16> { using type = depot::bfloat16; };
template <> struct dtype_type<dtype::float32> { using type = float; };
template <> struct dtype_type<dtype::float64> { using type = double; };

template <class T> inline constexpr bool always_false = false;
}  // namespace detail

// The C++ type of a dtype.
template <dtype T>
using dtype_type_t = typename detail::dtype_type<T>::type;

// The dtype of a C++ type (a compile error for types depot does not store).
template <class T>
[[nodiscard]] consteval dtype dtype_of()
{
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return dtype::bool_;
  else if constexpr (std::is_same_v<U, std::int8_t>) return dtype::int8;
  else if constexpr (std::is_same_v<U, std::int16_t>) return dtype::int16;
  else if constexpr (std::is_same_v<U, std::int32_t>) return dtype::int32;
  else if constexpr (std::is_same_v<U, std::int64_t> || (std::is_same_v<U, long long> && sizeof(long long) == 8)) return dtype::int64;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return dtype::uint8;
  else if constexpr (std::is_same_v<U, std::uint16_t>) return dtype::uint16;
  else if constexpr (std::is_same_v<U, std::uint32_t>) return dtype::uint32;
  else if constexpr (std::is_same_v<U, std::uint64_t> || (std::is_same_v<U, unsigned long long> && sizeof(unsigned long long) == 8)) return dtype::uint64;
  else if constexpr (std::is_same_v<U, depot::float16>) return dtype::float16;
  else if constexpr (std::is_same_v<U, depot::bfloat16>) return dtype::bfloat16;
  else if constexpr (std::is_same_v<U, float>) return dtype::float32;
  else if constexpr (std::is_same_v<U, double>) return dtype::float64;
  else static_assert(detail::always_false<T>, "depot: no dtype for this element type");
}

template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>();

[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept
{
  switch (t) {
    case dtype::bool_: case dtype::int8: case dtype::uint8: return 1;
    case dtype::int16: case dtype::uint16: case dtype::float16: case dtype::bfloat16: return 2;
    case dtype::int32: case dtype::uint32: case dtype::float32: return 4;
    case dtype::int64: case dtype::uint64: case dtype::float64: return 8;
  }
  return 0;
}

[[nodiscard]] constexpr std::string_view to_string(dtype t) noexcept
{
  switch (t) {
    case dtype::bool_: return "bool";
    case dtype::int8: return "int8";
    case dtype::int16: return "int16";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::uint8: return "uint8";
    case dtype::uint16: return "uint16";
    case dtype::uint32: return "uint32";
    case dtype::uint64: return "uint64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
  }
  return "unknown";
}

[[nodiscard]] constexpr bool is_floating_point(dtype t) noexcept
{
  return t == dtype::float16 || t == dtype::bfloat16 || t == dtype::float32 || t == dtype::float64;
}
[[nodiscard]] constexpr bool is_integral(dtype t) noexcept { return t != dtype::bool_ && !is_floating_point(t); }

// The dtype named `name` ("float32", "int64", "bool", ...); depot::invalid_argument listing
// the valid names otherwise.
[[nodiscard]] inline dtype dtype_from_string(std::string_view name)
{
  for (dtype t : all_dtypes) {
    if (to_string(t) == name) return t;
  }
  std::string valid;
  for (dtype t : all_dtypes) valid += (valid.empty() ? "" : ", ") + std::string{to_string(t)};
  throw invalid_argument("depot: unknown dtype \"" + std::string{name} + "\" (valid: " + valid + ")");
}

// Calls f(tag) with tag's ::type the C++ type of t; returns what f returns.
template <class T>
struct type_tag {
  using type = T;
};
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f)
{
  switch (t) {
    case dtype::bool_: return f(type_tag<bool>{});
    case dtype::int8: return f(type_tag<std::int8_t>{});
    case dtype::int16: return f(type_tag<std::int16_t>{});
    case dtype::int32: return f(type_tag<std::int32_t>{});
    case dtype::int64: return f(type_tag<std::int64_t>{});
    case dtype::uint8: return f(type_tag<std::uint8_t>{});
    case dtype::uint16: return f(type_tag<std::uint16_t>{});
    case dtype::uint32: return f(type_tag<std::uint32_t>{});
    case dtype::uint64: return f(type_tag<std::uint64_t>{});
    case dtype::float16: return f(type_tag<depot::float16>{});
    case dtype::bfloat16: return f(type_tag<depot::bfloat16>{});
    case dtype::float32: return f(type_tag<float>{});
    case dtype::float64: return f(type_tag<double>{});
  }
  throw invalid_argument("depot: dtype value " + std::to_string(static_cast<int>(t)) + " is not a dtype");
}

}  // namespace depot
