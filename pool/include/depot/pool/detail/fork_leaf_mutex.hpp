// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <mutex>

namespace depot::detail {

// A std::mutex that fork() cannot leave locked in the child: from construction to
// destruction it is on a process-wide list whose members the allocators' atfork handlers
// take after every other depot lock, give back in the parent and make anew in the child.
// For leaf locks only (whoever holds one takes no other depot lock), such as fixed_pool's.
// Not movable; lock/unlock as std::mutex, from any thread.
class fork_leaf_mutex {
 public:
  fork_leaf_mutex();  // may throw depot::error where the atfork handlers cannot be installed
  ~fork_leaf_mutex();
  fork_leaf_mutex(const fork_leaf_mutex&) = delete;
  fork_leaf_mutex& operator=(const fork_leaf_mutex&) = delete;

  void lock() { mu_.lock(); }
  [[nodiscard]] bool try_lock() noexcept { return mu_.try_lock(); }
  void unlock() noexcept { mu_.unlock(); }

  // The atfork handlers' side (allocator_core.cpp): every listed mutex, in list order.
  static void fork_hold_all() noexcept;
  static void fork_release_all(bool child) noexcept;

 private:
  std::mutex mu_;
  fork_leaf_mutex* prev_ = nullptr;  // the list's links, under its own mutex
  fork_leaf_mutex* next_ = nullptr;
};

}  // namespace depot::detail
