// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// Host memory running out inside the caching allocator. This program replaces the global
// operator new (its own executable, so no other test runs under it) with one that can be
// told to fail its n-th call on this thread. A script of allocator calls covers every kind
// of growth in the pool's bookkeeping: the tables of live blocks and of segments, block
// records, record_stream's lists, pending events, the trace ring, snapshots and summaries, a
// graph capture's private pool.
// It runs once per n, with n = 0, 1, 2, ... until the whole script gets through with
// nothing failed. Each time, exactly the n-th host allocation fails. The contract checked:
// - a call either completes or throws std::bad_alloc (depot::out_of_memory is one),
//   and a free never throws;
// - the allocator stays whole after a failure: statistics equal the snapshot's sums, the
//   call that failed succeeds when tried again, every live block can be freed;
// - at the end nothing is allocated, empty_cache() gives every segment back, and once the
//   allocator is gone nothing of the device is held (an upstream that counts segments,
//   reserved ranges, mapped pages and events).
// Two more scripts run the same way: a fixed pool (made, filled past its end, emptied,
// destroyed; a failed construction holds no device memory) and the C interface, whose every
// call must turn the failure into DEPOT_ERROR_OUT_OF_MEMORY and succeed when called again.
// DEPOT_FAIL_ALLOCATION=n runs each script once with only the n-th allocation failing (the
// failing step is named in the test's output), for a debugger's `catch throw`;
// DEPOT_FAIL_EVERY=k fails only every k-th allocation in turn (for instrumented runs).
#include "ipc_child_process.hpp"
#include "limiting_upstream.hpp"
#include "pool_invariants.hpp"
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/stream.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/detail/allocator_core.hpp>
#include <depot/pool/fixed_pool.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_mapping.hpp>
#include <depot/pool/ipc_received.hpp>
#include <depot/pool/pool.hpp>
#include <depot/pool/trace_file.hpp>
#include <depot/config.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
thread_local std::size_t t_bytes = 0;  // bytes asked of operator new on this thread
thread_local bool t_exhausted = false;  // every call fails (host memory all gone)

bool fail_now() noexcept
{
  if (t_exhausted) return true;
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
  t_bytes += n;
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

// The steps of one run of a script, the n-th host allocation made while a step is armed
// failing (n < 0: none). arm() runs one call with the countdown armed.
class armed_steps {
 public:
  armed_steps(long n, int& steps) : n_{n}, left_{n}, steps_{steps} {}

  enum class outcome { clean, threw, absorbed };  // absorbed: the call caught the failure
  // Runs `call`, armed. A std::bad_alloc is caught only when it is the injected failure's
  // (anything else thrown, or an exhaustion out_of_memory, goes on to the test).
  outcome arm(const std::function<void()>& call)
  {
    ++steps_;
    t_failures = 0;
    t_countdown = left_;
    bool threw = false;
    try {
      call();
    } catch (const std::bad_alloc& e) {
      t_countdown = -1;
      if (t_failures == 0) throw;  // not the injected failure: the caller's to check
      threw = true;
      message_ = e.what();
    }
    const long used = left_ - t_countdown;  // calls made while armed (+1 for the failed one)
    t_countdown = -1;
    if (left_ >= 0) left_ = t_failures != 0 ? -1 : left_ - used;
    if (t_failures == 0) return outcome::clean;
    failed_ = true;
    return threw ? outcome::threw : outcome::absorbed;
  }
  // Runs `call` armed (a free: `is_free`, which never fails for memory). `call` reports a
  // failure by throwing, or by returning false: a C interface call (`through_c`, through
  // which nothing may be thrown), whose status it may describe with note(). After the
  // injected failure the state must be whole (`whole()` checks it), and a call that failed
  // must succeed when made again, unarmed, leaving it whole too.
  template <class Whole>
  void checked(const char* script, const char* what, const std::function<bool()>& call, bool is_free, Whole&& whole,
               bool through_c)
  {
    bool ok = true;
    note_.clear();
    const outcome o = arm([&] { ok = call(); });
    const bool threw = o == outcome::threw;
    const bool failed = threw || !ok;
    INFO(script, " step ", steps_, " (", std::string{what}, "), allocation ", n_, " failing",
         threw ? ": threw " + message_ : "", note_);
    if (through_c) CHECK_FALSE(threw);  // nothing is thrown through the C interface
    CHECK_FALSE((failed && is_free));   // a free never fails for memory
    if (o == outcome::clean) {
      CHECK(ok);  // without the failure nothing fails
      return;
    }
    // The call failed, or it caught the failure and finished another way (a free ordered by
    // synchronising instead of an event): whole either way.
    whole();
    if (failed && !is_free) {  // and still works: the same call again
      bool again = false;
      CHECK_NOTHROW(again = call());
      CHECK(again);
    }
    whole();
  }
  // The same for a C++ call, which fails by throwing.
  template <class Whole>
  void checked(const char* script, const char* what, const std::function<void()>& call, bool is_free, Whole&& whole)
  {
    checked(script, what, std::function<bool()>{[&] {
              call();
              return true;
            }},
            is_free, whole, false);
  }
  // What the call under way reports beside its outcome (a C status and message).
  void note(std::string text) { note_ = std::move(text); }
  [[nodiscard]] bool failed() const noexcept { return failed_; }  // the injected failure happened
  [[nodiscard]] long n() const noexcept { return n_; }
  [[nodiscard]] int step() const noexcept { return steps_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  long n_;
  long left_;
  int& steps_;
  bool failed_ = false;
  std::string message_;
  std::string note_;
};

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
  armed_steps run{n, steps};

  // Runs `call` with the countdown armed; a std::bad_alloc is the one allowed failure
  // (not of a free), after which the allocator must be whole and the same call must
  // succeed unarmed.
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    run.checked("allocator", what, call, is_free, [&] { depot::test::check_invariants(a); });
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
  // A graph capture (no backend capture runs: the allocator's side of one): a private pool
  // that takes the capture's allocations, a free that another stream's work must wait for
  // (its event put off to the capture's end), the capture's end, then its pool released.
  {
    std::uint64_t pool = 0;
    step("begin a capture", [&] { pool = a.begin_capture(s1); });
    const std::size_t before = live.size();
    for (std::size_t bytes : {std::size_t{8} * KiB, 700 * KiB, 9 * MiB, 9 * MiB}) {
      allocate("allocate in a capture", bytes, s1);
    }
    step("record_stream in a capture", [&] { a.record_stream(live[before + 2], s2); });
    void* p = live.back();
    live.pop_back();
    step("free in a capture", [&] { a.deallocate(p); }, true);
    p = live.back();
    live.pop_back();
    step("free in a capture, used by another stream", [&] { a.deallocate(p); }, true);
    step("end the capture", [&] { a.end_capture(s1); });
    while (live.size() > before) {
      p = live.back();
      live.pop_back();
      step("free a captured block", [&] { a.deallocate(p, s2); }, true);
    }
    step("release the capture pool", [&] { a.release_capture_pool(pool); });
    CHECK(a.capture_pools().empty());
  }

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
  return run.failed();
}

// Blocks shared with other processes (ipc_export), the exporter's side: blocks of every
// kind exported (their segments' importer-count slots, an expandable block's page
// descriptors), the handles written as text and read back, then freed and their segments
// released, each step armed. A backend that cannot share memory (the host) exports through
// the test upstream's stand-ins (limiting_upstream::stand_in_exports), so the allocator's
// bookkeeping of exports runs in CI; a GPU's exports are real.
template <depot::device D>
bool run_ipc(long n, const depot::allocator_config& cfg, int& steps)
{
  const auto up = std::make_shared<typename depot::test::limiting_upstream<D>::counters>();
  auto owned = std::make_unique<depot::test::limiting_upstream<D>>(std::numeric_limits<std::size_t>::max(), up);
  owned->stand_in_exports = !depot::runtime<D>::has_ipc;
  std::optional<depot::caching_allocator<D>> allocator;
  allocator.emplace(std::move(owned), cfg);
  depot::caching_allocator<D>& a = *allocator;
  armed_steps run{n, steps};
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    run.checked("ipc", what, call, is_free, [&] { depot::test::check_invariants(a); });
  };
  // A dense small block, a linked small one, a large one sharing its segment, one with a
  // segment of its own; each after a neighbour of its size (unarmed: the allocator's script
  // covers allocation).
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{3000}, 300 * KiB, 6 * MiB + 5, 12 * MiB + 5}) {
    blocks.push_back(a.allocate(bytes));
    blocks.push_back(a.allocate(bytes));
  }
  std::vector<depot::ipc_handle> handles(blocks.size());
  std::vector<std::string> texts(blocks.size());
  for (std::size_t i = 1; i < blocks.size(); i += 2) {
    step("ipc_export", [&] { handles[i] = a.ipc_export(blocks[i]); });
    step("ipc_export again", [&] { handles[i - 1] = a.ipc_export(blocks[i]); });
    // (handle texts name a GPU: the host's stand-in handles travel as cuda:0's)
    if (handles[i].device.kind == depot::device_kind::host) handles[i].device.kind = depot::device_kind::cuda;
    step("to_hex", [&] { texts[i] = handles[i].to_hex(); });
    depot::ipc_handle back;
    step("from_hex", [&] { back = depot::ipc_handle::from_hex(texts[i]); });
    CHECK(back == handles[i]);
  }
  bool exported = false;
  step("snapshot", [&] {
    for (const auto& seg : a.snapshot().segments) exported = exported || seg.exported;
  });
  CHECK(exported);
  for (void* p : blocks) step("free an exported block or its neighbour", [&] { a.deallocate(p); }, true);
  step("empty_cache", [&] { a.empty_cache(); });
  depot::test::check_invariants(a);
  CHECK(a.stats().reserved_bytes.all.current == 0);  // no importer held an exported segment
  allocator.reset();
  INFO("allocation ", n, " failing");
  CHECK(up->outstanding.load() == 0);
  CHECK(up->reservations.load() == 0);
  return run.failed();
}

// The importing side of sharing (detail::ipc_attach and ipc_detach: what ipc_mapping does
// over the backend), with a stand-in backend (anonymous memory for a segment's handle, the
// pages' descriptors mapped for an expandable block's), against an exporter that is a real
// other process: a child holding an importer-count file (an ordinary segment's) and three
// memfd pages (an expandable block's). Each step armed: a failed attach leaves nothing
// open, counted or listed, and the same attach succeeds after.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
struct stand_in_backend {
  static constexpr std::size_t k_page = 4096;
  static inline int opens = 0;
  static inline int closes = 0;
  static void* open(const depot::ipc_memory_handle&, int)
  {
    void* p = ::mmap(nullptr, k_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc{};
    ++opens;
    return p;
  }
  static void close(void* p, int) noexcept
  {
    ::munmap(p, k_page);
    ++closes;
  }
  static void* open_pages(const int* fds, std::size_t count, std::size_t page, int)
  {
    void* base = ::mmap(nullptr, count * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc{};
    for (std::size_t i = 0; i < count; ++i) {
      if (::mmap(static_cast<char*>(base) + i * page, page, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) == MAP_FAILED) {
        ::munmap(base, count * page);
        throw std::bad_alloc{};
      }
    }
    ++opens;
    return base;
  }
  static void close_pages(void* p, std::size_t count, std::size_t page, int) noexcept
  {
    ::munmap(p, count * page);
    ++closes;
  }
  static constexpr depot::detail::ipc_backend backend{&open, &close, &open_pages, &close_pages};
};

// The exporter: a child process that holds an importer-count file and three pages, each a
// memfd, until told to exit; the parent also keeps three pages of its own (a received
// block's descriptors: ipc_received) and a view of the child's counts.
struct ipc_exporter_child {
  pid_t pid = -1;
  int remote[4] = {};  // the child's descriptors: the counts, then the pages
  int counts = -1;     // this process's descriptor of the child's counts file
  int own[3] = {-1, -1, -1};
  int to_child = -1;

  ipc_exporter_child()
  {
    int up[2];
    int down[2];
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::pipe(down) == 0);
    depot::test::allow_children_to_take_descriptors();  // (not needed: the parent takes them)
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // only system calls here, then _exit
      ::close(up[0]);
      ::close(down[1]);  // (else the read below never sees the parent's end close)
      int fds[4];
      fds[0] = ::memfd_create("depot-ipc-importers", MFD_CLOEXEC);
      bool ok = fds[0] >= 0 && ::ftruncate(fds[0], 4096) == 0;
      for (int i = 1; i < 4; ++i) {
        fds[i] = ::memfd_create("depot-test-page", MFD_CLOEXEC);
        ok = ok && fds[i] >= 0 && ::ftruncate(fds[i], static_cast<off_t>(stand_in_backend::k_page)) == 0;
      }
      if (!ok || ::write(up[1], fds, sizeof fds) != static_cast<ssize_t>(sizeof fds)) ::_exit(1);
      char c = 0;
      (void)::read(down[0], &c, 1);
      ::_exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    to_child = down[1];
    REQUIRE(::read(up[0], remote, sizeof remote) == static_cast<ssize_t>(sizeof remote));
    ::close(up[0]);
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(remote[0]);
    counts = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(counts >= 0);
    for (int& f : own) {
      f = ::memfd_create("depot-test-own-page", MFD_CLOEXEC);
      REQUIRE(f >= 0);
      REQUIRE(::ftruncate(f, static_cast<off_t>(stand_in_backend::k_page)) == 0);
    }
  }
  ipc_exporter_child(const ipc_exporter_child&) = delete;
  ipc_exporter_child& operator=(const ipc_exporter_child&) = delete;
  ~ipc_exporter_child()
  {
    for (int f : own) ::close(f);
    ::close(counts);
    ::close(to_child);  // the child's read returns: it exits
    CHECK(depot::test::exit_status(pid) == 0);
  }
  // The importers counted in slot 0 of the child's file.
  [[nodiscard]] std::int64_t importers() const
  {
    std::int64_t v = -1;
    REQUIRE(::pread(counts, &v, sizeof v, 0) == static_cast<ssize_t>(sizeof v));
    return v;
  }
  // Whether this process may take the child's descriptors (pidfd_getfd: ptrace permission,
  // no seccomp filter): where it may not, the expandable block is opened from descriptors
  // of its own only.
  [[nodiscard]] bool descriptors_takeable() const
  {
    const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return false;
    const long fd = ::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), remote[1], 0);
    ::close(static_cast<int>(pidfd));
    if (fd < 0) return false;
    ::close(static_cast<int>(fd));
    return true;
  }
};

bool run_ipc_import(long n, int& steps, const ipc_exporter_child& child, bool take)
{
  using depot::detail::ipc_attach;
  using depot::detail::ipc_detach;
  const auto& backend = stand_in_backend::backend;
  armed_steps run{n, steps};
  depot::ipc_handle ordinary;
  ordinary.device = depot::device_id{depot::device_kind::cuda, 0};
  ordinary.process = static_cast<std::uint64_t>(child.pid);
  ordinary.segment = std::uint64_t{1} << 30;
  ordinary.size = ordinary.requested = stand_in_backend::k_page;
  ordinary.memory.bytes[0] = 1;
  ordinary.counter_fd = child.remote[0];
  ordinary.counter_slot = 0;
  depot::ipc_handle pages = ordinary;  // an expandable block's: its pages' descriptors
  pages.memory = {};
  pages.counter_fd = -1;
  pages.segment = std::uint64_t{1} << 31;
  pages.page = stand_in_backend::k_page;
  pages.offset = 100;
  pages.size = pages.requested = 3 * stand_in_backend::k_page - 200;
  pages.fds = {child.remote[1], child.remote[2], child.remote[3]};
  depot::ipc_handle received = pages;  // the same, its descriptors received (ipc_received)
  received.segment = std::uint64_t{1} << 32;
  const std::size_t descriptors = depot::test::open_descriptors();
  // What is attached: the users of each handle's mapping (the script's own count).
  int users[3] = {};
  const auto whole = [&] {
    CHECK(stand_in_backend::opens - stand_in_backend::closes ==
          (users[0] > 0 ? 1 : 0) + (users[1] > 0 ? 1 : 0) + (users[2] > 0 ? 1 : 0));
    CHECK(child.importers() == (users[0] > 0 ? 1 : 0));
    CHECK(depot::test::open_descriptors() == descriptors + (users[0] > 0 ? 1 : 0));  // the counts file's, while counted
  };
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    run.checked("ipc import", what, call, is_free, whole);
  };
  void* base[3] = {};
  const auto attach = [&](int k, const depot::ipc_handle& h, const int* own) {
    void* p = ipc_attach(h, backend, own);
    CHECK((base[k] == nullptr || base[k] == p));  // (a second attach: the same mapping)
    base[k] = p;
    ++users[k];
  };
  step("attach an ordinary segment", [&] { attach(0, ordinary, nullptr); });
  step("attach it again", [&] { attach(0, ordinary, nullptr); });
  if (take) step("attach an expandable block (its pages taken)", [&] { attach(1, pages, nullptr); });
  step("attach an expandable block (its pages received)", [&] { attach(2, received, child.own); });
  step("attach that again", [&] { attach(2, received, child.own); });
  whole();
  const auto detach = [&](int k, const depot::ipc_handle& h) {
    ipc_detach(h, backend);
    --users[k];
  };
  step("detach", [&] { detach(0, ordinary); }, true);
  step("detach the last", [&] { detach(0, ordinary); }, true);
  if (take) step("detach", [&] { detach(1, pages); }, true);
  step("detach", [&] { detach(2, received); }, true);
  step("detach the last", [&] { detach(2, received); }, true);
  whole();
  CHECK(stand_in_backend::opens == stand_in_backend::closes);
  CHECK(child.importers() == 0);
  CHECK(depot::test::open_descriptors() == descriptors);
  return run.failed();
}

// Handles over a Unix socket (ipc_send, ipc_receive, a received handle passed on), each
// step armed, in one process: a send that fails for host memory writes nothing, a receive
// that fails takes nothing (the handle stays queued whole, so the same call made again gets
// it), and no descriptor is left open or lost either way.
std::size_t queued(int socket)
{
  int n = -1;
  REQUIRE(::ioctl(socket, FIONREAD, &n) == 0);
  return static_cast<std::size_t>(n);
}

bool run_ipc_socket(long n, int& steps, const std::vector<int>& pages)
{
  armed_steps run{n, steps};
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  depot::ipc_handle ordinary;
  ordinary.device = depot::device_id{depot::device_kind::cuda, 0};
  ordinary.process = 4242;
  ordinary.segment = std::uint64_t{1} << 30;
  ordinary.size = ordinary.requested = 4096;
  ordinary.memory.bytes[0] = 1;
  ordinary.counter_fd = 7;  // (the exporter's: a number here)
  ordinary.counter_slot = 3;
  depot::ipc_handle expandable = ordinary;
  expandable.memory = {};
  expandable.counter_fd = -1;
  expandable.page = 4096;
  expandable.offset = 100;
  expandable.size = expandable.requested = 3 * 4096 - 200;
  expandable.fds = {pages[0], pages[1], pages[2]};
  // What the other end reads (the fields an expandable block's text carries).
  const depot::ipc_handle expandable_read = depot::ipc_handle::from_hex(expandable.to_hex());
  // What a handle takes on the socket: its length, then its text (3 descriptors beside it).
  const std::size_t ordinary_bytes = 4 + ordinary.to_hex().size();
  const std::size_t expandable_bytes = 4 + expandable.to_hex().size();
  const std::size_t descriptors = depot::test::open_descriptors();
  std::size_t expect_queued = 0;  // set by each step that got through
  std::size_t held = 0;           // descriptors the received handles hold
  const auto whole = [&] {
    CHECK(queued(sv[1]) == expect_queued);
    CHECK(depot::test::open_descriptors() == descriptors + held);
  };
  using std::chrono::milliseconds;
  depot::ipc_received a;
  depot::ipc_received b;
  depot::ipc_received c;
  // A send: `bytes` queued once it got through.
  const auto send = [&](const char* what, std::size_t bytes, const std::function<void()>& call) {
    run.checked("ipc socket", what, [&] {
      call();
      expect_queued = bytes;
    }, false, whole);
  };
  // A receive into `into`: nothing queued once it got through, its descriptors held.
  const auto receive = [&](const char* what, depot::ipc_received& into, bool timed) {
    run.checked("ipc socket", what, [&] {
      into = timed ? depot::ipc_receive(sv[1], milliseconds{2000}) : depot::ipc_receive(sv[1]);
      expect_queued = 0;
      held = a.fds.size() + b.fds.size() + c.fds.size();
    }, false, whole);
  };
  send("send an ordinary segment's handle", ordinary_bytes, [&] { depot::ipc_send(sv[0], ordinary); });
  receive("receive it", a, false);
  CHECK(a.handle == ordinary);
  CHECK(a.fds.empty());
  send("send an expandable block's handle, its pages' descriptors beside it (timeout)", expandable_bytes,
       [&] { depot::ipc_send(sv[0], expandable, milliseconds{2000}); });
  receive("receive it (timeout)", b, true);
  CHECK(b.handle == expandable_read);
  REQUIRE(b.fds.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(depot::test::same_file(b.fds[i], pages[i]));
  send("pass the received handle on", expandable_bytes, [&] { depot::ipc_send(sv[0], b); });
  receive("receive that", c, false);
  send("pass it on again (timeout)", expandable_bytes, [&] { depot::ipc_send(sv[0], c, milliseconds{2000}); });
  receive("receive it in place of the first (timeout)", a, true);
  CHECK(c.handle == expandable_read);
  CHECK(a.handle == expandable_read);
  REQUIRE(a.fds.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(depot::test::same_file(a.fds[i], pages[i]));
  whole();
  a = {};
  b = {};
  c = {};
  held = 0;
  whole();
  ::close(sv[0]);
  ::close(sv[1]);
  return run.failed();
}

// A fixed pool made, filled past its end (its oom handler asked), emptied, defragmented and
// destroyed, each step armed. A failed construction holds no device memory (the host
// backend's under the sanitizers' leak check; on a GPU the device's free memory is compared
// by the caller), a failed call changes nothing and succeeds when tried again.
template <depot::device D>
bool run_fixed_pool(long n, int& steps)
{
  armed_steps run{n, steps};
  constexpr std::size_t k_blocks = 64;
  constexpr std::size_t k_block = 64 * KiB;
  std::optional<depot::fixed_pool<D>> fp;
  std::vector<void*> live;
  live.reserve(k_blocks);
  // Its statistics against the test's own count of live blocks.
  const auto whole = [&] {
    const depot::fixed_pool_stats st = fp->get_stats();
    CHECK(st.used_blocks == live.size());
    CHECK(st.free_blocks == k_blocks - live.size());
    CHECK(st.total_blocks == k_blocks);
  };
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    run.checked("fixed_pool", what, call, is_free, [&] {
      if (fp) whole();
    });
  };
  step("construct", [&] { fp.emplace(k_blocks * k_block, k_block); });
  int handler_calls = 0;
  for (std::size_t i = 0; i < k_blocks; ++i) step("allocate", [&] { live.push_back(fp->allocate()); });
  step("get_stats", [&] { (void)fp->get_stats(); });
  // Exhausted: out_of_memory (a std::bad_alloc of its own, not the injected failure's), the
  // pool unchanged, with and without a handler (which declines).
  const auto exhausted = [&] {
    try {
      (void)fp->allocate();
      FAIL("a full fixed pool handed out a block");
    } catch (const depot::out_of_memory&) {  // the pool is full (or its message ran out of memory)
    }
  };
  step("allocate from a full pool", exhausted);
  step("set an oom handler", [&] {
    fp->set_oom_handler([&](const depot::out_of_memory&, unsigned) {
      ++handler_calls;
      return false;
    });
  });
  step("allocate from a full pool, with a handler", exhausted);
  for (std::size_t i = 0; i < k_blocks; i += 2) {  // every other block: the free runs fragment
    void* p = live[i];
    step("deallocate", [&] { fp->deallocate(p); }, true);
    live[i] = nullptr;
  }
  std::erase(live, nullptr);
  step("defragment", [&] { fp->defragment(); });
  step("get_stats", [&] { (void)fp->get_stats(); });
  while (!live.empty()) {
    void* p = live.back();
    step("deallocate", [&] { fp->deallocate(p); }, true);
    live.pop_back();
  }
  whole();
  CHECK(handler_calls >= 1);
  step("destroy", [&] { fp.reset(); }, true);
  return run.failed();
}

// The C interface: every call turns the failure into DEPOT_ERROR_OUT_OF_MEMORY (never an
// exception through C, never std::terminate), leaves the allocator whole, and succeeds when
// called again; frees always succeed.

template <depot::device D>
bool run_c_api(long n, int& steps)
{
  armed_steps run{n, steps};
  const auto k = static_cast<depot_device_kind>(static_cast<int>(D::kind));
  depot::stream<D> s1;
  depot::stream<D> s2;
  void* const n1 = reinterpret_cast<void*>(s1.native());
  void* const n2 = reinterpret_cast<void*>(s2.native());
  std::vector<void*> live;
  live.reserve(64);
  std::vector<char> text(1 << 20);
  // The global pools the C interface uses: whole after every failure.
  const auto whole = [&] {
    depot::test::check_invariants(depot::pool<D>(0));
    depot::test::check_invariants(depot::pinned_pool<D>(0));
  };
  // A C call: its status is DEPOT_SUCCESS, or DEPOT_ERROR_OUT_OF_MEMORY for the injected
  // failure (armed_steps::checked tells which was allowed).
  const auto call = [&](const char* what, const std::function<depot_status()>& f, bool is_free = false) {
    run.checked("C", what, [&] {
      const depot_status st = f();
      if (st != DEPOT_SUCCESS) run.note(": " + std::string{depot_status_name(st)} + " " + depot_last_error());
      CHECK((st == DEPOT_SUCCESS || st == DEPOT_ERROR_OUT_OF_MEMORY));
      return st == DEPOT_SUCCESS;
    }, is_free, whole, true);
  };
  const auto allocate = [&](const char* what, std::size_t bytes, void* stream) {
    call(what, [&] {
      void* p = nullptr;
      const depot_status st = depot_allocate(k, 0, bytes, stream, &p);
      if (st == DEPOT_SUCCESS) live.push_back(p);
      return st;
    });
  };

  call("set_trace_capacity", [&] { return depot_set_trace_capacity(k, 0, 16); });
  for (std::size_t bytes : {std::size_t{100}, 200 * KiB, 2 * MiB, 30 * MiB}) allocate("allocate", bytes, n1);
  allocate("allocate on a second stream", 5 * MiB, n2);
  call("record_stream", [&] { return depot_record_stream(k, 0, live[1], n2); });
  depot_memory_stats stats{};
  call("get_memory_stats", [&] { return depot_get_memory_stats(k, 0, &stats); });
  std::size_t length = 0;
  call("memory_summary", [&] { return depot_memory_summary(k, 0, text.data(), text.size(), &length); });
  call("memory_snapshot_json", [&] { return depot_memory_snapshot_json(k, 0, text.data(), text.size(), &length); });
  call("trace_json", [&] { return depot_trace_json(k, 0, text.data(), text.size(), &length); });
  call("set_oom_handler", [&] {
    return depot_set_oom_handler(k, 0, [](const char*, size_t, unsigned, void*) { return 0; }, nullptr);
  });
  call("remove the oom handler", [&] { return depot_set_oom_handler(k, 0, nullptr, nullptr); });
  void* pinned = nullptr;
  call("allocate_pinned", [&] { return depot_allocate_pinned(k, 0, 96 * KiB, n1, &pinned); });
  call("deallocate_pinned", [&] { return depot_deallocate_pinned(k, 0, pinned); }, true);
  depot_fixed_pool* fp = nullptr;
  call("fixed_pool_create", [&] { return depot_fixed_pool_create(k, 0, 16 * 4 * KiB, 4 * KiB, &fp); });
  void* fb = nullptr;
  call("fixed_pool_allocate", [&] { return depot_fixed_pool_allocate(fp, &fb); });
  depot_fixed_pool_stats fstats{};
  call("fixed_pool_get_stats", [&] { return depot_fixed_pool_get_stats(fp, &fstats); });
  call("fixed_pool_deallocate", [&] { return depot_fixed_pool_deallocate(fp, fb); }, true);
  call("fixed_pool_defragment", [&] { return depot_fixed_pool_defragment(fp); });
  call("fixed_pool_destroy", [&] { return depot_fixed_pool_destroy(fp); }, true);
  std::uint64_t capture = 0;
  call("begin_capture", [&] { return depot_begin_capture(k, 0, n2, 0, &capture); });
  allocate("allocate in a capture", 3 * MiB, n2);
  call("end_capture", [&] { return depot_end_capture(k, 0, n2); });
  call("deallocate a captured block", [&] {
    const depot_status st = depot_deallocate(k, 0, live.back());
    live.pop_back();
    return st;
  }, true);
  call("release_capture_pool", [&] { return depot_release_capture_pool(k, 0, capture); });
  call("deallocate_on another stream", [&] {
    const depot_status st = depot_deallocate_on(k, 0, live.back(), n1);
    live.pop_back();
    return st;
  }, true);
  while (!live.empty()) {
    call("deallocate", [&] {
      const depot_status st = depot_deallocate(k, 0, live.back());
      live.pop_back();
      return st;
    }, true);
  }
  s1.synchronize();
  s2.synchronize();
  call("empty_cache", [&] { return depot_empty_cache(k, 0); });
  call("reset_peak_stats", [&] { return depot_reset_peak_stats(k, 0); });
  call("reset_memory_stats", [&] { return depot_reset_memory_stats(k, 0); });
  call("set_trace_capacity 0", [&] { return depot_set_trace_capacity(k, 0, 0); });
  whole();
  CHECK(depot::pool<D>(0).stats().allocated_bytes.all.current == 0);
  CHECK(depot::pool<D>(0).stats().reserved_bytes.all.current == 0);
  CHECK(depot::pinned_pool<D>(0).stats().allocated_bytes.all.current == 0);
  return run.failed();
}

// The host's upstream (real host events) under an allocator told it is asynchronous, as a
// GPU's is, so the host takes the paths CUDA and HIP take; the upstream counts what the
// allocator holds of it.
struct async_host_core {
  using host = depot::host;
  std::shared_ptr<depot::test::limiting_upstream<host>::counters> up =
      std::make_shared<depot::test::limiting_upstream<host>::counters>();
  std::optional<depot::detail::allocator_core> core;
  depot::stream<host> s1;
  depot::stream<host> s2;

  async_host_core()
  {
    core.emplace(std::make_unique<depot::test::limiting_upstream<host>>(std::numeric_limits<std::size_t>::max(), up),
                 depot::allocator_config{}, /*asynchronous=*/true);
  }
  void whole() const { depot::test::check_invariants(core->stats(), core->snapshot()); }
  // Every block came back (s2's work done): after empty_cache nothing is allocated, active
  // or reserved, and once the allocator is gone it holds nothing of the upstream.
  void all_back()
  {
    s2.synchronize();
    core->empty_cache();
    whole();
    const depot::memory_stats st = core->stats();
    CHECK(st.allocated_bytes.all.current == 0);
    CHECK(st.active_bytes.all.current == 0);
    CHECK(st.reserved_bytes.all.current == 0);  // every deferred free came back
    core.reset();
    CHECK(up->outstanding.load() == 0);
    CHECK(up->events.load() == 0);
  }
};

// Frees during a graph capture of blocks that another stream used, on an asynchronous
// backend: the host's upstream (real host events) under an allocator told it is
// asynchronous, as a GPU's is, so the host takes the paths CUDA and HIP take. With no host
// memory for the list of deferred frees (or for the list of streams a free on another
// stream makes), a free still succeeds (the block waits in place, stream_cache::in_place)
// and the capture's end gives it its events (or finishes the device's work).
bool run_capture_frees(long n, int& steps)
{
  using host = depot::host;
  armed_steps run{n, steps};
  async_host_core h;
  auto& core = h.core;
  depot::stream<host>& s1 = h.s1;
  depot::stream<host>& s2 = h.s2;
  const auto whole = [&] { h.whole(); };
  const auto step = [&](const char* what, const std::function<void()>& call, bool is_free = false) {
    run.checked("capture", what, call, is_free, whole);
  };
  // Blocks of both pools, dense small and linked, each used by s2 (unarmed: the allocator's
  // script covers these calls).
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{4} * KiB, 100 * KiB, 2 * MiB, 30 * MiB}) {
    for (int i = 0; i < 3; ++i) blocks.push_back(core->allocate(bytes, s1.native()));
  }
  for (void* p : blocks) core->record_stream(p, s2.native());
  // And blocks freed on another stream (whose list of streams the free itself makes).
  std::vector<void*> named;
  for (std::size_t bytes : {std::size_t{8} * KiB, 200 * KiB, 5 * MiB}) named.push_back(core->allocate(bytes, s1.native()));
  // And blocks used by a stream destroyed during the capture (its uses become a marker, its
  // fence waited for at the capture's end).
  std::optional<depot::stream<host>> s3;
  s3.emplace();
  std::vector<void*> orphaned;
  for (std::size_t bytes : {std::size_t{16} * KiB, 3 * MiB}) {
    orphaned.push_back(core->allocate(bytes, s1.native()));
    core->record_stream(orphaned.back(), s3->native());
  }
  std::uint64_t pool = 0;
  step("begin a capture", [&] { pool = core->begin_capture(s1.native(), 0); });
  step("a stream that used blocks ends in a capture", [&] { s3.reset(); }, true);
  for (void* p : orphaned) {
    step("free in a capture, used by a stream that ended", [&] { core->deallocate(p, nullptr, false, 0); }, true);
  }
  for (void* p : blocks) {
    step("free in a capture, used by another stream", [&] { core->deallocate(p, nullptr, false, 0); }, true);
  }
  for (void* p : named) {
    step("free in a capture on another stream", [&] { core->deallocate(p, s2.native(), true, 0); }, true);
  }
  step("end the capture", [&] { core->end_capture(s1.native()); });
  step("release the capture pool", [&] { core->release_capture_pool(pool); });
  s2.synchronize();
  void* again = nullptr;
  step("allocate after the capture", [&] { again = core->allocate(30 * MiB, s1.native()); });
  step("free", [&] { core->deallocate(again, nullptr, false, 0); }, true);
  h.all_back();
  return run.failed();
}

// Many frees during a graph capture with no host memory at all (asynchronous backend, as
// run_capture_frees): every one waits in place, side by side in the same segments (dense
// small units, linked blocks of both pools, free neighbours between them, one block whose
// other stream was destroyed in the capture), and the capture's end settles them all in one
// walk (settle_in_place): after the other stream's work, every segment goes back.
void capture_frees_exhausted()
{
  using host = depot::host;
  async_host_core h;
  auto& core = h.core;
  depot::stream<host>& s1 = h.s1;
  depot::stream<host>& s2 = h.s2;
  std::optional<depot::stream<host>> s3;
  s3.emplace();
  const auto whole = [&] { h.whole(); };
  // Large blocks cut from one segment, small ones from a few: a 60 MiB and a 1.5 MiB block
  // freed first leave cached segments that the blocks after them split.
  core->deallocate(core->allocate(60 * MiB, s1.native()), nullptr, false, 0);
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(core->allocate(std::size_t{4} * MiB, s1.native()));
  for (int i = 0; i < 24; ++i) blocks.push_back(core->allocate(std::size_t{4} * KiB, s1.native()));
  for (int i = 0; i < 12; ++i) blocks.push_back(core->allocate(100 * KiB, s1.native()));
  for (void* p : blocks) core->record_stream(p, s2.native());
  core->record_stream(blocks[5], s3->native());
  core->record_stream(blocks[20], s3->native());
  // Every third block freed before the capture: free neighbours of the blocks freed in it.
  std::vector<void*> in_capture;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 3 == 2 && i != 5 && i != 20) {
      core->deallocate(blocks[i], nullptr, false, 0);
    } else {
      in_capture.push_back(blocks[i]);
    }
  }
  const std::uint64_t pool = core->begin_capture(s1.native(), 0);
  s3.reset();  // its uses become a marker, its fence waited for at the capture's end
  t_exhausted = true;
  std::size_t n = 0;
  for (void* p : in_capture) {
    // (on the block's stream, or named on another: a free then lists its stream)
    if (n++ % 4 == 0) {
      core->deallocate(p, s2.native(), true, 0);
    } else {
      core->deallocate(p, nullptr, false, 0);
    }
  }
  t_exhausted = false;
  INFO(in_capture.size(), " blocks freed in the capture with no host memory");
  whole();
  CHECK(core->stats().allocated_bytes.all.current == 0);
  core->end_capture(s1.native());
  core->release_capture_pool(pool);
  whole();
  h.all_back();  // every block waiting in place came back
}

// Reading snapshots and traces back (trace_file.hpp, the tools' input) and writing them:
// each call completes with what an unarmed call gives, or throws std::bad_alloc (never
// std::terminate: no JSON document is freed while memory runs out).
struct written_files {
  std::string snapshot;
  std::string trace;
  std::string csv;
  std::string trace_again;  // parse_trace(trace).to_json() (its keys in the reader's order)
};

bool run_readers(long n, int& steps, const written_files& files)
{
  armed_steps run{n, steps};
  const auto step = [&](const char* what, const std::function<void()>& call) {
    const armed_steps::outcome o = run.arm(call);
    INFO("reader step ", run.step(), " (", std::string{what}, "), allocation ", n, " failing");
    if (o == armed_steps::outcome::threw) CHECK_NOTHROW(call());
  };
  // (the checks outside the armed calls: doctest's own allocations are not to fail)
  std::string text;
  step("parse a snapshot", [&] { text = depot::parse_snapshot(files.snapshot).to_json(); });
  CHECK(text == files.snapshot);
  step("parse a trace", [&] { text = depot::parse_trace(files.trace).to_json(); });
  CHECK(text == files.trace_again);
  std::size_t events = 0;
  step("parse an RMM log", [&] { events = depot::parse_trace(files.csv).events.size(); });
  CHECK(events == 4);
  bool refused = false;
  step("a bad snapshot", [&] {
    try {
      (void)depot::parse_snapshot(std::string_view{files.snapshot}.substr(0, files.snapshot.size() / 2));
    } catch (const depot::invalid_argument&) {
      refused = true;
    }
  });
  CHECK(refused);
  return run.failed();
}

// Runs `script(n, steps)` for n = 0, 1, ... until a run gets through with nothing failed
// (or once, for DEPOT_FAIL_ALLOCATION=n); at least `fewest` failure points are expected.
template <class Script>
void every_failure(Script script, long fewest)
{
  int steps = 0;
  long n = 0;
  if (const char* only = std::getenv("DEPOT_FAIL_ALLOCATION")) {  // one n, to debug it
    (void)script(std::atol(only), steps);
    return;
  }
  // DEPOT_FAIL_EVERY=k: only every k-th n (an instrumented run: compute-sanitizer).
  long every = 1;
  if (const char* k = std::getenv("DEPOT_FAIL_EVERY")) every = std::max(1L, std::atol(k));
  long runs = 0;
  for (; script(n, steps); n += every) ++runs;
  if (every == 1) {
    MESSAGE("each of ", n, " host allocations failed in turn, over ", steps, " steps");
  } else {
    MESSAGE(runs, " runs, failing host allocation n = 0, ", every, ", ... in turn; n = ", n,
            " got through with nothing failed (", steps, " steps)");
  }
  CHECK(n + every - 1 >= fewest);
}

template <depot::device D>
void every_failure(const depot::allocator_config& cfg)
{
  // The script reaches the bookkeeping's growth (~1 100 host allocations on the host backend).
  every_failure([&](long n, int& steps) { return run_script<D>(n, cfg, steps); }, 500);
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

TEST_CASE_TEMPLATE("pool: every host allocation of exporting blocks to other processes fails in turn", D,
                   DEPOT_TEST_DEVICES)
{
  SUBCASE("default settings")
  {
    every_failure([](long n, int& s) { return run_ipc<D>(n, depot::allocator_config{}, s); }, 20);
  }
  SUBCASE("expandable segments")
  {
    depot::allocator_config cfg;
    cfg.expandable_segments = true;
    every_failure([&](long n, int& s) { return run_ipc<D>(n, cfg, s); }, 20);
  }
}

TEST_CASE("pool: every host allocation of importing another process's blocks fails in turn")
{
  const ipc_exporter_child child;
  const bool take = child.descriptors_takeable();
  if (!take) MESSAGE("pidfd_getfd is not permitted here: the expandable block is opened from received descriptors only");
  every_failure([&](long n, int& s) { return run_ipc_import(n, s, child, take); }, 5);
}

TEST_CASE("pool: every host allocation of sending and receiving handles over a Unix socket fails in turn")
{
  const std::vector<int> pages = depot::test::memfd_pages(3, 4096);
  every_failure([&](long n, int& s) { return run_ipc_socket(n, s, pages); }, 8);
  for (int f : pages) ::close(f);
}

TEST_CASE_TEMPLATE("pool: every host allocation of a fixed pool fails in turn", D, DEPOT_TEST_DEVICES)
{
  // On a GPU, a construction that failed must not keep its device memory: the device's free
  // memory after the runs is what it was after one unarmed run (4 MiB each, so a leak shows).
  int steps = 0;
  (void)run_fixed_pool<D>(-1, steps);
  const std::size_t before = depot::get_memory_info<D>(0).free_bytes;
  every_failure([](long n, int& s) { return run_fixed_pool<D>(n, s); }, 3);
  if constexpr (depot::is_gpu_v<D>) CHECK(depot::get_memory_info<D>(0).free_bytes + 2 * MiB >= before);
  // A pool larger than the device is refused before any bookkeeping of its size is made
  // (2^38 blocks: 32 GiB of host memory for its flags, which a host with room would take).
  t_bytes = 0;
  CHECK_THROWS_AS((depot::fixed_pool<D>{std::size_t{1} << 50, 4096}), depot::out_of_memory);
  CHECK(t_bytes < MiB);
}

TEST_CASE_TEMPLATE("pool: every host allocation behind the C interface fails in turn", D, DEPOT_TEST_DEVICES)
{
  every_failure([](long n, int& s) { return run_c_api<D>(n, s); }, 50);
}

TEST_CASE("pool: every host allocation of reading a snapshot or a trace back fails in turn")
{
  // What a real allocator writes: several segments of both pools, and a trace of them.
  depot::caching_allocator<depot::host> a{0, depot::allocator_config{}};
  a.set_trace_capacity(64);
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{100}, 3 * KiB, 700 * KiB, 5 * MiB, 40 * MiB}) blocks.push_back(a.allocate(bytes));
  a.deallocate(blocks[1]);
  a.deallocate(blocks[3]);
  written_files files{a.snapshot().to_json(), a.trace_json(),
                      "Thread,Time,Action,Pointer,Size,Stream\n1,08:00:00.000001,allocate,0x1000,512,0x0\n"
                      "1,08:00:00.000002,allocate,0x2000,1024,0x0\n2,08:00:00.000003,free,0x1000,512,0x0\n"
                      "2,08:00:00.000004,allocate failure,0x0,9999999,0x0\n",
                      {}};
  REQUIRE(depot::parse_snapshot(files.snapshot).segments.size() >= 3);
  files.trace_again = depot::parse_trace(files.trace).to_json();
  every_failure([&](long n, int& s) { return run_readers(n, s, files); }, 20);
  for (void* p : {blocks[0], blocks[2], blocks[4]}) a.deallocate(p);
}

TEST_CASE("pool: every host allocation of frees during a graph capture fails in turn (asynchronous backend)")
{
  every_failure([](long n, int& s) { return run_capture_frees(n, s); }, 20);
}

TEST_CASE("pool: frees during a graph capture with no host memory at all wait in place, then all come back")
{
  capture_frees_exhausted();
}
