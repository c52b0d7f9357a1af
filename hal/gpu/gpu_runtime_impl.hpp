// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The GPU backend, written once. Included after a backend's name table (cuda_api.hpp or
// hip_api.hpp) by that backend's one .cpp file, which instantiates gpu_runtime<Api>.

#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/gpu/gpu_runtime.hpp>
#include <depot/hal/out_of_memory.hpp>

#include <fcntl.h>

#include <atomic>
#include <cstring>
#include <string>

namespace depot::hal::detail {

// Out of line and cold: builds the message, clears the backend's per-thread error state.
template <class Api>
[[noreturn, gnu::cold, gnu::noinline]] void throw_gpu_error(typename Api::error_t status,
                                                          const char* call, const char* file,
                                                          int line)
{
  (void)Api::get_last_error();
  std::string what = std::string{"depot: "} + Api::name + " call `" + call + "` failed at " +
                     file + ":" + std::to_string(line) + ": " + Api::error_name(status) + " (" +
                     std::to_string(static_cast<int>(status)) + "): " + Api::error_string(status);
  throw depot::error(what, call, file, line, static_cast<int>(status), Api::error_name(status));
}

}  // namespace depot::hal::detail

// DEPOT_GPU_TRY(call): runs a backend call of the current `Api`; on failure throws
// depot::error naming the call, the place and the backend's error.
#define DEPOT_GPU_TRY(call)                                                                 \
  do {                                                                                      \
    if (auto depot_gpu_status = (call); depot_gpu_status != Api::success) [[unlikely]] {    \
      ::depot::hal::detail::throw_gpu_error<Api>(depot_gpu_status, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (false)

namespace depot::hal {

namespace detail {

// This thread's stream capture mode relaxed for one scope, then restored: an allocation
// (cudaMalloc, cudaMallocHost) may then be made while a graph is captured in global mode
// (allocations are not captured; a caching allocator keeps such memory for the graph, as
// PyTorch's does).
template <class Api>
class relaxed_capture {
 public:
  relaxed_capture() noexcept { (void)Api::exchange_capture_mode(&mode_); }
  ~relaxed_capture() { (void)Api::exchange_capture_mode(&mode_); }
  relaxed_capture(const relaxed_capture&) = delete;
  relaxed_capture& operator=(const relaxed_capture&) = delete;

 private:
  typename Api::capture_mode_t mode_ = Api::capture_relaxed;
};

// Makes `device` current for one scope when it is not already; restores the previous one.
template <class Api>
class scoped_device {
 public:
  explicit scoped_device(int device)
  {
    DEPOT_GPU_TRY(Api::get_device(&previous_));
    if (previous_ != device) {
      DEPOT_GPU_TRY(Api::set_device(device));
      changed_ = true;
    }
  }
  scoped_device(const scoped_device&) = delete;
  scoped_device& operator=(const scoped_device&) = delete;
  // Restores a device that was current a moment ago; nothing useful to report on failure.
  ~scoped_device() noexcept
  {
    if (changed_ && Api::set_device(previous_) != Api::success) (void)Api::get_last_error();
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

template <class Api>
typename Api::stream_t to_native(native_stream s) noexcept
{
  return static_cast<typename Api::stream_t>(s);
}

template <class Api>
typename Api::event_t to_native_event(native_event e) noexcept
{
  return static_cast<typename Api::event_t>(e);
}

// "X free of Y" for an out-of-memory message (the current device), or "free/total unknown".
template <class Api>
std::string device_state()
{
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (Api::mem_get_info(&free_bytes, &total_bytes) == Api::success) {
    return format_bytes(free_bytes) + " free of " + format_bytes(total_bytes);
  }
  (void)Api::get_last_error();
  return "free/total unknown";
}

// The virtual-memory calls are the driver's (CUDA), which act in the calling thread's
// current context: a thread that never made a runtime call on the device has none. A free
// of nothing binds the device's primary context to the thread, as any runtime call does.
template <class Api>
void bind_context() noexcept
{
  if (Api::free(nullptr) != Api::success) (void)Api::get_last_error();
}

// Runs `release` (a free or unmap, which has no caller to report to: it must not throw in
// teardown) with `device` current, then restores the previous device; failures of any of
// the three calls are cleared from the error state, never thrown.
template <class Api, class F>
void release_on(int device, F release) noexcept
{
  int previous = 0;
  const bool switch_device = Api::get_device(&previous) == Api::success && previous != device;
  if (switch_device && Api::set_device(device) != Api::success) (void)Api::get_last_error();
  if (release() != Api::success) (void)Api::get_last_error();
  if (switch_device && Api::set_device(previous) != Api::success) (void)Api::get_last_error();
}

}  // namespace detail

template <class Api>
int gpu_runtime<Api>::device_count() noexcept
{
  // A machine without a driver or a device has 0 devices, not an error.
  static const int count = [] {
    int n = 0;
    if (Api::get_device_count(&n) != Api::success) {
      (void)Api::get_last_error();
      return 0;
    }
    return n;
  }();
  return count;
}

template <class Api>
void gpu_runtime<Api>::check_device(int device)
{
  const int count = device_count();
  DEPOT_EXPECTS(device >= 0 && device < count,
                std::string{"depot: "} + Api::name + " device index " + std::to_string(device) +
                    " is out of range: this machine has " + std::to_string(count) + " " +
                    Api::name + " device(s), valid indices are [0, " + std::to_string(count) + ")");
}

template <class Api>
int gpu_runtime<Api>::current_device()
{
  int device = 0;
  DEPOT_GPU_TRY(Api::get_device(&device));
  return device;
}

template <class Api>
void gpu_runtime<Api>::set_device(int device)
{
  check_device(device);
  DEPOT_GPU_TRY(Api::set_device(device));
}

template <class Api>
device_properties gpu_runtime<Api>::properties(int device)
{
  check_device(device);
  typename Api::properties_t p{};
  DEPOT_GPU_TRY(Api::get_properties(&p, device));
  int clock_khz = 0;
  int bus_bits = 0;
  DEPOT_GPU_TRY(Api::get_attribute(&clock_khz, Api::memory_clock_khz, device));
  DEPOT_GPU_TRY(Api::get_attribute(&bus_bits, Api::memory_bus_bits, device));
  device_properties out;
  out.id = device_id{Api::kind, device};
  out.name = p.name;
  out.arch = Api::arch_name(p);
  out.compute_major = p.major;
  out.compute_minor = p.minor;
  out.multiprocessors = p.multiProcessorCount;
  out.total_memory = p.totalGlobalMem;
  out.l2_cache_bytes = static_cast<std::size_t>(p.l2CacheSize);
  // Double data rate: two transfers per memory clock, bus width in bits.
  out.memory_bandwidth_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  return out;
}

template <class Api>
memory_info gpu_runtime<Api>::memory(int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  memory_info info;
  DEPOT_GPU_TRY(Api::mem_get_info(&info.free_bytes, &info.total_bytes));
  return info;
}

template <class Api>
void* gpu_runtime<Api>::allocate(std::size_t bytes, int device)
{
  check_device(device);
  if (bytes == 0) return nullptr;
  detail::scoped_device<Api> on{device};
  void* ptr = nullptr;
  const auto status = [&] {
    const detail::relaxed_capture<Api> relaxed;
    return Api::malloc(&ptr, bytes);
  }();
  if (status == Api::memory_allocation) {
    (void)Api::get_last_error();
    const std::string state = detail::device_state<Api>();
    const device_id id{Api::kind, device};
    throw out_of_memory("depot: " + id.to_string() + " out of memory: requested " +
                            format_bytes(bytes) + " (" + std::to_string(bytes) +
                            " bytes); the device has " + state,
                        bytes, id);
  }
  DEPOT_GPU_TRY(status);
  return ptr;
}

template <class Api>
void gpu_runtime<Api>::deallocate(void* ptr, int device) noexcept
{
  // A free that fails leaves nothing for the caller to do; it must not throw in teardown.
  if (ptr == nullptr) return;
  detail::release_on<Api>(device, [ptr] { return Api::free(ptr); });
}

template <class Api>
void* gpu_runtime<Api>::allocate_async(std::size_t bytes, int device, native_stream stream)
{
  check_device(device);
  if (bytes == 0) return nullptr;
  detail::scoped_device<Api> on{device};
  void* ptr = nullptr;
  const auto status = Api::malloc_async(&ptr, bytes, detail::to_native<Api>(stream));
  if (status == Api::memory_allocation) {
    (void)Api::get_last_error();
    const device_id id{Api::kind, device};
    throw out_of_memory("depot: " + id.to_string() + " stream-ordered allocation of " +
                            format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes) failed",
                        bytes, id);
  }
  DEPOT_GPU_TRY(status);
  return ptr;
}

template <class Api>
void gpu_runtime<Api>::deallocate_async(void* ptr, int device, native_stream stream) noexcept
{
  // As deallocate: a release has no one to report a failure to.
  (void)device;
  if (ptr != nullptr && Api::free_async(ptr, detail::to_native<Api>(stream)) != Api::success)
    (void)Api::get_last_error();
}

template <class Api>
void gpu_runtime<Api>::set_async_release_threshold(int device, std::size_t bytes)
{
  check_device(device);
  DEPOT_GPU_TRY(Api::set_release_threshold(device, static_cast<unsigned long long>(bytes)));
}

template <class Api>
void* gpu_runtime<Api>::allocate_pinned(std::size_t bytes)
{
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  const auto status = [&] {
    const detail::relaxed_capture<Api> relaxed;
    return Api::malloc_host(&ptr, bytes);
  }();
  if (status == Api::memory_allocation) {
    (void)Api::get_last_error();
    const device_id id{device_kind::host, 0};
    throw out_of_memory("depot: " + std::string{Api::name} +
                            " pinned host allocation failed: requested " + format_bytes(bytes) +
                            " (" + std::to_string(bytes) + " bytes)",
                        bytes, id);
  }
  DEPOT_GPU_TRY(status);
  return ptr;
}

template <class Api>
void gpu_runtime<Api>::deallocate_pinned(void* ptr) noexcept
{
  // As deallocate: nothing to report to a caller that is releasing memory.
  if (ptr != nullptr && Api::free_host(ptr) != Api::success) (void)Api::get_last_error();
}

template <class Api>
bool gpu_runtime<Api>::is_pinned(const void* ptr) noexcept
{
  return ptr != nullptr && Api::is_page_locked(ptr);
}

template <class Api>
bool gpu_runtime<Api>::supports_managed_memory(int device)
{
  check_device(device);
  int value = 0;
  DEPOT_GPU_TRY(Api::get_attribute(&value, Api::managed_memory, device));
  return value != 0;
}

template <class Api>
bool gpu_runtime<Api>::concurrent_managed_access(int device)
{
  check_device(device);
  int value = 0;
  DEPOT_GPU_TRY(Api::get_attribute(&value, Api::concurrent_managed_access, device));
  return value != 0;
}

template <class Api>
void* gpu_runtime<Api>::allocate_managed(std::size_t bytes, int device)
{
  const device_id id{Api::kind, device};
  DEPOT_EXPECTS(supports_managed_memory(device),
                "depot: " + id.to_string() + " cannot allocate managed (unified) memory");
  if (bytes == 0) return nullptr;
  detail::scoped_device<Api> on{device};
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  DEPOT_GPU_TRY(Api::mem_get_info(&free_bytes, &total_bytes));
  // Managed memory may oversubscribe the device and evict silently; depot never asks for
  // more than is free now.
  const auto refuse = [&] {
    throw out_of_memory("depot: " + id.to_string() + " managed allocation of " + format_bytes(bytes) +
                            " (" + std::to_string(bytes) + " bytes) refused: the device has " +
                            format_bytes(free_bytes) + " (" + std::to_string(free_bytes) + " bytes) free of " +
                            format_bytes(total_bytes),
                        bytes, id);
  };
  if (bytes > free_bytes) refuse();
  void* ptr = nullptr;
  const auto status = Api::malloc_managed(&ptr, bytes);
  if (status == Api::memory_allocation) {
    (void)Api::get_last_error();
    refuse();
  }
  DEPOT_GPU_TRY(status);
  return ptr;
}

template <class Api>
void gpu_runtime<Api>::deallocate_managed(void* ptr, int device) noexcept
{
  // As deallocate: the free path has no one to report a failure to.
  deallocate(ptr, device);
}

template <class Api>
void gpu_runtime<Api>::prefetch_managed(const void* ptr, std::size_t bytes, int device, native_stream stream)
{
  if (device != -1) check_device(device);  // -1: the host
  if (bytes == 0) return;
  DEPOT_EXPECTS(ptr != nullptr, "depot: prefetch of " + std::to_string(bytes) + " bytes with a null pointer");
  DEPOT_GPU_TRY(Api::prefetch(ptr, bytes, device, detail::to_native<Api>(stream)));
}

template <class Api>
void gpu_runtime<Api>::copy(void* dst, const void* src, std::size_t bytes)
{
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr && src != nullptr,
                "depot: copy of " + std::to_string(bytes) + " bytes with a null pointer");
  DEPOT_GPU_TRY(Api::memcpy(dst, src, bytes));
}

template <class Api>
void gpu_runtime<Api>::copy_async(void* dst, const void* src, std::size_t bytes,
                                  native_stream stream)
{
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr && src != nullptr,
                "depot: copy of " + std::to_string(bytes) + " bytes with a null pointer");
  DEPOT_GPU_TRY(Api::memcpy_async(dst, src, bytes, detail::to_native<Api>(stream)));
}

template <class Api>
void gpu_runtime<Api>::copy_peer_async(void* dst, int dst_device, const void* src,
                                       int src_device, std::size_t bytes, native_stream stream)
{
  check_device(dst_device);
  check_device(src_device);
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr && src != nullptr,
                "depot: peer copy of " + std::to_string(bytes) + " bytes with a null pointer");
  DEPOT_GPU_TRY(Api::memcpy_peer_async(dst, dst_device, src, src_device, bytes,
                                       detail::to_native<Api>(stream)));
}

template <class Api>
void gpu_runtime<Api>::set_async(void* dst, int value, std::size_t bytes, native_stream stream)
{
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr, "depot: memset of " + std::to_string(bytes) +
                                    " bytes with a null pointer");
  DEPOT_GPU_TRY(Api::memset_async(dst, value, bytes, detail::to_native<Api>(stream)));
}

template <class Api>
bool gpu_runtime<Api>::can_access_peer(int device, int peer)
{
  check_device(device);
  check_device(peer);
  if (device == peer) return true;
  int can = 0;
  DEPOT_GPU_TRY(Api::can_access_peer(&can, device, peer));
  return can != 0;
}

template <class Api>
void gpu_runtime<Api>::enable_peer_access(int device, int peer)
{
  check_device(device);
  check_device(peer);
  if (device == peer) return;
  detail::scoped_device<Api> on{device};
  const auto status = Api::enable_peer_access(peer);
  if (status == Api::peer_access_already_enabled) {
    (void)Api::get_last_error();
    return;
  }
  DEPOT_GPU_TRY(status);
}

template <class Api>
ipc_memory_handle gpu_runtime<Api>::ipc_export(void* allocation, int device)
{
  check_device(device);
  DEPOT_EXPECTS(allocation != nullptr, "depot: ipc_export of a null pointer");
  detail::scoped_device<Api> on{device};
  typename Api::ipc_handle_t h{};
  static_assert(sizeof(h) == ipc_memory_handle::size);
  DEPOT_GPU_TRY(Api::ipc_get(&h, allocation));
  ipc_memory_handle out;
  std::memcpy(out.bytes.data(), &h, sizeof h);
  return out;
}

template <class Api>
void* gpu_runtime<Api>::ipc_open(const ipc_memory_handle& handle, int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  typename Api::ipc_handle_t h{};
  std::memcpy(&h, handle.bytes.data(), sizeof h);
  void* ptr = nullptr;
  DEPOT_GPU_TRY(Api::ipc_open(&ptr, h));
  return ptr;
}

template <class Api>
void gpu_runtime<Api>::ipc_close(void* ptr, int device) noexcept
{
  if (ptr == nullptr) return;
  detail::release_on<Api>(device, [ptr] { return Api::ipc_close(ptr); });
}

// ---- virtual memory (expandable segments) ----------------------------------------------------

template <class Api>
std::size_t gpu_runtime<Api>::vm_page(int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  std::size_t g = 0;
  if (Api::vm_granularity(&g, device) != Api::success) {  // no virtual memory management here
    (void)Api::get_last_error();
    return 0;
  }
  return g;
}

template <class Api>
void* gpu_runtime<Api>::vm_reserve(std::size_t bytes, int device)
{
  check_device(device);
  const std::size_t page = vm_page(device);
  DEPOT_EXPECTS(page != 0, std::string{"depot: "} + Api::name + " device " + std::to_string(device) +
                               " cannot map memory into reserved addresses (no virtual memory management)");
  DEPOT_EXPECTS(bytes != 0 && bytes % page == 0,
                "depot: vm_reserve of " + std::to_string(bytes) + " bytes: must be a non-zero multiple of the " +
                    std::to_string(page) + "-byte page");
  detail::scoped_device<Api> on{device};
  detail::bind_context<Api>();
  void* p = nullptr;
  if (const auto status = Api::vm_reserve(&p, bytes, page); status != Api::success) {
    (void)Api::get_last_error();
    const device_id id{Api::kind, device};
    throw out_of_memory("depot: " + id.to_string() + " could not reserve " + format_bytes(bytes) +
                            " of addresses: " + Api::error_name(status),
                        bytes, id);
  }
  return p;
}

namespace detail {
// New physical memory of `bytes`: pages exportable as POSIX file descriptors (as PyTorch's
// expandable segments), so blocks on them can be shared (vm_export); where the runtime
// refuses that handle type (invalid value, not supported), plain pages, which vm_export
// then refuses. The first refusal is remembered for the process.
template <class Api>
typename Api::error_t vm_create(typename Api::vm_handle_t* h, std::size_t bytes, int device)
{
  static std::atomic<bool> exportable{true};
  if (exportable.load(std::memory_order_relaxed)) {
    const auto status = Api::vm_create(h, bytes, device, true);
    if (status != Api::invalid_value && status != Api::not_supported) return status;
    (void)Api::get_last_error();
    exportable.store(false, std::memory_order_relaxed);
  }
  return Api::vm_create(h, bytes, device, false);
}

// New physical memory of `bytes` mapped at addr (the device current, its context bound),
// not yet accessible: its handle. Out of memory is depot::out_of_memory; nothing is left
// made or mapped on any error.
template <class Api>
typename Api::vm_handle_t vm_create_mapped(void* addr, std::size_t bytes, int device)
{
  typename Api::vm_handle_t h{};
  if (const auto status = detail::vm_create<Api>(&h, bytes, device); status != Api::success) {
    (void)Api::get_last_error();
    if (status != Api::memory_allocation) DEPOT_GPU_TRY(status);
    const std::string state = device_state<Api>();
    const device_id id{Api::kind, device};
    throw out_of_memory("depot: " + id.to_string() + " out of memory: could not create " + format_bytes(bytes) +
                            " of physical memory to map; the device has " + state,
                        bytes, id);
  }
  if (const auto status = Api::vm_map(addr, bytes, h); status != Api::success) {
    (void)Api::vm_release_handle(h);
    DEPOT_GPU_TRY(status);
  }
  return h;
}
}  // namespace detail

template <class Api>
std::uint64_t gpu_runtime<Api>::vm_map(void* addr, std::size_t bytes, int device)
{
  check_device(device);
  DEPOT_EXPECTS(addr != nullptr && bytes != 0, "depot: vm_map of a null address or of 0 bytes");
  detail::scoped_device<Api> on{device};
  detail::bind_context<Api>();
  const auto h = detail::vm_create_mapped<Api>(addr, bytes, device);
  if (const auto status = Api::vm_set_access(addr, bytes, device); status != Api::success) {
    (void)Api::vm_unmap(addr, bytes);
    (void)Api::vm_release_handle(h);
    DEPOT_GPU_TRY(status);
  }
  return Api::vm_bits(h);
}

// Each page made and mapped, then one access call for the whole run (the slowest of the
// three driver calls, made once instead of per page).
template <class Api>
void gpu_runtime<Api>::vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles,
                                    int device)
{
  check_device(device);
  DEPOT_EXPECTS(addr != nullptr && handles != nullptr && count != 0 && page != 0 &&
                    count <= (std::size_t{1} << 46) / page,
                "depot: vm_map_pages of " + std::to_string(count) + " pages of " + std::to_string(page) +
                    " bytes: needs an address, 1 to 2^46 bytes of pages and room for their handles");
  detail::scoped_device<Api> on{device};
  detail::bind_context<Api>();
  auto* const b = static_cast<unsigned char*>(addr);
  std::size_t done = 0;
  const auto undo = [&]() noexcept {
    for (std::size_t i = done; i-- > 0;) {
      (void)Api::vm_unmap(b + i * page, page);
      (void)Api::vm_release_handle(Api::vm_handle(handles[i]));
    }
    (void)Api::get_last_error();
  };
  try {
    for (; done < count; ++done) handles[done] = Api::vm_bits(detail::vm_create_mapped<Api>(b + done * page, page, device));
  } catch (...) {
    undo();
    throw;
  }
  if (const auto status = Api::vm_set_access(addr, page * count, device); status != Api::success) {
    undo();
    DEPOT_GPU_TRY(status);
  }
}

template <class Api>
void gpu_runtime<Api>::vm_unmap(void* addr, std::size_t bytes, std::uint64_t handle, int device) noexcept
{
  detail::release_on<Api>(device, [addr, bytes] {
    detail::bind_context<Api>();
    return Api::vm_unmap(addr, bytes);
  });
  detail::release_on<Api>(device, [handle] { return Api::vm_release_handle(Api::vm_handle(handle)); });
}

template <class Api>
void gpu_runtime<Api>::vm_release(void* addr, std::size_t bytes, int device) noexcept
{
  detail::release_on<Api>(device, [addr, bytes] {
    detail::bind_context<Api>();
    return Api::vm_free_address(addr, bytes);
  });
}

template <class Api>
int gpu_runtime<Api>::vm_export(std::uint64_t handle, int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  detail::bind_context<Api>();
  int fd = -1;
  DEPOT_GPU_TRY(Api::vm_export(&fd, Api::vm_handle(handle)));
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);  // not inherited by programs this process runs
  return fd;
}

template <class Api>
void* gpu_runtime<Api>::vm_import(const int* fds, std::size_t count, std::size_t page, int device)
{
  check_device(device);
  DEPOT_EXPECTS(fds != nullptr && count != 0 && page != 0 && count <= (std::size_t{1} << 46) / page,
                "depot: vm_import of " + std::to_string(count) + " pages of " + std::to_string(page) +
                    " bytes: needs 1 to 2^46 bytes of pages and their descriptors");
  const std::size_t ours = vm_page(device);
  DEPOT_EXPECTS(ours != 0 && page % ours == 0,
                "depot: vm_import of " + std::to_string(page) + "-byte pages: device " + std::to_string(device) +
                    (ours == 0 ? std::string{" cannot map memory (no virtual memory management)"}
                               : " maps in multiples of " + std::to_string(ours) + " bytes"));
  void* base = vm_reserve(count * page, device);
  detail::scoped_device<Api> on{device};
  detail::bind_context<Api>();
  auto* const b = static_cast<unsigned char*>(base);
  std::size_t mapped = 0;
  const auto undo = [&]() noexcept {
    for (std::size_t i = 0; i < mapped; ++i) (void)Api::vm_unmap(b + i * page, page);
    (void)Api::vm_free_address(base, count * page);
    (void)Api::get_last_error();
  };
  for (; mapped < count; ++mapped) {
    typename Api::vm_handle_t h{};
    auto status = Api::vm_import(&h, fds[mapped]);
    if (status == Api::success) {
      status = Api::vm_map(b + mapped * page, page, h);
      (void)Api::vm_release_handle(h);  // the mapping keeps the memory
    }
    if (status != Api::success) {
      undo();
      DEPOT_GPU_TRY(status);
    }
  }
  if (const auto status = Api::vm_set_access(base, count * page, device); status != Api::success) {
    undo();
    DEPOT_GPU_TRY(status);
  }
  return base;
}

template <class Api>
void gpu_runtime<Api>::vm_close_import(void* addr, std::size_t count, std::size_t page, int device) noexcept
{
  auto* const b = static_cast<unsigned char*>(addr);
  for (std::size_t i = 0; i < count; ++i) {
    detail::release_on<Api>(device, [b, i, page] {
      detail::bind_context<Api>();
      return Api::vm_unmap(b + i * page, page);
    });
  }
  vm_release(addr, count * page, device);
}

template <class Api>
native_stream gpu_runtime<Api>::create_stream(int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  typename Api::stream_t s{};
  DEPOT_GPU_TRY(Api::stream_create(&s, Api::stream_non_blocking));
  return static_cast<native_stream>(s);
}

template <class Api>
void gpu_runtime<Api>::destroy_stream(native_stream stream, int device) noexcept
{
  // Destroying a stream with queued work is allowed: the work still completes.
  (void)device;
  if (stream != nullptr && Api::stream_destroy(detail::to_native<Api>(stream)) != Api::success)
    (void)Api::get_last_error();
}

template <class Api>
void gpu_runtime<Api>::synchronize_stream(native_stream stream)
{
  DEPOT_GPU_TRY(Api::stream_synchronize(detail::to_native<Api>(stream)));
}

template <class Api>
bool gpu_runtime<Api>::query_stream(native_stream stream)
{
  const auto status = Api::stream_query(detail::to_native<Api>(stream));
  if (status == Api::not_ready) return false;
  DEPOT_GPU_TRY(status);
  return true;
}

template <class Api>
native_event gpu_runtime<Api>::create_event(int device, bool timing)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  typename Api::event_t e{};
  DEPOT_GPU_TRY(Api::event_create(&e, timing ? Api::event_default : Api::event_disable_timing));
  return static_cast<native_event>(e);
}

template <class Api>
void gpu_runtime<Api>::destroy_event(native_event event, int device) noexcept
{
  // As destroy_stream: an event may be destroyed while its work is still pending.
  (void)device;
  if (event != nullptr && Api::event_destroy(detail::to_native_event<Api>(event)) != Api::success)
    (void)Api::get_last_error();
}

template <class Api>
void gpu_runtime<Api>::record_event(native_event event, native_stream stream)
{
  DEPOT_GPU_TRY(Api::event_record(detail::to_native_event<Api>(event), detail::to_native<Api>(stream)));
}

template <class Api>
bool gpu_runtime<Api>::query_event(native_event event)
{
  const auto status = Api::event_query(detail::to_native_event<Api>(event));
  if (status == Api::not_ready) return false;
  DEPOT_GPU_TRY(status);
  return true;
}

template <class Api>
void gpu_runtime<Api>::synchronize_event(native_event event)
{
  DEPOT_GPU_TRY(Api::event_synchronize(detail::to_native_event<Api>(event)));
}

template <class Api>
void gpu_runtime<Api>::wait_event(native_stream stream, native_event event)
{
  DEPOT_GPU_TRY(Api::stream_wait_event(detail::to_native<Api>(stream),
                                       detail::to_native_event<Api>(event)));
}

template <class Api>
float gpu_runtime<Api>::elapsed_ms(native_event start, native_event stop)
{
  float ms = 0.0F;
  DEPOT_GPU_TRY(Api::event_elapsed(&ms, detail::to_native_event<Api>(start),
                                   detail::to_native_event<Api>(stop)));
  return ms;
}

template <class Api>
void gpu_runtime<Api>::begin_capture(native_stream stream)
{
  DEPOT_GPU_TRY(Api::begin_capture(detail::to_native<Api>(stream)));
}

template <class Api>
native_graph gpu_runtime<Api>::end_capture(native_stream stream)
{
  typename Api::graph_t g{};
  DEPOT_GPU_TRY(Api::end_capture(detail::to_native<Api>(stream), &g));
  typename Api::graph_exec_t x{};
  const auto status = Api::graph_instantiate(&x, g);
  (void)Api::graph_destroy(g);  // (the instantiated graph does not need it)
  DEPOT_GPU_TRY(status);
  return static_cast<native_graph>(x);
}

template <class Api>
void gpu_runtime<Api>::launch_graph(native_graph graph, native_stream stream)
{
  DEPOT_EXPECTS(graph != nullptr, "depot: launch_graph of a null graph");
  DEPOT_GPU_TRY(Api::graph_launch(static_cast<typename Api::graph_exec_t>(graph), detail::to_native<Api>(stream)));
}

template <class Api>
void gpu_runtime<Api>::destroy_graph(native_graph graph) noexcept
{
  if (graph != nullptr && Api::graph_exec_destroy(static_cast<typename Api::graph_exec_t>(graph)) != Api::success)
    (void)Api::get_last_error();
}

template <class Api>
bool gpu_runtime<Api>::stream_capturing(native_stream stream)
{
  bool active = false;
  DEPOT_GPU_TRY(Api::stream_capturing(detail::to_native<Api>(stream), &active));
  return active;
}

template <class Api>
void gpu_runtime<Api>::synchronize(int device)
{
  check_device(device);
  detail::scoped_device<Api> on{device};
  DEPOT_GPU_TRY(Api::device_synchronize());
}

}  // namespace depot::hal
