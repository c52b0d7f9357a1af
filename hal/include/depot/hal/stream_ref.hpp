// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/native_handle.hpp>
#include <depot/hal/runtime.hpp>

#include <compare>

namespace depot {

// A non-owning reference to a stream of backend D: what allocate/copy functions take.
// Default-constructed, it is the backend's default stream. Trivially copyable; the caller
// keeps the stream alive while work is queued on it.
template <device D>
class stream_ref {
 public:
  constexpr stream_ref() noexcept = default;
  constexpr explicit stream_ref(native_stream handle) noexcept : handle_{handle} {}

  [[nodiscard]] constexpr native_stream native() const noexcept { return handle_; }
  [[nodiscard]] constexpr bool is_default() const noexcept { return handle_ == nullptr; }
  // The per-thread default stream's handle (0x2): each thread that uses it means its own.
  [[nodiscard]] bool is_per_thread() const noexcept { return is_per_thread_stream(handle_); }
  // One of the backend's built-in streams (null, legacy, per-thread), never destroyed.
  [[nodiscard]] bool is_built_in() const noexcept { return is_built_in_stream(handle_); }

  void synchronize() const { runtime<D>::synchronize_stream(handle_); }
  [[nodiscard]] bool ready() const { return runtime<D>::query_stream(handle_); }

  friend constexpr auto operator<=>(stream_ref, stream_ref) = default;

 private:
  native_stream handle_ = nullptr;
};

}  // namespace depot
