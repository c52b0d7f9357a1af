// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <cerrno>

#include <depot/hal/invalid_argument.hpp>
#include <depot/storage/dynamic_storage.hpp>
#include <depot/storage/mapped_file.hpp>
#include <depot/storage/strided_view.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class F>
std::string message_of(F&& f)
{
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// A fresh path in the temporary directory, removed (with whatever is there) at scope end.
class temp_path {
 public:
  explicit temp_path(const std::string& name)
  {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("depot-mapped-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + name);
    fs::remove_all(path_);
  }
  temp_path(const temp_path&) = delete;
  temp_path& operator=(const temp_path&) = delete;
  ~temp_path()
  {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const fs::path& get() const noexcept { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& p, const void* data, std::size_t bytes)
{
  std::ofstream out{p, std::ios::binary | std::ios::trunc};
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  REQUIRE(out.good());
}

std::vector<char> read_file(const fs::path& p)
{
  std::ifstream in{p, std::ios::binary};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

// How many regions of this process map `p` (from /proc/self/maps).
int mappings_of(const fs::path& p)
{
  std::ifstream maps{"/proc/self/maps"};
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += contains(line, p.string()) ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("mapped: writes through a read-write mapping reach the file")
{
  temp_path tmp{"rw.bin"};
  {
    auto file = depot::mapped_file::create(tmp.get(), 1000 * sizeof(float));
    CHECK(file.is_open());
    CHECK(file.is_writable());
    CHECK(file.size_bytes() == 4000);
    CHECK(file.path() == tmp.get());
    auto elems = file.elements<float>();
    CHECK(elems.size() == 1000);
    CHECK(elems[999] == 0.0F);  // a new file reads as zeros
    for (std::size_t i = 0; i < elems.size(); ++i) elems[i] = static_cast<float>(i) * 0.5F;
    file.flush();
    // Read back through the file system, not the mapping.
    const auto bytes = read_file(tmp.get());
    REQUIRE(bytes.size() == 4000);
    float v = 0;
    std::memcpy(&v, bytes.data() + 4 * 321, 4);
    CHECK(v == 160.5F);
  }
  // Reopened read-only, the values are there.
  auto ro = depot::mapped_file::open(tmp.get());
  CHECK_FALSE(ro.is_writable());
  auto view = ro.elements<const float>(10, 40);  // elements 10..19
  CHECK(view.size() == 10);
  CHECK(view[0] == 5.0F);
  CHECK(view[9] == 9.5F);
  static_assert(std::is_same_v<decltype(view[0]), const float&>, "read-only elements are const");
  // load() copies into pool memory, independent of the file.
  auto copy = ro.load<float>(4, 0);
  CHECK(copy.is_refcounted());
  copy[0] = 42.0F;
  CHECK(ro.elements<const float>(1)[0] == 0.0F);
}

TEST_CASE("mapped: typed storage from a mapping works with views and the type-erased layer")
{
  temp_path tmp{"views.bin"};
  {
    auto file = depot::mapped_file::create(tmp.get(), 12 * sizeof(std::int32_t));
    depot::storage<std::int32_t> s{file.elements<std::int32_t>()};
    depot::strided_view<std::int32_t> v{s, depot::layout::contiguous({3, 4})};
    v.transpose(0, 1).select(0, 2).at({1}) = 77;  // element (1, 2)
    depot::dynamic_storage d{s};
    auto tail = d.as<std::int32_t>();
    CHECK(tail.host_ptr() == s.host_ptr());
    depot::dynamic_storage ones{4, depot::dtype::float64};
    ones.fill_(-3.0);
    depot::dynamic_storage last_row{depot::storage<std::int32_t>{file.elements<std::int32_t>(4, 8 * sizeof(std::int32_t))}};
    last_row.copy_(ones);  // converted from float64 into the mapped int32 elements
  }  // unmapped here: stores reach the file even without flush()
  const auto bytes = read_file(tmp.get());
  REQUIRE(bytes.size() == 48);
  std::int32_t x[12];
  std::memcpy(x, bytes.data(), sizeof x);
  CHECK(x[1 * 4 + 2] == 77);
  CHECK(x[8] == -3);
  CHECK(x[11] == -3);
  CHECK(x[7] == 0);
}

TEST_CASE("mapped: storages keep the mapping alive; the last handle unmaps")
{
  temp_path tmp{"alive.bin"};
  std::vector<std::uint64_t> values(512);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = i * i;
  write_file(tmp.get(), values.data(), values.size() * 8);
  depot::host_storage<const std::uint64_t> kept;
  {
    auto file = depot::mapped_file::open(tmp.get());
    CHECK(file.ref_count() == 1);
    CHECK(mappings_of(tmp.get()) == 1);
    {
      auto copy = file;
      CHECK(file.ref_count() == 2);
    }
    kept = file.elements<const std::uint64_t>();
    CHECK(file.ref_count() == 2);
    CHECK(kept.is_refcounted());
    CHECK(kept.ref_count() == 1);
    auto again = kept.share();
    CHECK(file.ref_count() == 2);  // storage handles share one count on the mapping
  }
  CHECK(mappings_of(tmp.get()) == 1);  // the mapped_file is gone; the storage is not
  CHECK(kept[511] == 511ULL * 511ULL);
  kept = {};
  CHECK(mappings_of(tmp.get()) == 0);
}

TEST_CASE("mapped: read-only mappings refuse writes at the API")
{
  temp_path tmp{"ro.bin"};
  const std::vector<std::int16_t> values{1, 2, 3, 4};
  write_file(tmp.get(), values.data(), 8);
  auto ro = depot::mapped_file::open(tmp.get(), depot::map_access::read_only);
  CHECK_THROWS_AS((void)ro.elements<std::int16_t>(), depot::invalid_argument);
  CHECK(contains(message_of([&] { (void)ro.elements<std::int16_t>(); }), "is mapped read-only"));
  CHECK_THROWS_AS((void)ro.writable_data(), depot::invalid_argument);
  CHECK(ro.data() != nullptr);
  CHECK_NOTHROW(ro.flush());  // nothing to write
  CHECK(ro.ref_count() == 1);  // refused calls took no count
  // The same file mapped read-write may be written; the read-only mapping sees it (MAP_SHARED).
  auto rw = depot::mapped_file::open(tmp.get(), depot::map_access::read_write);
  rw.elements<std::int16_t>()[2] = -7;
  CHECK(ro.elements<const std::int16_t>()[2] == -7);
}

TEST_CASE("mapped: bad input is refused with a clear message")
{
  temp_path tmp{"bad.bin"};
  // Missing file: filesystem_error with the path and errno.
  try {
    (void)depot::mapped_file::open(tmp.get());
    FAIL("opening a missing file succeeded");
  } catch (const std::filesystem::filesystem_error& e) {
    CHECK(e.path1() == tmp.get());
    // By value and category name, not by category identity: where a toolchain links
    // libstdc++ statically (the GPU machine's g++ does), libdepot keeps its copy private, so
    // its std::generic_category() is another object than the caller's.
    CHECK(e.code().value() == ENOENT);
    CHECK(std::string{e.code().category().name()} == "generic");
    CHECK(contains(e.what(), "cannot open for reading"));
  }
  // A directory is not a regular file.
  fs::create_directory(tmp.get());
  CHECK_THROWS_AS((void)depot::mapped_file::open(tmp.get()), std::filesystem::filesystem_error);
  CHECK(contains(message_of([&] { (void)depot::mapped_file::open(tmp.get()); }), "not a regular file"));
  fs::remove(tmp.get());
  // Too short for what is asked.
  const std::vector<float> values(10, 1.0F);
  write_file(tmp.get(), values.data(), 40);
  CHECK(contains(message_of([&] { (void)depot::mapped_file::open(tmp.get(), depot::map_access::read_only, 41); }),
                 "holds 40 bytes, fewer than the 41 asked for"));
  auto file = depot::mapped_file::open(tmp.get());
  CHECK_THROWS_AS((void)file.elements<const float>(11), depot::invalid_argument);
  CHECK(contains(message_of([&] { (void)file.elements<const float>(11); }),
                 "11 elements of 4 bytes from byte 0 need a file of at least 44 bytes, but"));
  CHECK(contains(message_of([&] { (void)file.elements<const float>(10, 4); }), "room for 9"));
  CHECK(contains(message_of([&] { (void)file.elements<const double>(1, 4); }), "not a multiple of the element alignment 8"));
  CHECK(contains(message_of([&] { (void)file.elements<const float>(1, 44); }), "past the end"));
  CHECK_THROWS_AS((void)file.elements<const float>(std::size_t{1} << 62), depot::invalid_argument);
  CHECK_THROWS_AS((void)file.load<float>(11), depot::invalid_argument);
  CHECK(file.elements<const float>(depot::mapped_file::to_end, 40).size() == 0);
  CHECK(file.ref_count() == 1);
  // create() refuses an existing file unless told to overwrite it.
  CHECK(contains(message_of([&] { (void)depot::mapped_file::create(tmp.get(), 8); }), "the file exists"));
  CHECK(read_file(tmp.get()).size() == 40);  // untouched
  auto replaced = depot::mapped_file::create(tmp.get(), 8, true);
  CHECK(replaced.size_bytes() == 8);
  CHECK(fs::file_size(tmp.get()) == 8);
  // Nothing mapped.
  depot::mapped_file none;
  CHECK_FALSE(none.is_open());
  CHECK(none.ref_count() == 0);
  CHECK(none.data() == nullptr);
  CHECK_THROWS_AS((void)none.elements<const int>(), depot::invalid_argument);
  // A directory that does not exist for create().
  CHECK_THROWS_AS((void)depot::mapped_file::create(tmp.get() / "no" / "such.bin", 8), std::filesystem::filesystem_error);
}

TEST_CASE("mapped: empty files map to empty storage")
{
  temp_path tmp{"empty.bin"};
  auto file = depot::mapped_file::create(tmp.get(), 0);
  CHECK(file.size_bytes() == 0);
  CHECK(file.data() == nullptr);
  auto e = file.elements<double>();
  CHECK(e.size() == 0);
  CHECK(file.ref_count() == 2);  // even an empty storage holds its count
  file.flush();
  e = {};
  CHECK(file.ref_count() == 1);
  auto ro = depot::mapped_file::open(tmp.get());
  CHECK(ro.elements<const double>().size() == 0);
}

TEST_CASE("mapped: a sparse file larger than any test buffer, touched in a few places")
{
  temp_path tmp{"sparse.bin"};
  constexpr std::size_t gib = std::size_t{1} << 30;
  constexpr std::size_t bytes = 6 * gib + 12345;  // sparse: ftruncate allocates no blocks
  const std::size_t places[] = {0, gib + 7, 3 * gib, 5 * gib + 4096 * 3 + 1, bytes - 1};
  {
    auto file = depot::mapped_file::create(tmp.get(), bytes);
    auto all = file.elements<std::uint8_t>();
    REQUIRE(all.size() == bytes);
    for (std::size_t i = 0; i < std::size(places); ++i) all[places[i]] = static_cast<std::uint8_t>(11 * (i + 1));
    // Wide elements beyond 4 GiB: 8-byte words at a byte offset past 2^32.
    auto words = file.elements<std::uint64_t>(4, 4 * gib + 64);
    words[3] = 0x0123456789abcdefULL;
    file.flush();
  }
  CHECK(fs::file_size(tmp.get()) == bytes);
  struct stat st {};
  REQUIRE(::stat(tmp.get().c_str(), &st) == 0);
  CHECK(static_cast<std::size_t>(st.st_blocks) * 512 < 64 * 1024 * 1024);  // still sparse
  auto ro = depot::mapped_file::open(tmp.get(), depot::map_access::read_only, bytes);
  auto all = ro.elements<const std::uint8_t>();
  for (std::size_t i = 0; i < std::size(places); ++i) CHECK(all[places[i]] == 11 * (i + 1));
  CHECK(all[places[1] + 1] == 0);
  CHECK(all[2 * gib] == 0);
  CHECK(ro.elements<const std::uint64_t>(1, 4 * gib + 64 + 24)[0] == 0x0123456789abcdefULL);
  // Chunked loading: a copy of one window near the end.
  auto window = ro.load<std::uint8_t>(4096, bytes - 4096);
  CHECK(window[4095] == 11 * std::size(places));
  CHECK(window[0] == 0);
}
