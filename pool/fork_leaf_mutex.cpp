// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/pool/detail/fork_hooks.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>

#include <thread>

namespace depot::detail {
namespace {

// The listed leaf mutexes: an intrusive list (listing never allocates), under `mu`, which
// the handlers hold from before the leaves are taken until after they are given back.
struct leaf_list {
  std::mutex mu;
  fork_leaf_mutex* head = nullptr;
};

leaf_list& leaves() noexcept
{
  static auto* const l = new leaf_list;  // never destroyed: pools may outlive statics
  return *l;
}

}  // namespace

fork_leaf_mutex::fork_leaf_mutex()
{
  install_fork_handlers();
  leaf_list& l = leaves();
  std::lock_guard g{l.mu};
  next_ = l.head;
  if (next_ != nullptr) next_->prev_ = this;
  l.head = this;
}

fork_leaf_mutex::~fork_leaf_mutex()
{
  leaf_list& l = leaves();
  std::lock_guard g{l.mu};
  *(prev_ != nullptr ? &prev_->next_ : &l.head) = next_;
  if (next_ != nullptr) next_->prev_ = prev_;
}

std::atomic<bool> fork_leaf_mutex::fork_pending_{false};

void fork_leaf_mutex::wait_for_fork() noexcept
{
  while (fork_pending_.load(std::memory_order_acquire)) std::this_thread::yield();
}

void fork_leaf_mutex::fork_hold_all() noexcept
{
  leaf_list& l = leaves();
  l.mu.lock();
  fork_pending_.store(true, std::memory_order_seq_cst);
  for (fork_leaf_mutex* m = l.head; m != nullptr; m = m->next_) m->mu_.lock();
}

void fork_leaf_mutex::fork_release_all(bool child) noexcept
{
  leaf_list& l = leaves();
  for (fork_leaf_mutex* m = l.head; m != nullptr; m = m->next_) release_after_fork(m->mu_, child);
  fork_pending_.store(false, std::memory_order_release);
  release_after_fork(l.mu, child);
}

}  // namespace depot::detail
