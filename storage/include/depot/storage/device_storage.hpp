// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/pool.hpp>

#include <atomic>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// A contiguous buffer of T in the memory of one device of backend D, taken from
// pool<D>(device) in the order of a stream, or adopted from elsewhere (a DLPack tensor)
// with a release callback. Copies share the buffer (an atomic count); the last handle
// returns it to the pool on the stream it was last used on (the allocation stream, or the
// one given to record_use()), or calls the release callback. deep_copy() enqueues a device
// copy. The count is thread-safe; the elements and the stream bookkeeping are not
// synchronised.
template <class T, device D>
class device_storage {
  static_assert(std::is_trivially_copyable_v<T>, "device_storage holds trivially copyable elements");

 public:
  using value_type = T;

  device_storage() noexcept = default;

  // n elements, uninitialised, usable on `stream` in stream order.
  explicit device_storage(std::size_t n, int device = 0, stream_ref<D> stream = {})
  {
    DEPOT_EXPECTS(n <= std::numeric_limits<std::size_t>::max() / sizeof(T),
                  "depot::device_storage: " + std::to_string(n) + " elements of " +
                      std::to_string(sizeof(T)) + " bytes overflow size_t");
    if (n == 0) return;
    auto& p = pool<D>(device);
    void* mem = p.allocate(n * sizeof(T), stream);
    try {
      ctrl_ = new control{{1}, device, stream.native(), mem, nullptr, nullptr};
    } catch (...) {
      p.deallocate(mem, stream);
      throw;
    }
    data_ = static_cast<T*>(mem);
    size_ = n;
  }

  // Adopts n elements at ptr on `device`: counted; release(context, ptr) runs once, when
  // the last handle goes (it must not throw). Tracked even when n == 0.
  using release_fn = void (*)(void* context, void* ptr) noexcept;
  device_storage(T* ptr, std::size_t n, int device, release_fn release, void* context)
  {
    runtime<D>::check_device(device);
    DEPOT_EXPECTS(ptr != nullptr || n == 0, "depot::device_storage: null pointer with " +
                                                std::to_string(n) + " elements");
    DEPOT_EXPECTS(release != nullptr, "depot::device_storage: adopted memory needs a release function");
    ctrl_ = new control{{1}, device, nullptr, ptr, release, context};
    data_ = ptr;
    size_ = n;
  }

  device_storage(const device_storage& other) noexcept
      : data_{other.data_}, size_{other.size_}, ctrl_{other.ctrl_}
  {
    if (ctrl_ != nullptr) ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  device_storage(device_storage&& other) noexcept
      : data_{std::exchange(other.data_, nullptr)},
        size_{std::exchange(other.size_, 0)},
        ctrl_{std::exchange(other.ctrl_, nullptr)}
  {
  }
  device_storage& operator=(device_storage other) noexcept
  {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(ctrl_, other.ctrl_);
    return *this;
  }
  ~device_storage() { release(); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] int device() const noexcept { return ctrl_ == nullptr ? 0 : ctrl_->device; }
  [[nodiscard]] stream_ref<D> stream() const noexcept
  {
    return stream_ref<D>{ctrl_ == nullptr ? nullptr : ctrl_->last_stream};
  }
  [[nodiscard]] bool is_refcounted() const noexcept { return ctrl_ != nullptr; }
  [[nodiscard]] std::size_t ref_count() const noexcept
  {
    return ctrl_ == nullptr ? 0 : ctrl_->refs.load(std::memory_order_acquire);
  }
  [[nodiscard]] device_storage share() const noexcept { return *this; }

  // Work on `s` uses the buffer: its release waits for that work (see record_stream).
  void record_use(stream_ref<D> s)
  {
    if (ctrl_ == nullptr || s.native() == ctrl_->last_stream) return;
    if (ctrl_->release == nullptr) pool<D>(ctrl_->device).record_stream(ctrl_->memory, s);
    ctrl_->last_stream = s.native();
  }

  // A new buffer on the same device with the same contents, copied in the order of `s`.
  [[nodiscard]] device_storage deep_copy(stream_ref<D> s) const
  {
    device_storage out{size_, device(), s};
    if (size_ > 0) runtime<D>::copy_async(out.data_, data_, size_ * sizeof(T), s.native());
    return out;
  }
  [[nodiscard]] device_storage deep_copy() const { return deep_copy(stream()); }

  // Host <-> device copies of the whole buffer in the order of `s` (asynchronous).
  void copy_from_host(const T* src, stream_ref<D> s)
  {
    DEPOT_EXPECTS(src != nullptr || size_ == 0, "depot::device_storage::copy_from_host: null source");
    runtime<D>::copy_async(data_, src, size_ * sizeof(T), s.native());
  }
  void copy_to_host(T* dst, stream_ref<D> s) const
  {
    DEPOT_EXPECTS(dst != nullptr || size_ == 0, "depot::device_storage::copy_to_host: null destination");
    runtime<D>::copy_async(dst, data_, size_ * sizeof(T), s.native());
  }

 private:
  struct control {
    std::atomic<std::size_t> refs;
    int device;
    native_stream last_stream;
    void* memory;
    release_fn release;  // nullptr: memory from pool<D>
    void* context;
  };

  void release() noexcept
  {
    // A pool buffer came from this pool, so its deallocate cannot refuse it.
    if (ctrl_ != nullptr && ctrl_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (ctrl_->release != nullptr) {
        ctrl_->release(ctrl_->context, ctrl_->memory);
      } else {
        try {
          pool<D>(ctrl_->device).deallocate(ctrl_->memory, stream_ref<D>{ctrl_->last_stream});
        } catch (...) {
        }
      }
      delete ctrl_;
    }
    data_ = nullptr;
    size_ = 0;
    ctrl_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  control* ctrl_ = nullptr;
};

}  // namespace depot
