// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/host_device.hpp>

#include <cstdint>
#include <cstring>

namespace depot {

// bfloat16 (the upper half of an IEEE binary32), stored as its 16 bits. From float rounds
// to nearest even and keeps NaN a NaN; to float is exact. Plain C++, usable on host and
// device. A trivially copyable value type of 2 bytes.
struct bfloat16 {
  std::uint16_t bits;  // no initialiser: the type stays trivial (value-initialise for zero)

  bfloat16() = default;
  DEPOT_HOST_DEVICE() explicit bfloat16(float f) : bits{from_float(f)} {}
  DEPOT_HOST_DEVICE() explicit operator float() const { return to_float(bits); }

  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept
  {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }

  DEPOT_HOST_DEVICE() static std::uint16_t from_float(float f)
  {
    std::uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t round = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<std::uint16_t>((x + round) >> 16);
  }
  DEPOT_HOST_DEVICE() static float to_float(std::uint16_t b)
  {
    const std::uint32_t x = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }
};

static_assert(sizeof(bfloat16) == 2);

}  // namespace depot
