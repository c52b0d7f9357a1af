// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// depot-cpu-costs: what the allocator's fast path is made of, priced on this CPU, so that
// allocator timings taken on two machines can be compared (BENCHMARKS.md). One thread, ns
// per operation, best of 5:
//   plain add        load + add + store of a counter (what statistics under a lock could be)
//   atomic add       an uncontended lock-prefixed fetch_add on one line
//   16 atomic adds   fetch_add on 16 counters in 16 lines (the statistics of one pair)
//   mutex pair       std::mutex lock + unlock, uncontended
//   dependent load   one load whose address depends on the last, over N bytes (a cache or
//                    DRAM miss when N exceeds the caches): 32 KiB, 1 MiB, 32 MiB, 512 MiB
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

namespace {

template <class F>
double best_ns(std::size_t n, F f)
{
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f(n);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n));
  }
  return best;
}

struct alignas(64) line {
  std::atomic<std::int64_t> v{0};
};

}  // namespace

int main()
{
  constexpr std::size_t n = 20'000'000;
  volatile std::int64_t plain = 0;
  std::printf("%-22s %8.2f ns\n", "plain add", best_ns(n, [&](std::size_t k) {
                for (std::size_t i = 0; i < k; ++i) plain = plain + static_cast<std::int64_t>(i);
              }));
  line one;
  std::printf("%-22s %8.2f ns\n", "atomic add", best_ns(n, [&](std::size_t k) {
                for (std::size_t i = 0; i < k; ++i) one.v.fetch_add(static_cast<std::int64_t>(i), std::memory_order_relaxed);
              }));
  std::array<line, 16> many;
  std::printf("%-22s %8.2f ns\n", "16 atomic adds", best_ns(n / 16, [&](std::size_t k) {
                for (std::size_t i = 0; i < k; ++i) {
                  for (auto& l : many) l.v.fetch_add(1, std::memory_order_relaxed);
                }
              }));
  std::mutex mu;
  std::printf("%-22s %8.2f ns\n", "mutex pair", best_ns(n, [&](std::size_t k) {
                for (std::size_t i = 0; i < k; ++i) {
                  mu.lock();
                  plain = plain + 1;
                  mu.unlock();
                }
              }));
  std::mt19937_64 rng{1};
  for (std::size_t bytes : {std::size_t{32} << 10, std::size_t{1} << 20, std::size_t{32} << 20, std::size_t{512} << 20}) {
    // One random cycle through all slots, one slot per 64-byte line.
    const std::size_t slots = bytes / 64;
    std::vector<std::size_t> order(slots);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::size_t> next(slots * 8);
    for (std::size_t i = 0; i < slots; ++i) next[order[i] * 8] = order[(i + 1) % slots] * 8;
    std::size_t at = 0;
    const double ns = best_ns(std::min<std::size_t>(n / 4, 4 * slots), [&](std::size_t k) {
      for (std::size_t i = 0; i < k; ++i) at = next[at];
    });
    std::printf("dependent load %5zu %s %8.2f ns%s\n", bytes >= (1U << 20) ? bytes >> 20 : bytes >> 10,
                bytes >= (1U << 20) ? "MiB" : "KiB", ns, at == 1 ? " " : "");
  }
}
