// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/event.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/ops/busy_wait.hpp>
#include <depot/ops/fill.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/double_buffer.hpp>
#include <depot/storage/prefetcher.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& part)
{
  return text.find(part) != std::string::npos;
}

template <depot::device D>
std::int64_t pinned_allocated()
{
  return depot::pinned_pool<D>().stats().allocated_bytes.all.current;
}

// Device memory read back to the host in the order of `s` (the device-side check).
template <depot::device D>
std::vector<std::int32_t> read_back(const std::int32_t* data, std::size_t n, depot::stream_ref<D> s)
{
  std::vector<std::int32_t> out(n);
  if (n > 0) depot::runtime<D>::copy_async(out.data(), data, n * sizeof(std::int32_t), s.native());
  s.synchronize();
  return out;
}

// How many elements of `v` differ from `value`.
std::size_t wrong_elements(const std::vector<std::int32_t>& v, std::int32_t value)
{
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [&](std::int32_t x) { return x != value; }));
}

// Seeded sizes for batch i: mostly a few thousand elements, some empty, a few large.
std::vector<std::size_t> random_sizes(std::mt19937_64& rng, std::size_t count)
{
  std::vector<std::size_t> sizes(count);
  for (auto& n : sizes) {
    const auto kind = rng() % 20;
    n = kind == 0 ? 0 : kind == 1 ? 20000 + rng() % 50000 : 1 + rng() % 6000;
  }
  return sizes;
}

// A short random pause on the host, now and then.
void maybe_pause(std::mt19937_64& rng)
{
  const auto r = rng() % 50;
  if (r == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
  } else if (r < 5) {
    std::this_thread::yield();
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// double_buffer

TEST_CASE_TEMPLATE("staging: double_buffer hands over thousands of batches in order and never "
                   "overwrites the one being read",
                   D, DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("staging: double_buffer order", 7001)};
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  constexpr std::size_t steps = 2000;
  depot::stream<D> consumer;
  {
    depot::double_buffer<std::int32_t, D> db{{32, 33}, consumer};
    CHECK(db.size() == 32 * 33);
    CHECK(db.bytes() == 32 * 33 * sizeof(std::int32_t));
    std::vector<std::int32_t> host(db.size());
    // Batch i is filled with i; the host vector is reused at once, so prefetch_next must have
    // read it before returning.
    auto prefetch = [&](std::size_t i) {
      if (i % 2 == 0) {
        std::fill(host.begin(), host.end(), static_cast<std::int32_t>(i));
        db.prefetch_next(host);
        std::fill(host.begin(), host.end(), -7);
      } else {
        db.prefetch_next_with([&](std::span<std::int32_t> staging) {
          std::fill(staging.begin(), staging.end(), static_cast<std::int32_t>(i));
        });
      }
    };
    prefetch(0);
    db.swap();
    prefetch(1);
    std::size_t bad_steps = 0;
    for (std::size_t i = 0; i < steps; ++i) {
      const auto view = db.current();
      REQUIRE(view.numel() == static_cast<std::int64_t>(db.size()));
      // The consumer reads the current buffer late (after a random device-side delay) and then
      // poisons it; the copy into this buffer, queued right after swap(), must wait for both.
      depot::ops::busy_wait<D>(std::chrono::microseconds(rng() % 40), consumer);
      std::vector<std::int32_t> back(db.size());
      depot::runtime<D>::copy_async(back.data(), view.data(), db.bytes(), consumer.native());
      depot::ops::fill<D, std::int32_t>(view.data(), db.size(), -1, consumer);
      if (i + 1 < steps) {
        db.swap();
        if (i + 2 < steps) prefetch(i + 2);
      }
      maybe_pause(rng);
      consumer.synchronize();
      if (wrong_elements(back, static_cast<std::int32_t>(i)) != 0) {
        ++bad_steps;
        if (bad_steps < 5) MESSAGE("step " << i << ": first element " << back.front());
      }
    }
    CHECK(bad_steps == 0);
    CHECK_FALSE(db.has_pending());
    consumer.synchronize();
  }
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

TEST_CASE_TEMPLATE("staging: page-locked batches are copied directly, in order, without staging", D,
                   DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("staging: page-locked", 7010)};
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  depot::stream<D> consumer;
  auto& pinned = depot::pinned_pool<D>();
  constexpr std::size_t n = 4096;
  // A ring of page-locked host blocks from the pinned pool, as a loader would fill them.
  constexpr std::size_t ring = 6;
  std::vector<std::int32_t*> blocks;
  for (std::size_t k = 0; k < ring; ++k) {
    blocks.push_back(static_cast<std::int32_t*>(pinned.allocate(n * sizeof(std::int32_t))));
  }
  CHECK(depot::runtime<D>::is_pinned(blocks[0]) == depot::is_gpu_v<D>);
  std::vector<std::int32_t> pageable(n, 3);
  CHECK_FALSE(depot::runtime<D>::is_pinned(pageable.data()));
  CHECK_FALSE(depot::runtime<D>::is_pinned(nullptr));
  {
    depot::double_buffer<std::int32_t, D> db{{static_cast<std::int64_t>(n)}, consumer};
    if constexpr (depot::is_gpu_v<D>) {
      CHECK_THROWS_WITH_AS(db.prefetch_next_async(pageable), doctest::Contains("not page-locked"),
                           depot::invalid_argument);
      CHECK_FALSE(db.has_pending());
    }
    // Block i % 2 holds batch i; it is rewritten only after the prefetch two calls later
    // returned, which is the documented rule.
    auto prefetch = [&](std::size_t i) {
      std::int32_t* b = blocks[i % 2];
      std::fill(b, b + n, static_cast<std::int32_t>(i));
      db.prefetch_next_async(std::span<const std::int32_t>{b, n});
    };
    prefetch(0);
    db.swap();
    prefetch(1);
    constexpr std::size_t steps = 1000;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < steps; ++i) {
      const auto view = db.current();
      if (rng() % 3 == 0) depot::ops::busy_wait<D>(std::chrono::microseconds(rng() % 30), consumer);
      std::vector<std::int32_t> back(n);
      depot::runtime<D>::copy_async(back.data(), view.data(), db.bytes(), consumer.native());
      depot::ops::fill<D, std::int32_t>(view.data(), n, -1, consumer);
      if (i + 1 < steps) {
        db.swap();
        if (i + 2 < steps) prefetch(i + 2);
      }
      consumer.synchronize();
      if (wrong_elements(back, static_cast<std::int32_t>(i)) != 0 && ++bad < 5) {
        MESSAGE("step " << i << ": first element " << back.front());
      }
    }
    CHECK(bad == 0);
  }
  // The prefetcher copies page-locked batches without taking staging from the pinned pool
  // (on the host backend nothing is page-locked, so it stages as usual).
  for (const std::size_t workers : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(workers);
    depot::prefetch_options opts;
    opts.lookahead = 3;  // a block is reused ring = 6 > lookahead + 1 batches later
    opts.num_workers = workers;
    constexpr std::size_t count = 800;
    std::size_t produced = 0;
    auto producer = [&]() -> std::optional<std::span<const std::int32_t>> {
      if (produced == count) return std::nullopt;
      std::int32_t* b = blocks[produced % ring];
      const std::size_t len = 1 + (produced * 7919) % n;
      std::fill(b, b + len, static_cast<std::int32_t>(produced));
      ++produced;
      return std::span<const std::int32_t>{b, len};
    };
    const auto calls = pinned.stats().num_allocations.all.allocated;
    std::size_t expected = 0, bad = 0;
    {
      depot::prefetcher<D, std::int32_t> pf{producer, opts, consumer};
      for (auto& b : pf) {
        const auto back = read_back<D>(b.data(), b.size(), consumer);
        if (b.index() != expected || wrong_elements(back, static_cast<std::int32_t>(expected)) != 0) ++bad;
        ++expected;
      }
    }
    CHECK(bad == 0);
    CHECK(expected == count);
    const auto used = pinned.stats().num_allocations.all.allocated - calls;
    if constexpr (depot::is_gpu_v<D>) {
      CHECK(used == 0);
    } else {
      CHECK(used >= 1);
    }
  }
  consumer.synchronize();
  for (auto* b : blocks) pinned.deallocate(b);
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

TEST_CASE_TEMPLATE("staging: double_buffer refuses misuse with a clear message and keeps its state", D,
                   DEPOT_TEST_DEVICES)
{
  depot::stream<D> consumer;
  try {
    depot::double_buffer<float, D> empty{{4, 0}, consumer};
    FAIL("a shape without elements was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "has no elements"));
  }
  try {
    depot::double_buffer<float, D> wrong{{4}, consumer, depot::device_count<D>()};
    FAIL("a device index out of range was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "out of range"));
  }

  depot::double_buffer<float, D> db{{2, 3}, consumer};
  try {
    (void)db.current();
    FAIL("current() before the first swap was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "no batch has been swapped in yet"));
  }
  try {
    db.swap();
    FAIL("swap() without a prefetch was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "nothing was prefetched"));
  }
  const std::vector<float> five(5, 1.0F);
  try {
    db.prefetch_next(five);
    FAIL("host data of the wrong size was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "has 5 elements, the buffers hold 6"));
  }
  CHECK_FALSE(db.has_pending());
  try {
    db.prefetch_next_with([](std::span<float>) { throw std::runtime_error("fill failed"); });
    FAIL("a throwing fill was swallowed");
  } catch (const std::runtime_error& e) {
    CHECK(std::string{e.what()} == "fill failed");
  }
  CHECK_FALSE(db.has_pending());

  const std::vector<float> six{1, 2, 3, 4, 5, 6};
  db.prefetch_next(six);
  try {
    db.prefetch_next(six);
    FAIL("a second prefetch without swap was accepted");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "already pending"));
  }
  db.swap();
  const auto v = db.current();
  std::vector<float> back(6);
  depot::runtime<D>::copy_async(back.data(), v.data(), 6 * sizeof(float), consumer.native());
  consumer.synchronize();
  CHECK(back == six);
  CHECK(v.shape().size() == 2);
  CHECK(v.size(0) == 2);
  CHECK(v.size(1) == 3);
}

// ---------------------------------------------------------------------------------------------
// prefetcher

TEST_CASE_TEMPLATE("staging: prefetcher delivers thousands of random-sized batches in order with "
                   "their data",
                   D, DEPOT_TEST_DEVICES)
{
  const std::uint64_t seed = depot::test::seed("staging: prefetcher order", 7002);
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  depot::stream<D> consumer;
  for (const bool pin : {true, false}) {
    for (const std::size_t workers : {std::size_t{1}, std::size_t{4}}) {
      CAPTURE(pin);
      CAPTURE(workers);
      std::mt19937_64 rng{seed + workers + (pin ? 100 : 0)};
      const std::size_t count = workers == 1 ? 1000 : 3000;
      const auto sizes = random_sizes(rng, count);
      const auto pinned_calls = depot::pinned_pool<D>().stats().num_allocations.all.allocated;
      std::size_t next_index = 0;
      std::mt19937_64 producer_rng{seed * 3 + workers};
      auto producer = [&]() -> std::optional<std::vector<std::int32_t>> {
        if (next_index == count) return std::nullopt;
        maybe_pause(producer_rng);
        const std::size_t i = next_index++;
        return std::vector<std::int32_t>(sizes[i], static_cast<std::int32_t>(i));
      };
      depot::prefetch_options opts;
      opts.lookahead = 3;
      opts.num_workers = workers;
      opts.pin_memory = pin;
      std::size_t expected = 0;
      std::size_t bad = 0;
      {
        depot::prefetcher<D, std::int32_t> pf{producer, opts, consumer};
        for (auto& b : pf) {
          if (b.index() != expected || b.size() != sizes[expected]) {
            ++bad;
            MESSAGE("batch " << b.index() << " of " << b.size() << " elements, expected "
                              << expected << " of " << sizes[expected]);
            break;
          }
          if (rng() % 4 == 0) depot::ops::busy_wait<D>(std::chrono::microseconds(rng() % 30), consumer);
          const auto back = read_back<D>(b.data(), b.size(), consumer);
          if (wrong_elements(back, static_cast<std::int32_t>(expected)) != 0) {
            ++bad;
            MESSAGE("batch " << expected << " holds wrong data");
          }
          // Poison it: if its memory were handed to a later batch before that batch's copy
          // landed, the later check would see -1.
          depot::ops::fill<D, std::int32_t>(b.data(), b.size(), -1, consumer);
          maybe_pause(rng);
          ++expected;
        }
        CHECK_FALSE(pf.next().has_value());  // stays at the end
      }
      CHECK(bad == 0);
      CHECK(expected == count);
      const auto pinned_used = depot::pinned_pool<D>().stats().num_allocations.all.allocated - pinned_calls;
      if (pin) {
        CHECK(pinned_used >= 1);
      } else {
        CHECK(pinned_used == 0);  // pageable staging takes nothing from the pinned pool
      }
    }
  }
  consumer.synchronize();
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

TEST_CASE_TEMPLATE("staging: prefetcher over ranges (held, owned and computed) keeps their order", D,
                   DEPOT_TEST_DEVICES)
{
  std::mt19937_64 rng{depot::test::seed("staging: prefetcher ranges", 7003)};
  depot::stream<D> consumer;
  const auto sizes = random_sizes(rng, 500);
  std::vector<std::vector<std::int32_t>> batches;
  for (std::size_t i = 0; i < sizes.size(); ++i) batches.emplace_back(sizes[i], static_cast<std::int32_t>(i));
  depot::prefetch_options opts;
  opts.lookahead = 4;
  opts.num_workers = 3;

  auto check_all = [&](auto& pf, std::size_t count) {
    std::size_t expected = 0;
    std::size_t bad = 0;
    for (auto& b : pf) {
      bad += b.index() == expected ? 0 : 1;
      bad += b.size() == sizes[expected] ? 0 : 1;
      bad += wrong_elements(read_back<D>(b.data(), b.size(), consumer), static_cast<std::int32_t>(expected));
      ++expected;
    }
    CHECK(bad == 0);
    CHECK(expected == count);
  };
  {
    depot::prefetcher<D, std::int32_t> held{batches, opts, consumer};  // the caller's vector
    check_all(held, batches.size());
  }
  {
    auto copy = batches;
    depot::prefetcher<D, std::int32_t> owned{std::move(copy), opts, consumer};  // moved in
    check_all(owned, batches.size());
  }
  {
    // A range whose elements are computed (returned by value).
    auto computed = std::views::iota(std::size_t{0}, sizes.size()) |
                    std::views::transform([&](std::size_t i) {
                      return std::vector<std::int32_t>(sizes[i], static_cast<std::int32_t>(i));
                    });
    depot::prefetcher<D, std::int32_t> pf{computed, opts, consumer};
    check_all(pf, sizes.size());
  }
  {
    std::vector<std::vector<std::int32_t>> none;
    depot::prefetcher<D, std::int32_t> pf{none, opts, consumer};
    CHECK_FALSE(pf.next().has_value());
  }
}

TEST_CASE_TEMPLATE("staging: a worker's exception reaches the consumer at its batch and ends the stream",
                   D, DEPOT_TEST_DEVICES)
{
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  depot::stream<D> consumer;
  depot::prefetch_options opts;
  opts.lookahead = 4;
  opts.num_workers = 3;

  SUBCASE("the producer throws")
  {
    std::size_t calls = 0;
    auto producer = [&]() -> std::optional<std::vector<std::int32_t>> {
      const std::size_t i = calls++;
      if (i == 37) throw std::runtime_error("producer failed at batch 37");
      return std::vector<std::int32_t>(100 + i, static_cast<std::int32_t>(i));
    };
    depot::prefetcher<D, std::int32_t> pf{producer, opts, consumer};
    for (std::size_t i = 0; i < 37; ++i) {
      auto b = pf.next();
      REQUIRE(b.has_value());
      CHECK(b->index() == i);
      CHECK(wrong_elements(read_back<D>(b->data(), b->size(), consumer), static_cast<std::int32_t>(i)) == 0);
    }
    try {
      (void)pf.next();
      FAIL("the producer's exception did not reach the consumer");
    } catch (const std::runtime_error& e) {
      CHECK(std::string{e.what()} == "producer failed at batch 37");
    }
    CHECK_FALSE(pf.next().has_value());
    CHECK_FALSE(pf.next().has_value());
    CHECK(calls == 38);  // nothing is taken from the producer after its failure
  }
  consumer.synchronize();
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

// The backend's own allocation fails here (a 4 PiB batch), so compute-sanitizer's API
// check skips this case.
TEST_CASE_TEMPLATE("staging: a batch too large for the device fails at its place in the stream "
                   "[provokes backend errors]",
                   D, DEPOT_TEST_DEVICES)
{
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  depot::stream<D> consumer;
  depot::prefetch_options opts;
  opts.lookahead = 4;
  opts.num_workers = 3;
  {
    std::vector<std::int32_t> small(16, 5);
    std::size_t calls = 0;
    auto producer = [&]() -> std::optional<std::span<const std::int32_t>> {
      const std::size_t i = calls++;
      if (i == 5) return std::span<const std::int32_t>{small.data(), std::size_t{1} << 50};  // never read
      return std::span<const std::int32_t>{small};
    };
    std::size_t seen = 0;
    try {
      for (auto& b : depot::prefetcher<D, std::int32_t>{producer, opts, consumer}) {
        CHECK(b.index() == seen);
        ++seen;
      }
      FAIL("the staging error did not reach the consumer");
    } catch (const depot::out_of_memory& e) {
      CHECK(e.requested_bytes() == (std::size_t{1} << 50) * sizeof(std::int32_t));
    }
    CHECK(seen == 5);
  }
  consumer.synchronize();
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

TEST_CASE_TEMPLATE("staging: early exit stops the workers cleanly and returns the memory", D,
                   DEPOT_TEST_DEVICES)
{
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  depot::stream<D> consumer;
  depot::prefetch_options opts;
  opts.lookahead = 3;
  opts.num_workers = 4;
  std::atomic<std::size_t> calls{0};
  auto endless = [&]() -> std::optional<std::vector<std::int32_t>> {
    const std::size_t i = calls.fetch_add(1);
    return std::vector<std::int32_t>(4096, static_cast<std::int32_t>(i));
  };

  SUBCASE("destroying the prefetcher")
  {
    {
      depot::prefetcher<D, std::int32_t> pf{endless, opts, consumer};
      for (std::size_t i = 0; i < 5; ++i) REQUIRE(pf.next().has_value());
    }
    CHECK(calls.load() <= 5 + opts.lookahead);
  }
  SUBCASE("breaking out of a range-for over a temporary")
  {
    std::size_t last = 0;
    for (auto& b : depot::prefetcher<D, std::int32_t>{endless, opts, consumer}) {
      last = b.index();
      if (last == 9) break;
    }
    CHECK(last == 9);
    CHECK(calls.load() <= 10 + opts.lookahead);
  }
  SUBCASE("stop(), then next()")
  {
    depot::prefetcher<D, std::int32_t> pf{endless, opts, consumer};
    REQUIRE(pf.next().has_value());
    pf.stop();
    const auto after = calls.load();
    CHECK_FALSE(pf.next().has_value());
    pf.stop();  // idempotent
    CHECK(calls.load() == after);
    consumer.synchronize();
    CHECK(depot::memory_allocated<D>() == base);
  }
  SUBCASE("while the producer is slow")
  {
    auto slow = [&]() -> std::optional<std::vector<std::int32_t>> {
      std::this_thread::sleep_for(20ms);
      return endless();
    };
    const auto t0 = clock_type::now();
    {
      depot::prefetcher<D, std::int32_t> pf{slow, opts, consumer};
      REQUIRE(pf.next().has_value());
    }
    // One producer call in progress at most (they are serialised): well under a second.
    CHECK(clock_type::now() - t0 < 2s);
  }
  consumer.synchronize();
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

TEST_CASE_TEMPLATE("staging: the prefetcher fills up to lookahead batches in flight and never more", D,
                   DEPOT_TEST_DEVICES)
{
  depot::stream<D> consumer;
  constexpr std::size_t total = 30;
  for (const std::size_t lookahead : {std::size_t{1}, std::size_t{2}, std::size_t{5}}) {
    for (const std::size_t workers : {std::size_t{1}, std::size_t{4}}) {
      CAPTURE(lookahead);
      CAPTURE(workers);
      std::atomic<std::size_t> calls{0};  // batches taken from the producer (and the final call)
      auto producer = [&]() -> std::optional<std::vector<std::int32_t>> {
        const std::size_t i = calls.fetch_add(1);
        if (i >= total) return std::nullopt;
        return std::vector<std::int32_t>(1000, static_cast<std::int32_t>(i));
      };
      depot::prefetch_options opts;
      opts.lookahead = lookahead;
      opts.num_workers = workers;
      depot::prefetcher<D, std::int32_t> pf{producer, opts, consumer};
      std::size_t over = 0;
      std::size_t unfilled = 0;
      for (std::size_t delivered = 1; auto b = pf.next(); ++delivered) {
        // In flight = taken from the producer, not yet delivered (the final empty call counts).
        const std::size_t full = std::min(delivered + lookahead, total + 1);
        over += calls.load() > full ? 1 : 0;
        const auto deadline = clock_type::now() + 5s;
        while (calls.load() < full && clock_type::now() < deadline) std::this_thread::sleep_for(100us);
        unfilled += calls.load() == full ? 0 : 1;  // the workers do run ahead, as far as allowed
        std::this_thread::sleep_for(500us);
        over += calls.load() > full ? 1 : 0;  // and stop there
      }
      CHECK(over == 0);
      CHECK(unfilled == 0);
      CHECK(calls.load() == total + 1);
    }
  }
}

TEST_CASE_TEMPLATE("staging: prefetcher refuses bad options with the valid range", D, DEPOT_TEST_DEVICES)
{
  std::vector<std::vector<float>> batches(3, std::vector<float>(4, 1.0F));
  auto expect_refused = [&](depot::prefetch_options o, const std::string& part) {
    try {
      depot::prefetcher<D, float> pf{batches, o};
      FAIL("prefetch options were accepted: " << part);
    } catch (const depot::invalid_argument& e) {
      CHECK_MESSAGE(contains(e.what(), part), e.what());
    }
  };
  depot::prefetch_options o;
  o.lookahead = 0;
  expect_refused(o, "lookahead = 0 is out of range; valid values are 1 to 1024");
  o.lookahead = 1025;
  expect_refused(o, "lookahead = 1025 is out of range");
  o = {};
  o.num_workers = 0;
  expect_refused(o, "num_workers = 0 is out of range; valid values are 1 to 256");
  o.num_workers = 100000;
  expect_refused(o, "num_workers = 100000 is out of range");
  o = {};
  o.device = depot::device_count<D>();
  expect_refused(o, "out of range");
  o.device = -1;
  expect_refused(o, "out of range");
  // The defaults work.
  depot::prefetcher<D, float> pf{batches};
  CHECK(pf.options().lookahead == 2);
  CHECK(pf.options().num_workers == 1);
  CHECK(pf.options().pin_memory);
  std::size_t n = 0;
  for (auto& b : pf) n += b.size();
  CHECK(n == 12);
}

// Run under ThreadSanitizer by tools/test: many workers, several consumers at once, early exits.
TEST_CASE_TEMPLATE("staging: concurrent workers, consumers and early exits", D, DEPOT_TEST_DEVICES)
{
  const std::uint64_t seed = depot::test::seed("staging: concurrent", 7004);
  const auto base = depot::memory_allocated<D>();
  const auto pinned_base = pinned_allocated<D>();
  std::atomic<std::size_t> failures{0};
  auto consume = [&](std::uint64_t s) {
    std::mt19937_64 rng{s};
    depot::stream<D> consumer;
    for (int round = 0; round < 12; ++round) {
      depot::prefetch_options opts;
      opts.lookahead = 1 + rng() % 8;
      opts.num_workers = 1 + rng() % 8;
      opts.pin_memory = rng() % 4 != 0;
      const std::size_t count = 100 + rng() % 200;
      const std::size_t stop_at = rng() % 3 == 0 ? rng() % count : count;  // early exit
      std::atomic<std::size_t> taken{0};
      auto producer = [&taken, count]() -> std::optional<std::vector<std::int32_t>> {
        const std::size_t i = taken.fetch_add(1);
        if (i >= count) return std::nullopt;
        return std::vector<std::int32_t>(1 + (i * 7919) % 3000, static_cast<std::int32_t>(i));
      };
      std::size_t expected = 0;
      depot::prefetcher<D, std::int32_t> pf{producer, opts, consumer};
      for (auto& b : pf) {
        if (b.index() != expected) failures.fetch_add(1);
        if (wrong_elements(read_back<D>(b.data(), b.size(), consumer), static_cast<std::int32_t>(expected)) != 0) {
          failures.fetch_add(1);
        }
        if (++expected == stop_at) break;
      }
      if (expected != stop_at) failures.fetch_add(1);
      consumer.synchronize();
    }
  };
  std::vector<std::thread> consumers;
  for (std::uint64_t t = 0; t < 3; ++t) consumers.emplace_back(consume, seed + t);
  for (auto& t : consumers) t.join();
  CHECK(failures.load() == 0);
  CHECK(depot::memory_allocated<D>() == base);
  CHECK(pinned_allocated<D>() == pinned_base);
}

// The compute stand-in that the staging tests and `depot-bench staging` rely on.
TEST_CASE_TEMPLATE("ops: busy_wait spins for the requested time on its stream", D, DEPOT_TEST_DEVICES)
{
  depot::stream<D> s;
  depot::event<D> start{0, true};
  depot::event<D> stop{0, true};
  depot::ops::busy_wait<D>(1us, s);  // Kokkos starts and the kernel loads outside the timing
  s.synchronize();
  for (const auto d : {200us, 2000us}) {
    CAPTURE(d.count());
    const auto t0 = clock_type::now();
    start.record(s);
    depot::ops::busy_wait<D>(d, s);
    stop.record(s);
    stop.synchronize();
    const double wall_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    const double ms = depot::event<D>::elapsed_ms(start, stop);
    const double want = std::chrono::duration<double, std::milli>(d).count();
    CHECK(ms >= 0.95 * want);
    CHECK(wall_ms >= 0.95 * want);
    CHECK(ms < want + 100.0);  // generous: a loaded CI machine
  }
  depot::ops::busy_wait<D>(0ns, s);  // nothing to do
  for (const auto bad : {std::chrono::nanoseconds{-1}, std::chrono::nanoseconds{61s}}) {
    try {
      depot::ops::busy_wait<D>(bad, s);
      FAIL("busy_wait accepted " << bad.count() << " ns");
    } catch (const depot::invalid_argument& e) {
      CHECK(contains(e.what(), "valid durations are 0 to 60 s"));
    }
  }
}
