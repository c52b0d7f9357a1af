// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace depot {

// An index outside its valid range. Carries the index, the dimension (-1 for a flat index)
// and the extent; what() reads "index 5 is out of bounds for dimension 1 with size 5".
// Thrown before anything is written.
class index_error : public std::out_of_range {
 public:
  index_error(std::int64_t index, int dimension, std::int64_t size)
      : std::out_of_range{message(index, dimension, size)}, index_{index}, dimension_{dimension}, size_{size}
  {
  }

  [[nodiscard]] std::int64_t index() const noexcept { return index_; }
  [[nodiscard]] int dimension() const noexcept { return dimension_; }
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }

 private:
  static std::string message(std::int64_t index, int dimension, std::int64_t size)
  {
    return "depot: index " + std::to_string(index) + " is out of bounds for " +
           (dimension < 0 ? std::string{"a buffer"} : "dimension " + std::to_string(dimension)) +
           " with size " + std::to_string(size);
  }

  std::int64_t index_;
  int dimension_;
  std::int64_t size_;
};

}  // namespace depot
