// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/allocator_config.hpp>

#include <bit>
#include <charconv>
#include <cstdlib>
#include <string>

namespace depot {

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr auto unlimited = std::numeric_limits<std::size_t>::max();

[[noreturn]] void bad(std::string_view key, std::string_view value, std::string_view range)
{
  throw invalid_argument("depot: DEPOT_ALLOC_CONF: bad value '" + std::string{value} +
                         "' for " + std::string{key} + ": expected " + std::string{range});
}

unsigned long long parse_unsigned(std::string_view key, std::string_view value,
                                  std::string_view range)
{
  unsigned long long out = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (value.empty() || ec != std::errc{} || end != value.data() + value.size()) {
    bad(key, value, range);
  }
  return out;
}

// "1048576", "512KiB", "64MiB", "2GiB" (binary units; "KB"/"MB"/"GB" are refused as ambiguous).
bool parse_bool(std::string_view key, std::string_view value)
{
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  bad(key, value, "true or false (also True/False, 1/0)");
}

std::size_t parse_bytes(std::string_view key, std::string_view value, std::string_view range)
{
  std::size_t split = 0;
  while (split < value.size() && value[split] >= '0' && value[split] <= '9') ++split;
  const std::string_view digits = value.substr(0, split);
  const std::string_view unit = value.substr(split);
  const auto n = parse_unsigned(key, digits, range);
  unsigned shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "KiB") {
    shift = 10;
  } else if (unit == "MiB") {
    shift = 20;
  } else if (unit == "GiB") {
    shift = 30;
  } else if (unit == "TiB") {
    shift = 40;
  } else {
    bad(key, value, range);
  }
  if (n > ((1ULL << 50) >> shift)) bad(key, value, range);
  return static_cast<std::size_t>(n) << shift;
}

double parse_double(std::string_view key, std::string_view value, std::string_view range)
{
  const std::string text{value};
  char* end = nullptr;
  const double out = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || out != out) bad(key, value, range);
  return out;
}

std::string_view trim(std::string_view s)
{
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

constexpr std::size_t max_bound = std::size_t{1} << 50;

bool divisions_ok(unsigned long long v) { return v <= 64 && (v == 0 || std::has_single_bit(v)); }
bool bound_ok(std::size_t v) { return v >= mib && v <= max_bound && std::has_single_bit(v); }

// The position of the first ',' of `text` outside brackets (a list value holds commas).
std::size_t item_end(std::string_view text)
{
  int depth = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']') --depth;
    if (text[i] == ',' && depth <= 0) return i;
  }
  return std::string_view::npos;
}

// roundup_power2_divisions:[256:1,512:2,>:8] (bounds: a plain number is MiB, as PyTorch's).
std::vector<allocator_config::roundup_interval> parse_intervals(std::string_view key, std::string_view value)
{
  const auto wrong = [&](std::string_view entry, std::string_view why) {
    bad(key, value,
        "a list [bound:N,...,>:N]" + (entry.empty() ? std::string{} : ", and in '" + std::string{entry} + "' ") +
            std::string{why});
  };
  if (value.size() < 2 || value.back() != ']') wrong({}, "(brackets around the intervals)");
  std::string_view body = value.substr(1, value.size() - 2);
  std::vector<allocator_config::roundup_interval> out;
  while (true) {
    const auto comma = body.find(',');
    const std::string_view entry = trim(body.substr(0, comma));
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos) wrong(entry, "an interval is bound:N");
    const std::string_view bound = trim(entry.substr(0, colon));
    const std::string_view n = trim(entry.substr(colon + 1));
    if (!out.empty() && out.back().up_to == unlimited) wrong(entry, "'>' (all larger) must be the last interval");
    allocator_config::roundup_interval iv;
    if (bound == ">") {
      iv.up_to = unlimited;
    } else {
      const bool mib_count = !bound.empty() && bound.find_first_not_of("0123456789") == std::string_view::npos;
      constexpr std::string_view range = "the bound is a power of two in [1MiB, 2^50 bytes] (a plain number: MiB)";
      const auto unit = mib_count ? parse_unsigned(key, bound, range) : parse_bytes(key, bound, range);
      if (mib_count && unit > (max_bound >> 20)) wrong(entry, range);
      iv.up_to = static_cast<std::size_t>(unit) * (mib_count ? mib : 1);
      if (!bound_ok(iv.up_to)) wrong(entry, range);
      if (!out.empty() && iv.up_to <= out.back().up_to) wrong(entry, "the bounds must increase");
    }
    const auto d = parse_unsigned(key, n, "N is 0 or a power of two in [1, 64]");
    if (!divisions_ok(d)) wrong(entry, "N is 0 or a power of two in [1, 64]");
    iv.divisions = static_cast<unsigned>(d);
    out.push_back(iv);
    if (comma == std::string_view::npos) break;
    body = body.substr(comma + 1);
  }
  return out;
}

}  // namespace

allocator_config allocator_config::parse(std::string_view text)
{
  allocator_config c;
  while (!text.empty()) {
    const auto comma = item_end(text);
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw invalid_argument("depot: DEPOT_ALLOC_CONF: '" + std::string{item} +
                             "' is not key:value");
    }
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = trim(item.substr(colon + 1));
    if (key == "max_split_size_mb") {
      constexpr std::string_view range = "an integer number of MiB in [1, 2^40]";
      const auto v = parse_unsigned(key, value, range);
      if (v < 1 || v > (1ULL << 40)) bad(key, value, range);
      c.max_split_size = static_cast<std::size_t>(v) * mib;
    } else if (key == "max_split_size") {
      constexpr std::string_view range = "a size in [1MiB, 2^50 bytes], e.g. 512MiB";
      const auto v = parse_bytes(key, value, range);
      if (v < mib) bad(key, value, range);
      c.max_split_size = v;
    } else if (key == "max_non_split_rounding") {
      c.max_non_split_rounding = parse_bytes(key, value, "a size in [0, 1TiB], e.g. 64MiB");
      if (c.max_non_split_rounding > (std::size_t{1} << 40)) bad(key, value, "a size in [0, 1TiB], e.g. 64MiB");
    } else if (key == "max_non_split_rounding_mb") {
      constexpr std::string_view range = "an integer number of MiB in [0, 2^20]";
      const auto v = parse_unsigned(key, value, range);
      if (v > (1ULL << 20)) bad(key, value, range);
      c.max_non_split_rounding = static_cast<std::size_t>(v) * mib;
    } else if (key == "steal_threshold") {
      c.steal_threshold = value == "unlimited" ? unlimited
                                               : parse_bytes(key, value, "a size in [0, 2^50 bytes] or unlimited, e.g. 4GiB");
    } else if (key == "steal_threshold_mb") {
      constexpr std::string_view range = "an integer number of MiB in [0, 2^30]";
      const auto v = parse_unsigned(key, value, range);
      if (v > (1ULL << 30)) bad(key, value, range);
      c.steal_threshold = static_cast<std::size_t>(v) * mib;
    } else if (key == "release_threshold") {
      c.release_threshold = parse_bytes(key, value, "a size in [0, 2^50 bytes], e.g. 1GiB");
    } else if (key == "roundup_power2_divisions" && !value.empty() && value.front() == '[') {
      c.roundup_power2_intervals = parse_intervals(key, value);
      c.roundup_power2_divisions = 0;
    } else if (key == "roundup_power2_divisions") {
      constexpr std::string_view range = "0 or a power of two in [1, 64], or a list [256:1,512:2,>:4]";
      const auto v = parse_unsigned(key, value, range);
      if (!divisions_ok(v)) bad(key, value, range);
      c.roundup_power2_divisions = static_cast<unsigned>(v);
      c.roundup_power2_intervals.clear();
    } else if (key == "garbage_collection_threshold") {
      constexpr std::string_view range = "a fraction in (0, 1), or 0 for off";
      const double v = parse_double(key, value, range);
      if (v < 0.0 || v >= 1.0) bad(key, value, range);
      c.garbage_collection_threshold = v;
    } else if (key == "release_threshold_mb") {
      constexpr std::string_view range = "an integer number of MiB in [0, 2^40]";
      const auto v = parse_unsigned(key, value, range);
      if (v > (1ULL << 40)) bad(key, value, range);
      c.release_threshold = static_cast<std::size_t>(v) * mib;
    } else if (key == "per_process_memory_fraction") {
      constexpr std::string_view range = "a fraction in (0, 1]";
      const double v = parse_double(key, value, range);
      if (v <= 0.0 || v > 1.0) bad(key, value, range);
      c.per_process_memory_fraction = v;
    } else if (key == "trace_capacity") {
      constexpr std::string_view range = "a number of events in [0, 2^26]";
      const auto v = parse_unsigned(key, value, range);
      if (v > (1ULL << 26)) bad(key, value, range);
      c.trace_capacity = static_cast<std::size_t>(v);
    } else if (key == "stats_batch") {
      constexpr std::string_view range = "a size in [0, 1TiB], e.g. 16MiB";
      const auto v = parse_bytes(key, value, range);
      if (v > (std::size_t{1} << 40)) bad(key, value, range);
      c.stats_batch = v;
    } else if (key == "small_reuse_bytes") {
      constexpr std::string_view range = "a size in [0, 64MiB], e.g. 1MiB";
      const auto v = parse_bytes(key, value, range);
      if (v > (std::size_t{64} << 20)) bad(key, value, range);
      c.small_reuse_bytes = v;
    } else if (key == "expandable_segments") {
      c.expandable_segments = parse_bool(key, value);
    } else if (key == "biased_locks") {
      c.biased_locks = parse_bool(key, value);
    } else if (key == "null_stream_per_thread") {
      c.null_stream_per_thread = parse_bool(key, value);
    } else {
      throw invalid_argument(
          "depot: DEPOT_ALLOC_CONF: unknown key '" + std::string{key} +
          "'; known keys: max_split_size (or max_split_size_mb), max_non_split_rounding (or "
          "max_non_split_rounding_mb), roundup_power2_divisions, "
          "garbage_collection_threshold, release_threshold (or release_threshold_mb), steal_threshold (or "
          "steal_threshold_mb), "
          "per_process_memory_fraction, trace_capacity, stats_batch, small_reuse_bytes, expandable_segments, biased_locks, null_stream_per_thread");
    }
  }
  c.validate();
  return c;
}

void allocator_config::validate() const
{
  const auto fail = [](std::string_view field, const std::string& value, std::string_view range) {
    throw invalid_argument("depot: allocator_config: " + std::string{field} + " is " + value + "; expected " +
                           std::string{range});
  };
  if (max_split_size < mib) {
    fail("max_split_size", std::to_string(max_split_size) + " bytes",
         "at least 1 MiB (1048576 bytes), or SIZE_MAX for no limit");
  }
  if (max_non_split_rounding > (std::size_t{1} << 40)) {
    fail("max_non_split_rounding", std::to_string(max_non_split_rounding) + " bytes", "a size in [0, 1 TiB]");
  }
  if (!divisions_ok(roundup_power2_divisions)) {
    fail("roundup_power2_divisions", std::to_string(roundup_power2_divisions), "0 or a power of two in [1, 64]");
  }
  for (std::size_t i = 0; i < roundup_power2_intervals.size(); ++i) {
    const roundup_interval& iv = roundup_power2_intervals[i];
    const std::string field = "roundup_power2_intervals[" + std::to_string(i) + "]";
    const bool last = i + 1 == roundup_power2_intervals.size();
    if (!(bound_ok(iv.up_to) || (iv.up_to == unlimited && last))) {
      fail(field + ".up_to", std::to_string(iv.up_to),
           "a power of two in [1 MiB, 2^50 bytes], or SIZE_MAX (all larger) in the last interval");
    }
    if (i > 0 && iv.up_to <= roundup_power2_intervals[i - 1].up_to) {
      fail(field + ".up_to", std::to_string(iv.up_to),
           "more than the interval before's " + std::to_string(roundup_power2_intervals[i - 1].up_to));
    }
    if (!divisions_ok(iv.divisions)) {
      fail(field + ".divisions", std::to_string(iv.divisions), "0 or a power of two in [1, 64]");
    }
  }
  if (!(garbage_collection_threshold >= 0.0 && garbage_collection_threshold < 1.0)) {
    fail("garbage_collection_threshold", std::to_string(garbage_collection_threshold),
         "a fraction in (0, 1), or 0 for off");
  }
  if (!(per_process_memory_fraction > 0.0 && per_process_memory_fraction <= 1.0)) {
    fail("per_process_memory_fraction", std::to_string(per_process_memory_fraction), "a fraction in (0, 1]");
  }
  if (trace_capacity > (std::size_t{1} << 26)) {
    fail("trace_capacity", std::to_string(trace_capacity), "a number of events in [0, 2^26]");
  }
  if (steal_threshold > (std::size_t{1} << 50) && steal_threshold != unlimited) {
    fail("steal_threshold", std::to_string(steal_threshold) + " bytes", "a size in [0, 2^50 bytes], or SIZE_MAX (unlimited)");
  }
  if (stats_batch > (std::size_t{1} << 40)) {
    fail("stats_batch", std::to_string(stats_batch) + " bytes", "a size in [0, 1 TiB]");
  }
  if (small_reuse_bytes > (std::size_t{64} << 20)) {
    fail("small_reuse_bytes", std::to_string(small_reuse_bytes) + " bytes", "a size in [0, 64 MiB]");
  }
}

allocator_config allocator_config::from_environment()
{
  const char* text = std::getenv("DEPOT_ALLOC_CONF");
  return text == nullptr ? allocator_config{} : parse(text);
}

std::string allocator_config::to_string() const
{
  std::string s;
  auto add = [&s](const std::string& item) { s += (s.empty() ? "" : ",") + item; };
  // Sizes in bytes, so that parse(to_string()) gives back exactly these settings.
  if (max_split_size != unlimited) add("max_split_size:" + std::to_string(max_split_size));
  if (max_non_split_rounding != allocator_config{}.max_non_split_rounding)
    add("max_non_split_rounding:" + std::to_string(max_non_split_rounding));
  if (!roundup_power2_intervals.empty()) {
    std::string list;
    for (const roundup_interval& iv : roundup_power2_intervals) {
      if (!list.empty()) list += ',';
      list += iv.up_to == unlimited ? std::string{">"} : std::to_string(iv.up_to >> 20);
      list += ':';
      list += std::to_string(iv.divisions);
    }
    add("roundup_power2_divisions:[" + list + "]");
  } else if (roundup_power2_divisions != 0) {
    add("roundup_power2_divisions:" + std::to_string(roundup_power2_divisions));
  }
  if (garbage_collection_threshold != 0.0)
    add("garbage_collection_threshold:" + std::to_string(garbage_collection_threshold));
  if (release_threshold != unlimited)
    add("release_threshold:" + std::to_string(release_threshold));
  if (steal_threshold != 0) {
    add("steal_threshold:" + (steal_threshold == unlimited ? std::string{"unlimited"} : std::to_string(steal_threshold)));
  }
  if (per_process_memory_fraction != 1.0)
    add("per_process_memory_fraction:" + std::to_string(per_process_memory_fraction));
  if (trace_capacity != 0) add("trace_capacity:" + std::to_string(trace_capacity));
  if (stats_batch != allocator_config{}.stats_batch) add("stats_batch:" + std::to_string(stats_batch));
  if (small_reuse_bytes != allocator_config{}.small_reuse_bytes)
    add("small_reuse_bytes:" + std::to_string(small_reuse_bytes));
  if (expandable_segments) add("expandable_segments:true");
  if (!biased_locks) add("biased_locks:false");
  if (null_stream_per_thread) add("null_stream_per_thread:true");
  return s;
}

}  // namespace depot
