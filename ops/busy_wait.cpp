// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "kokkos/device_space.hpp"

#include <depot/hal/expects.hpp>
#include <depot/ops/busy_wait.hpp>
#include <depot/ops/kokkos_runtime.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

namespace depot::ops {

namespace {

// Ticks of the clock the kernel reads on backend D, per microsecond.
template <device D>
constexpr std::uint64_t ticks_per_us()
{
  // HIP: wall_clock64() reads s_memrealtime, a constant 100 MHz on gfx9 and CDNA GPUs (the HIP
  // headers this builds with have no hipDeviceAttributeWallClockRate to ask).
  if constexpr (D::kind == device_kind::hip) return 100;
  return 1000;  // CUDA %globaltimer and the host's steady_clock count nanoseconds
}

}  // namespace

template <device D>
void busy_wait(std::chrono::nanoseconds duration, stream_ref<D> stream)
{
  DEPOT_EXPECTS(duration.count() >= 0 && duration <= std::chrono::seconds{60},
                "depot::ops::busy_wait: duration " + std::to_string(duration.count()) +
                    " ns is out of range; valid durations are 0 to 60 s");
  if (duration.count() == 0) return;
  if constexpr (std::is_same_v<D, host>) {
    // Host streams complete work at once: spin in the calling thread. (A parallel region of
    // one iteration would add the wake-up of a whole OpenMP team to every call.)
    const auto until = std::chrono::steady_clock::now() + duration;
    while (std::chrono::steady_clock::now() < until) {
    }
    return;
  }
  ensure_kokkos();
  using exec = typename D::kokkos::execution_space;
  const std::uint64_t ns = static_cast<std::uint64_t>(duration.count());
  const std::uint64_t ticks = ns * ticks_per_us<D>() / 1000;
  Kokkos::parallel_for(
      "depot::busy_wait", Kokkos::RangePolicy<exec>(D::kokkos::instance(stream), 0, 1),
      KOKKOS_LAMBDA(int) {
#if defined(__CUDA_ARCH__)
        std::uint64_t start = 0;
        std::uint64_t now = 0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do {
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now - start < ticks);
#elif defined(__HIP_DEVICE_COMPILE__)
        const auto start = static_cast<std::uint64_t>(wall_clock64());
        while (static_cast<std::uint64_t>(wall_clock64()) - start < ticks) {
        }
#else
        const auto start = std::chrono::steady_clock::now();
        const auto until = start + std::chrono::nanoseconds{static_cast<std::int64_t>(ticks)};
        while (std::chrono::steady_clock::now() < until) {
        }
#endif
      });
}

template void busy_wait<host>(std::chrono::nanoseconds, stream_ref<host>);
#if DEPOT_HAS_CUDA
template void busy_wait<cuda>(std::chrono::nanoseconds, stream_ref<cuda>);
#endif
#if DEPOT_HAS_HIP
template void busy_wait<hip>(std::chrono::nanoseconds, stream_ref<hip>);
#endif

}  // namespace depot::ops
