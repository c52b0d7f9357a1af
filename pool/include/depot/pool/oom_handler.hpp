// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/out_of_memory.hpp>

#include <functional>

namespace depot {

// What a caching allocator calls when a request still fails after its own retries (waiting
// for pending frees, releasing its cache), before depot::out_of_memory reaches the caller,
// as RMM's failure-callback adaptor and PyTorch's out-of-memory observers do. It gets the
// exception that would be thrown (request, device, the report) and the attempt (1 for the
// request's first failure); it may free memory or empty caches, this allocator's included
// (no lock of it is held), and returns true to have the request tried again, false to let
// the exception go. Called on the failing thread, by as many threads as fail at once: it
// must be thread-safe. An exception it throws goes to the caller instead.
using oom_handler = std::function<bool(const out_of_memory& error, unsigned attempt)>;

}  // namespace depot
