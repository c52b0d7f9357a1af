// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/device_id.hpp>
#include <depot/hal/expects.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/scalar.hpp>
#include <depot/storage/storage.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace depot {

namespace detail {
// The state every handle on one dynamic_storage buffer shares: the count, and how the
// buffer goes back when the last handle does (to its pool, or by dropping a typed handle).
struct dynamic_control {
  std::atomic<std::size_t> refs;
  void (*release)(dynamic_control*) noexcept;
  void* memory;
  void* context;
  device_id device;
};
}  // namespace detail

// Contiguous elements of a dtype chosen at run time on a device chosen at run time (the
// host, or a CUDA/HIP device when this build has that backend): the type-erased layer for
// code that decides at run time. Memory comes from pool<D>(index) on the default stream.
// Copies share the buffer through an atomic count (as storage<T, D> does); share() is a
// copy, deep_copy() a new buffer. Element operations (to, copy_, fill_, zero_, resize_,
// copy_to_host) run ops' kernels on the device that holds the data and return when done.
// The count is thread-safe; the elements are not synchronised.
class dynamic_storage {
 public:
  // No elements: float32 on the host, nothing tracked.
  dynamic_storage() noexcept = default;

  // n uninitialised elements of `type` on `device`. depot::invalid_argument for a device
  // this build lacks or an index out of range, and for n * size_of(type) beyond size_t;
  // depot::out_of_memory when the device cannot hold them.
  dynamic_storage(std::size_t n, depot::dtype type, device_id device = {});

  // Shares the buffer of a typed storage (keeps a handle on it until the last dynamic
  // handle goes). An external host storage stays external: not counted, and its owner
  // keeps it alive.
  template <class T, depot::device D>
  explicit dynamic_storage(storage<T, D> typed);

  dynamic_storage(const dynamic_storage& other) noexcept;
  dynamic_storage(dynamic_storage&& other) noexcept;
  dynamic_storage& operator=(dynamic_storage other) noexcept;
  ~dynamic_storage();
  void swap(dynamic_storage& other) noexcept;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] depot::dtype dtype() const noexcept { return dtype_; }
  [[nodiscard]] device_id device() const noexcept { return device_; }
  [[nodiscard]] std::size_t nbytes() const noexcept { return size_ * size_of(dtype_); }
  // The first element, in the memory of device() (null when empty).
  [[nodiscard]] void* data_ptr() const noexcept { return data_; }
  [[nodiscard]] bool is_refcounted() const noexcept { return ctrl_ != nullptr; }
  [[nodiscard]] bool is_external() const noexcept { return ctrl_ == nullptr && data_ != nullptr; }
  // Handles (and as<T>() storages) sharing the buffer; 0 when not tracked.
  [[nodiscard]] std::size_t ref_count() const noexcept
  {
    return ctrl_ == nullptr ? 0 : ctrl_->refs.load(std::memory_order_acquire);
  }
  // A new handle on the same buffer; depot::invalid_argument on external storage.
  [[nodiscard]] dynamic_storage share() const;
  // A new buffer on the same device with the same dtype and elements (count 1).
  [[nodiscard]] dynamic_storage deep_copy() const;

  // A new storage on `device` holding the same dtype and elements (host <-> GPU, GPU <->
  // GPU); a deep copy when `device` is this storage's device.
  [[nodiscard]] dynamic_storage to(device_id device) const;

  // this = src elementwise: any dtype into this dtype (static_cast; float16/bfloat16 through
  // float; bool as != 0), on any device (a source on another device is first staged, in its
  // own dtype, in a contiguous buffer on this device). depot::invalid_argument, with
  // nothing written, when the sizes differ.
  dynamic_storage& copy_(const dynamic_storage& src);

  // n elements: the first min(size(), n) keep their values, the rest are uninitialised.
  // Always a new buffer (unless n == size(), which changes nothing): this handle moves to
  // it, while other handles and as<T>() storages that shared the old buffer keep the old
  // buffer and its values. On failure (depot::invalid_argument when n * size_of(dtype())
  // overflows, depot::out_of_memory) nothing changes.
  dynamic_storage& resize_(std::size_t n);

  // Every element = v converted to dtype(): static_cast rules (as PyTorch's fill_ casts:
  // 2.7 fills an int32 storage with 2, anything non-zero fills bool with true), but a value
  // the dtype cannot hold is refused with depot::invalid_argument before anything is
  // written (300 into int8, -1 into uint8, NaN into int32, 1e6 into float16); see scalar.
  dynamic_storage& fill_(scalar v);
  // Every element = 0 (all bits zero, which is 0 / +0.0 / false in every dtype).
  dynamic_storage& zero_();

  // A typed storage<T, D> of the same bytes (it shares the buffer: counted, and keeps it
  // alive). depot::invalid_argument when T is not this dtype or D not this device's kind.
  template <class T, depot::device D = host>
  [[nodiscard]] storage<T, D> as() const;

  // Host <-> storage copies with conversion: dst/src hold size() elements of any dtype's
  // C++ type; depot::invalid_argument when the sizes differ.
  template <class T>
  void copy_to_host(std::span<T> dst) const;
  template <class T>
  void copy_from_host(std::span<const T> src);
  // The elements converted to T, on the host (for bool, use copy_to_host with a bool[]).
  template <class T>
  [[nodiscard]] std::vector<T> to_vector() const
  {
    static_assert(!std::is_same_v<T, bool>, "std::vector<bool> has no data(): use copy_to_host(std::span<bool>)");
    std::vector<T> out(size_);
    copy_to_host(std::span<T>{out});
    return out;
  }

  // "float32[12] on cuda:0"
  [[nodiscard]] std::string to_string() const;

 private:
  template <class T, depot::device D>
  static void release_typed(detail::dynamic_control* c) noexcept
  {
    delete static_cast<storage<T, D>*>(c->context);  // the typed handle returns its buffer
  }
  static void drop(detail::dynamic_control* c) noexcept;
  void check_as(depot::dtype want, device_kind kind) const;

  detail::dynamic_control* ctrl_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  depot::dtype dtype_ = depot::dtype::float32;
  device_id device_{};
};

template <class T, depot::device D>
dynamic_storage::dynamic_storage(storage<T, D> typed) : size_{typed.size()}, dtype_{dtype_of_v<T>}
{
  static_assert(!std::is_const_v<T>, "dynamic_storage holds mutable elements");
  if constexpr (is_gpu_v<D>) {
    data_ = typed.device_ptr();
    device_ = device_id{D::kind, typed.impl().device()};
  } else {
    data_ = typed.host_ptr();
  }
  if (!typed.impl().is_refcounted()) return;  // empty, or external host memory
  auto handle = std::make_unique<storage<T, D>>(std::move(typed));
  ctrl_ = new detail::dynamic_control{{1}, &release_typed<T, D>, data_, handle.get(), device_};
  handle.release();  // NOLINT(bugprone-unused-return-value): owned by ctrl_ now
}

template <class T, depot::device D>
storage<T, D> dynamic_storage::as() const
{
  check_as(dtype_of_v<T>, D::kind);
  auto* first = static_cast<T*>(data_);
  if (ctrl_ == nullptr) {
    if constexpr (std::is_same_v<D, host>) {
      return storage<T, D>{host_storage<T>{first, size_}};  // external stays external
    } else {
      return storage<T, D>{};
    }
  }
  ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
  auto release = [](void* context, void*) noexcept { drop(static_cast<detail::dynamic_control*>(context)); };
  try {
    if constexpr (is_gpu_v<D>) {
      return storage<T, D>{device_storage<T, D>{first, size_, device_.index, release, ctrl_}};
    } else {
      return storage<T, D>{host_storage<T>{first, size_, release, ctrl_}};
    }
  } catch (...) {
    drop(ctrl_);
    throw;
  }
}

template <class T>
void dynamic_storage::copy_to_host(std::span<T> dst) const
{
  DEPOT_EXPECTS(dst.size() == size_, "depot::dynamic_storage::copy_to_host: the destination holds " +
                                         std::to_string(dst.size()) + " elements, the storage " + to_string());
  dynamic_storage host_side{storage<T, host>{host_storage<T>{dst.data(), dst.size()}}};
  host_side.copy_(*this);
}

template <class T>
void dynamic_storage::copy_from_host(std::span<const T> src)
{
  DEPOT_EXPECTS(src.size() == size_, "depot::dynamic_storage::copy_from_host: the source holds " +
                                         std::to_string(src.size()) + " elements, the storage " + to_string());
  // The kernels read the source only; the external view never writes through this cast.
  auto* p = const_cast<T*>(src.data());  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  copy_(dynamic_storage{storage<T, host>{host_storage<T>{p, src.size()}}});
}

}  // namespace depot
