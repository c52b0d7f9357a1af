// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/device_upstream.hpp>

#include <memory>
#include <mutex>
#include <vector>

namespace depot {

namespace detail {
// One lazily built allocator per device index, process-wide. Deliberately never destroyed:
// at exit the backend runtime may already be gone, and the process returns the memory.
template <device D, bool Pinned>
caching_allocator<D>& process_pool(int device)
{
  runtime<D>::check_device(device);
  static std::mutex mu;
  static auto* pools = new std::vector<caching_allocator<D>*>(static_cast<std::size_t>(device_count<D>()), nullptr);
  std::lock_guard g{mu};
  auto& slot = (*pools)[static_cast<std::size_t>(device)];
  if (slot == nullptr) {
    slot = new caching_allocator<D>(std::make_unique<device_upstream<D>>(device, Pinned),
                                    allocator_config::from_environment());
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
