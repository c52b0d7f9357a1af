// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// `depot-bench ops`: ops/ kernels against the backend's own memset / memcpy measured in the
// same run, over sizes from 4 KiB to --size, then other dtypes and index patterns at --size.
// Device events, warm-up, median; bytes counted as read + written (index bytes not counted,
// as Spatter does). GB/s and the ratio to the anchor are printed; the JSON has every number.
// PyTorch's numbers for the same shapes come from bench/torch_ops.py (tools/gpu-check runs
// both and bench/compare_ops.py joins them).
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
#include <depot/storage/array_ref.hpp>
#include <depot/storage/dtype.hpp>
#include <depot/storage/element_kernels.hpp>
#include <depot/storage/strided_view.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
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

// Device memory of `bytes` bytes, for kernels called through run-time dtypes.
template <device D>
struct raw_buffer {
  explicit raw_buffer(std::size_t bytes) : view{strided_view<std::uint8_t, D>::empty({static_cast<std::int64_t>(bytes)})} {}
  [[nodiscard]] array_ref as(dtype t, std::initializer_list<std::int64_t> shape) const
  {
    return array_ref::of(view.data(), t, layout::contiguous(shape));
  }
  strided_view<std::uint8_t, D> view;
};

// Spatter's UNIFORM:len:stride pattern (index j of each group = j * stride), repeated with
// delta = len * stride between groups: n indices in all.
std::vector<std::int64_t> uniform_pattern(std::int64_t n, std::int64_t len, std::int64_t stride)
{
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = (i / len) * len * stride + (i % len) * stride;
  return idx;
}

// At the largest size: the same kernels over other dtypes (fill, copy, transpose, gather of
// rows of 256 elements), and element gathers / scatter-adds over index patterns (Spatter's
// UNIFORM:len:stride, uniform random, sorted random) on fp32; bytes read + written, index
// bytes not counted (as Spatter counts).
template <device D>
nlohmann::json sweep_at(const options& opts, std::size_t bytes, double memset_gbps, double memcpy_gbps,
                        std::mt19937_64& rng)
{
  nlohmann::json rows = nlohmann::json::array();
  const stream_ref<D> s{};
  const auto report = [&](const std::string& name, double moved, double ms, double anchor) {
    const double gbps = moved / (ms * 1e6);
    std::printf("  %-34s %10s %10.4f %10.1f %10.1f %8.2f\n", name.c_str(), format_bytes(bytes).c_str(), ms, gbps,
                anchor, gbps / anchor);
    rows.push_back({{"device", std::string{D::name}}, {"operation", name}, {"bytes", bytes}, {"median_ms", ms},
                    {"gbps", gbps}, {"anchor", anchor}, {"ratio", gbps / anchor}});
  };
  std::printf("  -- other dtypes and index patterns at %s --\n", format_bytes(bytes).c_str());
  const raw_buffer<D> a{bytes}, b{bytes};
  runtime<D>::set_async(a.view.data(), 0x11, bytes, s.native());  // finite in every dtype
  for (const dtype t : {dtype::int8, dtype::float16, dtype::float64}) {
    const auto es = static_cast<std::int64_t>(size_of(t));
    const std::int64_t r = std::max<std::int64_t>(static_cast<std::int64_t>(bytes) / es / row_floats, 1);
    const double moved = static_cast<double>(r * row_floats * es);
    const auto src = a.as(t, {r, row_floats});
    const auto dst = b.as(t, {r, row_floats});
    const auto dst_t = b.as(t, {row_floats, r});
    auto src_t = src;  // the transpose of src as a strided ref
    std::swap(src_t.shape[0], src_t.shape[1]);
    std::swap(src_t.strides[0], src_t.strides[1]);
    const std::string tn{to_string(t)};
    std::uint64_t value = 0x3C3C3C3C3C3C3C3Cull;
    std::vector<std::int64_t> rows_idx(static_cast<std::size_t>(r));
    for (auto& v : rows_idx) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(r));
    const auto idx = upload<std::int64_t, D>(rows_idx, {r});
    report("fill " + tn, moved, median_ms<D>(opts, s, 0, [&] { kernels::fill<D>(dst, &value, s); }), memset_gbps);
    report("copy contiguous " + tn, 2 * moved, median_ms<D>(opts, s, 0, [&] { kernels::copy<D>(dst, src, s); }),
           memcpy_gbps);
    report("copy transpose " + tn, 2 * moved, median_ms<D>(opts, s, 0, [&] { kernels::copy<D>(dst_t, src_t, s); }),
           memcpy_gbps);
    report("gather rows " + tn, 2 * moved,
           median_ms<D>(opts, s, 0, [&] { kernels::gather<D>(dst, src, 0, idx.ref(), s); }), memcpy_gbps);
  }
  // Element patterns on fp32: n outputs; the source is as large as the pattern reaches.
  const std::int64_t n = static_cast<std::int64_t>(bytes / sizeof(float)) / 4;  // room for stride 4
  struct pattern {
    std::string name;
    std::vector<std::int64_t> idx;
  };
  std::vector<pattern> patterns;
  patterns.push_back({"UNIFORM:8:1", uniform_pattern(n, 8, 1)});
  patterns.push_back({"UNIFORM:8:4", uniform_pattern(n, 8, 4)});
  std::vector<std::int64_t> random(static_cast<std::size_t>(n));
  for (auto& v : random) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
  patterns.push_back({"random", random});
  std::sort(random.begin(), random.end());
  patterns.push_back({"sorted random", std::move(random)});
  const raw_buffer<D> out{static_cast<std::size_t>(n) * sizeof(float)};
  runtime<D>::set_async(out.view.data(), 0x11, static_cast<std::size_t>(n) * sizeof(float), s.native());
  const double moved = 2.0 * static_cast<double>(n) * sizeof(float);
  for (const pattern& p : patterns) {
    const std::int64_t reach = *std::max_element(p.idx.begin(), p.idx.end()) + 1;
    const auto idx = upload<std::int64_t, D>(p.idx, {n});
    const auto src = a.as(dtype::float32, {reach});
    const auto dst = out.as(dtype::float32, {n});
    report("gather elements " + p.name, moved,
           median_ms<D>(opts, s, 0, [&] { kernels::gather<D>(dst, src, 0, idx.ref(), s); }), memcpy_gbps);
    report("scatter-add elements " + p.name, 1.5 * moved,
           median_ms<D>(opts, s, 0, [&] { kernels::scatter<D>(src, 0, idx.ref(), dst, scatter_mode::add, s); }),
           memcpy_gbps);
  }
  return rows;
}

// The host's cost of queueing a kernel on one of many live streams (a GPU device): a fill
// of 256 floats, each thread launching round-robin on its own share of the streams, against
// the backend's memset of the same bytes queued the same way (no lookup of an execution-space
// instance: the raw enqueue). Wall time per launch over `launches` launches per thread, after
// one launch on every stream (which makes its Kokkos instance), median of opts.repetitions;
// the streams synchronised after each run (not timed).
template <device D>
nlohmann::json launches_for(const options& opts)
{
  nlohmann::json rows = nlohmann::json::array();
  if constexpr (is_gpu_v<D>) {
    constexpr int launches = 2000;
    std::printf("\n%s: queueing a kernel on one of N live streams, host us per launch (fill of 1 KiB with "
                "1.0, a kernel; with 0.0, depot's fill by the backend's memset; the backend's memset of the "
                "same, the raw enqueue; median of %d runs of %d launches a thread)\n",
                std::string{D::name}.c_str(), opts.repetitions, launches);
    std::printf("  %8s %8s %10s %10s %10s %8s\n", "streams", "threads", "fill us", "fill 0 us", "memset us",
                "ratio");
    for (const int n_streams : {1, 16, 256}) {
      std::vector<stream<D>> streams;
      streams.reserve(static_cast<std::size_t>(n_streams));
      for (int k = 0; k < n_streams; ++k) streams.emplace_back(0);
      auto buf = strided_view<float, D>::empty({static_cast<std::int64_t>(n_streams) * row_floats});
      std::vector<strided_view<float, D>> parts;  // (made once: a view's copy is a reference count)
      const auto rows2d = buf.view({static_cast<std::int64_t>(n_streams), row_floats});
      for (int k = 0; k < n_streams; ++k) parts.push_back(rows2d.select(0, k));
      for (int k = 0; k < n_streams; ++k) ops::fill(parts[static_cast<std::size_t>(k)], 0.0F, streams[static_cast<std::size_t>(k)].ref());
      for (auto& st : streams) st.synchronize();
      for (const int threads : {1, 4}) {
        if (threads > n_streams) continue;
        // One run: each thread t launches on streams t, t + threads, ... in turn.
        enum class what { fill, fill_zero, memset };
        const auto run = [&](what w) {
          const auto t0 = std::chrono::steady_clock::now();
          std::vector<std::thread> pool;
          // (a launch refused on a thread, e.g. by Kokkos 3.x's per-thread host state, is
          // rethrown here once all have joined, not a std::terminate)
          std::vector<std::exception_ptr> failed(static_cast<std::size_t>(threads));
          for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
              try {
                int k = t;
                for (int i = 0; i < launches; ++i) {
                  const auto& st = streams[static_cast<std::size_t>(k)];
                  const auto& dst = parts[static_cast<std::size_t>(k)];
                  if (w == what::fill) {
                    ops::fill(dst, 1.0F, st.ref());
                  } else if (w == what::fill_zero) {
                    ops::fill(dst, 0.0F, st.ref());
                  } else {
                    runtime<D>::set_async(dst.data(), 0, row_floats * sizeof(float), st.native());
                  }
                  k += threads;
                  if (k >= n_streams) k = t;
                }
              } catch (...) {
                failed[static_cast<std::size_t>(t)] = std::current_exception();
              }
            });
          }
          for (auto& th : pool) th.join();
          for (const auto& e : failed) {
            if (e) std::rethrow_exception(e);
          }
          const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          for (auto& st : streams) st.synchronize();
          return us / launches;
        };
        std::vector<double> fill_us, zero_us, memset_us;
        for (const what w : {what::fill, what::fill_zero, what::memset}) run(w);
        for (int r = 0; r < opts.repetitions; ++r) {
          fill_us.push_back(run(what::fill));
          zero_us.push_back(run(what::fill_zero));
          memset_us.push_back(run(what::memset));
        }
        const double f = median(fill_us), z = median(zero_us), m = median(memset_us);
        std::printf("  %8d %8d %10.2f %10.2f %10.2f %8.2f\n", n_streams, threads, f, z, m, f / m);
        rows.push_back({{"device", std::string{D::name}}, {"operation", "launch on one of N streams"},
                        {"streams", n_streams}, {"threads", threads}, {"launches", launches},
                        {"fill_us", f}, {"fill_zero_us", z}, {"memset_us", m}, {"ratio", f / m}});
      }
    }
  }
  return rows;
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
    if (bytes == sizes.back()) {
      for (auto& row : sweep_at<D>(opts, bytes, memset_gbps, memcpy_gbps, rng)) rows.push_back(row);
    }
  }
  for (auto& row : launches_for<D>(opts)) rows.push_back(row);
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
