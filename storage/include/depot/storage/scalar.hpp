// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/invalid_argument.hpp>
#include <depot/storage/bfloat16.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/float16.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// One number whose element type is chosen at run time (what dynamic_storage::fill_ takes):
// kept exactly as a bool, an int64, a uint64 or a double. A plain value type. to<T>() and
// store() convert it as static_cast does (a float truncates toward zero into an integer;
// float16/bfloat16 are reached through float, as ops' copy does), but refuse with
// depot::invalid_argument what static_cast would silently get wrong: an integer outside
// the target's range, NaN or infinity into an integer, a finite value that overflows a
// floating-point type. Anything goes into bool (non-zero is true, NaN included).
class scalar {
 public:
  enum class kind : std::uint8_t { boolean, signed_integer, unsigned_integer, floating_point };

  template <class V>
    requires std::is_arithmetic_v<V>
  constexpr scalar(V v) noexcept  // NOLINT(google-explicit-constructor): numbers convert
  {
    if constexpr (std::is_same_v<V, bool>) {
      kind_ = kind::boolean;
      i_ = v ? 1 : 0;
    } else if constexpr (std::is_floating_point_v<V>) {
      kind_ = kind::floating_point;
      d_ = static_cast<double>(v);
    } else if constexpr (std::is_signed_v<V>) {
      kind_ = kind::signed_integer;
      i_ = static_cast<std::int64_t>(v);
    } else {
      kind_ = kind::unsigned_integer;
      u_ = static_cast<std::uint64_t>(v);
    }
  }
  scalar(float16 v) noexcept : scalar(static_cast<float>(v)) {}   // NOLINT(google-explicit-constructor)
  scalar(bfloat16 v) noexcept : scalar(static_cast<float>(v)) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] constexpr kind type() const noexcept { return kind_; }

  // The value as a T (any dtype's C++ type), checked as described above.
  template <class T>
  [[nodiscard]] T to() const
  {
    if constexpr (std::is_same_v<T, bool>) {
      switch (kind_) {
        case kind::boolean:
        case kind::signed_integer: return i_ != 0;
        case kind::unsigned_integer: return u_ != 0;
        case kind::floating_point: return d_ != 0.0;
      }
      return false;
    } else if constexpr (std::is_integral_v<T>) {
      switch (kind_) {
        case kind::boolean: return static_cast<T>(i_);
        case kind::signed_integer:
          if (!std::in_range<T>(i_)) out_of_range(dtype_of_v<T>);
          return static_cast<T>(i_);
        case kind::unsigned_integer:
          if (!std::in_range<T>(u_)) out_of_range(dtype_of_v<T>);
          return static_cast<T>(u_);
        case kind::floating_point: {
          if (!std::isfinite(d_)) out_of_range(dtype_of_v<T>);
          const double t = std::trunc(d_);
          // [lowest, max] of T, as exact doubles: -2^digits (or 0) and 2^digits (exclusive).
          const double upper = std::ldexp(1.0, std::numeric_limits<T>::digits);
          const double lower = std::is_signed_v<T> ? -upper : 0.0;
          if (!(t >= lower && t < upper)) out_of_range(dtype_of_v<T>);
          return static_cast<T>(t);
        }
      }
      return T{};
    } else {
      // float and double directly; float16 and bfloat16 through float.
      using via = std::conditional_t<std::is_same_v<T, double>, double, float>;
      via v{};
      bool finite = true;
      switch (kind_) {
        case kind::boolean:
        case kind::signed_integer: v = static_cast<via>(i_); break;
        case kind::unsigned_integer: v = static_cast<via>(u_); break;
        case kind::floating_point:
          finite = std::isfinite(d_);
          v = static_cast<via>(d_);
          break;
      }
      const T out = static_cast<T>(v);
      if (finite && std::isinf(static_cast<double>(static_cast<via>(out)))) out_of_range(dtype_of_v<T>);
      return out;
    }
  }

  // Writes the value as one element of `t` (size_of(t) bytes at `out`).
  void store(dtype t, void* out) const
  {
    visit_dtype(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = to<T>();
      std::memcpy(out, &v, sizeof v);
    });
  }

  // "true", "-3", "18446744073709551615", "0.10000000000000001"
  [[nodiscard]] std::string to_string() const
  {
    switch (kind_) {
      case kind::boolean: return i_ != 0 ? "true" : "false";
      case kind::signed_integer: return std::to_string(i_);
      case kind::unsigned_integer: return std::to_string(u_);
      case kind::floating_point: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", d_);
        return buf;
      }
    }
    return "?";
  }

 private:
  [[noreturn]] void out_of_range(dtype t) const
  {
    std::string range;
    visit_dtype(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T>) {
        range = "the range of " + std::string{depot::to_string(t)} + " is [" +
                std::to_string(std::numeric_limits<T>::lowest()) + ", " +
                std::to_string(std::numeric_limits<T>::max()) + "]";
      } else {
        range = "it overflows to infinity in " + std::string{depot::to_string(t)};
      }
    });
    if (kind_ == kind::floating_point && !std::isfinite(d_)) {
      throw invalid_argument("depot: the value " + to_string() + " cannot be stored as " +
                             std::string{depot::to_string(t)} + ": an integer type has no NaN or infinity");
    }
    throw invalid_argument("depot: the value " + to_string() + " cannot be stored as " +
                           std::string{depot::to_string(t)} + " without overflow: " + range);
  }

  kind kind_ = kind::signed_integer;
  std::int64_t i_ = 0;
  std::uint64_t u_ = 0;
  double d_ = 0.0;
};

}  // namespace depot
