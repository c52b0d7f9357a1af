// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/hal/device_kind.hpp>
#include <depot/hal/native_handle.hpp>
#include <depot/hal/stream_registry.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace depot {

// One value of type V per live stream of one backend: made by the caller's maker on the
// stream's first get(), dropped as the stream closes (a stream_registry watcher: a
// depot::stream's destruction, or closing() by a raw handle's owner; register it with
// stream_registry::watch) or by clear(). Thread-safe: a get() of a kept value takes a shared
// lock and a binary search over the live streams (threads at once do not wait for each
// other; log n, where a list under one mutex grew as n). Makers run one at a time (a lock of
// their own) and outside the lookups' lock, so a new stream's first get() keeps no other
// stream's get() waiting while its value is made; keeping it, a closing and clear() take
// the lookups' lock alone, briefly. Values are shared: one a caller holds outlives its
// stream's closing and goes as the last holder lets go; a dropped value is destroyed outside
// the lock.
// (ops/ keeps each stream's Kokkos execution-space instance in one.)
template <class V>
class stream_keyed final : public stream_registry::watcher {
 public:
  explicit stream_keyed(device_kind kind) noexcept : kind_{kind} {}
  stream_keyed(const stream_keyed&) = delete;
  stream_keyed& operator=(const stream_keyed&) = delete;
  ~stream_keyed() = default;

  // The value of `stream`, made by make() (returning std::shared_ptr<V>) if it has none.
  // make() runs under the makers' lock (one maker at a time, for any stream; lookups of kept
  // values and closings go on meanwhile), once per stream, except where `stream` closed or
  // clear() ran while it made the value: that value is the caller's and is not kept (it is
  // for a handle closed meanwhile), and the next get() makes another. What make()
  // throws comes out, with nothing kept (the next get() makes it again); so does
  // std::bad_alloc. make() must not call this object (its lock is not recursive).
  template <class Make>
  std::shared_ptr<V> get(native_stream stream, Make&& make)
  {
    if (auto found = find(stream)) return found;
    const std::lock_guard<std::mutex> one_maker{make_mu_};
    if (auto found = find(stream)) return found;  // (another thread's maker made it meanwhile)
    {
      const std::unique_lock<std::shared_mutex> lock{mu_};
      making_ = {true, stream, false};
    }
    std::shared_ptr<V> made = std::forward<Make>(make)();  // (throws: making_ stays, and is
                                                          // set anew before the next make)
    const std::unique_lock<std::shared_mutex> lock{mu_};
    const bool closed = making_.closed;
    making_ = {};
    if (closed) return made;  // (not kept: see above)
    const auto it = at(stream);  // (no other maker ran: still none for `stream`)
    const std::size_t i = static_cast<std::size_t>(it - slots_.begin());
    if (slots_.size() == slots_.capacity()) slots_.reserve(std::max<std::size_t>(8, slots_.size() * 2));
    slots_.emplace(slots_.begin() + static_cast<std::ptrdiff_t>(i), stream, made);  // (reserved: no throw)
    return made;
  }

  // Values kept (one per stream that had a get() and has not closed since).
  [[nodiscard]] std::size_t size() const
  {
    const std::shared_lock<std::shared_mutex> lock{mu_};
    return slots_.size();
  }

  // Every value dropped (destroyed here, outside the lock, unless a caller holds it).
  void clear() noexcept
  {
    std::vector<slot> gone;
    const std::unique_lock<std::shared_mutex> lock{mu_};
    gone.swap(slots_);
    making_.closed = true;  // (a maker at work keeps nothing)
    // (gone is destroyed after the lock: declared before it)
  }

  void stream_closing(device_id device, native_stream stream) noexcept override
  {
    if (device.kind != kind_) return;
    std::shared_ptr<V> gone;  // (destroyed after the lock: declared before it)
    const std::unique_lock<std::shared_mutex> lock{mu_};
    if (making_.on && making_.stream == stream) making_.closed = true;  // (its maker keeps nothing)
    const auto it = at(stream);
    if (it != slots_.end() && it->first == stream) {
      gone = std::move(it->second);
      slots_.erase(it);  // (moves pointers: no throw)
    }
  }

 private:
  using slot = std::pair<native_stream, std::shared_ptr<V>>;
  // The kept value of `stream`, or null (under the shared lock).
  std::shared_ptr<V> find(native_stream stream) const
  {
    const std::shared_lock<std::shared_mutex> lock{mu_};
    const auto it = std::lower_bound(slots_.begin(), slots_.end(), stream, before);
    return it != slots_.end() && it->first == stream ? it->second : nullptr;
  }
  static bool before(const slot& e, native_stream s) noexcept { return std::less<native_stream>{}(e.first, s); }
  // The first slot whose stream is not below `stream` (caller holds mu_, either way).
  typename std::vector<slot>::iterator at(native_stream stream)
  {
    return std::lower_bound(slots_.begin(), slots_.end(), stream, before);
  }

  device_kind kind_;
  mutable std::shared_mutex mu_;  // the lookups' lock
  std::mutex make_mu_;            // the makers' lock (taken before mu_, never inside it)
  // The value being made (makers run one at a time), and whether its stream closed or
  // clear() ran since (under mu_).
  struct making {
    bool on = false;
    native_stream stream = nullptr;
    bool closed = false;
  } making_;
  std::vector<slot> slots_;  // sorted by stream
};

}  // namespace depot
