// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "ipc_child_process.hpp"
#include "limiting_upstream.hpp"
#include "pool_invariants.hpp"
#include "snapshot_queries.hpp"
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/error.hpp>
#include <depot/hal/format_address.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/stream_registry.hpp>
#include <depot/ops/busy_wait.hpp>
#include <depot/ops/fill.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/captured_graph.hpp>
#include <depot/pool/detail/handle_table.hpp>
#include <depot/pool/fixed_pool.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_mapping.hpp>
#include <depot/pool/ipc_received.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/pool/pool.hpp>
#include <depot/pool/profile_memory.hpp>
#include <depot/pool/simulated_upstream.hpp>
#include <depot/pool/trace_file.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using depot::test::check_invariants;
using depot::test::limiting_upstream;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

bool contains(const std::string& text, const std::string& part)
{
  return text.find(part) != std::string::npos;
}

// Every peak (all, large, small, for every statistic) equals the highest value its figure
// showed after any operation so far: figures change at operation boundaries, exactly.
// Call after each operation of a single-threaded test on an allocator with fresh peaks.
struct peak_tracker {
  std::map<std::string, std::int64_t> high;
  void check(const depot::memory_stats& st)
  {
    const std::pair<const char*, const depot::stat_array*> arrays[] = {
        {"allocated", &st.allocated_bytes}, {"requested", &st.requested_bytes},
        {"reserved", &st.reserved_bytes},   {"cached", &st.cached_bytes},
        {"active", &st.active_bytes},       {"inactive_split", &st.inactive_split_bytes},
        {"num_allocations", &st.num_allocations}, {"num_segments", &st.num_segments}};
    for (const auto& [name, a] : arrays) {
      for (const auto& [pool, x] : {std::pair{".all", &a->all}, std::pair{".large", &a->large},
                                    std::pair{".small", &a->small}}) {
        const std::string key = std::string{name} + pool;
        std::int64_t& h = high[key];
        h = std::max(h, x->current);
        INFO(key, " current ", x->current);
        REQUIRE(x->peak == h);
      }
    }
  }
};

template <depot::device D>
depot::allocator_config quiet_config()
{
  return depot::allocator_config{};  // defaults, whatever DEPOT_ALLOC_CONF says
}

// Fills n bytes of device memory with `value` and checks samples of it later.
template <depot::device D>
void fill_bytes(void* p, std::size_t n, unsigned char value, depot::stream_ref<D> s)
{
  depot::runtime<D>::set_async(p, value, n, s.native());
}

template <depot::device D>
bool check_bytes(const void* p, std::size_t n, unsigned char value, std::mt19937_64& rng)
{
  unsigned char probe[64];
  const std::size_t k = std::min<std::size_t>(sizeof probe, n);
  const std::size_t spots[] = {0, n - k, (rng() % (n - k + 1))};
  for (std::size_t at : spots) {
    depot::runtime<D>::copy(probe, static_cast<const unsigned char*>(p) + at, k);
    for (std::size_t i = 0; i < k; ++i) {
      if (probe[i] != value) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("pool: the allocator contract", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  CHECK(a.allocate(0) == nullptr);
  a.deallocate(nullptr);
  for (std::size_t n : {std::size_t{4}, std::size_t{1024}, MiB, std::size_t{1} << 30}) {
    CAPTURE(n);
    void* p = a.allocate(n);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 512 == 0);
    depot::runtime<D>::set_async(p, 0x5C, n, nullptr);
    depot::runtime<D>::synchronize(0);
    a.deallocate(p);
  }
  // Back-to-back small allocations are distinct and do not overlap.
  std::vector<void*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.push_back(a.allocate(100));
  std::set<void*> distinct(ptrs.begin(), ptrs.end());
  CHECK(distinct.size() == ptrs.size());
  for (std::size_t i = 1; i < ptrs.size(); ++i) {
    const auto d = reinterpret_cast<std::intptr_t>(ptrs[i]) - reinterpret_cast<std::intptr_t>(ptrs[i - 1]);
    CHECK(std::abs(d) >= 512);
  }
  for (void* p : ptrs) a.deallocate(p);
  check_invariants(a);
  CHECK(a.stats().allocated_bytes.all.current == 0);
}

TEST_CASE_TEMPLATE("pool: random sizes and mixed operations keep data and statistics", D,
                   DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("pool random sizes", 0xDE907)};
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s;
  std::map<void*, std::pair<std::size_t, unsigned char>> live;
  unsigned char next_id = 1;
  auto alloc = [&](std::size_t n) {
    void* p = a.allocate(n, s);
    REQUIRE(p != nullptr);
    fill_bytes<D>(p, n, next_id, s);
    live[p] = {n, next_id};
    next_id = static_cast<unsigned char>(next_id % 250 + 1);
  };
  for (int i = 0; i < 100; ++i) alloc(1 + rng() % (5 * MiB));
  s.synchronize();
  for (int i = 0; i < 200; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      alloc(1 + rng() % (5 * MiB));
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      s.synchronize();
      REQUIRE(check_bytes<D>(it->first, it->second.first, it->second.second, rng));
      a.deallocate(it->first, s);
      live.erase(it);
    }
  }
  s.synchronize();
  check_invariants(a);
  for (auto& [p, info] : live) {
    REQUIRE(check_bytes<D>(p, info.first, info.second, rng));
    a.deallocate(p);
  }
  const auto st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.num_cache_hits + st.num_cache_misses == st.num_allocations.all.allocated);
  CHECK(st.num_cache_hits > 0);
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

// Sizes of the fuzz: the large pool (the issue's 2-20 MiB), the small pool's dense segments
// (entries per 512-byte unit, up to 64 KiB), its linked segments (64 KiB-1 MiB) and a mix.
struct fuzz_range {
  std::size_t lo;
  std::size_t hi;
  std::size_t max_live;
  bool expandable = false;
};

fuzz_range pick_fuzz_range()
{
  fuzz_range r{2 * MiB, 20 * MiB, 48};
  SUBCASE("large pool, 2-20 MiB") {}
  SUBCASE("dense small segments, 1 B-64 KiB") { r = {1, 64 * KiB, 400}; }
  SUBCASE("linked small segments, 64 KiB-1 MiB") { r = {64 * KiB + 1, MiB, 120}; }
  SUBCASE("every pool, 1 B-3 MiB") { r = {1, 3 * MiB, 150}; }
  SUBCASE("expandable segments, 1 B-24 MiB") { r = {1, 24 * MiB, 40, true}; }
  return r;
}

TEST_CASE_TEMPLATE("pool: statistics fuzz, 10 000 operations, invariants after each", D,
                   DEPOT_TEST_DEVICES)
{
  const fuzz_range range = pick_fuzz_range();
  std::mt19937_64 rng{depot::test::seed("pool stats fuzz", 10000)};
  depot::allocator_config cfg = quiet_config<D>();
  cfg.expandable_segments = range.expandable;
  depot::caching_allocator<D> a{0, cfg};
  CHECK((a.expandable_page() != 0) == range.expandable);
  depot::stream<D> s;
  std::map<void*, std::pair<std::size_t, unsigned char>> live;
  std::int64_t expect_peak = 0;
  peak_tracker peaks;
  for (int op = 0; op < 10000; ++op) {
    const auto r = rng() % 100;
    if (r < 2) {
      a.empty_cache();
    } else if (live.empty() || (r < 55 && live.size() < range.max_live)) {
      const std::size_t n = range.lo + rng() % (range.hi - range.lo + 1);
      void* p = a.allocate(n, s);
      const auto id = static_cast<unsigned char>(op % 251 + 1);
      fill_bytes<D>(p, n, id, s);
      live[p] = {n, id};
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      s.synchronize();
      REQUIRE(check_bytes<D>(it->first, it->second.first, it->second.second, rng));
      a.deallocate(it->first);
      live.erase(it);
    }
    const auto st = a.stats();
    expect_peak = std::max(expect_peak, st.allocated_bytes.all.current);
    REQUIRE(st.allocated_bytes.all.peak == expect_peak);
    peaks.check(st);
    REQUIRE(st.allocated_bytes.all.allocated - st.allocated_bytes.all.freed ==
            st.allocated_bytes.all.current);
    check_invariants(st, a.snapshot());
  }
  // A peak reset never disturbs live totals.
  const auto before = a.stats();
  a.reset_peak_stats();
  const auto after = a.stats();
  CHECK(after.allocated_bytes.all.current == before.allocated_bytes.all.current);
  CHECK(after.allocated_bytes.all.peak == after.allocated_bytes.all.current);
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);
  a.reset_memory_stats();
  const auto reset = a.stats();
  CHECK(reset.allocated_bytes.all.current == before.allocated_bytes.all.current);
  CHECK(reset.allocated_bytes.all.allocated == 0);
  CHECK(reset.num_cache_hits == 0);
  check_invariants(reset, a.snapshot());
  for (auto& [p, info] : live) a.deallocate(p);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: out of memory retries, then throws a full report, and leaks nothing",
                   D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(80 * MiB, counters),
                                  quiet_config<D>()};
    void* x = a.allocate(30 * MiB);
    void* y = a.allocate(30 * MiB);
    a.deallocate(y);  // 30 MiB cached, 60 MiB reserved
    // 40 MiB does not fit next to 60: the cache is released and the retry succeeds.
    void* z = a.allocate(40 * MiB);
    // The upstream's out_of_memory (thrown here, in the test's code) was caught inside
    // libdepot: none is in flight. A toolchain that links a static C++ runtime into every
    // library and program gives the two different copies, and this read 1 from then on
    // (meson.build, cxx_runtime).
    CHECK(std::uncaught_exceptions() == 0);
    auto st = a.stats();
    CHECK(st.num_alloc_retries == 1);
    CHECK(st.num_ooms == 0);
    CHECK(st.reserved_bytes.all.current == 70 * static_cast<std::int64_t>(MiB));
    // 60 MiB cannot fit at all.
    try {
      (void)a.allocate(60 * MiB);
      FAIL("60 MiB over an 80 MiB limit succeeded");
    } catch (const depot::out_of_memory& e) {
      const std::string m = e.what();
      CHECK(e.requested_bytes() == 60 * MiB);
      CHECK(contains(m, "out of memory"));
      CHECK(contains(m, std::to_string(60 * MiB) + " bytes"));
      CHECK(contains(m, e.device().to_string()));
      CHECK(contains(m, "reserved"));
      CHECK(contains(m, "allocated"));
      CHECK(contains(m, "largest free block"));
      CHECK(contains(m, "fragmentation"));
    }
    st = a.stats();
    CHECK(st.num_ooms == 1);
    CHECK(st.num_alloc_retries == 2);
    check_invariants(a);
    // The live blocks are intact and usable.
    depot::runtime<D>::set_async(x, 1, 30 * MiB, nullptr);
    depot::runtime<D>::set_async(z, 2, 40 * MiB, nullptr);
    depot::runtime<D>::synchronize(0);
    a.deallocate(x);
    a.deallocate(z);
  }
  CHECK(counters->outstanding.load() == 0);  // everything went back to the upstream
  CHECK(counters->failures.load() >= 2);
}

// The out-of-memory handler (RMM's failure callback, PyTorch's out-of-memory observers):
// called after the allocator's own retries, with no lock held, so it can free memory here;
// true tries the request again, false (or no handler) lets out_of_memory go, counted once.
TEST_CASE_TEMPLATE("pool: an out-of-memory handler can free memory and have the request tried again", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(80 * MiB, counters),
                                  quiet_config<D>()};
    a.set_trace_capacity(64);
    void* held = a.allocate(60 * MiB);  // 40 MiB more cannot fit beside it
    std::vector<std::pair<std::size_t, unsigned>> calls;  // (requested bytes, attempt)
    // A handler that records each call and answers retry(attempt).
    const auto recording = [&calls](auto retry) {
      return [&calls, retry](const depot::out_of_memory& e, unsigned attempt) {
        calls.emplace_back(e.requested_bytes(), attempt);
        return retry(attempt);
      };
    };

    SUBCASE("it frees a block of this allocator and says retry: the request succeeds") {
      a.set_oom_handler([&](const depot::out_of_memory& e, unsigned attempt) {
        calls.emplace_back(e.requested_bytes(), attempt);
        CHECK(contains(e.what(), "out of memory"));
        CHECK(e.device() == a.device());
        check_invariants(a.stats(), a.snapshot());  // (no lock of the allocator is held)
        a.deallocate(std::exchange(held, nullptr));
        return true;
      });
      void* z = a.allocate(40 * MiB + 1);
      REQUIRE(z != nullptr);
      CHECK(calls == std::vector<std::pair<std::size_t, unsigned>>{{40 * MiB + 1, 1U}});
      const auto st = a.stats();
      CHECK(st.num_ooms == 0);
      CHECK(st.allocated_bytes.all.current == static_cast<std::int64_t>(40 * MiB + 512));
      const auto trace = a.trace();
      CHECK(std::count_if(trace.begin(), trace.end(), [](const depot::trace_event& t) {
              return t.kind == depot::trace_kind::out_of_memory;
            }) == 1);  // the failure the handler saw is in the trace
      depot::runtime<D>::set_async(z, 3, 40 * MiB + 1, nullptr);
      depot::runtime<D>::synchronize(0);
      a.deallocate(z);
    }
    SUBCASE("it declines: out_of_memory goes to the caller, counted once") {
      a.set_oom_handler(recording([](unsigned) { return false; }));
      CHECK_THROWS_AS((void)a.allocate(40 * MiB), depot::out_of_memory);
      CHECK(calls == std::vector<std::pair<std::size_t, unsigned>>{{40 * MiB, 1U}});
      CHECK(a.stats().num_ooms == 1);
    }
    SUBCASE("it says retry without freeing: called with attempts 1, 2, 3 until it declines") {
      a.set_oom_handler(recording([](unsigned attempt) { return attempt < 3; }));
      try {
        (void)a.allocate(40 * MiB);
        FAIL("40 MiB beside 60 MiB under an 80 MiB upstream succeeded");
      } catch (const depot::out_of_memory& e) {
        CHECK(e.requested_bytes() == 40 * MiB);
        CHECK(contains(e.what(), "largest free block"));  // the allocator's own report
      }
      CHECK(calls == std::vector<std::pair<std::size_t, unsigned>>{{40 * MiB, 1U}, {40 * MiB, 2U}, {40 * MiB, 3U}});
      CHECK(a.stats().num_ooms == 1);
    }
    SUBCASE("an exception it throws goes to the caller in place of out_of_memory") {
      a.set_oom_handler([](const depot::out_of_memory&, unsigned) -> bool { throw std::runtime_error("handler"); });
      CHECK_THROWS_WITH_AS((void)a.allocate(40 * MiB), "handler", std::runtime_error);
      CHECK(a.stats().num_ooms == 0);
    }
    SUBCASE("an empty handler removes it") {
      a.set_oom_handler(recording([](unsigned) { return false; }));
      a.set_oom_handler({});
      CHECK_THROWS_AS((void)a.allocate(40 * MiB), depot::out_of_memory);
      CHECK(calls.empty());
      CHECK(a.stats().num_ooms == 1);
    }
    SUBCASE("a request above the largest accepted size never reaches it (no retry could help)") {
      a.set_oom_handler(recording([](unsigned) { return true; }));
      CHECK_THROWS_AS((void)a.allocate((std::size_t{1} << 56) + 1), depot::out_of_memory);
      CHECK(calls.empty());
      CHECK(a.stats().num_ooms == 1);
    }
    check_invariants(a);
    if (held != nullptr) a.deallocate(held);
  }
  CHECK(counters->outstanding.load() == 0);
}

// The free function sets the process-wide pool's handler; a request no device can hold
// (1 PiB: the upstream refuses it at once) reaches it.
TEST_CASE_TEMPLATE("pool: set_oom_handler<D>() reaches pool<D>()", D, DEPOT_TEST_DEVICES)
{
  const std::size_t huge = std::size_t{1} << 50;
  std::vector<std::pair<std::size_t, unsigned>> calls;
  depot::set_oom_handler<D>([&](const depot::out_of_memory& e, unsigned attempt) {
    calls.emplace_back(e.requested_bytes(), attempt);
    return attempt < 2;
  });
  const auto ooms = depot::get_memory_stats<D>().num_ooms;
  CHECK_THROWS_AS((void)depot::pool<D>().allocate(huge), depot::out_of_memory);
  depot::set_oom_handler<D>({});
  CHECK(calls == std::vector<std::pair<std::size_t, unsigned>>{{huge, 1U}, {huge, 2U}});
  CHECK(depot::get_memory_stats<D>().num_ooms == ooms + 1);
  CHECK_THROWS_AS((void)depot::pool<D>().allocate(huge), depot::out_of_memory);
  CHECK(calls.size() == 2);  // removed
}

// Threads that run out of memory at once each get the handler, which is replaced while they
// do; no lock is held around it (it frees this allocator's memory) and no figure drifts.
TEST_CASE_TEMPLATE("pool: out-of-memory handlers on many threads at once", D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(64 * MiB, counters),
                                  quiet_config<D>()};
    constexpr int threads = 4;
    constexpr int rounds = 40;
    std::atomic<int> calls{0};
    std::atomic<int> declined{0};
    const auto handler = [&](const depot::out_of_memory&, unsigned attempt) {
      calls.fetch_add(1);
      (void)a.stats();
      if (attempt >= 2) {
        declined.fetch_add(1);
        return false;
      }
      return true;
    };
    a.set_oom_handler(handler);
    // 48 MiB held: no 24 MiB request fits beside it, so every one fails, twice.
    void* held[2] = {a.allocate(24 * MiB), a.allocate(24 * MiB)};
    std::atomic<int> thrown{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        depot::stream<D> s;
        for (int r = 0; r < rounds; ++r) {
          try {
            a.deallocate(a.allocate(24 * MiB, s), s);
          } catch (const depot::out_of_memory&) {
            thrown.fetch_add(1);
          }
          void* small = a.allocate(4 * KiB, s);  // the caches go on serving what fits
          if (t == 0 && r % 8 == 0) a.set_oom_handler(handler);  // replaced while others call it
          a.deallocate(small, s);
        }
      });
    }
    for (auto& th : pool) th.join();
    const auto st = a.stats();
    CHECK(thrown.load() == threads * rounds);
    CHECK(st.num_ooms == thrown.load());
    CHECK(declined.load() == thrown.load());
    CHECK(calls.load() == 2 * thrown.load());
    check_invariants(st, a.snapshot());
    a.deallocate(held[0]);
    a.deallocate(held[1]);
  }
  CHECK(counters->outstanding.load() == 0);
}

TEST_CASE_TEMPLATE("pool: out of memory with a fragmented cache suggests the settings that help", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(40 * MiB, counters), quiet_config<D>()};
  // Two 20 MiB segments of three 6 MiB blocks each; every other block freed: 22 MiB cached in
  // pieces of at most 8 MiB (fragmentation 0.64), none of it wholly free.
  std::vector<void*> p;
  for (int i = 0; i < 6; ++i) p.push_back(a.allocate(6 * MiB));
  REQUIRE(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(40 * MiB));
  a.deallocate(p[0]);
  a.deallocate(p[2]);
  a.deallocate(p[4]);
  const auto st = a.stats();
  CHECK(st.fragmentation > 0.5);
  try {
    (void)a.allocate(20 * MiB);
    FAIL("20 MiB over a full 40 MiB upstream succeeded");
  } catch (const depot::out_of_memory& e) {
    const std::string m = e.what();
    CHECK(contains(m, "fragmented"));
    CHECK(contains(m, "max_split_size_mb:20"));
    CHECK(contains(m, "expandable_segments:true"));
  }
  check_invariants(a);
  a.deallocate(p[1]);
  a.deallocate(p[3]);
  a.deallocate(p[5]);
}

TEST_CASE_TEMPLATE("pool: per_process_memory_fraction caps reserved memory", D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  depot::allocator_config cfg;
  cfg.per_process_memory_fraction = 0.5;
  depot::caching_allocator<D> a{
      std::make_unique<limiting_upstream<D>>(1024 * MiB, counters, 100 * MiB), cfg};
  void* p = a.allocate(40 * MiB);
  try {
    (void)a.allocate(20 * MiB);
    FAIL("allocation beyond the fraction succeeded");
  } catch (const depot::out_of_memory& e) {
    CHECK(contains(e.what(), "per_process_memory_fraction"));
  }
  a.deallocate(p);
  CHECK(counters->failures.load() == 0);  // refused before the upstream was asked
}

TEST_CASE_TEMPLATE("pool: bad input is refused and changes nothing", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  void* p = a.allocate(1000);
  const auto before = a.stats();
  for (std::size_t huge : {std::numeric_limits<std::size_t>::max(),
                           std::numeric_limits<std::size_t>::max() - 100,
                           (std::size_t{1} << 56) + 1}) {
    CAPTURE(huge);
    try {
      (void)a.allocate(huge);
      FAIL("a near-SIZE_MAX request succeeded");
    } catch (const depot::out_of_memory& e) {
      CHECK(e.requested_bytes() == huge);
      CHECK(contains(e.what(), std::to_string(huge)));
    }
  }
  CHECK_THROWS_AS((void)a.allocate(std::size_t{1} << 62, 8, {}), depot::invalid_argument);
  CHECK_THROWS_AS((void)a.allocate(std::numeric_limits<std::size_t>::max() / 2 + 1, 2, {}),
                  depot::invalid_argument);
  void* ok = a.allocate(4, 8, {});
  CHECK(ok != nullptr);
  a.deallocate(ok);

  int on_stack = 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(&on_stack)));
  try {
    a.deallocate(&on_stack);
    FAIL("a foreign pointer was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), buf));
  }
  // Wrong size for the size-taking overload: refused, the block stays live.
  CHECK_THROWS_AS(a.deallocate(p, 999, {}), depot::invalid_argument);
  a.deallocate(p, 1000, {});
  // Double free.
  CHECK_THROWS_AS(a.deallocate(p), depot::invalid_argument);
  CHECK_THROWS_AS(a.record_stream(p, {}), depot::invalid_argument);
  const auto after = a.stats();
  CHECK(after.allocated_bytes.all.current == before.allocated_bytes.all.current - 1024);
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);
  check_invariants(a);
  // Still fully working.
  void* q = a.allocate(1000);
  a.deallocate(q);
}

TEST_CASE_TEMPLATE("pool: pointers inside or beside live blocks are refused in every pool", D,
                   DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s2;
  for (std::size_t n : {std::size_t{4}, 3 * KiB, 64 * KiB, 64 * KiB + 1, 700 * KiB, 5 * MiB}) {
    CAPTURE(n);
    void* p = a.allocate(n);
    void* neighbour = a.allocate(n);
    auto* c = static_cast<char*>(p);
    const auto before = a.stats();
    for (char* bad : {c + 1, c + 512, c + 511, c - 512, c + 2 * MiB}) {
      if (bad == neighbour) continue;
      CAPTURE(static_cast<void*>(bad));
      CHECK_THROWS_AS(a.deallocate(bad), depot::invalid_argument);
      CHECK_THROWS_AS(a.record_stream(bad, s2), depot::invalid_argument);
    }
    // the wrong size: refused, and the block is still found afterwards (a linked block
    // is put back where a free finds it)
    CHECK_THROWS_AS(a.deallocate(p, n + 1, {}), depot::invalid_argument);
    CHECK_THROWS_AS(a.deallocate(p, n + 1, {}), depot::invalid_argument);
    CHECK(a.stats().allocated_bytes.all.current == before.allocated_bytes.all.current);
    check_invariants(a);
    a.deallocate(p, n, {});
    CHECK_THROWS_AS(a.deallocate(p), depot::invalid_argument);  // double free
    a.deallocate(neighbour);
    CHECK_THROWS_AS(a.deallocate(neighbour, s2), depot::invalid_argument);
    check_invariants(a);
  }
  const auto end = a.stats();
  CHECK(end.allocated_bytes.all.current == 0);
  // every neighbour merged back, but for the small blocks kept for reuse at their size
  // (allocator_config::small_reuse_bytes), which the snapshot names
  const std::int64_t kept = depot::test::kept_in(a.snapshot()).bytes;
  CHECK(kept > 0);  // (4 B and 3 KiB, twice each, and two of 64 KiB)
  CHECK(end.inactive_split_bytes.all.current >= kept);
  a.empty_cache();  // merges them, and releases every segment
  CHECK(a.stats().inactive_split_bytes.all.current == 0);
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

namespace {

using depot::test::exit_status;
using depot::test::spawn_ipc_child;

// Runs tests/ipc_child.cpp on `handle`; its exit status, or -1.
int run_ipc_child(const std::string& handle, int expect, int next)
{
  // (the child takes an expandable segment's page descriptors from this process)
  depot::test::allow_children_to_take_descriptors();
  return exit_status(spawn_ipc_child({handle, std::to_string(expect), std::to_string(next)}));
}

// depot-ipc-child --count HANDLE MODE, running, its stdin and stdout (stderr too) piped.
struct counting_child {
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout
  counting_child(const std::string& handle, const char* mode)
  {
    int to[2];
    int from[2];
    REQUIRE(::pipe2(to, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from, O_CLOEXEC) == 0);
    in = to[1];
    out = from[0];
    // A child that exits without reading its stdin (a refusal) must fail a check, not kill
    // this process with SIGPIPE when finish() writes to it.
    ::signal(SIGPIPE, SIG_IGN);
    pid = spawn_ipc_child({"--count", handle, mode}, {{to[0], 0}, {from[1], 1}, {from[1], 2}});
    ::close(to[0]);
    ::close(from[1]);
  }
  counting_child(const counting_child&) = delete;
  counting_child& operator=(const counting_child&) = delete;
  ~counting_child() { (void)finish(); }
  // Its next line of output ("" at the end).
  std::string line()
  {
    std::string l;
    char c = 0;
    while (::read(out, &c, 1) == 1 && c != '\n') l += c;
    return l;
  }
  // Lets it go on (a line on its stdin), reads the rest of its output; its exit status.
  int finish(std::string* rest = nullptr)
  {
    if (pid < 0) {  // (killed and reaped by the test)
      for (int* fd : {&in, &out}) {
        if (*fd >= 0) ::close(std::exchange(*fd, -1));
      }
      return -1;
    }
    if (in >= 0) {
      (void)::write(in, "\n", 1);
      ::close(std::exchange(in, -1));
    }
    std::string all;
    char buf[256];
    for (ssize_t k; (k = ::read(out, buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(k));
    ::close(std::exchange(out, -1));
    int status = 0;
    (void)::waitpid(std::exchange(pid, -1), &status, 0);  // (no REQUIRE: runs in the destructor)
    if (rest != nullptr) *rest = all;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

// Runs tests/ipc_child.cpp --receive, sending it h (ipc_send) over a Unix socket on its
// descriptor 3; its exit status, or -1.
int run_ipc_child_sent(const depot::ipc_handle& handle, int expect, int next)
{
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const pid_t pid = spawn_ipc_child({"--receive", std::to_string(expect), std::to_string(next)}, {{sv[1], 3}});
  ::close(sv[1]);
  depot::ipc_send(sv[0], handle);
  ::close(sv[0]);
  return exit_status(pid);
}

// Block p (n bytes, all `value`) exported as h: this process's own handle maps to the block
// itself; a child process sees `value` in every byte and sets them to value + 1, which this
// process then reads; a child sent the handle over a socket (with the page descriptors of
// an expandable segment's block) sees value + 1 and sets value + 2, read back too; a child
// expecting `value` fails.
template <depot::device D>
void check_shared_with_child(void* p, std::size_t n, const depot::ipc_handle& h, int value)
{
  {
    depot::ipc_mapping<D> self{h};
    CHECK(self.get() == p);
    CHECK(self.size() == h.size);
  }
  const auto all_are = [&](int v) {
    std::vector<unsigned char> back(n);
    depot::runtime<D>::copy(back.data(), p, n);
    return std::count(back.begin(), back.end(), static_cast<unsigned char>(v)) == static_cast<std::ptrdiff_t>(n);
  };
  CHECK(run_ipc_child(h.to_hex(), value, value + 1) == 0);
  CHECK(all_are(value + 1));
  CHECK(run_ipc_child_sent(h, value + 1, value + 2) == 0);
  CHECK(all_are(value + 2));
  CHECK(run_ipc_child(h.to_hex(), value, 0) == 1);  // the child sees the bytes are no longer `value`
}

// Frees the IPC tests' blocks and empties the cache.
template <depot::device D>
void free_all(depot::caching_allocator<D>& a, const std::vector<void*>& keep,
              const std::vector<std::pair<void*, std::size_t>>& blocks)
{
  for (void* p : keep) a.deallocate(p);
  for (auto [p, n] : blocks) a.deallocate(p);
  a.empty_cache();
}

}  // namespace

TEST_CASE_TEMPLATE("pool: blocks shared with another process (IPC)", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  // A dense small block, a linked small block, a large block sharing a segment and one with
  // a segment of its own (>= 10 MiB); each after a neighbour of its size, so the exported
  // block does not start its segment (but the last).
  std::vector<void*> keep;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t n : {std::size_t{3000}, 300 * KiB, 6 * MiB + 5, 12 * MiB + 5}) {
    keep.push_back(a.allocate(n));
    blocks.emplace_back(a.allocate(n), n);
  }
  const auto before = a.stats();

  // Bad input on every backend: pointers that are not live blocks, text that is no handle.
  auto* first = static_cast<char*>(blocks[0].first);
  int foreign = 0;
  CHECK_THROWS_WITH_AS(std::ignore = a.ipc_export(&foreign), doctest::Contains("not a live allocation"),
                       depot::invalid_argument);
  CHECK_THROWS_AS(std::ignore = a.ipc_export(first + 512), depot::invalid_argument);
  CHECK_THROWS_AS(std::ignore = a.ipc_export(nullptr), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex("abc"), doctest::Contains("expected 242 hex digits"),
                       depot::invalid_argument);
  depot::ipc_handle made;
  made.device = depot::device_id{depot::device_kind::cuda, 0};
  made.process = 1;
  made.segment = 1 << 21;
  made.offset = 512;
  made.size = 1024;
  made.requested = 1000;
  made.memory.bytes[0] = 0xAB;
  made.memory.bytes[63] = 0xCD;
  made.counter_fd = 5;
  made.counter_slot = 0x01020304;
  const std::string text = made.to_hex();
  REQUIRE(text.size() == depot::ipc_handle::hex_length);
  CHECK(depot::ipc_handle::from_hex(text) == made);
  std::string upper = text;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  CHECK(depot::ipc_handle::from_hex(upper) == made);
  auto altered = [&](std::size_t at, const std::string& with) {
    std::string t = text;
    t.replace(at, with.size(), with);
    return t;
  };
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(altered(7, "g")), doctest::Contains("character 7"),
                       depot::invalid_argument);
  CHECK(text.substr(0, 8) == "64707433");  // "dpt3"
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(altered(0, "00")), doctest::Contains("dpt3"),
                       depot::invalid_argument);
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(altered(6, "31")),  // "dpt1": before the counts
                       doctest::Contains("an older depot"), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(altered(8, "00")),  // kind host
                       doctest::Contains("valid: 1 cuda, 2 hip"), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(altered(10, "ffffffff")),  // index -1
                       doctest::Contains("out of range"), depot::invalid_argument);
  {
    depot::ipc_handle h = made;
    h.requested = 2000;  // more than the block spans
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(h.to_hex()),
                         doctest::Contains("0 < requested <= size"), depot::invalid_argument);
    h = made;
    h.counter_fd = -2;
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(h.to_hex()),
                         doctest::Contains("importer-count file descriptor -2 is negative"), depot::invalid_argument);
    h = made;
    h.offset = ~std::uint64_t{0} - 100;  // wraps the address space
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(h.to_hex()), doctest::Contains("overflows"),
                         depot::invalid_argument);
  }
  {
    // A block of an expandable segment: its pages' descriptors instead of a backend handle.
    depot::ipc_handle x = made;
    x.memory = {};
    x.counter_fd = -1;
    x.counter_slot = 0;
    x.page = 2 * MiB;
    x.offset = 2 * MiB - 512;  // 512 bytes on the first page, 1 MiB on the second, then 2 more pages
    x.size = 512 + 5 * MiB;
    x.fds = {7, 8, 9, 0x7FFFFFFF};
    const std::string xt = x.to_hex();
    CHECK(xt.size() == depot::ipc_handle::expandable_hex_length(4));
    CHECK(xt.substr(0, 8) == "64707432");  // "dpt2"
    CHECK(depot::ipc_handle::from_hex(xt) == x);
    CHECK(depot::ipc_handle::from_hex(xt).expandable());
    CHECK_FALSE(made.expandable());
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(xt + "00000000"),
                         doctest::Contains("hex digits for a handle of 4 pages"), depot::invalid_argument);
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(xt.substr(0, xt.size() - 8)),
                         doctest::Contains("hex digits for a handle of 4 pages"), depot::invalid_argument);
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(xt.substr(0, 100)),  // cut inside the header
                         doctest::Contains("expected 242 hex digits"), depot::invalid_argument);
    const auto bad = [&](auto change, const char* says) {
      depot::ipc_handle y = x;
      change(y);
      CAPTURE(says);
      CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(y.to_hex()), doctest::Contains(says),
                           depot::invalid_argument);
    };
    bad([](depot::ipc_handle& y) { y.page = 3 * MiB; }, "must be a power of two");
    bad([](depot::ipc_handle& y) { y.page = std::uint64_t{1} << 31; }, "must be a power of two in [1, 2^30]");
    bad([](depot::ipc_handle& y) { y.fds.clear(); }, "0 pages: must be 1 to");
    bad([](depot::ipc_handle& y) { y.fds.push_back(10); }, "does not span exactly 5 pages");  // a page too many
    bad([](depot::ipc_handle& y) { y.fds.pop_back(); }, "does not span exactly 3 pages");     // one too few
    bad([](depot::ipc_handle& y) { y.offset = 2 * MiB; }, "does not span exactly");            // offset past a page
    bad([](depot::ipc_handle& y) { y.fds[2] = -1; }, "page 2's file descriptor -1 is negative");
    bad([](depot::ipc_handle& y) { y.requested = y.size + 1; }, "0 < requested <= size");
    // The same fields with the other magic are an ordinary handle of the wrong length.
    std::string as_ordinary = xt;
    as_ordinary.replace(6, 2, "33");
    CHECK_THROWS_WITH_AS(std::ignore = depot::ipc_handle::from_hex(as_ordinary), doctest::Contains("expected 242 hex digits"),
                         depot::invalid_argument);
  }
  {
    depot::ipc_handle other = made;  // a handle of another backend
    other.device.kind = D::kind == depot::device_kind::cuda ? depot::device_kind::hip : depot::device_kind::cuda;
    CHECK_THROWS_WITH_AS(depot::ipc_mapping<D>{other}, doctest::Contains("open it with ipc_mapping<"),
                         depot::invalid_argument);
  }
  CHECK(a.stats().allocated_bytes.all.current == before.allocated_bytes.all.current);

  if constexpr (!depot::runtime<D>::has_ipc) {
    for (auto [p, n] : blocks) {
      CHECK_THROWS_WITH_AS(std::ignore = a.ipc_export(p), doctest::Contains("cannot share memory with another process"),
                           depot::error);
    }
    depot::ipc_handle h = made;
    h.device.kind = D::kind;
    CHECK_THROWS_WITH_AS(depot::ipc_mapping<D>{h}, doctest::Contains("cannot share memory"), depot::error);
    for (const auto& seg : a.snapshot().segments) CHECK_FALSE(seg.exported);
  } else {
    int value = 11;
    std::set<std::uint64_t> exported_segments;
    for (auto [p, n] : blocks) {
      CAPTURE(n);
      depot::runtime<D>::set_async(p, value, n, nullptr);
      depot::runtime<D>::synchronize(0);
      const depot::ipc_handle h = a.ipc_export(p);
      CHECK(h.device == depot::device_id::of<D>(0));
      CHECK(h.process == static_cast<std::uint64_t>(::getpid()));
      CHECK(h.segment + h.offset == reinterpret_cast<std::uintptr_t>(p));
      CHECK((h.offset > 0) == (n < 10 * MiB));  // after its neighbour, or a segment of its own
      CHECK(h.requested == n);
      CHECK(h.size >= n);
      CHECK(h.size % 512 == 0);
      CHECK(depot::ipc_handle::from_hex(h.to_hex()) == h);
      exported_segments.insert(h.segment);
      check_shared_with_child<D>(p, n, h, value);
      value += 10;
    }
    check_invariants(a);
    // Each child counted itself in while it mapped the block (it checks that) and out when
    // it exited: the exported segments have no importer now.
    std::set<std::uint64_t> exported_now;
    for (const auto& seg : a.snapshot().segments) {
      if (!seg.exported) continue;
      exported_now.insert(seg.address);
      CHECK(seg.importers == 0);
    }
    CHECK(exported_now == exported_segments);
    CHECK(nlohmann::json::parse(a.snapshot().to_json())["segments"][0].contains("importers"));
    // So once their blocks are freed, empty_cache releases them like any other.
    free_all(a, keep, blocks);
    CHECK(a.snapshot().segments.empty());
    CHECK(a.stats().reserved_bytes.all.current == 0);
    return;
  }
  free_all(a, keep, blocks);
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

namespace {
using depot::test::memfd_pages;
using depot::test::open_descriptors;
using depot::test::same_file;

// Lowers this process's RLIMIT_NOFILE soft limit so that exactly `room` more descriptors
// can be opened (new ones take the free numbers below the limit), restored on destruction
// (a test of what runs short must not leave the limit low).
struct descriptor_limit {
  rlimit saved{};
  explicit descriptor_limit(std::size_t room)
  {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    rlimit low = saved;
    int fd = 0;
    for (std::size_t free = 0; free < room; ++fd) free += ::fcntl(fd, F_GETFD) == -1 ? 1 : 0;
    low.rlim_cur = static_cast<rlim_t>(fd);
    REQUIRE(low.rlim_cur <= saved.rlim_cur);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  }
  descriptor_limit(const descriptor_limit&) = delete;
  descriptor_limit& operator=(const descriptor_limit&) = delete;
  ~descriptor_limit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};
}  // namespace

TEST_CASE_TEMPLATE("pool: blocks of expandable segments shared with another process (IPC)", D, DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg;
  cfg.expandable_segments = true;
  depot::caching_allocator<D> a{0, cfg};
  const std::size_t page = a.expandable_page();
  if (page == 0) {  // a GPU without virtual memory management: ordinary segments (tested above)
    MESSAGE("device 0 cannot map memory: no expandable segments to share");
    return;
  }
  // Blocks after a neighbour of their size, so they start inside a page and span parts of
  // several: 6 MiB + 5 and 12 MiB + 5 (4 and 7 pages of 2 MiB), and 3 MiB.
  std::vector<void*> keep;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t n : {6 * MiB + 5, 12 * MiB + 5, 3 * MiB}) {
    keep.push_back(a.allocate(n));
    blocks.emplace_back(a.allocate(n), n);
    depot::runtime<D>::set_async(blocks.back().first, 0, n, nullptr);
  }
  depot::runtime<D>::synchronize(0);
  const std::size_t descriptors = open_descriptors();  // the backend's own opened by now
  for (const auto& seg : a.snapshot().segments) REQUIRE(seg.reserved != 0);  // all in one expandable range

  if constexpr (!depot::runtime<D>::has_ipc) {
    for (auto [p, n] : blocks) {
      CHECK_THROWS_WITH_AS(std::ignore = a.ipc_export(p), doctest::Contains("cannot share memory with another process"),
                           depot::error);
    }
    for (const auto& seg : a.snapshot().segments) CHECK_FALSE(seg.exported);
    depot::ipc_handle h;
    h.device = depot::device_id::of<D>(0);
    h.process = 1;
    h.segment = 1 << 21;
    h.size = h.requested = 1024;
    h.page = 2 * MiB;
    h.fds = {3};
    CHECK_THROWS_WITH_AS(depot::ipc_mapping<D>{h}, doctest::Contains("cannot share memory"), depot::error);
  } else {
    int value = 31;
    for (auto [p, n] : blocks) {
      CAPTURE(n);
      depot::runtime<D>::set_async(p, value, n, nullptr);
      depot::runtime<D>::synchronize(0);
      const depot::ipc_handle h = a.ipc_export(p);
      const auto at = reinterpret_cast<std::uintptr_t>(p);
      CHECK(h.expandable());
      CHECK(h.page == page);
      CHECK(h.segment % page == 0);
      CHECK(h.segment + h.offset == at);
      CHECK(h.offset < page);
      CHECK(h.fds.size() == (h.offset + h.size + page - 1) / page);
      CHECK(h.requested == n);
      CHECK(depot::ipc_handle::from_hex(h.to_hex()) == h);
      CHECK(a.ipc_export(p) == h);  // one descriptor per page, made once
      check_shared_with_child<D>(p, n, h, value);
      value += 10;
    }
    // A block whose pages would take more descriptors than the process may open: refused
    // before any is made, saying what to raise; exported once the limit allows.
    {
      void* wide = a.allocate(16 * page);  // 16 or 17 pages, none exported yet
      const std::size_t open_before = open_descriptors();
      {
        const descriptor_limit low{8};
        CHECK_THROWS_WITH_AS(std::ignore = a.ipc_export(wide), doctest::Contains("RLIMIT_NOFILE"), depot::error);
        CHECK(open_descriptors() == open_before);
      }
      const depot::ipc_handle hw = a.ipc_export(wide);
      CHECK(hw.fds.size() >= 16);
      a.deallocate(wide);  // its pages' descriptors closed with it
      CHECK(open_descriptors() == open_before);
    }
    bool exported = false;
    for (const auto& seg : a.snapshot().segments) exported = exported || seg.exported;
    CHECK(exported);
    CHECK(open_descriptors() > descriptors);
    check_invariants(a);
    // Freeing an exported block closes its pages' descriptors at once (no other exported
    // block is on them), so its handle opens nothing, before any empty_cache.
    const depot::ipc_handle gone = a.ipc_export(blocks[1].first);
    const std::size_t before_free = open_descriptors();
    a.deallocate(blocks[1].first);
    blocks.erase(blocks.begin() + 1);
    CHECK(open_descriptors() + gone.fds.size() == before_free);
    CHECK(run_ipc_child(gone.to_hex(), 41, 0) == 1);
    // Not pinned: once the blocks are freed, empty_cache unmaps their pages; every
    // descriptor is closed; a handle of them then opens nothing.
    const std::string stale = a.ipc_export(blocks[1].first).to_hex();
    free_all(a, keep, blocks);
    CHECK(a.stats().reserved_bytes.all.current == 0);
    CHECK(a.snapshot().segments.empty());
    CHECK(open_descriptors() == descriptors);
    CHECK(run_ipc_child(stale, 41, 0) == 1);
    return;
  }
  free_all(a, keep, blocks);
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

namespace {
// A stand-in backend for the importer's side of sharing expandable blocks, on any machine:
// "pages" are memfd files of another process, mapped contiguously with mmap.
struct fake_pages {
  static inline int opens = 0;
  static inline int closes = 0;
  static inline bool refuse = false;
  static void* open_pages(const int* fds, std::size_t count, std::size_t page, int)
  {
    if (refuse) throw depot::error("test: pages refused", "open_pages", __FILE__, __LINE__, 1, "test");
    void* base = ::mmap(nullptr, count * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base != MAP_FAILED);
    for (std::size_t i = 0; i < count; ++i) {
      REQUIRE(::mmap(static_cast<char*>(base) + i * page, page, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) !=
              MAP_FAILED);
    }
    ++opens;
    return base;
  }
  static void close_pages(void* p, std::size_t count, std::size_t page, int) noexcept
  {
    ::munmap(p, count * page);
    ++closes;
  }
  static void* open(const depot::ipc_memory_handle&, int) { throw std::logic_error("not an ordinary handle"); }
  static void close(void*, int) noexcept {}
  static constexpr depot::detail::ipc_backend backend{&open, &close, &open_pages, &close_pages};
};
}  // namespace

// Readers of the statistics on threads that each work on a stream of their own: stats()
// takes every cache's lock, in one order, while each reader's own cache is biased to it.
// lock_many() entered a cache biased to its caller without its shared word, so a second
// reader took that word and waited for the first to leave it, while the first waited for a
// word of the second's: both stopped for good within a few thousand operations.
TEST_CASE_TEMPLATE("pool: readers of the statistics, each on a stream of its own", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  constexpr int k_threads = 4;
  constexpr int k_ops = 20000;
  std::vector<depot::stream<D>> streams(k_threads);
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&, t] {
      const auto s = depot::stream_ref<D>{streams[static_cast<std::size_t>(t)].native()};
      void* held[8] = {};
      for (int i = 0; i < k_ops; ++i) {
        void*& p = held[i % 8];
        if (p != nullptr) a.deallocate(p, s);
        p = a.allocate(std::size_t{512} << (i % 12), s);
        if (i % 16 == t) (void)a.stats();
      }
      for (void* p : held) a.deallocate(p, s);
      finished.fetch_add(1);
    });
  }
  depot::test::wait_or_abort(finished, k_threads, "pool: readers of the statistics");
  for (auto& t : threads) t.join();
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == std::int64_t{k_threads} * k_ops);
}

// Forks `forks` times, 1-3 ms apart, while `workers` run; each child runs `child` (one
// thread: the forking one) and exits with its result (2 if it threw). A child still
// running after 20 s is killed and counted as hung (waiting on a lock held by a thread it
// lacks); the forks stop there. Then stops and joins the workers and checks the outcome.
template <class Child>
void check_forks(int forks, const Child& child, std::atomic<bool>& stop, std::vector<std::thread>& workers)
{
  int hung = 0;
  int failed = 0;
  // A fork() that never returns (its handlers waiting for a lock) stops the run with a
  // message, not a silent hang.
  std::atomic<int> forked{0};
  std::thread watchdog{[&] { depot::test::wait_or_abort(forked, 1, "check_forks: fork() in the parent"); }};
  for (int f = 0; f < forks && hung == 0; ++f) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + f % 3));
    const pid_t pid = ::fork();
    if (pid < 0) {  // (not REQUIRE: the watchdog and the workers must be joined first)
      FAIL_CHECK("fork() failed: " << std::strerror(errno));
      break;
    }
    if (pid == 0) {
      int code = 2;
      try {
        code = child();
      } catch (...) {
      }
      ::_exit(code);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pid_t done = 0;
    while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (done == 0) {  // still running: hung on a lock
      ::kill(pid, SIGKILL);
      (void)::waitpid(pid, &status, 0);
      ++hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      INFO("fork ", f, ": child status ", status);
      ++failed;
    }
  }
  forked = 1;
  watchdog.join();
  stop = true;
  for (auto& t : workers) t.join();
  CHECK(hung == 0);
  CHECK(failed == 0);
}

// fork() while other threads are inside the allocator: its atfork handlers hold every
// lock through the fork, so the child (one thread) finds no operation half done and no lock
// held by a thread it lacks. Without them a child that used a cache biased to a worker
// inside it waited for ever. Host only: a CUDA or HIP child cannot use its parent's device.
namespace {

// This process's resident memory (VmRSS), in bytes.
std::size_t resident_bytes()
{
  std::ifstream f{"/proc/self/status"};
  std::string key;
  std::size_t kib = 0;
  while (f >> key) {
    if (key == "VmRSS:") {
      f >> kib;
      break;
    }
  }
  return kib * 1024;
}

}  // namespace

// The host backend's segments are whole pages of their own (mmap), as a device's memory is:
// empty_cache() gives them back to the system, not to the heap. From glibc's heap, the
// second round of this test kept ~0.8 GB resident after empty_cache() with reserved at 0
// (glibc's mmap threshold rises to the size of a freed mapping, so later segments came from
// the heap, pinned there by the allocator's own small allocations between them).
TEST_CASE("pool: empty_cache gives the host backend's segments back to the system")
{
  using rt = depot::runtime<depot::host>;
  CHECK(rt::map_segment(0, 0) == nullptr);
  rt::unmap_segment(nullptr, 0);  // a no-op
  for (const std::size_t bad : {std::numeric_limits<std::size_t>::max(), std::size_t{1} << 60}) {
    CAPTURE(bad);
    try {
      (void)rt::map_segment(bad, 0);
      FAIL("a segment of ", bad, " bytes was mapped");
    } catch (const depot::out_of_memory& e) {
      CHECK(e.requested_bytes() == bad);
      const std::string what = e.what();
      CHECK((what.find("exceeds the address space") != std::string::npos || what.find("could not be mapped") != std::string::npos));
    }
  }
  CHECK_THROWS_AS((void)rt::map_segment(4096, 1), depot::invalid_argument);  // the host has device 0 only
  // 2 MiB alignment from 2 MiB on (CUDA's for large allocations: the small pool's frame
  // lookup and transparent huge pages rely on it), page alignment below; every byte asked
  // for is there.
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (const std::size_t bytes : {std::size_t{2}, page, (std::size_t{2} << 20) - 1, std::size_t{2} << 20,
                                  (std::size_t{3} << 20) + 1, std::size_t{64} << 20}) {
    CAPTURE(bytes);
    const std::size_t align = bytes >= rt::segment_alignment ? rt::segment_alignment : page;
    std::vector<void*> held;
    for (int i = 0; i < 4; ++i) {  // (several: one could be aligned by chance)
      auto* p = static_cast<unsigned char*>(rt::map_segment(bytes, 0));
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
      p[0] = 1;
      p[bytes - 1] = 2;
      CHECK(p[0] + p[bytes - 1] == 3);
      held.push_back(p);
    }
    for (void* p : held) rt::unmap_segment(p, bytes);
  }
  for (const bool pinned : {false, true}) {
    CAPTURE(pinned);
    depot::caching_allocator<depot::host> a{std::make_unique<depot::device_upstream<depot::host>>(0, pinned),
                                            quiet_config<depot::host>()};
    std::mt19937_64 rng{depot::test::seed("pool host segments back to the system", 11)};
    const std::size_t before = resident_bytes();
    for (int round = 0; round < 3; ++round) {
      CAPTURE(round);
      std::vector<std::pair<void*, std::size_t>> blocks;
      std::size_t total = 0;
      for (int i = 0; i < 300; ++i) {  // both pools: 2 MiB small segments, 20 MiB and larger ones
        const std::size_t n = 1 + rng() % (i % 3 == 0 ? 1 * MiB : 8 * MiB);
        void* p = a.allocate(n);
        std::memset(p, round + 1, n);  // resident, as a user's data is
        blocks.emplace_back(p, n);
        total += n;
      }
      const std::size_t live = resident_bytes();
      CHECK(live >= before + total / 2);  // (the measure sees what the blocks hold)
      for (auto [p, n] : blocks) a.deallocate(p, n, {});
      a.empty_cache();
      CHECK(a.stats().reserved_bytes.all.current == 0);
      const std::size_t after = resident_bytes();
      INFO("resident before: ", before, ", with ", total, " bytes live: ", live, ", after empty_cache: ", after);
      CHECK(after <= before + 64 * MiB);
    }
  }
}

TEST_CASE("pool: a child of fork() uses the allocators its parent's threads were inside")
{
  depot::caching_allocator<depot::host> a{0, quiet_config<depot::host>()};
  depot::caching_allocator<depot::host>& shared = depot::pool<depot::host>();
  constexpr int k_workers = 3;
  // The workers' statistics and empty_cache() calls use the heap (their lists of locks,
  // segments given back and made again). GCC 12's AddressSanitizer holds no lock of its
  // heap across a fork, so under it a child could wait on the sanitizer's own lock, which
  // is not depot's to hold: there the workers keep to allocations and frees, which after
  // their first rounds touch no heap.
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool k_heap_calls = false;
#else
  constexpr bool k_heap_calls = true;
#endif
  std::vector<depot::stream<depot::host>> streams(k_workers);
  std::atomic<bool> stop{false};
  std::atomic<long> rounds{0};
  const std::uint64_t seed = depot::test::seed("pool fork", 23);
  std::vector<std::thread> workers;
  for (int w = 0; w < k_workers; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng{seed + static_cast<std::uint64_t>(w)};
      const auto s = depot::stream_ref<depot::host>{streams[static_cast<std::size_t>(w)].native()};
      std::vector<void*> live;
      for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const std::size_t n = std::size_t{1} << (rng() % 22);  // 1 B - 2 MiB: every pool
        live.push_back(w == 2 ? shared.allocate(n, s) : a.allocate(n, s));
        if (live.size() > 16 || rng() % 2 == 0) {
          const std::size_t k = rng() % live.size();
          (w == 2 ? shared : a).deallocate(live[k], s);
          live[k] = live.back();
          live.pop_back();
        }
        if constexpr (k_heap_calls) {
          if (i % 512 == 0) (void)a.stats();      // every cache's lock at once
          if (i % 4096 == 0 && w == 1) a.empty_cache();  // segments back, caches changed
        }
        rounds.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* p : live) (w == 2 ? shared : a).deallocate(p, s);
    });
  }
  while (rounds.load() < 10000) std::this_thread::yield();
  // The child: one thread, on every worker's stream and a new one; its exit code says what
  // failed (a hang is the parent's deadline).
  const auto child = [&]() -> int {
    depot::stream<depot::host> fresh;
    for (int w = 0; w <= k_workers; ++w) {
      const auto s = depot::stream_ref<depot::host>{w < k_workers ? streams[static_cast<std::size_t>(w)].native()
                                                                  : fresh.native()};
      for (std::size_t n : {std::size_t{100}, std::size_t{64} << 10, std::size_t{3} << 20}) {
        void* p = a.allocate(n, s);
        void* q = shared.allocate(n, s);
        if (p == nullptr || q == nullptr) return 3;
        std::memset(p, 0x5A, n);
        std::memset(q, 0xA5, n);
        a.deallocate(p, s);
        shared.deallocate(q, s);
      }
    }
    const depot::memory_stats st = a.stats();
    std::int64_t sum = 0;
    for (const auto& seg : a.snapshot().segments) sum += static_cast<std::int64_t>(seg.size);
    if (sum != st.reserved_bytes.all.current) return 4;  // snapshot and figures agree
    a.empty_cache();
    (void)shared.stats();
    return 0;
  };
  check_forks(24, child, stop, workers);
  // The parent goes on: its locks were given back.
  void* p = a.allocate(1 << 20, depot::stream_ref<depot::host>{streams[0].native()});
  a.deallocate(p, depot::stream_ref<depot::host>{streams[0].native()});
  CHECK(a.stats().allocated_bytes.all.current == 0);
}

// fork() while other threads are inside a fixed_pool, a simulated_upstream, a
// device_upstream's events or the C interface's handle table: their locks (fork_leaf_mutex)
// are held across it, so the child finds them free and the pool whole. (With a std::mutex,
// the handle table's child hung in 1 to 3 of 24 forks on the dev VM.)
// Without that, a child forked while a worker held one (here most of the time: get_stats()
// walks 2^16 blocks under the lock) waited for ever. The walker takes the lock back the
// moment it gives it back: without the leaves' gate for a pending fork, the parent's fork()
// waited up to 1.4 s for it on the 2-core dev VM and for good on a 16-core host. Host only,
// as the allocators' test.
TEST_CASE("pool: a child of fork() uses the fixed_pool and upstreams its parent's threads were inside")
{
  constexpr std::size_t k_blocks = std::size_t{1} << 16;
  depot::fixed_pool<depot::host> fp{k_blocks * 512, 512};
  depot::simulated_upstream sim{std::size_t{1} << 40};
  depot::device_upstream<depot::host> up{0};  // its spare events' lock
  depot::stream<depot::host> event_stream;
  depot::detail::handle_table<int> handles{"handle", "a live handle", "add"};
  // simulated_upstream's map allocates under its lock, and the handle worker beside it:
  // under AddressSanitizer (no lock of its heap held across a fork: see the allocators'
  // test) those workers stay out.
#if defined(__SANITIZE_ADDRESS__)
  constexpr int k_workers = 3;
#else
  constexpr int k_workers = 5;
#endif
  std::atomic<bool> stop{false};
  std::atomic<long> rounds{0};
  const std::uint64_t seed = depot::test::seed("fixed_pool fork", 29);
  std::vector<std::thread> workers;
  for (int w = 0; w < k_workers; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng{seed + static_cast<std::uint64_t>(w)};
      std::vector<void*> live;
      live.reserve(64);
      while (!stop.load(std::memory_order_relaxed)) {
        if (w == 4) {
          const auto h = handles.add(std::make_unique<int>(w));
          handles.remove("remove", reinterpret_cast<const void*>(h));
        } else if (w == 3) {
          void* p = sim.allocate(std::size_t{1} << (rng() % 24));
          sim.deallocate(p, 0);
        } else if (w == 2) {  // (after the first, the events come from the spares: no heap)
          up.destroy_event(up.record_event(event_stream.native()));
        } else if (w == 1) {
          (void)fp.get_stats();  // the lock held for the walk of every block
          fp.defragment();
        } else {
          live.push_back(fp.allocate());
          if (live.size() == 64 || rng() % 2 == 0) {
            const std::size_t k = rng() % live.size();
            fp.deallocate(live[k]);
            live[k] = live.back();
            live.pop_back();
          }
        }
        rounds.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* p : live) fp.deallocate(p);
    });
  }
  while (rounds.load() < 2000) std::this_thread::yield();
  // The child: every free block taken and given back, the statistics agree; its exit code
  // says what failed.
  const auto child = [&]() -> int {
    const depot::fixed_pool_stats before = fp.get_stats();
    if (before.used_blocks + before.free_blocks != k_blocks) return 3;
    std::size_t taken = 0;
    void* first = nullptr;
    for (; taken < before.free_blocks; ++taken) {
      void* p = fp.allocate();
      std::memset(p, 0x5A, 512);
      if (taken == 0) first = p;
    }
    if (fp.get_stats().free_blocks != 0) return 4;
    fp.deallocate(first);
    if (fp.get_stats().free_blocks != 1) return 5;
    const std::size_t used = sim.current_usage().used;
    void* q = sim.allocate(4096);
    if (sim.current_usage().used != used + (std::size_t{2} << 20)) return 6;
    sim.deallocate(q, 4096);
    const depot::native_event e = up.record_event(event_stream.native());
    if (e == nullptr || !up.event_done(e)) return 7;
    up.destroy_event(e);
    const auto h = handles.add(std::make_unique<int>(41));
    if (*handles.find("find", reinterpret_cast<const void*>(h)) != 41) return 8;
    handles.remove("remove", reinterpret_cast<const void*>(h));
    return 0;
  };
  check_forks(24, child, stop, workers);
  // The parent goes on: the locks were given back.
  CHECK(fp.get_stats().used_blocks == 0);
  CHECK(sim.current_usage().used == 0);
}

// The importer's side of a block of an expandable segment, without a GPU: the page
// descriptors are taken from another process (pidfd_getfd), handed to the backend, closed
// after; mappings counted; what the exporter no longer has, or an exporter that has exited,
// is a clear error that leaves nothing open.
TEST_CASE("pool: an expandable block's pages taken from another process (importer side)")
{
  constexpr std::size_t page = 64 * KiB;
  int to_parent[2];
  int to_child[2];
  REQUIRE(::pipe(to_parent) == 0);
  REQUIRE(::pipe(to_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the exporter: three pages of bytes 1, 2, 3, held until told to go
    // (system calls only: another thread may have held the heap's lock at the fork)
    static unsigned char bytes[page];
    int fds[3];
    for (int i = 0; i < 3; ++i) {
      fds[i] = static_cast<int>(::syscall(SYS_memfd_create, "depot-test-page", 0));
      if (fds[i] < 0 || ::ftruncate(fds[i], page) != 0) ::_exit(2);
      std::memset(bytes, i + 1, page);
      if (::pwrite(fds[i], bytes, page, 0) != static_cast<ssize_t>(page)) ::_exit(3);
    }
    if (::write(to_parent[1], fds, sizeof fds) != static_cast<ssize_t>(sizeof fds)) ::_exit(4);
    char c;
    (void)::read(to_child[0], &c, 1);
    ::_exit(0);
  }
  int remote[3];
  REQUIRE(::read(to_parent[0], remote, sizeof remote) == static_cast<ssize_t>(sizeof remote));
  depot::ipc_handle h;
  h.device = depot::device_id{depot::device_kind::cuda, 0};
  h.process = static_cast<std::uint64_t>(child);
  h.segment = std::uint64_t{1} << 30;
  h.page = page;
  h.offset = 100;
  h.size = h.requested = 3 * page - 200;
  h.fds = {remote[0], remote[1], remote[2]};
  REQUIRE(depot::ipc_handle::from_hex(h.to_hex()) == h);
  const auto& fake = fake_pages::backend;
  const std::size_t descriptors = open_descriptors();
  fake_pages::opens = fake_pages::closes = 0;
  // Where this machine forbids taking another process's descriptors (a seccomp filter, Yama
  // ptrace_scope 3), the refusal must say why, and leave nothing open.
  bool permitted = true;
  try {
    (void)depot::detail::ipc_attach(h, fake);
  } catch (const depot::error& e) {
    REQUIRE((e.code() == EPERM || e.code() == EACCES));
    CHECK(contains(e.what(), "must be allowed to ptrace the exporter"));
    CHECK(open_descriptors() == descriptors);
    MESSAGE("pidfd_getfd is not permitted on this machine: only its refusal is checked (" << std::string{e.what()} << ")");
    permitted = false;
  }
  if (permitted) depot::detail::ipc_detach(h, fake);
  if (permitted) {
    // Too few descriptors left for the block's pages (3, and a pidfd): refused before any
    // is taken, saying how many it needs and how to raise the limit.
    {
      const descriptor_limit low{3};
      CHECK_THROWS_WITH_AS((void)depot::detail::ipc_attach(h, fake),
                           doctest::Contains("needs 4 more file descriptors (one per page)"), depot::error);
      CHECK_THROWS_WITH_AS((void)depot::detail::ipc_attach(h, fake), doctest::Contains("RLIMIT_NOFILE"), depot::error);
      CHECK(open_descriptors() == descriptors);
    }
    fake_pages::opens = fake_pages::closes = 0;
    void* a = depot::detail::ipc_attach(h, fake);
    void* b = depot::detail::ipc_attach(h, fake);  // one mapping, counted
    CHECK(a == b);
    CHECK(fake_pages::opens == 1);
    CHECK(open_descriptors() == descriptors);  // the taken descriptors closed after mapping
    const auto* bytes = static_cast<const unsigned char*>(a);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(bytes[i * page] == i + 1);
      CHECK(bytes[i * page + page - 1] == i + 1);
    }
    depot::detail::ipc_detach(h, fake);
    CHECK(fake_pages::closes == 0);
    depot::detail::ipc_detach(h, fake);
    CHECK(fake_pages::closes == 1);
  }
  if (!permitted) {
    REQUIRE(::write(to_child[1], "x", 1) == 1);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
    return;
  }
  // A descriptor the exporter does not hold: refused, naming it, nothing left open.
  depot::ipc_handle gone = h;
  gone.fds[1] = 1000;
  try {
    (void)depot::detail::ipc_attach(gone, fake);
    FAIL("a descriptor the exporter does not hold was taken");
  } catch (const depot::error& e) {
    CAPTURE(e.what());
    CHECK(contains(e.what(), "could not take its file descriptor 1000"));
    CHECK(contains(e.what(), "the exporter no longer holds it"));
    CHECK(contains(e.what(), "process " + std::to_string(child)));
  }
  CHECK(open_descriptors() == descriptors);
  // The backend refusing: the taken descriptors are closed, and the next attach tries again.
  fake_pages::refuse = true;
  CHECK_THROWS_WITH_AS((void)depot::detail::ipc_attach(h, fake), doctest::Contains("pages refused"), depot::error);
  fake_pages::refuse = false;
  CHECK(open_descriptors() == descriptors);
  void* again = depot::detail::ipc_attach(h, fake);
  CHECK(fake_pages::opens == 2);
  CHECK(static_cast<const unsigned char*>(again)[2 * page] == 3);
  depot::detail::ipc_detach(h, fake);
  // The exporter gone: refused as such.
  REQUIRE(::write(to_child[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_THROWS_WITH_AS((void)depot::detail::ipc_attach(h, fake), doctest::Contains("the exporting process has exited"),
                       depot::error);
  CHECK(open_descriptors() == descriptors);
  CHECK(fake_pages::closes == 2);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

// An ordinary exported segment is released only while no other process maps it: importers
// count themselves in the exporter's importer-count file (depot-ipc-child --count runs the
// real importer code with a stand-in backend, so this runs on every backend).
TEST_CASE_TEMPLATE("pool: an exported segment is kept while another process maps it", D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto owned = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
  owned->stand_in_exports = true;
  int counts_fd = -1;
  {
    depot::caching_allocator<D> a{std::move(owned), quiet_config<D>()};
    const auto segment_of = [&](std::uint64_t addr) {
      for (const auto& seg : a.snapshot().segments) {
        if (seg.address == addr) return seg;
      }
      FAIL("no segment at " << addr);
      return depot::segment_info{};
    };
    // Handle texts name a GPU: the host's handles travel as cuda:0's (the child's backend is
    // a stand-in, so the kind only has to parse).
    const auto sent = [](depot::ipc_handle h) {
      if (h.device.kind == depot::device_kind::host) h.device.kind = depot::device_kind::cuda;
      return h.to_hex();
    };
    void* p1 = a.allocate(6 * MiB);  // p1 and p2 share a 20 MiB segment
    void* p2 = a.allocate(6 * MiB);
    void* p3 = a.allocate(3000);  // a small segment
    const depot::ipc_handle h1 = a.ipc_export(p1);
    const depot::ipc_handle h2 = a.ipc_export(p2);
    const depot::ipc_handle h3 = a.ipc_export(p3);
    CHECK(h1.segment == h2.segment);
    CHECK(h1.counter_slot == h2.counter_slot);  // a slot per segment
    CHECK(h3.counter_slot != h1.counter_slot);
    CHECK(h1.counter_fd == h3.counter_fd);  // one file per allocator
    CHECK(a.ipc_export(p1) == h1);
    CHECK(depot::ipc_handle::from_hex(sent(h1)).counter_slot == h1.counter_slot);
    counts_fd = h1.counter_fd;
    std::string target(256, '\0');
    const ssize_t tn = ::readlink(("/proc/self/fd/" + std::to_string(counts_fd)).c_str(), target.data(), target.size());
    REQUIRE(tn > 0);
    CHECK(contains(target.substr(0, static_cast<std::size_t>(tn)), "depot-ipc-importers"));
    CHECK((::fcntl(counts_fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK(segment_of(h1.segment).exported);
    CHECK(segment_of(h1.segment).importers == 0);

    // Another process maps h1 twice (counted once) and holds it; p2's handle names the same.
    counting_child holder{sent(h1), "hold"};
    REQUIRE(holder.line() == "attached");
    CHECK(segment_of(h1.segment).importers == 1);
    CHECK(segment_of(h3.segment).importers == 0);
    CHECK(nlohmann::json::parse(a.snapshot().to_json())["segments"][0].contains("importers"));
    const auto round = depot::parse_snapshot(a.snapshot().to_json());
    for (const auto& seg : round.segments) CHECK(seg.importers == (seg.address == h1.segment ? 1 : 0));
    {
      counting_child second{sent(h2), "hold"};  // another process: counted too
      REQUIRE(second.line() == "attached");
      CHECK(segment_of(h1.segment).importers == 2);
      CHECK(second.finish() == 0);
    }
    CHECK(segment_of(h1.segment).importers == 1);
    // All freed and the cache emptied: the mapped segment stays, the other exported one goes.
    a.deallocate(p1);
    a.deallocate(p2);
    a.deallocate(p3);
    a.empty_cache();
    check_invariants(a);
    auto snap = a.snapshot();
    REQUIRE(snap.segments.size() == 1);
    CHECK(snap.segments[0].address == h1.segment);
    CHECK(snap.segments[0].exported);
    CHECK(snap.segments[0].importers == 1);
    CHECK(a.stats().allocated_bytes.all.current == 0);
    // The importer closes its mappings: the next empty_cache releases the segment.
    std::string said;
    CHECK(holder.finish(&said) == 0);
    CHECK(contains(said, "detached"));
    CHECK(segment_of(h1.segment).importers == 0);
    a.empty_cache();
    CHECK(a.snapshot().segments.empty());
    CHECK(counters->outstanding.load() == 0);

    // A backend refusing to open: the importer's count is given back.
    void* p4 = a.allocate(6 * MiB);
    const depot::ipc_handle h4 = a.ipc_export(p4);
    CHECK(h4.counter_slot > h3.counter_slot);  // slots are never reused
    {
      counting_child refused{sent(h4), "refuse"};
      CHECK(refused.line() == "refused");
      CHECK(refused.finish() == 0);
    }
    CHECK(segment_of(h4.segment).importers == 0);
    // Bad handles, refused by the importer naming the file and the cause.
    const auto refused_with = [&](const depot::ipc_handle& bad, const std::string& says) {
      counting_child c{sent(bad), "hold"};
      std::string out;
      CHECK(c.finish(&out) == 1);
      CAPTURE(out);
      CHECK(contains(out, says));
    };
    depot::ipc_handle bad = h4;
    bad.counter_fd = 1000;
    refused_with(bad, "could not open /proc/" + std::to_string(::getpid()) + "/fd/1000");
    bad = h4;
    bad.counter_slot = 1U << 30;
    refused_with(bad, "slot 1073741824 lies past the end of");
    pid_t gone = 0;
    {
      char* args[] = {const_cast<char*>("/bin/true"), nullptr};
      REQUIRE(::posix_spawn(&gone, "/bin/true", nullptr, nullptr, args, environ) == 0);
      int status = 0;
      REQUIRE(::waitpid(gone, &status, 0) == gone);
    }
    bad = h4;
    bad.process = static_cast<std::uint64_t>(gone);
    refused_with(bad, "the exporting process has exited");
    CHECK(segment_of(h4.segment).importers == 0);
    // An importer killed while it maps the segment never counts itself out, but its lock on
    // the slot dies with it: the segment is released all the same (and shows no importer).
    {
      counting_child killed{sent(h4), "hold"};
      REQUIRE(killed.line() == "attached");
      CHECK(segment_of(h4.segment).importers == 1);
      a.deallocate(p4);
      a.empty_cache();
      CHECK(a.snapshot().segments.size() == 1);  // kept while it lives
      REQUIRE(::kill(killed.pid, SIGKILL) == 0);
      CHECK(exit_status(killed.pid) == -1);  // killed by the signal
      killed.pid = -1;
    }
    CHECK(segment_of(h4.segment).importers == 0);
    a.empty_cache();
    CHECK(a.snapshot().segments.empty());
  }
  CHECK(::fcntl(counts_fd, F_GETFD) == -1);  // the file closed with the allocator
}

// The handle of an expandable block over `pages` (memfd_pages) that names process 1 (which no
// test may ptrace), and an ordinary segment's handle (sent without descriptors).
depot::ipc_handle pages_handle(const std::vector<int>& pages, std::size_t page, std::size_t offset)
{
  depot::ipc_handle h;
  h.device = depot::device_id{depot::device_kind::cuda, 0};
  h.process = 1;
  h.segment = std::uint64_t{1} << 30;
  h.page = page;
  h.offset = offset;
  h.size = h.requested = pages.size() * page - 2 * offset;
  h.fds.assign(pages.begin(), pages.end());
  return h;
}
depot::ipc_handle ordinary_handle()
{
  depot::ipc_handle o;
  o.device = depot::device_id{depot::device_kind::hip, 1};
  o.process = 77;
  o.segment = 1 << 21;
  o.size = o.requested = 512;
  o.memory.bytes[5] = 9;
  o.counter_fd = 4;
  return o;
}

// A handle sent with its page descriptors over a Unix socket (SCM_RIGHTS): the receiver
// maps the pages from its own descriptors, never taking the exporter's (the handle names
// process 1, which no test may ptrace: a taking attempt would fail).
TEST_CASE("pool: a handle and its page descriptors sent over a Unix socket")
{
  constexpr std::size_t page = 4 * KiB;
  constexpr std::size_t count = 300;  // more than one message's 253 descriptors
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const std::size_t descriptors = open_descriptors();
  const std::vector<int> pages = memfd_pages(count);
  std::vector<unsigned char> bytes(page);
  for (std::size_t i = 0; i < count; ++i) {
    std::fill(bytes.begin(), bytes.end(), static_cast<unsigned char>(i % 251 + 1));
    REQUIRE(::pwrite(pages[i], bytes.data(), page, 0) == static_cast<ssize_t>(page));
  }
  const depot::ipc_handle h = pages_handle(pages, page, 100);
  const auto& fake = fake_pages::backend;
  fake_pages::opens = fake_pages::closes = 0;
  // Without its descriptors, this handle cannot be opened here: process 1 refuses.
  CHECK_THROWS_AS((void)depot::detail::ipc_attach(h, fake), depot::error);
  depot::ipc_send(sv[0], h);
  {
    const depot::ipc_received r = depot::ipc_receive(sv[1]);
    CHECK(r.handle == h);
    REQUIRE(r.fds.size() == count);
    CHECK(open_descriptors() == descriptors + 2 * count);
    for (std::size_t i = 0; i < count; ++i) {
      CHECK(r.fds[i] != pages[i]);
      CHECK((::fcntl(r.fds[i], F_GETFD) & FD_CLOEXEC) != 0);
    }
    void* a = depot::detail::ipc_attach(r.handle, fake, r.fds.data());
    void* b = depot::detail::ipc_attach(h, fake);  // the same segment: counted, nothing taken
    CHECK(a == b);
    CHECK(fake_pages::opens == 1);
    const auto* got = static_cast<const unsigned char*>(a);
    for (std::size_t i = 0; i < count; ++i) {
      CHECK(got[i * page] == i % 251 + 1);
      CHECK(got[i * page + page - 1] == i % 251 + 1);
    }
    depot::detail::ipc_detach(h, fake);
    depot::detail::ipc_detach(h, fake);
    CHECK(fake_pages::closes == 1);
    CHECK(open_descriptors() == descriptors + 2 * count);  // the received ones stay with r
    // Passed on by the receiver: the same handle, descriptors of the same files.
    depot::ipc_send(sv[1], r);
    depot::ipc_received again = depot::ipc_receive(sv[0]);
    CHECK(again.handle == h);
    REQUIRE(again.fds.size() == count);
    CHECK(same_file(again.fds[count - 1], pages[count - 1]));
    depot::ipc_received moved = std::move(again);
    CHECK(again.fds.empty());
    CHECK(moved.fds.size() == count);
  }
  for (int fd : pages) ::close(fd);
  CHECK(open_descriptors() == descriptors);  // every received descriptor closed with its holder
  // An ordinary segment's handle travels without descriptors.
  const depot::ipc_handle o = ordinary_handle();
  depot::ipc_send(sv[0], o);
  {
    const depot::ipc_received r = depot::ipc_receive(sv[1]);
    CHECK(r.handle == o);
    CHECK(r.fds.empty());
  }
  // Bad input: nothing stays open, each refusal says what was wrong.
  const auto raw = [&](std::uint32_t length, const std::string& text) {
    REQUIRE(::write(sv[0], &length, 4) == 4);
    if (!text.empty()) REQUIRE(::write(sv[0], text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  };
  raw(8, "nothexxx");
  CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1]), doctest::Contains("not a hex digit"), depot::invalid_argument);
  raw(1U << 30, "");
  CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1]), doctest::Contains("characters announced"),
                       depot::invalid_argument);
  depot::ipc_received bad;
  bad.handle = h;  // 300 pages, no descriptors
  CHECK_THROWS_WITH_AS(depot::ipc_send(sv[0], bad), doctest::Contains("holds 0 descriptors"), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(depot::ipc_mapping<depot::host>{bad}, doctest::Contains("holds 0 descriptors, its block spans 300"),
                       depot::invalid_argument);
  // The other end gone part way: the handle's text without its descriptors, then closed.
  const std::string text = h.to_hex();
  raw(static_cast<std::uint32_t>(text.size()), text);
  ::close(sv[0]);
  CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1]), doctest::Contains("the other end closed"), depot::error);
  CHECK_THROWS_AS(depot::ipc_send(sv[1], o), depot::error);  // no one to send to (EPIPE)
  ::close(sv[1]);
  CHECK(open_descriptors() + 2 == descriptors);
}

// The same over a SOCK_SEQPACKET socket, whose records are read whole or cut short: a
// handle's length and text go as one record and must be taken as one (a read of the length
// alone dropped the text), a block of more than 253 pages sends its further descriptors as
// one-byte records, and a record that is no handle is taken whole and refused, the next
// handle then received.
TEST_CASE("pool: handles over a SOCK_SEQPACKET socket")
{
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  const std::size_t descriptors = open_descriptors();
  const std::vector<int> pages = memfd_pages(300);  // more than one message's 253 descriptors
  const std::size_t count = pages.size();
  const depot::ipc_handle h = pages_handle(pages, 4 * KiB, 100);
  const depot::ipc_handle o = ordinary_handle();
  depot::ipc_send(sv[0], h);
  depot::ipc_send(sv[0], o, std::chrono::milliseconds{2000});
  {
    const depot::ipc_received r = depot::ipc_receive(sv[1], std::chrono::milliseconds{2000});
    CHECK(r.handle == h);
    REQUIRE(r.fds.size() == count);
    CHECK(same_file(r.fds[count - 1], pages[count - 1]));
    const depot::ipc_received q = depot::ipc_receive(sv[1], std::chrono::milliseconds{2000});
    CHECK(q.handle == o);
    CHECK(q.fds.empty());
  }
  CHECK(open_descriptors() == descriptors + count);
  // (timeouts throughout: a receive that took the length alone waited for the text forever)
  // A record that is no handle, then a handle: the first refused, the second received.
  std::string bad(4, '\0');
  const std::uint32_t length = 8;
  std::memcpy(bad.data(), &length, 4);
  bad += "nothexxx";
  REQUIRE(::send(sv[0], bad.data(), bad.size(), 0) == static_cast<ssize_t>(bad.size()));
  depot::ipc_send(sv[0], o);
  CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1], std::chrono::milliseconds{2000}),
                       doctest::Contains("not a hex digit"), depot::invalid_argument);
  CHECK(depot::ipc_receive(sv[1], std::chrono::milliseconds{2000}).handle == o);
  for (int f : pages) ::close(f);
  ::close(sv[0]);
  ::close(sv[1]);
  CHECK(open_descriptors() + 2 == descriptors);
}

// Timeouts and non-blocking sockets: ipc_receive must not hang on a sender that never
// comes or stalls part way, and what came with a stalled handle is closed.
TEST_CASE("pool: ipc_send and ipc_receive with a timeout, and on non-blocking sockets")
{
  using namespace std::chrono_literals;
  constexpr std::size_t page = 4 * KiB;
  constexpr std::size_t count = 300;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const std::size_t before = open_descriptors();
  const std::vector<int> pages = memfd_pages(count);
  const std::size_t descriptors = open_descriptors();  // with the pages'
  const depot::ipc_handle h = pages_handle(pages, page, 0);
  const auto elapsed_ms = [](auto since) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count();
  };
  SUBCASE("nothing sent: refused after the timeout, saying so")
  {
    const auto t = std::chrono::steady_clock::now();
    try {
      (void)depot::ipc_receive(sv[1], 50ms);
      FAIL("no exception");
    } catch (const depot::error& e) {
      CHECK(e.code() == ETIMEDOUT);
      CHECK(std::string{e.what()}.find("got 0 of 4 bytes") != std::string::npos);
      CHECK(std::string{e.what()}.find("timeout of 50 ms") != std::string::npos);
      CHECK(std::string{e.what()}.find("mid-handle") == std::string::npos);  // the socket is still usable
    }
    CHECK(elapsed_ms(t) >= 50);
    CHECK(elapsed_ms(t) < 5000);
    // ... and a handle sent afterwards still arrives whole.
    depot::ipc_send(sv[0], h, 1s);
    const depot::ipc_received r = depot::ipc_receive(sv[1], 0ms);  // ready now: 0 takes it
    CHECK(r.handle == h);
    CHECK(r.fds.size() == count);
    CHECK(open_descriptors() == descriptors + count);
  }
  SUBCASE("a sender that stalls part way: what came is closed")
  {
    // The text and the first 253 descriptors, then nothing: the other 47 never come.
    const std::string text = h.to_hex();
    std::string data(4, '\0');
    const auto n = static_cast<std::uint32_t>(text.size());
    std::memcpy(data.data(), &n, 4);
    data += text;
    iovec io{data.data(), data.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)] = {};
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * 253);
    std::memcpy(CMSG_DATA(c), pages.data(), sizeof(int) * 253);
    REQUIRE(::sendmsg(sv[0], &m, 0) == static_cast<ssize_t>(data.size()));
    CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1], 30ms),
                         doctest::Contains("253 descriptors, nothing more within the timeout of 30 ms (the socket is "
                                           "mid-handle now: close it)"),
                         depot::error);
    CHECK(open_descriptors() == descriptors);  // the 253 received ones closed
  }
  SUBCASE("non-blocking sockets are waited on")
  {
    for (int fd : sv) REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
    std::string sent_error;
    std::thread sender{[&] {
      std::this_thread::sleep_for(20ms);
      try {
        depot::ipc_send(sv[0], h);
      } catch (const std::exception& e) {
        sent_error = e.what();
      }
    }};
    try {
      const depot::ipc_received r = depot::ipc_receive(sv[1]);  // EAGAIN at first: waits
      CHECK(r.handle == h);
      CHECK(r.fds.size() == count);
    } catch (const std::exception& e) {
      FAIL_CHECK("ipc_receive on a non-blocking socket: " << std::string{e.what()});
    }
    sender.join();
    CHECK(sent_error.empty());
    CHECK(open_descriptors() == descriptors);
    // A receiver that does not read: the sender's buffer fills, and a timed send gives up.
    const std::string junk(64 * KiB, 'x');
    while (::send(sv[0], junk.data(), junk.size(), MSG_DONTWAIT) > 0) {
    }
    REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK));
    try {
      depot::ipc_send(sv[0], h, 30ms);
      FAIL("no exception");
    } catch (const depot::error& e) {
      CHECK(e.code() == ETIMEDOUT);
      CHECK(std::string{e.what()}.find("the receiver is not reading") != std::string::npos);
    }
  }
  SUBCASE("bad timeouts")
  {
    CHECK_THROWS_WITH_AS((void)depot::ipc_receive(sv[1], -1ms), doctest::Contains("timeout of -1 ms; it must be 0 or more"),
                         depot::invalid_argument);
    CHECK_THROWS_AS(depot::ipc_send(sv[0], h, -5ms), depot::invalid_argument);
    // The largest timeout is no limit (no overflowing deadline): the handle is there.
    depot::ipc_send(sv[0], h, std::chrono::milliseconds::max());
    CHECK(depot::ipc_receive(sv[1], std::chrono::milliseconds::max()).handle == h);
  }
  for (int fd : pages) ::close(fd);
  ::close(sv[0]);
  ::close(sv[1]);
  CHECK(open_descriptors() + 2 == before);
}

namespace {

using depot::test::capture_pool_of;

// One subcase per kind of block (large pool, dense small segment, linked small segment):
// a request size of that kind.
std::size_t each_block_kind()
{
  std::size_t n = 8 * MiB;
  SUBCASE("large pool") {}
  SUBCASE("dense small segment") { n = 4 * KiB; }
  SUBCASE("linked small segment") { n = 256 * KiB; }
  return n;
}

// Blocks freed that wait for other streams' events (state pending_free), by a snapshot.
int pending_in(const depot::detail::allocator_core& a)
{
  int k = 0;
  for (const auto& seg : a.snapshot().segments) {
    for (const auto& b : seg.blocks) k += b.state == depot::block_state::pending_free ? 1 : 0;
  }
  return k;
}

}  // namespace

TEST_CASE_TEMPLATE("pool: a block used on another stream waits for it before reuse", D,
                   DEPOT_TEST_DEVICES)
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s1;
  depot::stream<D> s2;
  void* x = a.allocate(n, s1);
  // Long work on s2 that uses x.
  void* big = a.allocate(512 * MiB, s2);
  const int passes = depot::is_gpu_v<D> ? 50 : 1;  // ~10 ms of GPU work; the host is synchronous
  for (int i = 0; i < passes; ++i) {
    depot::ops::fill<D, float>(static_cast<float*>(big), 128 * MiB, 1.0F, s2);
  }
  depot::ops::fill<D, float>(static_cast<float*>(x), n / 4, 2.0F, s2);
  a.record_stream(x, s2);
  a.deallocate(x, s1);
  void* y = a.allocate(n, s1);
  if constexpr (depot::is_gpu_v<D>) {
    if (!s2.ready()) {
      CHECK(y != x);  // s2 may still write x: it must not be handed out yet
    }
    CHECK(a.stats().active_bytes.all.current >= static_cast<std::int64_t>(2 * n));
  } else {
    CHECK(y == x);  // the host finished the work at once: immediate reuse
  }
  s2.synchronize();
  a.deallocate(y, s1);
  // Once s2's event completed, x's block is free again and is reused on s1 (after y's,
  // when y is another block: kept for the next request of its size).
  void* z = a.allocate(n, s1);
  void* z2 = z == x ? nullptr : a.allocate(n, s1);
  CHECK((z == x || z2 == x));
  a.deallocate(z, s1);
  a.deallocate(z2, s1);
  a.deallocate(big, s2);
  check_invariants(a);
}

// The memory of the test upstreams below that model a device: anonymous pages of their own
// (mmap / munmap), as a device's memory is, not the process heap. A freed segment goes back
// to the system at once; from glibc's heap, meson's MALLOC_PERTURB_ wrote through every byte
// of every segment on allocation and free and the heap kept them resident for the rest of the
// process (the pool suite reached 17 GB, and 24 GB beside the other suites, on 2026-12-02).
static void* map_pages(std::size_t bytes)
{
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw depot::out_of_memory("test: mmap of " + std::to_string(bytes) + " bytes failed", bytes,
                               depot::device_id{depot::device_kind::host, 0});
  }
  return p;
}
static void unmap_pages(void* p, std::size_t bytes) noexcept
{
  if (p != nullptr) ::munmap(p, bytes);
}

// Host memory whose events complete only when the test says so: the paths a GPU backend
// takes for frees that wait on other streams (pending blocks, events processed at the next
// allocation, waits when memory runs out), exercised on the CPU in every build.
class manual_event_upstream final : public depot::upstream_resource {
 public:
  struct state {
    std::set<std::uintptr_t> open;  // events recorded and not yet complete
    std::uintptr_t next = 0;
    int recorded = 0;
    int waits = 0;
    int syncs = 0;
    int stream_waits = 0;  // stream_wait() calls, and the last one's stream and event
    std::uintptr_t waiting_stream = 0;
    std::uintptr_t waited_event = 0;
    bool fail_events = false;
    bool fail_allocations = false;  // allocate() throws depot::out_of_memory
    bool fail_waits = false;        // stream_wait() and synchronize_device() throw depot::error
    // A graph capture under way (set by the test): every query, wait, synchronisation or
    // upstream free is counted in `forbidden` (CUDA's global capture mode forbids them), and
    // every event recorded in `captured_records`.
    bool capture = false;
    int forbidden = 0;
    int captured_records = 0;
    int upstream_frees = 0;
    // Handles the test marked destroyed (and not made again): an event recorded on one is
    // counted in `dead_records`. The last record_event()'s stream.
    std::set<std::uintptr_t> dead;
    int dead_records = 0;
    std::uintptr_t last_record_stream = 0;
    depot::device_id streams{depot::device_kind::host, 0};  // stream_device()
    // Streams whose queued work the test says is all done (stream_done() answers true), and
    // the stream_done() calls.
    std::set<std::uintptr_t> idle;
    int stream_queries = 0;
    // Calls (record, wait, query) on the per-thread default stream's handle (0x2) by each
    // thread, and calls given a value that is no handle: the allocator's per-thread key
    // (bit 62) passed on.
    std::map<std::thread::id, int> per_thread_calls;
    int key_calls = 0;
    std::mutex mu;  // held by every call below (a test reads the fields between calls)
  };
  explicit manual_event_upstream(std::shared_ptr<state> s) : s_{std::move(s)} {}
  // (caller holds s_->mu)
  void saw(depot::native_stream stream)
  {
    const auto v = reinterpret_cast<std::uintptr_t>(stream);
    if (v == 2) ++s_->per_thread_calls[std::this_thread::get_id()];
    s_->key_calls += (v >> 62U) == 1 ? 1 : 0;
  }
  void* allocate(std::size_t bytes) override
  {
    {
      const std::lock_guard g{s_->mu};
      if (s_->fail_allocations) throw depot::out_of_memory("test: refused", bytes, inner_.device());
    }
    return map_pages(bytes);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override
  {
    {
      const std::lock_guard g{s_->mu};
      ++s_->upstream_frees;
      s_->forbidden += s_->capture ? 1 : 0;
    }
    unmap_pages(p, bytes);
  }
  depot::memory_info memory() override { return inner_.memory(); }
  depot::device_id device() const noexcept override { return inner_.device(); }
  depot::device_id stream_device() const noexcept override { return s_->streams; }
  depot::native_event record_event(depot::native_stream stream) override
  {
    const std::lock_guard g{s_->mu};
    if (s_->fail_events) throw depot::error("test: event refused", "record_event", __FILE__, __LINE__, 1, "test");
    ++s_->recorded;
    saw(stream);
    s_->last_record_stream = reinterpret_cast<std::uintptr_t>(stream);
    s_->dead_records += static_cast<int>(s_->dead.count(s_->last_record_stream));
    s_->captured_records += s_->capture ? 1 : 0;
    s_->open.insert(++s_->next);
    return reinterpret_cast<depot::native_event>(s_->next);
  }
  bool event_done(depot::native_event e) override
  {
    const std::lock_guard g{s_->mu};
    s_->forbidden += s_->capture ? 1 : 0;
    return s_->open.count(id(e)) == 0;
  }
  bool stream_done(depot::native_stream s) override
  {
    const std::lock_guard g{s_->mu};
    s_->forbidden += s_->capture ? 1 : 0;
    ++s_->stream_queries;
    saw(s);
    return s_->idle.count(reinterpret_cast<std::uintptr_t>(s)) != 0;
  }
  void wait_event(depot::native_event e) override
  {
    const std::lock_guard g{s_->mu};
    s_->forbidden += s_->capture ? 1 : 0;
    ++s_->waits;
    s_->open.erase(id(e));
  }
  void stream_wait(depot::native_stream s, depot::native_event e) override
  {
    const std::lock_guard g{s_->mu};
    if (s_->fail_waits) throw depot::error("test: wait refused", "stream_wait", __FILE__, __LINE__, 1, "test");
    ++s_->stream_waits;
    saw(s);
    s_->waiting_stream = reinterpret_cast<std::uintptr_t>(s);
    s_->waited_event = id(e);
  }
  void destroy_event(depot::native_event e) noexcept override
  {
    const std::lock_guard g{s_->mu};
    s_->open.erase(id(e));
  }
  void synchronize_device() override
  {
    const std::lock_guard g{s_->mu};
    if (s_->fail_waits) throw depot::error("test: synchronisation refused", "synchronize_device", __FILE__, __LINE__, 1, "test");
    s_->forbidden += s_->capture ? 1 : 0;
    ++s_->syncs;
    s_->open.clear();
  }

 private:
  static std::uintptr_t id(depot::native_event e) { return reinterpret_cast<std::uintptr_t>(e); }
  depot::device_upstream<depot::host> inner_{0};
  std::shared_ptr<state> s_;
};

namespace {

// An allocator_core over a manual_event_upstream of state `ev`, asynchronous (as a GPU
// backend's), configured by `cfg`.
depot::detail::allocator_core async_core(std::shared_ptr<manual_event_upstream::state> ev,
                                         const depot::allocator_config& cfg = quiet_config<depot::host>())
{
  return depot::detail::allocator_core{std::make_unique<manual_event_upstream>(std::move(ev)), cfg,
                                       /*asynchronous=*/true};
}

// A stream handle that names no stream, for tests whose upstream never looks behind it.
depot::native_stream fake_stream(std::uintptr_t k) { return reinterpret_cast<depot::native_stream>(k); }

// After a test's last free: every figure agrees with the snapshot, the directory and the
// dense segments' bitmaps agree with the blocks, nothing is allocated, and empty_cache()
// returns every segment (the figures and the snapshot agreeing after it too).
void check_ends_empty(depot::detail::allocator_core& a)
{
  const depot::memory_stats st = a.stats();
  check_invariants(st, a.snapshot());
  CHECK(a.check_directory() == "");
  CHECK(a.check_small_bits() == "");
  CHECK(st.allocated_bytes.all.current == 0);
  a.empty_cache();
  CHECK(a.check_directory() == "");
  CHECK(a.stats().num_segments.all.current == 0);
  CHECK(a.stats().reserved_bytes.all.current == 0);
  check_invariants(a.stats(), a.snapshot());
}

}  // namespace

TEST_CASE("pool: frees that wait for other streams' events (an asynchronous backend on the CPU)")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto s2 = fake_stream(0x2000);
  const auto n64 = static_cast<std::int64_t>(n);
  auto pending_blocks = [&] { return pending_in(a); };

  // record_stream: x was used on s2, so its free on s1 waits for an event on s2.
  void* x = a.allocate(n, s1);
  std::memset(x, 7, n);
  a.record_stream(x, s2);
  a.deallocate(x, s1, true, 0);
  CHECK(ev->recorded == 1);
  depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);     // freed by the caller ...
  CHECK(st.active_bytes.all.current == n64);      // ... but still in use on s2
  CHECK(st.num_allocations.all.freed == 1);
  CHECK(pending_blocks() == 1);
  check_invariants(st, a.snapshot());
  void* y = a.allocate(n, s1);
  CHECK(y != x);  // not handed out while s2's event is open
  CHECK(pending_blocks() == 1);
  check_invariants(a.stats(), a.snapshot());

  // The event completes: the next allocation on s1 returns x's block to the cache.
  ev->open.clear();
  void* z = a.allocate(n, s1);
  CHECK(pending_blocks() == 0);
  st = a.stats();
  CHECK(st.allocated_bytes.all.current == 2 * n64);
  CHECK(st.active_bytes.all.current == 2 * n64);
  CHECK(st.active_bytes.all.peak == 2 * n64);  // x's release and z's allocation were one operation
  check_invariants(st, a.snapshot());

  // A free ordered on another stream waits for that stream too.
  a.deallocate(z, s2, true, 0);
  CHECK(ev->recorded == 2);
  CHECK(pending_blocks() == 1);
  check_invariants(a.stats(), a.snapshot());
  // empty_cache does not wait: the pending block and its segment stay.
  a.empty_cache();
  CHECK(pending_blocks() == 1);
  check_invariants(a.stats(), a.snapshot());

  // A stream that refuses events: the free is ordered by finishing the device's work.
  ev->fail_events = true;
  void* w = a.allocate(n, s1);
  a.record_stream(w, s2);
  const int syncs = ev->syncs;
  a.deallocate(w, s1, true, 0);
  CHECK(ev->syncs == syncs + 1);
  CHECK(pending_blocks() == 1);  // z's block only: w went straight back to the cache
  ev->fail_events = false;
  check_invariants(a.stats(), a.snapshot());

  a.deallocate(y, s1, true, 0);
  ev->open.clear();
  a.empty_cache();  // events complete now: z's block is processed, every segment released
  CHECK(pending_blocks() == 0);
  st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.active_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == st.num_allocations.all.freed);
  check_invariants(st, a.snapshot());
}

// ---- stream ordering, model-checked ------------------------------------------------------

namespace {

// A device whose streams are modelled. Four handles (1..4; 1 and 2 are built-in streams,
// never destroyed); a handle names one stream at a time, and a handle destroyed and made
// again names a new stream (an incarnation) whose work is not ordered after the old one's.
// Work enqueued on a stream is counted (queued) and finishes when the test says (done <=
// queued, in order, also after its handle is destroyed); an event recorded on a stream
// completes once that stream's work up to then has finished; stream_wait(t, e) orders t's
// later work after e. deallocate() waits for the whole device, as cudaFree and hipFree do;
// vm_unmap() does not (cuMemUnmap and hipMemUnmap do not wait for work queued on the
// pages), and asks `unmapping` whether anything may still touch them. An event recorded on
// (or a wait queued on) a destroyed handle, or an event used after it was destroyed, fails
// the test. Memory is host memory (expandable segments too), so the allocator's
// asynchronous paths run exactly as on a GPU, against a model that knows, for every byte
// freed, which streams' work may still touch it.
class modelled_device_upstream final : public depot::upstream_resource {
 public:
  static constexpr std::size_t k_handles = 4;
  struct state {
    std::vector<std::uint64_t> queued = std::vector<std::uint64_t>(k_handles);  // by stream (incarnation)
    std::vector<std::uint64_t> done = std::vector<std::uint64_t>(k_handles);
    std::array<std::ptrdiff_t, k_handles> current{0, 1, 2, 3};  // a handle's stream; -1: destroyed
    // clock[t][u]: the last item of u's work that t's work from now on comes after (stream
    // waits carry it along: t waited for an event of a stream that had waited, and so on).
    std::vector<std::vector<std::uint64_t>> clock = std::vector<std::vector<std::uint64_t>>(k_handles);
    struct event {
      std::size_t stream;
      std::uint64_t position;
      std::vector<std::uint64_t> after;  // the work it completes after: its stream's clock, and itself
    };
    std::map<std::uintptr_t, event> events;  // recorded, not destroyed
    // A stream's waits (stream_wait) are items of its work: (its number, what it waits for);
    // the stream gets past one only once that work is done.
    std::map<std::size_t, std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>>> waits;
    std::uintptr_t next = 0;
    int recorded = 0, syncs = 0, host_waits = 0, stream_waits = 0, frees = 0, unmaps = 0, refusals = 0;
    int idle_answers = 0;  // stream_done() calls that found the stream's work all done
    // A graph capture under way on stream `capturing` (-1: none): CUDA's global capture mode
    // forbids a query, a wait, a synchronisation or a free of device memory, on any stream;
    // an event recorded on the capturing stream would be a node of its graph. Each counted
    // in `forbidden`, with what it was in `forbidden_calls`.
    std::ptrdiff_t capturing = -1;
    int forbidden = 0;
    std::string forbidden_calls;
    void forbid(const char* call)
    {
      if (capturing < 0) return;
      ++forbidden;
      forbidden_calls += std::string{" "} + call;
    }
    bool expandable = false;
    std::size_t capacity = std::numeric_limits<std::size_t>::max();  // bytes of memory (segments and pages)
    std::size_t used = 0;
    void take(std::size_t bytes)  // out_of_memory past the capacity
    {
      if (bytes > capacity - used) {
        ++refusals;
        throw depot::out_of_memory("modelled device: " + std::to_string(bytes) + " bytes more do not fit", bytes,
                                   depot::device_id{depot::device_kind::host, 0});
      }
      used += bytes;
    }
    std::function<void(std::uintptr_t, std::size_t)> unmapping;  // before each vm_unmap

    [[nodiscard]] std::size_t stream_of(depot::native_stream h) const
    {
      const auto k = reinterpret_cast<std::uintptr_t>(h);
      REQUIRE_MESSAGE((k >= 1 && k <= k_handles), "a stream handle the test never made");
      REQUIRE_MESSAGE(current[k - 1] >= 0, "the allocator used the handle of a destroyed stream");
      return static_cast<std::size_t>(current[k - 1]);
    }
    // Whether work enqueued on stream t from now on comes after u's work up to item w.
    [[nodiscard]] bool ordered_after(std::size_t t, std::size_t u, std::uint64_t w) const
    {
      return t == u || done[u] >= w || (u < clock[t].size() && clock[t][u] >= w);
    }
    // Stream t's work up to item x is done, and with it whatever t waited for on the way.
    void complete(std::size_t t, std::uint64_t x)
    {
      if (x <= done[t]) return;
      for (const auto& [q, upto] : waits[t]) {
        if (q > x) break;
        if (q <= done[t]) continue;
        for (std::size_t u = 0; u < upto.size(); ++u) complete(u, upto[u]);
        done[t] = std::max(done[t], q);
      }
      done[t] = std::max(done[t], x);
    }
    void remake(std::size_t handle)  // a new stream on the handle
    {
      current[handle] = static_cast<std::ptrdiff_t>(queued.size());
      queued.push_back(0);
      done.push_back(0);
      clock.emplace_back();
    }
  };
  static depot::native_stream handle(std::size_t i) { return reinterpret_cast<depot::native_stream>(i + 1); }

  explicit modelled_device_upstream(std::shared_ptr<state> s) : s_{std::move(s)} {}
  void* allocate(std::size_t bytes) override
  {
    s_->take(bytes);
    try {
      return map_pages(bytes);
    } catch (...) {
      s_->used -= bytes;
      throw;
    }
  }
  void deallocate(void* p, std::size_t bytes) noexcept override
  {
    s_->forbid("deallocate");
    ++s_->frees;
    s_->done = s_->queued;
    s_->used -= bytes;
    unmap_pages(p, bytes);
  }
  depot::memory_info memory() override
  {
    if (s_->capacity == std::numeric_limits<std::size_t>::max()) return inner_.memory();
    return {s_->capacity - s_->used, s_->capacity};
  }
  depot::device_id device() const noexcept override { return inner_.device(); }
  depot::native_event record_event(depot::native_stream h) override
  {
    const std::size_t i = s_->stream_of(h);
    if (static_cast<std::ptrdiff_t>(i) == s_->capturing) s_->forbid("record_event on the capturing stream");
    ++s_->recorded;
    std::vector<std::uint64_t> after = s_->clock[i];
    after.resize(s_->queued.size());
    after[i] = s_->queued[i];
    s_->events[++s_->next] = {i, s_->queued[i], std::move(after)};
    return reinterpret_cast<depot::native_event>(s_->next);
  }
  bool event_done(depot::native_event e) override
  {
    s_->forbid("event_done");
    const auto& ev = event_of(e);
    return s_->done[ev.stream] >= ev.position;
  }
  // All of the stream's work done (its waits are items of it: what it waited for is done).
  bool stream_done(depot::native_stream h) override
  {
    s_->forbid("stream_done");
    const std::size_t i = s_->stream_of(h);
    const bool idle = s_->done[i] >= s_->queued[i];
    s_->idle_answers += idle ? 1 : 0;
    return idle;
  }
  void wait_event(depot::native_event e) override
  {
    s_->forbid("wait_event");
    const auto& ev = event_of(e);
    ++s_->host_waits;
    s_->complete(ev.stream, ev.position);
  }
  void stream_wait(depot::native_stream t, depot::native_event e) override
  {
    const auto& ev = event_of(e);
    ++s_->stream_waits;
    const std::size_t i = s_->stream_of(t);
    auto& c = s_->clock[i];
    c.resize(std::max(c.size(), ev.after.size()));
    for (std::size_t u = 0; u < ev.after.size(); ++u) c[u] = std::max(c[u], ev.after[u]);
    s_->waits[i].emplace_back(++s_->queued[i], ev.after);
  }
  void destroy_event(depot::native_event e) noexcept override
  {
    const bool known = s_->events.erase(reinterpret_cast<std::uintptr_t>(e)) == 1;
    CHECK_MESSAGE(known, "an event destroyed twice, or never recorded");
  }
  void synchronize_device() override
  {
    s_->forbid("synchronize_device");
    ++s_->syncs;
    s_->done = s_->queued;
  }
  std::size_t vm_page() override { return s_->expandable ? inner_.vm_page() : 0; }
  void* vm_reserve(std::size_t bytes) override { return inner_.vm_reserve(bytes); }
  std::uint64_t vm_map(void* addr, std::size_t bytes) override
  {
    s_->take(bytes);
    try {
      return inner_.vm_map(addr, bytes);
    } catch (...) {
      s_->used -= bytes;
      throw;
    }
  }
  void vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles) override
  {
    s_->take(page * count);
    try {
      inner_.vm_map_pages(addr, page, count, handles);
    } catch (...) {
      s_->used -= page * count;
      throw;
    }
  }
  void vm_unmap(void* addr, std::size_t bytes, std::uint64_t h) noexcept override
  {
    s_->forbid("vm_unmap");
    ++s_->unmaps;
    if (s_->unmapping) s_->unmapping(reinterpret_cast<std::uintptr_t>(addr), bytes);
    s_->used -= bytes;
    inner_.vm_unmap(addr, bytes, h);
  }
  void vm_release(void* addr, std::size_t bytes) noexcept override { inner_.vm_release(addr, bytes); }

 private:
  const state::event& event_of(depot::native_event e) const
  {
    const auto it = s_->events.find(reinterpret_cast<std::uintptr_t>(e));
    REQUIRE_MESSAGE(it != s_->events.end(), "the allocator used an event it had destroyed or never recorded");
    return it->second;
  }
  depot::device_upstream<depot::host> inner_{0};
  std::shared_ptr<state> s_;
};

struct ordering_variant {
  std::string name;
  std::size_t lo, hi;  // request sizes
  depot::allocator_config cfg;
  bool expandable = false;
  std::size_t capacity = std::numeric_limits<std::size_t>::max();  // the modelled device's memory
};

ordering_variant pick_ordering_variant()
{
  ordering_variant v{"every pool, 1 B-3 MiB", 1, 3 * MiB, quiet_config<depot::host>()};
  SUBCASE("every pool, 1 B-3 MiB") {}
  SUBCASE("dense small segments, 1 B-64 KiB") { v = {"dense small", 1, 64 * KiB, quiet_config<depot::host>()}; }
  SUBCASE("large pool, 1-24 MiB, steal_threshold unlimited") {
    v = {"large, no steals", MiB + 1, 24 * MiB, quiet_config<depot::host>()};
    v.cfg.steal_threshold = std::numeric_limits<std::size_t>::max();
  }
  SUBCASE("release_threshold 0, stats_batch 0") {
    v = {"release 0", 1, 6 * MiB, quiet_config<depot::host>()};
    v.cfg.release_threshold = 0;
    v.cfg.stats_batch = 0;
  }
  SUBCASE("expandable segments, 1 B-24 MiB") {
    v = {"expandable", 1, 24 * MiB, quiet_config<depot::host>()};
    v.cfg.expandable_segments = true;
    v.expandable = true;
  }
  SUBCASE("expandable segments, release_threshold 32 MiB") {
    v = {"expandable, release 32 MiB", 1, 24 * MiB, quiet_config<depot::host>()};
    v.cfg.expandable_segments = true;
    v.cfg.release_threshold = 32 * MiB;
    v.expandable = true;
  }
  SUBCASE("a 160 MiB device: out-of-memory retries") {
    v = {"160 MiB device", 1, 24 * MiB, quiet_config<depot::host>()};
    v.capacity = 160 * MiB;
  }
  SUBCASE("a 160 MiB device, expandable segments: out-of-memory retries") {
    v = {"160 MiB device, expandable", 1, 24 * MiB, quiet_config<depot::host>()};
    v.cfg.expandable_segments = true;
    v.expandable = true;
    v.capacity = 160 * MiB;
  }
  return v;
}

}  // namespace

// Random allocations, frees (on the block's stream, unnamed, on another stream, with and
// without the size), record_stream, work finishing stream by stream, streams destroyed and
// their handles made again, graph captures (streams destroyed during them, pools reused and
// released; no query, wait, synchronisation or device free may happen during one),
// empty_cache, bad frees, on four stream handles of an
// asynchronous backend, and the allocator destroyed at the end with work still queued.
// After every operation: the statistics equal the snapshot; every allocation's bytes are
// disjoint from every live block and from every freed block some other stream's unfinished
// work may still touch (unless the new owner's stream was made to wait for that work); no
// page is unmapped under a live block or under work that may still touch it; each live
// block still holds what its owner wrote; no destroyed stream or event is used.
// The fuzz with seed `fixed`; `first_seed`: the one whose coverage the end checks.
static void ordering_fuzz(std::uint64_t fixed, bool first_seed)
{
  using up = modelled_device_upstream;
  const ordering_variant v = pick_ordering_variant();
  CAPTURE(v.name);
  std::mt19937_64 rng{depot::test::seed("pool stream ordering fuzz", fixed)};
  auto dev = std::make_shared<up::state>();
  dev->expandable = v.expandable;
  dev->capacity = v.capacity;
  const depot::device_id host0{depot::device_kind::host, 0};
  // Handles 3 and 4 are streams stream_registry knows (1 and 2 are built in): destroyed
  // ones leave a fence. Whatever is still registered when the test ends is closed.
  std::array<bool, up::k_handles> open{true, true, true, true};
  struct registered {
    std::array<bool, up::k_handles>& open;
    depot::device_id device;
    ~registered()
    {
      for (std::size_t h = 2; h < up::k_handles; ++h) {
        if (open[h]) depot::stream_registry::closing(device, up::handle(h));
      }
    }
  } const closer{open, host0};
  depot::stream_registry::opened(host0, up::handle(2));
  depot::stream_registry::opened(host0, up::handle(3));
  auto a = std::make_unique<depot::detail::allocator_core>(std::make_unique<up>(dev), v.cfg, /*asynchronous=*/true);
  CHECK((a->expandable_page() != 0) == v.expandable);
  auto& queued = dev->queued;
  auto& done = dev->done;
  struct live_block {
    std::size_t bytes;
    std::size_t handle;             // allocated on the stream of this handle ...
    std::size_t stream;             // ... this one
    std::set<std::size_t> uses;     // streams of record_stream
    unsigned char id;
    int op;
  };
  std::map<std::uintptr_t, live_block> live;
  std::vector<std::uintptr_t> order;  // the live blocks in the order they came (picks do not depend on addresses)
  const auto pick = [&] {
    const std::size_t k = rng() % order.size();
    return std::pair{k, live.find(order[k])};
  };
  struct freed_block {  // bytes some stream's work may still touch: (stream, its work up to)
    std::uintptr_t addr;
    std::size_t bytes;
    std::vector<std::pair<std::size_t, std::uint64_t>> until;
    std::string how;
  };
  std::vector<freed_block> freed;
  // What may still touch a live block now: its stream's work so far, and that of the
  // streams it was recorded on.
  const auto last_uses = [&](const live_block& b) {
    std::vector<std::pair<std::size_t, std::uint64_t>> until{{b.stream, queued[b.stream]}};
    for (std::size_t u : b.uses) until.emplace_back(u, queued[u]);
    return until;
  };
  const auto overlaps = [](std::uintptr_t p, std::size_t n, std::uintptr_t q, std::size_t m) {
    return p < q + m && q < p + n;
  };
  const auto byte_at = [](std::uintptr_t p) { return *reinterpret_cast<const unsigned char*>(p); };
  bool unmapped_in_use = false;
  struct unhook {  // the hook reads this test's locals: gone before they are, however the test ends
    std::shared_ptr<up::state> d;
    ~unhook() { d->unmapping = nullptr; }
  } const unhooked{dev};
  dev->unmapping = [&](std::uintptr_t addr, std::size_t bytes) {
    for (const auto& [q, b] : live) {
      if (overlaps(addr, bytes, q, b.bytes)) {
        unmapped_in_use = true;
        MESSAGE("pages ", depot::format_address(addr), " + ", bytes, " unmapped under live block ", depot::format_address(q));
      }
    }
    for (const freed_block& f : freed) {
      if (!overlaps(addr, bytes, f.addr, f.bytes)) continue;
      for (const auto& [u, w] : f.until) {
        if (dev->done[u] >= w) continue;
        unmapped_in_use = true;
        MESSAGE("pages ", depot::format_address(addr), " + ", bytes, " unmapped while stream ", u,
                "'s work may still touch ", depot::format_address(f.addr), " + ", f.bytes, " (its work to ", w,
                ", done ", dev->done[u], "); it was ", f.how);
      }
    }
  };
  const auto intact = [&](std::uintptr_t p, const live_block& b) {
    return byte_at(p) == b.id && byte_at(p + b.bytes - 1) == b.id && byte_at(p + b.bytes / 2) == b.id;
  };
  // The stream of an open handle, picked at random (handles 1 and 2 are always open).
  const auto open_handle = [&] {
    std::size_t h = rng() % up::k_handles;
    while (!open[h]) h = (h + 1) % up::k_handles;
    return h;
  };
  int handed_early = 0, reuses_waited = 0, bad_frees = 0, allocations = 0, closings = 0, ooms = 0, captures = 0,
      closed_in_capture = 0;
  // Graph captures on handle 3 or 4 (registered streams): the captured work is never
  // launched, so it touches no memory (the model queues none). Each begin_capture is one
  // use of its pool, released once the capture ended (a pool may take a second capture).
  std::ptrdiff_t capture_handle = -1;
  std::uint64_t capture_pool = 0;
  std::vector<std::uint64_t> pool_uses;  // one per ended capture, not yet released
  const auto end_capture = [&] {
    dev->capturing = -1;
    a->end_capture(up::handle(static_cast<std::size_t>(capture_handle)));
    pool_uses.push_back(capture_pool);
    capture_handle = -1;
  };
  // Work queued on stream t (none while t is capturing: a graph's nodes).
  const auto work_on = [&](std::size_t t) {
    if (static_cast<std::ptrdiff_t>(t) != dev->capturing) ++queued[t];
  };
  for (int op = 0; op < 6000; ++op) {
    CAPTURE(op);
    CAPTURE(capture_handle);
    const auto r = rng() % 100;
    const std::size_t h = open_handle();
    const auto s = static_cast<std::size_t>(dev->current[h]);
    if (live.empty() || r < 38) {
      std::size_t n = v.lo + rng() % (v.hi - v.lo + 1);
      if (rng() % 8 == 0) n = v.lo + rng() % std::min<std::size_t>(v.hi - v.lo + 1, 4 * KiB);
      std::uintptr_t p = 0;
      try {
        p = reinterpret_cast<std::uintptr_t>(a->allocate(n, up::handle(h)));
      } catch (const depot::out_of_memory& e) {
        REQUIRE(v.capacity != std::numeric_limits<std::size_t>::max());  // only a small device runs out
        CHECK(e.requested_bytes() == n);
        ++ooms;
      }
      if (p != 0) {
        ++allocations;
        work_on(s);  // the owner's work on it
        for (const auto& [q, b] : live) {
          if (overlaps(p, n, q, b.bytes)) {
            FAIL("new block ", depot::format_address(p), " + ", n, " overlaps live ", depot::format_address(q), " + ",
                 b.bytes);
          }
        }
        for (const freed_block& f : freed) {
          if (!overlaps(p, n, f.addr, f.bytes)) continue;
          for (const auto& [u, w] : f.until) {
            const bool ordered = dev->ordered_after(s, u, w);
            handed_early += ordered && u != s && done[u] < w ? 1 : 0;
            if (ordered) continue;
            INFO("block ", depot::format_address(p), " + ", n, " handed out on stream ", s, " overlaps ",
                 depot::format_address(f.addr), " + ", f.bytes, " which stream ", u, " may touch until its work ",
                 w, " (done ", done[u], ", and stream ", s, " was not made to wait for it); it was ", f.how);
            REQUIRE(ordered);
          }
          ++reuses_waited;
        }
        const auto id = static_cast<unsigned char>(op % 251 + 1);
        // The bytes intact() reads, and one per 64 KiB (writing all of each block faulted in
        // gigabytes of fresh pages: minutes of system time)
        for (std::size_t at = 0; at < n; at += 64 * KiB) *reinterpret_cast<unsigned char*>(p + at) = id;
        for (std::size_t at : {n / 2, n - 1}) *reinterpret_cast<unsigned char*>(p + at) = id;
        live[p] = {n, h, s, {}, id, op};
        order.push_back(p);
      }
    } else if (r < 66) {
      const auto [k, it] = pick();
      const auto [p, b] = *it;
      INFO("block ", depot::format_address(p), " + ", b.bytes);
      REQUIRE(intact(p, b));
      std::vector<std::pair<std::size_t, std::uint64_t>> until = last_uses(b);
      // On its stream (while its handle still names it), unnamed, or on the stream of h.
      const bool own_open = dev->current[b.handle] == static_cast<std::ptrdiff_t>(b.stream);
      auto how = rng() % 10;
      if (how < 5 && !own_open) how = 5;
      void* const ptr = reinterpret_cast<void*>(p);
      if (how == 9) {
        CHECK_THROWS_AS(a->deallocate(ptr, up::handle(h), true, b.bytes + 1), depot::invalid_argument);
        ++bad_frees;
        REQUIRE(intact(p, b));
        continue;  // refused: still live, unchanged
      }
      if (how >= 7) until.emplace_back(s, queued[s]);  // freed on s: s's work up to now may use it
      std::string said = "allocated on " + std::to_string(b.stream) + " at op " + std::to_string(b.op) +
                         ", freed at op " + std::to_string(op) +
                         (how < 5 ? " on its stream" : how < 7 ? " unnamed" : " on stream " + std::to_string(s)) +
                         ", used on";
      for (std::size_t u : b.uses) said += " " + std::to_string(u);
      // Out of the live set before the call: the free itself may unmap its pages (release_threshold).
      freed.push_back({p, b.bytes, std::move(until), said});
      const std::size_t bytes = b.bytes, own = b.handle;
      live.erase(it);
      order[k] = order.back();
      order.pop_back();
      if (how < 5) {
        a->deallocate(ptr, up::handle(own), true, rng() % 2 == 0 ? bytes : 0);
      } else if (how < 7) {
        a->deallocate(ptr, nullptr, false, 0);  // ordered on its allocation's stream
      } else {
        a->deallocate(ptr, up::handle(h), true, 0);
      }
    } else if (r < 76) {
      const auto it = pick().second;
      a->record_stream(reinterpret_cast<void*>(it->first), up::handle(h));
      it->second.uses.insert(s);
      work_on(s);  // work on s that uses the block
    } else if (r < 90) {
      const std::size_t u = rng() % queued.size();  // any stream, destroyed ones too
      dev->complete(u, std::min(queued[u], done[u] + rng() % 4));  // some of u's work finishes
    } else if (r < 91) {
      // A capture begins on handle 3 or 4 (into a new pool, or one whose capture ended), or
      // the one under way ends.
      if (capture_handle >= 0) {
        end_capture();
      } else if (const std::size_t g = 2 + rng() % 2; open[g]) {
        const std::uint64_t into = !pool_uses.empty() && rng() % 3 == 0 ? pool_uses[rng() % pool_uses.size()] : 0;
        capture_pool = a->begin_capture(up::handle(g), into);
        CHECK((into == 0 || capture_pool == into));
        capture_handle = static_cast<std::ptrdiff_t>(g);
        dev->capturing = dev->current[g];
        ++captures;
      }
    } else if (r < 92) {
      if (capture_handle < 0 && !pool_uses.empty()) {  // a captured graph's pool goes
        const std::size_t k = rng() % pool_uses.size();
        a->release_capture_pool(pool_uses[k]);
        pool_uses[k] = pool_uses.back();
        pool_uses.pop_back();
      }
    } else if (r < 94) {
      work_on(s);  // unrelated work
    } else if (r < 96) {
      if (capture_handle >= 0) {
        CHECK_THROWS_AS(a->empty_cache(), depot::invalid_argument);  // nothing is released during one
      } else {
        a->empty_cache();
      }
    } else if (r < 97) {
      done = queued;  // the device goes idle
    } else if (r < 98) {
      // Handle 3 or 4: its stream is destroyed (its cache records a fence), or made again.
      const std::size_t g = 2 + rng() % 2;
      if (static_cast<std::ptrdiff_t>(g) == capture_handle) {
        // (a capturing stream is not destroyed)
      } else if (open[g]) {
        depot::stream_registry::closing(host0, up::handle(g));
        dev->current[g] = -1;
        open[g] = false;
        ++closings;
        closed_in_capture += capture_handle >= 0 ? 1 : 0;
      } else {
        dev->remake(g);
        depot::stream_registry::opened(host0, up::handle(g));
        open[g] = true;
      }
    } else {
      // A double free or a pointer inside a live block: refused by name, nothing changed.
      std::uintptr_t bad = order[rng() % order.size()] + 512;
      if (!freed.empty() && rng() % 2 == 0) {
        bad = freed.back().addr;
        for (const auto& [q, b] : live) bad = overlaps(bad, 1, q, b.bytes) ? 0 : bad;
      }
      if (bad != 0 && live.count(bad) == 0) {
        CHECK_THROWS_AS(a->deallocate(reinterpret_cast<void*>(bad), nullptr, false, 0), depot::invalid_argument);
        ++bad_frees;
      }
    }
    // Freed bytes whose every stream has finished with them leave the model.
    std::erase_if(freed, [&](const freed_block& f) {
      return std::all_of(f.until.begin(), f.until.end(), [&](const auto& uw) { return done[uw.first] >= uw.second; });
    });
    REQUIRE_FALSE(unmapped_in_use);
    REQUIRE_MESSAGE(dev->forbidden == 0, "during a capture:", dev->forbidden_calls);
    check_invariants(a->stats(), a->snapshot());
  }
  if (capture_handle >= 0) end_capture();
  for (const std::uint64_t pool : pool_uses) a->release_capture_pool(pool);
  REQUIRE_FALSE(unmapped_in_use);
  check_invariants(a->stats(), a->snapshot());
  MESSAGE(v.name, ": ", captures, " graph captures (", closed_in_capture, " streams destroyed during one), ",
          allocations, " allocations, ", reuses_waited, " reuses of freed bytes (", handed_early,
          " ordered by a stream wait before the old work finished), ", dev->recorded, " events, ", dev->syncs,
           " device synchronisations, ", dev->stream_waits, " stream waits, ", dev->idle_answers,
          " streams found idle, ", closings, " streams destroyed, ",
          dev->frees, " segments freed, ", dev->unmaps, " pages unmapped, ", bad_frees, " bad frees refused, ",
          ooms, " out_of_memory (", dev->refusals, " refusals by the device)");
  // What the first fixed seed reaches (another seed, DEPOT_TEST_SEED, may miss one by
  // chance: said, not failed).
  const bool fixed_seed = first_seed && std::getenv("DEPOT_TEST_SEED") == nullptr;
  const auto reached = [fixed_seed](bool r, const char* what) {
    if (fixed_seed) {
      CHECK_MESSAGE(r, what);
    } else {
      WARN_MESSAGE(r, what);
    }
  };
  reached(reuses_waited > 0, "freed bytes reused");
  reached(dev->recorded > 0, "events recorded");
  // (Only the expandable variant moves memory between live streams often enough, ~50 stream
  // waits a run, to find one idle by chance; a directed test covers the rest.)
  if (v.expandable) reached(dev->idle_answers > 0, "a steal from a stream with all of its work done");
  reached(closings > 0, "streams destroyed");
  reached(captures > 0, "graph captures");
  reached(closed_in_capture > 0, "a stream destroyed during a capture");
  CHECK((ooms == 0 || v.capacity != std::numeric_limits<std::size_t>::max()));
  reached((ooms > 0) == (v.capacity != std::numeric_limits<std::size_t>::max()), "out_of_memory on the small device");
  // Half the live blocks freed, with their streams' work still queued; empty_cache gives
  // back only what no stream may still use (finish_uses waits for the rest), then the
  // allocator goes with blocks live and work queued: nothing is unmapped under them.
  const bool any_live = !order.empty();
  for (const std::size_t keep = (order.size() + 1) / 2; order.size() > keep;) {
    const std::uintptr_t p = order.back();
    order.pop_back();
    const live_block b = live.at(p);
    REQUIRE(intact(p, b));
    freed.push_back({p, b.bytes, last_uses(b), "freed at the end"});
    live.erase(p);
    a->deallocate(reinterpret_cast<void*>(p), nullptr, false, 0);
  }
  a->empty_cache();
  REQUIRE_FALSE(unmapped_in_use);
  check_invariants(a->stats(), a->snapshot());
  CHECK(live.empty() == !any_live);
  for (const auto& [p, b] : live) {  // the allocator's destruction frees them, work still queued
    freed.push_back({p, b.bytes, last_uses(b), "live when the allocator went"});
  }
  live.clear();
  a.reset();
  REQUIRE_FALSE(unmapped_in_use);
  CHECK(dev->events.empty());  // every event recorded was destroyed
}

TEST_CASE("pool: stream ordering holds under 6 000 random operations on four streams (a modelled device)")
{
  ordering_fuzz(0x5712EA, true);
}

// A second seed, one that found a capture pool taken up by a capture on another stream
// counting the pool's blocks as the new stream's (2026-12-01; with DEPOT_TEST_SEED, 8 of
// 20 seeds failed before the fix, 0 after).
TEST_CASE("pool: stream ordering holds under the fuzz with a second seed")
{
  ordering_fuzz(2, false);
}

// The bug the modelled-device fuzz found (2026-12-01): empty_cache() unmapped an expandable
// segment's free pages while kernels queued on the stream that freed a block there could
// still write it (a block freed on its stream is free at once; cuMemUnmap does not wait).
// Here a kernel writes the block after a long wait; the block is freed and the cache
// emptied while it waits: the write must land in mapped memory (no device fault) and the
// pages go only after it.
TEST_CASE_TEMPLATE("pool: empty_cache waits for the last work on a freed expandable block before unmapping it", D,
                   DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg = quiet_config<D>();
  cfg.expandable_segments = true;
  depot::caching_allocator<D> a{0, cfg};
  if (a.expandable_page() == 0) {
    MESSAGE("no virtual memory management here: nothing to unmap");
    return;
  }
  depot::stream<D> s;
  const std::size_t n = 64 * MiB;
  void* x = a.allocate(n, s);
  depot::ops::busy_wait<D>(std::chrono::milliseconds(depot::is_gpu_v<D> ? 200 : 1), s);
  depot::ops::fill<D, float>(static_cast<float*>(x), n / sizeof(float), 3.0F, s);
  a.deallocate(x, s);  // free at once on s: s's queued fill still writes it
  const auto t0 = std::chrono::steady_clock::now();
  a.empty_cache();
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("empty_cache took ", waited_ms, " ms");
  CHECK(s.ready());                       // the fill was done before the pages went
  CHECK_NOTHROW(s.synchronize());         // and the device did not fault
  CHECK(a.stats().reserved_bytes.all.current == 0);
  if constexpr (depot::is_gpu_v<D>) CHECK(waited_ms > 50.0);  // it waited for the kernel
  // The allocator still works on that stream afterwards.
  void* y = a.allocate(n, s);
  depot::ops::fill<D, float>(static_cast<float*>(y), n / sizeof(float), 1.0F, s);
  s.synchronize();
  a.deallocate(y, s);
  check_invariants(a);
}

// The second bug the fuzz found: a block that lists another stream (record_stream) whose
// stream is destroyed before the block is freed. The free recorded an event on the dead
// handle (an error, or an event on whatever new stream the backend gave that handle). Now
// the stream's destruction waits for its queued work when a live block lists it, and the
// block forgets it: its writes are done when the destructor returns, and the free needs no
// event.
TEST_CASE_TEMPLATE("pool: a stream destroyed while a live block lists it is waited for, and no event goes on its handle",
                   D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s1;
  const std::size_t n = 4 * MiB;
  void* x = a.allocate(n, s1);
  depot::runtime<D>::set_async(x, 0, n, s1.native());
  s1.synchronize();
  auto s2 = std::make_unique<depot::stream<D>>();
  depot::ops::busy_wait<D>(std::chrono::milliseconds(depot::is_gpu_v<D> ? 100 : 1), *s2);
  depot::ops::fill<D, float>(static_cast<float*>(x), n / sizeof(float), 5.0F, *s2);
  a.record_stream(x, *s2);
  const auto t0 = std::chrono::steady_clock::now();
  s2.reset();  // destroyed with its fill still queued behind the wait
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("the stream's destruction took ", ms, " ms");
  float last[4] = {};
  depot::runtime<D>::copy(last, static_cast<const unsigned char*>(x) + n - sizeof last, sizeof last);
  CHECK(last[3] == 5.0F);  // its work was done when the destruction returned
  a.deallocate(x, s1);
  void* y = a.allocate(n, s1);
  CHECK(y == x);  // nothing left to wait for: the block came straight back
  a.deallocate(y, s1);
  // A stream that no live block lists is destroyed without a wait (printed: 0.03 ms against
  // 100 ms on an H200, 2026-12-01).
  auto s3 = std::make_unique<depot::stream<D>>();
  depot::ops::busy_wait<D>(std::chrono::milliseconds(depot::is_gpu_v<D> ? 100 : 1), *s3);
  const auto t1 = std::chrono::steady_clock::now();
  s3.reset();
  const double ms3 = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  MESSAGE("an unlisted stream's destruction took ", ms3, " ms (not asserted: under compute-sanitizer every stream "
          "destruction waits)");
  check_invariants(a);
}

// Two registered streams (handles 0x1000 and 0x2000) over a manual_event_upstream, for
// the steal tests below: in a subcase per kind of segment, blocks of n bytes that tile one
// `per` at a time (a 20 MiB large segment by one block, a linked small one by two of
// 1 MiB, a dense one by 32 of 64 KiB).
struct two_stream_steals {
  two_stream_steals()
  {
    SUBCASE("large pool") {}
    SUBCASE("linked small segment") { n = 1 * MiB, per = 2; }
    SUBCASE("dense small segment") { n = 64 * KiB, per = 32; }
    depot::stream_registry::opened(dev, s1);
    depot::stream_registry::opened(dev, s2);
  }
  std::size_t n = 20 * MiB, per = 1;
  std::shared_ptr<manual_event_upstream::state> ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  depot::native_stream s1 = fake_stream(0x1000);
  depot::native_stream s2 = fake_stream(0x2000);
  depot::device_id dev = ev->streams;
};
// k blocks of t.n bytes on stream s; given back on s.
static std::vector<void*> take(two_stream_steals& t, depot::native_stream s, std::size_t k)
{
  std::vector<void*> v;
  for (std::size_t i = 0; i < k; ++i) v.push_back(t.a.allocate(t.n, s));
  return v;
}
static void give(two_stream_steals& t, std::vector<void*>& v, depot::native_stream s)
{
  for (void* p : v) t.a.deallocate(p, s, true, 0);
  v.clear();
}
// A third stream (0x3000) beside t's two, opened here; end() checks that t's allocator
// ends empty and closes all three.
struct third_stream {
  explicit third_stream(two_stream_steals& steals) : t{steals} { depot::stream_registry::opened(t.dev, s3); }
  void end()
  {
    check_ends_empty(t.a);
    for (depot::native_stream s : {s3, t.s1, t.s2}) depot::stream_registry::closing(t.dev, s);
  }
  two_stream_steals& t;
  depot::native_stream s3 = fake_stream(0x3000);
};

// A steal from a live stream orders the thief's stream after the victim's by an event
// recorded there and a wait, unless the thief's stream already waited for an event of the
// victim's stream recorded after the segment's last free: then nothing is queued. Each kind
// of segment (two_stream_steals).
TEST_CASE("pool: a steal queues no event when the thief's stream already waited past the segment's last free")
{
  two_stream_steals t;
  auto& [n, per, ev, a, s1, s2, dev] = t;
  CAPTURE(n);
  const auto segments = [&] { return a.snapshot().segments.size(); };
  // memory_stats counts the moves and their events (num_segments_moved, num_move_events).
  const auto moved = [&] { return a.stats().num_segments_moved; };
  const auto move_events = [&] { return a.stats().num_move_events; };
  // Two segments on stream 1, freed there.
  std::vector<void*> on1 = take(t, s1, 2 * per);
  REQUIRE(segments() == 2);
  give(t, on1, s1);
  // Stream 2 takes both over: the first steal records an event on stream 1 (after both
  // frees) and queues a wait on stream 2; the second is covered by that wait.
  int recorded = ev->recorded, waits = ev->stream_waits;
  std::vector<void*> on2 = take(t, s2, 2 * per);
  CHECK(segments() == 2);  // taken over, not grown
  CHECK(ev->recorded == recorded + 1);
  CHECK(ev->last_record_stream == 0x1000);
  CHECK(ev->stream_waits == waits + 1);
  CHECK(ev->waiting_stream == 0x2000);
  CHECK(moved() == 2);
  CHECK(move_events() == 1);
  // Freed on stream 2, then stream 1 takes one back: an event on stream 2 (stream 1 never
  // waited for one). Stream 2 then uses and frees its other segment: its last free comes
  // after that event, so stream 1 taking it over needs a new one.
  give(t, on2, s2);
  recorded = ev->recorded;
  waits = ev->stream_waits;
  on1 = take(t, s1, per);
  CHECK(ev->recorded == recorded + 1);
  CHECK(ev->last_record_stream == 0x2000);
  CHECK(ev->stream_waits == waits + 1);
  CHECK(ev->waiting_stream == 0x1000);
  on2 = take(t, s2, per);  // its own remaining segment
  CHECK(ev->recorded == recorded + 1);
  give(t, on2, s2);
  std::vector<void*> more = take(t, s1, per);
  CHECK(segments() == 2);
  CHECK(ev->recorded == recorded + 2);  // not covered: freed after the wait
  CHECK(ev->last_record_stream == 0x2000);
  CHECK(ev->stream_waits == waits + 2);
  CHECK(moved() == 4);
  CHECK(move_events() == 3);
  CHECK(a.stats().num_move_syncs == 0);  // (registered streams: events, never the device)
  CHECK(a.summary().find("segments moved between streams 4 (events recorded for them 3, device synchronisations 0)") !=
        std::string::npos);
  give(t, on1, s1);
  give(t, more, s1);
  // Stream 1 destroyed with both segments free in its cache: stream 2's next miss takes
  // them over at once, ordered by the fence recorded at the destruction (no move event).
  depot::stream_registry::closing(dev, s1);
  on2 = take(t, s2, 2 * per);
  CHECK(segments() == 2);
  CHECK(moved() == 6);
  CHECK(move_events() == 3);
  give(t, on2, s2);
  check_invariants(a.stats(), a.snapshot());
  a.reset_memory_stats();  // both counters restart, as the other totals do
  CHECK(moved() == 0);
  CHECK(move_events() == 0);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  depot::stream_registry::closing(dev, s2);
}

// A steal from a live stream whose queued work is all done (the backend's stream query)
// queues neither an event nor a wait, and counts as one: a later steal of memory freed
// before the query is covered without asking again; memory freed after it asks again, and
// a stream with work left gets an event. Destroyed streams and raw handles are never
// asked (a handle may be gone). Each kind of segment, as above.
TEST_CASE("pool: a steal from a stream with no work left queues no event")
{
  two_stream_steals t;
  auto& [n, per, ev, a, s1, s2, dev] = t;
  CAPTURE(n);
  std::vector<void*> on1 = take(t, s1, 2 * per);
  REQUIRE(a.snapshot().segments.size() == 2);
  give(t, on1, s1);
  // Stream 1 has nothing left to run: stream 2 takes a segment over with one query.
  ev->idle = {0x1000};
  int recorded = ev->recorded, waits = ev->stream_waits, queries = ev->stream_queries;
  std::vector<void*> first = take(t, s2, per);
  CHECK(ev->stream_queries == queries + 1);
  CHECK(ev->recorded == recorded);
  CHECK(ev->stream_waits == waits);
  CHECK(a.stats().num_segments_moved == 1);
  CHECK(a.stats().num_move_events == 0);
  // Stream 1 busy again: its other segment was freed before the query, so covered.
  ev->idle.clear();
  std::vector<void*> second = take(t, s2, per);
  CHECK(a.snapshot().segments.size() == 2);
  CHECK(ev->stream_queries == queries + 1);
  CHECK(ev->recorded == recorded);
  CHECK(a.stats().num_segments_moved == 2);
  // Freed on stream 2, which has work left: stream 1 taking one back asks, then records an
  // event on stream 2 and waits for it.
  give(t, first, s2);
  give(t, second, s2);
  on1 = take(t, s1, per);
  CHECK(ev->stream_queries == queries + 2);
  CHECK(ev->recorded == recorded + 1);
  CHECK(ev->last_record_stream == 0x2000);
  CHECK(ev->stream_waits == waits + 1);
  CHECK(ev->waiting_stream == 0x1000);
  CHECK(a.stats().num_segments_moved == 3);
  CHECK(a.stats().num_move_events == 1);
  // Memory freed on stream 1 after a query is not covered by it: freed there, stream 1
  // idle, stream 2 takes it with a new query; then freed on 2 and 2 idle, 1 takes it back
  // with a query, no event.
  give(t, on1, s1);
  ev->idle = {0x1000, 0x2000};
  std::vector<void*> again = take(t, s2, 2 * per);  // its own one, then stream 1's
  CHECK(ev->stream_queries == queries + 3);
  CHECK(ev->recorded == recorded + 1);
  give(t, again, s2);
  on1 = take(t, s1, per);
  CHECK(ev->stream_queries == queries + 4);
  CHECK(ev->recorded == recorded + 1);
  CHECK(a.stats().num_segments_moved == 5);
  CHECK(a.stats().num_move_events == 1);
  give(t, on1, s1);
  // A destroyed stream's memory moves on its fence, unasked.
  depot::stream_registry::closing(dev, s1);
  std::vector<void*> all = take(t, s2, 2 * per);
  CHECK(ev->stream_queries == queries + 4);
  CHECK(a.snapshot().segments.size() == 2);
  give(t, all, s2);
  check_invariants(a.stats(), a.snapshot());
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  depot::stream_registry::closing(dev, s2);
}

// A query that found a stream with no work left covers every free there before it, for
// any stream that takes the memory later: a third stream taking the victim's other
// segment, freed before that query, asks nothing and queues nothing, though the victim is
// busy again (memory freed after a query is asked about anew: the case above). Each kind
// of segment.
TEST_CASE("pool: a stream found idle is not asked again about memory freed before, whichever stream takes it")
{
  two_stream_steals t;
  auto& [n, per, ev, a, s1, s2, dev] = t;
  CAPTURE(n);
  third_stream third{t};
  std::vector<void*> on1 = take(t, s1, 2 * per);
  REQUIRE(a.snapshot().segments.size() == 2);
  give(t, on1, s1);
  // Stream 2 takes one segment over with one query (stream 1 idle).
  ev->idle = {0x1000};
  const int recorded = ev->recorded, waits = ev->stream_waits, queries = ev->stream_queries;
  std::vector<void*> on2 = take(t, s2, per);
  CHECK(ev->stream_queries == queries + 1);
  CHECK(a.stats().num_segments_moved == 1);
  // Stream 1 busy again; stream 3 takes the other one: freed before the query, so done.
  ev->idle.clear();
  std::vector<void*> on3 = take(t, third.s3, per);
  CHECK(a.snapshot().segments.size() == 2);  // taken over, not grown
  CHECK(a.stats().num_segments_moved == 2);
  CHECK(ev->stream_queries == queries + 1);
  CHECK(ev->recorded == recorded);
  CHECK(ev->stream_waits == waits);
  CHECK(a.stats().num_move_events == 0);
  give(t, on3, third.s3);
  give(t, on2, s2);
  third.end();
}

// A miss takes over a whole free segment of the other stream that holds the most segments
// first, whatever the order the streams came in: taking from the first stream that has one
// made one thread alternating among streams move memory back and forth between the first
// few (steal()). Each kind of segment.
TEST_CASE("pool: a steal takes first from the stream that holds the most segments")
{
  two_stream_steals t;
  auto& [n, per, ev, a, s1, s2, dev] = t;
  CAPTURE(n);
  third_stream third{t};
  const auto held_by = [&](depot::native_stream s) {
    return depot::test::segments_on(a.snapshot(), reinterpret_cast<std::uintptr_t>(s));
  };
  // Stream 1 (its cache made first) holds one free segment, stream 3 three.
  std::vector<void*> on1 = take(t, s1, per);
  std::vector<void*> on3 = take(t, third.s3, 3 * per);
  REQUIRE(held_by(s1) == 1);
  REQUIRE(held_by(third.s3) == 3);
  give(t, on1, s1);
  give(t, on3, third.s3);
  // Stream 2 misses twice: both segments come from stream 3, which then holds as many as
  // stream 1 (ties go in the order the caches came).
  std::vector<void*> on2 = take(t, s2, 2 * per);
  CHECK(a.stats().num_segments_moved == 2);
  CHECK(held_by(s2) == 2);
  CHECK(held_by(third.s3) == 1);
  CHECK(held_by(s1) == 1);
  // Its third miss: stream 1's, the first of the two that hold one each.
  std::vector<void*> more = take(t, s2, per);
  CHECK(held_by(s2) == 3);
  CHECK(held_by(s1) == 0);
  CHECK(held_by(third.s3) == 1);
  CHECK(a.snapshot().segments.size() == 4);  // taken over, never grown
  give(t, on2, s2);
  give(t, more, s2);
  third.end();
}

// A stream depot cannot see the lifetime of (a raw handle never registered) gives its
// whole free segment to another stream's miss only after the whole device's work is done:
// no event can be recorded on a handle that may be gone. memory_stats counts those moves
// apart (num_move_syncs), so a code can see what registering its streams would spare.
// A thread that runs the calls given to it one at a time, each to its end (its exception
// rethrown) before run() returns, then exits at finish(): "thread A" of a test's steps
// between its own.
class step_thread {
 public:
  step_thread() : t_{[this] { loop(); }} {}
  step_thread(const step_thread&) = delete;
  step_thread& operator=(const step_thread&) = delete;
  ~step_thread() { finish(); }
  void run(std::function<void()> f)
  {
    std::packaged_task<void()> task{std::move(f)};
    std::future<void> done = task.get_future();
    {
      const std::lock_guard g{mu_};
      next_ = std::move(task);
      given_ = true;
    }
    cv_.notify_all();
    done.get();
  }
  void finish()
  {
    {
      const std::lock_guard g{mu_};
      stop_ = true;
    }
    cv_.notify_all();
    if (t_.joinable()) t_.join();
  }
  [[nodiscard]] std::thread::id id() const noexcept { return t_.get_id(); }

 private:
  void loop()
  {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock l{mu_};
        cv_.wait(l, [&] { return given_ || stop_; });
        if (!given_) return;
        task = std::move(next_);
        given_ = false;
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::packaged_task<void()> next_;
  bool given_ = false, stop_ = false;
  std::thread t_;
};

// The per-thread default stream's handle (0x2: cudaStreamPerThread, hipStreamPerThread)
// names each calling thread's own stream, so each thread gets a cache of its own for it.
// A block thread A freed there reaches this thread's allocation on the handle only by a
// move ordered by finishing the device's work (this thread's stream cannot wait for A's);
// A's free named on the handle records its event from A; an event for A's use
// (record_stream) that this thread's free cannot record is replaced by finishing the
// device's work; as A exits, its cache closes with a fence that A records, which a later
// taker waits for. No backend call sees the allocator's key for such a stream.
// The same with the null stream where null_stream_per_thread says it is the thread's own
// (code built with per-thread default streams).
TEST_CASE("pool: each thread's per-thread default stream has a cache of its own")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::allocator_config cfg = quiet_config<depot::host>();
  depot::native_stream ptds = fake_stream(2);
  SUBCASE("its handle, cudaStreamPerThread") {}
  SUBCASE("the null stream, null_stream_per_thread:true") {
    cfg.null_stream_per_thread = true;
    ptds = fake_stream(0);
  }
  CAPTURE(ptds);
  depot::detail::allocator_core a = async_core(ev, cfg);
  const std::size_t n = 20 * MiB;
  const auto calls_by = [&](std::thread::id t) {
    const std::lock_guard g{ev->mu};
    const auto it = ev->per_thread_calls.find(t);
    return it == ev->per_thread_calls.end() ? 0 : it->second;
  };
  const std::thread::id me = std::this_thread::get_id();
  step_thread ta;
  const std::thread::id other = ta.id();
  // A allocates and frees on its per-thread stream; this thread allocates as much on its own.
  void* pa = nullptr;
  ta.run([&] {
    pa = a.allocate(n, ptds);
    a.deallocate(pa, ptds, true, 0);
  });
  REQUIRE(a.snapshot().segments.size() == 1);
  const std::uintptr_t a_stream = a.snapshot().segments[0].stream;
  CHECK(a_stream != 2);  // (a key: the handle names no one stream)
  void* pb = a.allocate(n, ptds);
  CHECK(pb == pa);
  CHECK(a.snapshot().segments.size() == 1);  // moved, not grown
  CHECK(a.snapshot().segments[0].stream != a_stream);
  CHECK(a.stats().num_segments_moved == 1);
  CHECK(a.stats().num_move_syncs == 1);
  CHECK(a.stats().num_move_events == 0);
  CHECK(ev->syncs == 1);
  CHECK(ev->recorded == 0);
  // A frees this thread's block named on the handle: its own stream, so A records the event.
  a.deallocate(pb, ptds, true, 0);
  void* q = a.allocate(n, ptds);  // (a hit: this thread's own stream)
  CHECK(q == pb);
  CHECK(ev->syncs == 1);
  ta.run([&] { a.deallocate(q, ptds, true, 0); });
  CHECK(ev->recorded == 1);
  CHECK(ev->last_record_stream == 2);
  CHECK(calls_by(other) == 1);
  CHECK(calls_by(me) == 0);
  void* r = a.allocate(n, ptds);  // q waits for A's event: not handed out
  CHECK(r != q);
  {
    const std::lock_guard g{ev->mu};
    ev->open.clear();  // A's work done
  }
  a.deallocate(r, ptds, true, 0);
  // A uses this thread's block (record_stream on its own stream); this thread's free cannot
  // record on A's stream: the device's work is finished instead.
  void* u = a.allocate(n, ptds);
  ta.run([&] { a.record_stream(u, ptds); });
  const int syncs = ev->syncs, recorded = ev->recorded;
  a.deallocate(u, ptds, true, 0);
  CHECK(ev->syncs == syncs + 1);
  CHECK(ev->recorded == recorded);
  CHECK(calls_by(me) == 0);
  // A frees a 30 MiB block on its stream, uses one of this thread's (record_stream), and
  // exits: A waits for its stream's work (an event A records and waits for on the host)
  // and the block forgets A's stream; A's cache closes with a fence A records. This
  // thread's 30 MiB allocation takes the segment over and waits for the fence on its own
  // stream (no device synchronisation, no new segment).
  void* v = a.allocate(n, ptds);
  ta.run([&] {
    a.deallocate(a.allocate(30 * MiB, ptds), ptds, true, 0);
    a.record_stream(v, ptds);
  });
  const std::size_t segments = a.snapshot().segments.size();
  const int host_waits = ev->waits;
  ta.finish();
  CHECK(ev->recorded == recorded + 2);
  CHECK(ev->waits == host_waits + 1);
  CHECK(ev->last_record_stream == 2);
  CHECK(calls_by(other) == 3);
  a.deallocate(v, ptds, true, 0);  // (A's stream forgotten: no event, no synchronisation)
  CHECK(ev->recorded == recorded + 2);
  CHECK(ev->syncs == syncs + 1);
  const int waits = ev->stream_waits;
  void* big = a.allocate(30 * MiB, ptds);
  CHECK(a.snapshot().segments.size() == segments);
  CHECK(ev->stream_waits == waits + 1);
  CHECK(ev->waiting_stream == 2);
  CHECK(ev->syncs == syncs + 1);
  CHECK(calls_by(me) == 1);
  a.deallocate(big, ptds, true, 0);
  CHECK(ev->key_calls == 0);
  check_ends_empty(a);
}

// A thread that never allocates or frees but uses a block on its per-thread default stream
// (record_stream on the handle) closes that stream as it exits all the same: the block
// waits there for the stream's work (an event the thread records and the host waits for)
// and forgets it, so this thread's later free needs no event and no synchronisation (the
// exit hook is armed by record_stream's lookup, as by an allocation or a free; were it not,
// the key would stay listed and the free, unable to record on another thread's stream,
// would finish the device's work).
TEST_CASE("pool: a thread that only lists its per-thread stream on a block closes it as it exits")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto ptds = fake_stream(2);
  void* x = a.allocate(n, s1);
  const int recorded = ev->recorded, waits = ev->waits, syncs = ev->syncs;
  std::thread t{[&] { a.record_stream(x, ptds); }};
  t.join();
  CHECK(ev->recorded == recorded + 1);  // as the thread exited, on its own stream
  CHECK(ev->last_record_stream == 2);
  CHECK(ev->waits == waits + 1);
  a.deallocate(x, s1, true, 0);
  CHECK(ev->syncs == syncs);
  CHECK(ev->recorded == recorded + 1);
  CHECK(pending_in(a) == 0);
  void* y = a.allocate(n, s1);  // (free at once: x's block again)
  CHECK(y == x);
  a.deallocate(y, s1, true, 0);
  CHECK(ev->key_calls == 0);
  check_ends_empty(a);
}

// A capture on thread A's per-thread default stream whose pool this thread releases while
// A lives: a block of it still allocated then, freed later by A unnamed, is ordered on A's
// stream (an event A records), as a registered stream's is; where this thread frees it, it
// cannot record on A's stream, so the device's work is finished. Where A exited first, its
// stream's close left the pool's cache a fence, and a free from here needs neither. (Until
// finish_release asked for the fence, A's unnamed free was ordered on nothing: the block
// went to another stream while A's work might still use it.)
TEST_CASE("pool: a capture pool on a thread's per-thread stream, released by another thread, orders later frees")
{
  const std::size_t n = each_block_kind();
  int freer = 0;
  SUBCASE("freed unnamed by the capturing thread") {}
  SUBCASE("freed unnamed by the releasing thread") { freer = 1; }
  SUBCASE("freed by the releasing thread after the capturing one exited") { freer = 2; }
  CAPTURE(n);
  CAPTURE(freer);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto ptds = fake_stream(2);
  const auto s2 = fake_stream(0x2000);
  step_thread ta;
  std::uint64_t pool = 0;
  void* x = nullptr;
  ta.run([&] {
    pool = a.begin_capture(ptds, 0);
    {
      const std::lock_guard g{ev->mu};
      ev->capture = true;
    }
    x = a.allocate(n, ptds);
    {
      const std::lock_guard g{ev->mu};
      ev->capture = false;
    }
    a.end_capture(ptds);
  });
  if (freer == 2) ta.finish();  // A's stream closed: a fence A records
  const int recorded = ev->recorded, syncs = ev->syncs;
  a.release_capture_pool(pool);  // from this thread
  CHECK(ev->syncs == syncs + 1);  // (the device's work done: a replay may have used the pool)
  if (freer == 0) {
    ta.run([&] { a.deallocate(x, nullptr, false, 0); });
    CHECK(ev->recorded == recorded + 1);  // on A's stream, by A
    CHECK(ev->last_record_stream == 2);
    CHECK(ev->syncs == syncs + 1);
    CHECK(pending_in(a) == 1);
    void* y = a.allocate(n, s2);  // not x's bytes while A's work may use them
    CHECK(y != x);
    a.deallocate(y, s2, true, 0);
  } else if (freer == 1) {
    a.deallocate(x, nullptr, false, 0);
    CHECK(ev->recorded == recorded);  // (A's stream is not this thread's to record on)
    CHECK(ev->syncs == syncs + 2);    // the device's work finished instead
    CHECK(pending_in(a) == 0);
  } else {
    a.deallocate(x, nullptr, false, 0);
    CHECK(ev->syncs == syncs + 1);  // ordered by the fence, nothing more
    CHECK(pending_in(a) == 0);
  }
  CHECK(ev->key_calls == 0);
  CHECK(ev->forbidden == 0);
  {
    const std::lock_guard g{ev->mu};
    ev->open.clear();
  }
  check_ends_empty(a);
}

TEST_CASE("pool: a segment moved from a raw stream handle is counted as a device synchronisation")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);  // raw: never registered
  const auto s2 = fake_stream(0x2000);
  a.deallocate(a.allocate(n, s1), s1, true, 0);
  const int syncs = ev->syncs, recorded = ev->recorded;
  ev->idle = {0x1000};  // (never asked: a raw handle may name a destroyed stream)
  void* p = a.allocate(n, s2);  // s1's whole free segment moves to s2's cache
  const depot::memory_stats st = a.stats();
  CHECK(a.snapshot().segments.size() == 1);
  CHECK(st.num_segments_moved == 1);
  CHECK(st.num_move_syncs == 1);
  CHECK(st.num_move_events == 0);
  CHECK(ev->syncs == syncs + 1);
  CHECK(ev->recorded == recorded);
  CHECK(ev->stream_queries == 0);
  a.deallocate(p, s2, true, 0);
  a.reset_memory_stats();
  CHECK(a.stats().num_move_syncs == 0);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

// A block a capture allocated, still live when its pool was released (the pool's cache is
// then closed, its memory any stream's), freed after on the capture's stream (named, or
// unnamed: ordered on its allocation's stream), which is live: the free waits for that
// stream's work (an event), where it was free at once and another stream could take it
// while that work still ran (found by the stream-ordering fuzz with DEPOT_TEST_SEED=1).
TEST_CASE("pool: a released capture pool's block freed later on a live stream waits for that stream")
{
  const std::size_t n = each_block_kind();
  bool named = true;
  SUBCASE("freed on the capture's stream") {}
  SUBCASE("freed unnamed") { named = false; }
  CAPTURE(n);
  CAPTURE(named);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);  // the capture's, registered: known live
  const auto s2 = fake_stream(0x2000);
  const depot::device_id dev = ev->streams;
  depot::stream_registry::opened(dev, s1);
  const std::uint64_t pool = a.begin_capture(s1, 0);
  ev->capture = true;
  void* x = a.allocate(n, s1);
  ev->capture = false;
  a.end_capture(s1);
  a.release_capture_pool(pool);  // the device's work done: x's pool memory is any stream's
  const int recorded = ev->recorded;
  if (named) {
    a.deallocate(x, s1, true, 0);
  } else {
    a.deallocate(x, nullptr, false, 0);
  }
  CHECK(ev->recorded == recorded + 1);  // an event on s1
  CHECK(ev->last_record_stream == 0x1000);
  CHECK(pending_in(a) == 1);
  void* y = a.allocate(n, s2);  // not x's bytes while s1's work may use them
  CHECK(y != x);
  ev->open.clear();
  a.deallocate(y, s2, true, 0);
  a.empty_cache();  // the event completed: x's block back, every segment released
  CHECK(pending_in(a) == 0);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
  depot::stream_registry::closing(dev, s1);
}

// An allocator destroyed during a capture: the process's count of captures under way on
// the backend drops, or every other allocator of the backend would refuse to release
// memory, query events or steal, for good (found by the fuzz: after a failed variant
// left a capture open, every later one saw a capture under way).
TEST_CASE("pool: an allocator destroyed during a graph capture no longer counts as capturing")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  auto other_ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core other = async_core(other_ev);
  {
    depot::detail::allocator_core a = async_core(ev);
    (void)a.begin_capture(fake_stream(0x1000), 0);
    void* p = other.allocate(4 * MiB, fake_stream(0x2000));
    other.deallocate(p, fake_stream(0x2000), true, 0);
    CHECK_THROWS_AS(other.empty_cache(), depot::invalid_argument);  // a capture is under way (a's)
  }
  other.empty_cache();  // a's capture went with it
  CHECK(other.stats().reserved_bytes.all.current == 0);
}

// A stream that blocks list (record_stream) destroyed during a graph capture, which forbids
// the host's wait for its work: a fence recorded on it before it goes takes its place, and
// the capture's end waits for the fence. Without that, the frees' events went on the dead
// handle (an error; or, once a new stream has the handle, an event on the wrong stream).
TEST_CASE("pool: a stream destroyed during a graph capture is ordered by a fence, and no event goes on its handle")
{
  const std::size_t n = each_block_kind();
  bool reopened = false;  // a new stream gets the handle during the capture
  SUBCASE("the handle stays dead") {}
  SUBCASE("a new stream gets the handle") { reopened = true; }
  CAPTURE(n);
  CAPTURE(reopened);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);  // the blocks' stream
  const auto s2 = fake_stream(0x2000);  // uses them; destroyed during the capture
  const auto s3 = fake_stream(0x3000);  // the capture's
  const depot::device_id dev = ev->streams;
  depot::stream_registry::opened(dev, s2);
  void* x = a.allocate(n, s1);   // live through the capture
  void* y = a.allocate(n, s1);   // freed during the capture before s2 goes: deferred for s2
  void* z = a.allocate(n, s1);   // freed during the capture after s2 went
  for (void* p : {x, y, z}) a.record_stream(p, s2);
  const std::uint64_t pool = a.begin_capture(s3, 0);
  ev->capture = true;
  a.deallocate(y, s1, true, 0);
  CHECK(pending_in(a) == 1);
  const int recorded = ev->recorded;
  depot::stream_registry::closing(dev, s2);
  ev->dead.insert(0x2000);
  CHECK(ev->forbidden == 0);                 // no wait, no query
  CHECK(ev->recorded == recorded + 1);       // the fence
  CHECK(ev->last_record_stream == 0x2000);
  const std::uintptr_t fence = ev->next;
  if (reopened) {
    depot::stream_registry::opened(dev, s2);
    ev->dead.erase(0x2000);
    a.record_stream(x, s2);  // the new stream's use: listed by its handle
  }
  a.deallocate(z, s1, true, 0);
  CHECK(pending_in(a) == 2);
  CHECK(ev->recorded == recorded + 1);
  CHECK(ev->forbidden == 0);
  ev->capture = false;
  const int waits = ev->waits;
  a.end_capture(s3);
  // The end waited for the fence once; y and z are free again, no event recorded for them.
  CHECK(ev->waits == waits + 1);
  CHECK(ev->open.count(fence) == 0);
  CHECK(ev->recorded == recorded + 1);
  CHECK(pending_in(a) == 0);
  void* y2 = a.allocate(n, s1);
  void* z2 = a.allocate(n, s1);
  CHECK(((y2 == y && z2 == z) || (y2 == z && z2 == y)));
  // x's free: an event on the new stream if one used x, none for the destroyed one.
  a.deallocate(x, s1, true, 0);
  CHECK(ev->recorded == recorded + 1 + (reopened ? 1 : 0));
  CHECK(pending_in(a) == (reopened ? 1 : 0));
  CHECK(ev->dead_records == 0);
  if (reopened) {
    CHECK(ev->last_record_stream == 0x2000);
    depot::stream_registry::closing(dev, s2);  // (x pending on it: waited for, outside a capture)
  }
  ev->open.clear();
  a.deallocate(y2, s1, true, 0);
  a.deallocate(z2, s1, true, 0);
  a.release_capture_pool(pool);
  a.empty_cache();
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(pending_in(a) == 0);
  check_invariants(st, a.snapshot());
}

// More streams destroyed during one capture than the capture's end takes at a time
// (after_captures waits for their fences in batches, then one pass over the caches): each
// fence is waited for once, and every block whose other stream went is free again.
TEST_CASE("pool: forty streams destroyed during one graph capture are each waited for once")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);  // the blocks' stream
  const auto s3 = fake_stream(0x3000);  // the capture's
  const depot::device_id dev = ev->streams;
  constexpr int k_streams = 40;
  std::vector<void*> blocks;
  for (int i = 0; i < k_streams; ++i) {
    const std::uintptr_t h = 0x10000 + 0x100 * static_cast<std::uintptr_t>(i);
    depot::stream_registry::opened(dev, fake_stream(h));
    blocks.push_back(a.allocate(n, s1));
    a.record_stream(blocks.back(), fake_stream(h));
  }
  const std::uint64_t pool = a.begin_capture(s3, 0);
  ev->capture = true;
  const int recorded = ev->recorded;
  for (int i = 0; i < k_streams; ++i) {
    const std::uintptr_t h = 0x10000 + 0x100 * static_cast<std::uintptr_t>(i);
    if (i % 2 == 0) a.deallocate(blocks[static_cast<std::size_t>(i)], s1, true, 0);  // before its stream goes
    depot::stream_registry::closing(dev, fake_stream(h));
    ev->dead.insert(h);
    if (i % 2 == 1) a.deallocate(blocks[static_cast<std::size_t>(i)], s1, true, 0);  // after
  }
  CHECK(ev->forbidden == 0);
  CHECK(ev->recorded == recorded + k_streams);  // the fences
  CHECK(pending_in(a) == k_streams);
  ev->capture = false;
  const int waits = ev->waits;
  a.end_capture(s3);
  CHECK(ev->waits == waits + k_streams);
  CHECK(ev->recorded == recorded + k_streams);  // no event on a dead stream
  CHECK(ev->dead_records == 0);
  CHECK(pending_in(a) == 0);
  CHECK(ev->open.empty());  // every fence destroyed
  a.release_capture_pool(pool);
  a.empty_cache();
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
}

TEST_CASE("pool: a graph capture gets a private pool, and no call that would invalidate it (asynchronous backend)")
{
  // The capture's rules, on the CPU: while a capture is under way nothing may be queried,
  // waited for, synchronised or freed upstream (manual_event_upstream counts each in
  // `forbidden`), events of frees wait until the capture ends, and what the capture
  // allocated stays its pool's, not its stream's.
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto s2 = fake_stream(0x2000);
  const auto s3 = fake_stream(0x3000);
  auto pending_blocks = [&] { return pending_in(a); };
  auto pool_of = [&](void* p) { return capture_pool_of(a.snapshot(), p); };
  auto pool_bytes = [&](std::uint64_t pool) {
    std::size_t k = 0;
    for (const auto& seg : a.snapshot().segments) k += seg.capture_pool == pool ? seg.size : 0;
    return k;
  };

  // Before: x's block is free in s1's cache, an event of s2 is pending on another block,
  // and a whole free segment waits in s4's cache (a live stream's: taken before growing).
  void* x = a.allocate(n, s1);
  void* before = a.allocate(n, s1);
  a.record_stream(before, s2);
  a.deallocate(before, s1, true, 0);
  a.deallocate(x, s1, true, 0);
  REQUIRE(pending_blocks() == 1);
  // And s5's cache has a pending free (an event of s1), which no allocation there may query.
  const auto s5 = fake_stream(0x6000);
  void* b5 = a.allocate(n, s5);
  a.record_stream(b5, s1);
  a.deallocate(b5, s5, true, 0);
  const auto s4 = fake_stream(0x5000);
  void* spare = a.allocate(n, s4);
  a.deallocate(spare, s4, true, 0);
  REQUIRE(pending_blocks() == 2);
  const int recorded = ev->recorded;

  const std::uint64_t pool = a.begin_capture(s1, 0);
  CHECK(pool != 0);
  ev->capture = true;
  CHECK(a.capture_pools() == std::vector<std::pair<std::uint64_t, bool>>{{pool, true}});
  // The capture's allocations come from its pool, not from s1's cache.
  void* y = a.allocate(n, s1);
  CHECK(y != x);
  CHECK(pool_of(y) == pool);
  CHECK(pool_of(x) == 0);
  std::memset(y, 1, n);
  // A free that s2's work must wait for: no event now, the block pending until the end.
  a.record_stream(y, s2);
  a.deallocate(y, s1, true, 0);
  CHECK(ev->recorded == recorded);
  CHECK(pending_blocks() == 3);
  void* z = a.allocate(n, s1);
  CHECK(z != y);
  CHECK(z != x);
  // Freed on the capture's stream: reused by the capture at once (stream order holds).
  a.deallocate(z, s1, true, 0);
  void* w = a.allocate(n, s1);
  CHECK(w == z);
  // Another stream does not take s4's free segment (that needs an event): it grows.
  void* q = a.allocate(n, s2);
  CHECK(q != spare);
  void* p5 = a.allocate(n, s5);
  CHECK(p5 != b5);
  // Nothing may be released: empty_cache refuses, changing nothing.
  const depot::memory_stats st0 = a.stats();
  CHECK_THROWS_WITH_AS(a.empty_cache(), doctest::Contains("during a graph capture"), depot::invalid_argument);
  CHECK(a.stats().reserved_bytes.all.current == st0.reserved_bytes.all.current);
  // The upstream refuses: out_of_memory at once, the cache untouched, the reason given.
  ev->fail_allocations = true;
  CHECK_THROWS_WITH_AS((void)a.allocate(64 * MiB, s1), doctest::Contains("a graph capture is under way"),
                       depot::out_of_memory);
  ev->fail_allocations = false;
  CHECK(a.stats().num_ooms == st0.num_ooms + 1);
  // Bad calls change nothing.
  CHECK_THROWS_WITH_AS((void)a.begin_capture(s1, 0), doctest::Contains("capturing into capture pool"),
                       depot::invalid_argument);
  CHECK_THROWS_WITH_AS((void)a.begin_capture(s2, pool), doctest::Contains("one capture per pool"),
                       depot::invalid_argument);
  CHECK_THROWS_WITH_AS((void)a.begin_capture(s2, pool + 100), doctest::Contains("not a pool of this allocator"),
                       depot::invalid_argument);
  CHECK_THROWS_WITH_AS(a.end_capture(s2), doctest::Contains("not capturing here"), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(a.release_capture_pool(pool), doctest::Contains("end_capture first"),
                       depot::invalid_argument);
  check_invariants(a.stats(), a.snapshot());
  CHECK(ev->forbidden == 0);
  CHECK(ev->captured_records == 0);
  ev->capture = false;

  a.end_capture(s1);
  CHECK(a.capture_pools() == std::vector<std::pair<std::uint64_t, bool>>{{pool, false}});
  CHECK(ev->recorded == recorded + 1);  // y's event, deferred until now
  CHECK(pending_blocks() == 3);
  a.deallocate(p5, s5, true, 0);
  // s1 allocates from its own cache again; the capture's blocks stay its pool's.
  void* v = a.allocate(n, s1);
  CHECK(v == x);
  a.deallocate(w, s1, true, 0);  // a graph's block freed after its capture: back to the pool
  void* u = a.allocate(n, s1);
  CHECK(u != w);
  CHECK(pool_of(u) == 0);
  // Nothing returns a held pool's memory: not empty_cache, not the release threshold.
  const std::size_t held = pool_bytes(pool);
  CHECK(held > 0);
  a.empty_cache();
  CHECK(pool_bytes(pool) == held);
  CHECK(pool_of(w) == pool);
  // A second capture into the same pool (another graph sharing its memory) reuses it.
  CHECK(a.begin_capture(s3, pool) == pool);
  void* t = a.allocate(n, s3);
  CHECK(pool_of(t) == pool);  // (w's block, or y's: u's steal from raw-handle s4 synchronised the device)
  CHECK((t == w || t == y));
  a.end_capture(s3);
  check_invariants(a.stats(), a.snapshot());

  // Two uses of the pool: the first release keeps it, the last waits for the device and
  // frees its memory for any stream.
  const int syncs = ev->syncs;
  a.release_capture_pool(pool);
  CHECK(a.capture_pools().size() == 1);
  CHECK(ev->syncs == syncs);
  a.release_capture_pool(pool);
  CHECK(a.capture_pools().empty());
  CHECK(ev->syncs == syncs + 1);
  CHECK_THROWS_WITH_AS(a.release_capture_pool(pool), doctest::Contains("not a pool of this allocator"),
                       depot::invalid_argument);
  CHECK_THROWS_WITH_AS((void)a.begin_capture(s1, pool), doctest::Contains("not a pool of this allocator"),
                       depot::invalid_argument);
  a.deallocate(t, s3, true, 0);
  ev->open.clear();  // every event completes
  a.deallocate(u, s1, true, 0);
  a.deallocate(v, s1, true, 0);
  a.deallocate(q, s2, true, 0);
  // The released pool's segments belong to no pool now: empty_cache returns them too.
  CHECK(pool_bytes(pool) == 0);
  CHECK(pool_of(w) == 0);
  a.empty_cache();
  CHECK(pending_blocks() == 0);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
}

TEST_CASE("pool: a capture pool released during another capture waits for it to end (asynchronous backend)")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto s2 = fake_stream(0x2000);
  const std::uint64_t p1 = a.begin_capture(s1, 0);
  void* x = a.allocate(MiB * 8, s1);
  a.end_capture(s1);
  const std::uint64_t p2 = a.begin_capture(s2, 0);
  CHECK(p2 != p1);
  ev->capture = true;
  a.release_capture_pool(p1);  // no synchronisation now: due when s2's capture ends
  CHECK(ev->forbidden == 0);
  CHECK_THROWS_AS((void)a.begin_capture(s1, p1), depot::invalid_argument);  // on its way out
  ev->capture = false;
  const int syncs = ev->syncs;
  a.end_capture(s2);
  CHECK(ev->syncs == syncs + 1);
  CHECK(a.capture_pools() == std::vector<std::pair<std::uint64_t, bool>>{{p2, false}});
  a.deallocate(x, s1, true, 0);  // a block of the released pool: found, freed
  a.release_capture_pool(p2);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  check_invariants(a.stats(), a.snapshot());
}

TEST_CASE("pool: a capture pool's frees that waited for events return to it before its next capture")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto s2 = fake_stream(0x2000);
  const std::uint64_t pool = a.begin_capture(s1, 0);
  void* x = a.allocate(n, s1);
  a.record_stream(x, s2);
  a.deallocate(x, s1, true, 0);
  a.end_capture(s1);
  CHECK(pending_in(a) == 1);  // its event recorded at the end
  // The event is still open: the next capture finds the block pending.
  CHECK(a.begin_capture(s1, pool) == pool);
  CHECK(pending_in(a) == 1);
  void* y = a.allocate(n, s1);
  CHECK(y != x);
  a.deallocate(y, s1, true, 0);
  a.end_capture(s1);
  // Completed: the capture after takes the block back before it begins.
  ev->open.clear();
  const int forbidden = ev->forbidden;
  CHECK(a.begin_capture(s1, pool) == pool);
  CHECK(pending_in(a) == 0);
  CHECK(ev->forbidden == forbidden);
  void* z = a.allocate(n, s1);
  CHECK((z == x || z == y));  // (y: freed last, kept for reuse at its size)
  a.deallocate(z, s1, true, 0);
  a.end_capture(s1);
  a.release_capture_pool(pool);
  a.release_capture_pool(pool);
  a.release_capture_pool(pool);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  check_invariants(a.stats(), a.snapshot());
}

TEST_CASE("pool: a capture in one allocator holds back every allocator of its backend (asynchronous backend)")
{
  // CUDA's global capture mode is process-wide: a capture that one allocator (a device's)
  // was told of must stop the others' unsafe calls too (the pinned host pool, another
  // device's allocator), and their frees' events wait for its end as well.
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  depot::detail::allocator_core b = async_core(ev);
  const auto s1 = fake_stream(0x1000);
  const auto s2 = fake_stream(0x2000);
  // b: a free pending on an event of s2.
  void* p = b.allocate(MiB, s1);
  b.record_stream(p, s2);
  b.deallocate(p, s1, true, 0);
  REQUIRE(pending_in(b) == 1);
  const int recorded = ev->recorded;

  const std::uint64_t pool = a.begin_capture(s1, 0);
  ev->capture = true;
  void* q = b.allocate(MiB, s1);  // b's pending free: not queried
  b.record_stream(q, s2);
  b.deallocate(q, s1, true, 0);  // its event: not recorded now
  CHECK(pending_in(b) == 2);
  CHECK_THROWS_AS(b.empty_cache(), depot::invalid_argument);
  CHECK(ev->forbidden == 0);
  CHECK(ev->recorded == recorded);
  ev->capture = false;
  a.end_capture(s1);
  CHECK(ev->recorded == recorded + 1);  // b's deferred event, recorded at a's end
  a.release_capture_pool(pool);
  ev->open.clear();
  b.empty_cache();
  CHECK(pending_in(b) == 0);
  CHECK(b.stats().reserved_bytes.all.current == 0);
  check_invariants(b.stats(), b.snapshot());
}

TEST_CASE("pool: release_threshold never returns a held capture pool's memory")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::allocator_config cfg = quiet_config<depot::host>();
  cfg.release_threshold = 0;  // return every whole free segment at once
  depot::detail::allocator_core a = async_core(ev, cfg);
  const auto s1 = fake_stream(0x1000);
  for (std::size_t n : {4 * KiB, 256 * KiB, 8 * MiB}) {
    CAPTURE(n);
    // A stream's block: its segment goes back upstream at the free.
    void* x = a.allocate(n, s1);
    const int frees = ev->upstream_frees;
    a.deallocate(x, s1, true, 0);
    CHECK(ev->upstream_frees == frees + 1);
    CHECK(a.stats().reserved_bytes.all.current == 0);
    // A capture's block: its segment stays the pool's after the free, until the release.
    const std::uint64_t pool = a.begin_capture(s1, 0);
    void* y = a.allocate(n, s1);
    a.end_capture(s1);
    a.deallocate(y, s1, true, 0);
    CHECK(ev->upstream_frees == frees + 1);
    CHECK(a.stats().reserved_bytes.all.current > 0);
    a.release_capture_pool(pool);
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
    check_invariants(a.stats(), a.snapshot());
  }
}

TEST_CASE("pool: captures that begin and end while other threads allocate and free (asynchronous backend)")
{
  // Three threads allocate, record other streams and free on their own streams; a fourth
  // captures again and again. Between begin_capture's return and end_capture nothing may
  // query, wait, synchronise or free upstream (counted in `forbidden`), whatever the
  // other threads do; at the end every figure agrees with a snapshot.
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::allocator_config cfg = quiet_config<depot::host>();
  cfg.release_threshold = 8 * MiB;  // frees return segments too, outside captures
  depot::detail::allocator_core a = async_core(ev, cfg);
  const std::uint64_t seed = depot::test::seed("pool: captures while other threads allocate", 20261128);
  constexpr int k_workers = 3;
  std::atomic<bool> stop{false};
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < k_workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng{seed + static_cast<std::uint64_t>(w)};
      const auto own = reinterpret_cast<depot::native_stream>(std::uintptr_t{0x1000} * (w + 1));
      const auto other = reinterpret_cast<depot::native_stream>(std::uintptr_t{0x9000} + w);
      std::vector<void*> live;
      for (int i = 0; !stop.load() || i < 2000; ++i) {
        if (live.size() < 16 && (live.empty() || rng() % 3 != 0)) {
          const std::size_t sizes[] = {4 * KiB, 200 * KiB, 3 * MiB, 24 * MiB};
          void* p = a.allocate(sizes[rng() % 4], own);
          if (rng() % 4 == 0) a.record_stream(p, other);
          live.push_back(p);
        } else {
          const std::size_t k = rng() % live.size();
          a.deallocate(live[k], own, true, 0);
          live[k] = live.back();
          live.pop_back();
        }
        if (i % 97 == 0) {
          const std::lock_guard g{ev->mu};
          ev->open.clear();  // every event so far completes
        }
        if (i % 500 == 0 && i > 0) {
          try {
            a.empty_cache();
          } catch (const depot::invalid_argument&) {  // a capture is under way: refused
          }
        }
      }
      for (void* p : live) a.deallocate(p, own, true, 0);
      finished.fetch_add(1);
    });
  }
  const auto cs = fake_stream(0xC000);
  int forbidden = 0;
  for (int round = 0; round < 60; ++round) {
    const std::uint64_t pool = a.begin_capture(cs, 0);
    {
      const std::lock_guard g{ev->mu};
      ev->capture = true;
    }
    void* t = a.allocate(MiB, cs);
    a.record_stream(t, fake_stream(0xD000));
    a.deallocate(t, cs, true, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    {
      const std::lock_guard g{ev->mu};
      ev->capture = false;
      forbidden += ev->forbidden;
      ev->forbidden = 0;
    }
    a.end_capture(cs);
    a.release_capture_pool(pool);
  }
  stop.store(true);
  depot::test::wait_or_abort(finished, k_workers, "captures while other threads allocate");
  for (auto& t : threads) t.join();
  CHECK(forbidden == 0);
  CHECK(a.capture_pools().empty());
  {
    const std::lock_guard g{ev->mu};
    ev->open.clear();
  }
  a.empty_cache();
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
}

TEST_CASE_TEMPLATE("pool: a captured graph replays its work in its own memory", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s;
  depot::captured_graph<D> g;
  // Calls out of order are refused, changing nothing.
  CHECK_THROWS_WITH_AS(g.replay(s), doctest::Contains("not captured"), depot::invalid_argument);
  CHECK_THROWS_WITH_AS(g.capture_end(), doctest::Contains("without a capture"), depot::invalid_argument);
  CHECK(g.pool() == 0);
  if constexpr (std::is_same_v<D, depot::host>) {
    // No graphs on the host: refused, and the allocator left as it was.
    CHECK_THROWS_WITH_AS(g.capture_begin(a, s), doctest::Contains("no graphs"), depot::error);
    CHECK(a.capture_pools().empty());
    CHECK_FALSE(g.captured());
    CHECK_FALSE(depot::runtime<D>::stream_capturing(s.native()));
  } else {
    constexpr std::size_t n = 3 * MiB;
    auto* out = static_cast<unsigned char*>(a.allocate(n, s));  // the graph's output, kept by the caller
    void* eager = a.allocate(n, s);
    a.deallocate(eager, s);  // free in s's cache before the capture
    {  // A capture given up (reset while capturing): the stream and the pool are let go.
      depot::captured_graph<D> dropped;
      dropped.capture_begin(a, s);
      CHECK_THROWS_WITH_AS(dropped.capture_begin(a, s), doctest::Contains("holds a capture already"),
                           depot::invalid_argument);
      void* t = a.allocate(n, s);
      a.deallocate(t, s);
      CHECK(a.capture_pools().size() == 1);
      depot::captured_graph<D> moved = std::move(dropped);
      CHECK(dropped.pool() == 0);
      moved.reset();
      CHECK_FALSE(depot::runtime<D>::stream_capturing(s.native()));
      CHECK(a.capture_pools().empty());
    }
    depot::stream<D> side;
    // A pinned host pool the capture is not told of, with a free waiting for an event of s.
    depot::caching_allocator<D> pinned{std::make_unique<depot::device_upstream<D>>(0, true), quiet_config<D>()};
    void* h0 = pinned.allocate(64 * KiB, side);
    pinned.record_stream(h0, s);
    pinned.deallocate(h0, side);
    g.capture_begin(a, s);
    CHECK(depot::runtime<D>::stream_capturing(s.native()));
    // Inside: a temporary (the pool's first allocation, a cudaMalloc during a global-mode
    // capture), filled and copied to the output, freed; a second one reuses it.
    void* tmp = a.allocate(n, s);
    CHECK(tmp != eager);
    CHECK(capture_pool_of(a.snapshot(), tmp) == g.pool());
    depot::runtime<D>::set_async(tmp, 0x5A, n, s.native());
    depot::runtime<D>::copy_async(out, tmp, n, s.native());
    a.deallocate(tmp, s);
    void* tmp2 = a.allocate(n, s);
    CHECK(tmp2 == tmp);
    depot::runtime<D>::set_async(tmp2, 0x11, n / 2, s.native());
    depot::runtime<D>::copy_async(out, tmp2, n / 3, s.native());
    a.record_stream(tmp2, side);  // a free another stream must wait for: its event deferred
    a.deallocate(tmp2, s);
    // Meanwhile another stream allocates and frees (no query, no steal of s's segment).
    void* other = a.allocate(n, side);
    CHECK(other != eager);
    a.deallocate(other, side);
    // And the pinned pool: its pending free is not queried, a free it must order is
    // deferred, and a new segment comes from cudaMallocHost in relaxed mode.
    void* h1 = pinned.allocate(64 * KiB, side);
    CHECK(h1 != h0);
    pinned.record_stream(h1, s);
    pinned.deallocate(h1, side);
    void* h2 = pinned.allocate(8 * MiB, side);
    pinned.deallocate(h2, side);
    g.capture_end();
    CHECK(g.captured());
    CHECK_FALSE(depot::runtime<D>::stream_capturing(s.native()));
    // Nothing ran while captured: replays do the work, each from scratch.
    depot::runtime<D>::set_async(out, 0, n, s.native());
    std::mt19937_64 rng{depot::test::seed("captured graph replays", 7)};
    for (int r = 0; r < 3; ++r) {
      g.replay(s);
      // s's own allocations after the capture never get the graph's memory.
      void* after = a.allocate(n, s);
      CHECK(after != tmp);
      CHECK(capture_pool_of(a.snapshot(), after) == 0);
      depot::runtime<D>::set_async(after, 0xEE, n, s.native());
      a.deallocate(after, s);
      g.replay(s);
      depot::runtime<D>::synchronize_stream(s.native());
      CHECK(check_bytes<D>(out, n / 3, 0x11, rng));
      CHECK(check_bytes<D>(out + n / 3, n / 2 - n / 3, 0x5A, rng));
      CHECK(check_bytes<D>(out + n / 2, n - n / 2, 0x5A, rng));
    }
    // A second graph sharing the pool, then both given back.
    depot::captured_graph<D> g2;
    g2.capture_begin(a, s, g.pool());
    void* tmp3 = a.allocate(n, s);
    // The pool's memory, not the stream's (tmp's block once the side stream's event for
    // tmp2 completed: begin_capture takes it back).
    CHECK(capture_pool_of(a.snapshot(), tmp3) == g.pool());
    depot::runtime<D>::set_async(tmp3, 0x22, n, s.native());
    a.deallocate(tmp3, s);
    g2.capture_end();
    g2.replay(s);
    depot::captured_graph<D> g1 = std::move(g);  // the graph moves with its pool
    CHECK_FALSE(g.captured());
    g1.replay(s);
    g1.reset();
    CHECK(a.capture_pools().size() == 1);
    g2.reset();
    CHECK(a.capture_pools().empty());
    a.deallocate(out, s);
    depot::runtime<D>::synchronize(0);
    pinned.empty_cache();
    CHECK(pinned.stats().reserved_bytes.all.current == 0);
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
    check_invariants(a);
  }
}

// An allocator over manual events whose step() checks it after each operation: the
// statistics' invariants against a snapshot, and every peak against the figures seen so far.
struct peak_checked_core {
  std::shared_ptr<manual_event_upstream::state> ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  peak_tracker peaks;
  std::array<depot::native_stream, 3> streams{fake_stream(0x1000), fake_stream(0x2000), fake_stream(0x3000)};
  depot::memory_stats step()
  {
    const depot::memory_stats st = a.stats();
    check_invariants(st, a.snapshot());
    peaks.check(st);
    return st;
  }
};

TEST_CASE("pool: empty_cache counts its peaks once, at its end (asynchronous backend)")
{
  // empty_cache() returns every stream's pending blocks, one cache after another: s1's
  // returned block is a split piece (inactive split bytes grow by 8 MiB), then s2's makes
  // its segment whole again (they shrink by 12 MiB, and the segment goes). Every peak is
  // the figure before the call or the one it left, never one between two caches (until
  // 2026-12-02 the inactive split peak was 24 MiB, a figure no operation left; the
  // batched-statistics test found it with DEPOT_TEST_SEED=2).
  peak_checked_core t;
  depot::detail::allocator_core& a = t.a;
  const auto step = [&] { return t.step(); };
  const auto [s1, s2, s3] = t.streams;
  void* a1 = a.allocate(8 * MiB, s1);  // s1's cache (first in the registry): a 20 MiB segment
  step();
  void* a2 = a.allocate(8 * MiB, s1);  // the same segment: 4 MiB left, a split piece
  step();
  void* b1 = a.allocate(8 * MiB, s2);  // s2's own 20 MiB segment: 12 MiB left
  step();
  a.record_stream(a1, s3);
  a.deallocate(a1, s1, true, 0);  // pending on s3
  step();
  a.record_stream(b1, s3);
  a.deallocate(b1, s2, true, 0);  // pending on s3
  depot::memory_stats st = step();
  CHECK(st.inactive_split_bytes.all.current == static_cast<std::int64_t>(16 * MiB));
  t.ev->open.clear();  // s3's work done
  a.empty_cache();
  st = step();
  CHECK(st.inactive_split_bytes.all.current == static_cast<std::int64_t>(12 * MiB));  // a1's 8 + a2's 4
  CHECK(st.inactive_split_bytes.all.peak == static_cast<std::int64_t>(16 * MiB));
  CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(20 * MiB));
  a.deallocate(a2, s1, true, 0);
  step();
  a.empty_cache();
  CHECK(step().reserved_bytes.all.current == 0);
}

TEST_CASE("pool: one operation that changes both pools counts its peaks once (asynchronous backend)")
{
  // An allocation that first returns a pending large block to the cache (the large pool's
  // inactive split bytes grow) and then takes a split small block (the small pool's
  // shrink): the "all" peak is the sum after the operation, not a mix of before and after.
  peak_checked_core t;
  depot::detail::allocator_core& a = t.a;
  const auto step = [&] { return t.step(); };
  const auto [s1, s2, s3] = t.streams;  // (s3 unused)
  void* l1 = a.allocate(8 * MiB, s1);
  step();
  void* l2 = a.allocate(8 * MiB, s1);  // same 20 MiB segment: l1 freed alone is a split block
  step();
  void* d1 = a.allocate(4 * KiB, s1);
  step();
  void* d2 = a.allocate(4 * KiB, s1);
  step();
  a.deallocate(d1, s1, true, 0);  // a 4 KiB split free block in the small pool
  depot::memory_stats st = step();
  const std::int64_t small_split = st.inactive_split_bytes.small.current;
  CHECK(small_split > 0);
  a.record_stream(l1, s2);
  a.deallocate(l1, s1, true, 0);  // pending on s2
  step();
  t.ev->open.clear();
  void* d3 = a.allocate(4 * KiB, s1);  // releases l1 (large split +8 MiB), takes d1's block
  CHECK(d3 == d1);
  st = step();
  CHECK(st.inactive_split_bytes.small.current == small_split - static_cast<std::int64_t>(4 * KiB));
  CHECK(st.inactive_split_bytes.all.peak == st.inactive_split_bytes.all.current);
  for (void* p : {l2, d2, d3}) {
    a.deallocate(p, s1, true, 0);
    step();
  }
  a.empty_cache();
  st = step();
  CHECK(st.reserved_bytes.all.current == 0);
}

// Every figure of two statistics, peaks included, equal.
void check_same_stats(const depot::memory_stats& a, const depot::memory_stats& b)
{
  const std::pair<const char*, depot::stat_array depot::memory_stats::*> arrays[] = {
      {"allocated", &depot::memory_stats::allocated_bytes},
      {"requested", &depot::memory_stats::requested_bytes},
      {"reserved", &depot::memory_stats::reserved_bytes},
      {"cached", &depot::memory_stats::cached_bytes},
      {"active", &depot::memory_stats::active_bytes},
      {"inactive_split", &depot::memory_stats::inactive_split_bytes},
      {"num_allocations", &depot::memory_stats::num_allocations},
      {"num_segments", &depot::memory_stats::num_segments}};
  for (const auto& [name, member] : arrays) {
    for (const auto& [pool, cell] : {std::pair{"all", &depot::stat_array::all},
                                     std::pair{"large", &depot::stat_array::large},
                                     std::pair{"small", &depot::stat_array::small}}) {
      const depot::stat& x = a.*member.*cell;
      const depot::stat& y = b.*member.*cell;
      const std::string where = std::string{name} + "." + pool;  // one string: doctest printed the two pointers
      INFO(where);
      CHECK(x.current == y.current);
      CHECK(x.peak == y.peak);
      CHECK(x.allocated == y.allocated);
      CHECK(x.freed == y.freed);
    }
  }
  CHECK(a.num_cache_hits == b.num_cache_hits);
  CHECK(a.num_cache_misses == b.num_cache_misses);
  CHECK(a.largest_free_block == b.largest_free_block);
}

namespace {

// Fake device memory (never touched) from a simulated upstream; a test's upstream
// derives from it and changes what it needs.
class simulated_forwarder : public depot::upstream_resource {
 public:
  void* allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* p, std::size_t bytes) noexcept override { inner_.deallocate(p, bytes); }
  depot::memory_info memory() override { return inner_.memory(); }
  depot::device_id device() const noexcept override { return inner_.device(); }
  depot::native_event record_event(depot::native_stream s) override { return inner_.record_event(s); }
  bool event_done(depot::native_event e) override { return inner_.event_done(e); }
  bool stream_done(depot::native_stream s) override { return inner_.stream_done(s); }
  void wait_event(depot::native_event e) override { inner_.wait_event(e); }
  void stream_wait(depot::native_stream s, depot::native_event e) override { inner_.stream_wait(s, e); }
  void destroy_event(depot::native_event e) noexcept override { inner_.destroy_event(e); }
  void synchronize_device() override { inner_.synchronize_device(); }
  [[nodiscard]] std::size_t bad_frees() const { return inner_.current_usage().bad_frees; }

 protected:
  depot::simulated_upstream inner_{std::size_t{1} << 40, {depot::device_kind::cuda, 0}, 512};
};

// Segments that start at any 512-byte offset from the 2 MiB frames, a large segment's end
// and the next one's start often in one frame: a seeded gap (wasted address space) goes
// before each segment.
class scattered_upstream final : public simulated_forwarder {
 public:
  explicit scattered_upstream(std::uint64_t seed) : rng_{seed} {}
  void* allocate(std::size_t bytes) override
  {
    static constexpr std::size_t gaps[] = {512, 64 * KiB + 512, MiB + 1536, 2 * MiB - 512, 3 * MiB + 512};
    (void)inner_.allocate(gaps[rng_() % std::size(gaps)]);
    return inner_.allocate(bytes);
  }

 private:
  std::mt19937_64 rng_;
};

// Once armed, the next segment given back is handed to the next allocation of its size on
// another thread while the thread giving it back waits inside deallocate() until that
// allocation has it: the interleaving where a freed segment's addresses come back at once.
class handoff_upstream final : public simulated_forwarder {
 public:
  void arm() { armed_ = true; }
  void* allocate(std::size_t bytes) override
  {
    {
      std::lock_guard g{mu_};
      if (held_ != nullptr && held_bytes_ == bytes) {
        taken_ = true;
        cv_.notify_all();
        return std::exchange(held_, nullptr);
      }
    }
    return inner_.allocate(bytes);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override
  {
    if (!armed_.exchange(false)) {
      inner_.deallocate(p, bytes);
      return;
    }
    std::unique_lock g{mu_};
    held_ = p;  // (still allocated in inner_: its next owner frees it there)
    held_bytes_ = bytes;
    cv_.notify_all();
    cv_.wait(g, [this] { return taken_; });
  }
  // Waits until a segment is held for the taking.
  void wait_held()
  {
    std::unique_lock g{mu_};
    cv_.wait(g, [this] { return held_ != nullptr; });
  }

 private:
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  void* held_ = nullptr;
  std::size_t held_bytes_ = 0;
  bool taken_ = false;
};

}  // namespace

TEST_CASE("pool: segments at any offset from the 2 MiB frames: every free finds its block")
{
  // 6 000 seeded operations over all three pools (1 B - 64 KiB dense, to 1 MiB linked small,
  // to 70 MiB large) on two streams, segments placed at odd offsets and released now and
  // then; interior and neighbouring pointers, double frees and wrong sizes refused;
  // invariants and the directory of segments every 50 operations.
  const auto seed = depot::test::seed("pool scattered segments", 11);
  std::mt19937_64 rng{seed};
  auto up = std::make_unique<scattered_upstream>(seed);
  const scattered_upstream& upstream = *up;
  depot::allocator_config cfg = quiet_config<depot::host>();
  depot::detail::allocator_core a{std::move(up), cfg, /*asynchronous=*/false};
  const depot::native_stream streams[] = {reinterpret_cast<depot::native_stream>(std::uintptr_t{1} << 12),
                                          reinterpret_cast<depot::native_stream>(std::uintptr_t{2} << 12)};
  struct live_block {
    void* p;
    std::size_t bytes;
    depot::native_stream stream;
  };
  std::vector<live_block> live;
  for (int op = 0; op < 6000; ++op) {
    CAPTURE(op);
    if (live.empty() || rng() % 100 < 55) {
      const std::size_t limits[] = {64 * KiB, MiB, 70 * MiB};
      const std::size_t bytes = 1 + rng() % limits[rng() % 3];
      const depot::native_stream s = streams[rng() % 2];
      live.push_back({a.allocate(bytes, s), bytes, s});
    } else {
      const std::size_t k = rng() % live.size();
      const live_block b = live[k];
      auto* c = static_cast<char*>(b.p);
      if (op % 7 == 0) {
        for (char* bad : {c + 512, c + 1, c - 512}) {
          const bool is_live = std::any_of(live.begin(), live.end(), [&](const live_block& x) { return x.p == bad; });
          if (!is_live) CHECK_THROWS_AS(a.deallocate(bad, nullptr, false, 0), depot::invalid_argument);
        }
        CHECK_THROWS_AS(a.deallocate(b.p, b.stream, true, b.bytes + 1), depot::invalid_argument);
      }
      a.deallocate(b.p, b.stream, true, b.bytes);
      if (op % 11 == 0) CHECK_THROWS_AS(a.deallocate(b.p, nullptr, false, 0), depot::invalid_argument);
      live[k] = live.back();
      live.pop_back();
    }
    if (op % 50 == 0) {
      check_invariants(a.stats(), a.snapshot());
      CHECK(a.check_directory() == "");
      CHECK(a.check_small_bits() == "");
    }
    if (op % 400 == 399) a.empty_cache();  // whole free segments go; new ones land elsewhere
  }
  for (const live_block& b : live) a.deallocate(b.p, nullptr, false, 0);
  const depot::memory_stats end = a.stats();
  CHECK(end.allocated_bytes.all.current == 0);
  check_invariants(end, a.snapshot());
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  CHECK(upstream.bad_frees() == 0);
}

TEST_CASE("pool: statistics published in batches equal those published at every operation")
{
  // One thread, five streams, 20 000 operations (1 B - 3 MiB; frees on the block's stream,
  // on another stream or unnamed; record_stream; empty_cache; an asynchronous backend, so
  // frees wait for events) on four allocators over identical simulated devices, each
  // operation applied to all four in turn. The first publishes every operation
  // (stats_batch 0) and its peaks are checked against the running maxima after every
  // operation; the others gather their figures in their stream caches (the default 16 MiB,
  // 64 KiB, and 1 TiB: only the 256-operation cap and stream changes publish) and are read
  // only every few hundred operations: they must show exactly the same figures.
  const auto seed = depot::test::seed("pool batched statistics", 7);
  std::mt19937_64 rng{seed};
  std::vector<std::unique_ptr<depot::detail::allocator_core>> pools;
  for (const std::size_t batch : {std::size_t{0}, depot::allocator_config{}.stats_batch, 64 * KiB,
                                  std::size_t{1} << 40}) {
    depot::allocator_config cfg = quiet_config<depot::host>();
    cfg.stats_batch = batch;
    pools.push_back(std::make_unique<depot::detail::allocator_core>(
        std::make_unique<depot::simulated_upstream>(std::size_t{1} << 40), cfg, /*asynchronous=*/true));
  }
  std::vector<depot::native_stream> streams;
  for (std::uintptr_t k = 1; k <= 5; ++k) streams.push_back(reinterpret_cast<depot::native_stream>(k << 12));
  struct live_block {
    std::vector<void*> p;  // per allocator
    std::size_t stream;
  };
  std::vector<live_block> live;
  peak_tracker peaks;
  int compared = 0;
  for (int op = 0; op < 20000; ++op) {
    const auto r = rng() % 100;
    if (r < 1) {
      for (auto& a : pools) a->empty_cache();
    } else if (r < 4 && !live.empty()) {
      const live_block& b = live[rng() % live.size()];
      const std::size_t other = rng() % streams.size();
      for (std::size_t i = 0; i < pools.size(); ++i) pools[i]->record_stream(b.p[i], streams[other]);
    } else if (live.empty() || (r < 55 && live.size() < 300)) {
      const auto kind = rng() % 20;
      const std::size_t max = kind < 14 ? 64 * KiB : kind < 19 ? MiB : 3 * MiB;
      const std::size_t n = 1 + rng() % max;
      live_block b{{}, rng() % streams.size()};
      for (auto& a : pools) b.p.push_back(a->allocate(n, streams[b.stream]));
      for (void* p : b.p) REQUIRE(p == b.p[0]);  // identical devices, identical decisions
      live.push_back(std::move(b));
    } else {
      const std::size_t k = rng() % live.size();
      const auto how = rng() % 3;
      const std::size_t on = how == 0 ? live[k].stream : rng() % streams.size();
      for (std::size_t i = 0; i < pools.size(); ++i) pools[i]->deallocate(live[k].p[i], streams[on], how != 2, 0);
      live[k] = std::move(live.back());
      live.pop_back();
    }
    const depot::memory_stats st = pools[0]->stats();
    peaks.check(st);
    if (op % 379 == 0 || op == 19999) {
      CAPTURE(op);
      for (std::size_t i = 1; i < pools.size(); ++i) {
        CAPTURE(i);
        check_same_stats(st, pools[i]->stats());
      }
      check_invariants(st, pools[0]->snapshot());
      ++compared;
    }
  }
  CHECK(compared > 50);
  CHECK(peaks.high["allocated.all"] > static_cast<std::int64_t>(64 * MiB));
  // A peak reset publishes first: the batching allocators' peaks restart from the same
  // figures, and so do they after another stretch of operations.
  for (auto& a : pools) a->reset_peak_stats();
  for (int i = 0; i < 300 && !live.empty(); ++i) {
    for (std::size_t j = 0; j < pools.size(); ++j) pools[j]->deallocate(live.back().p[j], nullptr, false, 0);
    live.pop_back();
  }
  for (std::size_t i = 1; i < pools.size(); ++i) check_same_stats(pools[0]->stats(), pools[i]->stats());
}

// After one thread kept 3 x 8 MiB of hits unpublished (past a 1 MiB batch, alone): another
// thread's first operation, a 256 KiB hit on stream s2 within the batch, must publish them
// first, so every peak counts both: exactly 3 x 8 MiB + 256 KiB, 4 allocations.
template <class D>
void check_kept_drift_published_first(depot::caching_allocator<D>& a, depot::stream<D>& s2)
{
  std::thread{[&] {
    void* q = a.allocate(256 * KiB, s2);
    a.deallocate(q, s2);
  }}.join();
  const depot::memory_stats st = a.stats();
  CHECK(st.num_cache_misses == 0);
  CHECK(st.requested_bytes.all.current == static_cast<std::int64_t>(24 * MiB));
  CHECK(st.requested_bytes.all.peak == static_cast<std::int64_t>(24 * MiB + 256 * KiB));
  CHECK(st.allocated_bytes.all.peak == static_cast<std::int64_t>(24 * MiB + 256 * KiB));
  CHECK(st.num_allocations.all.peak == 4);
}

TEST_CASE_TEMPLATE("pool: a thread that drifted past stats_batch alone publishes before the next thread's first operation", D,
                   DEPOT_TEST_DEVICES)
{
  // One thread alone on stream 1 drifts past the batch (8 MiB hits, batch 1 MiB): it was the
  // last to publish, so it keeps its changes, and publishes them as it exits. Then another
  // thread's first operation on stream 2 (a 256 KiB block, within the batch, published by
  // no drift of its own) starts from figures that count them: exactly 3 x 8 MiB + 256 KiB.
  depot::allocator_config cfg = quiet_config<D>();
  cfg.stats_batch = MiB;
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s1;
  depot::stream<D> s2;
  // stream 2's cache first: stats() publishes it before stream 1's, so only an earlier
  // publish of stream 1 gives the exact peak
  void* small_block = a.allocate(256 * KiB, s2);
  a.deallocate(small_block, s2);
  std::vector<void*> warm;
  for (int i = 0; i < 3; ++i) warm.push_back(a.allocate(8 * MiB, s1));
  for (void* w : warm) a.deallocate(w, s1);
  a.reset_memory_stats();
  std::vector<void*> kept;
  std::thread{[&] {
    for (int i = 0; i < 3; ++i) kept.push_back(a.allocate(8 * MiB, s1));  // hits, each past the batch
  }}.join();
  check_kept_drift_published_first(a, s2);
  for (void* k : kept) a.deallocate(k, s1);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: a thread that changes streams keeps its drift in one delta, which its exit publishes",
                   D, DEPOT_TEST_DEVICES)
{
  // One thread alternates between streams 1 and 3 with 8 MiB hits past the 1 MiB batch: its
  // unpublished changes stay in its own delta whatever the cache, kept as the last
  // published, and are published as it exits. Another thread's first operation on stream 2
  // (within the batch) then counts them: exactly 3 x 8 MiB + 256 KiB. Had a change of
  // stream left some of them behind in a cache's delta, the peak would miss them.
  depot::allocator_config cfg = quiet_config<D>();
  cfg.stats_batch = MiB;
  cfg.steal_threshold = std::numeric_limits<std::size_t>::max();  // each stream grows its own
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s1;
  depot::stream<D> s2;
  depot::stream<D> s3;
  void* small_block = a.allocate(256 * KiB, s2);
  a.deallocate(small_block, s2);
  for (depot::stream<D>* s : {&s1, &s3}) {  // each stream's cache holds 8 MiB hits
    std::vector<void*> warm;
    for (int i = 0; i < 3; ++i) warm.push_back(a.allocate(8 * MiB, *s));
    for (void* w : warm) a.deallocate(w, *s);
  }
  a.reset_memory_stats();
  std::vector<std::pair<void*, depot::stream<D>*>> kept;
  std::thread{[&] {
    for (depot::stream<D>* s : {&s1, &s3, &s3}) kept.emplace_back(a.allocate(8 * MiB, *s), s);  // hits
  }}.join();
  check_kept_drift_published_first(a, s2);
  for (auto& [p, s] : kept) a.deallocate(p, *s);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: a window whose headroom went stale still leaves every peak at least its figure", D,
                   DEPOT_TEST_DEVICES)
{
  // Stream 1's cache opens a window with headroom (its peak of 64 MiB over a figure of 0)
  // and holds a 10 MiB hit unpublished. Another thread's 60 MiB miss on stream 2 publishes
  // (a new segment) and moves the figure under the headroom. When stream 1's delta is then
  // taken in, its high (10 MiB, under its 64 MiB headroom) does not move the peak, so the
  // peak must still become the 70 MiB both blocks make together, not stay at 64 MiB under
  // the figure.
  depot::allocator_config cfg = quiet_config<D>();
  cfg.stats_batch = std::size_t{1} << 40;  // only segments, stream changes and readers publish
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s1;
  depot::stream<D> s2;
  a.deallocate(a.allocate(64 * MiB, s1), s1);  // the peak: 64 MiB; a 64 MiB segment cached
  for (int i = 0; i < 2; ++i) a.deallocate(a.allocate(2 * MiB, s1), s1);  // a window of 5 operations
  {
    const depot::memory_stats st = a.stats();  // publishes it: the next window sets headroom
    CHECK(st.allocated_bytes.all.peak == static_cast<std::int64_t>(64 * MiB));
    CHECK(st.allocated_bytes.all.current == 0);
  }
  void* mine = a.allocate(10 * MiB, s1);  // a hit, opens the window
  void* theirs = nullptr;
  std::thread{[&] { theirs = a.allocate(60 * MiB, s2); }}.join();  // a miss: published at once
  const depot::memory_stats st = a.stats();
  CHECK(st.num_cache_misses == 2);
  for (const depot::stat_array* q : {&st.allocated_bytes, &st.requested_bytes, &st.active_bytes}) {
    CHECK(q->all.current == static_cast<std::int64_t>(70 * MiB));
    CHECK(q->all.peak == static_cast<std::int64_t>(70 * MiB));
    CHECK(q->large.peak == static_cast<std::int64_t>(70 * MiB));
  }
  CHECK(st.num_allocations.all.peak == 2);
  a.deallocate(theirs, s2);
  a.deallocate(mine, s1);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: a delta that kept its drift checks it again once published", D, DEPOT_TEST_DEVICES)
{
  // A kept delta stops checking its drift until it is published; publishing must restore
  // the check, or the thread would keep its changes even after another thread published,
  // and that thread's peak would lack them. This thread frees three 8 MiB blocks (the
  // first free drifts past the 1 MiB batch while it was the last to publish: kept, marked),
  // then reset_memory_stats() publishes them. Another thread allocates 8 MiB on stream 2
  // (a miss, published) and exits holding it; this thread then takes an 8 MiB hit, whose
  // drift must publish at once (another delta published since): the peak is 16 MiB. A
  // third thread then frees stream 2's block. Without the restored check the hit stays
  // unpublished until stats(), after that free, and the peak is 8 MiB.
  depot::allocator_config cfg = quiet_config<D>();
  cfg.stats_batch = MiB;
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s1;
  depot::stream<D> s2;
  {
    std::vector<void*> warm;
    for (int i = 0; i < 3; ++i) warm.push_back(a.allocate(8 * MiB, s1));  // misses
    for (void* w : warm) a.deallocate(w, s1);  // the first kept past the batch, marked
  }
  a.reset_memory_stats();
  void* y = nullptr;
  std::thread{[&] { y = a.allocate(8 * MiB, s2); }}.join();
  void* x = a.allocate(8 * MiB, s1);  // a hit past the batch
  std::thread{[&] { a.deallocate(y, s2); }}.join();
  const depot::memory_stats st = a.stats();
  CHECK(st.num_cache_misses == 1);
  CHECK(st.allocated_bytes.large.current == static_cast<std::int64_t>(8 * MiB));
  CHECK(st.allocated_bytes.large.peak == static_cast<std::int64_t>(16 * MiB));
  CHECK(st.requested_bytes.large.peak == static_cast<std::int64_t>(16 * MiB));
  CHECK(st.num_allocations.large.peak == 2);
  a.deallocate(x, s1);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: a figure that drifts past stats_batch is published at once", D,
                   DEPOT_TEST_DEVICES)
{
  // stats_batch 1 MiB. Another thread allocates two 8 MiB blocks on stream 1 (the second
  // a cache hit, which publishes only because it drifts past the batch) and ends; this
  // thread then allocates and frees 8 MiB on stream 2: the peak is 24 MiB. With two 256 KiB blocks the second stays unpublished
  // (within the batch) and may be missing from the peak, but by no more than the batch.
  for (const std::size_t block : {8 * MiB, 256 * KiB}) {
    CAPTURE(block);
    depot::allocator_config cfg = quiet_config<D>();
    cfg.stats_batch = MiB;
    depot::caching_allocator<D> a{0, cfg};
    depot::stream<D> s1;
    depot::stream<D> s2;
    a.deallocate(a.allocate(8 * MiB, s2), s2);
    a.reset_memory_stats();
    void* kept[2] = {};
    std::thread{[&] {
      kept[0] = a.allocate(block, s1);
      kept[1] = a.allocate(block, s1);
    }}.join();
    void* p = a.allocate(8 * MiB, s2);
    a.deallocate(p, s2);
    const depot::memory_stats st = a.stats();
    CHECK(st.num_cache_hits >= 1);  // the second block at least
    CHECK(st.requested_bytes.all.current == static_cast<std::int64_t>(2 * block));
    const auto exact = static_cast<std::int64_t>(2 * block + 8 * MiB);
    if (block > MiB) {
      CHECK(st.requested_bytes.all.peak == exact);
    } else {
      CHECK(st.requested_bytes.all.peak >= exact - static_cast<std::int64_t>(MiB));
      CHECK(st.requested_bytes.all.peak <= exact);
    }
    for (void* k : kept) a.deallocate(k, s1);
    check_invariants(a);
  }
}

// A thread's last operations leave their changes in its cache until the thread moves on; a
// thread that exits moves on no more, so it publishes them as it exits. Else the next
// thread's peaks counted the exited thread's last frees as still allocated (found in
// depot-bench alloc's JSON, 2026-12-02: one thread on 4 streams, new threads and streams
// each run, an allocated peak of 1 980 MiB beside a reserved peak of 2 358 and a true one
// of 1 032).
TEST_CASE_TEMPLATE("pool: a thread that exits publishes its changes, so the next thread's peaks are exact", D,
                   DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s1, s2;
  constexpr std::size_t k_block = 64 * MiB;
  constexpr int k_blocks = 8;
  std::thread([&] {
    std::vector<void*> mine;
    for (int i = 0; i < k_blocks; ++i) mine.push_back(a.allocate(k_block, s1));  // each a new segment: published
    for (void* p : mine) a.deallocate(p, s1);  // kept in s1's cache (one thread alone)
  }).join();
  std::thread([&] {
    void* p = a.allocate(k_block, s2);  // another cache: its figures start from the shared ones
    a.deallocate(p, s2);
  }).join();
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.peak == static_cast<std::int64_t>(k_blocks * k_block));
  CHECK(st.requested_bytes.all.peak == static_cast<std::int64_t>(k_blocks * k_block));
  CHECK(st.active_bytes.all.peak == static_cast<std::int64_t>(k_blocks * k_block));
  CHECK(st.num_allocations.all.peak == k_blocks);
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.allocated_bytes.all.peak <= st.reserved_bytes.all.peak);
  check_invariants(st, a.snapshot());
}

// Statistics deltas are the threads' (thread_stats), each published as its thread exits and
// then taken over by the next new thread: 50 threads one after another (each on two streams,
// each holding up to 7 blocks of 3 MiB and more at once, past the 1 MiB batch, then freeing
// them) leave one delta, and the requested peak is exactly the most any of them held. Four
// threads alive at once have four; a fifth after them takes one of those over.
TEST_CASE("pool: threads that come and go take over one another's statistics deltas, and peaks stay exact")
{
  depot::allocator_config cfg = quiet_config<depot::host>();
  cfg.stats_batch = MiB;
  depot::detail::allocator_core a{std::make_unique<depot::simulated_upstream>(std::size_t{1} << 40), cfg,
                                  /*asynchronous=*/false};
  const depot::native_stream streams[] = {fake_stream(0x1000), fake_stream(0x2000)};
  std::int64_t most = 0;
  for (std::size_t t = 0; t < 50; ++t) {
    const std::size_t n = t % 7 + 1;
    const std::size_t bytes = 3 * MiB + t * 4096;
    most = std::max(most, static_cast<std::int64_t>(n * bytes));
    std::thread([&] {
      std::vector<void*> mine;
      for (std::size_t k = 0; k < n; ++k) mine.push_back(a.allocate(bytes, streams[k % 2]));
      for (std::size_t k = 0; k < n; ++k) a.deallocate(mine[k], streams[k % 2], k % 3 != 0, 0);
    }).join();
  }
  CHECK(a.thread_deltas() == 1);
  depot::memory_stats st = a.stats();
  CHECK(st.requested_bytes.all.peak == most);
  CHECK(st.num_allocations.all.peak == 7);
  CHECK(st.requested_bytes.all.current == 0);
  check_invariants(st, a.snapshot());

  std::atomic<int> arrived{0};
  std::vector<std::thread> four;
  for (std::uintptr_t t = 0; t < 4; ++t) {
    four.emplace_back([&, t] {
      void* p = a.allocate(MiB, fake_stream(0x10000 * (t + 1)));
      arrived.fetch_add(1);
      while (arrived.load() < 4) std::this_thread::yield();  // all four at work at once
      a.deallocate(p, fake_stream(0x10000 * (t + 1)), true, 0);
    });
  }
  for (auto& th : four) th.join();
  CHECK(a.thread_deltas() == 4);
  std::thread([&] { a.deallocate(a.allocate(MiB, streams[0]), streams[0], true, 0); }).join();
  CHECK(a.thread_deltas() == 4);
  st = a.stats();
  CHECK(st.requested_bytes.all.peak == most);  // (4 MiB at most at once since)
  CHECK(st.requested_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
}

// Many threads at work at once, then gone: their deltas are published as they exit (the
// totals exact), and past 64 free ones each exiting thread's delta goes, so the allocator
// keeps 64 for later threads rather than one per thread it ever saw at once.
TEST_CASE("pool: 200 threads at once leave 64 spare statistics deltas, their changes all published")
{
  depot::detail::allocator_core a{std::make_unique<depot::simulated_upstream>(std::size_t{1} << 40),
                                  quiet_config<depot::host>(), /*asynchronous=*/false};
  constexpr int k_threads = 200;
  std::atomic<int> arrived{0};
  std::vector<std::thread> many;
  for (int t = 0; t < k_threads; ++t) {
    many.emplace_back([&, t] {
      const depot::native_stream s = fake_stream(0x1000 * static_cast<std::uintptr_t>(t % 8 + 1));
      void* p = a.allocate(64 * KiB, s);
      arrived.fetch_add(1);
      while (arrived.load() < k_threads) std::this_thread::yield();  // all at work at once
      a.deallocate(p, s, t % 2 == 0, 0);
    });
  }
  for (auto& th : many) th.join();
  CHECK(a.thread_deltas() == 64);
  depot::memory_stats st = a.stats();
  CHECK(st.num_allocations.all.allocated == k_threads);
  CHECK(st.num_allocations.all.freed == k_threads);
  CHECK(st.num_allocations.all.current == 0);
  CHECK(st.num_allocations.all.peak <= k_threads);
  CHECK(st.requested_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
  // A later thread takes a spare one over.
  std::thread([&] { a.deallocate(a.allocate(MiB, fake_stream(0x1000)), fake_stream(0x1000), true, 0); }).join();
  CHECK(a.thread_deltas() == 64);
  CHECK(a.stats().num_allocations.all.allocated == k_threads + 1);
}

// A thread remembers its last four allocators: a fifth takes the least recent's place.
// Back on that one, the thread finds its own delta again (not a new one), with the drift
// it kept there: 3 x 8 MiB hits past the 1 MiB batch, then the four others, then 8 MiB
// more and every free: the peak is exactly 32 MiB, and the first allocator has one delta.
TEST_CASE("pool: a thread back from four other allocators finds its statistics delta and its kept drift")
{
  depot::allocator_config cfg = quiet_config<depot::host>();
  cfg.stats_batch = MiB;
  std::vector<std::unique_ptr<depot::detail::allocator_core>> pools;
  for (int k = 0; k < 5; ++k) {
    pools.push_back(std::make_unique<depot::detail::allocator_core>(
        std::make_unique<depot::simulated_upstream>(std::size_t{1} << 40), cfg, /*asynchronous=*/false));
  }
  depot::detail::allocator_core& a = *pools[0];
  const depot::native_stream s = fake_stream(0x1000);
  {
    std::vector<void*> warm;  // a segment holding four 8 MiB blocks: the later ones hits
    for (int i = 0; i < 4; ++i) warm.push_back(a.allocate(8 * MiB, s));
    for (void* w : warm) a.deallocate(w, s, true, 0);
    a.reset_memory_stats();
  }
  std::thread([&] {
    std::vector<void*> held;
    for (int i = 0; i < 3; ++i) held.push_back(a.allocate(8 * MiB, s));  // hits, kept past the batch
    for (std::size_t k = 1; k < pools.size(); ++k) {
      pools[k]->deallocate(pools[k]->allocate(4 * KiB, s), s, true, 0);
    }
    held.push_back(a.allocate(8 * MiB, s));
    for (void* p : held) a.deallocate(p, s, true, 0);
  }).join();
  CHECK(a.thread_deltas() == 2);  // the warm-up's thread's and the thread's
  const depot::memory_stats st = a.stats();
  CHECK(st.num_cache_misses == 0);
  CHECK(st.requested_bytes.all.peak == static_cast<std::int64_t>(32 * MiB));
  CHECK(st.allocated_bytes.all.peak == static_cast<std::int64_t>(32 * MiB));
  CHECK(st.num_allocations.all.peak == 4);
  CHECK(st.requested_bytes.all.current == 0);
  check_invariants(st, a.snapshot());
}

TEST_CASE_TEMPLATE("pool: a thread alternating among more streams than it remembers", D,
                   DEPOT_TEST_DEVICES)
{
  // The thread keeps its last four streams' caches; six in turn make it fall back to the
  // registry every time: each block must still come from its own stream's cache.
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  std::vector<depot::stream<D>> streams(6);
  std::vector<std::pair<void*, std::size_t>> blocks;  // pointer, stream index
  for (std::size_t i = 0; i < 60; ++i) {
    const std::size_t k = i % (i < 30 ? 6 : 3);  // then three streams: all remembered
    blocks.emplace_back(a.allocate(1 + (i * 977) % (32 * KiB), streams[k]), k);
  }
  const depot::allocator_snapshot snap = a.snapshot();
  for (const auto& [p, k] : blocks) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const auto seg = std::find_if(snap.segments.begin(), snap.segments.end(), [&](const auto& sg) {
      return addr >= sg.address && addr < sg.address + sg.size;
    });
    REQUIRE(seg != snap.segments.end());
    CHECK(seg->stream == reinterpret_cast<std::uintptr_t>(streams[k].native()));
  }
  check_invariants(a);
  for (const auto& [p, k] : blocks) a.deallocate(p, streams[k]);
  CHECK(a.stats().allocated_bytes.all.current == 0);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: streams that come and go do not strand memory", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  for (int i = 0; i < 40; ++i) {
    depot::stream<D> s;
    void* p = a.allocate(3 * MiB, s);  // a 20 MiB large segment
    void* q = a.allocate(300 * 1024, s);  // a 2 MiB small segment
    a.deallocate(p, s);
    a.deallocate(q, s);
    s.synchronize();
  }
  const auto st = a.stats();
  // Each new stream took over the segments the previous one left.
  CHECK(st.num_segments.all.current == 2);
  CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(22 * MiB));
  check_invariants(a);
}

// device_upstream keeps destroyed events and records them again (a steal or a free on
// another stream records one): the same handle comes back, and each record is its own.
TEST_CASE_TEMPLATE("pool: device_upstream records kept events again", D, DEPOT_TEST_DEVICES)
{
  depot::device_upstream<D> up{0};
  depot::stream<D> s;
  std::vector<depot::native_event> first;
  for (int i = 0; i < 3; ++i) first.push_back(up.record_event(s.native()));
  for (auto e : first) up.destroy_event(e);
  std::vector<depot::native_event> again;
  for (int i = 0; i < 3; ++i) again.push_back(up.record_event(s.native()));
  std::sort(first.begin(), first.end());
  auto sorted = again;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == first);  // no new event taken from the backend
  const auto fresh = up.record_event(s.native());  // the spares are in use: a new one
  CHECK(std::find(first.begin(), first.end(), fresh) == first.end());
  s.synchronize();
  for (auto e : again) {
    up.wait_event(e);
    CHECK(up.event_done(e));
  }
  up.destroy_event(fresh);
  for (auto e : again) up.destroy_event(e);
  up.destroy_event(nullptr);  // nothing
}

// Whether a block of n bytes filled with id still holds it (first, middle and last byte).
bool holds_id(const unsigned char* p, std::size_t n, unsigned char id)
{
  return p[0] == id && p[n / 2] == id && p[n - 1] == id;
}

// Raw handle s (registered with stream_registry) closes as a destroyed stream's would, then
// counts as destroyed for ev (an event recorded on it later is in dead_records); with
// fences_complete, every event recorded so far completes.
void close_raw_stream(manual_event_upstream::state& ev, depot::native_stream s, bool fences_complete)
{
  depot::stream_registry::closing(ev.streams, s);  // (records a fence on s)
  const std::lock_guard g{ev.mu};
  ev.dead.insert(reinterpret_cast<std::uintptr_t>(s));
  if (fences_complete) ev.open.clear();
}

// Four threads, each 60 times making a stream, calling body(t, i, stream, rng) with it
// and destroying it (rng: the thread's own, seeded seed + t); every 8th time the fences
// recorded so far complete.
template <class Body>
void streams_come_and_go(manual_event_upstream::state& ev, std::uint64_t seed, Body body)
{
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + t};
      for (int i = 0; i < 60; ++i) {
        depot::stream<depot::host> s;
        body(t, i, s, rng);
        if (i % 8 == 7) {
          const std::lock_guard g{ev.mu};
          ev.open.clear();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
}

// Streams made and destroyed on four threads at once, on an asynchronous backend (CPU
// memory, events counted): closings record fences while other threads steal from those
// caches and new streams reuse their handles. Every stream is a depot::stream, so no steal
// and no reuse ever synchronises the device; the memory is not stranded; every block keeps
// its contents (the thread-sanitizer build runs this).
TEST_CASE("pool: streams that come and go on four threads are ordered by events, never by the device")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto seed = depot::test::seed("pool streams come and go, 4 threads", 11);
  std::atomic<int> bad{0};
  streams_come_and_go(*ev, seed, [&](unsigned t, int, depot::stream<depot::host>& s, std::mt19937_64& rng) {
    std::vector<std::pair<unsigned char*, std::size_t>> live;
    for (int k = 0; k < 3; ++k) {
      const std::size_t n = 1 + rng() % (6 * MiB);
      auto* p = static_cast<unsigned char*>(a.allocate(n, s.native()));
      const auto id = static_cast<unsigned char>(t * 64 + static_cast<unsigned>(k));
      std::memset(p, id, n);
      live.emplace_back(p, n);
    }
    for (std::size_t k = 0; k < live.size(); ++k) {
      const auto [p, n] = live[k];
      const auto id = static_cast<unsigned char>(t * 64 + k);
      if (!holds_id(p, n, id)) bad.fetch_add(1);
      a.deallocate(p, s.native(), true, 0);
    }
  });
  CHECK(bad.load() == 0);
  CHECK(ev->syncs == 0);
  CHECK(ev->recorded >= 4 * 60);  // a fence at each closing at least
  MESSAGE("fences and steal events recorded: " << ev->recorded << ", waits queued on streams: " << ev->stream_waits);
  const depot::memory_stats st = a.stats();
  check_invariants(st, a.snapshot());
  CHECK(a.check_directory() == "");  // every segment listed with the cache that took it last
  CHECK(st.allocated_bytes.all.current == 0);
  // Not stranded: at most what 4 threads' 3 live blocks of <= 6 MiB need at once, in
  // segments of <= 20 MiB (a cache takes others' whole free segments before growing).
  CHECK(st.reserved_bytes.all.peak <= static_cast<std::int64_t>(4 * 3 * 20 * MiB));
  a.empty_cache();
}

// Blocks any thread made and any thread frees, naming no stream, each checked first: its
// first, middle and last bytes hold its id (`bad` counts those that did not).
struct shared_blocks {
  struct live_block {
    unsigned char* p;
    std::size_t n;
    unsigned char id;
  };
  explicit shared_blocks(depot::detail::allocator_core& core) : a{core} {}
  depot::detail::allocator_core& a;
  std::mutex mu;
  std::vector<live_block> blocks;
  std::atomic<int> bad{0};

  // n bytes on stream s, filled with id.
  void allocate(std::size_t n, depot::native_stream s, unsigned char id)
  {
    auto* p = static_cast<unsigned char*>(a.allocate(n, s));
    std::memset(p, id, n);
    const std::lock_guard g{mu};
    blocks.push_back({p, n, id});
  }
  void free_checked(const live_block& b)
  {
    if (!holds_id(b.p, b.n, b.id)) bad.fetch_add(1);
    a.deallocate(b.p, nullptr, false, 0);
  }
  // One block any thread made, picked by rng (none: false).
  bool free_one(std::mt19937_64& rng)
  {
    live_block b{};
    {
      const std::lock_guard g{mu};
      if (blocks.empty()) return false;
      const std::size_t at = rng() % blocks.size();
      b = blocks[at];
      blocks[at] = blocks.back();
      blocks.pop_back();
    }
    free_checked(b);
    return true;
  }
  void free_all()
  {
    for (const live_block& b : blocks) free_checked(b);
    blocks.clear();
  }
};

// Four threads free each other's blocks, naming no stream, while their streams come and
// go: the frees ask the directory of segments while other threads' misses move whole free
// segments between caches (steals, under both caches' locks) and new segments are listed.
// Every block keeps its contents, and the directory ends listing every segment with the
// cache that holds it (the thread-sanitizer build runs this).
TEST_CASE("pool: threads free each other's blocks unnamed while streams come and go")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const auto seed = depot::test::seed("pool unnamed frees across threads, streams come and go", 13);
  shared_blocks shared{a};
  streams_come_and_go(*ev, seed, [&](unsigned t, int i, depot::stream<depot::host>& s, std::mt19937_64& rng) {
    for (int k = 0; k < 4; ++k) {
      const std::size_t n = 1 + rng() % (k % 2 == 0 ? 64 * KiB : 3 * MiB);
      shared.allocate(n, s.native(),
                      static_cast<unsigned char>(t * 64 + static_cast<unsigned>(i % 16) * 4 + static_cast<unsigned>(k)));
    }
    for (int k = 0; k < 4 && shared.free_one(rng); ++k) {
    }
  });
  shared.free_all();
  CHECK(shared.bad.load() == 0);
  check_ends_empty(a);
}

// 2 000 streams made and destroyed one after another, each with its own handle (never
// reused, as a backend may do), on an asynchronous backend: a destroyed stream's cache
// that holds nothing is taken over by a later new stream, so the caches stay few (one per
// stream ever used before: 48 KB each, and each looked through by every steal). A cache
// still holding a block (live, or free in a segment nobody took yet) is not taken over:
// the block keeps its stream and contents. No event is recorded on a destroyed handle, and
// nothing synchronises the device.
TEST_CASE("pool: destroyed streams' empty caches serve new streams, so 2 000 streams keep few caches")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const depot::device_id dev = ev->streams;
  const auto seed = depot::test::seed("pool stream caches taken over", 23);
  std::mt19937_64 rng{seed};
  struct kept {
    unsigned char* p;
    std::size_t n;
    unsigned char id;
    std::uintptr_t stream;
  };
  std::vector<kept> held;  // blocks that outlive their stream, freed later
  int bad = 0;
  const auto check_and_free = [&](const kept& b, bool named, depot::native_stream on) {
    if (!holds_id(b.p, b.n, b.id)) ++bad;
    a.deallocate(b.p, on, named, 0);
  };
  const std::size_t max_sizes[] = {4 * KiB, 64 * KiB, MiB, 8 * MiB};
  std::size_t most = 0;
  for (std::uintptr_t i = 1; i <= 2000; ++i) {
    const auto s = fake_stream(0x100000 + (i << 12));
    depot::stream_registry::opened(dev, s);
    std::vector<kept> mine;
    for (int k = 0; k < 3; ++k) {
      const std::size_t n = 1 + rng() % max_sizes[(i + static_cast<unsigned>(k)) % 4];
      auto* p = static_cast<unsigned char*>(a.allocate(n, s));
      const auto id = static_cast<unsigned char>(i * 3 + static_cast<unsigned>(k));
      std::memset(p, id, n);
      mine.push_back({p, n, id, reinterpret_cast<std::uintptr_t>(s)});
    }
    if (i % 50 == 0) {  // one block outlives the stream
      held.push_back(mine.back());
      mine.pop_back();
    }
    for (const kept& b : mine) check_and_free(b, true, s);
    close_raw_stream(*ev, s, i % 8 == 0);
    if (i % 100 == 0) {
      // The blocks that outlived their streams (two, 50 streams apart): each one's segment
      // is still its dead stream's cache's, never another's (that cache was not taken over
      // while it held the block).
      const auto segments = a.snapshot().segments;
      for (const kept& b : held) {
        for (const auto& seg : segments) {
          if (b.p >= reinterpret_cast<unsigned char*>(seg.address) &&
              b.p < reinterpret_cast<unsigned char*>(seg.address) + seg.size) {
            CHECK(seg.stream == b.stream);
          }
        }
        check_and_free(b, false, nullptr);  // unnamed: found through the directory
      }
      held.clear();
      check_invariants(a.stats(), a.snapshot());
      CHECK(a.check_directory() == "");
    }
    if (i % 500 == 0) a.empty_cache();
    most = std::max(most, a.stream_caches());
  }
  MESSAGE("seed " << seed << ": most stream caches at once " << most << ", at the end " << a.stream_caches()
                  << " (2 000 streams), events recorded " << ev->recorded);
  CHECK(bad == 0);
  CHECK(most <= 16);  // each stream made a cache before: 2 000
  CHECK(ev->dead_records == 0);
  CHECK(ev->syncs == 0);
  // Not stranded: the free memory of the dead streams' caches served the new ones.
  CHECK(a.stats().reserved_bytes.all.peak <= static_cast<std::int64_t>(64 * MiB));
  check_ends_empty(a);
}

// Four threads each making and destroying 300 streams with handles of their own (never
// reused), each stream allocating blocks that any thread may free, unnamed: new streams
// take over the empty caches of streams other threads destroyed while those threads' frees
// look for blocks through the directory and their misses take whole free segments over
// (the thread-sanitizer build runs this). Every block keeps its contents, the caches stay
// few, no event goes to a destroyed handle and nothing synchronises the device.
TEST_CASE("pool: streams that come and go on four threads with handles of their own take over empty caches")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const depot::device_id dev = ev->streams;
  const auto seed = depot::test::seed("pool stream caches taken over, 4 threads", 37);
  shared_blocks shared{a};
  std::atomic<std::size_t> most{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + t};
      for (std::uintptr_t i = 1; i <= 300; ++i) {
        const auto s = fake_stream(0x40000000 + ((i * 4 + t) << 12));
        depot::stream_registry::opened(dev, s);
        for (int k = 0; k < 3; ++k) {
          const std::size_t n = 1 + rng() % (k == 2 ? 3 * MiB : 64 * KiB);
          shared.allocate(n, s, static_cast<unsigned char>(t * 64 + (i % 16) * 4 + static_cast<unsigned>(k)));
        }
        for (int k = 0; k < 3 && shared.free_one(rng); ++k) {
        }
        close_raw_stream(*ev, s, i % 8 == 0);
        std::size_t seen = most.load();
        const std::size_t now = a.stream_caches();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  shared.free_all();
  MESSAGE("seed " << seed << ": most stream caches at once " << most.load() << " (1 200 streams, 4 threads)");
  CHECK(shared.bad.load() == 0);
  CHECK(most.load() <= 64);  // each stream made a cache before: 1 200
  CHECK(ev->dead_records == 0);
  CHECK(ev->syncs == 0);
  check_ends_empty(a);
}

// The same on every device, with its own streams (depot::stream, whose handles the backend
// may reuse): three streams live at a time, each allocating and freeing blocks of up to
// 8 MiB, one in 25 keeping a block past its destruction. The caches stay few, and every
// figure and the directory stay right.
TEST_CASE_TEMPLATE("pool: streams that come and go keep few caches", D, DEPOT_TEST_DEVICES)
{
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<D>>(0), quiet_config<D>(),
                                  depot::is_gpu_v<D>};
  const auto seed = depot::test::seed("pool streams come and go, few caches", 29);
  std::mt19937_64 rng{seed};
  std::deque<depot::stream<D>> window;
  std::vector<void*> held;
  std::size_t most = 0;
  for (int i = 0; i < 600; ++i) {
    window.emplace_back();
    const depot::native_stream s = window.back().native();
    std::vector<void*> mine;
    for (int k = 0; k < 3; ++k) mine.push_back(a.allocate(1 + rng() % (k == 2 ? 8 * MiB : 64 * KiB), s));
    if (i % 25 == 0) {
      held.push_back(mine.back());
      mine.pop_back();
    }
    for (void* p : mine) a.deallocate(p, s, true, 0);
    if (window.size() > 3) window.pop_front();
    if (held.size() > 4) {
      a.deallocate(held.front(), nullptr, false, 0);
      held.erase(held.begin());
    }
    most = std::max(most, a.stream_caches());
  }
  window.clear();
  for (void* p : held) a.deallocate(p, nullptr, false, 0);
  MESSAGE("seed " << seed << ": most stream caches at once " << most << " (600 streams)");
  CHECK(most <= 24);
  check_ends_empty(a);
}

// 3 000 streams, each (a raw handle, never destroyed) allocating and freeing 4 KiB once:
// each new stream's miss takes the whole free segment the stream before it left, so one
// segment serves them all; a steal skips the caches holding no segment without locking
// them by their count of segments, which must stay right as segments move; and the caches
// those steals emptied serve the later handles, so a few caches serve them all.
TEST_CASE("pool: a new stream takes the free segment of an earlier one among thousands of caches")
{
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<depot::host>>(0),
                                  quiet_config<depot::host>(), /*asynchronous=*/false};
  for (std::uintptr_t k = 1; k <= 3000; ++k) {
    const auto s = fake_stream(k << 12);
    void* p = a.allocate(4 * KiB, s);
    REQUIRE(p != nullptr);
    a.deallocate(p, s, true, 0);
    if (k % 500 == 0) {
      CAPTURE(k);
      CHECK(a.check_directory() == "");
    }
  }
  const depot::memory_stats st = a.stats();
  CHECK(st.num_segments.all.peak == 1);  // taken over 2 999 times, never grown again
  CHECK(st.reserved_bytes.all.peak == static_cast<std::int64_t>(2 * MiB));
  CHECK(st.num_cache_misses == 3000);
  // The caches the steals emptied served the later handles (take_empty_raw): the stream
  // before the last holds none, the last one the segment.
  CHECK(a.stream_caches() <= 3);
  check_invariants(st, a.snapshot());
  // An emptied raw handle used again gets a cache (made or taken), and its memory.
  const auto first = fake_stream(std::uintptr_t{1} << 12);
  void* p = a.allocate(4 * KiB, first);
  CHECK(a.snapshot().segments.size() == 1);
  a.deallocate(p, first, true, 0);
  CHECK(a.check_directory() == "");
  check_invariants(a.stats(), a.snapshot());
}

// Four threads, each cycling through 64 raw handles of its own (never registered), allocate
// and free on each in turn, so emptied caches are taken over by new handles while their old
// handles come back (take_empty_raw and the route change, under TSan in tools/test): every
// block is written and checked, and a handle whose cache was taken finds another.
TEST_CASE("pool: threads that cycle through raw stream handles share out the emptied caches")
{
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<depot::host>>(0),
                                  quiet_config<depot::host>(), /*asynchronous=*/false};
  constexpr std::uintptr_t k_threads = 4, k_handles = 64, k_rounds = 400;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (std::uintptr_t t = 0; t < k_threads; ++t) {
    threads.emplace_back([&a, &bad, t] {
      for (std::uintptr_t i = 0; i < k_rounds; ++i) {
        const auto s = fake_stream((t * k_handles + i % k_handles + 1) << 12);
        const std::size_t n = (i % 3 == 0) ? 3 * MiB : 4 * KiB;  // large and dense small segments
        auto* p = static_cast<unsigned char*>(a.allocate(n, s));
        std::memset(p, static_cast<int>(t + 1), n);
        if (p[0] != t + 1 || p[n - 1] != t + 1) bad.fetch_add(1);
        a.deallocate(p, s, true, 0);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  MESSAGE("stream caches at the end: ", a.stream_caches(), " for ", k_threads * k_handles, " handles");
  CHECK(a.stream_caches() < k_threads * k_handles);
  CHECK(a.check_directory() == "");
  check_invariants(a.stats(), a.snapshot());
}

// A segment given back to the upstream whose addresses come straight back as another
// stream's new segment (the upstream hands them over while the releasing thread is still
// inside its deallocate): the new segment must be listed in the directory of segments.
// (Leaving the directory only after the memory went back, the release erased the new
// segment's entry: its own was still there when the new one was added.)
TEST_CASE("pool: a segment released while its addresses become another stream's new segment stays listed")
{
  for (const std::size_t bytes : {4 * KiB, 3 * MiB}) {  // a dense small segment, a large one
    CAPTURE(bytes);
    auto up = std::make_unique<handoff_upstream>();
    handoff_upstream& handoff = *up;
    depot::allocator_config cfg = quiet_config<depot::host>();
    cfg.release_threshold = 0;  // a whole free segment goes back at once
    depot::detail::allocator_core a{std::move(up), cfg, /*asynchronous=*/false};
    const auto s1 = fake_stream(0x1000);
    const auto s2 = fake_stream(0x2000);
    void* first = nullptr;
    // (on another thread: this one's last operation must not be on s1's cache, whose lock
    // the releasing thread holds while it waits, since moving to another cache locks it)
    std::thread{[&] { first = a.allocate(bytes, s1); }}.join();
    handoff.arm();
    std::thread releasing{[&] { a.deallocate(first, s1, true, 0); }};
    handoff.wait_held();
    void* second = a.allocate(bytes, s2);  // a new segment at the addresses just given back
    releasing.join();
    CHECK(a.check_directory() == "");
    const depot::memory_stats st = a.stats();
    CHECK(st.num_segments.all.current == 1);
    check_invariants(st, a.snapshot());
    a.deallocate(second, nullptr, false, 0);  // found through the directory (not in the thread's caches)
    CHECK(a.check_directory() == "");
    CHECK(a.stats().num_segments.all.current == 0);
    CHECK(handoff.bad_frees() == 0);
  }
}

// A free that names no stream, of a block in neither the calling thread's last stream's
// cache nor its last operation's, finds the block's cache through the directory of
// segments by address (it tried every cache in turn): blocks of every kind made on 64
// streams, freed unnamed by another thread in a random order, each checked first; then a
// double free and pointers into a block or beside the pool are refused, naming the
// pointer and changing nothing. With and without expandable segments.
// Freed small blocks wait unmerged for the next request of their size
// (allocator_config::small_reuse_bytes, 1 MiB per cache by default): counted as cached
// (inactive, split) at once and shown free and `kept` in snapshots; the next request of the
// same rounded size takes the last one kept; a request that finds no free block merges them
// all before the cache would grow; a double free of a kept block is refused; empty_cache
// merges and releases them; over release_threshold nothing is kept. Contents written
// before the free and after the reuse are checked.
TEST_CASE_TEMPLATE("pool: freed small blocks are kept for the next request of their size, up to small_reuse_bytes", D,
                   DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg = quiet_config<D>();
  REQUIRE(cfg.small_reuse_bytes == MiB);
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<D>>(0), cfg, depot::is_gpu_v<D>};
  depot::stream<D> s;
  const depot::native_stream ns = s.native();
  const auto seed = depot::test::seed("pool kept blocks", 3);
  std::mt19937_64 rng{seed};
  const auto kept = [&] { return depot::test::kept_in(a.snapshot()); };
  const auto checked = [&] {
    CHECK(a.check_small_bits() == "");
    depot::test::check_invariants(a.stats(), a.snapshot());
  };
  // 32 blocks of 64 KiB: one whole segment, in address order.
  std::vector<unsigned char*> p;
  for (int i = 0; i < 32; ++i) p.push_back(static_cast<unsigned char*>(a.allocate(64 * KiB, ns)));
  for (int i = 1; i < 32; ++i) REQUIRE(p[i] == p[0] + i * 64 * KiB);
  REQUIRE(a.stats().num_segments.all.current == 1);
  for (int i = 0; i < 32; ++i) fill_bytes<D>(p[i], 64 * KiB, static_cast<unsigned char>(i), s);
  const auto full = a.stats();
  // The even ones: 16 x 128 units, exactly 1 MiB, all kept (none merged, though the
  // segment's index is empty and two kept blocks are free neighbours of p[1] below).
  for (int i = 0; i < 32; i += 2) a.deallocate(p[i], ns, true, 0);
  checked();
  {
    const auto st = a.stats();
    const depot::test::kept_blocks k = kept();
    CHECK(k.blocks == 16);
    CHECK(k.bytes == static_cast<std::int64_t>(MiB));
    CHECK(st.allocated_bytes.all.current == full.allocated_bytes.all.current - static_cast<std::int64_t>(MiB));
    CHECK(st.active_bytes.all.current == full.active_bytes.all.current - static_cast<std::int64_t>(MiB));
    CHECK(st.inactive_split_bytes.all.current == static_cast<std::int64_t>(MiB));
    CHECK(st.reserved_bytes.all.current == full.reserved_bytes.all.current);
    CHECK(st.largest_free_block == static_cast<std::int64_t>(64 * KiB));
  }
  {  // The JSON snapshot says which blocks are kept, and reads back the same.
    const depot::allocator_snapshot snap = a.snapshot();
    const std::string json = snap.to_json();
    CHECK(json.find("\"kept\":true") != std::string::npos);
    const auto round = depot::parse_snapshot(json);
    REQUIRE(round.segments.size() == snap.segments.size());
    for (std::size_t i = 0; i < snap.segments.size(); ++i) {
      REQUIRE(round.segments[i].blocks.size() == snap.segments[i].blocks.size());
      for (std::size_t j = 0; j < snap.segments[i].blocks.size(); ++j) {
        CHECK(round.segments[i].blocks[j].kept == snap.segments[i].blocks[j].kept);
      }
    }
    const std::string bad =
        R"({"format":"depot.snapshot.v1","device":"host:0","segments":[{"address":0,"size":1024,"stream":0,"pool":"small","blocks":[{"address":0,"size":1024,"requested":8,"state":"allocated","kept":K}]}]})";
    const auto with = [&](const char* k) { return std::string{bad}.replace(bad.find('K'), 1, k); };
    CHECK(depot::parse_snapshot(with("false")).segments.size() == 1);
    CHECK_THROWS_WITH_AS((void)depot::parse_snapshot(with("true")), doctest::Contains("'kept': true on a block that is not free"),
                         depot::invalid_argument);
    CHECK_THROWS_WITH_AS((void)depot::parse_snapshot(with("1")), doctest::Contains("'kept': expected true or false"),
                         depot::invalid_argument);
  }
  // A double free of a kept block, and record_stream on one: refused, nothing changed.
  {
    const auto before = a.stats();
    CHECK_THROWS_AS(a.deallocate(p[4], ns, true, 0), depot::invalid_argument);
    CHECK_THROWS_AS(a.deallocate(p[4], ns, false, 0), depot::invalid_argument);
    CHECK_THROWS_AS(a.record_stream(p[4], ns), depot::invalid_argument);
    CHECK(a.stats().allocated_bytes.all.current == before.allocated_bytes.all.current);
    CHECK(kept().blocks == 16);
    checked();
  }
  // The lists are full: p[1] merges as before (its kept neighbours stay as they are).
  a.deallocate(p[1], ns, true, 0);
  CHECK(kept().blocks == 16);
  CHECK(a.stats().inactive_split_bytes.all.current == static_cast<std::int64_t>(MiB + 64 * KiB));
  checked();
  // The next request of 128 units takes the last block kept (p[30]): a hit, no index.
  const auto hits = a.stats().num_cache_hits;
  const auto misses = a.stats().num_cache_misses;
  auto* q = static_cast<unsigned char*>(a.allocate(64 * KiB - 100, ns));
  CHECK(q == p[30]);
  CHECK(a.stats().num_cache_hits == hits + 1);
  CHECK(a.stats().num_cache_misses == misses);
  CHECK(a.stats().requested_bytes.all.current ==
        full.requested_bytes.all.current - static_cast<std::int64_t>(16 * 64 * KiB + 100));
  CHECK(kept().blocks == 15);
  checked();
  fill_bytes<D>(q, 64 * KiB - 100, 0xC3, s);
  // 48 KiB: none kept of that size; the free index has p[1]'s block, split.
  auto* r1 = static_cast<unsigned char*>(a.allocate(48 * KiB, ns));
  CHECK(r1 == p[1]);
  CHECK(kept().blocks == 15);
  // 48 KiB again: the index has 16 KiB only. The kept blocks are merged (with p[1]'s rest
  // too) and the request served from them: no new segment, no miss.
  auto* r2 = static_cast<unsigned char*>(a.allocate(48 * KiB, ns));
  CHECK(kept().blocks == 0);
  CHECK(a.stats().num_segments.all.current == 1);
  CHECK(a.stats().num_cache_misses == misses);
  CHECK(r2 >= p[0]);
  CHECK(r2 < p[0] + 2 * MiB);
  checked();
  // The odd blocks kept their contents through all of it; q and r1 theirs.
  fill_bytes<D>(r1, 48 * KiB, 0x5A, s);
  fill_bytes<D>(r2, 48 * KiB, 0xA5, s);
  for (int i = 3; i < 32; i += 2) CHECK(check_bytes<D>(p[i], 64 * KiB, static_cast<unsigned char>(i), rng));
  CHECK(check_bytes<D>(q, 64 * KiB - 100, 0xC3, rng));
  CHECK(check_bytes<D>(r1, 48 * KiB, 0x5A, rng));
  CHECK(check_bytes<D>(r2, 48 * KiB, 0xA5, rng));
  // Everything freed: up to 1 MiB kept again; empty_cache merges them and releases the segment.
  for (int i = 3; i < 32; i += 2) a.deallocate(p[i], ns, true, 0);
  a.deallocate(q, ns, true, 0);
  a.deallocate(r1, ns, true, 0);
  a.deallocate(r2, ns, true, 0);
  CHECK(kept().bytes > 0);
  CHECK(kept().bytes <= static_cast<std::int64_t>(MiB));
  checked();
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
  CHECK(a.stats().inactive_split_bytes.all.current == 0);
  checked();

  SUBCASE("over release_threshold, nothing is kept") {
    depot::allocator_config t = quiet_config<D>();
    t.release_threshold = 0;
    depot::detail::allocator_core b{std::make_unique<depot::device_upstream<D>>(0), t, depot::is_gpu_v<D>};
    void* x = b.allocate(4 * KiB, ns);
    void* y = b.allocate(4 * KiB, ns);
    b.deallocate(x, ns, true, 0);
    for (const auto& seg : b.snapshot().segments) {
      for (const auto& blk : seg.blocks) CHECK_FALSE(blk.kept);
    }
    // x merged with the segment's free rest: every byte but y's is one free block
    CHECK(b.stats().inactive_split_bytes.all.current == static_cast<std::int64_t>(2 * MiB - 4 * KiB));
    b.deallocate(y, ns, true, 0);  // merged, the segment whole free, released
    CHECK(b.stats().reserved_bytes.all.current == 0);
    CHECK(b.check_small_bits() == "");
  }
}

// A free of a dense block (<= 64 KiB) merges with its free neighbours as the segment's
// bitmap of free heads says (the previous block's head found by the distance back its
// entry keeps): merges with blocks of 128 to 1 664 units, at the segment's first and last
// unit, then a seeded fuzz checking the bitmap and the distances against the blocks after
// every operation and the contents at every free.
TEST_CASE_TEMPLATE("pool: dense blocks merge with free neighbours on either side, near and far", D,
                   DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg = quiet_config<D>();
  cfg.small_reuse_bytes = 0;  // every free merges at once (the kept blocks: their own test)
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<D>>(0), cfg, depot::is_gpu_v<D>};
  depot::stream<D> s;
  const depot::native_stream ns = s.native();
  const auto free_block_at = [&](const void* p) -> std::size_t {  // its size if a free block starts at p, else 0
    for (const auto& seg : a.snapshot().segments) {
      for (const auto& b : seg.blocks) {
        if (b.address == reinterpret_cast<std::uintptr_t>(p)) return b.state == depot::block_state::free ? b.size : 0;
      }
    }
    return 0;
  };
  {
    // 24 blocks of 64 KiB: the first 1.5 MiB of one fresh 2 MiB segment, in address order.
    std::vector<unsigned char*> p;
    for (int i = 0; i < 24; ++i) p.push_back(static_cast<unsigned char*>(a.allocate(64 * KiB, ns)));
    for (int i = 1; i < 24; ++i) REQUIRE(p[i] == p[0] + i * 64 * KiB);
    REQUIRE(a.stats().num_segments.all.current == 1);
    CHECK(a.check_small_bits() == "");
    for (int i = 2; i < 10; ++i) {  // each merges with the one before: 128, 256, ... units back
      a.deallocate(p[i], ns, false, 0);
      CHECK(a.check_small_bits() == "");
    }
    CHECK(free_block_at(p[2]) == 8 * 64 * KiB);
    a.deallocate(p[10], ns, false, 0);  // the previous free block's head is 1 024 units back
    CHECK(a.check_small_bits() == "");
    CHECK(free_block_at(p[2]) == 9 * 64 * KiB);
    CHECK(free_block_at(p[10]) == 0);
    a.deallocate(p[12], ns, false, 0);
    a.deallocate(p[11], ns, false, 0);  // both sides
    CHECK(a.check_small_bits() == "");
    CHECK(free_block_at(p[2]) == 11 * 64 * KiB);
    a.deallocate(p[23], ns, false, 0);  // merges with the segment's free rest, which ends at its last unit
    CHECK(free_block_at(p[23]) == 2 * MiB - 23 * 64 * KiB);
    CHECK(a.check_small_bits() == "");
    a.deallocate(p[0], ns, false, 0);  // unit 0: nothing before it
    CHECK(free_block_at(p[0]) == 64 * KiB);
    CHECK(a.check_small_bits() == "");
    // The best fit of 64 KiB is the block at unit 0, of exactly that size (the merged
    // blocks are larger).
    void* q = a.allocate(64 * KiB - 100, ns);
    CHECK(q == p[0]);
    CHECK(a.check_small_bits() == "");
    a.deallocate(q, ns, false, 0);
    a.deallocate(p[1], ns, false, 0);  // joins [p0, p1) and [p2, p13): 13 blocks, 1 664 units
    CHECK(free_block_at(p[0]) == 13 * 64 * KiB);
    CHECK(a.check_small_bits() == "");
    for (int i = 13; i < 23; ++i) a.deallocate(p[i], ns, false, 0);
    CHECK(free_block_at(p[0]) == 2 * MiB);  // the whole segment again
    CHECK(a.check_small_bits() == "");
    depot::test::check_invariants(a.stats(), a.snapshot());
  }
  {
    const auto seed = depot::test::seed("pool dense merges fuzz", 31);
    std::mt19937_64 rng{seed};
    struct live_block {
      void* p;
      std::size_t n;
      unsigned char id;
    };
    std::vector<live_block> live;
    std::size_t live_bytes = 0;
    int bad = 0;
    std::string first_error;
    for (int op = 0; op < 6000; ++op) {
      const bool grow = live.empty() || (live_bytes < 6 * MiB && rng() % 100 < 55);
      if (grow) {
        const std::size_t n = 1 + rng() % (rng() % 4 == 0 ? 4 * KiB : 64 * KiB);
        const auto id = static_cast<unsigned char>(op * 13 + 1);
        void* p = a.allocate(n, ns);
        fill_bytes<D>(p, n, id, s);
        live.push_back({p, n, id});
        live_bytes += n;
      } else {
        const std::size_t k = rng() % live.size();
        const live_block b = live[k];
        s.synchronize();
        if (!check_bytes<D>(b.p, b.n, b.id, rng)) ++bad;
        a.deallocate(b.p, ns, false, 0);
        live[k] = live.back();
        live.pop_back();
        live_bytes -= b.n;
      }
      if (std::string e = a.check_small_bits(); !e.empty() && first_error.empty()) first_error = "op " + std::to_string(op) + ": " + e;
      if (op % 200 == 0) depot::test::check_invariants(a.stats(), a.snapshot());
    }
    CHECK(first_error == "");
    CHECK(bad == 0);
    s.synchronize();
    for (const live_block& b : live) a.deallocate(b.p, ns, false, 0);
    CHECK(a.check_small_bits() == "");
    CHECK(a.stats().allocated_bytes.all.current == 0);
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
  }
}

TEST_CASE_TEMPLATE("pool: frees that name no stream find their block among 64 streams' caches", D, DEPOT_TEST_DEVICES)
{
  for (const bool expandable : {false, true}) {
    CAPTURE(expandable);
    depot::allocator_config cfg = quiet_config<D>();
    cfg.expandable_segments = expandable;
    depot::caching_allocator<D> a{0, cfg};
    const auto seed = depot::test::seed("pool frees naming no stream, 64 streams", 29);
    std::mt19937_64 rng{seed};
    std::vector<std::unique_ptr<depot::stream<D>>> streams;
    for (int i = 0; i < 64; ++i) streams.push_back(std::make_unique<depot::stream<D>>());
    struct live_block {
      void* p;
      std::size_t n;
      unsigned char id;
    };
    std::vector<live_block> live;
    // dense small (<= 64 KiB), linked small (<= 1 MiB) and large blocks on every stream
    const std::size_t kinds[] = {4 * KiB, 60 * KiB, 700 * KiB, 3 * MiB};
    for (std::size_t i = 0; i < streams.size(); ++i) {
      for (const std::size_t k : kinds) {
        const std::size_t n = 1 + rng() % k;
        const auto id = static_cast<unsigned char>(live.size() * 7 + 1);
        void* p = a.allocate(n, *streams[i]);
        fill_bytes<D>(p, n, id, *streams[i]);
        live.push_back({p, n, id});
      }
    }
    for (auto& s : streams) s->synchronize();
    std::shuffle(live.begin(), live.end(), rng);
    // freed last, by this thread: one larger than 512 bytes, so its address + 512 is inside it
    std::iter_swap(std::find_if(live.begin(), live.end(), [](const live_block& b) { return b.n > 512; }),
                   live.end() - 1);
    const live_block kept = live.back();
    live.pop_back();
    const std::int64_t before = a.stats().num_allocations.all.current;
    std::atomic<int> bad{0};
    std::thread consumer{[&] {
      std::mt19937_64 r{seed + 1};
      for (const live_block& b : live) {
        if (!check_bytes<D>(b.p, b.n, b.id, r)) bad.fetch_add(1);
        a.deallocate(b.p);
      }
    }};
    consumer.join();
    CHECK(bad.load() == 0);
    CHECK(a.stats().num_allocations.all.current == before - static_cast<std::int64_t>(live.size()));
    depot::test::check_invariants(a);
    // Refused, naming the pointer, and nothing changed.
    const depot::memory_stats held = a.stats();
    const auto refused = [&](void* p) {
      CAPTURE(p);
      const std::string where = depot::format_address(p);
      CHECK_THROWS_WITH_AS(a.deallocate(p), doctest::Contains(where.c_str()), depot::invalid_argument);
    };
    refused(live.front().p);                                   // freed already
    refused(static_cast<unsigned char*>(kept.p) + 512);        // inside a live block
    int outside = 0;
    refused(&outside);                                         // not this allocator's
    CHECK(a.stats().num_allocations.all.current == held.num_allocations.all.current);
    CHECK(a.stats().allocated_bytes.all.current == held.allocated_bytes.all.current);
    std::mt19937_64 r{seed + 2};
    CHECK(check_bytes<D>(kept.p, kept.n, kept.id, r));
    a.deallocate(kept.p);
    CHECK(a.stats().allocated_bytes.all.current == 0);
    depot::test::check_invariants(a);
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
  }
}

// A stream that finds no fitting block takes over every whole free segment of the pool it
// asks for from a destroyed stream's cache at once (one wait, not one per segment), and
// one from a live stream's cache: the smallest that fits (taking all made streams that
// alternate take them back and forth).
TEST_CASE_TEMPLATE("pool: a new stream takes over all of a destroyed stream's whole free segments", D,
                   DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  auto s1 = std::make_unique<depot::stream<D>>();
  const auto old = reinterpret_cast<std::uintptr_t>(s1->native());
  depot::stream<D> s2;  // made first, so it cannot get s1's handle
  const auto on = [&](std::uintptr_t h, bool small_pool) {
    return depot::test::segments_on(a.snapshot(), h, small_pool);
  };
  const auto s2h = reinterpret_cast<std::uintptr_t>(s2.native());
  std::vector<void*> dense;   // 60 KiB: dense small segments, 34 to a segment
  std::vector<void*> linked;  // 700 KiB: linked small segments, 2 to a segment
  for (int i = 0; i < 100; ++i) dense.push_back(a.allocate(60 * KiB, *s1));
  for (int i = 0; i < 6; ++i) linked.push_back(a.allocate(700 * KiB, *s1));
  void* keep = a.allocate(4 * KiB, *s1);  // its segment is not whole free: it stays
  for (void* p : dense) a.deallocate(p, *s1);
  for (void* p : linked) a.deallocate(p, *s1);
  s1->synchronize();
  s1.reset();  // destroyed: its cache is closed, with a fence
  const auto before = a.stats();
  const std::size_t small_on_s1 = on(old, true);
  REQUIRE(small_on_s1 >= 3 + 3);  // >= 3 dense and 3 linked segments
  CHECK(on(s2h, true) == 0);

  void* d = a.allocate(8 * KiB, s2);  // dense: every whole free dense segment moves
  check_invariants(a);
  const std::size_t moved_dense = on(s2h, true);
  CHECK(moved_dense >= 2);  // the 100 blocks spanned at least 3 segments, one keeps `keep`
  CHECK(on(old, true) == small_on_s1 - moved_dense);
  void* l = a.allocate(700 * KiB, s2);  // linked small: the 3 linked segments move
  check_invariants(a);
  CHECK(on(s2h, true) == moved_dense + 3);
  CHECK(on(old, true) == small_on_s1 - moved_dense - 3);
  const auto after = a.stats();
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);  // no growth
  CHECK(after.num_segments.all.current == before.num_segments.all.current);
  CHECK(after.num_cache_misses == before.num_cache_misses + 2);  // one per kind, not one per segment
  for (int i = 0; i < 60; ++i) dense.push_back(a.allocate(60 * KiB, s2));  // served by moved segments
  CHECK(a.stats().num_segments.all.current == before.num_segments.all.current);
  for (std::size_t i = 100; i < dense.size(); ++i) a.deallocate(dense[i], s2);
  a.deallocate(d, s2);
  a.deallocate(l, s2);
  a.deallocate(keep, s2);  // freed on a live stream: its cache is that stream's now
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

TEST_CASE_TEMPLATE("pool: a live stream's cache gives one whole free segment, the smallest that fits", D,
                   DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};  // steal_threshold 0: before growing
  depot::stream<D> s1;
  depot::stream<D> s2;
  const auto s1h = reinterpret_cast<std::uintptr_t>(s1.native());
  const auto s2h = reinterpret_cast<std::uintptr_t>(s2.native());
  const auto sizes_on = [&](std::uintptr_t h, bool small_pool) {
    std::vector<std::size_t> v;
    for (const auto& seg : a.snapshot().segments) {
      if (seg.stream == h && seg.small_pool == small_pool) v.push_back(seg.size);
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  // Large segments of 30, 50 and 40 MiB (each request its own segment), all freed.
  std::vector<void*> big;
  for (const std::size_t m : {30, 50, 40}) big.push_back(a.allocate(m * MiB, s1));
  for (void* p : big) a.deallocate(p, s1);
  // Three dense small segments, whole free.
  std::vector<void*> dense;
  for (int i = 0; i < 3 * 34; ++i) dense.push_back(a.allocate(60 * KiB, s1));
  for (void* p : dense) a.deallocate(p, s1);
  const std::size_t dense_on_s1 = sizes_on(s1h, true).size();
  REQUIRE(dense_on_s1 >= 3);
  REQUIRE(sizes_on(s1h, false) == std::vector<std::size_t>{30 * MiB, 40 * MiB, 50 * MiB});
  const auto before = a.stats();

  void* y = a.allocate(35 * MiB, s2);  // 40 MiB is the smallest that fits: only it moves
  CHECK(sizes_on(s2h, false) == std::vector<std::size_t>{40 * MiB});
  CHECK(sizes_on(s1h, false) == std::vector<std::size_t>{30 * MiB, 50 * MiB});
  void* d = a.allocate(8 * KiB, s2);  // one dense segment moves
  CHECK(sizes_on(s2h, true).size() == 1);
  CHECK(sizes_on(s1h, true).size() == dense_on_s1 - 1);
  const auto after = a.stats();
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);  // no growth
  CHECK(after.num_cache_misses == before.num_cache_misses + 2);
  check_invariants(a);
  // None of s1's fits 60 MiB: s2 grows.
  void* z = a.allocate(60 * MiB, s2);
  CHECK(sizes_on(s1h, false) == std::vector<std::size_t>{30 * MiB, 50 * MiB});
  CHECK(a.stats().reserved_bytes.all.current == before.reserved_bytes.all.current + static_cast<std::int64_t>(60 * MiB));
  a.deallocate(y, s2);
  a.deallocate(d, s2);
  a.deallocate(z, s2);
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

// When a stream's cache has no fitting block: destroyed streams' whole free segments are
// taken over first; a live stream's where steal_threshold says so (growing would pass it;
// 0, the default: always), else the allocator grows (no wait on another stream's work)
// and takes one over when growing is refused, before it releases its cache (no retry).
// A live stream's whole free segment taken over by another stream: while the old stream
// still has work queued (a long wait, then a fill of the block), the new stream's writes
// come after it (an event recorded there, waited for on the device); once a stream has no
// work left, the take-over queues nothing (its stream query stands in for the event).
TEST_CASE_TEMPLATE("pool: memory taken over from a busy stream is written after its work there, from an idle one at once",
                   D, DEPOT_TEST_DEVICES)
{
  const std::size_t n = 24 * MiB;  // one segment
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s1;
  depot::stream<D> s2;
  auto* x = static_cast<float*>(a.allocate(n, s1));
  depot::ops::busy_wait<D>(std::chrono::milliseconds(depot::is_gpu_v<D> ? 200 : 1), s1);
  depot::ops::fill<D, float>(x, n / sizeof(float), 1.0F, s1);
  a.deallocate(x, s1);  // free at once on s1, its fill still queued
  const auto events = a.stats().num_move_events;
  const bool busy = !s1.ready();  // (on a GPU: the 200 ms wait still runs)
  auto* y = static_cast<float*>(a.allocate(n, s2));
  CHECK(y == x);  // taken over, not grown
  CHECK(a.stats().num_segments_moved == 1);
  CHECK(a.stats().num_move_events == events + (busy ? 1 : 0));
  depot::ops::fill<D, float>(y, n / sizeof(float), 2.0F, s2);
  s2.synchronize();
  float last[4] = {};
  depot::runtime<D>::copy(last, y + n / sizeof(float) - 4, sizeof last);
  CHECK(last[3] == 2.0F);  // s1's fill came first
  a.deallocate(y, s2);
  s2.synchronize();  // s2 has nothing left to run
  CHECK(s2.ready());
  auto* z = static_cast<float*>(a.allocate(n, s1));
  CHECK(z == x);
  CHECK(a.stats().num_segments_moved == 2);
  CHECK(a.stats().num_move_events == events + (busy ? 1 : 0));  // no event for an idle stream
  check_invariants(a);
  a.deallocate(z, s1);
  s1.synchronize();
}

// Two threads on the per-thread default stream's handle, each its own stream: thread A's
// block, freed there with a long run of writes still queued, reaches this thread's
// allocation on the handle by a move that waits for the device's work (this thread's
// stream cannot wait for A's), so this thread's write lands last. A's exit closes its
// cache with a fence recorded on its stream (the backend's call made as the thread exits).
// (A's queue is the HAL's memsets, not ops' busy_wait: Kokkos 3.x with the OpenMP host
// backend makes no execution-space instance on a thread other than the one that
// initialised it, which the first GPU run of this test found.)
TEST_CASE_TEMPLATE("pool: a block freed on one thread's per-thread default stream is written on another's after that work",
                   D, DEPOT_TEST_DEVICES)
{
  const std::size_t n = 24 * MiB;  // one segment
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  const depot::stream_ref<D> ptds{reinterpret_cast<depot::native_stream>(depot::per_thread_stream_handle)};
  step_thread ta;
  void* x = nullptr;
  ta.run([&] {
    x = a.allocate(n, ptds);
    const int writes = depot::is_gpu_v<D> ? 400 : 1;  // (~4 ms on an H100)
    for (int k = 0; k < writes; ++k) depot::runtime<D>::set_async(x, k == writes - 1 ? 1 : 3, n, ptds.native());
    a.deallocate(x, ptds);  // at once, A's writes still queued (the last writes 1)
  });
  const auto syncs = a.stats().num_move_syncs;
  void* y = a.allocate(n, ptds);
  CHECK(y == x);  // taken over, not grown
  CHECK(a.stats().num_segments_moved == 1);
  CHECK(a.stats().num_move_syncs == syncs + (depot::is_gpu_v<D> ? 1 : 0));
  CHECK(a.stats().num_move_events == 0);
  depot::runtime<D>::set_async(y, 2, n, ptds.native());
  depot::runtime<D>::synchronize_stream(ptds.native());
  unsigned char last[4] = {};
  depot::runtime<D>::copy(last, static_cast<unsigned char*>(y) + n - sizeof last, sizeof last);
  CHECK(last[3] == 2);  // A's write came first
  a.deallocate(y, ptds);
  ta.run([&] { a.deallocate(a.allocate(n, ptds), ptds); });  // (a segment of A's again, then A exits)
  ta.finish();
  void* z = a.allocate(2 * n, ptds);
  check_invariants(a);
  a.deallocate(z, ptds);
  depot::runtime<D>::synchronize_stream(ptds.native());
}

TEST_CASE_TEMPLATE("pool: a miss grows before it takes over a live stream's segments, unless steal_threshold", D,
                   DEPOT_TEST_DEVICES)
{
  const std::size_t n = 24 * MiB;  // one 24 MiB segment each
  const auto stream_of = [](depot::caching_allocator<D>& a, void* p) {
    for (const auto& seg : a.snapshot().segments) {
      if (seg.address == reinterpret_cast<std::uintptr_t>(p)) return seg.stream;
    }
    return std::uintptr_t{0};
  };
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  SUBCASE("unlimited: grows while the upstream gives, then takes over a live stream's segment") {
    depot::allocator_config cfg = quiet_config<D>();
    cfg.steal_threshold = std::numeric_limits<std::size_t>::max();
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(3 * n - 1, counters), cfg};
    depot::stream<D> s1;
    depot::stream<D> s2;
    depot::stream<D> s3;
    void* x = a.allocate(n, s1);
    a.deallocate(x, s1);
    void* y = a.allocate(n, s2);  // s1 is live: a new segment
    CHECK(y != x);
    CHECK(stream_of(a, x) == reinterpret_cast<std::uintptr_t>(s1.native()));
    auto st = a.stats();
    CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(2 * n));
    CHECK(st.num_cache_misses == 2);
    CHECK(counters->failures.load() == 0);
    // A third segment passes the upstream's limit: s1's free one moves to s3.
    void* z = a.allocate(n, s3);
    CHECK(z == x);
    CHECK(stream_of(a, z) == reinterpret_cast<std::uintptr_t>(s3.native()));
    st = a.stats();
    CHECK(counters->failures.load() == 1);
    CHECK(st.num_alloc_retries == 0);  // taken over before the cache is released
    CHECK(st.num_ooms == 0);
    CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(2 * n));
    check_invariants(a);
    a.deallocate(y, s2);
    a.deallocate(z, s3);
  }
  SUBCASE("steal_threshold: past it, a live stream's segment moves before growing") {
    for (const std::size_t threshold : {std::size_t{0}, n, 2 * n - 1, 2 * n, std::size_t{1} << 50}) {
      CAPTURE(threshold);
      depot::allocator_config cfg = quiet_config<D>();
      CHECK(cfg.steal_threshold == 0);  // the default
      cfg.steal_threshold = threshold;
      depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters), cfg};
      depot::stream<D> s1;
      depot::stream<D> s2;
      void* x = a.allocate(n, s1);  // nothing to take over: grows
      a.deallocate(x, s1);
      void* y = a.allocate(n, s2);  // 24 MiB reserved: growing makes 48 MiB
      const bool stolen = threshold < 2 * n;
      CHECK((y == x) == stolen);
      CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(stolen ? n : 2 * n));
      CHECK(stream_of(a, x) == reinterpret_cast<std::uintptr_t>((stolen ? s2 : s1).native()));
      check_invariants(a);
      a.deallocate(y, s2);
    }
  }
  SUBCASE("a destroyed stream's segment moves first, whatever the threshold") {
    depot::allocator_config cfg = quiet_config<D>();
    cfg.steal_threshold = std::numeric_limits<std::size_t>::max();
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters), cfg};
    void* x = nullptr;
    {
      depot::stream<D> gone;
      x = a.allocate(n, gone);
      a.deallocate(x, gone);
    }
    depot::stream<D> s2;
    void* y = a.allocate(n, s2);
    CHECK(y == x);
    CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(n));
    CHECK(stream_of(a, y) == reinterpret_cast<std::uintptr_t>(s2.native()));
    a.deallocate(y, s2);
  }
  CHECK(counters->outstanding.load() == 0);
}

// A steal from another stream's cache orders the thief's stream after the victim's by an
// event where the victim's lifetime is known (a depot::stream, or a handle registered with
// stream_registry), and only for a raw handle by synchronising the device. A closed
// stream's cache keeps a fence event: a steal, or a new stream that reuses the handle,
// waits for that event. The event calls are counted on an asynchronous backend on the CPU.
// steal_threshold 0: live streams' segments are taken over before growing.
TEST_CASE("pool: steals and reused handles are ordered by events where the stream's lifetime is known")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::allocator_config cfg = quiet_config<depot::host>();
  cfg.steal_threshold = 0;
  auto a = std::make_unique<depot::detail::allocator_core>(std::make_unique<manual_event_upstream>(ev), cfg,
                                                           /*asynchronous=*/true);
  const depot::device_id dev{depot::device_kind::host, 0};
  const std::size_t n = 8 * MiB;
  const auto addr = [](auto p) { return reinterpret_cast<std::uintptr_t>(p); };
  depot::stream<depot::host> thief;

  SUBCASE("a live depot::stream: an event on it, waited for on the thief's stream") {
    depot::stream<depot::host> victim;
    void* x = a->allocate(n, victim.native());
    a->deallocate(x, victim.native(), true, 0);
    const int recorded = ev->recorded;
    void* y = a->allocate(n, thief.native());  // no fit in the thief's cache: the segment moves
    CHECK(y == x);
    CHECK(ev->recorded == recorded + 1);
    CHECK(ev->stream_waits == 1);
    CHECK(ev->waiting_stream == addr(thief.native()));
    CHECK(ev->waited_event == ev->next);  // the event just recorded on the victim
    CHECK(ev->syncs == 0);
    CHECK(ev->open.empty());  // destroyed once the wait was queued
    a->deallocate(y, thief.native(), true, 0);
  }
  // A raw handle may be destroyed at any time: the device's work is finished. The default
  // stream (and the per-thread ones, handles 1 and 2) never is: an event on it.
  std::uintptr_t victim_handle = 1;  // (1: none of these subcases)
  int syncs = 0;
  SUBCASE("a raw handle") {
    victim_handle = 0x1000;
    syncs = 1;
  }
  SUBCASE("the default stream") { victim_handle = 0; }
  SUBCASE("the per-thread default stream") { victim_handle = 2; }
  if (victim_handle != 1) {
    const auto victim = reinterpret_cast<depot::native_stream>(victim_handle);
    void* x = a->allocate(n, victim);
    a->deallocate(x, victim, true, 0);
    void* y = a->allocate(n, thief.native());
    CHECK(y == x);
    CHECK(ev->syncs == syncs);
    CHECK(ev->stream_waits == 1 - syncs);
    a->deallocate(y, thief.native(), true, 0);
  }
  SUBCASE("a destroyed stream: its fence, waited for while open, dropped once complete") {
    // The thief has a cache of its own first (else it would take the destroyed stream's
    // cache over: the next test case), so its miss takes the segments over.
    a->deallocate(a->allocate(512, thief.native()), thief.native(), true, 0);
    void* x = nullptr;
    void* x2 = nullptr;
    {
      depot::stream<depot::host> victim;
      x = a->allocate(n, victim.native());
      x2 = a->allocate(2 * n, victim.native());
      a->deallocate(x, victim.native(), true, 0);
      a->deallocate(x2, victim.native(), true, 0);
      CHECK(ev->recorded == 0);
    }
    CHECK(ev->recorded == 1);  // the fence, at the stream's last work
    const std::uintptr_t fence = ev->next;
    CHECK(ev->open.count(fence) == 1);
    const auto reserved = a->stats().reserved_bytes.all.current;
    void* y = a->allocate(n, thief.native());  // both whole free segments move at once
    CHECK((y == x || y == x2));                // (best fit: it may be the 16 MiB one)
    CHECK(a->stats().reserved_bytes.all.current == reserved);
    CHECK(ev->recorded == 1);  // no event on the destroyed stream
    CHECK(ev->stream_waits == 1);
    CHECK(ev->waiting_stream == addr(thief.native()));
    CHECK(ev->waited_event == fence);
    CHECK(ev->syncs == 0);
    check_invariants(a->stats(), a->snapshot());
    a->deallocate(y, thief.native(), true, 0);
    a->empty_cache();  // the fence is still open: not waited for, kept
    CHECK(ev->open.count(fence) == 1);
    ev->open.clear();  // the fence completes
    a->empty_cache();
    CHECK(ev->syncs == 0);
    CHECK(a->stats().reserved_bytes.all.current == 0);
  }
  SUBCASE("a new stream with a closed stream's handle waits for the fence before a cached block") {
    const auto h = fake_stream(0x3000);
    depot::stream_registry::opened(dev, h);
    void* x = a->allocate(n, h);
    a->deallocate(x, h, true, 0);
    depot::stream_registry::closing(dev, h);
    CHECK_FALSE(depot::stream_registry::live(dev.kind, h));
    CHECK(ev->recorded == 1);
    const std::uintptr_t fence = ev->next;
    depot::stream_registry::opened(dev, h);  // a new stream, the same handle
    void* y = a->allocate(n, h);             // a cache hit, on the new stream
    CHECK(y == x);
    CHECK(ev->stream_waits == 1);
    CHECK(ev->waiting_stream == addr(h));
    CHECK(ev->waited_event == fence);
    CHECK(ev->open.count(fence) == 0);  // consumed
    void* z = a->allocate(n, h);  // the cache is the new stream's now: no more waits
    CHECK(ev->stream_waits == 1);
    a->deallocate(y, h, true, 0);
    a->deallocate(z, h, true, 0);
    // Stolen from while live (the new stream): an event on it; then closed again with
    // its fence complete: nothing to wait for.
    depot::stream_registry::closing(dev, h);
    ev->open.clear();
    void* w = a->allocate(n, thief.native());
    CHECK(ev->stream_waits == 1);
    CHECK(ev->syncs == 0);
    a->deallocate(w, thief.native(), true, 0);
  }
  SUBCASE("a free into a closed stream's cache: on a new stream with the handle, it waits for the fence") {
    const auto h = fake_stream(0x6000);
    const std::size_t m = 24 * MiB;  // a segment each
    depot::stream_registry::opened(dev, h);
    void* x = a->allocate(m, h);
    void* x2 = a->allocate(m, h);
    depot::stream_registry::closing(dev, h);  // x and x2 are still allocated
    const std::uintptr_t fence = ev->next;
    CHECK(ev->recorded == 1);
    // Freed unnamed, or on the dead handle: its uses were the closed stream's, before the
    // fence. A steal then waits for the fence alone (no event on the dead handle).
    a->deallocate(x, h, true, 0);
    void* y = a->allocate(m, thief.native());
    CHECK(y == x);
    CHECK(ev->recorded == 1);
    CHECK(ev->stream_waits == 1);
    CHECK(ev->waited_event == fence);
    CHECK(ev->waiting_stream == addr(thief.native()));
    // Freed on a new stream with the handle: that stream waits for the fence, and the
    // cache is its own from then on (a steal records an event on it).
    depot::stream_registry::opened(dev, h);
    a->deallocate(x2, h, true, 0);
    CHECK(ev->stream_waits == 2);
    CHECK(ev->waiting_stream == addr(h));
    CHECK(ev->waited_event == fence);
    void* y2 = a->allocate(m, thief.native());  // the thief's cache has no free block: steals x2
    CHECK(y2 == x2);
    CHECK(ev->recorded == 2);  // an event on the new stream
    CHECK(ev->stream_waits == 3);
    CHECK(ev->syncs == 0);
    a->deallocate(y, thief.native(), true, 0);
    a->deallocate(y2, thief.native(), true, 0);
    depot::stream_registry::closing(dev, h);
  }
  SUBCASE("another device's closing, or a closing after the allocator is gone, changes nothing") {
    const auto h = fake_stream(0x4000);
    depot::stream_registry::opened(dev, h);
    void* x = a->allocate(n, h);
    a->deallocate(x, h, true, 0);
    depot::stream_registry::closing(depot::device_id{depot::device_kind::cuda, 0}, h);
    CHECK(ev->recorded == 0);
    depot::stream_registry::closing(depot::device_id{depot::device_kind::host, 1}, h);
    CHECK(ev->recorded == 0);
    a.reset();  // unwatches: the closing below must not reach it (ASan would see it)
    depot::stream_registry::closing(dev, h);
    CHECK(ev->recorded == 0);
  }
  SUBCASE("memory ordered by another backend's streams (pinned host memory) hears only those") {
    auto ev2 = std::make_shared<manual_event_upstream::state>();
    ev2->streams = depot::device_id{depot::device_kind::cuda, -1};  // any CUDA device
    depot::detail::allocator_core pinned = async_core(ev2);
    const auto h = fake_stream(0x5000);
    void* x = pinned.allocate(n, h);
    pinned.deallocate(x, h, true, 0);
    depot::stream_registry::closing(dev, h);  // a host stream: not one of its streams
    CHECK(ev2->recorded == 0);
    { depot::stream<depot::host> host_stream; }
    CHECK(ev2->recorded == 0);
    depot::stream_registry::closing(depot::device_id{depot::device_kind::cuda, 3}, h);
    CHECK(ev2->recorded == 1);  // its fence
    pinned.empty_cache();
  }
  SUBCASE("an event refused at a steal: the device's work is finished instead") {
    depot::stream<depot::host> victim;
    void* x = a->allocate(n, victim.native());
    a->deallocate(x, victim.native(), true, 0);
    ev->fail_events = true;
    void* y = a->allocate(n, thief.native());
    CHECK(y == x);
    CHECK(ev->syncs == 1);
    CHECK(ev->stream_waits == 0);
    ev->fail_events = false;
    a->deallocate(y, thief.native(), true, 0);
  }
  if (a) {
    check_invariants(a->stats(), a->snapshot());
    a->empty_cache();
  }
}

// record_stream on a destroyed stream's handle that a new stream was given (as CUDA gives
// the next stream): a use by another stream than the block's, so its free, unnamed or on
// that handle, waits for an event there before the block is handed out again. The
// modelled-device fuzz found it (a second seed, 2026-12-06, once small frees changed which
// segments moved): the use was taken for the block's own stream and dropped, the unnamed
// free released the block at once into the closed cache, and a steal handed its whole free
// segment to another stream ordered after the fence only, while the new stream's work on
// the block could still run.
TEST_CASE("pool: record_stream on a closed stream's handle that names a new stream orders the block's free after it")
{
  const std::size_t n = each_block_kind();
  CAPTURE(n);
  for (const bool named : {false, true}) {  // freed unnamed, or on the handle
    CAPTURE(named);
    auto ev = std::make_shared<manual_event_upstream::state>();
    depot::detail::allocator_core a = async_core(ev);
    const depot::device_id dev = ev->streams;
    const auto addr = [](auto p) { return reinterpret_cast<std::uintptr_t>(p); };
    const auto h = fake_stream(0x7300000);
    depot::stream_registry::opened(dev, h);
    void* x = a.allocate(n, h);
    close_raw_stream(*ev, h, false);  // its cache closed, a fence recorded on h
    REQUIRE(ev->recorded == 1);
    depot::stream_registry::opened(dev, h);  // a new stream, given the same handle
    {
      const std::lock_guard g{ev->mu};
      ev->dead.erase(addr(h));
    }
    a.record_stream(x, h);  // the new stream uses x
    if (named) {
      a.deallocate(x, h, true, 0);
    } else {
      a.deallocate(x, nullptr, false, 0);
    }
    CHECK(ev->recorded == 2);  // an event on the new stream, for its use
    CHECK(ev->last_record_stream == addr(h));
    CHECK(ev->dead_records == 0);
    CHECK(pending_in(a) == 1);
    // Another stream's allocation gets other memory while that event is open (without the
    // listed use: x, its segment whole free in the closed cache, stolen).
    const auto h2 = fake_stream(0x7400000);
    depot::stream_registry::opened(dev, h2);
    void* y = a.allocate(n, h2);
    CHECK(y != x);
    // The event done: x is back in the cache.
    {
      const std::lock_guard g{ev->mu};
      ev->open.clear();
    }
    a.deallocate(y, h2, true, 0);
    a.empty_cache();
    CHECK(pending_in(a) == 0);
    check_invariants(a.stats(), a.snapshot());
    close_raw_stream(*ev, h2, true);
    close_raw_stream(*ev, h, true);
  }
}

// The same orders on the device: the victim stream's last work on a block is slow (queued
// behind large fills), the thief writes the block at once. Without an order the victim's
// late fill would overwrite the thief's. Each way a block can change streams: a steal from
// a live stream (steal_threshold 0), a steal from a destroyed one, and a new stream (maybe
// with the old handle).
// A code that makes a stream per phase: the next phase's stream (a handle of its own) takes
// the destroyed stream's cache over with its free segments of every kind, so its
// allocations are cache hits, not a miss and a steal per kind, and no cache is made; its
// first allocation waits for the old stream's fence on the new stream (never the device's
// work, never an event on the dead handle). An allocation that fails while it opens the
// cache (the wait refused) leaves the cache closed with its fence: when that stream is
// destroyed too, the cache is a spare again and the next stream waits for the same fence.
TEST_CASE("pool: a new stream takes a destroyed stream's cache over with its free memory, after its fence")
{
  auto ev = std::make_shared<manual_event_upstream::state>();
  depot::detail::allocator_core a = async_core(ev);
  const depot::device_id dev = ev->streams;
  const auto addr = [](auto p) { return reinterpret_cast<std::uintptr_t>(p); };
  // dense small (60 KiB), linked small (700 KiB) and large (8 MiB) blocks
  const std::vector<std::size_t> sizes = {60 * KiB, 60 * KiB, 60 * KiB, 60 * KiB, 60 * KiB, 60 * KiB,
                                          700 * KiB, 700 * KiB, 700 * KiB, 8 * MiB, 8 * MiB};
  const auto phase = [&](depot::native_stream s, unsigned char id) {
    std::vector<void*> mine;
    for (std::size_t n : sizes) {
      auto* p = static_cast<unsigned char*>(a.allocate(n, s));
      std::memset(p, id, n);
      mine.push_back(p);
    }
    int bad = 0;
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (!holds_id(static_cast<unsigned char*>(mine[k]), sizes[k], id)) ++bad;
      a.deallocate(mine[k], s, true, 0);
    }
    return bad;
  };
  const auto on_stream = [&](depot::native_stream s) {
    const depot::allocator_snapshot snap = a.snapshot();
    return std::pair{depot::test::segments_on(snap, addr(s)), snap.segments.size()};
  };
  const auto h1 = fake_stream(0x7100000);
  depot::stream_registry::opened(dev, h1);
  CHECK(phase(h1, 1) == 0);
  const depot::memory_stats before = a.stats();
  REQUIRE(before.num_cache_misses >= 3);  // one kind each at least
  close_raw_stream(*ev, h1, false);
  REQUIRE(ev->recorded == 1);
  const std::uintptr_t fence = ev->next;

  const auto h2 = fake_stream(0x7200000);
  depot::stream_registry::opened(dev, h2);
  SUBCASE("taken over at the first allocation") {
    CHECK(phase(h2, 2) == 0);
    const depot::memory_stats after = a.stats();
    CHECK(after.num_cache_misses == before.num_cache_misses);  // every allocation a cache hit
    CHECK(after.num_cache_hits == before.num_cache_hits + static_cast<std::int64_t>(sizes.size()));
    CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);
    CHECK(after.num_segments.all.current == before.num_segments.all.current);
    CHECK(a.stream_caches() == 1);
    const auto [mine, all] = on_stream(h2);
    CHECK(mine == all);  // every segment came along
    CHECK(ev->stream_waits == 1);  // the fence, waited for on the new stream, once
    CHECK(ev->waiting_stream == addr(h2));
    CHECK(ev->waited_event == fence);
    CHECK(ev->open.count(fence) == 0);  // consumed
    CHECK(ev->recorded == 1);           // no event on either stream
    CHECK(ev->syncs == 0);
    CHECK(ev->dead_records == 0);
    check_invariants(after, a.snapshot());
    CHECK(a.check_directory() == "");
  }
  SUBCASE("an allocation that fails as it opens the cache, then its stream destroyed too") {
    ev->fail_waits = true;
    CHECK_THROWS_AS((void)a.allocate(8 * MiB, h2), depot::error);
    ev->fail_waits = false;
    CHECK(a.stream_caches() == 1);
    CHECK(ev->open.count(fence) == 1);  // not waited for, kept
    CHECK(ev->stream_waits == 0);
    close_raw_stream(*ev, h2, false);
    CHECK(ev->recorded == 1);  // its fence stands: nothing ran on the cache since
    const auto h3 = fake_stream(0x7300000);
    depot::stream_registry::opened(dev, h3);
    CHECK(phase(h3, 3) == 0);
    CHECK(a.stream_caches() == 1);  // a spare again: taken over once more (2 before)
    CHECK(a.stats().num_cache_misses == before.num_cache_misses);
    CHECK(ev->stream_waits == 1);
    CHECK(ev->waiting_stream == addr(h3));
    CHECK(ev->waited_event == fence);
    CHECK(ev->syncs == 0);
    const auto [mine, all] = on_stream(h3);
    CHECK(mine == all);
    check_invariants(a.stats(), a.snapshot());
    close_raw_stream(*ev, h3, true);
  }
  close_raw_stream(*ev, h2, true);
  check_ends_empty(a);
}

// Each phase of a code on a stream of its own (made and destroyed): the free memory of the
// phase before serves it, written after that phase's work. Every device: the blocks keep
// what each phase wrote, no phase after the first misses, and the caches stay few.
TEST_CASE_TEMPLATE("pool: a stream per phase finds the phase before's free memory", D, DEPOT_TEST_DEVICES)
{
  depot::detail::allocator_core a{std::make_unique<depot::device_upstream<D>>(0), quiet_config<D>(),
                                  depot::is_gpu_v<D>};
  std::mt19937_64 rng{depot::test::seed("pool stream per phase", 31)};
  const std::vector<std::size_t> sizes = {60 * KiB, 60 * KiB, 60 * KiB, 700 * KiB, 700 * KiB, 8 * MiB, 24 * MiB};
  std::int64_t misses_after_first = -1;
  std::int64_t reserved_after_first = -1;
  int bad = 0;
  // Each phase's stream is made before the phase before's is destroyed, so the backend
  // cannot give it that one's handle (which would reopen that one's cache, not take it over).
  auto next = std::make_unique<depot::stream<D>>();
  for (int i = 0; i < 24; ++i) {
    const std::unique_ptr<depot::stream<D>> current = std::move(next);
    depot::stream<D>& s = *current;
    std::vector<void*> mine;
    for (std::size_t n : sizes) mine.push_back(a.allocate(n, s.native()));
    for (std::size_t k = 0; k < mine.size(); ++k) {
      fill_bytes<D>(mine[k], sizes[k], static_cast<unsigned char>(i + 1), s);
    }
    s.synchronize();
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (!check_bytes<D>(mine[k], sizes[k], static_cast<unsigned char>(i + 1), rng)) ++bad;
      // (the last phase's work, queued after the check, still runs as its stream goes)
      fill_bytes<D>(mine[k], sizes[k], 0xEE, s);
      a.deallocate(mine[k], s.native(), true, 0);
    }
    next = std::make_unique<depot::stream<D>>();
    if (i == 0) {
      misses_after_first = a.stats().num_cache_misses;
      reserved_after_first = a.stats().reserved_bytes.all.current;
    }
  }
  const depot::memory_stats st = a.stats();
  next.reset();
  MESSAGE("24 phases: misses " << st.num_cache_misses << " (after the first phase " << misses_after_first
                               << "), stream caches " << a.stream_caches());
  CHECK(bad == 0);
  CHECK(st.num_cache_misses == misses_after_first);
  CHECK(st.reserved_bytes.all.peak == reserved_after_first);
  CHECK(a.stream_caches() <= 2);
  check_ends_empty(a);
}

TEST_CASE_TEMPLATE("pool: a block that changes streams is written after the last stream's work", D,
                   DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg = quiet_config<D>();
  cfg.steal_threshold = 0;
  depot::caching_allocator<D> a{0, cfg};
  const std::size_t busy_n = depot::is_gpu_v<D> ? std::size_t{1} << 30 : 1 * MiB;
  const std::size_t n = 64 * MiB;
  std::mt19937_64 rng{depot::test::seed("pool block changes streams", 7)};
  int how = 0;
  SUBCASE("stolen from a live stream") { how = 0; }
  SUBCASE("stolen from a destroyed stream") { how = 1; }
  SUBCASE("a new stream after the old one was destroyed") { how = 2; }
  SUBCASE("a new stream takes the destroyed one's cache over") { how = 3; }
  CAPTURE(how);
  auto s1 = std::make_unique<depot::stream<D>>();
  const depot::native_stream old_handle = s1->native();
  void* busy = a.allocate(busy_n, *s1);
  void* x = a.allocate(n, *s1);
  for (int i = 0; i < 8; ++i) fill_bytes<D>(busy, busy_n, static_cast<unsigned char>(i), *s1);
  fill_bytes<D>(x, n, 1, *s1);  // lands after the 8 GiB of fills on the GPU (~3 ms)
  a.deallocate(x, *s1);
  a.deallocate(busy, *s1);
  std::unique_ptr<depot::stream<D>> keep;
  if (how == 0) keep = std::move(s1);
  // The second and fourth ways' new stream is made before the old one goes (so its handle
  // is another); the second's has a cache of its own then, so its miss takes the segment
  // over; the fourth's has none, so it takes the whole closed cache over.
  std::unique_ptr<depot::stream<D>> s2p;
  if (how == 1 || how == 3) s2p = std::make_unique<depot::stream<D>>();
  if (how == 1) a.deallocate(a.allocate(512, *s2p), *s2p);
  s1.reset();
  // A new stream; for the third way, one with the old handle if the backend gives it back
  // within 64 streams (then the block is a cache hit on a closed stream's cache).
  std::vector<depot::stream<D>> tried;
  if (!s2p) s2p = std::make_unique<depot::stream<D>>();
  for (int i = 0; how == 2 && s2p->native() != old_handle && i < 64; ++i) {
    tried.push_back(std::move(*s2p));
    s2p = std::make_unique<depot::stream<D>>();
  }
  depot::stream<D>& s2 = *s2p;
  if (how == 2) MESSAGE("the new stream reuses the destroyed one's handle: " << (s2.native() == old_handle));
  if (how == 3) CHECK(s2.native() != old_handle);
  // Measured, not asserted: the allocation returns while the old stream's work still runs
  // (a device synchronisation would wait for it).
  const auto t0 = std::chrono::steady_clock::now();
  void* y = a.allocate(n, s2);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(y == x);  // the same block, moved (or reused)
  fill_bytes<D>(y, n, 2, s2);
  s2.synchronize();
  const auto t2 = std::chrono::steady_clock::now();
  depot::runtime<D>::synchronize(0);
  using us = std::chrono::duration<double, std::micro>;
  MESSAGE("allocate on the new stream took " << us(t1 - t0).count() << " us; its fill then took "
          << us(t2 - t1).count() << " us (on a GPU, most of it waiting for the old stream's work)");
  CHECK(check_bytes<D>(y, n, 2, rng));
  a.deallocate(y, s2);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: producer and consumer on two streams", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> producer;
  depot::stream<D> consumer;
  std::mt19937_64 rng{depot::test::seed("pool producer consumer", 42)};
  for (int i = 0; i < 50; ++i) {
    const std::size_t n = 4096 + rng() % (3 * MiB);
    void* p = a.allocate(n, producer);
    fill_bytes<D>(p, n, static_cast<unsigned char>(i + 1), producer);
    depot::event<D> ready;
    ready.record(producer);
    consumer.wait(ready);
    std::vector<unsigned char> out(n);
    a.record_stream(p, consumer);
    depot::runtime<D>::copy_async(out.data(), p, n, consumer.native());
    a.deallocate(p, producer);
    consumer.synchronize();
    REQUIRE(out.front() == static_cast<unsigned char>(i + 1));
    REQUIRE(out.back() == static_cast<unsigned char>(i + 1));
  }
  producer.synchronize();
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: four threads at once", D, DEPOT_TEST_DEVICES)
{
  // Each thread on its own stream, checking its blocks' contents. stats_batch 64 KiB: each
  // thread's own peak of requested bytes is a lower bound of the shared peak, and the sum
  // of their peaks plus what three other caches may hold unpublished (64 KiB, or one block
  // that crossed it) an upper bound; current figures and totals are exact at the end.
  // Thread 0 empties the cache now and then, so segments go (and expandable ones shrink)
  // while the others grow theirs.
  depot::allocator_config cfg = quiet_config<D>();
  cfg.stats_batch = 64 * KiB;
  SUBCASE("ordinary segments") {}
  SUBCASE("expandable segments") { cfg.expandable_segments = true; }
  SUBCASE("ordinary segments, locks never biased") { cfg.biased_locks = false; }
  depot::caching_allocator<D> a{0, cfg};
  std::atomic<int> errors{0};
  std::atomic<std::int64_t> made{0};
  std::vector<std::int64_t> own_peak(4, 0);
  const auto seed = depot::test::seed("pool threads", 4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + static_cast<unsigned>(t)};
      depot::stream<D> s;
      std::vector<std::pair<void*, std::size_t>> mine;
      std::int64_t live_bytes = 0;
      for (int i = 0; i < 3000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 4 * MiB : 64 * 1024);
          void* p = a.allocate(n, s);
          ++made;
          depot::runtime<D>::set_async(p, t + 1, std::min<std::size_t>(n, 256), s.native());
          mine.emplace_back(p, n);
          live_bytes += static_cast<std::int64_t>(n);
          own_peak[static_cast<std::size_t>(t)] = std::max(own_peak[static_cast<std::size_t>(t)], live_bytes);
        } else {
          const auto k = rng() % mine.size();
          unsigned char probe = 0;
          s.synchronize();
          depot::runtime<D>::copy(&probe, mine[k].first, 1);
          if (probe != t + 1) ++errors;
          a.deallocate(mine[k].first, s);
          live_bytes -= static_cast<std::int64_t>(mine[k].second);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
        if (t == 0 && i % 500 == 499) a.empty_cache();
      }
      s.synchronize();
      for (auto& [p, n] : mine) a.deallocate(p, s);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  CHECK((a.expandable_page() != 0) == cfg.expandable_segments);
  const depot::memory_stats st = a.stats();
  std::int64_t sum = 0;
  for (const std::int64_t p : own_peak) {
    CHECK(st.requested_bytes.all.peak >= p);
    sum += p;
  }
  CHECK(st.requested_bytes.all.peak <= sum + 3 * static_cast<std::int64_t>(64 * KiB + 4 * MiB));
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.requested_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == made.load());
  CHECK(st.num_allocations.all.freed == made.load());
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

// What a reader of the statistics may always expect, whatever other threads do: pools that
// sum to "all", peaks at least their current figures, freed = allocated - current, cached =
// reserved - allocated, active at least allocated.
bool consistent(const depot::memory_stats& st)
{
  for (const depot::stat_array* x : {&st.allocated_bytes, &st.requested_bytes, &st.reserved_bytes,
                                     &st.active_bytes, &st.num_allocations, &st.inactive_split_bytes}) {
    if (x->all.current != x->large.current + x->small.current || x->all.peak < x->all.current ||
        x->large.peak < x->large.current || x->small.peak < x->small.current ||
        x->all.freed != x->all.allocated - x->all.current) {
      return false;
    }
  }
  return st.cached_bytes.all.current == st.reserved_bytes.all.current - st.allocated_bytes.all.current &&
         st.active_bytes.all.current >= st.allocated_bytes.all.current;
}

// Every allocation freed: nothing current, as much freed as allocated.
void check_all_freed(const depot::memory_stats& st)
{
  for (const depot::stat_array* x : {&st.allocated_bytes, &st.requested_bytes, &st.active_bytes,
                                     &st.num_allocations}) {
    CHECK(x->all.current == 0);
    CHECK(x->all.freed == x->all.allocated);
  }
}

// Joins the workers, then stops and joins the reader of the statistics; the figures after.
template <class D>
depot::memory_stats join_then_stats(depot::caching_allocator<D>& a, std::vector<std::thread>& workers,
                                    std::atomic<bool>& done, std::thread& reader)
{
  for (auto& th : workers) th.join();
  done.store(true);
  reader.join();
  return a.stats();
}

TEST_CASE_TEMPLATE("pool: four threads sharing four streams, and a reader of the statistics", D,
                   DEPOT_TEST_DEVICES)
{
  // Every thread alternates among the same four streams, so a thread's change of cache
  // often finds the previous cache held by another thread (its changes then stay there) or
  // free (the two caches swap deltas, or its changes are published, or stay there while
  // another thread publishes), while a reader publishes every cache's all along.
  // Whatever moved where, the totals must come out exact and every figure consistent.
  depot::allocator_config cfg = quiet_config<D>();
  SUBCASE("the default batch") {}
  SUBCASE("a batch no drift reaches") { cfg.stats_batch = std::size_t{1} << 40; }
  depot::caching_allocator<D> a{0, cfg};
  std::vector<depot::stream<D>> streams(4);
  std::atomic<int> inconsistent{0};
  std::atomic<bool> done{false};
  const auto seed = depot::test::seed("pool shared streams", 5);
  std::thread reader([&] {
    while (!done.load()) {
      const depot::memory_stats st = a.stats();
      if (!consistent(st) || st.requested_bytes.all.current < 0) ++inconsistent;
    }
  });
  std::atomic<std::int64_t> requested_peak_bound{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + static_cast<unsigned>(t)};
      std::vector<std::pair<void*, std::size_t>> mine;  // (block, its stream)
      std::int64_t requested = 0;
      for (int i = 0; i < 3000; ++i) {
        if (mine.size() < 40 && (mine.empty() || rng() % 2 == 0)) {
          const std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 24 * MiB : 48 * KiB);
          const std::size_t k = rng() % streams.size();
          mine.emplace_back(a.allocate(n, streams[k]), k);
          requested += static_cast<std::int64_t>(n);
        } else {
          const auto j = rng() % mine.size();
          a.deallocate(mine[j].first, streams[mine[j].second]);
          mine.erase(mine.begin() + static_cast<long>(j));
        }
      }
      for (auto& [p, k] : mine) a.deallocate(p, streams[k]);
      requested_peak_bound += requested;
    });
  }
  const depot::memory_stats st = join_then_stats(a, threads, done, reader);
  CHECK(inconsistent.load() == 0);
  check_all_freed(st);
  // (inactive split bytes: those of the blocks kept for reuse, which check_invariants
  // compares with the snapshot's; none once they are merged)
  a.empty_cache();
  CHECK(a.stats().inactive_split_bytes.all.current == 0);
  CHECK(st.requested_bytes.all.allocated == requested_peak_bound.load());
  CHECK(st.requested_bytes.all.peak > 0);
  CHECK(st.requested_bytes.all.peak <= requested_peak_bound.load());
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: eight threads free the blocks of sixteen streams at once, beside a reader", D,
                   DEPOT_TEST_DEVICES)
{
  // One thread allocates every block (its peaks are exact: the sum of the blocks), then
  // eight threads free them in a random order, each from the streams it finds, so nearly
  // every free changes cache into one whose delta holds another thread's frees, while a
  // reader publishes all along: a thread then finds the shared figures' lock or its
  // previous cache held by another thread and leaves its changes in that cache's delta
  // (switch_op). Frees only lower the
  // figures, so no peak may rise past the sum, and the totals must come out exact.
  depot::allocator_config cfg = quiet_config<D>();
  depot::caching_allocator<D> a{0, cfg};
  std::vector<depot::stream<D>> streams(16);
  const auto seed = depot::test::seed("pool sixteen streams freed at once", 11);
  std::mt19937_64 rng{seed};
  struct block {
    void* p;
    std::size_t stream;
    bool named;
  };
  std::vector<block> blocks;
  std::int64_t sum = 0;
  for (int i = 0; i < 4096; ++i) {
    const std::size_t n = 512 * (1 + rng() % 16);  // whole units: allocated = requested
    const std::size_t k = rng() % streams.size();
    blocks.push_back({a.allocate(n, streams[k]), k, rng() % 2 == 0});
    sum += static_cast<std::int64_t>(n);
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const depot::memory_stats before = a.stats();
  REQUIRE(before.allocated_bytes.all.current == sum);
  REQUIRE(before.allocated_bytes.all.peak == sum);
  std::atomic<bool> done{false};
  std::atomic<int> inconsistent{0};
  std::thread reader([&] {
    while (!done.load()) {
      const depot::memory_stats st = a.stats();
      if (!consistent(st) || st.allocated_bytes.all.peak != sum || st.allocated_bytes.all.current < 0) {
        ++inconsistent;
      }
    }
  });
  std::vector<std::thread> threads;
  constexpr std::size_t n_threads = 8;
  const std::size_t share = blocks.size() / n_threads;
  for (std::size_t t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t * share; i < (t + 1) * share; ++i) {
        if (blocks[i].named) {
          a.deallocate(blocks[i].p, streams[blocks[i].stream]);
        } else {
          a.deallocate(blocks[i].p);
        }
      }
    });
  }
  const depot::memory_stats st = join_then_stats(a, threads, done, reader);
  CHECK(inconsistent.load() == 0);
  check_all_freed(st);
  CHECK(st.allocated_bytes.all.peak == sum);
  CHECK(st.requested_bytes.all.peak == sum);
  CHECK(st.num_allocations.all.peak == 4096);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: one thread on four streams beside a reader of snapshots keeps exact peaks", D,
                   DEPOT_TEST_DEVICES)
{
  // One thread's peaks are exact over any streams, also beside a reader that takes every
  // cache's lock over and over (snapshot(), which publishes nothing): the thread's changes
  // must stay in one delta as it changes stream at every operation. (The moment this guards
  // most narrowly, the reader holding the previous cache but not yet the next one as the
  // thread changes, when switch_op waits for the reader instead of leaving its changes
  // there, is rare: this passed with that wait removed too. It fails where changes of
  // stream split a thread's changes more often.)
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  std::vector<depot::stream<D>> streams(4);
  const auto seed = depot::test::seed("pool one thread four streams snapshots", 13);
  std::atomic<bool> done{false};
  std::atomic<long> snapshots{0};
  std::thread reader([&] {
    while (!done.load()) {
      (void)a.snapshot();
      ++snapshots;
    }
  });
  std::int64_t requested = 0;
  std::int64_t peak = 0;
  std::mt19937_64 rng{seed};
  std::vector<std::pair<void*, std::size_t>> mine;  // (block, its size)
  for (int i = 0; i < 20000; ++i) {
    const std::size_t k = static_cast<std::size_t>(i) % streams.size();  // a new stream each time
    if (mine.size() < 64 && (mine.empty() || rng() % 2 == 0)) {
      const std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 4 * MiB : 48 * KiB);
      mine.emplace_back(a.allocate(n, streams[k]), n);
      requested += static_cast<std::int64_t>(n);
      peak = std::max(peak, requested);
    } else {
      const auto j = rng() % mine.size();
      a.deallocate(mine[j].first, streams[k]);
      requested -= static_cast<std::int64_t>(mine[j].second);
      mine.erase(mine.begin() + static_cast<long>(j));
    }
  }
  for (auto& [p, n] : mine) a.deallocate(p, streams[0]);
  done.store(true);
  reader.join();
  MESSAGE("snapshots taken beside the thread: " << snapshots.load());
  const depot::memory_stats st = a.stats();
  CHECK(st.requested_bytes.all.current == 0);
  CHECK(st.requested_bytes.all.peak == peak);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: four threads on one stream, and a reader of the statistics", D,
                   DEPOT_TEST_DEVICES)
{
  // One stream cache shared by four threads (its lock contended, so waiters spin and sleep)
  // while a fifth reads the statistics and snapshots (every cache lock, revoking a bias
  // that a thread's run of takes made) all along.
  depot::allocator_config cfg = quiet_config<D>();
  SUBCASE("biased locks (the default)") {}
  SUBCASE("locks never biased") { cfg.biased_locks = false; }
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s;
  std::atomic<int> errors{0};
  std::atomic<int> inconsistent{0};
  std::atomic<bool> done{false};
  const auto seed = depot::test::seed("pool one stream", 4);
  std::thread reader([&] {
    while (!done.load()) {
      const depot::memory_stats st = a.stats();
      if (!consistent(st)) {
        ++inconsistent;
      }
      (void)a.snapshot();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + static_cast<unsigned>(t)};
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 2 * MiB : 32 * 1024);
          void* p = a.allocate(n, s);
          const auto mark = static_cast<unsigned char>(t + 1);
          depot::runtime<D>::copy(p, &mark, 1);
          mine.emplace_back(p, n);
        } else {
          const auto k = rng() % mine.size();
          unsigned char probe = 0;
          depot::runtime<D>::copy(&probe, mine[k].first, 1);
          if (probe != t + 1) ++errors;
          a.deallocate(mine[k].first, s);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto& [p, n] : mine) a.deallocate(p, s);
    });
  }
  for (auto& th : threads) th.join();
  done.store(true);
  reader.join();
  CHECK(errors.load() == 0);
  CHECK(inconsistent.load() == 0);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == st.num_allocations.all.freed);
  CHECK(st.allocated_bytes.all.peak > 0);
  check_invariants(a);
}

// A fuzz on four threads, each on a stream of its own: allocations of every pool filled with
// their id, frees checked against it, blocks handed to other threads and freed there (a free
// on another stream than the allocation's), record_stream onto other threads' streams,
// short-lived streams that list live blocks when destroyed, and empty_cache, while the main
// thread reads the statistics. After every round the threads stop and the main thread checks
// that the figures are exact (requested bytes and live blocks equal what the threads hold),
// that the snapshot shows every live block with its requested size and nothing else
// allocated, and that snapshot and statistics agree.
TEST_CASE_TEMPLATE("pool: a fuzz on four threads, checked exactly between rounds", D, DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg = quiet_config<D>();
  SUBCASE("the default batch") {}
  SUBCASE("statistics published at every operation") { cfg.stats_batch = 0; }
  depot::caching_allocator<D> a{0, cfg};
  constexpr int k_threads = 4, k_rounds = 12, k_ops = 250;
  const auto seed = depot::test::seed("pool four-thread fuzz", 0x4F0);
  std::vector<depot::stream<D>> streams(k_threads);
  struct held {
    void* p;
    std::size_t n;
    unsigned char id;
  };
  std::vector<std::vector<held>> mine(k_threads);
  std::mutex exchange_mu;
  std::vector<held> exchange;  // handed over by one thread (its stream synchronised), taken by another
  std::atomic<int> arrived{0}, round{0}, bad_data{0}, bad_stats{0};
  std::atomic<bool> stop{false};
  const auto size_of = [](std::mt19937_64& rng) -> std::size_t {
    const auto r = rng() % 100;
    if (r < 60) return 1 + rng() % (64 * KiB);               // dense small segments
    if (r < 90) return 64 * KiB + 1 + rng() % (MiB - 64 * KiB);  // linked small segments
    return MiB + 1 + rng() % (5 * MiB);                      // the large pool
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng{seed + static_cast<unsigned>(t)};
      depot::stream<D>& s = streams[static_cast<std::size_t>(t)];
      std::vector<held>& own = mine[static_cast<std::size_t>(t)];
      // One of v's blocks, drawn at random and taken out of v.
      const auto take_any = [&](std::vector<held>& v) {
        const std::size_t j = rng() % v.size();
        const held h = v[j];
        v[j] = v.back();
        v.pop_back();
        return h;
      };
      const auto check_and_free = [&](const held& h, depot::stream_ref<D> on) {
        s.synchronize();
        if (!check_bytes<D>(h.p, h.n, h.id, rng)) ++bad_data;
        a.deallocate(h.p, on);
      };
      for (int r = 0; r < k_rounds && !stop.load(); ++r) {
        for (int i = 0; i < k_ops; ++i) {
          const auto op = rng() % 100;
          if (own.empty() || (op < 45 && own.size() < 60)) {
            const std::size_t n = size_of(rng);
            const auto id = static_cast<unsigned char>(1 + rng() % 250);
            void* p = a.allocate(n, s);
            fill_bytes<D>(p, n, id, s);
            own.push_back({p, n, id});
          } else if (op < 75) {
            check_and_free(take_any(own), s);  // on this thread's stream: another's when the block was handed over
          } else if (op < 85) {
            const held h = take_any(own);
            s.synchronize();  // its fill is done before another thread reads it
            const std::lock_guard g{exchange_mu};
            exchange.push_back(h);
          } else if (op < 93) {
            const std::lock_guard g{exchange_mu};
            if (!exchange.empty()) own.push_back(take_any(exchange));
          } else if (op < 97) {
            const std::size_t other = rng() % k_threads;
            a.record_stream(own[rng() % own.size()].p, streams[other]);
          } else if (op < 99) {
            // A short-lived stream: blocks of its own, and one of this thread's listing it
            // when it is destroyed.
            depot::stream<D> tmp;
            std::vector<held> brief;
            for (int k = 0; k < 3; ++k) {
              const std::size_t n = size_of(rng);
              void* p = a.allocate(n, tmp);
              fill_bytes<D>(p, n, 0xEE, tmp);
              brief.push_back({p, n, 0xEE});
            }
            a.record_stream(own[rng() % own.size()].p, tmp);
            tmp.synchronize();
            for (const held& h : brief) {
              if (!check_bytes<D>(h.p, h.n, h.id, rng)) ++bad_data;
              a.deallocate(h.p, tmp);
            }
          } else {
            a.empty_cache();
          }
        }
        s.synchronize();
        ++arrived;
        while (round.load() == r && !stop.load()) std::this_thread::yield();
      }
      for (const held& h : own) check_and_free(h, s);
    });
  }
  std::exception_ptr failure;
  for (int r = 0; r < k_rounds && failure == nullptr; ++r) {
    while (arrived.load() < k_threads) {  // the threads at work: a reader publishing every cache
      if (!consistent(a.stats())) ++bad_stats;
    }
    try {
      std::map<std::uintptr_t, std::size_t> expect;  // live block: requested bytes
      for (const auto& v : mine) {
        for (const held& h : v) expect[reinterpret_cast<std::uintptr_t>(h.p)] = h.n;
      }
      for (const held& h : exchange) expect[reinterpret_cast<std::uintptr_t>(h.p)] = h.n;
      std::int64_t requested = 0;
      for (const auto& [p, n] : expect) requested += static_cast<std::int64_t>(n);
      const depot::memory_stats st = a.stats();
      const depot::allocator_snapshot snap = a.snapshot();
      INFO("round ", r, ", seed ", seed);
      REQUIRE(st.requested_bytes.all.current == requested);
      REQUIRE(st.num_allocations.all.current == static_cast<std::int64_t>(expect.size()));
      std::map<std::uintptr_t, std::size_t> shown;
      for (const auto& seg : snap.segments) {
        for (const auto& b : seg.blocks) {
          if (b.state == depot::block_state::allocated) shown[b.address] = b.requested;
        }
      }
      REQUIRE(shown == expect);
      check_invariants(st, snap);
    } catch (...) {
      failure = std::current_exception();
      stop.store(true);
    }
    arrived.store(0);
    round.store(r + 1);
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  if (failure != nullptr) std::rethrow_exception(failure);
  for (const held& h : exchange) a.deallocate(h.p);
  CHECK(bad_data.load() == 0);
  CHECK(bad_stats.load() == 0);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.requested_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == st.num_allocations.all.freed);
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.all.current == 0);
}

// A cache held through a slow upstream call (pages mapped for an expandable segment, under
// the cache's lock): the other threads on its stream spin, then sleep on the lock, and go
// on once it is given back; afterwards they contend with each other (waking one another at
// each unlock). Nothing is lost or handed out twice, and the figures end at zero.
TEST_CASE_TEMPLATE("pool: threads asleep on a cache held through a slow upstream call all go on", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto owned = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
  limiting_upstream<D>& up = *owned;
  depot::allocator_config cfg = quiet_config<D>();
  cfg.expandable_segments = true;
  depot::caching_allocator<D> a{std::move(owned), cfg};
  if (a.expandable_page() == 0) {
    MESSAGE("device 0 cannot map memory: no upstream call under a cache lock to wait for");
    return;
  }
  depot::stream<D> s;
  std::atomic<bool> mapping{false};
  up.on_map = [&] {
    if (!mapping.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds{50});
  };
  std::thread holder{[&] {
    void* p = a.allocate(64 * MiB, s);  // a miss: maps pages with the cache locked
    a.deallocate(p, s);
  }};
  while (!mapping.load()) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> errors{0};
  std::atomic<std::int64_t> made{1};  // the holder's
  std::vector<std::thread> waiters;
  std::vector<double> waited_ms(3);
  for (int t = 0; t < 3; ++t) {
    waiters.emplace_back([&, t] {
      void* first = a.allocate(4 * KiB, s);  // waits for the holder
      ++made;
      waited_ms[static_cast<std::size_t>(t)] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::vector<void*> mine{first};
      for (int i = 0; i < 3000; ++i) {
        if (mine.size() < 8) {
          void* p = a.allocate(static_cast<std::size_t>(512 * (1 + (i + t) % 64)), s);
          const auto mark = static_cast<unsigned char>(t + 1);
          depot::runtime<D>::copy(p, &mark, 1);
          mine.push_back(p);
          ++made;
        } else {
          for (void* p : mine) {
            unsigned char probe = 0;
            depot::runtime<D>::copy(&probe, p, 1);
            if (p != first && probe != t + 1) ++errors;
            a.deallocate(p, s);
          }
          mine.clear();
        }
      }
      for (void* p : mine) a.deallocate(p, s);
    });
  }
  holder.join();
  for (auto& th : waiters) th.join();
  MESSAGE("the waiters' first allocations returned after " << waited_ms[0] << ", " << waited_ms[1] << ", "
                                                            << waited_ms[2] << " ms (the holder slept 50 ms)");
  CHECK(errors.load() == 0);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.num_allocations.all.allocated == st.num_allocations.all.freed);
  CHECK(st.num_allocations.all.allocated == made.load());
  check_invariants(a);
}

// A free's lifetime comes from the allocation's time only when tracing was on at the
// allocation: a block handed out again while tracing was off (the same record or entry,
// which held the time of its previous allocation) frees with lifetime 0. Dense small,
// linked small and large blocks.
TEST_CASE_TEMPLATE("pool: a free's lifetime is 0 when its allocation was not traced", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  for (const std::size_t bytes : {4 * KiB, 512 * KiB, 12 * MiB}) {
    CAPTURE(bytes);
    a.set_trace_capacity(8);
    void* p = a.allocate(bytes);
    a.deallocate(p);
    auto events = a.trace();
    REQUIRE_FALSE(events.empty());
    CHECK(events.back().kind == depot::trace_kind::free);
    CHECK(events.back().lifetime_ns > 0);
    a.set_trace_capacity(0);  // off
    void* q = a.allocate(bytes);
    CHECK(q == p);  // the same block again
    a.set_trace_capacity(8);
    a.deallocate(q);
    events = a.trace();
    REQUIRE(events.size() == 1);
    CHECK(events.back().kind == depot::trace_kind::free);
    CHECK(events.back().address == reinterpret_cast<std::uintptr_t>(q));
    CHECK(events.back().lifetime_ns == 0);
  }
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: snapshot, trace and summary", D, DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  a.set_trace_capacity(16);
  std::vector<void*> ps;
  for (int i = 0; i < 12; ++i) ps.push_back(a.allocate((i + 1) * 1000));
  for (void* p : ps) a.deallocate(p);
  const auto events = a.trace();
  REQUIRE(events.size() == 16);  // the ring keeps the last 16 of 25 events
  CHECK(events.back().kind == depot::trace_kind::free);
  CHECK(events.back().lifetime_ns > 0);
  std::uint64_t t = 0;
  for (const auto& e : events) {
    CHECK(e.time_ns >= t);
    t = e.time_ns;
  }
  const std::string trace_text = a.trace_json();
  const auto trace = nlohmann::json::parse(trace_text);
  CHECK(trace["format"] == "depot.trace.v1");
  CHECK(trace["events"].size() == 16);
  // Written directly (no document in memory), in the exact form of nlohmann::json's dump():
  // keys sorted, no spaces, each optional key where its kind has it.
  CHECK(trace.dump() == trace_text);
  for (const auto& e : trace["events"]) {
    CHECK(e.contains("cache_hit") == (e["kind"] == "alloc"));
    CHECK(e.contains("lifetime_ns") == (e["kind"] == "free"));
  }
  void* live = a.allocate(5000);
  const std::string snap_text = a.snapshot().to_json();
  const auto snap = nlohmann::json::parse(snap_text);
  CHECK(snap.dump() == snap_text);
  CHECK(snap["format"] == "depot.snapshot.v1");
  REQUIRE(snap["segments"].size() == 1);
  CHECK(snap["segments"][0]["pool"] == "small");
  CHECK(snap["segments"][0]["blocks"][0]["state"] == "allocated");
  CHECK(snap["segments"][0]["blocks"][0]["requested"] == 5000);
  const std::string summary = a.summary();
  CHECK(contains(summary, "allocated bytes"));
  CHECK(contains(summary, "fragmentation"));
  a.deallocate(live);
  {
    depot::profile_memory<D> scope{a};
    void* p = a.allocate(3 * MiB);
    a.deallocate(p);
    CHECK(scope.peak_memory() == static_cast<std::int64_t>(3 * MiB));
    CHECK(scope.growth() == 0);
    CHECK(contains(scope.memory_summary(), "reserved bytes"));
  }
}

TEST_CASE_TEMPLATE("pool: the process-wide pools and free functions", D, DEPOT_TEST_DEVICES)
{
  auto& p = depot::pool<D>();
  CHECK(&p == &depot::pool<D>(0));
  CHECK_THROWS_AS((void)depot::pool<D>(depot::device_count<D>()), depot::invalid_argument);
  CHECK_THROWS_AS((void)depot::pool<D>(-1), depot::invalid_argument);
  const auto base = depot::memory_allocated<D>();
  void* x = p.allocate(10 * MiB);
  CHECK(depot::memory_allocated<D>() == base + static_cast<std::int64_t>(10 * MiB));
  CHECK(depot::max_memory_allocated<D>() >= depot::memory_allocated<D>());
  CHECK(depot::memory_reserved<D>() >= depot::memory_allocated<D>());
  CHECK(depot::memory_cached<D>() == depot::memory_reserved<D>() - depot::memory_allocated<D>());
  CHECK(depot::get_memory_stats<D>().num_allocations.all.current >= 1);
  CHECK_FALSE(depot::memory_summary<D>().empty());
  CHECK_FALSE(depot::memory_snapshot<D>().segments.empty());
  p.deallocate(x);
  depot::empty_cache<D>();
  depot::reset_peak_stats<D>();
  depot::reset_memory_stats<D>();
  CHECK(depot::max_memory_allocated<D>() == depot::memory_allocated<D>());

  // The pinned pool: host-accessible memory ordered on D's streams.
  auto& pinned = depot::pinned_pool<D>();
  CHECK(&pinned != &p);
  CHECK(pinned.device().kind == depot::device_kind::host);
  auto* h = static_cast<unsigned char*>(pinned.allocate(MiB));
  std::memset(h, 0x3A, MiB);  // directly writable by the host
  void* d = p.allocate(MiB);
  depot::stream<D> s;
  depot::runtime<D>::copy_async(d, h, MiB, s.native());
  pinned.record_stream(h, s);
  pinned.deallocate(h);
  unsigned char probe = 0;
  s.synchronize();
  depot::runtime<D>::copy(&probe, static_cast<unsigned char*>(d) + MiB - 1, 1);
  CHECK(probe == 0x3A);
  p.deallocate(d);
  // The process-wide pools live until exit; give their cache back so leak checkers see none.
  depot::empty_cache<D>();
  pinned.empty_cache();
  CHECK(depot::memory_reserved<D>() == 0);
}

TEST_CASE("pool: DEPOT_ALLOC_CONF is parsed strictly")
{
  using depot::allocator_config;
  const auto c = allocator_config::parse(
      "max_split_size_mb:256, roundup_power2_divisions:4,garbage_collection_threshold:0.8,"
      "release_threshold_mb:0,per_process_memory_fraction:0.75,trace_capacity:1000");
  CHECK(c.max_split_size == 256 * MiB);
  CHECK(c.roundup_power2_divisions == 4);
  CHECK(c.garbage_collection_threshold == doctest::Approx(0.8));
  CHECK(c.release_threshold == 0);
  CHECK(c.per_process_memory_fraction == doctest::Approx(0.75));
  CHECK(c.trace_capacity == 1000);
  CHECK(c.stats_batch == 16 * MiB);  // the default
  const auto round = allocator_config::parse(c.to_string());
  CHECK(round.max_split_size == c.max_split_size);
  CHECK(round.roundup_power2_divisions == c.roundup_power2_divisions);
  CHECK(round.garbage_collection_threshold == doctest::Approx(c.garbage_collection_threshold));
  CHECK(round.release_threshold == c.release_threshold);
  CHECK(round.per_process_memory_fraction == doctest::Approx(c.per_process_memory_fraction));
  CHECK(round.trace_capacity == c.trace_capacity);
  CHECK(round.stats_batch == c.stats_batch);
  // Sizes that are not whole MiB survive the round trip too.
  const auto odd = allocator_config::parse("max_split_size:1049088,release_threshold:65537,stats_batch:0");
  CHECK(odd.stats_batch == 0);
  const auto odd_round = allocator_config::parse(odd.to_string());
  CHECK(odd_round.max_split_size == 1049088);
  CHECK(odd_round.release_threshold == 65537);
  CHECK(odd_round.stats_batch == 0);
  CHECK(allocator_config::parse("stats_batch:1TiB").stats_batch == std::size_t{1} << 40);
  CHECK(allocator_config{}.small_reuse_bytes == MiB);
  CHECK(allocator_config::parse("small_reuse_bytes:0").small_reuse_bytes == 0);
  CHECK(allocator_config::parse("small_reuse_bytes:64MiB").small_reuse_bytes == 64 * MiB);
  CHECK(allocator_config::parse(allocator_config::parse("small_reuse_bytes:1000").to_string()).small_reuse_bytes == 1000);
  CHECK(allocator_config::parse("").max_split_size == std::numeric_limits<std::size_t>::max());
  CHECK(allocator_config::parse("max_split_size:512MiB").max_split_size == 512 * MiB);
  CHECK(allocator_config::parse("max_split_size:2GiB").max_split_size == 2048 * MiB);
  CHECK(allocator_config::parse("max_split_size:1048576").max_split_size == MiB);
  CHECK(allocator_config::parse("release_threshold:0").release_threshold == 0);
  CHECK(allocator_config::parse("release_threshold:64KiB").release_threshold == 65536);
  CHECK(c.steal_threshold == 0);  // the default: take another live stream's segment first
  CHECK(allocator_config::parse("steal_threshold:unlimited").steal_threshold == std::numeric_limits<std::size_t>::max());
  CHECK(allocator_config::parse(allocator_config::parse("steal_threshold:unlimited").to_string()).steal_threshold ==
        std::numeric_limits<std::size_t>::max());
  CHECK(allocator_config::parse("steal_threshold:0").steal_threshold == 0);
  CHECK(allocator_config::parse("steal_threshold:4GiB").steal_threshold == 4096 * MiB);
  CHECK(allocator_config::parse("steal_threshold_mb:512").steal_threshold == 512 * MiB);
  CHECK(allocator_config::parse(allocator_config::parse("steal_threshold:65537").to_string()).steal_threshold == 65537);
  CHECK(allocator_config::parse(allocator_config::parse("steal_threshold:0").to_string()).steal_threshold == 0);
  CHECK_FALSE(contains(allocator_config{}.to_string(), "steal_threshold"));
  CHECK_FALSE(c.expandable_segments);  // the default
  CHECK(allocator_config::parse("expandable_segments:true").expandable_segments);
  CHECK(allocator_config::parse("expandable_segments:True").expandable_segments);
  CHECK_FALSE(allocator_config::parse("expandable_segments:true,expandable_segments:0").expandable_segments);
  CHECK(allocator_config::parse(allocator_config::parse("expandable_segments:1").to_string()).expandable_segments);
  CHECK(c.biased_locks);  // the default
  CHECK_FALSE(c.null_stream_per_thread);  // the default
  CHECK(allocator_config::parse("null_stream_per_thread:true").null_stream_per_thread);
  CHECK(allocator_config::parse("null_stream_per_thread:true").to_string() == "null_stream_per_thread:true");
  CHECK_FALSE(allocator_config::parse("biased_locks:false").biased_locks);
  CHECK_FALSE(allocator_config::parse("biased_locks:0").biased_locks);
  CHECK(allocator_config::parse("biased_locks:False,biased_locks:True").biased_locks);
  CHECK_FALSE(allocator_config::parse(allocator_config::parse("biased_locks:false").to_string()).biased_locks);

  // PyTorch's list form: divisions by size interval (a plain bound is MiB), in one item
  // although it holds commas; the last of the two forms wins.
  const auto list = allocator_config::parse(
      "max_split_size_mb:64, roundup_power2_divisions:[256:1, 512:2,1GiB:4,>:8],trace_capacity:7");
  CHECK(list.max_split_size == 64 * MiB);
  CHECK(list.trace_capacity == 7);
  CHECK(list.roundup_power2_divisions == 0);
  REQUIRE(list.roundup_power2_intervals.size() == 4);
  const std::pair<std::size_t, unsigned> want[] = {
      {256 * MiB, 1}, {512 * MiB, 2}, {1024 * MiB, 4}, {std::numeric_limits<std::size_t>::max(), 8}};
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(list.roundup_power2_intervals[i].up_to == want[i].first);
    CHECK(list.roundup_power2_intervals[i].divisions == want[i].second);
  }
  CHECK(list.to_string() == "max_split_size:67108864,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],trace_capacity:7");
  const auto list_round = allocator_config::parse(list.to_string());
  CHECK(list_round.roundup_power2_intervals.size() == 4);
  CHECK(list_round.to_string() == list.to_string());
  CHECK(c.max_non_split_rounding == 20 * MiB);  // the default
  CHECK(allocator_config::parse("max_non_split_rounding_mb:64").max_non_split_rounding == 64 * MiB);
  CHECK(allocator_config::parse("max_non_split_rounding:0").max_non_split_rounding == 0);
  CHECK(allocator_config::parse("max_non_split_rounding:1TiB").max_non_split_rounding == std::size_t{1} << 40);
  CHECK(allocator_config::parse(allocator_config::parse("max_non_split_rounding:3KiB").to_string())
            .max_non_split_rounding == 3072);
  const auto no_rest = allocator_config::parse("roundup_power2_divisions:[2:4]");
  REQUIRE(no_rest.roundup_power2_intervals.size() == 1);
  CHECK(no_rest.roundup_power2_intervals[0].up_to == 2 * MiB);
  CHECK(allocator_config::parse("roundup_power2_divisions:[4:2],roundup_power2_divisions:8").roundup_power2_intervals.empty());
  CHECK(allocator_config::parse("roundup_power2_divisions:8,roundup_power2_divisions:[4:2]").roundup_power2_divisions == 0);

  const std::pair<const char*, const char*> bad[] = {
      {"roundup_power2_divisions:[]", "is bound:N"},
      {"roundup_power2_divisions:[256:1", "brackets"},
      {"roundup_power2_divisions:[256:1,trace_capacity:5", "brackets"},
      {"roundup_power2_divisions:[300:2]", "in '300:2' the bound is a power of two"},
      {"roundup_power2_divisions:[512KiB:2]", "[1MiB, 2^50 bytes]"},
      {"roundup_power2_divisions:[2147483648:2]", "in '2147483648:2' the bound"},  // MiB: 2^51 bytes
      {"roundup_power2_divisions:[512:2,256:4]", "the bounds must increase"},
      {"roundup_power2_divisions:[256:2,256:4]", "the bounds must increase"},
      {"roundup_power2_divisions:[>:2,256:4]", "'>' (all larger) must be the last"},
      {"roundup_power2_divisions:[256:3]", "N is 0 or a power of two"},
      {"roundup_power2_divisions:[256:128]", "N is 0 or a power of two"},
      {"roundup_power2_divisions:[256]", "is bound:N"},
      {"roundup_power2_divisions:[256:x]", "roundup_power2_divisions"},
      {"max_non_split_rounding:2TiB", "[0, 1TiB]"},
      {"max_non_split_rounding:20MB", "max_non_split_rounding"},
      {"max_non_split_rounding_mb:1048577", "[0, 2^20]"},
      {"max_non_split_rounding_mb:-1", "max_non_split_rounding_mb"},
      {"max_split_size_mb:0", "max_split_size_mb"},
      {"max_split_size_mb:-5", "max_split_size_mb"},
      {"max_split_size_mb:12abc", "12abc"},
      {"roundup_power2_divisions:3", "power of two"},
      {"roundup_power2_divisions:128", "roundup_power2_divisions"},
      {"garbage_collection_threshold:1.5", "(0, 1)"},
      {"per_process_memory_fraction:0", "(0, 1]"},
      {"per_process_memory_fraction:nan", "per_process_memory_fraction"},
      {"trace_capacity:many", "trace_capacity"},
      {"expandable_segments:yes", "true or false"},
      {"expandable_segments:", "expandable_segments"},
      {"biased_locks:maybe", "true or false"},
      {"null_stream_per_thread:2", "true or false"},
      {"biased_locks:", "biased_locks"},
      {"expandable_segment:true", "unknown key 'expandable_segment'"},
      {"max_split_size_mb", "not key:value"},
      {"max_split_size:512MB", "e.g. 512MiB"},
      {"max_split_size:1KiB", "[1MiB"},
      {"max_split_size:99999999TiB", "max_split_size"},
      {"release_threshold:lots", "release_threshold"},
      {"steal_threshold:lots", "steal_threshold"},
      {"steal_threshold:2048TiB", "[0, 2^50 bytes] or unlimited"},
      {"steal_threshold:Unlimited", "steal_threshold"},
      {"steal_threshold:-1", "steal_threshold"},
      {"steal_threshold_mb:1.5", "steal_threshold_mb"},
      {"steal_threshold_mb:2000000000", "[0, 2^30]"},
      {"stats_batch:2TiB", "[0, 1TiB]"},
      {"small_reuse_bytes:65MiB", "[0, 64MiB]"},
      {"small_reuse_bytes:-1", "small_reuse_bytes"},
      {"small_reuse_bytes:lots", "small_reuse_bytes"},
      {"stats_batch:-1", "stats_batch"},
      {"stats_batch:16MB", "e.g. 16MiB"},
  };
  for (const auto& [text, expect] : bad) {
    CAPTURE(text);
    try {
      (void)allocator_config::parse(text);
      FAIL("accepted");
    } catch (const depot::invalid_argument& e) {
      CHECK(contains(e.what(), expect));
    }
  }
  ::setenv("DEPOT_ALLOC_CONF", "max_split_size_mb:64", 1);
  CHECK(allocator_config::from_environment().max_split_size == 64 * MiB);
  ::setenv("DEPOT_ALLOC_CONF", "max_split_size_mb:zero", 1);
  CHECK_THROWS_AS((void)depot::caching_allocator<depot::host>{}, depot::invalid_argument);
  ::unsetenv("DEPOT_ALLOC_CONF");
}

TEST_CASE_TEMPLATE("pool: max_split_size and roundup settings shape the blocks", D,
                   DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg;
  cfg.max_split_size = 64 * MiB;
  cfg.roundup_power2_divisions = 4;
  depot::caching_allocator<D> a{0, cfg};
  void* big = a.allocate(100 * MiB);
  a.deallocate(big);
  // A small-ish large request must not be cut out of the unsplittable 100 MiB block.
  void* p = a.allocate(5 * MiB);
  CHECK(p != big);
  a.deallocate(p);
  // 1.1 MiB rounds up to 1.25 MiB with 4 divisions of [1, 2) MiB.
  void* q = a.allocate(MiB + MiB / 10);
  const auto snap = a.snapshot();
  bool found = false;
  for (const auto& s : snap.segments) {
    for (const auto& b : s.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(q)) {
        found = true;
        CHECK(b.size == MiB + MiB / 4);
      }
    }
  }
  CHECK(found);
  a.deallocate(q);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: roundup_power2_divisions by size interval (PyTorch's list form)", D, DEPOT_TEST_DEVICES)
{
  // The size a request is handed out with, read back from the snapshot.
  const auto block_size = [](depot::caching_allocator<D>& a, std::size_t bytes) {
    void* p = a.allocate(bytes);
    std::size_t size = 0;
    for (const auto& s : a.snapshot().segments) {
      for (const auto& b : s.blocks) {
        if (b.address == reinterpret_cast<std::uintptr_t>(p)) size = b.size;
      }
    }
    a.deallocate(p);
    return size;
  };
  {
    // Up to 4 MiB: quarters of the interval; up to 16 MiB: 512-byte rounding only; above: halves.
    depot::caching_allocator<D> a{0, depot::allocator_config::parse("roundup_power2_divisions:[4:4,16:1,>:2]")};
    CHECK(block_size(a, MiB + MiB / 10) == MiB + MiB / 4);  // (1, 2] MiB: steps of 256 KiB
    CHECK(block_size(a, 3 * MiB + MiB / 10) == 3 * MiB + MiB / 2);  // (2, 4] MiB: steps of 512 KiB
    CHECK(block_size(a, 4 * MiB) == 4 * MiB);  // a power of two rounds to itself
    CHECK(block_size(a, 5 * MiB + 1) == 5 * MiB + 512);  // (4, 16] MiB: not rounded
    CHECK(block_size(a, 15 * MiB + 1) == 15 * MiB + 512);
    CHECK(block_size(a, 20 * MiB + 1) == 24 * MiB);  // above: halves of (16, 32] MiB
    CHECK(block_size(a, 40 * MiB + 1) == 48 * MiB);  // halves of (32, 64] MiB
    CHECK(block_size(a, 512 * 1024 + 1) == 512 * 1024 + 512);  // the small pool is never rounded
    check_invariants(a);
  }
  {
    // No ">": requests above the last bound are not rounded; the one number rounds them all.
    depot::caching_allocator<D> a{0, depot::allocator_config::parse("roundup_power2_divisions:[4:4]")};
    CHECK(block_size(a, 3 * MiB + MiB / 10) == 3 * MiB + MiB / 2);
    CHECK(block_size(a, 20 * MiB + 1) == 20 * MiB + 512);
    depot::caching_allocator<D> b{0, depot::allocator_config::parse("roundup_power2_divisions:2")};
    CHECK(block_size(b, 3 * MiB + MiB / 10) == 4 * MiB);
    CHECK(block_size(b, 20 * MiB + 1) == 24 * MiB);
  }
}

TEST_CASE_TEMPLATE("pool: max_non_split_rounding bounds how much larger a reused unsplittable block may be", D,
                   DEPOT_TEST_DEVICES)
{
  // A cached 100 MiB block (max_split_size 64 MiB: never split) is reused for a request of at
  // least 64 MiB only if it is at most max_non_split_rounding larger; else a new segment.
  const auto reused = [](std::size_t rounding, std::size_t request) {
    depot::allocator_config cfg;
    cfg.max_split_size = 64 * MiB;
    cfg.max_non_split_rounding = rounding;
    depot::caching_allocator<D> a{0, cfg};
    void* big = a.allocate(100 * MiB);
    a.deallocate(big);
    void* p = a.allocate(request);
    const bool same = p == big;
    CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(same ? 100 * MiB : 100 * MiB + request));
    a.deallocate(p);
    check_invariants(a);
    return same;
  };
  CHECK(reused(20 * MiB, 90 * MiB));  // the default: 10 MiB larger
  CHECK(reused(20 * MiB, 80 * MiB));  // exactly 20 MiB larger
  CHECK_FALSE(reused(20 * MiB, 70 * MiB));
  CHECK(reused(40 * MiB, 70 * MiB));
  CHECK(reused(0, 100 * MiB));  // 0: exact fits only
  CHECK_FALSE(reused(0, 98 * MiB));
  CHECK_FALSE(reused(1024 * MiB, 60 * MiB));  // under max_split_size: never from a block above it
}

TEST_CASE_TEMPLATE("pool: a config built in code is checked like a parsed one", D, DEPOT_TEST_DEVICES)
{
  using cfg_t = depot::allocator_config;
  constexpr std::size_t all = std::numeric_limits<std::size_t>::max();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::pair<std::function<void(cfg_t&)>, const char*> bad[] = {
      {[](cfg_t& c) { c.max_split_size = MiB - 1; }, "max_split_size is 1048575 bytes; expected at least 1 MiB"},
      {[](cfg_t& c) { c.roundup_power2_divisions = 3; }, "roundup_power2_divisions is 3; expected 0 or a power of two"},
      {[](cfg_t& c) { c.roundup_power2_divisions = 128; }, "roundup_power2_divisions is 128"},
      {[](cfg_t& c) { c.roundup_power2_intervals = {{3 * MiB, 2}}; }, "roundup_power2_intervals[0].up_to is 3145728"},
      {[](cfg_t& c) { c.roundup_power2_intervals = {{MiB / 2, 2}}; }, "roundup_power2_intervals[0].up_to is 524288"},
      {[](cfg_t& c) { c.roundup_power2_intervals = {{8 * MiB, 2}, {4 * MiB, 2}}; },
       "roundup_power2_intervals[1].up_to is 4194304; expected more than the interval before's 8388608"},
      {[](cfg_t& c) { c.roundup_power2_intervals = {{all, 2}, {4 * MiB, 2}}; }, "roundup_power2_intervals[0].up_to is"},
      {[](cfg_t& c) { c.roundup_power2_intervals = {{4 * MiB, 2}, {all, 6}}; }, "roundup_power2_intervals[1].divisions is 6"},
      {[](cfg_t& c) { c.garbage_collection_threshold = 1.0; }, "garbage_collection_threshold is 1.000000"},
      {[](cfg_t& c) { c.garbage_collection_threshold = -0.5; }, "garbage_collection_threshold is -0.500000"},
      {[nan](cfg_t& c) { c.garbage_collection_threshold = nan; }, "garbage_collection_threshold is"},
      {[](cfg_t& c) { c.per_process_memory_fraction = 0.0; }, "per_process_memory_fraction is 0.000000"},
      {[](cfg_t& c) { c.per_process_memory_fraction = 1.5; }, "per_process_memory_fraction is 1.500000"},
      {[nan](cfg_t& c) { c.per_process_memory_fraction = nan; }, "per_process_memory_fraction is"},
      {[](cfg_t& c) { c.trace_capacity = (std::size_t{1} << 26) + 1; }, "trace_capacity is 67108865"},
      {[](cfg_t& c) { c.max_non_split_rounding = (std::size_t{1} << 40) + 1; }, "max_non_split_rounding is 1099511627777 bytes"},
      {[](cfg_t& c) { c.stats_batch = (std::size_t{1} << 40) + 1; }, "stats_batch is 1099511627777 bytes"},
      {[](cfg_t& c) { c.steal_threshold = (std::size_t{1} << 50) + 1; }, "steal_threshold is 1125899906842625 bytes"},
  };
  for (const auto& [spoil, expect] : bad) {
    CAPTURE(expect);
    cfg_t c;
    spoil(c);
    try {
      depot::caching_allocator<D> a{0, c};
      FAIL("accepted");
    } catch (const depot::invalid_argument& e) {
      CHECK(contains(e.what(), expect));
      CHECK(contains(e.what(), "allocator_config"));
    }
    CHECK_THROWS_AS(c.validate(), depot::invalid_argument);
  }
  // The edges of every range are accepted, and allocate as usual.
  cfg_t edge;
  edge.max_split_size = MiB;
  edge.roundup_power2_divisions = 64;
  edge.garbage_collection_threshold = 0.0;
  edge.per_process_memory_fraction = 1.0;
  edge.trace_capacity = std::size_t{1} << 26;
  edge.stats_batch = std::size_t{1} << 40;
  edge.validate();
  edge.trace_capacity = 16;
  edge.roundup_power2_intervals = {{MiB, 1}, {std::size_t{1} << 50, 64}, {all, 0}};
  depot::caching_allocator<D> a{0, edge};
  a.deallocate(a.allocate(3 * MiB));
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: garbage_collection_threshold releases free segments before growing", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  depot::allocator_config cfg;
  cfg.garbage_collection_threshold = 0.5;  // of the reported 100 MiB
  depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(1024 * MiB, counters, 100 * MiB), cfg};
  void* x = a.allocate(30 * MiB);
  a.deallocate(x);
  void* y = a.allocate(40 * MiB);  // 30 + 40 > 50: the free 30 MiB segment goes first
  auto st = a.stats();
  CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(40 * MiB));
  CHECK(st.num_alloc_retries == 0);
  a.deallocate(y);
  check_invariants(a);
  // Without the setting both segments stay cached.
  depot::caching_allocator<D> b{std::make_unique<limiting_upstream<D>>(1024 * MiB, counters, 100 * MiB),
                                depot::allocator_config{}};
  b.deallocate(b.allocate(30 * MiB));
  b.deallocate(b.allocate(40 * MiB));
  CHECK(b.stats().reserved_bytes.all.current == static_cast<std::int64_t>(70 * MiB));
}

TEST_CASE_TEMPLATE("pool: release_threshold bounds the cached memory", D, DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg;
  cfg.release_threshold = 64 * MiB;
  depot::caching_allocator<D> a{0, cfg};
  void* x = a.allocate(30 * MiB);
  void* y = a.allocate(40 * MiB);
  a.deallocate(x);  // 30 MiB cached: under the threshold, kept
  CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(70 * MiB));
  a.deallocate(y);  // 70 MiB cached: over it, the segment just freed goes back
  const auto st = a.stats();
  CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(30 * MiB));
  CHECK(st.cached_bytes.all.current <= static_cast<std::int64_t>(64 * MiB));
  check_invariants(a);
  depot::allocator_config none;
  none.release_threshold = 0;
  depot::caching_allocator<D> b{0, none};
  b.deallocate(b.allocate(5 * MiB));
  CHECK(b.stats().reserved_bytes.all.current == 0);
}

// ---- expandable segments ----------------------------------------------------------------------

namespace {

// The large-pool segments of a snapshot.
std::vector<depot::segment_info> large_segments(const depot::allocator_snapshot& snap)
{
  std::vector<depot::segment_info> out;
  for (const auto& s : snap.segments) {
    if (!s.small_pool) out.push_back(s);
  }
  return out;
}

template <depot::device D>
depot::allocator_config expandable_config()
{
  depot::allocator_config cfg = quiet_config<D>();
  cfg.expandable_segments = true;
  return cfg;
}

}  // namespace

// The allocator's side of sharing blocks of expandable segments, on every backend: one
// descriptor per page a block spans, made once and closed when the page is unmapped; the
// range is not pinned; a refused export keeps what it made until the pages go.
TEST_CASE_TEMPLATE("pool: page descriptors of exported expandable blocks", D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto owned = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
  limiting_upstream<D>& up = *owned;
  up.stand_in_exports = true;
  const auto is_open = [](int fd) { return ::fcntl(fd, F_GETFD) != -1; };
  std::vector<int> at_destruction;  // descriptors of blocks alive when the allocator goes
  {
    depot::caching_allocator<D> a{std::move(owned), expandable_config<D>()};
    const std::size_t page = a.expandable_page();
    REQUIRE(page != 0);
    void* p1 = a.allocate(3 * page + 512);  // pages 0-3
    void* p2 = a.allocate(page);            // 3 * page + 512 on: pages 3-4
    void* p3 = a.allocate(2 * page);        // pages 4-6
    const auto base = reinterpret_cast<std::uintptr_t>(p1);
    REQUIRE(base % page == 0);
    CHECK_FALSE(large_segments(a.snapshot())[0].exported);

    const depot::ipc_handle h2 = a.ipc_export(p2);
    CHECK(h2.expandable());
    CHECK(h2.page == page);
    CHECK(h2.segment == base + 3 * page);
    CHECK(h2.offset == 512);
    CHECK(h2.fds == std::vector<std::int32_t>(up.exported.begin(), up.exported.end()));
    REQUIRE(h2.fds.size() == 2);
    CHECK(large_segments(a.snapshot())[0].exported);
    // p1 shares page 3 with p2: its descriptor is reused, pages 0-2 get new ones.
    const depot::ipc_handle h1 = a.ipc_export(p1);
    CHECK(h1.segment == base);
    CHECK(h1.offset == 0);
    REQUIRE(h1.fds.size() == 4);
    CHECK(h1.fds[3] == h2.fds[0]);
    CHECK(up.exported.size() == 5);
    CHECK(a.ipc_export(p1) == h1);  // nothing new
    CHECK(up.exported.size() == 5);
    // Refused half way through p3's pages (4 has one, 5 gets one, 6 is refused): the
    // export throws and closes what it made; page 4's (p2's) stays.
    up.exports_left = 1;
    CHECK_THROWS_WITH_AS(std::ignore = a.ipc_export(p3), doctest::Contains("export refused"), depot::error);
    CHECK(up.exported.size() == 6);
    CHECK_FALSE(is_open(up.exported[5]));
    CHECK(is_open(h2.fds[1]));
    CHECK_FALSE(large_segments(a.snapshot())[0].blocks.empty());
    up.exports_left = -1;
    const depot::ipc_handle h3 = a.ipc_export(p3);
    REQUIRE(h3.fds.size() == 3);
    CHECK(h3.fds[0] == h2.fds[1]);
    CHECK(up.exported.size() == 8);
    CHECK(h3.fds[1] == up.exported[6]);
    CHECK(h3.fds[2] == up.exported[7]);
    for (int fd : h1.fds) CHECK(is_open(fd));
    for (int fd : h2.fds) CHECK(is_open(fd));
    for (int fd : h3.fds) CHECK(is_open(fd));
    check_invariants(a);

    // Freeing p1 closes the descriptors of pages 0-2 at once (no live exported block is on
    // them); page 3 (p2 lives on it) keeps its own. Not pinned: empty_cache unmaps 0-2.
    a.deallocate(p1);
    for (std::size_t i = 0; i < 3; ++i) CHECK_FALSE(is_open(h1.fds[i]));
    CHECK(is_open(h1.fds[3]));
    a.empty_cache();
    check_invariants(a);
    CHECK(is_open(h1.fds[3]));
    CHECK(large_segments(a.snapshot())[0].exported);
    // Mapped back later, the pages are new memory: a new export makes new descriptors.
    void* again = a.allocate(3 * page);
    CHECK(reinterpret_cast<std::uintptr_t>(again) == base);
    std::size_t before = up.exported.size();
    const depot::ipc_handle h4 = a.ipc_export(again);
    CHECK(up.exported.size() == before + 3);
    REQUIRE(h4.fds.size() == 4);  // 512 bytes beyond 3 pages stay with the block (too small to split off)
    CHECK(h4.fds[3] == h2.fds[0]);
    // A page's descriptor closes only with the last exported block on it: freeing p2
    // leaves page 3's (again is on it) and page 4's (p3 is on it) open.
    a.deallocate(p2);
    CHECK(is_open(h2.fds[0]));  // again
    CHECK(is_open(h2.fds[1]));  // p3
    a.deallocate(again);
    for (int fd : h4.fds) CHECK_FALSE(is_open(fd));
    CHECK(is_open(h3.fds[0]));
    // A block that was never exported frees without touching the descriptors; one freed
    // while its stream's work is pending (a recorded stream) closes them at deallocate.
    void* plain = a.allocate(page);
    a.deallocate(plain);
    CHECK(is_open(h3.fds[0]));
    CHECK(large_segments(a.snapshot())[0].exported);
    {
      depot::stream<D> other;
      a.record_stream(p3, depot::stream_ref<D>{other.native()});
      a.deallocate(p3);
      for (int fd : h3.fds) CHECK_FALSE(is_open(fd));
      other.synchronize();
    }
    CHECK_FALSE(large_segments(a.snapshot())[0].exported);
    a.empty_cache();
    CHECK(a.snapshot().segments.empty());
    CHECK(counters->reservations.load() == 0);
    for (int fd : up.exported) CHECK_FALSE(is_open(fd));
    // Exporting the same live block again counts it once: one free closes its descriptor.
    void* twice = a.allocate(page);
    before = up.exported.size();
    const depot::ipc_handle t1 = a.ipc_export(twice);
    CHECK(a.ipc_export(twice) == t1);
    CHECK(up.exported.size() == before + 1);
    a.deallocate(twice);
    for (int fd : t1.fds) CHECK_FALSE(is_open(fd));
    a.empty_cache();
    // Blocks alive when the allocator goes: their descriptors close with it.
    void* last = a.allocate(page);
    const depot::ipc_handle h5 = a.ipc_export(last);
    REQUIRE(h5.fds.size() == 1);
    CHECK(is_open(h5.fds[0]));
    at_destruction.assign(h5.fds.begin(), h5.fds.end());
  }
  for (int fd : at_destruction) CHECK_FALSE(is_open(fd));
  CHECK(counters->outstanding.load() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments grow one address range and unmap its free end", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters),
                                  expandable_config<D>()};
    a.set_trace_capacity(256);
    const std::size_t page = a.expandable_page();
    REQUIRE(page >= 2 * MiB);
    REQUIRE(page % (2 * MiB) == 0);
    CHECK(contains(a.summary(), "expandable segments: large blocks map"));
    depot::stream<D> s;
    // Growing requests: each maps only what the free end lacks, at the end of one range.
    void* p1 = a.allocate(3 * MiB, s);
    void* p2 = a.allocate(5 * MiB, s);
    void* p3 = a.allocate(9 * MiB, s);
    check_invariants(a);
    auto segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    const depot::segment_info seg = segs[0];
    CHECK(seg.reserved >= seg.size);
    CHECK(seg.reserved % page == 0);
    CHECK(seg.size % page == 0);
    CHECK(seg.address % page == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(p1) == seg.address);
    CHECK(reinterpret_cast<std::uintptr_t>(p2) > reinterpret_cast<std::uintptr_t>(p1));
    CHECK(reinterpret_cast<std::uintptr_t>(p3) > reinterpret_cast<std::uintptr_t>(p2));
    CHECK(reinterpret_cast<std::uintptr_t>(p3) + 9 * MiB <= seg.address + seg.size);
    CHECK(seg.size < 17 * MiB + 3 * page);  // no 20 MiB segments: pages as needed
    auto st = a.stats();
    CHECK(st.reserved_bytes.large.current == static_cast<std::int64_t>(seg.size));
    CHECK(st.num_segments.large.current == 1);
    CHECK(counters->reservations.load() == 1);
    CHECK(counters->outstanding.load() == static_cast<std::int64_t>(seg.size));
    // The blocks hold data (the pages are mapped for this device).
    fill_bytes<D>(p1, 3 * MiB, 11, depot::stream_ref<D>{s.native()});
    fill_bytes<D>(p3, 9 * MiB, 33, depot::stream_ref<D>{s.native()});
    s.synchronize();
    std::mt19937_64 rng{depot::test::seed("pool expandable", 1)};
    CHECK(check_bytes<D>(p1, 3 * MiB, 11, rng));
    CHECK(check_bytes<D>(p3, 9 * MiB, 33, rng));

    // The end freed and cached; a larger request grows the free end in place.
    a.deallocate(p3, s);
    a.deallocate(p2, s);
    check_invariants(a);
    CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(seg.size));
    void* big = a.allocate(30 * MiB, s);
    check_invariants(a);
    segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    CHECK(segs[0].address == seg.address);
    CHECK(reinterpret_cast<std::uintptr_t>(big) == reinterpret_cast<std::uintptr_t>(p2));  // where the free end began
    CHECK(segs[0].size == (reinterpret_cast<std::uintptr_t>(big) + 30 * MiB - seg.address + page - 1) / page * page);
    fill_bytes<D>(big, 30 * MiB, 44, depot::stream_ref<D>{s.native()});
    s.synchronize();
    CHECK(check_bytes<D>(big, 30 * MiB, 44, rng));
    CHECK(check_bytes<D>(p1, 3 * MiB, 11, rng));

    // empty_cache unmaps the free end's whole pages; the live first block stays.
    a.deallocate(big, s);
    a.empty_cache();
    check_invariants(a);
    segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    const std::uintptr_t live_end = reinterpret_cast<std::uintptr_t>(p1) + segs[0].blocks[0].size;
    CHECK(segs[0].size == (live_end - seg.address + page - 1) / page * page);
    st = a.stats();
    CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(segs[0].size));
    CHECK(counters->outstanding.load() == static_cast<std::int64_t>(segs[0].size));
    CHECK(check_bytes<D>(p1, 3 * MiB, 11, rng));

    // The trace tells every change of the reserved bytes.
    std::int64_t traced = 0;
    for (const auto& e : a.trace()) {
      const auto n = static_cast<std::int64_t>(e.size);
      if (e.kind == depot::trace_kind::segment_allocate || e.kind == depot::trace_kind::segment_map) traced += n;
      if (e.kind == depot::trace_kind::segment_free || e.kind == depot::trace_kind::segment_unmap) traced -= n;
    }
    CHECK(traced == st.reserved_bytes.all.current);
    bool saw_map = false;
    bool saw_unmap = false;
    for (const auto& e : a.trace()) {
      saw_map = saw_map || e.kind == depot::trace_kind::segment_map;
      saw_unmap = saw_unmap || e.kind == depot::trace_kind::segment_unmap;
    }
    CHECK(saw_map);
    CHECK(saw_unmap);
    const auto json = nlohmann::json::parse(a.trace_json());
    bool named = false;
    for (const auto& e : json["events"]) named = named || e["kind"] == "segment_map";
    CHECK(named);
    const auto snap = nlohmann::json::parse(a.snapshot().to_json());
    CHECK(snap["segments"][0]["reserved_addresses"] == seg.reserved);

    // The host backend cannot share pages with another process: the export is refused and
    // nothing changes (exporting: the IPC tests, and page descriptors above).
    if constexpr (!depot::runtime<D>::has_ipc) {
      try {
        (void)a.ipc_export(p1);
        FAIL("ipc_export of a block of a host expandable segment succeeded");
      } catch (const depot::error& e) {
        CHECK(contains(e.what(), "cannot share memory with another process"));
      }
    }
    for (const auto& sg : a.snapshot().segments) CHECK_FALSE(sg.exported);

    // All free: the whole range goes back.
    a.deallocate(p1, s);
    a.empty_cache();
    check_invariants(a);
    CHECK(a.stats().reserved_bytes.all.current == 0);
    CHECK(a.snapshot().segments.empty());
    CHECK(counters->reservations.load() == 0);
    CHECK(counters->outstanding.load() == 0);
    // And a new one is made on demand.
    void* again = a.allocate(4 * MiB, s);
    CHECK(counters->reservations.load() == 1);
    a.deallocate(again, s);
  }
  // The allocator's end gives back every page and every range.
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments unmap free pages inside their range and map them back", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto owned = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
  limiting_upstream<D>& up = *owned;
  depot::caching_allocator<D> a{std::move(owned), expandable_config<D>()};
  a.set_trace_capacity(256);
  const std::size_t P = a.expandable_page();
  REQUIRE(P >= 2 * MiB);
  depot::stream<D> s;
  const auto at = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const auto states = [&] {  // the one large segment's blocks as "A2 U5 F1 ..." in pages (x: not whole)
    const auto segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    std::string out;
    for (const auto& b : segs[0].blocks) {
      out += out.empty() ? "" : " ";
      out += b.state == depot::block_state::allocated ? 'A' : b.state == depot::block_state::free ? 'F' : b.state == depot::block_state::unmapped ? 'U' : 'P';
      out += b.size % P == 0 ? std::to_string(b.size / P) : "x";
    }
    return out;
  };
  const auto reserved = [&] { return static_cast<std::size_t>(a.stats().reserved_bytes.all.current); };
  std::mt19937_64 rng{depot::test::seed("pool expandable holes", 3)};
  void* p1 = a.allocate(P, s);
  void* p2 = a.allocate(5 * P, s);
  void* p3 = a.allocate(P, s);
  const std::uintptr_t base = at(p1);
  fill_bytes<D>(p1, P, 11, depot::stream_ref<D>{s.native()});
  fill_bytes<D>(p3, P, 33, depot::stream_ref<D>{s.native()});
  s.synchronize();
  CHECK(states() == "A1 A5 A1");

  // A free block between live ones: empty_cache unmaps its pages, leaving a hole.
  a.deallocate(p2, s);
  CHECK(reserved() == 7 * P);
  a.empty_cache();
  check_invariants(a);
  CHECK(states() == "A1 U5 A1");
  CHECK(reserved() == 2 * P);
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(2 * P));
  CHECK(large_segments(a.snapshot())[0].size == 2 * P);
  CAPTURE(a.summary());
  CHECK(contains(a.summary(), "1 range, " + depot::format_bytes(2 * P) + " mapped; 1 hole of " +
                                  depot::format_bytes(5 * P) + " unmapped inside"));
  CHECK(check_bytes<D>(p1, P, 11, rng));
  CHECK(check_bytes<D>(p3, P, 33, rng));

  // A miss maps part of the hole back, where it was: no new range, no growth of the end.
  void* q = a.allocate(2 * P, s);
  CHECK(at(q) == base + P);
  CHECK(states() == "A1 A2 U3 A1");
  CHECK(reserved() == 4 * P);
  CHECK(counters->reservations.load() == 1);
  fill_bytes<D>(q, 2 * P, 22, depot::stream_ref<D>{s.native()});
  s.synchronize();
  CHECK(check_bytes<D>(q, 2 * P, 22, rng));
  check_invariants(a);

  // Blocks not on page boundaries keep their partial pages; holes beside each other merge.
  a.deallocate(q, s);
  void* r = a.allocate(3 * P / 4, s);  // from the 2 free pages: 0.75 handed out, 1.25 free
  CHECK(at(r) == base + P);
  CHECK(states() == "A1 Ax Fx U3 A1");
  a.empty_cache();  // the free block's one whole page joins the hole; a quarter page stays free
  CHECK(states() == "A1 Ax Fx U4 A1");
  CHECK(reserved() == 3 * P);
  check_invariants(a);
  a.deallocate(r, s);
  a.empty_cache();  // the free page beside the hole: one hole of 5 pages again
  CHECK(states() == "A1 U5 A1");
  CHECK(reserved() == 2 * P);
  check_invariants(a);
  void* t = a.allocate(3 * P / 4, s);  // less than a page: one page mapped at the hole's start
  CHECK(at(t) == base + P);
  CHECK(states() == "A1 A1 U4 A1");  // (a rest of a quarter page is not split off)
  a.deallocate(t, s);
  a.empty_cache();
  CHECK(states() == "A1 U5 A1");

  // A mapping that fails for another reason than memory is undone and reported.
  up.fail_maps_with_error = true;
  CHECK_THROWS_AS((void)a.allocate(4 * P, s), depot::error);
  up.fail_maps_with_error = false;
  check_invariants(a);
  CHECK(states() == "A1 U5 A1");
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(2 * P));
  // A request larger than the hole with its free neighbours does not fit there: the end grows.
  void* big = a.allocate(6 * P, s);
  CHECK(at(big) == base + 7 * P);
  CHECK(states() == "A1 U5 A1 A6");
  a.deallocate(big, s);
  CHECK(states() == "A1 U5 A1 F6");

  // The end: its free pages go, then the hole the end reaches, down to the live first block.
  a.deallocate(p3, s);
  a.empty_cache();
  CHECK(states() == "A1");
  CHECK(reserved() == P);
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(P));
  CHECK(check_bytes<D>(p1, P, 11, rng));
  check_invariants(a);
  // The trace tells every change of the reserved bytes, holes included.
  std::int64_t traced = 0;
  bool inside = false;
  for (const auto& e : a.trace()) {
    const auto n = static_cast<std::int64_t>(e.size);
    if (e.kind == depot::trace_kind::segment_allocate || e.kind == depot::trace_kind::segment_map) traced += n;
    if (e.kind == depot::trace_kind::segment_free || e.kind == depot::trace_kind::segment_unmap) traced -= n;
    inside = inside || (e.kind == depot::trace_kind::segment_unmap && e.address == base + P && e.size == 5 * P);
  }
  CHECK(traced == static_cast<std::int64_t>(P));
  CHECK(inside);

  // A segment whose first pages are a hole goes back whole once the rest is free.
  a.deallocate(p1, s);
  void* x = a.allocate(3 * P, s);
  void* y = a.allocate(P, s);
  CHECK(at(x) == base);
  a.deallocate(x, s);
  a.empty_cache();
  CHECK(states() == "U3 A1");
  CHECK(reserved() == P);
  a.deallocate(y, s);
  a.empty_cache();
  CHECK(large_segments(a.snapshot()).empty());
  CHECK(reserved() == 0);
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
  check_invariants(a);
}

// Many holes: a miss finds a hole whose pages, with the free blocks beside it, hold the
// request in constant time however many holes there are (the holes are indexed by that
// room, raised when a neighbour grows, lowered when found too high), holes that merge are
// found at their merged size, and a request no hole fits grows the end.
TEST_CASE_TEMPLATE("pool: expandable segments: a miss among many holes", D, DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters),
                                expandable_config<D>()};
  const std::size_t P = a.expandable_page();
  REQUIRE(P >= 2 * MiB);
  depot::stream<D> s;
  const auto at = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const auto reserved = [&] { return static_cast<std::size_t>(a.stats().reserved_bytes.all.current); };
  const auto holes = [&] {
    std::size_t n = 0;
    for (const auto& seg : large_segments(a.snapshot())) {
      for (const auto& b : seg.blocks) n += b.state == depot::block_state::unmapped ? 1 : 0;
    }
    return n;
  };
  constexpr std::size_t K = 150;  // more holes than a miss looks at
  std::vector<void*> b(2 * K + 1);
  for (void*& x : b) x = a.allocate(P, s);
  const std::uintptr_t base = at(b[0]);
  for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(at(b[i]) == base + i * P);
  for (std::size_t i = 1; i < b.size(); i += 2) a.deallocate(b[i], s);
  a.empty_cache();
  check_invariants(a);
  CHECK(holes() == K);
  CHECK(reserved() == (K + 1) * P);
  // Holes 1, 3, 5, 7 and 9 merge into one of 9 pages once the blocks between them go.
  for (std::size_t i = 2; i <= 8; i += 2) a.deallocate(b[i], s);
  a.empty_cache();
  check_invariants(a);
  CHECK(holes() == K - 4);
  CHECK(reserved() == (K - 3) * P);
  // The merged hole, indexed at its merged size, takes a 9-page request where it was.
  void* q = a.allocate(9 * P, s);
  CHECK(at(q) == base + P);
  CHECK(holes() == K - 5);
  CHECK(reserved() == (K + 6) * P);
  // 2 pages: no hole fits (one page each, live blocks beside them): the range's end grows.
  void* r = a.allocate(2 * P, s);
  CHECK(at(r) == base + (2 * K + 1) * P);
  CHECK(reserved() == (K + 8) * P);
  // One page: a hole takes it (every one fits alone), not the end.
  void* t = a.allocate(P, s);
  CHECK(at(t) > base + 9 * P);
  CHECK(at(t) < base + (2 * K + 1) * P);
  CHECK((at(t) - base) / P % 2 == 1);
  CHECK(holes() == K - 6);
  CHECK(reserved() == (K + 9) * P);
  CHECK(counters->reservations.load() == 1);  // one range throughout
  check_invariants(a);
  // A hole that fits only with its free neighbour, among 144 that do not: page 10 freed
  // below hole 11 raises hole 11's room to 2 pages, and 1.5 pages go there, not to the end.
  a.deallocate(b[10], s);
  void* h2 = a.allocate(P + P / 2, s);
  CHECK(at(h2) == base + 10 * P);  // page 10, then hole 11's page mapped back
  CHECK(holes() == K - 7);
  CHECK(reserved() == (K + 10) * P);
  check_invariants(a);
  // Rooms found too high are lowered: a block taken beside a hole leaves its room stale
  // (page 12 freed beside hole 13 raises it, then a 1-page hit takes page 12 back), and a
  // miss that meets it passes on to a hole that fits or to the end.
  a.deallocate(b[12], s);
  void* u = a.allocate(P, s);  // a hit: page 12 again
  CHECK(at(u) == base + 12 * P);
  void* w = a.allocate(P + P / 2, s);  // no hole has room for it now
  CHECK(at(w) == base + (2 * K + 3) * P);
  CHECK(reserved() == (K + 12) * P);
  check_invariants(a);
  a.deallocate(w, s);
  b[12] = u;
  for (void* x : {q, r, t, h2}) a.deallocate(x, s);
  for (std::size_t i = 0; i < b.size(); i += 2) {
    if (i < 2 || i > 10) a.deallocate(b[i], s);
  }
  a.empty_cache();
  check_invariants(a);
  CHECK(large_segments(a.snapshot()).empty());
  CHECK(reserved() == 0);
  CHECK(counters->outstanding.load() == 0);

  // Few holes: 1 and 3, and page 2 free between them; 1.5 pages fit into either hole with
  // page 2, which is mapped back instead of growing the end.
  std::vector<void*> f(5);
  for (void*& x : f) x = a.allocate(P, s);
  const std::uintptr_t fbase = at(f[0]);
  a.deallocate(f[1], s);
  a.deallocate(f[3], s);
  a.empty_cache();
  CHECK(holes() == 2);
  a.deallocate(f[2], s);
  CHECK(reserved() == 3 * P);
  void* g = a.allocate(P + P / 2, s);
  CHECK((at(g) == fbase + P || at(g) == fbase + 2 * P));
  CHECK(holes() == 1);
  CHECK(reserved() == 4 * P);
  check_invariants(a);
  for (void* x : {f[0], f[4], g}) a.deallocate(x, s);
  a.empty_cache();
  CHECK(reserved() == 0);

  // Part of a hole mapped back: the rest of the hole has the room hand_out left free
  // below it (a 3-page hole; 1.25 pages take 2 of them, 0.75 stay free beside the last).
  void* e0 = a.allocate(P, s);
  void* e1 = a.allocate(3 * P, s);
  void* e2 = a.allocate(P, s);
  const std::uintptr_t ebase = at(e0);
  a.deallocate(e1, s);
  a.empty_cache();
  CHECK(holes() == 1);
  void* m1 = a.allocate(P + P / 4, s);
  CHECK(at(m1) == ebase + P);
  CHECK(reserved() == 4 * P);
  void* m2 = a.allocate(P + P / 2, s);  // the free 0.75 and the last page of the hole
  CHECK(at(m2) == ebase + 2 * P + P / 4);
  CHECK(holes() == 0);
  CHECK(reserved() == 5 * P);
  check_invariants(a);
  for (void* x : {e0, m1, m2, e2}) a.deallocate(x, s);
  a.empty_cache();
  CHECK(reserved() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments out of memory while mapping a hole back: undone, reported", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  const std::size_t P = depot::caching_allocator<D>{std::make_unique<limiting_upstream<D>>(MiB, counters),
                                                    expandable_config<D>()}
                            .expandable_page();
  REQUIRE(P >= 2 * MiB);
  depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(4 * P, counters), expandable_config<D>()};
  depot::stream<D> s;
  void* p1 = a.allocate(P, s);
  void* p2 = a.allocate(2 * P, s);
  void* p3 = a.allocate(P, s);
  a.deallocate(p2, s);
  a.empty_cache();  // a hole of 2 pages; 2 pages of the limit's 4 mapped
  void* tiny = a.allocate(4096, s);  // a 2 MiB small segment: room for one page more
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(2 * P + 2 * MiB));
  const auto before = a.stats();
  CHECK_THROWS_AS((void)a.allocate(2 * P, s), depot::out_of_memory);  // the second page does not fit
  check_invariants(a);
  const auto after = a.stats();
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(2 * P + 2 * MiB));
  a.deallocate(tiny, s);
  a.empty_cache();  // the small segment goes: now the hole maps back
  void* q = a.allocate(2 * P, s);
  CHECK(q == p2);
  check_invariants(a);
  a.deallocate(q, s);
  a.deallocate(p1, s);
  a.deallocate(p3, s);
  a.empty_cache();
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments with release_threshold unmap a freed block's pages at once", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  depot::allocator_config cfg = expandable_config<D>();
  cfg.release_threshold = 0;
  depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters), cfg};
  const std::size_t P = a.expandable_page();
  REQUIRE(P >= 2 * MiB);
  depot::stream<D> s;
  void* p1 = a.allocate(P, s);
  void* p2 = a.allocate(3 * P, s);
  void* p3 = a.allocate(P, s);
  a.deallocate(p2, s);  // in the middle: a hole at once
  check_invariants(a);
  CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(2 * P));
  CHECK(counters->outstanding.load() == static_cast<std::int64_t>(2 * P));
  void* q = a.allocate(2 * P, s);  // mapped back into the hole
  CHECK(reinterpret_cast<std::uintptr_t>(q) == reinterpret_cast<std::uintptr_t>(p2));
  a.deallocate(q, s);
  a.deallocate(p3, s);  // the end, then the hole below it
  CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(P));
  a.deallocate(p1, s);
  CHECK(a.stats().reserved_bytes.all.current == 0);
  CHECK(counters->reservations.load() == 0);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: expandable segments out of memory: undone, retried, reported, no leak", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    auto up = std::make_unique<limiting_upstream<D>>(40 * MiB, counters);
    limiting_upstream<D>* upstream = up.get();
    depot::caching_allocator<D> a{std::move(up), expandable_config<D>()};
    const std::size_t page = a.expandable_page();
    REQUIRE(page != 0);
    depot::stream<D> s;
    void* x = a.allocate(16 * MiB, s);
    void* y = a.allocate(16 * MiB, s);
    a.deallocate(y, s);  // 16 MiB cached at the end
    // 30 MiB: the free end (16) grows by 14 MiB in place (30 of 40 mapped... 46 > 40): the
    // pages mapped before the refusal are unmapped again, the cache is released and the
    // retry maps what fits: free end trimmed, then grown from its start.
    const int maps_before = counters->maps.load();
    try {
      (void)a.allocate(30 * MiB, s);
      FAIL("30 MiB next to 16 live under a 40 MiB limit succeeded");
    } catch (const depot::out_of_memory& e) {
      const std::string m = e.what();
      CHECK(e.requested_bytes() == 30 * MiB);
      CHECK(contains(m, "expandable segment"));
      CHECK(contains(m, "largest free block"));
    }
    CHECK(counters->maps.load() > maps_before);  // pages were mapped, then undone
    check_invariants(a);
    auto st = a.stats();
    CHECK(st.num_ooms == 1);
    CHECK(st.num_alloc_retries == 1);
    CHECK(counters->outstanding.load() == st.reserved_bytes.all.current);
    CHECK(st.reserved_bytes.all.current <= static_cast<std::int64_t>(40 * MiB));
    // What fits still works, in the same range.
    void* z = a.allocate(20 * MiB, s);
    check_invariants(a);
    CHECK(large_segments(a.snapshot()).size() == 1);
    // A failure that is not out of memory propagates, undone.
    a.deallocate(z, s);
    a.empty_cache();
    const std::int64_t mapped = counters->outstanding.load();
    upstream->fail_maps_with_error = true;
    CHECK_THROWS_AS((void)a.allocate(20 * MiB, s), depot::error);
    upstream->fail_maps_with_error = false;
    CHECK(counters->outstanding.load() == mapped);
    check_invariants(a);
    CHECK(a.stats().reserved_bytes.all.current == mapped);
    void* w = a.allocate(20 * MiB, s);
    check_invariants(a);
    a.deallocate(w, s);
    a.deallocate(x, s);
  }
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments move between streams and obey release_threshold", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::allocator_config cfg = expandable_config<D>();
    cfg.release_threshold = 8 * MiB;
    cfg.steal_threshold = 0;  // s1 is live: its free segment moves before s2 grows
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters), cfg};
    depot::stream<D> s1;
    depot::stream<D> s2;
    const std::size_t page = a.expandable_page();
    REQUIRE(page != 0);
    void* keep = a.allocate(4 * MiB, s1);
    void* p = a.allocate(6 * MiB, s1);
    void* q = a.allocate(6 * MiB, s1);
    // Freeing the end block: 12 MiB cached > 8: the free end is unmapped at once.
    a.deallocate(q, s1);
    a.deallocate(p, s1);
    check_invariants(a);
    auto segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    CHECK(a.stats().cached_bytes.all.current <= static_cast<std::int64_t>(8 * MiB));
    CHECK(segs[0].size < 16 * MiB);
    // A wholly free segment of s1 moves to s2, which grows it; s1 then makes its own.
    a.deallocate(keep, s1);
    s1.synchronize();
    if (large_segments(a.snapshot()).size() == 1) {  // (kept: under the threshold)
      void* t = a.allocate(3 * MiB, s2);
      segs = large_segments(a.snapshot());
      REQUIRE(segs.size() == 1);
      CHECK(segs[0].stream == reinterpret_cast<std::uintptr_t>(s2.native()));
      void* u = a.allocate(20 * MiB, s2);  // grows the moved segment
      segs = large_segments(a.snapshot());
      REQUIRE(segs.size() == 1);
      void* v = a.allocate(3 * MiB, s1);  // s1 has none now: a new range
      segs = large_segments(a.snapshot());
      CHECK(segs.size() == 2);
      CHECK(counters->reservations.load() == 2);
      check_invariants(a);
      a.deallocate(t, s2);
      a.deallocate(u, s2);
      a.deallocate(v, s1);
    }
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
    CHECK(counters->reservations.load() == 0);
  }
  CHECK(counters->outstanding.load() == 0);
}

// steal_threshold unlimited with expandable segments: a miss maps pages into its own
// stream's range first, and only when mapping is refused takes over a live stream's whole
// free range (before releasing the cache: no retry counted).
TEST_CASE_TEMPLATE("pool: expandable segments grow first under steal_threshold unlimited, then take a live range", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    depot::allocator_config cfg = expandable_config<D>();
    cfg.steal_threshold = std::numeric_limits<std::size_t>::max();
    depot::caching_allocator<D> a{std::make_unique<limiting_upstream<D>>(40 * MiB, counters), cfg};
    REQUIRE(a.expandable_page() == 2 * MiB);
    depot::stream<D> s1;
    depot::stream<D> s2;
    void* x = a.allocate(24 * MiB, s1);
    a.deallocate(x, s1);  // s1's range: 24 MiB mapped, whole free
    void* y = a.allocate(12 * MiB, s2);  // s1 is live: s2 reserves its own range and maps 12 MiB
    CHECK(counters->reservations.load() == 2);
    CHECK(a.stats().reserved_bytes.all.current == static_cast<std::int64_t>(36 * MiB));
    const auto in_x = [&](void* p) {
      const auto v = reinterpret_cast<std::uintptr_t>(p);
      const auto lo = reinterpret_cast<std::uintptr_t>(x);
      return v >= lo && v < lo + 24 * MiB;
    };
    CHECK_FALSE(in_x(y));
    void* z = a.allocate(12 * MiB, s2);  // 12 MiB more would pass the upstream's 40: s1's range moves
    CHECK(in_x(z));
    const depot::memory_stats st = a.stats();
    CHECK(counters->failures.load() >= 1);
    CHECK(st.num_alloc_retries == 0);
    CHECK(st.num_ooms == 0);
    CHECK(st.reserved_bytes.all.current == static_cast<std::int64_t>(36 * MiB));
    for (const auto& seg : large_segments(a.snapshot())) {
      CHECK(seg.stream == reinterpret_cast<std::uintptr_t>(s2.native()));
    }
    check_invariants(a);
    a.deallocate(y, s2);
    a.deallocate(z, s2);
    a.empty_cache();
    CHECK(a.stats().reserved_bytes.all.current == 0);
  }
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
}

TEST_CASE_TEMPLATE("pool: expandable segments fall back to ordinary segments where nothing maps", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto up = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
  up->vm = false;
  depot::caching_allocator<D> a{std::move(up), expandable_config<D>()};
  CHECK(a.expandable_page() == 0);
  CHECK(contains(a.summary(), "expandable segments: not available"));
  void* p = a.allocate(3 * MiB);
  const auto segs = large_segments(a.snapshot());
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].reserved == 0);
  CHECK(segs[0].size == 20 * MiB);  // an ordinary 20 MiB segment
  CHECK(counters->reservations.load() == 0);
  a.deallocate(p);
}

TEST_CASE_TEMPLATE("pool: expandable segments make ordinary ones when no addresses can be reserved", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  {
    auto up = std::make_unique<limiting_upstream<D>>(std::size_t{1} << 40, counters);
    limiting_upstream<D>* upstream = up.get();
    depot::caching_allocator<D> a{std::move(up), expandable_config<D>()};
    REQUIRE(a.expandable_page() != 0);
    upstream->fail_reserve = true;
    void* p = a.allocate(3 * MiB);  // an ordinary 20 MiB segment, not an out-of-memory error
    auto segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 1);
    CHECK(segs[0].reserved == 0);
    CHECK(segs[0].size == 20 * MiB);
    CHECK(a.stats().num_ooms == 0);
    upstream->fail_reserve = false;
    void* q = a.allocate(30 * MiB);  // addresses again: an expandable segment
    segs = large_segments(a.snapshot());
    REQUIRE(segs.size() == 2);
    CHECK((segs[0].reserved != 0) != (segs[1].reserved != 0));
    CHECK(counters->reservations.load() == 1);
    check_invariants(a);
    a.deallocate(p);
    a.deallocate(q);
  }
  CHECK(counters->outstanding.load() == 0);
  CHECK(counters->reservations.load() == 0);
}

TEST_CASE_TEMPLATE("pool: fixed_pool serves equal blocks and reports its use", D, DEPOT_TEST_DEVICES)
{
  depot::fixed_pool<D> fp{10 * 4096 + 100, 4000};
  CHECK(fp.block_size() == 4096);  // rounded up to the 256-byte alignment
  CHECK(fp.capacity() == 10);
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) {
    void* p = fp.allocate();
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    depot::runtime<D>::set_async(p, i + 1, 4096, nullptr);
    blocks.push_back(p);
  }
  depot::runtime<D>::synchronize(0);
  CHECK(blocks[1] == static_cast<std::byte*>(blocks[0]) + 4096);  // lowest address first
  try {
    (void)fp.allocate();
    FAIL("an eleventh block was handed out");
  } catch (const depot::out_of_memory& e) {
    CHECK(contains(e.what(), "all 10 blocks"));
  }
  for (int i = 0; i < 10; ++i) {
    unsigned char probe = 0;
    depot::runtime<D>::copy(&probe, static_cast<std::byte*>(blocks[static_cast<std::size_t>(i)]) + 4095, 1);
    CHECK(probe == i + 1);  // blocks do not overlap
  }
  auto st = fp.get_stats();
  CHECK(st.used_blocks == 10);
  CHECK(st.hits == 10);
  CHECK(st.misses == 1);
  CHECK(st.hit_rate == doctest::Approx(10.0 / 11.0));
  // Free every other block: the free space is in runs of one.
  for (int i = 0; i < 10; i += 2) fp.deallocate(blocks[static_cast<std::size_t>(i)]);
  st = fp.get_stats();
  CHECK(st.free_blocks == 5);
  CHECK(st.largest_free_run == 1);
  CHECK(st.fragmentation == doctest::Approx(0.8));
  // Bad frees: double free, foreign pointer, a pointer inside a block.
  CHECK_THROWS_AS(fp.deallocate(blocks[0]), depot::invalid_argument);
  int local = 0;
  CHECK_THROWS_AS(fp.deallocate(&local), depot::invalid_argument);
  CHECK_THROWS_AS(fp.deallocate(static_cast<std::byte*>(blocks[1]) + 8), depot::invalid_argument);
  fp.deallocate(nullptr);  // a no-op, as for the caching allocators
  CHECK(fp.get_stats().free_blocks == 5);  // nothing changed
  for (int i = 1; i < 10; i += 2) fp.deallocate(blocks[static_cast<std::size_t>(i)]);
  fp.defragment();
  CHECK(fp.allocate() == blocks[0]);
  CHECK(fp.allocate() == blocks[1]);
  CHECK(fp.get_stats().peak_used_blocks == 10);
  // Bad construction.
  CHECK_THROWS_AS((depot::fixed_pool<D>{4096, 0}), depot::invalid_argument);
  CHECK_THROWS_AS((depot::fixed_pool<D>{100, 4096}), depot::invalid_argument);
  CHECK_THROWS_AS((depot::fixed_pool<D>{4096, 4096, -1}), depot::invalid_argument);
}

// fixed_pool's out-of-memory handler: called with no lock held when every block is in use;
// true tries again, false or none throws (one miss), its own exception reaches the caller.
TEST_CASE_TEMPLATE("pool: fixed_pool asks its out-of-memory handler when every block is in use", D,
                   DEPOT_TEST_DEVICES)
{
  depot::fixed_pool<D> fp{4 * 1024, 1024};
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) held.push_back(fp.allocate());
  std::vector<unsigned> attempts;
  std::string seen;
  // Frees one held block (inside the handler: no lock of the pool is held) and retries.
  fp.set_oom_handler([&](const depot::out_of_memory& e, unsigned attempt) {
    attempts.push_back(attempt);
    seen = e.what();
    CHECK(fp.get_stats().used_blocks == 4);
    fp.deallocate(held.back());
    held.pop_back();
    return true;
  });
  void* p = fp.allocate();
  CHECK(p != nullptr);
  CHECK(attempts == std::vector<unsigned>{1});
  CHECK(contains(seen, "all 4 blocks"));
  auto st = fp.get_stats();
  CHECK(st.misses == 0);
  CHECK(st.hits == 5);
  CHECK(st.used_blocks == 4);
  held.push_back(p);
  // Retrying without freeing: attempts 1, 2, 3, then it declines: thrown once, one miss.
  attempts.clear();
  fp.set_oom_handler([&](const depot::out_of_memory&, unsigned attempt) {
    attempts.push_back(attempt);
    return attempt < 3;
  });
  CHECK_THROWS_AS((void)fp.allocate(), depot::out_of_memory);
  CHECK(attempts == std::vector<unsigned>{1, 2, 3});
  st = fp.get_stats();
  CHECK(st.misses == 1);
  CHECK(st.hits == 5);
  CHECK(st.used_blocks == 4);
  // A handler that throws: its exception reaches the caller; the pool is unchanged.
  fp.set_oom_handler([](const depot::out_of_memory&, unsigned) -> bool { throw std::runtime_error("handler"); });
  CHECK_THROWS_WITH_AS((void)fp.allocate(), "handler", std::runtime_error);
  CHECK(fp.get_stats().used_blocks == 4);
  // An empty handler removes it: thrown at once.
  attempts.clear();
  fp.set_oom_handler({});
  CHECK_THROWS_AS((void)fp.allocate(), depot::out_of_memory);
  CHECK(attempts.empty());
  CHECK(fp.get_stats().misses == 2);
  for (void* b : held) fp.deallocate(b);
  CHECK(fp.get_stats().used_blocks == 0);
}

// Threads that find every block in use at once wait in the handler for a block another
// thread gives back; each request is served, none thrown.
TEST_CASE("pool: a fixed_pool out of blocks on many threads at once asks its handler")
{
  constexpr int k_threads = 4;
  constexpr int k_rounds = 200;
  depot::fixed_pool<depot::host> fp{2 * 512, 512};
  std::atomic<int> calls{0};
  fp.set_oom_handler([&](const depot::out_of_memory&, unsigned) {
    calls.fetch_add(1);
    std::this_thread::yield();
    return true;
  });
  std::vector<std::thread> threads;
  std::atomic<int> served{0}, ready{0}, holding{0};
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&, t] {
      // All start at once, and a block is held until both are (or 200 us passed: at the end
      // one thread may run alone), so the pool runs out: on a machine with many cores the
      // threads had finished one after another (peak 1).
      ++ready;
      while (ready.load() < k_threads) std::this_thread::yield();
      for (int r = 0; r < k_rounds; ++r) {
        auto* b = static_cast<int*>(fp.allocate());
        *b = t;
        ++holding;
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds{200};
        while (holding.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        if (*b == t) served.fetch_add(1);  // no other thread was handed the block meanwhile
        --holding;
        fp.deallocate(b);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(served.load() == k_threads * k_rounds);
  const auto st = fp.get_stats();
  CHECK(st.hits == k_threads * k_rounds);
  CHECK(st.misses == 0);
  CHECK(st.used_blocks == 0);
  CHECK(st.peak_used_blocks == 2);
  MESSAGE("handler calls: ", calls.load());
}

TEST_CASE_TEMPLATE("pool: frees from another stream or another thread find their block", D,
                   DEPOT_TEST_DEVICES)
{
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  depot::stream<D> s1;
  depot::stream<D> s2;
  void* x = a.allocate(3 * MiB, s1);
  void* y = a.allocate(4096, s1);
  a.deallocate(x, s2);  // ordered on s2: the block waits for s2 before s1 reuses it
  std::thread other{[&] { a.deallocate(y); }};  // no stream, a thread with no history here
  other.join();
  s2.synchronize();
  auto st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.num_allocations.all.current == 0);
  void* again = a.allocate(3 * MiB, s1);  // once s2's event is done, x's block is reused
  CHECK(again == x);
  a.deallocate(again);
  CHECK_THROWS_AS(a.deallocate(x, s2), depot::invalid_argument);  // already freed
  check_invariants(a);
  // A consumer thread freeing, unnamed, a producer's blocks of several streams: a free
  // looks in the cache of the thread's last free first (where a producer's next block
  // usually is), then in the others. In runs of one stream and alternating among them, so
  // that cache is sometimes the block's and sometimes not; each is found once, then refused.
  std::vector<depot::stream<D>> streams(4);
  std::vector<void*> made;
  for (int i = 0; i < 12; ++i) made.push_back(a.allocate(4096, streams[3]));  // a run of one stream
  for (int i = 0; i < 24; ++i) made.push_back(a.allocate(4096 * (1 + i % 3), streams[static_cast<std::size_t>(i % 4)]));
  made.push_back(a.allocate(5 * MiB, streams[1]));  // a large block among them
  int refused = 0;
  std::thread consumer{[&] {
    for (void* p : made) a.deallocate(p);
    for (void* p : made) {
      try {
        a.deallocate(p);
      } catch (const depot::invalid_argument&) {
        ++refused;
      }
    }
  }};
  consumer.join();
  CHECK(refused == static_cast<int>(made.size()));
  for (auto& s : streams) s.synchronize();
  CHECK(a.stats().allocated_bytes.all.current == 0);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: an unnamed free whose frame's segment moved to another cache still finds its block", D,
                   DEPOT_TEST_DEVICES)
{
  // A thread remembers where an unnamed free of each 2 MiB frame found its block (a guess,
  // checked under that cache's lock). Here the frame's segment moves to another stream's
  // cache (a destroyed stream's free segment taken over) and a block of it is freed by the
  // same thread: the stale guess misses, and the free still finds the block.
  depot::caching_allocator<D> a{0, quiet_config<D>()};
  std::thread worker{[&] {
    depot::stream<D> sx;
    auto sa = std::make_unique<depot::stream<D>>();
    void* keep = a.allocate(5 * MiB, *sa);  // a's cache keeps a block in use: not a spare
    void* p = a.allocate(4096, *sa);
    a.deallocate(a.allocate(4096, sx), sx);  // the thread's last stream: x
    a.deallocate(p);                         // unnamed: found through the directory, a's
    sa->synchronize();
    sa.reset();  // a destroyed: its whole free small segment is taken over by the next
    depot::stream<D> sb;
    void* r = a.allocate(4096, sb);  // b's cache grows by taking a's free segment
    const auto frame = [](void* q) { return reinterpret_cast<std::uintptr_t>(q) >> 21U; };
    REQUIRE(frame(r) == frame(p));
    a.deallocate(a.allocate(4096, sx), sx);  // the last stream x again, so the guess is asked
    a.deallocate(r);                         // the guess (a) misses; b's block is found
    CHECK(a.stats().allocated_bytes.all.current == static_cast<std::int64_t>(5 * MiB));
    CHECK_THROWS_AS(a.deallocate(r), depot::invalid_argument);  // and it is freed once
    a.deallocate(keep);
  }};
  worker.join();
  CHECK(a.stats().allocated_bytes.all.current == 0);
  check_invariants(a);
}

TEST_CASE_TEMPLATE("pool: a free whose stream cannot take an event still frees its block", D,
                   DEPOT_TEST_DEVICES)
{
  auto counters = std::make_shared<typename limiting_upstream<D>::counters>();
  auto upstream = std::make_unique<limiting_upstream<D>>(1024 * MiB, counters);
  limiting_upstream<D>* up = upstream.get();
  depot::caching_allocator<D> a{std::move(upstream), depot::allocator_config{}};
  depot::stream<D> s1;
  depot::stream<D> s2;
  void* p = a.allocate(MiB, s1);
  up->fail_events = true;
  a.deallocate(p, s2);  // would wait for s2: the event fails, the device is synchronised
  up->fail_events = false;
  const auto st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.active_bytes.all.current == 0);  // not left pending
  CHECK(a.allocate(MiB, s1) == p);          // and reusable at once
  a.deallocate(p, s1);
  check_invariants(a);
}
