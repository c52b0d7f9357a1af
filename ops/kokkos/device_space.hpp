// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Internal to ops/: the Kokkos spaces each device tag names (the tags declare `kokkos`,
// this defines it), and the execution-space instance that runs on a depot stream. Works
// with Kokkos 3.4 and newer (HIP moved out of Kokkos::Experimental in 4.0).
#include <Kokkos_Core.hpp>

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/stream_ref.hpp>

#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#if DEPOT_HAS_CUDA && !defined(KOKKOS_ENABLE_CUDA)
#error "depot was configured with -Dgpu=cuda but this Kokkos has no CUDA backend"
#endif
#if DEPOT_HAS_HIP && !defined(KOKKOS_ENABLE_HIP)
#error "depot was configured with -Dgpu=hip but this Kokkos has no HIP backend"
#endif

namespace depot::ops::detail {
#if defined(KOKKOS_ENABLE_HIP)
#if KOKKOS_VERSION >= 40000
using kokkos_hip = Kokkos::HIP;
using kokkos_hip_space = Kokkos::HIPSpace;
#else
using kokkos_hip = Kokkos::Experimental::HIP;
using kokkos_hip_space = Kokkos::Experimental::HIPSpace;
#endif
#endif

// Kokkos 3.x with the OpenMP host backend keeps its host space's state per thread (set on
// the thread that initialised Kokkos alone); Kokkos 4 keeps it per process.
#if KOKKOS_VERSION < 40000 && defined(KOKKOS_ENABLE_OPENMP)
#define DEPOT_KOKKOS_HOST_STATE_PER_THREAD 1
#else
#define DEPOT_KOKKOS_HOST_STATE_PER_THREAD 0
#endif

// What a refused instance may mean. With the host state per thread, Kokkos makes a GPU
// instance only on the thread that initialised it; an instance, once made, serves every
// thread.
inline std::string instance_hint()
{
#if DEPOT_KOKKOS_HOST_STATE_PER_THREAD
  return "; Kokkos 3.x with the OpenMP host backend makes a stream's instance only on the thread that "
         "initialised Kokkos: run a first kernel on this stream from that thread (its instance then "
         "serves every thread), or use Kokkos 4 or newer";
#else
  return "";
#endif
}

// The execution-space instance for a backend stream, created on first use and kept: in
// Kokkos 3.x constructing an instance from a stream allocates device scratch memory, far
// too slow per launch. The instances are released by a Kokkos finalize hook, before
// Kokkos finalises (whether depot or the application finalises it). Thread-safe. A
// refusal by Kokkos is a depot::error naming the stream (and instance_hint's cause).
template <class Exec, class Native>
Exec instance_for(Native stream)
{
  // A singly linked list, not a std::map: hipcc 5.2's clang crashes instantiating std::map
  // of a Kokkos execution space in device compilation. Programs use few streams.
  struct entry {
    Native stream;
    Exec exec;
    entry* next;
  };
  static std::mutex m;
  static entry* head = nullptr;
  static bool hooked = false;
  std::lock_guard<std::mutex> lock{m};
  if (!hooked) {
    hooked = true;
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> l{m};
      while (head != nullptr) delete std::exchange(head, head->next);
      hooked = false;
    });
  }
  for (entry* e = head; e != nullptr; e = e->next) {
    if (e->stream == stream) return e->exec;
  }
  entry* made = nullptr;
  try {
    made = new entry{stream, Exec{stream}, head};
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // Kokkos refused (its runtime_error): said plainly
    throw depot::error(std::string{"depot::ops: Kokkos made no execution-space instance for stream "} +
                           std::to_string(reinterpret_cast<std::uintptr_t>(stream)) + " (" + e.what() + ")" +
                           instance_hint(),
                       "Kokkos execution-space instance for a stream", __FILE__, __LINE__, 0, "kokkos_instance");
  }
  head = made;
  return head->exec;
}
}  // namespace depot::ops::detail

struct depot::host::kokkos {
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using memory_space = Kokkos::HostSpace;
  // Host streams complete work at once; the default instance serves them all.
  static execution_space instance(stream_ref<host>) { return execution_space{}; }
};

#if DEPOT_HAS_CUDA
struct depot::cuda::kokkos {
  using execution_space = Kokkos::Cuda;
  using memory_space = Kokkos::CudaSpace;
  static execution_space instance(stream_ref<cuda> s)
  {
    return s.is_default() ? execution_space{}
                          : depot::ops::detail::instance_for<execution_space>(static_cast<cudaStream_t>(s.native()));
  }
};
#endif

#if DEPOT_HAS_HIP
struct depot::hip::kokkos {
  using execution_space = depot::ops::detail::kokkos_hip;
  using memory_space = depot::ops::detail::kokkos_hip_space;
  static execution_space instance(stream_ref<hip> s)
  {
    return s.is_default() ? execution_space{}
                          : depot::ops::detail::instance_for<execution_space>(static_cast<hipStream_t>(s.native()));
  }
};
#endif
