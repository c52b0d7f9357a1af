// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The lifetime planner: lifetimes from steps and from traces, the lower bound, plans checked
// by a brute-force overlap test (and the planner's own verifier checked against it), the
// 1.05x target on the generated shapes and on the recorded trace
// bench/traces/alloc_host_2threads.json, the search options, and the reuse suggestions.
#include "test_devices.hpp"
#include "trace_shapes.hpp"

#include <doctest/doctest.h>

#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/lifetime_planner.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using planner = depot::lifetime_planner;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// O(n^2): every pair alive at a common step must not share a byte; every buffer inside the
// arena. Returns the first offending pair as text, "" if the plan is valid.
std::string brute_force_check(const planner& pl, const planner::plan& p)
{
  const auto& ls = pl.lifetimes();
  if (p.offsets.size() != ls.size()) return "size";
  for (std::size_t i = 0; i < ls.size(); ++i) {
    if (ls[i].bytes == 0) continue;
    if (p.offsets[i] + ls[i].bytes > p.arena_bytes) return "buffer " + std::to_string(i) + " outside the arena";
    for (std::size_t j = i + 1; j < ls.size(); ++j) {
      if (ls[j].bytes == 0) continue;
      const bool same_time = ls[i].first_step <= ls[j].last_step && ls[j].first_step <= ls[i].last_step;
      const bool same_bytes = p.offsets[i] < p.offsets[j] + ls[j].bytes && p.offsets[j] < p.offsets[i] + ls[i].bytes;
      if (same_time && same_bytes) return "buffers " + std::to_string(i) + " and " + std::to_string(j);
    }
  }
  return "";
}

// The most bytes alive at one step, step by step.
std::size_t brute_force_lower_bound(const planner& pl)
{
  std::map<std::uint64_t, std::size_t> at;
  for (const auto& l : pl.lifetimes()) {
    at[l.first_step];
    at[l.last_step];
  }
  std::size_t best = 0;
  for (auto& [step, bytes] : at) {
    for (const auto& l : pl.lifetimes()) {
      if (l.first_step <= step && step <= l.last_step) bytes += l.bytes;
    }
    best = std::max(best, bytes);
  }
  return best;
}

// bench/traces/alloc_host_2threads.json in the source tree: $DEPOT_SOURCE_DIR if set, else
// found from this file's path as the compiler saw it (relative to the build directory) and
// from the working directory and its parents (meson runs tests inside the build directory).
std::filesystem::path recorded_trace_path(std::string& looked)
{
  const std::filesystem::path rel = std::filesystem::path{"bench"} / "traces" / "alloc_host_2threads.json";
  std::vector<std::filesystem::path> candidates;
  if (const char* dir = std::getenv("DEPOT_SOURCE_DIR")) candidates.push_back(std::filesystem::path{dir} / rel);
  const std::filesystem::path source_root = std::filesystem::path{__FILE__}.parent_path().parent_path();
  std::error_code ec;
  for (std::filesystem::path at = std::filesystem::current_path(ec); !ec;) {
    candidates.push_back(source_root.is_absolute() ? source_root / rel : at / source_root / rel);
    candidates.push_back(at / rel);
    if (at == at.parent_path() || candidates.size() > 24) break;
    at = at.parent_path();
  }
  for (const auto& c : candidates) {
    looked += " " + c.string();
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return {};
}

}  // namespace

TEST_CASE("planner: lifetimes, lower bound and an exact plan from record_usage")
{
  planner pl{1};
  pl.record_usage(0, {{1, 100}, {2, 50}});
  pl.record_usage(1, {{1, 100}, {3, 200}});
  pl.record_usage(2, {{3, 200}, {4, 100}});
  pl.record_usage(3, {{4, 100}, {2, 50}});  // tensor 2 lives through steps 0..3
  REQUIRE(pl.lifetimes().size() == 4);
  CHECK(pl.lifetimes()[1].first_step == 0);
  CHECK(pl.lifetimes()[1].last_step == 3);
  CHECK(pl.lifetimes()[2].first_step == 1);
  CHECK(pl.lifetimes()[2].last_step == 2);
  CHECK(pl.lower_bound() == 350);  // step 1 (and 2): 100 + 50 + 200 or 50 + 200 + 100
  const planner::plan p = pl.compute_reuse_plan();
  CHECK(p.lower_bound == 350);
  CHECK(p.arena_bytes == 350);
  CHECK(p.ratio() == doctest::Approx(1.0));
  CHECK(brute_force_check(pl, p).empty());
  CHECK_FALSE(pl.verify_plan(p).has_value());
  // tensors 1 and 4 never overlap, are the same size: one can take the other's memory
  const planner::suggestions s = pl.optimization_suggestions();
  CHECK(s.buffers == 4);
  CHECK(s.total_bytes == 450);
  CHECK(s.lower_bound == 350);
  CHECK(s.reusable_bytes == 100);
  REQUIRE(s.reuses.size() == 1);
  CHECK(s.reuses[0].tensor == 4);
  CHECK(s.reuses[0].donor == 1);
  CHECK(s.reuse_saved_bytes == 100);
  // steps out of order extend lifetimes backwards
  pl.record_usage(0, {{4, 100}});
  CHECK(pl.lifetimes()[3].first_step == 0);
  CHECK(pl.lower_bound() == 450);
}

TEST_CASE("planner: bad input is refused and changes nothing")
{
  CHECK_THROWS_AS(planner{3}, depot::invalid_argument);
  CHECK_THROWS_AS(planner{0}, depot::invalid_argument);
  planner pl{512};
  pl.record_usage(0, {{7, 1000}});
  try {
    pl.record_usage(5, {{8, 10}, {7, 5000}});
    FAIL("a size change was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "tensor 7"));
    CHECK(contains(e.what(), "step 5"));
    CHECK(contains(e.what(), "nothing was recorded"));
  }
  CHECK_THROWS_AS(pl.record_usage(6, {{9, 10}, {9, 20000}}), depot::invalid_argument);
  REQUIRE(pl.lifetimes().size() == 1);  // tensor 8 was not recorded
  CHECK(pl.lifetimes()[0].last_step == 0);
  CHECK(pl.lifetimes()[0].bytes == 1024);  // aligned to 512
  CHECK_THROWS_AS(pl.record_usage(1, {{1, std::numeric_limits<std::size_t>::max()}}), depot::invalid_argument);

  // a trace that allocates a live address again names the events
  depot::recorded_trace t;
  t.events.push_back({depot::trace_kind::allocate, 1, 4096, 512, 512, 0, 1, false, 0});
  t.events.push_back({depot::trace_kind::allocate, 2, 4096, 512, 512, 0, 1, false, 0});
  try {
    planner bad{t};
    FAIL("a double allocation was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "event 1"));
    CHECK(contains(e.what(), "since event 0"));
  }
  // a plan that does not fit the planner is refused with a reason
  planner::plan wrong;
  CHECK(pl.verify_plan(wrong).has_value());
  wrong.offsets = {100};
  wrong.arena_bytes = 2048;
  CHECK(contains(pl.verify_plan(wrong).value_or(""), "alignment"));
  wrong.offsets = {1536};
  CHECK(contains(pl.verify_plan(wrong).value_or(""), "past the arena"));
}

TEST_CASE("planner: lifetimes from a trace (frees before the trace, blocks never freed, address reuse)")
{
  depot::recorded_trace t;
  auto ev = [&](depot::trace_kind k, std::uintptr_t addr, std::size_t bytes) {
    t.events.push_back({k, t.events.size(), addr, bytes, bytes, 0, 1, false, 0});
  };
  ev(depot::trace_kind::free, 0x1000, 2048);              // 0: allocated before the trace
  ev(depot::trace_kind::segment_allocate, 0x2000, 1 << 21);  // 1: ignored
  ev(depot::trace_kind::allocate, 0x2000, 1000);          // 2
  ev(depot::trace_kind::allocate, 0x3000, 512);           // 3: never freed
  ev(depot::trace_kind::free, 0x2000, 1000);              // 4
  ev(depot::trace_kind::allocate, 0x2000, 3000);          // 5: same address again
  ev(depot::trace_kind::out_of_memory, 0, 1 << 30);       // 6
  ev(depot::trace_kind::free, 0x2000, 3000);              // 7
  const planner pl{t};
  const auto& ls = pl.lifetimes();
  REQUIRE(ls.size() == 4);
  CHECK(ls[0].id == 0);
  CHECK(ls[0].first_step == 0);
  CHECK(ls[0].last_step == 0);
  CHECK(ls[1].id == 2);
  CHECK(ls[1].bytes == 1024);
  CHECK(ls[1].last_step == 4);
  CHECK(ls[2].id == 3);
  CHECK(ls[2].last_step == 8);  // alive to the end
  CHECK(ls[3].id == 5);
  CHECK(ls[3].bytes == 3072);
  CHECK(ls[3].first_step == 5);
  CHECK(ls[3].last_step == 7);
  const auto s = pl.optimization_suggestions();
  CHECK(s.allocated_before_trace == 1);
  CHECK(s.never_freed == 1);
  CHECK(s.out_of_memory_events == 1);
  CHECK(pl.lower_bound() == 3072 + 512);
  const auto p = pl.compute_reuse_plan();
  CHECK(p.arena_bytes == 3072 + 512);
  CHECK(brute_force_check(pl, p).empty());
}

TEST_CASE("planner: random record_usage inputs: plans pass the brute-force check, the verifier agrees")
{
  std::mt19937_64 rng{depot::test::seed("planner random usage", 1122)};
  int corrupted_caught = 0;
  for (int round = 0; round < 60; ++round) {
    planner pl{round % 3 == 0 ? std::size_t{1} : std::size_t{256}};
    const int tensors = 5 + static_cast<int>(rng() % 120);
    const int steps = 3 + static_cast<int>(rng() % 50);
    for (int id = 0; id < tensors; ++id) {
      const std::size_t bytes = 1 + rng() % (round % 2 == 0 ? 4096 : 1 << 20);
      const int first = static_cast<int>(rng() % static_cast<std::uint64_t>(steps));
      const int last = first + static_cast<int>(rng() % static_cast<std::uint64_t>(steps - first));
      pl.record_usage(static_cast<std::uint64_t>(first), {{static_cast<std::uint64_t>(id), bytes}});
      pl.record_usage(static_cast<std::uint64_t>(last), {{static_cast<std::uint64_t>(id), bytes}});
    }
    CAPTURE(round);
    CHECK(pl.lower_bound() == brute_force_lower_bound(pl));
    const planner::plan p = pl.compute_reuse_plan();
    CHECK(p.arena_bytes >= p.lower_bound);
    CHECK(brute_force_check(pl, p) == "");
    CHECK_FALSE(pl.verify_plan(p).has_value());
    // Move buffers at random: the verifier and the brute force agree on every result.
    for (int k = 0; k < 20; ++k) {
      planner::plan q = p;
      const std::size_t i = rng() % q.offsets.size();
      const std::size_t j = rng() % q.offsets.size();
      q.offsets[i] = q.offsets[j] + (rng() % 2 == 0 ? 0 : pl.alignment() * (rng() % 4));
      q.arena_bytes = std::max(q.arena_bytes, q.offsets[i] + pl.lifetimes()[i].bytes);
      const bool brute_ok = brute_force_check(pl, q).empty();
      const auto verdict = pl.verify_plan(q);
      CHECK(brute_ok == !verdict.has_value());
      if (!brute_ok) {
        ++corrupted_caught;
        CHECK(contains(verdict.value_or(""), "share bytes"));
      }
    }
  }
  CHECK(corrupted_caught > 100);
}

TEST_CASE("planner: the generated trace shapes plan within 1.05x of the lower bound")
{
  const auto seed = depot::test::seed("planner shapes", 20261122);
  struct shape {
    std::string name;
    depot::recorded_trace trace;
  };
  std::vector<shape> shapes;
  shapes.push_back({"ladder", depot::test::ladder_trace(32, 4)});
  for (int k = 0; k < 4; ++k) {
    shapes.push_back({"random " + std::to_string(k), depot::test::random_trace(seed + static_cast<std::uint64_t>(k), 2000)});
  }
  shapes.push_back({"random small sizes", depot::test::random_trace(seed + 9, 3000, 64 << 10, 16 << 20)});
  shapes.push_back({"streams", depot::test::streams_trace(seed + 10, 8, 4, 5000)});
  shapes.push_back({"rmm csv", depot::parse_trace(depot::test::rmm_csv(depot::test::streams_trace(seed + 11, 4, 2, 3000)))});
  for (const shape& s : shapes) {
    CAPTURE(s.name);
    const planner pl{s.trace};
    const planner::plan p = pl.compute_reuse_plan();
    std::printf("[planner] %-20s %6zu buffers  lower bound %12zu  arena %12zu  ratio %.4f (%s)\n", s.name.c_str(),
                pl.lifetimes().size(), p.lower_bound, p.arena_bytes, p.ratio(), p.strategy.c_str());
    CHECK(p.lower_bound == brute_force_lower_bound(pl));
    CHECK(brute_force_check(pl, p) == "");
    CHECK_FALSE(pl.verify_plan(p).has_value());
    CHECK(p.ratio() <= 1.05);
    // the suggestions' reuse chain pairs never overlap in time
    const auto sug = pl.optimization_suggestions();
    std::map<std::uint64_t, std::size_t> by_id;
    for (std::size_t i = 0; i < pl.lifetimes().size(); ++i) by_id[pl.lifetimes()[i].id] = i;
    for (const auto& r : sug.reuses) {
      const auto& a = pl.lifetimes()[by_id.at(r.tensor)];
      const auto& d = pl.lifetimes()[by_id.at(r.donor)];
      CHECK(d.last_step < a.first_step);
    }
    CHECK(sug.total_bytes - sug.reuse_saved_bytes >= sug.lower_bound);
  }
}

TEST_CASE("planner: the recorded trace plans within 1.05x of the lower bound")
{
  std::string looked;
  const std::filesystem::path file = recorded_trace_path(looked);
  INFO("looked for the trace at:" << looked);
  REQUIRE_FALSE(file.empty());
  const planner pl{depot::read_trace(file)};
  REQUIRE(pl.lifetimes().size() == 2400);
  const auto t0 = std::chrono::steady_clock::now();
  const planner::plan p = pl.compute_reuse_plan();  // the default budget and seed
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[planner] %-20s %6zu buffers  lower bound %12zu  arena %12zu  ratio %.4f (%s; %.2f s, %llu visits)\n",
              "recorded trace", pl.lifetimes().size(), p.lower_bound, p.arena_bytes, p.ratio(), p.strategy.c_str(),
              seconds, static_cast<unsigned long long>(p.work));
  CHECK(p.lower_bound == 55535616);  // 53.0 MiB alive at once (aligned to 512)
  CHECK(p.lower_bound == brute_force_lower_bound(pl));
  CHECK(brute_force_check(pl, p) == "");
  CHECK_FALSE(pl.verify_plan(p).has_value());
  CHECK(p.ratio() <= 1.05);
  CHECK(p.work <= planner::plan_options{}.work_budget + planner::plan_options{}.work_budget / 20);
}

TEST_CASE("planner: the search is deterministic for a seed and budget, and bounded by them")
{
  const planner pl{depot::test::random_trace(depot::test::seed("planner search options", 77), 600, 1 << 20)};
  planner::plan_options o;
  o.work_budget = 0;  // the greedy orderings only
  const planner::plan greedy = pl.compute_reuse_plan(o);
  CHECK(greedy.work == 0);
  CHECK(greedy.strategy.find("sweep") == std::string::npos);
  CHECK(greedy.strategy.find("squeaky") == std::string::npos);
  CHECK_FALSE(pl.verify_plan(greedy).has_value());
  o.work_budget = 40'000'000;
  o.seed = 5;
  const planner::plan a = pl.compute_reuse_plan(o);
  const planner::plan b = pl.compute_reuse_plan(o);
  CHECK(a.offsets == b.offsets);
  CHECK(a.arena_bytes == b.arena_bytes);
  CHECK(a.strategy == b.strategy);
  CHECK(a.work == b.work);
  CHECK(a.arena_bytes <= greedy.arena_bytes);
  CHECK(a.work <= o.work_budget + o.work_budget / 20);
  CHECK(brute_force_check(pl, a) == "");
  CHECK_FALSE(pl.verify_plan(a).has_value());
  // a time limit stops the search early and still gives a valid plan
  o.work_budget = std::uint64_t{1} << 50;
  o.time_limit_seconds = 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  const planner::plan limited = pl.compute_reuse_plan(o);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  CHECK(brute_force_check(pl, limited) == "");
  CHECK(limited.arena_bytes <= greedy.arena_bytes);
}
