// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/host/host_runtime.hpp>
#include <depot/hal/out_of_memory.hpp>

#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

namespace depot::hal {

namespace {

struct host_stream {
  int device;
};

struct host_event {
  bool timing;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
};

// Reads "Key:   value" from a /proc text file; empty when absent.
std::string proc_field(const char* path, const std::string& key)
{
  std::ifstream in{path};
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      const auto start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? std::string{} : line.substr(start);
    }
  }
  return {};
}

std::size_t meminfo_bytes(const std::string& key)
{
  const auto text = proc_field("/proc/meminfo", key);  // "12345 kB"
  return text.empty() ? 0 : std::strtoull(text.c_str(), nullptr, 10) * 1024;
}

void* aligned_or_throw(std::size_t bytes, const char* what)
{
  constexpr auto a = host_runtime::alignment;
  const device_id id{device_kind::host, 0};
  if (bytes > std::numeric_limits<std::size_t>::max() - a) {
    throw out_of_memory(std::string{"depot: host "} + what + " of " + std::to_string(bytes) +
                            " bytes exceeds the address space",
                        bytes, id);
  }
  void* ptr = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (ptr == nullptr) {
    throw out_of_memory(std::string{"depot: host out of memory: "} + what + " of " +
                            format_bytes(bytes) + " (" + std::to_string(bytes) +
                            " bytes) failed; the system has " +
                            format_bytes(meminfo_bytes("MemAvailable")) + " available of " +
                            format_bytes(meminfo_bytes("MemTotal")),
                        bytes, id);
  }
  return ptr;
}

host_event* as_event(native_event e) noexcept { return static_cast<host_event*>(e); }

}  // namespace

void host_runtime::check_device(int device)
{
  DEPOT_EXPECTS(device == 0, "depot: host device index " + std::to_string(device) +
                                 " is out of range: the host backend has 1 device, valid "
                                 "indices are [0, 1)");
}

void host_runtime::set_device(int device) { check_device(device); }

device_properties host_runtime::properties(int device)
{
  check_device(device);
  device_properties p;
  p.id = device_id{device_kind::host, 0};
  p.name = proc_field("/proc/cpuinfo", "model name");
  if (p.name.empty()) p.name = "host CPU";
  utsname u{};
  p.arch = ::uname(&u) == 0 ? u.machine : "unknown";
  p.multiprocessors = static_cast<int>(std::thread::hardware_concurrency());
  p.total_memory = meminfo_bytes("MemTotal");
  const long cache = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  p.l2_cache_bytes = cache > 0 ? static_cast<std::size_t>(cache) : 0;
  return p;
}

memory_info host_runtime::memory(int device)
{
  check_device(device);
  return memory_info{meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal")};
}

void* host_runtime::allocate(std::size_t bytes, int device)
{
  check_device(device);
  return bytes == 0 ? nullptr : aligned_or_throw(bytes, "allocation");
}

void host_runtime::deallocate(void* ptr, int /*device*/) noexcept { std::free(ptr); }

void* host_runtime::allocate_async(std::size_t bytes, int device, native_stream)
{
  return allocate(bytes, device);
}

void host_runtime::deallocate_async(void* ptr, int device, native_stream) noexcept
{
  deallocate(ptr, device);
}

void host_runtime::set_async_release_threshold(int device, std::size_t) { check_device(device); }

void* host_runtime::allocate_pinned(std::size_t bytes)
{
  return bytes == 0 ? nullptr : aligned_or_throw(bytes, "pinned allocation");
}

void host_runtime::deallocate_pinned(void* ptr) noexcept { std::free(ptr); }

void* host_runtime::map_segment(std::size_t bytes, int device)
{
  check_device(device);
  const device_id id{device_kind::host, device};
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes == 0) return nullptr;
  // 2 MiB alignment for a segment of 2 MiB or more (mapped with room to spare, the spare
  // unmapped again): a transparent huge page boundary, and the alignment CUDA and HIP give
  // such allocations, so the caching allocator finds a small segment from an address in
  // one probe of its frame table here too (two at page alignment, a mispredicted branch
  // at every other free).
  const std::size_t align = bytes >= segment_alignment ? segment_alignment : page;
  if (bytes > std::numeric_limits<std::size_t>::max() - segment_alignment) {
    throw out_of_memory("depot: host segment of " + std::to_string(bytes) + " bytes exceeds the address space",
                        bytes, id);
  }
  const std::size_t length = (bytes + page - 1) / page * page;
  const std::size_t mapped = length + (align - page);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    throw out_of_memory("depot: host out of memory: a segment of " + format_bytes(bytes) + " (" +
                            std::to_string(bytes) + " bytes) could not be mapped (" + std::strerror(e) +
                            "); the system has " + format_bytes(meminfo_bytes("MemAvailable")) +
                            " available of " + format_bytes(meminfo_bytes("MemTotal")),
                        bytes, id);
  }
  const auto first = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t start = (first + align - 1) / align * align;
  if (start != first) (void)::munmap(p, start - first);
  if (const std::uintptr_t end = first + mapped; start + length != end) {
    (void)::munmap(reinterpret_cast<void*>(start + length), end - (start + length));
  }
  return reinterpret_cast<void*>(start);
}

void host_runtime::unmap_segment(void* ptr, std::size_t bytes) noexcept
{
  if (ptr != nullptr && bytes != 0) (void)::munmap(ptr, bytes);
}

void host_runtime::copy(void* dst, const void* src, std::size_t bytes)
{
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr && src != nullptr,
                "depot: copy of " + std::to_string(bytes) + " bytes with a null pointer");
  std::memmove(dst, src, bytes);
}

void host_runtime::copy_async(void* dst, const void* src, std::size_t bytes, native_stream)
{
  copy(dst, src, bytes);
}

void host_runtime::copy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                                   std::size_t bytes, native_stream)
{
  check_device(dst_device);
  check_device(src_device);
  copy(dst, src, bytes);
}

void host_runtime::set_async(void* dst, int value, std::size_t bytes, native_stream)
{
  if (bytes == 0) return;
  DEPOT_EXPECTS(dst != nullptr,
                "depot: memset of " + std::to_string(bytes) + " bytes with a null pointer");
  std::memset(dst, value, bytes);
}

bool host_runtime::can_access_peer(int device, int peer)
{
  check_device(device);
  check_device(peer);
  return true;
}

void host_runtime::enable_peer_access(int device, int peer)
{
  check_device(device);
  check_device(peer);
}

namespace {
[[noreturn]] void no_host_ipc(const char* call)
{
  throw error(std::string{"depot: "} + call +
                  ": the host backend cannot share memory with another process (its memory "
                  "is the process's own heap); share host data through a file or POSIX shared "
                  "memory, or use a CUDA or HIP device",
              call, __FILE__, __LINE__, 0, "not_supported");
}
}  // namespace

ipc_memory_handle host_runtime::ipc_export(void*, int device)
{
  check_device(device);
  no_host_ipc("ipc_export");
}

void* host_runtime::ipc_open(const ipc_memory_handle&, int device)
{
  check_device(device);
  no_host_ipc("ipc_open");
}

void host_runtime::ipc_close(void*, int) noexcept {}

int host_runtime::vm_export(std::uint64_t, int device)
{
  check_device(device);
  no_host_ipc("vm_export");
}

void* host_runtime::vm_import(const int*, std::size_t, std::size_t, int device)
{
  check_device(device);
  no_host_ipc("vm_import");
}

void host_runtime::vm_close_import(void*, std::size_t, std::size_t, int) noexcept {}

// ---- virtual memory: addresses reserved inaccessible, pages made anonymous memory -------------

namespace {
constexpr std::size_t k_vm_page = std::size_t{2} << 20;  // as CUDA's granularity on current GPUs

void check_vm_range(const void* addr, std::size_t bytes, const char* call)
{
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  DEPOT_EXPECTS(addr != nullptr && a % k_vm_page == 0 && bytes != 0 && bytes % k_vm_page == 0,
                std::string{"depot: host "} + call + ": address " + std::to_string(a) + " and size " +
                    std::to_string(bytes) + " must be non-zero multiples of the 2 MiB page");
}
}  // namespace

std::size_t host_runtime::vm_page(int device)
{
  check_device(device);
  return k_vm_page;
}

void* host_runtime::vm_reserve(std::size_t bytes, int device)
{
  check_device(device);
  DEPOT_EXPECTS(bytes != 0 && bytes % k_vm_page == 0 && bytes <= (std::size_t{1} << 46),
                "depot: host vm_reserve of " + std::to_string(bytes) +
                    " bytes: must be a non-zero multiple of the 2 MiB page, at most 64 TiB");
  // One page more than asked, so a page-aligned start can be cut out of it.
  const std::size_t span = bytes + k_vm_page;
  void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    const device_id id{device_kind::host, device};
    throw out_of_memory("depot: host could not reserve " + format_bytes(bytes) +
                            " of address space: " + std::strerror(errno),
                        bytes, id);
  }
  const auto r = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (r + k_vm_page - 1) / k_vm_page * k_vm_page;
  if (start > r) ::munmap(raw, start - r);
  if (const std::uintptr_t end = r + span, want = start + bytes; end > want) {
    ::munmap(reinterpret_cast<void*>(want), end - want);
  }
  return reinterpret_cast<void*>(start);
}

std::uint64_t host_runtime::vm_map(void* addr, std::size_t bytes, int device)
{
  check_device(device);
  check_vm_range(addr, bytes, "vm_map");
  // MAP_FIXED over the reservation: the commit charge is taken here (ENOMEM under strict
  // overcommit accounting), the pages are made on first touch.
  if (::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
      MAP_FAILED) {
    const int e = errno;
    const device_id id{device_kind::host, device};
    throw out_of_memory("depot: host out of memory: could not map " + format_bytes(bytes) + ": " +
                            std::strerror(e),
                        bytes, id);
  }
  return 0;
}

void host_runtime::vm_map_pages(void* addr, std::size_t page, std::size_t count, std::uint64_t* handles, int device)
{
  DEPOT_EXPECTS(handles != nullptr && count != 0 && page != 0 && count <= (std::size_t{1} << 46) / page,
                "depot: host vm_map_pages of " + std::to_string(count) + " pages of " + std::to_string(page) +
                    " bytes: needs 1 to 2^46 bytes of pages and room for their handles");
  check_vm_range(addr, page, "vm_map_pages");
  (void)vm_map(addr, page * count, device);  // one mapping; pages unmap on their own
  std::fill_n(handles, count, std::uint64_t{0});
}

void host_runtime::vm_unmap(void* addr, std::size_t bytes, std::uint64_t, int) noexcept
{
  // Back to reserved and inaccessible; the pages go back to the system.
  (void)::mmap(addr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

void host_runtime::vm_release(void* addr, std::size_t bytes, int) noexcept { (void)::munmap(addr, bytes); }

native_stream host_runtime::create_stream(int device)
{
  check_device(device);
  return new host_stream{device};
}

void host_runtime::destroy_stream(native_stream stream, int) noexcept
{
  delete static_cast<host_stream*>(stream);
}

void host_runtime::synchronize_stream(native_stream) {}

bool host_runtime::query_stream(native_stream) { return true; }

native_event host_runtime::create_event(int device, bool timing)
{
  check_device(device);
  return new host_event{timing};
}

void host_runtime::destroy_event(native_event event, int) noexcept { delete as_event(event); }

void host_runtime::record_event(native_event event, native_stream)
{
  DEPOT_EXPECTS(event != nullptr, "depot: record of a null host event");
  as_event(event)->recorded = true;
  as_event(event)->when = std::chrono::steady_clock::now();
}

bool host_runtime::query_event(native_event) { return true; }

void host_runtime::synchronize_event(native_event) {}

void host_runtime::wait_event(native_stream, native_event) {}

float host_runtime::elapsed_ms(native_event start, native_event stop)
{
  const host_event* a = as_event(start);
  const host_event* b = as_event(stop);
  DEPOT_EXPECTS(a != nullptr && b != nullptr, "depot: elapsed_ms of a null host event");
  DEPOT_EXPECTS(a->timing && b->timing,
                "depot: elapsed_ms needs two events created with timing = true");
  DEPOT_EXPECTS(a->recorded && b->recorded,
                "depot: elapsed_ms needs two events that have been recorded");
  return std::chrono::duration<float, std::milli>(b->when - a->when).count();
}

namespace {
[[noreturn]] void no_host_graphs(const char* call)
{
  throw error("depot: the host backend has no graphs of captured work (CUDA and HIP have)", call, __FILE__,
              __LINE__, 0, "not_supported");
}
}  // namespace

void host_runtime::begin_capture(native_stream) { no_host_graphs("begin_capture"); }

native_graph host_runtime::end_capture(native_stream) { no_host_graphs("end_capture"); }

void host_runtime::launch_graph(native_graph, native_stream) { no_host_graphs("launch_graph"); }

void host_runtime::destroy_graph(native_graph) noexcept {}

bool host_runtime::stream_capturing(native_stream) { return false; }

void host_runtime::synchronize(int device) { check_device(device); }

}  // namespace depot::hal
