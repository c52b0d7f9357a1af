// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
// depot-memviz [--trace FILE] [--snapshot FILE] -o OUT.html: writes one self-contained HTML
// page (no network, no external scripts, fonts or images) that shows the active-memory
// timeline, reserved / allocated / fragmentation over time and the segment map of a
// snapshot. Exit status: 0 page written, 2 bad arguments, unreadable or invalid input, or an
// output file that cannot be written.
#include "memviz/page_data.hpp"
#include "memviz_page.hpp"

#include <depot/config.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/pool/trace_file.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

namespace {

// Replaces the one occurrence of `marker` in `page` (the template is ours: a missing marker
// is a build defect).
void fill(std::string& page, std::string_view marker, std::string_view text)
{
  const std::size_t at = page.find(marker);
  if (at == std::string::npos) throw std::logic_error("page template lacks " + std::string{marker});
  page.replace(at, marker.size(), text);
}

// JSON inside <script type="application/json">: "</" would end the element early.
std::string script_safe(std::string json)
{
  for (std::size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) json.insert(at + 1, "\\");
  return json;
}

double seconds_since(std::chrono::steady_clock::time_point t0)
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv)
{
  CLI::App app{"depot-memviz: writes one self-contained HTML page that shows a depot allocation trace (active "
               "memory timeline; reserved, allocated and fragmentation over time) and the segment map of a "
               "snapshot."};
  app.set_version_flag("--version", std::string{DEPOT_VERSION});
  std::string trace_file, snapshot_file, out_file, title;
  app.add_option("--trace", trace_file, "trace file: depot.trace.v1 JSON (trace_json()) or an RMM CSV log");
  app.add_option("--snapshot", snapshot_file, "snapshot file: depot.snapshot.v1 JSON (snapshot().to_json())");
  app.add_option("-o,--output", out_file, "the HTML file to write")->required();
  app.add_option("--title", title, "page title (default: the input file names)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (trace_file.empty() && snapshot_file.empty()) {
    std::fprintf(stderr, "depot-memviz: nothing to show: give --trace FILE, --snapshot FILE or both\n");
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  nlohmann::json data = nlohmann::json::object();
  depot::memviz::trace_summary summary;
  std::optional<depot::recorded_trace> trace;
  double read_s = 0.0;
  try {
    if (!trace_file.empty()) {
      trace = depot::read_trace(trace_file);
      read_s = seconds_since(t0);
      data["trace"] = depot::memviz::trace_page_data(*trace, summary);
      data["trace"]["file"] = std::filesystem::path{trace_file}.filename().string();
    }
    if (!snapshot_file.empty()) {
      const depot::allocator_snapshot snap = depot::read_snapshot(snapshot_file);
      data["snapshot"] = depot::memviz::snapshot_page_data(snap);
      data["snapshot"]["file"] = std::filesystem::path{snapshot_file}.filename().string();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-memviz: %s\n", e.what());
    return 2;
  }
  if (title.empty()) {
    title = !trace_file.empty() ? std::filesystem::path{trace_file}.filename().string() : "";
    if (!snapshot_file.empty()) {
      title += (title.empty() ? "" : " + ") + std::filesystem::path{snapshot_file}.filename().string();
    }
  }
  data["title"] = title;
  data["generator"] = std::string{"depot-memviz "} + DEPOT_VERSION;

  std::string page{depot::memviz::page_html};
  try {
    fill(page, "/*@MEMVIZ_CSS@*/", depot::memviz::page_css);
    fill(page, "/*@MEMVIZ_JS@*/", depot::memviz::page_js);
    std::string html_title;
    for (const char c : title) {
      if (c == '<') html_title += "&lt;";
      else if (c == '&') html_title += "&amp;";
      else html_title += c;
    }
    fill(page, "@MEMVIZ_TITLE@", html_title);
    fill(page, "@MEMVIZ_DATA@", script_safe(data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depot-memviz: %s\n", e.what());
    return 1;
  }

  {
    std::ofstream out{out_file, std::ios::binary | std::ios::trunc};
    if (!out) {
      std::fprintf(stderr, "depot-memviz: cannot write %s\n", out_file.c_str());
      return 2;
    }
    out.write(page.data(), static_cast<std::streamsize>(page.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "depot-memviz: writing %s failed\n", out_file.c_str());
      return 2;
    }
  }
  const double total_s = seconds_since(t0);
  std::printf("depot-memviz: wrote %s (%s) in %.2f s", out_file.c_str(), depot::format_bytes(page.size()).c_str(), total_s);
  if (trace) std::printf(" (reading the trace %.2f s)", read_s);
  std::printf("\n");
  if (trace) {
    std::printf("  trace: %zu events, %zu allocations (%zu from before the trace, %zu alive at its end), "
                "%zu out-of-memory, %zu segments moved between streams, span %.6f s\n",
                summary.events, summary.allocations, summary.before_trace, summary.never_freed, summary.out_of_memory,
                summary.segment_moves, static_cast<double>(summary.span_ns) * 1e-9);
    std::printf("  peak allocated %zu, peak reserved %zu%s, fragmentation peak %.4f, at the end %.4f\n",
                summary.peak_allocated, summary.peak_reserved, summary.has_segments ? "" : " (no segment events)",
                summary.peak_fragmentation, summary.final_fragmentation);
  }
  return 0;
}
