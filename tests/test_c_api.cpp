// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The C interface (depot/pool/c_api.h) over the process-wide allocators: what it hands out
// is the C++ pool's, its statistics are the C++ pool's field for field, and bad input gets
// a status and a message for the calling thread, never an exception, changing nothing.
#include "ipc_child_process.hpp"
#include "snapshot_queries.hpp"
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/format_address.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/detail/handle_table.hpp>
#include <depot/pool/ipc_handle.hpp>
#include <depot/pool/ipc_received.hpp>
#include <depot/pool/pool.hpp>

#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

template <class D>
constexpr depot_device_kind kind_of()
{
  if constexpr (std::is_same_v<D, depot::host>) return DEPOT_DEVICE_HOST;
  if constexpr (std::is_same_v<D, depot::cuda>) return DEPOT_DEVICE_CUDA;
  return DEPOT_DEVICE_HIP;
}

bool has(const char* text, const std::string& part) { return std::string{text}.find(part) != std::string::npos; }

// Every figure of the C statistics against the C++ ones (written apart from c_api.cpp's
// table, so a field it leaves out or swaps fails here).
void check_same(const depot_memory_stats& c, const depot::memory_stats& s)
{
  const std::pair<const depot_stat_array*, const depot::stat_array*> arrays[] = {
      {&c.allocated_bytes, &s.allocated_bytes},   {&c.requested_bytes, &s.requested_bytes},
      {&c.reserved_bytes, &s.reserved_bytes},     {&c.cached_bytes, &s.cached_bytes},
      {&c.active_bytes, &s.active_bytes},         {&c.inactive_split_bytes, &s.inactive_split_bytes},
      {&c.num_allocations, &s.num_allocations},   {&c.num_segments, &s.num_segments}};
  for (const auto& [x, y] : arrays) {
    const std::pair<const depot_stat*, const depot::stat*> cells[] = {
        {&x->all, &y->all}, {&x->small, &y->small}, {&x->large, &y->large}};
    for (const auto& [a, b] : cells) {
      CHECK(a->current == b->current);
      CHECK(a->peak == b->peak);
      CHECK(a->allocated == b->allocated);
      CHECK(a->freed == b->freed);
    }
  }
  CHECK(c.num_cache_hits == s.num_cache_hits);
  CHECK(c.num_cache_misses == s.num_cache_misses);
  CHECK(c.cache_hit_rate == s.cache_hit_rate);
  CHECK(c.peak_allocated == s.peak_allocated);
  CHECK(c.peak_cached == s.peak_cached);
  CHECK(c.num_alloc_retries == s.num_alloc_retries);
  CHECK(c.num_ooms == s.num_ooms);
  CHECK(c.num_segments_moved == s.num_segments_moved);
  CHECK(c.num_move_events == s.num_move_events);
  CHECK(c.num_move_syncs == s.num_move_syncs);
  CHECK(c.largest_free_block == s.largest_free_block);
  CHECK(c.fragmentation == s.fragmentation);
}

}  // namespace

TEST_CASE_TEMPLATE("c_api: blocks, streams and statistics of the process pool through the C interface", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  int count = -1;
  REQUIRE(depot_device_count(k, &count) == DEPOT_SUCCESS);
  CHECK(count == depot::device_count<D>());
  REQUIRE(count >= 1);
  auto& pool = depot::pool<D>(0);
  depot::stream<D> s1;
  depot::stream<D> s2;
  const depot::memory_stats before = pool.stats();

  void* a = reinterpret_cast<void*>(1);
  REQUIRE(depot_allocate(k, 0, 1000, s1.native(), &a) == DEPOT_SUCCESS);
  void* b = nullptr;
  REQUIRE(depot_allocate(k, 0, 3 << 20, nullptr, &b) == DEPOT_SUCCESS);  // the default stream
  void* z = reinterpret_cast<void*>(1);
  REQUIRE(depot_allocate(k, 0, 0, nullptr, &z) == DEPOT_SUCCESS);
  CHECK(z == nullptr);  // bytes == 0 gives NULL, as the C++ call
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 512 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 512 == 0);
  // The blocks are memory of the device: written and read back through the HAL.
  std::vector<unsigned char> out(1000, 0xab);
  std::vector<unsigned char> back(1000, 0);
  depot::runtime<D>::copy(a, out.data(), out.size());
  depot::runtime<D>::copy(back.data(), a, back.size());
  CHECK(back == out);

  // The C statistics are the C++ pool's, field for field, in the same state.
  depot_memory_stats cs{};
  REQUIRE(depot_get_memory_stats(k, 0, &cs) == DEPOT_SUCCESS);
  const depot::memory_stats now = pool.stats();
  check_same(cs, now);
  CHECK(now.num_allocations.all.current == before.num_allocations.all.current + 2);
  CHECK(now.allocated_bytes.all.current >= before.allocated_bytes.all.current + 1024 + (3 << 20));

  // Work on s2 uses a: its reuse waits for s2 (record_stream), then it is freed on its own
  // stream; b is freed in the order of s2.
  CHECK(depot_record_stream(k, 0, a, s2.native()) == DEPOT_SUCCESS);
  CHECK(depot_deallocate(k, 0, a) == DEPOT_SUCCESS);
  CHECK(depot_deallocate_on(k, 0, b, s2.native()) == DEPOT_SUCCESS);
  CHECK(depot_deallocate(k, 0, nullptr) == DEPOT_SUCCESS);  // a no-op
  s2.synchronize();
  REQUIRE(depot_get_memory_stats(k, 0, &cs) == DEPOT_SUCCESS);
  CHECK(cs.num_allocations.all.current == before.num_allocations.all.current);
  CHECK(cs.allocated_bytes.all.current == before.allocated_bytes.all.current);

  // The summary: its length alone, all of it, and cut short (always NUL-terminated).
  std::size_t length = 0;
  REQUIRE(depot_memory_summary(k, 0, nullptr, 0, &length) == DEPOT_SUCCESS);
  const std::string cpp = pool.summary();
  CHECK(length == cpp.size());
  std::vector<char> full(length + 1, 'x');
  REQUIRE(depot_memory_summary(k, 0, full.data(), full.size(), nullptr) == DEPOT_SUCCESS);
  CHECK(std::string{full.data()} == cpp);
  char small[10];
  std::memset(small, 'x', sizeof small);
  std::size_t cut_length = 0;
  REQUIRE(depot_memory_summary(k, 0, small, sizeof small, &cut_length) == DEPOT_SUCCESS);
  CHECK(cut_length == cpp.size());
  CHECK(std::strlen(small) == 9);
  CHECK(std::string{small} == cpp.substr(0, 9));

  // Peaks reset to the current figures; totals reset; the cache empties.
  CHECK(depot_reset_peak_stats(k, 0) == DEPOT_SUCCESS);
  REQUIRE(depot_get_memory_stats(k, 0, &cs) == DEPOT_SUCCESS);
  CHECK(cs.allocated_bytes.all.peak == cs.allocated_bytes.all.current);
  CHECK(depot_reset_memory_stats(k, 0) == DEPOT_SUCCESS);
  REQUIRE(depot_get_memory_stats(k, 0, &cs) == DEPOT_SUCCESS);
  CHECK(cs.num_allocations.all.allocated == 0);
  CHECK(cs.num_allocations.all.current == before.num_allocations.all.current);  // live figures kept
  const std::int64_t cached = pool.stats().cached_bytes.all.current;
  CHECK(depot_empty_cache(k, 0) == DEPOT_SUCCESS);
  CHECK(pool.stats().cached_bytes.all.current <= cached);
}

TEST_CASE_TEMPLATE("c_api: bad input gets a status and a message naming it, and changes nothing", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  const int count = depot::device_count<D>();
  auto& pool = depot::pool<D>(0);
  void* p = reinterpret_cast<void*>(1);

  CHECK(depot_allocate(k, 0, 64, nullptr, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "ptr is NULL"));
  CHECK(depot_device_count(k, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "count is NULL"));
  CHECK(depot_get_memory_stats(k, 0, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "stats is NULL"));
  CHECK(depot_memory_summary(k, 0, nullptr, 5, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "buffer is NULL but size is 5"));

  // Device indices outside [0, count): the message gives the valid range; *ptr is NULL.
  for (const int bad : {-1, count, INT_MAX}) {
    CAPTURE(bad);
    p = reinterpret_cast<void*>(1);
    CHECK(depot_allocate(k, bad, 64, nullptr, &p) == DEPOT_ERROR_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    CHECK(has(depot_last_error(), "device index " + std::to_string(bad) + " is out of range"));
    CHECK(has(depot_last_error(), "valid indices are [0, " + std::to_string(count) + ")"));
    CHECK(depot_empty_cache(k, bad) == DEPOT_ERROR_INVALID_ARGUMENT);
  }
  // A device kind that is none of the three.
  CHECK(depot_allocate(static_cast<depot_device_kind>(7), 0, 64, nullptr, &p) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "device kind 7 is not one of"));
  CHECK(depot_empty_cache(static_cast<depot_device_kind>(-2), 0) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "device kind -2"));

  // Sizes that cannot be served: out of memory with the request in the message, *ptr NULL.
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  p = reinterpret_cast<void*>(1);
  CHECK(depot_allocate(k, 0, huge, nullptr, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(p == nullptr);
  CHECK(has(depot_last_error(), std::to_string(huge)));

  // A double free and a foreign pointer: invalid, naming the pointer; the pool unchanged.
  void* q = nullptr;
  REQUIRE(depot_allocate(k, 0, 4096, nullptr, &q) == DEPOT_SUCCESS);
  REQUIRE(depot_deallocate(k, 0, q) == DEPOT_SUCCESS);
  const depot::memory_stats before = pool.stats();
  CHECK(depot_deallocate(k, 0, q) == DEPOT_ERROR_INVALID_ARGUMENT);
  char hex[32];
  std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(q)));
  CHECK(has(depot_last_error(), hex));
  int local = 0;
  CHECK(depot_deallocate_on(k, 0, &local, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_record_stream(k, 0, &local, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  const depot::memory_stats after = pool.stats();
  CHECK(after.num_allocations.all.current == before.num_allocations.all.current);
  CHECK(after.allocated_bytes.all.current == before.allocated_bytes.all.current);
  CHECK(after.reserved_bytes.all.current == before.reserved_bytes.all.current);

  // The message is the calling thread's: another thread's failures do not touch it, and a
  // thread that has not failed reads "".
  CHECK(depot_deallocate(k, 0, &local) == DEPOT_ERROR_INVALID_ARGUMENT);
  const std::string mine = depot_last_error();
  std::string other_before;
  std::string other_after;
  std::thread t([&] {
    other_before = depot_last_error();
    void* r = nullptr;
    (void)depot_allocate(k, -5, 1, nullptr, &r);
    other_after = depot_last_error();
  });
  t.join();
  CHECK(other_before.empty());
  CHECK(has(other_after.c_str(), "device index -5"));
  CHECK(std::string{depot_last_error()} == mine);
}

TEST_CASE("c_api: a backend this build lacks, and the status names")
{
#if DEPOT_HAS_CUDA
  const depot_device_kind missing = DEPOT_DEVICE_HIP;
  const char* option = "-Dgpu=hip";
#else
  const depot_device_kind missing = DEPOT_DEVICE_CUDA;
  const char* option = "-Dgpu=cuda";
#endif
  int count = -1;
  CHECK(depot_device_count(missing, &count) == DEPOT_ERROR_NOT_SUPPORTED);
  CHECK(count == 0);
  CHECK(has(depot_last_error(), option));
  void* p = reinterpret_cast<void*>(1);
  CHECK(depot_allocate(missing, 0, 64, nullptr, &p) == DEPOT_ERROR_NOT_SUPPORTED);
  CHECK(p == nullptr);
  CHECK(has(depot_last_error(), "this build of depot has no"));

  CHECK(std::string{depot_status_name(DEPOT_SUCCESS)} == "DEPOT_SUCCESS");
  CHECK(std::string{depot_status_name(DEPOT_ERROR_INVALID_ARGUMENT)} == "DEPOT_ERROR_INVALID_ARGUMENT");
  CHECK(std::string{depot_status_name(DEPOT_ERROR_OUT_OF_MEMORY)} == "DEPOT_ERROR_OUT_OF_MEMORY");
  CHECK(std::string{depot_status_name(DEPOT_ERROR_NOT_SUPPORTED)} == "DEPOT_ERROR_NOT_SUPPORTED");
  CHECK(std::string{depot_status_name(DEPOT_ERROR_BACKEND)} == "DEPOT_ERROR_BACKEND");
  CHECK(std::string{depot_status_name(DEPOT_ERROR_INTERNAL)} == "DEPOT_ERROR_INTERNAL");
  CHECK(std::string{depot_status_name(static_cast<depot_status>(99))} == "unknown depot_status");
}

namespace {

// What the out-of-memory callback saw (user_data points at it).
struct oom_calls {
  std::vector<unsigned> attempts;
  std::size_t requested = 0;
  std::string message;
  unsigned retry_below = 0;  // answers "retry" while attempt < retry_below
};

int record_oom(const char* message, size_t requested_bytes, unsigned attempt, void* user_data)
{
  auto& c = *static_cast<oom_calls*>(user_data);
  c.attempts.push_back(attempt);
  c.requested = requested_bytes;
  c.message = message;
  return attempt < c.retry_below ? 1 : 0;
}

// The text a buffer-filling call gives, through the length query first.
template <class Call>
std::string text_of(Call call)
{
  std::size_t length = 0;
  REQUIRE(call(nullptr, 0, &length) == DEPOT_SUCCESS);
  std::vector<char> buffer(length + 1);
  REQUIRE(call(buffer.data(), buffer.size(), nullptr) == DEPOT_SUCCESS);
  return std::string{buffer.data(), length};
}

}  // namespace

TEST_CASE_TEMPLATE("c_api: snapshot and trace as JSON, the out-of-memory callback and the pinned pool", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  auto& pool = depot::pool<D>(0);
  void* held = nullptr;
  REQUIRE(depot_allocate(k, 0, 5 << 20, nullptr, &held) == DEPOT_SUCCESS);

  // The snapshot is the C++ one in the same state; its segments sum to the reserved bytes.
  const std::string snap = text_of([&](char* b, std::size_t n, std::size_t* len) {
    return depot_memory_snapshot_json(k, 0, b, n, len);
  });
  CHECK(snap == pool.snapshot().to_json());
  const auto j = nlohmann::json::parse(snap);
  CHECK(j["format"] == "depot.snapshot.v1");
  std::int64_t seg_bytes = 0;
  bool found = false;
  for (const auto& seg : j["segments"]) {
    seg_bytes += seg["size"].get<std::int64_t>();
    for (const auto& blk : seg["blocks"]) {
      found = found || (blk["address"].get<std::uintptr_t>() == reinterpret_cast<std::uintptr_t>(held) &&
                        blk["state"] == "allocated");
    }
  }
  depot_memory_stats st{};
  REQUIRE(depot_get_memory_stats(k, 0, &st) == DEPOT_SUCCESS);
  CHECK(seg_bytes == st.reserved_bytes.all.current);
  CHECK(found);
  CHECK(depot_memory_snapshot_json(k, 0, nullptr, 3, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_memory_snapshot_json: buffer is NULL but size is 3"));

  // The trace: on, one allocate and one free of a block, off again (the pool is shared).
  REQUIRE(depot_set_trace_capacity(k, 0, 64) == DEPOT_SUCCESS);
  void* t = nullptr;
  REQUIRE(depot_allocate(k, 0, 3000, nullptr, &t) == DEPOT_SUCCESS);
  REQUIRE(depot_deallocate(k, 0, t) == DEPOT_SUCCESS);
  const std::string trace = text_of([&](char* b, std::size_t n, std::size_t* len) {
    return depot_trace_json(k, 0, b, n, len);
  });
  REQUIRE(depot_set_trace_capacity(k, 0, 0) == DEPOT_SUCCESS);
  const auto tj = nlohmann::json::parse(trace);
  CHECK(tj["format"] == "depot.trace.v1");
  int alloc_events = 0;
  int free_events = 0;
  for (const auto& e : tj["events"]) {
    if (e["address"].get<std::uintptr_t>() != reinterpret_cast<std::uintptr_t>(t)) continue;
    alloc_events += e["kind"] == "alloc" && e["requested"] == 3000;
    free_events += e["kind"] == "free";
  }
  CHECK(alloc_events == 1);
  CHECK(free_events == 1);

  // The out-of-memory callback: a request no device holds (1 PiB: the upstream refuses it)
  // reaches it with the request and the report; retried while it says so; NULL removes it.
  const std::size_t huge = std::size_t{1} << 50;
  oom_calls calls;
  REQUIRE(depot_set_oom_handler(k, 0, &record_oom, &calls) == DEPOT_SUCCESS);
  void* p = reinterpret_cast<void*>(1);
  CHECK(depot_allocate(k, 0, huge, nullptr, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(p == nullptr);
  CHECK(calls.attempts == std::vector<unsigned>{1});
  CHECK(calls.requested == huge);
  CHECK(has(calls.message.c_str(), std::to_string(huge)));
  CHECK(std::string{depot_last_error()} == calls.message);  // the report the caller gets
  calls.attempts.clear();
  calls.retry_below = 3;
  CHECK(depot_allocate(k, 0, huge, nullptr, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(calls.attempts == std::vector<unsigned>{1, 2, 3});
  REQUIRE(depot_set_oom_handler(k, 0, nullptr, nullptr) == DEPOT_SUCCESS);
  calls.attempts.clear();
  CHECK(depot_allocate(k, 0, huge, nullptr, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(calls.attempts.empty());
  CHECK(depot_set_oom_handler(k, -1, &record_oom, &calls) == DEPOT_ERROR_INVALID_ARGUMENT);

  // The pinned pool: host memory the CPU writes and reads, whatever the backend.
  void* pinned = nullptr;
  REQUIRE(depot_allocate_pinned(k, 0, 1 << 20, nullptr, &pinned) == DEPOT_SUCCESS);
  REQUIRE(pinned != nullptr);
  std::memset(pinned, 0x5a, 1 << 20);
  CHECK(static_cast<unsigned char*>(pinned)[(1 << 20) - 1] == 0x5a);
  CHECK(depot_deallocate_pinned(k, 0, pinned) == DEPOT_SUCCESS);
  CHECK(depot_deallocate_pinned(k, 0, pinned) == DEPOT_ERROR_INVALID_ARGUMENT);  // a double free
  CHECK(depot_allocate_pinned(k, 0, 64, nullptr, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_deallocate(k, 0, held) == DEPOT_SUCCESS);
}

namespace {

// A fixed pool's out-of-memory callback (user_data points at it): frees `give_back` (once)
// and retries, or declines.
struct fixed_oom {
  depot_fixed_pool* pool = nullptr;
  void* give_back = nullptr;
  std::vector<unsigned> attempts;
  std::size_t requested = 0;
};

int free_one_and_retry(const char*, size_t requested_bytes, unsigned attempt, void* user_data)
{
  auto& c = *static_cast<fixed_oom*>(user_data);
  c.attempts.push_back(attempt);
  c.requested = requested_bytes;
  if (c.give_back == nullptr) return 0;
  const depot_status s = depot_fixed_pool_deallocate(c.pool, std::exchange(c.give_back, nullptr));
  return s == DEPOT_SUCCESS ? 1 : 0;
}

}  // namespace

TEST_CASE_TEMPLATE("c_api: a fixed pool's blocks, statistics, defragment and out-of-memory callback", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  depot_fixed_pool* fp = nullptr;
  REQUIRE(depot_fixed_pool_create(k, 0, 10 * 4096 + 100, 4000, &fp) == DEPOT_SUCCESS);
  REQUIRE(fp != nullptr);
  depot_fixed_pool_stats st{};
  REQUIRE(depot_fixed_pool_get_stats(fp, &st) == DEPOT_SUCCESS);
  CHECK(st.block_size == 4096);  // rounded up to the 256-byte alignment
  CHECK(st.total_blocks == 10);
  CHECK(st.pool_size == 10 * 4096);
  CHECK(st.free_blocks == 10);
  CHECK(st.used_blocks == 0);

  // Ten distinct, aligned, non-overlapping blocks of device memory, lowest address first.
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    REQUIRE(depot_fixed_pool_allocate(fp, &p) == DEPOT_SUCCESS);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    depot::runtime<D>::set_async(p, i + 1, 4096, nullptr);
    blocks.push_back(p);
  }
  depot::runtime<D>::synchronize(0);
  CHECK(blocks[1] == static_cast<std::byte*>(blocks[0]) + 4096);
  for (int i = 0; i < 10; ++i) {
    unsigned char first = 0;
    unsigned char last = 0;
    depot::runtime<D>::copy(&first, blocks[static_cast<std::size_t>(i)], 1);
    depot::runtime<D>::copy(&last, static_cast<std::byte*>(blocks[static_cast<std::size_t>(i)]) + 4095, 1);
    CHECK(first == i + 1);
    CHECK(last == i + 1);
  }

  // Every block in use: out of memory, *ptr NULL, the message says why; counted a miss.
  void* p = reinterpret_cast<void*>(1);
  CHECK(depot_fixed_pool_allocate(fp, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(p == nullptr);
  CHECK(has(depot_last_error(), "all 10 blocks"));
  REQUIRE(depot_fixed_pool_get_stats(fp, &st) == DEPOT_SUCCESS);
  CHECK(st.used_blocks == 10);
  CHECK(st.peak_used_blocks == 10);
  CHECK(st.hits == 10);
  CHECK(st.misses == 1);
  CHECK(st.hit_rate == doctest::Approx(10.0 / 11.0));
  CHECK(st.fragmentation == 0.0);

  // The callback: it frees a block and says retry, so the request is served; one that
  // declines leaves it out of memory (attempt 1 only); NULL removes it.
  fixed_oom cb;
  cb.pool = fp;
  cb.give_back = blocks[3];
  REQUIRE(depot_fixed_pool_set_oom_handler(fp, &free_one_and_retry, &cb) == DEPOT_SUCCESS);
  REQUIRE(depot_fixed_pool_allocate(fp, &p) == DEPOT_SUCCESS);
  CHECK(p == blocks[3]);
  CHECK(cb.attempts == std::vector<unsigned>{1});
  CHECK(cb.requested == 4096);
  cb.attempts.clear();
  CHECK(depot_fixed_pool_allocate(fp, &p) == DEPOT_ERROR_OUT_OF_MEMORY);  // nothing left to give
  CHECK(cb.attempts == std::vector<unsigned>{1});
  REQUIRE(depot_fixed_pool_set_oom_handler(fp, nullptr, nullptr) == DEPOT_SUCCESS);
  cb.attempts.clear();
  CHECK(depot_fixed_pool_allocate(fp, &p) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(cb.attempts.empty());

  // Every other block freed: runs of one free block; defragment hands out the lowest first.
  for (std::size_t i = 0; i < 10; i += 2) REQUIRE(depot_fixed_pool_deallocate(fp, blocks[i]) == DEPOT_SUCCESS);
  REQUIRE(depot_fixed_pool_get_stats(fp, &st) == DEPOT_SUCCESS);
  CHECK(st.free_blocks == 5);
  CHECK(st.largest_free_run == 1);
  CHECK(st.fragmentation == doctest::Approx(0.8));
  CHECK(st.misses == 3);
  // Bad frees: a double free and a pointer inside a block name the pointer and change
  // nothing; NULL is a no-op.
  CHECK(depot_fixed_pool_deallocate(fp, blocks[0]) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "double free"));
  CHECK(depot_fixed_pool_deallocate(fp, static_cast<std::byte*>(blocks[1]) + 8) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "is not a block of this pool"));
  CHECK(depot_fixed_pool_deallocate(fp, nullptr) == DEPOT_SUCCESS);
  REQUIRE(depot_fixed_pool_get_stats(fp, &st) == DEPOT_SUCCESS);
  CHECK(st.free_blocks == 5);
  for (std::size_t i = 1; i < 10; i += 2) REQUIRE(depot_fixed_pool_deallocate(fp, blocks[i]) == DEPOT_SUCCESS);
  REQUIRE(depot_fixed_pool_defragment(fp) == DEPOT_SUCCESS);
  REQUIRE(depot_fixed_pool_allocate(fp, &p) == DEPOT_SUCCESS);
  CHECK(p == blocks[0]);
  REQUIRE(depot_fixed_pool_allocate(fp, &p) == DEPOT_SUCCESS);
  CHECK(p == blocks[1]);

  // Destroyed (with blocks in use): the handle is refused from then on, and never reused.
  REQUIRE(depot_fixed_pool_destroy(fp) == DEPOT_SUCCESS);
  depot_fixed_pool* again = nullptr;
  REQUIRE(depot_fixed_pool_create(k, 0, 4096, 4096, &again) == DEPOT_SUCCESS);
  CHECK(again != fp);
  CHECK(depot_fixed_pool_allocate(fp, &p) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(p == nullptr);
  CHECK(has(depot_last_error(), "is not a live fixed pool"));
  CHECK(depot_fixed_pool_destroy(fp) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_fixed_pool_get_stats(fp, &st) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_fixed_pool_destroy(again) == DEPOT_SUCCESS);
  CHECK(depot_fixed_pool_destroy(nullptr) == DEPOT_SUCCESS);  // a no-op
}

TEST_CASE_TEMPLATE("c_api: a fixed pool refuses bad input with a status and a message naming it", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  const int count = depot::device_count<D>();
  depot_fixed_pool* fp = reinterpret_cast<depot_fixed_pool*>(1);

  CHECK(depot_fixed_pool_create(k, 0, 4096, 512, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_fixed_pool_create: pool is NULL"));
  // Sizes: a block of 0 bytes or above 2^48, a pool smaller than one block; *pool NULL.
  CHECK(depot_fixed_pool_create(k, 0, 4096, 0, &fp) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(fp == nullptr);
  CHECK(has(depot_last_error(), "block_size must be at least 1 byte"));
  CHECK(depot_fixed_pool_create(k, 0, SIZE_MAX, (std::size_t{1} << 48) + 1, &fp) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "exceeds 2^48 bytes"));
  CHECK(depot_fixed_pool_create(k, 0, 100, 4096, &fp) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "pool_size 100 is smaller than one block of 4096 bytes"));
  // More than any device holds: out of memory, nothing made.
  CHECK(depot_fixed_pool_create(k, 0, std::size_t{1} << 50, 4096, &fp) == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(fp == nullptr);
  // Devices outside [0, count) and a kind that is none of the three.
  for (const int bad : {-1, count, INT_MAX}) {
    CAPTURE(bad);
    CHECK(depot_fixed_pool_create(k, bad, 4096, 512, &fp) == DEPOT_ERROR_INVALID_ARGUMENT);
    CHECK(fp == nullptr);
    CHECK(has(depot_last_error(), "valid indices are [0, " + std::to_string(count) + ")"));
  }
  CHECK(depot_fixed_pool_create(static_cast<depot_device_kind>(7), 0, 4096, 512, &fp) ==
        DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "device kind 7"));

  // Handles that are no pool: NULL, and a made-up one (the address of a local).
  void* p = reinterpret_cast<void*>(1);
  CHECK(depot_fixed_pool_allocate(nullptr, &p) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(p == nullptr);
  CHECK(has(depot_last_error(), "depot_fixed_pool_allocate: pool is NULL"));
  int local = 0;
  auto* made_up = reinterpret_cast<depot_fixed_pool*>(&local);
  CHECK(depot_fixed_pool_deallocate(made_up, &local) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "is not a live fixed pool"));
  CHECK(depot_fixed_pool_defragment(made_up) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_fixed_pool_set_oom_handler(made_up, nullptr, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_fixed_pool_destroy(made_up) == DEPOT_ERROR_INVALID_ARGUMENT);

  // NULL out-pointers on a live pool, and a foreign pointer: refused, the pool unchanged.
  REQUIRE(depot_fixed_pool_create(k, 0, 4 * 512, 512, &fp) == DEPOT_SUCCESS);
  CHECK(depot_fixed_pool_allocate(fp, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "ptr is NULL"));
  CHECK(depot_fixed_pool_get_stats(fp, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "stats is NULL"));
  CHECK(depot_fixed_pool_deallocate(fp, &local) == DEPOT_ERROR_INVALID_ARGUMENT);
  char hex[32];
  std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(&local)));
  CHECK(has(depot_last_error(), hex));
  depot_fixed_pool_stats st{};
  REQUIRE(depot_fixed_pool_get_stats(fp, &st) == DEPOT_SUCCESS);
  CHECK(st.free_blocks == 4);
  CHECK(st.hits == 0);
  CHECK(st.misses == 0);
  CHECK(depot_fixed_pool_destroy(fp) == DEPOT_SUCCESS);
}

// Threads using one pool while another makes and destroys pools (the handle table's writes
// beside its reads), and a pool destroyed while a thread is inside a call on it: that call
// finishes on the pool, later calls are refused. Run under ThreadSanitizer by tools/test.
TEST_CASE("c_api: fixed pools used, made and destroyed on many threads at once")
{
  const std::uint64_t seed = depot::test::seed("c_api fixed pools threads", 41);
  depot_fixed_pool* shared = nullptr;
  REQUIRE(depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 8 * 512, 512, &shared) == DEPOT_SUCCESS);
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> users;
  for (int t = 0; t < 4; ++t) {
    users.emplace_back([&, t] {
      std::uint64_t x = seed + static_cast<std::uint64_t>(t);
      for (int i = 0; i < 500; ++i) {
        void* p = nullptr;
        if (depot_fixed_pool_allocate(shared, &p) != DEPOT_SUCCESS) {
          ++failures;  // 4 threads, 8 blocks, one each at a time: never exhausted
          continue;
        }
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        std::memset(p, static_cast<int>(x >> 56), 512);
        if (static_cast<unsigned char*>(p)[511] != static_cast<unsigned char>(x >> 56)) ++failures;
        if (depot_fixed_pool_deallocate(shared, p) != DEPOT_SUCCESS) ++failures;
      }
    });
  }
  std::thread maker([&] {
    while (!stop.load()) {
      depot_fixed_pool* mine = nullptr;
      if (depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 2 * 512, 512, &mine) != DEPOT_SUCCESS) ++failures;
      void* p = nullptr;
      if (depot_fixed_pool_allocate(mine, &p) != DEPOT_SUCCESS) ++failures;
      if (depot_fixed_pool_destroy(mine) != DEPOT_SUCCESS) ++failures;  // with a block in use
      if (depot_fixed_pool_allocate(mine, &p) != DEPOT_ERROR_INVALID_ARGUMENT) ++failures;
    }
  });
  for (auto& u : users) u.join();
  stop.store(true);
  maker.join();
  CHECK(failures.load() == 0);
  depot_fixed_pool_stats st{};
  REQUIRE(depot_fixed_pool_get_stats(shared, &st) == DEPOT_SUCCESS);
  CHECK(st.hits == 4 * 500);
  CHECK(st.used_blocks == 0);

  // Destroyed while a thread is inside a call on it (its out-of-memory callback, which waits
  // for the destroy): the call finishes on the pool (the callback's free and the retry
  // succeed), and the handle is refused after.
  struct inside {
    depot_fixed_pool* pool;
    void* held;
    std::atomic<int> stage{0};
  };
  depot_fixed_pool* doomed = nullptr;
  REQUIRE(depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 512, 512, &doomed) == DEPOT_SUCCESS);
  inside in{doomed, nullptr};
  REQUIRE(depot_fixed_pool_allocate(doomed, &in.held) == DEPOT_SUCCESS);
  const depot_oom_callback wait_then_free = [](const char*, size_t, unsigned, void* user_data) -> int {
    auto& s = *static_cast<inside*>(user_data);
    s.stage.store(1);
    while (s.stage.load() != 2) std::this_thread::yield();  // the pool is destroyed meanwhile
    return depot_fixed_pool_deallocate(s.pool, s.held) == DEPOT_ERROR_INVALID_ARGUMENT ? 0 : 1;
  };
  REQUIRE(depot_fixed_pool_set_oom_handler(doomed, wait_then_free, &in) == DEPOT_SUCCESS);
  depot_status during = DEPOT_SUCCESS;
  void* got = nullptr;
  std::thread caller([&] { during = depot_fixed_pool_allocate(doomed, &got); });
  while (in.stage.load() != 1) std::this_thread::yield();
  CHECK(depot_fixed_pool_destroy(doomed) == DEPOT_SUCCESS);
  in.stage.store(2);
  caller.join();
  // The callback's free was refused (the handle is gone), so it declined: the call under way
  // ended out of memory on a pool that was still whole (no use after free: ASan checks).
  CHECK(during == DEPOT_ERROR_OUT_OF_MEMORY);
  CHECK(got == nullptr);
  CHECK(depot_fixed_pool_allocate(doomed, &got) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_fixed_pool_destroy(shared) == DEPOT_SUCCESS);
}

TEST_CASE_TEMPLATE("c_api: a graph capture's allocations come from its own pool until released", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  auto& pool = depot::pool<D>(0);
  depot::stream<D> s;
  const auto capture_pool_of = [&](const void* p) { return depot::test::capture_pool_of(pool.snapshot(), p); };
  // A block freed on s before: a capture must not reuse it.
  void* before = nullptr;
  REQUIRE(depot_allocate(k, 0, 3 << 20, s.native(), &before) == DEPOT_SUCCESS);
  REQUIRE(depot_deallocate(k, 0, before) == DEPOT_SUCCESS);

  std::uint64_t cp = 0;
  REQUIRE(depot_begin_capture(k, 0, s.native(), 0, &cp) == DEPOT_SUCCESS);
  CHECK(cp != 0);
  void* inside = nullptr;
  REQUIRE(depot_allocate(k, 0, 3 << 20, s.native(), &inside) == DEPOT_SUCCESS);
  CHECK(inside != before);
  CHECK(capture_pool_of(inside) == cp);
  // While a capture is under way nothing is released: refused, with the reason.
  CHECK(depot_empty_cache(k, 0) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "capture"));
  // A second capture on the same stream, and an unknown pool to share: refused.
  std::uint64_t other = 0;
  CHECK(depot_begin_capture(k, 0, s.native(), 0, &other) == DEPOT_ERROR_INVALID_ARGUMENT);
  depot::stream<D> s2;
  CHECK(depot_begin_capture(k, 0, s2.native(), cp + 1000, &other) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), std::to_string(cp + 1000)));
  REQUIRE(depot_deallocate(k, 0, inside) == DEPOT_SUCCESS);
  REQUIRE(depot_end_capture(k, 0, s.native()) == DEPOT_SUCCESS);
  // The pool keeps its memory after the capture (a replay uses it) until released.
  REQUIRE(pool.capture_pools().size() == 1);
  CHECK(pool.capture_pools()[0].first == cp);
  CHECK(capture_pool_of(inside) == cp);
  void* after = nullptr;
  REQUIRE(depot_allocate(k, 0, 3 << 20, s.native(), &after) == DEPOT_SUCCESS);
  CHECK(capture_pool_of(after) == 0);  // the stream's own cache again
  REQUIRE(depot_deallocate(k, 0, after) == DEPOT_SUCCESS);
  REQUIRE(depot_release_capture_pool(k, 0, cp) == DEPOT_SUCCESS);
  CHECK(pool.capture_pools().empty());
  CHECK(capture_pool_of(inside) == 0);  // back to the allocator

  // Calls out of order and bad input: refused, changing nothing.
  CHECK(depot_end_capture(k, 0, s.native()) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_release_capture_pool(k, 0, cp) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_begin_capture(k, 0, s.native(), 0, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "pool_out is NULL"));
  CHECK(depot_begin_capture(k, -1, s.native(), 0, &other) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(pool.capture_pools().empty());
  CHECK(depot_empty_cache(k, 0) == DEPOT_SUCCESS);
}

// A block of n bytes of the process pool of D's device 0, every byte 7 (for the IPC tests).
template <depot::device D>
void* sevens(std::size_t n)
{
  void* block = nullptr;
  REQUIRE(depot_allocate(kind_of<D>(), 0, n, nullptr, &block) == DEPOT_SUCCESS);
  depot::runtime<D>::set_async(block, 7, n, nullptr);
  depot::runtime<D>::synchronize(0);
  return block;
}

// Whether every byte of the n bytes at block is 9 (what depot-ipc-child wrote).
template <depot::device D>
void check_nines(const void* block, std::size_t n)
{
  std::vector<unsigned char> seen(n);
  depot::runtime<D>::copy(seen.data(), block, n);
  CHECK(std::count(seen.begin(), seen.end(), 9) == static_cast<std::ptrdiff_t>(n));
}

// Writes `text` to fd framed as ipc_send frames a handle: its length (4 bytes), then it.
void write_framed(int fd, const std::string& text)
{
  const auto length = static_cast<std::uint32_t>(text.size());
  REQUIRE(::write(fd, &length, 4) == 4);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
}

// The out-values of depot_ipc_open / depot_ipc_receive (mapping, pointer, bytes), set to
// markers: check_cleared() checks that a refused call cleared them all, then sets them again.
struct opened_outs {
  int marked = 0;
  std::tuple<depot_ipc_mapping*, void*, std::size_t> values;
  opened_outs() { mark(); }
  void mark() { values = {reinterpret_cast<depot_ipc_mapping*>(std::uintptr_t{0x5eed}), &marked, 5}; }
  void check_cleared()
  {
    CHECK(std::get<0>(values) == nullptr);
    CHECK(std::get<1>(values) == nullptr);
    CHECK(std::get<2>(values) == 0);
    mark();
  }
};

TEST_CASE_TEMPLATE("c_api: IPC export, open and close; bad input refused", D, DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  constexpr std::size_t n = 3 << 20;
  void* const block = sevens<D>(n);
  char text[512] = "unchanged";
  std::size_t length = 99;

  // Bad input, on every backend: refused, nothing exported or opened.
  int local = 0;
  CHECK(depot_ipc_export(k, 0, &local, text, sizeof text, &length) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), depot::format_address(&local)));
  CHECK(text[0] == '\0');
  CHECK(length == 99);
  CHECK(depot_ipc_export(k, 0, block, nullptr, 5, &length) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "buffer is NULL but size is 5"));
  CHECK(depot_ipc_export(static_cast<depot_device_kind>(7), 0, block, text, sizeof text, &length) ==
        DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_ipc_export(k, -1, block, text, sizeof text, &length) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(length == 99);
  opened_outs out;
  auto& [m, p, bytes] = out.values;
  CHECK(depot_ipc_open(nullptr, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "handle is NULL"));
  out.check_cleared();
  CHECK(depot_ipc_open("not a handle", &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  out.check_cleared();
  depot::ipc_handle made_up;
  made_up.device = depot::device_id::of<D>(depot::device_count<D>());  // one past the last device
  made_up.size = made_up.requested = 512;
  CHECK(depot_ipc_open(made_up.to_hex().c_str(), &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  out.check_cleared();
  CHECK(depot_ipc_open(made_up.to_hex().c_str(), nullptr, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "mapping is NULL"));
  CHECK(depot_ipc_close(m) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "mapping 0x5eed is not an open IPC mapping"));
  CHECK(depot_ipc_close(nullptr) == DEPOT_SUCCESS);

  if constexpr (!depot::runtime<D>::has_ipc) {
    // The host backend's memory is the process's own: export and open say so.
    CHECK(depot_ipc_export(k, 0, block, text, sizeof text, &length) == DEPOT_ERROR_NOT_SUPPORTED);
    CHECK(has(depot_last_error(), "cannot share memory"));
    CHECK(text[0] == '\0');
    made_up.device = depot::device_id::of<D>(0);  // (no text names a host block)
    CHECK(depot_ipc_open(made_up.to_hex().c_str(), &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
    CHECK(has(depot_last_error(), "has no interprocess memory"));
    out.check_cleared();
  } else {
    // The length alone, then a buffer one byte short (refused, not cut), then the handle.
    length = 0;
    REQUIRE(depot_ipc_export(k, 0, block, nullptr, 0, &length) == DEPOT_SUCCESS);
    CHECK(length >= depot::ipc_handle::hex_length / 2);  // (checked exactly once parsed)
    std::string handle(length, 'x');
    CHECK(depot_ipc_export(k, 0, block, handle.data(), length, &length) == DEPOT_ERROR_INVALID_ARGUMENT);
    CHECK(has(depot_last_error(), "the handle takes " + std::to_string(length + 1) + " bytes"));
    CHECK(handle[0] == '\0');
    handle.assign(length + 1, 'x');
    REQUIRE(depot_ipc_export(k, 0, block, handle.data(), handle.size(), &length) == DEPOT_SUCCESS);
    CHECK(std::strlen(handle.c_str()) == length);
    handle.resize(length);
    const depot::ipc_handle h = depot::ipc_handle::from_hex(handle);
    // (a block of an expandable segment names its pages: DEPOT_ALLOC_CONF in gpu-check)
    CHECK(length == (h.expandable() ? depot::ipc_handle::expandable_hex_length(h.fds.size())
                                    : depot::ipc_handle::hex_length));
    CHECK(h.requested == n);
    CHECK(h.device == depot::device_id::of<D>(0));

    // In this process the handle opens to the block itself; a mapping closes once.
    REQUIRE(depot_ipc_open(handle.c_str(), &m, &p, &bytes) == DEPOT_SUCCESS);
    CHECK(p == block);
    CHECK(bytes == n);
    CHECK(depot_ipc_close(m) == DEPOT_SUCCESS);
    CHECK(depot_ipc_close(m) == DEPOT_ERROR_INVALID_ARGUMENT);

    // Another process opens it twice through the C interface, finds 7s and writes 9s.
    depot::test::allow_children_to_take_descriptors();
    CHECK(depot::test::exit_status(depot::test::spawn_ipc_child({"--c", handle, "7", "9"})) == 0);
    check_nines<D>(block, n);
  }
  REQUIRE(depot_deallocate(k, 0, block) == DEPOT_SUCCESS);
  // A freed block is no longer live: refused.
  CHECK(depot_ipc_export(k, 0, block, text, sizeof text, &length) == DEPOT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE_TEMPLATE("c_api: IPC over a Unix socket (depot_ipc_send, depot_ipc_receive); bad input refused", D,
                   DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  constexpr std::size_t n = 3 << 20;
  void* const block = sevens<D>(n);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int local = 0;
  opened_outs out;
  auto& [m, p, bytes] = out.values;

  // Bad input, on every backend: refused, nothing sent or opened.
  CHECK(depot_ipc_send(sv[0], k, 0, &local, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), depot::format_address(&local)));
  CHECK(depot_ipc_send(sv[0], k, 0, block, -2) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "timeout_ms -2 is neither -1 (no timeout) nor 0 or more milliseconds"));
  CHECK(depot_ipc_send(sv[0], static_cast<depot_device_kind>(7), 0, block, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_ipc_send(sv[0], k, -1, block, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_ipc_receive(sv[1], -1, nullptr, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_receive: mapping is NULL"));
  CHECK(depot_ipc_receive(sv[1], -2, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "timeout_ms -2"));
  out.check_cleared();
  // Nothing was sent by the refused calls: nothing is ready.
  CHECK(depot_ipc_receive(sv[1], 0, &m, &p, &bytes) == DEPOT_ERROR_BACKEND);
  CHECK(has(depot_last_error(), "ipc_receive"));
  out.check_cleared();
  // Data that is no handle, a handle too long to be one, a handle of a device past the last.
  write_framed(sv[0], "not a handle");
  CHECK(depot_ipc_receive(sv[1], 1000, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  out.check_cleared();
  const std::uint32_t huge = 1U << 30;
  REQUIRE(::write(sv[0], &huge, 4) == 4);
  CHECK(depot_ipc_receive(sv[1], 1000, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "a handle of 1073741824 characters announced"));
  out.check_cleared();
  ::close(sv[0]);
  ::close(sv[1]);
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  depot::ipc_handle made_up;
  made_up.device = depot::device_id::of<D>(depot::device_count<D>());
  made_up.size = made_up.requested = 512;
  write_framed(sv[0], made_up.to_hex());
  CHECK(depot_ipc_receive(sv[1], 1000, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  out.check_cleared();
  // A socket whose other end is closed: a failing call, named.
  ::close(sv[0]);
  CHECK(depot_ipc_receive(sv[1], -1, &m, &p, &bytes) == DEPOT_ERROR_BACKEND);
  CHECK(has(depot_last_error(), "ipc_receive"));
  out.check_cleared();
  ::close(sv[1]);

  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  if constexpr (!depot::runtime<D>::has_ipc) {
    // The host backend's memory is the process's own: sending says so, and sends nothing.
    CHECK(depot_ipc_send(sv[0], k, 0, block, -1) == DEPOT_ERROR_NOT_SUPPORTED);
    CHECK(has(depot_last_error(), "cannot share memory"));
    CHECK(depot_ipc_receive(sv[1], 0, &m, &p, &bytes) == DEPOT_ERROR_BACKEND);
    out.check_cleared();
  } else {
    // A socket that fails: named, nothing opened on the other end.
    CHECK(depot_ipc_send(-1, k, 0, block, -1) == DEPOT_ERROR_BACKEND);
    CHECK(has(depot_last_error(), "ipc_send"));
    // In this process the received handle opens to the block itself.
    REQUIRE(depot_ipc_send(sv[0], k, 0, block, 10000) == DEPOT_SUCCESS);
    REQUIRE(depot_ipc_receive(sv[1], 10000, &m, &p, &bytes) == DEPOT_SUCCESS);
    CHECK(p == block);
    CHECK(bytes == n);
    CHECK(depot_ipc_close(m) == DEPOT_SUCCESS);
    CHECK(depot_ipc_close(m) == DEPOT_ERROR_INVALID_ARGUMENT);
    // Another process receives it twice (once sent with no timeout, once with one), finds
    // 7s, writes 9s and closes both mappings.
    depot::test::allow_children_to_take_descriptors();
    const pid_t child = depot::test::spawn_ipc_child({"--c-receive", "7", "9"}, {{sv[1], 3}});
    CHECK(depot_ipc_send(sv[0], k, 0, block, -1) == DEPOT_SUCCESS);
    CHECK(depot_ipc_send(sv[0], k, 0, block, 10000) == DEPOT_SUCCESS);
    CHECK(depot::test::exit_status(child) == 0);
    check_nines<D>(block, n);
  }
  ::close(sv[0]);
  ::close(sv[1]);
  REQUIRE(depot_deallocate(k, 0, block) == DEPOT_SUCCESS);
}

TEST_CASE_TEMPLATE("c_api: IPC handles passed on by a broker (depot_ipc_receive_handle, depot_ipc_forward); bad "
                   "input refused",
                   D, DEPOT_TEST_DEVICES)
{
  const depot_device_kind k = kind_of<D>();
  int in[2];   // sender -> broker
  int out[2];  // broker -> receiver
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) == 0);
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) == 0);
  const auto marker = reinterpret_cast<depot_ipc_received*>(std::uintptr_t{0x5eed});
  depot_ipc_received* r = marker;
  opened_outs opened;
  auto& [m, p, bytes] = opened.values;

  // Bad input, on every backend: refused by name, *received cleared, nothing sent.
  CHECK(depot_ipc_receive_handle(in[1], -1, nullptr) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_receive_handle: received is NULL"));
  CHECK(depot_ipc_receive_handle(in[1], -2, &r) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_receive_handle: timeout_ms -2 is neither -1"));
  CHECK(r == nullptr);
  r = marker;
  CHECK(depot_ipc_receive_handle(in[1], 0, &r) == DEPOT_ERROR_BACKEND);  // nothing ready
  CHECK(has(depot_last_error(), "ipc_receive"));
  CHECK(r == nullptr);
  r = marker;
  write_framed(in[0], "not a handle");
  CHECK(depot_ipc_receive_handle(in[1], 1000, &r) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(r == nullptr);
  CHECK(depot_ipc_forward(out[0], nullptr, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_forward: received is NULL"));
  CHECK(depot_ipc_forward(out[0], marker, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "received 0x5eed is not a held received IPC handle"));
  CHECK(depot_ipc_open_received(marker, &m, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_open_received: received 0x5eed is not"));
  opened.check_cleared();
  CHECK(depot_ipc_received_free(marker) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_ipc_received_free(nullptr) == DEPOT_SUCCESS);

  // Any build passes on any handle, opened or not, whatever backends it has: a handle of
  // CUDA device 1000 (which no process can open) goes through the broker unchanged.
  depot::ipc_handle made_up;
  made_up.device = depot::device_id::of<depot::cuda>(1000);
  made_up.size = made_up.requested = 512;
  made_up.process = 4242;
  made_up.counter_fd = 5;
  const std::size_t descriptors_before = depot::test::open_descriptors();
  depot::ipc_send(in[0], made_up);
  REQUIRE(depot_ipc_receive_handle(in[1], 1000, &r) == DEPOT_SUCCESS);
  REQUIRE(r != nullptr);
  CHECK(depot_ipc_forward(out[0], r, -2) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(depot_ipc_forward(-1, r, -1) == DEPOT_ERROR_BACKEND);
  CHECK(has(depot_last_error(), "ipc_send"));
  REQUIRE(depot_ipc_forward(out[0], r, -1) == DEPOT_SUCCESS);
  REQUIRE(depot_ipc_forward(out[0], r, 1000) == DEPOT_SUCCESS);  // it stays held: again
  for (int i = 0; i < 2; ++i) {
    const depot::ipc_received again = depot::ipc_receive(out[1], std::chrono::seconds{1});
    CHECK(again.handle == made_up);
    CHECK(again.fds.empty());
  }
  CHECK(depot_ipc_open_received(r, nullptr, &p, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "depot_ipc_open_received: mapping is NULL"));
  // Opening it is refused: a device past the last, or (without the CUDA backend) not built.
  CHECK(depot_ipc_open_received(r, &m, &p, &bytes) ==
        (DEPOT_HAS_CUDA ? DEPOT_ERROR_INVALID_ARGUMENT : DEPOT_ERROR_NOT_SUPPORTED));
  CHECK(has(depot_last_error(), DEPOT_HAS_CUDA ? "1000" : "no CUDA backend"));
  opened.check_cleared();
  CHECK(depot_ipc_received_free(r) == DEPOT_SUCCESS);
  CHECK(depot::test::open_descriptors() == descriptors_before);
  CHECK(depot_ipc_received_free(r) == DEPOT_ERROR_INVALID_ARGUMENT);  // freed: refused
  CHECK(depot_ipc_forward(out[0], r, 0) == DEPOT_ERROR_INVALID_ARGUMENT);
  CHECK(has(depot_last_error(), "is not a held received IPC handle"));
  // A closed peer: a failing call, named, nothing held.
  ::close(in[0]);
  r = marker;
  CHECK(depot_ipc_receive_handle(in[1], -1, &r) == DEPOT_ERROR_BACKEND);
  CHECK(r == nullptr);
  ::close(in[1]);

  if constexpr (depot::runtime<D>::has_ipc) {
    // A block sent to the broker (with its pages' descriptors when expandable: gpu-check's
    // DEPOT_ALLOC_CONF run), opened there (the block itself, in this process), then passed
    // on twice to another process, which finds 7s and writes 9s; the broker lets go of its
    // handle before that process has read it.
    constexpr std::size_t n = 3 << 20;
    void* const block = sevens<D>(n);
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) == 0);
    REQUIRE(depot_ipc_send(in[0], k, 0, block, 10000) == DEPOT_SUCCESS);
    // The broker holds one descriptor per page of the block (none for an ordinary segment's)
    // until it frees the handle.
    char text[4096];
    REQUIRE(depot_ipc_export(k, 0, block, text, sizeof text, nullptr) == DEPOT_SUCCESS);
    const std::size_t pages = depot::ipc_handle::from_hex(text).fds.size();
    const std::size_t descriptors = depot::test::open_descriptors();
    REQUIRE(depot_ipc_receive_handle(in[1], 10000, &r) == DEPOT_SUCCESS);
    CHECK(depot::test::open_descriptors() == descriptors + pages);
    REQUIRE(depot_ipc_open_received(r, &m, &p, &bytes) == DEPOT_SUCCESS);
    CHECK(p == block);
    CHECK(bytes == n);
    CHECK(depot_ipc_close(m) == DEPOT_SUCCESS);
    depot::test::allow_children_to_take_descriptors();
    REQUIRE(depot_ipc_forward(out[0], r, -1) == DEPOT_SUCCESS);
    REQUIRE(depot_ipc_forward(out[0], r, 10000) == DEPOT_SUCCESS);
    CHECK(depot_ipc_received_free(r) == DEPOT_SUCCESS);
    CHECK(depot::test::open_descriptors() == descriptors);
    const pid_t child = depot::test::spawn_ipc_child({"--c-receive", "7", "9"}, {{out[1], 3}});
    CHECK(depot::test::exit_status(child) == 0);
    check_nines<D>(block, n);
    ::close(in[0]);
    ::close(in[1]);
    REQUIRE(depot_deallocate(k, 0, block) == DEPOT_SUCCESS);
  }
  ::close(out[0]);
  ::close(out[1]);
}

TEST_CASE("c_api: the handle table refuses removed and made-up handles and frees after the last hold")
{
  struct tracked {
    int value;
    int* destroyed;
    ~tracked() { ++*destroyed; }
  };
  int destroyed = 0;
  depot::detail::handle_table<tracked> table{"thing", "a live thing", "make_thing"};
  const auto add = [&](int v) {
    return reinterpret_cast<void*>(table.add(std::unique_ptr<tracked>(new tracked{v, &destroyed})));
  };
  void* a = add(1);
  void* b = add(2);
  void* c = add(3);
  CHECK(a != nullptr);
  CHECK(table.find("f", a)->value == 1);
  CHECK(table.find("f", b)->value == 2);
  CHECK(table.find("f", c)->value == 3);

  // Removed: refused from then on, by name; the slot is reused under a new handle.
  table.remove("r", b);
  CHECK(destroyed == 1);
  CHECK_THROWS_WITH_AS(std::ignore = table.find("f", b),
                       ("f: thing " + depot::format_address(b) +
                        " is not a live thing (not made by make_thing, or given back)").c_str(),
                       std::invalid_argument);
  CHECK_THROWS_AS(table.remove("r", b), std::invalid_argument);
  void* d = add(4);
  CHECK(d != b);
  CHECK((reinterpret_cast<std::uintptr_t>(d) & 0xFFFFFF) == (reinterpret_cast<std::uintptr_t>(b) & 0xFFFFFF));
  CHECK_THROWS_AS(std::ignore = table.find("f", b), std::invalid_argument);
  CHECK(table.find("f", d)->value == 4);

  // A hold keeps its object past the removal; the last hold to end frees it.
  {
    auto h1 = table.find("f", a);
    auto h2 = table.find("f", a);
    table.remove("r", a);
    CHECK(destroyed == 1);
    CHECK_THROWS_AS(std::ignore = table.find("f", a), std::invalid_argument);
    CHECK(h1->value == 1);
    { auto moved = std::move(h2); }
    CHECK(destroyed == 1);
    CHECK(h1->value == 1);
  }
  CHECK(destroyed == 2);

  // Made up: NULL, generation 0, a slot never made, all bits set.
  CHECK_THROWS_WITH_AS(std::ignore = table.find("f", nullptr), "f: thing is NULL", std::invalid_argument);
  for (const std::uintptr_t bad : {std::uintptr_t{1}, (std::uintptr_t{1} << 24) | 4000, (std::uintptr_t{1} << 24) | 9000,
                                   ~std::uintptr_t{0}}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(std::ignore = table.find("f", reinterpret_cast<void*>(bad)), std::invalid_argument);
    CHECK_THROWS_AS(table.remove("r", reinterpret_cast<void*>(bad)), std::invalid_argument);
  }
  CHECK(table.find("f", c)->value == 3);  // the others unharmed
  CHECK(table.find("f", d)->value == 4);
}

TEST_CASE("c_api: the handle table under threads that add, look up and remove at once")
{
  // Each object knows its handle: a lookup that succeeds must give the object of that handle,
  // never one that took its slot later. Every object is destroyed once.
  struct tracked {
    std::atomic<std::uintptr_t> handle{0};
    std::atomic<int>* destroyed;
    explicit tracked(std::atomic<int>* d) : destroyed{d} {}
    ~tracked() { destroyed->fetch_add(1); }
  };
  std::atomic<int> destroyed{0};
  std::atomic<int> made{0};
  std::atomic<int> wrong{0};
  depot::detail::handle_table<tracked> table{"thing", "a live thing", "make_thing"};
  constexpr int k_shared = 64;
  std::array<std::atomic<std::uintptr_t>, k_shared> recent{};  // handles, live or not
  const std::uint64_t seed = depot::test::seed("c_api handle table threads", 7);
  const auto worker = [&](unsigned id) {
    std::mt19937_64 rng{seed + id};
    for (int i = 0; i < 3000; ++i) {
      auto* t = new tracked{&destroyed};
      const std::uintptr_t h = table.add(std::unique_ptr<tracked>(t));
      t->handle.store(h);
      made.fetch_add(1);
      recent[rng() % k_shared].store(h);
      // someone's handle, perhaps removed (and its slot reused) by now
      const std::uintptr_t other = recent[rng() % k_shared].load();
      try {
        auto held = table.find("f", reinterpret_cast<void*>(other));
        if (held->handle.load() != other && held->handle.load() != 0) wrong.fetch_add(1);
      } catch (const std::invalid_argument&) {
      }
      table.remove("r", reinterpret_cast<void*>(h));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned id = 0; id < 4; ++id) threads.emplace_back(worker, id);
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
  CHECK(made.load() == 4 * 3000);
  CHECK(destroyed.load() == made.load());
}
