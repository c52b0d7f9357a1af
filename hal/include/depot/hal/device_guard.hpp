// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>

namespace depot {

// Makes `device` the calling thread's current device of backend D for the guard's
// lifetime and restores the previous one on destruction (which never throws). Not movable:
// it belongs to one scope on one thread.
template <device D>
class device_guard {
 public:
  explicit device_guard(int device) : previous_{runtime<D>::current_device()}
  {
    runtime<D>::set_device(device);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  // Restoring a device that was valid at construction cannot fail in a way a caller could
  // handle during unwinding, so errors are swallowed here.
  ~device_guard() noexcept
  {
    try {
      runtime<D>::set_device(previous_);
    } catch (...) {
    }
  }

  [[nodiscard]] int previous() const noexcept { return previous_; }

 private:
  int previous_;
};

}  // namespace depot
