// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>

namespace depot {

// Free and total memory of one device, in bytes, as the backend reports them now.
struct memory_info {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

}  // namespace depot
