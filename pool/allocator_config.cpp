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

}  // namespace

allocator_config allocator_config::parse(std::string_view text)
{
  allocator_config c;
  while (!text.empty()) {
    const auto comma = text.find(',');
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
    } else if (key == "release_threshold") {
      c.release_threshold = parse_bytes(key, value, "a size in [0, 2^50 bytes], e.g. 1GiB");
    } else if (key == "roundup_power2_divisions") {
      constexpr std::string_view range = "0 or a power of two in [1, 64]";
      const auto v = parse_unsigned(key, value, range);
      if (v > 64 || (v != 0 && !std::has_single_bit(v))) bad(key, value, range);
      c.roundup_power2_divisions = static_cast<unsigned>(v);
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
    } else if (key == "expandable_segments") {
      if (value == "true" || value == "True" || value == "1") {
        c.expandable_segments = true;
      } else if (value == "false" || value == "False" || value == "0") {
        c.expandable_segments = false;
      } else {
        bad(key, value, "true or false (also True/False, 1/0)");
      }
    } else {
      throw invalid_argument(
          "depot: DEPOT_ALLOC_CONF: unknown key '" + std::string{key} +
          "'; known keys: max_split_size (or max_split_size_mb), roundup_power2_divisions, "
          "garbage_collection_threshold, release_threshold (or release_threshold_mb), "
          "per_process_memory_fraction, trace_capacity, stats_batch, expandable_segments");
    }
  }
  return c;
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
  if (roundup_power2_divisions != 0)
    add("roundup_power2_divisions:" + std::to_string(roundup_power2_divisions));
  if (garbage_collection_threshold != 0.0)
    add("garbage_collection_threshold:" + std::to_string(garbage_collection_threshold));
  if (release_threshold != unlimited)
    add("release_threshold:" + std::to_string(release_threshold));
  if (per_process_memory_fraction != 1.0)
    add("per_process_memory_fraction:" + std::to_string(per_process_memory_fraction));
  if (trace_capacity != 0) add("trace_capacity:" + std::to_string(trace_capacity));
  if (stats_batch != allocator_config{}.stats_batch) add("stats_batch:" + std::to_string(stats_batch));
  if (expandable_segments) add("expandable_segments:true");
  return s;
}

}  // namespace depot
