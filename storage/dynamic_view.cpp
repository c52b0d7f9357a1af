// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/expects.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/storage/dynamic_view.hpp>
#include <depot/storage/element_kernels.hpp>

#include "on_device.hpp"

#include <algorithm>
#include <string>

namespace depot {

namespace {

bool same_shape(const layout& a, const layout& b)
{
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d < a.rank(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

std::string describe(const dynamic_view& v)
{
  return std::string{to_string(v.dtype())} + " " + v.get_layout().to_string() + " on " + v.device().to_string();
}

}  // namespace

dynamic_view::dynamic_view(dynamic_storage s, layout l) : storage_{std::move(s)}, layout_{l}
{
  if (layout_.numel() > 0) {
    DEPOT_EXPECTS(layout_.min_offset() >= 0 && layout_.max_offset() < static_cast<std::int64_t>(storage_.size()),
                  "depot::dynamic_view: " + layout_.to_string() + " reaches element " +
                      std::to_string(layout_.max_offset()) + " of a storage of " + std::to_string(storage_.size()) +
                      " elements");
  }
}

dynamic_view dynamic_view::empty(extents shape, depot::dtype type, device_id device)
{
  const layout l = layout::contiguous(shape);
  return dynamic_view{dynamic_storage{static_cast<std::size_t>(l.numel()), type, device}, l};
}

dynamic_view dynamic_view::view(extents shape) const
{
  const auto l = layout_.view_as(shape);
  DEPOT_EXPECTS(l.has_value(), "depot::dynamic_view::view: " + layout_.to_string() +
                                   " cannot be seen with the new shape without a copy; use reshape(), which "
                                   "copies when it must");
  return {storage_, *l};
}

dynamic_view dynamic_view::reshape(extents shape) const
{
  if (const auto l = layout_.view_as(shape)) return {storage_, *l};
  return clone().view(shape);
}

dynamic_view dynamic_view::clone() const { return to(device(), dtype()); }

dynamic_view dynamic_view::to(device_id device, depot::dtype type) const
{
  dynamic_view out = empty(shape(), type, device);
  out.copy_(*this);
  return out;
}

dynamic_view& dynamic_view::copy_(const dynamic_view& src)
{
  DEPOT_EXPECTS(same_shape(layout_, src.layout_), "depot::dynamic_view::copy_: shapes differ: destination " +
                                                      describe(*this) + ", source " + describe(src));
  if (numel() == 0) return *this;
  if (src.device() != device()) {
    // Contiguous on the source's device, moved as bytes, converted and scattered here.
    const dynamic_view packed = src.contiguous();
    const dynamic_storage here = packed.storage_.to(device());
    return copy_(dynamic_view{here, layout::contiguous(shape())});
  }
  const bool same_buffer = src.storage_.data_ptr() == storage_.data_ptr();
  if (same_buffer && !(src.layout_.offset() == layout_.offset() && src.dtype() == dtype() &&
                       std::ranges::equal(src.layout_.strides(), layout_.strides()))) {
    return copy_(src.clone());  // overlapping views: read everything before writing
  }
  detail::on_device(device(), [&](auto tag) {
    using D = typename decltype(tag)::type;
    kernels::copy<D>(ref(), src.ref(), stream_ref<D>{});
    kernels::fence<D>(stream_ref<D>{});
  });
  return *this;
}

dynamic_view& dynamic_view::fill_(scalar v)
{
  alignas(8) unsigned char element[8] = {};
  v.store(dtype(), element);  // refused before anything is written
  if (numel() == 0) return *this;
  detail::on_device(device(), [&](auto tag) {
    using D = typename decltype(tag)::type;
    kernels::fill<D>(ref(), element, stream_ref<D>{});
    kernels::fence<D>(stream_ref<D>{});
  });
  return *this;
}

}  // namespace depot
