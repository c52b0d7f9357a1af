// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// PyTorch's CUDACachingAllocator through libtorch's C++ API, for `depot-bench alloc`.
// Built only when meson finds the torch package (the GPU machine has it).
#include <c10/cuda/CUDACachingAllocator.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>

namespace depot::bench {

namespace {
std::once_flag initialised;
void init()
{
  std::call_once(initialised, [] {
    int n = 0;
    cudaGetDeviceCount(&n);
    c10::cuda::CUDACachingAllocator::init(n);
  });
}
}  // namespace

void* torch_allocate(std::size_t bytes, void* stream)
{
  init();
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
}

void torch_deallocate(void* ptr) { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }

void torch_empty_cache()
{
  init();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

}  // namespace depot::bench
