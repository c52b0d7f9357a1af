// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench staging`: a loop of (bring a batch from host memory to the device, run a compute
// kernel of a chosen duration on it), serially on one stream and through depot's staging
// (double_buffer, prefetcher). Overlap efficiency = ideal / measured, where ideal = steps *
// max(H2D copy, compute) per step. Also H2D bandwidth from depot's pinned pool against the
// backend's memcpy from pinned and from pageable memory, in the same run.
#include "bench_result.hpp"

#include <depot/config.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/ops/busy_wait.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/double_buffer.hpp>
#include <depot/storage/prefetch_options.hpp>
#include <depot/storage/prefetcher.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace depot::bench {

namespace {

using wall = std::chrono::steady_clock;

template <device D>
using rt = runtime<D>;

// The backend's own copy call, as the baseline rows name it.
template <device D>
std::string memcpy_name()
{
  if constexpr (D::kind == device_kind::cuda) return "cudaMemcpy";
  if constexpr (D::kind == device_kind::hip) return "hipMemcpy";
  return "memcpy";
}

double ms_since(wall::time_point t0)
{
  return std::chrono::duration<double, std::milli>(wall::now() - t0).count();
}

// Median wall time (ms) of op, which must return only once its work is complete.
double median_wall_ms(int warmup, int reps, const std::function<void()>& op)
{
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = wall::now();
    op();
    ms.push_back(ms_since(t0));
  }
  return median(ms);
}

// Median device time (ms) of the work op queues on s, timed with events.
template <device D>
double median_event_ms(int warmup, int reps, stream<D>& s, int device, const std::function<void()>& op)
{
  event<D> start{device, true};
  event<D> stop{device, true};
  for (int i = 0; i < warmup; ++i) op();
  s.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    start.record(s);
    op();
    stop.record(s);
    stop.synchronize();
    ms.push_back(event<D>::elapsed_ms(start, stop));
  }
  return median(ms);
}

template <device D>
struct pinned_memory {  // the backend's pinned allocation (cudaMallocHost), for the baseline
  explicit pinned_memory(std::size_t n) : ptr{rt<D>::allocate_pinned(n)} {}
  pinned_memory(const pinned_memory&) = delete;
  pinned_memory& operator=(const pinned_memory&) = delete;
  ~pinned_memory() { rt<D>::deallocate_pinned(ptr); }
  void* ptr;
};

template <device D>
struct pool_block {  // a block of depot's pinned pool
  pool_block(std::size_t n, int device) : pool{&pinned_pool<D>(device)}, ptr{pool->allocate(n)} {}
  pool_block(const pool_block&) = delete;
  pool_block& operator=(const pool_block&) = delete;
  ~pool_block() { pool->deallocate(ptr); }
  caching_allocator<D>* pool;
  void* ptr;
};

template <device D>
void staging_size(const options& opts, int device, std::size_t n, nlohmann::json& rows)
{
  const int reps = opts.staging_reps;
  const int steps = opts.staging_steps;
  stream<D> s{device};
  device_storage<std::byte, D> dev{n, device, s.ref()};
  pool_block<D> from_pool{n, device};
  pinned_memory<D> pinned{n};
  pinned_memory<D> pinned2{n};  // page-locked batches alternate between pinned and pinned2
  std::vector<std::vector<std::byte>> pageable(2, std::vector<std::byte>(n));
  for (std::size_t i = 0; i < n; ++i) {  // never time on zeros
    pageable[0][i] = static_cast<std::byte>(i * 131 + 7);
    pageable[1][i] = static_cast<std::byte>(i * 17 + 3);
  }
  std::memcpy(from_pool.ptr, pageable[0].data(), n);
  std::memcpy(pinned.ptr, pageable[0].data(), n);
  std::memcpy(pinned2.ptr, pageable[1].data(), n);
  const std::span<const std::byte> locked[2] = {{static_cast<const std::byte*>(pinned.ptr), n},
                                                {static_cast<const std::byte*>(pinned2.ptr), n}};

  // ---- bandwidth: one synchronous H2D copy each, wall time ----
  const double pool_ms = median_wall_ms(opts.warmup, opts.repetitions, [&] {
    rt<D>::copy_async(dev.data(), from_pool.ptr, n, s.native());
    s.synchronize();
  });
  const double pinned_ms = median_wall_ms(opts.warmup, opts.repetitions,
                                          [&] { rt<D>::copy(dev.data(), pinned.ptr, n); });
  const double pageable_ms = median_wall_ms(opts.warmup, opts.repetitions,
                                            [&] { rt<D>::copy(dev.data(), pageable[0].data(), n); });
  // Host copy into pinned memory: what staging a pageable batch costs the host.
  const double stage_ms = median_wall_ms(opts.warmup, opts.repetitions,
                                         [&] { std::memcpy(from_pool.ptr, pageable[1].data(), n); });

  // ---- the two halves of a step, device time ----
  const double h2d_ms = median_event_ms<D>(opts.warmup, opts.repetitions, s, device, [&] {
    rt<D>::copy_async(dev.data(), from_pool.ptr, n, s.native());
  });
  const auto compute = std::chrono::nanoseconds(static_cast<std::int64_t>(
      1e3 * std::max(1.0, opts.compute_us > 0 ? opts.compute_us : h2d_ms * 1e3)));
  const double compute_ms = median_event_ms<D>(opts.warmup, opts.repetitions, s, device,
                                               [&] { ops::busy_wait<D>(compute, s.ref()); });
  const double ideal_ms = steps * std::max(h2d_ms, compute_ms);

  // ---- the loops (wall time from the first call to the last result) ----
  struct loop {
    std::string name;
    std::function<void()> run;
  };
  std::vector<loop> loops;
  loops.push_back({"serial, pageable (" + memcpy_name<D>() + "Async + compute on one stream)", [&] {
                     for (int i = 0; i < steps; ++i) {
                       rt<D>::copy_async(dev.data(), pageable[i % 2].data(), n, s.native());
                       ops::busy_wait<D>(compute, s.ref());
                     }
                     s.synchronize();
                   }});
  loops.push_back({"serial, pinned (" + memcpy_name<D>() + "Async + compute on one stream)", [&] {
                     for (int i = 0; i < steps; ++i) {
                       rt<D>::copy_async(dev.data(), pinned.ptr, n, s.native());
                       ops::busy_wait<D>(compute, s.ref());
                     }
                     s.synchronize();
                   }});
  for (const bool page_locked : {false, true}) {
    loops.push_back({page_locked ? "depot double_buffer (page-locked batches, prefetch_next_async)"
                                 : "depot double_buffer (pageable batches)",
                     [&, page_locked] {
                       double_buffer<std::byte, D> db{{static_cast<std::int64_t>(n)}, s.ref(), device};
                       const auto prefetch = [&](int i) {
                         if (page_locked) {
                           db.prefetch_next_async(locked[i % 2]);
                         } else {
                           db.prefetch_next(pageable[static_cast<std::size_t>(i % 2)]);
                         }
                       };
                       prefetch(0);
                       db.swap();
                       for (int i = 0; i < steps; ++i) {
                         if (i + 1 < steps) prefetch(i + 1);
                         ops::busy_wait<D>(compute, s.ref());
                         if (i + 1 < steps) db.swap();
                       }
                       s.synchronize();
                     }});
  }
  for (const bool page_locked : {false, true}) {
  const std::string pf_name = std::string{"depot prefetcher ("} + (page_locked ? "page-locked" : "pageable") +
                              " batches, " + std::to_string(opts.staging_workers) + " workers, lookahead 3)";
  loops.push_back({pf_name, [&, page_locked] {
                     int produced = 0;
                     auto producer = [&]() -> std::optional<std::span<const std::byte>> {
                       if (produced == steps) return std::nullopt;
                       const int k = produced++ % 2;
                       return page_locked ? locked[k] : std::span<const std::byte>{pageable[static_cast<std::size_t>(k)]};
                     };
                     prefetch_options po;
                     po.lookahead = 3;
                     po.num_workers = opts.staging_workers;
                     po.device = device;
                     prefetcher<D, std::byte> pf{producer, po, s.ref()};
                     for (auto& b : pf) {
                       (void)b;
                       ops::busy_wait<D>(compute, s.ref());
                     }
                     s.synchronize();
                   }});
  }

  const double gb = static_cast<double>(n) / 1e9;
  std::printf("\n  batch %s: H2D %.3f ms, compute %.3f ms, host staging copy %.3f ms; ideal %d steps = %.2f ms\n",
              format_bytes(n).c_str(), h2d_ms, compute_ms, stage_ms, steps, ideal_ms);
  std::printf("    H2D GB/s: depot pinned pool %.2f | %s pinned %.2f (pool/%s %.2f) | %s pageable %.2f\n",
              gb / (pool_ms / 1e3), memcpy_name<D>().c_str(), gb / (pinned_ms / 1e3),
              memcpy_name<D>().c_str(), pinned_ms / pool_ms, memcpy_name<D>().c_str(),
              gb / (pageable_ms / 1e3));
  nlohmann::json j{{"device", rt<D>::properties(device).id.to_string()},
                   {"bytes", n},
                   {"steps", steps},
                   {"h2d_ms", h2d_ms},
                   {"compute_ms", compute_ms},
                   {"host_stage_ms", stage_ms},
                   {"ideal_ms", ideal_ms},
                   {"h2d_gbps_pinned_pool", gb / (pool_ms / 1e3)},
                   {"h2d_gbps_memcpy_pinned", gb / (pinned_ms / 1e3)},
                   {"h2d_gbps_memcpy_pageable", gb / (pageable_ms / 1e3)},
                   {"pinned_pool_over_memcpy_pinned", pinned_ms / pool_ms},
                   {"loops", nlohmann::json::array()}};
  for (const loop& l : loops) {
    const double ms = median_wall_ms(1, reps, l.run);
    const double eff = ideal_ms / ms;
    std::printf("    %-72s %9.2f ms  efficiency %.2f\n", l.name.c_str(), ms, eff);
    j["loops"].push_back({{"name", l.name}, {"ms", ms}, {"efficiency", eff}});
  }
  rows.push_back(j);
}

template <device D>
void staging_device(const options& opts, int device, nlohmann::json& rows)
{
  const device_properties p = rt<D>::properties(device);
  std::printf("\n%s  %s: staging loop, %d steps, compute %s, median of %d runs\n",
              p.id.to_string().c_str(), p.name.c_str(), opts.staging_steps,
              opts.compute_us > 0 ? (std::to_string(opts.compute_us) + " us").c_str()
                                  : "= the batch's H2D time",
              opts.staging_reps);
  for (std::size_t n : opts.staging_sizes) staging_size<D>(opts, device, n, rows);
}

}  // namespace

nlohmann::json run_staging(const options& opts)
{
  nlohmann::json rows = nlohmann::json::array();
  if (opts.device == "all" || opts.device == "host") staging_device<host>(opts, 0, rows);
#if DEPOT_HAS_CUDA
  if ((opts.device == "all" || opts.device == "cuda") && device_count<cuda>() > 0) staging_device<cuda>(opts, 0, rows);
#endif
#if DEPOT_HAS_HIP
  if ((opts.device == "all" || opts.device == "hip") && device_count<hip>() > 0) staging_device<hip>(opts, 0, rows);
#endif
  return nlohmann::json{{"suite", "staging"}, {"compute_us", opts.compute_us}, {"rows", rows}};
}

}  // namespace depot::bench
