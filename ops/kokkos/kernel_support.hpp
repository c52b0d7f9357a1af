// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Internal to ops/: what every kernel file shares. Element conversion usable in kernels,
// strided index arithmetic over coalesced dimensions (32-bit when it fits), the index
// validation pass that runs before any gather or scatter writes, and launch helpers.
#include "kokkos/device_space.hpp"

#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/ops/kokkos_runtime.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/array_ref.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

namespace depot::ops::detail {

// static_cast semantics, with float16/bfloat16 through float, bool as != 0, and floating
// to integer through int64 (values outside int64's range: unspecified, as in C++).
template <class To, class From>
KOKKOS_INLINE_FUNCTION To convert(From v)
{
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, float16> || std::is_same_v<From, bfloat16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, float16> || std::is_same_v<To, bfloat16>) {
    return To{static_cast<float>(v)};
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From{0};
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // Through int64, so that negative values reach unsigned types the same way on every
    // backend (C++ leaves a direct conversion undefined; GPUs saturate, CPUs wrap).
    return static_cast<To>(static_cast<std::int64_t>(v));
  } else {
    return static_cast<To>(v);
  }
}

// An unsigned integer of N bytes: same-dtype moves copy bit patterns by size only.
template <std::size_t N> struct bits_of;
template <> struct bits_of<1> { using type = std::uint8_t; };
template <> struct bits_of<2> { using type = std::uint16_t; };
template <> struct bits_of<4> { using type = std::uint32_t; };
template <> struct bits_of<8> { using type = std::uint64_t; };

// 16 bytes moved as one load or store (elements of any size that divides 16, in bulk).
struct alignas(16) word16 {
  std::uint64_t lo, hi;
};

// Shape and strides with unit dimensions dropped and neighbours merged where the strides of
// every array agree (dims d-1, d merge when stride[d-1] == stride[d] * shape[d] for all).
// Iteration is row-major over the (common) shape. Value type, copied into kernels.
template <int N>
struct strided_shape {
  int rank = 0;
  std::int64_t shape[max_rank] = {};
  std::int64_t strides[N][max_rank] = {};

  [[nodiscard]] KOKKOS_INLINE_FUNCTION std::int64_t shape_numel() const
  {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }

  // The offsets in every array of linear index i (row-major order over shape).
  template <class I>
  KOKKOS_INLINE_FUNCTION void offsets(I i, I (&out)[N]) const
  {
    for (int a = 0; a < N; ++a) out[a] = 0;
    for (int d = rank - 1; d > 0; --d) {
      const I n = static_cast<I>(shape[d]);
      const I q = i / n;
      const I r = i - q * n;
      for (int a = 0; a < N; ++a) out[a] += r * static_cast<I>(strides[a][d]);
      i = q;
    }
    if (rank > 0) {
      for (int a = 0; a < N; ++a) out[a] += i * static_cast<I>(strides[a][0]);
    }
  }
};

template <int N>
strided_shape<N> coalesce(const array_ref* const (&arrays)[N])
{
  strided_shape<N> s;
  const array_ref& first = *arrays[0];
  for (int d = 0; d < first.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (first.shape[u] == 1) continue;
    bool merge = s.rank > 0;
    for (int a = 0; a < N && merge; ++a) {
      merge = s.strides[a][s.rank - 1] == arrays[a]->strides[u] * first.shape[u];
    }
    if (merge) {
      s.shape[s.rank - 1] *= first.shape[u];
      for (int a = 0; a < N; ++a) s.strides[a][s.rank - 1] = arrays[a]->strides[u];
    } else {
      s.shape[s.rank] = first.shape[u];
      for (int a = 0; a < N; ++a) s.strides[a][s.rank] = arrays[a]->strides[u];
      ++s.rank;
    }
  }
  return s;
}

// The largest element offset (in absolute value) any array reaches, to choose 32-bit math.
template <int N>
bool fits_int32(const strided_shape<N>& s, std::int64_t numel)
{
  if (numel >= (std::int64_t{1} << 31)) return false;
  for (int a = 0; a < N; ++a) {
    std::int64_t reach = 0;
    for (int d = 0; d < s.rank; ++d) {
      const std::int64_t st = s.strides[a][d] < 0 ? -s.strides[a][d] : s.strides[a][d];
      reach += st * (s.shape[d] - 1);
    }
    if (reach >= (std::int64_t{1} << 31)) return false;
  }
  return true;
}

template <class D>
using exec_space = typename D::kokkos::execution_space;

template <class D, class I>
using range = Kokkos::RangePolicy<exec_space<D>, Kokkos::IndexType<I>>;

// [0, n) on an instance already found, or on `stream`'s instance.
template <class D, class I>
range<D, I> make_range(const exec_space<D>& exec, I n)
{
  return range<D, I>(exec, I{0}, n);
}
template <class D, class I>
range<D, I> make_range(stream_ref<D> stream, I n)
{
  return make_range<D, I>(D::kokkos::instance(stream), n);
}

// Kokkos 3.x with the OpenMP host backend keeps its host state per thread: it runs a host
// reduction, scan or team kernel only on the thread that initialised Kokkos (its host
// state on no other: OpenMP::impl_is_initialized() is per thread there, the very test
// Kokkos makes), and throws its own bare runtime_error elsewhere. Called before such a
// kernel (`what`: the op), this says so as a depot::error with the remedy instead. Nothing
// for a GPU device, another host backend, or Kokkos 4 and newer.
template <class D>
void require_kokkos_host_thread([[maybe_unused]] const char* what)
{
#if DEPOT_KOKKOS_HOST_STATE_PER_THREAD
  if constexpr (std::is_same_v<exec_space<D>, Kokkos::OpenMP>) {
    if (!Kokkos::OpenMP::impl_is_initialized()) {
      throw depot::error(std::string{what} +
                             " on the host: Kokkos 3.x with the OpenMP host backend runs reductions, scans and "
                             "team kernels only on the thread that initialised Kokkos, and this is another thread; "
                             "call it from that thread, or build depot with Kokkos 4 or newer",
                         what, __FILE__, __LINE__, 0, "kokkos_host_thread");
    }
  }
#endif
}

// Waits for the work queued on `stream` (host: nothing to wait for).
template <class D>
void wait(stream_ref<D> stream)
{
  D::kokkos::instance(stream).fence();
}

// Held around a reduction or scan from its launch until its result is read: a Kokkos
// instance keeps one scratch area (partial results, a scan's block sums, the reduced value
// the host reads back), which launches on that instance from several threads share and
// Kokkos 3.x does not guard (newer releases guard most of it: kokkos/kokkos#9291, a scan's
// two kernels, was fixed in 2026). depot shares instances among threads: the default
// stream's, a stream's own where several threads launch on it, and the per-thread default
// stream's handle (0x2: one instance for every thread's stream). The lock is the instance's
// own (D::kokkos::locked_instance: one for the default stream's and the host's), so streams
// with instances of their own never wait for each other. The guard finds the instance once
// and hands it to the kernels it guards (range, instance, wait). Also makes the host-thread
// check (require_kokkos_host_thread). On the per-thread handle the threads' streams run at
// once on the device, so finish() waits for the kernels before the lock goes to another.
template <class D>
class scratch_guard {
 public:
  scratch_guard(stream_ref<D> stream, const char* what)
      : stream_{stream}, held_{(require_kokkos_host_thread<D>(what), D::kokkos::locked_instance(stream))},
        lock_{*held_.lock}
  {
  }
  // The guarded instance, a range of n on it, and a wait for its work.
  [[nodiscard]] const exec_space<D>& instance() const noexcept { return held_.exec; }
  template <class I>
  [[nodiscard]] range<D, I> range_of(I n) const
  {
    return make_range<D, I>(held_.exec, n);
  }
  void wait() const { held_.exec.fence(); }
  // Call once the kernels are launched where nothing after them waits for the stream.
  void finish() const
  {
    if (is_gpu_v<D> && stream_.is_per_thread()) wait();
  }

 private:
  stream_ref<D> stream_;
  locked_instance<exec_space<D>> held_;  // (its lock keeps the instance's entry: declared before lock_)
  std::unique_lock<std::mutex> lock_;
};

// One element of device memory to the host, with no wait: the caller has waited for the
// work that writes it.
template <class D, class T>
T copy_one(const T* device_ptr)
{
  T v{};
  runtime<D>::copy(&v, device_ptr, sizeof(T));
  return v;
}

// One element of device memory to the host, once the guarded instance's work is done.
template <class D, class T>
T read_one(const T* device_ptr, const scratch_guard<D>& guard)
{
  guard.wait();
  return copy_one<D>(device_ptr);
}

// Validates an index array (int32 or int64, any shape/strides) against `extent`: every
// value in [-extent, extent). On failure throws depot::index_error with the first bad
// value, its row-major position, `dim` and extent. Synchronises.
template <class D>
void check_indices(const array_ref& index, std::int64_t extent, int dim, stream_ref<D> stream);

// Element offsets (int64, any shape) all within [lo, hi]: depot::invalid_argument naming
// the first bad one and its position otherwise. Synchronises.
template <class D>
void check_offsets(const array_ref& offsets, std::int64_t lo, std::int64_t hi, stream_ref<D> stream);

// One element of device memory to the host (synchronises the stream first).
template <class D, class T>
T read_one(const T* device_ptr, stream_ref<D> stream)
{
  wait(stream);
  return copy_one<D>(device_ptr);
}

[[nodiscard]] inline std::int64_t wrap_index(std::int64_t i, std::int64_t n) { return i < 0 ? i + n : i; }

}  // namespace depot::ops::detail

namespace depot::ops::detail {

// Temporary device memory from the device's caching pool, freed on the stream it was used on.
template <class D>
class scratch_buffer {
 public:
  scratch_buffer(std::size_t bytes, stream_ref<D> stream)
      : pool_{&pool<D>(runtime<D>::current_device())}, stream_{stream}, ptr_{pool_->allocate(bytes, stream)}
  {
  }
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
  // The block was allocated here on stream_, so freeing cannot fail.
  ~scratch_buffer() { pool_->deallocate(ptr_, stream_); }
  template <class T>
  [[nodiscard]] T* as() const noexcept
  {
    return static_cast<T*>(ptr_);
  }

 private:
  caching_allocator<D>* pool_;
  stream_ref<D> stream_;
  void* ptr_;
};

// dst += v for types without a native atomic add: a compare-and-swap loop on the aligned
// 32-bit word that holds the 1- or 2-byte element.
template <class T>
KOKKOS_INLINE_FUNCTION void atomic_add_narrow(T* p, T v)
{
  static_assert(sizeof(T) == 1 || sizeof(T) == 2);
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto* word = reinterpret_cast<unsigned int*>(addr & ~std::uintptr_t{3});
  const unsigned shift = static_cast<unsigned>((addr & 3u) * 8u);
  const unsigned mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
  unsigned old = *reinterpret_cast<volatile unsigned int*>(word);
  while (true) {
    T cur;
    const auto bits = static_cast<std::conditional_t<sizeof(T) == 1, std::uint8_t, std::uint16_t>>((old & mask) >> shift);
    std::memcpy(&cur, &bits, sizeof(T));
    T sum;
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      sum = T{static_cast<float>(cur) + static_cast<float>(v)};
    } else {
      sum = static_cast<T>(cur + v);
    }
    std::conditional_t<sizeof(T) == 1, std::uint8_t, std::uint16_t> nb;
    std::memcpy(&nb, &sum, sizeof(T));
    const unsigned desired = (old & ~mask) | (static_cast<unsigned>(nb) << shift);
    const unsigned seen = Kokkos::atomic_compare_exchange(word, old, desired);
    if (seen == old) return;
    old = seen;
  }
}

template <class T>
KOKKOS_INLINE_FUNCTION void atomic_add_any(T* p, T v)
{
  if constexpr (sizeof(T) <= 2) {
    atomic_add_narrow(p, v);
  } else {
    Kokkos::atomic_add(p, v);
  }
}

// a + b in T (float16/bfloat16 through float).
template <class T>
KOKKOS_INLINE_FUNCTION T add_values(T a, T b)
{
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T{static_cast<float>(a) + static_cast<float>(b)};
  } else {
    return static_cast<T>(a + b);
  }
}

}  // namespace depot::ops::detail
