// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>
#include <string_view>

namespace depot {

// The family of a backend. Values are stable: they appear in traces and snapshots.
enum class device_kind : std::uint8_t { host = 0, cuda = 1, hip = 2 };

[[nodiscard]] constexpr std::string_view to_string(device_kind kind) noexcept
{
  switch (kind) {
    case device_kind::host: return "host";
    case device_kind::cuda: return "cuda";
    case device_kind::hip: return "hip";
  }
  return "unknown";
}

}  // namespace depot
