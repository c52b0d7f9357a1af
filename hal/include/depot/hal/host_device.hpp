// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// DEPOT_HOST_DEVICE(): marks a function callable from host and device code when the
// translation unit is compiled by nvcc or hipcc (ops/ kernels), and nothing otherwise.
// Function-like, so that a misspelling is a compile error rather than a silent no-op.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define DEPOT_HOST_DEVICE() __host__ __device__
#else
#define DEPOT_HOST_DEVICE()
#endif
