// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/device_guard.hpp>
#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/stream_keyed.hpp>
#include <depot/hal/stream_registry.hpp>

// The shared GPU code's templates, exercised here with stand-in name tables (no GPU needed).
#include "../hal/gpu/gpu_runtime_impl.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// Device memory released by the runtime when the test leaves scope, also on failure.
template <depot::device D>
struct device_buffer {
  device_buffer(std::size_t n, int device = 0)
      : bytes{n}, dev{device}, ptr{depot::runtime<D>::allocate(n, device)}
  {
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { depot::runtime<D>::deallocate(ptr, dev); }
  std::size_t bytes;
  int dev;
  void* ptr;
};

template <depot::device D>
struct pinned_buffer {
  explicit pinned_buffer(std::size_t n) : ptr{depot::runtime<D>::allocate_pinned(n)} {}
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { depot::runtime<D>::deallocate_pinned(ptr); }
  std::byte* data() const { return static_cast<std::byte*>(ptr); }
  void* ptr;
};

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed)
{
  std::mt19937_64 rng{seed};
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

bool contains(const std::string& text, const std::string& part)
{
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE_TEMPLATE("hal: device count, properties and memory", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const int n = rt::device_count();
  REQUIRE(n >= 1);
  for (int d = 0; d < n; ++d) {
    const depot::device_properties p = rt::properties(d);
    CHECK(p.id == depot::device_id::of<D>(d));
    CHECK_FALSE(p.name.empty());
    CHECK_FALSE(p.arch.empty());
    CHECK(p.multiprocessors > 0);
    CHECK(p.total_memory > 0);
    CHECK(p.memory_bandwidth_gbps >= 0.0);
    if constexpr (depot::is_gpu_v<D>) {
      CHECK(p.compute_major > 0);
      CHECK(p.memory_bandwidth_gbps > 0.0);
    }
    const depot::memory_info m = rt::memory(d);
    CHECK(m.total_bytes > 0);
    CHECK(m.free_bytes <= m.total_bytes);
  }
  CHECK(depot::device_count<D>() == n);
  CHECK(depot::get_device_properties<D>(0).name == rt::properties(0).name);
}

TEST_CASE_TEMPLATE("hal: bad device index is a clear error and changes nothing", D,
                   DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const int n = rt::device_count();
  const int before = rt::current_device();
  const std::string range = "[0, " + std::to_string(n) + ")";
  for (int bad : {-1, n, n + 7}) {
    CAPTURE(bad);
    try {
      rt::check_device(bad);
      FAIL("check_device accepted a bad index");
    } catch (const depot::invalid_argument& e) {
      CHECK(contains(e.what(), "device index " + std::to_string(bad)));
      CHECK(contains(e.what(), range));
      CHECK(contains(e.what(), std::string{D::name}));
    }
    CHECK_THROWS_AS(rt::set_device(bad), depot::invalid_argument);
    CHECK_THROWS_AS((void)rt::properties(bad), depot::invalid_argument);
    CHECK_THROWS_AS((void)rt::memory(bad), depot::invalid_argument);
    CHECK_THROWS_AS((void)rt::allocate(64, bad), depot::invalid_argument);
    CHECK_THROWS_AS(depot::stream<D>{bad}, depot::invalid_argument);
    CHECK_THROWS_AS(depot::event<D>{bad}, depot::invalid_argument);
    CHECK_THROWS_AS(depot::device_guard<D>{bad}, depot::invalid_argument);
    CHECK_THROWS_AS(rt::synchronize(bad), depot::invalid_argument);
    CHECK_THROWS_AS((void)rt::can_access_peer(0, bad), depot::invalid_argument);
    CHECK(rt::current_device() == before);
  }
}

TEST_CASE_TEMPLATE("hal: an absurd allocation is out_of_memory and the backend recovers [provokes backend errors]", D,
                   DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const std::size_t absurd = std::size_t{1} << 62;  // 4 EiB
  try {
    void* p = rt::allocate(absurd, 0);
    rt::deallocate(p, 0);
    FAIL("a 4 EiB allocation succeeded");
  } catch (const depot::out_of_memory& e) {
    CHECK(e.requested_bytes() == absurd);
    CHECK(e.device() == depot::device_id::of<D>(0));
    CHECK(contains(e.what(), std::to_string(absurd)));
    CHECK(contains(e.what(), "out of memory"));
    const std::bad_alloc& as_std = e;  // generic handlers catch it
    CHECK(std::string{as_std.what()} == e.what());
  }
  // The largest size_t must not wrap around into a small allocation.
  CHECK_THROWS_AS((void)rt::allocate(~std::size_t{0}, 0), depot::out_of_memory);
  CHECK_THROWS_AS((void)rt::allocate_pinned(absurd), depot::out_of_memory);
  // The failure left no error state behind: ordinary work succeeds.
  device_buffer<D> ok{4096};
  CHECK(ok.ptr != nullptr);
  rt::set_async(ok.ptr, 0, ok.bytes, nullptr);
  rt::synchronize(0);
}

TEST_CASE_TEMPLATE("hal: zero-byte requests and null frees", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  CHECK(rt::allocate(0, 0) == nullptr);
  CHECK(rt::allocate_pinned(0) == nullptr);
  rt::deallocate(nullptr, 0);
  rt::deallocate_pinned(nullptr);
  rt::copy(nullptr, nullptr, 0);
  rt::copy_async(nullptr, nullptr, 0, nullptr);
  rt::set_async(nullptr, 0, 0, nullptr);
  // A non-zero size with a null pointer is a precondition failure, not a device fault.
  device_buffer<D> b{64};
  CHECK_THROWS_AS(rt::copy(nullptr, b.ptr, 64), depot::invalid_argument);
  CHECK_THROWS_AS(rt::copy(b.ptr, nullptr, 64), depot::invalid_argument);
  CHECK_THROWS_AS(rt::copy_async(b.ptr, nullptr, 64, nullptr), depot::invalid_argument);
  CHECK_THROWS_AS(rt::set_async(nullptr, 0, 64, nullptr), depot::invalid_argument);
  CHECK_THROWS_AS(rt::copy_peer_async(nullptr, 0, b.ptr, 0, 64, nullptr),
                  depot::invalid_argument);
}

TEST_CASE_TEMPLATE("hal: copies host<->device, device<->device, sync and on a stream", D,
                   DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const auto seed = depot::test::seed("hal copies", 20261122);
  // Odd sizes: no alignment the copy paths could lean on.
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, std::size_t{3} << 20}) {
    CAPTURE(n);
    const auto src = random_bytes(n, seed + n);
    std::vector<std::byte> back(n, std::byte{0xA5});  // poisoned
    device_buffer<D> a{n};
    device_buffer<D> b{n};

    rt::copy(a.ptr, src.data(), n);  // host -> device
    rt::copy(b.ptr, a.ptr, n);       // device -> device
    rt::copy(back.data(), b.ptr, n); // device -> host
    CHECK(std::memcmp(back.data(), src.data(), n) == 0);

    depot::stream<D> s;
    pinned_buffer<D> staging{n};
    std::memcpy(staging.data(), src.data(), n);
    rt::set_async(a.ptr, 0x3C, n, s.native());
    rt::set_async(b.ptr, 0, n, s.native());
    rt::copy_async(b.ptr, staging.ptr, n, s.native());      // pinned host -> device
    rt::copy_peer_async(a.ptr, 0, b.ptr, 0, n, s.native());  // device -> device (same device)
    s.synchronize();  // the host may touch the staging buffer only once the copy is done
    std::memset(staging.data(), 0x5A, n);                   // poison it
    rt::copy_async(staging.ptr, a.ptr, n, s.native());      // device -> pinned host
    s.synchronize();
    CHECK(std::memcmp(staging.data(), src.data(), n) == 0);
    CHECK(s.ready());
  }
}

TEST_CASE_TEMPLATE("hal: memset on a stream writes every byte and only those", D,
                   DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const std::size_t n = 10007;
  device_buffer<D> buf{n + 2};
  std::vector<std::byte> host(n + 2, std::byte{0x11});
  rt::copy(buf.ptr, host.data(), n + 2);
  depot::stream<D> s;
  rt::set_async(static_cast<std::byte*>(buf.ptr) + 1, 0xEE, n, s.native());
  s.synchronize();
  rt::copy(host.data(), buf.ptr, n + 2);
  CHECK(host.front() == std::byte{0x11});
  CHECK(host.back() == std::byte{0x11});
  std::size_t written = 0;
  for (std::size_t i = 1; i <= n; ++i) written += host[i] == std::byte{0xEE} ? 1 : 0;
  CHECK(written == n);
}

TEST_CASE_TEMPLATE("hal: streams and events order, wait and time work", D, DEPOT_TEST_DEVICES)
{
  const std::size_t n = std::size_t{16} << 20;
  device_buffer<D> a{n};
  device_buffer<D> b{n};
  depot::stream<D> producer;
  depot::stream<D> consumer;
  CHECK(producer.native() != consumer.native());  // distinct streams, also on the host
  depot::event<D> start{0, true};
  depot::event<D> stop{0, true};
  depot::event<D> produced;

  start.record(producer);
  depot::runtime<D>::set_async(a.ptr, 0x42, n, producer.native());
  produced.record(producer);
  stop.record(producer);
  consumer.wait(produced);  // the copy below sees the memset
  depot::runtime<D>::copy_async(b.ptr, a.ptr, n, consumer.native());
  consumer.synchronize();
  stop.synchronize();
  CHECK(produced.ready());
  CHECK(stop.ready());
  CHECK(depot::event<D>::elapsed_ms(start, stop) >= 0.0F);

  std::vector<std::byte> host(n);
  depot::runtime<D>::copy(host.data(), b.ptr, n);
  CHECK(host.front() == std::byte{0x42});
  CHECK(host[n / 2] == std::byte{0x42});
  CHECK(host.back() == std::byte{0x42});
}

TEST_CASE_TEMPLATE("hal: timing untimed events is an error [provokes backend errors]", D,
                   DEPOT_TEST_DEVICES)
{
  // Timing needs timing events: a clear error, and the backend keeps working afterwards.
  depot::stream<D> s;
  depot::event<D> untimed_a;
  depot::event<D> untimed_b;
  untimed_a.record(s);
  untimed_b.record(s);
  s.synchronize();
  CHECK_THROWS_AS((void)depot::event<D>::elapsed_ms(untimed_a, untimed_b), std::exception);
  depot::event<D> timed_a{0, true};
  depot::event<D> timed_b{0, true};
  CHECK_THROWS_AS((void)depot::event<D>::elapsed_ms(untimed_a, timed_b), std::exception);
  timed_a.record(s);
  timed_b.record(s);
  s.synchronize();
  CHECK(depot::event<D>::elapsed_ms(timed_a, timed_b) >= 0.0F);
}

TEST_CASE_TEMPLATE("hal: stream and event handles move and release", D, DEPOT_TEST_DEVICES)
{
  depot::stream<D> s1;
  const depot::native_stream h = s1.native();
  REQUIRE(h != nullptr);
  depot::stream<D> s2{std::move(s1)};
  CHECK(s2.native() == h);
  CHECK(s1.native() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  depot::stream<D> s3;
  s3 = std::move(s2);
  CHECK(s3.native() == h);
  const depot::stream_ref<D> ref = s3;
  CHECK(ref.native() == h);
  CHECK_FALSE(ref.is_default());
  CHECK(depot::stream_ref<D>{}.is_default());
  depot::stream_ref<D>{}.synchronize();  // the default stream
  // The built-in handles (null, legacy 0x1, per-thread 0x2) told from a created stream's.
  const auto handle = [](std::uintptr_t v) { return depot::stream_ref<D>{reinterpret_cast<depot::native_stream>(v)}; };
  CHECK(depot::stream_ref<D>{}.is_built_in());
  CHECK_FALSE(depot::stream_ref<D>{}.is_per_thread());
  CHECK(handle(depot::legacy_stream_handle).is_built_in());
  CHECK_FALSE(handle(depot::legacy_stream_handle).is_per_thread());
  CHECK(handle(depot::per_thread_stream_handle).is_built_in());
  CHECK(handle(depot::per_thread_stream_handle).is_per_thread());
  CHECK_FALSE(handle(depot::per_thread_stream_handle).is_default());
  CHECK_FALSE(handle(3).is_built_in());
  CHECK_FALSE(ref.is_built_in());
  CHECK_FALSE(ref.is_per_thread());

  depot::event<D> e1;
  const depot::native_event eh = e1.native();
  depot::event<D> e2{std::move(e1)};
  CHECK(e2.native() == eh);
  CHECK(e1.native() == nullptr);  // NOLINT(bugprone-use-after-move)
  e2.record(ref);
  e2.synchronize();
  CHECK(e2.ready());
}

TEST_CASE_TEMPLATE("hal: device guard switches and restores", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const int n = rt::device_count();
  const int before = rt::current_device();
  for (int d = 0; d < n; ++d) {
    depot::device_guard<D> guard{d};
    CHECK(rt::current_device() == d);
    CHECK(guard.previous() == before);
  }
  CHECK(rt::current_device() == before);
}

TEST_CASE_TEMPLATE("hal: peer access and peer copies", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const int n = rt::device_count();
  CHECK(rt::can_access_peer(0, 0));
  rt::enable_peer_access(0, 0);
  const std::size_t bytes = 1 << 20;
  const auto src = random_bytes(bytes, depot::test::seed("hal peer", 7));
  for (int peer = 0; peer < n; ++peer) {
    CAPTURE(peer);
    device_buffer<D> a{bytes, 0};
    device_buffer<D> b{bytes, peer};
    rt::copy(a.ptr, src.data(), bytes);
    if (rt::can_access_peer(peer, 0)) rt::enable_peer_access(peer, 0);
    depot::stream<D> s{0};
    rt::copy_peer_async(b.ptr, peer, a.ptr, 0, bytes, s.native());
    s.synchronize();
    std::vector<std::byte> back(bytes);
    rt::copy(back.data(), b.ptr, bytes);
    CHECK(std::memcmp(back.data(), src.data(), bytes) == 0);
  }
}

#if DEPOT_HAS_CUDA || DEPOT_HAS_HIP
TEST_CASE("hal: a failing GPU call reports call, place and code, and clears the error [provokes backend errors]")
{
#if DEPOT_HAS_CUDA
  using D = depot::cuda;
  const std::string prefix = "cuda";
#else
  using D = depot::hip;
  const std::string prefix = "hip";
#endif
  depot::event<D> a;  // no timing: elapsed time is refused by the backend
  depot::event<D> b;
  a.record();
  b.record();
  b.synchronize();
  try {
    (void)depot::event<D>::elapsed_ms(a, b);
    FAIL("elapsed time of untimed events succeeded");
  } catch (const depot::error& e) {
    CHECK(contains(e.call(), "event_elapsed"));
    CHECK(contains(e.file(), "gpu_runtime_impl.hpp"));
    CHECK(e.line() > 0);
    CHECK(e.code() != 0);
    CHECK(e.code_name().rfind(prefix, 0) == 0);
    CHECK(contains(e.what(), e.code_name()));
  }
  // Nothing sticky remains: the next calls succeed.
  device_buffer<D> ok{256};
  depot::runtime<D>::set_async(ok.ptr, 1, 256, nullptr);
  depot::runtime<D>::synchronize(0);
}
#endif

namespace {
// A stand-in name table for the shared GPU code's page creation: records each call's
// `exportable` and answers exportable requests with `Refusal` (plain ones succeed).
template <int Refusal>
struct fake_vm_api {
  using error_t = int;
  using vm_handle_t = std::uint64_t;
  static constexpr error_t success = 0;
  static constexpr error_t invalid_value = 1;
  static constexpr error_t memory_allocation = 2;
  static constexpr error_t not_supported = 801;
  static inline std::vector<bool> calls;
  static inline int cleared = 0;
  static error_t get_last_error()
  {
    ++cleared;
    return success;
  }
  static error_t vm_create(vm_handle_t* h, std::size_t n, int, bool exportable)
  {
    calls.push_back(exportable);
    if (exportable && Refusal != success) return Refusal;
    *h = n;
    return success;
  }
};
}  // namespace

TEST_CASE("hal: the shared GPU code asks for exportable pages and remembers a refusal")
{
  using depot::hal::detail::vm_create;
  std::uint64_t h = 0;
  SUBCASE("accepted: every page exportable")
  {
    using api = fake_vm_api<0>;
    for (int i = 0; i < 3; ++i) CHECK(vm_create<api>(&h, 4096, 0) == api::success);
    CHECK(api::calls == std::vector<bool>{true, true, true});
    CHECK(h == 4096);
  }
  SUBCASE("handle type invalid: one refusal, then plain pages only")
  {
    using api = fake_vm_api<1>;
    CHECK(vm_create<api>(&h, 8192, 0) == api::success);
    CHECK(h == 8192);
    CHECK(vm_create<api>(&h, 8192, 0) == api::success);
    CHECK(api::calls == std::vector<bool>{true, false, false});
    CHECK(api::cleared == 1);  // the refusal's error state cleared
  }
  SUBCASE("handle type not supported: the same")
  {
    using api = fake_vm_api<801>;
    CHECK(vm_create<api>(&h, 4096, 0) == api::success);
    CHECK(vm_create<api>(&h, 4096, 0) == api::success);
    CHECK(api::calls == std::vector<bool>{true, false, false});
  }
  SUBCASE("out of memory is no refusal of the type: returned, and the next page asks again")
  {
    using api = fake_vm_api<2>;
    CHECK(vm_create<api>(&h, 4096, 0) == api::memory_allocation);
    CHECK(vm_create<api>(&h, 4096, 0) == api::memory_allocation);
    CHECK(api::calls == std::vector<bool>{true, true});
  }
}

TEST_CASE("hal: device_id parses and prints")
{
  using depot::device_id;
  using depot::device_kind;
  CHECK(device_id::parse("host") == device_id{device_kind::host, 0});
  CHECK(device_id::parse("cpu") == device_id{device_kind::host, 0});
  CHECK(device_id::parse("cuda:3") == device_id{device_kind::cuda, 3});
  CHECK(device_id::parse("hip:0") == device_id{device_kind::hip, 0});
  CHECK(device_id::parse("hip:12").to_string() == "hip:12");
  CHECK(device_id::of<depot::cuda>(1).to_string() == "cuda:1");
  for (const char* bad : {"", "tpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:99999999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)device_id::parse(bad), depot::invalid_argument);
  }
  try {
    (void)device_id::parse("tpu:0");
  } catch (const depot::invalid_argument& e) {
    CHECK(contains(e.what(), "'tpu'"));
    CHECK(contains(e.what(), "host, cpu, cuda or hip"));
  }
  CHECK(device_id::parse("cuda:0") < device_id::parse("cuda:1"));
}

TEST_CASE("hal: format_bytes")
{
  CHECK(depot::format_bytes(0) == "0 B");
  CHECK(depot::format_bytes(1023) == "1023 B");
  CHECK(depot::format_bytes(1024) == "1.00 KiB");
  CHECK(depot::format_bytes(1536) == "1.50 KiB");
  CHECK(depot::format_bytes(std::size_t{80} << 30) == "80.0 GiB");
  CHECK(depot::format_bytes(std::size_t{1} << 62) == "4.00 EiB");
  CHECK(depot::format_bytes(~std::size_t{0}) == "16.0 EiB");
}

TEST_CASE("hal: enabled backends match the configuration")
{
  static_assert(depot::is_enabled_v<depot::host>);
  CHECK(depot::is_enabled_v<depot::cuda> == (DEPOT_HAS_CUDA != 0));
  CHECK(depot::is_enabled_v<depot::hip> == (DEPOT_HAS_HIP != 0));
  CHECK_FALSE(depot::is_gpu_v<depot::host>);
  CHECK(depot::is_gpu_v<depot::cuda>);
  CHECK(depot::cuda::name == "cuda");
  CHECK(depot::to_string(depot::hip::kind) == "hip");
}

TEST_CASE_TEMPLATE("hal: the backend's stream-ordered allocator", D, DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  depot::stream<D> s;
  rt::set_async_release_threshold(0, std::size_t{1} << 30);
  CHECK(rt::allocate_async(0, 0, s.native()) == nullptr);
  const std::size_t n = 3 << 20;
  void* p = rt::allocate_async(n, 0, s.native());
  REQUIRE(p != nullptr);
  rt::set_async(p, 0x6B, n, s.native());
  std::vector<std::byte> back(n);
  rt::copy_async(back.data(), p, n, s.native());
  rt::deallocate_async(p, 0, s.native());
  s.synchronize();
  CHECK(back.front() == std::byte{0x6B});
  CHECK(back.back() == std::byte{0x6B});
  rt::deallocate_async(nullptr, 0, s.native());
  CHECK_THROWS_AS(rt::set_async_release_threshold(-1, 0), depot::invalid_argument);
  CHECK_THROWS_AS((void)rt::allocate_async(64, rt::device_count(), s.native()),
                  depot::invalid_argument);
}

TEST_CASE_TEMPLATE("hal: virtual memory reserves, maps page by page, unmaps and releases", D,
                   DEPOT_TEST_DEVICES)
{
  using rt = depot::runtime<D>;
  const std::size_t page = rt::vm_page(0);
  REQUIRE(page != 0);  // the host backend and every CUDA device since Pascal (HIP: gfx90a on)
  CAPTURE(page);
  CHECK((page & (page - 1)) == 0);
  const std::size_t span = 64 * page;
  void* base = rt::vm_reserve(span, 0);
  REQUIRE(base != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(base) % page == 0);
  // Three pages, each its own mapping; data written across their boundaries survives.
  auto* b = static_cast<unsigned char*>(base);
  std::vector<std::uint64_t> handles;
  for (std::size_t i = 0; i < 3; ++i) handles.push_back(rt::vm_map(b + i * page, page, 0));
  const std::size_t n = 3 * page;
  std::vector<unsigned char> src(n);
  std::mt19937 rng{depot::test::seed("hal vm", 7)};
  for (auto& x : src) x = static_cast<unsigned char>(rng());
  rt::copy(b, src.data(), n);
  std::vector<unsigned char> back(n, 0);
  rt::copy(back.data(), b, n);
  CHECK(std::memcmp(back.data(), src.data(), n) == 0);
  // The last page goes, the first two keep their data; it can be mapped again.
  rt::vm_unmap(b + 2 * page, page, handles[2], 0);
  handles.pop_back();
  std::fill(back.begin(), back.end(), 0);
  rt::copy(back.data(), b, 2 * page);
  CHECK(std::memcmp(back.data(), src.data(), 2 * page) == 0);
  handles.push_back(rt::vm_map(b + 2 * page, page, 0));
  rt::set_async(b + 2 * page, 0x7E, page, nullptr);
  rt::synchronize(0);
  unsigned char probe = 0;
  rt::copy(&probe, b + 3 * page - 1, 1);
  CHECK(probe == 0x7E);
  // Four pages at once (pages 3-6), each its own mapping: data across all of them, then the
  // second of them unmapped alone while its neighbours keep their bytes.
  std::uint64_t run[4] = {};
  rt::vm_map_pages(b + 3 * page, page, 4, run, 0);
  std::vector<unsigned char> more(4 * page);
  for (auto& x : more) x = static_cast<unsigned char>(rng());
  rt::copy(b + 3 * page, more.data(), more.size());
  std::vector<unsigned char> more_back(more.size(), 0);
  rt::copy(more_back.data(), b + 2 * page, page);  // the page before the run: still 0x7E
  CHECK(std::count(more_back.begin(), more_back.begin() + static_cast<std::ptrdiff_t>(page), 0x7E) ==
        static_cast<std::ptrdiff_t>(page));
  rt::copy(more_back.data(), b + 3 * page, more.size());
  CHECK(more_back == more);
  rt::vm_unmap(b + 4 * page, page, run[1], 0);
  std::fill(more_back.begin(), more_back.end(), 0);
  rt::copy(more_back.data(), b + 3 * page, page);
  rt::copy(more_back.data() + 2 * page, b + 5 * page, 2 * page);
  CHECK(std::memcmp(more_back.data(), more.data(), page) == 0);
  CHECK(std::memcmp(more_back.data() + 2 * page, more.data() + 2 * page, 2 * page) == 0);
  for (std::size_t i : {3U, 2U, 0U}) rt::vm_unmap(b + (3 + i) * page, page, run[i], 0);
  CHECK_THROWS_AS(rt::vm_map_pages(b, page, 0, run, 0), depot::invalid_argument);
  CHECK_THROWS_AS(rt::vm_map_pages(b, page, 1, nullptr, 0), depot::invalid_argument);
  CHECK_THROWS_AS(rt::vm_map_pages(b, page, 1, run, rt::device_count()), depot::invalid_argument);
  for (std::size_t i = handles.size(); i-- > 0;) rt::vm_unmap(b + i * page, page, handles[i], 0);
  rt::vm_release(base, span, 0);
  // Bad input: sizes that are not whole pages, and bad device indices.
  CHECK_THROWS_AS((void)rt::vm_reserve(page + 512, 0), depot::invalid_argument);
  CHECK_THROWS_AS((void)rt::vm_reserve(0, 0), depot::invalid_argument);
  CHECK_THROWS_AS((void)rt::vm_page(rt::device_count()), depot::invalid_argument);
  CHECK_THROWS_AS((void)rt::vm_map(nullptr, page, 0), depot::invalid_argument);
}

namespace {
// A value kept per stream by stream_keyed: counts those alive, knows its stream.
struct keyed_probe {
  static inline std::atomic<int> alive{0};
  explicit keyed_probe(depot::native_stream s) noexcept : stream{s} { ++alive; }
  keyed_probe(const keyed_probe&) = delete;
  keyed_probe& operator=(const keyed_probe&) = delete;
  ~keyed_probe() { --alive; }
  depot::native_stream stream;
};
// Watching for as long as it lives (unwatched before the table goes, also on failure).
struct watched {
  explicit watched(depot::stream_registry::watcher* w) : w_{w} { depot::stream_registry::watch(w); }
  watched(const watched&) = delete;
  watched& operator=(const watched&) = delete;
  ~watched() { depot::stream_registry::unwatch(w_); }
  depot::stream_registry::watcher* w_;
};
}  // namespace

// stream_keyed (ops/ keeps each stream's Kokkos instance in one): one value per live stream,
// made once however many threads ask at once, dropped as its stream closes in any order, a
// held one outliving its stream, another backend's closing ignored, a failed make keeping
// nothing; threads looking up while others' streams close.
TEST_CASE_TEMPLATE("hal: stream_keyed keeps one value per live stream and drops it as the stream closes", D,
                   DEPOT_TEST_DEVICES)
{
  // (on the heap: std::mutex's destructor tells TSan nothing, so a later test's mutex in the
  // same stack slot would read to it as this table's, making lock-order cycles of its own)
  const auto table_owner = std::make_unique<depot::stream_keyed<keyed_probe>>(D::kind);
  auto& table = *table_owner;
  const watched w{&table};
  std::mt19937_64 rng{depot::test::seed("hal stream_keyed", 1207)};
  std::atomic<int> made{0};
  const auto get = [&](depot::native_stream s) {
    return table.get(s, [&, s] {
      ++made;
      return std::make_shared<keyed_probe>(s);
    });
  };
  const int alive_before = keyed_probe::alive.load();
  constexpr int n = 32;
  std::vector<std::unique_ptr<depot::stream<D>>> streams;
  for (int k = 0; k < n; ++k) streams.push_back(std::make_unique<depot::stream<D>>());
  std::vector<int> order(n);
  for (int k = 0; k < n; ++k) order[static_cast<std::size_t>(k)] = k;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<keyed_probe*> first(n);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int k = order[i];
    const auto v = get(streams[static_cast<std::size_t>(k)]->native());
    REQUIRE(v->stream == streams[static_cast<std::size_t>(k)]->native());
    first[static_cast<std::size_t>(k)] = v.get();
    REQUIRE(table.size() == i + 1);
  }
  CHECK(made.load() == n);
  // Four threads at once, each stream's value the one made first, none made again.
  {
    std::vector<std::thread> threads;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 r{static_cast<std::uint64_t>(t) + 1};
        for (int i = 0; i < 5000; ++i) {
          const auto k = static_cast<std::size_t>(r() % n);
          if (get(streams[k]->native()).get() != first[k]) ++wrong;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    CHECK(made.load() == n);
  }
  // Another backend's closing of the same handle drops nothing.
  const depot::device_kind other = D::kind == depot::device_kind::host ? depot::device_kind::cuda : depot::device_kind::host;
  depot::stream_registry::closing(depot::device_id{other, 0}, streams[0]->native());
  CHECK(table.size() == n);
  // A held value outlives its stream's closing; the table forgets it at once.
  std::shared_ptr<keyed_probe> held = get(streams[3]->native());
  streams[3].reset();
  CHECK(table.size() == n - 1);
  CHECK(keyed_probe::alive.load() == alive_before + n);
  held.reset();
  CHECK(keyed_probe::alive.load() == alive_before + n - 1);
  // A make that throws keeps nothing; the next get makes it.
  depot::stream<D> fresh;
  CHECK_THROWS_AS(table.get(fresh.native(), []() -> std::shared_ptr<keyed_probe> { throw std::runtime_error("no"); }),
                  std::runtime_error);
  CHECK(table.size() == n - 1);
  CHECK(get(fresh.native())->stream == fresh.native());
  CHECK(table.size() == n);
  // The rest closed in another order while two threads look up the streams still open (each
  // thread's streams are its own half; the closing thread is this one).
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> closing_order;
  for (const int k : order) {
    if (k != 3 && k % 2 == 0) closing_order.push_back(k);
  }
  {
    std::atomic<bool> done{false};
    std::atomic<int> wrong{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 2; ++t) {
      readers.emplace_back([&, t] {
        while (!done.load()) {
          for (int k = 1 + 2 * t; k < n; k += 4) {  // odd streams: never closed meanwhile
            if (k == 3) continue;
            if (get(streams[static_cast<std::size_t>(k)]->native()).get() != first[static_cast<std::size_t>(k)]) ++wrong;
          }
        }
      });
    }
    std::size_t left = table.size();
    for (const int k : closing_order) {
      streams[static_cast<std::size_t>(k)].reset();
      --left;
      REQUIRE(table.size() == left);
    }
    done = true;
    for (auto& th : readers) th.join();
    CHECK(wrong.load() == 0);
  }
  CHECK(made.load() == n + 1);
  // clear() drops every value; a raw handle's closing() drops its own.
  const depot::native_stream raw = depot::runtime<D>::create_stream(0);
  CHECK(get(raw)->stream == raw);
  depot::stream_registry::closing(depot::device_id::of<D>(0), raw);
  depot::runtime<D>::destroy_stream(raw, 0);
  table.clear();
  CHECK(table.size() == 0);
  CHECK(keyed_probe::alive.load() == alive_before);
}

// stream_keyed's makers run outside the lookups' lock: while one makes a new stream's value
// (a Kokkos instance: milliseconds), other threads' lookups of kept values, a closing and
// size() go on; a value whose stream closed while it was made, or made across a clear(), is
// the caller's and not kept (the next get() makes another); one made undisturbed is kept.
TEST_CASE_TEMPLATE("hal: stream_keyed makes a value outside the lookups' lock, keeping none whose stream closed meanwhile",
                   D, DEPOT_TEST_DEVICES)
{
  // (on the heap: std::mutex's destructor tells TSan nothing, so a later test's mutex in the
  // same stack slot would read to it as this table's, making lock-order cycles of its own)
  const auto table_owner = std::make_unique<depot::stream_keyed<keyed_probe>>(D::kind);
  auto& table = *table_owner;
  const watched w{&table};
  const int alive_before = keyed_probe::alive.load();
  std::atomic<int> made{0};
  const auto plain = [&](depot::native_stream s) {
    return [&made, s] {
      ++made;
      return std::make_shared<keyed_probe>(s);
    };
  };
  auto kept = std::make_unique<depot::stream<D>>();
  auto doomed = std::make_unique<depot::stream<D>>();
  auto kept_value = table.get(kept->native(), plain(kept->native()));
  (void)table.get(doomed->native(), plain(doomed->native()));
  REQUIRE(table.size() == 2);

  // One maker held at work on a new stream; meanwhile this thread's lookups, a closing and
  // size() answer (a wait of 10 s each: a lookup that waited for the maker fails, not hangs).
  depot::stream<D> fresh;
  std::promise<void> started, release;
  std::shared_future<void> go{release.get_future().share()};
  std::shared_ptr<keyed_probe> fresh_value;
  std::thread maker{[&] {
    fresh_value = table.get(fresh.native(), [&] {
      ++made;
      started.set_value();
      go.wait();
      return std::make_shared<keyed_probe>(fresh.native());
    });
  }};
  started.get_future().wait();
  auto lookup = std::async(std::launch::async, [&] { return table.get(kept->native(), plain(kept->native())); });
  const bool answered = lookup.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  CHECK_MESSAGE(answered, "a lookup of a kept value waited for another stream's maker");
  const auto closer = std::async(std::launch::async, [&] { doomed.reset(); });
  const bool closed = closer.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  CHECK_MESSAGE(closed, "a stream's closing waited for another stream's maker");
  release.set_value();
  maker.join();
  if (answered) CHECK(lookup.get().get() == kept_value.get());
  CHECK(table.size() == 2);  // kept and fresh (another stream's closing does not stop it being kept)
  CHECK(fresh_value->stream == fresh.native());
  CHECK(table.get(fresh.native(), plain(fresh.native())).get() == fresh_value.get());
  CHECK(made.load() == 3);

  // Its own stream closing while the value is made: handed to the caller, not kept.
  const depot::native_stream raw = depot::runtime<D>::create_stream(0);
  auto lost = table.get(raw, [&] {
    ++made;
    depot::stream_registry::closing(depot::device_id::of<D>(0), raw);
    return std::make_shared<keyed_probe>(raw);
  });
  CHECK(lost->stream == raw);
  CHECK(table.size() == 2);
  auto again = table.get(raw, plain(raw));  // (the handle still open: made anew, kept)
  CHECK(again.get() != lost.get());
  CHECK(table.size() == 3);
  CHECK(made.load() == 5);
  // Another stream's closing while a value is made keeps it (done above on another thread;
  // here from the maker itself).
  depot::stream<D> second;
  auto second_value = table.get(second.native(), [&] {
    ++made;
    kept.reset();
    return std::make_shared<keyed_probe>(second.native());
  });
  CHECK(table.size() == 3);  // second in, kept out
  CHECK(table.get(second.native(), plain(second.native())).get() == second_value.get());
  // A clear() while a value is made: nothing kept, that value included.
  depot::stream<D> third;
  auto third_value = table.get(third.native(), [&] {
    ++made;
    table.clear();
    return std::make_shared<keyed_probe>(third.native());
  });
  CHECK(table.size() == 0);
  CHECK(third_value->stream == third.native());
  CHECK(made.load() == 7);
  depot::stream_registry::closing(depot::device_id::of<D>(0), raw);
  depot::runtime<D>::destroy_stream(raw, 0);
  table.clear();
  for (auto* held : {&kept_value, &fresh_value, &lost, &again, &second_value, &third_value}) held->reset();
  CHECK(keyed_probe::alive.load() == alive_before);
}
