// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/storage/mapped_file.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace depot {

namespace detail {
struct mapping {
  std::atomic<std::size_t> refs{1};
  void* base = nullptr;  // null for an empty file (mmap cannot map 0 bytes)
  std::size_t bytes = 0;
  map_access access = map_access::read_only;
  std::filesystem::path path;
};
}  // namespace detail

namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int err)
{
  throw std::filesystem::filesystem_error("depot::mapped_file: " + what, path,
                                          std::error_code{err, std::generic_category()});
}

// Closes a descriptor when the scope ends; the mapping does not need it.
struct fd_guard {
  int fd;
  ~fd_guard()
  {
    if (fd >= 0) ::close(fd);
  }
};

detail::mapping* map_descriptor(int fd, const std::filesystem::path& path, map_access access, std::size_t bytes)
{
  auto* m = new detail::mapping{};
  m->bytes = bytes;
  m->access = access;
  m->path = path;
  if (bytes == 0) return m;
  const int prot = access == map_access::read_write ? PROT_READ | PROT_WRITE : PROT_READ;
  void* base = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    delete m;
    fail("mmap of " + std::to_string(bytes) + " bytes failed", path, err);
  }
  m->base = base;
  return m;
}

}  // namespace

mapped_file mapped_file::open(const std::filesystem::path& path, map_access access, std::size_t min_bytes)
{
  const int flags = (access == map_access::read_write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  fd_guard fd{::open(path.c_str(), flags)};
  if (fd.fd < 0) {
    fail(std::string{"cannot open for "} + (access == map_access::read_write ? "reading and writing" : "reading"),
         path, errno);
  }
  struct ::stat st {};
  if (::fstat(fd.fd, &st) != 0) fail("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) fail("not a regular file", path, EINVAL);
  const auto bytes = static_cast<std::size_t>(st.st_size);
  DEPOT_EXPECTS(bytes >= min_bytes, "depot::mapped_file::open: " + path.string() + " holds " +
                                        std::to_string(bytes) + " bytes, fewer than the " +
                                        std::to_string(min_bytes) + " asked for");
  return mapped_file{map_descriptor(fd.fd, path, access, bytes)};
}

mapped_file mapped_file::create(const std::filesystem::path& path, std::size_t bytes, bool overwrite)
{
  DEPOT_EXPECTS(bytes <= static_cast<std::size_t>(std::numeric_limits<off_t>::max()),
                "depot::mapped_file::create: " + std::to_string(bytes) + " bytes exceed the largest file size");
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  fd_guard fd{::open(path.c_str(), flags, 0644)};
  if (fd.fd < 0) {
    const int err = errno;
    if (err == EEXIST) fail("the file exists (pass overwrite = true to replace it)", path, err);
    fail("cannot create", path, err);
  }
  if (::ftruncate(fd.fd, static_cast<off_t>(bytes)) != 0) fail("cannot size to " + std::to_string(bytes) + " bytes", path, errno);
  return mapped_file{map_descriptor(fd.fd, path, map_access::read_write, bytes)};
}

mapped_file::mapped_file(const mapped_file& other) noexcept : map_{other.map_} { acquire(); }

mapped_file::~mapped_file()
{
  if (map_ != nullptr) release(map_);
}

std::size_t mapped_file::size_bytes() const noexcept { return map_ == nullptr ? 0 : map_->bytes; }

map_access mapped_file::access() const noexcept { return map_ == nullptr ? map_access::read_only : map_->access; }

const std::filesystem::path& mapped_file::path() const
{
  static const std::filesystem::path none;
  return map_ == nullptr ? none : map_->path;
}

std::size_t mapped_file::ref_count() const noexcept
{
  return map_ == nullptr ? 0 : map_->refs.load(std::memory_order_acquire);
}

const std::byte* mapped_file::data() const noexcept
{
  return map_ == nullptr ? nullptr : static_cast<const std::byte*>(map_->base);
}

std::byte* mapped_file::writable_data() const
{
  DEPOT_EXPECTS(is_open(), "depot::mapped_file::writable_data: nothing is mapped");
  DEPOT_EXPECTS(is_writable(), "depot::mapped_file::writable_data: " + path().string() +
                                   " is mapped read-only (map it with map_access::read_write)");
  return static_cast<std::byte*>(map_->base);
}

void mapped_file::flush() const
{
  if (map_ == nullptr || map_->base == nullptr || map_->access != map_access::read_write) return;
  if (::msync(map_->base, map_->bytes, MS_SYNC) != 0) fail("msync failed", map_->path, errno);
}

std::size_t mapped_file::checked_count(std::size_t count, std::size_t offset, std::size_t size,
                                       std::size_t align) const
{
  const std::size_t bytes = map_->bytes;
  DEPOT_EXPECTS(offset % align == 0, "depot::mapped_file: byte offset " + std::to_string(offset) +
                                         " is not a multiple of the element alignment " + std::to_string(align));
  DEPOT_EXPECTS(offset <= bytes, "depot::mapped_file: byte offset " + std::to_string(offset) + " is past the end of " +
                                     map_->path.string() + " (" + std::to_string(bytes) + " bytes)");
  const std::size_t fit = (bytes - offset) / size;
  if (count == to_end) return fit;
  DEPOT_EXPECTS(count <= fit, "depot::mapped_file: " + std::to_string(count) + " elements of " +
                                  std::to_string(size) + " bytes from byte " + std::to_string(offset) +
                                  " need a file of at least " +
                                  (count <= (std::numeric_limits<std::size_t>::max() - offset) / size
                                       ? std::to_string(offset + count * size) + " bytes"
                                       : std::string{"more than 2^64 bytes"}) +
                                  ", but " + map_->path.string() + " holds " + std::to_string(bytes) +
                                  " bytes (room for " + std::to_string(fit) + ")");
  return count;
}

void mapped_file::acquire() const noexcept
{
  if (map_ != nullptr) map_->refs.fetch_add(1, std::memory_order_relaxed);
}

void mapped_file::release(detail::mapping* m) noexcept
{
  // munmap of a region this object mapped cannot fail in a way the caller could act on.
  if (m->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (m->base != nullptr) (void)::munmap(m->base, m->bytes);
    delete m;
  }
}

void mapped_file::release_storage(void* context, void* /*ptr*/) noexcept
{
  release(static_cast<detail::mapping*>(context));
}

}  // namespace depot
