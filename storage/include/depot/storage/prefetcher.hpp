// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/hal/event.hpp>
#include <depot/hal/expects.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/hal/stream.hpp>
#include <depot/hal/stream_ref.hpp>
#include <depot/pool/pool.hpp>
#include <depot/storage/device_storage.hpp>
#include <depot/storage/prefetch_options.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace depot {

namespace detail {

// A host batch of T: contiguous, sized, elements of type T (std::vector<T>, std::span<const T>,
// std::array<T, N>, ...).
template <class B, class T>
concept host_batch_of = std::ranges::contiguous_range<B> && std::ranges::sized_range<B> &&
                        std::same_as<std::remove_cv_t<std::ranges::range_value_t<B>>, T>;

template <class X>
inline constexpr bool is_optional_v = false;
template <class X>
inline constexpr bool is_optional_v<std::optional<X>> = true;

// A callable that returns std::optional<host batch>; std::nullopt ends the stream.
template <class F, class T>
concept batch_source = std::invocable<F&> &&
                       is_optional_v<std::remove_cvref_t<std::invoke_result_t<F&>>> &&
                       host_batch_of<typename std::remove_cvref_t<std::invoke_result_t<F&>>::value_type, T>;

// A forward range whose elements are host batches.
template <class R, class T>
concept batch_range = std::ranges::forward_range<std::remove_reference_t<R>> &&
                      host_batch_of<std::ranges::range_value_t<std::remove_reference_t<R>>, T> &&
                      !batch_source<R, T>;

// A host batch on its way to the device, and whatever keeps its elements alive.
template <class T>
struct staged_host_batch {
  std::span<const T> elements;
  std::shared_ptr<const void> owner;
};

}  // namespace detail

// Yields the batches of a host producer (a forward range of batches, or a callable returning
// std::optional<batch>) as device batches, in order: num_workers threads stage up to `lookahead`
// batches ahead (taken from the producer, not yet delivered; never more) through pinned_pool<D>
// on one copy stream; a delivered batch is ready in the order of the consumer stream. A producer
// or staging error is rethrown by next() at the batch it belongs to, and ends the stream; stop()
// or destruction stops and joins the workers (after producer calls in progress return) and
// returns undelivered batches to the pools. next()/begin() from one thread at a time; the
// producer is called from one worker at a time; the range or callable must outlive this object.
template <device D, class T = std::byte>
class prefetcher {
  static_assert(std::is_trivially_copyable_v<T>, "prefetcher moves trivially copyable elements");

 public:
  using value_type = T;

  // One batch on the device: index() in the producer's order and its elements, in memory of
  // pool<D>, ready in the order of the consumer stream. Copies share the storage; it returns to
  // the pool, in the order of the consumer stream, when the last copy goes.
  class batch {
   public:
    batch() = default;
    [[nodiscard]] std::size_t index() const noexcept { return index_; }
    [[nodiscard]] T* data() const noexcept { return storage_.data(); }
    [[nodiscard]] std::size_t size() const noexcept { return storage_.size(); }
    [[nodiscard]] std::size_t bytes() const noexcept { return storage_.size() * sizeof(T); }
    [[nodiscard]] bool empty() const noexcept { return storage_.size() == 0; }
    [[nodiscard]] const device_storage<T, D>& storage() const noexcept { return storage_; }

   private:
    friend class prefetcher;
    batch(std::size_t index, device_storage<T, D> s) noexcept : index_{index}, storage_{std::move(s)} {}
    std::size_t index_ = 0;
    device_storage<T, D> storage_;
  };

  // Input iterator over the remaining batches (for range-for); ++ calls next().
  class iterator {
   public:
    using value_type = batch;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    batch& operator*() const noexcept { return *current_; }
    batch* operator->() const noexcept { return &*current_; }
    iterator& operator++()
    {
      current_.reset();  // the previous batch goes back first
      current_ = owner_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept { return !it.current_; }

   private:
    friend class prefetcher;
    explicit iterator(prefetcher* owner) : owner_{owner}, current_{owner->next()} {}
    prefetcher* owner_ = nullptr;
    mutable std::optional<batch> current_;
  };

  template <class Producer>
    requires detail::batch_source<Producer, T> || detail::batch_range<Producer, T>
  explicit prefetcher(Producer&& producer, prefetch_options options = {}, stream_ref<D> consumer = {})
      : options_{checked(options)},
        copy_{options_.device},
        consumer_{consumer},
        producer_{make_producer(std::forward<Producer>(producer))}
  {
    slots_.reserve(options_.lookahead);
    for (std::size_t i = 0; i < options_.lookahead; ++i) slots_.emplace_back(options_.device);
    try {
      workers_.reserve(options_.num_workers);
      for (std::size_t w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  prefetcher(prefetcher&&) = delete;
  prefetcher& operator=(prefetcher&&) = delete;
  ~prefetcher() { stop(); }

  // The next batch in the producer's order; std::nullopt once the producer is exhausted, after
  // an error was delivered, or after stop(). Blocks until a worker has staged it. Rethrows the
  // producer's or the staging's exception at the batch it belongs to.
  [[nodiscard]] std::optional<batch> next()
  {
    std::unique_lock l{mu_};
    const std::size_t i = delivered_;
    slot& s = slot_of(i);
    ready_.wait(l, [&] { return (s.ready && s.index == i) || (ended_ && i >= end_index_) || stopping_; });
    if (!(s.ready && s.index == i) || stopping_) return std::nullopt;
    if (s.error) {
      std::exception_ptr error = std::exchange(s.error, nullptr);
      s.ready = false;
      ++delivered_;
      l.unlock();
      space_.notify_all();
      std::rethrow_exception(error);
    }
    // The consumer's later work waits for the copy; the buffer's release waits for that work.
    runtime<D>::wait_event(consumer_.native(), s.done.native());
    s.data.record_use(consumer_);
    batch out{i, std::move(s.data)};
    s.ready = false;
    ++delivered_;
    l.unlock();
    space_.notify_all();
    return out;
  }

  [[nodiscard]] iterator begin() { return iterator{this}; }
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

  // Stops the workers (each finishes the producer call or staging in progress), joins them and
  // returns undelivered batches to the pools; next() returns std::nullopt afterwards. Idempotent.
  void stop() noexcept
  {
    {
      std::lock_guard l{mu_};
      stopping_ = true;
    }
    space_.notify_all();
    ready_.notify_all();
    for (std::thread& w : workers_) {
      // join fails only for a thread joining itself, which a worker never does.
      if (w.joinable()) {
        try {
          w.join();
        } catch (...) {
        }
      }
    }
    workers_.clear();
    std::lock_guard l{mu_};
    for (slot& s : slots_) {
      s.data = device_storage<T, D>{};
      s.error = nullptr;
      s.ready = false;
    }
  }

  [[nodiscard]] const prefetch_options& options() const noexcept { return options_; }
  [[nodiscard]] stream_ref<D> copy_stream() const noexcept { return copy_.ref(); }
  [[nodiscard]] stream_ref<D> consumer_stream() const noexcept { return consumer_; }

 private:
  using producer_fn = std::function<std::optional<detail::staged_host_batch<T>>()>;

  struct slot {
    explicit slot(int device) : done{device} {}
    event<D> done;  // the copy of the batch held here
    std::size_t index = 0;
    bool ready = false;
    device_storage<T, D> data;
    std::exception_ptr error;
  };

  template <class R>
  struct range_state {
    using range_t = std::conditional_t<std::is_lvalue_reference_v<R>, std::remove_reference_t<R>,
                                       std::remove_cvref_t<R>>;
    using holder_t = std::conditional_t<std::is_lvalue_reference_v<R>, range_t*, range_t>;

    explicit range_state(R&& r)
        : held{hold(std::forward<R>(r))}, it{std::ranges::begin(get())}, end{std::ranges::end(get())}
    {
    }
    static holder_t hold(R&& r)
    {
      if constexpr (std::is_lvalue_reference_v<R>) {
        return &r;
      } else {
        return holder_t(std::move(r));
      }
    }
    range_t& get() noexcept
    {
      if constexpr (std::is_lvalue_reference_v<R>) {
        return *held;
      } else {
        return held;
      }
    }
    std::optional<detail::staged_host_batch<T>> next()
    {
      if (it == end) return std::nullopt;
      detail::staged_host_batch<T> b;
      if constexpr (std::is_lvalue_reference_v<std::ranges::range_reference_t<range_t>>) {
        const auto& e = *it;  // lives in the range
        b.elements = std::span<const T>{std::ranges::data(e), std::ranges::size(e)};
      } else {
        auto e = std::make_shared<const std::ranges::range_value_t<range_t>>(*it);
        b.elements = std::span<const T>{std::ranges::data(*e), std::ranges::size(*e)};
        b.owner = std::move(e);
      }
      ++it;
      return b;
    }

    holder_t held;
    std::ranges::iterator_t<range_t> it;
    std::ranges::sentinel_t<range_t> end;
  };

  template <class Producer>
  static producer_fn make_producer(Producer&& p)
  {
    if constexpr (detail::batch_source<Producer, T>) {
      auto fn = std::make_shared<std::remove_cvref_t<Producer>>(std::forward<Producer>(p));
      return [fn]() -> std::optional<detail::staged_host_batch<T>> {
        auto r = (*fn)();
        if (!r) return std::nullopt;
        using batch_t = typename std::remove_cvref_t<decltype(r)>::value_type;
        auto owned = std::make_shared<const batch_t>(std::move(*r));
        return detail::staged_host_batch<T>{
            std::span<const T>{std::ranges::data(*owned), std::ranges::size(*owned)}, owned};
      };
    } else {
      auto st = std::make_shared<range_state<Producer>>(std::forward<Producer>(p));
      return [st] { return st->next(); };
    }
  }

  static prefetch_options checked(prefetch_options o)
  {
    DEPOT_EXPECTS(o.lookahead >= 1 && o.lookahead <= prefetch_options::max_lookahead,
                  "depot::prefetcher: lookahead = " + std::to_string(o.lookahead) +
                      " is out of range; valid values are 1 to " +
                      std::to_string(prefetch_options::max_lookahead));
    DEPOT_EXPECTS(o.num_workers >= 1 && o.num_workers <= prefetch_options::max_workers,
                  "depot::prefetcher: num_workers = " + std::to_string(o.num_workers) +
                      " is out of range; valid values are 1 to " +
                      std::to_string(prefetch_options::max_workers));
    runtime<D>::check_device(o.device);
    return o;
  }

  slot& slot_of(std::size_t index) noexcept { return slots_[index % slots_.size()]; }

  // Copies one host batch into new device memory on the copy stream; `done` marks the copy.
  // Returns once the host batch may be released.
  device_storage<T, D> stage(std::span<const T> src, event<D>& done)
  {
    const std::size_t n = src.size();
    device_storage<T, D> out{n, options_.device, copy_.ref()};
    const std::size_t bytes = n * sizeof(T);
    // Page-locked batches are read by the copy engine directly; others go through staging.
    if (n > 0 && options_.pin_memory && !runtime<D>::is_pinned(src.data())) {
      auto& pinned = pinned_pool<D>(options_.device);
      // Written by this host thread: keyed to the default stream, never to the copy stream,
      // so the pool reuses it only after the copy out of it (declared below) is done.
      void* staging = pinned.allocate(bytes, stream_ref<D>{});
      try {
        std::memcpy(staging, src.data(), bytes);
        runtime<D>::copy_async(out.data(), staging, bytes, copy_.native());
      } catch (...) {
        pinned.deallocate(staging);
        throw;
      }
      pinned.deallocate(staging, copy_.ref());
      done.record(copy_.ref());
    } else if (n > 0) {
      runtime<D>::copy_async(out.data(), src.data(), bytes, copy_.native());
      done.record(copy_.ref());
      done.synchronize();  // held until the copy has read it
    } else {
      done.record(copy_.ref());
    }
    return out;
  }

  void work() noexcept
  {
    for (;;) {
      std::size_t index = 0;
      std::optional<detail::staged_host_batch<T>> host;
      std::exception_ptr error;
      {
        // Taking an index and calling the producer is one step, so batch i is its i-th value.
        std::lock_guard p{producer_mu_};
        {
          std::unique_lock l{mu_};
          space_.wait(l, [&] {
            return stopping_ || ended_ || next_index_ < delivered_ + options_.lookahead;
          });
          if (stopping_ || ended_) return;
          index = next_index_++;
        }
        try {
          host = producer_();
        } catch (...) {
          error = std::current_exception();
        }
        if (!host) {
          // Exhausted (batch `index` does not exist) or failed (batch `index` is the error):
          // nothing more is taken from the producer, so this is decided before letting go of it.
          {
            std::lock_guard l{mu_};
            ended_ = true;
            end_index_ = std::min(end_index_, error ? index + 1 : index);
          }
          space_.notify_all();
          if (!error) {
            ready_.notify_all();
            return;
          }
        }
      }
      {
        std::lock_guard l{mu_};
        if (stopping_) return;  // nobody will take it
      }
      slot& s = slot_of(index);  // this worker's alone until it is marked ready
      if (!error) {
        try {
          s.data = stage(host->elements, s.done);
        } catch (...) {
          error = std::current_exception();
        }
      }
      host.reset();
      {
        std::lock_guard l{mu_};
        s.index = index;
        s.error = error;
        s.ready = true;
        if (error) {  // nothing after this batch is taken or delivered
          ended_ = true;
          end_index_ = std::min(end_index_, index + 1);
        }
      }
      ready_.notify_all();
      if (error) space_.notify_all();
    }
  }

  prefetch_options options_;
  stream<D> copy_;  // declared before the slots: it outlives the buffers' release
  stream_ref<D> consumer_;
  producer_fn producer_;

  std::mutex producer_mu_;  // taken before mu_, never while holding it
  std::mutex mu_;
  std::condition_variable space_;  // workers: room for another batch, or the end
  std::condition_variable ready_;  // consumer: a batch is staged, or the end
  std::vector<slot> slots_;        // batch i lives in slots_[i % lookahead]
  std::size_t next_index_ = 0;     // the next index a worker takes from the producer
  std::size_t delivered_ = 0;      // batches handed out by next() (errors included)
  std::size_t end_index_ = std::numeric_limits<std::size_t>::max();
  bool ended_ = false;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace depot
