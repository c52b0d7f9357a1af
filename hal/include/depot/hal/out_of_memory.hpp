// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>

#include <cstddef>
#include <new>
#include <string>

namespace depot {

// An allocation could not be satisfied. A std::bad_alloc, so generic handlers catch it;
// carries the requested size and the device, and what() explains the device's state.
class out_of_memory : public std::bad_alloc {
 public:
  out_of_memory(std::string message, std::size_t requested_bytes, device_id device);

  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_bytes_; }
  [[nodiscard]] device_id device() const noexcept { return device_; }

 private:
  std::string message_;
  std::size_t requested_bytes_;
  device_id device_;
};

}  // namespace depot
