// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The C interface (c_api.h): each call picks the backend, calls the C++ allocator and turns
// an exception into a status code and the thread's last-error message.
#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/format_address.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/detail/handle_table.hpp>
#include <depot/pool/fixed_pool.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_mapping.hpp>
#include <depot/pool/ipc_received.hpp>
#include <depot/pool/memory_stats.hpp>
#include <depot/pool/oom_handler.hpp>
#include <depot/pool/pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace {

thread_local std::string last_error;

depot_status fail(depot_status s, std::string message) noexcept
{
  try {
    last_error = std::move(message);
  } catch (...) {  // no room for the message: the status still says what happened
  }
  return s;
}

depot_status not_built(const char* backend, const char* option) noexcept
{
  return fail(DEPOT_ERROR_NOT_SUPPORTED, std::string{"depot: this build of depot has no "} + backend +
                                             " backend (configure it with -Dgpu=" + option + ")");
}

// Runs f() (which returns a status), turning what it throws into one.
template <class F>
depot_status guarded(F&& f) noexcept
{
  try {
    return f();
  } catch (const depot::out_of_memory& e) {
    return fail(DEPOT_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::bad_alloc& e) {
    return fail(DEPOT_ERROR_OUT_OF_MEMORY, std::string{"depot: host memory exhausted ("} + e.what() + ")");
  } catch (const std::invalid_argument& e) {  // depot::invalid_argument among them
    return fail(DEPOT_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const depot::error& e) {
    return fail(e.code_name() == "not_supported" ? DEPOT_ERROR_NOT_SUPPORTED : DEPOT_ERROR_BACKEND, e.what());
  } catch (const std::exception& e) {
    return fail(DEPOT_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(DEPOT_ERROR_INTERNAL, "depot: an unknown exception");
  }
}

static_assert(static_cast<int>(depot::device_kind::host) == DEPOT_DEVICE_HOST &&
              static_cast<int>(depot::device_kind::cuda) == DEPOT_DEVICE_CUDA &&
              static_cast<int>(depot::device_kind::hip) == DEPOT_DEVICE_HIP);

// Runs f(D{}) for the backend `kind` names, turning what it throws into a status.
template <class F>
depot_status with_backend(depot_device_kind kind, F&& f) noexcept
{
  return guarded([&] {
    switch (kind) {
      case DEPOT_DEVICE_HOST: f(depot::host{}); return DEPOT_SUCCESS;
      case DEPOT_DEVICE_CUDA:
#if DEPOT_HAS_CUDA
        f(depot::cuda{});
        return DEPOT_SUCCESS;
#else
        return not_built("CUDA", "cuda");
#endif
      case DEPOT_DEVICE_HIP:
#if DEPOT_HAS_HIP
        f(depot::hip{});
        return DEPOT_SUCCESS;
#else
        return not_built("HIP", "hip");
#endif
    }
    return fail(DEPOT_ERROR_INVALID_ARGUMENT,
                "depot: device kind " + std::to_string(static_cast<int>(kind)) +
                    " is not one of DEPOT_DEVICE_HOST (0), DEPOT_DEVICE_CUDA (1), DEPOT_DEVICE_HIP (2)");
  });
}

// A T<D> of whichever backend of this build (the host, and at most one GPU backend).
template <template <depot::device> class T>
using any_backend = std::variant<T<depot::host>
#if DEPOT_HAS_CUDA
                                 , T<depot::cuda>
#endif
#if DEPOT_HAS_HIP
                                 , T<depot::hip>
#endif
                                 >;

// A fixed pool of whichever backend its handle was made for.
using any_fixed_pool = any_backend<depot::fixed_pool>;

// The C interface's fixed pools, IPC mappings and received IPC handles, by handle (never
// reused; a call holds its object, so a destroy on another thread frees it after the calls
// under way end).
// Never destroyed (an object left at exit is not freed during static destruction, after
// the backend may be gone).
using depot::detail::handle_table;

handle_table<any_fixed_pool>& fixed_pools()
{
  static auto* t = new handle_table<any_fixed_pool>{"pool", "a live fixed pool", "depot_fixed_pool_create"};
  return *t;
}

// Runs f(the fixed_pool<D> behind `pool`), turning what it throws into a status.
template <class F>
depot_status with_fixed_pool(const char* call, depot_fixed_pool* pool, F&& f) noexcept
{
  return guarded([&] {
    const auto p = fixed_pools().find(call, pool);
    std::visit(f, *p);
    return DEPOT_SUCCESS;
  });
}

// An IPC mapping of whichever backend its handle named.
using any_ipc_mapping = any_backend<depot::ipc_mapping>;

handle_table<any_ipc_mapping>& ipc_mappings()
{
  static auto* t = new handle_table<any_ipc_mapping>{"mapping", "an open IPC mapping", "depot_ipc_open"};
  return *t;
}

// Received IPC handles held unopened (a broker's: depot_ipc_receive_handle).
handle_table<depot::ipc_received>& ipc_receiveds()
{
  static auto* t =
      new handle_table<depot::ipc_received>{"received", "a held received IPC handle", "depot_ipc_receive_handle"};
  return *t;
}

// Out-values of depot_ipc_open and depot_ipc_receive cleared first (nothing on a refusal).
depot_status clear_opened(const char* call, depot_ipc_mapping** mapping, void** ptr, size_t* bytes)
{
  if (mapping == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, std::string{call} + ": mapping is NULL");
  *mapping = nullptr;
  if (ptr != nullptr) *ptr = nullptr;
  if (bytes != nullptr) *bytes = 0;
  return DEPOT_SUCCESS;
}

// Opens what `from` names (an ipc_handle, or an ipc_received with its descriptors) as a
// mapping handle of the backend its handle names.
template <class From>
depot_status open_mapping(const depot::ipc_handle& h, const From& from, depot_ipc_mapping** mapping, void** ptr,
                          size_t* bytes)
{
  const auto kind = static_cast<depot_device_kind>(h.device.kind);  // (the same numbers)
  return with_backend(kind, [&]<class D>(D) {
    auto m = std::make_unique<any_ipc_mapping>(std::in_place_type<depot::ipc_mapping<D>>, from);
    void* const at = std::get<depot::ipc_mapping<D>>(*m).get();
    *mapping = reinterpret_cast<depot_ipc_mapping*>(ipc_mappings().add(std::move(m)));
    if (ptr != nullptr) *ptr = at;
    if (bytes != nullptr) *bytes = static_cast<std::size_t>(h.requested);
  });
}

using c_timeout = std::optional<std::chrono::milliseconds>;

// A C timeout: -1 none, else milliseconds (below -1 refused).
c_timeout timeout_of(const char* call, int timeout_ms)
{
  if (timeout_ms < -1) {
    throw depot::invalid_argument(std::string{call} + ": timeout_ms " + std::to_string(timeout_ms) +
                                  " is neither -1 (no timeout) nor 0 or more milliseconds");
  }
  if (timeout_ms == -1) return std::nullopt;
  return std::chrono::milliseconds{timeout_ms};
}
// ipc_send / ipc_receive with the timeout, or without one (timeout_of's nullopt).
template <class What>
void send_within(int socket, const What& what, const c_timeout& timeout)
{
  if (timeout) {
    depot::ipc_send(socket, what, *timeout);
  } else {
    depot::ipc_send(socket, what);
  }
}
depot::ipc_received receive_within(int socket, const c_timeout& timeout)
{
  return timeout ? depot::ipc_receive(socket, *timeout) : depot::ipc_receive(socket);
}

// The C callback as a depot::oom_handler (empty for NULL).
depot::oom_handler oom_handler_of(depot_oom_callback callback, void* user_data)
{
  if (callback == nullptr) return {};
  return [callback, user_data](const depot::out_of_memory& e, unsigned attempt) {
    return callback(e.what(), e.requested_bytes(), attempt, user_data) != 0;
  };
}

template <class D>
depot::stream_ref<D> ref(void* stream) noexcept
{
  return depot::stream_ref<D>{static_cast<depot::native_stream>(stream)};
}

// The figures of depot_memory_stats, each beside depot::memory_stats's.
struct array_field {
  depot_stat_array depot_memory_stats::*c;
  depot::stat_array depot::memory_stats::*cpp;
};
constexpr array_field k_arrays[] = {
    {&depot_memory_stats::allocated_bytes, &depot::memory_stats::allocated_bytes},
    {&depot_memory_stats::requested_bytes, &depot::memory_stats::requested_bytes},
    {&depot_memory_stats::reserved_bytes, &depot::memory_stats::reserved_bytes},
    {&depot_memory_stats::cached_bytes, &depot::memory_stats::cached_bytes},
    {&depot_memory_stats::active_bytes, &depot::memory_stats::active_bytes},
    {&depot_memory_stats::inactive_split_bytes, &depot::memory_stats::inactive_split_bytes},
    {&depot_memory_stats::num_allocations, &depot::memory_stats::num_allocations},
    {&depot_memory_stats::num_segments, &depot::memory_stats::num_segments}};

depot_stat to_c(const depot::stat& s) noexcept { return depot_stat{s.current, s.peak, s.allocated, s.freed}; }

depot_memory_stats to_c(const depot::memory_stats& s) noexcept
{
  depot_memory_stats out{};
  for (const auto& f : k_arrays) {
    const depot::stat_array& from = s.*f.cpp;
    out.*f.c = depot_stat_array{to_c(from.all), to_c(from.small), to_c(from.large)};
  }
  out.num_cache_hits = s.num_cache_hits;
  out.num_cache_misses = s.num_cache_misses;
  out.cache_hit_rate = s.cache_hit_rate;
  out.peak_allocated = s.peak_allocated;
  out.peak_cached = s.peak_cached;
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_segments_moved = s.num_segments_moved;
  out.num_move_events = s.num_move_events;
  out.num_move_syncs = s.num_move_syncs;
  out.largest_free_block = s.largest_free_block;
  out.fragmentation = s.fragmentation;
  return out;
}

// Copies the text `make(D{})` returns into buffer[0, size) (NUL-terminated when size > 0)
// and its full length into *length (if not NULL). A text longer than the buffer is cut
// short, or, when `whole` names it, refused (a handle cut short would open nothing): the
// buffer is then "" and *length still says what it needs.
template <class Make>
depot_status text_out(const char* call, depot_device_kind kind, char* buffer, std::size_t size,
                      std::size_t* length, Make&& make, const char* whole = nullptr) noexcept
{
  if (buffer == nullptr && size != 0) {
    return fail(DEPOT_ERROR_INVALID_ARGUMENT, std::string{call} + ": buffer is NULL but size is " +
                                                  std::to_string(size) + " (NULL is allowed with size 0 only)");
  }
  if (whole != nullptr && size > 0) buffer[0] = '\0';
  return with_backend(kind, [&]<class D>(D d) {
    const std::string text = make(d);
    if (length != nullptr) *length = text.size();
    if (size == 0) return;  // the length only
    if (whole != nullptr && text.size() >= size) {
      throw std::invalid_argument(std::string{call} + ": " + whole + " takes " + std::to_string(text.size() + 1) +
                                  " bytes with its NUL, the buffer has " + std::to_string(size) +
                                  " (the length is in *length)");
    }
    const std::size_t n = std::min(text.size(), size - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  });
}

}  // namespace

extern "C" {

depot_status depot_device_count(depot_device_kind kind, int* count)
{
  if (count == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_device_count: count is NULL");
  *count = 0;
  return with_backend(kind, [&]<class D>(D) { *count = depot::device_count<D>(); });
}

depot_status depot_allocate(depot_device_kind kind, int device, size_t bytes, void* stream, void** ptr)
{
  if (ptr == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_allocate: ptr is NULL");
  *ptr = nullptr;
  return with_backend(kind, [&]<class D>(D) { *ptr = depot::pool<D>(device).allocate(bytes, ref<D>(stream)); });
}

depot_status depot_deallocate(depot_device_kind kind, int device, void* ptr)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).deallocate(ptr); });
}

depot_status depot_deallocate_on(depot_device_kind kind, int device, void* ptr, void* stream)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).deallocate(ptr, ref<D>(stream)); });
}

depot_status depot_record_stream(depot_device_kind kind, int device, void* ptr, void* stream)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).record_stream(ptr, ref<D>(stream)); });
}

depot_status depot_empty_cache(depot_device_kind kind, int device)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).empty_cache(); });
}

depot_status depot_reset_peak_stats(depot_device_kind kind, int device)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).reset_peak_stats(); });
}

depot_status depot_reset_memory_stats(depot_device_kind kind, int device)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).reset_memory_stats(); });
}

depot_status depot_get_memory_stats(depot_device_kind kind, int device, depot_memory_stats* stats)
{
  if (stats == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_get_memory_stats: stats is NULL");
  return with_backend(kind, [&]<class D>(D) {
    *stats = to_c(depot::pool<D>(device).stats());  // (written once every figure is read)
  });
}

depot_status depot_memory_summary(depot_device_kind kind, int device, char* buffer, size_t size, size_t* length)
{
  return text_out("depot_memory_summary", kind, buffer, size, length,
                  [&]<class D>(D) { return depot::pool<D>(device).summary(); });
}

depot_status depot_memory_snapshot_json(depot_device_kind kind, int device, char* buffer, size_t size,
                                        size_t* length)
{
  return text_out("depot_memory_snapshot_json", kind, buffer, size, length,
                  [&]<class D>(D) { return depot::pool<D>(device).snapshot().to_json(); });
}

depot_status depot_set_trace_capacity(depot_device_kind kind, int device, size_t events)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).set_trace_capacity(events); });
}

depot_status depot_trace_json(depot_device_kind kind, int device, char* buffer, size_t size, size_t* length)
{
  return text_out("depot_trace_json", kind, buffer, size, length,
                  [&]<class D>(D) { return depot::pool<D>(device).trace_json(); });
}

depot_status depot_set_oom_handler(depot_device_kind kind, int device, depot_oom_callback callback,
                                   void* user_data)
{
  return with_backend(kind, [&]<class D>(D) {
    // (built inside the guard: a std::function may allocate)
    depot::pool<D>(device).set_oom_handler(oom_handler_of(callback, user_data));
  });
}

depot_status depot_allocate_pinned(depot_device_kind kind, int device, size_t bytes, void* stream, void** ptr)
{
  if (ptr == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_allocate_pinned: ptr is NULL");
  *ptr = nullptr;
  return with_backend(kind,
                      [&]<class D>(D) { *ptr = depot::pinned_pool<D>(device).allocate(bytes, ref<D>(stream)); });
}

depot_status depot_deallocate_pinned(depot_device_kind kind, int device, void* ptr)
{
  return with_backend(kind, [&]<class D>(D) { depot::pinned_pool<D>(device).deallocate(ptr); });
}

depot_status depot_begin_capture(depot_device_kind kind, int device, void* stream, uint64_t pool,
                                 uint64_t* pool_out)
{
  if (pool_out == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_begin_capture: pool_out is NULL");
  return with_backend(kind, [&]<class D>(D) { *pool_out = depot::pool<D>(device).begin_capture(ref<D>(stream), pool); });
}

depot_status depot_end_capture(depot_device_kind kind, int device, void* stream)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).end_capture(ref<D>(stream)); });
}

depot_status depot_release_capture_pool(depot_device_kind kind, int device, uint64_t pool)
{
  return with_backend(kind, [&]<class D>(D) { depot::pool<D>(device).release_capture_pool(pool); });
}

depot_status depot_fixed_pool_create(depot_device_kind kind, int device, size_t pool_size, size_t block_size,
                                     depot_fixed_pool** pool)
{
  if (pool == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_fixed_pool_create: pool is NULL");
  *pool = nullptr;
  return with_backend(kind, [&]<class D>(D) {
    auto p = std::make_unique<any_fixed_pool>(std::in_place_type<depot::fixed_pool<D>>, pool_size, block_size,
                                              device);
    *pool = reinterpret_cast<depot_fixed_pool*>(fixed_pools().add(std::move(p)));
  });
}

depot_status depot_fixed_pool_destroy(depot_fixed_pool* pool)
{
  if (pool == nullptr) return DEPOT_SUCCESS;
  return guarded([&] {
    fixed_pools().remove("depot_fixed_pool_destroy", pool);
    return DEPOT_SUCCESS;
  });
}

depot_status depot_fixed_pool_allocate(depot_fixed_pool* pool, void** ptr)
{
  if (ptr == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_fixed_pool_allocate: ptr is NULL");
  *ptr = nullptr;
  return with_fixed_pool("depot_fixed_pool_allocate", pool, [&](auto& p) { *ptr = p.allocate(); });
}

depot_status depot_fixed_pool_deallocate(depot_fixed_pool* pool, void* ptr)
{
  return with_fixed_pool("depot_fixed_pool_deallocate", pool, [&](auto& p) { p.deallocate(ptr); });
}

depot_status depot_fixed_pool_defragment(depot_fixed_pool* pool)
{
  return with_fixed_pool("depot_fixed_pool_defragment", pool, [](auto& p) { p.defragment(); });
}

depot_status depot_fixed_pool_get_stats(depot_fixed_pool* pool, depot_fixed_pool_stats* stats)
{
  if (stats == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_fixed_pool_get_stats: stats is NULL");
  return with_fixed_pool("depot_fixed_pool_get_stats", pool, [&](auto& p) {
    const depot::fixed_pool_stats s = p.get_stats();
    *stats = depot_fixed_pool_stats{s.pool_size,        s.block_size, s.total_blocks, s.used_blocks,
                                    s.free_blocks,      s.peak_used_blocks, s.hits,   s.misses,
                                    s.hit_rate,         s.largest_free_run, s.fragmentation};
  });
}

depot_status depot_fixed_pool_set_oom_handler(depot_fixed_pool* pool, depot_oom_callback callback, void* user_data)
{
  return with_fixed_pool("depot_fixed_pool_set_oom_handler", pool,
                         [&](auto& p) { p.set_oom_handler(oom_handler_of(callback, user_data)); });
}

depot_status depot_ipc_export(depot_device_kind kind, int device, void* ptr, char* buffer, size_t size,
                              size_t* length)
{
  // (the block stays exported when the buffer is refused: exporting again is fine)
  return text_out("depot_ipc_export", kind, buffer, size, length,
                  [&]<class D>(D) { return depot::pool<D>(device).ipc_export(ptr).to_hex(); }, "the handle");
}

depot_status depot_ipc_open(const char* handle, depot_ipc_mapping** mapping, void** ptr, size_t* bytes)
{
  if (const depot_status st = clear_opened("depot_ipc_open", mapping, ptr, bytes); st != DEPOT_SUCCESS) return st;
  if (handle == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_ipc_open: handle is NULL");
  return guarded([&] {
    const depot::ipc_handle h = depot::ipc_handle::from_hex(handle);
    return open_mapping(h, h, mapping, ptr, bytes);
  });
}

depot_status depot_ipc_send(int socket, depot_device_kind kind, int device, void* ptr, int timeout_ms)
{
  return with_backend(kind, [&]<class D>(D) {
    const auto timeout = timeout_of("depot_ipc_send", timeout_ms);
    send_within(socket, depot::pool<D>(device).ipc_export(ptr), timeout);
  });
}

depot_status depot_ipc_receive(int socket, int timeout_ms, depot_ipc_mapping** mapping, void** ptr, size_t* bytes)
{
  if (const depot_status st = clear_opened("depot_ipc_receive", mapping, ptr, bytes); st != DEPOT_SUCCESS) return st;
  return guarded([&] {
    const auto timeout = timeout_of("depot_ipc_receive", timeout_ms);
    // (its descriptors are closed when it goes, after the mapping took the pages)
    const depot::ipc_received r = receive_within(socket, timeout);
    return open_mapping(r.handle, r, mapping, ptr, bytes);
  });
}

depot_status depot_ipc_receive_handle(int socket, int timeout_ms, depot_ipc_received** received)
{
  if (received == nullptr) return fail(DEPOT_ERROR_INVALID_ARGUMENT, "depot_ipc_receive_handle: received is NULL");
  *received = nullptr;
  return guarded([&] {
    const auto timeout = timeout_of("depot_ipc_receive_handle", timeout_ms);
    auto r = std::make_unique<depot::ipc_received>(receive_within(socket, timeout));
    *received = reinterpret_cast<depot_ipc_received*>(ipc_receiveds().add(std::move(r)));
    return DEPOT_SUCCESS;
  });
}

depot_status depot_ipc_forward(int socket, const depot_ipc_received* received, int timeout_ms)
{
  return guarded([&] {
    const auto timeout = timeout_of("depot_ipc_forward", timeout_ms);
    send_within(socket, *ipc_receiveds().find("depot_ipc_forward", received), timeout);
    return DEPOT_SUCCESS;
  });
}

depot_status depot_ipc_open_received(const depot_ipc_received* received, depot_ipc_mapping** mapping, void** ptr,
                                     size_t* bytes)
{
  if (const depot_status st = clear_opened("depot_ipc_open_received", mapping, ptr, bytes); st != DEPOT_SUCCESS) {
    return st;
  }
  return guarded([&] {
    const auto r = ipc_receiveds().find("depot_ipc_open_received", received);
    return open_mapping(r->handle, *r, mapping, ptr, bytes);
  });
}

depot_status depot_ipc_received_free(depot_ipc_received* received)
{
  if (received == nullptr) return DEPOT_SUCCESS;
  return guarded([&] {
    ipc_receiveds().remove("depot_ipc_received_free", received);
    return DEPOT_SUCCESS;
  });
}

depot_status depot_ipc_close(depot_ipc_mapping* mapping)
{
  if (mapping == nullptr) return DEPOT_SUCCESS;
  return guarded([&] {
    ipc_mappings().remove("depot_ipc_close", mapping);
    return DEPOT_SUCCESS;
  });
}

const char* depot_last_error(void) { return last_error.c_str(); }

const char* depot_status_name(depot_status status)
{
  switch (status) {
    case DEPOT_SUCCESS: return "DEPOT_SUCCESS";
    case DEPOT_ERROR_INVALID_ARGUMENT: return "DEPOT_ERROR_INVALID_ARGUMENT";
    case DEPOT_ERROR_OUT_OF_MEMORY: return "DEPOT_ERROR_OUT_OF_MEMORY";
    case DEPOT_ERROR_NOT_SUPPORTED: return "DEPOT_ERROR_NOT_SUPPORTED";
    case DEPOT_ERROR_BACKEND: return "DEPOT_ERROR_BACKEND";
    case DEPOT_ERROR_INTERNAL: return "DEPOT_ERROR_INTERNAL";
  }
  return "unknown depot_status";
}

}  // extern "C"
