// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/layout.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace depot {

// A non-owning, type-erased description of strided elements in one device's memory: the
// address of the first element (the layout's offset already applied), the dtype, and up to
// max_rank sizes and strides (in elements, any sign, 0 to broadcast). What ops' kernels take;
// it keeps nothing alive, so the caller holds the storage for as long as work uses it.
struct array_ref {
  void* data = nullptr;
  dtype type = dtype::float32;
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
  std::array<std::int64_t, max_rank> strides{};

  // `base` is the storage's first element; `l` says where the elements are in it.
  [[nodiscard]] static array_ref of(void* base, dtype t, const layout& l)
  {
    array_ref r;
    r.type = t;
    r.rank = l.rank();
    r.data = static_cast<char*>(base) + l.offset() * static_cast<std::int64_t>(size_of(t));
    for (int d = 0; d < r.rank; ++d) {
      r.shape[static_cast<std::size_t>(d)] = l.size(d);
      r.strides[static_cast<std::size_t>(d)] = l.stride(d);
    }
    return r;
  }
  // A contiguous 1-D array of n elements at `data`.
  [[nodiscard]] static array_ref vector(void* data, dtype t, std::int64_t n)
  {
    array_ref r;
    r.data = data;
    r.type = t;
    r.rank = 1;
    r.shape[0] = n;
    r.strides[0] = 1;
    return r;
  }

  [[nodiscard]] std::int64_t numel() const noexcept
  {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[static_cast<std::size_t>(d)];
    return n;
  }
  [[nodiscard]] bool is_contiguous() const noexcept
  {
    std::int64_t expected = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const auto i = static_cast<std::size_t>(d);
      if (shape[i] == 0) return true;
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
  [[nodiscard]] bool same_shape(const array_ref& o) const noexcept
  {
    if (o.rank != rank) return false;
    for (int d = 0; d < rank; ++d) {
      if (o.shape[static_cast<std::size_t>(d)] != shape[static_cast<std::size_t>(d)]) return false;
    }
    return true;
  }
  // "float32[4, 3] strides [3, 1]"
  [[nodiscard]] std::string to_string() const
  {
    std::string s{depot::to_string(type)};
    s += '[';
    for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(shape[static_cast<std::size_t>(d)]);
    s += "] strides [";
    for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(strides[static_cast<std::size_t>(d)]);
    return s + ']';
  }
};

}  // namespace depot
