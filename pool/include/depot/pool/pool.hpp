// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/detail/fork_hooks.hpp>
#include <depot/pool/device_upstream.hpp>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace depot {

namespace detail {
// One lazily built allocator per device index, process-wide. The allocators themselves are
// deliberately never destroyed (work may still run at exit); an exit handler, registered
// on first use and so run before the backend runtime's own teardown, returns their cached
// free segments, so leak checkers see only blocks the program still holds. A slot is
// published once, built, with a release store: later calls read it without a lock (the C
// interface looks its pool up at every call, from any number of threads).
template <device D, bool Pinned>
std::vector<std::atomic<caching_allocator<D>*>>& process_pools()
{
  static auto* pools =
      new std::vector<std::atomic<caching_allocator<D>*>>(static_cast<std::size_t>(device_count<D>()));
  return *pools;
}

template <device D, bool Pinned>
void empty_process_pools() noexcept
{
  // At exit nothing can act on a failure; the process returns the memory anyway.
  for (const auto& slot : process_pools<D, Pinned>()) {
    try {
      if (caching_allocator<D>* p = slot.load(std::memory_order_acquire); p != nullptr) p->empty_cache();
    } catch (...) {
    }
  }
}

template <device D, bool Pinned>
[[gnu::cold]] caching_allocator<D>& build_process_pool(std::atomic<caching_allocator<D>*>& slot, int device)
{
  std::lock_guard g{process_pool_mutex()};  // the library's (held across a fork)
  caching_allocator<D>* p = slot.load(std::memory_order_relaxed);
  if (p == nullptr) {
    p = new caching_allocator<D>(std::make_unique<device_upstream<D>>(device, Pinned),
                                 allocator_config::from_environment());
    static const bool registered = std::atexit(&empty_process_pools<D, Pinned>) == 0;
    (void)registered;
    slot.store(p, std::memory_order_release);
  }
  return *p;
}

template <device D, bool Pinned>
caching_allocator<D>& process_pool(int device)
{
  runtime<D>::check_device(device);
  auto& slot = process_pools<D, Pinned>()[static_cast<std::size_t>(device)];
  if (caching_allocator<D>* p = slot.load(std::memory_order_acquire); p != nullptr) [[likely]] {
    return *p;
  }
  return build_process_pool<D, Pinned>(slot, device);
}
}  // namespace detail

// The process-wide caching allocator of device `device` of backend D, built on first use
// (configured from DEPOT_ALLOC_CONF; a bad setting throws depot::invalid_argument then).
template <device D>
[[nodiscard]] caching_allocator<D>& pool(int device = 0)
{
  return detail::process_pool<D, false>(device);
}

// The process-wide caching pool of pinned host memory for staging transfers to and from
// device `device` of backend D; ordered on D's streams like pool<D>.
template <device D>
[[nodiscard]] caching_allocator<D>& pinned_pool(int device = 0)
{
  return detail::process_pool<D, true>(device);
}

}  // namespace depot
