// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench info`: the devices this build sees, their properties, and the HAL's own
// memset / memcpy bandwidth on each (device events, warm-up, median of repetitions; bytes
// counted as read + written).
#include "bench_result.hpp"
#include "timing.hpp"

#include <depot/config.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace depot::bench {

namespace {

template <device D>
using rt = runtime<D>;

// Owns memory from a HAL allocation function.
template <device D>
struct device_memory {
  device_memory(std::size_t n, int device) : dev{device}, ptr{rt<D>::allocate(n, device)} {}
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  ~device_memory() { rt<D>::deallocate(ptr, dev); }
  int dev;
  void* ptr;
};

template <device D>
struct pinned_memory {
  explicit pinned_memory(std::size_t n) : ptr{rt<D>::allocate_pinned(n)} {}
  pinned_memory(const pinned_memory&) = delete;
  pinned_memory& operator=(const pinned_memory&) = delete;
  ~pinned_memory() { rt<D>::deallocate_pinned(ptr); }
  void* ptr;
};

template <device D>
nlohmann::json info_for(const options& opts, int device)
{
  const device_properties p = rt<D>::properties(device);
  const memory_info m = rt<D>::memory(device);
  std::printf("\n%s  %s  (%s, %d %s, %s total, %s free", p.id.to_string().c_str(),
              p.name.c_str(), p.arch.c_str(), p.multiprocessors,
              is_gpu_v<D> ? "multiprocessors" : "hardware threads",
              format_bytes(p.total_memory).c_str(), format_bytes(m.free_bytes).c_str());
  if (p.memory_bandwidth_gbps > 0) std::printf(", peak %.0f GB/s", p.memory_bandwidth_gbps);
  std::printf(")\n");

  nlohmann::json j{{"id", p.id.to_string()},
                   {"name", p.name},
                   {"arch", p.arch},
                   {"multiprocessors", p.multiprocessors},
                   {"total_memory", p.total_memory},
                   {"free_memory", m.free_bytes},
                   {"l2_cache_bytes", p.l2_cache_bytes},
                   {"peak_bandwidth_gbps", p.memory_bandwidth_gbps},
                   {"results", nlohmann::json::array()}};

  const std::size_t n = opts.bytes;
  stream<D> s{device};
  device_memory<D> a{n, device};
  device_memory<D> b{n, device};
  pinned_memory<D> pinned{n};
  std::vector<unsigned char> pageable(n);
  // Never time on zeros: a pattern everywhere.
  for (std::size_t i = 0; i < n; ++i) pageable[i] = static_cast<unsigned char>(i * 131 + 7);
  std::memcpy(pinned.ptr, pageable.data(), n);
  rt<D>::copy(a.ptr, pageable.data(), n);

  struct row {
    const char* name;
    double bytes_moved;  // read + written
    std::function<void()> op;
  };
  std::vector<row> rows{
      {"memset", double(n), [&] { rt<D>::set_async(b.ptr, 0x5A, n, s.native()); }},
      {"copy device->device", 2.0 * double(n),
       [&] { rt<D>::copy_async(b.ptr, a.ptr, n, s.native()); }},
  };
  if constexpr (is_gpu_v<D>) {
    rows.push_back({"copy host->device (pinned)", double(n),
                    [&] { rt<D>::copy_async(b.ptr, pinned.ptr, n, s.native()); }});
    rows.push_back({"copy device->host (pinned)", double(n),
                    [&] { rt<D>::copy_async(pinned.ptr, a.ptr, n, s.native()); }});
    rows.push_back({"copy host->device (pageable)", double(n),
                    [&] { rt<D>::copy_async(b.ptr, pageable.data(), n, s.native()); }});
  }

  std::printf("  %-30s %10s %11s %10s %9s\n", "operation", "size", "median ms", "GB/s",
              "of peak");
  for (const row& r : rows) {
    const double ms = median_ms<D>(opts, s.ref(), device, r.op);
    const double gbps = ms > 0 ? r.bytes_moved / (ms * 1e-3) / 1e9 : 0.0;
    char peak[16] = "-";
    if (p.memory_bandwidth_gbps > 0 && std::strstr(r.name, "host") == nullptr) {
      std::snprintf(peak, sizeof peak, "%.2f", gbps / p.memory_bandwidth_gbps);
    }
    std::printf("  %-30s %10s %11.3f %10.1f %9s\n", r.name, format_bytes(n).c_str(), ms, gbps,
                peak);
    j["results"].push_back({{"operation", r.name},
                            {"bytes", n},
                            {"bytes_moved", r.bytes_moved},
                            {"median_ms", ms},
                            {"gbps", gbps},
                            {"repetitions", opts.repetitions}});
  }
  return j;
}

template <device D>
void info_all(const options& opts, nlohmann::json& out)
{
  const int count = rt<D>::device_count();
  if (count == 0) {
    std::printf("\n%.*s: no device visible\n", static_cast<int>(D::name.size()), D::name.data());
    return;
  }
  for (int d = 0; d < count; ++d) out.push_back(info_for<D>(opts, d));
}

}  // namespace

nlohmann::json run_info(const options& opts)
{
  std::printf("depot %s: backends host%s%s\n", DEPOT_VERSION, DEPOT_HAS_CUDA ? ", cuda" : "",
              DEPOT_HAS_HIP ? ", hip" : "");
  nlohmann::json devices = nlohmann::json::array();
  if (opts.device == "all" || opts.device == "host") info_all<host>(opts, devices);
#if DEPOT_HAS_CUDA
  if (opts.device == "all" || opts.device == "cuda") info_all<cuda>(opts, devices);
#endif
#if DEPOT_HAS_HIP
  if (opts.device == "all" || opts.device == "hip") info_all<hip>(opts, devices);
#endif
  return nlohmann::json{{"suite", "info"}, {"devices", devices}};
}

}  // namespace depot::bench
