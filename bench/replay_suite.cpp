// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench replay FILE`: replays a recorded allocation trace (depot.trace.v1 JSON or
// RMM's CSV log) against depot's caching allocator and the alternatives of the device (raw
// allocation, the stream-ordered allocator, PyTorch's where built in), keeping the trace's
// threads (one replay thread per recorded thread), its streams (one stream per recorded
// stream) and its global event order (each thread waits for the sequence number of its next
// event). With --capacity the device is simulated (pool/simulated_upstream.hpp): fake
// addresses, a hard capacity, so a trace from an 80 GB GPU replays on the CPU.
// Reported per allocator: median wall time of --alloc-reps runs (each on a fresh allocator),
// then, from one more untimed run sampled after every event (or every k-th for long traces),
// peak reserved and peak fragmentation; and every out-of-memory point.
#include "bench_result.hpp"

#include <depot/config.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/simulated_upstream.hpp>
#include <depot/pool/trace_file.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace depot::bench {

#if DEPOT_BENCH_TORCH
void* torch_allocate(std::size_t bytes, void* stream);
void torch_deallocate(void* ptr);
void torch_empty_cache();
#endif

namespace {

constexpr std::size_t max_replay_threads = 256;
constexpr std::size_t max_replay_streams = 1024;

// The trace reduced to what a replay does, in global order.
struct schedule {
  struct op {
    bool allocate = true;
    std::uint32_t slot = 0;    // which allocation
    std::uint32_t stream = 0;  // index into `streams`
    std::size_t bytes = 0;
    std::size_t event = 0;     // index in the trace
  };
  std::vector<op> ops;
  std::vector<std::vector<std::uint32_t>> per_thread;  // indices into ops, in order
  std::vector<std::uintptr_t> streams;                 // recorded handles
  std::size_t slots = 0;
  std::size_t frees_before_trace = 0;  // frees of blocks allocated before the trace began
  std::size_t never_freed = 0;         // freed after the replay, untimed
  std::size_t recorded_ooms = 0;
  std::size_t peak_live = 0;           // bytes requested and live at once, as recorded
  bool folded = false;                 // threads or streams beyond the caps were folded
};

schedule make_schedule(const recorded_trace& t)
{
  schedule s;
  std::unordered_map<std::uint64_t, std::uint32_t> thread_index;
  std::unordered_map<std::uintptr_t, std::uint32_t> stream_index;
  std::unordered_map<std::uintptr_t, std::pair<std::uint32_t, std::size_t>> live;  // address -> slot, bytes
  std::size_t live_bytes = 0;
  auto stream_of = [&](std::uintptr_t h) {
    auto [it, fresh] = stream_index.try_emplace(h, static_cast<std::uint32_t>(s.streams.size()));
    if (fresh) {
      if (s.streams.size() < max_replay_streams) {
        s.streams.push_back(h);
      } else {
        it->second = static_cast<std::uint32_t>(stream_index.size() % max_replay_streams);
        s.folded = true;
      }
    }
    return it->second;
  };
  auto thread_of = [&](std::uint64_t id) {
    auto [it, fresh] = thread_index.try_emplace(id, static_cast<std::uint32_t>(s.per_thread.size()));
    if (fresh) {
      if (s.per_thread.size() < max_replay_threads) {
        s.per_thread.emplace_back();
      } else {
        it->second = static_cast<std::uint32_t>(thread_index.size() % max_replay_threads);
        s.folded = true;
      }
    }
    return it->second;
  };
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    schedule::op o;
    o.event = i;
    if (e.kind == trace_kind::allocate) {
      o.bytes = e.requested != 0 ? e.requested : e.size;
      o.slot = static_cast<std::uint32_t>(s.slots++);
      if (!live.try_emplace(e.address, o.slot, o.bytes).second) {
        throw std::invalid_argument("trace event " + std::to_string(i) + " allocates address " + std::to_string(e.address) +
                                    ", which is still live (no free in between)");
      }
      live_bytes += o.bytes;
      s.peak_live = std::max(s.peak_live, live_bytes);
    } else if (e.kind == trace_kind::free) {
      const auto it = live.find(e.address);
      if (it == live.end()) {
        ++s.frees_before_trace;
        continue;
      }
      o.allocate = false;
      o.slot = it->second.first;
      o.bytes = it->second.second;
      live_bytes -= o.bytes;
      live.erase(it);
    } else {
      if (e.kind == trace_kind::out_of_memory) ++s.recorded_ooms;
      continue;
    }
    o.stream = stream_of(e.stream);
    s.per_thread[thread_of(e.thread)].push_back(static_cast<std::uint32_t>(s.ops.size()));
    s.ops.push_back(o);
  }
  s.never_freed = live.size();
  if (s.streams.empty()) s.streams.push_back(0);
  return s;
}

// One allocator as the replay drives it.
struct replay_target {
  std::string name;
  std::function<void*(std::size_t, native_stream)> allocate;  // throws std::bad_alloc or returns nullptr
  std::function<void(void*, std::size_t, native_stream)> deallocate;
  std::function<void()> reset;                         // a fresh allocator, nothing cached
  std::function<std::optional<std::size_t>()> reserved;  // bytes held now (nullopt: unknown)
  std::function<std::optional<double>()> fragmentation;  // depot's definition (nullopt: none)
  std::function<std::optional<std::size_t>()> peak_reserved;  // its own peak, if it keeps one
};

struct oom_point {
  std::size_t event;
  std::size_t bytes;
  std::size_t live_bytes;
};

struct run_result {
  double seconds = 0;
  std::vector<oom_point> ooms;
  std::size_t peak_live = 0;
  std::optional<std::size_t> peak_reserved;
  std::optional<double> peak_fragmentation;
};

// Replays the schedule once. `sample_every` > 0: after every k-th op (and the last) the
// executing thread samples reserved bytes and fragmentation (an untimed run).
run_result replay_once(const replay_target& a, const schedule& s, const std::vector<native_stream>& streams,
                       std::size_t sample_every, const std::function<void()>& finish)
{
  run_result r;
  std::vector<void*> ptrs(s.slots, nullptr);
  std::atomic<std::uint64_t> next{0};
  std::size_t live_bytes = 0;  // touched only by the thread holding the turn
  std::optional<std::size_t> reserved_base;
  if (sample_every > 0) reserved_base = a.reserved();
  std::exception_ptr failure;
  std::atomic<bool> failed{false};

  auto execute = [&](std::uint32_t k) {
    const schedule::op& o = s.ops[k];
    const native_stream st = streams[o.stream];
    if (o.allocate) {
      void* p = nullptr;
      try {
        p = a.allocate(o.bytes, st);
      } catch (const std::bad_alloc&) {
        p = nullptr;
      }
      if (p == nullptr && o.bytes > 0) {
        r.ooms.push_back({o.event, o.bytes, live_bytes});
      } else {
        ptrs[o.slot] = p;
        live_bytes += o.bytes;
        r.peak_live = std::max(r.peak_live, live_bytes);
      }
    } else if (void* p = std::exchange(ptrs[o.slot], nullptr); p != nullptr) {
      a.deallocate(p, o.bytes, st);
      live_bytes -= o.bytes;
    }
    if (sample_every > 0 && (k % sample_every == 0 || k + 1 == s.ops.size())) {
      if (const auto now = a.reserved(); now && reserved_base) {
        const std::size_t held = *now >= *reserved_base ? *now - *reserved_base : 0;
        r.peak_reserved = std::max(r.peak_reserved.value_or(0), held);
      }
      if (const auto f = a.fragmentation()) r.peak_fragmentation = std::max(r.peak_fragmentation.value_or(0.0), *f);
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  if (s.per_thread.size() == 1) {
    for (std::uint32_t k : s.per_thread[0]) execute(k);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(s.per_thread.size());
    for (std::size_t t = 0; t < s.per_thread.size(); ++t) {
      threads.emplace_back([&, t] {
        for (std::uint32_t k : s.per_thread[t]) {
          // wait for this op's turn in the recorded order
          int spins = 0;
          for (std::uint64_t v = next.load(std::memory_order_acquire); v != k; v = next.load(std::memory_order_acquire)) {
            if (failed.load(std::memory_order_relaxed)) return;
            if (++spins < 64) {
              std::this_thread::yield();
            } else {
              next.wait(v, std::memory_order_acquire);
            }
          }
          if (failed.load()) return;
          try {
            execute(k);
          } catch (...) {
            failure = std::current_exception();
            failed.store(true);
          }
          next.store(k + 1, std::memory_order_release);
          next.notify_all();
          if (failed.load()) return;
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  if (finish && !failure) finish();  // the device's queued work is part of the time
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failure) std::rethrow_exception(failure);
  // Blocks the trace never freed are returned now, outside the timing.
  for (std::size_t slot = 0; slot < ptrs.size(); ++slot) {
    if (ptrs[slot] != nullptr) a.deallocate(ptrs[slot], 0, streams[0]);
  }
  if (a.peak_reserved) {
    if (const auto p = a.peak_reserved()) r.peak_reserved = p;
  }
  return r;
}

std::string bytes_or_dash(const std::optional<std::size_t>& b) { return b ? format_bytes(*b) : std::string{"-"}; }

// Runs every target on the schedule; prints the table and appends JSON rows.
void replay_targets(const std::vector<replay_target>& targets, const schedule& s,
                    const std::vector<native_stream>& streams, const std::string& device_label, const options& opts,
                    nlohmann::json& rows, const std::function<void()>& finish = {})
{
  const std::size_t sample_every = std::max<std::size_t>(1, s.ops.size() / 200000);
  std::printf("  %-16s %12s %9s %14s %14s %10s %6s  %s\n", "allocator", "time (ms)", "ratio", "peak live",
              "peak reserved", "peak frag", "OOMs", "first out-of-memory points (event: bytes, live)");
  double depot_ms = 0;
  for (const replay_target& a : targets) {
    std::vector<double> times;
    run_result last;
    for (int rep = 0; rep < opts.alloc_reps; ++rep) {
      a.reset();
      last = replay_once(a, s, streams, 0, finish);
      times.push_back(last.seconds);
    }
    a.reset();
    const run_result measured = replay_once(a, s, streams, sample_every, finish);
    a.reset();
    const double ms = median(times) * 1e3;
    if (a.name == "depot") depot_ms = ms;
    std::string points;
    for (std::size_t k = 0; k < std::min<std::size_t>(measured.ooms.size(), 3); ++k) {
      points += (k > 0 ? "; " : "") + std::to_string(measured.ooms[k].event) + ": " + format_bytes(measured.ooms[k].bytes) +
                ", " + format_bytes(measured.ooms[k].live_bytes);
    }
    char frag[32] = "-";
    if (measured.peak_fragmentation) std::snprintf(frag, sizeof frag, "%.3f", *measured.peak_fragmentation);
    std::printf("  %-16s %12.3f %9.2f %14s %14s %10s %6zu  %s\n", a.name.c_str(), ms, depot_ms > 0 ? ms / depot_ms : 1.0,
                format_bytes(measured.peak_live).c_str(), bytes_or_dash(measured.peak_reserved).c_str(), frag,
                measured.ooms.size(), points.c_str());
    std::fflush(stdout);
    nlohmann::json oom_rows = nlohmann::json::array();
    for (const oom_point& p : measured.ooms) {
      oom_rows.push_back({{"event", p.event}, {"bytes", p.bytes}, {"live_bytes", p.live_bytes}});
    }
    rows.push_back({{"device", device_label},
                    {"allocator", a.name},
                    {"ms", ms},
                    {"runs", opts.alloc_reps},
                    {"ratio_to_depot", depot_ms > 0 ? ms / depot_ms : 1.0},
                    {"peak_live_bytes", measured.peak_live},
                    {"peak_reserved_bytes", measured.peak_reserved ? nlohmann::json(*measured.peak_reserved) : nlohmann::json()},
                    {"peak_fragmentation",
                     measured.peak_fragmentation ? nlohmann::json(*measured.peak_fragmentation) : nlohmann::json()},
                    {"out_of_memory", oom_rows}});
  }
}

void print_header(const schedule& s, const recorded_trace& t, const options& opts, const std::string& where)
{
  std::printf("\nreplay %s (%s, recorded on %s) on %s: %zu allocations, %zu frees, %zu threads, %zu streams; "
              "%s requested live at the peak; median of %d runs\n",
              opts.replay_file.c_str(), t.format.c_str(), t.device.empty() ? "?" : t.device.c_str(), where.c_str(), s.slots,
              s.ops.size() - s.slots + s.never_freed, s.per_thread.size(), s.streams.size(), format_bytes(s.peak_live).c_str(),
              opts.alloc_reps);
  if (s.frees_before_trace + s.never_freed + s.recorded_ooms > 0 || s.folded) {
    std::printf("  note: %zu frees of blocks allocated before the trace (skipped), %zu blocks never freed (freed after "
                "the timing), %zu recorded allocation failures (not replayed)%s\n",
                s.frees_before_trace, s.never_freed, s.recorded_ooms,
                s.folded ? "; threads/streams beyond 256/1024 folded together" : "");
  }
}

allocator_config replay_config(const options& opts)
{
  return opts.alloc_conf.empty() ? allocator_config::from_environment() : allocator_config::parse(opts.alloc_conf);
}

// --capacity: depot's allocator and the raw device, both over a simulated device.
void replay_simulated(const recorded_trace& t, const schedule& s, const options& opts, nlohmann::json& rows)
{
  device_id dev{device_kind::cuda, 0};
  try {
    dev = device_id::parse(t.device);
  } catch (const std::exception&) {
  }
  const allocator_config cfg = replay_config(opts);
  const std::string label = "simulated " + dev.to_string() + " of " + format_bytes(opts.capacity);
  print_header(s, t, opts, label + (cfg.to_string().empty() ? "" : " (depot: " + cfg.to_string() + ")"));
  std::vector<native_stream> streams;
  for (std::uintptr_t h : s.streams) streams.push_back(reinterpret_cast<native_stream>(h));  // never dereferenced

  std::unique_ptr<caching_allocator<host>> pool;
  simulated_upstream* pool_device = nullptr;
  std::unique_ptr<simulated_upstream> raw;
  std::vector<replay_target> targets;
  targets.push_back({"depot",
                     [&](std::size_t n, native_stream st) { return pool->allocate(n, stream_ref<host>{st}); },
                     [&](void* p, std::size_t, native_stream st) { pool->deallocate(p, stream_ref<host>{st}); },
                     [&] {
                       auto up = std::make_unique<simulated_upstream>(opts.capacity, dev);
                       pool_device = up.get();
                       pool = std::make_unique<caching_allocator<host>>(std::move(up), cfg);
                     },
                     [&]() -> std::optional<std::size_t> {
                       return static_cast<std::size_t>(pool->stats().reserved_bytes.all.current);
                     },
                     [&]() -> std::optional<double> { return pool->stats().fragmentation; },
                     [&]() -> std::optional<std::size_t> { return pool_device->current_usage().peak; }});
  targets.push_back({"device (no pool)",
                     [&](std::size_t n, native_stream) { return raw->allocate(n); },
                     [&](void* p, std::size_t n, native_stream) { raw->deallocate(p, n); },
                     // the driver packs small allocations into its pages: charge bytes, not 2 MiB pages
                     [&] { raw = std::make_unique<simulated_upstream>(opts.capacity, dev, 512); },
                     [&]() -> std::optional<std::size_t> { return raw->current_usage().used; },
                     [] { return std::optional<double>{}; },
                     [&]() -> std::optional<std::size_t> { return raw->current_usage().peak; }});
  replay_targets(targets, s, streams, label, opts, rows);
  pool.reset();
}

template <device D>
void replay_device(const recorded_trace& t, const schedule& s, const options& opts, int device, nlohmann::json& rows)
{
  const std::string label = std::string{D::name} + ":" + std::to_string(device);
  const allocator_config cfg = replay_config(opts);
  print_header(s, t, opts, label + (cfg.to_string().empty() ? "" : " (depot: " + cfg.to_string() + ")"));
  std::vector<stream<D>> owned;
  std::vector<native_stream> streams;
  for (std::uintptr_t h : s.streams) {
    if (h == 0) {
      streams.push_back(nullptr);  // the default stream
    } else {
      owned.emplace_back(device);
      streams.push_back(owned.back().native());
    }
  }
  auto device_reserved = [device]() -> std::optional<std::size_t> {
    if constexpr (is_gpu_v<D>) {
      const memory_info m = runtime<D>::memory(device);
      return m.total_bytes - m.free_bytes;
    } else {
      return std::nullopt;  // the host's free memory is the whole system's: not a measure
    }
  };
  auto none_double = [] { return std::optional<double>{}; };
  auto none_size = [] { return std::optional<std::size_t>{}; };

  std::unique_ptr<caching_allocator<D>> pool;
  std::vector<replay_target> targets;
  targets.push_back({"depot",
                     [&](std::size_t n, native_stream st) { return pool->allocate(n, stream_ref<D>{st}); },
                     [&](void* p, std::size_t, native_stream st) { pool->deallocate(p, stream_ref<D>{st}); },
                     [&] {
                       pool.reset();
                       pool = std::make_unique<caching_allocator<D>>(device, cfg);
                     },
                     [&]() -> std::optional<std::size_t> {
                       return static_cast<std::size_t>(pool->stats().reserved_bytes.all.current);
                     },
                     [&]() -> std::optional<double> { return pool->stats().fragmentation; },
                     [&]() -> std::optional<std::size_t> {
                       return static_cast<std::size_t>(pool->stats().reserved_bytes.all.peak);
                     }});
  targets.push_back({is_gpu_v<D> ? std::string{D::name} + "Malloc" : std::string{"malloc"},
                     [device](std::size_t n, native_stream) { return runtime<D>::allocate(n, device); },
                     [device](void* p, std::size_t, native_stream) { runtime<D>::deallocate(p, device); }, [] {},
                     device_reserved, none_double, none_size});
  if constexpr (is_gpu_v<D>) {
    targets.push_back({std::string{D::name} + "MallocAsync",
                       [device](std::size_t n, native_stream st) { return runtime<D>::allocate_async(n, device, st); },
                       [device](void* p, std::size_t, native_stream st) { runtime<D>::deallocate_async(p, device, st); },
                       [device] {
                         // return what the pool holds, then let it keep everything (as depot does)
                         runtime<D>::synchronize(device);
                         runtime<D>::set_async_release_threshold(device, 0);
                         runtime<D>::synchronize(device);
                         runtime<D>::set_async_release_threshold(device, std::numeric_limits<std::size_t>::max());
                       },
                       device_reserved, none_double, none_size});
  }
#if DEPOT_BENCH_TORCH && DEPOT_HAS_CUDA
  if constexpr (std::is_same_v<D, cuda>) {
    targets.push_back({"torch", [](std::size_t n, native_stream st) { return torch_allocate(n, st); },
                       [](void* p, std::size_t, native_stream) { torch_deallocate(p); }, [] { torch_empty_cache(); },
                       device_reserved, none_double, none_size});
  }
#endif
  if (!opts.alloc_only.empty()) {
    std::erase_if(targets, [&](const replay_target& x) {
      return x.name != "depot" && std::find(opts.alloc_only.begin(), opts.alloc_only.end(), x.name) == opts.alloc_only.end();
    });
  }
  replay_targets(targets, s, streams, label, opts, rows, [&owned, device] {
    for (auto& st : owned) st.synchronize();
    runtime<D>::synchronize(device);
  });
  pool.reset();
}

}  // namespace

nlohmann::json run_replay(const options& opts)
{
  if (opts.replay_file.empty()) {
    throw std::invalid_argument("replay: no trace file (depot-bench replay FILE, or --replay-file FILE)");
  }
  const recorded_trace t = read_trace(opts.replay_file);
  const schedule s = make_schedule(t);
  nlohmann::json rows = nlohmann::json::array();
  if (opts.capacity > 0) {
    replay_simulated(t, s, opts, rows);
  } else {
    if (opts.device == "all" || opts.device == "host") replay_device<host>(t, s, opts, 0, rows);
#if DEPOT_HAS_CUDA
    if ((opts.device == "all" || opts.device == "cuda") && device_count<cuda>() > 0) replay_device<cuda>(t, s, opts, 0, rows);
#endif
#if DEPOT_HAS_HIP
    if ((opts.device == "all" || opts.device == "hip") && device_count<hip>() > 0) replay_device<hip>(t, s, opts, 0, rows);
#endif
  }
  return nlohmann::json{{"suite", "replay"},
                        {"file", opts.replay_file},
                        {"format", t.format},
                        {"recorded_device", t.device},
                        {"events", t.events.size()},
                        {"threads", s.per_thread.size()},
                        {"streams", s.streams.size()},
                        {"capacity", opts.capacity},
                        {"rows", rows}};
}

}  // namespace depot::bench
