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
#include <depot/hal/stream_keyed.hpp>
#include <depot/hal/stream_registry.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
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
// A stream's execution-space instance with the lock of its scratch area (scratch_guard):
// found once per reduction or scan, then handed to its kernels. The lock's owner keeps the
// instance alive while it is held (a stream closing meanwhile frees it as the lock goes).
template <class Exec>
struct locked_instance {
  Exec exec;
  std::shared_ptr<std::mutex> lock;
};

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

// The execution-space instances of a GPU backend's streams, each made on the stream's first
// kernel and kept until the stream closes (a depot::stream's destruction, or closing() by a
// raw handle's owner) or Kokkos finalises: making one allocates device scratch memory
// (Kokkos 3.x: four allocations and a memset), far too slow per launch. Kept for every
// stream ever used, they grew without bound in a program that makes and destroys streams.
// Each has its own lock for its scratch area (scratch_guard). Thread-safe: a launch finds
// its stream's instance by stream_keyed's shared lock and binary search (threads that launch
// at once do not wait for each other), and a new stream's instance is made outside that
// lock (launches on other streams go on; Kokkos makes one instance at a time). Never
// destroyed (streams close during static destruction too). A refusal by Kokkos is a
// depot::error naming the stream (and instance_hint's cause).
template <class Exec, class Native>
class instance_table {
 public:
  // Entries are shared with the scratch_guards that hold their lock, so a stream closing
  // meanwhile frees none in use. (Held by pointer: hipcc 5.2's clang crashes instantiating
  // std::map of a Kokkos execution space in device compilation.)
  struct entry {
    Native stream;
    Exec exec;
    std::mutex scratch;
  };

  static instance_table& get(device_kind kind)
  {
    static instance_table* const table = [kind] {
      auto t = std::make_unique<instance_table>(kind);
      stream_registry::watch(&t->kept_);  // (may throw std::bad_alloc: tried again next time)
      return t.release();
    }();
    return *table;
  }
  explicit instance_table(device_kind kind) noexcept : kept_{kind} {}

  Exec instance(Native stream) { return find(stream)->exec; }
  // The stream's instance and the lock of its scratch area (which keeps it alive): one lookup.
  locked_instance<Exec> locked(Native stream)
  {
    std::shared_ptr<entry> e = find(stream);
    std::mutex* const m = &e->scratch;
    return {e->exec, std::shared_ptr<std::mutex>{std::move(e), m}};
  }
  [[nodiscard]] std::size_t size() const { return kept_.size(); }

 private:
  std::shared_ptr<entry> find(Native stream)
  {
    if (!hooked_.load(std::memory_order_acquire)) hook();
    return kept_.get(static_cast<native_stream>(stream), [stream] {
      try {
        return std::shared_ptr<entry>(new entry{stream, Exec{stream}, {}});
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& e) {  // Kokkos refused (its runtime_error): said plainly
        throw depot::error(std::string{"depot::ops: Kokkos made no execution-space instance for stream "} +
                               std::to_string(reinterpret_cast<std::uintptr_t>(stream)) + " (" + e.what() + ")" +
                               instance_hint(),
                           "Kokkos execution-space instance for a stream", __FILE__, __LINE__, 0, "kokkos_instance");
      }
    });
  }
  // Kokkos' finalisation drops every instance (once per initialisation).
  void hook()
  {
    const std::lock_guard<std::mutex> lock{hook_mu_};
    if (hooked_.load(std::memory_order_relaxed)) return;
    Kokkos::push_finalize_hook([this] {
      kept_.clear();
      hooked_.store(false, std::memory_order_release);
    });
    hooked_.store(true, std::memory_order_release);
  }

  stream_keyed<entry> kept_;
  std::mutex hook_mu_;
  std::atomic<bool> hooked_{false};
};

// Exec's default instance (the default stream's, or the host's one instance) with the lock
// a reduction or scan there holds: shared by every thread that launches there.
template <class Exec>
locked_instance<Exec> default_locked()
{
  static std::mutex m;
  return {Exec{}, std::shared_ptr<std::mutex>{std::shared_ptr<void>{}, &m}};
}
}  // namespace depot::ops::detail

struct depot::host::kokkos {
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using memory_space = Kokkos::HostSpace;
  // Host streams complete work at once; the default instance serves them all.
  static execution_space instance(stream_ref<host>) { return execution_space{}; }
  static depot::ops::detail::locked_instance<execution_space> locked_instance(stream_ref<host>)
  {
    return depot::ops::detail::default_locked<execution_space>();
  }
  static std::size_t kept_instances() { return 0; }
};

#if DEPOT_HAS_CUDA
struct depot::cuda::kokkos {
  using execution_space = Kokkos::Cuda;
  using memory_space = Kokkos::CudaSpace;
  using table = depot::ops::detail::instance_table<execution_space, cudaStream_t>;
  static execution_space instance(stream_ref<cuda> s)
  {
    return s.is_default() ? execution_space{}
                          : table::get(device_kind::cuda).instance(static_cast<cudaStream_t>(s.native()));
  }
  static depot::ops::detail::locked_instance<execution_space> locked_instance(stream_ref<cuda> s)
  {
    return s.is_default() ? depot::ops::detail::default_locked<execution_space>()
                          : table::get(device_kind::cuda).locked(static_cast<cudaStream_t>(s.native()));
  }
  static std::size_t kept_instances() { return table::get(device_kind::cuda).size(); }
};
#endif

#if DEPOT_HAS_HIP
struct depot::hip::kokkos {
  using execution_space = depot::ops::detail::kokkos_hip;
  using memory_space = depot::ops::detail::kokkos_hip_space;
  using table = depot::ops::detail::instance_table<execution_space, hipStream_t>;
  static execution_space instance(stream_ref<hip> s)
  {
    return s.is_default() ? execution_space{}
                          : table::get(device_kind::hip).instance(static_cast<hipStream_t>(s.native()));
  }
  static depot::ops::detail::locked_instance<execution_space> locked_instance(stream_ref<hip> s)
  {
    return s.is_default() ? depot::ops::detail::default_locked<execution_space>()
                          : table::get(device_kind::hip).locked(static_cast<hipStream_t>(s.native()));
  }
  static std::size_t kept_instances() { return table::get(device_kind::hip).size(); }
};
#endif
