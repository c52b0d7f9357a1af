// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Offline arena planning from buffer lifetimes (greedy orderings after Pisarchyk & Lee 2020,
// best-fit gap search), its verification and the reuse suggestions.
#include <depot/hal/expects.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/lifetime_planner.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <set>

namespace depot {

namespace {

using lifetime = lifetime_planner::lifetime;

std::string describe(const std::vector<lifetime>& ls, std::size_t i)
{
  const lifetime& l = ls[i];
  return "buffer " + std::to_string(i) + " (id " + std::to_string(l.id) + ", " + std::to_string(l.bytes) +
         " bytes, steps " + std::to_string(l.first_step) + ".." + std::to_string(l.last_step) + ")";
}

// Interval stabbing over compressed time: a segment tree whose nodes keep the placed
// buffers that cover them, plus the placed buffers ordered by start. Together they list
// exactly the placed buffers that overlap a query interval, each once.
class placed_index {
 public:
  explicit placed_index(std::size_t leaves) : leaves_{std::max<std::size_t>(leaves, 1)}, nodes_(4 * leaves_) {}

  void insert(std::uint32_t first, std::uint32_t last, std::uint32_t id)
  {
    insert(1, 0, leaves_ - 1, first, last, id);
    by_start_.emplace(first, id);
  }

  // Calls fn(id) for every placed buffer overlapping [first, last].
  template <class Fn>
  void overlapping(std::uint32_t first, std::uint32_t last, Fn&& fn) const
  {
    std::size_t node = 1;
    std::size_t lo = 0;
    std::size_t hi = leaves_ - 1;
    while (true) {
      for (std::uint32_t id : nodes_[node]) fn(id);
      if (lo == hi) break;
      const std::size_t mid = (lo + hi) / 2;
      if (first <= mid) {
        node = 2 * node;
        hi = mid;
      } else {
        node = 2 * node + 1;
        lo = mid + 1;
      }
    }
    for (auto it = by_start_.upper_bound({first, std::numeric_limits<std::uint32_t>::max()});
         it != by_start_.end() && it->first <= last; ++it) {
      fn(it->second);
    }
  }

 private:
  void insert(std::size_t node, std::size_t lo, std::size_t hi, std::uint32_t first, std::uint32_t last, std::uint32_t id)
  {
    if (first <= lo && hi <= last) {
      nodes_[node].push_back(id);
      return;
    }
    const std::size_t mid = (lo + hi) / 2;
    if (first <= mid) insert(2 * node, lo, mid, first, last, id);
    if (last > mid) insert(2 * node + 1, mid + 1, hi, first, last, id);
  }

  std::size_t leaves_;
  std::vector<std::vector<std::uint32_t>> nodes_;
  std::set<std::pair<std::uint32_t, std::uint32_t>> by_start_;
};

// Lifetimes on compressed time (ranks of the distinct step values).
struct compressed {
  std::vector<std::uint32_t> first;
  std::vector<std::uint32_t> last;
  std::size_t points = 0;
};

compressed compress(const std::vector<lifetime>& ls)
{
  std::vector<std::uint64_t> t;
  t.reserve(2 * ls.size());
  for (const lifetime& l : ls) {
    t.push_back(l.first_step);
    t.push_back(l.last_step);
  }
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  compressed c;
  c.points = t.size();
  c.first.reserve(ls.size());
  c.last.reserve(ls.size());
  auto rank = [&](std::uint64_t v) { return static_cast<std::uint32_t>(std::lower_bound(t.begin(), t.end(), v) - t.begin()); };
  for (const lifetime& l : ls) {
    c.first.push_back(rank(l.first_step));
    c.last.push_back(rank(l.last_step));
  }
  return c;
}

// Live bytes at each compressed point.
std::vector<std::size_t> breadth(const std::vector<lifetime>& ls, const compressed& c)
{
  std::vector<std::int64_t> delta(c.points + 1, 0);
  for (std::size_t i = 0; i < ls.size(); ++i) {
    delta[c.first[i]] += static_cast<std::int64_t>(ls[i].bytes);
    delta[c.last[i] + 1] -= static_cast<std::int64_t>(ls[i].bytes);
  }
  std::vector<std::size_t> out(c.points);
  std::int64_t run = 0;
  for (std::size_t p = 0; p < c.points; ++p) {
    run += delta[p];
    out[p] = static_cast<std::size_t>(run);
  }
  return out;
}

// Places buffers in `order`, each at the best-fitting gap among the placed buffers that
// overlap it in time (the smallest gap that holds it), or on top of them.
lifetime_planner::plan place(const std::vector<lifetime>& ls, const compressed& c, const std::vector<std::uint32_t>& order,
                             bool lowest_fit, std::size_t* work = nullptr)
{
  lifetime_planner::plan p;
  p.offsets.assign(ls.size(), 0);
  placed_index index{c.points};
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // (offset, end) of overlapping buffers
  for (std::uint32_t i : order) {
    const std::size_t size = ls[i].bytes;
    if (size == 0) continue;
    busy.clear();
    index.overlapping(c.first[i], c.last[i], [&](std::uint32_t j) { busy.emplace_back(p.offsets[j], p.offsets[j] + ls[j].bytes); });
    std::sort(busy.begin(), busy.end());
    if (work != nullptr) *work += busy.size() + 1;
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t top = 0;  // highest end so far in the sweep
    for (const auto& [off, end] : busy) {
      if (off > top) {
        const std::size_t gap = off - top;
        if (gap >= size && gap < best_gap && (!lowest_fit || best == std::numeric_limits<std::size_t>::max())) {
          best_gap = gap;
          best = top;
        }
      }
      top = std::max(top, end);
    }
    p.offsets[i] = best != std::numeric_limits<std::size_t>::max() ? best : top;
    p.arena_bytes = std::max(p.arena_bytes, p.offsets[i] + size);
    index.insert(c.first[i], c.last[i], i);
  }
  return p;
}

}  // namespace

lifetime_planner::lifetime_planner(std::size_t alignment) : alignment_{alignment}
{
  DEPOT_EXPECTS(alignment > 0 && (alignment & (alignment - 1)) == 0,
                "depot: lifetime_planner alignment must be a power of two >= 1, got " + std::to_string(alignment));
}

lifetime_planner::lifetime_planner(const recorded_trace& trace, std::size_t alignment) : lifetime_planner(alignment)
{
  std::unordered_map<std::uintptr_t, std::size_t> live;  // address -> lifetime index
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const trace_event& e = trace.events[i];
    const std::size_t bytes = align(e.requested != 0 ? e.requested : e.size);
    switch (e.kind) {
      case trace_kind::allocate: {
        const auto [it, inserted] = live.try_emplace(e.address, lifetimes_.size());
        if (!inserted) {
          throw invalid_argument("depot: lifetime_planner: trace event " + std::to_string(i) + " allocates address " +
                                 std::to_string(e.address) + ", which is still live since event " +
                                 std::to_string(lifetimes_[it->second].id) + " (no free in between)");
        }
        lifetimes_.push_back({i, bytes, i, i});
        break;
      }
      case trace_kind::free: {
        const auto it = live.find(e.address);
        if (it == live.end()) {
          // allocated before the trace's first event: alive from the start
          lifetimes_.push_back({i, bytes, 0, i});
          ++allocated_before_trace_;
        } else {
          lifetimes_[it->second].last_step = i;
          live.erase(it);
        }
        break;
      }
      case trace_kind::out_of_memory: ++out_of_memory_events_; break;
      case trace_kind::segment_allocate:
      case trace_kind::segment_free: break;
    }
  }
  const std::uint64_t end = trace.events.size();
  for (const auto& [address, index] : live) {
    lifetimes_[index].last_step = end;
    ++never_freed_;
  }
}

std::size_t lifetime_planner::align(std::size_t bytes) const
{
  DEPOT_EXPECTS(bytes <= std::numeric_limits<std::size_t>::max() - alignment_,
                "depot: lifetime_planner: a buffer of " + std::to_string(bytes) + " bytes overflows when aligned");
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

void lifetime_planner::record_usage(std::uint64_t step, std::span<const tensor> tensors)
{
  // Check everything first, so that a bad tensor records nothing.
  std::unordered_map<std::uint64_t, std::size_t> in_call;
  for (const tensor& t : tensors) {
    const std::size_t bytes = align(t.bytes);
    const auto it = index_of_.find(t.id);
    if (it != index_of_.end() && lifetimes_[it->second].bytes != bytes) {
      throw invalid_argument("depot: lifetime_planner::record_usage(step " + std::to_string(step) + "): tensor " +
                             std::to_string(t.id) + " is " + std::to_string(t.bytes) + " bytes, but was " +
                             std::to_string(lifetimes_[it->second].bytes) + " (aligned) before; nothing was recorded");
    }
    const auto [c, fresh] = in_call.try_emplace(t.id, bytes);
    if (!fresh && c->second != bytes) {
      throw invalid_argument("depot: lifetime_planner::record_usage(step " + std::to_string(step) + "): tensor " +
                             std::to_string(t.id) + " appears twice with different sizes; nothing was recorded");
    }
  }
  for (const tensor& t : tensors) {
    const auto [it, fresh] = index_of_.try_emplace(t.id, lifetimes_.size());
    if (fresh) {
      lifetimes_.push_back({t.id, align(t.bytes), step, step});
    } else {
      lifetime& l = lifetimes_[it->second];
      l.first_step = std::min(l.first_step, step);
      l.last_step = std::max(l.last_step, step);
    }
  }
}

std::size_t lifetime_planner::lower_bound() const
{
  if (lifetimes_.empty()) return 0;
  const compressed c = compress(lifetimes_);
  const std::vector<std::size_t> b = breadth(lifetimes_, c);
  return *std::max_element(b.begin(), b.end());
}

lifetime_planner::suggestions lifetime_planner::optimization_suggestions() const
{
  suggestions s;
  s.buffers = lifetimes_.size();
  for (const lifetime& l : lifetimes_) s.total_bytes += l.bytes;
  s.lower_bound = lower_bound();
  s.reusable_bytes = s.total_bytes - s.lower_bound;
  s.allocated_before_trace = allocated_before_trace_;
  s.never_freed = never_freed_;
  s.out_of_memory_events = out_of_memory_events_;

  // Reuse chain: in order of first use, a buffer takes over the smallest dead block that
  // holds it; blocks die with the last buffer that used them.
  std::vector<std::uint32_t> order(lifetimes_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return lifetimes_[a].first_step != lifetimes_[b].first_step ? lifetimes_[a].first_step < lifetimes_[b].first_step : a < b;
  });
  struct block {
    std::size_t bytes;
    std::uint32_t last_user;
  };
  using dying = std::pair<std::uint64_t, std::size_t>;  // (last step, block index)
  std::priority_queue<dying, std::vector<dying>, std::greater<>> active;
  std::vector<block> blocks;
  std::multimap<std::size_t, std::size_t> dead;  // bytes -> block index
  std::size_t created = 0;
  for (std::uint32_t i : order) {
    const lifetime& l = lifetimes_[i];
    while (!active.empty() && active.top().first < l.first_step) {
      dead.emplace(blocks[active.top().second].bytes, active.top().second);
      active.pop();
    }
    if (l.bytes == 0) continue;
    const auto fit = dead.lower_bound(l.bytes);
    std::size_t b = 0;
    if (fit != dead.end()) {
      b = fit->second;
      dead.erase(fit);
      s.reuses.push_back({l.id, lifetimes_[blocks[b].last_user].id, l.bytes});
      blocks[b].last_user = i;
    } else {
      b = blocks.size();
      blocks.push_back({l.bytes, i});
      created += l.bytes;
    }
    active.emplace(l.last_step, b);
  }
  s.reuse_saved_bytes = s.total_bytes - created;
  std::stable_sort(s.reuses.begin(), s.reuses.end(), [](const reuse& a, const reuse& b) { return a.bytes > b.bytes; });
  return s;
}

lifetime_planner::plan lifetime_planner::compute_reuse_plan() const
{
  const std::size_t n = lifetimes_.size();
  DEPOT_EXPECTS(n < std::numeric_limits<std::uint32_t>::max(),
                "depot: lifetime_planner: at most 2^32-2 buffers can be planned, got " + std::to_string(n));
  plan best;
  best.offsets.assign(n, 0);
  const std::size_t lower_bound_bytes = lower_bound();
  best.lower_bound = lower_bound_bytes;
  best.strategy = "none";
  if (n == 0) return best;
  const compressed c = compress(lifetimes_);
  const std::vector<std::size_t> live = breadth(lifetimes_, c);
  // Each buffer's breadth: the most bytes alive at any step of its life (a sparse table
  // answers the range maxima).
  std::vector<std::vector<std::size_t>> table{live};
  for (std::size_t w = 1; 2 * w <= live.size(); w *= 2) {
    const auto& prev = table.back();
    std::vector<std::size_t> next(prev.size() - w);
    for (std::size_t k = 0; k < next.size(); ++k) next[k] = std::max(prev[k], prev[k + w]);
    table.push_back(std::move(next));
  }
  auto range_max = [&](std::uint32_t a, std::uint32_t b) {
    std::size_t level = 0;
    while ((std::size_t{2} << level) <= static_cast<std::size_t>(b - a + 1)) ++level;
    return std::max(table[level][a], table[level][b + 1 - (std::size_t{1} << level)]);
  };
  std::vector<std::size_t> peak(n);
  for (std::size_t i = 0; i < n; ++i) peak[i] = range_max(c.first[i], c.last[i]);

  std::vector<std::uint32_t> base(n);
  std::iota(base.begin(), base.end(), 0u);
  const auto& ls = lifetimes_;
  auto tie = [&](std::uint32_t a, std::uint32_t b) {
    if (ls[a].first_step != ls[b].first_step) return ls[a].first_step < ls[b].first_step;
    return a < b;
  };
  struct strategy {
    const char* name;
    std::function<bool(std::uint32_t, std::uint32_t)> before;
  };
  const strategy strategies[] = {
      {"size",
       [&](std::uint32_t a, std::uint32_t b) {
         if (ls[a].bytes != ls[b].bytes) return ls[a].bytes > ls[b].bytes;
         const auto la = ls[a].last_step - ls[a].first_step;
         const auto lb = ls[b].last_step - ls[b].first_step;
         return la != lb ? la > lb : tie(a, b);
       }},
      {"breadth",
       [&](std::uint32_t a, std::uint32_t b) {
         if (peak[a] != peak[b]) return peak[a] > peak[b];
         if (ls[a].bytes != ls[b].bytes) return ls[a].bytes > ls[b].bytes;
         return tie(a, b);
       }},
      {"duration",
       [&](std::uint32_t a, std::uint32_t b) {
         const auto la = c.last[a] - c.first[a];
         const auto lb = c.last[b] - c.first[b];
         if (la != lb) return la > lb;
         if (ls[a].bytes != ls[b].bytes) return ls[a].bytes > ls[b].bytes;
         return tie(a, b);
       }},
  };
  bool have = false;
  auto consider = [&](const std::vector<std::uint32_t>& order, const std::string& name) {
    for (bool lowest : {false, true}) {
      plan p = place(ls, c, order, lowest);
      if (!have || p.arena_bytes < best.arena_bytes) {
        p.lower_bound = best.lower_bound;
        p.strategy = name + (lowest ? ", lowest fit" : ", best fit");
        best = std::move(p);
        have = true;
      }
    }
  };
  for (const strategy& s : strategies) {
    std::vector<std::uint32_t> order = base;
    std::sort(order.begin(), order.end(), s.before);
    consider(order, s.name);
    if (best.arena_bytes == best.lower_bound) return best;  // optimal
  }
  // Squeaky wheel: buffers that a plan puts above the lower bound get a higher priority,
  // and the buffers are placed again in the new order (deterministic; a budget of about
  // 4 million placements, at most 64 rounds).
  const std::size_t rounds = std::min<std::size_t>(64, std::max<std::size_t>(4, 4'000'000 / (n + 1)));
  std::vector<double> priority(n);
  for (std::size_t i = 0; i < n; ++i) priority[i] = static_cast<double>(ls[i].bytes);
  plan current = best;
  std::size_t work = 0;
  constexpr std::size_t work_budget = 40'000'000;  // overlap entries visited: deterministic, ~0.5 s
  for (std::size_t r = 0; r < rounds && best.arena_bytes > best.lower_bound && work < work_budget; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      if (ls[i].bytes > 0 && current.offsets[i] + ls[i].bytes > best.lower_bound) priority[i] *= 1.5;
    }
    std::vector<std::uint32_t> order = base;
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return priority[a] != priority[b] ? priority[a] > priority[b] : tie(a, b);
    });
    current = place(ls, c, order, false, &work);
    plan low = place(ls, c, order, true, &work);
    if (low.arena_bytes < current.arena_bytes) current = std::move(low);
    if (current.arena_bytes < best.arena_bytes) {
      best = current;
      best.lower_bound = lower_bound_bytes;
      best.strategy = "squeaky wheel round " + std::to_string(r + 1);
    }
  }
  return best;
}

std::optional<std::string> lifetime_planner::verify_plan(const plan& p) const
{
  const std::size_t n = lifetimes_.size();
  if (p.offsets.size() != n) {
    return "the plan has " + std::to_string(p.offsets.size()) + " offsets for " + std::to_string(n) + " buffers";
  }
  const std::size_t lb = lower_bound();
  if (p.arena_bytes < lb) {
    return "the arena (" + std::to_string(p.arena_bytes) + " bytes) is below the lower bound (" + std::to_string(lb) +
           " bytes alive at once)";
  }
  // Sweep over time: at each step, buffers that ended before it leave, then those that
  // begin at it enter; the live set never overlaps, so each newcomer is checked against its
  // neighbours in address order.
  struct change {
    std::uint64_t step;
    bool enter;
    std::uint32_t buffer;
  };
  std::vector<change> changes;
  changes.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const lifetime& l = lifetimes_[i];
    if (l.first_step > l.last_step) return describe(lifetimes_, i) + " ends before it begins";
    if (l.bytes == 0) continue;
    const std::size_t off = p.offsets[i];
    if (off % alignment_ != 0) {
      return describe(lifetimes_, i) + " is at offset " + std::to_string(off) + ", not a multiple of the alignment " +
             std::to_string(alignment_);
    }
    if (off > p.arena_bytes || l.bytes > p.arena_bytes - off) {
      return describe(lifetimes_, i) + " at offset " + std::to_string(off) + " ends past the arena of " +
             std::to_string(p.arena_bytes) + " bytes";
    }
    changes.push_back({l.first_step, true, static_cast<std::uint32_t>(i)});
    if (l.last_step != std::numeric_limits<std::uint64_t>::max()) {
      changes.push_back({l.last_step + 1, false, static_cast<std::uint32_t>(i)});
    }
  }
  std::sort(changes.begin(), changes.end(), [](const change& a, const change& b) {
    if (a.step != b.step) return a.step < b.step;
    if (a.enter != b.enter) return !a.enter;  // leave first
    return a.buffer < b.buffer;
  });
  std::map<std::size_t, std::uint32_t> live;  // offset -> buffer
  for (const change& ch : changes) {
    const std::size_t off = p.offsets[ch.buffer];
    if (!ch.enter) {
      live.erase(off);
      continue;
    }
    const std::size_t end = off + lifetimes_[ch.buffer].bytes;
    auto clash = [&](std::uint32_t other) {
      const std::size_t o_off = p.offsets[other];
      const std::size_t o_end = o_off + lifetimes_[other].bytes;
      return describe(lifetimes_, ch.buffer) + " and " + describe(lifetimes_, other) + " are both alive at step " +
             std::to_string(ch.step) + " and share bytes [" + std::to_string(std::max(off, o_off)) + ", " +
             std::to_string(std::min(end, o_end)) + ") of the arena";
    };
    const auto next = live.lower_bound(off);
    if (next != live.end() && next->first < end) return clash(next->second);
    if (next != live.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + lifetimes_[prev->second].bytes > off) return clash(prev->second);
    }
    live.emplace(off, ch.buffer);
  }
  return std::nullopt;
}

}  // namespace depot
