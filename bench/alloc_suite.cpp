// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench alloc`: RMM's random_allocations workload against depot's caching allocator,
// the backend's raw allocation, the backend's stream-ordered allocator (cudaMallocAsync /
// hipMallocAsync, release threshold = the live-byte cap) and, where built in, PyTorch's
// CUDACachingAllocator. Per (N, max size): 2N operations; allocate (73 %) while fewer than N
// were made and the live bytes stay under the cap, otherwise free a random live block;
// sizes uniform in [1, max]; seeded std::default_random_engine, drawn into a sequence of
// steps before the clock starts. Wall time of the whole sequence over N = time per
// allocate+free pair: one warm-up run, then the median of --alloc-reps timed runs, each right
// after an untimed run of the same allocator (--alloc-cold: right after the previous
// allocator's), in rounds that interleave the allocators (each run creates its streams
// anew, as short-lived code does, before its clock starts). Thread t
// of every run and allocator is pinned to one CPU (the t-th from the end of the process's
// allowed set; --alloc-no-pin: not): on the GPU hosts' virtual machines a run's speed
// depended on the CPU its new thread landed on (two modes ~40 % apart across runs), which
// moved medians by tens of percent between runs.
#include "bench_result.hpp"

#include <depot/config.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/detail/allocator_core.hpp>
#include <depot/pool/detail/biased_mutex.hpp>
#include <depot/pool/simulated_upstream.hpp>
#include <depot/hal/stream_registry.hpp>
#include <depot/pool/fixed_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace depot::bench {

#if DEPOT_BENCH_TORCH
// bench/torch_allocator.cpp (built when libtorch is found): c10's CUDA caching allocator.
void* torch_allocate(std::size_t bytes, void* stream);
void torch_deallocate(void* ptr);
void torch_empty_cache();
#endif

namespace {

struct workload_step;
struct slot_step;

struct allocator_under_test {
  std::string name;
  std::function<void()> reset;  // between configurations (release cached memory)
  // Replays a workload (run_workload) with this allocator's calls inlined into the loop.
  std::function<void(const std::vector<workload_step>&, const std::vector<native_stream>&)> run;
  // Replays steps on a table of blocks the caller keeps (run_slots), on one stream.
  std::function<void(std::vector<void*>&, const std::vector<slot_step>&, native_stream)> run_slots;
};

// One step on a table of live blocks (`depot-bench live`): the block in `slot`, if any, is
// freed, then (size != 0) a new block of `size` bytes takes its place.
struct slot_step {
  std::uint32_t slot;
  std::size_t size;
};

// One step of the workload: allocate `size` bytes on streams[stream], or (size 0) free the
// live block at index k of the table of live blocks (the last one takes its place).
struct workload_step {
  std::size_t size;
  std::uint32_t k;
  std::uint32_t stream;
};

// The whole sequence of steps, drawn before the clock starts (the random numbers' integer
// divisions cost a quarter of the pair time of a fast allocator when drawn in the timed
// loop). Allocations go to the streams in turn; a block is freed on the stream it was
// allocated on.
std::vector<workload_step> make_workload(std::size_t n, std::size_t max_size, std::size_t cap, unsigned seed,
                                         std::size_t streams)
{
  std::default_random_engine rng{seed};
  std::uniform_int_distribution<std::size_t> size_dist{1, max_size};
  std::uniform_int_distribution<int> percent{0, 99};
  std::vector<std::size_t> live;  // sizes of the live blocks
  live.reserve(n);
  std::vector<workload_step> steps;
  steps.reserve(2 * n);
  std::size_t made = 0;
  std::size_t live_bytes = 0;
  while (made < n || !live.empty()) {
    const std::size_t size = size_dist(rng);
    const bool want_alloc = made < n && (live.empty() || percent(rng) < 73);
    if (want_alloc && live_bytes + size <= cap) {
      steps.push_back({size, 0, static_cast<std::uint32_t>(made % streams)});
      live.push_back(size);
      live_bytes += size;
      ++made;
    } else if (!live.empty()) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>{0, live.size() - 1}(rng);
      steps.push_back({0, static_cast<std::uint32_t>(k), 0});
      live_bytes -= live[k];
      live[k] = live.back();
      live.pop_back();
    } else {
      ++made;  // a single request above the cap: skip it
    }
  }
  return steps;
}

// What comes right before each timed run (alloc, live): an untimed run of the same
// allocator (its steady state: caches, TLB and branch history its own, as in RMM's
// benchmark loop), or with --alloc-cold the previous allocator's run. On the H200 hosts
// the two orders differed by -14 % to +22 % a row, both ways, within the hosts' drift
// (BENCHMARKS.md, "Each run after one of its own"); the default is kept as RMM's method.
const char* run_order(const options& opts)
{
  return opts.alloc_cold ? "right after the previous allocator's run (--alloc-cold)"
                         : "right after an untimed run of the same allocator";
}

// The CPU for benchmark thread t (its pinning), or -1 where there is none.
int cpu_for_thread(std::size_t t)
{
#if defined(__linux__)
  static const std::vector<int> allowed = [] {
    std::vector<int> v;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) v.push_back(c);
      }
    }
    return v;
  }();
  if (allowed.empty()) return -1;
  return allowed[allowed.size() - 1 - t % allowed.size()];
#else
  (void)t;
  return -1;
#endif
}

void pin_this_thread(int cpu)
{
#if defined(__linux__)
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // refused: runs unpinned
#else
  (void)cpu;
#endif
}

// One run of the steps (the timed part).
template <class Allocate, class Deallocate>
void run_workload(const Allocate& allocate, const Deallocate& deallocate, const std::vector<workload_step>& steps,
                  const std::vector<native_stream>& streams)
{
  struct live_block {
    void* p;
    native_stream stream;
  };
  std::vector<live_block> live;
  live.reserve(steps.size() / 2 + 1);
  for (const workload_step& w : steps) {
    if (w.size != 0) {
      const native_stream stream = streams[w.stream];
      live.push_back({allocate(w.size, stream), stream});
    } else {
      const live_block b = live[w.k];
      deallocate(b.p, b.stream);
      live[w.k] = live.back();
      live.pop_back();
    }
  }
}

// Steps on a table of blocks (timed by the caller).
template <class Allocate, class Deallocate>
void run_slots(const Allocate& allocate, const Deallocate& deallocate, std::vector<void*>& table,
               const std::vector<slot_step>& steps, native_stream stream)
{
  for (const slot_step& w : steps) {
    void*& p = table[w.slot];
    if (p != nullptr) deallocate(p, stream);
    p = w.size != 0 ? allocate(w.size, stream) : nullptr;
  }
}

// An allocator under test from its calls. The workload loop is made for those calls
// (run_workload instantiated with them), so each allocator is called as its users call it
// (depot's pool and the runtime's functions directly, torch through its allocator's virtual
// calls), where a loop over type-erased calls cost every allocator two indirect calls per
// pair: ~20 instructions, 1-7 % of depot's pair on the dev VM (BENCHMARKS.md, "Harness").
template <class Allocate, class Deallocate, class Reset>
allocator_under_test under_test(std::string name, Allocate allocate, Deallocate deallocate, Reset reset)
{
  return {std::move(name), std::move(reset),
          [allocate, deallocate](const std::vector<workload_step>& steps, const std::vector<native_stream>& streams) {
            run_workload(allocate, deallocate, steps, streams);
          },
          [allocate, deallocate](std::vector<void*>& table, const std::vector<slot_step>& steps, native_stream s) {
            run_slots(allocate, deallocate, table, steps, s);
          }};
}

// Whether --alloc-only asks for allocator `name` (everything is asked for without it).
bool asked(const options& opts, const std::string& name)
{
  const auto& only = opts.alloc_only;
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

// How rows name device `device` of backend D ("cuda:0").
template <device D>
std::string device_label(int device)
{
  return std::string{D::name} + ":" + std::to_string(device);
}

// The workload alone (the replay of the steps: the calls, the table of live blocks) with an
// allocator that does nothing: the floor under every allocator's figure, measured the same
// way (one thread's sequence, per pair).
allocator_under_test workload_floor()
{
  struct state {
    std::uintptr_t next = 4096;
    void* volatile freed = nullptr;  // what the free keeps, so no step is optimised away
  };
  auto st = std::make_shared<state>();
  return under_test(
      "workload",
      [st](std::size_t, native_stream) {
        st->next += 512;
        return reinterpret_cast<void*>(st->next);
      },
      [st](void* p, native_stream) { st->freed = p; }, [] {});
}

template <device D>
std::vector<allocator_under_test> allocators_for(int device, std::size_t cap,
                                                 std::unique_ptr<caching_allocator<D>>& depot_pool,
                                                 std::size_t trace_capacity = 0, int instances = 1)
{
  std::vector<allocator_under_test> out;
  out.push_back(under_test("depot",
                 [&depot_pool](std::size_t n, native_stream s) {
                   return depot_pool->allocate(n, stream_ref<D>{s});
                 },
                 [&depot_pool](void* p, native_stream s) { depot_pool->deallocate(p, stream_ref<D>{s}); },
                 [&depot_pool, device, trace_capacity] {
                   allocator_config cfg = allocator_config::from_environment();  // DEPOT_ALLOC_CONF applies
                   cfg.trace_capacity = trace_capacity;  // --trace-out
                   depot_pool = std::make_unique<caching_allocator<D>>(device, cfg);
                 }));
  // A depot pool the entry owns, made anew at each reset (the previous one freed first) with
  // DEPOT_ALLOC_CONF's settings changed by `adjust`.
  const auto owned_pool = [device](std::string name, void (*adjust)(allocator_config&)) {
    auto pool = std::make_shared<std::unique_ptr<caching_allocator<D>>>();
    return under_test(std::move(name),
                      [pool](std::size_t n, native_stream s) { return (*pool)->allocate(n, stream_ref<D>{s}); },
                      [pool](void* p, native_stream s) { (*pool)->deallocate(p, stream_ref<D>{s}); },
                      [pool, device, adjust] {
                        pool->reset();  // the previous configuration's pool goes first
                        allocator_config cfg = allocator_config::from_environment();
                        adjust(cfg);
                        *pool = std::make_unique<caching_allocator<D>>(device, cfg);
                      });
  };
  // --alloc-instances: more instances of the same configuration, each its own allocator
  // (made when its row begins, after the ones before it: its structures land elsewhere).
  for (int i = 2; i <= instances; ++i) {
    out.push_back(owned_pool("depot/" + std::to_string(i), [](allocator_config&) {}));
  }
  // depot with expandable segments (where the backend can map memory): the same hits, and
  // misses that map pages into one address range per stream instead of making segments.
  out.push_back(owned_pool("depot-expandable", [](allocator_config& cfg) { cfg.expandable_segments = true; }));
  out.push_back(under_test(is_gpu_v<D> ? std::string{D::name} + "Malloc" : std::string{"malloc"},
                 [device](std::size_t n, native_stream) { return runtime<D>::allocate(n, device); },
                 [device](void* p, native_stream) { runtime<D>::deallocate(p, device); },
                 [] {}));
  if constexpr (is_gpu_v<D>) {
    out.push_back(under_test(std::string{D::name} + "MallocAsync",
                   [device](std::size_t n, native_stream s) {
                     return runtime<D>::allocate_async(n, device, s);
                   },
                   [device](void* p, native_stream s) { runtime<D>::deallocate_async(p, device, s); },
                   [device, cap] { runtime<D>::set_async_release_threshold(device, cap); }));
  }
#if DEPOT_BENCH_TORCH && DEPOT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    out.push_back(under_test("torch",
                   [](std::size_t n, native_stream s) { return torch_allocate(n, s); },
                   [](void* p, native_stream) { torch_deallocate(p); },
                   [] { torch_empty_cache(); }));
  }
#endif
  return out;
}

template <device D>
void alloc_device(const options& opts, int device, nlohmann::json& rows)
{
  const std::size_t cap = opts.live_cap;
  std::printf("\n%s:%d  random_allocations, seed %u, live bytes capped at %s, %d thread(s)%s, "
              "%d stream(s) each (made anew each run); us per allocate+free pair (median of %d timed runs, "
              "in rounds of every allocator, each run %s; the streams' destruction and the threads' exit "
              "after a run are timed apart: JSON teardown_us), ratio = allocator / depot\n",
              std::string{D::name}.c_str(), device, opts.seed, std::to_string(cap >> 20).append(" MiB").c_str(),
              opts.threads, opts.alloc_pin ? " (pinned)" : "", opts.alloc_streams, opts.alloc_reps, run_order(opts));
  std::printf("  %8s %9s", "N", "max");
  std::unique_ptr<caching_allocator<D>> depot_pool;
  auto allocators = allocators_for<D>(device, cap, depot_pool, opts.trace_out.empty() ? 0 : std::size_t{1} << 20,
                                     opts.alloc_instances);
  std::erase_if(allocators, [&](const allocator_under_test& x) {
    return x.name != "depot" && !x.name.starts_with("depot/") && !asked(opts, x.name);
  });
  std::printf(" %9s", "workload");
  for (const auto& a : allocators) std::printf(" %14s %7s", a.name.c_str(), "ratio");
  std::printf("\n");
  const allocator_under_test floor = workload_floor();
  for (std::size_t n : opts.alloc_counts) {
    for (std::size_t max_size : opts.alloc_max_sizes) {
      std::printf("  %8zu %9s", n, (std::to_string(max_size >> 10) + " KiB").c_str());
      double depot_us = 0;
      double floor_us = 0;
      const auto threads_n = static_cast<std::size_t>(opts.threads);
      const auto streams_n = static_cast<std::size_t>(opts.alloc_streams);
      std::vector<std::vector<workload_step>> steps;  // per thread, drawn before any clock
      for (std::size_t t = 0; t < threads_n; ++t) {
        steps.push_back(make_workload(n / threads_n, max_size, cap / threads_n, opts.seed + static_cast<unsigned>(t),
                                      streams_n));
      }
      {
        std::vector<double> runs;
        const std::vector<native_stream> no_streams(streams_n);
        for (int rep = 0; rep <= opts.alloc_reps; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          floor.run(steps[0], no_streams);
          if (rep > 0) {
            runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
        }
        floor_us = median(runs) * 1e6 / static_cast<double>(n / threads_n);
        std::printf(" %9.3f", floor_us);
      }
      // One run of allocator a: each thread makes its streams (anew each run, as
      // short-lived code does), then waits for the others. The run's time is from the start
      // signal to the last thread's end of its workload and of its streams' work (the new
      // streams' first operations included); what follows, the streams' destruction (depot
      // records a fence for each) and the threads' exit and join, is timed apart, the
      // teardown, so that a row of few pairs does not carry it as per-pair time.
      // Seconds: {run, teardown}.
      const auto run_once = [&](const allocator_under_test& a) {
        std::vector<std::thread> threads;
        std::atomic<int> ready{0};
        std::atomic<bool> go{false};
        std::vector<std::chrono::steady_clock::time_point> done(threads_n);
        for (std::size_t t = 0; t < threads_n; ++t) {
          threads.emplace_back([&, t] {
            if (opts.alloc_pin) pin_this_thread(cpu_for_thread(t));
            std::vector<stream<D>> own;
            own.reserve(streams_n);
            std::vector<native_stream> handles;
            for (std::size_t k = 0; k < streams_n; ++k) handles.push_back(own.emplace_back(device).native());
            ready.fetch_add(1);
            while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
            a.run(steps[t], handles);
            for (auto& s : own) s.synchronize();
            done[t] = std::chrono::steady_clock::now();
          });
        }
        while (ready.load() < opts.threads) std::this_thread::yield();
        const auto t0 = std::chrono::steady_clock::now();
        go.store(true, std::memory_order_release);
        for (auto& th : threads) th.join();
        const auto joined = std::chrono::steady_clock::now();
        const auto end = *std::max_element(done.begin(), done.end());
        return std::pair{std::chrono::duration<double>(end - t0).count(),
                         std::chrono::duration<double>(joined - end).count()};
      };
      // Every allocator reset and warmed (run 0, untimed), then the timed runs in rounds,
      // each round one run of every allocator in turn (each right after an untimed run of
      // its own, unless --alloc-cold): a host whose speed drifts over the seconds of a row
      // (these hosts' do, ±40 % between runs) moves every allocator's runs alike, so the
      // ratios compare the same conditions.
      std::vector<std::vector<double>> all_runs(allocators.size());
      std::vector<std::vector<double>> all_teardowns(allocators.size());
      for (const auto& a : allocators) {
        a.reset();
        run_once(a);
      }
      for (int rep = 0; rep < opts.alloc_reps; ++rep) {
        for (std::size_t k = 0; k < allocators.size(); ++k) {
          if (!opts.alloc_cold) run_once(allocators[k]);  // its own steady state (untimed)
          const auto [run, teardown] = run_once(allocators[k]);
          all_runs[k].push_back(run);
          all_teardowns[k].push_back(teardown);
        }
      }
      // Paired: the median over rounds of each round's run / depot's run in that round. The
      // ratio of the medians compares runs from different rounds, and a host that changes
      // speed between rounds (the H200 hosts did, by 2x, within one row) puts the two
      // medians in different phases: the paired ratio keeps each comparison within a round.
      std::vector<double> paired;  // by allocator (depot's is 1)
      for (const std::vector<double>& runs : all_runs) {
        std::vector<double> r;
        for (std::size_t i = 0; i < runs.size(); ++i) r.push_back(runs[i] / all_runs[0][i]);
        paired.push_back(median(r));
      }
      for (std::size_t k = 0; k < allocators.size(); ++k) {
        const allocator_under_test& a = allocators[k];
        const std::vector<double>& runs = all_runs[k];
        std::vector<double> run_us;  // each timed run, µs per pair
        for (const double r : runs) run_us.push_back(r * 1e6 / static_cast<double>(n));
        const double seconds = median(runs);
        const double us = seconds * 1e6 / static_cast<double>(n);
        if (a.name == "depot") depot_us = us;
        std::printf(" %14.3f %7.2f", us, us / depot_us);
        std::fflush(stdout);
        rows.push_back({{"device", device_label<D>(device)},
                        {"allocator", a.name},
                        {"n", n},
                        {"max_size", max_size},
                        {"threads", opts.threads},
                        {"streams", opts.alloc_streams},
                        {"us_per_pair", us},
                        {"workload_us_per_pair", floor_us},
                        {"runs", opts.alloc_reps},
                        {"run_us_per_pair", run_us},  // round r of every allocator ran together
                        // the streams' destruction and the threads' exit after each run (µs)
                        {"teardown_us", median(all_teardowns[k]) * 1e6},
                        {"interleaved", true},
                        {"cold", opts.alloc_cold},  // false: each timed run right after an untimed one of its own
                        {"pinned", opts.alloc_pin},
                        {"ratio_to_depot", us / depot_us},
                        {"paired_ratio_to_depot", paired[k]}});
        if (a.name == "depot" && depot_pool) {
          // What depot's speed cost in memory, over the warm-up and the timed runs: the
          // peak reserved bytes and the misses (new memory, or another stream's taken over).
          const memory_stats st = depot_pool->stats();
          rows.back()["reserved_peak_bytes"] = st.reserved_bytes.all.peak;
          rows.back()["allocated_peak_bytes"] = st.allocated_bytes.all.peak;
          rows.back()["cache_misses"] = st.num_cache_misses;
          rows.back()["segments_peak"] = st.num_segments.all.peak;
          rows.back()["segments_moved"] = st.num_segments_moved;  // between the streams' caches
          rows.back()["move_events"] = st.num_move_events;
          rows.back()["move_syncs"] = st.num_move_syncs;
        }
      }
      std::printf("\n");
      if (allocators.size() > 1) {
        std::printf("  %18s paired (median of each round's ratio):", "");
        for (std::size_t k = 1; k < allocators.size(); ++k) {
          std::printf(" %s %.2f", allocators[k].name.c_str(), paired[k]);
        }
        std::printf("\n");
      }
    }
  }
  if (!opts.trace_out.empty() && depot_pool) {
    // the depot allocator's last 2^20 events: those of the last configuration
    std::ofstream out{opts.trace_out};
    out << depot_pool->trace_json() << '\n';
    if (!out) throw std::runtime_error("cannot write the trace to " + opts.trace_out);
    std::printf("  depot's trace of the last configuration (%zu events) written to %s\n", depot_pool->trace().size(),
                opts.trace_out.c_str());
  }
  depot_pool.reset();
}

// Tensors that grow step by step (a sequence length, a batch size): each of 32 steps
// allocates 4 blocks of 5 MiB + step x 640 KiB on one stream, then frees them. Ordinary
// segments fit a step's blocks only into segments that were made for smaller ones, so each
// step from 10 MiB on makes new ones beside the cached old ones; an expandable segment
// grows its one free range. Reports the peak reserved against the peak allocated. Then
// one more step whose blocks are freed under a 4 MiB block allocated after them and kept
// (a long-lived tensor made late), and empty_cache(): what stays reserved for that block.
template <device D>
void alloc_growth(int device, nlohmann::json& growing)
{
  std::printf("\n%s:%d  growing requests: 32 steps of 4 blocks of 5 MiB + step x 640 KiB, freed after each step\n",
              std::string{D::name}.c_str(), device);
  std::printf("  %-17s %14s %14s %9s %8s %8s %9s %16s\n", "allocator", "peak allocated", "peak reserved", "ratio",
              "segments", "misses", "ms", "kept 4 MiB: MiB");
  for (const bool expandable : {false, true}) {
    allocator_config cfg;
    cfg.expandable_segments = expandable;
    caching_allocator<D> a{device, cfg};
    stream<D> s{device};
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t step = 0; step < 32; ++step) {
      void* p[4];
      for (void*& x : p) x = a.allocate((std::size_t{5} << 20) + step * (std::size_t{640} << 10), s);
      for (void* x : p) a.deallocate(x, s);
    }
    s.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const memory_stats st = a.stats();
    void* last[4];
    for (void*& x : last) x = a.allocate((std::size_t{5} << 20) + 31 * (std::size_t{640} << 10), s);
    void* kept = a.allocate(std::size_t{4} << 20, s);
    for (void* x : last) a.deallocate(x, s);
    a.empty_cache();
    const auto kept_reserved = a.stats().reserved_bytes.all.current;
    a.deallocate(kept, s);
    const std::string name = expandable ? (a.expandable_page() != 0 ? "depot-expandable" : "depot-exp(n/a)")
                                        : "depot";
    const double ratio = static_cast<double>(st.reserved_bytes.all.peak) / static_cast<double>(st.allocated_bytes.all.peak);
    std::printf("  %-17s %11.1f MiB %11.1f MiB %9.2f %8lld %8lld %9.2f %16.1f\n", name.c_str(),
                static_cast<double>(st.allocated_bytes.all.peak) / 1048576.0,
                static_cast<double>(st.reserved_bytes.all.peak) / 1048576.0, ratio,
                static_cast<long long>(st.num_segments.all.peak), static_cast<long long>(st.num_cache_misses), ms,
                static_cast<double>(kept_reserved) / 1048576.0);
    growing.push_back({{"device", device_label<D>(device)},
                    {"allocator", name},
                    {"peak_allocated", st.allocated_bytes.all.peak},
                    {"peak_reserved", st.reserved_bytes.all.peak},
                    {"segments_peak", st.num_segments.all.peak},
                    {"misses", st.num_cache_misses},
                    {"ms", ms},
                    {"kept_reserved_after_empty_cache", kept_reserved}});
  }
}

// What an expandable segment's miss pays to map pages: 32 pages (64 MiB of 2 MiB pages)
// mapped with one vm_map per page (memory, mapping and access per page) against one
// vm_map_pages call (access set once for the run), then unmapped; median of 7 of each,
// alternating. Nothing when the device cannot map memory.
template <device D>
void alloc_map_pages(int device, nlohmann::json& maps)
{
  using rt = runtime<D>;
  const std::size_t page = rt::vm_page(device);
  if (page == 0) return;
  constexpr std::size_t count = 32;
  void* base = rt::vm_reserve(count * page, device);
  auto* const b = static_cast<unsigned char*>(base);
  std::uint64_t handles[count];
  std::vector<double> each;
  std::vector<double> once;
  const auto unmap_all = [&] {
    for (std::size_t i = count; i-- > 0;) rt::vm_unmap(b + i * page, page, handles[i], device);
  };
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < count; ++i) handles[i] = rt::vm_map(b + i * page, page, device);
    each.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    unmap_all();
    t0 = std::chrono::steady_clock::now();
    rt::vm_map_pages(b, page, count, handles, device);
    once.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    unmap_all();
  }
  rt::vm_release(base, count * page, device);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double per_page = median(each);
  const double batched = median(once);
  std::printf("\n%s:%d  mapping %zu pages of %zu KiB (an expandable segment's miss), median of 7: one call per page "
              "%.3f ms, one call for all %.3f ms (ratio %.2f)\n",
              std::string{D::name}.c_str(), device, count, page >> 10, per_page, batched, per_page / batched);
  maps.push_back({{"device", device_label<D>(device)},
                  {"pages", count},
                  {"page_bytes", page},
                  {"per_page_ms", per_page},
                  {"one_call_ms", batched}});
}

// What an expandable segment's miss pays for the holes inside its range: H holes of one
// page each between live one-page blocks (every other block freed, then empty_cache()),
// then a 3-page request that no hole fits, so the range grows at its end (timed; the block
// then freed and its pages unmapped again), median of 15. A miss looks at a bounded number
// of holes, so this should not grow with H.
template <device D>
void alloc_hole_miss(int device, nlohmann::json& out)
{
  std::printf("\n%s:%d  an expandable segment's miss past H one-page holes (3 pages mapped at the end), median of 15:",
              std::string{D::name}.c_str(), device);
  for (const std::size_t holes : {std::size_t{0}, std::size_t{256}, std::size_t{4096}}) {
    allocator_config cfg;
    cfg.expandable_segments = true;
    caching_allocator<D> a{device, cfg};
    const std::size_t page = a.expandable_page();
    if (page == 0) {
      std::printf(" (no virtual memory on this device)");
      break;
    }
    stream<D> s{device};
    std::vector<void*> blocks(2 * holes + 1);
    for (void*& b : blocks) b = a.allocate(page, s);
    for (std::size_t i = 1; i < blocks.size(); i += 2) a.deallocate(blocks[i], s);
    a.empty_cache();
    std::vector<double> us;
    for (int r = 0; r < 15; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      void* p = a.allocate(3 * page, s);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      a.deallocate(p, s);
      a.empty_cache();
    }
    std::sort(us.begin(), us.end());
    std::printf(" H=%zu %.1f us;", holes, us[us.size() / 2]);
    out.push_back({{"device", device_label<D>(device)},
                   {"holes", holes},
                   {"page_bytes", page},
                   {"miss_us", us[us.size() / 2]}});
    for (std::size_t i = 0; i < blocks.size(); i += 2) a.deallocate(blocks[i], s);
  }
  std::printf("\n");
}

template <device D>
void alloc_all(const options& opts, int device, nlohmann::json& rows, nlohmann::json& growing, nlohmann::json& maps,
               nlohmann::json& hole_misses)
{
  alloc_device<D>(opts, device, rows);
  if (asked(opts, "depot-expandable") && !opts.alloc_rows_only) {
    alloc_growth<D>(device, growing);
    alloc_map_pages<D>(device, maps);
    alloc_hole_miss<D>(device, hole_misses);
  }
}

// `depot-bench live`: whether a pair's time grows with the number of live blocks (the pool
// must use constant-time structures: a search over a tree or list of blocks gets slower as
// they grow). Per (L, max): L blocks of sizes uniform in [1, max] are made first (untimed),
// then M pairs are timed, each freeing a random live block and allocating a new random size
// in its place, on one stream of one pinned thread: one warm-up run, then the median of
// --alloc-reps runs, each right after an untimed run of the same allocator (--alloc-cold:
// right after the previous allocator's), in rounds that interleave the allocators (each
// keeps its L blocks live all the while). A row whose live bytes (L x max / 2 expected)
// would pass --live-cap is skipped.
// Per max, a last line gives each allocator's time at the largest L run over its time at
// the smallest. The raw cudaMalloc / hipMalloc is left out (tens of µs a call: 10^6 blocks
// would take minutes), and depot-expandable (its hits are depot's).
template <device D>
void live_device(const options& opts, int device, nlohmann::json& rows, nlohmann::json& growth)
{
  const std::size_t cap = opts.live_cap;
  const std::size_t m = opts.live_pairs;
  std::printf("\n%s:%d  live blocks: L blocks of sizes uniform in [1, max] made first (untimed), then %zu pairs "
              "timed, each freeing a random live block and allocating a new size in its place; seed %u, one "
              "thread%s on one stream; us per free+allocate pair (median of %d timed runs, in rounds of every "
              "allocator, each run %s), ratio = allocator / depot\n",
              std::string{D::name}.c_str(), device, m, opts.seed, opts.alloc_pin ? " (pinned)" : "", opts.alloc_reps,
              run_order(opts));
  std::unique_ptr<caching_allocator<D>> depot_pool;
  auto allocators = allocators_for<D>(device, cap, depot_pool);
  std::erase_if(allocators, [&](const allocator_under_test& x) {
    if (x.name == "depot") return false;
    if (x.name == "depot-expandable" || (is_gpu_v<D> && x.name == std::string{D::name} + "Malloc")) return true;
    return !asked(opts, x.name);
  });
  std::printf("  %8s %9s %9s", "L", "max", "workload");
  for (const auto& a : allocators) std::printf(" %14s %7s", a.name.c_str(), "ratio");
  std::printf("\n");
  const allocator_under_test floor = workload_floor();
  const stream<D> st{device};
  for (const std::size_t max_size : opts.live_max_sizes) {
    const std::string max_text = max_size >= (std::size_t{1} << 20) && max_size % (std::size_t{1} << 20) == 0
                                     ? std::to_string(max_size >> 20) + " MiB"
                                     : std::to_string(max_size >> 10) + " KiB";
    std::vector<double> first_us(allocators.size(), 0.0);
    std::vector<double> last_us(allocators.size(), 0.0);
    std::size_t first_l = 0;
    std::size_t last_l = 0;
    for (const std::size_t l : opts.live_blocks) {
      std::printf("  %8zu %9s", l, max_text.c_str());
      const std::size_t half = max_size / 2 + 1;  // (the expected size, rounded up)
      if (l > cap / half) {
        std::printf("   skipped: ~%s live, above --live-cap %s\n", format_bytes(l * half).c_str(),
                    format_bytes(cap).c_str());
        continue;
      }
      std::default_random_engine rng{opts.seed};
      std::uniform_int_distribution<std::size_t> size_dist{1, max_size};
      std::uniform_int_distribution<std::uint32_t> slot_dist{0, static_cast<std::uint32_t>(l - 1)};
      std::vector<slot_step> fill;
      std::vector<slot_step> pairs;
      std::vector<slot_step> drain;
      fill.reserve(l);
      drain.reserve(l);
      pairs.reserve(m);
      for (std::size_t i = 0; i < l; ++i) fill.push_back({static_cast<std::uint32_t>(i), size_dist(rng)});
      for (std::size_t i = 0; i < m; ++i) {
        const std::uint32_t k = slot_dist(rng);
        pairs.push_back({k, size_dist(rng)});
      }
      for (std::size_t i = 0; i < l; ++i) drain.push_back({static_cast<std::uint32_t>(i), 0});
      const auto timed = [&](const allocator_under_test& a, std::vector<void*>& table) {
        const auto t0 = std::chrono::steady_clock::now();
        a.run_slots(table, pairs, st.native());
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        st.synchronize();
        return s * 1e6 / static_cast<double>(m);
      };
      std::vector<double> floor_runs;
      {
        std::vector<void*> table(l, nullptr);
        floor.run_slots(table, fill, st.native());
        for (int rep = 0; rep <= opts.alloc_reps; ++rep) {
          const double us = timed(floor, table);
          if (rep > 0) floor_runs.push_back(us);
        }
      }
      const double floor_us = median(floor_runs);
      std::printf(" %9.3f", floor_us);
      std::vector<std::vector<void*>> tables(allocators.size(), std::vector<void*>(l, nullptr));
      std::vector<std::vector<double>> runs(allocators.size());
      for (std::size_t k = 0; k < allocators.size(); ++k) {
        allocators[k].reset();
        allocators[k].run_slots(tables[k], fill, st.native());
        (void)timed(allocators[k], tables[k]);  // warm-up
      }
      for (int rep = 0; rep < opts.alloc_reps; ++rep) {
        for (std::size_t k = 0; k < allocators.size(); ++k) {
          if (!opts.alloc_cold) (void)timed(allocators[k], tables[k]);  // its own steady state (untimed)
          runs[k].push_back(timed(allocators[k], tables[k]));
        }
      }
      double depot_us = 0;
      for (std::size_t k = 0; k < allocators.size(); ++k) {
        const double us = median(runs[k]);
        if (allocators[k].name == "depot") depot_us = us;
        std::printf(" %14.3f %7.2f", us, us / depot_us);
        nlohmann::json row{{"device", device_label<D>(device)},
                           {"allocator", allocators[k].name},
                           {"live_blocks", l},
                           {"max_size", max_size},
                           {"pairs", m},
                           {"us_per_pair", us},
                           {"workload_us_per_pair", floor_us},
                           {"run_us_per_pair", runs[k]},
                           {"cold", opts.alloc_cold},
                           {"ratio_to_depot", us / depot_us}};
        if (allocators[k].name == "depot" && depot_pool) {
          const memory_stats ms = depot_pool->stats();
          row["allocated_bytes"] = ms.allocated_bytes.all.current;
          row["reserved_bytes"] = ms.reserved_bytes.all.current;
          row["segments"] = ms.num_segments.all.current;
          row["cache_misses"] = ms.num_cache_misses;
        }
        rows.push_back(std::move(row));
        if (first_l == 0) first_us[k] = us;
        last_us[k] = us;
      }
      if (first_l == 0) first_l = l;
      last_l = l;
      std::printf("\n");
      std::fflush(stdout);
      for (std::size_t k = 0; k < allocators.size(); ++k) allocators[k].run_slots(tables[k], drain, st.native());
      st.synchronize();
    }
    if (first_l != 0 && last_l != first_l) {
      std::printf("  %s, L %zu -> %zu: time per pair x", max_text.c_str(), first_l, last_l);
      for (std::size_t k = 0; k < allocators.size(); ++k) {
        std::printf(" %.2f (%s)%s", last_us[k] / first_us[k], allocators[k].name.c_str(),
                    k + 1 < allocators.size() ? "," : "\n");
        growth.push_back({{"device", device_label<D>(device)},
                          {"allocator", allocators[k].name},
                          {"max_size", max_size},
                          {"from_blocks", first_l},
                          {"to_blocks", last_l},
                          {"growth", last_us[k] / first_us[k]}});
      }
    }
  }
  for (auto& a : allocators) a.reset();  // (depot's pool: a new, empty one)
  depot_pool.reset();
}

// The stream caches' lock alone: one thread takes it and gives it back with three memory
// updates inside (as a cache operation's bookkeeping), biased (after its run of takes) and
// never biased (one compare-exchange per take); best of 10 runs of 10^6, ns per take.
// Where membarrier is refused both are the compare-exchange.
void alloc_lock(nlohmann::json& out)
{
  static std::int64_t cells[32];
  const auto run = [](detail::biased_mutex& m, int n) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      m.lock();
      cells[i & 31] += i;
      cells[(i * 7) & 31] -= 3;
      cells[(i + 5) & 31] ^= i;
      m.unlock();
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  detail::biased_mutex biased{true};
  detail::biased_mutex plain{false};
  run(biased, 1000);  // the run of takes that biases it
  run(plain, 1000);
  double b = 1e9;
  double p = 1e9;
  for (int k = 0; k < 10; ++k) {
    b = std::min(b, run(biased, 1'000'000));
    p = std::min(p, run(plain, 1'000'000));
  }
  const bool on = biased.biased_to_me();
  std::printf("\ncache lock: take + give back with 3 updates inside, 1 thread, best of 10 x 10^6: biased %.2f ns%s, "
              "compare-exchange %.2f ns (ratio %.2f)\n",
              b, on ? "" : " (not biased: membarrier unavailable)", p, p / b);
  out = {{"biased_ns", b}, {"compare_exchange_ns", p}, {"biased", on}};
}

// A fixed pool's allocate + free pair (4 KiB blocks, four in turn), through C++ on a held
// pool and through the C interface's handle (the call's hold on the pool, the status and
// the guard around it), on 1 thread and on up to 4 at once with a pool each (threads on
// different pools should share no line); host backend (a fixed pool never calls the
// backend after creation). Median of 5 runs of 10^6 pairs, the slowest thread's, ns.
void alloc_fixed(nlohmann::json& out)
{
  constexpr int pairs = 1'000'000;
  const auto cpp_run = [] {
    fixed_pool<host> pool{64 * 4096, 4096, 0};
    void* b[4] = {};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) {
      b[i & 3] = pool.allocate();
      pool.deallocate(b[i & 3]);
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / pairs;
  };
  const auto c_run = [] {
    depot_fixed_pool* pool = nullptr;
    if (depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 64 * 4096, 4096, &pool) != DEPOT_SUCCESS) {
      throw std::runtime_error(std::string{"alloc: depot_fixed_pool_create: "} + depot_last_error());
    }
    void* b[4] = {};
    int failed = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) {
      failed |= depot_fixed_pool_allocate(pool, &b[i & 3]);
      failed |= depot_fixed_pool_deallocate(pool, b[i & 3]);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / pairs;
    (void)depot_fixed_pool_destroy(pool);
    if (failed != 0) throw std::runtime_error(std::string{"alloc: a C fixed pool call failed: "} + depot_last_error());
    return ns;
  };
  // The slowest of `threads` threads running f at once, median of 5.
  const auto timed = [](int threads, const auto& f) {
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) {
      std::vector<double> ns(static_cast<std::size_t>(threads));
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          try {
            ns[static_cast<std::size_t>(t)] = f();
          } catch (...) {
            errors[static_cast<std::size_t>(t)] = std::current_exception();
          }
        });
      }
      for (auto& t : pool) t.join();
      for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
      }
      runs.push_back(*std::max_element(ns.begin(), ns.end()));
    }
    return median(runs);
  };
  const int many = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2U, 4U));
  out = nlohmann::json::array();
  std::printf("\nfixed pool: allocate + free of 4 KiB blocks, ns per pair (median of 5 x 10^6; threads: a pool each):");
  for (const int threads : {1, many}) {
    const double cpp = timed(threads, cpp_run);
    const double c = timed(threads, c_run);
    std::printf(" %d thread%s C++ %.1f, C %.1f (ratio %.2f)%s", threads, threads == 1 ? "" : "s", cpp, c, c / cpp,
                threads == 1 ? ";" : "\n");
    out.push_back({{"threads", threads}, {"cpp_ns", cpp}, {"c_ns", c}});
  }
}

// What a reader of every cache pays beside a busy thread: one thread allocates and frees
// 4 KiB-ish blocks round-robin on 8 streams (8 caches, biased to it where the locks bias)
// while this thread calls stats() (every cache lock) every 5 ms; biased locks against
// biased_locks:false. Medians of 150 calls, the barriers issued per call, and the worker's
// ns per pair over the same time (host backend: the locks are the same on every backend).
void alloc_reader(nlohmann::json& out)
{
  constexpr int calls = 150;
  out = nlohmann::json::array();
  std::printf("stats() beside a thread working on 8 streams, every 5 ms, median of %d calls:", calls);
  for (const bool biased : {true, false}) {
    allocator_config cfg;
    cfg.biased_locks = biased;
    caching_allocator<host> a{0, cfg};
    std::atomic<bool> started{false};
    std::atomic<bool> stop{false};
    std::atomic<std::int64_t> pairs{0};  // so far (a plain store per 8 pairs)
    std::thread worker([&] {
      std::vector<stream<host>> streams(8);
      std::int64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (auto& st : streams) {
          const stream_ref<host> r{st.native()};
          a.deallocate(a.allocate(4096 + static_cast<std::size_t>(n % 7) * 512, r), r);
          ++n;
        }
        pairs.store(n, std::memory_order_relaxed);
        if (n == 8 * 1000) started = true;  // every lock biased by now, where they bias
      }
    });
    while (!started.load()) std::this_thread::yield();
    std::vector<double> us;
    const std::uint64_t barriers0 = detail::biased_mutex::barriers();
    const std::int64_t pairs0 = pairs.load();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      const auto c0 = std::chrono::steady_clock::now();
      const memory_stats st = a.stats();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count());
      if (st.num_allocations.all.current < 0) std::printf("?");  // (keeps the call)
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    }
    const std::uint64_t barriers = detail::biased_mutex::barriers() - barriers0;
    const double elapsed_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    const std::int64_t done = pairs.load() - pairs0;
    stop = true;
    worker.join();
    const double med = median(us);
    const double per_pair = elapsed_ns / static_cast<double>(std::max<std::int64_t>(done, 1));
    const double per_call = static_cast<double>(barriers) / calls;
    std::printf(" %s %.1f us (%.2f barriers per call, worker %.0f ns per pair)%s", biased ? "biased" : "unbiased",
                med, per_call, per_pair, biased ? "," : "\n");
    out.push_back({{"biased_locks", biased}, {"stats_us_median", med}, {"barriers_per_call", per_call},
                   {"worker_ns_per_pair", per_pair}});
  }
}

// A stream's destruction beside threads that work on their own streams, their caches'
// locks biased to them, once some block lists another stream (record_stream): the
// destruction looks through every cache for blocks that list it, all caches locked at once
// (one barrier for every bias revoked; a lock each paid one per biased cache, 2.86 per
// destruction at 32 threads on the dev VM). On a simulated asynchronous device, whose
// events complete at once: the stream destroyed is listed by no block, so nothing waits.
void alloc_destroy(nlohmann::json& out)
{
  constexpr int destructions = 100;
  constexpr int workers = 16;
  out = nlohmann::json::array();
  std::printf("stream destruction beside %d threads working on their own streams, every 5 ms, median of %d:",
              workers, destructions);
  for (const bool biased : {true, false}) {
    const device_id dev{device_kind::cuda, 0};  // (simulated: no GPU is used)
    allocator_config cfg;
    cfg.biased_locks = biased;
    detail::allocator_core a{std::make_unique<simulated_upstream>(std::size_t{1} << 40, dev), cfg, true};
    std::atomic<int> ready{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < workers; ++t) {
      threads.emplace_back([&, t] {
        const auto s = reinterpret_cast<native_stream>(std::uintptr_t{0x10000} + 0x100 * static_cast<unsigned>(t));
        for (int k = 0; k < 1000; ++k) a.deallocate(a.allocate(std::size_t{1} << 20, s), s, true, 0);
        ready.fetch_add(1);
        while (!stop.load(std::memory_order_relaxed)) {  // bursts: a lock biases after 64 takes in a row
          for (int k = 0; k < 100; ++k) a.deallocate(a.allocate(std::size_t{1} << 20, s), s, true, 0);
          std::this_thread::sleep_for(std::chrono::microseconds{200});
        }
      });
    }
    while (ready.load() < workers) std::this_thread::yield();
    const auto s0 = reinterpret_cast<native_stream>(std::uintptr_t{0x9000});
    void* x = a.allocate(std::size_t{1} << 20, s0);
    a.record_stream(x, reinterpret_cast<native_stream>(std::uintptr_t{0x9100}));
    const auto h = reinterpret_cast<native_stream>(std::uintptr_t{0x9200});
    std::vector<double> us;
    std::uint64_t barriers = 0;  // issued during the destructions (by any thread)
    for (int k = 0; k < destructions; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
      stream_registry::opened(dev, h);
      const std::uint64_t b0 = detail::biased_mutex::barriers();
      const auto t0 = std::chrono::steady_clock::now();
      stream_registry::closing(dev, h);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      barriers += detail::biased_mutex::barriers() - b0;
    }
    const double per = static_cast<double>(barriers) / destructions;
    stop = true;
    for (auto& t : threads) t.join();
    a.deallocate(x, s0, true, 0);
    const double med = median(us);
    std::printf(" %s %.2f us (%.2f barriers each)%s", biased ? "biased" : "unbiased", med, per, biased ? "," : "\n");
    out.push_back({{"biased_locks", biased}, {"workers", workers}, {"destroy_us_median", med},
                   {"barriers_per_destruction", per}});
  }
}

// The resident set size of this process in bytes (Linux: /proc/self/statm), or 0 where unknown.
std::size_t resident_bytes()
{
  std::ifstream statm{"/proc/self/statm"};
  std::size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? pages_resident * static_cast<std::size_t>(page) : 0;
}

// Raw stream handles (never registered: depot cannot see them destroyed) used once each, as
// a code that makes a stream per task with the runtime directly: 20 000 handles, each
// allocating and freeing 4 KiB once, on a simulated asynchronous device. A raw handle's
// cache never closes; an emptied one is taken over by a new handle (take_empty_raw), so the
// time a new handle takes and the host memory stay flat. Per quarter: µs a new handle
// (mean over the quarter), the caches kept and the resident set's growth since the start.
void alloc_raw_handles(nlohmann::json& out)
{
  constexpr int handles = 20000;
  constexpr int quarter = handles / 4;
  const device_id dev{device_kind::cuda, 0};  // (simulated: no GPU is used)
  detail::allocator_core a{std::make_unique<simulated_upstream>(std::size_t{1} << 40, dev), allocator_config{}, true};
  out = nlohmann::json::array();
  std::printf("raw stream handles used once each (4 KiB allocated and freed), %d of them:", handles);
  const std::size_t rss0 = resident_bytes();
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 1; k <= handles; ++k) {
    const auto s = reinterpret_cast<native_stream>(std::uintptr_t{0x100000} + (static_cast<std::uintptr_t>(k) << 12U));
    a.deallocate(a.allocate(4096, s), s, true, 0);
    if (k % quarter != 0) continue;
    const auto t1 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / quarter;
    const std::size_t rss = resident_bytes();
    const double grown_mb = rss0 == 0 || rss == 0 ? 0.0 : (static_cast<double>(rss) - static_cast<double>(rss0)) / 1e6;
    std::printf(" %d: %.2f us a handle, %zu caches, %+.1f MB%s", k, us, a.stream_caches(), grown_mb,
                k == handles ? "\n" : ";");
    out.push_back({{"handles", k}, {"us_per_new_handle", us}, {"stream_caches", a.stream_caches()},
                   {"resident_growth_mb", grown_mb}});
    t0 = std::chrono::steady_clock::now();
  }
}

// Frees from another thread (a consumer freeing what a producer made, with no stream named
// or naming it): 16 streams whose caches a producer thread used (their locks biased to it),
// then blocks it made on the last stream freed by a consumer thread, unnamed (the block is
// looked for beyond the consumer's own cache: lookup_elsewhere) and named on the block's
// stream (found at once), ns per free, median of 5 runs; and the barriers the unnamed
// frees issued (revoking the producer's biases). On a simulated asynchronous device.
void alloc_cross_thread(nlohmann::json& out)
{
  constexpr int streams = 16;
  constexpr int blocks = 20000;
  const device_id dev{device_kind::cuda, 0};  // (simulated: no GPU is used)
  detail::allocator_core a{std::make_unique<simulated_upstream>(std::size_t{1} << 40, dev), allocator_config{}, true};
  const auto stream_of = [](int k) {
    return reinterpret_cast<native_stream>(std::uintptr_t{0x10000} + 0x100 * static_cast<unsigned>(k));
  };
  std::vector<void*> made(blocks);
  double ns[2] = {};
  std::uint64_t barriers = 0;
  for (const bool named : {false, true}) {
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) {
      // The producer stays alive while the consumer frees (a bias to a thread that has
      // exited is dropped without a barrier).
      std::atomic<int> phase{0};
      std::thread producer([&] {
        for (int k = 0; k < streams; ++k) {
          for (int i = 0; i < 1000; ++i) a.deallocate(a.allocate(4096, stream_of(k)), stream_of(k), true, 0);
        }
        for (void*& p : made) p = a.allocate(4096, stream_of(streams - 1));
        phase = 1;
        while (phase.load() != 2) std::this_thread::sleep_for(std::chrono::microseconds{100});
      });
      while (phase.load() != 1) std::this_thread::yield();
      const std::uint64_t b0 = detail::biased_mutex::barriers();
      double elapsed = 0;
      std::thread consumer([&] {
        const auto t0 = std::chrono::steady_clock::now();
        for (void* p : made) a.deallocate(p, stream_of(streams - 1), named, 0);
        elapsed = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      });
      consumer.join();
      if (!named) barriers += detail::biased_mutex::barriers() - b0;
      phase = 2;
      producer.join();
      runs.push_back(elapsed / blocks);
    }
    ns[named ? 1 : 0] = median(runs);
  }
  const double per_run = static_cast<double>(barriers) / 5;
  std::printf("frees from another thread, %d streams the producer used, %d blocks of the last, ns per free (median of "
              "5): unnamed %.1f, named %.1f (ratio %.2f; %.1f barriers per run)\n",
              streams, blocks, ns[0], ns[1], ns[0] / ns[1], per_run);
  out = {{"streams", streams}, {"blocks", blocks}, {"unnamed_ns", ns[0]}, {"named_ns", ns[1]},
         {"barriers_per_run", per_run}};

  // Blocks of 4 KiB, per_stream made on each of n_streams streams, shuffled (seeded
  // seed_base + run), then freed by `threads` threads at once, each its own share, unnamed
  // or named on the block's stream. Every thread starts at one barrier; ns per free as a
  // thread sees it (the slowest thread's time / its frees), median of 5 runs.
  const auto frees_at_once = [&](detail::allocator_core& al, int n_streams, int per_stream, int threads, bool named,
                                 std::uint64_t seed_base) {
    std::vector<double> runs;
    for (int r = 0; r < 5; ++r) {
      std::vector<std::pair<void*, native_stream>> blocks_of;
      for (int i = 0; i < per_stream; ++i) {
        for (int k = 0; k < n_streams; ++k) blocks_of.emplace_back(al.allocate(4096, stream_of(k)), stream_of(k));
      }
      std::mt19937_64 rng{seed_base + static_cast<std::uint64_t>(r)};
      std::shuffle(blocks_of.begin(), blocks_of.end(), rng);
      const std::size_t share = blocks_of.size() / static_cast<std::size_t>(threads);
      std::atomic<int> ready{0};
      std::atomic<bool> go{false};
      std::vector<double> took(static_cast<std::size_t>(threads));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          const std::size_t from = share * static_cast<std::size_t>(t);
          const std::size_t to = t + 1 == threads ? blocks_of.size() : from + share;
          ready.fetch_add(1);
          while (!go.load()) {
          }
          const auto t0 = std::chrono::steady_clock::now();
          for (std::size_t i = from; i < to; ++i) al.deallocate(blocks_of[i].first, blocks_of[i].second, named, 0);
          took[static_cast<std::size_t>(t)] =
              std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
              static_cast<double>(to - from);
        });
      }
      while (ready.load() != threads) std::this_thread::yield();
      go = true;
      for (auto& t : pool) t.join();
      runs.push_back(*std::max_element(took.begin(), took.end()));
    }
    return median(runs);
  };

  // A consumer of every stream's blocks: 256 blocks of each of S streams freed by another
  // thread in a random order, unnamed and named on the block's stream. Unnamed, nearly
  // every block is in neither the cache of the consumer's last stream nor of its last
  // operation, so the free asks the directory of segments (before it, it tried every cache
  // in turn: O(S)).
  nlohmann::json spread = nlohmann::json::array();
  std::printf("frees of blocks of S streams in a random order by another thread, ns per free (median of 5):");
  for (const int s : {1, 4, 16, 64}) {
    const auto seed = static_cast<std::uint64_t>(s * 10);
    const double u = frees_at_once(a, s, 256, 1, false, seed);
    const double n = frees_at_once(a, s, 256, 1, true, seed);
    std::printf(" S=%d unnamed %.1f named %.1f;", s, u, n);
    spread.push_back({{"streams", s}, {"blocks_per_stream", 256}, {"unnamed_ns", u}, {"named_ns", n}});
  }
  std::printf("\n");
  out["spread"] = spread;

  // The directory's shared lock under many readers: 1024 blocks of each of 16 streams freed
  // by C threads at once (nearly every unnamed free asks the directory: its reader lock is
  // one cache line for all; named, no directory), C = 1, 2, 4, ... up to the machine's
  // hardware threads (at most 16); and the same on an allocator whose cache locks are not
  // biased (biased_locks:false): whether the cost is the revocation of biases or the locks'
  // words passed between cores.
  constexpr int dir_streams = 16;
  constexpr int dir_per_stream = 1024;
  const int max_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 16U));
  allocator_config unbiased_cfg;
  unbiased_cfg.biased_locks = false;
  detail::allocator_core unbiased{std::make_unique<simulated_upstream>(std::size_t{1} << 40, dev), unbiased_cfg, true};
  nlohmann::json dir = nlohmann::json::array();
  std::printf("frees by C threads at once, blocks of %d streams in a random order, ns per free per thread (median of 5; "
              "then with biased_locks:false):",
              dir_streams);
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    const auto seed = static_cast<std::uint64_t>(threads * 100);
    const double u = frees_at_once(a, dir_streams, dir_per_stream, threads, false, seed);
    const double n = frees_at_once(a, dir_streams, dir_per_stream, threads, true, seed);
    const double uu = frees_at_once(unbiased, dir_streams, dir_per_stream, threads, false, seed);
    const double un = frees_at_once(unbiased, dir_streams, dir_per_stream, threads, true, seed);
    std::printf(" C=%d unnamed %.1f named %.1f (%.1f, %.1f);", threads, u, n, uu, un);
    dir.push_back({{"threads", threads}, {"streams", dir_streams}, {"blocks_per_stream", dir_per_stream},
                   {"unnamed_ns", u}, {"named_ns", n}, {"unbiased_unnamed_ns", uu}, {"unbiased_named_ns", un}});
  }
  std::printf("\n");
  out["directory_threads"] = dir;
}

}  // namespace

nlohmann::json run_live(const options& opts)
{
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json growth = nlohmann::json::array();
  // On one pinned thread (as the alloc suite's), this thread's own placement left alone.
  std::exception_ptr failed;
  std::thread runner([&] {
    try {
      if (opts.alloc_pin) pin_this_thread(cpu_for_thread(0));
      if (opts.device == "all" || opts.device == "host") live_device<host>(opts, 0, rows, growth);
#if DEPOT_HAS_CUDA
      if ((opts.device == "all" || opts.device == "cuda") && device_count<cuda>() > 0) live_device<cuda>(opts, 0, rows, growth);
#endif
#if DEPOT_HAS_HIP
      if ((opts.device == "all" || opts.device == "hip") && device_count<hip>() > 0) live_device<hip>(opts, 0, rows, growth);
#endif
    } catch (...) {
      failed = std::current_exception();
    }
  });
  runner.join();
  if (failed) std::rethrow_exception(failed);
  return nlohmann::json{{"suite", "live"}, {"seed", opts.seed}, {"pairs", opts.live_pairs}, {"rows", rows},
                        {"growth", growth}};
}

nlohmann::json run_alloc(const options& opts)
{
  // Each thread replays its share of N allocations: a thread with none would time nothing.
  for (const std::size_t n : opts.alloc_counts) {
    if (n < static_cast<std::size_t>(opts.threads)) {
      throw std::invalid_argument("alloc: --alloc-n " + std::to_string(n) + " is below --threads " +
                                  std::to_string(opts.threads) +
                                  ": each thread needs at least one allocation (valid: --alloc-n >= --threads)");
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json growing = nlohmann::json::array();  // the growing-requests workload
  nlohmann::json maps = nlohmann::json::array();     // mapping pages: per page against one call
  nlohmann::json hole_misses = nlohmann::json::array();  // an expandable miss past many holes
  if (opts.device == "all" || opts.device == "host") alloc_all<host>(opts, 0, rows, growing, maps, hole_misses);
#if DEPOT_HAS_CUDA
  if ((opts.device == "all" || opts.device == "cuda") && device_count<cuda>() > 0) alloc_all<cuda>(opts, 0, rows, growing, maps, hole_misses);
#endif
#if DEPOT_HAS_HIP
  if ((opts.device == "all" || opts.device == "hip") && device_count<hip>() > 0) alloc_all<hip>(opts, 0, rows, growing, maps, hole_misses);
#endif
  nlohmann::json lock;
  nlohmann::json reader;
  nlohmann::json destroy;
  nlohmann::json fixed;
  nlohmann::json cross;
  nlohmann::json raw_handles;
  if (!opts.alloc_rows_only) {
    alloc_lock(lock);
    alloc_reader(reader);
    alloc_destroy(destroy);
    alloc_cross_thread(cross);
    alloc_raw_handles(raw_handles);
    alloc_fixed(fixed);
  }
  return nlohmann::json{{"suite", "alloc"},           {"seed", opts.seed},   {"rows", rows},
                        {"growing", growing},         {"map_pages", maps},   {"hole_misses", hole_misses},
                        {"cache_lock", lock},         {"stats_reader", reader}, {"stream_destruction", destroy},
                        {"cross_thread_frees", cross}, {"raw_handles", raw_handles}, {"fixed_pool", fixed}};
}

}  // namespace depot::bench
