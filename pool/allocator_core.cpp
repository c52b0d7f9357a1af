// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// The caching allocator, written once over upstream_resource.
//
// Structure: one stream_cache per stream that has allocated. Each holds the segments
// (upstream allocations) it owns, cut into blocks, and three free indexes. Requests up to
// 64 KiB come from dense small segments (2 MiB, one 16-byte entry per 512-byte unit in
// address order, exact-size free lists with bitmaps: the best fit in O(1)), so a free
// touches its own entry and its neighbours' and finds the block's segment by its 2 MiB
// frame (one or two probes of a per-cache table). Larger small requests (to 1 MiB) and
// the large pool use linked block records and a two-level segregated fit (power of two,
// 16 subdivisions, bitmaps): O(1) as well, with few records that stay in cache.
// Locks: each stream_cache has its own mutex and its own table of the blocks it handed out,
// so an allocation or a free on one stream takes one lock, and threads on different streams
// never meet; a free from another stream searches the other caches. Growth (upstream calls,
// stealing, out-of-memory handling) takes grow_mu. Statistics: operations gather their
// changes in their cache and publish them to the shared figures under one short spin lock
// when a figure drifts by more than stats_batch (unless no other cache published since:
// one thread alone keeps them, unchecked until published) or after 256 operations (at
// once when segments change or the thread moves to another cache; another cache's
// publishing operations publish a cache that kept its drift when its lock is free and not
// biased to its thread, which else publishes it within its 256 operations); the
// highs a cache keeps for the peaks start each window at the peaks' headroom over the
// shared figures, so they rise (an unpredictable branch) only where a peak could move;
// stats() and snapshot() take every cache lock and stats() publishes
// every cache first, so the two agree.
// Streams: a block freed on its own stream is reusable at once on that stream; a block
// that record_stream() marked as used by other streams waits for events on them. Whole
// free segments of another stream are taken over, ordered after its work by an event or a
// fence: all of a destroyed stream's before growing, so memory is not stranded when
// streams come and go; one of a live stream's (the smallest that fits) before growing past
// steal_threshold (default 0: always), else when growing is refused.
#include <depot/hal/expects.hpp>
#include <depot/hal/format_address.hpp>
#include <depot/hal/format_bytes.hpp>
#include <depot/hal/out_of_memory.hpp>
#include <depot/hal/stream_registry.hpp>
#include <depot/pool/detail/allocator_core.hpp>
#include <depot/pool/detail/biased_mutex.hpp>
#include <depot/pool/detail/fork_hooks.hpp>
#include <depot/pool/detail/fork_leaf_mutex.hpp>
#include <depot/pool/ipc_mapping.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>


namespace depot::detail {

namespace {

constexpr std::size_t k_align = 512;
constexpr std::size_t k_small_request = std::size_t{1} << 20;   // <= 1 MiB: small pool
constexpr std::size_t k_small_segment = std::size_t{2} << 20;
// Small requests up to this size live in dense segments (entries per 512-byte unit, in
// address order); larger small requests in linked segments (a record per block), whose
// few records stay in cache where dense entries for big blocks would be spread thin.
constexpr std::size_t k_dense_request = std::size_t{64} << 10;
constexpr std::size_t k_mid_request = std::size_t{10} << 20;    // large < 10 MiB share ...
constexpr std::size_t k_large_segment = std::size_t{20} << 20;  // ... 20 MiB segments
constexpr std::size_t k_large_round = std::size_t{2} << 20;
constexpr std::size_t k_max_request = std::size_t{1} << 56;     // refused above: no wrap
constexpr std::size_t k_block_chunk = 64;  // block records made at once
constexpr auto k_unlimited = std::numeric_limits<std::size_t>::max();

std::uint64_t now_ns()
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

struct segment;
struct stream_cache;

// `x != nullptr ? a : b` as a data select (cmov, csel) rather than a branch: GCC 12 compiled
// the ternaries of the block and free-list links into branches (tail duplication, even
// with an expected probability of 0.5), which random sizes mispredict (0.5 per
// allocate+free pair at 64 MiB requests, callgrind); a mask select cost 15 instructions
// more per free-list removal than the instruction itself.
template <class X, class T>
[[gnu::always_inline]] inline T* select_if_set(const X* x, T* a, T* b) noexcept
{
#if defined(__x86_64__) && defined(__GNUC__)
  asm("test %1, %1\n\tcmovne %2, %0" : "+r"(b) : "r"(x), "r"(a) : "cc");
  return b;
#elif defined(__aarch64__) && defined(__GNUC__)
  asm("cmp %1, #0\n\tcsel %0, %2, %0, ne" : "+r"(b) : "r"(x), "r"(a) : "cc");
  return b;
#else
  const std::uintptr_t m = std::uintptr_t{0} - std::uintptr_t{x != nullptr};
  return reinterpret_cast<T*>((reinterpret_cast<std::uintptr_t>(a) & m) | (reinterpret_cast<std::uintptr_t>(b) & ~m));
#endif
}

// `set ? a : b` as a data select, for the same reason (a bool where select_if_set tests a pointer).
template <class T>
[[gnu::always_inline]] inline T* select_if(bool set, T* a, T* b) noexcept
{
#if defined(__x86_64__) && defined(__GNUC__)
  asm("test %1, %1\n\tcmovne %2, %0" : "+r"(b) : "r"(static_cast<unsigned>(set)), "r"(a) : "cc");
  return b;
#else
  const std::uintptr_t m = std::uintptr_t{0} - std::uintptr_t{set};
  return reinterpret_cast<T*>((reinterpret_cast<std::uintptr_t>(a) & m) | (reinterpret_cast<std::uintptr_t>(b) & ~m));
#endif
}

// floor(log2(s)) for s > 0: `std::bit_width(s) - 1` tests for 0 first (a compare and a
// branch at each of the ~5 index mappings of a pair); bsr / clz alone here.
[[gnu::always_inline]] inline unsigned log2_floor(std::size_t s) noexcept
{
#if defined(__GNUC__)
  static_assert(sizeof(std::size_t) == sizeof(unsigned long long));
  return 63U ^ static_cast<unsigned>(__builtin_clzll(s));
#else
  return static_cast<unsigned>(std::bit_width(s) - 1);
#endif
}

// A block record of a linked segment. Two cache lines: the first holds all that a free, a
// merge and the free index read or write (the block's and its neighbours'), the second what
// only a split, record_stream and tracing need, so a free of a random block misses the
// first line of it and of its neighbours only.
struct alignas(64) block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  block* prev = nullptr;  // address-order neighbours in the segment
  block* next = nullptr;
  block* fprev = nullptr;  // free-index list links
  block* fnext = nullptr;
  block_state state = block_state::free;
  bool counted_split = false;  // counted in inactive_split_bytes while indexed
  bool small = false;          // seg->small, kept here: a free need not read the segment record
  bool has_uses = false;       // `uses` may be non-empty (set before a stream is added)
  bool timed = false;          // t_alloc holds the allocation's time (tracing was on)
  std::uint16_t cls = 0;       // its list in the index that holds it (segregated_index)
  // the second line
  segment* seg = nullptr;
  std::vector<native_stream> uses;  // other streams that used it (record_stream)
  std::uint64_t t_alloc = 0;
  std::uint16_t pending = 0;  // events outstanding before it may be reused
  bool in_place = false;  // a free deferred in place during a capture (stream_cache::in_place)
  // Exported (a live block of an expandable segment, counted in its pages' shared_page
  // blocks until freed); has_uses is set with it, so its free takes the general path.
  bool exported = false;
  // A hole's key in its cache's hole index: at least what a request could take there (its
  // pages and its free neighbours), raised at once when a neighbour grows, lowered lazily.
  std::size_t room = 0;
  // (one test of both links: whether a freed block is whole is a coin toss at random sizes)
  [[nodiscard]] bool whole() const noexcept
  {
    return (reinterpret_cast<std::uintptr_t>(prev) | reinterpret_cast<std::uintptr_t>(next)) == 0;
  }
  // Where `b->prev` / `b->fnext` is, computed without reading b (null or not): operands of
  // select_if_set, which picks them only when b is set.
  static block** prev_field(block* b) noexcept { return field(b, offsetof(block, prev)); }
  static block** fnext_field(block* b) noexcept { return field(b, offsetof(block, fnext)); }
  static block** field(block* b, std::size_t offset) noexcept
  {
    return reinterpret_cast<block**>(reinterpret_cast<std::uintptr_t>(b) + offset);
  }
  // Every field above back to its default, field by field (`*this = block{}` builds a
  // temporary and move-assigns a vector: ~20 instructions more on every split); `uses`
  // keeps its capacity, emptied. A field added above is reset here too.
  void reset() noexcept
  {
    addr = 0;
    size = 0;
    requested = 0;
    prev = next = fprev = fnext = nullptr;
    state = block_state::free;
    counted_split = small = has_uses = timed = false;
    cls = 0;
    seg = nullptr;
    reset_second_line();
  }
  // reset() but for the fields a split sets on the record it makes (link_after: address,
  // size, segment, pool, neighbours; index: state, counted_split, cls, free-list links):
  // their stores cost every split ~5 instructions.
  void reset_for_split() noexcept
  {
    requested = 0;
    has_uses = timed = false;
    reset_second_line();
  }

 private:
  void reset_second_line() noexcept
  {
    uses.clear();
    t_alloc = 0;
    pending = 0;
    in_place = false;
    exported = false;
    room = 0;
  }
};
static_assert(offsetof(block, seg) == 64, "a free's fields fill the first cache line");

// What a merge test reads for a missing neighbour (a segment's end): never free, never
// written. `(p != nullptr ? p : &k_edge)->state == free` is one unpredictable branch where
// `p != nullptr && p->state == free` was two (release_block: 1.25 -> 0.85 modelled
// mispredicted branches per free at 64 MiB requests, callgrind; -8 % of the pair's time
// with aac2845's other changes, BENCHMARKS.md).
constexpr block edge_block() noexcept
{
  block b;
  b.state = block_state::allocated;
  return b;
}
constinit const block k_edge = edge_block();

// A block record of state block_state::unmapped stands for whole pages unmapped inside an
// expandable segment (a hole): never indexed, never merged with free blocks, never the
// segment's last block; the cache lists its holes through fprev/fnext.
constexpr auto k_unmapped = block_state::unmapped;

// Push-front and unlink of an intrusive doubly linked list through members Prev and Next.
template <class T, T* T::*Prev, T* T::*Next>
struct intrusive_list {
  static void push_front(T*& head, T* n) noexcept
  {
    n->*Prev = nullptr;
    n->*Next = head;
    if (head != nullptr) head->*Prev = n;
    head = n;
  }
  static void unlink(T*& head, T* n) noexcept
  {
    if (n->*Prev != nullptr) {
      n->*Prev->*Next = n->*Next;
    } else {
      head = n->*Next;
    }
    if (n->*Next != nullptr) n->*Next->*Prev = n->*Prev;
    n->*Prev = n->*Next = nullptr;
  }
};

struct segment {  // of the large pool, or of the small pool's linked part
  std::uintptr_t addr = 0;
  std::size_t size = 0;  // bytes mapped (of an expandable segment: from addr on)
  bool small = false;
  bool exported = false;  // shared with other processes: released only while no importer maps it
  std::int64_t* importers = nullptr;  // exported: its slot of importer_counts
  std::uint32_t importer_slot = 0;
  stream_cache* cache = nullptr;
  block* head = nullptr;
  block* last = nullptr;  // the block that ends it
  // An expandable segment (allocator_config::expandable_segments): `reserved` bytes of
  // addresses from addr, of which the first `size` are mapped, one upstream vm_map per page
  // (maps[i]: the handle of page i). 0 for an ordinary segment.
  std::size_t reserved = 0;
  std::vector<std::uint64_t> maps;
  // Pages shared with other processes (ipc_export of blocks on them): shared[i] holds this
  // process's file descriptor of page i's memory (-1: none) and the live exported blocks
  // on it; the descriptor is open exactly while that count is above 0 (closed when the
  // last of them is freed). Empty until a block of the segment is exported.
  struct shared_page {
    int fd = -1;
    std::uint32_t blocks = 0;
  };
  std::vector<shared_page> shared;
  std::size_t unmapped = 0;  // bytes of holes (k_unmapped blocks) below addr + size
  segment* lprev = nullptr;  // in the cache's segment list
  segment* lnext = nullptr;
  // No block of it is allocated or waiting: it is one free block (free neighbours merge).
  [[nodiscard]] bool whole_free() const noexcept { return head->whole() && head->state == block_state::free; }
};
using segment_list = intrusive_list<segment, &segment::lprev, &segment::lnext>;

// Two-level segregated fit over blocks of one stream cache by a key (Key: their size, for
// free blocks; their room, for holes), which must not change while a block is indexed.
template <std::size_t block::*Key>
class segregated_index {
 public:
  // always_inline, as address_table::insert: GCC kept both inline on the hot paths until
  // unrelated code grew the file, then called them (+35 instructions per pair at 64 MiB).
  [[gnu::always_inline]] void insert(block* b) noexcept
  {
    const auto [fl, sl] = mapping(b->*Key);
    b->cls = static_cast<std::uint16_t>(fl * 16 + sl);  // remove() reads it back
    block* const n = heads_[fl][sl];
    b->fprev = nullptr;
    b->fnext = n;
    sink_or(n)->fprev = b;
    heads_[fl][sl] = b;
    fl_map_ |= std::uint64_t{1} << fl;
    sl_map_[fl] = static_cast<std::uint16_t>(sl_map_[fl] | (1U << sl));
    bytes_ += b->*Key;
  }

  [[gnu::always_inline]] void remove(block* b) noexcept
  {
    const unsigned fl = b->cls >> 4U;
    const unsigned sl = b->cls & 15U;
    block* const p = b->fprev;
    block* const n = b->fnext;
    *select_if_set(p, block::fnext_field(p), &heads_[fl][sl]) = n;
    sink_or(n)->fprev = p;
    b->fprev = b->fnext = nullptr;
    // The bitmaps without a branch: whether a list empties is the workload's coin toss.
    const auto emptied = static_cast<unsigned>(heads_[fl][sl] == nullptr);
    const auto sm = static_cast<std::uint16_t>(sl_map_[fl] & ~(emptied << sl));
    sl_map_[fl] = sm;
    fl_map_ &= ~(std::uint64_t{sm == 0} << fl);  // (no branch: release_block's no_next empties level 63 at most frees)
    bytes_ -= b->*Key;
  }

  // A free block of at least `size` bytes: the first one of the smallest class whose
  // every block fits (O(1)); failing that, a short search of size's own class.
  [[nodiscard]] block* find(std::size_t size) const noexcept
  {
    const std::size_t step = std::size_t{1} << (log2_floor(size) - sl_bits);
    auto [fl, sl] = mapping(size + step - 1);
    std::uint32_t sm = sl_map_[fl] & (0xFFFFU << sl) & 0xFFFFU;
    // The first non-empty level above fl, taken where sm is 0 by a mask, not a branch:
    // whether size's own level has a fit is the workload's coin toss (0.22 mispredicted
    // branches per pair at 64 MiB requests, callgrind). Level 63 is never used (keys are
    // below 2^63), so its bit marks "none above" and its map is 0.
    const std::uint64_t fm = (fl_map_ & ((~std::uint64_t{0} << fl) << 1U)) | (std::uint64_t{1} << 63U);
    const auto up = static_cast<unsigned>(std::countr_zero(fm));
    const std::uint32_t none = std::uint32_t{0} - std::uint32_t{sm == 0};
    sm |= std::uint32_t{sl_map_[up]} & none;
    fl ^= (fl ^ up) & none;
    if (sm != 0) return heads_[fl][static_cast<unsigned>(std::countr_zero(sm))];
    const auto [efl, esl] = mapping(size);
    int budget = 32;
    for (block* b = heads_[efl][esl]; b != nullptr && budget-- > 0; b = b->fnext) {
      if (b->*Key >= size) return b;
    }
    return nullptr;
  }

  [[nodiscard]] std::size_t largest() const noexcept
  {
    if (fl_map_ == 0) return 0;
    const unsigned fl = 63U - static_cast<unsigned>(std::countl_zero(fl_map_));
    const unsigned sl = 15U - static_cast<unsigned>(std::countl_zero(std::uint32_t{sl_map_[fl]}) - 16);
    std::size_t best = 0;
    for (block* b = heads_[fl][sl]; b != nullptr; b = b->fnext) best = std::max(best, b->*Key);
    return best;
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] bool empty() const noexcept { return fl_map_ == 0; }

 private:
  static constexpr unsigned sl_bits = 4;
  static std::pair<unsigned, unsigned> mapping(std::size_t s) noexcept
  {
    const unsigned fl = log2_floor(s);
    return {fl, static_cast<unsigned>((s >> (fl - sl_bits)) & 15U)};
  }

  std::uint64_t fl_map_ = 0;
  std::array<std::uint16_t, 64> sl_map_{};
  std::array<std::array<block*, 16>, 64> heads_{};
  std::size_t bytes_ = 0;
  // Where a list's links write when there is no neighbour (written, never read): the links
  // need no branch on whether a neighbour exists (unpredictable at random sizes).
  block sink_;
  block* sink_or(block* b) noexcept { return b != nullptr ? b : &sink_; }
};
using free_index = segregated_index<&block::size>;
using hole_index = segregated_index<&block::room>;
// Level 63 of an index is never used (find's "none above" bit, stream_cache::no_next's list).
static_assert(k_max_request < (std::size_t{1} << 63));

// Records by a non-zero key (an address, or a 2 MiB frame number + 1): open addressing with
// linear probing and backward-shift deletion, so erasing never allocates and inserting
// allocates only to grow (never after reserve(n) for the next n). At most a quarter full
// (16 bytes per slot: 64 per member): at half full, probe runs cost the 1 MiB rows of
// depot-bench alloc 1.4 mispredicted branches and 17 instructions more per pair (cachegrind).
// At least `MinSlots` slots once used: the live large blocks' table starts at 1 024 (16 KiB
// per stream cache), where 256 cost the 64 MiB rows ~0.4 mispredicted branches per pair at
// ~35 live blocks (a probe run or a backward shift at one insert or erase in seven).
// `Shift` drops a key's bits that are always zero before hashing.
template <class V, unsigned Shift, std::size_t MinSlots = 256>
class address_table {
  static_assert(std::has_single_bit(MinSlots));

 public:
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }

  void reserve(std::size_t extra)
  {
    while (count_ + extra > room_) grow();
  }
  // Whether one more member fits without growing (insert_reserved may then be used).
  [[nodiscard]] bool has_room() const noexcept { return count_ < room_; }

  [[gnu::always_inline]] void insert(std::uintptr_t key, V* value)
  {
    if (count_ >= room_) grow();
    insert_reserved(key, value);
  }
  // insert() where has_room() (or reserve()) said it fits: never allocates.
  [[gnu::always_inline]] void insert_reserved(std::uintptr_t key, V* value) noexcept
  {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++count_;
  }

  [[nodiscard]] V* find(std::uintptr_t key) const noexcept
  {
    if (count_ == 0) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  V* erase(std::uintptr_t key) noexcept
  {
    if (count_ == 0) return nullptr;
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    V* found = slots_[i].value;
    // Shift later members of the probe run back so lookups never meet a hole.
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --count_;
    return found;
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    V* value = nullptr;
  };
  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept
  {
    return static_cast<std::size_t>(((key >> Shift) * 0x9E3779B97F4A7C15ULL) >> 20) & mask_;
  }
  // Twice the slots. May throw std::bad_alloc, changing nothing (the new slots are had
  // before the old ones move: moving out first lost every member when the allocation
  // failed, tests/alloc_failure.cpp).
  void grow()
  {
    std::vector<slot> old(slots_.empty() ? MinSlots : slots_.size() * 2, slot{});
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    room_ = slots_.size() / 4;
    count_ = 0;
    for (const slot& s : old) {
      if (s.key != 0) insert_reserved(s.key, s.value);
    }
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  std::size_t room_ = 0;  // members that fit: a quarter of the slots
  std::size_t count_ = 0;
};

// ---- the small pool: blocks described in place, in address order --------------------------
// A small segment (2 MiB) is 4096 units of 512 bytes. Its blocks are described by an array
// with one 16-byte entry per unit, valid at each block's first unit (its head): freeing a
// block reads its entry, and its neighbours' entries only when a bitmap of the segment's
// free heads says they are free (to merge them), and finding a live block from its
// address is a probe of a per-cache table of segments by 2 MiB frame and an index into the
// array. No per-block records or hash entries: a few cache misses per allocate+free pair,
// where linked records took five or six.
constexpr unsigned k_unit_shift = 9;
constexpr unsigned k_seg_units = static_cast<unsigned>(k_small_segment >> k_unit_shift);  // 4096
constexpr unsigned k_unit_bits = 12;  // a unit index in a link
constexpr std::uint32_t k_nil = ~std::uint32_t{0};
static_assert(k_seg_units == 1U << k_unit_bits);

constexpr std::size_t unit_bytes(unsigned units) noexcept { return std::size_t{units} << k_unit_shift; }
// The sizes a dense block may have while allocated, in units: those of stream_cache::reuse.
constexpr unsigned k_reuse_sizes = static_cast<unsigned>(k_dense_request >> k_unit_shift);  // 128

struct unit_entry {
  // in_place: stream_cache::in_place; reuse: on a stream_cache::reuse list (state free, not indexed)
  enum : std::uint8_t { head = 1, split = 2, has_uses = 4, in_place = 8, reuse = 16 };
  std::uint16_t size = 0;  // units (1..4096)
  std::uint16_t prev = 0;  // units back to the previous block's head (0: the first block)
  block_state state = block_state::free;
  std::uint8_t flags = 0;
  std::uint16_t pending = 0;      // events outstanding before reuse
  std::uint32_t requested = 0;    // allocated: bytes asked for; free: previous link in its list
                                  // (not kept at a list's head, so taking the head writes no other entry)
  std::uint32_t fnext = k_nil;    // free: next link in its list
};
static_assert(sizeof(unit_entry) == 16);

// The header of a small segment; its entries live in the segment_table's slabs.
struct small_segment {
  std::uintptr_t addr = 0;
  stream_cache* cache = nullptr;
  unit_entry* units = nullptr;               // k_seg_units entries
  // One bit per unit: set at the head of each block in the cache's index (state free), so
  // a free asks whether its neighbours are free here (512 bytes per segment, which stay in
  // the CPU's cache) instead of reading their entries: at 64 KiB to 1 MiB requests those
  // sit kilobytes away, a cache miss each, and most neighbours are not free.
  // (kept beside the segment_table's other headers' bitmaps, not in the header: headers
  // of 600 bytes each took a random_allocations pair at 100 000 x 64 KiB from 0.25 to
  // 0.35 us on the development VM)
  std::uint64_t* free_heads = nullptr;  // k_seg_units / 64 words
  [[nodiscard]] bool free_at(unsigned u) const noexcept { return ((free_heads[u >> 6] >> (u & 63U)) & 1U) != 0; }
  void mark_free(unsigned u) noexcept { free_heads[u >> 6] |= std::uint64_t{1} << (u & 63U); }
  void mark_taken(unsigned u) noexcept { free_heads[u >> 6] &= ~(std::uint64_t{1} << (u & 63U)); }
  std::unique_ptr<std::uint64_t[]> t_alloc;  // allocation times, once tracing is on
  // Its cache's steal_gen at its last merge of a freed block (0: unknown; steal).
  std::uint64_t freed_gen = 0;
  std::uint32_t slot = 0;
  bool exported = false;  // shared with other processes: released only while no importer maps it
  std::int64_t* importers = nullptr;  // exported: its slot of importer_counts
  std::uint32_t importer_slot = 0;
  [[nodiscard]] bool whole_free() const noexcept
  {
    return units[0].size == k_seg_units && units[0].state == block_state::free;
  }
};

// Small segments by slot, so a free-list link is 32 bits: slot << 12 | unit. The entries
// of 32 consecutive slots share one 2 MiB slab (a transparent huge page where the kernel
// allows), so following links and neighbours through many segments does not miss the TLB;
// the headers of those 32 slots sit together in the slab's chunk. Slots are taken and given
// back under the table's mutex; a slot is set up before its segment is published to a cache
// (under that cache's lock), so readers need no lock.
class segment_table {
 public:
  static constexpr std::uint32_t per_chunk = 32;
  static constexpr std::uint32_t chunks = (k_nil >> k_unit_bits) / per_chunk;  // 2^20 slots, 2 TiB
  static constexpr std::uint32_t capacity = chunks * per_chunk;

  segment_table() : top_(chunks) {}
  segment_table(const segment_table&) = delete;
  segment_table& operator=(const segment_table&) = delete;
  ~segment_table()
  {
    for (auto& c : top_) {
      if (c) std::free(c->slab);
    }
  }

  [[nodiscard]] small_segment& at(std::uint32_t slot) const noexcept
  {
    return top_[slot / per_chunk]->heads[slot % per_chunk];
  }
  [[nodiscard]] unit_entry& entry(std::uint32_t link) const noexcept
  {
    const std::uint32_t slot = link >> k_unit_bits;
    return top_[slot / per_chunk]->slab[std::size_t{slot % per_chunk} * k_seg_units + (link & (k_seg_units - 1))];
  }

  // A fresh segment header for `addr` (one free block of the whole segment), or nullptr
  // when every slot is taken. Throws std::bad_alloc, changing nothing, when a slab cannot
  // be had.
  small_segment* acquire(std::uintptr_t addr)
  {
    std::lock_guard g{mu_};
    free_.reserve(next_ + 1);  // release() then never allocates
    std::uint32_t slot = 0;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      if (next_ >= capacity) return nullptr;
      if (next_ % per_chunk == 0) top_[next_ / per_chunk] = make_chunk();
      slot = next_++;
    }
    small_segment& s = at(slot);
    s.addr = addr;
    s.slot = slot;
    s.units = top_[slot / per_chunk]->slab + std::size_t{slot % per_chunk} * k_seg_units;
    std::fill(s.units, s.units + k_seg_units, unit_entry{});
    s.units[0].size = static_cast<std::uint16_t>(k_seg_units);
    s.units[0].flags = unit_entry::head;
    s.free_heads = top_[slot / per_chunk]->free_heads.get() + std::size_t{slot % per_chunk} * (k_seg_units / 64);
    std::fill(s.free_heads, s.free_heads + k_seg_units / 64, std::uint64_t{0});  // (the whole block is not indexed yet)
    return &s;
  }
  void release(small_segment& s) noexcept
  {
    std::lock_guard g{mu_};
    s.cache = nullptr;
    s.exported = false;
    s.importers = nullptr;
    s.t_alloc.reset();
    s.freed_gen = 0;
    free_.push_back(s.slot);
  }

  void fork_hold() noexcept { mu_.lock(); }  // (allocator_core::impl::fork_hold)
  void fork_release(bool child) noexcept { release_after_fork(mu_, child); }

 private:
  struct chunk {
    unit_entry* slab = nullptr;
    std::array<small_segment, per_chunk> heads{};
    std::unique_ptr<std::uint64_t[]> free_heads = std::make_unique<std::uint64_t[]>(per_chunk * (k_seg_units / 64));
  };
  static std::unique_ptr<chunk> make_chunk()
  {
    constexpr std::size_t bytes = sizeof(unit_entry) * k_seg_units * per_chunk;  // 2 MiB
    auto c = std::make_unique<chunk>();
    void* p = std::aligned_alloc(bytes, bytes);
    if (p == nullptr) throw std::bad_alloc{};
#if defined(__linux__)
    (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: refused is fine
#endif
    c->slab = static_cast<unit_entry*>(p);
    return c;
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<chunk>> top_;
  std::vector<std::uint32_t> free_;
  std::uint32_t next_ = 0;
};

// Every segment of an allocator by its range of addresses (an expandable one: its whole
// reservation), with where its header says which stream cache holds it now. A free whose
// block is in neither cache it tries first (a thread that frees blocks of many streams,
// naming none) asks here and locks that one cache, where it tried every cache in turn
// (64 streams: ~1.3 us a free on the development VM). Thread safety: its own read-write
// lock, a leaf (its holder takes no other lock). An entry's node is made before anything
// of a new segment changes (spare(), which may throw std::bad_alloc) and filled and added
// once the segment is in a cache (add(), no allocation); it is removed before the header
// is freed or its slot reused. A header's `cache` changes (a move between caches, under both
// caches' locks) by an atomic store and is read here by an atomic load, so a caller may be
// told the cache a segment just left: it then finds no block there and looks the long way.
class segment_directory {
 public:
  struct entry {
    std::uintptr_t end = 0;
    stream_cache** owner = nullptr;  // the header's `cache`
  };
  using node_type = std::map<std::uintptr_t, entry>::node_type;

  // A node for an entry; may throw std::bad_alloc. (add() takes it; dropped unused, it
  // frees itself.)
  static node_type spare()
  {
    std::map<std::uintptr_t, entry> one;
    return one.extract(one.emplace().first);
  }
  // Lists the segment at [addr, addr + bytes), whose header's cache is *owner, in node n
  // (spare()'s: no allocation). Addresses are unique: remove() comes before the upstream
  // may hand a segment's addresses out again.
  void add(node_type&& n, std::uintptr_t addr, std::size_t bytes, stream_cache** owner) noexcept
  {
    n.key() = addr;
    n.mapped() = {addr + bytes, owner};
    std::lock_guard g{mu_};
    by_addr_.insert(std::move(n));
  }
  void remove(std::uintptr_t addr) noexcept
  {
    std::lock_guard g{mu_};
    by_addr_.erase(addr);
  }
  // The cache whose segment holds address p, as its header said a moment ago; nullptr when
  // no segment of this allocator holds it.
  [[nodiscard]] stream_cache* owner_of(std::uintptr_t p) const noexcept
  {
    std::shared_lock g{mu_};
    auto it = by_addr_.upper_bound(p);
    if (it == by_addr_.begin()) return nullptr;
    --it;
    return p < it->second.end ? owner(it->second) : nullptr;
  }
  // Whether the segment at addr is listed as [addr, end) with its header's cache c; and
  // how many are listed (check_directory).
  [[nodiscard]] bool lists(std::uintptr_t addr, std::uintptr_t end, const stream_cache* c) const noexcept
  {
    std::shared_lock g{mu_};
    const auto it = by_addr_.find(addr);
    return it != by_addr_.end() && it->second.end == end && owner(it->second) == c;
  }
  [[nodiscard]] std::size_t size() const noexcept
  {
    std::shared_lock g{mu_};
    return by_addr_.size();
  }
  // A header's cache changes (under the caches' locks) through this, so owner_of() can read it.
  static void set_owner(stream_cache*& field, stream_cache* c) noexcept
  {
    std::atomic_ref<stream_cache*>{field}.store(c, std::memory_order_relaxed);
  }

  void fork_hold() noexcept { mu_.lock(); }  // (allocator_core::impl::fork_hold)
  void fork_release(bool child) noexcept { release_after_fork(mu_, child); }

 private:
  static stream_cache* owner(const entry& e) noexcept
  {
    return std::atomic_ref<stream_cache*>{*e.owner}.load(std::memory_order_relaxed);
  }

  mutable std::shared_mutex mu_;  // (frees on several threads read it at once)
  std::map<std::uintptr_t, entry> by_addr_;
};

// Exact-size segregated free lists of the small pool of one stream cache: one list per
// size in units (1..4096), a bitmap of non-empty lists and a bitmap of non-zero words, so
// the best fit (the smallest free block that is large enough) is found in O(1).
class small_free_index {
 public:
  explicit small_free_index(const segment_table& t) : table_{&t} { heads_.fill(k_nil); }

  void insert(std::uint32_t link, unit_entry& e) noexcept
  {
    const unsigned i = e.size - 1U;
    e.fnext = heads_[i];
    if (e.fnext != k_nil) table_->entry(e.fnext).requested = link;
    heads_[i] = link;
    words_[i >> 6] |= std::uint64_t{1} << (i & 63U);
    top_ |= std::uint64_t{1} << (i >> 6);
    bytes_ += unit_bytes(e.size);
  }

  // A list's head keeps no previous link: taking it (the best fit) writes only the heads.
  void remove(std::uint32_t link, unit_entry& e) noexcept
  {
    const unsigned i = e.size - 1U;
    if (heads_[i] == link) {
      heads_[i] = e.fnext;
    } else {
      table_->entry(e.requested).fnext = e.fnext;
      if (e.fnext != k_nil) table_->entry(e.fnext).requested = e.requested;
    }
    if (heads_[i] == k_nil) {
      words_[i >> 6] &= ~(std::uint64_t{1} << (i & 63U));
      if (words_[i >> 6] == 0) top_ &= ~(std::uint64_t{1} << (i >> 6));
    }
    e.requested = 0;
    e.fnext = k_nil;
    bytes_ -= unit_bytes(e.size);
  }

  // The link of the smallest free block of at least `units` units, or k_nil.
  [[nodiscard]] std::uint32_t find(unsigned units) const noexcept
  {
    const unsigned i = units - 1U;
    unsigned w = i >> 6;
    std::uint64_t m = words_[w] & (~std::uint64_t{0} << (i & 63U));
    if (m == 0) {
      const std::uint64_t t = w + 1 < 64 ? top_ & (~std::uint64_t{0} << (w + 1)) : 0;
      if (t == 0) return k_nil;
      w = static_cast<unsigned>(std::countr_zero(t));
      m = words_[w];
    }
    return heads_[w * 64 + static_cast<unsigned>(std::countr_zero(m))];
  }

  [[nodiscard]] std::size_t largest() const noexcept
  {
    if (top_ == 0) return 0;
    const unsigned w = 63U - static_cast<unsigned>(std::countl_zero(top_));
    return unit_bytes(w * 64 + 64U - static_cast<unsigned>(std::countl_zero(words_[w])));
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  const segment_table* table_;
  std::uint64_t top_ = 0;
  std::array<std::uint64_t, 64> words_{};
  std::array<std::uint32_t, k_seg_units> heads_{};
  std::size_t bytes_ = 0;
};

// The statistics' quantities, each kept per pool ([0] large, [1] small).
enum quantity : unsigned {
  q_allocated,
  q_requested,
  q_reserved,
  q_active,
  q_inactive_split,
  q_num_allocations,
  q_num_segments,
  q_count
};
// The quantities an allocation or a split raises: their highs follow every operation
// (stat_delta::bound, shared_stats::open_window); the others change with segments only.
constexpr std::array<unsigned, 5> k_hot_quantities{q_allocated, q_requested, q_active, q_inactive_split,
                                                   q_num_allocations};
// Of those, the byte figures (a count has no drift bound).
constexpr std::array<unsigned, 4> k_hot_bytes{q_allocated, q_requested, q_active, q_inactive_split};

// A lock for a few dozen instructions that never block: one exchange to take, a plain
// store to give back (std::mutex pays a second read-modify-write to unlock).
class spin_lock {
 public:
  void lock() noexcept
  {
    while (held_.exchange(true, std::memory_order_acquire)) {
      // A holder preempted by the kernel: after a while, let it run.
      for (unsigned n = 0; held_.load(std::memory_order_relaxed); ++n) {
        if (n < 256) {
          biased_mutex::relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

// A stream cache's mutex: biased to the thread that uses the stream (no atomic
// read-modify-write per operation once it is), else one compare-exchange to take and a
// release store to give back; a waiter spins briefly, then sleeps (biased_mutex.hpp).
using cache_mutex = biased_mutex;

// What the operations on one stream cache changed in the shared figures and have not yet
// published (kept under the cache's lock). Per cell [pool * 8 + quantity]: the net change,
// the growth, and the highest net change seen at an operation boundary; the same highest for
// the pools' sum of each quantity and for cached = reserved - allocated. Threads on
// different streams so touch no shared line on most operations (one shared write per
// operation cost 10x at 4 threads on a 16-core Xeon). publish() applies it all at once.
// A high need only take in, at an operation's end, the figures that operation can have
// raised (a figure's highest boundary ends an operation that raised it): an operation
// records what kind of change it made (op_* bits) and end_op() raises those highs only, in
// straight-line code with a branch per figure that rarely moves; any other change
// (segments, events, a reset, both pools at once) marks the operation general and end_op()
// takes in every figure. An operation of one pool compares each figure it raised with one
// bound for both the pool's high and the pools' sum's (stat_delta::bound), not with each.
struct stat_delta {
  std::array<std::int64_t, 16> net{};
  std::array<std::int64_t, 16> added{};
  std::array<std::int64_t, 16> high{};
  std::array<std::int64_t, q_count> all_high{};
  std::array<std::int64_t, 3> cached_high{};  // large, small, all
  // For the pool `bound_kind` (op_large, op_small; 0: none): per hot quantity, the
  // highest its net may reach at a boundary with neither the pool's high nor the sum's
  // high moving, min(high[p + q], all_high[q] - net[o + q]) (o the other pool), for bytes
  // also at most `limit` (the drift check of a rising figure); the same for cached bytes
  // (bound[q_reserved], no limit). Set by aim() at the end of the first operation of pool
  // p after one of the other pool (the other pool's net enters the bound), and moved up by
  // near() with the highs it raises; publish, open_window, raise_everything and a change of
  // `limit` drop it. While the bound is p's, the other pool's nets have not risen (an
  // operation of that pool aims at it first; a fall there leaves p's bound lower than it
  // could be, which costs at most a needless raise), so a figure at or under its bound
  // moves no high and has not drifted: at 64 MiB requests this took 8 of the 14
  // compare-and-branches of a pair (each pool's high and the sum's) and their additions,
  // and the drift checks of an allocation.
  std::array<std::int64_t, q_count> bound{};
  std::uint32_t bound_kind = 0;
  // Headroom, set at a window's first operation (shared_stats::open_window): how far each
  // shared figure of the hot quantities was below its peak. The highs start there, so an
  // operation raises a high only when it could move the peak (raising from 0 after every
  // publish took ~1 unpredictable branch per pair at random sizes), and publish() takes in
  // only the highs that rose above it. 0 when not set (publish() takes in every high then).
  std::array<std::int64_t, 16> room{};
  std::array<std::int64_t, q_count> all_room{};
  std::array<std::int64_t, 3> cached_room{};
  std::uint32_t op = 0;     // op_* bits: what the operation under way changed
  std::uint32_t dirty = 0;  // op_* bits of the operations since the last publish
  // due_* bits (the low byte), and from bit 8 the operations since the last publish: the
  // operation's end asks one question of it (k_settle) where it asked three (due bits, the
  // first operation since a publish, k_max_ops operations).
  std::uint32_t due = due_fresh;
  // The last window held at most 3 operations (a delta published at nearly every
  // operation, as at 64 MiB requests beside other threads, or where deltas were the
  // caches' and a thread alternating among streams published at every change): the next
  // window then sets no headroom, whose reading of the shared figures under their lock
  // cost more than the few operations it would have spared branches for.
  bool short_window = false;
  bool opened = false;          // the rooms are set (open_window): publish() clears them
  std::uint64_t opened_at = 0;  // shared_stats::publishes when they were set
  std::int64_t batch = 0;   // allocator_config::stats_batch: the largest |net| kept
  // The drift checks' bound: batch, or no bound while the delta is kept past it
  // (overdrawn): it is then published by its thread's next due operation (k_max_ops
  // operations, or a change of segments), by a reader or as its thread exits, so the
  // checks need not fire again at every operation (at 64 MiB requests they did: a call and
  // two unpredictable branches per operation).
  std::int64_t limit = 0;
  static constexpr std::int64_t k_no_limit = std::numeric_limits<std::int64_t>::max() / 4;
  // Drifted past batch and kept (shared_stats::settle) until published.
  [[nodiscard]] bool overdrawn() const noexcept { return limit == k_no_limit; }

  // What an operation changed. Raises: an allocation of either pool (its allocated,
  // requested, active bytes and count), inactive split bytes grew, a free (cached bytes of
  // its pool grew); general: anything else (every figure is taken in). Pools: the hot cells
  // of that pool changed (publish() applies those of the pools marked).
  static constexpr std::uint32_t op_alloc_large = 1U << 0;
  static constexpr std::uint32_t op_alloc_small = 1U << 1;
  static constexpr std::uint32_t op_free = 1U << 2;
  static constexpr std::uint32_t op_split = 1U << 3;
  static constexpr std::uint32_t op_general = 1U << 4;
  static constexpr std::uint32_t op_large = 1U << 5;
  static constexpr std::uint32_t op_small = 1U << 6;
  static constexpr std::uint32_t op_counted = op_alloc_large | op_alloc_small | op_free;
  static constexpr std::uint32_t k_max_ops = 256;  // at most this many operations unpublished
  // Why to publish: segments changed or k_max_ops operations passed (due_now), or a figure
  // drifted more than `batch` from its published value (due_drift: see shared_stats::settle).
  static constexpr std::uint32_t due_now = 1;
  static constexpr std::uint32_t due_drift = 2;
  // No operation has ended since the last publish (its end opens a window: open_window).
  static constexpr std::uint32_t due_fresh = 4;
  static constexpr std::uint32_t k_due_bits = 0xFFU;
  static constexpr std::uint32_t k_op_count = 1U << 8;  // one operation in `due`
  // Some due bit, or k_max_ops operations since the last publish: settle as the operation ends.
  static constexpr std::uint32_t k_settle = k_due_bits | ~(k_max_ops * k_op_count - 1U);
  static_assert(k_max_ops * k_op_count == 1U << 16);

  explicit stat_delta(std::size_t stats_batch) noexcept
      : batch{static_cast<std::int64_t>(stats_batch)}, limit{batch}
  {
  }

  // (shifts, not selects: each small bit is its large bit's next)
  static_assert(op_small == op_large << 1 && op_alloc_small == op_alloc_large << 1);
  static constexpr std::uint32_t pool_bit(bool small) noexcept { return op_large << unsigned{small}; }
  // The first cell of the pool of `kind` (op_large: 0, op_small: 8), by a shift.
  static constexpr std::size_t cells_of(std::uint32_t kind) noexcept { return (kind & op_small) >> 3U; }
  [[gnu::always_inline]] static void raise(std::int64_t& high, std::int64_t v) noexcept
  {
    if (v > high) [[unlikely]] {
      high = v;
    }
  }

  // An operation boundary: the highs take in what the operation may have raised (caller
  // holds the lock).
  [[gnu::always_inline]] void end_op() noexcept
  {
    const std::uint32_t o = op;
    // One branch for both: the operation is of one pool, whose bounds are set.
    const std::uint32_t kind = o & (op_large | op_small | op_general);
    if (kind != bound_kind) [[unlikely]] {
      if (kind == op_large || kind == op_small) {
        aim(kind);
      } else {  // general, or both pools
        raise_everything();
      }
    }
    if (kind == bound_kind) {
      const std::size_t p = cells_of(kind);
      if ((o & (op_alloc_large | op_alloc_small)) != 0) {
        near(p, q_allocated);
        near(p, q_requested);
        near(p, q_active);
        near(p, q_num_allocations);
      }
      // Whether an operation split a block, or a free left a split one indexed, is the
      // workload's coin toss: comparing at every operation costs less than the mispredicted
      // branch (0.33 per pair at 64 MiB requests, callgrind). A figure this operation did
      // not raise is under its bound, or is a boundary's value all the same.
      near(p, q_inactive_split);
      if ((o & op_free) != 0) near_cached(p);
    }
    dirty |= o;
    op = 0;
    due += k_op_count;
  }
  // Operations since the last publish.
  [[nodiscard]] std::uint32_t ops() const noexcept { return due / k_op_count; }
  // Due now: segments changed, or k_max_ops operations passed.
  [[nodiscard]] bool due_at_once() const noexcept { return (due & due_now) != 0 || ops() >= k_max_ops; }

  // The bounds no longer hold (a high moved, or was set back).
  void drop_bound() noexcept { bound_kind = 0; }

  // An allocation of `size_bytes` bytes for a request of `requested` bytes in the small or
  // large pool (one per operation: a second one starts a new operation boundary).
  [[gnu::always_inline]] void count_allocation(bool small, std::size_t size_bytes, std::size_t requested) noexcept
  {
    if ((op & op_counted) != 0) end_op();  // a second one in one operation: a boundary between them
    add_allocation(small ? 8U : 0U, size_bytes, requested);
    op |= (op_alloc_large | op_large) << unsigned{small};
    // (whether a figure drifted past `limit`: end_op, with the highs' bounds)
  }
  // count_allocation() and the end of its operation at once, where the operation so far
  // changed the same pool only (index changes, inactive split bytes; mark()) and that
  // pool's bounds are set: the take of a cached block (take_free_in, small_take_free).
  // Straight-line code for a known pool, where count_allocation() set op bits that end_op()
  // read back through a dispatch as the lock was given back (13-16 instructions per pair,
  // callgrind). Returns false, having done nothing, otherwise (count_allocation() then).
  // The caller settles the delta when due (as cache_lock::unlock()).
  [[gnu::always_inline]] bool count_allocation_ended(bool small, std::size_t size_bytes, std::size_t requested) noexcept
  {
    const std::uint32_t kind = pool_bit(small);
    if ((((op & ~op_split) ^ kind) | (bound_kind ^ kind)) != 0) [[unlikely]] {
      return false;
    }
    const std::size_t p = small ? 8U : 0U;
    add_allocation(p, size_bytes, requested);
    near(p, q_allocated);
    near(p, q_requested);
    near(p, q_active);
    near(p, q_num_allocations);
    near(p, q_inactive_split);
    dirty |= (op_alloc_large | op_large) << unsigned{small};  // (op_split: publish() reads no such bit)
    op = 0;
    due += k_op_count;
    return true;
  }
  // A free (active bytes stay until the block is back in the cache).
  [[gnu::always_inline]] void count_free(bool small, std::size_t size_bytes, std::size_t requested) noexcept
  {
    if ((op & op_counted) != 0) end_op();
    const std::size_t p = small ? 8U : 0U;
    net[p + q_allocated] -= static_cast<std::int64_t>(size_bytes);
    net[p + q_requested] -= static_cast<std::int64_t>(requested);
    net[p + q_num_allocations] -= 1;
    op |= op_free | pool_bit(small);
    if (net[p + q_allocated] < -limit || net[p + q_requested] < -limit) [[unlikely]] {
      due |= due_drift;
    }
  }
  // Inactive split bytes: a split block was indexed / left the index.
  [[gnu::always_inline]] void add_split(bool small, std::size_t n) noexcept
  {
    const std::size_t i = (small ? 8U : 0U) + q_inactive_split;
    net[i] += static_cast<std::int64_t>(n);
    added[i] += static_cast<std::int64_t>(n);
    op |= op_split | pool_bit(small);  // (drift: end_op)
  }
  [[gnu::always_inline]] void sub_split(bool small, std::size_t n) noexcept { decrease(small, q_inactive_split, n); }
  // add_split(small, n) if `counted`, else nothing, without a branch (as sub_split_if).
  // Marked: the operation has marked the pool already (mark()), so no bit is set here.
  template <bool Marked = false>
  [[gnu::always_inline]] void add_split_if(bool counted, bool small, std::size_t n) noexcept
  {
    const std::size_t i = (small ? 8U : 0U) + q_inactive_split;
    const std::size_t mask = std::size_t{0} - std::size_t{counted};
    net[i] += static_cast<std::int64_t>(n & mask);
    added[i] += static_cast<std::int64_t>(n & mask);
    if constexpr (!Marked) op |= (op_split | pool_bit(small)) & static_cast<std::uint32_t>(mask);
  }
  // sub_split(small, n) if `counted`, else nothing, without a branch: whether a block
  // leaving the index was split is a coin toss at random sizes.
  template <bool Marked = false>
  [[gnu::always_inline]] void sub_split_if(bool counted, bool small, std::size_t n) noexcept
  {
    const std::size_t i = (small ? 8U : 0U) + q_inactive_split;
    net[i] -= static_cast<std::int64_t>(n & (std::size_t{0} - std::size_t{counted}));
    if constexpr (!Marked) op |= pool_bit(small) & (std::uint32_t{0} - std::uint32_t{counted});
    if (net[i] < -limit) [[unlikely]] {
      due |= due_drift;
    }
  }
  // A block is back in the cache (marks its pool).
  [[gnu::always_inline]] void sub_active(bool small, std::size_t n) noexcept { decrease(small, q_active, n); }
  // The operation under way changes the hot cells of this pool: marked once, so the index
  // changes that follow (add_split_if<true>, sub_split_if<true>) set no bit each (a masked
  // bit per block indexed or unindexed cost ~10 instructions per pair at 64 MiB requests).
  // Only on the hot paths, in the operation's own cache: a bit set unconditionally by every
  // index change (a steal's in another cache included) made the batched-statistics test
  // (seed 7) miss a cached-bytes peak; the likely cause, a bit in an idle cache's delta
  // opening a headroom window there that went stale (shared_stats::settle), is not proven.
  [[gnu::always_inline]] void mark(bool small) noexcept { op |= pool_bit(small); }
  // A segment came (+1) or went (-1): published as the operation ends.
  void change_segments(bool small, std::size_t bytes, int sign) noexcept
  {
    const std::size_t p = small ? 8U : 0U;
    change_mapped(small, bytes, sign);
    net[p + q_num_segments] += sign;
    if (sign > 0) added[p + q_num_segments] += 1;
  }
  // Pages mapped into (sign +1) or unmapped from (-1) an expandable segment.
  void change_mapped(bool small, std::size_t bytes, int sign) noexcept
  {
    const std::size_t p = small ? 8U : 0U;
    net[p + q_reserved] += sign * static_cast<std::int64_t>(bytes);
    if (sign > 0) added[p + q_reserved] += static_cast<std::int64_t>(bytes);
    op |= op_general;
    due |= due_now;
  }

 private:
  // The cells of pool p (0, 8) an allocation changes.
  [[gnu::always_inline]] void add_allocation(std::size_t p, std::size_t size_bytes, std::size_t requested) noexcept
  {
    const auto size = static_cast<std::int64_t>(size_bytes);  // (64-bit: net[p + q] is one address)
    const auto bytes = static_cast<std::int64_t>(requested);
    net[p + q_allocated] += size;
    net[p + q_requested] += bytes;
    net[p + q_active] += size;
    net[p + q_num_allocations] += 1;
    added[p + q_allocated] += size;
    added[p + q_requested] += bytes;
    added[p + q_active] += size;
    added[p + q_num_allocations] += 1;
  }
  // A hot figure fell (no high to take in).
  [[gnu::always_inline]] void decrease(bool small, quantity q, std::size_t n) noexcept
  {
    const std::size_t i = (small ? 8U : 0U) + q;
    net[i] -= static_cast<std::int64_t>(n);
    op |= pool_bit(small);
    if (net[i] < -limit) [[unlikely]] {
      due |= due_drift;
    }
  }
  [[gnu::always_inline]] void raise_all(unsigned q) noexcept { raise(all_high[q], net[q] + net[q + 8]); }
  // cached = reserved - allocated, of pool p
  [[nodiscard]] std::int64_t cached_net(std::size_t p) const noexcept { return net[p + q_reserved] - net[p + q_allocated]; }
  // The bounds of the pool of `kind` (op_large or op_small; see bound).
  [[gnu::noinline]] void aim(std::uint32_t kind) noexcept
  {
    const std::size_t p = cells_of(kind);
    for (unsigned q : k_hot_quantities) aim_at(p, q);
    aim_cached(p);
    bound_kind = kind;
  }
  [[gnu::always_inline]] void aim_at(std::size_t p, unsigned q) noexcept
  {
    const std::int64_t b = std::min(high[p + q], all_high[q] - net[(8U - p) + q]);
    bound[q] = q == q_num_allocations ? b : std::min(b, limit);  // (a count has no drift bound)
  }
  [[gnu::always_inline]] void aim_cached(std::size_t p) noexcept
  {
    bound[q_reserved] = std::min(cached_high[p / 8U], cached_high[2] - cached_net(8U - p));
  }
  // Pool p's figure of quantity q at a boundary: past its bound, the pool's high and the
  // sum's take it in and the bound follows them.
  [[gnu::always_inline]] void near(std::size_t p, unsigned q) noexcept
  {
    if (net[p + q] > bound[q]) [[unlikely]] {
      raise(high[p + q], net[p + q]);
      raise_all(q);
      if (q != q_num_allocations && net[p + q] > limit) due |= due_drift;
      aim_at(p, q);
    }
  }
  [[gnu::always_inline]] void near_cached(std::size_t p) noexcept
  {
    const std::int64_t mine = cached_net(p);
    if (mine > bound[q_reserved]) [[unlikely]] {
      raise(cached_high[p / 8U], mine);
      raise(cached_high[2], mine + cached_net(8U - p));
      aim_cached(p);
    }
  }
  // cached = reserved - allocated
  [[gnu::always_inline]] void raise_cached() noexcept
  {
    const std::int64_t large = cached_net(0);
    const std::int64_t small = cached_net(8);
    raise(cached_high[0], large);
    raise(cached_high[1], small);
    raise(cached_high[2], large + small);
  }
  [[gnu::noinline]] void raise_everything() noexcept
  {
    for (unsigned p = 0; p < 16; p += 8) {
      for (unsigned q = 0; q < q_count; ++q) raise(high[p + q], net[p + q]);
      for (unsigned q : k_hot_bytes) {
        if (net[p + q] > limit) due |= due_drift;
      }
    }
    for (unsigned q = 0; q < q_count; ++q) raise_all(q);
    raise_cached();
    drop_bound();
  }
};
static_assert(q_count <= 8);
static_assert(stat_delta::cells_of(stat_delta::op_large) == 0 && stat_delta::cells_of(stat_delta::op_small) == 8);

// The allocator's figures, shared by its stream caches: what their stat_deltas published.
// Written under `mu` with plain loads and stores of relaxed atomics, so readers that need
// no exact figure may read without a lock; segment changes are published at once, so
// reserved bytes (the growth limits' figure) are always exact. stats() takes every cache
// lock and publishes every delta first, so its figures are exact and agree with a snapshot.
// Per pool and quantity: current, added (since the last reset of totals), peak; freed =
// added - (current - base), base being current at that reset. "all" figures are the pools'
// sums. A peak is the highest value at an operation boundary: exact while at most one
// delta holds unpublished changes (one thread at work, whatever its streams: a thread
// counts its operations in a delta of its own, whichever cache it works on (the caches'
// own deltas take what is changed under every cache's lock, by flush_all, and a cache a
// segment is moved out of: both published at once); with several threads at work at
// once, off by at most what the others hold unpublished (a peak of bytes by stats_batch
// per other thread, a count by 256 per other thread; a thread that drifts past
// stats_batch while it was the last to publish, i.e. ran alone, publishes at its 256th
// operation, at a change of segments, as it exits, or when a reader looks: publishing at
// every 64 MiB allocation cost one thread ~270 instructions per pair, for no figure it
// can see).
struct shared_stats {
  alignas(64) spin_lock mu;
  std::atomic<const stat_delta*> last{nullptr};  // the delta published last (written under mu)
  // d is about to be destroyed: a later delta at its address must not read as published last.
  void forget(const stat_delta& d) noexcept
  {
    std::lock_guard g{mu};
    if (last.load(std::memory_order_relaxed) == &d) last.store(nullptr, std::memory_order_relaxed);
  }
  std::uint64_t publishes = 0;                   // publish() calls so far (under mu)
  std::array<std::atomic<std::int64_t>, 16> value{};  // current figures
  std::array<std::atomic<std::int64_t>, 16> added{};
  std::array<std::atomic<std::int64_t>, 16> peak{};
  std::array<std::atomic<std::int64_t>, q_count> all_peak{};
  std::array<std::atomic<std::int64_t>, 3> cached_peak{};  // large, small, all
  std::array<std::array<std::int64_t, q_count>, 2> base{};

  static std::int64_t get(const std::atomic<std::int64_t>& a) noexcept
  {
    return a.load(std::memory_order_relaxed);
  }
  static void set(std::atomic<std::int64_t>& a, std::int64_t v) noexcept
  {
    a.store(v, std::memory_order_relaxed);
  }
  [[gnu::always_inline]] static void raise(std::atomic<std::int64_t>& high, std::int64_t v) noexcept
  {
    if (v > get(high)) set(high, v);
  }

  [[nodiscard]] std::int64_t current(quantity q, int p) const noexcept
  {
    return get(value[static_cast<std::size_t>(p) * 8 + q]);
  }
  [[nodiscard]] std::int64_t total(quantity q) const noexcept { return current(q, 0) + current(q, 1); }

  // cached = reserved - allocated: large, small, all
  [[nodiscard]] std::array<std::int64_t, 3> cached_now() const noexcept
  {
    const std::int64_t large = current(q_reserved, 0) - current(q_allocated, 0);
    const std::int64_t small = current(q_reserved, 1) - current(q_allocated, 1);
    return {large, small, large + small};
  }
  void raise_cached() noexcept
  {
    const auto now = cached_now();
    for (unsigned k = 0; k < 3; ++k) raise(cached_peak[k], now[k]);
  }
  // Whether publish() takes a delta's high in: it rose above the headroom its window
  // started at (stat_delta::room; 0 when none was set). A high of 0 is the figure the
  // window started at, not above its peak, so a window of one or two operations (a thread
  // alternating among streams) takes in only the figures it raised.
  [[gnu::always_inline]] static bool rose(std::int64_t high, std::int64_t room) noexcept { return high > room; }
  // Before publish() takes in a delta whose window's headroom went stale (another cache
  // published after the window opened, so the shared figures moved under it): each peak
  // becomes at least the figure the delta leaves. A high kept under a stale headroom is not
  // taken in, and the peak could stay below that figure; under a fresh headroom, the
  // figure is already at most the peak.
  [[gnu::noinline]] void raise_to_figures(const stat_delta& d) noexcept
  {
    for (unsigned q = 0; q < q_count; ++q) {
      raise(peak[q], get(value[q]) + d.net[q]);
      raise(peak[q + 8], get(value[q + 8]) + d.net[q + 8]);
      raise(all_peak[q], get(value[q]) + get(value[q + 8]) + d.net[q] + d.net[q + 8]);
    }
    const auto now = cached_now();
    const std::int64_t large = d.net[q_reserved] - d.net[q_allocated];
    const std::int64_t small = d.net[8 + q_reserved] - d.net[8 + q_allocated];
    raise(cached_peak[0], now[0] + large);
    raise(cached_peak[1], now[1] + small);
    raise(cached_peak[2], now[2] + large + small);
  }

  [[nodiscard]] stat load_cell(quantity q, int p) const noexcept
  {
    const std::size_t i = static_cast<std::size_t>(p) * 8 + q;
    const std::int64_t cur = get(value[i]);
    const std::int64_t in = get(added[i]);
    return stat{cur, get(peak[i]), in, in - (cur - base[static_cast<std::size_t>(p)][q])};
  }
  [[nodiscard]] stat_array load(quantity q) const noexcept
  {
    stat_array a;
    a.large = load_cell(q, 0);
    a.small = load_cell(q, 1);
    a.all = stat{a.large.current + a.small.current, get(all_peak[q]), a.large.allocated + a.small.allocated,
                 a.large.freed + a.small.freed};
    return a;
  }
  [[nodiscard]] std::int64_t cached_peak_of(int p) const noexcept
  {
    return get(cached_peak[static_cast<std::size_t>(p)]);
  }

  [[gnu::always_inline]] void publish_all_peak(stat_delta& d, unsigned q) noexcept
  {
    if (rose(d.all_high[q], d.all_room[q])) raise(all_peak[q], get(value[q]) + get(value[q + 8]) + d.all_high[q]);
    d.all_high[q] = 0;
  }
  [[gnu::always_inline]] void publish_cell(stat_delta& d, unsigned i) noexcept
  {
    const std::int64_t v = get(value[i]);
    if (rose(d.high[i], d.room[i])) raise(peak[i], v + d.high[i]);
    set(value[i], v + d.net[i]);
    if (d.added[i] != 0) set(added[i], get(added[i]) + d.added[i]);
    d.net[i] = 0;
    d.added[i] = 0;  // its high: with every high at the end of publish()
  }
  [[gnu::always_inline]] void publish_pool(stat_delta& d, unsigned p) noexcept
  {
    publish_cell(d, p + q_allocated);
    publish_cell(d, p + q_requested);
    publish_cell(d, p + q_active);
    publish_cell(d, p + q_inactive_split);
    publish_cell(d, p + q_num_allocations);
  }

  // At the end of an operation that made a delta due, or the first since it was published
  // (caller holds the lock of the cache it worked on: see allocator_core::impl's
  // thread_stats). It is published, unless it is due only because a figure drifted, no
  // other delta was published since it was and stats_batch is not 0 (exact peaks asked
  // for): then it is kept, and marked (overdrawn). No other thread publishes it then (a
  // thread's delta is only ever under the lock of the cache it is working on, which
  // another thread cannot know without a lock of its own per operation): its thread does
  // within k_max_ops operations, or a reader, or its exit.
  [[gnu::noinline]] void settle(stat_delta& d) noexcept
  {
    const bool fresh = (d.due & stat_delta::due_fresh) != 0;
    if (d.due_at_once() ||
        ((d.due & stat_delta::due_drift) != 0 && (last.load(std::memory_order_relaxed) != &d || d.batch == 0))) {
      publish(d);
      return;
    }
    if (fresh && d.batch != 0 && !d.short_window) open_window(d);
    if ((d.due & stat_delta::due_drift) != 0 && !d.overdrawn()) {
      d.limit = stat_delta::k_no_limit;
      d.drop_bound();  // (the bounds held the limit)
    }
    d.due &= ~stat_delta::k_due_bits;  // the operations stay counted
  }

  // Applies and clears a stream cache's delta (caller holds that cache's lock; no
  // operation under way). Each peak becomes at least the figure before + the delta's high;
  // with `peaks` false no peak moves (flush_all: its changes end at one boundary, the end
  // of the whole call, taken in by raise_to_current).
  void publish(stat_delta& d, bool peaks = true) noexcept
  {
    const std::uint32_t dirty = d.dirty;
    if (dirty == 0) return;
    std::lock_guard g{mu};
    last.store(&d, std::memory_order_relaxed);
    if (!peaks) {
      d.high = {};  // (none taken in: publish_all_peak, publish_cell and the cached peaks below)
      d.all_high = {};
      d.cached_high = {};
      d.opened = false;  // (a stale window's figures: the caller raises to the ones it leaves)
      d.room = {};
      d.all_room = {};
      d.cached_room = {};
    }
    if (d.opened && d.opened_at != publishes) [[unlikely]] {
      raise_to_figures(d);
    }
    ++publishes;
    if (d.overdrawn()) d.limit = d.batch;
    // Straight-line over the hot quantities (a cell that did not change holds net, added and
    // high 0, and its peak is at least its value, so taking it in changes nothing): at 64 MiB
    // requests every operation drifts past the batch and publishes, and a loop over the
    // changed cells cost ~260 instructions there.
    publish_all_peak(d, q_allocated);
    publish_all_peak(d, q_requested);
    publish_all_peak(d, q_active);
    publish_all_peak(d, q_inactive_split);
    publish_all_peak(d, q_num_allocations);
    if ((dirty & (stat_delta::op_free | stat_delta::op_general)) != 0) {  // else no cached high rose
      const auto now = cached_now();
      for (unsigned k = 0; k < 3; ++k) {
        if (rose(d.cached_high[k], d.cached_room[k])) raise(cached_peak[k], now[k] + d.cached_high[k]);
      }
    }
    if ((dirty & (stat_delta::op_large | stat_delta::op_general)) != 0) publish_pool(d, 0);
    if ((dirty & (stat_delta::op_small | stat_delta::op_general)) != 0) publish_pool(d, 8);
    if ((dirty & stat_delta::op_general) != 0) {  // segments came or went
      publish_all_peak(d, q_reserved);
      publish_all_peak(d, q_num_segments);
      for (unsigned p : {0U, 8U}) {
        publish_cell(d, p + q_reserved);
        publish_cell(d, p + q_num_segments);
      }
    }
    // Every cell's high back to 0 (also those not taken in above, which may hold their
    // headroom): the next window sets its own (none after a window of at most 3 operations).
    d.high = {};
    d.cached_high = {};
    d.drop_bound();
    if (d.opened) {  // else every room is 0 still
      d.room = {};
      d.all_room = {};
      d.cached_room = {};
      d.opened = false;
    }
    d.dirty = 0;
    d.short_window = d.ops() <= 3;
    d.due = stat_delta::due_fresh;
  }

  // A window's first operation has ended on d's cache (caller holds its lock; d not
  // published since): each high of the hot quantities starts at the headroom of its peak
  // over the shared figure (see stat_delta::room). Read under mu, so the figures are one
  // publish's. Exact while d's cache is the only one publishing: the shared figure stays
  // what it is now until d is published, so value + high reaches the peak only if a
  // boundary of this window did. Not with stats_batch 0 (every operation publishes).
  void open_window(stat_delta& d) noexcept
  {
    std::lock_guard g{mu};
    d.opened = true;
    d.opened_at = publishes;
    auto headroom = [](std::int64_t peak_now, std::int64_t value_now) {
      return std::max<std::int64_t>(peak_now - value_now, 0);
    };
    for (unsigned p : {0U, 8U}) {
      for (unsigned q : k_hot_quantities) {
        const unsigned i = p + q;
        d.room[i] = headroom(get(peak[i]), get(value[i]));
        d.high[i] = std::max(d.high[i], d.room[i]);
      }
    }
    for (unsigned q : k_hot_quantities) {
      d.all_room[q] = headroom(get(all_peak[q]), total(static_cast<quantity>(q)));
      d.all_high[q] = std::max(d.all_high[q], d.all_room[q]);
    }
    const auto now = cached_now();
    for (unsigned k = 0; k < 3; ++k) {
      d.cached_room[k] = headroom(get(cached_peak[k]), now[k]);
      d.cached_high[k] = std::max(d.cached_high[k], d.cached_room[k]);
    }
    d.drop_bound();
  }

  // Each peak at least its figure now: the end of a change published without peaks
  // (publish(d, false)) is a boundary.
  void raise_to_current() noexcept
  {
    std::lock_guard g{mu};
    for (std::size_t i = 0; i < value.size(); ++i) raise(peak[i], get(value[i]));
    for (unsigned q = 0; q < q_count; ++q) raise(all_peak[q], total(static_cast<quantity>(q)));
    raise_cached();
  }

  // Peaks restart from the current figures (caller holds every cache lock, deltas published).
  void reset_peaks() noexcept
  {
    for (std::size_t i = 0; i < value.size(); ++i) set(peak[i], get(value[i]));
    for (unsigned q = 0; q < q_count; ++q) set(all_peak[q], total(static_cast<quantity>(q)));
    for (auto& p : cached_peak) set(p, std::numeric_limits<std::int64_t>::min());
    raise_cached();
  }
  // Totals (allocated / freed) restart; current figures stay (caller holds every cache lock,
  // deltas published).
  void reset_totals() noexcept
  {
    for (std::size_t p = 0; p < 2; ++p) {
      for (unsigned q = 0; q < q_count; ++q) {
        set(added[p * 8 + q], 0);
        base[p][q] = get(value[p * 8 + q]);
      }
    }
    reset_peaks();
  }
};

// A live block of either pool: a record (large) or a segment and a unit (small).
struct block_ref {
  block* large = nullptr;
  small_segment* seg = nullptr;
  unsigned unit = 0;
  [[nodiscard]] bool found() const noexcept { return large != nullptr || seg != nullptr; }
};

struct stream_cache {
  stream_cache(native_stream s, const segment_table& t, const allocator_config& cfg)
      : stream{s}, mu{cfg.biased_locks}, small{t},
        reuse_cap{static_cast<std::uint32_t>(cfg.small_reuse_bytes >> k_unit_shift)},
        home{cfg.stats_batch}
  {
  }
  // Its stream: a pool's changes when a capture on another takes it up, a closed stream's
  // cache's when a new stream takes it over, none of its blocks in use (take_spare; under
  // its lock and registry_mu's unique lock both).
  native_stream stream;
  // Its stream was closed (stream_registry) and nothing reopened it since (an allocation
  // here, or a free here on a live stream with the handle): what the cache holds was last
  // used before `fence`. Reopening waits for the fence on the new stream (one the backend
  // gave the closed one's handle); a steal waits for it instead of synchronising the
  // device. Here, on the line of `stream` and the lock's words, which every free reads.
  bool closed = false;
  // A released capture pool's cache (closed since finish_release, no fence: the device
  // was idle then) whose `stream`, the last capture's, may still live: a block of it
  // still allocated then and freed later is ordered on that stream's work (a named free
  // on any stream, an unnamed one on `stream`), which the missing fence does not cover.
  // Cleared, with a fence, when that stream is destroyed (stream_closing).
  // Atomic: stream_closing reads it without the lock first (fence_released), so that a
  // destruction need not lock every cache; written under the lock.
  std::atomic<bool> released{false};
  // The order of steals (impl::order_steal). steal_gen: 1 + the events recorded on this
  // cache's stream for steals from it; a free stamps the memory it returns with it (a
  // dense segment's freed_gen, a free linked block's `requested`), so event n covers every
  // free stamped n or less. waited: the events of other caches' streams this cache's
  // stream waited for (cache id, steal_gen at the record), cleared when its stream changes.
  std::uint64_t steal_gen = 1;
  // Frees stamped idle_gen or less are done on the device, for every stream: a query found
  // this cache's stream with no work left after them (order_steal), a fact about the
  // stream's past that no later wait or change of stream undoes (0: none known).
  std::uint64_t idle_gen = 0;
  const std::uint64_t id = next_id();
  struct waited_on {
    std::uint64_t cache = 0;
    std::uint64_t gen = 0;
  };
  std::array<waited_on, 4> waited{};
  unsigned waited_next = 0;
  // The remembered wait for an event of cache `cache`'s stream, or nullptr.
  waited_on* wait_for(std::uint64_t cache) noexcept
  {
    for (auto& w : waited) {
      if (w.cache == cache) return &w;
    }
    return nullptr;
  }
  const waited_on* wait_for(std::uint64_t cache) const noexcept
  {
    return const_cast<stream_cache*>(this)->wait_for(cache);
  }
  // Its stream's earlier waits order another stream's work (a new stream, a reopen, a
  // capture: captured work runs where the graph is launched, after none of them).
  void forget_waits() noexcept
  {
    waited = {};
    waited_next = 0;
  }
  // The cache serves stream s from now on (caller holds the lock).
  void set_stream(native_stream s) noexcept
  {
    stream = s;
    forget_waits();
  }
  static std::uint64_t next_id() noexcept
  {
    static std::atomic<std::uint64_t> ids{0};
    return ids.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  cache_mutex mu;
  std::array<free_index, 2> pools;           // free linked blocks: [0] large, [1] small
  small_free_index small;                    // free blocks of dense small segments
  // Freed dense blocks kept unmerged for the next request of their size
  // (allocator_config::small_reuse_bytes): per size in units, a list linked through the
  // entries' fnext (state free, flags head | split | reuse, not indexed, their free bits
  // clear, so no neighbour merges them); reuse_units: their units in all, at most reuse_cap.
  std::array<std::uint32_t, k_reuse_sizes> reuse = [] {
    std::array<std::uint32_t, k_reuse_sizes> a{};
    a.fill(k_nil);
    return a;
  }();
  std::uint32_t reuse_units = 0;
  const std::uint32_t reuse_cap;             // allocator_config::small_reuse_bytes in units
  segment* segments = nullptr;               // linked segments
  segment* growing = nullptr;                // its expandable segment, which grows (one of `segments`)
  hole_index holes;                          // k_unmapped blocks of its segments, by room
  std::vector<std::pair<std::uintptr_t, small_segment*>> small_dir;  // small segments by address
  std::vector<std::pair<native_event, block_ref>> pending;
  // The fence of a closed cache (see `closed`): an event at its stream's last work (nullptr:
  // complete).
  native_event fence = nullptr;
  block* spare = nullptr;  // recycled block records, linked through `next`
  // What release_block merges when the next block is not free: never linked into a
  // segment or indexed; its list is one nobody uses (level 63), its size 0 and it is not
  // counted split, so taking it out of the free index and absorbing it change nothing.
  block no_next = [] {
    block b;
    b.cls = 63 * 16 + 15;
    return b;
  }();
  // The block records this cache made, k_block_chunk to a heap allocation. A record moves
  // to another cache with its segment; all of them live as long as the allocator.
  std::vector<std::unique_ptr<block[]>> block_chunks;
  address_table<block, 9, 1024> live;  // the large blocks of this cache that are handed out, by address
  // The small segments by the 2 MiB frame their address falls in (+ 1): at most one starts
  // in a frame, so a pointer's segment is the one starting in its frame or the one before.
  address_table<small_segment, 0> small_frames;
  std::unordered_map<std::uintptr_t, std::vector<native_stream>> small_uses;  // record_stream
  // The linked blocks whose `uses` another stream was added to (has_uses set by uses_of):
  // what a stream's destruction looks through (forget_uses), not every live block.
  std::unordered_set<block*> listed;
  std::int64_t hits = 0;      // allocations served from this cache without growing
  // Where the operation under way counts its changes to the statistics: the delta of the
  // thread holding the lock (allocator_core::impl::lock_for_op), or `home` (readers of
  // every cache, a cache locked beside another). `home` whenever the lock is free (every
  // unlock puts it back), so no thread's delta is reached through an unlocked cache.
  stat_delta home;
  stat_delta* delta = &home;
  // A graph capture pool's cache (the pool's id; 0: a stream's): only captures into that
  // pool allocate from it, and no other cache takes its memory until the pool is released.
  std::uint64_t capture_pool = 0;
  // Frees during a graph capture of blocks that other streams used: their events are
  // recorded once no capture is under way (no event may be queried during one).
  std::vector<std::pair<native_stream, block_ref>> deferred;
  // Such frees that found no host memory for `deferred`: the block is pending with one
  // wait, its flag in_place set and its uses kept in its list; after_captures finds it by
  // its flag (settle_in_place). So a free never fails for memory. The count of them here.
  std::size_t in_place = 0;
  // One of them could not even list the stream it was freed on: the device's work is
  // finished before they are settled.
  bool in_place_sync = false;
  // The segments it holds (linked and dense), changed under its lock and read without it
  // by a steal, which skips a cache holding none without locking it: a new stream's miss
  // tried every cache's lock in turn, 23 ns each, ~0.5 ms at 20 000 streams' caches.
  std::atomic<std::uint32_t> held{0};
  // The next on the allocator's list of caches a new stream may take over (impl::spares,
  // under registry_mu): its stream was closed, or its capture pool released, since it was
  // last taken from there. Whether it can be taken is decided then, under its lock
  // (reusable). On the list: this set, or the list's last (impl::on_spare_list).
  stream_cache* next_spare = nullptr;

  void recycle(block* b) noexcept
  {
    b->next = spare;
    spare = b;
  }
  // k_block_chunk more spare records in one heap allocation. May throw std::bad_alloc,
  // changing nothing.
  [[gnu::noinline]] void add_block_chunk()
  {
    // push_back grows geometrically and, when it throws, frees the new chunk
    block_chunks.push_back(std::make_unique<block[]>(k_block_chunk));
    block* chunk = block_chunks.back().get();
    for (std::size_t i = 0; i < k_block_chunk; ++i) recycle(&chunk[i]);
  }

  // The first small segment above address p.
  [[nodiscard]] auto small_after(std::uintptr_t p) const noexcept
  {
    return std::upper_bound(small_dir.begin(), small_dir.end(), p,
                            [](std::uintptr_t v, const auto& d) { return v < d.first; });
  }
  static std::uintptr_t frame_key(std::uintptr_t p) noexcept { return (p >> 21) + 1; }
  // The small segment holding `p`, or nullptr: one or two probes of small_frames, where a
  // binary search of small_dir took ~100 instructions and a chain of dependent loads per
  // free over 512 segments (a 1 GiB working set of 64 KiB blocks).
  [[nodiscard]] small_segment* small_segment_of(std::uintptr_t p) const noexcept
  {
    if (small_segment* s = small_frames.find(frame_key(p)); s != nullptr && p >= s->addr) return s;
    small_segment* s = small_frames.find(frame_key(p) - 1);
    return s != nullptr && p - s->addr < k_small_segment ? s : nullptr;
  }
  // Call reserve_small() first: then this cannot fail.
  void add_small(small_segment* s) noexcept
  {
    small_dir.insert(small_after(s->addr), {s->addr, s});
    held.fetch_add(1, std::memory_order_relaxed);
    small_frames.insert(frame_key(s->addr), s);
    segment_directory::set_owner(s->cache, this);
  }
  void reserve_small(std::size_t n = 1)
  {
    small_dir.reserve(small_dir.size() + n);
    small_frames.reserve(n);
  }
  // Moves the small segments of `from` that `pick` selects to this cache, keeping both
  // caches' indexes of them (small_dir in address order, small_frames); `moved(s)` runs on
  // each as it moves (both caches locked). Call reserve_small(n) for them first: then this
  // cannot fail.
  template <class Pick, class Moved>
  void take_small_from(stream_cache& from, Pick pick, Moved moved) noexcept
  {
    const auto mid = static_cast<std::ptrdiff_t>(small_dir.size());
    std::erase_if(from.small_dir, [&](const auto& d) {
      small_segment* s = d.second;
      if (!pick(*s)) return false;
      from.small_frames.erase(frame_key(s->addr));
      small_dir.push_back(d);  // capacity reserved
      held.fetch_add(1, std::memory_order_relaxed);
      from.held.fetch_sub(1, std::memory_order_relaxed);
      small_frames.insert(frame_key(s->addr), s);
      segment_directory::set_owner(s->cache, this);
      moved(*s);
      return true;
    });
    std::inplace_merge(small_dir.begin(), small_dir.begin() + mid, small_dir.end());
  }
  void remove_small(small_segment* s) noexcept
  {
    auto it = std::lower_bound(small_dir.begin(), small_dir.end(), s->addr,
                               [](const auto& d, std::uintptr_t v) { return d.first < v; });
    if (it != small_dir.end() && it->second == s) {
      small_dir.erase(it);
      held.fetch_sub(1, std::memory_order_relaxed);
      small_frames.erase(frame_key(s->addr));
    }
  }
};

// A stream cache's lock (movable, may be empty), taken by allocator_core::impl::lock (or
// adopted). Giving it back ends the operation under way in the statistics (and publishes
// them when due), so a reader that takes the cache lock never sees an operation
// half-counted, and puts the cache's own delta back.
class cache_lock {
 public:
  cache_lock() = default;
  cache_lock(shared_stats& s, stream_cache& c, std::adopt_lock_t) noexcept : stats_{&s}, cache_{&c} {}
  cache_lock(cache_lock&& o) noexcept : stats_{o.stats_}, cache_{std::exchange(o.cache_, nullptr)} {}
  cache_lock(const cache_lock&) = delete;
  cache_lock& operator=(const cache_lock&) = delete;
  cache_lock& operator=(cache_lock&&) = delete;
  ~cache_lock()
  {
    if (cache_ != nullptr) give_back();
  }
  // Ends the operation under way on the cache (publishing when due) and gives back its
  // lock, leaving this empty. Inlined where the caller's code tells the compiler which
  // figures the operation changed (the common free's); the destructor calls it out of line.
  [[gnu::always_inline]] void unlock() noexcept
  {
    stat_delta& d = *cache_->delta;
    if (d.op != 0) {
      d.end_op();
      if ((d.due & stat_delta::k_settle) != 0) [[unlikely]] {
        stats_->settle(d);
      }
    }
    stream_cache* const c = std::exchange(cache_, nullptr);
    c->delta = &c->home;
    c->mu.unlock();
  }
  [[nodiscard]] stream_cache& cache() const noexcept { return *cache_; }
 private:
  [[gnu::noinline]] void give_back() noexcept { unlock(); }
  shared_stats* stats_ = nullptr;
  stream_cache* cache_ = nullptr;
};

std::atomic<std::uint64_t> next_allocator_id{1};

// Graph captures under way in the process, per backend (by device_kind): CUDA's global
// capture mode forbids unsafe calls on every thread, whatever the device or allocator.
std::array<std::atomic<int>, 4> process_captures{};

// A thread's statistics delta on one allocator: what its operations there changed and have
// not published, whichever caches they were on (a change of stream costs nothing: where
// the deltas were the caches', a thread's changes moved with it by swapping two caches'
// deltas under both their locks). Touched by its thread under the lock of the cache it
// works on, or by a reader holding every cache's lock, never otherwise. Owned by the
// allocator; a later thread takes it over once its thread has exited (published first),
// or, past k_spare_stats free ones, it goes.
struct alignas(64) thread_stats {
  explicit thread_stats(std::size_t stats_batch) noexcept : delta{stats_batch} {}
  stat_delta delta;
  stream_cache* last = nullptr;  // the cache of the thread's last operation (its thread's)
  std::uint64_t thread = 0;      // its thread's token; 0: free (under impl::stats_mu)
};

// The stream caches a thread used last (a thread often alternates between a few streams,
// e.g. compute and copies): found without the registry's lock. An entry is valid for the
// allocator whose id it holds (ids are never reused; caches live as long as their allocator).
struct thread_caches {
  struct entry {
    std::uint64_t owner = 0;
    native_stream stream = nullptr;
    stream_cache* cache = nullptr;
  };
  std::array<entry, 4> entries{};  // the one used last first, then the others (no order kept)
  // Per allocator (the last four this thread used): the thread's statistics there.
  struct op_entry {
    std::uint64_t owner = 0;
    thread_stats* stats = nullptr;
  };
  std::array<op_entry, 4> ops{};  // the one used last first, then in order of use
  // Both kept most recent first (a miss moves its entry to the front, a new one replaces
  // the least recent), so the fast paths read fixed offsets from the thread pointer.

  // Moves a[k] to the front, the ones before it back by one: a plain shift of at most three
  // entries (std::rotate's general cycle algorithm cost ~70 instructions per operation of a
  // thread alternating among four streams, where every operation moves an entry).
  template <class A>
  static void to_front(A& a, std::size_t k) noexcept
  {
    static_assert(std::tuple_size_v<A> == 4);
    const auto moved = a[k];
    if (k >= 3) a[3] = a[2];
    if (k >= 2) a[2] = a[1];
    if (k >= 1) a[1] = a[0];
    a[0] = moved;
  }
};
// initial-exec: a fixed offset from the thread pointer, where the default model for a shared
// library calls __tls_get_addr on every allocation and free (176 bytes of the 512 of static
// TLS that glibc keeps spare for libraries loaded later, e.g. by Python).
static_assert(sizeof(thread_caches) <= 176);
[[gnu::tls_model("initial-exec")]] thread_local thread_caches tl_caches;

// What a thread found lately where its first look misses, by hash of a key (direct-mapped,
// 64 slots; a newer key takes an older one's slot). Read only when those first looks miss,
// so in the default TLS model (not in the static TLS that initial-exec draws on, of which a
// library loaded with dlopen gets little).
template <class Entry>
struct recent_table {
  std::array<Entry, 64> slots{};
  Entry& slot(std::uintptr_t key) noexcept
  {
    // (keys are pointers or address frames: Fibonacci hashing, the top six bits)
    return slots[static_cast<std::size_t>((key * std::uintptr_t{0x9E3779B97F4A7C15ULL}) >> 58U)];
  }
};

// The streams beyond tl_caches' four (entries valid as tl_caches.entries are): a thread that
// works on more than four streams finds their caches here, without the registry's shared
// lock, whose count of readers is one cache line that every thread writes twice (16
// threads freeing the blocks of 16 streams, named, took it at 3 of 4 frees).
thread_local recent_table<thread_caches::entry> tl_streams;

// The cache where an unnamed free of an address in a 2 MiB frame (k_small_segment) found
// its block (owner: the allocator's id). A guess, checked under that cache's lock: a live
// block's segment never changes cache, and a guess that misses costs one lock. So a thread
// freeing blocks of many streams' segments asks the directory of segments (a shared lock,
// one line for all threads) once a frame, not once a free.
struct frame_hint {
  std::uint64_t owner = 0;
  std::uintptr_t frame = 0;
  stream_cache* cache = nullptr;
};
thread_local recent_table<frame_hint> tl_frames;

}  // namespace

// Where other processes count themselves as importers of this allocator's exported
// ordinary segments (ipc_mapping: +1 before its backend mapping opens, -1 after it closes)
// and hold a read lock (an open-file-description lock on the slot's 8 bytes, kept while
// they map the segment, dropped by the kernel when such a process dies): a memfd of 8-byte
// counters, one slot per segment ever exported, never reused (a late importer of a released
// segment touches only that segment's stale slot), mapped here in chunks. Made at the first
// export; importers reach it as /proc/PID/fd/FD. Thread-safe.
class importer_counts {
 public:
  struct slot {
    std::int64_t* count = nullptr;
    std::uint32_t index = 0;
  };
  importer_counts() = default;
  importer_counts(const importer_counts&) = delete;
  importer_counts& operator=(const importer_counts&) = delete;
  ~importer_counts()
  {
    for (void* c : chunks_) ::munmap(c, k_chunk_bytes);
    if (fd_ >= 0) ::close(fd_);
  }
  // A new slot, count 0. depot::error when the file cannot be made or grown (nothing changed).
  slot take(const device_id& dev)
  {
    std::lock_guard g{mu_};
    const auto fail = [&](const std::string& what) {
      const int e = errno;
      throw error("depot: " + dev.to_string() + " caching allocator: ipc_export: could not " + what +
                      " the importer-count file: " + std::strerror(e),
                  "memfd", __FILE__, __LINE__, e, "ipc");
    };
    if (fd_ < 0) {
      fd_ = ::memfd_create("depot-ipc-importers", MFD_CLOEXEC);
      if (fd_ < 0) fail("make");
    }
    if (next_ == std::numeric_limits<std::uint32_t>::max()) {
      errno = EOVERFLOW;
      fail("take a slot of");
    }
    const std::uint32_t i = next_;
    const std::size_t chunk = i / k_chunk;
    if (chunk == chunks_.size()) {
      chunks_.reserve(chunk + 1);  // may throw: nothing grown yet
      if (::ftruncate(fd_, static_cast<off_t>((chunk + 1) * k_chunk_bytes)) != 0) fail("grow");
      void* m = ::mmap(nullptr, k_chunk_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                       static_cast<off_t>(chunk * k_chunk_bytes));
      if (m == MAP_FAILED) fail("map");
      chunks_.push_back(m);
    }
    ++next_;
    return {static_cast<std::int64_t*>(chunks_[chunk]) + i % k_chunk, i};
  }
  [[nodiscard]] int fd() const noexcept { return fd_; }  // after a take()
  void fork_hold() noexcept { mu_.lock(); }  // (allocator_core::impl::fork_hold)
  void fork_release(bool child) noexcept { release_after_fork(mu_, child); }
  // The processes that counted themselves in at slot `count` and not out (one killed
  // before it could stays counted).
  static std::int64_t load(std::int64_t* count) noexcept
  {
    return std::atomic_ref<std::int64_t>{*count}.load(std::memory_order_acquire);
  }
  // Whether a live process holds slot `slot` of file `fd` (its read lock): what releasing
  // decides by, so an importer that died without detaching does not pin the segment.
  static bool held(int fd, std::uint32_t slot) noexcept
  {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = static_cast<off_t>(std::uint64_t{slot} * sizeof(std::int64_t));
    l.l_len = sizeof(std::int64_t);
    if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return true;  // cannot tell: keep the segment
    return l.l_type != F_UNLCK;
  }

 private:
  static constexpr std::size_t k_chunk_bytes = std::size_t{64} << 10;  // a multiple of any page size
  static constexpr std::size_t k_chunk = k_chunk_bytes / sizeof(std::int64_t);
  std::mutex mu_;
  int fd_ = -1;
  std::uint32_t next_ = 0;
  std::vector<void*> chunks_;
};

struct allocator_core::impl {
  impl(std::unique_ptr<upstream_resource> u, allocator_config c, bool a)
      : up{std::move(u)}, cfg{(c.validate(), c)}, async{a}, dev{up->device()}, streams_of{up->stream_device()}
  {
    // Divisions by a request's power-of-two interval (its floor's exponent): one number
    // for every interval above 1 MiB, or the list's, where an interval up to 2^k covers the
    // floors 2^lo .. 2^(k-1) (a request of exactly 2^k rounds to itself under any division).
    if (cfg.roundup_power2_intervals.empty()) {
      for (unsigned f = 20; f < 64; ++f) divisions[f] = static_cast<std::uint8_t>(cfg.roundup_power2_divisions);
    } else {
      unsigned lo = 20;
      for (const auto& iv : cfg.roundup_power2_intervals) {
        const unsigned hi = iv.up_to == k_unlimited ? 64U : static_cast<unsigned>(std::countr_zero(iv.up_to));
        for (; lo < hi; ++lo) divisions[lo] = static_cast<std::uint8_t>(iv.divisions);
      }
    }
    rounds = std::any_of(divisions.begin(), divisions.end(), [](std::uint8_t d) { return d > 1; });
    const std::size_t total = up->memory().total_bytes;
    limit = cfg.per_process_memory_fraction >= 1.0
                ? k_unlimited
                : static_cast<std::size_t>(static_cast<double>(total) * cfg.per_process_memory_fraction);
    if (cfg.trace_capacity > 0) set_trace_capacity(cfg.trace_capacity);
    if (cfg.expandable_segments) {
      // A page the size classes' rounding (2 MiB) divides; addresses for the whole allowed total.
      if (const std::size_t g = up->vm_page(); g != 0) {
        vm_page = (std::max(g, k_large_round) + g - 1) / g * g;
        const std::size_t allowed = limit != k_unlimited ? limit : total;
        vm_span = std::max((allowed + vm_page - 1) / vm_page * vm_page, vm_page);
      }
    }
    // last: nothing after it throws. Also for a synchronous backend, whose closed caches
    // (no fence: nothing is queued) give all of their free segments at once.
    stream_registry::watch(&closing_watch);
  }

  ~impl()
  {
    stream_registry::unwatch(&closing_watch);  // first: no closing runs on what follows
    // Destroyed during a capture (the caller's capture goes on without it): its captures no
    // longer count, or every allocator of the backend would act as in one for good.
    for (const capture_state& p : pools) {
      if (p.capturing) captures().fetch_sub(1);
    }
    // The device's work first: pending blocks' streams, and the streams whose freed blocks
    // are free at once, may still use memory that goes back below (cudaFree would wait;
    // unmapping expandable pages would not). Then nothing waits any more (finish_uses).
    if (async) {
      try {
        up->synchronize_device();
      } catch (...) {  // the device failed: nothing runs on it any more
      }
      settled = true;
    }
    for (auto& [marker, fence] : closed_fences) {
      if (fence != nullptr) up->destroy_event(fence);
    }
    // Give every segment back; pending events first.
    for (auto& c : caches) {
      for (auto& [e, b] : c->pending) up->destroy_event(e);
      c->pending.clear();
      if (c->fence != nullptr) up->destroy_event(std::exchange(c->fence, nullptr));
      for (segment* s = c->segments; s != nullptr;) {
        segment* next = s->lnext;
        give_back(*s);  // (its block records: chunks)
        delete s;
        s = next;
      }
      for (auto& [addr, s] : c->small_dir) up->deallocate(reinterpret_cast<void*>(addr), k_small_segment);
    }
  }

  std::unique_ptr<upstream_resource> up;
  allocator_config cfg;
  std::array<std::uint8_t, 64> divisions{};  // by floor(log2(size)): cfg's roundup divisions
  bool rounds = false;                        // some division above 1
  bool async;
  bool settled = false;  // being destroyed, the device's work done: unmapping waits for nothing
  // Some block ever listed another stream (record_stream, a free on another stream): until
  // then a stream's destruction need not look for blocks that list it (forget_uses).
  // Relaxed: a listing that happened before a stream's destruction is seen by it (one that
  // races with it uses a stream being destroyed, which is the caller's error).
  std::atomic<bool> uses_listed{false};
  // Streams destroyed during a graph capture while a list named them (forget_uses): the host
  // may not wait for their work then, so the lists (blocks' uses, deferred frees) name a
  // marker in their place (bit 63 set, which no handle has) with a fence recorded on the
  // stream before it went (null: the whole device, if the stream refused it). When the last
  // capture ends the host waits for the fences and the lists forget the markers
  // (after_captures); a free outside a capture before that waits for the fence itself. A
  // stream made meanwhile with the old handle is another stream, listed by its handle.
  std::mutex closed_mu;
  std::unordered_map<native_stream, native_event> closed_fences;  // marker -> fence
  std::uint64_t closed_count = 0;                                  // markers made (under closed_mu)
  static constexpr std::uintptr_t k_closed_marker = std::uintptr_t{1} << 63U;
  static bool is_marker(native_stream s) noexcept
  {
    return (reinterpret_cast<std::uintptr_t>(s) & k_closed_marker) != 0;
  }
  device_id dev;
  device_id streams_of;  // whose streams order the work (up->stream_device())
  std::uint64_t id = next_allocator_id.fetch_add(1);
  // What the threads' stream entries (thread_caches::entries) are valid for: `id` at first,
  // a new number of the same sequence whenever a stream's cache changes (a graph capture
  // begins or ends; written under registry_mu), so no thread keeps a stale entry.
  std::atomic<std::uint64_t> route{id};
  // A stream's cache changed (under registry_mu's unique lock): every thread's entries go.
  void new_route() noexcept { route.store(next_allocator_id.fetch_add(1), std::memory_order_release); }
  std::size_t limit = k_unlimited;
  std::size_t vm_page = 0;  // expandable segments: the page they map (0: they are off)
  std::size_t vm_span = 0;  // and the addresses each reserves

  segment_table small_table;
  segment_directory directory;  // every segment here, for frees that find their block nowhere they look first
  mutable std::shared_mutex registry_mu;
  std::unordered_map<native_stream, stream_cache*> by_stream;
  std::vector<std::unique_ptr<stream_cache>> caches;
  // Caches whose streams were closed (or whose capture pools were released), oldest first,
  // linked through next_spare (under registry_mu): a new stream takes one with no block in
  // use over, free segments and all (take_spare), instead of making a cache, so a code that
  // makes and destroys streams keeps a bounded number of caches (each ~48 KB, and a steal
  // looks through all of them) and finds its free memory without a miss.
  stream_cache* spares = nullptr;
  stream_cache* spares_tail = nullptr;

  // Graph capture pools (under registry_mu). While a pool captures, its cache is by_stream's
  // entry for the capturing stream (`displaced`: the entry it replaced, nullptr: none).
  struct capture_state {
    std::uint64_t pool = 0;
    stream_cache* cache = nullptr;
    native_stream stream = nullptr;  // capturing on it now (`capturing`)
    bool capturing = false;
    bool releasing = false;  // its last use given back: release under way, or due when captures end
    int users = 1;           // begin_capture calls into it not yet given back (release_capture_pool)
    stream_cache* displaced = nullptr;
  };
  std::vector<capture_state> pools;
  std::uint64_t next_pool = 1;
  // The pool with uses left whose id is `pool`; the pool capturing on `s`. nullptr: none.
  capture_state* live_pool(std::uint64_t pool) noexcept
  {
    const auto it = std::find_if(pools.begin(), pools.end(),
                                 [&](const capture_state& p) { return p.pool == pool && !p.releasing; });
    return it == pools.end() ? nullptr : &*it;
  }
  capture_state* capturing_on(native_stream s) noexcept
  {
    const auto it =
        std::find_if(pools.begin(), pools.end(), [&](const capture_state& p) { return p.capturing && p.stream == s; });
    return it == pools.end() ? nullptr : &*it;
  }
  // Captures under way on this allocator's backend, by any allocator (process_captures):
  // while any is, nothing here queries or waits for an event, synchronises, frees upstream
  // memory or takes another cache's memory (each invalidates a capture in CUDA's global
  // mode or needs an event), and frees' events wait (stream_cache::deferred). Each such
  // call is made under a cache lock or grow_mu after this reads false, and a capture
  // begins only after every allocator of the backend gave those locks back once (drain()).
  std::atomic<int>& captures() const noexcept
  {
    return process_captures[static_cast<std::size_t>(streams_of.kind) % process_captures.size()];
  }
  bool capturing() const noexcept { return captures().load(std::memory_order_acquire) != 0; }
  // Waits until the operations under way here are done (their locks given back once).
  // Allocates nothing (a capture has begun when it runs, so it must not fail for memory):
  // the caches' locks are taken a chunk at a time, one barrier per chunk for the biases it
  // revokes, and given back before the next chunk's; each need only be taken once.
  void drain()
  {
    const std::lock_guard g{grow_mu};
    std::shared_lock r{registry_mu};
    std::array<cache_mutex*, 64> chunk{};
    for (std::size_t i = 0; i < caches.size();) {
      std::size_t k = 0;
      for (; k < chunk.size() && i < caches.size(); ++k, ++i) chunk[k] = &caches[i]->mu;
      cache_mutex::lock_many(chunk.data(), k);
      for (std::size_t j = 0; j < k; ++j) chunk[j]->unlock();
    }
  }

  std::mutex grow_mu;

  // Changes to these figures by an operation on a cache are gathered in the delta the
  // cache points at (its thread's, or the cache's own: stat_delta's count_*, add_split,
  // sub_split, sub_active, change_segments; caller holds c.mu), published when due as c.mu
  // is given back, or before any reader looks. mutable: readers (stats(), snapshots)
  // publish every delta before they read, which changes no figure they could see.
  mutable shared_stats figures;

  // Locks `c` for an allocation or free, or any work of this thread on c alone (no cache
  // lock held): its changes to the statistics count in the thread's delta here
  // (thread_stats), taken at the thread's first operation here (or again after a fifth
  // allocator took its entry), so one thread's unpublished changes are in one delta
  // whatever its streams, and its peaks exact.
  [[gnu::always_inline]] void lock_for_op(stream_cache& c) noexcept
  {
    const thread_caches::op_entry& e = tl_caches.ops[0];
    if (e.owner != id) [[unlikely]] {
      lock_for_first_op(c);
      return;
    }
    thread_stats* const t = e.stats;
    c.mu.lock();
    c.delta = &t->delta;
    t->last = &c;
  }
  // lock_for_op where this allocator's entry is not the thread's first. Without host
  // memory for a new thread_stats, the operation counts in the cache's own delta (a free
  // must not fail for host memory: tests/alloc_failure.cpp), and the next one tries again.
  [[gnu::noinline]] void lock_for_first_op(stream_cache& c) noexcept
  {
    thread_stats* const t = stats_to_front();
    c.mu.lock();
    if (t == nullptr) return;
    c.delta = &t->delta;
    t->last = &c;
  }
  // The cache lock of lock_for_op, as a cache_lock.
  [[nodiscard]] cache_lock lock_cache(stream_cache& c) noexcept
  {
    lock_for_op(c);
    return cache_lock{figures, c, std::adopt_lock};
  }
  // Cache c, locked by this thread otherwise than by lock_for_op, counts in the thread's
  // delta (where it has one here) until given back.
  void count_as_mine(stream_cache& c) noexcept
  {
    const thread_caches::op_entry& e = tl_caches.ops[0];
    if (e.owner == id) c.delta = &e.stats->delta;
  }
  // Gives back a lock taken by lock_for_op on which nothing was counted.
  static void unlock_unused(stream_cache& c) noexcept
  {
    c.delta = &c.home;
    c.mu.unlock();
  }
  // This allocator's entry of the thread's last operations to the front, with its
  // thread_stats: found in the entries, else the thread's among this allocator's (it was
  // here before a fifth allocator took its entry), else a free one or a new one, in the
  // least recent allocator's entry's place (that allocator's thread_stats stays the
  // thread's, published by its readers or as the thread exits). Null, the entries as they
  // were, without host memory for a new one (no cache locked).
  thread_stats* stats_to_front() noexcept
  {
    thread_caches& tc = tl_caches;
    std::size_t k = 0;
    while (k < tc.ops.size() && tc.ops[k].owner != id) ++k;
    if (k == tc.ops.size()) {  // the least recent allocator's entry goes
      thread_stats* const t = claim_stats();
      if (t == nullptr) return nullptr;
      k = tc.ops.size() - 1;
      tc.ops[k] = thread_caches::op_entry{id, t};
      try {
        publish_at_thread_exit();
      } catch (...) {  // (its guard's first use: no memory for the thread's TLS block)
      }
    }
    thread_caches::to_front(tc.ops, k);
    return tc.ops[0].stats;
  }
  thread_stats* claim_stats() noexcept
  {
    const std::uint64_t me = thread_token();
    const std::lock_guard g{stats_mu};
    thread_stats* free = nullptr;
    for (const auto& t : thread_deltas) {
      if (t->thread == me) return t.get();
      if (t->thread == 0 && free == nullptr) free = t.get();
    }
    if (free == nullptr) {
      try {
        thread_deltas.push_back(std::make_unique<thread_stats>(cfg.stats_batch));
      } catch (const std::bad_alloc&) {
        return nullptr;
      }
      free = thread_deltas.back().get();
    }
    free->thread = me;
    return free;
  }
  // A number no other thread of the process has (threads' thread_stats are told apart by
  // it; a TLS address is reused by later threads).
  static std::uint64_t thread_token() noexcept
  {
    static std::atomic<std::uint64_t> next{1};
    thread_local std::uint64_t token = 0;
    if (token == 0) token = next.fetch_add(1, std::memory_order_relaxed);
    return token;
  }
  // Arms (once per thread) the publishing, as the thread exits, of its thread_stats on
  // each live allocator, which are then free for later threads: a thread's changes stay
  // unpublished until it works on, and a thread that exits works on no more, so the shared
  // figures would lack them until stats() (whose publishing is exact), and the peaks of
  // threads after it counted its last frees as still allocated (depot-bench alloc, one
  // thread on 4 streams, new threads each run: an allocated peak of 1 980 MiB for a true
  // 1 032, above the reserved peak). A thread_local with a destructor is reached through a
  // guard: here, on a thread's first operation on an allocator, not on the hot path's
  // tl_caches. Under the allocators' list lock, so an allocator being destroyed (delisted
  // first) is either published or not seen.
  static void publish_at_thread_exit()
  {
    struct at_exit {
      ~at_exit()
      {
        fork_list& l = forks();
        const std::lock_guard g{l.mu};
        for (impl* m : l.all) {
          m->close_per_thread_stream();
          m->publish_and_leave();
        }
        tl_caches.ops.fill({});
      }
    };
    static thread_local at_exit hook;
    (void)&hook;
  }
  // This thread's thread_stats here, published (no cache lock held) and given up for a
  // later thread (the thread exits). Under a cache's lock, as every change to it: readers
  // hold every one (taken without stats_mu held: readers take stats_mu under the caches').
  void publish_and_leave() noexcept
  {
    const std::uint64_t me = thread_token();
    thread_stats* mine = nullptr;
    {
      const std::lock_guard g{stats_mu};
      for (const auto& t : thread_deltas) {
        if (t->thread == me) mine = t.get();
      }
    }
    if (mine == nullptr) return;
    if (mine->last != nullptr) {  // (none: no operation yet, nothing counted)
      mine->last->mu.lock();
      figures.publish(mine->delta);
      mine->last->mu.unlock();
    }
    mine->last = nullptr;
    const std::lock_guard g{stats_mu};
    mine->thread = 0;
    // Kept for a later thread, unless k_spare_stats are free already: then it goes (no
    // cache points at it: an unlocked cache's delta is its own).
    std::size_t spare = 0, at = 0;  // free records (this one too); this one's index
    for (std::size_t i = 0; i < thread_deltas.size(); ++i) {
      spare += thread_deltas[i]->thread == 0 ? 1 : 0;
      if (thread_deltas[i].get() == mine) at = i;
    }
    if (spare <= k_spare_stats) return;
    figures.forget(mine->delta);
    std::swap(thread_deltas[at], thread_deltas.back());
    thread_deltas.pop_back();
  }
  // Free thread_stats (~1 KB each) an allocator keeps for later threads: 10 000 threads at
  // work at once, then gone, leave 64.
  static constexpr std::size_t k_spare_stats = 64;
  // Every thread's delta (caller holds every cache lock).
  void publish_threads() const noexcept
  {
    const std::lock_guard g{stats_mu};
    for (const auto& t : thread_deltas) figures.publish(t->delta);
  }
  // Every thread's delta and every cache's own (caller holds every cache lock).
  void publish_all() const noexcept
  {
    publish_threads();
    for (const auto& c : caches) figures.publish(c->home);
  }
  // The threads' statistics deltas (thread_stats), appended (under stats_mu, taken after
  // any cache lock and before figures.mu), a free one removed as its thread exits where
  // k_spare_stats others are free.
  mutable std::mutex stats_mu;
  std::vector<std::unique_ptr<thread_stats>> thread_deltas;
  std::atomic<std::int64_t> misses{0}, retries{0}, ooms{0};
  // memory_stats::num_segments_moved, num_move_events, num_move_syncs (steal(),
  // order_steal(): miss path)
  std::atomic<std::int64_t> moves{0}, move_events{0}, move_syncs{0};
  // set_oom_handler's handler (null: none), copied under oom_mu and called without it.
  std::mutex oom_mu;
  std::shared_ptr<const oom_handler> on_oom;
  std::int64_t hits_base = 0;  // hits before the last reset_memory_stats (under all locks)
  importer_counts importers;

  std::atomic<bool> tracing{false};
  mutable std::mutex trace_mu;
  std::vector<trace_event> ring;
  std::size_t ring_next = 0;
  std::size_t ring_count = 0;

  // ---- helpers ---------------------------------------------------------------------------

  std::size_t round_size(std::size_t n) const noexcept
  {
    std::size_t size = (n + k_align - 1) / k_align * k_align;
    if (rounds && size > k_small_request) {
      if (const unsigned div = divisions[std::bit_width(size) - 1]; div > 1) {
        const std::size_t floor2 = std::bit_floor(size);
        const std::size_t step = std::max(floor2 / div, k_align);
        size = (size + step - 1) / step * step;
      }
    }
    return size;
  }

  stream_cache& cache_for(native_stream s) { return *cache_ptr<true>(s); }
  // The cache of `s`: with Create, made when there is none (may throw std::bad_alloc, changing
  // nothing); without, nullptr then (a free's hint: a stream with no cache holds no block).
  template <bool Create>
  [[gnu::always_inline]] stream_cache* cache_ptr(native_stream s)
  {
    thread_caches& tc = tl_caches;
    const std::uint64_t r = route.load(std::memory_order_relaxed);
    if (tc.entries[0].owner == r && tc.entries[0].stream == s) [[likely]] {
      return tc.entries[0].cache;
    }
    // The thread's other recent streams here, inline, the one found swapped to the front (a
    // call and a shift of up to three entries cost a thread alternating among four streams
    // ~60 instructions per operation; the order of the other three is not kept). Each
    // entry's stream and owner are compared and its cache picked by a conditional move, no
    // branch each (which one matches is the caller's order of streams: a loop that stopped
    // at it mispredicted about once per operation there) and no index on the way to the
    // cache, whose address everything the operation does next waits for (an index from
    // countr_zero, then a load at it, cost one thread on 4 streams ~4 ns a pair more at
    // requests to 64 MiB with moves off: 30-40 interleaved runs on the development VM; an
    // H100 host's noise hid it); the swap's stores are off that path. No match
    // (an entry of the same stream for another allocator, or one from before a capture
    // changed the route): the long way (recent_cache).
    static_assert(std::tuple_size_v<decltype(tc.entries)> == 4);
    stream_cache* c = nullptr;
    std::size_t at = 0;
    for (std::size_t k = 1; k < 4; ++k) {
      const thread_caches::entry& e = tc.entries[k];
      const std::uint64_t differs =
          (reinterpret_cast<std::uintptr_t>(e.stream) ^ reinterpret_cast<std::uintptr_t>(s)) | (e.owner ^ r);
      c = select_if(differs == 0, e.cache, c);
      at = differs == 0 ? k : at;
    }
    if (c == nullptr) [[unlikely]] return recent_cache(s, r, Create);
    tc.entries[at] = tc.entries[0];
    tc.entries[0] = thread_caches::entry{r, s, c};
    return c;
  }
  // cache_for() when its first match by stream was not this allocator's: both fields of the
  // other three entries compared, then the registry (find_cache).
  [[gnu::noinline]] stream_cache* recent_cache(native_stream s, std::uint64_t r, bool create)
  {
    thread_caches& tc = tl_caches;
    for (std::size_t k = 1; k < tc.entries.size(); ++k) {
      if (tc.entries[k].owner == r && tc.entries[k].stream == s) {
        std::swap(tc.entries[0], tc.entries[k]);
        return tc.entries[0].cache;
      }
    }
    return find_cache(s, create);
  }

  // cache_for() when none of the thread's recent streams here is `s`: the registry (or a new
  // cache), remembered first, in place of the last entry.
  [[gnu::noinline]] stream_cache* find_cache(native_stream s, bool create)
  {
    thread_caches& tc = tl_caches;
    stream_cache* c = nullptr;
    std::uint64_t valid_for = route.load(std::memory_order_relaxed);
    thread_caches::entry& slot = tl_streams.slot(reinterpret_cast<std::uintptr_t>(s));
    if (slot.owner == valid_for && slot.stream == s) {
      c = slot.cache;
    } else {
      std::shared_lock r{registry_mu};
      valid_for = route.load(std::memory_order_relaxed);
      if (auto it = by_stream.find(s); it != by_stream.end()) c = it->second;
    }
    if (c == nullptr && !create) return nullptr;
    if (c == nullptr) {
      // A closed stream's cache with no block in use taken over, else a new one: each step
      // that may throw std::bad_alloc comes before anything changes, or is undone (an entry
      // inserted first and left null by a failed allocation after it crashed the next
      // allocation on the stream: tests/alloc_failure.cpp).
      std::unique_lock w{registry_mu};
      if (auto it = by_stream.find(s); it != by_stream.end()) {
        c = it->second;
      } else {
        const auto placed = by_stream.try_emplace(s, nullptr).first;
        try {
          c = take_spare(s);
          if (c == nullptr) c = take_empty_raw(s);
          if (c == nullptr) {
            auto fresh = std::make_unique<stream_cache>(s, small_table, cfg);
            caches.reserve(caches.size() + 1);
            c = fresh.get();
            caches.push_back(std::move(fresh));  // (reserved)
          }
        } catch (...) {
          by_stream.erase(placed);
          throw;
        }
        placed->second = c;
      }
      valid_for = route.load(std::memory_order_relaxed);  // (take_spare changes it)
    }
    thread_caches::to_front(tc.entries, tc.entries.size() - 1);
    tc.entries[0] = thread_caches::entry{valid_for, s, c};
    slot = tc.entries[0];
    return c;
  }

  // Whether c is on the list of spares (caller holds registry_mu).
  bool on_spare_list(const stream_cache& c) const noexcept { return c.next_spare != nullptr || spares_tail == &c; }
  // c on the list of spares, last (caller holds registry_mu uniquely; c is on none).
  void list_spare(stream_cache& c) noexcept
  {
    c.next_spare = nullptr;
    (spares_tail != nullptr ? spares_tail->next_spare : spares) = &c;
    spares_tail = &c;
  }
  // Whether closed cache c (locked) can serve another stream as it is: none of its blocks
  // is allocated or waits for an event, so every segment it holds is whole free, last used
  // on its old stream before its fence.
  static bool reusable(const stream_cache& c) noexcept
  {
    if (!c.pending.empty() || !c.deferred.empty() || c.in_place != 0 || !c.listed.empty() || !c.small_uses.empty()) {
      return false;
    }
    for (const segment* s = c.segments; s != nullptr; s = s->lnext) {
      if (!s->whole_free()) return false;
    }
    return std::all_of(c.small_dir.begin(), c.small_dir.end(), [](const auto& d) { return d.second->whole_free(); });
  }
  // A spare cache with no block in use, made stream s's (caller holds registry_mu uniquely
  // and enters s in by_stream), or nullptr. Up to k_look of the oldest spares are looked at:
  // one reopened since (its stream's handle used again) leaves the list until it closes
  // again; one with a block allocated or waiting, or that a capture displaced, or whose lock
  // is busy goes to the end. Taken (adopt): free segments come along (a stream per phase
  // of a code finds the last phase's memory where it left it, in place of a miss and a
  // steal per kind): the cache stays closed with its fence, so the first allocation on s
  // waits for the old stream's last work on s (reopen), as a stream given the closed one's
  // handle does.
  stream_cache* take_spare(native_stream s) noexcept
  {
    constexpr int k_look = 8;
    for (int k = 0; k < k_look && spares != nullptr; ++k) {
      stream_cache* c = spares;
      spares = c->next_spare;
      if (spares == nullptr) spares_tail = nullptr;
      c->next_spare = nullptr;
      if (!c->mu.try_lock()) {
        list_spare(*c);
        continue;
      }
      if (!c->closed || c->capture_pool != 0) {  // reopened: listed again when it closes
        c->mu.unlock();
        continue;
      }
      if (displaced(*c) || !reusable(*c)) {
        c->mu.unlock();
        list_spare(*c);
        continue;
      }
      adopt(*c, s);
      return c;
    }
    return nullptr;
  }

  // A cache that holds nothing (no segment, no block waiting) of a raw handle (never
  // registered, so its stream's end is never known: it never closes), made stream s's
  // (caller holds registry_mu uniquely and enters s in by_stream), or nullptr. Steals empty
  // such caches: each new raw handle's miss takes the free segment the last one left.
  // Until this every raw handle ever seen kept its cache (~48 KB of host memory each: 976 MB
  // at 20 000, BENCHMARKS.md); now a code that makes and drops raw streams keeps a few. Its
  // old handle, used again, finds no cache and makes or takes one (adopt). Only caches
  // whose count of segments reads 0 are locked, with try_lock (a busy one is skipped).
  stream_cache* take_empty_raw(native_stream s) noexcept
  {
    for (const auto& p : caches) {
      stream_cache* c = p.get();
      if (c->held.load(std::memory_order_relaxed) != 0 || c->capture_pool != 0 || !c->mu.try_lock()) continue;
      const native_stream old = c->stream;
      const bool raw = !c->closed && !per_thread(old) && !is_marker(old) && !stream_lives(old);
      if (!raw || displaced(*c) || c->held.load(std::memory_order_relaxed) != 0 || !reusable(*c) || on_spare_list(*c)) {
        c->mu.unlock();
        continue;
      }
      adopt(*c, s);
      return c;
    }
    return nullptr;
  }
  // Whether a capture displaced cache c (caller holds registry_mu).
  bool displaced(const stream_cache& c) const noexcept
  {
    return std::any_of(pools.begin(), pools.end(), [&c](const capture_state& p) { return p.displaced == &c; });
  }
  // Locked cache c, which holds no block in use, made stream s's (take_spare,
  // take_empty_raw; caller holds registry_mu uniquely and enters s in by_stream) and
  // unlocked: its old stream's entry goes, and the threads' remembered entries with it
  // (new_route), so an operation on the old handle finds the registry's answer. An
  // allocation that read a thread's entry before the route changed finds the cache's stream
  // changed under its lock (allocate). Holding nothing, it opens at once and any fence goes
  // unwaited (steals and releases waited for it).
  void adopt(stream_cache& c, native_stream s) noexcept
  {
    if (const auto it = by_stream.find(c.stream); it != by_stream.end() && it->second == &c) by_stream.erase(it);
    c.set_stream(s);
    if (c.held.load(std::memory_order_relaxed) == 0) {
      if (c.fence != nullptr) up->destroy_event(std::exchange(c.fence, nullptr));
      c.closed = false;
    }
    c.released.store(false, std::memory_order_relaxed);  // (no block of it is allocated)
    c.mu.unlock();
    new_route();
  }

  void record(const trace_event& e)
  {
    if (!tracing.load(std::memory_order_relaxed)) return;
    std::lock_guard g{trace_mu};
    if (ring.empty()) return;
    ring[ring_next] = e;
    ring_next = (ring_next + 1) % ring.size();
    ring_count = std::min(ring_count + 1, ring.size());
  }

  // A whole free segment moved from `from`'s cache to `to`'s (steal; both locked).
  void record_move(const stream_cache& from, const stream_cache& to, std::uintptr_t addr, std::size_t size)
  {
    moves.fetch_add(1, std::memory_order_relaxed);
    if (!tracing.load(std::memory_order_relaxed)) return;
    trace_event e = event_of(trace_kind::segment_move, addr, size, 0, to.stream);
    e.from_stream = reinterpret_cast<std::uintptr_t>(from.stream);
    record(e);
  }

  trace_event event_of(trace_kind k, std::uintptr_t addr, std::size_t size, std::size_t requested,
                       native_stream s) const
  {
    trace_event e;
    e.kind = k;
    e.time_ns = now_ns();
    e.address = addr;
    e.size = size;
    e.requested = requested;
    e.stream = reinterpret_cast<std::uintptr_t>(s);
    e.thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
    return e;
  }

  void set_trace_capacity(std::size_t n)
  {
    std::lock_guard g{trace_mu};
    ring.assign(n, trace_event{});
    ring_next = 0;
    ring_count = 0;
    tracing.store(n > 0);
  }

  // A block record: a recycled one, else one of a new chunk (one heap allocation per
  // k_block_chunk records, where one per record cost ~180 instructions at every split of a
  // new stream's cache, e.g. a benchmark repetition's). May throw std::bad_alloc, changing
  // nothing.
  // ForSplit: the caller sets what reset_for_split() leaves (split: link_after, then index).
  template <bool ForSplit = false>
  [[gnu::always_inline]] static block* new_block(stream_cache& c)
  {
    if (c.spare == nullptr) [[unlikely]] {
      c.add_block_chunk();
    }
    block* b = c.spare;
    c.spare = b->next;
    if constexpr (ForSplit) {
      b->reset_for_split();
    } else {
      b->reset();
    }
    return b;
  }

  // ---- the large pool: linked block records ------------------------------------------------

  // Index a free block (caller holds c.mu). The hot paths pass the block's pool
  // (b->small) as a constant, after one branch on it (take_free, free_simple), so every
  // pool-dependent cell, bit and index folds to a constant.
  [[gnu::always_inline]] void index(stream_cache& c, block* b) noexcept { index(c, b, b->small); }
  // Marked: the operation marked the block's pool in c's delta (stat_delta::mark).
  template <bool Marked = false>
  [[gnu::always_inline]] void index(stream_cache& c, block* b, bool small) noexcept
  {
    b->state = block_state::free;
    b->counted_split = !b->whole();
    c.delta->add_split_if<Marked>(b->counted_split, small, b->size);
    c.pools[small ? 1 : 0].insert(b);
  }

  [[gnu::always_inline]] void unindex(stream_cache& c, block* b) noexcept { unindex(c, b, b->small); }
  template <bool Marked = false>
  [[gnu::always_inline]] void unindex(stream_cache& c, block* b, bool small) noexcept
  {
    c.pools[small ? 1 : 0].remove(b);
    c.delta->sub_split_if<Marked>(b->counted_split, small, b->size);
    b->counted_split = false;
  }

  bool oversize(const block* b, std::size_t size) const noexcept
  {
    const std::size_t m = cfg.max_split_size;
    if (m == k_unlimited || b->seg->reserved != 0) return false;  // (expandable: always split)
    return (size < m && b->size >= m) || (size >= m && b->size - size > cfg.max_non_split_rounding);
  }

  // Cuts `b` (not indexed) to `size` when the rest is worth keeping as a free block.
  [[gnu::always_inline]] void split(stream_cache& c, block* b, std::size_t size, bool small)
  {
    const std::size_t rest = b->size - size;
    const bool worth = small ? rest >= k_align
                             : rest > k_small_request && (b->size < cfg.max_split_size || b->seg->reserved != 0);
    if (!worth) return;
    block* r = link_after<true>(c, b, b->addr + size, rest);
    b->size = size;
    index<true>(c, r, small);  // (hand_out marked the pool)
  }

  // A new block record for [addr, addr + size) of b's segment and pool, linked right after
  // b (the segment's last if b was); not indexed. May throw std::bad_alloc (new_block).
  // ForSplit: the caller indexes it next (new_block<true>).
  template <bool ForSplit = false>
  [[gnu::always_inline]] static block* link_after(stream_cache& c, block* b, std::uintptr_t addr, std::size_t size)
  {
    block* r = new_block<ForSplit>(c);
    r->addr = addr;
    r->size = size;
    r->seg = b->seg;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    *select_if_set(b->next, block::prev_field(b->next), &r->seg->last) = r;
    b->next = r;
    return r;
  }

  // Hands out `b` (not indexed) for a request of `bytes` (caller holds c.mu).
  [[gnu::always_inline]] void hand_out(stream_cache& c, block* b, std::size_t size, std::size_t bytes)
  {
    hand_out(c, b, size, bytes, b->small);
  }
  // Ends: the operation ends with the allocation where it can (count_allocation_ended).
  // Call make_room(c) first, before anything changed (has_room(c) says whether it must):
  // then this allocates nothing and cannot fail.
  template <bool Ends = false>
  [[gnu::always_inline]] void hand_out(stream_cache& c, block* b, std::size_t size, std::size_t bytes, bool small) noexcept
  {
    c.delta->mark(small);
    split(c, b, size, small);
    b->state = block_state::allocated;
    b->requested = bytes;
    b->timed = tracing.load(std::memory_order_relaxed);
    if (b->timed) b->t_alloc = now_ns();
    c.live.insert_reserved(b->addr, b);
    count_handed_out<Ends>(c, small, b->size, bytes);
  }
  // What a hand-out of a linked block takes from the heap, had before anything changes: a
  // spare block record (for a split) and a free slot in the table of live blocks. Without
  // it, a hand-out that failed for host memory after its block left the index lost the
  // block, counted nowhere (tests/alloc_failure.cpp). May throw std::bad_alloc, changing
  // nothing that statistics or a snapshot show.
  // `records`: spare records the caller's changes take (a split's, a new segment's, ...).
  [[nodiscard]] static bool has_room(const stream_cache& c, int records = 1) noexcept
  {
    const block* b = c.spare;
    for (int i = 0; i < records; ++i, b = b->next) {
      if (b == nullptr) return false;
    }
    return c.live.has_room();
  }
  [[gnu::noinline]] static void make_room(stream_cache& c, int records = 1)
  {
    c.live.reserve(1);
    while (!has_room(c, records)) c.add_block_chunk();
  }
  // The allocation counted (stat_delta::count_allocation); with Ends, its operation ended
  // with it where it can (count_allocation_ended) and the delta settled when due, as
  // cache_lock::unlock() would.
  template <bool Ends>
  [[gnu::always_inline]] void count_handed_out(stream_cache& c, bool small, std::size_t size, std::size_t bytes) noexcept
  {
    stat_delta& d = *c.delta;
    if constexpr (Ends) {
      if (d.count_allocation_ended(small, size, bytes)) [[likely]] {
        if ((d.due & stat_delta::k_settle) != 0) [[unlikely]] {
          figures.settle(d);
        }
        return;
      }
    }
    d.count_allocation(small, size, bytes);
  }

  [[gnu::always_inline]] block* take_free(stream_cache& c, std::size_t size, bool small, std::size_t bytes)
  {
    return small ? take_free_in<true>(c, size, bytes) : take_free_in<false>(c, size, bytes);
  }
  template <bool Small>
  [[gnu::noinline]] block* take_free_in(stream_cache& c, std::size_t size, std::size_t bytes)
  {
    block* b = c.pools[Small ? 1 : 0].find(size);
    if (b == nullptr || (!Small && oversize(b, size))) return nullptr;
    if (!has_room(c)) [[unlikely]] {
      make_room(c);  // may throw: nothing changed
    }
    unindex<true>(c, b, Small);  // (hand_out marks the pool)
    hand_out<true>(c, b, size, bytes, Small);
    return b;
  }

  // Whether the cached bytes exceed release_threshold (caller holds c.mu). The common case,
  // no threshold, inline: the call cost every free ~10 instructions (callgrind, 64 MiB).
  [[gnu::always_inline]] bool over_release_threshold(stream_cache& c) noexcept
  {
    return cfg.release_threshold != k_unlimited && over_set_threshold(c);
  }
  [[gnu::noinline]] bool over_set_threshold(stream_cache& c) noexcept
  {
    // (never a held capture pool's memory: a replay may use it)
    if (c.capture_pool != 0 || capturing()) return false;
    // The shared figures and what this cache has not yet published (others' unpublished
    // changes are not seen: the threshold holds to within their stats_batch).
    const stat_delta& d = *c.delta;
    const std::int64_t cached = figures.total(q_reserved) - figures.total(q_allocated) + d.net[q_reserved] +
                                d.net[8 + q_reserved] - d.net[q_allocated] - d.net[8 + q_allocated];
    return cached > 0 && static_cast<std::size_t>(cached) > cfg.release_threshold;
  }

  // b takes in the block after it (not indexed), whose record is recycled.
  [[gnu::always_inline]] static void absorb_next(stream_cache& c, block* b) noexcept { absorb<true>(c, b, b->next, true); }
  // b takes in n: the block after it (not indexed), whose record is recycled where
  // `recycled` (always where Always), or c.no_next, which changes nothing (release_block's
  // merge without a branch: its `next` is b's next, its size 0, and it is not recycled).
  template <bool Always>
  [[gnu::always_inline]] static void absorb(stream_cache& c, block* b, block* n, bool recycled) noexcept
  {
    b->size += n->size;
    b->next = n->next;
    *select_if_set(n->next, block::prev_field(n->next), &b->seg->last) = b;
    if constexpr (Always) {
      c.recycle(n);
    } else {
      n->next = c.spare;
      c.spare = select_if(recycled, n, c.spare);
    }
  }

  // Back to the cache: merge with free neighbours, index (caller holds c.mu).
  [[gnu::always_inline]] void release_block(stream_cache& c, block* b) { release_block(c, b, b->small); }
  [[gnu::always_inline]] void release_block(stream_cache& c, block* b, bool small)
  {
    c.delta->sub_active(small, b->size);
    if (b->has_uses) {
      b->uses.clear();
      b->has_uses = false;
      c.listed.erase(b);
    }
    // (sub_active marked the pool: a segment's blocks are all of it)
    if (select_if_set(b->prev, static_cast<const block*>(b->prev), &k_edge)->state == block_state::free) {
      block* p = b->prev;
      unindex<true>(c, p, small);
      absorb_next(c, p);
      b = p;
    }
    // The next block merged without a branch: whether it is free is the workload's coin
    // toss (0.45 mispredicted branches per free at 64 MiB requests, callgrind). Where it
    // is not, the same steps take out and absorb c.no_next, which changes nothing.
    {
      block* const n = b->next;
      const bool merge = select_if_set(n, static_cast<const block*>(n), &k_edge)->state == block_state::free;
      c.no_next.next = n;
      block* const m = select_if(merge, n, &c.no_next);
      unindex<true>(c, m, small);
      absorb<false>(c, b, m, merge);
    }
    b->requested = freed_stamp(c);  // (a free block's requested: when it was freed, for steal)
    index<true>(c, b, small);
    if (!c.holes.empty()) [[unlikely]] holes_beside(c, b);
    if (over_release_threshold(c)) [[unlikely]] {
      if (releasable(*b->seg)) {
        release_segment(c, b->seg);
      } else if (b->seg->reserved != 0) {
        if (b->next == nullptr) {
          trim_end(c, b->seg);
        } else {
          unmap_inside(c, b->seg, b);
        }
      }
    }
  }

  void link_segment(stream_cache& c, segment* s) noexcept
  {
    segment_directory::set_owner(s->cache, &c);
    segment_list::push_front(c.segments, s);
    c.held.fetch_add(1, std::memory_order_relaxed);
  }
  static void unlink_segment(stream_cache& c, segment* s) noexcept
  {
    segment_list::unlink(c.segments, s);
    c.held.fetch_sub(1, std::memory_order_relaxed);
  }

  // Returns a whole free segment to the upstream (caller holds c.mu); an expandable one
  // also when its one block is a hole (nothing mapped).
  void release_segment(stream_cache& c, segment* s) noexcept
  {
    block* b = s->head;
    if (b->state == k_unmapped) {
      hole_unlink(c, b);
    } else {
      unindex(c, b);
    }
    unlink_segment(c, s);
    const std::size_t mapped = s->size - s->unmapped;
    c.delta->change_segments(s->small, mapped, -1);
    record(event_of(trace_kind::segment_free, s->addr, mapped, 0, c.stream));
    directory.remove(s->addr);  // (before the upstream may hand the addresses out again)
    give_back(*s);
    if (c.growing == s) c.growing = nullptr;
    c.recycle(b);
    delete s;
  }

  // A segment's memory back to the upstream: unmapped page by page (but for its holes) and
  // its addresses given back when expandable.
  void give_back(segment& s) noexcept
  {
    if (s.reserved == 0) {
      up->deallocate(reinterpret_cast<void*>(s.addr), s.size);
      return;
    }
    std::uintptr_t run = s.addr;  // the mapped runs between holes
    if (s.unmapped != 0) {
      for (const block* b = s.head; b != nullptr; b = b->next) {
        if (b->state != k_unmapped) continue;
        unmap_pages(s, (run - s.addr) / vm_page, (b->addr - s.addr) / vm_page);
        run = b->addr + b->size;
      }
    }
    unmap_pages(s, (run - s.addr) / vm_page, s.size / vm_page);
    up->vm_release(reinterpret_cast<void*>(s.addr), s.reserved);
  }
  // Maps pages [first, first + count) of expandable segment s (its maps sized for them), in
  // one upstream call: true; out of memory, nothing is mapped and it is false; any other
  // error maps nothing either and propagates.
  bool map_pages(segment& s, std::size_t first, std::size_t count)
  {
    try {
      up->vm_map_pages(reinterpret_cast<void*>(s.addr + first * vm_page), vm_page, count, s.maps.data() + first);
      return true;
    } catch (const out_of_memory&) {
      return false;
    }
  }
  void unmap_pages(segment& s, std::size_t from, std::size_t to) noexcept
  {
    if (from < to) finish_uses(*s.cache);
    for (std::size_t i = to; i-- > from;) {
      if (i < s.shared.size() && s.shared[i].fd >= 0) {  // (none: their blocks were freed)
        ::close(std::exchange(s.shared[i].fd, -1));
        s.shared[i].blocks = 0;
      }
      up->vm_unmap(reinterpret_cast<void*>(s.addr + i * vm_page), vm_page, s.maps[i]);
    }
  }

  // The pages [first, end) of expandable segment s that [addr, addr + bytes) spans.
  std::pair<std::size_t, std::size_t> pages_of(const segment& s, std::uintptr_t addr, std::size_t bytes) const noexcept
  {
    return {(addr - s.addr) / vm_page, (page_ceil(s, addr + bytes) - s.addr) / vm_page};
  }
  // An exported block of an expandable segment is freed: its pages count it no more, and a
  // page no live exported block is on closes its descriptor (a handle to the freed block
  // is then refused by the importer: the exporter no longer holds the descriptor).
  void unshare(block& k) noexcept
  {
    segment& s = *k.seg;
    const auto [first, end] = pages_of(s, k.addr, k.size);
    for (std::size_t i = first; i < end; ++i) {
      if (--s.shared[i].blocks == 0) ::close(std::exchange(s.shared[i].fd, -1));
    }
    k.exported = false;
  }

  // Address a of segment s rounded up / down to a page boundary of s.
  std::uintptr_t page_ceil(const segment& s, std::uintptr_t a) const noexcept
  {
    return s.addr + (a - s.addr + vm_page - 1) / vm_page * vm_page;
  }
  std::uintptr_t page_floor(const segment& s, std::uintptr_t a) const noexcept
  {
    return s.addr + (a - s.addr) / vm_page * vm_page;
  }
  // Drops the last block record of segment s (its predecessor becomes the last).
  static void drop_last(stream_cache& c, segment* s) noexcept
  {
    block* t = s->last;
    t->prev->next = nullptr;
    s->last = t->prev;
    c.recycle(t);
  }

  // Holes are indexed by room (c.holes): their pages and the free blocks beside them, what a
  // request could take there. A hole is never resized while indexed; its room is raised
  // when a free neighbour grows (release_block, fill_hole) and lowered when a miss finds it
  // too high (a neighbour was taken), so it is never below the truth.
  static std::size_t free_size(const block* b) noexcept
  {
    return b != nullptr && b->state == block_state::free ? b->size : 0;
  }
  static std::size_t room_of(const block* h) noexcept { return free_size(h->prev) + h->size + free_size(h->next); }
  static void hole_link(stream_cache& c, block* h) noexcept
  {
    h->room = room_of(h);
    c.holes.insert(h);
  }
  static void hole_unlink(stream_cache& c, block* h) noexcept { c.holes.remove(h); }
  static void hole_rekey(stream_cache& c, block* h) noexcept
  {
    if (h->room == room_of(h)) return;
    c.holes.remove(h);
    hole_link(c, h);
  }
  // After free block b grew or appeared: the holes beside it have more room.
  [[gnu::noinline]] static void holes_beside(stream_cache& c, const block* b) noexcept
  {
    for (block* x : {b->prev, b->next}) {
      if (x != nullptr && x->state == k_unmapped) hole_rekey(c, x);
    }
  }
  // At least n spare block records, made now if need be; false when the heap has none.
  static bool spare_records(stream_cache& c, int n) noexcept
  {
    for (const block* b = c.spare; b != nullptr && n > 0; b = b->next) --n;
    if (n <= 0) return true;
    try {
      c.add_block_chunk();
      return true;
    } catch (...) {
      return false;
    }
  }

  // Unmaps the whole free pages of expandable segment s (caller holds c.mu): inside its
  // free blocks, which leaves holes, and at its end, where the range shrinks; a segment
  // with nothing left mapped goes back whole.
  void trim(stream_cache& c, segment* s) noexcept
  {
    if (s->exported) return;
    for (block* b = s->head; b != s->last;) {
      b = b->state == block_state::free ? unmap_inside(c, s, b) : b->next;
    }
    trim_end(c, s);
  }

  // Unmaps the whole pages inside free block b of expandable segment s, b not its last
  // (caller holds c.mu): b keeps the part below them, a new free block the part above, and
  // the pages become a hole, merged with holes beside it. Returns the block after all of
  // them. Leaves b as it is when it holds no whole page, or no block record can be made.
  [[gnu::noinline]] block* unmap_inside(stream_cache& c, segment* s, block* b) noexcept
  {
    block* after = b->next;
    const std::uintptr_t end = b->addr + b->size;
    const std::uintptr_t lo = page_ceil(*s, b->addr);
    const std::uintptr_t hi = page_floor(*s, end);
    if (hi <= lo || !spare_records(c, 2)) return after;
    unindex(c, b);
    if (hi < end) index(c, link_after(c, b, hi, end - hi));  // the free part above
    block* h = b;
    if (lo > b->addr) {  // the free part below stays b
      h = link_after(c, b, lo, 0);
      b->size = lo - b->addr;
      index(c, b);
    }
    h->size = hi - lo;
    h->state = k_unmapped;
    if (block* p = h->prev; p != nullptr && p->state == k_unmapped) {
      hole_unlink(c, p);
      absorb_next(c, p);
      h = p;
    }
    if (block* n = h->next; n->state == k_unmapped) {  // (a hole is never the last block)
      if (after == n) after = n->next;
      hole_unlink(c, n);
      absorb_next(c, h);
    }
    hole_link(c, h);
    const std::size_t first = (lo - s->addr) / vm_page, count = (hi - lo) / vm_page;
    unmap_pages(*s, first, first + count);
    std::fill_n(s->maps.begin() + static_cast<std::ptrdiff_t>(first), count, std::uint64_t{0});
    s->unmapped += hi - lo;
    c.delta->change_mapped(false, hi - lo, -1);
    record(event_of(trace_kind::segment_unmap, lo, hi - lo, 0, c.stream));
    return after;
  }

  // Unmaps the whole free pages at the end of expandable segment s (caller holds c.mu): its
  // last block, when free, shrinks to its start rounded up to a page, or goes, and a hole
  // it uncovers goes too (the range ends below it); a segment wholly free or wholly
  // unmapped goes back whole.
  [[gnu::noinline]] void trim_end(stream_cache& c, segment* s) noexcept
  {
    while (true) {
      block* t = s->last;
      if (t->state == k_unmapped) {
        if (t == s->head) {
          release_segment(c, s);
          return;
        }
        hole_unlink(c, t);
        s->unmapped -= t->size;
        s->size -= t->size;
        s->maps.resize(s->size / vm_page);
        drop_last(c, s);
        continue;
      }
      if (t->state != block_state::free || s->exported) return;
      if (t == s->head) {
        release_segment(c, s);
        return;
      }
      const std::uintptr_t end = s->addr + s->size;
      const std::uintptr_t cut = page_ceil(*s, t->addr);
      if (cut >= end) return;
      const std::size_t bytes = end - cut;
      unindex(c, t);
      const bool gone = cut == t->addr;
      if (gone) {
        drop_last(c, s);
      } else {
        t->size -= bytes;
        index(c, t);
      }
      unmap_pages(*s, (cut - s->addr) / vm_page, s->size / vm_page);
      s->size -= bytes;
      s->maps.resize(s->size / vm_page);
      c.delta->change_mapped(false, bytes, -1);
      record(event_of(trace_kind::segment_unmap, cut, bytes, 0, c.stream));
      if (!gone) return;
    }
  }

  // A miss of the large pool with expandable segments (caller holds c.mu): maps pages of a
  // hole back where they make, with the free blocks beside the hole, room for `size`, and
  // hands that out. Nothing when no hole can (or the limit forbids it, or the upstream is
  // out of memory: undone, the caller goes on to grow and retry). Needs one spare record.
  // The hole index gives one whose room holds `size` in constant time; a room found too
  // high (a neighbour was taken since) is lowered and the search repeated, at most
  // k_hole_tries times (each lowering pays for an earlier change beside a hole).
  static constexpr int k_hole_tries = 64;
  block* find_hole(stream_cache& c, std::size_t size) noexcept
  {
    for (int tries = 0; tries < k_hole_tries; ++tries) {
      block* h = c.holes.find(size);
      if (h == nullptr) return nullptr;
      if (room_of(h) >= size) return h;
      hole_rekey(c, h);
    }
    return nullptr;
  }
  block_ref fill_hole(stream_cache& c, std::size_t size, std::size_t bytes)
  {
    block* const h = find_hole(c, size);
    if (h == nullptr) return {};
    segment* s = h->seg;
    block* p = h->prev;
    block* n = h->next;
    const std::size_t below = free_size(p);
    const std::size_t above = free_size(n);
    if (below >= size) return {};  // (the free index passed over p: rare; the end grows)
    const std::size_t pages = h->size / vm_page;
    const std::size_t count = std::min(pages, (size - below + vm_page - 1) / vm_page);
    const std::size_t need = count * vm_page;
    if (limit != k_unlimited && static_cast<std::size_t>(figures.total(q_reserved)) + need > limit) return {};
    if (!map_pages(*s, (h->addr - s->addr) / vm_page, count)) return {};
    hole_unlink(c, h);  // its mapped pages keep its record; the rest of the hole gets a new one
    block* rest = nullptr;
    if (count < pages) {
      rest = link_after(c, h, h->addr + need, h->size - need);  // (the caller made one spare)
      rest->state = k_unmapped;
      h->size = need;
    }
    h->state = block_state::free;
    s->unmapped -= need;
    c.delta->change_mapped(false, need, +1);
    record(event_of(trace_kind::segment_map, h->addr, need, 0, c.stream));
    block* b = h;  // merged with the free blocks beside it (not indexed)
    if (below != 0) {
      unindex(c, p);
      absorb_next(c, p);
      b = p;
    }
    if (count == pages && above != 0) {
      unindex(c, n);
      absorb_next(c, b);
    }
    hand_out(c, b, size, bytes);
    if (rest != nullptr) hole_link(c, rest);  // its room: with what hand_out left free below it
    return {b, nullptr, 0};
  }

  // ---- the small pool: entries in address order ---------------------------------------------

  static std::uint32_t link_of(const small_segment& s, unsigned u) noexcept
  {
    return s.slot << k_unit_bits | u;
  }
  static std::uintptr_t address_of(const small_segment& s, unsigned u) noexcept
  {
    return s.addr + unit_bytes(u);
  }

  void small_index(stream_cache& c, small_segment& s, unsigned u) noexcept
  {
    unit_entry& e = s.units[u];
    e.state = block_state::free;
    e.flags = unit_entry::head;
    s.mark_free(u);
    if (e.size != k_seg_units) {
      e.flags |= unit_entry::split;
      c.delta->add_split(true, unit_bytes(e.size));
    }
    c.small.insert(link_of(s, u), e);
  }

  [[gnu::noinline]] void small_unindex(stream_cache& c, small_segment& s, unsigned u) noexcept
  {
    unit_entry& e = s.units[u];
    c.small.remove(link_of(s, u), e);
    s.mark_taken(u);
    if ((e.flags & unit_entry::split) != 0) c.delta->sub_split(true, unit_bytes(e.size));
    e.flags = unit_entry::head;
  }

  // Hands out the block at `u` (not indexed) as `units` units for `bytes` (caller holds c.mu).
  // Ends: as hand_out's.
  // Call small_make_room(s) first, before anything changed: then this cannot fail.
  template <bool Ends = false>
  void small_hand_out(stream_cache& c, small_segment& s, unsigned u, unsigned units, std::size_t bytes) noexcept
  {
    unit_entry& e = s.units[u];
    if (e.size > units) {  // the rest stays free
      const unsigned r = u + units;
      unit_entry& re = s.units[r];
      re = unit_entry{};
      re.size = static_cast<std::uint16_t>(e.size - units);
      re.prev = static_cast<std::uint16_t>(units);
      if (const unsigned after = u + e.size; after < k_seg_units) s.units[after].prev = re.size;
      e.size = static_cast<std::uint16_t>(units);
      small_index(c, s, r);
    }
    e.state = block_state::allocated;
    e.flags = unit_entry::head;
    e.pending = 0;
    e.requested = static_cast<std::uint32_t>(bytes);
    // (tracing turned on since small_make_room: this one stays untimed, as before it)
    if (s.t_alloc) s.t_alloc[u] = tracing.load(std::memory_order_relaxed) ? now_ns() : 0;
    count_handed_out<Ends>(c, true, unit_bytes(units), bytes);
  }
  // What small_hand_out takes from the heap: the segment's allocation times, once tracing
  // is on. May throw std::bad_alloc, changing nothing.
  void small_make_room(small_segment& s)
  {
    if (!s.t_alloc && tracing.load(std::memory_order_relaxed)) [[unlikely]] {
      s.t_alloc = std::make_unique<std::uint64_t[]>(k_seg_units);
    }
  }

  block_ref small_take_free(stream_cache& c, unsigned units, std::size_t bytes)
  {
    if (const std::uint32_t l = c.reuse[units - 1]; l != k_nil) return small_take_kept(c, l, units, bytes);
    std::uint32_t l = c.small.find(units);
    if (l == k_nil) {
      if (c.reuse_units == 0) return {};
      merge_kept(c);  // kept blocks of other sizes, merged, before the cache grows
      l = c.small.find(units);
      if (l == k_nil) return {};
    }
    small_segment& s = small_table.at(l >> k_unit_bits);
    const unsigned u = l & (k_seg_units - 1);
    small_make_room(s);  // may throw: nothing changed
    c.delta->mark(true);  // (count_allocation_ended: the operation is of the small pool)
    small_unindex(c, s, u);
    small_hand_out<true>(c, s, u, units, bytes);
    return {nullptr, &s, u};
  }

  // The kept block at link l (the head of the reuse list of `units`) handed out for
  // `bytes`: no split, no index (caller holds c.mu).
  block_ref small_take_kept(stream_cache& c, std::uint32_t l, unsigned units, std::size_t bytes)
  {
    small_segment& s = small_table.at(l >> k_unit_bits);
    const unsigned u = l & (k_seg_units - 1);
    small_make_room(s);  // may throw: nothing changed
    c.reuse[units - 1] = s.units[u].fnext;
    c.reuse_units -= units;
    c.delta->mark(true);
    c.delta->sub_split(true, unit_bytes(units));
    small_hand_out<true>(c, s, u, units, bytes);
    return {nullptr, &s, u};
  }

  // A freed block (no other stream recorded, its free counted) kept unmerged for reuse at
  // its size, when the cache's reuse lists have room and it is not over release_threshold;
  // else back to the cache as small_release() (caller holds c.mu).
  [[gnu::always_inline]] void small_free(stream_cache& c, small_segment& s, unsigned u)
  {
    unit_entry& e = s.units[u];
    const unsigned units = e.size;
    if (c.reuse_units + units > c.reuse_cap || over_release_threshold(c)) {
      small_release(c, s, u);
      return;
    }
    const std::size_t n = unit_bytes(units);
    c.delta->sub_active(true, n);
    c.delta->add_split(true, n);  // (a dense block is never a whole segment)
    e.state = block_state::free;
    e.flags = unit_entry::head | unit_entry::split | unit_entry::reuse;
    std::uint32_t& first = c.reuse[units - 1];
    e.fnext = first;
    first = link_of(s, u);
    c.reuse_units += units;
  }

  // Every kept block of c merged with its free neighbours and indexed, as its free would
  // have done (caller holds c.mu).
  void merge_kept(stream_cache& c) noexcept
  {
    if (c.reuse_units == 0) return;
    c.delta->mark(true);
    for (std::uint32_t& first : c.reuse) {
      for (std::uint32_t l = std::exchange(first, k_nil); l != k_nil;) {
        small_segment& s = small_table.at(l >> k_unit_bits);
        const unsigned u = l & (k_seg_units - 1);
        unit_entry& e = s.units[u];
        l = e.fnext;
        c.delta->sub_split(true, unit_bytes(e.size));
        e.flags = unit_entry::head;
        small_merge(c, s, u);
      }
    }
    c.reuse_units = 0;
    // An operation boundary of its own, so an allocation that follows counts as on the
    // fast path and the highs take in the merged figures now (merging raises no figure:
    // a merged block's split bytes are its parts', or none when it is a whole segment).
    c.delta->end_op();
  }

  // The largest kept block's bytes (0: none).
  static std::size_t largest_kept(const stream_cache& c) noexcept
  {
    for (unsigned k = k_reuse_sizes; k-- > 0;) {
      if (c.reuse[k] != k_nil) return unit_bytes(k + 1);
    }
    return 0;
  }

  // Back to the cache: merge with free neighbours, index (caller holds c.mu).
  void small_release(stream_cache& c, small_segment& s, unsigned u)
  {
    unit_entry* e = &s.units[u];
    c.delta->sub_active(true, unit_bytes(e->size));
    if ((e->flags & unit_entry::has_uses) != 0) c.small_uses.erase(address_of(s, u));
    small_merge(c, s, u);
  }
  // small_release() past its counting: the block at u (flags `head`, not indexed) merged
  // with its free neighbours and indexed; a whole free segment released past the
  // release threshold.
  [[gnu::always_inline]] void small_merge(stream_cache& c, small_segment& s, unsigned u) noexcept
  {
    unit_entry* e = &s.units[u];
    // Neighbours are asked of the segment's bitmap: a neighbour's entry is read only to
    // merge it, and the entry after the block is written only when the block grew (its
    // distance back to this head is the block's size already otherwise).
    bool grew = false;
    if (e->prev != 0) {
      if (const unsigned p = u - e->prev; s.free_at(p)) {
        unit_entry& pe = s.units[p];
        small_unindex(c, s, p);
        pe.size = static_cast<std::uint16_t>(pe.size + e->size);
        e->flags = 0;
        e = &pe;
        u = p;
        grew = true;
      }
    }
    if (const unsigned n = u + e->size; n < k_seg_units && s.free_at(n)) {
      unit_entry& ne = s.units[n];
      small_unindex(c, s, n);
      e->size = static_cast<std::uint16_t>(e->size + ne.size);
      ne.flags = 0;
      grew = true;
    }
    if (const unsigned after = u + e->size; grew && after < k_seg_units) s.units[after].prev = e->size;
    s.freed_gen = c.steal_gen;  // (for steal)
    small_index(c, s, u);
    // The threshold first: releasable() reads the segment's first entry, a cache miss at
    // nearly every free of a random workload when no threshold is set.
    if (over_release_threshold(c) && releasable(s)) release_small_segment(c, s);
  }

  // Returns a whole free small segment to the upstream (caller holds c.mu).
  void release_small_segment(stream_cache& c, small_segment& s) noexcept
  {
    small_unindex(c, s, 0);
    c.remove_small(&s);
    c.delta->change_segments(true, k_small_segment, -1);
    record(event_of(trace_kind::segment_free, s.addr, k_small_segment, 0, c.stream));
    directory.remove(s.addr);  // (before the upstream may hand the addresses out again)
    up->deallocate(reinterpret_cast<void*>(s.addr), k_small_segment);
    small_table.release(s);
  }

  // ---- either pool -------------------------------------------------------------------------

  // Whether a request of `size` (rounded) is served by dense small segments.
  static bool dense(std::size_t size) noexcept { return size <= k_dense_request; }

  // The streams other than its own that used a live block (record_stream, or a free ordered
  // on another stream); nullptr when none are recorded and `create` is false. Creating may
  // throw std::bad_alloc, changing nothing (caller holds c.mu).
  static std::vector<native_stream>* uses_of(stream_cache& c, const block_ref& r, bool create)
  {
    if (r.large != nullptr) {
      if (create) {  // (has_uses alone may be an export's: listed or not, it is listed now)
        c.listed.insert(r.large);  // may throw std::bad_alloc, changing nothing
        r.large->has_uses = true;
      }
      return &r.large->uses;
    }
    if ((r.seg->units[r.unit].flags & unit_entry::has_uses) == 0 && !create) return nullptr;
    return small_uses_of(c, r);
  }
  [[gnu::noinline]] static std::vector<native_stream>* small_uses_of(stream_cache& c, const block_ref& r)
  {
    std::vector<native_stream>* uses = &c.small_uses[address_of(r)];
    r.seg->units[r.unit].flags |= unit_entry::has_uses;
    return uses;
  }

  static stream_cache& cache_of(const block_ref& r) noexcept
  {
    return r.large != nullptr ? *r.large->seg->cache : *r.seg->cache;
  }
  static std::uintptr_t address_of(const block_ref& r) noexcept
  {
    return r.large != nullptr ? r.large->addr : address_of(*r.seg, r.unit);
  }
  static std::size_t size_of(const block_ref& r) noexcept
  {
    return r.large != nullptr ? r.large->size : unit_bytes(r.seg->units[r.unit].size);
  }
  static std::size_t requested_of(const block_ref& r) noexcept
  {
    return r.large != nullptr ? r.large->requested : r.seg->units[r.unit].requested;
  }

  void release(stream_cache& c, const block_ref& r)
  {
    if (r.large != nullptr) {
      release_block(c, r.large);
    } else {
      small_release(c, *r.seg, r.unit);
    }
  }

  // Whether an exported (ordinary) segment is mapped by another process now.
  template <class S>
  bool imported(const S& s) const noexcept
  {
    return s.exported && importer_counts::held(importers.fd(), s.importer_slot);
  }
  // Whether a segment may go back to the upstream now: wholly free, and not mapped by
  // another process (an exported segment is kept while importers count themselves in).
  template <class S>
  bool releasable(const S& s) const noexcept
  {
    return s.whole_free() && !imported(s);
  }

  void release_free_segments(stream_cache& c) noexcept
  {
    merge_kept(c);
    for (segment* s = c.segments; s != nullptr;) {
      segment* next = s->lnext;
      if (releasable(*s)) {
        release_segment(c, s);
      } else if (s->reserved != 0) {
        trim(c, s);
      }
      s = next;
    }
    for (std::size_t i = c.small_dir.size(); i-- > 0;) {
      if (small_segment& s = *c.small_dir[i].second; releasable(s)) release_small_segment(c, s);
    }
  }

  // A freed block waits for `waits` events of other streams (state pending_free).
  static void mark_pending(const block_ref& r, std::uint16_t waits) noexcept
  {
    if (r.large == nullptr) {
      unit_entry& entry = r.seg->units[r.unit];
      entry.state = block_state::pending_free;
      entry.pending = waits;
    } else {
      r.large->state = block_state::pending_free;
      r.large->pending = waits;
    }
  }
  static void set_in_place(const block_ref& r, bool on) noexcept
  {
    if (r.large != nullptr) {
      r.large->in_place = on;
    } else if (on) {
      r.seg->units[r.unit].flags |= unit_entry::in_place;
    } else {
      r.seg->units[r.unit].flags &= static_cast<std::uint8_t>(~unit_entry::in_place);
    }
  }
  // One of a pending block's waits is over: at the last, the block is free in `c`.
  void settle_one(stream_cache& c, const block_ref& r) noexcept
  {
    const int left = r.large != nullptr ? --r.large->pending : --r.seg->units[r.unit].pending;
    if (left == 0) release(c, r);
  }

  void process_events(stream_cache& c, bool wait)
  {
    auto keep = c.pending.begin();
    for (auto it = c.pending.begin(); it != c.pending.end(); ++it) {
      auto [e, r] = *it;
      if (wait) up->wait_event(e);
      if (wait || up->event_done(e)) {
        up->destroy_event(e);
        settle_one(c, r);
      } else {
        *keep++ = *it;
      }
    }
    c.pending.erase(keep, c.pending.end());
  }

  // Every cache: pending frees whose events completed (all of them, waiting, when `wait`)
  // back in the cache, fences done with, whole free segments returned to the upstream.
  // As one step for the statistics, under every cache's lock (as stats() reads): the
  // threads' unpublished changes and each cache's own are published with their peaks
  // first (boundaries they were), then what the flush
  // changed there without any, and the peaks take in the figures the whole flush left at
  // its end, before any lock is given back. A figure between two caches (one cache's pending
  // blocks returned, the next one's not yet) was no operation's boundary: publishing each
  // cache's flush with its peaks made a peak of it (inactive split bytes 24 MiB where the
  // figures before and after were 16 and 12 MiB); and no reader may see a figure above its
  // peak (a lock per cache let one in between: 4 of a 16-core H200 host's reads, four-thread
  // fuzz). Other threads' operations wait for the whole flush, as for PyTorch's empty_cache.
  void flush_all(bool wait)
  {
    std::shared_lock r{registry_mu};
    const all_locks locks{*this};
    struct peaks_at_end {  // (also when the backend throws half-way)
      shared_stats& figures;
      ~peaks_at_end() { figures.raise_to_current(); }
    } at_end{figures};
    publish_threads();
    for (auto& c : caches) {
      stat_delta& d = c->home;
      const auto publish = [&](bool peaks) {
        if (d.op != 0) d.end_op();
        figures.publish(d, peaks);
      };
      publish(true);  // (its own operations' changes: boundaries they were)
      process_events(*c, wait);
      if (c->fence != nullptr && (wait || up->event_done(c->fence))) {
        if (wait) up->wait_event(c->fence);
        up->destroy_event(std::exchange(c->fence, nullptr));
      }
      if (c->capture_pool == 0) release_free_segments(*c);  // (a held pool's memory stays: a replay may use it)
      publish(false);
    }
  }

  // Whether a handle names a stream that is never destroyed: the default (legacy) stream,
  // and CUDA's and HIP's per-thread default streams (cudaStreamLegacy, *PerThread).
  static bool built_in(native_stream s) noexcept { return is_built_in_stream(s); }

  // The per-thread default stream's handle (cudaStreamPerThread, hipStreamPerThread: 0x2)
  // names the calling thread's own stream, so the allocator keys it by thread: the public
  // entry points turn it into the key k_per_thread_tag | thread_token() (key_of), a stream
  // of its own with its own cache, given back as the handle only to backend calls on its
  // own thread (native). Another thread's cannot be reached: native() throws, and every
  // path that orders memory after it (stream_lives() false) finishes the device's work, as
  // for a raw handle. A thread's key is closed like a destroyed stream as the thread exits
  // (close_per_thread_stream). Bit 62 is never set in a user-space address (the marker's
  // bit 63 is told apart).
  static constexpr std::uintptr_t k_per_thread_tag = std::uintptr_t{1} << 62U;
  static native_stream own_per_thread() noexcept
  {
    return reinterpret_cast<native_stream>(k_per_thread_tag | thread_token());
  }
  // (the null stream too where allocator_config::null_stream_per_thread says so: the
  // caller was built with per-thread default streams, where 0 means the thread's own)
  native_stream key_of(native_stream s) const noexcept
  {
    const auto v = reinterpret_cast<std::uintptr_t>(s);
    if (v > per_thread_stream_handle || v == legacy_stream_handle || (v == 0 && !cfg.null_stream_per_thread)) [[likely]]
      return s;
    tl_named_per_thread = true;
    return own_per_thread();
  }
  // This thread named its per-thread default stream to an allocator (its exit closes it).
  static inline thread_local bool tl_named_per_thread = false;
  static bool per_thread(native_stream s) noexcept
  {
    const auto v = reinterpret_cast<std::uintptr_t>(s);
    return (v & k_per_thread_tag) != 0 && (v & k_closed_marker) == 0;
  }
  // The handle a backend call takes for stream key s: a per-thread key is this thread's
  // per-thread default stream, or unreachable here (an error, which callers take as a
  // refused event: the device's work is finished instead).
  native_stream native(native_stream s) const
  {
    if (!per_thread(s)) [[likely]] return s;
    if (s == own_per_thread()) return reinterpret_cast<native_stream>(per_thread_stream_handle);
    throw error("depot: " + dev.to_string() + " caching allocator: thread " +
                    std::to_string(reinterpret_cast<std::uintptr_t>(s) & ~k_per_thread_tag) +
                    "'s per-thread default stream cannot be reached from thread " + std::to_string(thread_token()),
                "native(per-thread stream key)", __FILE__, __LINE__, 0, "another_thread_stream");
  }
  native_event record_on(native_stream s) { return up->record_event(native(s)); }
  void wait_on(native_stream s, native_event e) { up->stream_wait(native(s), e); }
  // As a thread that named its per-thread default stream exits: that stream closed here as
  // a destroyed one (stream_closing): blocks that list it (record_stream) wait for its work
  // and forget it, and its cache, if any, gets a fence at its last work and goes on the
  // spare list. The key is never used again, and the memory moves on after the fence, not
  // by finishing the device's work. Before publish_and_leave (closing changes statistics).
  void close_per_thread_stream() noexcept
  {
    if (tl_named_per_thread) stream_closing(streams_of, own_per_thread());
  }
  // Whether all of the work queued on live stream s so far is done (false where the backend
  // cannot tell or fails to: the caller then orders by an event). Never during a capture
  // (a query is forbidden then): steal() does nothing during one.
  bool stream_idle(native_stream s) noexcept
  {
    try {
      return up->stream_done(native(s));
    } catch (...) {
      return false;
    }
  }
  // Whether work may still be queued on s: a built-in stream, or one stream_registry lists.
  bool stream_lives(native_stream s) const noexcept
  {
    return built_in(s) || (per_thread(s) ? s == own_per_thread() : stream_registry::live(streams_of.kind, s));
  }
  // A stream other than c's own, for ordering a block of c on it: a different handle, or
  // c's own handle on a closed cache when it is live again (the backend gave the
  // destroyed stream's handle to a new stream, whose work the fence does not cover).
  bool another_stream(const stream_cache& c, native_stream s) const noexcept
  {
    return s != c.stream || (c.closed && stream_lives(s));
  }

  // Makes `wait(event)` (a stream's wait or the host's) follow the last uses of the free
  // memory that cache c holds (caller holds c's lock). c's fence once it was closed (nothing
  // ran there since), else an event recorded on c's stream while stream_registry says it is
  // live (not closed here yet: its closing waits for c's lock, which the caller holds, so it
  // stays valid meanwhile). A raw handle's stream may be destroyed at any time: only
  // finishing the device's work orders those. Throws what the backend throws.
  template <class Wait>
  void follow_last_uses(stream_cache& c, Wait wait)
  {
    if (c.closed) {
      if (c.fence != nullptr && up->event_done(c.fence)) up->destroy_event(std::exchange(c.fence, nullptr));
      if (c.fence != nullptr) wait(c.fence);
      return;
    }
    if (!stream_lives(c.stream)) {
      up->synchronize_device();
      return;
    }
    follow_stream(c.stream, wait);
  }

  // `wait(event)` follows the work queued on stream s so far: an event recorded there,
  // destroyed after (a stream's wait already queued holds what it needs). Throws what the
  // backend throws.
  template <class Wait>
  void follow_stream(native_stream s, Wait wait)
  {
    const native_event e = record_on(s);
    try {
      wait(e);
    } catch (...) {
      up->destroy_event(e);
      throw;
    }
    up->destroy_event(e);
  }

  // f(), for the paths that cannot throw: the backend failing, the device's work is finished
  // instead, or, failing that too, nothing runs on it any more.
  template <class F>
  void or_finish_device(F f) noexcept
  {
    try {
      f();
    } catch (...) {
      try {
        up->synchronize_device();
      } catch (...) {
      }
    }
  }

  // Makes work queued on stream `to` wait for the last uses of the free memory that cache
  // `other` holds (caller holds both caches' locks), without a host wait where it can. An
  // event refused: ordered by the device's work instead.
  void order_after(stream_cache& other, native_stream to)
  {
    if (!async) return;
    try {
      follow_last_uses(other, [&](native_event e) { wait_on(to, e); });
    } catch (const error&) {
      up->synchronize_device();
    }
  }

  // order_after() for a steal by c of memory of `other` last freed at `stamp` (other's
  // steal_gen then; 0: unknown), both locked: from a live stream's cache, nothing to queue
  // where c's stream already waited for an event recorded on other's stream after that
  // free (one thread that alternates among streams takes whole free segments back and
  // forth, most of them idle since an earlier steal's event: a record and a wait spared,
  // ~2 driver calls), or where a query found other's stream with no work left after that
  // free (idle_gen: for any thief, where a wait covers only the stream that waited); else
  // one query (its frees so far are done, as though an event recorded now had completed:
  // kept as other's idle_gen, so the next steal of memory freed before it, by any stream,
  // asks nothing), and where work is left an event there, remembered as waited for by c.
  // Either is counted in other's steal_gen.
  void order_steal(stream_cache& other, stream_cache& c, std::uint64_t stamp)
  {
    if (!async) return;
    if (other.closed || !stream_lives(other.stream)) {
      if (!other.closed) move_syncs.fetch_add(1, std::memory_order_relaxed);  // (a raw handle's)
      order_after(other, c.stream);
      return;
    }
    if (covered(c, other, stamp)) return;
    const std::uint64_t gen = other.steal_gen;
    const bool idle = stream_idle(other.stream);
    if (!idle) {
      try {
        follow_stream(other.stream, [&](native_event e) { wait_on(c.stream, e); });
      } catch (const error&) {
        up->synchronize_device();
        return;
      }
      move_events.fetch_add(1, std::memory_order_relaxed);
    }
    other.steal_gen = gen + 1;  // (frees from now on come after the event, or the query)
    if (idle) {  // (done for every thief: no wait of c's to remember)
      other.idle_gen = gen;
      return;
    }
    auto* slot = c.wait_for(other.id);
    if (slot == nullptr) {
      slot = &c.waited[c.waited_next];
      c.waited_next = (c.waited_next + 1) % c.waited.size();
    }
    *slot = {other.id, gen};
  }
  // A free linked block's `requested` holds k_freed_tag | its cache's steal_gen when it was
  // freed (release_block) or moved (steal); anything else there (0, a size left by a path
  // that freed no used memory) reads as unknown: 0, which always waits.
  static constexpr std::size_t k_freed_tag = std::size_t{1} << 63;
  static std::uint64_t freed_gen(const block* b) noexcept
  {
    return (b->requested & k_freed_tag) != 0 ? b->requested & ~k_freed_tag : 0;
  }
  // The stamp of a linked block freed into c now (freed_gen's inverse).
  static std::size_t freed_stamp(const stream_cache& c) noexcept { return k_freed_tag | c.steal_gen; }
  // Whether a free stamped `stamp` in other (0: unknown, never) is done (a query after it
  // found other's stream idle) or c's stream waited for an event recorded there after it.
  static bool covered(const stream_cache& c, const stream_cache& other, std::uint64_t stamp) noexcept
  {
    if (stamp == 0) return false;
    if (stamp <= other.idle_gen) return true;  // (done, whoever takes it)
    const auto* w = c.wait_for(other.id);
    return w != nullptr && stamp <= w->gen;
  }

  // Blocks the host until the last uses of the free memory cache c holds are done (caller
  // holds c's lock). Unmapping pages does not wait for the work that uses them (cuMemUnmap
  // and hipMemUnmap do not, where cudaFree and hipFree wait for the device), and a block
  // freed on a stream is free at once while that stream's kernels may still use it. Never
  // during a capture (nothing is released then).
  void finish_uses(stream_cache& c) noexcept
  {
    if (!async || settled || capturing()) return;
    or_finish_device([&] { follow_last_uses(c, [&](native_event e) { up->wait_event(e); }); });
  }

  // The first allocation from a closed stream's cache (caller holds c's lock), or a free
  // there on a live stream: it is on a stream with the closed one's handle, whose work must
  // wait for the fence (and the cache is that stream's from now on).
  [[gnu::noinline]] void reopen(stream_cache& c)
  {
    if (c.fence != nullptr) {
      if (capturing()) {  // no query: a wait on a complete event costs the stream nothing
        wait_on(c.stream, c.fence);
      } else {
        try {
          if (!up->event_done(c.fence)) wait_on(c.stream, c.fence);
        } catch (const error&) {
          up->synchronize_device();
        }
      }
      up->destroy_event(std::exchange(c.fence, nullptr));
    }
    c.closed = false;
    c.forget_waits();
  }

  // stream_registry: `s` is about to be destroyed. Its cache (if any) records a fence at
  // the stream's last work, so a steal or a stream that reuses the handle waits for that
  // event, never for the whole device.
  void stream_closing(device_id d, native_stream s) noexcept
  {
    if (d.kind != streams_of.kind || (streams_of.index >= 0 && d.index != streams_of.index)) return;
    forget_uses(s);
    fence_released(s);
    stream_cache* c = nullptr;
    {
      std::shared_lock r{registry_mu};
      const auto it = by_stream.find(s);
      if (it == by_stream.end()) return;
      c = it->second;  // (caches live as long as the allocator)
    }
    {
      cache_lock g = lock_cache(*c);
      merge_kept(*c);  // (whole free segments, for a take-over or a steal)
      // Closed already: nothing ran here since, its fence stands (a handle closed twice, or
      // a cache taken over with its memory by s, which never allocated from it).
      if (!c->closed) {
        c->fence = record_fence(s);  // (reopen() consumed any earlier one)
        c->closed = true;
      }
    }
    std::unique_lock w{registry_mu};
    if (!on_spare_list(*c) && c->capture_pool == 0) list_spare(*c);
  }

  // An event at the last work of stream s, about to be destroyed (null where the backend is
  // synchronous, or s refused it: then the device's work is finished instead, outside a
  // capture, so nothing is left to wait for).
  native_event record_fence(native_stream s) noexcept
  {
    if (!async) return nullptr;  // (synchronous: the stream's work is done)
    try {
      return record_on(s);
    } catch (...) {
      finish_device_outside_capture();
      return nullptr;
    }
  }

  // The device's work finished, for the paths that order memory by it when an event fails
  // (never during a capture, which forbids it; a failure leaves nothing running on it).
  void finish_device_outside_capture() noexcept
  {
    if (capturing()) return;
    try {
      up->synchronize_device();
    } catch (...) {
    }
  }

  // The host waits for `fence` (record_fence's), or for the device's work where it is null.
  void wait_fence(native_event fence)
  {
    if (fence != nullptr) {
      up->wait_event(fence);
    } else {
      up->synchronize_device();
    }
  }

  // stream_registry: `s` is about to be destroyed while live blocks may list it among the
  // streams that used them (record_stream, a free on another stream that is still to be
  // ordered), or frees deferred during a capture wait for it: their events would be
  // recorded on a destroyed stream's handle (an error, or, once the backend gives the
  // handle to a new stream, an event on the wrong stream). So when one does, the host waits
  // for the work queued on s, the lists forget it and its deferred frees are settled.
  // During a capture, which forbids the wait, a fence recorded on s (which no capture
  // holds: it is being destroyed) takes its place in the lists, as a marker (closed_fences).
  void forget_uses(native_stream s) noexcept
  {
    if (!async || !uses_listed.load(std::memory_order_relaxed)) return;
    const auto lists = [s](const std::vector<native_stream>& u) { return std::find(u.begin(), u.end(), s) != u.end(); };
    bool found = false;
    bool deferred = false;
    {
      std::shared_lock r{registry_mu};
      each_cache_locked([&](const stream_cache& c) {
        for (const block* b : c.listed) found = found || lists(b->uses);
        for (const auto& [addr, u] : c.small_uses) found = found || lists(u);
        for (const auto& d : c.deferred) deferred = deferred || d.first == s;
      });
    }
    if (!found && !deferred) return;
    if (capturing()) {
      close_in_capture(s);
      return;
    }
    or_finish_device([&] { follow_stream(s, [&](native_event e) { up->wait_event(e); }); });
    const auto drop = [s](std::vector<native_stream>& u) { u.erase(std::remove(u.begin(), u.end(), s), u.end()); };
    std::shared_lock r{registry_mu};
    each_cache_locked([&](stream_cache& c) {
      for (block* b : c.listed) drop(b->uses);
      for (auto& [addr, u] : c.small_uses) drop(u);
    });
    if (!deferred) return;
    for (auto& c : caches) {  // (a release changes figures: one cache_lock at a time)
      cache_lock g = lock_cache(*c);
      settle_deferred(*c, [s](native_stream d) { return d == s; });
    }
  }

  // f(cache) for every cache under its lock, with one barrier for all the biases revoked:
  // each cache free and unbiased is taken alone (never a barrier), then those biased to
  // another thread or busy all at once (lock_many), where a lock each paid a barrier per
  // biased cache (2-13 us each on the GPU hosts) and holding every lock at once made the
  // threads working on their streams wait (1.5 us more per destruction beside 16 of them,
  // dev VM). One by one if the host is out of memory. f changes no figure (no operation
  // is counted). Caller holds registry_mu.
  template <class F>
  void each_cache_locked(F f) const noexcept
  {
    std::vector<stream_cache*> rest;
    std::vector<cache_mutex*> mus;
    try {
      rest.reserve(caches.size());
      mus.reserve(caches.size());
    } catch (...) {
      for (const auto& c : caches) {
        const std::lock_guard g{c->mu};
        f(*c);
      }
      return;
    }
    for (const auto& c : caches) {
      if (c->mu.try_lock_unbiased()) {
        f(*c);
        c->mu.unlock();
      } else {
        rest.push_back(c.get());
        mus.push_back(&c->mu);
      }
    }
    if (rest.empty()) return;
    cache_mutex::lock_many(mus.data(), mus.size());
    for (stream_cache* c : rest) {
      f(*c);
      c->mu.unlock();
    }
  }

  // stream_closing(s): a released capture pool's cache ordered on s (released) becomes a
  // destroyed stream's, with a fence at s's last work.
  void fence_released(native_stream s) noexcept
  {
    std::shared_lock r{registry_mu};
    for (auto& c : caches) {
      // (released is written under c's lock, so read first without it; capture_pool under registry_mu's unique lock)
      if (!c->released.load(std::memory_order_relaxed) && c->capture_pool == 0) continue;
      cache_lock g = lock_cache(*c);
      if ((!c->released && c->capture_pool == 0) || c->stream != s) continue;
      if (const auto it = by_stream.find(s); c->capture_pool != 0 && it != by_stream.end() && it->second == c.get()) {
        continue;  // (capturing on s)
      }
      if (c->fence != nullptr) up->destroy_event(c->fence);
      c->fence = record_fence(s);
      c->released = false;
    }
  }

  // A held pool's cache c is taken up by a capture on stream `to` (caller holds c's lock):
  // its blocks were ordered on c.stream. `to` waits for that stream's work so far (its
  // fence, if it was destroyed), so the free blocks are `to`'s from now on; a live block
  // lists that stream (as record_stream would) while it lives, so its free waits for the
  // work it does on the block later.
  void hand_pool_over(stream_cache& c, native_stream to) noexcept
  {
    if (!async) return;
    if (c.fence != nullptr) {
      or_finish_device([&] { wait_on(to, c.fence); });
      up->destroy_event(std::exchange(c.fence, nullptr));
      return;  // (destroyed: no later work)
    }
    const native_stream from = c.stream;
    if (!stream_lives(from)) {
      finish_device_outside_capture();
      return;
    }
    or_finish_device([&] { follow_stream(from, [&](native_event e) { wait_on(to, e); }); });
    try {
      uses_listed.store(true, std::memory_order_relaxed);
      const auto list = [&](const block_ref& r) {
        std::vector<native_stream>* u = uses_of(c, r, true);
        if (std::find(u->begin(), u->end(), from) == u->end()) u->push_back(from);
      };
      for (segment* sg = c.segments; sg != nullptr; sg = sg->lnext) {
        for (block* b = sg->head; b != nullptr; b = b->next) {
          if (b->state == block_state::allocated) list({b, nullptr, 0});
        }
      }
      for (const auto& [addr, sm] : c.small_dir) {
        for (unsigned u = 0; u < k_seg_units; u += sm->units[u].size) {
          if (!sm->free_at(u) && sm->units[u].state == block_state::allocated) list({nullptr, sm, u});
        }
      }
    } catch (...) {  // out of host memory: order by the device's work instead
      finish_device_outside_capture();
    }
  }

  // forget_uses() during a capture: s's place in the lists goes to a marker, with a fence.
  void close_in_capture(native_stream s) noexcept
  {
    // (on a stream no capture holds: allowed, BENCHMARKS.md; refused: the capture's end
    // finishes the device's work)
    const native_event fence = record_fence(s);
    native_stream marker = nullptr;
    try {
      const std::lock_guard g{closed_mu};
      marker = reinterpret_cast<native_stream>(k_closed_marker | ++closed_count);
      closed_fences.emplace(marker, fence);
    } catch (...) {  // out of host memory: s stays listed, as before (its event refused later)
      if (fence != nullptr) up->destroy_event(fence);
      return;
    }
    const auto swap_in = [&](native_stream& u) {
      if (u == s) u = marker;
    };
    std::shared_lock r{registry_mu};
    each_cache_locked([&](stream_cache& c) {
      for (block* b : c.listed) std::for_each(b->uses.begin(), b->uses.end(), swap_in);
      for (auto& [addr, u] : c.small_uses) std::for_each(u.begin(), u.end(), swap_in);
      for (auto& d : c.deferred) swap_in(d.first);
    });
  }

  // The host waits for the work a marker stands for (no capture under way). A free that
  // reads a marker in a block's list holds that block's cache lock, and after_captures()
  // drops a batch's markers from every cache's lists, each under its lock, before it
  // forgets their fences: so the fence is found. Were it not, its wait happened already.
  void wait_closed(native_stream marker)
  {
    const std::lock_guard g{closed_mu};
    const auto it = closed_fences.find(marker);
    if (it != closed_fences.end()) wait_fence(it->second);
  }

  // The frees deferred in c whose stream `done(s)` says finished: one wait each settled.
  template <class Done>
  void settle_deferred(stream_cache& c, Done done) noexcept
  {
    auto keep = c.deferred.begin();
    for (auto it = c.deferred.begin(); it != c.deferred.end(); ++it) {
      if (done(it->first)) {
        settle_one(c, it->second);
      } else {
        *keep++ = *it;
      }
    }
    c.deferred.erase(keep, c.deferred.end());
  }

  // The frees deferred in place in c (stream_cache::in_place), as those of c.deferred: an
  // event on each stream of the block's uses, or the device's work finished when one cannot
  // be had (or a free could not list its stream: in_place_sync). A block whose uses name a
  // stream destroyed since the closed fences were waited for (a marker) stays for the next
  // capture's end. Caller holds c's lock; no capture is under way. Allocates nothing but the
  // pending list's room (when that fails, the device is synchronised). The blocks are found
  // by one walk of c's segments: a block that goes back to the cache merges with free
  // neighbours, fills holes and may release its segment, but leaves the next allocated or
  // pending block after it (where the walk goes on) in place, and a segment it releases
  // holds no such block. (A rare path, taken only when host memory ran out in a capture.)
  void settle_in_place(stream_cache& c) noexcept
  {
    bool finished = false;  // the device's work is done
    if (c.in_place_sync) {
      try {
        up->synchronize_device();
        finished = true;
      } catch (...) {  // the device failed: its work is over as far as it will ever be
        finished = true;
      }
      c.in_place_sync = false;
    }
    const auto settle = [&](const block_ref& r) {
      std::vector<native_stream>* uses = uses_of(c, r, false);
      if (!finished && uses != nullptr && std::any_of(uses->begin(), uses->end(), is_marker)) return;
      set_in_place(r, false);
      --c.in_place;
      std::size_t recorded = 0;
      if (!finished && uses != nullptr) {
        try {
          c.pending.reserve(c.pending.size() + uses->size());
          for (native_stream s : *uses) {
            c.pending.emplace_back(record_on(s), r);  // (reserved)
            ++recorded;
          }
        } catch (...) {  // no room, or a stream refused an event: order by the device's work
          for (; recorded > 0; --recorded) {
            up->destroy_event(c.pending.back().first);
            c.pending.pop_back();
          }
          try {
            up->synchronize_device();
          } catch (...) {
          }
        }
      }
      if (uses != nullptr) uses->clear();
      if (recorded > 0) {
        mark_pending(r, static_cast<std::uint16_t>(recorded));
      } else {
        settle_one(c, r);  // its one wait
      }
    };
    for (segment* sg = c.segments; sg != nullptr && c.in_place > 0;) {
      segment* const next_segment = sg->lnext;  // (sg may be released)
      for (block* b = sg->head; b != nullptr;) {
        block* after = b->next;
        while (after != nullptr && (after->state == block_state::free || after->state == k_unmapped)) {
          after = after->next;
        }
        if (b->in_place) settle({b, nullptr, 0});
        b = after;
      }
      sg = next_segment;
    }
    // (backwards: a small segment released leaves the entries before it where they were)
    for (std::size_t i = c.small_dir.size(); i-- > 0 && c.in_place > 0;) {
      small_segment* const sm = c.small_dir[i].second;
      for (unsigned u = 0; u < k_seg_units;) {
        unsigned after = u + sm->units[u].size;
        while (after < k_seg_units && sm->free_at(after)) after += sm->units[after].size;
        if ((sm->units[u].flags & unit_entry::in_place) != 0) settle({nullptr, sm, u});
        u = after;  // (at the end when sm was released: it is not read again)
      }
    }
  }

  // The last capture ended: the events of frees deferred during captures are recorded
  // (pending as usual from now on), then the pools released meanwhile are finished.
  // Under grow_mu, which a beginning capture takes before it returns (its drain), so a
  // synchronisation here never falls inside a capture that began meanwhile.
  void after_captures() noexcept
  {
    const std::lock_guard grow_guard{grow_mu};
    // The streams destroyed during captures first, up to k_batch at a time: the host waits
    // for their fences, then one pass over the caches makes the lists forget their markers
    // and settles their deferred frees. Nothing is allocated (a copy of the list that failed
    // for memory once left the blocks that waited for such streams pending until another
    // capture ended: tests/alloc_failure.cpp). A capture that begins meanwhile stops this:
    // its end does the rest.
    constexpr std::size_t k_batch = 16;
    for (;;) {
      std::array<std::pair<native_stream, native_event>, k_batch> closed{};
      std::size_t n = 0;
      {
        const std::lock_guard g{closed_mu};
        for (auto it = closed_fences.begin(); it != closed_fences.end() && n < k_batch; ++it) closed[n++] = *it;
      }
      if (n == 0) break;
      if (capturing()) return;  // another capture began: its end does this
      for (std::size_t i = 0; i < n; ++i) or_finish_device([&] { wait_fence(closed[i].second); });
      const auto waited = [&](native_stream u) {
        return is_marker(u) && std::any_of(closed.begin(), closed.begin() + static_cast<std::ptrdiff_t>(n),
                                           [u](const auto& m) { return m.first == u; });
      };
      const auto drop = [&](std::vector<native_stream>& u) { u.erase(std::remove_if(u.begin(), u.end(), waited), u.end()); };
      {
        std::shared_lock r{registry_mu};
        for (auto& c : caches) {
          cache_lock g = lock_cache(*c);
          for (block* b : c->listed) drop(b->uses);
          for (auto& [addr, u] : c->small_uses) drop(u);
          settle_deferred(*c, waited);
        }
      }
      const std::lock_guard g{closed_mu};
      for (std::size_t i = 0; i < n; ++i) {
        if (closed[i].second != nullptr) up->destroy_event(closed[i].second);
        closed_fences.erase(closed[i].first);
      }
    }
    {
      std::shared_lock r{registry_mu};
      for (auto& c : caches) {
        cache_lock g = lock_cache(*c);
        if (capturing()) return;  // another capture began: its end does this
        for (auto [s, b] : c->deferred) {
          if (is_marker(s)) continue;  // made since the waits above: its capture's end
          try {
            c->pending.reserve(c->pending.size() + 1);
            const native_event e = record_on(s);
            c->pending.emplace_back(e, b);  // (reserved)
            continue;
          } catch (...) {  // the stream refused it: order by the device's work instead
            try {
              up->synchronize_device();
            } catch (...) {
            }
          }
          settle_one(*c, b);
        }
        std::erase_if(c->deferred, [](const auto& d) { return !is_marker(d.first); });
        if (c->in_place > 0) settle_in_place(*c);
      }
    }
    std::vector<std::uint64_t> due;
    {
      std::shared_lock r{registry_mu};
      for (const auto& p : pools) {
        if (p.releasing) due.push_back(p.pool);
      }
    }
    for (std::uint64_t p : due) {
      try {
        finish_release(p);
      } catch (...) {  // the device failed: the pool stays held, as if not released
      }
    }
  }

  // Ends pool `pool` (marked releasing): once the device's work is done (a replay of a
  // graph that used its memory may still run), its cache is as a destroyed stream's, whose
  // whole free segments other caches take and empty_cache() returns. Caller holds grow_mu
  // (see after_captures). Throws what the device throws, the pool left releasing.
  void finish_release(std::uint64_t pool)
  {
    if (capturing()) return;  // a capture began meanwhile: its end finishes this
    up->synchronize_device();
    std::unique_lock w{registry_mu};
    const auto it = std::find_if(pools.begin(), pools.end(), [&](const capture_state& p) { return p.pool == pool; });
    if (it == pools.end()) return;  // (finished by another thread)
    stream_cache& c = *it->cache;
    pools.erase(it);
    cache_lock g = lock_cache(c);
    c.capture_pool = 0;
    c.closed = true;  // (no fence unless its stream closed meanwhile: the device's work is done)
    // (a destroyed stream's work is done; a raw handle's ordering stays the caller's) A
    // thread's per-thread stream lives until the thread closes it as it exits, with a fence
    // (fence_released): without one it is live, though stream_lives() says so only on its
    // own thread, and this may be another (a block of it freed later, unnamed, would have
    // been ordered on nothing). Its key is never reused, so no stale fence is left here.
    c.released = stream_lives(c.stream) || (per_thread(c.stream) && c.fence == nullptr);
    if (!on_spare_list(c)) list_spare(c);
  }

  struct closing_watcher final : stream_registry::watcher {
    explicit closing_watcher(impl* m) noexcept : owner{m} {}
    void stream_closing(device_id d, native_stream s) noexcept override { owner->stream_closing(d, s); }
    impl* owner;
  };
  closing_watcher closing_watch{this};

  // Whole free segments of another stream, moved to `c` once work on c's stream is ordered
  // after their last uses (order_after), then the block taken from `c`. From a destroyed
  // stream's cache every whole free segment of the kind asked for (dense, linked small,
  // large) moves at once: one order (an event, or a device synchronisation) for all of
  // them, where one per segment cost a synchronisation per segment to a thread that moved
  // to a new stream (a benchmark's repetition, a code that makes a stream per phase). From a
  // live stream's cache one moves, the smallest that fits (a dense one: any), one whose
  // last free c's stream is already ordered after where there is one (order_steal): taking all
  // made one thread alternating among 4 streams take memory over at 9.6 % of its
  // allocations at requests to 64 MiB, back and forth; one, at 2.1 %. (Taking the victim's
  // spare block records along measured slower: they are cold.) Both caches are locked with
  // try_lock (never blocking while holding one), so this cannot deadlock with lock_all(),
  // and a segment is never in neither cache. `live`: from every other cache; else only from
  // those of destroyed streams (closed), whose memory nothing else would use.
  block_ref steal(stream_cache& c, std::size_t size, bool small, std::size_t bytes, bool live)
  {
    if (capturing()) return {};  // (an order needs an event, a fallback a synchronisation)
    std::shared_lock r{registry_mu};
    const bool want_dense = dense(size);
    // First the k_first other caches that hold the most segments, most first (a glance at
    // each count, no lock), then the rest in the registry's order. Taken in the registry's
    // order alone, the first caches gave again and again and took back as often: one thread
    // alternating among streams, requests to 64 MiB, a simulated asynchronous device, moves
    // per 100 000 allocations (mean of seeds 1-5; most are a stream query each), 4 streams
    // 2 650 against 1 650 now, 8 streams 13 200 against 6 300 (the one most, 7 700; four,
    // 6 400), the same memory reserved (2.1-2.5 GiB).
    constexpr std::size_t k_first = 2;
    std::array<stream_cache*, k_first> first{};
    std::array<std::uint32_t, k_first> first_held{};
    if (live) {
      for (auto& other : caches) {
        std::uint32_t h = other->held.load(std::memory_order_relaxed);
        if (h <= first_held[k_first - 1] || other.get() == &c || other->capture_pool != 0) continue;
        stream_cache* o = other.get();
        for (std::size_t i = 0; i < k_first && o != nullptr; ++i) {  // (insertion, most first)
          if (h > first_held[i]) {
            std::swap(h, first_held[i]);
            std::swap(o, first[i]);
          }
        }
      }
      for (stream_cache* o : first) {
        if (o == nullptr) break;
        if (block_ref b = steal_from(*o, c, size, small, bytes, live, want_dense); b.found()) return b;
      }
    }
    for (auto& other : caches) {
      if (std::find(first.begin(), first.end(), other.get()) != first.end()) continue;
      if (block_ref b = steal_from(*other, c, size, small, bytes, live, want_dense); b.found()) return b;
    }
    return {};
  }
  // steal() from one other cache.
  block_ref steal_from(stream_cache& other, stream_cache& c, std::size_t size, bool small, std::size_t bytes,
                       bool live, bool want_dense)
  {
    if (&other == &c || other.capture_pool != 0) return {};
    if (other.held.load(std::memory_order_relaxed) == 0) return {};  // (a moment ago: nothing to give)
    if (std::try_lock(other.mu, c.mu) != -1) return {};
    count_as_mine(c);  // (other's changes, a segment gone, in its own delta)
    const cache_lock other_lock{figures, other, std::adopt_lock};
    const cache_lock own_lock{figures, c, std::adopt_lock};
    if (!live && !other.closed) return {};
    // A closed stream's cache gives every movable segment, a live one's gives one.
    const bool all = other.closed;
    // The segments' last frees were ordered on the other stream: order_after() makes
    // work on this one wait for them (an event where the stream's lifetime is known, a
    // device synchronisation for a raw handle). This is the miss path, in place of an
    // upstream allocation.
    if (want_dense) {
      // Blocks the other cache keeps for reuse merged first (a segment that holds one is
      // not whole free), as an operation of that cache's own, published at once: its
      // figures changed in this cache's operation, between its own operations, and a
      // peak of the batched statistics went astray when they waited there.
      if (other.reuse_units != 0) {
        merge_kept(other);
        figures.publish(*other.delta, true);
      }
      auto& from = other.small_dir;
      const auto n = std::min<std::size_t>(
          static_cast<std::size_t>(
              std::count_if(from.begin(), from.end(), [&](const auto& d) { return d.second->whole_free(); })),
          all ? from.size() : 1);
      if (n == 0) return {};
      c.reserve_small(n);  // may throw: nothing changed yet
      // From a live cache: one whole free segment, one that c's stream is already ordered
      // after where there is one (no event), else the first.
      const small_segment* pick = nullptr;
      if (!all) {
        for (const auto& d : from) {
          if (!d.second->whole_free()) continue;
          if (pick == nullptr) pick = d.second;
          if (covered(c, other, d.second->freed_gen)) {
            pick = d.second;
            break;
          }
        }
      }
      order_steal(other, c, all ? 0 : pick->freed_gen);
      std::size_t left = n;
      c.take_small_from(
          other,
          [&left, pick](const small_segment& s) {
            return left > 0 && s.whole_free() && (pick == nullptr || &s == pick) && (--left, true);
          },
          [&](small_segment& s) {
            small_unindex(other, s, 0);
            small_index(c, s, 0);
            s.freed_gen = c.steal_gen;  // (in c's count from now on: ordered after c's stream now)
            record_move(other, c, s.addr, k_small_segment);
          });
    } else {
      const auto movable = [small](const segment* s) {
        return s->small == small && s->whole_free();
      };
      const auto move = [&](segment* s) {
        unindex(other, s->head);
        unlink_segment(other, s);
        link_segment(c, s);
        s->head->requested = freed_stamp(c);  // (its free stamp, in c's count from now on)
        index(c, s->head);
        if (other.growing == s) other.growing = nullptr;  // (an expandable one grows where it is)
        if (s->reserved != 0 && c.growing == nullptr) c.growing = s;
        record_move(other, c, s->addr, s->size);
      };
      // One: the smallest that fits, of those c's stream is already ordered after where
      // one fits (no event; host backend, 100 000 x 64 MiB on 4 streams: 31 % fewer events
      // than the smallest of all), else of all (when all move: the first movable one,
      // where they start).
      segment* best = nullptr;
      segment* best_covered = nullptr;
      for (segment* s = other.segments; s != nullptr; s = s->lnext) {
        if (!movable(s)) continue;
        if (all) {
          best = s;
          break;
        }
        if (s->size < size) continue;
        if (best == nullptr || s->size < best->size) best = s;
        if (covered(c, other, freed_gen(s->head)) && (best_covered == nullptr || s->size < best_covered->size)) {
          best_covered = s;
        }
      }
      if (best_covered != nullptr) best = best_covered;
      if (best == nullptr) return {};
      order_steal(other, c, all ? 0 : freed_gen(best->head));
      if (all) {
        for (segment* s = best; s != nullptr;) {
          segment* const next = s->lnext;  // (read before s moves to c's list)
          if (movable(s)) move(s);
          s = next;
        }
      } else {
        move(best);
      }
      // The splits of those segments will want block records and live-table room, which
      // the other cache has and may not need again (a stream that is gone): a new
      // stream's cache made them anew, ~30 heap chunks and a table grown to 4 096 slots,
      // page faults included, at each repetition of 10 000 x 1 MiB (~0.05 us a pair).
      if (c.spare == nullptr) c.spare = std::exchange(other.spare, nullptr);
      if (c.live.empty() && other.live.empty() && c.live.capacity() < other.live.capacity()) {
        std::swap(c.live, other.live);
      }
    }
    return take(c, size, small, bytes);
  }

  // (counted in num_ooms by miss(), once no handler takes it)
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, native_stream s,
                              const std::string& cause)
  {
    trace_event e;
    e.kind = trace_kind::out_of_memory;
    e.time_ns = now_ns();
    e.size = size;
    e.requested = bytes;
    e.stream = reinterpret_cast<std::uintptr_t>(s);
    e.thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
    record(e);
    const memory_stats st = stats();
    std::string device_state = "free/total unknown";
    try {
      const memory_info m = up->memory();
      device_state = format_bytes(m.free_bytes) + " free of " + format_bytes(m.total_bytes);
    } catch (...) {
    }
    const auto reserved = static_cast<std::size_t>(st.reserved_bytes.all.current);
    const auto allocated = static_cast<std::size_t>(st.allocated_bytes.all.current);
    std::ostringstream msg;
    msg << "depot: " << dev.to_string() << " out of memory: tried to allocate "
        << format_bytes(bytes) << " (" << bytes << " bytes) on stream " << format_address(s)
        << "; " << cause << ". The device has " << device_state << "; depot holds "
        << format_bytes(reserved) << " reserved, of which " << format_bytes(allocated)
        << " allocated and " << format_bytes(reserved - allocated)
        << " reserved but unallocated (largest free block "
        << format_bytes(static_cast<std::size_t>(st.largest_free_block)) << ", fragmentation "
        << std::to_string(st.fragmentation).substr(0, 4) << ").";
    if (limit != k_unlimited) {
      msg << " per_process_memory_fraction=" << cfg.per_process_memory_fraction << " caps depot at "
          << format_bytes(limit) << ": raise it in DEPOT_ALLOC_CONF if the device has room.";
    } else if (reserved - allocated >= size && st.fragmentation > 0.5) {
      msg << " The cached memory would suffice but is fragmented: set DEPOT_ALLOC_CONF="
             "max_split_size_mb:"
          << std::max<std::size_t>(size >> 20, 1) << " so large blocks are not split";
      if (vm_page == 0 && !cfg.expandable_segments) {
        msg << ", or expandable_segments:true so large blocks grow one range of addresses";
      }
      msg << ".";
    } else {
      msg << " Free tensors you no longer need, use smaller batches, or check other processes "
             "on the device.";
    }
    throw out_of_memory(msg.str(), bytes, dev);
  }

  static std::size_t segment_size(std::size_t size, bool small) noexcept
  {
    if (small) return k_small_segment;
    if (size < k_mid_request) return k_large_segment;
    return (size + k_large_round - 1) / k_large_round * k_large_round;
  }

  // Upstream memory for a new segment, or nullptr when the limit or the upstream refuses.
  void* grow(std::size_t seg_bytes)
  {
    const auto reserved = static_cast<std::size_t>(figures.total(q_reserved));
    if (limit != k_unlimited && reserved + seg_bytes > limit) return nullptr;
    try {
      return up->allocate(seg_bytes);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }

  // garbage_collection_threshold: when growing by `bytes` would take the reserved memory
  // past that fraction of the allowed total, the free cache is released first.
  void collect_before_growing(std::size_t bytes)
  {
    if (cfg.garbage_collection_threshold <= 0.0 || capturing()) return;
    const double cap = static_cast<double>(limit != k_unlimited ? limit : up->memory().total_bytes);
    if (static_cast<double>(figures.total(q_reserved) + static_cast<std::int64_t>(bytes)) >
        cfg.garbage_collection_threshold * cap) {
      flush_all(false);
    }
  }

  // Takes a free block of this cache's pool (caller holds c.mu).
  block_ref take(stream_cache& c, std::size_t size, bool small, std::size_t bytes)
  {
    if (dense(size)) return small_take_free(c, static_cast<unsigned>(size >> k_unit_shift), bytes);
    return {take_free(c, size, small, bytes), nullptr, 0};
  }

  // Maps the pages a large request of `size` needs at the end of this cache's expandable
  // segment (reserving one first if it has none), beyond its last block when that is free,
  // then takes the block (caller holds grow_mu, not c.mu). Nothing when the limit, the
  // upstream or the reservation refuses (no_range: no addresses could be reserved); nothing
  // changed then.
  block_ref expand(stream_cache& c, std::size_t size, std::size_t bytes, bool& no_range)
  {
    cache_lock g = lock_cache(c);
    if (block_ref b = take(c, size, false, bytes); b.found()) return b;
    if (!c.holes.empty()) {  // pages unmapped inside a range first, before its end grows
      make_room(c, 2);  // the rest of the hole's record and a split's
      if (block_ref b = fill_hole(c, size, bytes); b.found()) return b;
    }
    segment* s = c.growing;
    block* t = s != nullptr ? s->last : nullptr;
    const std::size_t have = t != nullptr && t->state == block_state::free ? t->size : 0;
    const std::size_t need = (size > have ? size - have + vm_page - 1 : vm_page) / vm_page * vm_page;
    const auto reserved = static_cast<std::size_t>(figures.total(q_reserved));
    if (limit != k_unlimited && reserved + need > limit) return {};
    if (s != nullptr && s->size + need > s->reserved) return {};
    make_room(c, 2);  // the new block's record and a split's: nothing below can throw
    std::unique_ptr<segment> fresh;
    segment_directory::node_type listed;
    if (s == nullptr) {
      listed = segment_directory::spare();
      fresh = std::make_unique<segment>();
      try {
        fresh->addr = reinterpret_cast<std::uintptr_t>(up->vm_reserve(vm_span));
      } catch (const out_of_memory&) {
        no_range = true;
        return {};
      }
      fresh->reserved = vm_span;
      s = fresh.get();
    }
    const std::size_t first = s->size / vm_page;
    const auto drop = [&]() noexcept {  // the new pages' handles, and a new range
      s->maps.resize(first);
      if (fresh) up->vm_release(reinterpret_cast<void*>(s->addr), s->reserved);
    };
    bool mapped = false;
    try {
      s->maps.resize(first + need / vm_page);
      mapped = map_pages(*s, first, need / vm_page);
    } catch (...) {
      drop();
      throw;
    }
    if (!mapped) {
      drop();
      return {};
    }
    const std::uintptr_t at = s->addr + s->size;
    if (fresh) {
      block* b = new_block(c);
      b->addr = s->addr;
      b->size = need;
      b->seg = s;
      s->head = s->last = b;
      s->size = need;
      link_segment(c, fresh.release());
      directory.add(std::move(listed), s->addr, s->reserved, &s->cache);
      c.growing = s;
      index(c, b);
      record(event_of(trace_kind::segment_allocate, s->addr, need, 0, c.stream));
      c.delta->change_segments(false, need, +1);
    } else {
      if (have != 0) {
        unindex(c, t);
        t->size += need;
        index(c, t);
      } else {
        index(c, link_after(c, t, at, need));
      }
      s->size += need;
      record(event_of(trace_kind::segment_map, at, need, 0, c.stream));
      c.delta->change_mapped(false, need, +1);
    }
    // The last block now fits: hand it out (the index's search of size's own class is
    // bounded, so take() could miss it).
    block* b = s->last;
    unindex(c, b);
    hand_out(c, b, size, bytes);
    return {b, nullptr, 0};
  }

  // Whether a miss that would grow the reserved memory by `bytes` takes over a live
  // stream's whole free segment first (steal_threshold; 0: always): else it grows, and
  // takes one over only when growing is refused. A steal from a live stream makes this
  // stream wait for all of that stream's queued work (an event record and a wait).
  [[nodiscard]] bool steals_first(std::size_t bytes) const noexcept
  {
    if (cfg.steal_threshold == k_unlimited) return false;
    const auto reserved = static_cast<std::size_t>(std::max<std::int64_t>(figures.total(q_reserved), 0));
    return bytes > cfg.steal_threshold || reserved > cfg.steal_threshold - bytes;
  }

  // allocate_miss, and when it throws out_of_memory the handler set (set_oom_handler),
  // with no lock of this allocator held, until it declines: then the exception goes on,
  // counted in num_ooms.
  [[gnu::noinline]] block_ref miss(stream_cache& c, std::size_t size, bool small, std::size_t bytes,
                                   native_stream s)
  {
    for (unsigned attempt = 1;; ++attempt) {
      try {
        return allocate_miss(c, size, small, bytes, s);
      } catch (const out_of_memory& e) {
        std::shared_ptr<const oom_handler> handler;
        {
          const std::lock_guard g{oom_mu};
          handler = on_oom;
        }
        if (handler == nullptr || !(*handler)(e, attempt)) {
          ooms.fetch_add(1);
          throw;
        }
      }
    }
  }
  void set_oom_handler(oom_handler h)
  {
    auto handler = h ? std::make_shared<const oom_handler>(std::move(h)) : nullptr;
    const std::lock_guard g{oom_mu};
    on_oom.swap(handler);  // (the old one is destroyed after the lock is given back)
  }

  // A request's miss: destroyed streams' whole free segments, then live streams' ones
  // where steals_first(), then new memory (expandable: pages), then live streams' whole
  // free segments, then all of that again after waiting for pending frees and releasing
  // the cache; else out of memory.
  // Out of line: inlined into allocate(), its growth moved the hit path's code (+8
  // instructions per allocation when the steal policy came).
  [[gnu::noinline]] block_ref allocate_miss(stream_cache& c, std::size_t size, bool small, std::size_t bytes,
                                            native_stream s)
  {
    std::lock_guard grow_guard{grow_mu};
    {
      cache_lock g = lock_cache(c);  // another thread may have freed meanwhile
      if (block_ref b = take(c, size, small, bytes); b.found()) return b;
    }
    const bool live_first = steals_first(!small && vm_page != 0 ? size : segment_size(size, small));
    if (block_ref b = steal(c, size, small, bytes, live_first); b.found()) return b;
    if (!small && vm_page != 0 && !capturing()) {  // (no mapping calls during a capture)
      if (block_ref b = allocate_expanding(c, size, bytes, s, live_first); b.found()) return b;
    }

    std::size_t seg_bytes = segment_size(size, small);
    collect_before_growing(seg_bytes);
    void* p = grow(seg_bytes);
    if (p == nullptr && seg_bytes > size) {  // a 20 MiB segment may not fit where the block does
      seg_bytes = small ? k_small_segment : (size + k_large_round - 1) / k_large_round * k_large_round;
      p = grow(seg_bytes);
    }
    if (p == nullptr) {
      if (block_ref b = reclaim(c, size, small, bytes, live_first); b.found()) return b;
      p = grow(seg_bytes);
    }
    if (p == nullptr) {
      const bool capped = limit != k_unlimited &&
                          static_cast<std::size_t>(figures.total(q_reserved)) +
                                  seg_bytes > limit;
      throw_oom(bytes, size, s,
                capped ? "the per-process limit is reached"
                : capturing()
                    ? "the upstream allocation of " + format_bytes(seg_bytes) +
                          " failed; a graph capture is under way, so the cache was not released "
                          "(no event may be waited for and no memory freed until the capture ends)"
                    : "the upstream allocation of " + format_bytes(seg_bytes) + " failed after releasing the cache");
    }
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    cache_lock g = lock_cache(c);
    block_ref out;
    try {
      segment_directory::node_type listed = segment_directory::spare();
      if (dense(size)) {
        c.reserve_small();
        small_segment* seg = small_table.acquire(addr);
        if (seg == nullptr) {
          throw out_of_memory("depot: " + dev.to_string() + " caching allocator: more than " +
                                  std::to_string(segment_table::capacity) + " small-pool segments (" +
                                  format_bytes(segment_table::capacity * k_small_segment) + ")",
                              bytes, dev);
        }
        try {
          small_make_room(*seg);
        } catch (...) {
          small_table.release(*seg);
          throw;
        }
        c.add_small(seg);
        directory.add(std::move(listed), addr, seg_bytes, &seg->cache);
        out = {nullptr, seg, 0};
      } else {
        auto seg = std::make_unique<segment>();
        seg->addr = addr;
        seg->size = seg_bytes;
        seg->small = small;
        make_room(c, 2);  // the segment's record and a split's
        block* b = new_block(c);
        b->addr = addr;
        b->size = seg_bytes;
        b->seg = seg.get();
        b->small = small;
        seg->head = b;
        seg->last = b;
        segment* const made = seg.release();
        link_segment(c, made);
        directory.add(std::move(listed), addr, seg_bytes, &made->cache);
        out = {b, nullptr, 0};
      }
    } catch (...) {
      up->deallocate(p, seg_bytes);
      throw;
    }
    record(event_of(trace_kind::segment_allocate, addr, seg_bytes, 0, c.stream));
    c.delta->change_segments(small, seg_bytes, +1);
    if (out.seg != nullptr) {
      small_hand_out(c, *out.seg, 0, static_cast<unsigned>(size >> k_unit_shift), bytes);
    } else {
      hand_out(c, out.large, size, bytes);
    }
    return out;
  }

  // Growing was refused: a live stream's whole free segment (unless `live_tried`: the miss
  // tried that before growing), then, counted as a retry, the cache released after waiting
  // for pending frees, and this cache's own free blocks and other streams' segments tried
  // again. Nothing found: the caller grows once more, or throws out_of_memory.
  block_ref reclaim(stream_cache& c, std::size_t size, bool small, std::size_t bytes, bool live_tried)
  {
    if (capturing()) return {};  // waiting and releasing would invalidate the capture
    if (!live_tried) {
      if (block_ref b = steal(c, size, small, bytes, true); b.found()) return b;
    }
    retries.fetch_add(1);
    flush_all(true);
    {
      cache_lock g = lock_cache(c);  // frees that were pending may have come back here
      if (block_ref b = take(c, size, small, bytes); b.found()) return b;
    }
    return steal(c, size, small, bytes, true);
  }

  // allocate_miss of a large block with expandable segments: the same retries, mapping
  // pages in place of new segments. Nothing when no range of addresses could be reserved
  // (the address space is finite: a range per stream as large as the device): the caller
  // makes an ordinary segment instead.
  block_ref allocate_expanding(stream_cache& c, std::size_t size, std::size_t bytes, native_stream s,
                               bool live_tried)
  {
    collect_before_growing(size);
    bool no_range = false;
    if (block_ref b = expand(c, size, bytes, no_range); b.found() || no_range) return b;
    if (block_ref b = reclaim(c, size, false, bytes, live_tried); b.found()) return b;
    if (block_ref b = expand(c, size, bytes, no_range); b.found() || no_range) return b;
    const bool capped = limit != k_unlimited && static_cast<std::size_t>(figures.total(q_reserved)) + size > limit;
    throw_oom(bytes, size, s,
              capped ? "the per-process limit is reached"
                     : "mapping " + format_bytes(size) +
                           " more into the stream's expandable segment failed after releasing the cache");
  }

  // The live block at `p` in cache `c` (caller holds c.mu), or nothing. `erase`: a large
  // block leaves the table of live blocks (deallocate puts it back if it then refuses).
  static block_ref find_live(stream_cache& c, std::uintptr_t p, bool erase) noexcept
  {
    // The live table first: a linked block is found in one probe, where the small
    // segments' frame table takes two misses first (a dense block pays one miss here,
    // none while its cache hands out no linked block).
    if (block* b = erase ? c.live.erase(p) : c.live.find(p)) return {b, nullptr, 0};
    if (small_segment* s = c.small_segment_of(p)) {
      const std::uintptr_t off = p - s->addr;
      const auto u = static_cast<unsigned>(off >> k_unit_shift);
      const unit_entry& e = s->units[u];
      if ((off & (k_align - 1)) != 0 || (e.flags & unit_entry::head) == 0 ||
          e.state != block_state::allocated) {
        return {};
      }
      return {nullptr, s, u};
    }
    return {};
  }

  // The common free, finished at once: a block of the locked cache (an operation begun)
  // freed on its own stream with no other stream recorded, no tracing and the size right if
  // given. Returns true, the lock given back; returns false, changing nothing, otherwise.
  [[gnu::always_inline]] bool free_simple(cache_lock& lock, const block_ref& b, native_stream stream,
                                          bool stream_given, std::size_t expected) noexcept
  {
    stream_cache& c = lock.cache();
    if (tracing.load(std::memory_order_relaxed) || c.closed || (stream_given && stream != c.stream)) return false;
    if (b.large == nullptr) {
      const unit_entry& e = b.seg->units[b.unit];
      // flags exactly `head`: no other stream recorded (has_uses)
      if (e.flags != unit_entry::head || (expected != 0 && expected != e.requested)) return false;
      c.delta->count_free(true, unit_bytes(e.size), e.requested);
      small_free(c, *b.seg, b.unit);
    } else {
      block* k = b.large;
      if (k->has_uses || (expected != 0 && expected != k->requested)) return false;
      if (k->small) {  // (the pool as a constant: see index)
        c.delta->count_free(true, k->size, k->requested);
        release_block(c, k, true);
      } else {
        c.delta->count_free(false, k->size, k->requested);
        release_block(c, k, false);
      }
    }
    lock.unlock();
    return true;
  }

  // deallocate() past free_simple(): events for other streams, tracing, errors.
  void free_general(const block_ref& b, cache_lock lock, native_stream stream, bool stream_given,
                    std::size_t expected_bytes);

  // Finds a live block and locks the cache that holds it: first the cache of `hint` (the
  // stream named by the caller, or the calling thread's last one), then every other cache.
  // Throws depot::invalid_argument, changing nothing, when no cache holds it.
  std::pair<block_ref, cache_lock> lookup(void* ptr, stream_cache* hint, bool erase)
  {
    if (hint != nullptr) {
      if (auto found = lookup_in(*hint, ptr, erase); found.first.found()) return found;
    }
    return lookup_elsewhere(ptr, hint, erase);
  }

  // The live block at ptr in cache c, locked; or nothing, with c unlocked again.
  std::pair<block_ref, cache_lock> lookup_in(stream_cache& c, void* ptr, bool erase)
  {
    const block_ref b = find_locked(c, ptr, erase);
    if (!b.found()) return {b, cache_lock{}};
    return {b, cache_lock{figures, c, std::adopt_lock}};
  }
  // lookup_in() without the pair: c's lock is held when a block was found (an operation
  // begun), given back when not.
  [[gnu::always_inline]] block_ref find_locked(stream_cache& c, void* ptr, bool erase) noexcept
  {
    lock_for_op(c);
    const block_ref b = find_live(c, reinterpret_cast<std::uintptr_t>(ptr), erase);
    if (!b.found()) unlock_unused(c);
    return b;
  }

  // lookup() past the hinted cache: the cache where this thread found a block of ptr's
  // 2 MiB frame last (tl_frames), the cache of this thread's last operation here, the cache
  // the directory of segments names, then every other cache, or the error. A thread that
  // frees what another made (a consumer) finds its next block where it found the last: the
  // frees of a producer's blocks on the last of 16 streams walked 15 caches each, 1.28 us a
  // free against 27 ns named (depot-bench alloc's "frees from another thread",
  // BENCHMARKS.md). The walk: the caches one at a time,
  // each read under the registry's lock and searched after it is given back (no cache lock
  // is taken under it): caches are only ever appended, so an index walks them all. Nothing
  // allocated: a free must not fail for host memory (a copy of the list here made frees on
  // another stream throw std::bad_alloc, tests/alloc_failure.cpp).
  [[gnu::noinline]] std::pair<block_ref, cache_lock> lookup_elsewhere(void* ptr, stream_cache* hint, bool erase)
  {
    stream_cache* last = nullptr;  // (caches live as long as their allocator, whose id is never reused)
    for (const thread_caches::op_entry& e : tl_caches.ops) {
      if (e.owner == id) {
        last = e.stats->last;
        break;
      }
    }
    // Where this thread found a block of ptr's frame last (tl_frames).
    const std::uintptr_t frame = reinterpret_cast<std::uintptr_t>(ptr) / k_small_segment;
    frame_hint& seen = tl_frames.slot(frame);
    stream_cache* const guess = seen.owner == id && seen.frame == frame ? seen.cache : nullptr;
    if (guess != nullptr && guess != hint) {
      if (auto found = lookup_in(*guess, ptr, erase); found.first.found()) return found;
    }
    if (last != nullptr && last != hint && last != guess) {
      if (auto found = lookup_in(*last, ptr, erase); found.first.found()) {
        seen = frame_hint{id, frame, last};
        return found;
      }
    }
    // The cache whose segment holds ptr. (A live block's segment stays in its cache: only
    // whole free segments move. The walk below stays for what this does not find: a
    // double free's error, or a pointer from elsewhere.)
    stream_cache* const owner = directory.owner_of(reinterpret_cast<std::uintptr_t>(ptr));
    if (owner != nullptr && owner != hint && owner != last && owner != guess) {
      if (auto found = lookup_in(*owner, ptr, erase); found.first.found()) {
        seen = frame_hint{id, frame, owner};
        return found;
      }
    }
    for (std::size_t i = 0;; ++i) {
      stream_cache* c = nullptr;
      {
        std::shared_lock r{registry_mu};
        if (i >= caches.size()) break;
        c = caches[i].get();
      }
      if (c == hint || c == last || c == owner || c == guess) continue;
      if (auto found = lookup_in(*c, ptr, erase); found.first.found()) return found;
    }
    throw invalid_argument("depot: " + dev.to_string() + " caching allocator: pointer " +
                           format_address(ptr) +
                           " is not a live allocation of this allocator (a double free, or "
                           "memory from elsewhere); nothing was changed");
  }

  // allocate() found locked cache c serving another stream than s (taken over since the
  // thread remembered it): given back, and s's cache from the registry locked instead.
  [[gnu::noinline]] stream_cache* relock(stream_cache* c, native_stream s)
  {
    while (c->stream != s) {
      unlock_unused(*c);
      // (not the thread's table again: a cache taken over before the route changed, which
      // the registry's lock waits out)
      tl_streams.slot(reinterpret_cast<std::uintptr_t>(s)) = {};
      c = find_cache(s, true);
      lock_for_op(*c);
    }
    return c;
  }

  stream_cache* hint_for(native_stream s, bool stream_given)
  {
    if (stream_given) return cache_ptr<false>(s);
    const thread_caches::entry& t = tl_caches.entries[0];
    return t.owner == route.load(std::memory_order_relaxed) ? t.cache : nullptr;
  }

  // Every cache's lock (lock_all), held as long as this lives.
  class all_locks {
   public:
    explicit all_locks(const impl& m) { m.lock_all(locks_); }

   private:
    std::vector<std::unique_lock<cache_mutex>> locks_;
  };

  // Every cache's lock, in registry order, with one barrier for all the biases revoked
  // (a lock each paid one per cache biased to another thread: 2-13 us each on the hosts
  // measured, BENCHMARKS.md).
  void lock_all(std::vector<std::unique_lock<cache_mutex>>& locks) const
  {
    std::vector<cache_mutex*> all;  // allocated before any lock is taken
    all.reserve(caches.size());
    locks.reserve(caches.size());
    for (const auto& c : caches) all.push_back(&c->mu);
    cache_mutex::lock_many(all.data(), all.size());
    for (cache_mutex* mu : all) locks.emplace_back(*mu, std::adopt_lock);
  }

  memory_stats stats_locked() const
  {
    memory_stats s;
    s.allocated_bytes = figures.load(q_allocated);
    s.requested_bytes = figures.load(q_requested);
    s.reserved_bytes = figures.load(q_reserved);
    for (auto [dst, p] : {std::pair{&s.cached_bytes.large, 0}, std::pair{&s.cached_bytes.small, 1}}) {
      const stat& r = p == 0 ? s.reserved_bytes.large : s.reserved_bytes.small;
      const stat& a = p == 0 ? s.allocated_bytes.large : s.allocated_bytes.small;
      // Bytes enter the cache when blocks are freed or segments added, leave when blocks
      // are handed out or segments released.
      *dst = stat{r.current - a.current, figures.cached_peak_of(p),
                  a.freed + r.allocated, a.allocated + r.freed};
    }
    s.cached_bytes.all = stat{s.cached_bytes.large.current + s.cached_bytes.small.current,
                              figures.cached_peak_of(2),
                              s.cached_bytes.large.allocated + s.cached_bytes.small.allocated,
                              s.cached_bytes.large.freed + s.cached_bytes.small.freed};
    s.active_bytes = figures.load(q_active);
    s.inactive_split_bytes = figures.load(q_inactive_split);
    s.num_allocations = figures.load(q_num_allocations);
    s.num_segments = figures.load(q_num_segments);
    s.num_cache_hits = -hits_base;
    for (const auto& c : caches) s.num_cache_hits += c->hits;
    s.num_cache_misses = misses.load();
    const auto calls = s.num_cache_hits + s.num_cache_misses;
    s.cache_hit_rate = calls > 0 ? static_cast<double>(s.num_cache_hits) / static_cast<double>(calls) : 0.0;
    s.peak_allocated = s.allocated_bytes.all.peak;
    s.peak_cached = s.cached_bytes.all.peak;
    s.num_alloc_retries = retries.load();
    s.num_ooms = ooms.load();
    s.num_segments_moved = moves.load();
    s.num_move_events = move_events.load();
    s.num_move_syncs = move_syncs.load();
    std::size_t largest = 0;
    std::size_t free_total = 0;
    for (const auto& c : caches) {
      largest = std::max({largest, c->pools[0].largest(), c->pools[1].largest(), c->small.largest(),
                          largest_kept(*c)});
      free_total += c->pools[0].bytes() + c->pools[1].bytes() + c->small.bytes() + unit_bytes(c->reuse_units);
    }
    s.largest_free_block = static_cast<std::int64_t>(largest);
    s.fragmentation = free_total > 0 ? 1.0 - static_cast<double>(largest) / static_cast<double>(free_total) : 0.0;
    return s;
  }

  // Restarts the peaks, and with `totals` the totals too, with every cache locked (so no
  // operation is half-counted).
  void reset_stats(bool totals)
  {
    std::shared_lock r{registry_mu};
    const all_locks locks{*this};
    publish_all();
    if (totals) {
      hits_base = 0;
      for (auto& c : caches) hits_base += c->hits;
      figures.reset_totals();
    } else {
      figures.reset_peaks();
    }
  }

  memory_stats stats() const
  {
    std::shared_lock r{registry_mu};
    const all_locks locks{*this};
    publish_all();
    return stats_locked();
  }

  // ---- fork() ------------------------------------------------------------------------------
  // Every lock of this allocator, taken before a fork in the order its operations take them
  // (growth, the registry, the caches, then the leaves under a cache's lock), so the child
  // gets it whole: no operation half done, no lock held by a thread the child lacks (which
  // it would wait on for ever; glibc's malloc guards its arenas the same way).
  void fork_hold() noexcept
  {
    grow_mu.lock();
    registry_mu.lock();
    try {
      std::vector<std::unique_lock<cache_mutex>> locks;
      lock_all(locks);  // one barrier for all the biases
      for (auto& l : locks) l.release();  // held until fork_release()
    } catch (...) {  // out of host memory (before any lock was taken): one by one, in order
      for (const auto& c : caches) c->mu.lock();
    }
    stats_mu.lock();
    figures.mu.lock();
    small_table.fork_hold();
    directory.fork_hold();
    importers.fork_hold();
    trace_mu.lock();
    oom_mu.lock();
    closed_mu.lock();  // (a leaf: taken under a cache's lock by a free's wait_closed)
    up->fork_hold();
  }
  // After the fork: given back in the parent; in the child (the forking thread alone) made
  // free, and unbiased (the threads the caches were biased to are not there).
  void fork_release(bool child) noexcept
  {
    up->fork_release(child);
    release_after_fork(closed_mu, child);
    release_after_fork(oom_mu, child);
    release_after_fork(trace_mu, child);
    importers.fork_release(child);
    directory.fork_release(child);
    small_table.fork_release(child);
    figures.mu.unlock();
    // (the parent's other threads' thread_stats stay theirs in the child: published by its
    // readers, never taken over)
    release_after_fork(stats_mu, child);
    for (const auto& c : caches) {
      if (child) {
        c->mu.reset_in_child();
      } else {
        c->mu.unlock();
      }
    }
    release_after_fork(registry_mu, child);
    release_after_fork(grow_mu, child);
  }

  // The allocators of this process, for the atfork handlers (registered with the first).
  struct fork_list {
    std::mutex mu;
    std::vector<impl*> all;
  };
  static fork_list& forks() noexcept
  {
    static auto* const l = new fork_list;  // never destroyed: allocators may outlive statics
    return *l;
  }
  static void enlist(impl* m)
  {
    install_fork_handlers();
    fork_list& l = forks();
    std::lock_guard g{l.mu};
    l.all.push_back(m);  // may throw std::bad_alloc: not listed, the caller gives up
  }
  static void delist(impl* m) noexcept
  {
    fork_list& l = forks();
    std::lock_guard g{l.mu};
    std::erase(l.all, m);
  }
  // f(allocator) for every live allocator whose streams are of backend k (under the list's
  // lock, taken before any allocator's, as in fork_prepare).
  template <class F>
  static void for_each_of_kind(device_kind k, F f)
  {
    fork_list& l = forks();
    std::lock_guard g{l.mu};
    for (impl* m : l.all) {
      if (m->streams_of.kind == k) f(*m);
    }
  }
  // The process-wide order: the pools' slots, the list, the stream registry's watchers
  // (held across a stream's closing, which takes allocator locks), every allocator, then
  // the leaves (imports, the live-stream set, the thread ids, then fork_leaf_mutex's list).
  static void fork_prepare() noexcept
  {
    process_pool_mutex().lock();
    fork_list& l = forks();
    l.mu.lock();
    stream_registry::fork_hold_watchers();
    for (impl* m : l.all) m->fork_hold();
    ipc_imports_fork_hold();
    stream_registry::fork_hold_live();
    biased_mutex::fork_hold_ids();
    fork_leaf_mutex::fork_hold_all();
  }
  static void fork_after(bool child) noexcept
  {
    fork_leaf_mutex::fork_release_all(child);
    biased_mutex::fork_release_ids(child);
    stream_registry::fork_release(child);
    ipc_imports_fork_release(child);
    fork_list& l = forks();
    for (impl* m : l.all) m->fork_release(child);
    release_after_fork(l.mu, child);
    release_after_fork(process_pool_mutex(), child);
  }
  static void fork_parent() noexcept { fork_after(false); }
  static void fork_child() noexcept { fork_after(true); }
};

void install_fork_handlers()
{
  static const bool registered = [] {
    if (const int e = ::pthread_atfork(&allocator_core::impl::fork_prepare, &allocator_core::impl::fork_parent,
                                       &allocator_core::impl::fork_child);
        e != 0) {
      throw error("depot: pthread_atfork failed: " + std::string{std::strerror(e)}, "pthread_atfork", __FILE__,
                  __LINE__, e, "pool");
    }
    return true;
  }();
  (void)registered;
}

std::mutex& process_pool_mutex() noexcept
{
  static auto* const m = new std::mutex;  // never destroyed (pools are made until exit)
  return *m;
}

allocator_core::allocator_core(std::unique_ptr<upstream_resource> upstream, allocator_config config,
                               bool asynchronous)
    : impl_{std::make_unique<impl>(std::move(upstream), config, asynchronous)}
{
  impl::enlist(impl_.get());
}

allocator_core::~allocator_core() { impl::delist(impl_.get()); }

void* allocator_core::allocate(std::size_t bytes, native_stream stream)
{
  impl& m = *impl_;
  stream = m.key_of(stream);
  if (bytes == 0) return nullptr;
  if (bytes > k_max_request) {
    m.ooms.fetch_add(1);
    throw out_of_memory("depot: " + m.dev.to_string() + " allocation of " + std::to_string(bytes) +
                            " bytes (" + format_bytes(bytes) +
                            ") exceeds the largest request depot accepts, " +
                            std::to_string(k_max_request) + " bytes (64 PiB)",
                        bytes, m.dev);
  }
  const std::size_t size = m.round_size(bytes);
  const bool small = size <= k_small_request;
  stream_cache* cp = &m.cache_for(stream);
  m.lock_for_op(*cp);
  // (a thread's remembered entry read as another stream took the cache over: take_spare)
  if (cp->stream != stream) [[unlikely]] cp = m.relock(cp, stream);
  stream_cache& c = *cp;
  block_ref b;
  {
    cache_lock g{m.figures, c, std::adopt_lock};
    if (c.closed) [[unlikely]] m.reopen(c);
    if (!c.pending.empty() && !m.capturing()) m.process_events(c, false);
    b = m.take(c, size, small, bytes);
    if (b.found()) ++c.hits;
    g.unlock();  // inline (the destructor's out-of-line call is for the throwing paths)
  }
  const bool hit = b.found();
  if (!hit) {
    m.misses.fetch_add(1, std::memory_order_relaxed);
    b = m.miss(c, size, small, bytes, stream);
  }
  const std::uintptr_t addr = impl::address_of(b);
  if (m.tracing.load(std::memory_order_relaxed)) {
    trace_event e = m.event_of(trace_kind::allocate, addr, impl::size_of(b), bytes, stream);
    e.cache_hit = hit;
    m.record(e);
  }
  return reinterpret_cast<void*>(addr);
}

void allocator_core::deallocate(void* ptr, native_stream stream, bool stream_given,
                                std::size_t expected_bytes)
{
  impl& m = *impl_;
  if (ptr == nullptr) return;
  stream = m.key_of(stream);
  // The hinted cache first, inline (lookup() without its pair), so the common free takes
  // one pass and the compiler sees which figures it changed.
  stream_cache* const hint = m.hint_for(stream, stream_given);
  if (hint != nullptr) {
    if (const block_ref b = m.find_locked(*hint, ptr, true); b.found()) {
      cache_lock lock{m.figures, *hint, std::adopt_lock};
      // A free into a closed stream's cache on a live stream with its handle: the block's
      // last use is that stream's, after the fence (a free on the dead stream itself, or
      // unnamed, is before it).
      if (hint->closed && stream_given) [[unlikely]] {
        try {
          if (stream_registry::live(m.streams_of.kind, stream)) m.reopen(*hint);
        } catch (...) {  // the device failed: the fence stays, and with it the order
        }
      }
      if (m.free_simple(lock, b, stream, stream_given, expected_bytes)) return;
      m.free_general(b, std::move(lock), stream, stream_given, expected_bytes);
      return;
    }
  }
  auto [b, lock] = m.lookup_elsewhere(ptr, hint, true);
  if (m.free_simple(lock, b, stream, stream_given, expected_bytes)) return;
  m.free_general(b, std::move(lock), stream, stream_given, expected_bytes);
}

void allocator_core::impl::free_general(const block_ref& b, [[maybe_unused]] cache_lock lock,
                                        native_stream stream, bool stream_given, std::size_t expected_bytes)
{
  impl& m = *this;
  stream_cache& c = impl::cache_of(b);
  const std::uintptr_t addr = impl::address_of(b);
  const std::size_t size = impl::size_of(b);
  const std::size_t requested = impl::requested_of(b);
  const bool dense = b.large == nullptr;
  const bool small = dense || b.large->small;
  // A refused free puts a large block back in the live table (lookup erased it), so nothing
  // changed.
  const auto put_back = [&] {
    if (!dense) c.live.insert(addr, b.large);
  };
  if (expected_bytes != 0 && expected_bytes != requested) {
    put_back();
    throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: deallocate(" +
                           format_address(addr) + ", " + std::to_string(expected_bytes) +
                           " bytes): the allocation was " + std::to_string(requested) +
                           " bytes; nothing was changed");
  }
  if (!dense && b.large->exported) m.unshare(*b.large);
  // Counted as freed just before the block changes state (after the calls above and below
  // that may throw, block or allocate).
  auto count_free = [&] { c.delta->count_free(small, size, requested); };
  if (m.tracing.load(std::memory_order_relaxed)) {
    trace_event e = m.event_of(trace_kind::free, addr, size, requested, c.stream);
    const std::uint64_t t = dense     ? (b.seg->t_alloc ? b.seg->t_alloc[b.unit] : 0)
                            : b.large->timed ? b.large->t_alloc
                                             : 0;
    e.lifetime_ns = t != 0 ? e.time_ns - t : 0;  // 0: allocated before tracing
    m.record(e);
  }
  std::vector<native_stream>* uses = impl::uses_of(c, b, false);
  // The stream whose work so far the free is ordered after, when the cache's own order
  // does not hold it: a named stream other than the cache's; in a released capture pool's
  // cache (closed with no fence, its stream still live) its stream too, named or not. (In
  // a destroyed stream's cache a free on the dead handle, or unnamed, is before the fence.)
  const native_stream order = stream_given ? stream : c.stream;
  // A named free into a closed cache on a live stream is ordered on it too: a released
  // pool's cache is in no stream's place, so no reopen orders it.
  const bool named_apart = stream_given && m.another_stream(c, stream);
  if ((named_apart || c.released) &&
      (uses == nullptr || std::find(uses->begin(), uses->end(), order) == uses->end())) {
    try {
      m.uses_listed.store(true, std::memory_order_relaxed);
      uses = impl::uses_of(c, b, true);
      uses->push_back(order);
    } catch (...) {  // out of host memory: order by the device instead, below
      if (m.capturing()) {  // (which a capture forbids): the block waits in place, and the
        c.in_place_sync = true;  // capture's end finishes the device's work first
        impl::mark_pending(b, 1);
        impl::set_in_place(b, true);
        ++c.in_place;
        count_free();
        return;
      }
      try {
        m.up->synchronize_device();
      } catch (...) {
      }
    }
  }
  if (m.async && uses != nullptr && !uses->empty() && m.capturing()) {
    // No event now: one recorded on a capturing stream is part of its graph and cannot be
    // queried. The block waits, pending, until the last capture ends (after_captures()).
    if (uses->size() > 0xFFFF) {
      put_back();
      throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: block " + format_address(addr) +
                             " was used on more than 65535 streams; nothing was changed");
    }
    try {
      c.deferred.reserve(c.deferred.size() + uses->size());
    } catch (...) {  // out of host memory: the block waits in place, its uses kept
      impl::mark_pending(b, 1);
      impl::set_in_place(b, true);
      ++c.in_place;
      count_free();
      return;
    }
    impl::mark_pending(b, static_cast<std::uint16_t>(uses->size()));
    for (native_stream s : *uses) c.deferred.emplace_back(s, b);
    uses->clear();
    count_free();
    return;
  }
  if (m.async && uses != nullptr && !uses->empty()) {
    // Record every event before changing anything: if a stream cannot take one (it was
    // destroyed, the device failed), order the free by finishing the device's work instead,
    // so the block is never lost.
    std::vector<native_event> events;
    try {
      if (uses->size() > 0xFFFF) throw std::length_error("too many streams to count");  // 16-bit counts
      events.reserve(uses->size());
      c.pending.reserve(c.pending.size() + uses->size());
      for (native_stream s : *uses) {
        if (impl::is_marker(s)) {  // a stream destroyed during a capture: its fence
          m.wait_closed(s);
          continue;
        }
        events.push_back(m.record_on(s));
      }
    } catch (...) {
      for (native_event e : events) m.up->destroy_event(e);
      events.clear();
      try {
        m.up->synchronize_device();
      } catch (...) {
      }
    }
    uses->clear();
    if (!events.empty()) {
      impl::mark_pending(b, static_cast<std::uint16_t>(events.size()));
      for (native_event e : events) c.pending.emplace_back(e, b);
      count_free();
      return;
    }
  }
  count_free();
  m.release(c, b);
}

void allocator_core::record_stream(void* ptr, native_stream stream)
{
  impl& m = *impl_;
  stream = m.key_of(stream);
  auto [b, lock] = m.lookup(ptr, m.hint_for(stream, false), false);
  stream_cache& c = impl::cache_of(b);
  // Its own stream: nothing to list. A closed cache's handle that is live again counts as
  // another stream (another_stream), as for a free named on it: listed, so a free records
  // an event there.
  if (!m.another_stream(c, stream)) return;
  m.uses_listed.store(true, std::memory_order_relaxed);
  std::vector<native_stream>* uses = impl::uses_of(c, b, true);
  if (std::find(uses->begin(), uses->end(), stream) == uses->end()) uses->push_back(stream);
}

namespace {
std::string pool_name(std::uint64_t pool) { return "capture pool " + std::to_string(pool); }
}  // namespace

std::uint64_t allocator_core::begin_capture(native_stream stream, std::uint64_t pool)
{
  impl& m = *impl_;
  stream = m.key_of(stream);
  std::uint64_t id = 0;
  {
    std::unique_lock w{m.registry_mu};
    m.pools.reserve(m.pools.size() + 1);  // (before pointing into it)
    m.caches.reserve(m.caches.size() + 1);
    if (const impl::capture_state* p = m.capturing_on(stream)) {
      throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: begin_capture on stream " +
                             format_address(stream) + ", which is capturing into " +
                             pool_name(p->pool) + " already (end_capture first); nothing was changed");
    }
    impl::capture_state* st = nullptr;
    if (pool != 0) {
      st = m.live_pool(pool);
      if (st == nullptr) {
        throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: begin_capture into " +
                               pool_name(pool) + ", which is not a pool of this allocator (valid: 0 for a new "
                               "one, or a begin_capture result not yet released); nothing was changed");
      }
      if (st->capturing) {
        throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: begin_capture into " +
                               pool_name(pool) + ", which is capturing on stream " +
                               format_address(st->stream) +
                               " (one capture per pool at a time); nothing was changed");
      }
    }
    if (st != nullptr) {
      // Its frees that waited for other streams' events come back first: allocations from
      // a pool happen only in captures, where no event may be queried.
      cache_lock g = m.lock_cache(*st->cache);
      if (!st->cache->pending.empty() && !m.capturing()) m.process_events(*st->cache, false);
    }
    std::unique_ptr<stream_cache> fresh;
    if (st == nullptr) {
      fresh = std::make_unique<stream_cache>(stream, m.small_table, m.cfg);
      fresh->capture_pool = m.next_pool;
    }
    auto placed = m.by_stream.try_emplace(stream, nullptr);  // (may throw: nothing changed yet)
    const bool created = fresh != nullptr;
    if (created) {
      m.caches.push_back(std::move(fresh));  // (reserved)
      m.pools.push_back(impl::capture_state{m.next_pool++, m.caches.back().get()});
      st = &m.pools.back();
    }
    {
      const cache_lock g = m.lock_cache(*st->cache);  // (frees of its blocks read its stream)
      if (!created && st->cache->stream != stream) m.hand_pool_over(*st->cache, stream);
      st->cache->set_stream(stream);  // (its waits forgotten even where the stream is the same)
    }
    if (!created) ++st->users;  // an existing pool: one more use
    st->displaced = placed.second ? nullptr : placed.first->second;
    placed.first->second = st->cache;
    st->capturing = true;
    st->stream = stream;
    m.captures().fetch_add(1);
    m.new_route();
    id = st->pool;
  }
  // Operations begun before, in any allocator of the backend, may be querying events or
  // growing: wait until they are done.
  impl::for_each_of_kind(m.streams_of.kind, [](impl& a) { a.drain(); });
  return id;
}

void allocator_core::end_capture(native_stream stream)
{
  impl& m = *impl_;
  stream = m.key_of(stream);
  bool last = false;
  {
    std::unique_lock w{m.registry_mu};
    impl::capture_state* st = m.capturing_on(stream);
    if (st == nullptr) {
      throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: end_capture on stream " +
                             format_address(stream) +
                             ", which is not capturing here (no begin_capture on it, or ended already); "
                             "nothing was changed");
    }
    const auto it = m.by_stream.find(stream);  // (st->cache since begin_capture)
    if (st->displaced != nullptr) {
      it->second = st->displaced;
    } else {
      m.by_stream.erase(it);
    }
    st->capturing = false;
    st->stream = nullptr;
    st->displaced = nullptr;
    m.new_route();
    last = m.captures().fetch_sub(1) == 1;
  }
  // Every allocator of the backend may hold frees deferred, or pools released, meanwhile.
  if (last) impl::for_each_of_kind(m.streams_of.kind, [](impl& a) { a.after_captures(); });
}

void allocator_core::release_capture_pool(std::uint64_t pool)
{
  impl& m = *impl_;
  {
    std::unique_lock w{m.registry_mu};
    impl::capture_state* st = m.live_pool(pool);
    if (st == nullptr) {
      throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: release_capture_pool(" +
                             std::to_string(pool) + "): not a pool of this allocator (valid: a begin_capture "
                             "result not yet released); nothing was changed");
    }
    if (st->capturing && st->users == 1) {
      throw invalid_argument("depot: " + m.dev.to_string() + " caching allocator: release_capture_pool(" +
                             std::to_string(pool) + "): its last use, and it is capturing on stream " +
                             format_address(st->stream) +
                             " (end_capture first); nothing was changed");
    }
    if (--st->users > 0) return;  // other graphs still use it
    st->releasing = true;  // no capture begins into it from now on
    if (m.capturing()) return;  // released when the last capture ends (after_captures)
  }
  const std::lock_guard grow_guard{m.grow_mu};
  m.finish_release(pool);
}

std::vector<std::pair<std::uint64_t, bool>> allocator_core::capture_pools() const
{
  const impl& m = *impl_;
  std::shared_lock r{m.registry_mu};
  std::vector<std::pair<std::uint64_t, bool>> out;
  for (const auto& p : m.pools) {
    if (!p.releasing) out.emplace_back(p.pool, p.capturing);
  }
  return out;
}

ipc_handle allocator_core::ipc_export(void* ptr)
{
  impl& m = *impl_;
  auto [b, lock] = m.lookup(ptr, m.hint_for(nullptr, false), false);
  ipc_handle h;
  h.device = m.dev;
  h.process = static_cast<std::uint64_t>(::getpid());
  h.size = impl::size_of(b);
  h.requested = impl::requested_of(b);
  const std::uintptr_t addr = impl::address_of(b);
  if (b.large != nullptr && b.large->seg->reserved != 0) {
    // An expandable segment's block: a descriptor of each page it spans, made once per page
    // and kept open while a live exported block is on the page. The importer's mapping holds
    // the memory itself, so the segment is not pinned.
    block& k = *b.large;
    segment& s = *k.seg;
    const auto [first, end] = m.pages_of(s, addr, h.size);
    std::size_t fresh = 0;  // pages without a descriptor yet
    for (std::size_t i = first; i < end; ++i) fresh += i >= s.shared.size() || s.shared[i].fd < 0 ? 1 : 0;
    if (fresh > 0) {
      if (const std::string why = detail::descriptor_shortage(fresh); !why.empty()) {
        throw error("depot: " + m.dev.to_string() + " ipc_export(" + format_address(addr) + "): a block of " +
                        std::to_string(end - first) + " pages of an expandable segment " + why + "; nothing was exported",
                    "ipc_export", __FILE__, __LINE__, EMFILE, "ipc");
      }
    }
    if (s.shared.size() < end) s.shared.resize(end);  // may throw: nothing exported yet
    h.fds.reserve(end - first);
    try {
      for (std::size_t i = first; i < end; ++i) {
        if (s.shared[i].fd < 0) s.shared[i].fd = m.up->vm_export(s.maps[i]);
        h.fds.push_back(s.shared[i].fd);
      }
    } catch (...) {  // refused part way: what this call made is closed again
      for (std::size_t i = first; i < end; ++i) {
        if (s.shared[i].blocks == 0 && s.shared[i].fd >= 0) ::close(std::exchange(s.shared[i].fd, -1));
      }
      throw;
    }
    if (!k.exported) {
      for (std::size_t i = first; i < end; ++i) ++s.shared[i].blocks;
      k.exported = true;
      k.has_uses = true;  // its free takes the general path, which unshares it
    }
    h.page = m.vm_page;
    h.segment = s.addr + first * m.vm_page;
    h.offset = addr - h.segment;
    return h;
  }
  const auto finish = [&](auto& seg) {
    if (seg.importers == nullptr) {  // a slot once per segment (throws: nothing changed)
      const importer_counts::slot k = m.importers.take(m.dev);
      seg.importers = k.count;
      seg.importer_slot = k.index;
    }
    h.memory = m.up->ipc_export(reinterpret_cast<void*>(seg.addr));  // throws: nothing else changed
    seg.exported = true;
    h.counter_fd = m.importers.fd();
    h.counter_slot = seg.importer_slot;
    h.segment = seg.addr;
    h.offset = addr - seg.addr;
  };
  if (b.large != nullptr) {
    finish(*b.large->seg);
  } else {
    finish(*b.seg);
  }
  return h;
}

memory_stats allocator_core::stats() const { return impl_->stats(); }

std::string allocator_core::check_directory() const
{
  const impl& m = *impl_;
  std::shared_lock r{m.registry_mu};
  const impl::all_locks locks{m};
  std::size_t segments = 0;
  for (const auto& c : m.caches) {
    const std::size_t before = segments;
    for (const segment* s = c->segments; s != nullptr; s = s->lnext, ++segments) {
      const std::uintptr_t end = s->addr + (s->reserved != 0 ? s->reserved : s->size);
      if (!m.directory.lists(s->addr, end, c.get())) {
        return "segment " + format_address(s->addr) + " of stream " + format_address(c->stream) +
               " is not listed with its range and cache";
      }
    }
    for (const auto& [addr, s] : c->small_dir) {
      ++segments;
      if (!m.directory.lists(addr, addr + k_small_segment, c.get())) {
        return "small segment " + format_address(addr) + " of stream " + format_address(c->stream) +
               " is not listed with its range and cache";
      }
    }
    if (const std::uint32_t held = c->held.load(std::memory_order_relaxed); held != segments - before) {
      return "the cache of stream " + format_address(c->stream) + " counts " + std::to_string(held) +
             " segments and holds " + std::to_string(segments - before);
    }
  }
  if (const std::size_t n = m.directory.size(); n != segments) {
    return std::to_string(n) + " segments listed, " + std::to_string(segments) + " held";
  }
  return {};
}

std::size_t allocator_core::stream_caches() const
{
  const impl& m = *impl_;
  std::shared_lock r{m.registry_mu};
  return m.caches.size();
}

std::size_t allocator_core::thread_deltas() const
{
  const impl& m = *impl_;
  const std::lock_guard g{m.stats_mu};
  return m.thread_deltas.size();
}

std::string allocator_core::check_small_bits() const
{
  const impl& m = *impl_;
  std::shared_lock r{m.registry_mu};
  const impl::all_locks locks{m};
  for (const auto& c : m.caches) {
    // The reuse lists: every block on them flagged, of the list's size, counted in
    // reuse_units; every flagged block on one.
    std::size_t listed = 0;
    std::size_t flagged = 0;
    std::uint64_t units = 0;
    for (unsigned k = 0; k < k_reuse_sizes; ++k) {
      for (std::uint32_t l = c->reuse[k]; l != k_nil; ++listed) {
        const small_segment& s = m.small_table.at(l >> k_unit_bits);
        const unit_entry& e = s.units[l & (k_seg_units - 1)];
        if (s.cache != &*c || (e.flags & unit_entry::reuse) == 0 || e.size != k + 1 || listed > k_seg_units * c->small_dir.size()) {
          return "the reuse list of " + std::to_string(k + 1) + " units of stream " + format_address(c->stream) +
                 " holds a block at " + format_address(s.addr + unit_bytes(l & (k_seg_units - 1))) +
                 " that is not a kept block of that size in its cache";
        }
        units += e.size;
        l = e.fnext;
      }
    }
    if (units != c->reuse_units || units > c->reuse_cap) {
      return "the reuse lists of stream " + format_address(c->stream) + " hold " + std::to_string(units) +
             " units, counted " + std::to_string(c->reuse_units) + " (at most " + std::to_string(c->reuse_cap) + ")";
    }
    for (const auto& [addr, s] : c->small_dir) {
      const std::string where = "small segment " + format_address(addr) + ": ";
      std::array<std::uint64_t, k_seg_units / 64> want{};
      unsigned before = 0;  // the previous block's size in units (0: none)
      for (unsigned u = 0; u < k_seg_units;) {
        const unit_entry& e = s->units[u];
        const unsigned n = e.size;
        if (n == 0 || n > k_seg_units - u) {
          return where + "the block at unit " + std::to_string(u) + " has " + std::to_string(n) + " units";
        }
        if (e.prev != before) {
          return where + "the block at unit " + std::to_string(u) + " says the block before it has " +
                 std::to_string(e.prev) + " units, not " + std::to_string(before);
        }
        if (s->free_at(u)) {
          if (e.state != block_state::free || (e.flags & unit_entry::reuse) != 0) {
            return where + "the block at unit " + std::to_string(u) + " is marked free but is not";
          }
          want[u >> 6] |= std::uint64_t{1} << (u & 63U);
        }
        if ((e.flags & unit_entry::reuse) != 0) {
          if (e.state != block_state::free || n > k_reuse_sizes) {
            return where + "the block at unit " + std::to_string(u) + " is marked kept for reuse but is " +
                   (n > k_reuse_sizes ? "larger than 64 KiB" : "not free");
          }
          ++flagged;
        }
        before = n;
        u += n;
      }
      for (std::size_t w = 0; w < want.size(); ++w) {
        if (s->free_heads[w] != want[w]) {
          return where + "the free bits of units " + std::to_string(w * 64) + ".." + std::to_string(w * 64 + 63) +
                 " are out of step with its blocks";
        }
      }
    }
    if (flagged != listed) {
      return "stream " + format_address(c->stream) + ": " + std::to_string(flagged) + " blocks marked kept for reuse, " +
             std::to_string(listed) + " on its reuse lists";
    }
  }
  return {};
}

allocator_snapshot allocator_core::snapshot() const
{
  const impl& m = *impl_;
  std::shared_lock r{m.registry_mu};
  const impl::all_locks locks{m};
  allocator_snapshot snap;
  snap.device = m.dev;
  for (const auto& c : m.caches) {
    for (const segment* s = c->segments; s != nullptr; s = s->lnext) {
      segment_info si;
      si.address = s->addr;
      si.small_pool = s->small;
      si.stream = reinterpret_cast<std::uintptr_t>(c->stream);
      si.capture_pool = c->capture_pool;
      si.exported = s->exported || std::any_of(s->shared.begin(), s->shared.end(), [](const segment::shared_page& g) { return g.fd >= 0; });
      si.importers = m.imported(*s) ? importer_counts::load(s->importers) : 0;
      si.reserved = s->reserved;
      si.size = s->size - s->unmapped;  // mapped: holes' blocks (state unmapped) are not reserved
      for (const block* b = s->head; b != nullptr; b = b->next) {
        const bool idle = b->state == block_state::free || b->state == k_unmapped;
        si.blocks.push_back(block_info{b->addr, b->size, idle ? 0 : b->requested, b->state});
      }
      snap.segments.push_back(std::move(si));
    }
    for (const auto& [addr, s] : c->small_dir) {
      segment_info si;
      si.address = s->addr;
      si.size = k_small_segment;
      si.small_pool = true;
      si.stream = reinterpret_cast<std::uintptr_t>(c->stream);
      si.capture_pool = c->capture_pool;
      si.exported = s->exported;
      si.importers = m.imported(*s) ? importer_counts::load(s->importers) : 0;
      for (unsigned u = 0; u < k_seg_units; u += s->units[u].size) {
        const unit_entry& e = s->units[u];
        // Free as the bitmap says (what frees consult), so a bitmap out of step with the
        // entries shows as a snapshot that disagrees with the statistics.
        const bool kept = (e.flags & unit_entry::reuse) != 0;
        const block_state st = s->free_at(u) || kept ? block_state::free
                               : e.state == block_state::free ? block_state::allocated
                                                              : e.state;
        si.blocks.push_back(block_info{s->addr + unit_bytes(u), unit_bytes(e.size),
                                       st == block_state::free ? 0 : e.requested, st, kept});
      }
      snap.segments.push_back(std::move(si));
    }
  }
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const segment_info& a, const segment_info& b) { return a.address < b.address; });
  return snap;
}

std::vector<trace_event> allocator_core::trace() const
{
  const impl& m = *impl_;
  std::lock_guard g{m.trace_mu};
  std::vector<trace_event> out;
  out.reserve(m.ring_count);
  const std::size_t n = m.ring.size();
  for (std::size_t i = 0; i < m.ring_count; ++i) {
    out.push_back(m.ring[(m.ring_next + n - m.ring_count + i) % n]);
  }
  return out;
}

void allocator_core::empty_cache()
{
  impl& m = *impl_;
  // grow_mu: a capture that begins meanwhile waits for the whole release (its drain).
  const std::lock_guard grow_guard{m.grow_mu};
  if (m.capturing()) {
    throw invalid_argument("depot: " + m.dev.to_string() +
                           " caching allocator: empty_cache() during a graph capture (freeing memory "
                           "would invalidate it); call it after end_capture(); nothing was changed");
  }
  m.flush_all(false);
}

void allocator_core::reset_peak_stats()
{
  impl_->reset_stats(false);
}

void allocator_core::reset_memory_stats()
{
  impl_->reset_stats(true);
  impl_->misses.store(0);
  impl_->retries.store(0);
  impl_->ooms.store(0);
  impl_->moves.store(0);
  impl_->move_events.store(0);
  impl_->move_syncs.store(0);
}

void allocator_core::set_trace_capacity(std::size_t events) { impl_->set_trace_capacity(events); }
void allocator_core::set_oom_handler(oom_handler handler) { impl_->set_oom_handler(std::move(handler)); }

const allocator_config& allocator_core::config() const noexcept { return impl_->cfg; }
std::size_t allocator_core::expandable_page() const noexcept { return impl_->vm_page; }

device_id allocator_core::device() const noexcept { return impl_->dev; }

}  // namespace depot::detail
