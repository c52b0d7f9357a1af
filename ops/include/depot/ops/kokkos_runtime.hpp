// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>
#include <string>

namespace depot::ops {

// depot's ops run on Kokkos. Kokkos is started on the first op (or by ensure_kokkos())
// and finalised at process exit, unless the application started Kokkos itself, in which
// case depot leaves both to it. Thread-safe. Kokkos itself is never included by this header.
void ensure_kokkos();

[[nodiscard]] bool kokkos_is_initialized() noexcept;

// "Kokkos 3.4.1: Cuda (device), OpenMP (host)": the version and execution spaces in use.
[[nodiscard]] std::string kokkos_description();

// How many streams of backend D have a Kokkos execution-space instance kept now: made on a
// stream's first kernel, dropped as the stream closes (a depot::stream's destruction, or
// stream_registry::closing() for a raw handle) or Kokkos finalises. The host's streams
// share Kokkos' default instance: 0. D: depot::host, or an enabled GPU backend.
template <class D>
[[nodiscard]] std::size_t kept_instances();

}  // namespace depot::ops
