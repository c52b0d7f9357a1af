// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/native_handle.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/hal/stream_registry.hpp>

#include <utility>

namespace depot {

// An owning stream of backend D on one device: created in the constructor, destroyed in
// the destructor (never throws; work already queued still completes). Move-only. Not
// synchronised: share it between threads through stream_ref, not by mutating one object.
// Registered in stream_registry while it lives, so caching allocators order memory cached
// for it after its last work by an event, not a device synchronisation.
template <device D>
class stream {
 public:
  explicit stream(int device = 0) : device_{device}, handle_{runtime<D>::create_stream(device)}
  {
    try {
      stream_registry::opened(device_id::of<D>(device_), handle_);
    } catch (...) {
      runtime<D>::destroy_stream(handle_, device_);
      throw;
    }
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream(stream&& other) noexcept
      : device_{other.device_}, handle_{std::exchange(other.handle_, nullptr)}
  {
  }
  stream& operator=(stream&& other) noexcept
  {
    if (this != &other) {
      reset();
      device_ = other.device_;
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~stream() noexcept { reset(); }

  [[nodiscard]] stream_ref<D> ref() const noexcept { return stream_ref<D>{handle_}; }
  operator stream_ref<D>() const noexcept { return ref(); }  // NOLINT: implicit by design
  [[nodiscard]] native_stream native() const noexcept { return handle_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  void synchronize() const { runtime<D>::synchronize_stream(handle_); }
  [[nodiscard]] bool ready() const { return runtime<D>::query_stream(handle_); }
  // Work queued on this stream after the call waits for `e` (without blocking the host).
  void wait(const event<D>& e) const { runtime<D>::wait_event(handle_, e.native()); }

 private:
  void reset() noexcept
  {
    if (handle_ == nullptr) return;
    stream_registry::closing(device_id::of<D>(device_), handle_);
    runtime<D>::destroy_stream(std::exchange(handle_, nullptr), device_);
  }

  int device_;
  native_stream handle_;
};

}  // namespace depot
