// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/pool/ipc_handle.hpp>

#include <chrono>
#include <cstddef>
#include <vector>

namespace depot {

// An ipc_handle received over a Unix socket together with the exporter's page descriptors
// (SCM_RIGHTS), now this process's own: a block of an expandable segment can then be mapped
// (ipc_mapping) without taking the descriptors from the exporter, so no ptrace permission is
// needed (Yama ptrace_scope 1 with a child importing from its parent, scope 2, seccomp).
// Owns the descriptors (closed on destruction); move-only; not thread-safe.
struct ipc_received {
  ipc_handle handle;
  std::vector<int> fds;  // for an expandable segment's block: one per page, in page order

  ipc_received() = default;
  ipc_received(ipc_received&& o) noexcept;
  ipc_received& operator=(ipc_received&& o) noexcept;
  ipc_received(const ipc_received&) = delete;
  ipc_received& operator=(const ipc_received&) = delete;
  ~ipc_received();
};

// Sends h over the connected Unix socket `socket` (SOCK_STREAM or SOCK_SEQPACKET): its text
// and, for a block of an expandable segment, the descriptors it names (which must be open in
// this process: the exporter's), in messages of at most 253 descriptors. The exporter
// sends; any process may pass on what it received by sending its ipc_received.
// depot::error naming the failing call. A non-blocking socket is waited on (poll).
// With a timeout, the whole handle must be sent within it, else depot::error (ETIMEDOUT):
// the receiver is not reading, and the socket is left mid-handle (close it).
void ipc_send(int socket, const ipc_handle& h);
void ipc_send(int socket, const ipc_handle& h, std::chrono::milliseconds timeout);
void ipc_send(int socket, const ipc_received& r);
void ipc_send(int socket, const ipc_received& r, std::chrono::milliseconds timeout);

// Receives what ipc_send sent: depot::error on a closed socket or a failing call,
// depot::invalid_argument on data that is no handle (nothing stays open then). Without a
// timeout it waits as long as it takes (for a sender that never comes, forever); with one,
// the whole handle must arrive within it, else depot::error (ETIMEDOUT) saying how much came
// (descriptors that came are closed; a socket left mid-handle must be closed). A timeout
// of 0 takes only what is ready now. std::bad_alloc takes nothing from the socket when the
// handle's text was queued whole as the call began (one piece: the usual case), so the
// same call made again gets the handle.
[[nodiscard]] ipc_received ipc_receive(int socket);
[[nodiscard]] ipc_received ipc_receive(int socket, std::chrono::milliseconds timeout);

}  // namespace depot
