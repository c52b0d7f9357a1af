// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include "bench_result.hpp"

#include <depot/hal/event.hpp>
#include <depot/hal/stream_ref.hpp>

#include <functional>
#include <vector>

namespace depot::bench {

// Times `op` (which queues work on `s`) with device events: opts.warmup untimed runs, then
// the median of opts.repetitions timed runs, in milliseconds.
template <device D>
double median_ms(const options& opts, stream_ref<D> s, int device, const std::function<void()>& op)
{
  event<D> start{device, true};
  event<D> stop{device, true};
  for (int i = 0; i < opts.warmup; ++i) op();
  runtime<D>::synchronize_stream(s.native());
  std::vector<double> ms;
  for (int i = 0; i < opts.repetitions; ++i) {
    start.record(s);
    op();
    stop.record(s);
    stop.synchronize();
    ms.push_back(event<D>::elapsed_ms(start, stop));
  }
  return median(ms);
}

}  // namespace depot::bench
