// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// The name mapping that lets CUDA and HIP share one implementation (gpu_runtime_impl.hpp).
// DEPOT_GPU_API_TABLE(cuda) or (hip), expanded inside a backend's `Api` struct after its
// runtime header, declares the types, constants and one-line wrappers whose names differ
// only by the prefix. What differs in more than the prefix (pinned allocation, attribute
// enumerators, architecture names) each backend's `Api` struct spells out itself.
// Used only by hal/cuda/cuda_api.hpp and hal/hip/hip_api.hpp.

#define DEPOT_GPU_API_TABLE(P)                                                                    \
  using error_t = P##Error_t;                                                                     \
  using stream_t = P##Stream_t;                                                                   \
  using event_t = P##Event_t;                                                                     \
  static constexpr error_t success = P##Success;                                                  \
  static constexpr error_t not_ready = P##ErrorNotReady;                                          \
  static constexpr error_t memory_allocation = P##ErrorMemoryAllocation;                          \
  static constexpr error_t invalid_value = P##ErrorInvalidValue;                                  \
  static constexpr error_t not_supported = P##ErrorNotSupported;                                  \
  static constexpr error_t peer_access_already_enabled = P##ErrorPeerAccessAlreadyEnabled;        \
  static constexpr unsigned stream_non_blocking = P##StreamNonBlocking;                           \
  static constexpr unsigned event_default = P##EventDefault;                                      \
  static constexpr unsigned event_disable_timing = P##EventDisableTiming;                         \
  static const char* error_name(error_t e) { return P##GetErrorName(e); }                         \
  static const char* error_string(error_t e) { return P##GetErrorString(e); }                     \
  static error_t get_last_error() { return P##GetLastError(); }                                   \
  static error_t get_device_count(int* n) { return P##GetDeviceCount(n); }                        \
  static error_t get_device(int* d) { return P##GetDevice(d); }                                   \
  static error_t set_device(int d) { return P##SetDevice(d); }                                    \
  static error_t get_properties(properties_t* p, int d) { return P##GetDeviceProperties(p, d); }  \
  static error_t get_attribute(int* v, attribute_t a, int d) { return P##DeviceGetAttribute(v, a, d); } \
  static error_t mem_get_info(std::size_t* f, std::size_t* t) { return P##MemGetInfo(f, t); }     \
  static error_t malloc(void** p, std::size_t n) { return P##Malloc(p, n); }                      \
  static error_t free(void* p) { return P##Free(p); }                                             \
  static error_t malloc_async(void** p, std::size_t n, stream_t s) { return P##MallocAsync(p, n, s); } \
  static error_t free_async(void* p, stream_t s) { return P##FreeAsync(p, s); }                   \
  static error_t malloc_managed(void** p, std::size_t n)                                          \
  {                                                                                               \
    return P##MallocManaged(p, n, P##MemAttachGlobal);                                            \
  }                                                                                               \
  static error_t set_release_threshold(int d, unsigned long long bytes)                           \
  {                                                                                               \
    P##MemPool_t pool{};                                                                          \
    if (auto e = P##DeviceGetDefaultMemPool(&pool, d); e != P##Success) return e;                 \
    return P##MemPoolSetAttribute(pool, P##MemPoolAttrReleaseThreshold, &bytes);                  \
  }                                                                                               \
  static error_t memcpy(void* d, const void* s, std::size_t n)                                    \
  {                                                                                               \
    return P##Memcpy(d, s, n, P##MemcpyDefault);                                                  \
  }                                                                                               \
  static error_t memcpy_async(void* d, const void* s, std::size_t n, stream_t st)                 \
  {                                                                                               \
    return P##MemcpyAsync(d, s, n, P##MemcpyDefault, st);                                         \
  }                                                                                               \
  static error_t memcpy_peer_async(void* d, int dd, const void* s, int sd, std::size_t n,         \
                                   stream_t st)                                                   \
  {                                                                                               \
    return P##MemcpyPeerAsync(d, dd, s, sd, n, st);                                               \
  }                                                                                               \
  static error_t memset_async(void* d, int v, std::size_t n, stream_t st)                         \
  {                                                                                               \
    return P##MemsetAsync(d, v, n, st);                                                           \
  }                                                                                               \
  static error_t can_access_peer(int* r, int d, int p) { return P##DeviceCanAccessPeer(r, d, p); } \
  static error_t enable_peer_access(int p) { return P##DeviceEnablePeerAccess(p, 0); }            \
  static error_t stream_create(stream_t* s, unsigned f) { return P##StreamCreateWithFlags(s, f); } \
  static error_t stream_destroy(stream_t s) { return P##StreamDestroy(s); }                       \
  static error_t stream_synchronize(stream_t s) { return P##StreamSynchronize(s); }               \
  static error_t stream_query(stream_t s) { return P##StreamQuery(s); }                           \
  static error_t stream_wait_event(stream_t s, event_t e) { return P##StreamWaitEvent(s, e, 0); } \
  static error_t event_create(event_t* e, unsigned f) { return P##EventCreateWithFlags(e, f); }   \
  static error_t event_destroy(event_t e) { return P##EventDestroy(e); }                          \
  static error_t event_record(event_t e, stream_t s) { return P##EventRecord(e, s); }             \
  static error_t event_query(event_t e) { return P##EventQuery(e); }                              \
  static error_t event_synchronize(event_t e) { return P##EventSynchronize(e); }                  \
  using graph_t = P##Graph_t;                                                                      \
  using graph_exec_t = P##GraphExec_t;                                                            \
  using capture_mode_t = P##StreamCaptureMode;                                                    \
  static constexpr capture_mode_t capture_relaxed = P##StreamCaptureModeRelaxed;                  \
  static error_t begin_capture(stream_t s) { return P##StreamBeginCapture(s, P##StreamCaptureModeGlobal); } \
  static error_t end_capture(stream_t s, graph_t* g) { return P##StreamEndCapture(s, g); }        \
  static error_t graph_instantiate(graph_exec_t* x, graph_t g) { return P##GraphInstantiateWithFlags(x, g, 0); } \
  static error_t graph_destroy(graph_t g) { return P##GraphDestroy(g); }                          \
  static error_t graph_launch(graph_exec_t x, stream_t s) { return P##GraphLaunch(x, s); }         \
  static error_t graph_exec_destroy(graph_exec_t x) { return P##GraphExecDestroy(x); }            \
  static error_t stream_capturing(stream_t s, bool* active)                                       \
  {                                                                                               \
    P##StreamCaptureStatus st{};                                                                  \
    const error_t e = P##StreamIsCapturing(s, &st);                                               \
    *active = st == P##StreamCaptureStatusActive;                                                 \
    return e;                                                                                     \
  }                                                                                               \
  static error_t exchange_capture_mode(capture_mode_t* m) { return P##ThreadExchangeStreamCaptureMode(m); } \
  static error_t event_elapsed(float* ms, event_t a, event_t b)                                   \
  {                                                                                               \
    return P##EventElapsedTime(ms, a, b);                                                         \
  }                                                                                               \
  static error_t device_synchronize() { return P##DeviceSynchronize(); }                          \
  using ipc_handle_t = P##IpcMemHandle_t;                                                         \
  static error_t ipc_get(ipc_handle_t* h, void* p) { return P##IpcGetMemHandle(h, p); }           \
  static error_t ipc_open(void** p, ipc_handle_t h)                                               \
  {                                                                                               \
    return P##IpcOpenMemHandle(p, h, P##IpcMemLazyEnablePeerAccess);                              \
  }                                                                                               \
  static error_t ipc_close(void* p) { return P##IpcCloseMemHandle(p); }
