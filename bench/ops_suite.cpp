// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench ops`: ops/ kernels against the backend's own memset / memcpy measured in the
// same run, over sizes from 4 KiB to --size. Device events, warm-up, median; bytes counted
// as read + written (index bytes not counted, as Spatter does). GB/s and the ratio to the
// anchor are printed; the JSON has every number. PyTorch's numbers for the same shapes come
// from bench/torch_ops.py (tools/gpu-check runs both and bench/compare_ops.py joins them).
#include "bench_result.hpp"
#include "timing.hpp"

#include <depot/config.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/ops/copy.hpp>
#include <depot/ops/fill.hpp>
#include <depot/ops/gather.hpp>
#include <depot/ops/masked_select.hpp>
#include <depot/ops/scatter.hpp>
#include <depot/storage/strided_view.hpp>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace depot::bench {
namespace {

constexpr std::int64_t row_floats = 256;  // rows of 256 fp32 (1 KiB), as in ../shared/ANCHORS.md

template <class T, device D>
strided_view<T, D> upload(const std::vector<T>& host, std::initializer_list<std::int64_t> shape)
{
  auto v = strided_view<T, D>::empty(shape);
  runtime<D>::copy(v.data(), host.data(), host.size() * sizeof(T));
  return v;
}

template <device D>
nlohmann::json ops_for(const options& opts)
{
  nlohmann::json rows = nlohmann::json::array();
  const stream_ref<D> s{};  // the default stream: the kernels' and the anchors'
  std::printf("\n%s: ops against the backend's memset/memcpy in the same run (median of %d, fp32)\n",
              std::string{D::name}.c_str(), opts.repetitions);
  std::printf("  %-26s %10s %10s %10s %10s %8s\n", "operation", "size", "ms", "GB/s", "anchor GB/s", "ratio");
  std::vector<std::size_t> sizes;
  for (std::size_t b = std::size_t{4} << 10; b <= opts.bytes; b *= 16) sizes.push_back(b);
  if (sizes.empty() || sizes.back() != opts.bytes) sizes.push_back(opts.bytes);
  std::mt19937_64 rng{opts.seed};

  for (const std::size_t bytes : sizes) {
    const std::int64_t n = static_cast<std::int64_t>(bytes / sizeof(float));
    const std::int64_t r = std::max<std::int64_t>(n / row_floats, 1);
    const std::int64_t nn = r * row_floats;  // whole rows
    std::vector<float> pattern(static_cast<std::size_t>(nn));
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 1000) * 0.5F;
    auto a = upload<float, D>(pattern, {r, row_floats});
    auto b = strided_view<float, D>::empty({r, row_floats});
    auto bt = strided_view<float, D>::empty({row_floats, r});
    std::vector<std::int64_t> rand_rows(static_cast<std::size_t>(r));
    for (auto& v : rand_rows) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(r));
    auto idx = upload<std::int64_t, D>(rand_rows, {r});
    std::vector<std::uint8_t> half(static_cast<std::size_t>(nn));
    for (auto& v : half) v = static_cast<std::uint8_t>(rng() & 1);
    auto mask = strided_view<bool, D>::empty({nn});
    runtime<D>::copy(mask.data(), half.data(), half.size());
    std::int64_t selected = 0;
    for (auto v : half) selected += v;
    auto picked = strided_view<float, D>::empty({selected});
    const auto flat_a = a.view({nn});
    const double nbytes = static_cast<double>(nn) * sizeof(float);

    const double memset_ms = median_ms<D>(opts, s, 0, [&] { runtime<D>::set_async(b.data(), 0x3F, static_cast<std::size_t>(nbytes), s.native()); });
    const double memcpy_ms = median_ms<D>(opts, s, 0, [&] { runtime<D>::copy_async(b.data(), a.data(), static_cast<std::size_t>(nbytes), s.native()); });
    const double memset_gbps = nbytes / (memset_ms * 1e6);
    const double memcpy_gbps = 2 * nbytes / (memcpy_ms * 1e6);

    struct op_row {
      const char* name;
      double moved;  // bytes read + written
      bool vs_memset;
      std::function<void()> run;
    };
    std::vector<op_row> ops{
        {"fill", nbytes, true, [&] { ops::fill(b, 1.5F, s); }},
        {"copy contiguous", 2 * nbytes, false, [&] { ops::copy(b, a, s); }},
        {"copy transpose (R x 256)", 2 * nbytes, false, [&] { ops::copy(bt, a.transpose(0, 1), s); }},
        {"gather rows (random)", 2 * nbytes, false, [&] { kernels::gather<D>(b.ref(), a.ref(), 0, idx.ref(), s); }},
        {"scatter-add rows (random)", 3 * nbytes, false,
         [&] { kernels::scatter<D>(b.ref(), 0, idx.ref(), a.ref(), scatter_mode::add, s); }},
        {"masked_select (half)", nbytes / 4 + nbytes + static_cast<double>(selected) * 4, false,
         [&] { kernels::masked_select<D>(picked.ref(), flat_a.ref(), mask.ref(), s); }},
    };
    const auto report = [&](const char* name, double ms, double gbps, double anchor) {
      std::printf("  %-26s %10s %10.4f %10.1f %10.1f %8.2f\n", name, format_bytes(static_cast<std::size_t>(nbytes)).c_str(),
                  ms, gbps, anchor, gbps / anchor);
      rows.push_back({{"device", std::string{D::name}},
                      {"operation", name},
                      {"bytes", static_cast<std::size_t>(nbytes)},
                      {"rows", r},
                      {"median_ms", ms},
                      {"gbps", gbps},
                      {"anchor", anchor},
                      {"ratio", gbps / anchor}});
    };
    report("anchor: memset", memset_ms, memset_gbps, memset_gbps);
    report("anchor: memcpy", memcpy_ms, memcpy_gbps, memcpy_gbps);
    for (const op_row& o : ops) {
      const double ms = median_ms<D>(opts, s, 0, o.run);
      report(o.name, ms, o.moved / (ms * 1e6), o.vs_memset ? memset_gbps : memcpy_gbps);
    }
  }
  return rows;
}

}  // namespace

nlohmann::json run_ops(const options& opts)
{
  nlohmann::json results = nlohmann::json::array();
  if (opts.device == "all" || opts.device == "host") {
    for (auto& r : ops_for<host>(opts)) results.push_back(r);
  }
#if DEPOT_HAS_CUDA
  if (opts.device == "all" || opts.device == "cuda") {
    for (auto& r : ops_for<cuda>(opts)) results.push_back(r);
  }
#endif
#if DEPOT_HAS_HIP
  if (opts.device == "all" || opts.device == "hip") {
    for (auto& r : ops_for<hip>(opts)) results.push_back(r);
  }
#endif
  return {{"suite", "ops"}, {"results", results}};
}

}  // namespace depot::bench
