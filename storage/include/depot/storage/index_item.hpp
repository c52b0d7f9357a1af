// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/config.hpp>
#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/storage/array_ref.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/slice.hpp>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace depot {

template <class T, device D>
class strided_view;

// "..." in an index expression: as many full slices as the dimensions it stands for.
struct ellipsis_t {
  explicit constexpr ellipsis_t() = default;
};
inline constexpr ellipsis_t ellipsis{};

// NumPy's np.newaxis / None: a new dimension of size 1.
struct newaxis_t {
  explicit constexpr newaxis_t() = default;
};
inline constexpr newaxis_t newaxis{};

namespace detail {

// Copies `bytes` from memory of device family `where` to host memory (synchronous).
inline void copy_to_host(device_kind where, void* dst, const void* src, std::size_t bytes)
{
  if (bytes == 0) return;
  switch (where) {
    case device_kind::host: std::memcpy(dst, src, bytes); return;
    case device_kind::cuda:
#if DEPOT_HAS_CUDA
      runtime<cuda>::copy(dst, src, bytes);
      return;
#else
      break;
#endif
    case device_kind::hip:
#if DEPOT_HAS_HIP
      runtime<hip>::copy(dst, src, bytes);
      return;
#else
      break;
#endif
  }
  throw invalid_argument("depot: an index array lives on " + std::string{to_string(where)} +
                         ", a backend this build of depot does not have");
}

// The elements of a strided `a` (in memory of `where`), row-major, converted to Out.
template <class Out>
std::vector<Out> read_to_host(const array_ref& a, device_kind where)
{
  const std::int64_t n = a.numel();
  std::vector<Out> out(static_cast<std::size_t>(n));
  if (n == 0) return out;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  for (int d = 0; d < a.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const std::int64_t reach = a.strides[u] * (a.shape[u] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  const std::size_t es = size_of(a.type);
  std::vector<unsigned char> span(static_cast<std::size_t>(hi - lo + 1) * es);
  copy_to_host(where, span.data(), static_cast<const unsigned char*>(a.data) + lo * static_cast<std::int64_t>(es),
               span.size());
  visit_dtype(a.type, [&](auto tag) {
    using U = typename decltype(tag)::type;
    std::vector<std::int64_t> idx(static_cast<std::size_t>(a.rank), 0);
    std::int64_t off = -lo;
    for (std::int64_t k = 0; k < n; ++k) {
      U v;
      std::memcpy(&v, span.data() + off * static_cast<std::int64_t>(es), sizeof(U));
      if constexpr (std::is_integral_v<U>) {
        out[static_cast<std::size_t>(k)] = static_cast<Out>(v);
      } else {
        out[static_cast<std::size_t>(k)] = Out{};  // not reached: index_item accepts integer and bool arrays only
      }
      for (int d = a.rank - 1; d >= 0; --d) {
        const auto u = static_cast<std::size_t>(d);
        off += a.strides[u];
        if (++idx[u] < a.shape[u]) break;
        off -= a.strides[u] * idx[u];
        idx[u] = 0;
      }
    }
  });
  return out;
}

}  // namespace detail

// One entry of an index expression (depot::index_expr): an integer, a depot::slice,
// depot::ellipsis, depot::newaxis, an index array (int32 or int64, any rank, any device;
// std::vector<std::int64_t> for a host list) or a boolean mask (bool, any rank; a plain
// `bool` is a 0-d mask, as Python's True/False). Array entries keep their storage alive
// (shared, not copied); reading their values (host_values) synchronises with their device.
class index_item {
 public:
  enum class kind : std::uint8_t { integer, slice, ellipsis, newaxis, array, mask };

  template <std::integral I>
    requires(!std::same_as<I, bool>)
  index_item(I i)  // NOLINT: implicit, as x[{0, 1}]
      : kind_{kind::integer}, integer_{static_cast<std::int64_t>(i)}
  {
    if constexpr (std::is_unsigned_v<I> && sizeof(I) >= sizeof(std::int64_t)) {
      DEPOT_EXPECTS(i <= static_cast<I>(INT64_MAX), "depot::index_item: index " + std::to_string(i) + " exceeds int64");
    }
  }
  template <class B>
    requires std::same_as<B, bool>
  index_item(B b)  // NOLINT: a 0-d mask: true adds a dimension of 1, false one of 0
      : kind_{kind::mask}, where_{device_kind::host}
  {
    auto cell = std::make_shared<bool>(b);
    ref_ = array_ref{};
    ref_.data = cell.get();
    ref_.type = dtype::bool_;
    ref_.rank = 0;
    keep_ = std::move(cell);
  }
  index_item(const depot::slice& s) : kind_{kind::slice}, slice_{s} {}  // NOLINT
  index_item(ellipsis_t) : kind_{kind::ellipsis} {}                     // NOLINT
  index_item(newaxis_t) : kind_{kind::newaxis} {}                       // NOLINT

  // An index array or mask held by a strided view of any device (shared, not copied).
  template <class I, device D>
  index_item(const strided_view<I, D>& v)  // NOLINT
      : kind_{std::is_same_v<I, bool> ? kind::mask : kind::array}, where_{D::kind}
  {
    static_assert(std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t> || std::is_same_v<I, bool>,
                  "depot::index_item: index arrays must hold int32_t or int64_t, masks bool");
    ref_ = v.ref();
    keep_ = std::make_shared<strided_view<I, D>>(v);
  }
  // A host list of indices (moved in).
  index_item(std::vector<std::int64_t> indices)  // NOLINT
      : kind_{kind::array}, where_{device_kind::host}
  {
    auto held = std::make_shared<std::vector<std::int64_t>>(std::move(indices));
    ref_ = array_ref::vector(held->data(), dtype::int64, static_cast<std::int64_t>(held->size()));
    keep_ = std::move(held);
  }

  // For type-erased callers: an index array (int32 or int64) or mask (bool) described by `a`
  // in memory of `where`, kept alive by `keep_alive`. Other dtypes (float index arrays
  // among them) are depot::invalid_argument.
  [[nodiscard]] static index_item from_array(const array_ref& a, device_kind where, std::shared_ptr<const void> keep_alive)
  {
    DEPOT_EXPECTS(a.type == dtype::int32 || a.type == dtype::int64 || a.type == dtype::bool_,
                  "depot::index_item: index arrays must be int32 or int64 (or bool for a mask), got " +
                      std::string{depot::to_string(a.type)} + " " + a.to_string());
    DEPOT_EXPECTS(a.rank >= 0 && a.rank <= max_rank, "depot::index_item: rank " + std::to_string(a.rank) +
                                                         " is out of range [0, " + std::to_string(max_rank) + "]");
    index_item it{ellipsis};
    it.kind_ = a.type == dtype::bool_ ? kind::mask : kind::array;
    it.ref_ = a;
    it.where_ = where;
    it.keep_ = std::move(keep_alive);
    return it;
  }

  [[nodiscard]] kind get_kind() const noexcept { return kind_; }
  [[nodiscard]] std::int64_t integer() const noexcept { return integer_; }
  [[nodiscard]] const depot::slice& get_slice() const noexcept { return slice_; }
  // Array and mask entries: the elements (array_ref.data is in memory of device()).
  [[nodiscard]] const array_ref& ref() const noexcept { return ref_; }
  [[nodiscard]] device_kind device() const noexcept { return where_; }
  [[nodiscard]] const std::shared_ptr<const void>& keep_alive() const noexcept { return keep_; }

  // Array entries: the indices, row-major, as int64 on the host; mask entries: 0/1 bytes.
  // Copies from the device (synchronous) when the array lives there.
  [[nodiscard]] std::vector<std::int64_t> host_indices() const
  {
    DEPOT_EXPECTS(kind_ == kind::array, "depot::index_item: host_indices() of a non-array entry");
    return detail::read_to_host<std::int64_t>(ref_, where_);
  }
  [[nodiscard]] std::vector<std::uint8_t> host_mask() const
  {
    DEPOT_EXPECTS(kind_ == kind::mask, "depot::index_item: host_mask() of a non-mask entry");
    return detail::read_to_host<std::uint8_t>(ref_, where_);
  }

  // "3", "1:-1:2", "...", "newaxis", "int64[2, 3] array", "bool[4] mask"
  [[nodiscard]] std::string to_string() const
  {
    switch (kind_) {
      case kind::integer: return std::to_string(integer_);
      case kind::slice: return slice_.to_string();
      case kind::ellipsis: return "...";
      case kind::newaxis: return "newaxis";
      case kind::array: return shape_string() + " array";
      case kind::mask: return shape_string() + " mask";
    }
    return "?";
  }

 private:
  [[nodiscard]] std::string shape_string() const
  {
    std::string s{depot::to_string(ref_.type)};
    s += '[';
    for (int d = 0; d < ref_.rank; ++d) s += (d ? ", " : "") + std::to_string(ref_.shape[static_cast<std::size_t>(d)]);
    return s + ']';
  }

  kind kind_;
  std::int64_t integer_ = 0;
  depot::slice slice_{};
  array_ref ref_{};
  device_kind where_ = device_kind::host;
  std::shared_ptr<const void> keep_;
};

}  // namespace depot
