// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/host_device.hpp>

#include <cstdint>
#include <cstring>

namespace depot {

// IEEE 754 binary16, stored as its 16 bits. Converts to and from float exactly as the
// hardware does (round to nearest even; overflow to infinity; NaN stays NaN), in plain C++
// usable on host and device, so every backend and compiler gives the same bits.
// A trivially copyable value type of 2 bytes.
struct float16 {
  std::uint16_t bits;  // no initialiser: the type stays trivial (value-initialise for zero)

  float16() = default;
  DEPOT_HOST_DEVICE() explicit float16(float f) : bits{from_float(f)} {}
  DEPOT_HOST_DEVICE() explicit operator float() const { return to_float(bits); }

  [[nodiscard]] static constexpr float16 from_bits(std::uint16_t b) noexcept
  {
    float16 h;
    h.bits = b;
    return h;
  }
  friend constexpr bool operator==(float16 a, float16 b) noexcept { return a.bits == b.bits; }

  DEPOT_HOST_DEVICE() static std::uint16_t from_float(float f)
  {
    std::uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (abs < 0x38800000u) {  // subnormal or zero in half
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
      const std::uint32_t exp = abs >> 23;
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - exp;  // 14..24
      const std::uint32_t half = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t mid = 1u << (shift - 1u);
      const std::uint32_t round = (rem > mid || (rem == mid && (half & 1u))) ? 1u : 0u;
      return static_cast<std::uint16_t>(sign | (half + round));
    }
    const std::uint32_t rebased = abs - 0x38000000u;  // exponent 127 -> 15
    const std::uint32_t half = rebased >> 13;
    const std::uint32_t rem = rebased & 0x1fffu;
    const std::uint32_t round = (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (half + round));
  }

  DEPOT_HOST_DEVICE() static float to_float(std::uint16_t h)
  {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    std::uint32_t x;
    if (exp == 0x1fu) {
      x = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      x = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      std::uint32_t e = 113u;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      x = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }
};

static_assert(sizeof(float16) == 2);

}  // namespace depot
