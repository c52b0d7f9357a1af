// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Offline arena planning from buffer lifetimes (greedy orderings after Pisarchyk & Lee 2020,
// best-fit gap search, squeaky-wheel reordering, then a time sweep under a lowering cap with
// rollouts, relocation and randomised backtracking), its verification and the reuse
// suggestions.
#include <depot/hal/expects.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/lifetime_planner.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <random>
#include <set>
#include <tuple>

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

// Which buffers overlap which in time (compressed), as CSR lists; left empty when there would be
// more than `max_entries` entries.
struct adjacency {
  std::vector<std::size_t> start;  // buffer i's neighbours: list[start[i] .. start[i + 1])
  std::vector<std::uint32_t> list;
};

adjacency build_adjacency(const std::vector<lifetime>& ls, const compressed& c, std::size_t max_entries)
{
  const std::size_t n = ls.size();
  std::vector<std::uint32_t> by_first(n);
  std::iota(by_first.begin(), by_first.end(), 0u);
  std::sort(by_first.begin(), by_first.end(), [&](std::uint32_t a, std::uint32_t b) {
    return c.first[a] != c.first[b] ? c.first[a] < c.first[b] : a < b;
  });
  // Every overlapping pair, found once from the one that begins first (or comes first);
  // visit(i, j) returns false to stop.
  const auto each_pair = [&](auto&& visit) {
    for (std::size_t p = 0; p < n; ++p) {
      const std::uint32_t i = by_first[p];
      if (ls[i].bytes == 0) continue;
      for (std::size_t q = p + 1; q < n && c.first[by_first[q]] <= c.last[i]; ++q) {
        const std::uint32_t j = by_first[q];
        if (ls[j].bytes != 0 && !visit(i, j)) return false;
      }
    }
    return true;
  };
  std::vector<std::size_t> degree(n, 0);
  std::size_t total = 0;
  const bool fits = each_pair([&](std::uint32_t i, std::uint32_t j) {
    ++degree[i];
    ++degree[j];
    total += 2;
    return total <= max_entries;
  });
  if (!fits) return {};
  adjacency a;
  a.start.assign(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) a.start[i + 1] = a.start[i] + degree[i];
  a.list.resize(total);
  std::vector<std::size_t> fill(a.start.begin(), a.start.end() - 1);
  each_pair([&](std::uint32_t i, std::uint32_t j) {
    a.list[fill[i]++] = j;
    a.list[fill[j]++] = i;
    return true;
  });
  return a;
}

// The time sweep under a cap: the buffers are placed in the order they are allocated (frees
// first at each step), each into a hole of the buffers alive then, below the cap. A position
// (either end of a hole) scores (bytes it would leave unused, in units of 6 mean buffer sizes)
// x (steps until that waste can merge: until the buffer or the neighbour across the waste is
// freed) + the distance between the buffer's free step and that of the neighbour it touches,
// both over the median lifetime; each score is multiplied by 1 + U[0, 1). While less than 16
// mean buffer sizes are free, the 8 best positions are tried by a rollout (the next 150
// events placed by the same rule, without noise) and the first that survives them all (else
// the one that lasts longest) is taken. When no hole holds a buffer, the live buffers in the
// way of one of 16 windows are moved elsewhere (each to a gap free over its whole life so
// far); else the sweep backs up a random number of checkpoints (more after repeated failures
// at the same place) and goes on with new random choices. Deterministic for a seed; `work`
// counts buffer visits. The constants were tuned on bench/traces/alloc_host_2threads.json
// (success rate and work to fit under 1.045-1.05x the lower bound, 8 seeds each).
class sweep_search {
 public:
  sweep_search(const std::vector<lifetime>& ls, const compressed& c, const adjacency& adj, std::uint64_t seed)
      : ls_{ls}, c_{c}, adj_{adj}, rng_{seed}, off_(ls.size(), 0), placed_(ls.size(), 0), moving_(ls.size(), 0),
        roff_(ls.size(), 0), rstamp_(ls.size(), 0)
  {
    std::vector<std::tuple<std::uint32_t, bool, std::uint32_t>> ev;  // (step, alloc, buffer)
    std::vector<std::uint32_t> lives;
    double total = 0;
    std::size_t count = 0;
    for (std::size_t i = 0; i < ls.size(); ++i) {
      if (ls[i].bytes == 0) continue;
      ev.emplace_back(c.first[i], true, static_cast<std::uint32_t>(i));
      ev.emplace_back(c.last[i] + 1, false, static_cast<std::uint32_t>(i));
      lives.push_back(c.last[i] - c.first[i] + 1);
      total += static_cast<double>(ls[i].bytes);
      ++count;
    }
    std::sort(ev.begin(), ev.end());  // at a step: frees (false) before allocations
    events_.reserve(ev.size());
    std::uint64_t alive = 0;
    for (const auto& [step, alloc, i] : ev) {
      events_.push_back({i, alloc});
      if (alloc) {
        plain_sweep_ += alive + 1;
        ++alive;
      } else {
        --alive;
      }
    }
    if (count > 0) {
      std::nth_element(lives.begin(), lives.begin() + static_cast<std::ptrdiff_t>(lives.size() / 2), lives.end());
      time_scale_ = std::max(1.0, static_cast<double>(lives[lives.size() / 2]));
      const double mean = total / static_cast<double>(count);
      byte_scale_ = 1.0 / std::max(1.0, 6 * mean);
      lookahead_below_ = static_cast<std::size_t>(16 * mean);
    }
    fails_.assign(events_.size() / checkpoint_every + 2, 0);
  }

  // Places every buffer below `cap`; false when `work_limit` (a total) or the deadline comes first.
  // `hint`: offsets of a plan under a larger cap; the sweep follows them until one ends above
  // `cap` (or the first failure) and searches from there.
  bool solve(std::size_t cap, std::uint64_t work_limit, std::chrono::steady_clock::time_point deadline,
             const std::vector<std::size_t>* hint = nullptr)
  {
    cap_ = cap;
    std::size_t hint_until = hint != nullptr ? events_.size() : 0;
    std::fill(placed_.begin(), placed_.end(), 0);
    std::fill(fails_.begin(), fails_.end(), 0);
    journal_.clear();
    live_.clear();
    for (auto& ck : checkpoints_) ck.index = std::numeric_limits<std::size_t>::max();
    std::size_t e = 0;
    std::size_t steps = 0;
    while (e < events_.size()) {
      if (work_ > work_limit) return false;
      if ((++steps & 255) == 0 && deadline != std::chrono::steady_clock::time_point::max() &&
          std::chrono::steady_clock::now() > deadline) {
        return false;
      }
      if (e % checkpoint_every == 0) {
        checkpoint& ck = checkpoints_[(e / checkpoint_every) % ring];
        ck.index = e / checkpoint_every;
        ck.live = live_;
        work_ += live_.size();
      }
      const event& x = events_[e];
      pos_ = e;
      bool ok = true;
      if (!x.alloc) {
        erase_live(x.buffer);
      } else if (e < hint_until && follow(x.buffer, (*hint)[x.buffer])) {
        ok = true;
      } else {
        hint_until = std::min(hint_until, e);
        ok = allocate(x.buffer) || relocate_for(x.buffer, e);
      }
      if (ok) {
        ++e;
        continue;
      }
      // Back up 1 + a random number of checkpoints, up to 61 after many failures here.
      const std::size_t at = e / checkpoint_every;
      const std::size_t f = ++fails_[at];
      const std::size_t back = 1 + rng_() % (1 + std::min<std::size_t>(f / 4, ring - 4));
      std::size_t to = at >= back ? at - back : 0;
      if (checkpoints_[to % ring].index != to) to = 0;
      const std::size_t from = to * checkpoint_every;
      hint_until = std::min(hint_until, from);
      for (std::size_t q = from; q <= e && q < events_.size(); ++q) {
        if (events_[q].alloc) placed_[events_[q].buffer] = 0;
      }
      while (!journal_.empty() && journal_.back().event >= from) {
        off_[journal_.back().buffer] = journal_.back().offset;
        journal_.pop_back();
      }
      if (to == 0 && checkpoints_[0].index != 0) {
        live_.clear();
      } else {
        live_ = checkpoints_[to % ring].live;
      }
      for (const auto& [o, j] : live_) off_[j] = o;
      work_ += live_.size() + (e - from);
      e = from;
    }
    return true;
  }

  [[nodiscard]] const std::vector<std::size_t>& offsets() const noexcept { return off_; }
  [[nodiscard]] std::uint64_t work() const noexcept { return work_; }
  // The work of one sweep with no rollouts and no failures: what "small" means for this input.
  [[nodiscard]] std::uint64_t plain_sweep() const noexcept { return plain_sweep_; }

 private:
  static constexpr std::size_t checkpoint_every = 8;  // events
  static constexpr std::size_t ring = 64;             // checkpoints kept
  static constexpr int horizon = 150;                  // events a rollout looks ahead
  static constexpr std::size_t rollouts = 8;           // candidates tried by rollout, best scored first
  static constexpr std::size_t relocation_windows = 16;  // windows tried when nothing fits
  static constexpr double noise = 1.0;                 // scores are multiplied by 1 + noise * U[0, 1)

  struct event {
    std::uint32_t buffer;
    bool alloc;
  };
  using entry = std::pair<std::size_t, std::uint32_t>;  // (offset, buffer), live sorted by offset
  struct checkpoint {
    std::size_t index = std::numeric_limits<std::size_t>::max();
    std::vector<entry> live;
  };
  struct moved {
    std::size_t event;
    std::uint32_t buffer;
    std::size_t offset;  // before the move
  };

  std::size_t size(std::uint32_t i) const { return ls_[i].bytes; }
  double death(std::uint32_t i) const { return static_cast<double>(c_.last[i]); }

  void insert_live(std::vector<entry>& l, std::size_t o, std::uint32_t i)
  {
    l.insert(std::lower_bound(l.begin(), l.end(), entry{o, i}), entry{o, i});
  }
  void erase_live(std::uint32_t i)
  {
    const auto it = std::lower_bound(live_.begin(), live_.end(), entry{off_[i], i});
    if (it != live_.end() && it->second == i) live_.erase(it);
  }

  // Scores the candidate positions for buffer i among `l` (now = i's first step). With
  // `all`, every candidate goes to cands_ (randomised); else the best one is returned.
  template <bool all>
  std::size_t candidates(const std::vector<entry>& l, std::uint32_t i)
  {
    const std::size_t s = size(i);
    const double di = death(i);
    const double now = static_cast<double>(c_.first[i]);
    double best_score = std::numeric_limits<double>::max();
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t prev_end = 0;
    std::int64_t prev = -1;
    const std::size_t n = l.size();
    work_ += n + 1;
    if constexpr (all) cands_.clear();
    auto consider = [&](double score, std::size_t o) {
      if constexpr (all) {
        score *= 1 + noise * static_cast<double>(rng_() % 1000) / 1000.0;
        cands_.emplace_back(score, o);
      } else {
        if (score < best_score) {
          best_score = score;
          best = o;
        }
      }
    };
    for (std::size_t k = 0; k <= n; ++k) {
      const std::size_t hs = prev_end;
      const std::size_t he = k < n ? l[k].first : cap_;
      if (he >= hs && he - hs >= s) {
        const std::int64_t next = k < n ? static_cast<std::int64_t>(l[k].second) : -1;
        const double waste = static_cast<double>(he - hs - s) * byte_scale_;
        const double dp = prev < 0 ? 1e18 : death(static_cast<std::uint32_t>(prev));
        const double dn = next < 0 ? 1e18 : death(static_cast<std::uint32_t>(next));
        // low end: touches `prev`, the waste lies against `next`
        consider(waste * (std::min(di, dn) - now) / time_scale_ + (prev < 0 ? 0.0 : std::abs(dp - di)) / time_scale_,
                 hs);
        if (he - hs > s) {
          consider(waste * (std::min(di, dp) - now) / time_scale_ + (next < 0 ? 0.0 : std::abs(dn - di)) / time_scale_,
                   he - s);
        }
      }
      if (k < n) {
        const std::size_t end = l[k].first + size(l[k].second);
        if (end >= prev_end) {
          prev_end = end;
          prev = l[k].second;
        }
      }
    }
    return best;
  }

  std::size_t free_bytes() const
  {
    std::size_t used = 0;
    for (const auto& [o, j] : live_) used += size(j);
    return cap_ > used ? cap_ - used : 0;
  }

  // Events survived (up to horizon + 1) after placing i at o, the next allocations placed by
  // the rule without noise.
  int rollout(std::uint32_t i, std::size_t o)
  {
    ++stamp_;
    roll_ = live_;
    work_ += roll_.size();
    insert_live(roll_, o, i);
    roff_[i] = o;
    rstamp_[i] = stamp_;
    int q = 1;
    for (; q <= horizon && pos_ + static_cast<std::size_t>(q) < events_.size(); ++q) {
      const event& x = events_[pos_ + static_cast<std::size_t>(q)];
      if (!x.alloc) {
        const std::size_t xo = rstamp_[x.buffer] == stamp_ ? roff_[x.buffer] : off_[x.buffer];
        const auto it = std::lower_bound(roll_.begin(), roll_.end(), entry{xo, x.buffer});
        if (it != roll_.end() && it->second == x.buffer) roll_.erase(it);
        continue;
      }
      const std::size_t bo = candidates<false>(roll_, x.buffer);
      if (bo == std::numeric_limits<std::size_t>::max()) break;
      insert_live(roll_, bo, x.buffer);
      roff_[x.buffer] = bo;
      rstamp_[x.buffer] = stamp_;
    }
    return pos_ + static_cast<std::size_t>(q) >= events_.size() ? horizon + 1 : q;
  }

  // Places i at o if that lies below the cap and clear of the live buffers.
  bool follow(std::uint32_t i, std::size_t o)
  {
    const std::size_t s = size(i);
    if (o > cap_ || cap_ - o < s) return false;
    const auto it = std::lower_bound(live_.begin(), live_.end(), entry{o, i});
    if (it != live_.end() && it->first < o + s) return false;
    if (it != live_.begin() && std::prev(it)->first + size(std::prev(it)->second) > o) return false;
    work_ += 1;
    off_[i] = o;
    placed_[i] = 1;
    live_.insert(it, entry{o, i});
    return true;
  }

  bool allocate(std::uint32_t i)
  {
    candidates<true>(live_, i);
    if (cands_.empty()) return false;
    std::size_t chosen = 0;
    if (free_bytes() < lookahead_below_) {
      std::sort(cands_.begin(), cands_.end());
      int longest = -1;
      const std::vector<std::pair<double, std::size_t>> tried = cands_;
      for (std::size_t m = 0; m < std::min(rollouts, tried.size()); ++m) {
        const int r = rollout(i, tried[m].second);
        if (r > longest) {
          longest = r;
          chosen = tried[m].second;
        }
        if (r > horizon) break;
      }
    } else {
      chosen = std::min_element(cands_.begin(), cands_.end())->second;
    }
    off_[i] = chosen;
    placed_[i] = 1;
    insert_live(live_, chosen, i);
    return true;
  }

  // The best-fitting gap below the cap for j over its whole life, among the placed buffers
  // that overlap it (but those being moved) and [xo, xe); max() if none.
  std::size_t gap_for(std::uint32_t j, std::size_t xo, std::size_t xe)
  {
    busy_.clear();
    for (std::size_t k = adj_.start[j]; k < adj_.start[j + 1]; ++k) {
      const std::uint32_t o = adj_.list[k];
      if (placed_[o] && !moving_[o]) busy_.emplace_back(off_[o], off_[o] + size(o));
    }
    work_ += adj_.start[j + 1] - adj_.start[j];
    busy_.emplace_back(xo, xe);
    std::sort(busy_.begin(), busy_.end());
    const std::size_t s = size(j);
    std::size_t best = std::numeric_limits<std::size_t>::max();
    std::size_t best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t top = 0;
    for (const auto& [o, e] : busy_) {
      if (o > top && o - top >= s && o - top < best_gap) {
        best_gap = o - top;
        best = top;
      }
      top = std::max(top, e);
    }
    if (top <= cap_ && cap_ - top >= s && cap_ - top < best_gap) best = top;
    return best;
  }

  // No hole holds buffer b: clears a window for it by moving the live buffers in the way.
  bool relocate_for(std::uint32_t b, std::size_t e)
  {
    if (adj_.start.empty()) return false;
    const std::size_t s = size(b);
    if (s > cap_) return false;
    std::vector<std::size_t> starts{0, cap_ - s};
    for (const auto& [o, j] : live_) {
      if (o + size(j) + s <= cap_) starts.push_back(o + size(j));
      if (o >= s) starts.push_back(o - s);
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    std::vector<std::pair<double, std::size_t>> windows;  // bytes in the way, randomised
    for (std::size_t o : starts) {
      double in_way = 0;
      for (const auto& [lo, j] : live_) {
        if (lo >= o + s) break;
        if (lo + size(j) > o) in_way += static_cast<double>(size(j));
      }
      windows.emplace_back(in_way * (1 + 0.2 * static_cast<double>(rng_() % 1000) / 1000.0), o);
    }
    work_ += starts.size() * (live_.size() / 2 + 1);
    std::sort(windows.begin(), windows.end());
    std::vector<std::uint32_t> way;
    std::vector<std::pair<std::uint32_t, std::size_t>> done;
    for (std::size_t w = 0; w < std::min(relocation_windows, windows.size()); ++w) {
      const std::size_t o = windows[w].second;
      way.clear();
      for (const auto& [lo, j] : live_) {
        if (lo >= o + s) break;
        if (lo + size(j) > o) way.push_back(j);
      }
      std::sort(way.begin(), way.end(), [&](std::uint32_t a, std::uint32_t c) {
        return size(a) != size(c) ? size(a) > size(c) : a < c;
      });
      for (std::uint32_t j : way) moving_[j] = 1;
      done.clear();
      bool ok = true;
      for (std::uint32_t j : way) {
        const std::size_t to = gap_for(j, o, o + s);
        if (to == std::numeric_limits<std::size_t>::max()) {
          ok = false;
          break;
        }
        done.emplace_back(j, off_[j]);
        off_[j] = to;
        moving_[j] = 0;
      }
      if (!ok) {
        for (const auto& [j, old] : done) off_[j] = old;
        for (std::uint32_t j : way) moving_[j] = 0;
        continue;
      }
      for (const auto& [j, old] : done) {
        const std::size_t to = off_[j];
        off_[j] = old;
        erase_live(j);
        off_[j] = to;
        insert_live(live_, to, j);
        journal_.push_back({e, j, old});
      }
      off_[b] = o;
      placed_[b] = 1;
      insert_live(live_, o, b);
      return true;
    }
    return false;
  }

  const std::vector<lifetime>& ls_;
  const compressed& c_;
  const adjacency& adj_;
  std::mt19937_64 rng_;
  std::vector<event> events_;
  std::vector<std::size_t> off_;
  std::vector<char> placed_;
  std::vector<char> moving_;
  std::vector<std::size_t> roff_;
  std::vector<std::uint64_t> rstamp_;
  std::uint64_t stamp_ = 0;
  std::vector<entry> live_;
  std::vector<entry> roll_;
  std::vector<std::pair<double, std::size_t>> cands_;
  std::vector<std::pair<std::size_t, std::size_t>> busy_;
  std::vector<moved> journal_;
  std::array<checkpoint, ring> checkpoints_{};
  std::vector<std::uint32_t> fails_;
  std::size_t cap_ = 0;
  std::size_t pos_ = 0;
  double time_scale_ = 1;
  double byte_scale_ = 1;
  std::size_t lookahead_below_ = 0;
  std::uint64_t work_ = 0;
  std::uint64_t plain_sweep_ = 0;
};

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
      case trace_kind::segment_free:
      case trace_kind::segment_map:
      case trace_kind::segment_unmap:
      case trace_kind::segment_move: break;
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

lifetime_planner::plan lifetime_planner::compute_reuse_plan() const { return compute_reuse_plan(plan_options{}); }

lifetime_planner::plan lifetime_planner::compute_reuse_plan(const plan_options& options) const
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
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = options.time_limit_seconds > 0
                            ? start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(options.time_limit_seconds))
                            : std::chrono::steady_clock::time_point::max();
  auto out_of_time = [&] {
    return deadline != std::chrono::steady_clock::time_point::max() && std::chrono::steady_clock::now() > deadline;
  };
  const std::uint64_t budget = options.work_budget;
  // Squeaky wheel: buffers that a plan puts above the lower bound get a higher priority,
  // and the buffers are placed again in the new order (deterministic; at most a third of
  // the budget, each overlap entry visited counting 8, at most 64 rounds).
  const std::size_t rounds = std::min<std::size_t>(64, std::max<std::size_t>(4, 4'000'000 / (n + 1)));
  std::vector<double> priority(n);
  for (std::size_t i = 0; i < n; ++i) priority[i] = static_cast<double>(ls[i].bytes);
  plan current = best;
  std::size_t visits = 0;
  constexpr std::uint64_t visit_cost = 8;  // an overlap entry gathered, sorted and swept
  for (std::size_t r = 0;
       r < rounds && best.arena_bytes > best.lower_bound && visit_cost * visits < budget / 2 && !out_of_time(); ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      if (ls[i].bytes > 0 && current.offsets[i] + ls[i].bytes > best.lower_bound) priority[i] *= 1.5;
    }
    std::vector<std::uint32_t> order = base;
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return priority[a] != priority[b] ? priority[a] > priority[b] : tie(a, b);
    });
    current = place(ls, c, order, false, &visits);
    plan low = place(ls, c, order, true, &visits);
    if (low.arena_bytes < current.arena_bytes) current = std::move(low);
    if (current.arena_bytes < best.arena_bytes) {
      best = current;
      best.lower_bound = lower_bound_bytes;
      best.strategy = "squeaky wheel round " + std::to_string(r + 1);
    }
  }
  std::uint64_t work = visit_cost * visits;
  best.work = work;
  if (best.arena_bytes == best.lower_bound || work >= budget || out_of_time()) return best;

  // Time sweep under a cap, lowered while it succeeds. Each cap lies 3/4 of the way from the
  // floor (at first the lower bound) up to the best arena. The first sweep starts from
  // scratch with half of what is left of the budget; once one has succeeded, the next
  // follows its offsets up to where they break the new cap (cheap while it works), with a
  // quarter. Once such a guided try fails, the sweeps start from scratch again, half of what
  // is left each, and the cap comes down in steps of 1/400 of the lower bound (or halfway to
  // the floor, whichever is higher); a failed cap becomes the floor. Failing is no proof: a
  // cap at or below the floor may still be feasible.
  const adjacency adj = build_adjacency(ls, c, std::size_t{8} << 20);  // relocation needs it; skipped above 32 MiB
  work += adj.list.size();
  sweep_search sweep{ls, c, adj, options.seed};
  std::size_t floor = lower_bound_bytes - 1;  // caps at or below it have failed (or are below the bound)
  // Small inputs need far less: a try spends at most 4 000 plain sweeps, all tries 20 000.
  const std::uint64_t sweep_budget =
      std::min<std::uint64_t>(budget, work + std::max<std::uint64_t>(1, sweep.plain_sweep()) * 20000);
  const std::uint64_t try_limit = std::max<std::uint64_t>(1, sweep.plain_sweep()) * 4000;
  int tries = 0;
  bool from_sweep = false;  // the best plan came from a sweep (its offsets can guide the next)
  bool fine = false;        // a guided try has failed: small steps from scratch
  while (!out_of_time()) {
    const std::uint64_t spent = work + sweep.work();
    if (spent >= sweep_budget) break;
    const std::size_t room = best.arena_bytes - floor;
    std::size_t cap = 0;
    if (fine) {
      const std::size_t step = std::max<std::size_t>(alignment_, lower_bound_bytes / 400);
      cap = std::max(floor + room / 2, best.arena_bytes > step ? best.arena_bytes - step : 0);
    } else {
      cap = floor + room / 4 * 3 + room % 4 * 3 / 4;
    }
    cap -= cap % alignment_;
    if (cap <= floor) cap = (floor + room / 2) / alignment_ * alignment_;
    if (cap <= floor || cap >= best.arena_bytes) break;
    ++tries;
    const bool guided = from_sweep && !fine;
    const std::uint64_t slice = std::min(try_limit, (sweep_budget - spent) / (guided ? 4 : 2));
    if (sweep.solve(cap, sweep.work() + slice, deadline, guided ? &best.offsets : nullptr)) {
      plan p;
      p.offsets.assign(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        if (ls[i].bytes == 0) continue;
        p.offsets[i] = sweep.offsets()[i];
        p.arena_bytes = std::max(p.arena_bytes, p.offsets[i] + ls[i].bytes);
      }
      p.lower_bound = lower_bound_bytes;
      p.strategy = "time sweep under a cap of " + std::to_string(cap) + " bytes, try " + std::to_string(tries);
      best = std::move(p);
      from_sweep = true;
    } else if (guided) {
      fine = true;
    } else {
      floor = cap;
    }
  }
  best.work = work + sweep.work();
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
