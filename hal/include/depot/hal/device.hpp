// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/device_kind.hpp>

#include <concepts>
#include <string_view>

namespace depot {

namespace hal {
class host_runtime;
template <class Api>
class gpu_runtime;
struct cuda_api;
struct hip_api;
}  // namespace hal

// Device tags: empty types chosen at compile time. Each names its backend runtime
// (`runtime`, a class of static functions, see <depot/hal/runtime.hpp>) and declares a
// nested `kokkos` whose definition (execution_space, memory_space) lives in ops/ only.
// The host backend is always enabled; at most one GPU backend is enabled per build.
struct host {
  static constexpr std::string_view name = "host";
  static constexpr device_kind kind = device_kind::host;
  static constexpr bool enabled = true;
  using runtime = hal::host_runtime;
  struct kokkos;
};

struct cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr device_kind kind = device_kind::cuda;
  static constexpr bool enabled = DEPOT_HAS_CUDA != 0;
  using runtime = hal::gpu_runtime<hal::cuda_api>;
  struct kokkos;
};

struct hip {
  static constexpr std::string_view name = "hip";
  static constexpr device_kind kind = device_kind::hip;
  static constexpr bool enabled = DEPOT_HAS_HIP != 0;
  using runtime = hal::gpu_runtime<hal::hip_api>;
  struct kokkos;
};

// What every device tag provides.
template <class D>
concept device = requires {
  { D::name } -> std::convertible_to<std::string_view>;
  { D::kind } -> std::convertible_to<device_kind>;
  { D::enabled } -> std::convertible_to<bool>;
  typename D::runtime;
};

static_assert(device<host> && device<cuda> && device<hip>);

// True when this build of depot contains the backend of D.
template <device D>
inline constexpr bool is_enabled_v = D::enabled;

// True for the GPU backends (whether or not they are enabled in this build).
template <device D>
inline constexpr bool is_gpu_v = D::kind != device_kind::host;

}  // namespace depot
