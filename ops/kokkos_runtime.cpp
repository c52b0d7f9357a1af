// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "kokkos/device_space.hpp"

#include <depot/ops/kokkos_runtime.hpp>

#include <cstdlib>
#include <mutex>
#include <string>

namespace depot::ops {

namespace {

std::once_flag started;

void finalize_at_exit() noexcept
{
  // Runs from std::atexit, after main; Kokkos reports its own problems, nothing to throw to.
  if (Kokkos::is_initialized()) Kokkos::finalize();
}

}  // namespace

void ensure_kokkos()
{
  std::call_once(started, [] {
    if (Kokkos::is_initialized()) return;  // the application owns Kokkos
    char name[] = "depot";
    char quiet[] = "--kokkos-disable-warnings";
    char* argv[] = {name, quiet, nullptr};
    int argc = 2;
    Kokkos::initialize(argc, argv);
    std::atexit(finalize_at_exit);
  });
}

bool kokkos_is_initialized() noexcept { return Kokkos::is_initialized(); }

std::string kokkos_description()
{
  const int v = KOKKOS_VERSION;
  std::string text = "Kokkos " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) +
                     "." + std::to_string(v % 100) + ": ";
  text += Kokkos::DefaultExecutionSpace::name();
  text += " (default)";
  text += ", ";
  text += Kokkos::DefaultHostExecutionSpace::name();
  text += " (host)";
  return text;
}

template <class D>
std::size_t kept_instances()
{
  return D::kokkos::kept_instances();
}

template std::size_t kept_instances<host>();
#if DEPOT_HAS_CUDA
template std::size_t kept_instances<cuda>();
#endif
#if DEPOT_HAS_HIP
template std::size_t kept_instances<hip>();
#endif

}  // namespace depot::ops
