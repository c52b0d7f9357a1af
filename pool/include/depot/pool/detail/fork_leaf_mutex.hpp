// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <atomic>
#include <mutex>

namespace depot::detail {

// A std::mutex that fork() cannot leave locked in the child: from construction to
// destruction it is on a process-wide list whose members the allocators' atfork handlers
// take after every other depot lock, give back in the parent and make anew in the child.
// For leaf locks only (whoever holds one takes no other depot lock), such as fixed_pool's.
// Not movable; lock/unlock as std::mutex, from any thread. A fork gets every leaf within
// one more hold of each: takers that arrive while it waits wait for it.
class fork_leaf_mutex {
 public:
  fork_leaf_mutex();  // may throw depot::error where the atfork handlers cannot be installed
  ~fork_leaf_mutex();
  fork_leaf_mutex(const fork_leaf_mutex&) = delete;
  fork_leaf_mutex& operator=(const fork_leaf_mutex&) = delete;

  // While a fork waits for the leaves, new takers wait for it to pass (std::mutex is not
  // fair: a thread that takes it back the moment it gives it back kept a fork out for
  // seconds on 2 cores, for good on 16): each holder takes it at most once more.
  void lock()
  {
    if (fork_pending_.load(std::memory_order_acquire)) [[unlikely]] {
      wait_for_fork();
    }
    mu_.lock();
  }
  [[nodiscard]] bool try_lock() noexcept { return !fork_pending_.load(std::memory_order_acquire) && mu_.try_lock(); }
  void unlock() noexcept { mu_.unlock(); }

  // The atfork handlers' side (allocator_core.cpp): every listed mutex, in list order.
  static void fork_hold_all() noexcept;
  static void fork_release_all(bool child) noexcept;

 private:
  static void wait_for_fork() noexcept;
  static std::atomic<bool> fork_pending_;  // between a fork's prepare and its return

  std::mutex mu_;
  fork_leaf_mutex* prev_ = nullptr;  // the list's links, under its own mutex
  fork_leaf_mutex* next_ = nullptr;
};

}  // namespace depot::detail
