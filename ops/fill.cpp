// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// kernels::fill and kernels::masked_fill. Contiguous fills store 16-byte words (the element
// pattern repeated), several per thread; strided fills walk coalesced dimensions.
#include "kokkos/kernel_support.hpp"

#include <depot/ops/fill.hpp>
#include <depot/storage/element_kernels.hpp>

#include <algorithm>
#include <cstring>
#include <string>

namespace depot {
namespace ops::detail {
namespace {

constexpr int words_per_thread = 4;

template <class D, class I>
void fill_words(word16* p, I n, word16 w, stream_ref<D> stream)
{
  const I per = words_per_thread;
  const I threads = (n + per - 1) / per;
  // Thread t stores words t, t + threads, ...: neighbouring threads store neighbouring words.
  Kokkos::parallel_for("depot::fill", make_range<D, I>(stream, threads), KOKKOS_LAMBDA(I t) {
    for (I k = 0; k < per; ++k) {
      const I i = t + k * threads;
      if (i < n) p[i] = w;
    }
  });
}

template <class D, class U>
void fill_elements(U* p, std::int64_t n, U v, stream_ref<D> stream)
{
  Kokkos::parallel_for("depot::fill", make_range<D, std::int64_t>(stream, n),
                       KOKKOS_LAMBDA(std::int64_t i) { p[i] = v; });
}

// Host fills up to this size run on the calling thread: an OpenMP team costs ~1 us to start
// (10x a 4 KiB memset) and, on a loaded machine, a descheduled team member stalls the whole
// fill for a scheduler tick (4-8 ms seen on 2- and 16-core VMs). Larger fills split into
// chunks of host_fill_chunk_bytes, each filled by one thread at memset speed.
constexpr std::int64_t host_serial_fill_bytes = std::int64_t{1} << 20;
constexpr std::int64_t host_fill_chunk_bytes = std::int64_t{256} << 10;

// Whether every byte of v is the same (zero, all ones, ...): then memset writes it.
template <class U>
bool uniform_bytes(const U& v, unsigned char& byte)
{
  unsigned char b[sizeof(U)];
  std::memcpy(b, &v, sizeof(U));
  byte = b[0];
  return std::all_of(b, b + sizeof(U), [&](unsigned char x) { return x == b[0]; });
}

// A serial fill at memset speed: on x86-64 the string store instruction (`rep stos`, the
// fast-string path memset itself uses, with no read-for-ownership of the lines it writes);
// elsewhere a plain loop.
template <class U>
void fill_serial(U* p, std::int64_t n, U v)
{
#if defined(__x86_64__)
  auto count = static_cast<std::size_t>(n);
  void* dst = p;
  if constexpr (sizeof(U) == 8) {
    std::uint64_t x;
    std::memcpy(&x, &v, 8);
    asm volatile("rep stosq" : "+D"(dst), "+c"(count) : "a"(x) : "memory");
  } else if constexpr (sizeof(U) == 4) {
    std::uint32_t x;
    std::memcpy(&x, &v, 4);
    asm volatile("rep stosl" : "+D"(dst), "+c"(count) : "a"(x) : "memory");
  } else if constexpr (sizeof(U) == 2) {
    std::uint16_t x;
    std::memcpy(&x, &v, 2);
    asm volatile("rep stosw" : "+D"(dst), "+c"(count) : "a"(x) : "memory");
  } else {
    std::fill_n(p, n, v);
  }
#else
  std::fill_n(p, n, v);
#endif
}

template <class D, class U>
void fill_contiguous(U* p, std::int64_t n, U v, stream_ref<D> stream)
{
  if constexpr (!is_gpu_v<D>) {
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(U));
    unsigned char byte = 0;
    const bool uniform = uniform_bytes(v, byte);
    const auto fill_range = [p, v, uniform, byte](std::int64_t lo, std::int64_t len) {
      if (uniform) {
        std::memset(p + lo, byte, static_cast<std::size_t>(len) * sizeof(U));
      } else {
        fill_serial(p + lo, len, v);
      }
    };
    if (bytes <= host_serial_fill_bytes) {
      fill_range(0, n);
      return;
    }
    const std::int64_t chunk = host_fill_chunk_bytes / static_cast<std::int64_t>(sizeof(U));
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    Kokkos::parallel_for("depot::fill", make_range<D, std::int64_t>(stream, chunks),
                         [=](std::int64_t c) { fill_range(c * chunk, std::min(chunk, n - c * chunk)); });
    return;
  }
  // A value whose bytes are all the same (zero above all): the backend's memset, one enqueue
  // of the driver's own (~1 us of the host's time, where a Kokkos launch costs ~5 us:
  // BENCHMARKS.md) at the same bandwidth, in stream order on the same stream.
  // The stream's Kokkos instance is still found (made at its first use, as a kernel would):
  // a program whose first op on a stream is a zero fill on the thread that initialised
  // Kokkos, and whose later kernels there come from other threads, runs as before with
  // Kokkos 3.x's OpenMP host backend (see require_kokkos_host_thread).
  if (unsigned char byte = 0; uniform_bytes(v, byte)) {
    (void)D::kokkos::instance(stream);
    runtime<D>::set_async(p, byte, static_cast<std::size_t>(n) * sizeof(U), stream.native());
    return;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (addr % sizeof(U) != 0 || n < 64) {
    fill_elements<D, U>(p, n, v, stream);
    return;
  }
  const std::int64_t head = static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(U));
  const std::int64_t words = (n - head) * static_cast<std::int64_t>(sizeof(U)) / 16;
  const std::int64_t tail_start = head + words * 16 / static_cast<std::int64_t>(sizeof(U));
  word16 w;
  unsigned char bytes[16];
  for (std::size_t k = 0; k < 16; k += sizeof(U)) std::memcpy(bytes + k, &v, sizeof(U));
  std::memcpy(&w, bytes, 16);
  if (head > 0) fill_elements<D, U>(p, head, v, stream);
  auto* wp = reinterpret_cast<word16*>(p + head);
  if (words < (std::int64_t{1} << 31)) {
    fill_words<D, std::int32_t>(wp, static_cast<std::int32_t>(words), w, stream);
  } else {
    fill_words<D, std::int64_t>(wp, words, w, stream);
  }
  if (tail_start < n) fill_elements<D, U>(p + tail_start, n - tail_start, v, stream);
}

template <class D, class U, class I>
void fill_strided(U* p, const strided_shape<1>& s, I n, U v, stream_ref<D> stream)
{
  Kokkos::parallel_for("depot::fill", make_range<D, I>(stream, n), KOKKOS_LAMBDA(I i) {
    I off[1];
    s.offsets(i, off);
    p[off[0]] = v;
  });
}

template <class D, class U>
void fill_typed(const array_ref& dst, const void* value, stream_ref<D> stream)
{
  U v;
  std::memcpy(&v, value, sizeof(U));
  auto* p = static_cast<U*>(dst.data);
  if (dst.is_contiguous()) {
    fill_contiguous<D, U>(p, dst.numel(), v, stream);
    return;
  }
  const array_ref* arrays[1] = {&dst};
  const auto s = coalesce<1>(arrays);
  const std::int64_t n = dst.numel();
  if (fits_int32(s, n)) {
    fill_strided<D, U, std::int32_t>(p, s, static_cast<std::int32_t>(n), v, stream);
  } else {
    fill_strided<D, U, std::int64_t>(p, s, n, v, stream);
  }
}

template <class D, class U, class M>
void masked_fill_typed(const array_ref& dst, const array_ref& mask, const void* value, stream_ref<D> stream)
{
  U v;
  std::memcpy(&v, value, sizeof(U));
  auto* p = static_cast<U*>(dst.data);
  const auto* m = static_cast<const M*>(mask.data);
  const array_ref* arrays[2] = {&dst, &mask};
  const auto s = coalesce<2>(arrays);
  const std::int64_t n = dst.numel();
  Kokkos::parallel_for("depot::masked_fill", make_range<D, std::int64_t>(stream, n), KOKKOS_LAMBDA(std::int64_t i) {
    std::int64_t off[2];
    s.offsets(i, off);
    if (m[off[1]]) p[off[0]] = v;
  });
}

}  // namespace
}  // namespace ops::detail

template <device D>
void kernels::fill(const array_ref& dst, const void* value, stream_ref<D> stream)
{
  if (dst.numel() == 0) return;
  DEPOT_EXPECTS(dst.data != nullptr && value != nullptr,
                "depot::fill: null destination or value for " + dst.to_string());
  ops::ensure_kokkos();
  switch (size_of(dst.type)) {
    case 1: ops::detail::fill_typed<D, std::uint8_t>(dst, value, stream); break;
    case 2: ops::detail::fill_typed<D, std::uint16_t>(dst, value, stream); break;
    case 4: ops::detail::fill_typed<D, std::uint32_t>(dst, value, stream); break;
    default: ops::detail::fill_typed<D, std::uint64_t>(dst, value, stream); break;
  }
}

template <device D>
void kernels::masked_fill(const array_ref& dst, const array_ref& mask, const void* value, stream_ref<D> stream)
{
  DEPOT_EXPECTS(mask.type == dtype::bool_ || mask.type == dtype::uint8,
                "depot::masked_fill: the mask must be bool (or uint8), got " + std::string{to_string(mask.type)});
  DEPOT_EXPECTS(dst.same_shape(mask), "depot::masked_fill: the mask " + mask.to_string() +
                                          " does not have the shape of the destination " + dst.to_string());
  if (dst.numel() == 0) return;
  DEPOT_EXPECTS(value != nullptr, "depot::masked_fill: null value");
  ops::ensure_kokkos();
  switch (size_of(dst.type)) {
    case 1: ops::detail::masked_fill_typed<D, std::uint8_t, std::uint8_t>(dst, mask, value, stream); break;
    case 2: ops::detail::masked_fill_typed<D, std::uint16_t, std::uint8_t>(dst, mask, value, stream); break;
    case 4: ops::detail::masked_fill_typed<D, std::uint32_t, std::uint8_t>(dst, mask, value, stream); break;
    default: ops::detail::masked_fill_typed<D, std::uint64_t, std::uint8_t>(dst, mask, value, stream); break;
  }
}

namespace ops {
template <device D, class T>
void fill(T* data, std::size_t n, T value, stream_ref<D> stream)
{
  if (n == 0) return;
  DEPOT_EXPECTS(data != nullptr,
                "depot::ops::fill: null data with n = " + std::to_string(n) + " elements");
  DEPOT_EXPECTS(n <= static_cast<std::size_t>(INT64_MAX), "depot::ops::fill: n = " + std::to_string(n) + " is too large");
  kernels::fill<D>(array_ref::vector(data, dtype_of_v<T>, static_cast<std::int64_t>(n)), &value, stream);
}
}  // namespace ops

#define DEPOT_OPS_FILL_DEFINE(D, T) template void ops::fill<D, T>(T*, std::size_t, T, stream_ref<D>);
#define DEPOT_OPS_FILL_DEFINE_ALL(D)                                                              \
  DEPOT_OPS_FILL_DEFINE(D, float)                                                                 \
  DEPOT_OPS_FILL_DEFINE(D, double)                                                                \
  DEPOT_OPS_FILL_DEFINE(D, std::int32_t)                                                          \
  DEPOT_OPS_FILL_DEFINE(D, std::int64_t)                                                          \
  DEPOT_OPS_FILL_DEFINE(D, std::uint8_t)                                                          \
  template void kernels::fill<D>(const array_ref&, const void*, stream_ref<D>);                   \
  template void kernels::masked_fill<D>(const array_ref&, const array_ref&, const void*, stream_ref<D>);

DEPOT_OPS_FILL_DEFINE_ALL(host)
#if DEPOT_HAS_CUDA
DEPOT_OPS_FILL_DEFINE_ALL(cuda)
#endif
#if DEPOT_HAS_HIP
DEPOT_OPS_FILL_DEFINE_ALL(hip)
#endif

}  // namespace depot
