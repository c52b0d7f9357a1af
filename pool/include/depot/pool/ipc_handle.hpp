// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/ipc_memory_handle.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace depot {

// A live block of a caching_allocator, made openable by other processes on the same machine
// (caching_allocator::ipc_export; opened with depot::ipc_mapping): the device, the exporting
// process, where the block lies, and how to reach its memory: the backend handle of the
// block's segment and where importers count themselves (the exporter's descriptor of its
// importer-count file and the segment's slot in it: the exporter releases an exported
// segment only while no other process has it mapped), or, for a block of an expandable
// segment, the exporter's file descriptor of each page the block spans (`page` bytes each;
// the importer takes them with pidfd_getfd). Plain data. to_hex() is a text that from_hex()
// turns back into the handle, refusing any other text with depot::invalid_argument, so a
// handle can travel through a pipe, a file, an environment variable or an MPI message as a
// string: hex_length (242) characters for an ordinary segment's block,
// expandable_hex_length(pages) for the other.
struct ipc_handle {
  device_id device;
  std::uint64_t process = 0;    // the exporter's process id
  std::uint64_t segment = 0;    // the segment's address in the exporter (expandable: the first page's)
  std::uint64_t offset = 0;     // the block's offset from `segment`
  std::uint64_t size = 0;       // bytes the block spans (its rounded size)
  std::uint64_t requested = 0;  // bytes the exporter asked for
  ipc_memory_handle memory;     // the segment's backend handle (ordinary segments)
  std::int32_t counter_fd = -1;   // ordinary segments: the exporter's descriptor of its importer counts
  std::uint32_t counter_slot = 0;  // and the segment's slot (8 bytes) in that file
  std::uint64_t page = 0;       // expandable segments: the page size; 0 for an ordinary segment
  std::vector<std::int32_t> fds;  // expandable segments: the exporter's descriptor of each page

  static constexpr std::size_t hex_length = 242;
  [[nodiscard]] static constexpr std::size_t expandable_hex_length(std::size_t pages) noexcept
  {
    return 2 * (4 + 1 + 4 + 6 * 8 + 4 + 4 * pages);
  }
  [[nodiscard]] bool expandable() const noexcept { return page != 0; }
  [[nodiscard]] std::string to_hex() const;
  [[nodiscard]] static ipc_handle from_hex(std::string_view text);

  friend bool operator==(const ipc_handle&, const ipc_handle&) = default;
};

}  // namespace depot
