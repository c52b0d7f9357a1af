// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Generated allocation traces of a few shapes, for the trace reader, the lifetime planner
// and the replay tests: a training-like ladder, random sizes and lifetimes, many threads
// and streams with frees on other threads, and RMM's CSV log of any of them. Addresses are
// those a real allocator could give: never two live blocks at overlapping bytes; freed
// addresses are reused.
#include <depot/pool/trace_file.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace depot::test {

// Hands out addresses like a first-fit allocator over a 2^40-byte space (bytes rounded to
// 512), so that generated traces reuse freed addresses.
class fake_address_space {
 public:
  std::uintptr_t take(std::size_t bytes)
  {
    const std::size_t n = round(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= n) {
        const std::uintptr_t a = it->first;
        const std::size_t left = it->second - n;
        free_.erase(it);
        if (left > 0) free_.emplace(a + n, left);
        return a;
      }
    }
    const std::uintptr_t a = top_;
    top_ += n;
    return a;
  }
  void give(std::uintptr_t a, std::size_t bytes)
  {
    const std::size_t n = round(bytes);
    auto [it, ok] = free_.emplace(a, n);
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

 private:
  static std::size_t round(std::size_t b) { return b == 0 ? 512 : (b + 511) / 512 * 512; }
  std::map<std::uintptr_t, std::size_t> free_;
  std::uintptr_t top_ = std::uintptr_t{1} << 40;
};

// Builds a trace event by event, keeping addresses and lifetimes consistent.
class trace_builder {
 public:
  explicit trace_builder(std::string device = "cuda:0") { trace_.format = "depot.trace.v1"; trace_.device = std::move(device); }

  // Returns the address of the new block.
  std::uintptr_t alloc(std::size_t bytes, std::uintptr_t stream = 0, std::uint64_t thread = 1)
  {
    trace_event e;
    e.kind = trace_kind::allocate;
    e.time_ns = now_ += 1000;
    e.address = space_.take(bytes);
    e.size = (bytes + 511) / 512 * 512;
    e.requested = bytes;
    e.stream = stream;
    e.thread = thread;
    born_[e.address] = {e.time_ns, bytes};
    trace_.events.push_back(e);
    return e.address;
  }
  void free(std::uintptr_t address, std::uintptr_t stream = 0, std::uint64_t thread = 1)
  {
    const auto b = born_.at(address);
    trace_event e;
    e.kind = trace_kind::free;
    e.time_ns = now_ += 1000;
    e.address = address;
    e.size = (b.second + 511) / 512 * 512;
    e.requested = b.second;
    e.stream = stream;
    e.thread = thread;
    e.lifetime_ns = e.time_ns - b.first;
    born_.erase(address);
    space_.give(address, b.second);
    trace_.events.push_back(e);
  }
  void oom(std::size_t bytes, std::uintptr_t stream = 0, std::uint64_t thread = 1)
  {
    trace_event e;
    e.kind = trace_kind::out_of_memory;
    e.time_ns = now_ += 1000;
    e.requested = e.size = bytes;
    e.stream = stream;
    e.thread = thread;
    trace_.events.push_back(e);
  }
  [[nodiscard]] std::size_t live() const { return born_.size(); }
  recorded_trace take() { return std::move(trace_); }

 private:
  recorded_trace trace_;
  fake_address_space space_;
  std::map<std::uintptr_t, std::pair<std::uint64_t, std::size_t>> born_;
  std::uint64_t now_ = 1'000'000;
};

// A training step repeated: the forward pass allocates one activation per layer (sizes
// first growing, then shrinking) and a short-lived workspace; the backward pass frees
// activations in reverse order while allocating and freeing gradients. Nothing is left.
inline recorded_trace ladder_trace(int layers = 24, int iterations = 3, std::size_t unit = std::size_t{1} << 20)
{
  trace_builder b;
  std::vector<std::uintptr_t> acts;
  for (int it = 0; it < iterations; ++it) {
    for (int l = 0; l < layers; ++l) {
      const std::size_t rung = static_cast<std::size_t>(l < layers / 2 ? l + 1 : layers - l);
      const std::uintptr_t ws = b.alloc(unit / 2 + static_cast<std::size_t>(l) * 4096);
      acts.push_back(b.alloc(rung * unit + 1000));
      b.free(ws);
    }
    for (int l = layers - 1; l >= 0; --l) {
      const std::uintptr_t grad = b.alloc(unit + static_cast<std::size_t>(l) * 512);
      b.free(acts.back());
      acts.pop_back();
      b.free(grad);
    }
  }
  return b.take();
}

// `allocations` random requests (sizes log-uniform in [1, max_bytes]); each step allocates
// with probability 0.55 while live bytes stay under `live_cap`, else frees a random live
// block. Some blocks are left live at the end.
inline recorded_trace random_trace(std::uint64_t seed, std::size_t allocations, std::size_t max_bytes = std::size_t{8} << 20,
                                   std::size_t live_cap = std::size_t{256} << 20)
{
  std::mt19937_64 rng{seed};
  std::uniform_real_distribution<double> logsize{0.0, std::log2(static_cast<double>(max_bytes))};
  std::uniform_real_distribution<double> coin{0.0, 1.0};
  trace_builder b;
  std::vector<std::pair<std::uintptr_t, std::size_t>> live;
  std::size_t live_bytes = 0;
  std::size_t made = 0;
  while (made < allocations) {
    const auto size = static_cast<std::size_t>(std::exp2(logsize(rng)));
    if ((live.empty() || coin(rng) < 0.55) && live_bytes + size <= live_cap) {
      live.emplace_back(b.alloc(size), size);
      live_bytes += size;
      ++made;
    } else if (!live.empty()) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>{0, live.size() - 1}(rng);
      b.free(live[k].first);
      live_bytes -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    } else {
      ++made;
    }
  }
  // Free most of what is left, keep a few live to the end.
  while (live.size() > 3) {
    b.free(live.back().first);
    live.pop_back();
  }
  return b.take();
}

// `threads` threads, each with `streams_per_thread` streams, interleaved at random. One in
// eight blocks is freed by the next thread on its own stream (a producer/consumer hand-off).
inline recorded_trace streams_trace(std::uint64_t seed, int threads, int streams_per_thread, std::size_t operations)
{
  std::mt19937_64 rng{seed};
  trace_builder b;
  struct live_block {
    std::uintptr_t address;
    std::uintptr_t stream;
  };
  std::vector<std::vector<live_block>> live(static_cast<std::size_t>(threads));
  auto stream_of = [&](int t, int s) { return std::uintptr_t{0x7000} + static_cast<std::uintptr_t>(t * 16 + s) * 0x100; };
  for (std::size_t op = 0; op < operations; ++op) {
    const int t = static_cast<int>(rng() % static_cast<std::uint64_t>(threads));
    const auto thread = static_cast<std::uint64_t>(1000 + t);
    auto& mine = live[static_cast<std::size_t>(t)];
    if (mine.empty() || rng() % 100 < 55) {
      const std::uintptr_t s = stream_of(t, static_cast<int>(rng() % static_cast<std::uint64_t>(streams_per_thread)));
      const std::size_t size = std::size_t{1} << (rng() % 22);
      mine.push_back({b.alloc(size + rng() % 4096, s, thread), s});
    } else {
      const std::size_t k = rng() % mine.size();
      const live_block blk = mine[k];
      mine[k] = mine.back();
      mine.pop_back();
      if (rng() % 8 == 0 && threads > 1) {
        // handed to the next thread, which frees it later
        live[static_cast<std::size_t>((t + 1) % threads)].push_back(blk);
      } else {
        b.free(blk.address, blk.stream, thread);
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    for (const live_block& blk : live[static_cast<std::size_t>(t)]) b.free(blk.address, blk.stream, static_cast<std::uint64_t>(1000 + t));
  }
  return b.take();
}

// The trace as RMM's logging_resource_adaptor writes it (alloc, free, oom events only).
inline std::string rmm_csv(const recorded_trace& t, bool clock_times = true)
{
  std::string out = "Thread,Time,Action,Pointer,Size,Stream\n";
  char line[256];
  for (const trace_event& e : t.events) {
    const char* action = e.kind == trace_kind::allocate        ? "allocate"
                         : e.kind == trace_kind::free          ? "free"
                         : e.kind == trace_kind::out_of_memory ? "allocate failure"
                                                               : nullptr;
    if (action == nullptr) continue;
    char time[48];
    if (clock_times) {
      const std::uint64_t us = e.time_ns / 1000;
      std::snprintf(time, sizeof time, "%02llu:%02llu:%02llu.%06llu", static_cast<unsigned long long>(us / 3600000000ull % 24),
                    static_cast<unsigned long long>(us / 60000000ull % 60), static_cast<unsigned long long>(us / 1000000ull % 60),
                    static_cast<unsigned long long>(us % 1000000ull));
    } else {
      std::snprintf(time, sizeof time, "%llu.%06llu", static_cast<unsigned long long>(1634567890ull + e.time_ns / 1000000000ull),
                    static_cast<unsigned long long>(e.time_ns / 1000 % 1000000));
    }
    std::snprintf(line, sizeof line, "%llu,%s,%s,0x%llx,%zu,0x%llx\n", static_cast<unsigned long long>(e.thread), time, action,
                  static_cast<unsigned long long>(e.address), e.requested, static_cast<unsigned long long>(e.stream));
    out += line;
  }
  return out;
}

}  // namespace depot::test
