// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "page_data.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace depot::memviz {
namespace {

// Unsigned LEB128 varints and zigzag-coded signed ones, then base64: what page.js decodes.
class packed_stream {
 public:
  void put(std::uint64_t v)
  {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<char>(v));
  }
  void put_signed(std::int64_t v)
  {
    put((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
  }
  // a - b as a signed difference (two's complement wrap for far-apart values)
  void put_delta(std::uint64_t a, std::uint64_t b) { put_signed(static_cast<std::int64_t>(a - b)); }

  [[nodiscard]] std::string base64() const
  {
    static constexpr char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((bytes_.size() + 2) / 3 * 4);
    std::size_t i = 0;
    const auto byte = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes_[k])); };
    for (; i + 3 <= bytes_.size(); i += 3) {
      const std::uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
      out += table[v >> 18];
      out += table[(v >> 12) & 63];
      out += table[(v >> 6) & 63];
      out += table[v & 63];
    }
    if (const std::size_t rest = bytes_.size() - i; rest > 0) {
      const std::uint32_t v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0);
      out += table[v >> 18];
      out += table[(v >> 12) & 63];
      out += rest == 2 ? table[(v >> 6) & 63] : '=';
      out += '=';
    }
    return out;
  }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }

 private:
  std::string bytes_;
};

std::string hex(std::uint64_t v)
{
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Size classes of a block, by its size (the pool's small pool ends at 1 MiB).
constexpr std::array<std::size_t, 6> size_class_limits{std::size_t{4} << 10,  std::size_t{64} << 10,
                                                       std::size_t{1} << 20,  std::size_t{16} << 20,
                                                       std::size_t{256} << 20, std::size_t{1} << 30};
constexpr std::array<const char*, 7> size_class_names{"<= 4 KiB",   "<= 64 KiB",  "<= 1 MiB", "<= 16 MiB",
                                                      "<= 256 MiB", "<= 1 GiB", "> 1 GiB"};
constexpr std::size_t size_classes = size_class_names.size();

std::uint32_t size_class(std::size_t bytes) noexcept
{
  std::uint32_t c = 0;
  while (c < size_class_limits.size() && bytes > size_class_limits[c]) ++c;
  return c;
}

constexpr std::size_t max_stream_classes = 8;  // the busiest streams; the rest are "other"
constexpr std::size_t finest_buckets_cap = 65536;
constexpr std::size_t coarsest_buckets = 1024;
constexpr std::size_t max_oom_markers = 10000;

enum alloc_flag : std::uint32_t {
  before_trace = 1,  // freed in the trace, allocated before it began
  never_freed = 2,   // alive when the trace ends
  cache_hit = 4,
  replaced = 8,      // its address was handed out again without a recorded free
};

struct allocation {
  std::uint64_t start = 0;  // ns since the trace began
  std::uint64_t end = 0;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  std::uintptr_t stream = 0;
  std::uint64_t thread = 0;
  std::uint32_t flags = 0;
};

// Free ranges inside the segments the trace saw being reserved: the pool's fragmentation
// (1 - largest free range / free bytes) follows from them, event by event.
class segment_gaps {
 public:
  void add_segment(std::uintptr_t address, std::size_t size)
  {
    if (size == 0 || segments_.count(address) != 0) return;
    segments_[address] = segment{size, {}, {}};
    add_gap(size);
  }
  // Pages of an expandable segment mapped or unmapped. At its end the range grows or
  // shrinks, and the free range at its end with it; inside it, unmapped pages become a hole,
  // kept like a live block (no free range there) until mapped back, and a hole the end
  // reaches goes with it (the allocator ends the range below it).
  void map_pages(std::uintptr_t address, std::size_t size, bool map)
  {
    if (address + size < address) return;
    if (map) {  // inside a hole: (part of) it mapped back, free addresses again
      segment* s = nullptr;
      std::uintptr_t base = 0;
      if (find(address, size, s, base)) {
        auto h = s->holes.upper_bound(address);
        if (h == s->holes.begin()) return;
        --h;
        const std::uintptr_t h0 = h->first, h1 = h->second;
        if (address + size > h1) return;  // not inside one hole: the trace is inconsistent
        s->holes.erase(h);
        free(h0);
        if (h0 < address) hole(h0, address - h0);
        if (address + size < h1) hole(address + size, h1 - address - size);
        return;
      }
    }
    auto it = segments_.upper_bound(address - (map ? 1 : 0));
    if (it == segments_.begin()) return;
    --it;
    segment& s = it->second;
    const std::uintptr_t base = it->first, end = base + s.size;
    if (address < base) return;
    if (!map && address + size < end) {  // unmapped inside: a hole
      hole(address, size);
      return;
    }
    if (map ? end != address : address + size != end) return;
    const std::uintptr_t last = s.blocks.empty() ? base : s.blocks.rbegin()->second;
    if (!map && last > address) return;  // a live block above: the trace is inconsistent
    remove_gap(end - last);
    s.size = map ? s.size + size : s.size - size;
    add_gap(base + s.size - last);
    // The end reached a hole: the range now ends where the hole begins.
    while (!map && !s.blocks.empty() && s.blocks.rbegin()->second == base + s.size &&
           s.holes.count(s.blocks.rbegin()->first) != 0) {
      const std::uintptr_t h0 = s.blocks.rbegin()->first;
      s.holes.erase(h0);
      s.blocks.erase(h0);
      s.size = h0 - base;  // the free range below the hole now ends the range (no gap changes)
    }
  }
  void remove_segment(std::uintptr_t address)
  {
    const auto it = segments_.find(address);
    if (it == segments_.end()) return;
    // Normally empty; if blocks are still recorded inside, drop every gap between them.
    std::uintptr_t p = address;
    for (const auto& [b, e] : it->second.blocks) {
      remove_gap(b - p);
      p = e;
    }
    remove_gap(address + it->second.size - p);
    segments_.erase(it);
  }
  void allocate(std::uintptr_t a, std::size_t size)
  {
    segment* s = nullptr;
    std::uintptr_t base = 0;
    if (!find(a, size, s, base)) return;
    auto next = s->blocks.lower_bound(a);
    const std::uintptr_t hi = next == s->blocks.end() ? base + s->size : next->first;
    const std::uintptr_t lo = next == s->blocks.begin() ? base : std::prev(next)->second;
    if (a < lo || a + size > hi) return;  // overlaps a live block: the trace is inconsistent
    remove_gap(hi - lo);
    add_gap(a - lo);
    add_gap(hi - (a + size));
    s->blocks.emplace_hint(next, a, a + size);
  }
  void free(std::uintptr_t a)
  {
    segment* s = nullptr;
    std::uintptr_t base = 0;
    if (!find(a, 1, s, base)) return;
    const auto it = s->blocks.find(a);
    if (it == s->blocks.end() || s->holes.count(a) != 0) return;  // (a hole is freed by mapping it)
    const auto next = std::next(it);
    const std::uintptr_t hi = next == s->blocks.end() ? base + s->size : next->first;
    const std::uintptr_t lo = it == s->blocks.begin() ? base : std::prev(it)->second;
    remove_gap(a - lo);
    remove_gap(hi - it->second);
    add_gap(hi - lo);
    s->blocks.erase(it);
  }
  // 1 - largest free range / free bytes (0 with no free bytes): memory_stats::fragmentation
  [[nodiscard]] double fragmentation() const noexcept
  {
    if (free_bytes_ == 0 || gaps_.empty()) return 0.0;
    return 1.0 - static_cast<double>(*gaps_.rbegin()) / static_cast<double>(free_bytes_);
  }

 private:
  struct segment {
    std::size_t size = 0;
    std::map<std::uintptr_t, std::uintptr_t> blocks;  // live block (or hole) start -> end
    std::map<std::uintptr_t, std::uintptr_t> holes;   // unmapped pages inside: start -> end
  };
  void hole(std::uintptr_t a, std::size_t size)
  {
    segment* s = nullptr;
    std::uintptr_t base = 0;
    if (!find(a, size, s, base)) return;
    const std::size_t before = s->blocks.size();
    allocate(a, size);
    if (s->blocks.size() == before) return;
    // Holes that meet are one (as the allocator keeps them): a later map may cross the seam.
    std::uintptr_t h0 = a;
    const std::uintptr_t h1 = a + size;
    if (auto it = s->holes.lower_bound(a); it != s->holes.begin() && std::prev(it)->second == a) {
      h0 = std::prev(it)->first;
      s->blocks.erase(a);
    }
    std::uintptr_t end = h1;
    if (auto nx = s->holes.find(h1); nx != s->holes.end()) {
      end = nx->second;
      s->holes.erase(nx);
      s->blocks.erase(h1);
    }
    s->holes[h0] = end;
    s->blocks[h0] = end;  // (no free range between holes that meet: the gaps stay)
  }
  bool find(std::uintptr_t a, std::size_t size, segment*& s, std::uintptr_t& base)
  {
    auto it = segments_.upper_bound(a);
    if (it == segments_.begin()) return false;
    --it;
    if (a + size > it->first + it->second.size) return false;
    s = &it->second;
    base = it->first;
    return true;
  }
  void add_gap(std::size_t n)
  {
    if (n == 0) return;
    gaps_.insert(n);
    free_bytes_ += n;
  }
  void remove_gap(std::size_t n)
  {
    if (n == 0) return;
    const auto it = gaps_.find(n);
    if (it == gaps_.end()) return;
    gaps_.erase(it);
    free_bytes_ -= n;
  }
  std::map<std::uintptr_t, segment> segments_;
  std::multiset<std::size_t> gaps_;
  std::size_t free_bytes_ = 0;
};

// One time bucket: the series' range and last value, and the live bytes per class at the
// moment of the bucket's highest allocated total.
struct series_bucket {
  std::array<std::uint64_t, 3> lo{}, hi{}, last{};  // allocated, reserved, fragmentation x 1e4
};

}  // namespace

nlohmann::json trace_page_data(const recorded_trace& trace, trace_summary& summary)
{
  const std::vector<trace_event>& ev = trace.events;
  summary = trace_summary{};
  summary.events = ev.size();

  // ---- times made non-decreasing, relative to the first event ----
  std::vector<std::uint64_t> t(ev.size());
  std::uint64_t now = ev.empty() ? 0 : ev.front().time_ns;
  const std::uint64_t t_begin = now;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    now = std::max(now, ev[i].time_ns);
    t[i] = now - t_begin;
  }
  const std::uint64_t span = ev.empty() ? 0 : t.back();
  summary.span_ns = span;
  const std::uint64_t span_nonzero = std::max<std::uint64_t>(span, 1);

  // ---- pass 1: pair allocations with their frees ----
  std::vector<allocation> regular, before;
  std::vector<std::int64_t> event_alloc(ev.size(), std::numeric_limits<std::int64_t>::min());
  std::unordered_map<std::uintptr_t, std::size_t> open;
  std::unordered_map<std::uintptr_t, std::size_t> open_segments;
  std::unordered_map<std::size_t, std::size_t> replaced_at;  // event -> regular allocation it ended
  std::size_t base_reserved = 0;
  nlohmann::json ooms = nlohmann::json::array();
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const trace_event& e = ev[i];
    switch (e.kind) {
      case trace_kind::allocate: {
        if (const auto it = open.find(e.address); it != open.end()) {
          regular[it->second].end = t[i];
          regular[it->second].flags |= replaced;
          replaced_at[i] = it->second;
          open.erase(it);
        }
        allocation a;
        a.start = t[i];
        a.end = span;
        a.address = e.address;
        a.size = e.size;
        a.requested = e.requested;
        a.stream = e.stream;
        a.thread = e.thread;
        a.flags = e.cache_hit ? std::uint32_t{cache_hit} : 0U;
        open[e.address] = regular.size();
        event_alloc[i] = static_cast<std::int64_t>(regular.size());
        regular.push_back(a);
        break;
      }
      case trace_kind::free: {
        if (const auto it = open.find(e.address); it != open.end()) {
          regular[it->second].end = t[i];
          event_alloc[i] = static_cast<std::int64_t>(it->second);
          open.erase(it);
        } else {
          allocation a;
          a.start = 0;
          a.end = t[i];
          a.address = e.address;
          a.size = e.size;
          a.requested = e.requested;
          a.stream = e.stream;
          a.thread = e.thread;
          a.flags = alloc_flag::before_trace;
          event_alloc[i] = -static_cast<std::int64_t>(before.size()) - 1;
          before.push_back(a);
        }
        break;
      }
      case trace_kind::segment_allocate:
        summary.has_segments = true;
        open_segments[e.address] = e.size;
        break;
      case trace_kind::segment_free:
        summary.has_segments = true;
        if (open_segments.erase(e.address) == 0) base_reserved += e.size;
        break;
      case trace_kind::segment_map:
      case trace_kind::segment_unmap: summary.has_segments = true; break;
      case trace_kind::segment_move:
        summary.has_segments = true;
        ++summary.segment_moves;
        break;
      case trace_kind::out_of_memory:
        ++summary.out_of_memory;
        if (ooms.size() < max_oom_markers) ooms.push_back({t[i], e.requested != 0 ? e.requested : e.size});
        break;
    }
  }
  for (const auto& [address, index] : open) regular[index].flags |= never_freed;

  // Final order: blocks alive when the trace began (start 0) first, then by allocation.
  std::vector<allocation> allocs;
  allocs.reserve(before.size() + regular.size());
  allocs.insert(allocs.end(), before.begin(), before.end());
  allocs.insert(allocs.end(), regular.begin(), regular.end());
  const auto final_index = [&](std::int64_t k) {
    return k >= 0 ? before.size() + static_cast<std::size_t>(k) : static_cast<std::size_t>(-k - 1);
  };
  summary.allocations = allocs.size();
  summary.before_trace = before.size();
  summary.never_freed = open.size();

  // ---- streams and threads: tables, and the busiest streams as colour classes ----
  std::vector<std::uintptr_t> streams;
  std::unordered_map<std::uintptr_t, std::uint32_t> stream_index;
  std::vector<std::size_t> stream_count;
  std::vector<std::uint64_t> threads;
  std::unordered_map<std::uint64_t, std::uint32_t> thread_index;
  std::vector<std::uint32_t> alloc_stream(allocs.size()), alloc_thread(allocs.size());
  for (std::size_t k = 0; k < allocs.size(); ++k) {
    auto [it, fresh] = stream_index.try_emplace(allocs[k].stream, static_cast<std::uint32_t>(streams.size()));
    if (fresh) {
      streams.push_back(allocs[k].stream);
      stream_count.push_back(0);
    }
    ++stream_count[it->second];
    alloc_stream[k] = it->second;
    auto [jt, tfresh] = thread_index.try_emplace(allocs[k].thread, static_cast<std::uint32_t>(threads.size()));
    if (tfresh) threads.push_back(allocs[k].thread);
    alloc_thread[k] = jt->second;
  }
  std::vector<std::uint32_t> by_count(streams.size());
  for (std::uint32_t s = 0; s < by_count.size(); ++s) by_count[s] = s;
  std::stable_sort(by_count.begin(), by_count.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return stream_count[a] > stream_count[b]; });
  const bool stream_other = streams.size() > max_stream_classes;
  const std::size_t stream_classes = stream_other ? max_stream_classes + 1 : std::max<std::size_t>(streams.size(), 1);
  std::vector<std::uint32_t> stream_class(streams.size());
  nlohmann::json stream_class_names = nlohmann::json::array();
  for (std::size_t r = 0; r < by_count.size(); ++r) {
    stream_class[by_count[r]] = static_cast<std::uint32_t>(std::min(r, max_stream_classes));
    if (r < max_stream_classes) stream_class_names.push_back(streams[by_count[r]] == 0 ? "default stream" : "stream " + hex(streams[by_count[r]]));
  }
  if (stream_other) stream_class_names.push_back("other streams");
  if (streams.empty()) stream_class_names.push_back("default stream");

  // ---- pass 2: series and per-class live bytes, bucketed ----
  std::size_t finest = coarsest_buckets;
  while (finest < finest_buckets_cap && finest < ev.size()) finest *= 4;
  const std::size_t classes = size_classes + stream_classes;
  std::vector<series_bucket> series(finest);
  std::vector<std::uint64_t> stacks(finest * classes, 0);  // live bytes per class at the bucket's peak
  std::vector<std::uint64_t> stack_total(finest, 0);

  std::vector<std::uint64_t> live(classes, 0);
  std::uint64_t allocated = 0;
  std::uint64_t reserved = base_reserved;
  segment_gaps gaps;
  for (std::size_t k = 0; k < before.size(); ++k) {
    live[size_class(allocs[k].size)] += allocs[k].size;
    live[size_classes + stream_class[alloc_stream[k]]] += allocs[k].size;
    allocated += allocs[k].size;
  }
  double peak_frag = 0.0;
  std::uint64_t peak_alloc = allocated, peak_res = reserved;
  const auto values = [&]() -> std::array<std::uint64_t, 3> {
    const double f = gaps.fragmentation();
    peak_frag = std::max(peak_frag, f);
    peak_alloc = std::max(peak_alloc, allocated);
    peak_res = std::max(peak_res, reserved);
    return {allocated, reserved, static_cast<std::uint64_t>(std::llround(f * 10000.0))};
  };
  std::size_t bucket = 0;
  const auto open_bucket = [&](std::size_t b, const std::array<std::uint64_t, 3>& v) {
    series[b].lo = series[b].hi = series[b].last = v;
    std::copy(live.begin(), live.end(), stacks.begin() + static_cast<std::ptrdiff_t>(b * classes));
    stack_total[b] = allocated;
  };
  open_bucket(0, values());
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const std::size_t b = std::min<std::size_t>(
        finest - 1, static_cast<std::size_t>(static_cast<long double>(t[i]) * finest / span_nonzero));
    while (bucket < b) open_bucket(++bucket, values());
    const trace_event& e = ev[i];
    switch (e.kind) {
      case trace_kind::allocate:
      case trace_kind::free: {
        const std::size_t k = final_index(event_alloc[i]);
        const std::size_t bytes = allocs[k].size;
        const std::size_t sc = size_class(bytes), tc = size_classes + stream_class[alloc_stream[k]];
        if (e.kind == trace_kind::allocate) {
          // A block whose address comes back without a recorded free leaves here.
          if (const auto r = replaced_at.find(i); r != replaced_at.end()) {
            const std::size_t rk = before.size() + r->second;
            const std::size_t rb = allocs[rk].size;
            const std::size_t rsc = size_class(rb), rtc = size_classes + stream_class[alloc_stream[rk]];
            live[rsc] -= std::min<std::uint64_t>(live[rsc], rb);
            live[rtc] -= std::min<std::uint64_t>(live[rtc], rb);
            allocated -= std::min<std::uint64_t>(allocated, rb);
            gaps.free(e.address);
          }
          live[sc] += bytes;
          live[tc] += bytes;
          allocated += bytes;
          gaps.allocate(e.address, bytes);
        } else {
          live[sc] -= std::min<std::uint64_t>(live[sc], bytes);
          live[tc] -= std::min<std::uint64_t>(live[tc], bytes);
          allocated -= std::min<std::uint64_t>(allocated, bytes);
          gaps.free(e.address);
        }
        break;
      }
      case trace_kind::segment_allocate:
        reserved += e.size;
        gaps.add_segment(e.address, e.size);
        break;
      case trace_kind::segment_free:
        reserved -= std::min<std::uint64_t>(reserved, e.size);
        gaps.remove_segment(e.address);
        break;
      case trace_kind::segment_map:
        reserved += e.size;
        gaps.map_pages(e.address, e.size, true);
        break;
      case trace_kind::segment_unmap:
        reserved -= std::min<std::uint64_t>(reserved, e.size);
        gaps.map_pages(e.address, e.size, false);
        break;
      case trace_kind::segment_move:  // (the same memory, another stream's: reserved unchanged)
      case trace_kind::out_of_memory: break;
    }
    const auto v = values();
    series_bucket& sb = series[bucket];
    for (int s = 0; s < 3; ++s) {
      sb.lo[s] = std::min(sb.lo[s], v[s]);
      sb.hi[s] = std::max(sb.hi[s], v[s]);
      sb.last[s] = v[s];
    }
    if (allocated > stack_total[bucket]) {
      std::copy(live.begin(), live.end(), stacks.begin() + static_cast<std::ptrdiff_t>(bucket * classes));
      stack_total[bucket] = allocated;
    }
  }
  while (bucket + 1 < finest) open_bucket(++bucket, values());
  summary.final_fragmentation = gaps.fragmentation();
  summary.peak_allocated = peak_alloc;
  summary.peak_reserved = peak_res;
  summary.peak_fragmentation = peak_frag;

  // ---- levels, coarse to fine: a coarse bucket keeps its peak child's stack ----
  std::vector<std::size_t> level_sizes;
  for (std::size_t n = finest; n >= coarsest_buckets; n /= 4) level_sizes.insert(level_sizes.begin(), n);
  nlohmann::json levels = nlohmann::json::array();
  for (const std::size_t n : level_sizes) {
    const std::size_t f = finest / n;
    packed_stream tl, se;
    std::vector<std::uint64_t> prev_stack(classes, 0);
    std::array<std::array<std::uint64_t, 3>, 3> prev{};  // [lo, hi, last][series]
    for (std::size_t b = 0; b < n; ++b) {
      std::size_t peak_child = b * f;
      series_bucket agg = series[b * f];
      for (std::size_t c = b * f; c < (b + 1) * f; ++c) {
        if (stack_total[c] > stack_total[peak_child]) peak_child = c;
        for (int s = 0; s < 3; ++s) {
          agg.lo[s] = std::min(agg.lo[s], series[c].lo[s]);
          agg.hi[s] = std::max(agg.hi[s], series[c].hi[s]);
        }
        agg.last = series[c].last;
      }
      for (std::size_t k = 0; k < classes; ++k) {
        const std::uint64_t v = stacks[peak_child * classes + k];
        tl.put_delta(v, prev_stack[k]);
        prev_stack[k] = v;
      }
      for (int s = 0; s < 3; ++s) {
        for (int q = 0; q < 3; ++q) {
          const std::uint64_t v = q == 0 ? agg.lo[s] : q == 1 ? agg.hi[s] : agg.last[s];
          se.put_delta(v, prev[q][s]);
          prev[q][s] = v;
        }
      }
    }
    levels.push_back({{"buckets", n}, {"stacks", tl.base64()}, {"series", se.base64()}});
  }

  // ---- every allocation, packed: 8 varints each ----
  packed_stream pa;
  std::uint64_t prev_start = 0;
  std::uintptr_t prev_address = 0;
  for (std::size_t k = 0; k < allocs.size(); ++k) {
    const allocation& a = allocs[k];
    pa.put(a.start - prev_start);
    pa.put(a.end - a.start);
    pa.put(a.size);
    pa.put_delta(a.size, a.requested);
    pa.put_delta(a.address, prev_address);
    pa.put(alloc_stream[k]);
    pa.put(alloc_thread[k]);
    pa.put(a.flags);
    prev_start = a.start;
    prev_address = a.address;
  }

  nlohmann::json stream_names = nlohmann::json::array(), stream_classes_of = nlohmann::json::array();
  for (std::size_t s = 0; s < streams.size(); ++s) {
    stream_names.push_back(hex(streams[s]));
    stream_classes_of.push_back(stream_class[s]);
  }
  nlohmann::json thread_names = nlohmann::json::array();
  for (const std::uint64_t th : threads) thread_names.push_back(hex(th));
  nlohmann::json size_names = nlohmann::json::array();
  for (const char* n : size_class_names) size_names.push_back(n);

  return {
      {"format", trace.format},
      {"device", trace.device},
      {"events", ev.size()},
      {"span_ns", span},
      {"begin_ns", t_begin},
      {"allocations", allocs.size()},
      {"alloc_data", pa.base64()},
      {"before_trace", before.size()},
      {"never_freed", open.size()},
      {"has_segments", summary.has_segments},
      {"base_reserved", base_reserved},
      {"peak_allocated", peak_alloc},
      {"peak_reserved", peak_res},
      {"peak_fragmentation", peak_frag},
      {"final_fragmentation", summary.final_fragmentation},
      {"size_classes", size_names},
      {"stream_classes", stream_class_names},
      {"streams", stream_names},
      {"stream_class_of", stream_classes_of},
      {"threads", thread_names},
      {"levels", levels},
      {"ooms", ooms},
      {"out_of_memory", summary.out_of_memory},
      {"segment_moves", summary.segment_moves},
  };
}

nlohmann::json snapshot_page_data(const allocator_snapshot& snapshot)
{
  packed_stream p;
  std::vector<std::uintptr_t> streams;
  std::unordered_map<std::uintptr_t, std::uint32_t> stream_index;
  std::uintptr_t prev_address = 0;
  std::size_t blocks = 0, reserved = 0, allocated = 0, pending = 0, kept = 0, largest_segment = 0;
  for (const segment_info& s : snapshot.segments) {
    auto [it, fresh] = stream_index.try_emplace(s.stream, static_cast<std::uint32_t>(streams.size()));
    if (fresh) streams.push_back(s.stream);
    p.put_delta(s.address, prev_address);
    prev_address = s.address;
    p.put(s.size);
    p.put(s.small_pool ? 1 : 0);
    p.put(it->second);
    p.put(s.blocks.size());
    std::uintptr_t end = s.address;
    for (const block_info& b : s.blocks) {
      p.put_delta(b.address, end);  // 0 when the blocks tile the segment
      p.put(b.size);
      p.put_delta(b.size, b.requested);
      // the state, or 4: a free block kept for reuse at its size (block_info::kept)
      p.put(b.kept ? std::uint64_t{4} : static_cast<std::uint64_t>(b.state));
      end = b.address + b.size;
      if (b.state == block_state::allocated) allocated += b.size;
      if (b.state == block_state::pending_free) pending += b.size;
      if (b.kept) kept += b.size;
    }
    blocks += s.blocks.size();
    reserved += s.size;
    largest_segment = std::max(largest_segment, s.size);
  }
  nlohmann::json stream_names = nlohmann::json::array();
  for (const std::uintptr_t s : streams) stream_names.push_back(hex(s));
  return {
      {"device", snapshot.device.to_string()},
      {"segments", snapshot.segments.size()},
      {"blocks", blocks},
      {"reserved", reserved},
      {"allocated", allocated},
      {"pending_free", pending},
      {"kept", kept},
      {"largest_segment", largest_segment},
      {"streams", stream_names},
      {"data", p.base64()},
  };
}

}  // namespace depot::memviz
