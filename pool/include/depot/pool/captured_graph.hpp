// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/native_handle.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/caching_allocator.hpp>

#include <cstdint>
#include <utility>

namespace depot {

// Work captured on one stream into a graph (CUDA / HIP graphs) and replayed, with the caching
// allocator's capture pool that holds what the work allocated while captured, so a replay
// never finds that memory reused (caching_allocator::begin_capture). Destruction or reset()
// destroys the graph and gives back its use of the pool. One owner, move-only, not
// thread-safe; the allocator must outlive it. The host backend has no graphs:
// capture_begin throws depot::error "not_supported" there.
template <device D>
class captured_graph {
 public:
  captured_graph() = default;
  captured_graph(const captured_graph&) = delete;
  captured_graph& operator=(const captured_graph&) = delete;
  captured_graph(captured_graph&& o) noexcept
      : alloc_{std::exchange(o.alloc_, nullptr)}, stream_{o.stream_}, pool_{std::exchange(o.pool_, 0)},
        graph_{std::exchange(o.graph_, nullptr)}, capturing_{std::exchange(o.capturing_, false)}
  {
  }
  captured_graph& operator=(captured_graph&& o) noexcept
  {
    if (this != &o) {
      reset();
      alloc_ = std::exchange(o.alloc_, nullptr);
      stream_ = o.stream_;
      pool_ = std::exchange(o.pool_, 0);
      graph_ = std::exchange(o.graph_, nullptr);
      capturing_ = std::exchange(o.capturing_, false);
    }
    return *this;
  }
  ~captured_graph() { reset(); }

  // Starts capturing the work queued on `stream` (the backend's global capture mode), its
  // allocations from `pool` (0: a new pool; another graph's pool() to share its memory,
  // for graphs replayed one after another in capture order).
  void capture_begin(caching_allocator<D>& allocator, stream_ref<D> stream, std::uint64_t pool = 0)
  {
    DEPOT_EXPECTS(alloc_ == nullptr,
                  "depot: captured_graph::capture_begin on a graph that holds a capture already (reset() first)");
    const std::uint64_t p = allocator.begin_capture(stream, pool);
    try {
      runtime<D>::begin_capture(stream.native());
    } catch (...) {
      allocator.end_capture(stream);
      allocator.release_capture_pool(p);
      throw;
    }
    alloc_ = &allocator;
    stream_ = stream.native();
    pool_ = p;
    capturing_ = true;
  }
  // Ends the capture and makes the graph; depot::error when the backend invalidated the
  // capture (an unsafe call during it), the graph then empty and its pool still held.
  void capture_end()
  {
    DEPOT_EXPECTS(capturing_, "depot: captured_graph::capture_end without a capture under way (capture_begin first)");
    capturing_ = false;
    native_graph g = nullptr;
    try {
      g = runtime<D>::end_capture(stream_);
    } catch (...) {
      alloc_->end_capture(stream_ref<D>{stream_});
      throw;
    }
    alloc_->end_capture(stream_ref<D>{stream_});
    graph_ = g;
  }
  // Runs the captured work on `stream`.
  void replay(stream_ref<D> stream) const
  {
    DEPOT_EXPECTS(graph_ != nullptr, "depot: captured_graph::replay of a graph not captured (capture_end first)");
    runtime<D>::launch_graph(graph_, stream.native());
  }
  // The capture pool (0: none), to share with another graph's capture_begin.
  [[nodiscard]] std::uint64_t pool() const noexcept { return pool_; }
  [[nodiscard]] bool captured() const noexcept { return graph_ != nullptr; }
  // Destroys the graph (ending a capture under way) and gives back its use of the pool,
  // which waits for the device's work when it is the pool's last.
  void reset() noexcept
  {
    if (alloc_ == nullptr) return;
    if (capturing_) {
      try {
        runtime<D>::destroy_graph(runtime<D>::end_capture(stream_));
      } catch (...) {
      }
      try {
        alloc_->end_capture(stream_ref<D>{stream_});
      } catch (...) {
      }
      capturing_ = false;
    }
    runtime<D>::destroy_graph(std::exchange(graph_, nullptr));
    try {
      alloc_->release_capture_pool(pool_);
    } catch (...) {  // the device failed: the pool stays held
    }
    alloc_ = nullptr;
    pool_ = 0;
  }

 private:
  caching_allocator<D>* alloc_ = nullptr;
  native_stream stream_ = nullptr;
  std::uint64_t pool_ = 0;
  native_graph graph_ = nullptr;
  bool capturing_ = false;
};

}  // namespace depot
