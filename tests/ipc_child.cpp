// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// depot-ipc-child HANDLE EXPECT NEXT: the other process of the pool's IPC test. Opens the
// block named by HANDLE (ipc_handle::to_hex) twice (the two mappings must share one base),
// checks that each of its requested bytes is EXPECT (and, for an ordinary segment's block,
// that the exporter's importer count includes it), sets them all to NEXT and waits for the
// device. Exit 0 on success; 1 with a message on stderr otherwise.
//
// depot-ipc-child --receive EXPECT NEXT: the same for a handle received on descriptor 3 (a
// Unix socket) with its page descriptors (ipc_receive), mapped from those.
//
// depot-ipc-child --c HANDLE EXPECT NEXT: the same through the C interface (depot_ipc_open
// twice, the requested size, depot_ipc_close of both, and a close of a closed mapping
// refused).
//
// depot-ipc-child --c-receive EXPECT NEXT: as --c, for two handles of one block received on
// descriptor 3 (depot_ipc_receive, 60 s each) on this build's GPU backend, device 0.
//
// depot-ipc-child --count HANDLE hold|refuse: the importer's counting alone, on any backend
// (a stand-in backend whose mapping is a dummy address). hold: attaches twice, prints
// "attached", waits for a line (or the end) on stdin, detaches both, prints "detached".
// refuse: the stand-in backend refuses to open; prints "refused" when the attach throws
// that. Exit 0 then; on any error prints "error: WHAT" and exits 1.
#include <depot/config.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/ipc_mapping.hpp>
#include <depot/pool/ipc_received.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The exporter's count of importers of h's segment, read through its file (-1: unreadable).
std::int64_t importer_count(const depot::ipc_handle& h)
{
  const std::string path = "/proc/" + std::to_string(h.process) + "/fd/" + std::to_string(h.counter_fd);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::int64_t v = -1;
  const bool ok = ::pread(fd, &v, sizeof v, static_cast<off_t>(std::uint64_t{h.counter_slot} * sizeof v)) ==
                  static_cast<ssize_t>(sizeof v);
  ::close(fd);
  return ok ? v : -1;
}

// The stand-in backend of --count: an ordinary mapping is the segment's address, never touched.
bool refuse_open = false;
void* fake_open(const depot::ipc_memory_handle&, int)
{
  if (refuse_open) throw depot::error("stand-in backend refused", "open", __FILE__, __LINE__, 1, "test");
  static int dummy;
  return &dummy;
}
void fake_close(void*, int) noexcept {}
void* fake_open_pages(const int*, std::size_t, std::size_t, int) { throw std::logic_error("pages: not counted"); }
void fake_close_pages(void*, std::size_t, std::size_t, int) noexcept {}
constexpr depot::detail::ipc_backend k_fake{&fake_open, &fake_close, &fake_open_pages, &fake_close_pages};

int count(const depot::ipc_handle& h, const std::string& mode)
{
  if (mode == "refuse") {
    refuse_open = true;
    try {
      (void)depot::detail::ipc_attach(h, k_fake);
    } catch (const depot::error& e) {
      if (std::strstr(e.what(), "stand-in backend refused") == nullptr) throw;
      std::printf("refused\n");
      return 0;
    }
    std::printf("error: the refusing backend opened\n");
    return 1;
  }
  void* a = depot::detail::ipc_attach(h, k_fake);
  void* b = depot::detail::ipc_attach(h, k_fake);
  if (a != b) {
    std::printf("error: two attachments differ\n");
    return 1;
  }
  std::printf("attached\n");
  std::fflush(stdout);
  char line[16];
  (void)std::fgets(line, sizeof line, stdin);
  depot::detail::ipc_detach(h, k_fake);
  depot::detail::ipc_detach(h, k_fake);
  std::printf("detached\n");
  return 0;
}

template <depot::device D>
int run(const depot::ipc_received& r, int expect, int next)
{
  const depot::ipc_handle& h = r.handle;
  depot::ipc_mapping<D> m = r.fds.empty() ? depot::ipc_mapping<D>{h} : depot::ipc_mapping<D>{r};
  depot::ipc_mapping<D> again{h};
  if (again.get() != m.get() || m.get() == nullptr) {
    std::fprintf(stderr, "depot-ipc-child: two mappings of one handle differ (%p, %p)\n", m.get(), again.get());
    return 1;
  }
  if (!h.expandable() && importer_count(h) < 1) {
    std::fprintf(stderr, "depot-ipc-child: the exporter's importer count is %lld, expected at least 1\n",
                 static_cast<long long>(importer_count(h)));
    return 1;
  }
  std::vector<unsigned char> bytes(m.requested());
  depot::runtime<D>::copy(bytes.data(), m.get(), bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<unsigned char>(expect)) {
      std::fprintf(stderr, "depot-ipc-child: byte %zu is %d, expected %d\n", i, bytes[i], expect);
      return 1;
    }
  }
  depot::runtime<D>::set_async(m.get(), next, bytes.size(), nullptr);
  depot::runtime<D>::synchronize(h.device.index);
  return 0;
}

// --c and --c-receive: the block through the C interface, opened twice by open(&mapping,
// &ptr, &bytes); `requested` its size (0: not known here), `device` its device index.
template <depot::device D, class Open>
int run_c(const Open& open, std::size_t requested, int device, int expect, int next)
{
  const auto failed = [](const char* what, depot_status st) {
    std::fprintf(stderr, "depot-ipc-child --c: %s: %s: %s\n", what, depot_status_name(st), depot_last_error());
    return 1;
  };
  depot_ipc_mapping* m = nullptr;
  depot_ipc_mapping* again = nullptr;
  void* p = nullptr;
  void* q = nullptr;
  std::size_t bytes = 0;
  std::size_t bytes_again = 0;
  if (const depot_status st = open(&m, &p, &bytes); st != DEPOT_SUCCESS) return failed("open", st);
  if (const depot_status st = open(&again, &q, &bytes_again); st != DEPOT_SUCCESS) return failed("second open", st);
  if (p == nullptr || p != q || m == again || bytes == 0 || (requested != 0 && bytes != requested) ||
      bytes_again != bytes) {
    std::fprintf(stderr, "depot-ipc-child --c: two opens gave %p and %p (%zu and %zu bytes, handles %p %p)\n", p,
                 q, bytes, bytes_again, static_cast<void*>(m), static_cast<void*>(again));
    return 1;
  }
  std::vector<unsigned char> seen(bytes);
  depot::runtime<D>::copy(seen.data(), p, seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != static_cast<unsigned char>(expect)) {
      std::fprintf(stderr, "depot-ipc-child --c: byte %zu is %d, expected %d\n", i, seen[i], expect);
      return 1;
    }
  }
  depot::runtime<D>::set_async(p, next, seen.size(), nullptr);
  depot::runtime<D>::synchronize(device);
  if (const depot_status st = depot_ipc_close(again); st != DEPOT_SUCCESS) return failed("close", st);
  if (const depot_status st = depot_ipc_close(m); st != DEPOT_SUCCESS) return failed("close", st);
  if (depot_ipc_close(m) != DEPOT_ERROR_INVALID_ARGUMENT) {
    std::fprintf(stderr, "depot-ipc-child --c: a closed mapping was closed again\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc == 4 && std::string{argv[1]} == "--count") {
    try {
      return count(depot::ipc_handle::from_hex(argv[2]), argv[3]);
    } catch (const std::exception& e) {
      std::printf("error: %s\n", e.what());
      return 1;
    }
  }
  if (argc == 4 && std::string{argv[1]} == "--c-receive") {
    [[maybe_unused]] const auto receive = [](depot_ipc_mapping** m, void** p, std::size_t* bytes) {
      return depot_ipc_receive(3, 60000, m, p, bytes);
    };
    [[maybe_unused]] const int expect = std::atoi(argv[2]);
    [[maybe_unused]] const int next = std::atoi(argv[3]);
#if DEPOT_HAS_CUDA
    return run_c<depot::cuda>(receive, 0, 0, expect, next);
#elif DEPOT_HAS_HIP
    return run_c<depot::hip>(receive, 0, 0, expect, next);
#else
    std::fprintf(stderr, "depot-ipc-child --c-receive: this build has no GPU backend\n");
    return 1;
#endif
  }
  if (argc == 5 && std::string{argv[1]} == "--c") {
    try {
      const char* text = argv[2];
      [[maybe_unused]] const int expect = std::atoi(argv[3]);
      [[maybe_unused]] const int next = std::atoi(argv[4]);
      [[maybe_unused]] const auto open = [text](depot_ipc_mapping** m, void** p, std::size_t* bytes) {
        return depot_ipc_open(text, m, p, bytes);
      };
      const depot::ipc_handle h = depot::ipc_handle::from_hex(text);
      switch (h.device.kind) {
#if DEPOT_HAS_CUDA
        case depot::device_kind::cuda: return run_c<depot::cuda>(open, h.requested, h.device.index, expect, next);
#endif
#if DEPOT_HAS_HIP
        case depot::device_kind::hip: return run_c<depot::hip>(open, h.requested, h.device.index, expect, next);
#endif
        default: break;
      }
      std::fprintf(stderr, "depot-ipc-child --c: this build has no backend for the handle\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "depot-ipc-child --c: %s\n", e.what());
    }
    return 1;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: depot-ipc-child HANDLE|--receive EXPECT NEXT | --c HANDLE EXPECT NEXT | --c-receive EXPECT NEXT | "
                 "--count HANDLE hold|refuse\n");
    return 1;
  }
  try {
    depot::ipc_received r;  // from the command line: no descriptors (ipc_mapping takes them)
    if (std::string{argv[1]} == "--receive") {
      // (EXPECT and NEXT in the same places as after a HANDLE; a parent that fails before
      // sending must not leave this child waiting)
      r = depot::ipc_receive(3, std::chrono::seconds{60});
    } else {
      r.handle = depot::ipc_handle::from_hex(argv[1]);
    }
    [[maybe_unused]] const int expect = std::atoi(argv[2]);
    [[maybe_unused]] const int next = std::atoi(argv[3]);
    switch (r.handle.device.kind) {
#if DEPOT_HAS_CUDA
      case depot::device_kind::cuda: return run<depot::cuda>(r, expect, next);
#endif
#if DEPOT_HAS_HIP
      case depot::device_kind::hip: return run<depot::hip>(r, expect, next);
#endif
      default: break;
    }
    std::fprintf(stderr, "depot-ipc-child: this build has no backend for %s\n", r.handle.device.to_string().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-ipc-child: %s\n", e.what());
  }
  return 1;
}
