// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// depot-bench: measures depot side by side with the alternatives. Each suite is one entry
// in `suites` below; with no subcommand the default suite runs.
#include "bench_result.hpp"

#include <depot/config.hpp>
#include <depot/pool/allocator_config.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct suite {
  const char* name;
  const char* description;
  bool in_default;
  depot::bench::suite_fn run;
};

// Name -> suite, in one table. Later suites (pool, ops, staging, replay) are added here.
constexpr std::array suites{
    suite{"info", "devices, properties, and the HAL's memset/memcpy bandwidth", true,
          &depot::bench::run_info},
    suite{"alloc", "random_allocations: depot's pool against raw, stream-ordered and torch allocators",
          true, &depot::bench::run_alloc},
    suite{"live", "allocation and free with 10^3 to 10^6 blocks live: whether a pair gets slower as they grow",
          true, &depot::bench::run_live},
    suite{"replay", "replays a recorded trace (depot JSON or RMM CSV) against depot and the alternatives",
          false, &depot::bench::run_replay},
    suite{"ops", "fill, copy, transpose, gather, scatter-add and masked_select against memset/memcpy", true,
          &depot::bench::run_ops},
    suite{"staging", "overlap of H2D copies with compute: serial loops against double_buffer and "
          "prefetcher; H2D bandwidth from the pinned pool", false, &depot::bench::run_staging},
};

std::string utc_now()
{
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int main(int argc, char** argv)
{
  CLI::App app{"depot-bench: depot's allocator, storage and ops measured against the "
               "alternatives. With no subcommand, runs the default suite."};
  app.set_version_flag("--version", std::string{DEPOT_VERSION});

  depot::bench::options opts;
  std::string json_path;
  std::vector<std::string> devices{"all", "host"};
  if (DEPOT_HAS_CUDA) devices.emplace_back("cuda");
  if (DEPOT_HAS_HIP) devices.emplace_back("hip");

  app.add_option("--device", opts.device, "which backend to measure (the enabled ones)")
      ->check(CLI::IsMember(devices))
      ->capture_default_str();
  app.add_option("--size", opts.bytes, "buffer size in bytes; suffixes KiB, MiB, GiB")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_option("--repetitions", opts.repetitions, "timed repetitions (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--warmup", opts.warmup, "untimed repetitions first")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--json", json_path, "also write the results to this JSON file");
  app.add_option("--alloc-n", opts.alloc_counts, "alloc: allocations per run (list)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}))
      ->capture_default_str();
  app.add_option("--alloc-max", opts.alloc_max_sizes, "alloc: largest request size (list; KiB, MiB suffixes)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 36))
      ->capture_default_str();
  app.add_option("--live-cap", opts.live_cap, "alloc, live: cap on live bytes")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1} << 20, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_option("--threads", opts.threads, "alloc: threads, each on its own stream")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--alloc-streams", opts.alloc_streams,
                 "alloc: streams per thread, allocations alternating between them (frees on the "
                 "block's own stream)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--seed", opts.seed, "alloc: random seed")->capture_default_str();
  app.add_option("--alloc-reps", opts.alloc_reps, "alloc, live: timed runs after a warm-up (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--alloc-instances", opts.alloc_instances,
                 "alloc: depot allocators side by side in the rounds (depot, depot/2, ...), each "
                 "made anew for a row: whether a row's speed belongs to an instance or to the time")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_flag("--alloc-cold", opts.alloc_cold,
               "alloc, live: time each run right after another allocator's run, not after an untimed run "
               "of the same allocator (the default: each allocator's steady state; the rounds interleave "
               "the allocators either way)");
  app.add_flag("!--alloc-no-pin", opts.alloc_pin,
               "alloc: leave the benchmark threads unpinned (by default thread t runs on one fixed CPU, "
               "the same for every allocator and run)");
  app.add_flag("--alloc-rows-only", opts.alloc_rows_only,
               "alloc: the random_allocations rows alone (not the growing requests, page mapping, "
               "cache lock, stats reader, stream destruction and fixed pool parts)");
  app.add_option("--alloc-only", opts.alloc_only,
                 "alloc: run only these allocators (depot, malloc, cudaMalloc, cudaMallocAsync, "
                 "hipMalloc, hipMallocAsync, torch); depot always runs, as the reference");

  app.add_option("--live-blocks", opts.live_blocks, "live: blocks kept live (list)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}))
      ->capture_default_str();
  app.add_option("--live-max", opts.live_max_sizes, "live: largest request size (list; KiB, MiB suffixes)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 36))
      ->capture_default_str();
  app.add_option("--live-pairs", opts.live_pairs, "live: timed free+allocate pairs per run")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}))
      ->capture_default_str();
  app.add_option("--trace-out", opts.trace_out,
                 "alloc: write the depot allocator's trace of the last configuration (depot.trace.v1) to this file");
  app.add_option("--replay-file", opts.replay_file, "replay: the trace to replay (depot JSON or RMM CSV)")
      ->check(CLI::ExistingFile);
  app.add_option("--capacity", opts.capacity,
                 "replay: simulate a device of this capacity (KiB, MiB, GiB suffixes) instead of using a real one")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1} << 20, std::size_t{1} << 50));
  app.add_option("--alloc-conf", opts.alloc_conf, "replay: depot allocator settings, as DEPOT_ALLOC_CONF")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              (void)depot::allocator_config::parse(text);
            } catch (const std::exception& e) {
              return e.what();
            }
            return {};
          },
          "KEY:VALUE,...", "allocator config"));

  app.add_option("--staging-sizes", opts.staging_sizes, "staging: batch sizes (list; KiB, MiB suffixes)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1} << 10, std::size_t{1} << 32))
      ->capture_default_str();
  app.add_option("--compute-us", opts.compute_us,
                 "staging: compute kernel per step in microseconds (0: as long as the batch's H2D copy)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--staging-steps", opts.staging_steps, "staging: steps per loop")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  app.add_option("--staging-reps", opts.staging_reps, "staging: timed loops after a warm-up (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--staging-workers", opts.staging_workers, "staging: prefetcher worker threads")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->capture_default_str();

  std::vector<const suite*> chosen;
  app.fallthrough();  // before the subcommands, which copy it: options go before or after them
  for (const suite& s : suites) {
    CLI::App* sub = app.add_subcommand(s.name, s.description);
    sub->callback([&chosen, &s] { chosen.push_back(&s); });
    if (std::string_view{s.name} == "replay") {
      sub->add_option("file", opts.replay_file, "the trace to replay (depot JSON or RMM CSV)")->check(CLI::ExistingFile);
    }
  }
  CLI11_PARSE(app, argc, argv);

  if (chosen.empty()) {
    for (const suite& s : suites) {
      if (s.in_default) chosen.push_back(&s);
    }
  }

  nlohmann::json report{{"tool", "depot-bench"},
                        {"depot_version", DEPOT_VERSION},
                        {"date", utc_now()},
                        {"options",
                         {{"device", opts.device},
                          {"bytes", opts.bytes},
                          {"repetitions", opts.repetitions},
                          {"warmup", opts.warmup},
                          {"threads", opts.threads},
                          {"alloc_streams", opts.alloc_streams},
                          {"alloc_reps", opts.alloc_reps},
                          {"alloc_cold", opts.alloc_cold},
                          {"alloc_instances", opts.alloc_instances},
                          {"alloc_pin", opts.alloc_pin},
                          {"alloc_rows_only", opts.alloc_rows_only},
                          {"seed", opts.seed}}},
                        {"suites", nlohmann::json::array()}};
  try {
    for (const suite* s : chosen) report["suites"].push_back(s->run(opts));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-bench: %s\n", e.what());
    return 1;
  }
  if (!json_path.empty()) {
    std::ofstream out{json_path};
    out << report.dump(2) << '\n';
    if (!out) {
      std::fprintf(stderr, "depot-bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::printf("\nresults written to %s\n", json_path.c_str());
  }
  return 0;
}
