// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace depot::bench {

// Options every suite understands (parsed and validated by the CLI before a suite runs).
struct options {
  std::string device = "all";        // host | cuda | hip | all (the enabled ones)
  std::size_t bytes = std::size_t{256} << 20;
  int repetitions = 10;
  int warmup = 2;
  // alloc suite
  std::vector<std::size_t> alloc_counts{10000, 100000};
  std::vector<std::size_t> alloc_max_sizes{std::size_t{4} << 10, std::size_t{64} << 10,
                                           std::size_t{1} << 20, std::size_t{64} << 20};
  std::size_t live_cap = std::size_t{1} << 30;
  int threads = 1;
  int alloc_streams = 1;  // alloc: streams each thread alternates between (round robin)
  int alloc_reps = 3;  // timed runs after one warm-up; the median is reported
  // alloc: depot instances side by side (depot, depot/2, ...), each made once per row and
  // timed in the same rounds: whether a row's level belongs to the instance (where its
  // structures landed) or to the time (every instance moving together)
  int alloc_instances = 1;
  // alloc, live: time each run right after the previous allocator's run (caches left cold by
  // it), not right after an untimed run of its own (the default: each allocator's steady
  // state, as RMM's benchmark loop runs one allocator back to back)
  bool alloc_cold = false;
  bool alloc_pin = true;  // alloc: pin benchmark thread t to a fixed CPU (the same for every allocator)
  // alloc: the random_allocations rows alone (for A/B runs: no growth, mapping, lock,
  // reader, stream destruction or fixed-pool parts, which take ~1 minute on 2 cores)
  bool alloc_rows_only = false;
  unsigned seed = 1;
  std::vector<std::string> alloc_only;  // allocator names to run (empty: all)
  std::string trace_out;  // alloc: write the depot allocator's trace (depot.trace.v1) here
  // live suite
  std::vector<std::size_t> live_blocks{1000, 10000, 100000, 1000000};
  std::vector<std::size_t> live_max_sizes{std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{4} << 20};
  std::size_t live_pairs = 100000;  // timed pairs per run
  // replay suite
  std::string replay_file;   // a depot trace JSON or RMM CSV log
  std::size_t capacity = 0;  // replay on a simulated device of this many bytes (0: the real one)
  std::string alloc_conf;    // depot allocator settings for replay (DEPOT_ALLOC_CONF syntax)
  // staging suite
  std::vector<std::size_t> staging_sizes{std::size_t{64} << 10, std::size_t{256} << 10,
                                         std::size_t{1} << 20,  std::size_t{4} << 20,
                                         std::size_t{16} << 20, std::size_t{64} << 20};
  double compute_us = 0;        // compute per step; 0: as long as the batch's H2D copy
  int staging_steps = 100;      // steps per loop
  int staging_reps = 3;         // timed loops after a warm-up (median reported)
  std::size_t staging_workers = 4;  // prefetcher workers
};

// Median of a sample of times, in the sample's unit. The sample must not be empty.
inline double median(std::vector<double> samples)
{
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

// A suite prints its table to stdout and returns its results as JSON.
using suite_fn = nlohmann::json (*)(const options&);

nlohmann::json run_info(const options& opts);
nlohmann::json run_alloc(const options& opts);
nlohmann::json run_live(const options& opts);
nlohmann::json run_replay(const options& opts);
nlohmann::json run_ops(const options& opts);
nlohmann::json run_staging(const options& opts);

}  // namespace depot::bench
