// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <cstddef>

namespace depot {

// How a depot::prefetcher stages batches. A plain value; prefetcher's constructor checks it
// (lookahead in [1, max_lookahead], num_workers in [1, max_workers], an existing device) and
// refuses anything else with depot::invalid_argument naming the field and the valid range.
struct prefetch_options {
  static constexpr std::size_t max_lookahead = 1024;
  static constexpr std::size_t max_workers = 256;

  std::size_t lookahead = 2;    // batches taken from the producer and not yet delivered, at most
  std::size_t num_workers = 1;  // host threads staging batches
  bool pin_memory = true;       // stage pageable batches through pinned_pool<D> (page-locked
                                // batches are always copied directly); false: copy as given
  int device = 0;               // device index of the backend
};

}  // namespace depot
