// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/backend_runtime.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/gpu/gpu_runtime.hpp>
#include <depot/hal/host/host_runtime.hpp>

#include <type_traits>

namespace depot {

namespace detail {
template <device D>
struct enabled_runtime {
  static_assert(!std::is_same_v<D, cuda> || DEPOT_HAS_CUDA,
                "depot was built without the CUDA backend: configure with "
                "`tools/bootstrap --gpu cuda && meson setup BUILDDIR -Dgpu=cuda`");
  static_assert(!std::is_same_v<D, hip> || DEPOT_HAS_HIP,
                "depot was built without the HIP backend: configure with "
                "`tools/bootstrap --gpu hip && meson setup BUILDDIR -Dgpu=hip`");
  using type = typename D::runtime;
};
}  // namespace detail

// The backend runtime of device tag D: depot::runtime<depot::cuda>::device_count().
// Naming the runtime of a backend this build lacks is a compile error that says how to
// enable it.
template <device D>
using runtime = typename detail::enabled_runtime<D>::type;

// Convenience free functions over runtime<D>.
template <device D>
[[nodiscard]] int device_count() noexcept
{
  return runtime<D>::device_count();
}

template <device D>
[[nodiscard]] device_properties get_device_properties(int device = 0)
{
  return runtime<D>::properties(device);
}

template <device D>
[[nodiscard]] memory_info get_memory_info(int device = 0)
{
  return runtime<D>::memory(device);
}

template <device D>
void synchronize(int device = 0)
{
  runtime<D>::synchronize(device);
}

}  // namespace depot
