// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device_id.hpp>

#include <cstddef>
#include <string>

namespace depot {

// What a backend reports about one device. Values it cannot know are 0 or empty
// (the host backend knows no memory bandwidth, for example).
struct device_properties {
  device_id id;
  std::string name;            // "NVIDIA H100 80GB HBM3", the CPU model for the host
  std::string arch;            // "sm_90", "gfx90a", "x86_64"
  int compute_major = 0;       // compute capability (CUDA) or GFX major (HIP); 0 on host
  int compute_minor = 0;
  int multiprocessors = 0;     // SMs, CUs, or hardware threads on the host
  std::size_t total_memory = 0;  // bytes
  std::size_t l2_cache_bytes = 0;
  double memory_bandwidth_gbps = 0.0;  // theoretical peak, 10^9 bytes/s; 0 when unknown
};

}  // namespace depot
