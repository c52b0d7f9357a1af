// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/stream_registry.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>
#include <vector>

namespace depot {
namespace {

struct key {
  device_kind kind;
  native_stream stream;
  friend bool operator==(const key&, const key&) = default;
};

struct key_hash {
  std::size_t operator()(const key& k) const noexcept
  {
    return std::hash<std::uintptr_t>{}(reinterpret_cast<std::uintptr_t>(k.stream)) ^
           (static_cast<std::size_t>(k.kind) * 0x9e3779b97f4a7c15ULL);
  }
};

// Two locks: `live_mu` is a leaf (held only around the set), `watchers_mu` is held shared
// across the calls to watchers, so unwatch() waits for them and a watcher may take its
// own locks (and call live()) inside.
struct registry_state {
  std::mutex live_mu;
  std::unordered_set<key, key_hash> live;
  std::shared_mutex watchers_mu;
  std::vector<stream_registry::watcher*> watchers;
};

// Never destroyed: streams and allocators may outlive static destruction's order.
registry_state& state() noexcept
{
  static auto* s = new registry_state;
  return *s;
}

}  // namespace

void stream_registry::opened(device_id device, native_stream stream)
{
  registry_state& s = state();
  std::lock_guard g{s.live_mu};
  s.live.insert(key{device.kind, stream});
}

void stream_registry::closing(device_id device, native_stream stream) noexcept
{
  registry_state& s = state();
  {
    // Live while the watchers are told: one that holds a lock its stream_closing() takes
    // may still use the stream (it is destroyed only after this returns).
    std::shared_lock r{s.watchers_mu};
    for (watcher* w : s.watchers) w->stream_closing(device, stream);
  }
  std::lock_guard g{s.live_mu};
  s.live.erase(key{device.kind, stream});
}

bool stream_registry::live(device_kind kind, native_stream stream) noexcept
{
  registry_state& s = state();
  std::lock_guard g{s.live_mu};
  return s.live.count(key{kind, stream}) != 0;
}

void stream_registry::watch(watcher* w)
{
  registry_state& s = state();
  std::unique_lock g{s.watchers_mu};
  s.watchers.push_back(w);
}

void stream_registry::unwatch(watcher* w) noexcept
{
  registry_state& s = state();
  std::unique_lock g{s.watchers_mu};
  s.watchers.erase(std::remove(s.watchers.begin(), s.watchers.end(), w), s.watchers.end());
}

void stream_registry::fork_hold_watchers() noexcept { state().watchers_mu.lock(); }

void stream_registry::fork_hold_live() noexcept { state().live_mu.lock(); }

void stream_registry::fork_release(bool child) noexcept
{
  registry_state& s = state();
  if (child) {
    // The forking thread holds both, under another thread id than its own now (a
    // read-write lock's unlock tells its writer by thread id): made anew instead.
    std::construct_at(&s.live_mu);
    std::construct_at(&s.watchers_mu);
    return;
  }
  s.live_mu.unlock();
  s.watchers_mu.unlock();
}

}  // namespace depot
