// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/host_storage.hpp>
#include <depot/storage/layout.hpp>
#include <depot/storage/storage.hpp>
#include <depot/storage/strided_view.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// Two device buffers of one shape that overlap host->device copies with compute: the consumer
// reads current() on its stream while prefetch_next() copies the next batch (through pinned
// staging from pinned_pool<D>) into the other buffer on a copy stream. Ordering is by events
// only: a copy into a buffer waits for the consumer's work queued on it before the last swap();
// swap() makes the consumer's stream wait for the copy; nothing synchronises the device.
// One thread at a time; the consumer stream must outlive this object. Not copyable or movable.
template <class T, device D>
class double_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "double_buffer holds trivially copyable elements");

 public:
  using value_type = T;

  // Buffers of `shape` (at least one element) on `device`, read in the order of `consumer`.
  double_buffer(layout::extents shape, stream_ref<D> consumer = {}, int device = 0)
      : device_{checked_device(device)},
        copy_{device},
        consumer_{consumer},
        copied_{event<D>{device}, event<D>{device}},
        released_{event<D>{device}, event<D>{device}}
  {
    const layout l = layout::contiguous(shape);
    DEPOT_EXPECTS(l.numel() > 0, "depot::double_buffer: the shape " + l.to_string() +
                                     " has no elements; each buffer needs at least one");
    layout_ = l;
    n_ = static_cast<std::size_t>(l.numel());
    DEPOT_EXPECTS(n_ <= std::numeric_limits<std::size_t>::max() / sizeof(T),
                  "depot::double_buffer: " + std::to_string(n_) + " elements of " +
                      std::to_string(sizeof(T)) + " bytes overflow size_t");
    buffers_[0] = make_buffer();
    buffers_[1] = make_buffer();
    auto& pinned = pinned_pool<D>(device_);
    // Staging is written by the host: keyed to the default stream, never to the copy stream,
    // so the pool hands it to nobody else while a copy out of it may still run.
    staging_[0] = static_cast<T*>(pinned.allocate(bytes(), stream_ref<D>{}));
    try {
      staging_[1] = static_cast<T*>(pinned.allocate(bytes(), stream_ref<D>{}));
    } catch (...) {
      pinned.deallocate(staging_[0]);
      throw;
    }
  }
  double_buffer(std::initializer_list<std::int64_t> shape, stream_ref<D> consumer = {}, int device = 0)
      : double_buffer(layout::extents{shape.begin(), shape.size()}, consumer, device)
  {
  }

  double_buffer(const double_buffer&) = delete;
  double_buffer& operator=(const double_buffer&) = delete;
  double_buffer(double_buffer&&) = delete;
  double_buffer& operator=(double_buffer&&) = delete;

  // Staging goes back to the pinned pool in the order of the copy stream (reused only once
  // the last copies from it are done); the buffers in the order of the consumer's stream.
  ~double_buffer()
  {
    auto& pinned = pinned_pool<D>(device_);
    for (T* s : staging_) {
      try {
        pinned.deallocate(s, copy_.ref());
      } catch (...) {  // a block of this pool: cannot be refused; nothing to report at teardown
      }
    }
  }

  // The buffer the consumer reads, as a contiguous view of the shape; valid in the order of
  // the consumer stream after the first swap(). Throws depot::invalid_argument before that.
  [[nodiscard]] strided_view<T, D> current() const
  {
    DEPOT_EXPECTS(has_current_, "depot::double_buffer::current: no batch has been swapped in yet; "
                                "call prefetch_next() and then swap() first");
    return {buffers_[cur_], layout_};
  }

  // Starts the copy of host_data (exactly size() elements, any host memory) into the buffer
  // that is not current. Returns once host_data has been read into pinned staging; blocks
  // only until the copy out of the same staging buffer two steps earlier has finished.
  void prefetch_next(std::span<const T> host_data)
  {
    check_batch("prefetch_next", host_data);
    prefetch_next_with([&](std::span<T> staging) {
      std::memcpy(staging.data(), host_data.data(), bytes());
    });
  }

  // Starts the copy of host_data (exactly size() elements of page-locked memory, e.g. from
  // pinned_pool<D>, so the copy engine reads it directly: no staging copy on the host) into
  // the buffer that is not current, and returns at once. The copy reads host_data in the
  // background: change or free it only after the prefetch_next*() two calls later has
  // returned (it waits for this copy), or after copy_stream() is synchronised. Pageable
  // host_data is refused (depot::invalid_argument: use prefetch_next). On the host backend
  // any memory is accepted (its copies are synchronous).
  void prefetch_next_async(std::span<const T> host_data)
  {
    check_batch("prefetch_next_async", host_data);
    if constexpr (is_gpu_v<D>) {
      DEPOT_EXPECTS(runtime<D>::is_pinned(host_data.data()),
                    "depot::double_buffer::prefetch_next_async: host_data is not page-locked memory; "
                    "use prefetch_next (staged) or memory from depot::pinned_pool");
    }
    DEPOT_EXPECTS(!pending_, "depot::double_buffer::prefetch_next: a prefetch is already pending; "
                             "call swap() before the next prefetch_next()");
    const std::size_t b = 1 - cur_;
    if (copied_recorded_[b]) copied_[b].synchronize();  // the copy two steps ago has read its source
    if (released_recorded_[b]) copy_.wait(released_[b]);  // the consumer is done reading b
    runtime<D>::copy_async(data_of(b), host_data.data(), bytes(), copy_.native());
    copied_[b].record(copy_.ref());
    copied_recorded_[b] = true;
    pending_ = true;
  }

  // As prefetch_next, but fill(std::span<T>) writes the next batch straight into the pinned
  // staging buffer (no extra host copy). If fill throws, nothing is queued.
  template <class F>
    requires std::invocable<F&, std::span<T>>
  void prefetch_next_with(F&& fill)
  {
    DEPOT_EXPECTS(!pending_, "depot::double_buffer::prefetch_next: a prefetch is already pending; "
                             "call swap() before the next prefetch_next()");
    const std::size_t b = 1 - cur_;
    if (copied_recorded_[b]) copied_[b].synchronize();  // staging[b] is free to overwrite
    fill(std::span<T>{staging_[b], n_});
    if (released_recorded_[b]) copy_.wait(released_[b]);  // the consumer is done reading b
    runtime<D>::copy_async(data_of(b), staging_[b], bytes(), copy_.native());
    copied_[b].record(copy_.ref());
    copied_recorded_[b] = true;
    pending_ = true;
  }

  // Makes the prefetched buffer current: the consumer's work queued so far on the old current
  // buffer is marked (a later copy into it waits for that work), and the consumer stream
  // waits for the copy. Requires a pending prefetch_next().
  void swap()
  {
    DEPOT_EXPECTS(pending_, "depot::double_buffer::swap: nothing was prefetched since the last "
                            "swap(); call prefetch_next() first");
    const std::size_t next = 1 - cur_;
    runtime<D>::wait_event(consumer_.native(), copied_[next].native());
    if (has_current_) {
      released_[cur_].record(consumer_);
      released_recorded_[cur_] = true;
    }
    cur_ = next;
    has_current_ = true;
    pending_ = false;
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return n_ * sizeof(T); }
  [[nodiscard]] layout::extents shape() const noexcept { return layout_.shape(); }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] bool has_pending() const noexcept { return pending_; }
  [[nodiscard]] stream_ref<D> copy_stream() const noexcept { return copy_.ref(); }
  [[nodiscard]] stream_ref<D> consumer_stream() const noexcept { return consumer_; }

 private:
  // A host batch for prefetch_next*(): exactly size() elements, not null.
  void check_batch(const char* call, std::span<const T> host_data) const
  {
    DEPOT_EXPECTS(host_data.size() == n_, std::string{"depot::double_buffer::"} + call + ": host_data has " +
                                              std::to_string(host_data.size()) + " elements, the buffers hold " +
                                              std::to_string(n_) + " (" + layout_.to_string() + ")");
    DEPOT_EXPECTS(host_data.data() != nullptr, std::string{"depot::double_buffer::"} + call + ": null host_data");
  }

  static int checked_device(int device)
  {
    runtime<D>::check_device(device);
    return device;
  }

  // Device memory from pool<D>, first used on the copy stream; its release waits for the
  // consumer stream too.
  storage<T, D> make_buffer()
  {
    if constexpr (std::is_same_v<D, host>) {
      return storage<T, D>{host_storage<T>(n_)};
    } else {
      device_storage<T, D> s{n_, device_, copy_.ref()};
      s.record_use(consumer_);
      return storage<T, D>{std::move(s)};
    }
  }

  T* data_of(std::size_t b) const noexcept { return buffers_[b].impl().data(); }

  int device_;
  stream<D> copy_;  // declared before the buffers: it outlives their release
  stream_ref<D> consumer_;
  layout layout_;
  std::size_t n_ = 0;
  std::array<event<D>, 2> copied_;    // the last copy into buffer b (out of staging b)
  std::array<event<D>, 2> released_;  // the consumer's last use of buffer b
  std::array<bool, 2> copied_recorded_{false, false};
  std::array<bool, 2> released_recorded_{false, false};
  std::array<storage<T, D>, 2> buffers_;
  std::array<T*, 2> staging_{nullptr, nullptr};
  std::size_t cur_ = 0;
  bool has_current_ = false;
  bool pending_ = false;
};

}  // namespace depot
