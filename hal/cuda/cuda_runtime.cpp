// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "cuda_api.hpp"

#include "../gpu/gpu_runtime_impl.hpp"

namespace depot::hal {
template class gpu_runtime<cuda_api>;
}  // namespace depot::hal
