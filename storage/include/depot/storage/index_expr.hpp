// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/storage/index_item.hpp>

#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace depot {

// A NumPy index expression: the entries between the brackets of x[0, 1:-1:2, ..., None, idx],
// written x[{0, depot::slice(1, -1, 2), depot::ellipsis, depot::newaxis, idx}]. A value type;
// it shares (never copies) the index arrays it holds. See index_planner.hpp for the rules.
class index_expr {
 public:
  index_expr() = default;  // x[()]: the whole array
  index_expr(std::initializer_list<index_item> items) : items_{items} {}
  index_expr(index_item item) : items_{std::move(item)} {}  // NOLINT: x[idx]
  explicit index_expr(std::vector<index_item> items) : items_{std::move(items)} {}

  [[nodiscard]] std::span<const index_item> items() const noexcept { return items_; }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }
  index_expr& push_back(index_item item)
  {
    items_.push_back(std::move(item));
    return *this;
  }

  // "[0, 1:-1:2, ..., newaxis, int64[3] array]"
  [[nodiscard]] std::string to_string() const
  {
    std::string s = "[";
    for (std::size_t i = 0; i < items_.size(); ++i) s += (i ? ", " : "") + items_[i].to_string();
    return s + "]";
  }

 private:
  std::vector<index_item> items_;
};

}  // namespace depot
