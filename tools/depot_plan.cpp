// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// depot-plan FILE: plans one arena for every buffer of a recorded trace (depot JSON or RMM
// CSV) and prints the plan against the lower bound and the caching allocator's peak
// reserved on the same trace (replayed on a simulated device). Verifies its own plan.
// --seed, --budget and --time-limit set the planner's search (lifetime_planner::plan_options).
// Exit status: 0 valid plan, 1 the plan failed verification, 2 bad arguments or file.
#include <depot/config.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/lifetime_planner.hpp>
#include <depot/pool/simulated_upstream.hpp>
#include <depot/pool/trace_file.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct replay_result {
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  std::size_t ooms = 0;
  std::size_t first_oom_event = 0;
  std::size_t first_oom_bytes = 0;
};

// The trace's alloc and free events, in order, against a caching allocator over a
// simulated device of `capacity` bytes (one thread; streams kept as recorded).
replay_result replay_on_caching_allocator(const depot::recorded_trace& t, std::size_t capacity,
                                          const depot::allocator_config& cfg)
{
  depot::device_id dev{depot::device_kind::cuda, 0};
  try {
    dev = depot::device_id::parse(t.device);
  } catch (const depot::invalid_argument&) {
    // RMM logs say only "cuda"; anything unreadable is a GPU
  }
  depot::caching_allocator<depot::host> pool{std::make_unique<depot::simulated_upstream>(capacity, dev), cfg};
  std::unordered_map<std::uintptr_t, void*> live;
  replay_result r;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const depot::trace_event& e = t.events[i];
    const depot::stream_ref<depot::host> s{reinterpret_cast<depot::native_stream>(e.stream)};
    if (e.kind == depot::trace_kind::allocate) {
      const std::size_t bytes = e.requested != 0 ? e.requested : e.size;
      try {
        void* p = pool.allocate(bytes, s);
        live[e.address] = p;
      } catch (const depot::out_of_memory&) {
        if (r.ooms++ == 0) {
          r.first_oom_event = i;
          r.first_oom_bytes = bytes;
        }
      }
    } else if (e.kind == depot::trace_kind::free) {
      const auto it = live.find(e.address);
      if (it == live.end()) continue;  // allocated before the trace, or its allocation failed
      pool.deallocate(it->second, s);
      live.erase(it);
    }
  }
  const depot::memory_stats st = pool.stats();
  r.peak_reserved = static_cast<std::size_t>(st.reserved_bytes.all.peak);
  r.peak_allocated = static_cast<std::size_t>(st.allocated_bytes.all.peak);
  for (const auto& [address, p] : live) pool.deallocate(p);
  return r;
}

std::string bytes(std::size_t n) { return depot::format_bytes(n) + " (" + std::to_string(n) + ")"; }

}  // namespace

int main(int argc, char** argv)
{
  CLI::App app{"depot-plan: plans one arena for every buffer of a recorded allocation trace (depot "
               "trace JSON or RMM CSV log), verifies the plan, and compares it with the lower bound and "
               "the caching allocator's peak reserved on the same trace."};
  app.set_version_flag("--version", std::string{DEPOT_VERSION});
  std::string file;
  std::size_t alignment = 512;
  std::size_t capacity = std::size_t{1} << 50;
  std::string alloc_conf;
  std::size_t show = 40;
  bool full = false;
  app.add_option("file", file, "trace file (depot.trace.v1 JSON or RMM CSV)")->required();
  app.add_option("--alignment", alignment, "buffer size and offset alignment in bytes (a power of two)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--capacity", capacity,
                 "capacity of the simulated device the caching allocator replays on; suffixes KiB, MiB, GiB")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1} << 20, std::size_t{1} << 60));
  app.add_option("--alloc-conf", alloc_conf,
                 "caching allocator settings for the replay, as DEPOT_ALLOC_CONF (default: the environment's)");
  app.add_option("--show", show, "buffers listed (the largest first) when the plan is long")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_flag("--full", full, "list every buffer of the plan, in offset order");
  depot::lifetime_planner::plan_options plan_opts;
  app.add_option("--seed", plan_opts.seed,
                 "seed of the planner's search (the same seed and budget give the same plan)")
      ->capture_default_str();
  app.add_option("--budget", plan_opts.work_budget,
                 "planner search budget in buffer visits (a few ns each; the default is about 3 s for 2 400 "
                 "buffers); 0: greedy orderings only")
      ->capture_default_str();
  app.add_option("--time-limit", plan_opts.time_limit_seconds,
                 "stop the planner's search after this many seconds (0: none; a limit makes the plan depend on speed)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if ((alignment & (alignment - 1)) != 0) {
    std::fprintf(stderr, "depot-plan: --alignment must be a power of two, got %zu\n", alignment);
    return 2;
  }

  depot::recorded_trace trace;
  depot::allocator_config cfg;
  try {
    cfg = alloc_conf.empty() ? depot::allocator_config::from_environment() : depot::allocator_config::parse(alloc_conf);
    trace = depot::read_trace(file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-plan: %s\n", e.what());
    return 2;
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    const depot::lifetime_planner planner{trace, alignment};
    const depot::lifetime_planner::plan plan = planner.compute_reuse_plan(plan_opts);
    const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const depot::lifetime_planner::suggestions sug = planner.optimization_suggestions();
    const replay_result replay = replay_on_caching_allocator(trace, capacity, cfg);
    const auto& ls = planner.lifetimes();

    std::printf("depot-plan: %s (%s, %s): %zu events, %zu buffers, alignment %zu\n", file.c_str(), trace.format.c_str(),
                trace.device.empty() ? "device not recorded" : trace.device.c_str(), trace.events.size(), ls.size(),
                alignment);
    if (sug.allocated_before_trace + sug.never_freed + sug.out_of_memory_events > 0) {
      std::printf("  note: %zu blocks allocated before the trace began (alive from its start), %zu never freed "
                  "(alive to its end), %zu recorded allocation failures\n",
                  sug.allocated_before_trace, sug.never_freed, sug.out_of_memory_events);
    }

    if (ls.size() <= show || full) {
      std::vector<std::size_t> order(ls.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return plan.offsets[a] != plan.offsets[b] ? plan.offsets[a] < plan.offsets[b] : ls[a].first_step < ls[b].first_step;
      });
      std::printf("\n  %14s %14s %12s %12s %10s\n", "offset", "bytes", "first step", "last step", "id");
      for (std::size_t i : order) {
        std::printf("  %14zu %14zu %12llu %12llu %10llu\n", plan.offsets[i], ls[i].bytes,
                    static_cast<unsigned long long>(ls[i].first_step), static_cast<unsigned long long>(ls[i].last_step),
                    static_cast<unsigned long long>(ls[i].id));
      }
    } else {
      std::vector<std::size_t> order(ls.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      const std::size_t k = std::min(show, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                        [&](std::size_t a, std::size_t b) { return ls[a].bytes > ls[b].bytes; });
      std::printf("\n  the %zu largest of %zu buffers (--full lists all):\n", k, ls.size());
      std::printf("  %14s %14s %12s %12s %10s\n", "offset", "bytes", "first step", "last step", "id");
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t i = order[j];
        std::printf("  %14zu %14zu %12llu %12llu %10llu\n", plan.offsets[i], ls[i].bytes,
                    static_cast<unsigned long long>(ls[i].first_step), static_cast<unsigned long long>(ls[i].last_step),
                    static_cast<unsigned long long>(ls[i].id));
      }
    }

    const double lb = plan.lower_bound == 0 ? 1.0 : static_cast<double>(plan.lower_bound);
    std::printf("\n  lower bound (most bytes alive at once)  %s\n", bytes(plan.lower_bound).c_str());
    std::printf("  planned arena                           %s  %.4fx the lower bound (%s; %.3f s, %llu buffer visits, "
                "seed %llu)\n",
                bytes(plan.arena_bytes).c_str(), plan.ratio(), plan.strategy.c_str(), plan_s,
                static_cast<unsigned long long>(plan.work), static_cast<unsigned long long>(plan_opts.seed));
    std::printf("  caching allocator peak reserved         %s  %.4fx the lower bound (replayed on a simulated "
                "device of %s%s%s)\n",
                bytes(replay.peak_reserved).c_str(), static_cast<double>(replay.peak_reserved) / lb,
                depot::format_bytes(capacity).c_str(), cfg.to_string().empty() ? "" : ", ", cfg.to_string().c_str());
    if (replay.ooms > 0) {
      std::printf("  caching allocator ran out of memory %zu times; first at event %zu (%s)\n", replay.ooms,
                  replay.first_oom_event, depot::format_bytes(replay.first_oom_bytes).c_str());
    }
    std::printf("  no reuse at all (every buffer apart)    %s\n", bytes(sug.total_bytes).c_str());
    std::printf("  in-place reuse chain                    %zu buffers could take over a dead buffer's memory, "
                "saving %s\n",
                sug.reuses.size(), depot::format_bytes(sug.reuse_saved_bytes).c_str());
    for (std::size_t j = 0; j < std::min<std::size_t>(sug.reuses.size(), 5); ++j) {
      std::printf("      buffer %llu can reuse buffer %llu's memory (%s)\n",
                  static_cast<unsigned long long>(sug.reuses[j].tensor), static_cast<unsigned long long>(sug.reuses[j].donor),
                  depot::format_bytes(sug.reuses[j].bytes).c_str());
    }

    if (const auto problem = planner.verify_plan(plan)) {
      std::printf("  plan verification FAILED: %s\n", problem->c_str());
      return 1;
    }
    std::printf("  plan verified: no two buffers alive at the same step share a byte\n");
  } catch (const depot::invalid_argument& e) {
    std::fprintf(stderr, "depot-plan: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
