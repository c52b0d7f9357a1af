// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// A program outside depot that links it: fills host memory through ops and the HAL.
#include <depot/depot.hpp>

#include <cstdio>
#include <vector>

int main()
{
  using rt = depot::runtime<depot::host>;
  std::vector<float> v(1000, 0.0F);
  auto* d = static_cast<float*>(rt::allocate(v.size() * sizeof(float), 0));
  depot::ops::fill<depot::host, float>(d, v.size(), 2.5F);
  rt::copy(v.data(), d, v.size() * sizeof(float));
  rt::deallocate(d, 0);
  for (float x : v) {
    if (x != 2.5F) return 1;
  }
  std::printf("consumer: depot %s ok\n", DEPOT_VERSION);
  return 0;
}
