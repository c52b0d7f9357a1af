// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>
#include <depot/storage/host_storage.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace depot {

// How a file is mapped: read_only (PROT_READ; typed access only as const elements) or
// read_write (MAP_SHARED: stores reach the file; flush() waits until they are on disk).
enum class map_access : std::uint8_t { read_only, read_write };

namespace detail {
struct mapping;  // the mmap'ed region and its count, defined in storage/mapped_file.cpp
}

// A whole file mapped into host memory, for data sets larger than memory: the kernel pages
// it in on access and out under pressure. Copies share the mapping through an atomic
// count; every host_storage handed out by elements<T>() holds a count too (host_storage's
// adopted mode), so the region is unmapped only when the last handle of either kind goes.
// The count is thread-safe; the bytes are not synchronised. Errors: a missing, unreadable or
// non-regular file, and failed mmap/msync calls throw std::filesystem::filesystem_error
// (path and errno); size and access mismatches throw depot::invalid_argument.
class mapped_file {
 public:
  // Elements counted to the end of the file.
  static constexpr std::size_t to_end = std::numeric_limits<std::size_t>::max();

  mapped_file() noexcept = default;  // nothing mapped

  // Maps all of an existing file. depot::invalid_argument when it holds fewer than
  // min_bytes bytes (the message gives both sizes).
  [[nodiscard]] static mapped_file open(const std::filesystem::path& path, map_access access = map_access::read_only,
                                        std::size_t min_bytes = 0);
  // Creates a file of `bytes` zero bytes (sparse where the file system allows: ftruncate)
  // and maps it read-write. An existing file is refused unless `overwrite`, which truncates
  // and resizes it.
  [[nodiscard]] static mapped_file create(const std::filesystem::path& path, std::size_t bytes,
                                          bool overwrite = false);

  mapped_file(const mapped_file& other) noexcept;
  mapped_file(mapped_file&& other) noexcept : map_{std::exchange(other.map_, nullptr)} {}
  mapped_file& operator=(mapped_file other) noexcept
  {
    std::swap(map_, other.map_);
    return *this;
  }
  ~mapped_file();

  [[nodiscard]] bool is_open() const noexcept { return map_ != nullptr; }
  [[nodiscard]] std::size_t size_bytes() const noexcept;
  [[nodiscard]] map_access access() const noexcept;
  [[nodiscard]] bool is_writable() const noexcept { return access() == map_access::read_write; }
  [[nodiscard]] const std::filesystem::path& path() const;
  // Handles sharing the mapping (mapped_file copies and storages from elements()); 0 when
  // nothing is mapped.
  [[nodiscard]] std::size_t ref_count() const noexcept;

  // The first byte (null for an empty file or nothing mapped).
  [[nodiscard]] const std::byte* data() const noexcept;
  // The first byte for writing: depot::invalid_argument on a read-only mapping.
  [[nodiscard]] std::byte* writable_data() const;

  // Writes the mapping's dirty pages to the file and waits (msync MS_SYNC). Nothing to do
  // for a read-only mapping. Stores reach the file at unmap anyway; flush() is for
  // durability at a point the caller chooses.
  void flush() const;

  // `count` elements of T (to_end: as many whole ones as fit) from byte `offset`, as host
  // storage of the mapped bytes, zero-copy and counted (see the class comment). T const:
  // any mapping; T mutable: a read-write mapping only, so a read-only mapping cannot be
  // written through a storage (depot::invalid_argument: ask for elements<const T>()).
  // depot::invalid_argument when offset is not a multiple of alignof(T) or the elements
  // pass the end of the file.
  template <class T>
  [[nodiscard]] host_storage<T> elements(std::size_t count = to_end, std::size_t offset = 0) const
  {
    static_assert(std::is_trivially_copyable_v<T>, "mapped elements are trivially copyable");
    DEPOT_EXPECTS(is_open(), "depot::mapped_file::elements: nothing is mapped");
    DEPOT_EXPECTS(std::is_const_v<T> || is_writable(),
                  "depot::mapped_file::elements: " + path().string() +
                      " is mapped read-only; ask for const elements (elements<const T>()) or map it "
                      "with map_access::read_write");
    const std::size_t n = checked_count(count, offset, sizeof(T), alignof(T));
    auto* first = reinterpret_cast<T*>(const_cast<std::byte*>(data()) + offset);  // NOLINT
    if (n == 0) first = nullptr;
    acquire();
    try {
      return host_storage<T>{first, n, &mapped_file::release_storage, map_};
    } catch (...) {
      release(map_);
      throw;
    }
  }

  // A managed copy (in pool memory, independent of the file) of `count` elements of T
  // from byte `offset`: how a part of a large read-only file is loaded for mutable work.
  template <class T>
  [[nodiscard]] host_storage<T> load(std::size_t count, std::size_t offset = 0) const
  {
    static_assert(!std::is_const_v<T>, "load() makes a mutable copy: name T without const");
    DEPOT_EXPECTS(is_open(), "depot::mapped_file::load: nothing is mapped");
    const std::size_t n = checked_count(count, offset, sizeof(T), 1);
    host_storage<T> out{n};
    if (n > 0) std::memcpy(out.data(), data() + offset, n * sizeof(T));
    return out;
  }

 private:
  explicit mapped_file(detail::mapping* m) noexcept : map_{m} {}

  // The element count [offset, offset + n * size) covers, checked against the file.
  [[nodiscard]] std::size_t checked_count(std::size_t count, std::size_t offset, std::size_t size,
                                          std::size_t align) const;
  void acquire() const noexcept;
  static void release(detail::mapping* m) noexcept;
  static void release_storage(void* context, void* ptr) noexcept;

  detail::mapping* map_ = nullptr;
};

}  // namespace depot
