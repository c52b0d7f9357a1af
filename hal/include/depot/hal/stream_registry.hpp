// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/native_handle.hpp>

namespace depot {

// The process-wide record of the streams whose lifetime depot sees: every depot::stream
// from construction to destruction, and any handle its owner registers with opened() and
// closing(). Watchers (the caching allocators of GPU backends) are told of each closing
// before its handle is destroyed, so they can order their cached memory after the
// stream's last work by an event. Thread-safe; a raw handle never registered is unknown.
class stream_registry {
 public:
  class watcher {
   public:
    // `stream` of `device` is about to be destroyed: it is still valid during the call.
    // Called on the destroying thread, with no lock of the caller's held; must not throw.
    virtual void stream_closing(device_id device, native_stream stream) noexcept = 0;

   protected:
    watcher() = default;
    watcher(const watcher&) = default;
    watcher& operator=(const watcher&) = default;
    ~watcher() = default;
  };

  // `stream` is live until closing(). May throw std::bad_alloc (nothing recorded then).
  static void opened(device_id device, native_stream stream);
  // Tells every watcher, then forgets `stream`: call it before destroying the handle. A
  // handle never opened is told to watchers too (they order by events either way).
  static void closing(device_id device, native_stream stream) noexcept;
  // Whether `stream` of backend `kind` (on any of its devices: a handle names one stream of
  // its backend) is opened and its closing() has not returned. A watcher that holds a lock
  // its stream_closing() takes and has not been told yet may use the stream until it
  // releases that lock (the closing waits for it).
  [[nodiscard]] static bool live(device_kind kind, native_stream stream) noexcept;

  // Adds a watcher (may throw std::bad_alloc). unwatch() returns once no call to it runs,
  // and never calls it again: call it before the watcher is destroyed.
  static void watch(watcher* w);
  static void unwatch(watcher* w) noexcept;

  // fork() support, for the allocators' atfork handlers (pool/, which order every lock of
  // the process around a fork): hold the watchers' lock (taken before any allocator's), then
  // the live set's (a leaf, taken after them); fork_release() gives both back in the
  // parent, and in the child (one thread, the forking one) makes both anew.
  static void fork_hold_watchers() noexcept;
  static void fork_hold_live() noexcept;
  static void fork_release(bool child) noexcept;
};

}  // namespace depot
