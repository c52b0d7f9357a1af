// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include <depot/hal/device_id.hpp>
#include <depot/hal/error.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/format_address.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/invalid_argument.hpp>
#include <depot/hal/out_of_memory.hpp>

#include <array>
#include <charconv>
#include <cstdio>
#include <string>
#include <utility>

namespace depot {

error::error(const std::string& what, std::string call, std::string file, int line, int code,
             std::string code_name)
    : std::runtime_error{what},
      call_{std::move(call)},
      file_{std::move(file)},
      line_{line},
      code_{code},
      code_name_{std::move(code_name)}
{
}

out_of_memory::out_of_memory(std::string message, std::size_t requested_bytes, device_id device)
    : message_{std::move(message)}, requested_bytes_{requested_bytes}, device_{device}
{
}

namespace detail {

void throw_invalid_argument(std::string_view message, const char* file, int line)
{
  throw invalid_argument(std::string{message} + " [" + file + ":" + std::to_string(line) + "]");
}

}  // namespace detail

std::string format_bytes(std::size_t bytes)
{
  static constexpr std::array<const char*, 7> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  std::array<char, 32> buffer{};
  const int precision = value < 10 ? 2 : value < 100 ? 1 : 0;
  std::snprintf(buffer.data(), buffer.size(), "%.*f %s", precision, value, units[unit]);
  return buffer.data();
}

std::string format_address(std::uintptr_t address)
{
  std::array<char, 24> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "0x%llx", static_cast<unsigned long long>(address));
  return buffer.data();
}

device_id device_id::parse(std::string_view text)
{
  const auto colon = text.find(':');
  const std::string_view kind_text = text.substr(0, colon);
  device_id id;
  if (kind_text == "host" || kind_text == "cpu") {
    id.kind = device_kind::host;
  } else if (kind_text == "cuda") {
    id.kind = device_kind::cuda;
  } else if (kind_text == "hip") {
    id.kind = device_kind::hip;
  } else {
    throw invalid_argument("depot: unknown device kind '" + std::string{kind_text} + "' in '" +
                           std::string{text} + "': expected host, cpu, cuda or hip");
  }
  if (colon == std::string_view::npos) return id;
  const std::string_view index_text = text.substr(colon + 1);
  const char* first = index_text.data();
  const char* last = first + index_text.size();
  const auto [end, ec] = std::from_chars(first, last, id.index);
  if (index_text.empty() || ec != std::errc{} || end != last || id.index < 0) {
    throw invalid_argument("depot: bad device index '" + std::string{index_text} + "' in '" +
                           std::string{text} + "': expected a non-negative integer");
  }
  return id;
}

std::string device_id::to_string() const
{
  return std::string{depot::to_string(kind)} + ":" + std::to_string(index);
}

}  // namespace depot
