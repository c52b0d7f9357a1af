// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/pool/ipc_received.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <limits>
#include <optional>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace depot {

namespace {

// What one message carries: the kernel's SCM_MAX_FD.
constexpr std::size_t k_fds_per_message = 253;
// The longest handle text accepted (a block of 2^20 pages: 2 TiB of 2 MiB pages).
constexpr std::size_t k_max_text = ipc_handle::expandable_hex_length(std::size_t{1} << 20);

[[noreturn]] void fail(const char* call, const std::string& what, int e)
{
  throw error("depot: " + std::string{call} + ": " + what + ": " + std::strerror(e), call, __FILE__, __LINE__, e,
              "ipc");
}

// When a call that waits must be done by (nullopt: no limit).
using deadline = std::optional<std::chrono::steady_clock::time_point>;

deadline deadline_after(std::chrono::milliseconds timeout)
{
  DEPOT_EXPECTS(timeout.count() >= 0, "depot: ipc_send / ipc_receive: timeout of " + std::to_string(timeout.count()) +
                                          " ms; it must be 0 or more (0: only what is ready now)");
  // (beyond a century: no limit, rather than a time point that overflows)
  if (timeout > std::chrono::hours{24 * 366 * 100}) return std::nullopt;
  return std::chrono::steady_clock::now() + timeout;
}

// Waits until `socket` is ready for `events` (POLLIN or POLLOUT) or `until` passes; false
// then. Without a deadline, waits as long as it takes (a blocking socket's recvmsg or
// sendmsg would have; a non-blocking one lands here on EAGAIN).
bool wait_ready(int socket, short events, const deadline& until, const char* what)
{
  for (;;) {
    int ms = -1;
    if (until) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      ms = static_cast<int>(std::min<std::int64_t>(left.count(), std::numeric_limits<int>::max()));
    }
    pollfd p{socket, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("poll", std::string{what} + " on socket " + std::to_string(socket), errno);
    }
    if (n > 0) return true;  // ready, or an error / hang-up the next call reports
  }
}

std::string waited(std::chrono::milliseconds timeout)
{
  return "nothing more within the timeout of " + std::to_string(timeout.count()) + " ms";
}

// The text (its length first, 4 bytes) with the descriptors: as many as a message takes go
// with the text's first bytes sent, the rest with one byte '+' each further message.
void send(int socket, const std::string& text, const std::vector<int>& fds, const deadline& until,
          std::chrono::milliseconds timeout)
{
  DEPOT_EXPECTS(text.size() <= k_max_text, "depot: ipc_send: a handle of " + std::to_string(text.size()) +
                                                " characters is longer than the " + std::to_string(k_max_text) +
                                                " that ipc_receive takes");
  std::string data(4, '\0');
  const auto n = static_cast<std::uint32_t>(text.size());
  std::memcpy(data.data(), &n, 4);
  data += text;
  std::size_t off = 0;
  std::size_t fd_at = 0;
  char plus = '+';
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_fds_per_message)];
  // With a deadline, no call may block past it: each send waits in poll() first.
  const int flags = MSG_NOSIGNAL | (until ? MSG_DONTWAIT : 0);
  while (off < data.size() || fd_at < fds.size()) {
    const std::size_t k = std::min(k_fds_per_message, fds.size() - fd_at);
    iovec io{};
    if (off < data.size()) {
      io.iov_base = data.data() + off;
      io.iov_len = data.size() - off;
    } else {
      io.iov_base = &plus;
      io.iov_len = 1;
    }
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    if (k > 0) {
      std::memset(control, 0, sizeof control);
      m.msg_control = control;
      m.msg_controllen = CMSG_SPACE(sizeof(int) * k);
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * k);
      std::memcpy(CMSG_DATA(c), fds.data() + fd_at, sizeof(int) * k);
    }
    const ssize_t sent = ::sendmsg(socket, &m, flags);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a full socket (or a non-blocking one)
        if (wait_ready(socket, POLLOUT, until, "ipc_send")) continue;
        fail("sendmsg", "ipc_send on socket " + std::to_string(socket) + ": sent " + std::to_string(off) + " of " +
                            std::to_string(data.size()) + " bytes and " + std::to_string(fd_at) + " of " +
                            std::to_string(fds.size()) + " descriptors, " + waited(timeout) +
                            " (the receiver is not reading; the socket is mid-handle now: close it)",
             ETIMEDOUT);
      }
      fail("sendmsg", "ipc_send on socket " + std::to_string(socket) + " could not send the handle" +
                          (k > 0 ? " and " + std::to_string(k) + " descriptors" : std::string{}),
           errno);
    }
    fd_at += k;  // they went with the first byte sent
    if (off < data.size()) off += static_cast<std::size_t>(sent);
  }
}

// Copies up to `bytes` of what the socket holds into `into` without taking it (MSG_PEEK, no
// control buffer: descriptors stay queued with their bytes), waiting for the first byte as
// recvmsg would. Returns how many bytes were there: 0 when the other end has closed or the
// deadline passed with nothing (the read that follows reports either), fewer than asked
// when the rest has not come yet or lies past a message that carries descriptors (a peek
// stops there).
std::size_t peek(int socket, char* into, std::size_t bytes, const deadline& until)
{
  for (;;) {
    const ssize_t n = ::recv(socket, into, bytes, MSG_PEEK | MSG_DONTWAIT);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (wait_ready(socket, POLLIN, until, "ipc_receive")) continue;
      return 0;
    }
    fail("recvmsg", "ipc_receive on socket " + std::to_string(socket), errno);
  }
}

ipc_received receive(int socket, const deadline& until, std::chrono::milliseconds timeout)
{
  ipc_received r;  // owns every descriptor taken in: closed if anything below throws
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_fds_per_message)];
  const int flags = MSG_CMSG_CLOEXEC | (until ? MSG_DONTWAIT : 0);
  const auto read_exactly = [&](char* into, std::size_t bytes) {
    for (std::size_t got = 0; got < bytes;) {
      iovec io{into + got, bytes - got};
      msghdr m{};
      m.msg_iov = &io;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
      // Room for a whole message's descriptors before they arrive: taking them in then
      // cannot throw (bad_alloc would have left the kernel's copies open, owned by no one).
      r.fds.reserve(r.fds.size() + k_fds_per_message);
      const ssize_t n = ::recvmsg(socket, &m, flags);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {  // nothing yet (a non-blocking socket, or a deadline)
          if (wait_ready(socket, POLLIN, until, "ipc_receive")) continue;
          fail("recvmsg", "ipc_receive on socket " + std::to_string(socket) + ": got " + std::to_string(got) +
                              " of " + std::to_string(bytes) + " bytes of this part of the handle and " +
                              std::to_string(r.fds.size()) + " descriptors, " + waited(timeout) +
                              (got == 0 && r.fds.empty() ? std::string{}
                                                         : " (the socket is mid-handle now: close it)"),
               ETIMEDOUT);
        }
        fail("recvmsg", "ipc_receive on socket " + std::to_string(socket), errno);
      }
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const std::size_t at = r.fds.size();
        r.fds.resize(at + k);  // within the capacity reserved above (k <= 253)
        std::memcpy(r.fds.data() + at, CMSG_DATA(c), k * sizeof(int));
      }
      if ((m.msg_flags & MSG_CTRUNC) != 0) {
        fail("recvmsg", "ipc_receive on socket " + std::to_string(socket) +
                            ": descriptors were dropped (this process's limit of open files?)",
             EMFILE);
      }
      if (n == 0) {
        fail("recvmsg", "ipc_receive on socket " + std::to_string(socket) + ": the other end closed after " +
                            std::to_string(got) + " of " + std::to_string(bytes) + " bytes",
             ECONNRESET);
      }
      got += static_cast<std::size_t>(n);
    }
  };
  // What the handle needs of the heap, had before anything is taken from the socket: when
  // its length and text are queued whole (a handle sent in one piece: up to ~4 000 pages
  // with descriptors, any size without), they are read in place, parsed, and room is made
  // for every descriptor, so a receive that fails for host memory takes nothing and the
  // same call made again gets the handle (tests/alloc_failure.cpp). Otherwise the text is
  // read first, and a failure for memory after it leaves the socket mid-handle.
  std::string text;  // the length (4 bytes), then the text
  std::optional<ipc_handle> parsed;
  {
    char head[4];
    if (peek(socket, head, 4, until) == 4) {
      std::uint32_t length = 0;
      std::memcpy(&length, head, 4);
      if (length <= k_max_text) {  // (else the read below refuses it)
        text.resize(4 + std::size_t{length});
        if (peek(socket, text.data(), text.size(), until) == text.size()) {
          try {
            parsed = ipc_handle::from_hex(std::string_view{text}.substr(4));
          } catch (const invalid_argument&) {
            // No handle: taken all the same (a stream's next handle must not find it in its
            // way; a SOCK_SEQPACKET record goes whole), then refused.
            read_exactly(text.data(), text.size());
            throw;
          }
          r.fds.reserve((parsed->expandable() ? parsed->fds.size() : 0) + k_fds_per_message);
        }
      }
    }
  }
  if (parsed) {  // (nothing below allocates)
    read_exactly(text.data(), text.size());
    r.handle = std::move(*parsed);
  } else {
    std::uint32_t length = 0;
    read_exactly(reinterpret_cast<char*>(&length), 4);
    DEPOT_EXPECTS(length <= k_max_text, "depot: ipc_receive: a handle of " + std::to_string(length) +
                                            " characters announced, at most " + std::to_string(k_max_text) +
                                            " taken (is the other end ipc_send?)");
    text.assign(length, '\0');
    read_exactly(text.data(), length);
    r.handle = ipc_handle::from_hex(text);
  }
  const std::size_t expected = r.handle.expandable() ? r.handle.fds.size() : 0;
  while (r.fds.size() < expected) {
    char plus = 0;
    read_exactly(&plus, 1);
    DEPOT_EXPECTS(plus == '+', "depot: ipc_receive: expected more descriptors, got data (is the other end ipc_send?)");
  }
  DEPOT_EXPECTS(r.fds.size() == expected, "depot: ipc_receive: " + std::to_string(r.fds.size()) +
                                              " descriptors came with a handle of " + std::to_string(expected) +
                                              " pages");
  r.fds.shrink_to_fit();
  return r;
}

}  // namespace

ipc_received::ipc_received(ipc_received&& o) noexcept : handle{std::move(o.handle)}, fds{std::exchange(o.fds, {})} {}

ipc_received& ipc_received::operator=(ipc_received&& o) noexcept
{
  if (this != &o) {
    for (int fd : fds) ::close(fd);
    handle = std::move(o.handle);
    fds = std::exchange(o.fds, {});
  }
  return *this;
}

ipc_received::~ipc_received()
{
  for (int fd : fds) ::close(fd);
}

namespace {

std::vector<int> fds_of(const ipc_handle& h)
{
  // (an ordinary segment's handle goes without descriptors, whatever its fds hold)
  return h.expandable() ? std::vector<int>(h.fds.begin(), h.fds.end()) : std::vector<int>{};
}

void check_received(const ipc_received& r)
{
  DEPOT_EXPECTS(r.fds.size() == (r.handle.expandable() ? r.handle.fds.size() : 0),
                "depot: ipc_send: the received handle holds " + std::to_string(r.fds.size()) +
                    " descriptors, its block spans " + std::to_string(r.handle.fds.size()) + " pages");
}

}  // namespace

void ipc_send(int socket, const ipc_handle& h) { send(socket, h.to_hex(), fds_of(h), std::nullopt, {}); }

void ipc_send(int socket, const ipc_handle& h, std::chrono::milliseconds timeout)
{
  send(socket, h.to_hex(), fds_of(h), deadline_after(timeout), timeout);
}

void ipc_send(int socket, const ipc_received& r)
{
  check_received(r);
  send(socket, r.handle.to_hex(), r.fds, std::nullopt, {});
}

void ipc_send(int socket, const ipc_received& r, std::chrono::milliseconds timeout)
{
  check_received(r);
  send(socket, r.handle.to_hex(), r.fds, deadline_after(timeout), timeout);
}

ipc_received ipc_receive(int socket) { return receive(socket, std::nullopt, {}); }

ipc_received ipc_receive(int socket, std::chrono::milliseconds timeout)
{
  return receive(socket, deadline_after(timeout), timeout);
}

}  // namespace depot
