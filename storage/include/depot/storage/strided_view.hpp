// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/array_ref.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/index_expr.hpp>
#include <depot/storage/layout.hpp>
#include <depot/storage/storage.hpp>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace depot {

// A view of elements of T in a storage of device D: a shared handle on the storage and a
// layout (shape, strides, offset; rank <= 8). Views alias: writes through one are seen
// through every view of the same storage; clone() and contiguous() (when it must copy)
// make new storage. Structural operations (slice, select, transpose, permute, view) never
// copy. Element movement between layouts and devices (clone, reshape when a copy is
// needed, to<D2>, copy_) is synchronous and runs ops/' kernels on the device that holds
// the data (declared in element_kernels.hpp). Not synchronised; the storage's count is.
template <class T, device D>
class index_ref;
namespace detail {  // indexing, defined in index_execution.hpp
template <class T, device D>
strided_view<T, D> index_read(const strided_view<T, D>& x, const index_expr& expr);
template <class T, device D, device D2>
void index_assign(const strided_view<T, D>& x, const index_expr& expr, const strided_view<T, D2>& y);
template <class T, device D>
void index_fill(const strided_view<T, D>& x, const index_expr& expr, const T& value);
}  // namespace detail

template <class T, device D = host>
class strided_view {
 public:
  using value_type = T;
  using extents = layout::extents;

  strided_view() = default;

  // A view of `s` through `l`; every element of `l` must lie inside the storage.
  strided_view(storage<T, D> s, layout l) : storage_{std::move(s)}, layout_{l}
  {
    if (layout_.numel() > 0) {
      DEPOT_EXPECTS(layout_.min_offset() >= 0 &&
                        layout_.max_offset() < static_cast<std::int64_t>(storage_.size()),
                    "depot::strided_view: " + layout_.to_string() + " reaches element " +
                        std::to_string(layout_.max_offset()) + " of a storage of " +
                        std::to_string(storage_.size()) + " elements");
    }
  }

  // A new contiguous view of `shape` over new, uninitialised storage.
  [[nodiscard]] static strided_view empty(extents shape)
  {
    const layout l = layout::contiguous(shape);
    return strided_view{storage<T, D>{static_cast<std::size_t>(l.numel())}, l};
  }
  [[nodiscard]] static strided_view empty(std::initializer_list<std::int64_t> shape)
  {
    return empty(extents{shape.begin(), shape.size()});
  }

  [[nodiscard]] const layout& get_layout() const noexcept { return layout_; }
  [[nodiscard]] const storage<T, D>& get_storage() const noexcept { return storage_; }
  [[nodiscard]] int rank() const noexcept { return layout_.rank(); }
  [[nodiscard]] extents shape() const noexcept { return layout_.shape(); }
  [[nodiscard]] std::int64_t size(int dim) const { return layout_.size(dim); }
  [[nodiscard]] std::int64_t numel() const { return layout_.numel(); }
  [[nodiscard]] bool is_contiguous() const noexcept { return layout_.is_contiguous(); }
  // Address of the first element (of the storage's memory space).
  [[nodiscard]] T* data() const noexcept { return base() + layout_.offset(); }
  // The type-erased description ops' kernels take (valid while this view's storage lives).
  [[nodiscard]] array_ref ref() const { return array_ref::of(base(), dtype_of_v<T>, layout_); }

  [[nodiscard]] strided_view slice(int dim, std::int64_t start, std::int64_t stop, std::int64_t step = 1) const
  {
    return {storage_, layout_.slice(dim, start, stop, step)};
  }
  [[nodiscard]] strided_view select(int dim, std::int64_t index) const { return {storage_, layout_.select(dim, index)}; }
  [[nodiscard]] strided_view transpose(int d0, int d1) const { return {storage_, layout_.transpose(d0, d1)}; }
  [[nodiscard]] strided_view permute(std::initializer_list<int> order) const { return {storage_, layout_.permute(order)}; }

  // The same elements with a new shape, never copying: depot::invalid_argument when the
  // strides do not allow it (use reshape(), which copies then).
  [[nodiscard]] strided_view view(extents shape) const
  {
    const auto l = layout_.view_as(shape);
    DEPOT_EXPECTS(l.has_value(), "depot::strided_view::view: " + layout_.to_string() +
                                     " cannot be seen with the new shape without a copy; use "
                                     "reshape(), which copies when it must");
    return {storage_, *l};
  }
  [[nodiscard]] strided_view view(std::initializer_list<std::int64_t> shape) const
  {
    return view(extents{shape.begin(), shape.size()});
  }
  // A view when the strides allow it, else a contiguous copy with the new shape.
  [[nodiscard]] strided_view reshape(extents shape) const
  {
    if (const auto l = layout_.view_as(shape)) return {storage_, *l};
    return clone().view(shape);
  }
  [[nodiscard]] strided_view reshape(std::initializer_list<std::int64_t> shape) const
  {
    return reshape(extents{shape.begin(), shape.size()});
  }
  [[nodiscard]] strided_view flatten() const { return reshape({-1}); }

  // New contiguous storage holding the elements in row-major order.
  [[nodiscard]] strided_view clone() const
  {
    strided_view out = empty(shape());
    out.copy_(*this);
    return out;
  }
  [[nodiscard]] strided_view contiguous() const { return is_contiguous() ? *this : clone(); }

  // A contiguous copy on device D2 (host <-> device, device <-> device).
  template <device D2>
  [[nodiscard]] strided_view<T, D2> to() const
  {
    strided_view<T, D2> out = strided_view<T, D2>::empty(shape());
    out.copy_(*this);
    return out;
  }

  // Copies the elements of `src` (same shape, any layout, any device) into this view.
  // Returns when the copy is complete. On one device this is one kernel (ops/); across
  // devices a non-contiguous side is first made contiguous on its own device.
  template <device D2>
  strided_view& copy_(const strided_view<T, D2>& src)
  {
    DEPOT_EXPECTS(same_shape(src.get_layout()),
                  "depot::strided_view::copy_: shapes differ: destination " + layout_.to_string() +
                      ", source " + src.get_layout().to_string());
    const std::int64_t n = numel();
    if (n == 0) return *this;
    if constexpr (std::is_same_v<D, D2>) {
      kernels::copy<D>(ref(), src.ref(), stream_ref<D>{});
      kernels::fence<D>(stream_ref<D>{});
    } else if (is_contiguous() && src.is_contiguous()) {
      copy_bytes<D2>(data(), src.data(), static_cast<std::size_t>(n) * sizeof(T));
    } else if (!src.is_contiguous()) {
      copy_(src.clone());
    } else {
      strided_view staged = empty(shape());
      staged.copy_(src);
      copy_(staged);
    }
    return *this;
  }

  // The elements in row-major order, on the host.
  [[nodiscard]] std::vector<T> to_host_vector() const
  {
    const std::int64_t n = numel();
    std::vector<T> out(static_cast<std::size_t>(n));
    if (n == 0) return out;
    const std::vector<T> span = read_span();
    const std::int64_t lo = layout_.min_offset();
    std::size_t k = 0;
    for_each_offset([&](std::int64_t off) { out[k++] = span[static_cast<std::size_t>(off - lo)]; });
    return out;
  }

  // NumPy indexing (index_planner.hpp has the rules, README.md "Indexing" the differences):
  // x.index({0, depot::slice(1, -1, 2), depot::ellipsis, depot::newaxis, idx}) is a view of
  // x for basic indexing and a new contiguous array for advanced indexing (index arrays,
  // masks). index_put writes a tensor (any device, broadcast to the shape of x[expr]) or a
  // scalar; bad indices throw before anything is written. Synchronous. x[expr] reads or
  // writes the same way (x[expr] = y) through a temporary depot::index_ref.
  [[nodiscard]] strided_view index(const index_expr& expr) const { return detail::index_read(*this, expr); }
  template <device D2>
  strided_view& index_put(const index_expr& expr, const strided_view<T, D2>& value)
  {
    detail::index_assign(*this, expr, value);
    return *this;
  }
  strided_view& index_put(const index_expr& expr, const T& value)
  {
    detail::index_fill(*this, expr, value);
    return *this;
  }
  [[nodiscard]] index_ref<T, D> operator[](index_expr expr) const { return {*this, std::move(expr)}; }
  template <class I>
    requires std::is_convertible_v<I, index_item>
  [[nodiscard]] index_ref<T, D> operator[](I&& item) const
  {
    return {*this, index_expr{index_item{std::forward<I>(item)}}};
  }

  // One element (host views only; negative indices count from the end).
  [[nodiscard]] T& at(std::initializer_list<std::int64_t> index) const
    requires std::is_same_v<D, host>
  {
    return base()[layout_.offset_of(index)];
  }

 private:
  template <class U, device E>
  friend class strided_view;

  [[nodiscard]] T* base() const noexcept
  {
    if constexpr (std::is_same_v<D, host>) {
      return storage_.host_ptr();
    } else {
      return storage_.device_ptr();
    }
  }

  [[nodiscard]] bool same_shape(const layout& other) const
  {
    if (other.rank() != layout_.rank()) return false;
    for (int d = 0; d < layout_.rank(); ++d) {
      if (other.size(d) != layout_.size(d)) return false;
    }
    return true;
  }

  template <class F>
  void for_each_offset(F f) const
  {
    const int r = layout_.rank();
    std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
    std::int64_t off = layout_.offset();
    const std::int64_t n = numel();
    for (std::int64_t k = 0; k < n; ++k) {
      f(off);
      for (int d = r - 1; d >= 0; --d) {
        const auto u = static_cast<std::size_t>(d);
        off += layout_.stride(d);
        if (++idx[u] < layout_.size(d)) break;
        off -= layout_.stride(d) * idx[u];
        idx[u] = 0;
      }
    }
  }

  // The storage elements [min_offset, max_offset] that the view covers, on the host.
  [[nodiscard]] std::vector<T> read_span() const
  {
    const std::int64_t lo = layout_.min_offset();
    const auto count = static_cast<std::size_t>(layout_.max_offset() - lo + 1);
    std::vector<T> span(count);
    runtime<D>::copy(span.data(), base() + lo, count * sizeof(T));
    return span;
  }

  // Contiguous bytes from memory of D2 into memory of D.
  template <device D2>
  static void copy_bytes(T* dst, const T* src, std::size_t bytes)
  {
    if constexpr (is_gpu_v<D>) {
      runtime<D>::copy(dst, src, bytes);  // unified addressing: the GPU runtime handles host memory
    } else if constexpr (is_gpu_v<D2>) {
      runtime<D2>::copy(dst, src, bytes);
    } else {
      runtime<host>::copy(dst, src, bytes);
    }
  }

  storage<T, D> storage_;
  layout layout_;
};

}  // namespace depot

#include <depot/storage/index_execution.hpp>  // NOLINT: the definitions of index / index_put
#include <depot/storage/index_ref.hpp>
