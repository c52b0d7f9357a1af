// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace depot::detail {

// A mutex for data that one thread uses nearly always (a stream's cache, used by the thread
// that runs the stream). Taken `run` times in a row by one thread, it is biased to that
// thread (only ever the first thread it was biased to, while that thread lives: owner_),
// which then takes and gives it back with plain stores and loads: no atomic
// read-modify-write, no fence (a locked instruction costs ~20 cycles on recent Xeons).
// Any other taker first revokes the bias: one process-wide barrier (Linux membarrier(2),
// microseconds), then it waits until the biased holder is out. A revocation less than 1 ms
// after the bias was made doubles the run needed to bias again, so a mutex that threads
// share stays an ordinary one (at most about one barrier per ms and mutex otherwise).
// Without membarrier (other systems, old kernels, a seccomp filter) or when built with
// biasable = false it never biases. Not recursive; lock/unlock/try_lock from any thread;
// unlock by the thread that took it.
class biased_mutex {
 public:
  // paid_off_ns: how long a bias must last for its revocation not to double the next run.
  explicit biased_mutex(bool biasable = true, std::int64_t paid_off_ns = k_paid_off_ns) noexcept
      : biasable_{biasable}, paid_off_ns_{paid_off_ns}
  {
  }
  biased_mutex(const biased_mutex&) = delete;
  biased_mutex& operator=(const biased_mutex&) = delete;

  [[gnu::always_inline]] void lock() noexcept
  {
    if (enter_if_biased()) [[likely]] {
      return;
    }
    take_word();
    taken();
  }
  // Takes it if free; revokes another thread's bias (a barrier, no wait): fails if that
  // thread is inside.
  [[gnu::always_inline]] bool try_lock() noexcept { return enter_if_biased() || try_lock_impl(true); }
  // Takes it if free and not biased to another thread (never a barrier).
  bool try_lock_unbiased() noexcept { return try_lock_impl(false); }
  [[gnu::always_inline]] void unlock() noexcept
  {
    if (biased_inside_) {
      biased_inside_ = false;
      busy_.store(0, std::memory_order_release);
      if (busy_sleepers_.load(std::memory_order_relaxed) != 0) [[unlikely]] {
        wake(busy_);
      }
      return;
    }
    release_word();
  }

  // Takes every mutex of ms[0, n) in that order, as lock() would one by one, but with one
  // barrier for all the biases it revokes where lock() pays one each (a reader of every
  // stream cache: stats(), snapshot()). Not to be mixed with other locks held by the caller
  // in another order (as any lock order).
  static void lock_many(biased_mutex* const* ms, std::size_t n) noexcept;

  // fork() support (the allocators' atfork handlers). In the child, where only the forking
  // thread lives: reset_in_child() makes a mutex free and unbiased whatever it was (the
  // forking thread held it through the fork, or the thread it was biased to is gone).
  // fork_hold_ids() / fork_release_ids() hold the list of live thread ids across the fork
  // (a leaf lock: taken after every mutex).
  void reset_in_child() noexcept;
  static void fork_hold_ids() noexcept;
  static void fork_release_ids(bool child) noexcept;
  // Barriers issued so far by every biased_mutex of the process (for tests and figures).
  [[nodiscard]] static std::uint64_t barriers() noexcept;

  // Whether it is biased to the calling thread (a racy read, for tests and figures).
  [[nodiscard]] bool biased_to_me() const noexcept { return bias_.load(std::memory_order_relaxed) == id_; }
  // Revocations so far (caller holds the lock).
  [[nodiscard]] std::uint64_t revocations() const noexcept { return revocations_; }
  // Whether this process can bias at all (membarrier available; registers on first call).
  static bool supported() noexcept;
  // A spinning waiter's pause (x86 `pause`, else a yield).
  static void relax() noexcept;

  static constexpr std::uint32_t k_first_run = 64;        // takes in a row before the first bias
  static constexpr std::uint32_t k_max_run = 1U << 20;    // the most a run is doubled to
  static constexpr std::int64_t k_paid_off_ns = 1'000'000;  // a bias that lasted this long paid for its barrier

 private:
  // Enters as the biased holder when biased to the calling thread, else returns false.
  // Dekker's entry with a one-sided fence: the revoker's barrier orders this thread's store
  // of busy_ before its load of bias_ (or the revoker sees busy_ set).
  [[gnu::always_inline]] bool enter_if_biased() noexcept
  {
    if (bias_.load(std::memory_order_relaxed) != id_) return false;
    busy_.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (bias_.load(std::memory_order_relaxed) == id_) [[likely]] {
      biased_inside_ = true;
      return true;
    }
    backed_off();
    return false;
  }
  // After the shared word was taken: revoke another thread's bias, wait until a biased
  // holder (entered before a revocation) is out, count the run.
  void taken() noexcept
  {
    // acquire on busy_: pairs with a biased holder's release of it
    if (bias_.load(std::memory_order_relaxed) != k_nobody || busy_.load(std::memory_order_acquire) != 0) [[unlikely]] {
      clear_bias(true);
    }
    count_run();
  }
  void count_run() noexcept
  {
    if (!biasable_) return;
    if (id_ == k_no_id) [[unlikely]] {
      assign_id();
    }
    if (last_ == id_) {
      if (++run_ >= need_) [[unlikely]] {
        make_biased();
      }
    } else {
      last_ = id_;
      run_ = 1;
    }
  }
  // Takes the shared word: at once when free, else waiting in lock_slow().
  [[gnu::always_inline]] void take_word() noexcept
  {
    int expected = 0;
    if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) lock_slow();
  }
  // Gives back the shared word, waking a sleeper if there is one.
  void release_word() noexcept
  {
    state_.store(0, std::memory_order_release);
    if (sleepers_.load(std::memory_order_relaxed) != 0) [[unlikely]] {
      wake(state_);
    }
  }
  bool try_lock_impl(bool may_revoke) noexcept;
  [[gnu::noinline]] void backed_off() noexcept;
  [[gnu::noinline]] void lock_slow() noexcept;
  [[gnu::noinline]] bool clear_bias(bool wait) noexcept;
  bool drop_bias() noexcept;
  void note_revoked() noexcept;
  bool wait_out(bool wait) noexcept;
  [[gnu::noinline]] void make_biased() noexcept;
  [[gnu::noinline]] static void assign_id() noexcept;
  static bool alive(std::uintptr_t id) noexcept;
  static void sleep_while(std::atomic<int>& word, int value) noexcept;
  static void wake(std::atomic<int>& word) noexcept;

  // A thread's name in bias_, owner_ and last_: a number no other thread of the process is
  // ever given (a thread's TLS address is reused by later threads, and a later thread with
  // the name of an owner that has exited must not pass for it), assigned at its first take
  // of a shared word (count_run); k_no_id until then, never a bias (make_biased refuses it).
  // k_nobody (0) in bias_, owner_ and last_: no thread. initial-exec: a fixed offset from
  // the thread pointer, no call.
  static constexpr std::uintptr_t k_nobody = 0;
  static constexpr std::uintptr_t k_no_id = 1;
  [[gnu::tls_model("initial-exec")]] static inline thread_local constinit std::uintptr_t id_ = k_no_id;

  std::atomic<std::uintptr_t> bias_{k_nobody};  // the thread it is biased to, or k_nobody
  std::atomic<int> busy_{0};                // 1 while the biased thread is inside (or entering)
  std::atomic<int> state_{0};               // the shared word: 0 free, 1 held
  std::atomic<int> sleepers_{0};            // waiting on state_
  std::atomic<int> busy_sleepers_{0};       // a revoker waiting on busy_
  // Under the lock:
  bool biased_inside_ = false;   // the holder entered biased
  // lock_many between its passes (written by the holder only): 1 took the shared word,
  // 2 took it and dropped the bias (its barrier still to come); 0 otherwise.
  std::uint8_t many_ = 0;
  bool biasable_;
  std::uintptr_t last_ = k_nobody;  // the last thread that took the shared word
  // The only thread the bias is ever made to while that thread lives: the first one it was
  // made to. A thread whose biased entry read the bias as its own just before a revocation
  // stores the busy flag after the revocation, sees the bias gone and clears the flag again
  // as it backs off: were the bias by then made to another thread, which set the flag and
  // is inside, that clear would let a taker in beside it (found by TSan on the four-thread
  // test). With one owner, the late entrant and the new holder are the same thread.
  std::uintptr_t owner_ = k_nobody;
  std::uint32_t run_ = 0;        // its takes in a row
  std::uint32_t need_ = k_first_run;
  std::int64_t paid_off_ns_;
  std::int64_t biased_at_ns_ = 0;  // when the bias was made (steady clock)
  std::uint64_t revocations_ = 0;
};

}  // namespace depot::detail
