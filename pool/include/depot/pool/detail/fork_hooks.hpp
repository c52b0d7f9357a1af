// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// fork() support: locks outside the allocators that their atfork handlers (allocator_core.cpp)
// hold across a fork, in the process-wide order those handlers keep. Not for direct use.
#include <memory>
#include <mutex>

namespace depot::detail {

// After a fork: a std mutex the forking thread held through it is given back in the
// parent, and made anew in the child (where that thread runs under a new thread id, which
// a read-write lock's unlock would misread; nothing else can hold it there).
template <class Mutex>
void release_after_fork(Mutex& m, bool child) noexcept
{
  if (child) {
    std::construct_at(&m);
  } else {
    m.unlock();
  }
}

// Registers the atfork handlers (allocator_core.cpp) once per process; throws depot::error
// where pthread_atfork fails. Called by every allocator and fork_leaf_mutex as it is made.
void install_fork_handlers();

// The lock of the process-wide pools' slots (pool<D>(), pinned_pool<D>()): the first one
// taken before a fork, since a pool is made under it.
[[nodiscard]] std::mutex& process_pool_mutex() noexcept;

// The lock of this process's registry of imported segments (ipc_mapping): held across a
// fork after every allocator's locks; in the child made anew.
void ipc_imports_fork_hold() noexcept;
void ipc_imports_fork_release(bool child) noexcept;

}  // namespace depot::detail
