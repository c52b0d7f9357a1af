// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

namespace depot {

// Backend handles cross the public interface as opaque pointers, so that no public header
// includes a backend's runtime header: a cudaStream_t / hipStream_t converts to and from
// native_stream, a cudaEvent_t / hipEvent_t to and from native_event. The null stream is
// the backend's default stream.
using native_stream = void*;
using native_event = void*;
// An instantiated graph of captured work (cudaGraphExec_t / hipGraphExec_t).
using native_graph = void*;

}  // namespace depot
