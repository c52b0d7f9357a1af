// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/ipc_memory_handle.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace depot {

// A live block of a caching_allocator, made openable by other processes on the same machine
// (caching_allocator::ipc_export; opened with depot::ipc_mapping): the device, the exporting
// process, the backend handle of the block's segment and where the block lies in it. Plain
// data. to_hex() is a fixed-length text (226 characters) that from_hex() turns back into the
// handle, refusing any other text with depot::invalid_argument, so a handle can travel
// through a pipe, a file, an environment variable or an MPI message as a string.
struct ipc_handle {
  device_id device;
  std::uint64_t process = 0;    // the exporter's process id
  std::uint64_t segment = 0;    // the segment's address in the exporter
  std::uint64_t offset = 0;     // the block's offset in its segment
  std::uint64_t size = 0;       // bytes the block spans (its rounded size)
  std::uint64_t requested = 0;  // bytes the exporter asked for
  ipc_memory_handle memory;     // the segment's backend handle

  static constexpr std::size_t hex_length = 226;
  [[nodiscard]] std::string to_hex() const;
  [[nodiscard]] static ipc_handle from_hex(std::string_view text);

  friend bool operator==(const ipc_handle&, const ipc_handle&) = default;
};

}  // namespace depot
