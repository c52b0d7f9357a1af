// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/format_address.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace depot::detail {

// Objects handed out by handle (the C interface's fixed pools and IPC mappings). A handle
// is a slot's index and a generation that a removal moves on, so it is never reused (not
// an address, which a later object could take): a removed or made-up handle is refused
// with std::invalid_argument, never mistaken for another object. A lookup holds the object
// (find: a hold) without a lock and without touching any line but its slot's, so threads
// on different objects share nothing; a removal does not wait for holds: the last of them
// to end destroys the object. Thread-safe; add() and the final destruction take a mutex,
// a leaf that fork() never leaves locked in the child (fork_leaf_mutex).
// Up to 2^24 objects live at once; handles stay unique for 2^39 removals per slot.
template <class T>
class handle_table {
  struct slot;

 public:
  // A lookup's claim on a live object: the object stays until the hold ends, even if its
  // handle is removed meanwhile. Move-only.
  class hold {
   public:
    hold(hold&& o) noexcept : table_{o.table_}, slot_{std::exchange(o.slot_, nullptr)} {}
    hold& operator=(hold&&) = delete;
    hold(const hold&) = delete;
    hold& operator=(const hold&) = delete;
    ~hold()
    {
      if (slot_ != nullptr) table_->release(*slot_);
    }
    T& operator*() const noexcept { return *slot_->object; }
    T* operator->() const noexcept { return slot_->object; }

   private:
    friend class handle_table;
    hold(handle_table* table, slot* s) noexcept : table_{table}, slot_{s} {}
    handle_table* table_;
    slot* slot_;
  };

  // `noun`, `live` and `maker` word the refusal: "depot_fixed_pool_allocate: pool 0x2000001
  // is not a live fixed pool (not made by depot_fixed_pool_create, or given back)".
  handle_table(const char* noun, const char* live, const char* maker) : noun_{noun}, live_{live}, maker_{maker} {}
  handle_table(const handle_table&) = delete;
  handle_table& operator=(const handle_table&) = delete;
  ~handle_table()
  {
    for (auto& c : chunks_) {
      slot* s = c.load(std::memory_order_relaxed);
      if (s == nullptr) continue;
      for (std::size_t i = 0; i < k_chunk; ++i) delete s[i].object;
      delete[] s;
    }
  }

  // The handle of `object`, now owned here (never 0). std::bad_alloc, keeping nothing, when
  // 2^24 objects are live or memory is short.
  std::uintptr_t add(std::unique_ptr<T> object)
  {
    const std::lock_guard g{mu_};
    std::uint32_t index = 0;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (used_ == k_slots) throw std::bad_alloc{};
      std::atomic<slot*>& chunk = chunks_[used_ / k_chunk];
      if (chunk.load(std::memory_order_relaxed) == nullptr) chunk.store(new slot[k_chunk], std::memory_order_release);
      free_.reserve(used_ + 1);  // so that a release never allocates
      index = used_++;
    }
    slot& s = *slot_at(index);
    s.index = index;
    const std::uint64_t generation = std::max<std::uint64_t>(s.word.load(std::memory_order_relaxed) >> k_ref_bits, 1);
    s.object = object.release();
    s.word.store(generation << k_ref_bits | 1, std::memory_order_release);  // the table's reference
    return static_cast<std::uintptr_t>(generation << k_index_bits | index);
  }

  // The live object behind `handle`, held; std::invalid_argument naming `call` if none.
  hold find(const char* call, const void* handle)
  {
    const auto [s, word] = claim(handle, [](std::uint64_t w) { return w + 1; }, std::memory_order_acquire);
    if (s == nullptr) refuse(call, handle);
    return hold{this, s};
  }

  // Removes `handle` (refused afterwards); its object is destroyed now, or by the last hold
  // under way. std::invalid_argument naming `call` if it is not live.
  void remove(const char* call, const void* handle)
  {
    // the next generation (new lookups refused), less the table's reference
    const auto next = [](std::uint64_t w) { return ((w >> k_ref_bits) + 1) << k_ref_bits | ((w & k_ref_mask) - 1); };
    const auto [s, word] = claim(handle, next, std::memory_order_acq_rel);
    if (s == nullptr) refuse(call, handle);
    if ((word & k_ref_mask) == 0) destroy(*s);
  }

 private:
  static constexpr unsigned k_index_bits = 24;  // handle: generation << 24 | index
  static constexpr unsigned k_ref_bits = 25;    // slot word: generation << 25 | references
  static constexpr std::uint64_t k_ref_mask = (std::uint64_t{1} << k_ref_bits) - 1;
  static constexpr std::uint32_t k_slots = std::uint32_t{1} << k_index_bits;
  static constexpr std::uint32_t k_chunk = 4096;

  // One per cache line: holds of different objects touch no common line.
  struct alignas(64) slot {
    std::atomic<std::uint64_t> word{0};  // generation and references (the table's and holds')
    T* object = nullptr;
    std::uint32_t index = 0;  // its own
  };

  static std::uint64_t generation_of(const void* handle) noexcept
  {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle)) >> k_index_bits;
  }
  // Slot `index`, or nullptr when its chunk was never made.
  slot* slot_at(std::uint32_t index) noexcept
  {
    slot* chunk = chunks_[index / k_chunk].load(std::memory_order_acquire);
    return chunk != nullptr ? &chunk[index % k_chunk] : nullptr;
  }
  // The slot `handle` names, or nullptr when it names none that was ever made.
  slot* lookup(const void* handle) noexcept
  {
    if (generation_of(handle) == 0) return nullptr;
    return slot_at(static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(handle) & (k_slots - 1)));
  }
  // Moves the word of the slot `handle` names from w to next(w) while it holds that
  // handle's generation with a reference: the slot and the new word, or nullptr (not live).
  template <class Next>
  std::pair<slot*, std::uint64_t> claim(const void* handle, Next next, std::memory_order order) noexcept
  {
    slot* s = lookup(handle);
    if (s == nullptr) return {nullptr, 0};
    const std::uint64_t generation = generation_of(handle);
    std::uint64_t w = s->word.load(std::memory_order_relaxed);
    while ((w >> k_ref_bits) == generation && (w & k_ref_mask) != 0) {
      const std::uint64_t n = next(w);
      if (s->word.compare_exchange_weak(w, n, order, std::memory_order_relaxed)) return {s, n};
    }
    return {nullptr, 0};
  }
  void release(slot& s) noexcept
  {
    if ((s.word.fetch_sub(1, std::memory_order_acq_rel) & k_ref_mask) == 1) destroy(s);
  }
  // The last reference is gone: the object, then the slot back for reuse (its generation
  // already moved on). A T's destructor must not throw.
  void destroy(slot& s) noexcept
  {
    delete std::exchange(s.object, nullptr);
    const std::lock_guard g{mu_};
    free_.push_back(s.index);  // (reserved by add)
  }
  [[noreturn]] void refuse(const char* call, const void* handle) const
  {
    throw std::invalid_argument(std::string{call} + ": " + noun_ +
                                (handle == nullptr ? std::string{" is NULL"}
                                                   : " " + format_address(handle) + " is not " + live_ +
                                                         " (not made by " + maker_ + ", or given back)"));
  }

  const char* noun_;
  const char* live_;
  const char* maker_;
  std::array<std::atomic<slot*>, k_slots / k_chunk> chunks_{};
  fork_leaf_mutex mu_;
  std::vector<std::uint32_t> free_;
  std::uint32_t used_ = 0;
};

}  // namespace depot::detail
