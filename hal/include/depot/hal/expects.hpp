// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/invalid_argument.hpp>

#include <string>
#include <string_view>

namespace depot::detail {

// Out of line so that the check itself stays a compare and a branch.
[[noreturn]] void throw_invalid_argument(std::string_view message, const char* file, int line);

}  // namespace depot::detail

// DEPOT_EXPECTS(condition, message): throws depot::invalid_argument with `message` (any
// expression convertible to std::string_view, evaluated only on failure) and the location.
#define DEPOT_EXPECTS(condition, message)                                        \
  do {                                                                           \
    if (!(condition)) [[unlikely]] {                                             \
      ::depot::detail::throw_invalid_argument((message), __FILE__, __LINE__);    \
    }                                                                            \
  } while (false)
