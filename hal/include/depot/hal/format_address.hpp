// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>
#include <string>

namespace depot {

// "0x7f3a2c000000": an address (a pointer, a stream, a handle) as lower-case hex with a 0x
// prefix, the same on every platform (unlike printf's %p). For messages and reports.
[[nodiscard]] std::string format_address(std::uintptr_t address);
[[nodiscard]] inline std::string format_address(const volatile void* p)
{
  return format_address(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace depot
