// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/detail/fork_hooks.hpp>
#include <depot/pool/device_upstream.hpp>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace depot {

namespace detail {
// One lazily built allocator per device index, process-wide. The allocators themselves are
// deliberately never destroyed (work may still run at exit); an exit handler, registered
// on first use and so run before the backend runtime's own teardown, returns their cached
// free segments, so leak checkers see only blocks the program still holds.
template <device D, bool Pinned>
std::vector<caching_allocator<D>*>& process_pools()
{
  static auto* pools = new std::vector<caching_allocator<D>*>(static_cast<std::size_t>(device_count<D>()), nullptr);
  return *pools;
}

template <device D, bool Pinned>
void empty_process_pools() noexcept
{
  // At exit nothing can act on a failure; the process returns the memory anyway.
  for (caching_allocator<D>* p : process_pools<D, Pinned>()) {
    try {
      if (p != nullptr) p->empty_cache();
    } catch (...) {
    }
  }
}

template <device D, bool Pinned>
caching_allocator<D>& process_pool(int device)
{
  runtime<D>::check_device(device);
  std::lock_guard g{process_pool_mutex()};  // the library's (held across a fork)
  auto& slot = process_pools<D, Pinned>()[static_cast<std::size_t>(device)];
  if (slot == nullptr) {
    slot = new caching_allocator<D>(std::make_unique<device_upstream<D>>(device, Pinned),
                                    allocator_config::from_environment());
    static const bool registered = std::atexit(&empty_process_pools<D, Pinned>) == 0;
    (void)registered;
  }
  return *slot;
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
