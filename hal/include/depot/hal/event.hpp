// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/native_handle.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>

#include <utility>

namespace depot {

// An owning event of backend D on one device. record() marks a point in a stream;
// ready()/synchronize() observe it; elapsed_ms() times two recorded events (both created
// with timing = true). Move-only; destruction never throws. Not synchronised.
template <device D>
class event {
 public:
  explicit event(int device = 0, bool timing = false)
      : device_{device}, handle_{runtime<D>::create_event(device, timing)}
  {
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& other) noexcept
      : device_{other.device_}, handle_{std::exchange(other.handle_, nullptr)}
  {
  }
  event& operator=(event&& other) noexcept
  {
    if (this != &other) {
      reset();
      device_ = other.device_;
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~event() noexcept { reset(); }

  void record(stream_ref<D> s = {}) { runtime<D>::record_event(handle_, s.native()); }
  [[nodiscard]] bool ready() const { return runtime<D>::query_event(handle_); }
  void synchronize() const { runtime<D>::synchronize_event(handle_); }
  [[nodiscard]] native_event native() const noexcept { return handle_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  // Milliseconds between two recorded timing events (stop after start).
  [[nodiscard]] static float elapsed_ms(const event& start, const event& stop)
  {
    return runtime<D>::elapsed_ms(start.handle_, stop.handle_);
  }

 private:
  void reset() noexcept
  {
    if (handle_ != nullptr) runtime<D>::destroy_event(std::exchange(handle_, nullptr), device_);
  }

  int device_;
  native_event handle_;
};

}  // namespace depot
