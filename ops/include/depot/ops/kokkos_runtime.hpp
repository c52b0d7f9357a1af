// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <string>

namespace depot::ops {

// depot's ops run on Kokkos. Kokkos is started on the first op (or by ensure_kokkos())
// and finalised at process exit, unless the application started Kokkos itself, in which
// case depot leaves both to it. Thread-safe. Kokkos itself is never included by this header.
void ensure_kokkos();

[[nodiscard]] bool kokkos_is_initialized() noexcept;

// "Kokkos 3.4.1: Cuda (device), OpenMP (host)": the version and execution spaces in use.
[[nodiscard]] std::string kokkos_description();

}  // namespace depot::ops
