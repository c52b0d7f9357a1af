// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/pool/detail/fork_hooks.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_mapping.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cerrno>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace depot {

namespace {

// The text layouts, little-endian, as hex digits. Ordinary segments: "dpt3", kind (1 byte),
// index (4), process, segment, offset, size, requested (8 each), the backend handle (64),
// the importer-count descriptor and slot (4 each). ("dpt1", before the counts, is refused.)
// Expandable segments: "dpt2", kind, index, process, segment, offset, size, requested, page
// (8 each), the number of pages (4), each page's descriptor (4 each).
constexpr std::array<unsigned char, 4> k_magic{'d', 'p', 't', '3'};
constexpr std::array<unsigned char, 4> k_magic_pages{'d', 'p', 't', '2'};
constexpr std::array<unsigned char, 4> k_magic_old{'d', 'p', 't', '1'};
constexpr std::size_t k_bytes = 4 + 1 + 4 + 5 * 8 + ipc_memory_handle::size + 4 + 4;
static_assert(ipc_handle::hex_length == 2 * k_bytes);
// pidfd_open and pidfd_getfd (Linux 5.3 and 5.6): the same numbers on every architecture.
#ifdef SYS_pidfd_open
constexpr long k_sys_pidfd_open = SYS_pidfd_open;
#else
constexpr long k_sys_pidfd_open = 434;
#endif
#ifdef SYS_pidfd_getfd
constexpr long k_sys_pidfd_getfd = SYS_pidfd_getfd;
#else
constexpr long k_sys_pidfd_getfd = 438;
#endif
constexpr std::size_t k_max_pages = std::size_t{1} << 24;  // 32 TiB of 2 MiB pages

void put(std::string& out, std::uint64_t v, int bytes)
{
  constexpr const char* digits = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>((v >> (8 * i)) & 0xFFU);
    out += digits[b >> 4];
    out += digits[b & 0xFU];
  }
}

int digit(char c) noexcept
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::uint64_t process_id() noexcept { return static_cast<std::uint64_t>(::getpid()); }

struct segment_key {
  device_id device;
  std::uint64_t process;
  std::uint64_t segment;
  ipc_memory_handle memory;
  std::uint64_t page;
  std::vector<std::int32_t> fds;
};

// The order of segment keys, which also compares a key with a handle's own fields (the
// same names): a lookup by handle copies nothing, so ipc_detach, which may not throw,
// allocates nothing (a key made for its lookup copied the pages' descriptors: std::bad_alloc
// in a noexcept function, std::terminate, when host memory ran out; tests/alloc_failure.cpp).
struct segment_order {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const noexcept
  {
    const auto x = std::tie(a.device, a.process, a.segment, a.memory.bytes, a.page);
    const auto y = std::tie(b.device, b.process, b.segment, b.memory.bytes, b.page);
    if (x != y) return x < y;
    return std::lexicographical_compare(a.fds.begin(), a.fds.end(), b.fds.begin(), b.fds.end());
  }
};

struct opened {
  void* base = nullptr;
  std::size_t users = 0;
  // Ordinary segments: this process's count in the exporter's importer-count file (the
  // page of it mapped here), taken before the backend mapping opens, given back after it
  // closes, so the exporter never releases a segment another process has mapped.
  void* counts = nullptr;
  std::int64_t* count = nullptr;
  int counts_fd = -1;  // holds the read lock on the slot (the exporter's test of liveness)
};

std::mutex& registry_mutex()
{
  static std::mutex m;
  return m;
}
std::map<segment_key, opened, segment_order>& registry()
{
  static auto* r = new std::map<segment_key, opened, segment_order>;  // outlives static destructors
  return *r;
}

}  // namespace

std::string ipc_handle::to_hex() const
{
  std::string out;
  const bool pages = expandable();
  out.reserve(pages ? expandable_hex_length(fds.size()) : hex_length);
  for (unsigned char c : pages ? k_magic_pages : k_magic) put(out, c, 1);
  put(out, static_cast<std::uint64_t>(device.kind), 1);
  put(out, static_cast<std::uint32_t>(device.index), 4);
  for (std::uint64_t v : {process, segment, offset, size, requested}) put(out, v, 8);
  if (!pages) {
    for (unsigned char c : memory.bytes) put(out, c, 1);
    put(out, static_cast<std::uint32_t>(counter_fd), 4);
    put(out, counter_slot, 4);
    return out;
  }
  put(out, page, 8);
  put(out, fds.size(), 4);
  for (std::int32_t fd : fds) put(out, static_cast<std::uint32_t>(fd), 4);
  return out;
}

ipc_handle ipc_handle::from_hex(std::string_view text)
{
  const auto wrong_length = [&](const std::string& expected) {
    return "depot: ipc_handle::from_hex: expected " + expected + ", got " + std::to_string(text.size()) +
           " characters";
  };
  const std::string lengths = std::to_string(hex_length) +
                              " hex digits (a handle's to_hex() of an ordinary segment's block) or " +
                              std::to_string(expandable_hex_length(1)) + " + 8 per page beyond the first (of an "
                              "expandable segment's block)";
  DEPOT_EXPECTS(text.size() >= 8 && text.size() % 2 == 0, wrong_length(lengths));
  std::vector<unsigned char> raw(text.size() / 2);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const int hi = digit(text[2 * i]);
    const int lo = digit(text[2 * i + 1]);
    DEPOT_EXPECTS(hi >= 0 && lo >= 0, "depot: ipc_handle::from_hex: character " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1) +
                                          " is not a hex digit");
    raw[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  const bool pages = std::memcmp(raw.data(), k_magic_pages.data(), k_magic_pages.size()) == 0;
  DEPOT_EXPECTS(std::memcmp(raw.data(), k_magic_old.data(), k_magic_old.size()) != 0,
                "depot: ipc_handle::from_hex: a handle of an older depot (\"dpt1\", without importer "
                "counts): export the block again with this version");
  DEPOT_EXPECTS(pages || std::memcmp(raw.data(), k_magic.data(), k_magic.size()) == 0,
                "depot: ipc_handle::from_hex: not a depot IPC handle (it must start with the "
                "hex of \"dpt3\" or \"dpt2\", 64707433 or 64707432)");
  if (pages) {
    DEPOT_EXPECTS(raw.size() >= expandable_hex_length(0) / 2, wrong_length(lengths));
  } else {
    DEPOT_EXPECTS(text.size() == hex_length, wrong_length(lengths));
  }
  std::size_t at = 4;
  auto get = [&](int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{raw[at++]} << (8 * i);
    return v;
  };
  ipc_handle h;
  const std::uint64_t kind = get(1);
  DEPOT_EXPECTS(kind == static_cast<std::uint64_t>(device_kind::cuda) ||
                    kind == static_cast<std::uint64_t>(device_kind::hip),
                "depot: ipc_handle::from_hex: device kind " + std::to_string(kind) +
                    " has no interprocess memory (valid: 1 cuda, 2 hip)");
  h.device.kind = static_cast<device_kind>(kind);
  const std::uint64_t index = get(4);
  DEPOT_EXPECTS(index <= 0x7FFFFFFFU, "depot: ipc_handle::from_hex: device index " + std::to_string(index) +
                                          " is out of range [0, 2^31)");
  h.device.index = static_cast<int>(index);
  h.process = get(8);
  h.segment = get(8);
  h.offset = get(8);
  h.size = get(8);
  h.requested = get(8);
  DEPOT_EXPECTS(h.size > 0 && h.requested > 0 && h.requested <= h.size,
                "depot: ipc_handle::from_hex: requested " + std::to_string(h.requested) +
                    " and size " + std::to_string(h.size) + " bytes must satisfy 0 < requested <= size");
  DEPOT_EXPECTS(h.offset <= ~std::uint64_t{0} - h.size && h.segment <= ~std::uint64_t{0} - h.offset - h.size,
                "depot: ipc_handle::from_hex: segment " + std::to_string(h.segment) + " + offset " +
                    std::to_string(h.offset) + " + size " + std::to_string(h.size) +
                    " overflows the address space");
  if (!pages) {
    std::memcpy(h.memory.bytes.data(), raw.data() + at, ipc_memory_handle::size);
    at += ipc_memory_handle::size;
    const auto fd = static_cast<std::uint32_t>(get(4));
    DEPOT_EXPECTS(fd <= 0x7FFFFFFFU, "depot: ipc_handle::from_hex: the importer-count file descriptor " +
                                         std::to_string(static_cast<std::int32_t>(fd)) + " is negative");
    h.counter_fd = static_cast<std::int32_t>(fd);
    h.counter_slot = static_cast<std::uint32_t>(get(4));
    return h;
  }
  h.page = get(8);
  const std::uint64_t count = get(4);
  DEPOT_EXPECTS(h.page != 0 && std::has_single_bit(h.page) && h.page <= (std::uint64_t{1} << 30),
                "depot: ipc_handle::from_hex: page size " + std::to_string(h.page) +
                    " must be a power of two in [1, 2^30]");
  DEPOT_EXPECTS(count != 0 && count <= k_max_pages,
                "depot: ipc_handle::from_hex: " + std::to_string(count) + " pages: must be 1 to " +
                    std::to_string(k_max_pages));
  DEPOT_EXPECTS(text.size() == expandable_hex_length(count),
                wrong_length(std::to_string(expandable_hex_length(count)) + " hex digits for a handle of " +
                             std::to_string(count) + " pages"));
  DEPOT_EXPECTS(h.offset < h.page && h.offset + h.size <= count * h.page &&
                    h.offset + h.size > (count - 1) * h.page,
                "depot: ipc_handle::from_hex: a block of " + std::to_string(h.size) + " bytes at offset " +
                    std::to_string(h.offset) + " does not span exactly " + std::to_string(count) + " pages of " +
                    std::to_string(h.page) + " bytes");
  h.fds.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto fd = static_cast<std::uint32_t>(get(4));
    DEPOT_EXPECTS(fd <= 0x7FFFFFFFU, "depot: ipc_handle::from_hex: page " + std::to_string(i) +
                                         "'s file descriptor " + std::to_string(static_cast<std::int32_t>(fd)) +
                                         " is negative");
    h.fds[i] = static_cast<std::int32_t>(fd);
  }
  return h;
}

namespace detail {

std::string descriptor_shortage(std::size_t needed)
{
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return {};
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return {};  // (no /proc: the call that runs short will say so)
  // New descriptors take the free numbers below the limit: count the open ones there.
  std::size_t open = 0;
  const int own = ::dirfd(d);
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const long fd = std::strtol(e->d_name, nullptr, 10);
    open += fd != own && static_cast<rlim_t>(fd) < lim.rlim_cur ? 1 : 0;
  }
  ::closedir(d);
  if (open + needed <= lim.rlim_cur) return {};
  return "needs " + std::to_string(needed) + " more file descriptors (one per page), and this process has " +
         std::to_string(open) + " open of the " + std::to_string(lim.rlim_cur) +
         " it may hold (RLIMIT_NOFILE; hard limit " +
         (lim.rlim_max == RLIM_INFINITY ? std::string{"unlimited"} : std::to_string(lim.rlim_max)) +
         "): raise the limit (ulimit -n, or setrlimit up to the hard limit) or share smaller blocks";
}

namespace {

segment_key key_of(const ipc_handle& h) { return {h.device, h.process, h.segment, h.memory, h.page, h.fds}; }

// The exporter's process id, which names it to pidfd_open and in /proc.
void check_process(const ipc_handle& h)
{
  DEPOT_EXPECTS(h.process <= 0x7FFFFFFFU && h.process != 0,
                "depot: ipc_mapping: process id " + std::to_string(h.process) + " is out of range [1, 2^31)");
}

// Descriptors of this process for the exporter's page descriptors of `h` (pidfd_getfd).
// Throws depot::error naming the exporter, the descriptor and what would let it through;
// nothing stays open then.
std::vector<int> take_descriptors(const ipc_handle& h)
{
  const auto fail = [&](const std::string& what, int e) {
    std::string why = std::strerror(e);
    if (e == EPERM || e == EACCES) {
      why += "; this process must be allowed to ptrace the exporter (the same user, and with "
             "Yama's ptrace_scope 1 the exporter's ancestor, or named by the exporter's "
             "prctl(PR_SET_PTRACER)), and the system call must not be filtered (seccomp)";
    } else if (e == ESRCH) {
      why += "; the exporting process has exited";
    } else if (e == EBADF) {
      why += "; the exporter no longer holds it (was the block freed and its pages unmapped?)";
    } else if (e == ENOSYS) {
      why += "; Linux 5.6 or newer is needed";
    }
    throw error("depot: ipc_mapping of a block of an expandable segment of process " + std::to_string(h.process) +
                    ": " + what + ": " + why,
                "pidfd_getfd", __FILE__, __LINE__, e, "ipc");
  };
  check_process(h);
  if (const std::string why = descriptor_shortage(h.fds.size() + 1); !why.empty()) {
    throw error("depot: ipc_mapping of a block of " + std::to_string(h.fds.size()) +
                    " pages of an expandable segment of process " + std::to_string(h.process) + " " + why,
                "pidfd_getfd", __FILE__, __LINE__, EMFILE, "ipc");
  }
  std::vector<int> fds;
  fds.reserve(h.fds.size());  // may throw: nothing open yet
  const long pidfd = ::syscall(k_sys_pidfd_open, static_cast<pid_t>(h.process), 0);
  if (pidfd < 0) fail("could not open the process (pidfd_open)", errno);
  for (std::int32_t remote : h.fds) {
    const long fd = ::syscall(k_sys_pidfd_getfd, static_cast<int>(pidfd), remote, 0);
    if (fd < 0) {
      const int e = errno;
      for (int f : fds) ::close(f);
      ::close(static_cast<int>(pidfd));
      fail("could not take its file descriptor " + std::to_string(remote), e);
    }
    fds.push_back(static_cast<int>(fd));
  }
  ::close(static_cast<int>(pidfd));
  return fds;
}

std::size_t page_size() noexcept { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// Maps the page of the exporter's importer-count file that holds h's slot, reached by the
// path /proc/PID/fd/FD (which needs the same user, not ptrace permission), and adds this
// process to the count. Throws depot::error naming the exporter, the file and the cause.
void count_in(const ipc_handle& h, opened& o)
{
  check_process(h);
  const std::string path = "/proc/" + std::to_string(h.process) + "/fd/" + std::to_string(h.counter_fd);
  const auto fail = [&](const std::string& what, int e) {
    std::string why = std::strerror(e);
    if (e == ENOENT) {
      why += "; the exporting process has exited, or its allocator (which holds the file) was destroyed";
    } else if (e == EACCES || e == EPERM) {
      why += "; the importer must run as the exporter's user";
    }
    throw error("depot: ipc_mapping of a block of process " + std::to_string(h.process) + ": " + what + " " + path +
                    " (the exporter's importer counts): " + why,
                "open", __FILE__, __LINE__, e, "ipc");
  };
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("could not open", errno);
  struct stat st {};
  const std::uint64_t at = std::uint64_t{h.counter_slot} * sizeof(std::int64_t);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("could not read the size of", e);
  }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < at + sizeof(std::int64_t)) {
    ::close(fd);
    fail("slot " + std::to_string(h.counter_slot) + " lies past the end of", EINVAL);
  }
  struct flock l {};
  l.l_type = F_RDLCK;
  l.l_whence = SEEK_SET;
  l.l_start = static_cast<off_t>(at);
  l.l_len = sizeof(std::int64_t);
  if (::fcntl(fd, F_OFD_SETLK, &l) != 0) {
    const int e = errno;
    ::close(fd);
    fail("could not lock slot " + std::to_string(h.counter_slot) + " of", e);
  }
  const std::size_t page = page_size();
  const std::uint64_t first = at / page * page;
  void* m = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(first));
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    fail("could not map", e);
  }
  o.counts_fd = fd;  // kept open: its lock says this process maps the segment
  o.counts = m;
  o.count = reinterpret_cast<std::int64_t*>(static_cast<unsigned char*>(m) + (at - first));
  std::atomic_ref<std::int64_t>{*o.count}.fetch_add(1, std::memory_order_acq_rel);
}

// This process's count given back (after its backend mapping closed).
void count_out(opened& o) noexcept
{
  if (o.count == nullptr) return;
  std::atomic_ref<std::int64_t>{*o.count}.fetch_sub(1, std::memory_order_acq_rel);
  ::munmap(o.counts, page_size());
  ::close(o.counts_fd);  // the lock goes with it
  o.counts = nullptr;
  o.count = nullptr;
  o.counts_fd = -1;
}

}  // namespace

void* ipc_attach(const ipc_handle& h, const ipc_backend& backend, const int* own_fds)
{
  if (h.process == process_id()) return reinterpret_cast<void*>(static_cast<std::uintptr_t>(h.segment));
  std::lock_guard g{registry_mutex()};
  auto& r = registry();
  auto [it, fresh] = r.try_emplace(key_of(h));  // may throw std::bad_alloc: nothing opened yet
  if (fresh) {
    try {
      if (!h.expandable()) {
        count_in(h, it->second);
        try {
          it->second.base = backend.open(h.memory, h.device.index);
        } catch (...) {
          count_out(it->second);
          throw;
        }
      } else {
        // The caller's descriptors (received with the handle: ipc_received), or ones taken
        // from the exporter, closed here once mapped (the mapping holds the memory).
        const std::vector<int> taken = own_fds == nullptr ? take_descriptors(h) : std::vector<int>{};
        const auto close_taken = [&]() noexcept {
          for (int f : taken) ::close(f);
        };
        try {
          it->second.base = backend.open_pages(own_fds != nullptr ? own_fds : taken.data(), h.fds.size(),
                                               static_cast<std::size_t>(h.page), h.device.index);
        } catch (...) {
          close_taken();
          throw;
        }
        close_taken();
      }
    } catch (...) {
      r.erase(it);
      throw;
    }
  }
  ++it->second.users;
  return it->second.base;
}

void ipc_detach(const ipc_handle& h, const ipc_backend& backend) noexcept
{
  if (h.process == process_id()) return;
  std::lock_guard g{registry_mutex()};
  auto& r = registry();
  auto it = r.find(h);  // (allocates nothing)
  if (it == r.end()) return;
  if (--it->second.users == 0) {
    if (h.expandable()) {
      backend.close_pages(it->second.base, h.fds.size(), static_cast<std::size_t>(h.page), h.device.index);
    } else {
      backend.close(it->second.base, h.device.index);
      count_out(it->second);
    }
    r.erase(it);
  }
}

void ipc_imports_fork_hold() noexcept { registry_mutex().lock(); }

void ipc_imports_fork_release(bool child) noexcept { release_after_fork(registry_mutex(), child); }

}  // namespace detail

}  // namespace depot
