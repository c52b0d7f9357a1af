// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/config.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/array_ref.hpp>
#include <depot/storage/dynamic_storage.hpp>
#include <depot/storage/element_kernels.hpp>

#include "on_device.hpp"

#include <cstdint>
#include <limits>
#include <string>

namespace depot {

namespace {

using detail::on_device;

template <device D>
void free_to_pool(detail::dynamic_control* c) noexcept
{
  // The buffer came from this pool, so its deallocate cannot refuse it.
  try {
    if constexpr (is_gpu_v<D>) {
      pool<D>(c->device.index).deallocate(c->memory, stream_ref<D>{});
    } else {
      pool<D>(c->device.index).deallocate(c->memory);
    }
  } catch (...) {
  }
}

template <device D>
detail::dynamic_control* allocate_on(std::size_t bytes, device_id id)
{
  auto& p = pool<D>(id.index);
  void* mem = p.allocate(bytes, stream_ref<D>{});
  try {
    return new detail::dynamic_control{{1}, &free_to_pool<D>, mem, nullptr, id};
  } catch (...) {
    if constexpr (is_gpu_v<D>) {
      p.deallocate(mem, stream_ref<D>{});
    } else {
      p.deallocate(mem);
    }
    throw;
  }
}

std::size_t checked_bytes(std::size_t n, dtype t)
{
  const std::size_t e = size_of(t);
  DEPOT_EXPECTS(e != 0, "depot::dynamic_storage: dtype value " + std::to_string(static_cast<int>(t)) +
                            " is not a dtype");
  DEPOT_EXPECTS(n <= std::numeric_limits<std::size_t>::max() / e &&
                    n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()),
                "depot::dynamic_storage: " + std::to_string(n) + " elements of " + std::string{to_string(t)} +
                    " (" + std::to_string(e) + " bytes each) overflow the address space");
  return n * e;
}

array_ref whole(void* data, dtype t, std::size_t n)
{
  return array_ref::vector(data, t, static_cast<std::int64_t>(n));
}

// Contiguous bytes between any two devices of this build (the GPU runtime reaches host
// memory and, with unified addressing, its other devices).
void copy_bytes(void* dst, device_id dst_dev, const void* src, device_id src_dev, std::size_t bytes)
{
  if (bytes == 0) return;
  const device_id gpu = dst_dev.kind != device_kind::host ? dst_dev : src_dev;
  on_device(gpu, [&](auto tag) {
    using D = typename decltype(tag)::type;
    runtime<D>::copy(dst, src, bytes);
  });
}

}  // namespace

dynamic_storage::dynamic_storage(std::size_t n, depot::dtype type, device_id device) : dtype_{type}, device_{device}
{
  const std::size_t bytes = checked_bytes(n, type);
  on_device(device, [&](auto tag) {
    using D = typename decltype(tag)::type;
    if (n == 0) return;
    ctrl_ = allocate_on<D>(bytes, device);
    data_ = ctrl_->memory;
    size_ = n;
  });
}

dynamic_storage::dynamic_storage(const dynamic_storage& other) noexcept
    : ctrl_{other.ctrl_}, data_{other.data_}, size_{other.size_}, dtype_{other.dtype_}, device_{other.device_}
{
  if (ctrl_ != nullptr) ctrl_->refs.fetch_add(1, std::memory_order_relaxed);
}

dynamic_storage::dynamic_storage(dynamic_storage&& other) noexcept
    : ctrl_{std::exchange(other.ctrl_, nullptr)},
      data_{std::exchange(other.data_, nullptr)},
      size_{std::exchange(other.size_, 0)},
      dtype_{other.dtype_},
      device_{other.device_}
{
}

dynamic_storage& dynamic_storage::operator=(dynamic_storage other) noexcept
{
  swap(other);
  return *this;
}

dynamic_storage::~dynamic_storage()
{
  if (ctrl_ != nullptr) drop(ctrl_);
}

void dynamic_storage::swap(dynamic_storage& other) noexcept
{
  std::swap(ctrl_, other.ctrl_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(dtype_, other.dtype_);
  std::swap(device_, other.device_);
}

void dynamic_storage::drop(detail::dynamic_control* c) noexcept
{
  if (c->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    c->release(c);
    delete c;
  }
}

dynamic_storage dynamic_storage::share() const
{
  DEPOT_EXPECTS(!is_external(), "depot::dynamic_storage::share(): the storage is external (not owned by "
                                "depot, nothing keeps it alive); use deep_copy()");
  return *this;
}

dynamic_storage dynamic_storage::deep_copy() const { return to(device_); }

dynamic_storage dynamic_storage::to(device_id device) const
{
  dynamic_storage out{size_, dtype_, device};
  copy_bytes(out.data_, device, data_, device_, nbytes());
  return out;
}

dynamic_storage& dynamic_storage::copy_(const dynamic_storage& src)
{
  DEPOT_EXPECTS(src.size_ == size_, "depot::dynamic_storage::copy_: sizes differ: destination " + to_string() +
                                        ", source " + src.to_string());
  if (size_ == 0 || (src.data_ == data_ && src.dtype_ == dtype_ && src.device_ == device_)) return *this;
  if (src.dtype_ == dtype_) {
    copy_bytes(data_, device_, src.data_, src.device_, nbytes());
    return *this;
  }
  if (src.device_ != device_) return copy_(src.to(device_));  // staged on this device, then converted
  on_device(device_, [&](auto tag) {
    using D = typename decltype(tag)::type;
    kernels::copy<D>(whole(data_, dtype_, size_), whole(src.data_, src.dtype_, size_), stream_ref<D>{});
    kernels::fence<D>(stream_ref<D>{});
  });
  return *this;
}

dynamic_storage& dynamic_storage::resize_(std::size_t n)
{
  if (n == size_) return *this;
  dynamic_storage next{n, dtype_, device_};
  const std::size_t keep = n < size_ ? n : size_;
  copy_bytes(next.data_, device_, data_, device_, keep * size_of(dtype_));
  swap(next);
  return *this;
}

dynamic_storage& dynamic_storage::fill_(scalar v)
{
  alignas(8) unsigned char element[8] = {};
  v.store(dtype_, element);  // refuses a value that does not fit before anything is written
  if (size_ == 0) return *this;
  on_device(device_, [&](auto tag) {
    using D = typename decltype(tag)::type;
    kernels::fill<D>(whole(data_, dtype_, size_), element, stream_ref<D>{});
    kernels::fence<D>(stream_ref<D>{});
  });
  return *this;
}

dynamic_storage& dynamic_storage::zero_()
{
  if (size_ == 0) return *this;
  on_device(device_, [&](auto tag) {
    using D = typename decltype(tag)::type;
    runtime<D>::set_async(data_, 0, nbytes(), nullptr);
    runtime<D>::synchronize_stream(nullptr);
  });
  return *this;
}

void dynamic_storage::check_as(depot::dtype want, device_kind kind) const
{
  DEPOT_EXPECTS(want == dtype_, "depot::dynamic_storage::as<" + std::string{depot::to_string(want)} +
                                    ">(): the storage holds " + std::string{depot::to_string(dtype_)} +
                                    " (" + to_string() + ")");
  DEPOT_EXPECTS(kind == device_.kind, "depot::dynamic_storage::as<T, " + std::string{depot::to_string(kind)} +
                                          ">(): the storage is on " + device_.to_string() +
                                          "; name its device kind");
}

std::string dynamic_storage::to_string() const
{
  return std::string{depot::to_string(dtype_)} + "[" + std::to_string(size_) + "] on " + device_.to_string();
}

}  // namespace depot
