// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>

namespace depot {

// Backend handles cross the public interface as opaque pointers, so that no public header
// includes a backend's runtime header: a cudaStream_t / hipStream_t converts to and from
// native_stream, a cudaEvent_t / hipEvent_t to and from native_event. The null stream is
// the backend's default stream.
using native_stream = void*;
using native_event = void*;
// An instantiated graph of captured work (cudaGraphExec_t / hipGraphExec_t).
using native_graph = void*;

// The handles CUDA and HIP give their built-in streams, which are never destroyed: the
// null stream (the default stream), 0x1 (cudaStreamLegacy) and 0x2 (cudaStreamPerThread,
// hipStreamPerThread: the calling thread's own default stream, a different stream on each
// thread behind one handle). Every other handle names a created stream.
inline constexpr std::uintptr_t legacy_stream_handle = 1;
inline constexpr std::uintptr_t per_thread_stream_handle = 2;
[[nodiscard]] inline bool is_per_thread_stream(native_stream s) noexcept
{
  return reinterpret_cast<std::uintptr_t>(s) == per_thread_stream_handle;
}
[[nodiscard]] inline bool is_built_in_stream(native_stream s) noexcept
{
  return reinterpret_cast<std::uintptr_t>(s) <= per_thread_stream_handle;
}

}  // namespace depot
