// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <stdexcept>
#include <string>

namespace depot {

// A precondition on an argument was not met. Thrown before any state changes; the
// message names the argument, the value given and the valid range.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace depot
