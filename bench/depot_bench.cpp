// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// depot-bench: measures depot side by side with the alternatives. Each suite is one entry
// in `suites` below; with no subcommand the default suite runs.
#include "bench_result.hpp"

#include <depot/config.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <string>
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
  app.add_option("--live-cap", opts.live_cap, "alloc: cap on live bytes")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{1} << 20, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_option("--threads", opts.threads, "alloc: threads, each on its own stream")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--seed", opts.seed, "alloc: random seed")->capture_default_str();
  app.add_option("--alloc-reps", opts.alloc_reps, "alloc: timed runs after a warm-up (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--alloc-only", opts.alloc_only,
                 "alloc: run only these allocators (depot, malloc, cudaMalloc, cudaMallocAsync, "
                 "hipMalloc, hipMallocAsync, torch); depot always runs, as the reference");

  std::vector<const suite*> chosen;
  app.fallthrough();  // before the subcommands, which copy it: options go before or after them
  for (const suite& s : suites) {
    app.add_subcommand(s.name, s.description)->callback([&chosen, &s] { chosen.push_back(&s); });
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
