// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/expects.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace depot {

// An omitted slice bound or step, as Python's None: depot::slice(none, 3) is x[:3].
inline constexpr std::nullopt_t none = std::nullopt;

// One start:stop:step entry of an index expression, with Python's rules: an omitted start or
// stop means "from the beginning" / "to the end" in the direction of the step (so
// slice(none, none, -1) reverses), negative values count from the end, out-of-range bounds
// are clamped (never an error), the step defaults to 1 and must not be 0. A plain value type.
struct slice {
  std::optional<std::int64_t> start;
  std::optional<std::int64_t> stop;
  std::optional<std::int64_t> step;

  constexpr slice() = default;  // ":" (every element)
  constexpr slice(std::optional<std::int64_t> start_, std::optional<std::int64_t> stop_,
                  std::optional<std::int64_t> step_ = std::nullopt)
      : start{start_}, stop{stop_}, step{step_}
  {
  }

  // The step, checked: depot::invalid_argument for 0.
  [[nodiscard]] std::int64_t checked_step() const
  {
    const std::int64_t s = step.value_or(1);
    DEPOT_EXPECTS(s != 0, "depot::slice: slice step cannot be zero");
    DEPOT_EXPECTS(s != INT64_MIN, "depot::slice: slice step " + std::to_string(s) + " is too large in magnitude");
    return s;
  }

  // "1:-1:2", ":", "::-1"
  [[nodiscard]] std::string to_string() const
  {
    auto part = [](const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string{}; };
    std::string s = part(start) + ":" + part(stop);
    if (step) s += ":" + std::to_string(*step);
    return s;
  }
};

}  // namespace depot
