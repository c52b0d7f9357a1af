// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The readable and machine-readable views of an allocator: summary(), snapshot JSON and
// trace JSON (formats documented in README.md, "Snapshot and trace JSON").
#include <depot/hal/format_bytes.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/detail/allocator_core.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace depot {

namespace {

std::string_view state_name(block_state s)
{
  switch (s) {
    case block_state::allocated: return "allocated";
    case block_state::pending_free: return "pending_free";
    case block_state::free: return "free";
    case block_state::unmapped: return "unmapped";
  }
  return "unknown";
}

}  // namespace

std::string allocator_snapshot::to_json() const
{
  nlohmann::json segs = nlohmann::json::array();
  for (const segment_info& s : segments) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const block_info& b : s.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested", b.requested},
                        {"state", state_name(b.state)}});
    }
    segs.push_back({{"address", s.address},
                    {"size", s.size},
                    {"pool", s.small_pool ? "small" : "large"},
                    {"stream", s.stream},
                    {"exported", s.exported},
                    {"importers", s.importers},
                    {"capture_pool", s.capture_pool},
                    {"reserved_addresses", s.reserved},
                    {"blocks", std::move(blocks)}});
  }
  return nlohmann::json{{"format", "depot.snapshot.v1"}, {"device", device.to_string()}, {"segments", segs}}
      .dump();
}

namespace detail {

std::string allocator_core::trace_json() const
{
  nlohmann::json events = nlohmann::json::array();
  for (const trace_event& e : trace()) {
    nlohmann::json j{{"kind", to_string(e.kind)}, {"time_ns", e.time_ns}, {"address", e.address},
                     {"size", e.size},          {"requested", e.requested}, {"stream", e.stream},
                     {"thread", e.thread}};
    if (e.kind == trace_kind::allocate) j["cache_hit"] = e.cache_hit;
    if (e.kind == trace_kind::free) j["lifetime_ns"] = e.lifetime_ns;
    events.push_back(std::move(j));
  }
  return nlohmann::json{{"format", "depot.trace.v1"}, {"device", device().to_string()}, {"events", events}}
      .dump();
}

std::string allocator_core::summary() const
{
  const memory_stats s = stats();
  std::string out = "depot caching allocator " + device().to_string();
  const std::string conf = config().to_string();
  out += conf.empty() ? " (default settings)\n" : " (" + conf + ")\n";
  if (config().expandable_segments) {
    out += expandable_page() != 0
               ? "expandable segments: large blocks map " + format_bytes(expandable_page()) +
                     " pages into one address range per stream\n"
               : "expandable segments: not available (this upstream cannot map memory into reserved "
                 "addresses): ordinary segments\n";
    // The ranges now: mapped bytes, and the holes (pages unmapped inside) among them.
    std::size_t ranges = 0, mapped = 0, holes = 0, unmapped = 0;
    for (const segment_info& seg : snapshot().segments) {
      if (seg.reserved == 0) continue;
      ++ranges;
      mapped += seg.size;
      for (const block_info& b : seg.blocks) {
        if (b.state != block_state::unmapped) continue;
        ++holes;
        unmapped += b.size;
      }
    }
    if (ranges != 0) {
      out += "  " + std::to_string(ranges) + (ranges == 1 ? " range, " : " ranges, ") + format_bytes(mapped) +
             " mapped; " + std::to_string(holes) + (holes == 1 ? " hole" : " holes") + " of " +
             format_bytes(unmapped) + " unmapped inside\n";
    }
  }
  char line[160];
  std::snprintf(line, sizeof line, "%-22s %-6s %12s %12s %12s %12s\n", "", "pool", "current", "peak",
                "allocated", "freed");
  out += line;
  auto bytes_row = [&](const char* name, const stat_array& a) {
    const char* pools[] = {"all", "small", "large"};
    const stat* st[] = {&a.all, &a.small, &a.large};
    for (int i = 0; i < 3; ++i) {
      std::snprintf(line, sizeof line, "%-22s %-6s %12s %12s %12s %12s\n", i == 0 ? name : "", pools[i],
                    format_bytes(static_cast<std::size_t>(st[i]->current)).c_str(),
                    format_bytes(static_cast<std::size_t>(st[i]->peak)).c_str(),
                    format_bytes(static_cast<std::size_t>(st[i]->allocated)).c_str(),
                    format_bytes(static_cast<std::size_t>(st[i]->freed)).c_str());
      out += line;
    }
  };
  auto count_row = [&](const char* name, const stat_array& a) {
    std::snprintf(line, sizeof line, "%-22s %-6s %12lld %12lld %12lld %12lld\n", name, "all",
                  static_cast<long long>(a.all.current), static_cast<long long>(a.all.peak),
                  static_cast<long long>(a.all.allocated), static_cast<long long>(a.all.freed));
    out += line;
  };
  bytes_row("allocated bytes", s.allocated_bytes);
  bytes_row("requested bytes", s.requested_bytes);
  bytes_row("reserved bytes", s.reserved_bytes);
  bytes_row("cached bytes", s.cached_bytes);
  bytes_row("active bytes", s.active_bytes);
  bytes_row("inactive split bytes", s.inactive_split_bytes);
  count_row("allocations", s.num_allocations);
  count_row("segments", s.num_segments);
  std::snprintf(line, sizeof line,
                "cache hits %lld, misses %lld (hit rate %.1f%%); alloc retries %lld, OOMs %lld\n"
                "largest free block %s, fragmentation %.3f\n",
                static_cast<long long>(s.num_cache_hits), static_cast<long long>(s.num_cache_misses),
                100.0 * s.cache_hit_rate, static_cast<long long>(s.num_alloc_retries),
                static_cast<long long>(s.num_ooms),
                format_bytes(static_cast<std::size_t>(s.largest_free_block)).c_str(), s.fragmentation);
  out += line;
  return out;
}

}  // namespace detail

}  // namespace depot
