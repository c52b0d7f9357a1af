// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// memviz-make-trace --events N [--capacity C] --trace FILE [--snapshot FILE] [--expect FILE]: records a
// trace of the real host pool (depot::pool<host>()) running a training-like workload:
// long-lived weights, per-step activations freed in reverse order, temporaries on a second
// stream and on a helper thread, a few large blocks and an empty_cache() now and then. Runs
// for about N events; the trace keeps the last C (default N: the run is longer, the trace
// starts mid-run; C > N keeps all of it). --expect writes the pool's
// own statistics for the test to compare with what depot-memviz shows. Fixed seed, printed.
#include <depot/hal/stream.hpp>
#include <depot/pool/pool.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

void write_file(const std::string& path, const std::string& text)
{
  std::ofstream out{path, std::ios::binary | std::ios::trunc};
  out << text;
  if (!out) {
    std::fprintf(stderr, "memviz-make-trace: cannot write %s\n", path.c_str());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv)
{
  std::size_t events = 0, capacity = 0;
  std::string trace_path, snapshot_path, expect_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view k = argv[i];
    if (k == "--events") events = std::stoull(argv[i + 1]);
    else if (k == "--capacity") capacity = std::stoull(argv[i + 1]);
    else if (k == "--trace") trace_path = argv[i + 1];
    else if (k == "--snapshot") snapshot_path = argv[i + 1];
    else if (k == "--expect") expect_path = argv[i + 1];
    else {
      std::fprintf(stderr, "memviz-make-trace: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (events == 0 || trace_path.empty()) {
    std::fprintf(stderr, "usage: memviz-make-trace --events N [--capacity C] --trace FILE [--snapshot FILE] [--expect FILE]\n");
    return 2;
  }
  constexpr std::uint64_t seed = 20261122;
  std::printf("memviz-make-trace: seed %llu, %zu events\n", static_cast<unsigned long long>(seed), events);
  std::mt19937_64 rng{seed};

  auto& pool = depot::pool<depot::host>();
  if (capacity == 0) capacity = events;
  // A ring as large as the run keeps all of it; one of `events` wraps (starts mid-run).
  const std::size_t target = capacity > events ? events : events + events / 10 + 64;
  pool.set_trace_capacity(capacity);
  depot::stream<depot::host> side;
  const auto pick_size = [&](int step) {
    const unsigned r = static_cast<unsigned>(rng() % 100);
    if (r < 45) return std::size_t{512} + rng() % (std::size_t{16} << 10);       // small tensors
    if (r < 85) return (std::size_t{64} << 10) + rng() % (std::size_t{1} << 20);  // around the small-pool limit
    if (r < 98) return (std::size_t{2} << 20) + rng() % (std::size_t{6} << 20);   // large pool
    return (std::size_t{24} << 20) + static_cast<std::size_t>(step % 4) * (std::size_t{8} << 20);
  };

  std::vector<void*> weights;
  for (int w = 0; w < 24; ++w) weights.push_back(pool.allocate(pick_size(0)));
  std::size_t recorded = weights.size();
  std::vector<void*> keep;  // a few activations kept alive across steps (the snapshot shows them)
  int large_kept = 0;
  for (int step = 0; recorded < target; ++step) {
    // forward: activations, some on the side stream
    std::vector<std::pair<void*, bool>> acts;
    const int depth = 6 + static_cast<int>(rng() % 10);
    for (int k = 0; k < depth; ++k) {
      const bool on_side = rng() % 4 == 0;
      void* p = on_side ? pool.allocate(pick_size(step), side) : pool.allocate(pick_size(step));
      acts.emplace_back(p, on_side);
    }
    // now and then a large block kept to the end, above this step's activations: once they
    // are freed, an empty_cache() has free pages below a live block (with expandable
    // segments: pages unmapped inside the range, and mapped back by later steps). At most
    // 8 of them: a 1 000 000-event run kept 500 (15 GiB reserved, all of it resident under
    // meson's MALLOC_PERTURB_, which writes every byte glibc hands out: 23 GB on 2026-12-03).
    if (step % 50 == 20 && large_kept < 8) {
      keep.push_back(pool.allocate(std::size_t{30} << 20));
      ++large_kept;
    }
    // temporaries on a helper thread every few steps (another thread id in the trace)
    if (step % 5 == 0) {
      std::thread helper{[&pool, step] {
        std::vector<void*> tmp;
        for (int k = 0; k < 3; ++k) tmp.push_back(pool.allocate(std::size_t{4096} << (k + step % 3)));
        for (void* p : tmp) pool.deallocate(p);
      }};
      helper.join();
      recorded += 6;
    }
    // backward: frees in reverse order, each followed by a gradient temporary
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
      void* g = pool.allocate(pick_size(step) / 2 + 512);
      if (it->second) pool.deallocate(it->first, side);
      else if (step % 97 == 3 && keep.size() < 6) keep.push_back(it->first);
      else pool.deallocate(it->first);
      pool.deallocate(g);
    }
    recorded += acts.size() * 4;
    if (step % 50 == 49) pool.empty_cache();  // segments go back: segment_free events
  }
  // End state: weights and the kept activations alive, the rest of the cache free (with
  // expandable segments: its whole free pages unmapped, holes between the kept blocks, a
  // page mapped back and unmapped again, then pages mapped back for a last block).
  if (pool.config().expandable_segments) {
    pool.empty_cache();
    void* back = pool.allocate((std::size_t{2} << 20) + 1);  // maps a page of a hole back
    pool.deallocate(back);
    pool.empty_cache();  // unmapped again, beside the rest of the hole: one hole
    keep.push_back(pool.allocate((std::size_t{6} << 20) + 1));  // maps pages across that seam
  }
  if (!snapshot_path.empty()) write_file(snapshot_path, pool.snapshot().to_json());
  write_file(trace_path, pool.trace_json());
  if (!expect_path.empty()) {
    const depot::memory_stats st = pool.stats();
    nlohmann::json e = {
        {"peak_allocated", st.allocated_bytes.all.peak},
        {"peak_reserved", st.reserved_bytes.all.peak},
        {"allocated", st.allocated_bytes.all.current},
        {"reserved", st.reserved_bytes.all.current},
        {"live_allocations", st.num_allocations.all.current},
        {"allocation_calls", st.num_allocations.all.allocated},
        {"segments", st.num_segments.all.current},
        {"fragmentation", st.fragmentation},
        {"segments_moved", st.num_segments_moved},
    };
    write_file(expect_path, e.dump(2));
  }
  for (void* p : keep) pool.deallocate(p);
  for (void* p : weights) pool.deallocate(p);
  return 0;
}
