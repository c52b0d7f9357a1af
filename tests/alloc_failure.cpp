// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// Host memory running out inside the caching allocator. This program replaces the global
// operator new (its own executable, so no other test runs under it) with one that can be
// told to fail its n-th call on this thread. A script of allocator calls covers every kind
// of growth in the pool's bookkeeping: the tables of live blocks and of segments, block
// records, record_stream's lists, pending events, the trace ring, snapshots and summaries.
// It runs once per n, with n = 0, 1, 2, ... until the whole script gets through with
// nothing failed. Each time, exactly the n-th host allocation fails. The contract checked:
// - a call either completes or throws std::bad_alloc (depot::out_of_memory is one),
//   and a free never throws;
// - the allocator stays whole after a failure: statistics equal the snapshot's sums, the
//   call that failed succeeds when tried again, every live block can be freed;
// - at the end nothing is allocated, empty_cache() gives every segment back, and once the
//   allocator is gone nothing of the device is held (an upstream that counts segments,
//   reserved ranges, mapped pages and events).
// DEPOT_FAIL_ALLOCATION=n runs the script once with only the n-th allocation failing (the
// failing step is named in the test's output), for a debugger's `catch throw`.
#include "limiting_upstream.hpp"
#include "pool_invariants.hpp"
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/stream.hpp>
#include <depot/pool/caching_allocator.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace {

// Calls of operator new on this thread before one fails (-1: none fails). Counting down
// past 0 fails one call, then none.
thread_local long t_countdown = -1;
thread_local long t_failures = 0;

bool fail_now() noexcept
{
  if (t_countdown < 0) return false;
  if (t_countdown-- == 0) {
    ++t_failures;
    return true;
  }
  return false;
}

void* allocate_or_null(std::size_t n, std::size_t align) noexcept
{
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}

void* allocate_or_throw(std::size_t n, std::size_t align)
{
  if (fail_now()) throw std::bad_alloc{};
  if (void* p = allocate_or_null(n, align)) return p;
  throw std::bad_alloc{};
}

void* allocate_nothrow(std::size_t n, std::size_t align) noexcept
{
  return fail_now() ? nullptr : allocate_or_null(n, align);
}

}  // namespace

void* operator new(std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
  return allocate_nothrow(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept
{
  return allocate_nothrow(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// One run of the script against a fresh allocator, the n-th host allocation of its armed
// steps failing (n < 0: none). Returns whether one failed; `steps` counts the steps run.
template <depot::device D>
bool run_script(long n, const depot::allocator_config& cfg, int& steps)
{
  // The device's upstream, counting what the allocator holds of it (no limit): a failure
  // path that dropped a segment, a range, a mapped page or an event without giving it back
  // leaks device memory that no statistic shows; here it is a count left above 0.
  const auto up = std::make_shared<typename depot::test::limiting_upstream<D>::counters>();
  std::optional<depot::caching_allocator<D>> allocator;
  allocator.emplace(std::make_unique<depot::test::limiting_upstream<D>>(std::numeric_limits<std::size_t>::max(), up), cfg);
  depot::caching_allocator<D>& a = *allocator;
  depot::stream<D> s1;
  depot::stream<D> s2;
  std::vector<void*> live;
  live.reserve(4096);  // the test's own bookkeeping never allocates while armed
  long left = n;
  bool failed = false;

  // Runs `call` with the countdown armed; a std::bad_alloc is the one allowed failure
  // (not of a free), after which the allocator must be whole and the same call must
  // succeed unarmed.
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    ++steps;
    t_failures = 0;
    t_countdown = left;
    bool threw = false;
    std::string message;
    try {
      call();
    } catch (const std::bad_alloc& e) {
      threw = true;
      t_countdown = -1;
      message = e.what();
    }
    const long used = left - t_countdown;  // calls made while armed (+1 for the failed one)
    t_countdown = -1;
    if (left >= 0) left = t_failures != 0 ? -1 : left - used;
    INFO("step ", steps, " (", std::string{what}, "), allocation ", n, " failing", threw ? ": threw " + message : "");
    CHECK((!threw || t_failures != 0));  // nothing but the injected failure
    CHECK_FALSE((threw && is_free));      // a free never fails for memory
    if (t_failures == 0) return;
    failed = true;
    // The call threw, or it caught the failure and finished another way (a free ordered by
    // synchronising instead of an event): the allocator is whole either way.
    depot::test::check_invariants(a);
    if (threw && !is_free) CHECK_NOTHROW(call());  // and still works: the same call again
    depot::test::check_invariants(a);
  };
  const auto allocate = [&](const char* what, std::size_t bytes, depot::stream<D>& s) {
    step(what, [&] { live.push_back(a.allocate(bytes, s)); });  // (reserved: no allocation)
  };
  // Frees down to `keep` live blocks, every third on the second stream (events, lists of
  // streams) and the others on the block's own.
  const auto free_some = [&](std::size_t keep) {
    while (live.size() > keep) {
      void* p = live.back();
      live.pop_back();
      CHECK(p != nullptr);
      if (live.size() % 3 == 0) {
        step("free on another stream", [&] { a.deallocate(p, s2); }, true);
      } else {
        step("free", [&] { a.deallocate(p); }, true);
      }
    }
  };

  // Both pools and every kind of segment: dense small, linked small, large, over 64 MiB.
  for (std::size_t bytes : {std::size_t{4}, 1 * KiB, 100 * KiB, 1 * MiB, 3 * MiB, 20 * MiB, 70 * MiB}) {
    allocate("allocate one of each size", bytes, s1);
  }
  // Another stream's cache, then blocks used by another stream (record_stream's lists) and
  // freed (pending events).
  allocate("allocate on a second stream", 64 * KiB, s2);
  allocate("allocate on a second stream", 8 * MiB, s2);
  step("record_stream of a small block", [&] { a.record_stream(live[1], s2); });
  step("record_stream of a large block", [&] { a.record_stream(live[4], s2); });
  // Many live blocks: the tables of live blocks and of small segments grow.
  for (int i = 0; i < 300; ++i) allocate("allocate many large blocks", 2 * MiB + 512 * static_cast<std::size_t>(i), s1);
  for (int i = 0; i < 300; ++i) allocate("allocate many small blocks", 512 * KiB + 512 * static_cast<std::size_t>(i), s1);
  step("trace on", [&] { a.set_trace_capacity(64); });
  allocate("allocate while tracing", 5 * MiB, s1);
  step("snapshot", [&] { (void)a.snapshot(); });
  step("summary", [&] { (void)a.summary(); });
  step("trace", [&] { (void)a.trace_json(); });
  step("stats", [&] { (void)a.stats(); });
  free_some(200);
  s2.synchronize();
  step("empty_cache", [&] { a.empty_cache(); });
  for (int i = 0; i < 50; ++i) allocate("allocate after empty_cache", 3 * MiB + 512 * static_cast<std::size_t>(i), s2);
  step("reset_memory_stats", [&] { a.reset_memory_stats(); });
  // A stream that ends with memory cached (its cache closes), then allocations that take
  // that memory over (steal) on another stream.
  {
    std::optional<depot::stream<D>> s3;
    s3.emplace();
    const std::size_t before = live.size();
    for (std::size_t bytes : {std::size_t{4} * KiB, 300 * KiB, 6 * MiB}) allocate("allocate on a third stream", bytes, *s3);
    while (live.size() > before) {
      void* p = live.back();
      live.pop_back();
      step("free on the third stream", [&] { a.deallocate(p, *s3); }, true);
    }
    step("the third stream ends", [&] { s3.reset(); }, true);
  }
  for (std::size_t bytes : {std::size_t{4} * KiB, 300 * KiB, 6 * MiB}) allocate("allocate after a stream ended", bytes, s1);

  // Nothing leaks: every block frees, and the cache empties.
  free_some(0);
  s1.synchronize();
  s2.synchronize();
  a.empty_cache();
  depot::test::check_invariants(a);
  const depot::memory_stats st = a.stats();
  CHECK(st.allocated_bytes.all.current == 0);
  CHECK(st.reserved_bytes.all.current == 0);
  // Nothing of the device is held past the allocator (segments, ranges, pages, events).
  allocator.reset();
  INFO("allocation ", n, " failing");
  CHECK(up->outstanding.load() == 0);  // segments and mapped pages
  CHECK(up->reservations.load() == 0);
  CHECK(up->events.load() == 0);
  return failed;
}

template <depot::device D>
void every_failure(const depot::allocator_config& cfg)
{
  int steps = 0;
  long n = 0;
  if (const char* only = std::getenv("DEPOT_FAIL_ALLOCATION")) {  // one n, to debug it
    (void)run_script<D>(std::atol(only), cfg, steps);
    return;
  }
  for (; run_script<D>(n, cfg, steps); ++n) {
  }
  MESSAGE("each of ", n, " host allocations failed in turn, over ", steps, " steps");
  CHECK(n > 500);  // the script reaches the bookkeeping's growth (~1 100 host allocations on the host backend)
}

}  // namespace

TEST_CASE_TEMPLATE("pool: every host allocation of the allocator's bookkeeping fails in turn", D, DEPOT_TEST_DEVICES)
{
  SUBCASE("default settings") { every_failure<D>(depot::allocator_config{}); }
  SUBCASE("expandable segments")
  {
    depot::allocator_config cfg;
    cfg.expandable_segments = true;
    every_failure<D>(cfg);
  }
}
