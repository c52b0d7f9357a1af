// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

// Run-time device dispatch for the type-erased layer's .cpp files (not installed).
#include <depot/config.hpp>
#include <depot/hal/device_id.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/runtime.hpp>

#include <string>

namespace depot::detail {

template <device D>
struct device_tag {
  using type = D;
};

[[noreturn]] inline void no_backend(device_id id, const char* option)
{
  throw invalid_argument("depot::dynamic_storage: device " + id.to_string() +
                         " is not available: this build of depot has no " + std::string{to_string(id.kind)} +
                         " backend (configure with -Dgpu=" + option + ")");
}

// Calls f(device_tag<D>{}) for the backend of `id` after checking the index; a kind this
// build lacks, or one that is no kind at all, is depot::invalid_argument.
template <class F>
void on_device(device_id id, F&& f)
{
  switch (id.kind) {
    case device_kind::host:
      runtime<host>::check_device(id.index);
      f(device_tag<host>{});
      return;
    case device_kind::cuda:
#if DEPOT_HAS_CUDA
      runtime<cuda>::check_device(id.index);
      f(device_tag<cuda>{});
      return;
#else
      no_backend(id, "cuda");
#endif
    case device_kind::hip:
#if DEPOT_HAS_HIP
      runtime<hip>::check_device(id.index);
      f(device_tag<hip>{});
      return;
#else
      no_backend(id, "hip");
#endif
  }
  throw invalid_argument("depot::dynamic_storage: device kind " + std::to_string(static_cast<int>(id.kind)) +
                         " is not a device kind (host, cuda, hip)");
}

}  // namespace depot::detail
