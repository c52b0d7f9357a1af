/* SPDX-License-Identifier: Apache-2.0 */
/* Part of depot: the memory layer for host, CUDA and HIP tensor data. */
/* The C interface to the process-wide caching allocators (depot::pool<D>(device)), for C
 * codes and, through ISO_C_BINDING interfaces, Fortran ones. Valid C99 and C++.
 *
 * Every call is thread-safe, as the allocators are. A call returns DEPOT_SUCCESS or an
 * error code and never lets a C++ exception out; on an error it changes nothing and keeps
 * a message naming what was wrong (and the valid range) for the calling thread, read with
 * depot_last_error(). Streams are the backend's native handles as void* (cudaStream_t,
 * hipStream_t; NULL is the backend's default stream; on the host backend, a depot host
 * stream's handle or NULL). Memory from depot_allocate belongs to the caller until
 * depot_deallocate; the allocators and their caches belong to the library. */
#ifndef DEPOT_POOL_C_API_H
#define DEPOT_POOL_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* In C++ the enumerations are int-based, so any int a C or Fortran caller passes is a value
 * of the type (checked, never undefined); in C they are int-sized as well. */
#ifdef __cplusplus
#define DEPOT_C_ENUM_BASE : int
#else
#define DEPOT_C_ENUM_BASE
#endif

/* A backend. One that this build lacks gives DEPOT_ERROR_NOT_SUPPORTED. */
typedef enum depot_device_kind DEPOT_C_ENUM_BASE {
  DEPOT_DEVICE_HOST = 0,
  DEPOT_DEVICE_CUDA = 1,
  DEPOT_DEVICE_HIP = 2
} depot_device_kind;

typedef enum depot_status DEPOT_C_ENUM_BASE {
  DEPOT_SUCCESS = 0,
  DEPOT_ERROR_INVALID_ARGUMENT = 1, /* a bad argument: kind, device, pointer, size, buffer */
  DEPOT_ERROR_OUT_OF_MEMORY = 2,    /* after the allocator's retries and its handler */
  DEPOT_ERROR_NOT_SUPPORTED = 3,    /* this build lacks the backend, or the backend the call */
  DEPOT_ERROR_BACKEND = 4,          /* the backend's runtime failed (its error in the message) */
  DEPOT_ERROR_INTERNAL = 5          /* anything else (the message says what) */
} depot_status;

#undef DEPOT_C_ENUM_BASE

/* One figure: now, highest since the last peak reset, running totals added and removed. */
typedef struct depot_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated;
  int64_t freed;
} depot_stat;

/* A figure for all blocks, the small pool (requests <= 1 MiB) and the large pool. */
typedef struct depot_stat_array {
  depot_stat all;
  depot_stat small;
  depot_stat large;
} depot_stat_array;

/* depot::memory_stats, field for field (see memory_stats.hpp for the definitions). */
typedef struct depot_memory_stats {
  depot_stat_array allocated_bytes;
  depot_stat_array requested_bytes;
  depot_stat_array reserved_bytes;
  depot_stat_array cached_bytes;
  depot_stat_array active_bytes;
  depot_stat_array inactive_split_bytes;
  depot_stat_array num_allocations;
  depot_stat_array num_segments;
  int64_t num_cache_hits;
  int64_t num_cache_misses;
  double cache_hit_rate;
  int64_t peak_allocated;
  int64_t peak_cached;
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t largest_free_block;
  double fragmentation;
  int64_t num_segments_moved; /* memory_stats::num_segments_moved */
  int64_t num_move_events;    /* memory_stats::num_move_events */
  int64_t num_move_syncs;     /* memory_stats::num_move_syncs */
} depot_memory_stats;

/* Devices of backend `kind` (0 where it has none; DEPOT_ERROR_NOT_SUPPORTED, with *count
 * 0, where this build lacks it). */
depot_status depot_device_count(depot_device_kind kind, int* count);

/* *ptr = a block of at least `bytes` bytes, 512-byte aligned, usable on `stream` in stream
 * order; bytes == 0 gives NULL. On an error *ptr is NULL. */
depot_status depot_allocate(depot_device_kind kind, int device, size_t bytes, void* stream, void** ptr);
/* Frees `ptr` on the stream it was allocated on. NULL is a no-op; a pointer that is not a
 * live block of this allocator (a double free, a foreign pointer) is
 * DEPOT_ERROR_INVALID_ARGUMENT and changes nothing. */
depot_status depot_deallocate(depot_device_kind kind, int device, void* ptr);
/* Frees `ptr` in the order of `stream` (when that is not the allocation's stream, as if
 * depot_record_stream had been called with it). */
depot_status depot_deallocate_on(depot_device_kind kind, int device, void* ptr, void* stream);
/* Declares that work on `stream` uses the block: its reuse waits for that work. */
depot_status depot_record_stream(depot_device_kind kind, int device, void* ptr, void* stream);

/* Returns the cached free segments to the backend. */
depot_status depot_empty_cache(depot_device_kind kind, int device);
depot_status depot_reset_peak_stats(depot_device_kind kind, int device);
/* Resets peaks and the running totals; current figures are never disturbed. */
depot_status depot_reset_memory_stats(depot_device_kind kind, int device);
/* *stats = the allocator's statistics, consistent with each other. */
depot_status depot_get_memory_stats(depot_device_kind kind, int device, depot_memory_stats* stats);
/* The readable table (depot::memory_summary): *length = its length in chars, without the
 * terminating NUL; copied into buffer[0, size), cut short if it does not fit and always
 * NUL-terminated when size > 0. buffer may be NULL when size is 0 (ask for the length);
 * length may be NULL. */
depot_status depot_memory_summary(depot_device_kind kind, int device, char* buffer, size_t size, size_t* length);

/* Every segment with its blocks as JSON (depot::allocator_snapshot::to_json, the README's
 * "depot.snapshot" format), into a buffer as depot_memory_summary. */
depot_status depot_memory_snapshot_json(depot_device_kind kind, int device, char* buffer, size_t size,
                                         size_t* length);
/* Keep the last `events` allocation events (0: stop tracing; the README's trace format). */
depot_status depot_set_trace_capacity(depot_device_kind kind, int device, size_t events);
/* The trace as JSON (depot::caching_allocator::trace_json), into a buffer as above. */
depot_status depot_trace_json(depot_device_kind kind, int device, char* buffer, size_t size, size_t* length);

/* Called when a request still fails after the allocator's own retries (depot::oom_handler):
 * the out-of-memory report, the bytes asked for, the attempt (1, 2, ...) and the user_data
 * given with it; no lock of the allocator is held, so it may free memory (depot_deallocate,
 * depot_empty_cache). Nonzero tries the request again; 0 lets it fail with
 * DEPOT_ERROR_OUT_OF_MEMORY. Called on each failing thread: it must be thread-safe. */
typedef int (*depot_oom_callback)(const char* message, size_t requested_bytes, unsigned attempt, void* user_data);
/* Sets the allocator's out-of-memory callback (NULL removes it). */
depot_status depot_set_oom_handler(depot_device_kind kind, int device, depot_oom_callback callback,
                                   void* user_data);

/* The pinned host pool for staging transfers to and from `device` (depot::pinned_pool<D>):
 * host memory the CPU reads and writes, ordered on the backend's streams like the above. */
depot_status depot_allocate_pinned(depot_device_kind kind, int device, size_t bytes, void* stream, void** ptr);
depot_status depot_deallocate_pinned(depot_device_kind kind, int device, void* ptr);

/* Graph capture (caching_allocator::begin_capture), for a code that captures work on
 * `stream` into a CUDA or HIP graph itself: call depot_begin_capture just before the
 * backend's capture begins (cudaStreamBeginCapture). Allocations on `stream` then come from
 * a capture pool, *pool_out: a new one (pool 0), or `pool`, an earlier call's not yet
 * released, to share its memory (graphs replayed one after another in capture order).
 * While any capture is under way the allocators of the backend wait for no event and
 * release nothing (depot_empty_cache is refused). depot_end_capture after the backend's
 * capture ended; depot_release_capture_pool once no graph of that use will run again (one
 * call per depot_begin_capture), when its memory returns to the allocator. */
depot_status depot_begin_capture(depot_device_kind kind, int device, void* stream, uint64_t pool,
                                 uint64_t* pool_out);
depot_status depot_end_capture(depot_device_kind kind, int device, void* stream);
depot_status depot_release_capture_pool(depot_device_kind kind, int device, uint64_t pool);

/* A fixed pool (depot::fixed_pool<D>, the Kitsune seed's MemoryPool): pool_size bytes of
 * the device allocated at creation, cut into blocks of block_size bytes (rounded up to 256,
 * the alignment of every block); allocation and free are O(1) and never call the backend.
 * Thread-safe. The handle is the caller's from depot_fixed_pool_create to
 * depot_fixed_pool_destroy, which returns the memory (blocks still in use become invalid).
 * Handles are never reused: one that is not a live pool (destroyed, or never made) is
 * DEPOT_ERROR_INVALID_ARGUMENT. A destroy does not wait: calls already under way on other
 * threads finish on the pool, which is freed when the last of them returns. */
typedef struct depot_fixed_pool depot_fixed_pool;

/* depot::fixed_pool_stats, field for field. hit_rate = hits / (hits + misses), a miss
 * being a request that failed; fragmentation = 1 - largest_free_run / free_blocks. */
typedef struct depot_fixed_pool_stats {
  size_t pool_size;
  size_t block_size;
  size_t total_blocks;
  size_t used_blocks;
  size_t free_blocks;
  size_t peak_used_blocks;
  int64_t hits;
  int64_t misses;
  double hit_rate;
  size_t largest_free_run;
  double fragmentation;
} depot_fixed_pool_stats;

/* *pool = a new fixed pool on `device` of backend `kind` (NULL on an error: a block_size of
 * 0 or above 2^48 bytes, a pool_size below one block, a bad device, out of memory). */
depot_status depot_fixed_pool_create(depot_device_kind kind, int device, size_t pool_size, size_t block_size,
                                     depot_fixed_pool** pool);
/* Returns the pool's memory; NULL is a no-op. */
depot_status depot_fixed_pool_destroy(depot_fixed_pool* pool);
/* *ptr = a free block (lowest address first after depot_fixed_pool_defragment). When
 * every block is in use: the pool's out-of-memory callback, if set, then
 * DEPOT_ERROR_OUT_OF_MEMORY with *ptr NULL (counted in misses). */
depot_status depot_fixed_pool_allocate(depot_fixed_pool* pool, void** ptr);
/* NULL is a no-op; a pointer that is not a block of the pool in use (a double free, a
 * foreign pointer, a pointer inside a block) is DEPOT_ERROR_INVALID_ARGUMENT and changes
 * nothing. */
depot_status depot_fixed_pool_deallocate(depot_fixed_pool* pool, void* ptr);
/* Orders the free blocks so that the next allocations come lowest address first. */
depot_status depot_fixed_pool_defragment(depot_fixed_pool* pool);
depot_status depot_fixed_pool_get_stats(depot_fixed_pool* pool, depot_fixed_pool_stats* stats);
/* Called as depot_set_oom_handler's callback (no lock of the pool held: it may free blocks
 * of the pool), when every block is in use; nonzero tries again. NULL removes it. */
depot_status depot_fixed_pool_set_oom_handler(depot_fixed_pool* pool, depot_oom_callback callback,
                                              void* user_data);

/* Interprocess memory: a live block of the process pool (depot_allocate) opened by
 * another process on this machine, the same device memory (not a copy), as PyTorch shares
 * CUDA tensors. The GPU backends only: the host backend's memory is the process's own
 * (DEPOT_ERROR_NOT_SUPPORTED).
 * depot_ipc_export writes the block's handle into buffer as NUL-terminated text (hex
 * digits: pass it through a pipe, a file, an environment variable or an MPI message) and
 * its length into *length (if not NULL). size 0 (buffer NULL) asks for the length only; a
 * buffer too small for the text and its NUL is refused (a handle cut short would open
 * nothing). Exporting a block again is fine. The block's segment is then released only
 * while no other process maps it; keep the block allocated (and its stream's work on it
 * ordered, e.g. by an event) while other processes use it. A pointer that is not a live
 * block is DEPOT_ERROR_INVALID_ARGUMENT. */
depot_status depot_ipc_export(depot_device_kind kind, int device, void* ptr, char* buffer, size_t size,
                              size_t* length);
/* An open mapping of another process's block; thread-safe; handles are never reused (as
 * for fixed pools: one that is not open is DEPOT_ERROR_INVALID_ARGUMENT). */
typedef struct depot_ipc_mapping depot_ipc_mapping;
/* Opens the block `handle` (depot_ipc_export's text) names: *mapping, *ptr the block in
 * this process and *bytes its requested size (ptr and bytes may be NULL). The device is the
 * handle's. Opening one handle twice is fine (the mappings share one backend mapping); text
 * that is no handle is DEPOT_ERROR_INVALID_ARGUMENT with nothing opened. */
depot_status depot_ipc_open(const char* handle, depot_ipc_mapping** mapping, void** ptr, size_t* bytes);
/* Unmaps (NULL is a no-op); the pointer depot_ipc_open gave is invalid after. */
depot_status depot_ipc_close(depot_ipc_mapping* mapping);
/* The block's handle over a connected Unix socket (SOCK_STREAM or SOCK_SEQPACKET), with the
 * descriptors of its pages when it lies in an expandable segment (SCM_RIGHTS), so the
 * receiver maps them without taking them from this process (no ptrace permission needed,
 * as depot_ipc_open's text would need for such a block). Exports the block as
 * depot_ipc_export does. timeout_ms -1 waits as long as it takes (a non-blocking socket is
 * polled); 0 or more: the whole handle must go within it, else DEPOT_ERROR_BACKEND
 * (ETIMEDOUT), the socket left mid-handle (close it). A failing socket call is
 * DEPOT_ERROR_BACKEND naming it. */
depot_status depot_ipc_send(int socket, depot_device_kind kind, int device, void* ptr, int timeout_ms);
/* Receives what depot_ipc_send (or C++'s depot::ipc_send) sent and opens it, as
 * depot_ipc_open does: *mapping, *ptr (may be NULL) and *bytes (may be NULL). timeout_ms as
 * for depot_ipc_send (0 takes only what is ready now). A closed socket, a failing call or
 * the timeout is DEPOT_ERROR_BACKEND; data that is no handle DEPOT_ERROR_INVALID_ARGUMENT;
 * nothing is left open then. The received descriptors are closed once mapped. */
depot_status depot_ipc_receive(int socket, int timeout_ms, depot_ipc_mapping** mapping, void** ptr, size_t* bytes);
/* A handle received and not opened: what a process that passes blocks on (a broker)
 * holds, with the page descriptors that came with it (its own, closed by
 * depot_ipc_received_free). Thread-safe; handles are never reused (one that is not held is
 * DEPOT_ERROR_INVALID_ARGUMENT). */
typedef struct depot_ipc_received depot_ipc_received;
/* Receives what depot_ipc_send or depot_ipc_forward sent, as depot_ipc_receive does, into
 * *received without opening it (no device is touched: any build may pass on any handle).
 * *received is NULL on any refusal, with nothing left open. */
depot_status depot_ipc_receive_handle(int socket, int timeout_ms, depot_ipc_received** received);
/* Sends the received handle on, with its descriptors, as depot_ipc_send does (timeout_ms
 * the same); it stays held (forward it again, open it, or free it). */
depot_status depot_ipc_forward(int socket, const depot_ipc_received* received, int timeout_ms);
/* Opens the received handle as depot_ipc_receive would have (its descriptors stay held). */
depot_status depot_ipc_open_received(const depot_ipc_received* received, depot_ipc_mapping** mapping, void** ptr,
                                     size_t* bytes);
/* Frees it and closes its descriptors (NULL is a no-op); mappings opened from it stay. */
depot_status depot_ipc_received_free(depot_ipc_received* received);

/* The message of the calling thread's last failed call ("" if none failed yet); valid
 * until its next failed call. */
const char* depot_last_error(void);
/* "DEPOT_SUCCESS", "DEPOT_ERROR_OUT_OF_MEMORY", ...; "unknown depot_status" otherwise. */
const char* depot_status_name(depot_status status);

#ifdef __cplusplus
}
#endif

#endif /* DEPOT_POOL_C_API_H */
