// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace depot {

// An index outside its valid range. Carries the index, the dimension (-1 for a flat index)
// and the extent, and for an index taken from an index array its position there;
// what() reads "index 5 is out of bounds for dimension 1 with size 5 (valid: -5..4)
// at position 7 of the index array". Thrown before anything is written.
class index_error : public std::out_of_range {
 public:
  index_error(std::int64_t index, int dimension, std::int64_t size)
      : std::out_of_range{message(index, dimension, size, -1)}, index_{index}, dimension_{dimension}, size_{size}
  {
  }
  index_error(std::int64_t index, int dimension, std::int64_t size, std::int64_t position)
      : std::out_of_range{message(index, dimension, size, position)},
        index_{index},
        dimension_{dimension},
        size_{size},
        position_{position}
  {
  }

  [[nodiscard]] std::int64_t index() const noexcept { return index_; }
  [[nodiscard]] int dimension() const noexcept { return dimension_; }
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  // Position in the index array (row-major), or -1 when the index was not from one.
  [[nodiscard]] std::int64_t position() const noexcept { return position_; }

 private:
  static std::string message(std::int64_t index, int dimension, std::int64_t size, std::int64_t position)
  {
    std::string m = "depot: index " + std::to_string(index) + " is out of bounds for " +
                    (dimension < 0 ? std::string{"a buffer"} : "dimension " + std::to_string(dimension)) +
                    " with size " + std::to_string(size);
    if (position >= 0) {
      m += size > 0 ? " (valid: " + std::to_string(-size) + ".." + std::to_string(size - 1) + ")"
                    : std::string{" (no index is valid)"};
      m += " at position " + std::to_string(position) + " of the index array";
    }
    return m;
  }

  std::int64_t index_;
  int dimension_;
  std::int64_t size_;
  std::int64_t position_ = -1;
};

}  // namespace depot
