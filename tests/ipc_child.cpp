// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// depot-ipc-child HANDLE EXPECT NEXT: the other process of the pool's IPC test. Opens the
// block named by HANDLE (ipc_handle::to_hex) twice (the two mappings must share one base),
// checks that each of its requested bytes is EXPECT, sets them all to NEXT and waits for
// the device. Exit 0 on success; 1 with a message on stderr otherwise.
#include <depot/config.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/ipc_mapping.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

template <depot::device D>
int run(const depot::ipc_handle& h, int expect, int next)
{
  depot::ipc_mapping<D> m{h};
  depot::ipc_mapping<D> again{h};
  if (again.get() != m.get() || m.get() == nullptr) {
    std::fprintf(stderr, "depot-ipc-child: two mappings of one handle differ (%p, %p)\n", m.get(), again.get());
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

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 4) {
    std::fprintf(stderr, "usage: depot-ipc-child HANDLE EXPECT NEXT\n");
    return 1;
  }
  try {
    const auto h = depot::ipc_handle::from_hex(argv[1]);
    [[maybe_unused]] const int expect = std::atoi(argv[2]);
    [[maybe_unused]] const int next = std::atoi(argv[3]);
    switch (h.device.kind) {
#if DEPOT_HAS_CUDA
      case depot::device_kind::cuda: return run<depot::cuda>(h, expect, next);
#endif
#if DEPOT_HAS_HIP
      case depot::device_kind::hip: return run<depot::hip>(h, expect, next);
#endif
      default: break;
    }
    std::fprintf(stderr, "depot-ipc-child: this build has no backend for %s\n", h.device.to_string().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-ipc-child: %s\n", e.what());
  }
  return 1;
}
