// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <array>
#include <cstddef>

namespace depot {

// The backend's interprocess handle of one device allocation (cudaIpcMemHandle_t /
// hipIpcMemHandle_t, both 64 opaque bytes), copied by value so that no public header
// includes a runtime header. It names the whole allocation: another process on the same
// machine opens it to reach the same memory, at the allocation's start.
struct ipc_memory_handle {
  static constexpr std::size_t size = 64;
  std::array<unsigned char, size> bytes{};
  friend bool operator==(const ipc_memory_handle&, const ipc_memory_handle&) = default;
};

}  // namespace depot
