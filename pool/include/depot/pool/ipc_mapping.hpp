// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/ipc_handle.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace depot {

namespace detail {
// The base in this process of the segment of `h`, opened with `open` the first time and
// counted; ipc_detach closes it with `close` when the last mapping of it goes. A handle
// exported by this process maps to the segment itself (backends refuse to open their own).
// Thread-safe. Both throw nothing but what `open` throws.
void* ipc_attach(const ipc_handle& h, void* (*open)(const ipc_memory_handle&, int));
void ipc_detach(const ipc_handle& h, void (*close)(void*, int) noexcept) noexcept;
}  // namespace detail

// Another process's block, opened from its ipc_handle: get() is the block in this process,
// the same device memory (not a copy), until the mapping is destroyed. Move-only. Mappings
// of blocks of one segment share one backend mapping, counted process-wide, so opening the
// same handle twice is fine. It does not keep the block alive: the exporter must keep it
// allocated (and its stream's work on it ordered, e.g. by an event) while mappings use it.
// A handle of another backend or device index refuses with depot::invalid_argument; a
// backend without interprocess memory (the host) throws depot::error saying so.
template <device D>
class ipc_mapping {
 public:
  explicit ipc_mapping(const ipc_handle& h) : handle_{h}
  {
    DEPOT_EXPECTS(h.device.kind == D::kind,
                  "depot: ipc_mapping<" + std::string{to_string(D::kind)} + "> of a handle from " +
                      h.device.to_string() + ": open it with ipc_mapping<" +
                      std::string{to_string(h.device.kind)} + ">");
    runtime<D>::check_device(h.device.index);
    base_ = static_cast<unsigned char*>(detail::ipc_attach(h, &open));
  }
  ipc_mapping(ipc_mapping&& o) noexcept : handle_{o.handle_}, base_{std::exchange(o.base_, nullptr)} {}
  ipc_mapping& operator=(ipc_mapping&& o) noexcept
  {
    if (this != &o) {
      reset();
      handle_ = o.handle_;
      base_ = std::exchange(o.base_, nullptr);
    }
    return *this;
  }
  ipc_mapping(const ipc_mapping&) = delete;
  ipc_mapping& operator=(const ipc_mapping&) = delete;
  ~ipc_mapping() { reset(); }

  [[nodiscard]] void* get() const noexcept { return base_ != nullptr ? base_ + handle_.offset : nullptr; }
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(handle_.size); }
  [[nodiscard]] std::size_t requested() const noexcept { return static_cast<std::size_t>(handle_.requested); }
  [[nodiscard]] const ipc_handle& handle() const noexcept { return handle_; }

 private:
  static void* open(const ipc_memory_handle& m, int device) { return runtime<D>::ipc_open(m, device); }
  static void close(void* p, int device) noexcept { runtime<D>::ipc_close(p, device); }
  void reset() noexcept
  {
    if (base_ != nullptr) detail::ipc_detach(handle_, &close);
    base_ = nullptr;
  }

  ipc_handle handle_;
  unsigned char* base_ = nullptr;
};

}  // namespace depot
