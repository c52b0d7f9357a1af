// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The stream caches' lock (pool/include/depot/pool/detail/biased_mutex.hpp): exclusion in
// every mix of biased and ordinary takes, revocation while the biased thread is inside or
// gone, the run before a bias and its doubling. Host-only: it is the same on every backend.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/pool/detail/biased_mutex.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using depot::detail::biased_mutex;

namespace {

// Takes it n times in a row on the calling thread.
void take_run(biased_mutex& m, std::uint32_t n)
{
  for (std::uint32_t i = 0; i < n; ++i) {
    m.lock();
    m.unlock();
  }
}

}  // namespace

TEST_CASE("pool: biased lock: a run of takes by one thread biases it, where membarrier is there")
{
  const bool supported = biased_mutex::supported();
  std::printf("biased_mutex: membarrier %s\n", supported ? "available: locks bias" : "not available: never biased");
  // A bias pays for its revocation after an hour here, so a revocation always doubles the
  // next run (the default 1 ms would make the test depend on its own speed).
  constexpr std::int64_t hour_ns = std::int64_t{3600} * 1'000'000'000;
  biased_mutex m{true, hour_ns};
  take_run(m, biased_mutex::k_first_run - 1);
  CHECK_FALSE(m.biased_to_me());
  take_run(m, 1);
  CHECK(m.biased_to_me() == supported);
  // the biased takes exclude like any other (the same thread again, then try_lock)
  take_run(m, 1000);
  CHECK(m.biased_to_me() == supported);
  CHECK(m.try_lock());
  m.unlock();

  SUBCASE("never biased when built unbiasable")
  {
    biased_mutex u{false};
    take_run(u, 10 * biased_mutex::k_first_run);
    CHECK_FALSE(u.biased_to_me());
  }
  SUBCASE("another thread's take revokes it; a short-lived bias needs twice the run next time")
  {
    bool other_biased = true;
    std::thread([&] {
      m.lock();
      other_biased = m.biased_to_me();
      m.unlock();
    }).join();
    CHECK_FALSE(other_biased);
    CHECK_FALSE(m.biased_to_me());
    m.lock();
    CHECK(m.revocations() == (supported ? 1U : 0U));
    m.unlock();
    // revoked before it paid off: the next run is twice as long
    take_run(m, 2 * biased_mutex::k_first_run - 2);  // with the take above: one short
    CHECK_FALSE(m.biased_to_me());
    take_run(m, 1);
    CHECK(m.biased_to_me() == supported);
  }
  SUBCASE("a thread that ended biased: the next taker revokes and goes on")
  {
    std::thread([&] { take_run(m, 10'000); }).join();
    CHECK_FALSE(m.biased_to_me());
    CHECK(m.try_lock());  // revokes (the thread is gone, so nobody is inside)
    m.unlock();
    take_run(m, 1);
  }
}

TEST_CASE("pool: biased lock: a bias that lasted long enough is made again after the first run")
{
  biased_mutex m{true, 0};  // every bias pays for its revocation at once
  take_run(m, biased_mutex::k_first_run);
  CHECK(m.biased_to_me() == biased_mutex::supported());
  std::thread([&] { take_run(m, 1); }).join();
  CHECK_FALSE(m.biased_to_me());
  take_run(m, biased_mutex::k_first_run - 1);
  CHECK_FALSE(m.biased_to_me());
  take_run(m, 1);
  CHECK(m.biased_to_me() == biased_mutex::supported());
}

TEST_CASE("pool: biased lock: the bias goes only to its first thread while that thread runs")
{
  // A thread whose biased entry read the bias as its own just before a revocation stores
  // the busy flag after it, then clears it as it backs off. Had the bias been made to
  // another thread meanwhile, that clear would let a taker in beside the new holder; so a
  // bias goes only to the first thread it went to, until that thread exits (threads are
  // named by numbers never reused, so a later thread cannot pass for it).
  const bool supported = biased_mutex::supported();
  biased_mutex m{true, 0};  // every bias pays for its revocation: runs restart at k_first_run
  take_run(m, biased_mutex::k_first_run);
  CHECK(m.biased_to_me() == supported);
  bool other_biased = true;
  std::thread([&] {
    take_run(m, 20 * biased_mutex::k_first_run);  // revokes this thread's bias, then runs
    other_biased = m.biased_to_me();
  }).join();
  CHECK_FALSE(other_biased);
  CHECK_FALSE(m.biased_to_me());
  take_run(m, 40 * biased_mutex::k_first_run);  // the owner runs again (the refusals doubled the run)
  CHECK(m.biased_to_me() == supported);

  // The owner has exited: the next thread to run on it owns it.
  biased_mutex n{true, 0};
  bool first = false;
  std::thread([&] {
    take_run(n, biased_mutex::k_first_run);
    first = n.biased_to_me();
  }).join();
  CHECK(first == supported);
  bool second = false;
  std::thread([&] {
    take_run(n, biased_mutex::k_first_run + 1);  // its first take revokes the dead owner's bias
    second = n.biased_to_me();
  }).join();
  CHECK(second == supported);
}

TEST_CASE("pool: biased lock: a biased holder inside keeps every other taker out until it leaves")
{
  biased_mutex m;
  std::atomic<bool> inside{false};
  std::atomic<bool> leave{false};
  std::atomic<bool> other_in{false};
  std::thread holder([&] {
    take_run(m, biased_mutex::k_first_run);  // biased to this thread, where supported
    m.lock();
    inside = true;
    while (!leave.load()) std::this_thread::yield();
    inside = false;
    m.unlock();
  });
  while (!inside.load()) std::this_thread::yield();
  CHECK_FALSE(m.try_lock_unbiased());  // held (or biased to the holder)
  CHECK_FALSE(m.try_lock());           // revokes where biased, but the holder is inside
  std::thread taker([&] {
    m.lock();  // sleeps until the holder leaves
    other_in = true;
    CHECK_FALSE(inside.load());
    m.unlock();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds{30});
  CHECK_FALSE(other_in.load());
  leave = true;
  holder.join();
  taker.join();
  CHECK(other_in.load());
  CHECK(m.try_lock());
  m.unlock();
}

TEST_CASE("pool: biased lock: four threads in runs and at random keep their counts exact")
{
  // Each thread takes the lock in runs (long enough to bias it) or singly, by lock(),
  // try_lock() or try_lock_unbiased(), and inside bumps plain counters and checks that
  // nobody else is inside: a broken exclusion loses counts or sees a second holder.
  constexpr unsigned seed = 20261127;
  std::printf("biased lock exclusion: seed %u\n", seed);
  biased_mutex m;
  std::uint64_t total = 0;         // plain: guarded by m
  int holders = 0;                 // plain: guarded by m
  std::atomic<std::uint64_t> taken{0};
  std::atomic<int> overlaps{0};
  constexpr int threads_n = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng{seed + static_cast<unsigned>(t)};
      std::uint64_t mine = 0;
      for (int round = 0; round < 60; ++round) {
        const std::uint32_t run = rng() % 3 == 0 ? 1 : biased_mutex::k_first_run + rng() % 2000;
        for (std::uint32_t i = 0; i < run; ++i) {
          const unsigned how = rng() % 16;
          bool got = true;
          if (how == 0) {
            got = m.try_lock();
          } else if (how == 1) {
            got = m.try_lock_unbiased();
          } else {
            m.lock();
          }
          if (!got) continue;
          if (++holders != 1) overlaps.fetch_add(1);
          ++total;
          ++mine;
          --holders;
          m.unlock();
        }
        if (rng() % 4 == 0) std::this_thread::yield();
      }
      taken.fetch_add(mine);
    });
  }
  for (auto& th : threads) th.join();
  std::lock_guard g{m};
  CHECK(overlaps.load() == 0);
  CHECK(total == taken.load());
  if (biased_mutex::supported()) CHECK(m.revocations() > 0);
}

TEST_CASE("pool: biased lock: lock_many takes every lock with one barrier for all the biases it revokes")
{
  const bool supported = biased_mutex::supported();
  constexpr std::int64_t hour_ns = std::int64_t{3600} * 1'000'000'000;
  std::vector<std::unique_ptr<biased_mutex>> own;
  for (int i = 0; i < 5; ++i) own.push_back(std::make_unique<biased_mutex>(true, hour_ns));
  std::vector<biased_mutex*> all;
  for (auto& m : own) all.push_back(m.get());
  biased_mutex& mine = *all[4];  // biased to this thread; 0-3 to the other one
  take_run(mine, biased_mutex::k_first_run);
  std::atomic<bool> ready{false};   // the other thread has biased 0-3 (and is inside 1, if asked)
  std::atomic<bool> leave{false};
  std::atomic<bool> inside{false};
  bool stay_inside = false;
  SUBCASE("the biased thread outside every lock") {}
  SUBCASE("the biased thread inside one of them: lock_many waits until it leaves") { stay_inside = true; }
  std::thread other([&] {
    for (int i = 0; i < 4; ++i) take_run(*all[static_cast<std::size_t>(i)], biased_mutex::k_first_run);
    if (stay_inside) {
      all[1]->lock();
      inside = true;
    }
    ready = true;
    while (!leave.load()) std::this_thread::yield();
    if (stay_inside) {
      inside = false;
      all[1]->unlock();
    }
  });
  while (!ready.load()) std::this_thread::yield();
  CHECK(mine.biased_to_me() == supported);
  const std::uint64_t before = biased_mutex::barriers();
  std::atomic<bool> taken{false};
  bool inside_when_taken = true;
  std::thread reader([&] {
    biased_mutex::lock_many(all.data(), all.size());
    inside_when_taken = inside.load();
    taken = true;
  });
  if (stay_inside) {
    std::this_thread::sleep_for(std::chrono::milliseconds{30});
    CHECK_FALSE(taken.load());  // the biased holder is still inside 1
  }
  leave = true;
  reader.join();
  other.join();
  CHECK(taken.load());
  CHECK_FALSE(inside_when_taken);
  // 0-3 revoked by one barrier, 4 (biased to this thread, not the reader) too
  CHECK(biased_mutex::barriers() - before == (supported ? 1U : 0U));
  for (biased_mutex* m : all) {
    CHECK(m->revocations() == (supported ? 1U : 0U));  // the reader still holds them all
    CHECK_FALSE(m->biased_to_me());
  }
  // held: no other taker gets in until each is given back (by this thread: the reader
  // has ended; a lock is not tied to its taker's thread once taken by the shared word)
  std::thread([&] {
    for (biased_mutex* m : all) CHECK_FALSE(m->try_lock());
  }).join();
  for (biased_mutex* m : all) m->unlock();
  for (biased_mutex* m : all) {
    CHECK(m->try_lock());
    m->unlock();
  }
  // lock_many on locks biased to the caller takes their words and keeps their biases: no barrier
  for (biased_mutex* m : all) take_run(*m, 2 * biased_mutex::k_first_run);
  const std::uint64_t before_own = biased_mutex::barriers();
  biased_mutex::lock_many(all.data(), all.size());
  CHECK(biased_mutex::barriers() == before_own);
  std::thread([&] {
    for (biased_mutex* m : all) CHECK_FALSE(m->try_lock_unbiased());
  }).join();
  for (biased_mutex* m : all) m->unlock();
  for (biased_mutex* m : all) CHECK(m->biased_to_me() == supported);
}

// Two threads, each with a lock biased to it, taking both with lock_many in one order, over
// and over. lock_many entered a lock biased to its caller without its shared word: the other
// thread then took that word, dropped the bias and waited for the first to leave it, while
// the first waited for the word of the other's own lock, which the other had entered
// biased. Both stopped for good within a few rounds.
TEST_CASE("pool: biased lock: lock_many by two threads, each with a lock biased to it, never deadlocks")
{
  biased_mutex m0{true, 0};  // every bias paid off: each round's run biases it again
  biased_mutex m1{true, 0};
  biased_mutex* const both[] = {&m0, &m1};
  constexpr int k_rounds = 2000;
  std::atomic<int> finished{0};
  std::atomic<long> inside{0};
  std::atomic<long> overlaps{0};  // both holding every lock at once: must never happen
  const auto run = [&](biased_mutex& own) {
    for (int r = 0; r < k_rounds; ++r) {
      take_run(own, 2 * biased_mutex::k_first_run);  // (re)biased to this thread
      biased_mutex::lock_many(both, 2);
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      inside.fetch_sub(1);
      m0.unlock();
      m1.unlock();
    }
    finished.fetch_add(1);
  };
  std::thread t0([&] { run(m0); });
  std::thread t1([&] { run(m1); });
  depot::test::wait_or_abort(finished, 2, "biased lock: lock_many by two threads");
  t0.join();
  t1.join();
  CHECK(overlaps.load() == 0);
}
