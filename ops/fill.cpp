// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "kokkos/device_space.hpp"

#include <depot/hal/expects.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/kokkos_runtime.hpp>

#include <string>

namespace depot::ops {

template <device D, class T>
void fill(T* data, std::size_t n, T value, stream_ref<D> stream)
{
  if (n == 0) return;
  DEPOT_EXPECTS(data != nullptr,
                "depot::ops::fill: null data with n = " + std::to_string(n) + " elements");
  ensure_kokkos();
  using exec = typename D::kokkos::execution_space;
  Kokkos::parallel_for("depot::fill",
                       Kokkos::RangePolicy<exec, Kokkos::IndexType<std::size_t>>(
                           D::kokkos::instance(stream), 0, n),
                       KOKKOS_LAMBDA(std::size_t i) { data[i] = value; });
}

#define DEPOT_OPS_FILL_DEFINE(D, T) template void fill<D, T>(T*, std::size_t, T, stream_ref<D>);
#define DEPOT_OPS_FILL_DEFINE_ALL(D)          \
  DEPOT_OPS_FILL_DEFINE(D, float)             \
  DEPOT_OPS_FILL_DEFINE(D, double)            \
  DEPOT_OPS_FILL_DEFINE(D, std::int32_t)      \
  DEPOT_OPS_FILL_DEFINE(D, std::int64_t)      \
  DEPOT_OPS_FILL_DEFINE(D, std::uint8_t)

DEPOT_OPS_FILL_DEFINE_ALL(host)
#if DEPOT_HAS_CUDA
DEPOT_OPS_FILL_DEFINE_ALL(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_OPS_FILL_DEFINE_ALL(hip)
#endif

}  // namespace depot::ops
