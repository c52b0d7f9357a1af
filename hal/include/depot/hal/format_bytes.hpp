// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>
#include <string>

namespace depot {

// "1.50 GiB", "512 B": binary units, three significant figures. For messages and reports.
[[nodiscard]] std::string format_bytes(std::size_t bytes);

}  // namespace depot
