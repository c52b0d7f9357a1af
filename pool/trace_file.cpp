// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Reading traces (depot.trace.v1 JSON, RMM's CSV log) and snapshots back from files. Both
// JSON formats are read with SAX handlers: a trace of a million events never becomes a DOM,
// and no DOM is freed while host memory runs out (its destructor would allocate).
#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/trace_file.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>

namespace depot {

namespace {

[[noreturn]] void fail(std::string_view name, const std::string& where_what)
{
  throw invalid_argument("depot: trace file " + std::string{name} + ": " + where_what);
}

std::string read_whole_file(const std::filesystem::path& file, const char* what)
{
  std::ifstream in{file, std::ios::binary};
  if (!in) {
    throw invalid_argument("depot: cannot open " + std::string{what} + " file " + file.string() +
                           (std::filesystem::exists(file) ? " (not readable)" : " (no such file)"));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw invalid_argument("depot: error while reading " + file.string());
  return std::move(buf).str();
}

// "line L, column C" of a byte offset into `text`.
std::string line_column(std::string_view text, std::size_t position)
{
  position = std::min(position, text.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < position; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(position - line_start + 1);
}

// The part of a nlohmann parse error after its "[json.exception...] parse error at ...: ".
std::string json_reason(const std::string& what)
{
  const auto at = what.find("syntax error");
  return at == std::string::npos ? what : what.substr(at);
}

// Where and why nlohmann's SAX parser stopped at byte `position` of `text`.
std::string syntax_error(std::string_view text, std::size_t position, const std::exception& ex)
{
  std::string msg = line_column(text, position > 0 ? position - 1 : 0) + ": invalid JSON: " + json_reason(ex.what());
  if (position >= text.size()) msg += " (the file ends early: truncated?)";
  return msg;
}

std::string_view trim(std::string_view s)
{
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b)
{
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::optional<std::uint64_t> parse_u64(std::string_view s, int base = 10)
{
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A pointer or stream as RMM's fmt prints it: "0x7f..." (hex), or decimal; 0 for null.
std::optional<std::uint64_t> parse_pointer(std::string_view s)
{
  if (s == "(nil)" || s == "nullptr" || s == "0") return 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return parse_u64(s.substr(2), 16);
  return parse_u64(s);
}

// Digits of a fraction of a second ("123456") as nanoseconds.
std::optional<std::uint64_t> parse_fraction_ns(std::string_view digits)
{
  if (digits.empty() || digits.size() > 9) return std::nullopt;
  const auto v = parse_u64(digits);
  if (!v) return std::nullopt;
  std::uint64_t ns = *v;
  for (std::size_t i = digits.size(); i < 9; ++i) ns *= 10;
  return ns;
}

// RMM's time column: "HH:MM:SS.ffffff" (spdlog "%H:%M:%S.%f"), or seconds "1634567890.234567".
std::optional<std::uint64_t> parse_rmm_time_ns(std::string_view s)
{
  constexpr std::uint64_t second = 1'000'000'000;
  if (s.find(':') != std::string_view::npos) {
    if (s.size() < 8 || s[2] != ':' || s[5] != ':') return std::nullopt;
    const auto h = parse_u64(s.substr(0, 2));
    const auto m = parse_u64(s.substr(3, 2));
    const auto sec = parse_u64(s.substr(6, 2));
    if (!h || !m || !sec || *h > 23 || *m > 59 || *sec > 60) return std::nullopt;
    std::uint64_t ns = ((*h * 60 + *m) * 60 + *sec) * second;
    if (s.size() > 8) {
      if (s[8] != '.' && s[8] != ':') return std::nullopt;
      const auto f = parse_fraction_ns(s.substr(9));
      if (!f) return std::nullopt;
      ns += *f;
    }
    return ns;
  }
  const auto dot = s.find('.');
  const auto whole = parse_u64(s.substr(0, dot));
  if (!whole || *whole > std::numeric_limits<std::uint64_t>::max() / second - 1) return std::nullopt;
  std::uint64_t ns = *whole * second;
  if (dot != std::string_view::npos) {
    const auto f = parse_fraction_ns(s.substr(dot + 1));
    if (!f) return std::nullopt;
    ns += *f;
  }
  return ns;
}

std::string shown(std::string_view s)
{
  constexpr std::size_t max_shown = 60;
  std::string out(1, '\'');
  out.append(s.data(), std::min(s.size(), max_shown));
  if (s.size() > max_shown) out += "...";
  out += '\'';
  return out;
}

// ---------------------------------------------------------------------------------------
// RMM CSV

constexpr std::string_view rmm_columns[] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};

recorded_trace parse_rmm_csv(std::string_view text, std::string_view name)
{
  recorded_trace out;
  out.format = "rmm.csv";
  out.device = "cuda";
  std::unordered_map<std::uint64_t, std::uint64_t> alloc_time;  // address -> time_ns
  std::uint64_t day_offset = 0;
  std::uint64_t last_clock = 0;
  bool clock_of_day = false;
  std::size_t line_no = 0;
  bool header_seen = false;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const bool last_line_unterminated = nl == std::string_view::npos;
    std::string_view line = text.substr(pos, last_line_unterminated ? std::string_view::npos : nl - pos);
    pos = last_line_unterminated ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (trim(line).empty()) continue;
    const std::string where = "line " + std::to_string(line_no) + ": ";

    std::string_view fields[6];
    std::size_t n = 0;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = line.find(',', start);
      if (n < 6) fields[n] = trim(line.substr(start, comma == std::string_view::npos ? comma : comma - start));
      ++n;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (!header_seen) {
      bool ok = n == 6;
      for (std::size_t i = 0; ok && i < 6; ++i) ok = iequals(fields[i], rmm_columns[i]);
      if (!ok) {
        fail(name, where + "expected RMM's CSV header Thread,Time,Action,Pointer,Size,Stream, got " +
                       shown(line));
      }
      header_seen = true;
      continue;
    }
    if (n != 6) {
      fail(name, where + "expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream), got " +
                     std::to_string(n) +
                     (last_line_unterminated && n < 6 ? " (the file ends in this line: truncated?)" : "") +
                     ": " + shown(line));
    }
    auto column_error = [&](int col, const char* expected) {
      fail(name, where + "column '" + std::string{rmm_columns[col]} + "': expected " + expected + ", got " +
                     shown(fields[col]));
    };
    trace_event e;
    const auto thread = parse_u64(fields[0]);
    if (!thread) {
      const auto hex = parse_pointer(fields[0]);
      if (!hex) column_error(0, "a thread id (decimal or 0x hex)");
      e.thread = *hex;
    } else {
      e.thread = *thread;
    }
    const auto t = parse_rmm_time_ns(fields[1]);
    if (!t) column_error(1, "a time HH:MM:SS.ffffff or seconds with a fraction");
    if (fields[1].find(':') != std::string_view::npos) {
      // Clock-of-day times wrap at midnight: a jump back of more than 12 h is the next day.
      constexpr std::uint64_t day = 86'400ull * 1'000'000'000ull;
      if (clock_of_day && *t + day / 2 < last_clock) day_offset += day;
      clock_of_day = true;
      last_clock = *t;
    }
    e.time_ns = *t + day_offset;
    const std::string_view action = fields[2];
    if (iequals(action, "allocate")) {
      e.kind = trace_kind::allocate;
    } else if (iequals(action, "free") || iequals(action, "deallocate")) {
      e.kind = trace_kind::free;
    } else if (iequals(action, "allocate failure") || iequals(action, "allocate_failure")) {
      e.kind = trace_kind::out_of_memory;
    } else {
      column_error(2, "allocate, free, deallocate or 'allocate failure'");
    }
    const auto ptr = parse_pointer(fields[3]);
    if (!ptr) column_error(3, "an address (0x hex or decimal)");
    e.address = static_cast<std::uintptr_t>(*ptr);
    const auto size = parse_u64(fields[4]);
    if (!size) column_error(4, "a byte count (a non-negative decimal integer)");
    e.size = static_cast<std::size_t>(*size);
    e.requested = e.size;
    const auto stream = parse_pointer(fields[5]);
    if (!stream) column_error(5, "a stream (0x hex or decimal)");
    e.stream = static_cast<std::uintptr_t>(*stream);
    if (e.kind == trace_kind::allocate) {
      alloc_time[e.address] = e.time_ns;
    } else if (e.kind == trace_kind::free) {
      if (const auto it = alloc_time.find(e.address); it != alloc_time.end()) {
        e.lifetime_ns = e.time_ns >= it->second ? e.time_ns - it->second : 0;
        alloc_time.erase(it);
      }
    }
    out.events.push_back(e);
  }
  if (!header_seen) fail(name, "line 1: the file is empty (expected RMM's CSV header)");
  return out;
}

// ---------------------------------------------------------------------------------------
// depot.trace.v1 JSON, through nlohmann's SAX interface

// Enumerations numbered from 0 without gaps whose to_string() names each value and answers
// "unknown" past the last (trace_kind, block_state): a new value needs only the enum and
// to_string(), and the readers below accept and list it.
template <class E, class F>
void for_each_named(F&& f)
{
  for (unsigned v = 0; v <= 0xff; ++v) {
    const auto e = static_cast<E>(v);
    if (to_string(e) == "unknown") return;
    f(e);
  }
}

template <class E>
std::optional<E> from_name(std::string_view s)
{
  std::optional<E> found;
  for_each_named<E>([&](E e) {
    if (!found && to_string(e) == s) found = e;
  });
  return found;
}

// "one of alloc, free, ..., segment_move"
template <class E>
std::string names_of()
{
  std::string out = "one of ";
  const char* separator = "";
  for_each_named<E>([&](E e) {
    out += separator;
    out += to_string(e);
    separator = ", ";
  });
  return out;
}

// The depth of a nested value (object or array) a SAX reader skips, an unknown key's or
// one a reader need not look into; 0: none. Every event inside it is consumed here.
class skipped_value {
 public:
  [[nodiscard]] bool inside() const noexcept { return depth_ > 0; }
  void begin() noexcept { depth_ = 1; }  // the value just opened is skipped
  // An object or array opens / closes: true (consumed) inside a skipped value.
  bool opens() noexcept
  {
    if (depth_ == 0) return false;
    ++depth_;
    return true;
  }
  bool closes() noexcept
  {
    if (depth_ == 0) return false;
    --depth_;
    return true;
  }

 private:
  int depth_ = 0;
};

class trace_sax {
 public:
  using json = nlohmann::json;

  trace_sax(std::string_view text, std::string_view name) : text_{text}, name_{name} {}

  recorded_trace take()
  {
    if (!saw_top_) fail(name_, "expected a JSON object");
    if (!format_) {
      fail(name_, "no \"format\" key (expected \"depot.trace.v1\")");
    }
    if (*format_ != "depot.trace.v1") {
      fail(name_, "\"format\" is " + shown(*format_) + ", expected 'depot.trace.v1'" +
                      (*format_ == "depot.snapshot.v1" ? " (this is a snapshot, not a trace)" : ""));
    }
    if (!saw_events_) fail(name_, "no \"events\" array");
    out_.format = *format_;
    return std::move(out_);
  }

  // ---- the SAX interface ----
  bool null() { return scalar("null", value_kind::other); }
  bool boolean(bool v)
  {
    bool_ = v;
    return scalar(v ? "true" : "false", value_kind::boolean);
  }
  bool number_integer(json::number_integer_t v)
  {
    return scalar(std::to_string(v), v >= 0 ? value_kind::unsigned_int : value_kind::other, v >= 0 ? static_cast<std::uint64_t>(v) : 0);
  }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(std::to_string(v), value_kind::unsigned_int, v); }
  bool number_float(json::number_float_t, const json::string_t& s) { return scalar(s, value_kind::other); }
  bool string(json::string_t& s)
  {
    string_ = s;
    return scalar("\"" + s + "\"", value_kind::string);
  }
  bool binary(json::binary_t&) { return scalar("binary", value_kind::other); }

  bool start_object(std::size_t)
  {
    if (skip_.opens()) return true;
    switch (where_) {
      case where::start:
        where_ = where::top;
        saw_top_ = true;
        return true;
      case where::top_value:
        if (top_key_ == "events") fail(name_, "\"events\" must be an array, got an object");
        if (top_key_ == "format" || top_key_ == "device") {
          fail(name_, "\"" + top_key_ + "\" must be a string, got an object");
        }
        skip_.begin();
        where_ = where::top;
        return true;
      case where::events:
        current_ = trace_event{};
        seen_ = 0;
        where_ = where::event;
        return true;
      case where::event_value:
        if (field_index_ >= 0) field_error("an object");
        skip_.begin();
        where_ = where::event;
        return true;
      default: return true;
    }
  }
  bool end_object()
  {
    if (skip_.closes()) return true;
    if (where_ == where::event) {
      finish_event();
      where_ = where::events;
    } else if (where_ == where::top) {
      where_ = where::done;
    }
    return true;
  }
  bool start_array(std::size_t)
  {
    if (skip_.opens()) return true;
    switch (where_) {
      case where::start: fail(name_, "expected a JSON object with \"format\" and \"events\", got an array");
      case where::top_value:
        if (top_key_ == "events") {
          saw_events_ = true;
          where_ = where::events;
          return true;
        }
        if (top_key_ == "format" || top_key_ == "device") {
          fail(name_, "\"" + top_key_ + "\" must be a string, got an array");
        }
        skip_.begin();
        where_ = where::top;
        return true;
      case where::events: fail(name_, event_where() + "expected an event object, got an array");
      case where::event_value:
        if (field_index_ >= 0) field_error("an array");
        skip_.begin();
        where_ = where::event;
        return true;
      default: return true;
    }
  }
  bool end_array()
  {
    if (skip_.closes()) return true;
    if (where_ == where::events) where_ = where::top;
    return true;
  }
  bool key(json::string_t& k)
  {
    if (skip_.inside()) return true;
    if (where_ == where::top) {
      top_key_ = k;
      where_ = where::top_value;
    } else if (where_ == where::event) {
      field_ = k;
      field_index_ = -1;
      for (int i = 0; i < field_count; ++i) {
        if (k == field_names[i]) field_index_ = i;
      }
      if (field_index_ >= 0) {
        if ((seen_ & (1u << field_index_)) != 0) {
          fail(name_, event_where() + "field '" + k + "' appears twice");
        }
        seen_ |= 1u << field_index_;
      }
      where_ = where::event_value;
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex)
  {
    std::string msg = syntax_error(text_, position, ex);
    if (where_ == where::event || where_ == where::event_value) {
      msg += " (inside event " + std::to_string(out_.events.size()) + ")";
    }
    fail(name_, msg);
  }

 private:
  enum class where { start, top, top_value, events, event, event_value, done };
  enum class value_kind { unsigned_int, boolean, string, other };
  static constexpr int field_count = 10;
  static constexpr const char* field_names[field_count] = {
      "kind", "time_ns", "address", "size", "requested", "stream", "thread", "cache_hit", "lifetime_ns", "from_stream"};
  enum field : int {
    f_kind, f_time, f_address, f_size, f_requested, f_stream, f_thread, f_cache_hit, f_lifetime, f_from_stream
  };

  std::string event_where() const { return "event " + std::to_string(out_.events.size()) + ": "; }

  [[noreturn]] void field_error(const std::string& got)
  {
    const std::string expected = field_index_ == f_kind        ? names_of<trace_kind>()
                                 : field_index_ == f_cache_hit ? std::string("true or false")
                                                               : std::string("a non-negative integer");
    fail(name_, event_where() + "field '" + field_ + "': expected " + expected + ", got " + got);
  }

  bool scalar(const std::string& text, value_kind vk, std::uint64_t u = 0)
  {
    if (skip_.inside()) return true;
    switch (where_) {
      case where::start: fail(name_, "expected a JSON object with \"format\" and \"events\", got " + text);
      case where::top_value:
        if (top_key_ == "format" || top_key_ == "device") {
          if (vk != value_kind::string) fail(name_, "\"" + top_key_ + "\" must be a string, got " + text);
          if (top_key_ == "format") {
            format_ = string_;
          } else {
            out_.device = string_;
          }
        } else if (top_key_ == "events") {
          fail(name_, "\"events\" must be an array, got " + text);
        }
        where_ = where::top;
        return true;
      case where::events: fail(name_, event_where() + "expected an event object, got " + text);
      case where::event_value:
        where_ = where::event;
        if (field_index_ < 0) return true;  // an unknown field: skipped
        if (field_index_ == f_kind) {
          if (vk != value_kind::string) field_error(text);
          const auto k = from_name<trace_kind>(string_);
          if (!k) field_error(shown(string_));
          current_.kind = *k;
        } else if (field_index_ == f_cache_hit) {
          if (vk != value_kind::boolean) field_error(text);
          current_.cache_hit = bool_;
        } else {
          if (vk != value_kind::unsigned_int) field_error(text);
          switch (field_index_) {
            case f_time: current_.time_ns = u; break;
            case f_address: current_.address = static_cast<std::uintptr_t>(u); break;
            case f_size: current_.size = static_cast<std::size_t>(u); break;
            case f_requested: current_.requested = static_cast<std::size_t>(u); break;
            case f_stream: current_.stream = static_cast<std::uintptr_t>(u); break;
            case f_thread: current_.thread = u; break;
            case f_lifetime: current_.lifetime_ns = u; break;
            case f_from_stream: current_.from_stream = static_cast<std::uintptr_t>(u); break;
            default: break;
          }
        }
        return true;
      default: return true;
    }
  }

  void finish_event()
  {
    for (int f : {f_kind, f_address, f_size}) {
      if ((seen_ & (1u << f)) == 0) {
        fail(name_, event_where() + "required field '" + std::string{field_names[f]} + "' is missing");
      }
    }
    if ((seen_ & (1u << f_requested)) == 0 &&
        (current_.kind == trace_kind::allocate || current_.kind == trace_kind::free ||
         current_.kind == trace_kind::out_of_memory)) {
      current_.requested = current_.size;
    }
    out_.events.push_back(current_);
  }

  std::string_view text_;
  std::string_view name_;
  recorded_trace out_;
  where where_ = where::start;
  skipped_value skip_;
  bool saw_top_ = false;
  bool saw_events_ = false;
  std::optional<std::string> format_;
  std::string top_key_;
  std::string field_;
  int field_index_ = -1;
  unsigned seen_ = 0;
  trace_event current_;
  std::string string_;
  bool bool_ = false;
};

recorded_trace parse_trace_json(std::string_view text, std::string_view name)
{
  trace_sax sax{text, name};
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return sax.take();
}

// ---------------------------------------------------------------------------------------
// depot.snapshot.v1, through nlohmann's SAX interface as well: a DOM's destructor allocates
// (nlohmann flattens nested values onto a heap stack), so a document freed while host
// memory runs out would end in std::terminate; this reader builds the snapshot as it goes
// and throws std::bad_alloc like any other call.

[[noreturn]] void snapshot_fail(std::string_view name, const std::string& where_what)
{
  throw invalid_argument("depot: snapshot file " + std::string{name} + ": " + where_what);
}

// A field's value as read: its kind, and its text for messages (a nested value: "an object").
struct field_value {
  enum class kind { none, unsigned_int, boolean, string, other } k = kind::none;
  std::uint64_t u = 0;
  bool b = false;
  std::string s;
  std::string text;
};

class snapshot_sax {
 public:
  using json = nlohmann::json;

  snapshot_sax(std::string_view text, std::string_view name) : text_{text}, name_{name} {}

  allocator_snapshot take()
  {
    if (where_ != where::done) sfail("expected a JSON object");
    check_header(true);
    if (!saw_segments_) sfail("required field 'segments' is missing");
    return std::move(snap_);
  }

  // ---- the SAX interface ----
  bool null() { return scalar(field_value::kind::other, "null", "null"); }
  bool boolean(bool v)
  {
    value_.b = v;
    return scalar(field_value::kind::boolean, v ? "true" : "false", "boolean");
  }
  bool number_integer(json::number_integer_t v)
  {
    value_.u = static_cast<std::uint64_t>(v);
    return scalar(v >= 0 ? field_value::kind::unsigned_int : field_value::kind::other, std::to_string(v), "number");
  }
  bool number_unsigned(json::number_unsigned_t v)
  {
    value_.u = v;
    return scalar(field_value::kind::unsigned_int, std::to_string(v), "number");
  }
  bool number_float(json::number_float_t, const json::string_t& s)
  {
    return scalar(field_value::kind::other, s, "number");
  }
  bool string(json::string_t& s)
  {
    value_.s = s;
    return scalar(field_value::kind::string, "\"" + s + "\"", "string");
  }
  bool binary(json::binary_t&) { return scalar(field_value::kind::other, "binary", "binary"); }

  bool start_object(std::size_t) { return nested("object"); }
  bool start_array(std::size_t) { return nested("array"); }
  bool end_object()
  {
    if (skip_.closes()) return true;
    if (where_ == where::block) {
      finish_block();
      where_ = where::blocks;
    } else if (where_ == where::segment) {
      finish_segment();
      where_ = where::segments;
    } else if (where_ == where::top) {
      where_ = where::done;
    }
    return true;
  }
  bool end_array()
  {
    if (skip_.closes()) return true;
    if (where_ == where::segments) where_ = where::top;
    if (where_ == where::blocks) where_ = where::segment;
    return true;
  }
  bool key(json::string_t& k)
  {
    if (skip_.inside()) return true;
    const auto index = [&](const auto& names) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (k == names[i]) return static_cast<int>(i);
      }
      return -1;
    };
    if (where_ == where::top) {
      key_ = k == "segments" ? k_array : index(top_names);
      where_ = where::top_value;
    } else if (where_ == where::segment) {
      key_ = k == "blocks" ? k_array : index(segment_names);
      where_ = where::segment_value;
    } else if (where_ == where::block) {
      key_ = index(block_names);
      where_ = where::block_value;
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex)
  {
    sfail(syntax_error(text_, position, ex));
  }

 private:
  enum class where { start, top, top_value, segments, segment, segment_value, blocks, block, block_value, done };
  static constexpr int k_array = -2;  // the key of the level's array ("segments", "blocks")
  static constexpr std::array<const char*, 2> top_names{"format", "device"};
  enum : std::size_t { t_format, t_device };
  static constexpr std::array<const char*, 8> segment_names{
      "address", "size", "stream", "pool", "exported", "importers", "capture_pool", "reserved_addresses"};
  enum : std::size_t { s_address, s_size, s_stream, s_pool, s_exported, s_importers, s_capture_pool, s_reserved };
  static constexpr std::array<const char*, 5> block_names{"address", "size", "requested", "state", "kept"};
  enum : std::size_t { b_address, b_size, b_requested, b_state, b_kept };

  [[noreturn]] void sfail(const std::string& msg) const { snapshot_fail(name_, msg); }
  std::string segment_where() const { return "segment " + std::to_string(snap_.segments.size()) + ": "; }
  std::string block_where(std::size_t bi) const { return segment_where() + "block " + std::to_string(bi) + ": "; }

  // The value of `key` in the object being read, into its field (the last one when a key
  // appears twice, as a DOM keeps it).
  void keep(field_value& f, field_value::kind k, std::string text)
  {
    f.k = k;
    f.u = value_.u;
    f.b = value_.b;
    f.s = std::move(value_.s);
    f.text = std::move(text);
  }
  void keep_in(field_value::kind k, std::string text)
  {
    if (key_ < 0) return;  // an unknown key: skipped
    const auto i = static_cast<std::size_t>(key_);
    switch (where_) {
      case where::top_value: keep(top_[i], k, std::move(text)); break;
      case where::segment_value: keep(segment_[i], k, std::move(text)); break;
      case where::block_value: keep(block_[i], k, std::move(text)); break;
      default: break;
    }
  }

  bool scalar(field_value::kind k, std::string text, const char* type)
  {
    if (skip_.inside()) return true;
    switch (where_) {
      case where::start: sfail("expected a JSON object, got " + std::string{type});
      case where::top_value:
        if (key_ == k_array) sfail("field 'segments': expected an array, got " + std::string{type});
        keep_in(k, std::move(text));
        where_ = where::top;
        return true;
      case where::segments: sfail(segment_where() + "expected an object, got " + type);
      case where::segment_value:
        if (key_ == k_array) sfail(segment_where() + "field 'blocks': expected an array, got " + type);
        keep_in(k, std::move(text));
        where_ = where::segment;
        return true;
      case where::blocks: sfail(block_where(blocks_.size()) + "expected an object, got " + type);
      case where::block_value:
        keep_in(k, std::move(text));
        where_ = where::block;
        return true;
      default: return true;
    }
  }

  // An object or array begins.
  bool nested(const char* type)
  {
    if (skip_.opens()) return true;
    const bool object = type[0] == 'o';
    const std::string an = std::string{"an "} + type;
    switch (where_) {
      case where::start:
        if (!object) sfail("expected a JSON object, got " + std::string{type});
        where_ = where::top;
        return true;
      case where::top_value:
        if (key_ == k_array) {
          if (object) sfail("field 'segments': expected an array, got object");
          check_header(false);
          saw_segments_ = true;
          where_ = where::segments;
          return true;
        }
        keep_in(field_value::kind::other, an);
        where_ = where::top;
        break;
      case where::segments:
        if (!object) sfail(segment_where() + "expected an object, got array");
        segment_ = {};
        blocks_.clear();
        saw_blocks_ = false;
        where_ = where::segment;
        return true;
      case where::segment_value:
        if (key_ == k_array) {
          if (object) sfail(segment_where() + "field 'blocks': expected an array, got object");
          saw_blocks_ = true;
          where_ = where::blocks;
          return true;
        }
        keep_in(field_value::kind::other, an);
        where_ = where::segment;
        break;
      case where::blocks:
        if (!object) sfail(block_where(blocks_.size()) + "expected an object, got array");
        block_ = {};
        where_ = where::block;
        return true;
      case where::block_value:
        keep_in(field_value::kind::other, an);
        where_ = where::block;
        break;
      default: return true;
    }
    skip_.begin();  // its content is skipped
    return true;
  }

  std::uint64_t need_unsigned(const field_value& v, const char* key, const std::string& where) const
  {
    if (v.k == field_value::kind::none) sfail(where + "required field '" + key + "' is missing");
    if (v.k != field_value::kind::unsigned_int) {
      sfail(where + "field '" + key + "': expected a non-negative integer, got " + v.text);
    }
    return v.u;
  }
  const std::string& need_string(const field_value& v, const char* key, const std::string& where) const
  {
    if (v.k == field_value::kind::none) sfail(where + "required field '" + key + "' is missing");
    if (v.k != field_value::kind::string) sfail(where + "field '" + key + "': expected a string, got " + v.text);
    return v.s;
  }

  // The top level's fields, once they are read (`final`: at its end, when they must be).
  void check_header(bool final)
  {
    if (checked_header_) return;
    if (!final && (top_[t_format].k == field_value::kind::none || top_[t_device].k == field_value::kind::none)) return;
    const std::string& format = need_string(top_[t_format], "format", "");
    if (format != "depot.snapshot.v1") {
      sfail("\"format\" is " + shown(format) + ", expected 'depot.snapshot.v1'" +
            (format == "depot.trace.v1" ? " (this is a trace, not a snapshot)" : ""));
    }
    const std::string& dev = need_string(top_[t_device], "device", "");
    try {
      snap_.device = device_id::parse(dev);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      sfail("field 'device': " + std::string{e.what()});
    }
    checked_header_ = true;
  }

  void finish_block()
  {
    const std::string bw = block_where(blocks_.size());
    block_info blk;
    blk.address = static_cast<std::uintptr_t>(need_unsigned(block_[b_address], "address", bw));
    blk.size = static_cast<std::size_t>(need_unsigned(block_[b_size], "size", bw));
    blk.requested = static_cast<std::size_t>(need_unsigned(block_[b_requested], "requested", bw));
    const std::string& st = need_string(block_[b_state], "state", bw);
    const auto state = from_name<block_state>(st);
    if (!state) sfail(bw + "field 'state': expected " + names_of<block_state>() + ", got " + shown(st));
    blk.state = *state;
    if (const field_value& kp = block_[b_kept]; kp.k != field_value::kind::none) {  // optional
      if (kp.k != field_value::kind::boolean) sfail(bw + "field 'kept': expected true or false, got " + kp.text);
      if (kp.b && blk.state != block_state::free) sfail(bw + "field 'kept': true on a block that is not free");
      blk.kept = kp.b;
    }
    blocks_.push_back(blk);
  }

  void finish_segment()
  {
    const std::string sw = segment_where();
    segment_info seg;
    seg.address = static_cast<std::uintptr_t>(need_unsigned(segment_[s_address], "address", sw));
    seg.size = static_cast<std::size_t>(need_unsigned(segment_[s_size], "size", sw));
    seg.stream = static_cast<std::uintptr_t>(need_unsigned(segment_[s_stream], "stream", sw));
    const std::string& pool = need_string(segment_[s_pool], "pool", sw);
    if (pool != "small" && pool != "large") {
      sfail(sw + "field 'pool': expected \"small\" or \"large\", got " + shown(pool));
    }
    seg.small_pool = pool == "small";
    // Optional (files before them lack them):
    if (const field_value& ex = segment_[s_exported]; ex.k != field_value::kind::none) {
      if (ex.k != field_value::kind::boolean) sfail(sw + "field 'exported': expected true or false, got " + ex.text);
      seg.exported = ex.b;
    }
    if (const field_value& im = segment_[s_importers]; im.k != field_value::kind::none) {
      if (im.k != field_value::kind::unsigned_int || im.u > std::numeric_limits<std::int64_t>::max()) {
        sfail(sw + "field 'importers': expected a non-negative integer, got " + im.text);
      }
      seg.importers = static_cast<std::int64_t>(im.u);
    }
    if (const field_value& cp = segment_[s_capture_pool]; cp.k != field_value::kind::none) {
      if (cp.k != field_value::kind::unsigned_int) {
        sfail(sw + "field 'capture_pool': expected a non-negative integer, got " + cp.text);
      }
      seg.capture_pool = cp.u;
    }
    if (const field_value& rv = segment_[s_reserved]; rv.k != field_value::kind::none) {
      if (rv.k != field_value::kind::unsigned_int) {
        sfail(sw + "field 'reserved_addresses': expected a non-negative integer, got " + rv.text);
      }
      seg.reserved = static_cast<std::size_t>(rv.u);
    }
    if (!saw_blocks_) sfail(sw + "required field 'blocks' is missing");
    std::uint64_t covered = 0, mapped = 0;  // bytes tiled, and of them mapped (not unmapped blocks)
    for (std::size_t bi = 0; bi < blocks_.size(); ++bi) {
      const block_info& blk = blocks_[bi];
      const std::string bw = block_where(bi);
      if (blk.state == block_state::unmapped && seg.reserved == 0) {
        sfail(bw + "an unmapped block outside an expandable segment (no reserved_addresses)");
      }
      if (blk.address < seg.address || blk.address - seg.address != covered) {
        sfail(bw + "address " + std::to_string(blk.address) + " does not follow the previous block (expected " +
              std::to_string(seg.address + covered) + "): blocks must tile their segment in address order");
      }
      if (blk.state != block_state::unmapped) {
        if (blk.size > seg.size - mapped) {
          sfail(bw + "the block ends past its segment's " + std::to_string(seg.size) + " bytes");
        }
        mapped += blk.size;
      } else if (blk.size > seg.reserved - covered) {
        sfail(bw + "the unmapped block ends past its segment's " + std::to_string(seg.reserved) +
              " reserved addresses");
      }
      covered += blk.size;
    }
    if (mapped != seg.size) {
      sfail(sw + "blocks cover " + std::to_string(mapped) + " of the segment's " + std::to_string(seg.size) +
            " bytes (blocks must tile their segment; unmapped blocks aside)");
    }
    seg.blocks = std::move(blocks_);
    blocks_ = {};
    snap_.segments.push_back(std::move(seg));
  }

  std::string_view text_;
  std::string_view name_;
  allocator_snapshot snap_;
  where where_ = where::start;
  skipped_value skip_;
  int key_ = -1;
  field_value value_;  // the scalar being read
  std::array<field_value, top_names.size()> top_;
  std::array<field_value, segment_names.size()> segment_;
  std::array<field_value, block_names.size()> block_;
  std::vector<block_info> blocks_;  // the segment's so far
  bool saw_segments_ = false;
  bool saw_blocks_ = false;
  bool checked_header_ = false;
};

}  // namespace

std::string recorded_trace::to_json() const
{
  // Written by hand (not through a DOM) so that a million events stay cheap; the same
  // layout as allocator_core::trace_json().
  std::string out = "{\"format\":\"depot.trace.v1\",\"device\":" + nlohmann::json(device).dump() + ",\"events\":[";
  bool first = true;
  for (const trace_event& e : events) {
    if (!first) out += ',';
    first = false;
    out += "{\"kind\":\"";
    out += to_string(e.kind);
    out += "\",\"time_ns\":" + std::to_string(e.time_ns) + ",\"address\":" + std::to_string(e.address) +
           ",\"size\":" + std::to_string(e.size) + ",\"requested\":" + std::to_string(e.requested) +
           ",\"stream\":" + std::to_string(e.stream) + ",\"thread\":" + std::to_string(e.thread);
    if (e.kind == trace_kind::allocate) out += e.cache_hit ? ",\"cache_hit\":true" : ",\"cache_hit\":false";
    if (e.kind == trace_kind::free) out += ",\"lifetime_ns\":" + std::to_string(e.lifetime_ns);
    if (e.kind == trace_kind::segment_move) out += ",\"from_stream\":" + std::to_string(e.from_stream);
    out += '}';
  }
  out += "]}";
  return out;
}

recorded_trace parse_trace(std::string_view text, std::string_view name)
{
  std::size_t i = 0;
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF &&
      static_cast<unsigned char>(text[1]) == 0xBB && static_cast<unsigned char>(text[2]) == 0xBF) {
    i = 3;  // a UTF-8 byte order mark
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])) != 0) ++i;
  if (i == text.size()) fail(name, "the file is empty (expected a depot trace JSON or an RMM CSV log)");
  if (text[i] == '{' || text[i] == '[') return parse_trace_json(text.substr(i), name);
  if (iequals(text.substr(i, 7), "Thread,")) return parse_rmm_csv(text.substr(i), name);
  const std::string_view first = text.substr(i, std::min(text.find('\n', i), text.size()) - i);
  fail(name, "line 1: neither a depot trace (a JSON object) nor an RMM CSV log (header "
             "Thread,Time,Action,Pointer,Size,Stream); it starts with " + shown(first));
}

recorded_trace read_trace(const std::filesystem::path& file)
{
  const std::string text = read_whole_file(file, "trace");
  return parse_trace(text, file.string());
}

allocator_snapshot parse_snapshot(std::string_view text, std::string_view name)
{
  snapshot_sax sax{text, name};
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return sax.take();
}

allocator_snapshot read_snapshot(const std::filesystem::path& file)
{
  const std::string text = read_whole_file(file, "snapshot");
  return parse_snapshot(text, file.string());
}

}  // namespace depot
