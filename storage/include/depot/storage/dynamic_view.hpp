// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>
#include <depot/storage/array_ref.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/dynamic_storage.hpp>
#include <depot/storage/layout.hpp>
#include <depot/storage/scalar.hpp>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

namespace depot {

// strided_view's run-time counterpart: a shared handle on a dynamic_storage and a layout
// (shape, strides, offset; rank <= 8). Views alias their storage; structural operations
// (slice, select, transpose, permute, view) never copy; clone(), contiguous() when it must
// copy, and to() make new storage. Element operations (copy_, fill_, clone, to,
// to_host_vector) run ops' strided kernels on the device holding the data and return when
// done. Not synchronised; the storage's count is.
class dynamic_view {
 public:
  using extents = layout::extents;

  dynamic_view() = default;
  // A view of `s` through `l`; every element of `l` must lie inside the storage
  // (depot::invalid_argument naming the layout and the storage otherwise).
  dynamic_view(dynamic_storage s, layout l);

  // A new contiguous view of `shape` over new, uninitialised storage.
  [[nodiscard]] static dynamic_view empty(extents shape, depot::dtype type, device_id device = {});
  [[nodiscard]] static dynamic_view empty(std::initializer_list<std::int64_t> shape, depot::dtype type,
                                          device_id device = {})
  {
    return empty(extents{shape.begin(), shape.size()}, type, device);
  }

  [[nodiscard]] const dynamic_storage& get_storage() const noexcept { return storage_; }
  [[nodiscard]] const layout& get_layout() const noexcept { return layout_; }
  [[nodiscard]] depot::dtype dtype() const noexcept { return storage_.dtype(); }
  [[nodiscard]] device_id device() const noexcept { return storage_.device(); }
  [[nodiscard]] int rank() const noexcept { return layout_.rank(); }
  [[nodiscard]] extents shape() const noexcept { return layout_.shape(); }
  [[nodiscard]] std::int64_t numel() const { return layout_.numel(); }
  [[nodiscard]] bool is_contiguous() const noexcept { return layout_.is_contiguous(); }
  // What ops' kernels take (valid while this view's storage lives).
  [[nodiscard]] array_ref ref() const { return array_ref::of(storage_.data_ptr(), dtype(), layout_); }

  [[nodiscard]] dynamic_view slice(int dim, std::int64_t start, std::int64_t stop, std::int64_t step = 1) const
  {
    return {storage_, layout_.slice(dim, start, stop, step)};
  }
  [[nodiscard]] dynamic_view select(int dim, std::int64_t index) const { return {storage_, layout_.select(dim, index)}; }
  [[nodiscard]] dynamic_view transpose(int d0, int d1) const { return {storage_, layout_.transpose(d0, d1)}; }
  [[nodiscard]] dynamic_view permute(std::initializer_list<int> order) const
  {
    return {storage_, layout_.permute(order)};
  }
  // The same elements with a new shape, never copying: depot::invalid_argument when the
  // strides do not allow it (use reshape(), which copies then).
  [[nodiscard]] dynamic_view view(extents shape) const;
  [[nodiscard]] dynamic_view view(std::initializer_list<std::int64_t> shape) const
  {
    return view(extents{shape.begin(), shape.size()});
  }
  [[nodiscard]] dynamic_view reshape(extents shape) const;
  [[nodiscard]] dynamic_view reshape(std::initializer_list<std::int64_t> shape) const
  {
    return reshape(extents{shape.begin(), shape.size()});
  }

  // New contiguous storage (same dtype and device) with the elements in row-major order.
  [[nodiscard]] dynamic_view clone() const;
  [[nodiscard]] dynamic_view contiguous() const { return is_contiguous() ? *this : clone(); }
  // A contiguous copy on `device`, optionally in another dtype.
  [[nodiscard]] dynamic_view to(device_id device) const { return to(device, dtype()); }
  [[nodiscard]] dynamic_view to(device_id device, depot::dtype type) const;

  // this = src elementwise: same shape (depot::invalid_argument naming both, nothing
  // written, otherwise), any layout, dtype and device. Conversion as dynamic_storage::copy_;
  // a source on another device is made contiguous on its device and staged on this one.
  // Views of the same storage may overlap: the source is then copied first.
  dynamic_view& copy_(const dynamic_view& src);
  // Every element = v (dynamic_storage::fill_'s rules: cast, refused when it cannot fit).
  dynamic_view& fill_(scalar v);

  // The elements in row-major order, converted to T, on the host.
  template <class T>
  [[nodiscard]] std::vector<T> to_host_vector() const
  {
    static_assert(!std::is_same_v<T, bool>, "std::vector<bool> has no data(): read bool views as std::uint8_t");
    const dynamic_view h = to(device_id{}, dtype_of_v<T>);
    std::vector<T> out(static_cast<std::size_t>(numel()));
    h.get_storage().copy_to_host(std::span<T>{out});
    return out;
  }

 private:
  dynamic_storage storage_;
  layout layout_;
};

}  // namespace depot
