// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The readable and machine-readable views of an allocator: summary(), snapshot JSON and
// trace JSON (formats documented in README.md, "Snapshot and trace JSON").
#include <depot/hal/format_bytes.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/detail/allocator_core.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace depot {

namespace {

// The JSON views are written straight into their string, in the form nlohmann::json's
// dump() gave (keys sorted, no spaces): a document built first ended the process when host
// memory ran out, as nlohmann::json's destructor allocates (it moves nested values onto a
// heap stack) and a failure there is a throw from a noexcept function (std::terminate,
// tests/alloc_failure.cpp). Here a failure is std::bad_alloc from a string's growth.
class json_writer {
 public:
  explicit json_writer(std::string& out) noexcept : out_{out} {}
  void open(char c)
  {
    comma();
    out_ += c;
    first_ = true;
  }
  void close(char c)
  {
    out_ += c;
    first_ = false;
  }
  void key(std::string_view k)
  {
    comma();
    text(k);
    out_ += ':';
    first_ = true;  // (the value follows without a comma)
  }
  void value(std::string_view v)
  {
    comma();
    text(v);
  }
  void value(std::uint64_t v)
  {
    comma();
    out_ += std::to_string(v);
  }
  void value(std::int64_t v)
  {
    comma();
    out_ += std::to_string(v);
  }
  void value(bool v)
  {
    comma();
    out_ += v ? "true" : "false";
  }
  template <class V>
  void member(std::string_view k, V v)
  {
    key(k);
    value(v);
  }

 private:
  void comma()
  {
    if (!first_) out_ += ',';
    first_ = false;
  }
  // A JSON string, escaped as nlohmann::json escapes it.
  void text(std::string_view v)
  {
    out_ += '"';
    for (const char ch : v) {
      const auto c = static_cast<unsigned char>(ch);
      switch (ch) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\b': out_ += "\\b"; break;
        case '\f': out_ += "\\f"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += ch;
          }
      }
    }
    out_ += '"';
  }

  std::string& out_;
  bool first_ = true;
};

}  // namespace

std::string allocator_snapshot::to_json() const
{
  std::string out;
  json_writer w{out};
  w.open('{');
  w.member("device", std::string_view{device.to_string()});
  w.member("format", std::string_view{"depot.snapshot.v1"});
  w.key("segments");
  w.open('[');
  for (const segment_info& s : segments) {
    w.open('{');
    w.member("address", std::uint64_t{s.address});
    w.key("blocks");
    w.open('[');
    for (const block_info& b : s.blocks) {
      w.open('{');
      w.member("address", std::uint64_t{b.address});
      w.member("requested", std::uint64_t{b.requested});
      w.member("size", std::uint64_t{b.size});
      w.member("state", to_string(b.state));
      if (b.kept) w.member("kept", true);
      w.close('}');
    }
    w.close(']');
    w.member("capture_pool", std::uint64_t{s.capture_pool});
    w.member("exported", s.exported);
    w.member("importers", std::int64_t{s.importers});
    w.member("pool", std::string_view{s.small_pool ? "small" : "large"});
    w.member("reserved_addresses", std::uint64_t{s.reserved});
    w.member("size", std::uint64_t{s.size});
    w.member("stream", std::uint64_t{s.stream});
    w.close('}');
  }
  w.close(']');
  w.close('}');
  return out;
}

namespace detail {

std::string allocator_core::trace_json() const
{
  const std::vector<trace_event> events = trace();
  std::string out;
  json_writer w{out};
  w.open('{');
  w.member("device", std::string_view{device().to_string()});
  w.key("events");
  w.open('[');
  for (const trace_event& e : events) {
    w.open('{');
    w.member("address", std::uint64_t{e.address});
    if (e.kind == trace_kind::allocate) w.member("cache_hit", e.cache_hit);
    if (e.kind == trace_kind::segment_move) w.member("from_stream", std::uint64_t{e.from_stream});
    w.member("kind", to_string(e.kind));
    if (e.kind == trace_kind::free) w.member("lifetime_ns", std::uint64_t{e.lifetime_ns});
    w.member("requested", std::uint64_t{e.requested});
    w.member("size", std::uint64_t{e.size});
    w.member("stream", std::uint64_t{e.stream});
    w.member("thread", std::uint64_t{e.thread});
    w.member("time_ns", std::uint64_t{e.time_ns});
    w.close('}');
  }
  w.close(']');
  w.member("format", std::string_view{"depot.trace.v1"});
  w.close('}');
  return out;
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
  char line[320];
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
                "segments moved between streams %lld (events recorded for them %lld, device "
                "synchronisations %lld)\n"
                "largest free block %s, fragmentation %.3f\n",
                static_cast<long long>(s.num_cache_hits), static_cast<long long>(s.num_cache_misses),
                100.0 * s.cache_hit_rate, static_cast<long long>(s.num_alloc_retries),
                static_cast<long long>(s.num_ooms), static_cast<long long>(s.num_segments_moved),
                static_cast<long long>(s.num_move_events), static_cast<long long>(s.num_move_syncs),
                format_bytes(static_cast<std::size_t>(s.largest_free_block)).c_str(), s.fragmentation);
  out += line;
  return out;
}

}  // namespace detail

}  // namespace depot
