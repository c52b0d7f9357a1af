// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// The umbrella header: everything public in depot, layer by layer.
#pragma once

#include <depot/config.hpp>

// hal/
#include <depot/hal/device.hpp>
#include <depot/hal/device_guard.hpp>
#include <depot/hal/device_id.hpp>
#include <depot/hal/device_properties.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/index_error.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/memory_info.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/host_device.hpp>
#include <depot/hal/stream_ref.hpp>

// pool/
#include <depot/pool/allocator_config.hpp>
#include <depot/pool/allocator_snapshot.hpp>
#include <depot/pool/c_api.h>
#include <depot/pool/caching_allocator.hpp>
#include <depot/pool/captured_graph.hpp>
#include <depot/pool/device_upstream.hpp>
#include <depot/pool/fixed_pool.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/pool/memory_stats.hpp>
#include <depot/pool/oom_handler.hpp>
#include <depot/pool/pool.hpp>
#include <depot/pool/profile_memory.hpp>
#include <depot/pool/trace_event.hpp>
#include <depot/pool/upstream_resource.hpp>

// storage/
#include <depot/storage/array_ref.hpp>
#include <depot/storage/bfloat16.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/dlpack.hpp>
#include <depot/storage/double_buffer.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/float16.hpp>
#include <depot/storage/host_storage.hpp>
#include <depot/storage/layout.hpp>
#include <depot/storage/prefetch_options.hpp>
#include <depot/storage/prefetcher.hpp>
#include <depot/storage/storage.hpp>
#include <depot/storage/strided_view.hpp>

// ops/
#include <depot/ops/busy_wait.hpp>
#include <depot/ops/copy.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/gather.hpp>
#include <depot/ops/kokkos_runtime.hpp>
#include <depot/ops/masked_fill.hpp>
#include <depot/ops/masked_select.hpp>
#include <depot/ops/scatter.hpp>
