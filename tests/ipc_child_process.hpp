// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Starting tests/ipc_child.cpp's program (depot-ipc-child, built beside the test binary),
// the other process of the IPC tests, and waiting for it. A failure to start it or to wait
// fails the test that asked. And how many descriptors this process has open (the IPC
// tests' check that nothing is left open), memfd pages to send, and whether two
// descriptors are of one file.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace depot::test {

// tests/ipc_child.cpp's program, built beside this binary.
inline std::string ipc_child_path()
{
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size());
  REQUIRE(n > 0);
  self.resize(static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/')) + "/depot-ipc-child";
}

// Starts tests/ipc_child.cpp with `args`, each (from, to) of `fds` made its descriptor `to`.
inline pid_t spawn_ipc_child(std::vector<std::string> args, std::initializer_list<std::pair<int, int>> fds = {})
{
  std::string child = ipc_child_path();
  std::vector<char*> argv{child.data()};
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  for (auto [from, to] : fds) ::posix_spawn_file_actions_adddup2(&fa, from, to);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, child.c_str(), &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

// The exit status of child `pid` once it ends, or -1 (killed).
inline int exit_status(pid_t pid)
{
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Lets children take this process's descriptors (pidfd_getfd, as for an expandable
// segment's pages): where Yama's ptrace_scope is 1 a child may do so only when named
// (EINVAL without Yama).
inline void allow_children_to_take_descriptors() { (void)::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); }

// The descriptors open in this process (of the numbers below 4096).
inline std::size_t open_descriptors()
{
  std::size_t n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) != -1 ? 1 : 0;
  return n;
}

// `count` memfd pages of `bytes` each (descriptors of this process; the caller closes them).
inline std::vector<int> memfd_pages(std::size_t count, std::size_t bytes = 0)
{
  std::vector<int> pages(count);
  for (int& fd : pages) {
    fd = ::memfd_create("depot-test-page", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  }
  return pages;
}

// Whether descriptors a and b are of the same file.
inline bool same_file(int a, int b)
{
  struct stat x {};
  struct stat y {};
  return ::fstat(a, &x) == 0 && ::fstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

}  // namespace depot::test
