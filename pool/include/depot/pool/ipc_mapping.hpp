// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_received.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace depot {

namespace detail {
// How a backend opens and closes what an ipc_handle names: a segment's backend handle, or
// pages given by file descriptors (expandable segments).
struct ipc_backend {
  void* (*open)(const ipc_memory_handle&, int device);
  void (*close)(void*, int device) noexcept;
  void* (*open_pages)(const int* fds, std::size_t count, std::size_t page, int device);
  void (*close_pages)(void*, std::size_t count, std::size_t page, int device) noexcept;
};
// The base in this process of what `h` names (its segment, or for a block of an expandable
// segment the pages it spans, taken from the exporter with pidfd_getfd), opened the first
// time and counted; ipc_detach closes it when the last mapping of it goes. A handle
// exported by this process maps to the memory itself (backends refuse to open their own).
// own_fds: the pages' descriptors already in this process (ipc_received; not closed here),
// used instead of taking them. Thread-safe. Both throw nothing but what opening throws.
void* ipc_attach(const ipc_handle& h, const ipc_backend& backend, const int* own_fds = nullptr);
void ipc_detach(const ipc_handle& h, const ipc_backend& backend) noexcept;
// Empty when this process may open `needed` more file descriptors under its RLIMIT_NOFILE
// soft limit (or cannot tell), else what is short and how to raise it: checked before a
// block's pages' descriptors are made (ipc_export) or taken (ipc_mapping).
std::string descriptor_shortage(std::size_t needed);
}  // namespace detail

// Another process's block, opened from its ipc_handle: get() is the block in this process,
// the same device memory (not a copy), until the mapping is destroyed. Move-only. Mappings
// of blocks of one segment share one backend mapping, counted process-wide, so opening the
// same handle twice is fine; while it is open, this process is counted in the exporter's
// importer counts (ordinary segments), so the exporter does not release the segment. It
// does not keep the block alive: the exporter must keep it
// allocated (and its stream's work on it ordered, e.g. by an event) while mappings use it.
// A handle of another backend or device index refuses with depot::invalid_argument; a
// backend without interprocess memory (the host) throws depot::error saying so.
template <device D>
class ipc_mapping {
 public:
  explicit ipc_mapping(const ipc_handle& h) : ipc_mapping{h, nullptr} {}
  // A handle received with its page descriptors (ipc_receive): a block of an expandable
  // segment is mapped from them, without taking the exporter's (no ptrace permission
  // needed). r keeps its descriptors (the mapping holds the memory).
  explicit ipc_mapping(const ipc_received& r) : ipc_mapping{r.handle, own_fds_of(r)} {}
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
  static void* open_pages(const int* fds, std::size_t count, std::size_t page, int device)
  {
    return runtime<D>::vm_import(fds, count, page, device);
  }
  static void close_pages(void* p, std::size_t count, std::size_t page, int device) noexcept
  {
    runtime<D>::vm_close_import(p, count, page, device);
  }
  static constexpr detail::ipc_backend k_backend{&open, &close, &open_pages, &close_pages};
  void reset() noexcept
  {
    if (base_ != nullptr) detail::ipc_detach(handle_, k_backend);
    base_ = nullptr;
  }

  static const int* own_fds_of(const ipc_received& r)
  {
    if (!r.handle.expandable()) return nullptr;
    DEPOT_EXPECTS(r.fds.size() == r.handle.fds.size(),
                  "depot: ipc_mapping of a received handle: it holds " + std::to_string(r.fds.size()) +
                      " descriptors, its block spans " + std::to_string(r.handle.fds.size()) + " pages");
    return r.fds.data();
  }
  ipc_mapping(const ipc_handle& h, const int* own_fds) : handle_{h}
  {
    DEPOT_EXPECTS(h.device.kind == D::kind,
                  "depot: ipc_mapping<" + std::string{to_string(D::kind)} + "> of a handle from " +
                      h.device.to_string() + ": open it with ipc_mapping<" +
                      std::string{to_string(h.device.kind)} + ">");
    runtime<D>::check_device(h.device.index);
    // A backend without interprocess memory says so before anything is taken from the exporter.
    if constexpr (!runtime<D>::has_ipc) (void)runtime<D>::ipc_open(h.memory, h.device.index);
    base_ = static_cast<unsigned char*>(detail::ipc_attach(h, k_backend, own_fds));
  }
  ipc_handle handle_;
  unsigned char* base_ = nullptr;
};

}  // namespace depot
