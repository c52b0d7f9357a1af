// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/pool/trace_file.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace depot {

// Offline memory planning from buffer lifetimes. Lifetimes come from record_usage() (each
// step names the tensors it uses; a tensor lives from its first to its last step) or from
// a recorded trace (a block lives from its alloc event to its free event, in file order).
// compute_reuse_plan() gives every buffer an offset in one arena so that buffers alive at
// the same step never share a byte; verify_plan() checks that. Sizes are rounded up to
// `alignment` bytes, and so are offsets. A plain value type; not thread-safe to modify
// concurrently. Planning ignores streams: the trace's event order is the timeline.
class lifetime_planner {
 public:
  // A tensor as record_usage() sees it.
  struct tensor {
    std::uint64_t id = 0;
    std::size_t bytes = 0;
  };
  // A buffer alive in steps [first_step, last_step] (inclusive). From a trace, `id` is the
  // index of the alloc event that opened it (or of its free event, for a block allocated
  // before the trace began, which is then alive from step 0).
  struct lifetime {
    std::uint64_t id = 0;
    std::size_t bytes = 0;  // rounded up to the alignment
    std::uint64_t first_step = 0;
    std::uint64_t last_step = 0;
  };
  // `tensor` can take over the memory of `donor`, whose lifetime ends before it begins.
  struct reuse {
    std::uint64_t tensor = 0;
    std::uint64_t donor = 0;
    std::size_t bytes = 0;
  };
  // What planning could save, and what the input said about itself.
  struct suggestions {
    std::size_t buffers = 0;
    std::size_t total_bytes = 0;     // every buffer at its own address (no reuse at all)
    std::size_t lower_bound = 0;     // the most bytes alive at one step
    std::size_t reusable_bytes = 0;  // total_bytes - lower_bound
    // A chain of in-place reuses (best fit among dead buffers at least as large), largest
    // first: each pair never overlaps in time.
    std::vector<reuse> reuses;
    std::size_t reuse_saved_bytes = 0;  // bytes the chain saves over no reuse
    // From a trace: blocks freed but allocated before it began, blocks never freed
    // (alive to the end), failed allocations, events of other kinds ignored.
    std::size_t allocated_before_trace = 0;
    std::size_t never_freed = 0;
    std::size_t out_of_memory_events = 0;
  };
  // An offset for every buffer, in the order of lifetimes().
  struct plan {
    std::vector<std::size_t> offsets;
    std::size_t arena_bytes = 0;
    std::size_t lower_bound = 0;
    std::string strategy;    // which method produced it ("size, best fit", "time sweep under a cap ...", ...)
    std::uint64_t work = 0;  // search work spent, in the units of plan_options::work_budget
    // arena_bytes / lower_bound (1 when both are 0).
    [[nodiscard]] double ratio() const noexcept
    {
      return lower_bound == 0 ? 1.0 : static_cast<double>(arena_bytes) / static_cast<double>(lower_bound);
    }
  };

  // How hard compute_reuse_plan() searches. The plan depends only on the lifetimes, the seed
  // and the budget (not on the machine), unless time_limit_seconds cuts the search short.
  struct plan_options {
    std::uint64_t seed = 20261123;  // the search's random choices
    // Search effort after the greedy orderings, in buffer visits (one buffer looked at while
    // placing another, a few ns each). The default takes about 3 s on 2 400 buffers with ~110
    // alive at a time on a 2-core development VM (bench/traces/alloc_host_2threads.json);
    // 0 keeps to the greedy orderings (a few placements, milliseconds).
    std::uint64_t work_budget = 900'000'000;
    double time_limit_seconds = 0;  // > 0: stop searching after this long (the plan then depends on speed)
  };

  // `alignment`: a power of two; buffer sizes and offsets are multiples of it.
  explicit lifetime_planner(std::size_t alignment = 512);
  // Lifetimes from a trace's alloc and free events (by address, in event order). Throws
  // depot::invalid_argument naming the event if a block is allocated at an address that is
  // already live.
  explicit lifetime_planner(const recorded_trace& trace, std::size_t alignment = 512);

  // Step `step` uses `tensors`. A tensor seen before must have the same size (else
  // depot::invalid_argument naming it, and nothing is recorded). Steps may come in any order.
  void record_usage(std::uint64_t step, std::span<const tensor> tensors);
  void record_usage(std::uint64_t step, std::initializer_list<tensor> tensors)
  {
    record_usage(step, std::span<const tensor>{tensors.begin(), tensors.size()});
  }

  [[nodiscard]] const std::vector<lifetime>& lifetimes() const noexcept { return lifetimes_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  // The most bytes alive at one step: no plan can use a smaller arena.
  [[nodiscard]] std::size_t lower_bound() const;
  [[nodiscard]] suggestions optimization_suggestions() const;

  // Offsets for every buffer, the smallest arena found within the budget:
  //  1. greedy orderings after Pisarchyk & Lee 2020 ("Efficient Memory Management for Deep
  //     Neural Net Inference"): buffers in an order (largest first, widest breadth first,
  //     longest-lived first), each placed in the best-fitting (or lowest) gap among the placed
  //     buffers that overlap it in time, or above them; then squeaky-wheel reordering (buffers
  //     placed above the lower bound move up the order; at most half of the budget);
  //  2. a time sweep under a cap (the rest of the budget): buffers placed in the order they are
  //     allocated, each into a hole of the live set scored by the bytes it leaves unused times
  //     how long until that waste can merge, and by how close the touching neighbour's free
  //     step is to its own; rollouts of the next allocations pick among the best holes when
  //     little room is left; live buffers in the way are moved when nothing fits; randomised
  //     backtracking otherwise. The cap comes down while sweeps succeed.
  // The best plan of all is returned; `strategy` names it and `work` says what it cost.
  [[nodiscard]] plan compute_reuse_plan() const;
  [[nodiscard]] plan compute_reuse_plan(const plan_options& options) const;

  // Checks `p` against these lifetimes: one offset per buffer, aligned, inside the arena,
  // and no two buffers alive at a common step sharing a byte. Returns what is wrong (naming
  // the buffers), or nothing when the plan is valid. O(n log n).
  [[nodiscard]] std::optional<std::string> verify_plan(const plan& p) const;

 private:
  std::size_t align(std::size_t bytes) const;

  std::size_t alignment_;
  std::vector<lifetime> lifetimes_;
  std::unordered_map<std::uint64_t, std::size_t> index_of_;  // record_usage: id -> lifetime
  std::size_t allocated_before_trace_ = 0;
  std::size_t never_freed_ = 0;
  std::size_t out_of_memory_events_ = 0;
};

}  // namespace depot
