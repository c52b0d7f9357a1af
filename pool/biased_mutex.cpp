// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/pool/detail/biased_mutex.hpp>
#include <depot/pool/detail/fork_hooks.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace depot::detail {

namespace {

std::int64_t now_ns() noexcept
{
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if defined(__linux__)
long membarrier(int cmd) noexcept { return syscall(SYS_membarrier, cmd, 0U, 0); }
#endif

std::atomic<std::uint64_t> barriers_issued{0};

// The names of the threads that took a shared word and have not exited (biased_mutex::id_),
// so a bias whose owner has exited can be made to another thread. Never destroyed: a thread
// may exit after the statics are gone.
struct live_ids {
  std::mutex mu;
  std::vector<std::uintptr_t> ids;
};
live_ids& live() noexcept
{
  static auto* const l = new live_ids;
  return *l;
}
std::atomic<std::uintptr_t> next_id{2};
// Takes the thread's name off the list as it exits.
struct id_guard {
  std::uintptr_t id = 0;
  id_guard() = default;
  id_guard(const id_guard&) = delete;
  id_guard& operator=(const id_guard&) = delete;
  ~id_guard()
  {
    if (id == 0) return;
    live_ids& l = live();
    std::lock_guard g{l.mu};
    std::erase(l.ids, id);
  }
};
thread_local id_guard tl_id_guard;  // touched only by assign_id()

// A full memory barrier on every running thread of this process (the revoker's side of
// the biased entry's Dekker pairing).
void heavy_fence() noexcept
{
  barriers_issued.fetch_add(1, std::memory_order_relaxed);
#if defined(__linux__)
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // Registration is per address space: a child of fork() may need it again.
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    return;
  }
#endif
  // Only reached once supported() said yes and the kernel then refused: no safe way on.
  std::fputs("depot: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after it was registered; "
             "set DEPOT_ALLOC_CONF=biased_locks:false\n",
             stderr);
  std::abort();
}

}  // namespace

void biased_mutex::reset_in_child() noexcept
{
  bias_.store(k_nobody, std::memory_order_relaxed);
  busy_.store(0, std::memory_order_relaxed);
  state_.store(0, std::memory_order_relaxed);
  sleepers_.store(0, std::memory_order_relaxed);
  busy_sleepers_.store(0, std::memory_order_relaxed);
  biased_inside_ = false;
  many_ = 0;
  last_ = k_nobody;
  owner_ = k_nobody;
  run_ = 0;
  need_ = k_first_run;
  biased_at_ns_ = 0;
}

void biased_mutex::fork_hold_ids() noexcept { live().mu.lock(); }

void biased_mutex::fork_release_ids(bool child) noexcept
{
  live_ids& l = live();
  if (child) {
    // The other threads' ids died with them: only the forking thread's stays.
    if (id_ != k_no_id) {
      l.ids.assign(1, id_);
    } else {
      l.ids.clear();
    }
  }
  release_after_fork(l.mu, child);
}

void biased_mutex::relax() noexcept
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

bool biased_mutex::supported() noexcept
{
#if defined(__linux__)
  static const bool ok = [] {
    const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
    return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

std::uint64_t biased_mutex::barriers() noexcept { return barriers_issued.load(std::memory_order_relaxed); }

// Each shared word in order (each bias but the calling thread's own dropped as its word is
// taken, the barrier not yet issued: the biased thread may still enter meanwhile, which the
// wait below covers as it covers a holder that entered before a lone revocation); then one
// barrier; then each mutex waits for a biased holder inside to leave, as taken() does.
void biased_mutex::lock_many(biased_mutex* const* ms, std::size_t n) noexcept
{
  bool fence = false;
  for (std::size_t i = 0; i < n; ++i) {
    biased_mutex& m = *ms[i];
    // Every shared word, in order, also of a mutex biased to this thread (which keeps its
    // bias: this thread is not inside it). Entering that one biased instead held it without
    // its word: another thread taking the words in the same order then took it, and waited
    // for this thread to leave while this one waited for a word of its: two readers of the
    // statistics, each on a stream of its own, deadlocked.
    m.take_word();
    if (id_ != k_no_id && m.bias_.load(std::memory_order_relaxed) == id_) {
      m.many_ = 3;
      continue;
    }
    const bool dropped = m.drop_bias();
    m.many_ = dropped ? 2 : 1;
    fence = fence || dropped;
  }
  if (fence) heavy_fence();
  for (std::size_t i = 0; i < n; ++i) {
    biased_mutex& m = *ms[i];
    if (m.many_ == 3) {  // its own bias: no biased holder to wait for
      m.many_ = 0;
      continue;
    }
    if (m.many_ == 2) m.note_revoked();
    m.many_ = 0;
    m.wait_out(true);
    m.count_run();
  }
}

bool biased_mutex::try_lock_impl(bool may_revoke) noexcept
{
  if (enter_if_biased()) return true;
  int expected = 0;
  if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return false;
  if (bias_.load(std::memory_order_relaxed) != k_nobody || busy_.load(std::memory_order_acquire) != 0) {
    if ((!may_revoke && bias_.load(std::memory_order_relaxed) != k_nobody) || !clear_bias(false)) {
      release_word();  // not unlock(): biased_inside_ is the biased holder's now
      return false;
    }
  }
  count_run();
  return true;
}

// The biased entry lost to a revoker: out again, waking a revoker that may sleep on busy_.
void biased_mutex::backed_off() noexcept
{
  busy_.store(0, std::memory_order_release);
  if (busy_sleepers_.load(std::memory_order_relaxed) != 0) wake(busy_);
}

// A taker that found the shared word held spins briefly, then sleeps on it for at most
// 100 us at a time: a giver whose read of the sleeper count overtook its store (x86 lets a
// load pass an earlier store) may miss a sleeper that came just then, who finds it free at
// its next check, late but never stuck.
void biased_mutex::lock_slow() noexcept
{
  for (int i = 0; i < 64; ++i) {
    relax();
    int expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
      return;
    }
  }
  for (;;) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (state_.load(std::memory_order_seq_cst) != 0) sleep_while(state_, 1);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    int expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
  }
}

// Caller holds the shared word: a bias to another thread goes (a barrier); then, if a
// biased holder that entered before is still inside, waits until it is out (wait) or
// returns false (!wait: the bias is gone all the same).
bool biased_mutex::clear_bias(bool wait) noexcept
{
  if (drop_bias()) {
    heavy_fence();
    note_revoked();
  }
  return wait_out(wait);
}

// Caller holds the shared word: the bias goes, its barrier still to be issued; whether
// there was one.
bool biased_mutex::drop_bias() noexcept
{
  if (bias_.load(std::memory_order_relaxed) == k_nobody) return false;
  bias_.store(k_nobody, std::memory_order_relaxed);
  return true;
}

// After the barrier for a dropped bias (caller holds the shared word).
void biased_mutex::note_revoked() noexcept
{
  ++revocations_;
  last_ = k_nobody;
  run_ = 0;
  // A bias revoked soon after it was made is not made again so soon.
  need_ = now_ns() - biased_at_ns_ >= paid_off_ns_ ? k_first_run : std::min(need_ * 2, k_max_run);
}

// Whether the biased holder is out: at once (!wait), or once it is (wait).
bool biased_mutex::wait_out(bool wait) noexcept
{
  // acquire: pairs with the biased holder's release of busy_, so what it wrote inside is seen
  if (busy_.load(std::memory_order_acquire) == 0) return true;
  if (!wait) return false;
  for (int i = 0; i < 256; ++i) {
    relax();
    if (busy_.load(std::memory_order_acquire) == 0) return true;
  }
  for (;;) {
    busy_sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (busy_.load(std::memory_order_seq_cst) != 0) sleep_while(busy_, 1);
    busy_sleepers_.fetch_sub(1, std::memory_order_relaxed);
    if (busy_.load(std::memory_order_acquire) == 0) return true;
  }
}

// The calling thread's name, listed as live until it exits. Without memory for the list,
// it keeps k_no_id and is never biased.
void biased_mutex::assign_id() noexcept
{
  const std::uintptr_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  try {
    live_ids& l = live();
    std::lock_guard g{l.mu};
    l.ids.push_back(id);
  } catch (...) {
    return;
  }
  tl_id_guard.id = id;
  id_ = id;
}

bool biased_mutex::alive(std::uintptr_t id) noexcept
{
  live_ids& l = live();
  std::lock_guard g{l.mu};
  return std::find(l.ids.begin(), l.ids.end(), id) != l.ids.end();
}

// Caller holds the shared word after a run of takes by this thread.
void biased_mutex::make_biased() noexcept
{
  run_ = 0;
  if (!supported()) {
    biasable_ = false;
    return;
  }
  if (id_ == k_no_id) return;
  if (owner_ != id_) {
    // Another owner, still running: not this thread (see owner_), and not asked again soon.
    if (owner_ != k_nobody && alive(owner_)) {
      need_ = std::min(need_ * 2, k_max_run);
      return;
    }
    owner_ = id_;
  }
  biased_at_ns_ = now_ns();
  bias_.store(id_, std::memory_order_relaxed);  // seen by others through state_'s release
}

// Returns when woken, when the word no longer holds `value` (checked by the kernel as it
// goes to sleep), or after 100 us.
void biased_mutex::sleep_while(std::atomic<int>& word, int value) noexcept
{
#if defined(__linux__)
  static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
  timespec bound{0, 100'000};
  syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAIT_PRIVATE, value, &bound, nullptr, 0);
#else
  (void)word;
  (void)value;
  std::this_thread::sleep_for(std::chrono::microseconds{100});
#endif
}

void biased_mutex::wake(std::atomic<int>& word) noexcept
{
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace depot::detail
