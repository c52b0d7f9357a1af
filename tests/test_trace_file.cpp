// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// Reading traces and snapshots back: depot's JSON and RMM's CSV, round trips with a real
// allocator, and every kind of bad or truncated file giving a message that says where.
#include "test_devices.hpp"
#include "trace_shapes.hpp"

#include <doctest/doctest.h>

#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/stream.hpp>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/trace_file.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

bool same_event(const depot::trace_event& a, const depot::trace_event& b)
{
  return a.kind == b.kind && a.time_ns == b.time_ns && a.address == b.address && a.size == b.size &&
         a.requested == b.requested && a.stream == b.stream && a.thread == b.thread &&
         a.cache_hit == b.cache_hit && a.lifetime_ns == b.lifetime_ns && a.from_stream == b.from_stream;
}

// The message of the depot::invalid_argument that parse_trace(text) throws ("" if none).
std::string trace_error(const std::string& text, std::string_view name = "t.json")
{
  try {
    (void)depot::parse_trace(text, name);
  } catch (const depot::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string snapshot_error(const std::string& text)
{
  try {
    (void)depot::parse_snapshot(text, "s.json");
  } catch (const depot::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A temporary directory removed at the end of the test.
struct temp_dir {
  std::filesystem::path path;
  temp_dir()
  {
    char tmpl[] = "/tmp/depot-trace-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE_TEMPLATE("trace: a real allocator's trace and snapshot read back exactly", D, DEPOT_TEST_DEVICES)
{
  depot::allocator_config cfg;
  cfg.trace_capacity = 1000;
  SUBCASE("ordinary segments") {}
  SUBCASE("expandable segments") { cfg.expandable_segments = true; }  // segment_map events
  depot::caching_allocator<D> a{0, cfg};
  std::vector<void*> ptrs;
  for (std::size_t n : {1 * KiB, 3 * MiB, 100 * KiB, 700 * KiB, 7 * MiB}) ptrs.push_back(a.allocate(n));
  a.deallocate(ptrs[1]);
  ptrs[1] = a.allocate(2 * MiB);
  a.deallocate(ptrs[4]);
  a.empty_cache();  // (expandable: segment_unmap)
  ptrs[4] = a.allocate(5 * MiB);
  a.deallocate(ptrs[0]);
  const std::vector<depot::trace_event> events = a.trace();
  const depot::recorded_trace t = depot::parse_trace(a.trace_json(), "pool");
  CHECK(t.format == "depot.trace.v1");
  CHECK(t.device == a.device().to_string());
  REQUIRE(t.events.size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) CHECK(same_event(t.events[i], events[i]));
  // recorded_trace::to_json writes the same format back
  const depot::recorded_trace again = depot::parse_trace(t.to_json());
  REQUIRE(again.events.size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) CHECK(same_event(again.events[i], events[i]));

  const depot::allocator_snapshot snap = a.snapshot();
  if (cfg.expandable_segments) {
    const auto kinds = [&](depot::trace_kind k) {
      return std::count_if(events.begin(), events.end(), [k](const depot::trace_event& e) { return e.kind == k; });
    };
    CHECK(kinds(depot::trace_kind::segment_map) >= 1);
    CHECK(kinds(depot::trace_kind::segment_unmap) >= 1);
    CHECK(std::any_of(snap.segments.begin(), snap.segments.end(), [](const auto& g) { return g.reserved != 0; }));
  }
  temp_dir dir;
  {
    std::ofstream out{dir.path / "snap.json"};
    out << snap.to_json();
  }
  const depot::allocator_snapshot back = depot::read_snapshot(dir.path / "snap.json");
  CHECK(back.device == snap.device);
  REQUIRE(back.segments.size() == snap.segments.size());
  for (std::size_t s = 0; s < snap.segments.size(); ++s) {
    CHECK(back.segments[s].address == snap.segments[s].address);
    CHECK(back.segments[s].size == snap.segments[s].size);
    CHECK(back.segments[s].small_pool == snap.segments[s].small_pool);
    CHECK(back.segments[s].exported == snap.segments[s].exported);
    CHECK(back.segments[s].reserved == snap.segments[s].reserved);
    REQUIRE(back.segments[s].blocks.size() == snap.segments[s].blocks.size());
    for (std::size_t b = 0; b < snap.segments[s].blocks.size(); ++b) {
      CHECK(back.segments[s].blocks[b].address == snap.segments[s].blocks[b].address);
      CHECK(back.segments[s].blocks[b].size == snap.segments[s].blocks[b].size);
      CHECK(back.segments[s].blocks[b].requested == snap.segments[s].blocks[b].requested);
      CHECK(back.segments[s].blocks[b].state == snap.segments[s].blocks[b].state);
    }
  }
  for (void* p : ptrs) {
    if (p != ptrs[0]) a.deallocate(p);
  }
}

// A stream that misses takes another stream's whole free segment: the trace says which
// segment moved, from which stream to which, and reads back the same.
TEST_CASE_TEMPLATE("trace: a segment moved between streams is traced with both streams and read back", D,
                   DEPOT_TEST_DEVICES)
{
  std::size_t n = 24 * MiB;
  SUBCASE("large segment") {}
  SUBCASE("linked small segment") { n = 1 * MiB; }
  SUBCASE("dense small segment") { n = 64 * KiB; }
  CAPTURE(n);
  depot::allocator_config cfg;
  cfg.trace_capacity = 1000;
  depot::caching_allocator<D> a{0, cfg};
  depot::stream<D> s1;
  depot::stream<D> s2;
  a.deallocate(a.allocate(n, s1), s1);  // a whole free segment in s1's cache
  void* q = a.allocate(n, s2);          // s2's cache has none: s1's moves
  const std::vector<depot::trace_event> events = a.trace();
  std::vector<depot::trace_event> moves;
  std::copy_if(events.begin(), events.end(), std::back_inserter(moves),
               [](const depot::trace_event& e) { return e.kind == depot::trace_kind::segment_move; });
  REQUIRE(moves.size() == 1);
  const depot::trace_event& m = moves[0];
  CHECK(m.stream == reinterpret_cast<std::uintptr_t>(s2.native()));
  CHECK(m.from_stream == reinterpret_cast<std::uintptr_t>(s1.native()));
  CHECK(m.from_stream != m.stream);
  // The segment that moved is the one q lies in, whole.
  const depot::allocator_snapshot snap = a.snapshot();
  const auto q_at = reinterpret_cast<std::uintptr_t>(q);
  const auto seg = std::find_if(snap.segments.begin(), snap.segments.end(), [&](const auto& g) {
    return g.address <= q_at && q_at < g.address + g.size;
  });
  REQUIRE(seg != snap.segments.end());
  CHECK(m.address == seg->address);
  CHECK(m.size == seg->size);
  CHECK(seg->stream == m.stream);
  CHECK(snap.segments.size() == 1);  // moved, not grown
  CHECK(a.stats().num_segments_moved == 1);
  CHECK(to_string(m.kind) == "segment_move");
  const depot::recorded_trace t = depot::parse_trace(a.trace_json(), "pool");
  REQUIRE(t.events.size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) CHECK(same_event(t.events[i], events[i]));
  const depot::recorded_trace again = depot::parse_trace(t.to_json());
  REQUIRE(again.events.size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) CHECK(same_event(again.events[i], events[i]));
  a.deallocate(q, s2);
}

TEST_CASE("trace: generated shapes round-trip through files in both formats")
{
  const auto seed = depot::test::seed("trace shapes", 20261122);
  temp_dir dir;
  const std::vector<std::pair<std::string, depot::recorded_trace>> shapes{
      {"ladder", depot::test::ladder_trace()},
      {"random", depot::test::random_trace(seed, 3000)},
      {"streams", depot::test::streams_trace(seed + 1, 6, 3, 4000)}};
  for (const auto& [name, t] : shapes) {
    CAPTURE(name);
    const auto json_file = dir.path / (name + ".json");
    {
      std::ofstream out{json_file};
      out << t.to_json();
    }
    const depot::recorded_trace j = depot::read_trace(json_file);
    CHECK(j.format == "depot.trace.v1");
    CHECK(j.device == "cuda:0");
    REQUIRE(j.events.size() == t.events.size());
    for (std::size_t i = 0; i < t.events.size(); ++i) CHECK(same_event(j.events[i], t.events[i]));

    for (bool clock : {true, false}) {
      const auto csv_file = dir.path / (name + (clock ? ".clock.csv" : ".epoch.csv"));
      {
        std::ofstream out{csv_file};
        out << depot::test::rmm_csv(t, clock);
      }
      const depot::recorded_trace r = depot::read_trace(csv_file);
      CHECK(r.format == "rmm.csv");
      REQUIRE(r.events.size() == t.events.size());
      for (std::size_t i = 0; i < t.events.size(); ++i) {
        const auto& a = r.events[i];
        const auto& b = t.events[i];
        CHECK(a.kind == b.kind);
        CHECK(a.address == b.address);
        CHECK(a.requested == b.requested);
        CHECK(a.stream == b.stream);
        CHECK(a.thread == b.thread);
        // RMM logs microseconds: lifetimes come back to the microsecond
        if (b.kind == depot::trace_kind::free) CHECK(a.lifetime_ns / 1000 == b.lifetime_ns / 1000);
      }
    }
  }
}

TEST_CASE("trace: RMM CSV details (CRLF, hex and decimal, failures, midnight, header case)")
{
  const std::string csv =
      "thread,time,action,pointer,size,stream\r\n"
      "140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0x7f8a38001020\r\n"
      "140573312345856,23:59:59.999500,allocate failure,0x0,999999999999,0x0\r\n"
      "140573312345857,00:00:00.000500,free,140231755956224,1024,0x7f8a38001020\r\n"
      "\r\n";
  const depot::recorded_trace t = depot::parse_trace(csv, "rmm.csv");
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0].kind == depot::trace_kind::allocate);
  CHECK(t.events[0].address == 0x7f8a40000000u);
  CHECK(t.events[0].stream == 0x7f8a38001020u);
  CHECK(t.events[1].kind == depot::trace_kind::out_of_memory);
  CHECK(t.events[1].requested == 999999999999u);
  CHECK(t.events[2].kind == depot::trace_kind::free);
  CHECK(t.events[2].address == 0x7f8a40000000u);  // given in decimal
  CHECK(t.events[2].thread == 140573312345857u);
  // the free is 1.5 ms after the allocate, across midnight
  CHECK(t.events[2].lifetime_ns == 1'500'000u);
  CHECK(t.events[2].time_ns > t.events[0].time_ns);

  const depot::recorded_trace d = depot::parse_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n1,1634567890.5,allocate,0x10,5,0x0\n2,1634567891,deallocate,0x10,5,0x0");
  REQUIRE(d.events.size() == 2);
  CHECK(d.events[1].kind == depot::trace_kind::free);
  CHECK(d.events[1].lifetime_ns == 500'000'000u);
}

TEST_CASE("trace: a JSON trace with defaults and unknown keys")
{
  const depot::recorded_trace t = depot::parse_trace(
      R"({"extra":{"nested":[1,{"a":[]}]},"events":[{"kind":"alloc","address":512,"size":1536,"future":[1,2]},)"
      R"({"kind":"oom","address":0,"size":99,"note":{"x":1}}],"format":"depot.trace.v1","device":"host:0"})");
  REQUIRE(t.events.size() == 2);
  CHECK(t.events[0].requested == 1536);  // defaults to size
  CHECK(t.events[0].time_ns == 0);
  CHECK(t.events[1].kind == depot::trace_kind::out_of_memory);
  CHECK(t.device == "host:0");
  const depot::recorded_trace empty = depot::parse_trace(R"({"format":"depot.trace.v1","device":"cuda:1","events":[]})");
  CHECK(empty.events.empty());
}

TEST_CASE("trace: bad JSON traces name the event and the field")
{
  struct bad_case {
    std::string text;
    std::vector<std::string> expected;
  };
  const std::string head = R"({"format":"depot.trace.v1","device":"cuda:0","events":[)";
  const std::string ok = R"({"kind":"alloc","address":512,"size":512},)";
  const std::vector<bad_case> cases{
      {head + ok + R"({"kind":"alloc","address":512,"size":"12"}]})", {"t.json", "event 1", "'size'", "non-negative integer", "\"12\""}},
      {head + R"({"kind":"alloc","address":-5,"size":1}]})", {"event 0", "'address'", "-5"}},
      {head + R"({"kind":"alloc","address":5.5,"size":1}]})", {"event 0", "'address'", "5.5"}},
      {head + ok + ok + R"({"address":1,"size":1}]})", {"event 2", "'kind'", "missing"}},
      {head + R"({"kind":"allocate","address":1,"size":1}]})", {"event 0", "'kind'", "'allocate'", "one of alloc, free, segment_alloc, segment_free, oom, segment_map, segment_unmap, segment_move, got"}},
      {head + R"({"kind":"free","address":1,"size":1,"cache_hit":1}]})", {"event 0", "'cache_hit'", "true or false"}},
      {head + R"({"kind":"free","address":1,"size":1,"size":2}]})", {"event 0", "'size'", "twice"}},
      {head + R"({"kind":"free","address":1,"size":[1]}]})", {"event 0", "'size'", "array"}},
      {head + R"(7]})", {"event 0", "event object", "7"}},
      {head + R"([1]]})", {"event 0", "event object", "array"}},
      {R"({"device":"cuda:0","events":[]})", {"no \"format\""}},
      {R"({"format":"depot.snapshot.v1","device":"cuda:0","segments":[]})", {"depot.snapshot.v1", "snapshot, not a trace"}},
      {R"({"format":"depot.trace.v2","events":[]})", {"'depot.trace.v2'", "expected 'depot.trace.v1'"}},
      {R"({"format":"depot.trace.v1","device":"cuda:0"})", {"no \"events\""}},
      {R"({"format":"depot.trace.v1","events":{}})", {"\"events\" must be an array"}},
      {R"({"format":1,"events":[]})", {"\"format\" must be a string"}},
      {R"([1,2])", {"expected a JSON object"}},
      {"{\"format\":\"depot.trace.v1\",\n\"events\":[\n{\"kind\":\"alloc\",,}]}", {"line 3", "invalid JSON", "event 0"}},
      {"", {"empty"}},
      {"   \n  ", {"empty"}},
      {"hello", {"line 1", "neither a depot trace", "'hello'"}},
  };
  for (const bad_case& c : cases) {
    CAPTURE(c.text);
    const std::string msg = trace_error(c.text);
    REQUIRE_MESSAGE(!msg.empty(), "accepted: " << c.text);
    CHECK(contains(msg, "t.json"));
    for (const std::string& part : c.expected) CHECK_MESSAGE(contains(msg, part), msg << " lacks " << part);
  }
}

TEST_CASE("trace: bad RMM CSV logs name the line and the column")
{
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  const std::string ok = "1,10:00:00.000001,allocate,0x200,512,0x0\n";
  struct bad_case {
    std::string text;
    std::vector<std::string> expected;
  };
  const std::vector<bad_case> cases{
      {"Thread,Time,Action,Pointer,Size\n", {"line 1", "header"}},
      {"Thread,Time,Action,Pointer,Size,Strm\n" + ok, {"line 1", "header", "Strm"}},
      {header + ok + "1,10:00:00.5,allocate,0x200,12x,0x0\n", {"line 3", "'Size'", "'12x'"}},
      {header + ok + "1,10:00:00.5,allocate,0x200,-1,0x0\n", {"line 3", "'Size'"}},
      {header + "1,10:00:00.5,reserve,0x200,12,0x0\n", {"line 2", "'Action'", "'reserve'"}},
      {header + "1,25:00:00.5,free,0x200,12,0x0\n", {"line 2", "'Time'"}},
      {header + "1,yesterday,free,0x200,12,0x0\n", {"line 2", "'Time'"}},
      {header + "1,1.5,free,0xZZ,12,0x0\n", {"line 2", "'Pointer'", "'0xZZ'"}},
      {header + "1,1.5,free,0x10,12,stream\n", {"line 2", "'Stream'"}},
      {header + "t1,1.5,free,0x10,12,0x0\n", {"line 2", "'Thread'"}},
      {header + ok + ok + "1,10:00:00.000001,alloc", {"line 4", "6 comma-separated fields", "got 3", "truncated"}},
      {header + ok + "1,2,3,4,5,6,7\n", {"line 3", "got 7"}},
      {header + "1,1.1234567891,allocate,0x10,12,0x0\n", {"line 2", "'Time'"}},
  };
  for (const bad_case& c : cases) {
    CAPTURE(c.text);
    const std::string msg = trace_error(c.text, "log.csv");
    REQUIRE_MESSAGE(!msg.empty(), "accepted: " << c.text);
    CHECK(contains(msg, "log.csv"));
    for (const std::string& part : c.expected) CHECK_MESSAGE(contains(msg, part), msg << " lacks " << part);
  }
}

TEST_CASE("trace: every truncation and random corruption is an error or a valid trace, never a crash")
{
  const std::string json = depot::test::ladder_trace(3, 1).to_json();
  const std::string csv = depot::test::rmm_csv(depot::test::ladder_trace(3, 1));
  for (const std::string* text : {&json, &csv}) {
    const depot::recorded_trace full = depot::parse_trace(*text);
    for (std::size_t n = 0; n < text->size(); ++n) {
      const std::string cut = text->substr(0, n);
      try {
        const depot::recorded_trace t = depot::parse_trace(cut, "cut");
        // A CSV cut at a line end is a shorter valid log; a JSON cut never is.
        CHECK(text == &csv);
        CHECK(t.events.size() <= full.events.size());
      } catch (const depot::invalid_argument& e) {
        const std::string msg = e.what();
        CHECK(contains(msg, "cut"));
        const bool says_where = contains(msg, "line ") || contains(msg, "event ") || contains(msg, "empty");
        CHECK_MESSAGE(says_where, msg);
        if (text == &json && n > 0) CHECK_MESSAGE(contains(msg, "truncated"), msg);
      }
    }
  }
  std::mt19937_64 rng{depot::test::seed("trace corruption", 77)};
  const std::string alphabet = "{}[],:\"-.0123456789eEaxtrufln \n";
  int errors = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string t = round % 2 == 0 ? json : csv;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) t[rng() % t.size()] = alphabet[rng() % alphabet.size()];
    try {
      (void)depot::parse_trace(t, "fuzz");
    } catch (const depot::invalid_argument& e) {
      ++errors;
      CHECK(contains(e.what(), "fuzz"));
    }
  }
  CHECK(errors > 500);  // most corruptions are caught
}

TEST_CASE("trace: files that are missing, unreadable or not snapshots")
{
  temp_dir dir;
  try {
    (void)depot::read_trace(dir.path / "nope.json");
    FAIL("a missing file was read");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "nope.json"));
    CHECK(contains(e.what(), "no such file"));
  }
  CHECK_THROWS_AS((void)depot::read_snapshot(dir.path / "nope.json"), depot::invalid_argument);
  CHECK_THROWS_AS((void)depot::read_trace(dir.path), depot::invalid_argument);  // a directory

  const std::string good =
      R"({"format":"depot.snapshot.v1","device":"cuda:0","segments":[{"address":1024,"size":2048,"pool":"small","stream":0,)"
      R"("blocks":[{"address":1024,"size":512,"requested":500,"state":"allocated"},{"address":1536,"size":1536,"requested":0,"state":"free"}]}]})";
  const depot::allocator_snapshot s = depot::parse_snapshot(good);
  REQUIRE(s.segments.size() == 1);
  CHECK(s.segments[0].blocks[0].state == depot::block_state::allocated);
  CHECK(s.device.kind == depot::device_kind::cuda);
  CHECK_FALSE(s.segments[0].exported);  // optional: absent reads as not exported
  {
    std::string t = good;
    t.replace(t.find("\"stream\":0,"), 11, "\"stream\":0,\"exported\":true,");
    CHECK(depot::parse_snapshot(t).segments[0].exported);
  }

  // Read as it streams (SAX), yet as a document is: keys in any order (a segment's blocks
  // before its address, the format after the segments), unknown keys and nested values
  // skipped, a key given twice taking its last value.
  {
    const std::string shuffled =
        R"({"extra":{"nested":[1,{"a":[]}]},"segments":[{"blocks":[{"state":"allocated","requested":500,"size":512,)"
        R"("address":1024,"note":[1,2]},{"size":1536,"address":1536,"requested":0,"state":"free"}],"stream":7,)"
        R"("pool":"small","size":2048,"address":1024,"future":{"x":1}},{"address":8192,"size":512,"stream":0,)"
        R"("pool":"large","pool":"large","blocks":[{"address":8192,"size":512,"requested":1,"state":"pending_free"}]}],)"
        R"("device":"cuda:1","format":"depot.snapshot.v1"})";
    const depot::allocator_snapshot t = depot::parse_snapshot(shuffled);
    REQUIRE(t.segments.size() == 2);
    CHECK(t.device.index == 1);
    CHECK(t.segments[0].stream == 7);
    CHECK(t.segments[0].small_pool);
    REQUIRE(t.segments[0].blocks.size() == 2);
    CHECK(t.segments[0].blocks[0].requested == 500);
    CHECK(t.segments[0].blocks[1].state == depot::block_state::free);
    CHECK_FALSE(t.segments[1].small_pool);
    CHECK(t.segments[1].blocks[0].state == depot::block_state::pending_free);
    CHECK(depot::parse_snapshot(depot::parse_snapshot(good).to_json()).segments[0].blocks.size() == 2);
  }

  // An expandable segment with a hole: the unmapped block tiles the addresses, not the size.
  const std::string holed =
      R"({"format":"depot.snapshot.v1","device":"cuda:0","segments":[{"address":1024,"size":2048,"pool":"large","stream":0,)"
      R"("reserved_addresses":8192,"blocks":[{"address":1024,"size":512,"requested":500,"state":"allocated"},)"
      R"({"address":1536,"size":4096,"requested":0,"state":"unmapped"},{"address":5632,"size":1536,"requested":0,"state":"free"}]}]})";
  {
    const depot::allocator_snapshot h = depot::parse_snapshot(holed);
    REQUIRE(h.segments.size() == 1);
    REQUIRE(h.segments[0].blocks.size() == 3);
    CHECK(h.segments[0].blocks[1].state == depot::block_state::unmapped);
    CHECK(h.segments[0].size == 2048);
    CHECK(depot::parse_snapshot(h.to_json()).segments[0].blocks[1].state == depot::block_state::unmapped);
    auto holed_with = [&](const std::string& from, const std::string& to) {
      std::string t = holed;
      t.replace(t.find(from), from.size(), to);
      return t;
    };
    CHECK(contains(snapshot_error(holed_with("\"reserved_addresses\":8192,", "")), "outside an expandable segment"));
    CHECK(contains(snapshot_error(holed_with("\"size\":4096", "\"size\":8000")), "past its segment's 8192 reserved"));
    CHECK(contains(snapshot_error(holed_with("\"size\":2048", "\"size\":6144")), "cover 2048"));
  }

  struct bad_case {
    std::string text;
    std::vector<std::string> expected;
  };
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  const std::vector<bad_case> cases{
      {good.substr(0, good.size() / 2), {"invalid JSON", "truncated"}},
      {replace("\"state\":\"free\"", "\"state\":\"gone\""), {"segment 0", "block 1", "'state'", "'gone'", "one of allocated, pending_free, free, unmapped, got"}},
      {replace("\"size\":512", "\"size\":\"512\""), {"segment 0", "block 0", "'size'"}},
      {replace("\"address\":1536", "\"address\":1600"), {"block 1", "tile"}},
      {replace("\"size\":1536", "\"size\":1000"), {"segment 0", "cover"}},
      {replace("\"size\":1536", "\"size\":4000"), {"block 1", "past"}},
      {replace("\"pool\":\"small\"", "\"pool\":\"tiny\""), {"segment 0", "'pool'"}},
      {replace("\"device\":\"cuda:0\"", "\"device\":\"tpu:0\""), {"'device'"}},
      {replace("\"depot.snapshot.v1\"", "\"depot.trace.v1\""), {"trace, not a snapshot"}},
      {replace(",\"stream\":0", ""), {"segment 0", "'stream'", "missing"}},
      {replace("\"stream\":0,", "\"stream\":0,\"exported\":1,"), {"segment 0", "'exported'", "true or false"}},
      {"[]", {"expected a JSON object"}},
      {"7", {"expected a JSON object", "number"}},
      {replace("\"depot.snapshot.v1\"", "{\"v\":1}"), {"'format'", "expected a string", "an object"}},
      {replace("\"segments\":[", "\"segments\":{\"x\":["), {"'segments'", "expected an array"}},
      {replace("\"segments\":[{\"address\":1024", "\"segments\":[7,{\"address\":1024"), {"segment 0", "expected an object"}},
      {replace("\"blocks\":[{", "\"blocks\":[[],{"), {"segment 0", "block 0", "expected an object"}},
      {replace("\"blocks\":[", "\"blocks\":7,\"b\":["), {"segment 0", "'blocks'", "expected an array"}},
      {replace("\"blocks\":[", "\"b\":["), {"segment 0", "'blocks'", "missing"}},
      {replace("\"requested\":500", "\"requested\":-5"), {"block 0", "'requested'", "-5"}},
      {replace("\"requested\":500", "\"requested\":[5]"), {"block 0", "'requested'", "an array"}},
      {replace("\"requested\":500,", ""), {"block 0", "'requested'", "missing"}},
      {replace(",\"device\":\"cuda:0\"", ""), {"'device'", "missing"}},
      {replace("\"format\":\"depot.snapshot.v1\",", ""), {"'format'", "missing"}},
      {R"({"format":"depot.snapshot.v1","device":"cuda:0"})", {"'segments'", "missing"}},
  };
  for (const bad_case& c : cases) {
    CAPTURE(c.text);
    const std::string msg = snapshot_error(c.text);
    REQUIRE_MESSAGE(!msg.empty(), "accepted: " << c.text);
    CHECK(contains(msg, "s.json"));
    for (const std::string& part : c.expected) CHECK_MESSAGE(contains(msg, part), msg << " lacks " << part);
  }
}
