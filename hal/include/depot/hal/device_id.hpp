// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/device_kind.hpp>

#include <compare>
#include <string>
#include <string_view>

namespace depot {

// A device chosen at run time: a backend kind and an index within it ("cuda:1").
// A plain value type; parsing validates the kind and the index syntax, not whether the
// device exists (the runtime checks that when the device is used).
struct device_id {
  device_kind kind = device_kind::host;
  int index = 0;

  template <device D>
  [[nodiscard]] static constexpr device_id of(int index = 0) noexcept
  {
    return device_id{D::kind, index};
  }

  // Parses "host", "cpu", "cuda", "cuda:1", "hip:0". Throws depot::invalid_argument.
  [[nodiscard]] static device_id parse(std::string_view text);

  [[nodiscard]] std::string to_string() const;

  friend constexpr auto operator<=>(const device_id&, const device_id&) = default;
};

}  // namespace depot
