// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// The depot side of tests/dlpack_torch/check.py: a C interface (loaded with ctypes) that
// exports depot CUDA views as DLPack tensors for PyTorch to consume, imports PyTorch's
// DLPack tensors as depot views, and reports what happened (values seen through depot,
// pool statistics, how often each deleter ran). Every function returns a negative number
// or null on failure and leaves the reason in dlpt_last_error(); none lets an exception out.
// Built by meson in CUDA builds only; with -DDLPT_HOST the same functions work on depot::host
// (for check.py --device cpu on a machine without a GPU).
#include <depot/hal/device.hpp>
#include <depot/hal/runtime.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/storage/dlpack.hpp>
#include <depot/storage/strided_view.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#define DLPT_API extern "C" __attribute__((visibility("default")))

namespace {

#if defined(DLPT_HOST)
using gpu = depot::host;  // the same checks on CPU tensors (check.py --device cpu); not built by meson
#else
using gpu = depot::cuda;
#endif
using f32_view = depot::strided_view<float, gpu>;
using i64_view = depot::strided_view<std::int64_t, gpu>;
using any_view = std::variant<f32_view, i64_view>;

std::string last_error;  // NOLINT: one test process, one thread

// ---- deleter bookkeeping --------------------------------------------------------------
// Each tensor that crosses the boundary has its deleter replaced by a counting trampoline
// that calls the original deleter (depot's own for exports, PyTorch's for imports) exactly
// as the consumer would have. A second call for the same tensor, or a call for a tensor
// never seen, is counted as an error and not forwarded.
using deleter_fn = void (*)(DLManagedTensor*);
struct deleter_book {
  std::mutex mutex;
  std::map<DLManagedTensor*, deleter_fn> pending;
  std::int64_t calls = 0;
  std::int64_t errors = 0;
};
deleter_book exports_book;  // NOLINT
deleter_book imports_book;  // NOLINT

// One of a book's counters, read under its lock.
std::int64_t count_of(deleter_book& book, std::int64_t deleter_book::*counter)
{
  const std::lock_guard<std::mutex> lock{book.mutex};
  return book.*counter;
}

template <deleter_book& Book>
void counting_deleter(DLManagedTensor* self)
{
  deleter_fn original = nullptr;
  {
    const std::lock_guard<std::mutex> lock{Book.mutex};
    const auto it = Book.pending.find(self);
    if (it == Book.pending.end()) {
      ++Book.errors;  // called twice, or for a tensor this library never handed out
      return;
    }
    original = it->second;
    Book.pending.erase(it);
    ++Book.calls;
  }
  if (original != nullptr) original(self);
}

template <deleter_book& Book>
void track(DLManagedTensor* t)
{
  const std::lock_guard<std::mutex> lock{Book.mutex};
  Book.pending[t] = t->deleter;
  t->deleter = &counting_deleter<Book>;
}

template <deleter_book& Book>
void untrack(DLManagedTensor* t)  // hands the original deleter back (the tensor was not consumed)
{
  const std::lock_guard<std::mutex> lock{Book.mutex};
  const auto it = Book.pending.find(t);
  if (it == Book.pending.end()) return;
  t->deleter = it->second;
  Book.pending.erase(it);
}

// ---- exports: depot -> torch ----------------------------------------------------------
// The cases check.py mirrors (its EXPORT_CASES): storage filled with value(k) at storage
// element k, viewed through a layout.
//   0  f32 1-D contiguous, 1000 elements                      value(k) = k + 0.5
//   1  f32 (6, 8).transpose(0, 1): shape (8, 6), strides (1, 8)                  k + 0.5
//   2  f32 (6, 8)[:, 0::2].T: shape (4, 6), strides (2, 8), offset 0            k + 0.5
//   3  f32 (6, 8)[1:5, 1::3]: shape (4, 3), strides (8, 3), offset 9 (byte_offset 36)
//   4  i64 1-D contiguous, 257 elements                 value(k) = 2^40 + 3k - 7
constexpr int export_case_count = 5;

// Never destroyed: whatever a failed run leaves here must not reach the pool after the
// CUDA runtime has shut down at exit.
auto& held = *new std::map<int, any_view>;    // the exporting side's own handles, by case
auto& churn = *new std::vector<any_view>;     // pool blocks taken to catch early frees

template <class T>
depot::strided_view<T, gpu> filled(std::initializer_list<std::int64_t> shape)
{
  auto h = depot::strided_view<T, depot::host>::empty(shape);
  for (std::int64_t k = 0; k < h.numel(); ++k) {
    if constexpr (std::is_same_v<T, float>) {
      h.data()[k] = static_cast<float>(k) + 0.5F;
    } else {
      h.data()[k] = (std::int64_t{1} << 40) + 3 * k - 7;
    }
  }
  return h.template to<gpu>();
}

any_view make_export_case(int which)
{
  switch (which) {
    case 0: return filled<float>({1000});
    case 1: return filled<float>({6, 8}).transpose(0, 1);
    case 2: return filled<float>({6, 8}).slice(1, 0, 8, 2).transpose(0, 1);
    case 3: return filled<float>({6, 8}).slice(0, 1, 5).slice(1, 1, 8, 3);
    case 4: return filled<std::int64_t>({257});
    default: throw depot::invalid_argument("dlpack_torch: no export case " + std::to_string(which));
  }
}

// Compares the view's elements (row-major, read through depot: a device-to-host copy of
// the view, and a device-side contiguous clone copied back) with `expected`.
template <class T>
std::int64_t compare(const depot::strided_view<T, gpu>& v, const void* expected, std::int64_t n,
                     const char* what)
{
  if (v.numel() != n) {
    last_error = std::string{what} + ": the depot view has " + std::to_string(v.numel()) +
                 " elements, the caller expects " + std::to_string(n);
    return 1;
  }
  const auto* want = static_cast<const T*>(expected);
  std::int64_t bad = 0;
  std::ostringstream first;
  const std::pair<const char*, std::vector<T>> reads[] = {
      {"to_host_vector", v.to_host_vector()},
      {"clone on the device", v.clone().to_host_vector()},
  };
  for (const auto& [how, got] : reads) {
    for (std::int64_t k = 0; k < n; ++k) {
      if (got[static_cast<std::size_t>(k)] != want[k]) {
        if (bad == 0) {
          first << what << ": element " << k << " (row-major) read through depot (" << how << ") is "
                << got[static_cast<std::size_t>(k)] << ", expected " << want[k];
        }
        ++bad;
      }
    }
  }
  if (bad > 0) last_error = first.str() + " (" + std::to_string(bad) + " mismatches in all)";
  return bad;
}

template <class F>
auto guarded(F f, decltype(f()) on_error) noexcept -> decltype(f())
{
  try {
    return f();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown exception";
  }
  return on_error;
}

// ---- imports: torch -> depot ----------------------------------------------------------
auto& imported = *new std::map<int, any_view>;  // never destroyed, as `held`

// The entry for `key`, or the end with last_error naming what was missing.
std::map<int, any_view>::iterator find_view(std::map<int, any_view>& views, int key, const char* what)
{
  const auto it = views.find(key);
  if (it == views.end()) last_error = std::string{"no "} + what + " " + std::to_string(key);
  return it;
}
int next_handle = 1;                            // NOLINT

}  // namespace

DLPT_API const char* dlpt_last_error() { return last_error.c_str(); }

// CUDA devices depot sees; warms depot up (pool, Kokkos) so that later statistics do not
// include first-use allocations. Returns the device count, or -1.
DLPT_API int dlpt_init()
{
  return guarded(
      [] {
        const int n = depot::device_count<gpu>();
        if (n > 0) {
          const auto warm = filled<float>({4, 4}).transpose(0, 1).clone();
          (void)warm.to_host_vector();
          depot::synchronize<gpu>();
        }
        return n;
      },
      -1);
}

DLPT_API int dlpt_synchronize()
{
  return guarded(
      [] {
        depot::synchronize<gpu>();
        return 0;
      },
      -1);
}

// Bytes depot's CUDA pool has handed out on device 0 (after a device synchronise).
DLPT_API std::int64_t dlpt_memory_allocated()
{
  return guarded(
      [] {
        depot::synchronize<gpu>();
        return depot::memory_allocated<gpu>();
      },
      std::int64_t{-1});
}

DLPT_API int dlpt_export_case_count() { return export_case_count; }

// Makes export case `which`, keeps a depot handle on it, and returns depot::to_dlpack of
// it (its deleter counted), or null.
DLPT_API DLManagedTensor* dlpt_export(int which)
{
  return guarded(
      [which]() -> DLManagedTensor* {
        any_view v = make_export_case(which);
        DLManagedTensor* t = std::visit([](const auto& x) { return depot::to_dlpack(x); }, v);
        depot::synchronize<gpu>();  // the fill is complete before another runtime reads it
        held.insert_or_assign(which, std::move(v));
        track<exports_book>(t);
        return t;
      },
      nullptr);
}

// For a tensor the consumer refused: runs its deleter as the producer's capsule would.
DLPT_API void dlpt_delete_unconsumed(DLManagedTensor* t)
{
  if (t == nullptr) return;
  untrack<exports_book>(t);
  if (t->deleter != nullptr) t->deleter(t);
}

// Compares views[key] (after a device synchronise) with `expected` (n elements, row-major):
// the number of mismatches, or -1 with last_error set.
std::int64_t compare_entry(std::map<int, any_view>& views, int key, const char* what, const void* expected,
                           std::int64_t n)
{
  return guarded(
      [&]() -> std::int64_t {
        const auto it = find_view(views, key, what);
        if (it == views.end()) return -1;
        depot::synchronize<gpu>();
        const std::string label = std::string{what} + " " + std::to_string(key);
        return std::visit([&](const auto& v) { return compare(v, expected, n, label.c_str()); }, it->second);
      },
      std::int64_t{-1});
}

// Compares the depot handle kept for export case `which` with `expected` (n elements,
// row-major, of the case's type). Returns the number of mismatches, or -1.
DLPT_API std::int64_t dlpt_check_held(int which, const void* expected, std::int64_t n)
{
  return compare_entry(held, which, "depot handle held for export case", expected, n);
}

// The address of the first element of the depot view kept for export case `which`.
DLPT_API void* dlpt_held_data(int which)
{
  return guarded(
      [which]() -> void* {
        const auto it = find_view(held, which, "depot handle held for export case");
        if (it == held.end()) {
          return nullptr;
        }
        return std::visit([](const auto& v) { return static_cast<void*>(v.data()); }, it->second);
      },
      nullptr);
}

// Drops every depot handle on the exported views: only the DLPack tensors hold them now.
DLPT_API int dlpt_drop_held()
{
  return guarded(
      [] {
        held.clear();
        depot::synchronize<gpu>();
        return 0;
      },
      -1);
}

// Takes `copies` new pool blocks of each export case's storage size and fills them with a
// sentinel: had an exported storage gone back to the pool early, one of these would now
// overwrite it.
DLPT_API int dlpt_churn(int copies)
{
  return guarded(
      [copies] {
        for (int c = 0; c < copies; ++c) {
          for (int which = 0; which < export_case_count; ++which) {
            any_view v = make_export_case(which);
            std::visit(
                [](auto& x) {
                  using T = typename std::decay_t<decltype(x)>::value_type;
                  const auto n = static_cast<std::int64_t>(x.get_storage().size());
                  auto junk = depot::strided_view<T, depot::host>::empty({n});
                  for (std::int64_t k = 0; k < n; ++k) junk.data()[k] = static_cast<T>(-777);
                  auto whole = depot::strided_view<T, gpu>{x.get_storage(), depot::layout::contiguous({n})};
                  whole.copy_(junk);
                },
                v);
            churn.push_back(std::move(v));
          }
        }
        depot::synchronize<gpu>();
        return 0;
      },
      -1);
}

DLPT_API int dlpt_release_churn()
{
  return guarded(
      [] {
        churn.clear();
        depot::synchronize<gpu>();
        return 0;
      },
      -1);
}

DLPT_API std::int64_t dlpt_export_deleter_calls() { return count_of(exports_book, &deleter_book::calls); }
DLPT_API std::int64_t dlpt_export_deleter_errors() { return count_of(exports_book, &deleter_book::errors); }
DLPT_API std::int64_t dlpt_export_pending()
{
  const std::lock_guard<std::mutex> lock{exports_book.mutex};
  return static_cast<std::int64_t>(exports_book.pending.size());
}

// Imports a DLPack tensor (float32 or int64, on the library's device) as a depot view; depot owns it on
// success (its deleter counted). Returns a handle > 0, or -1 (the caller still owns it).
DLPT_API int dlpt_import(DLManagedTensor* t)
{
  return guarded(
      [t]() -> int {
        if (t == nullptr) {
          last_error = "dlpt_import: null tensor";
          return -1;
        }
        const DLDataType dt = t->dl_tensor.dtype;
        track<imports_book>(t);  // before the import: depot calls whatever deleter is there
        try {
          any_view v;
          if (dt.code == kDLFloat && dt.bits == 32) {
            v = depot::from_dlpack<float, gpu>(t);
          } else if (dt.code == kDLInt && dt.bits == 64) {
            v = depot::from_dlpack<std::int64_t, gpu>(t);
          } else {
            throw depot::invalid_argument("dlpt_import: only float32 and int64 are handled, got code " +
                                          std::to_string(dt.code) + " bits " + std::to_string(dt.bits));
          }
          const int h = next_handle++;
          imported.emplace(h, std::move(v));
          return h;
        } catch (...) {
          untrack<imports_book>(t);  // refused: the caller keeps the tensor and its deleter
          throw;
        }
      },
      -1);
}

// The imported view's rank, shape, strides (elements) and offset (elements, from the
// lowest element reached). Returns the rank, or -1.
DLPT_API int dlpt_import_layout(int handle, std::int64_t* shape, std::int64_t* strides, std::int64_t* offset)
{
  return guarded(
      [&]() -> int {
        const auto it = find_view(imported, handle, "imported view");
        if (it == imported.end()) {
          return -1;
        }
        return std::visit(
            [&](const auto& v) {
              const depot::layout& l = v.get_layout();
              for (int d = 0; d < l.rank(); ++d) {
                shape[d] = l.size(d);
                strides[d] = l.stride(d);
              }
              *offset = l.offset();
              return l.rank();
            },
            it->second);
      },
      -1);
}

// The address of the imported view's first element.
DLPT_API void* dlpt_import_data(int handle)
{
  return guarded(
      [&]() -> void* {
        const auto it = find_view(imported, handle, "imported view");
        if (it == imported.end()) {
          return nullptr;
        }
        return std::visit([](const auto& v) { return static_cast<void*>(v.data()); }, it->second);
      },
      nullptr);
}

// Compares the imported view's elements, read through depot, with `expected` (n, row-major).
DLPT_API std::int64_t dlpt_import_check(int handle, const void* expected, std::int64_t n)
{
  return compare_entry(imported, handle, "imported view", expected, n);
}

// Writes `values` (n, row-major) into the imported view through depot (host -> device copy
// and a strided device copy), then synchronises.
DLPT_API int dlpt_import_write(int handle, const void* values, std::int64_t n)
{
  return guarded(
      [&]() -> int {
        const auto it = find_view(imported, handle, "imported view");
        if (it == imported.end()) {
          return -1;
        }
        return std::visit(
            [&](auto& v) -> int {
              using T = typename std::decay_t<decltype(v)>::value_type;
              if (v.numel() != n) {
                last_error = "dlpt_import_write: " + std::to_string(n) + " values for " +
                             std::to_string(v.numel()) + " elements";
                return -1;
              }
              auto src = depot::strided_view<T, depot::host>::empty(v.shape());
              std::memcpy(src.data(), values, static_cast<std::size_t>(n) * sizeof(T));
              v.copy_(src);
              depot::synchronize<gpu>();
              return 0;
            },
            it->second);
      },
      -1);
}

// Drops depot's handle on an imported view: the last one, so the producer's deleter runs.
DLPT_API int dlpt_import_release(int handle)
{
  return guarded(
      [handle]() -> int {
        const auto it = find_view(imported, handle, "imported view");
        if (it == imported.end()) {
          return -1;
        }
        depot::synchronize<gpu>();  // depot's reads are complete before the producer frees
        imported.erase(it);
        return 0;
      },
      -1);
}

DLPT_API std::int64_t dlpt_import_deleter_calls() { return count_of(imports_book, &deleter_book::calls); }
DLPT_API std::int64_t dlpt_import_deleter_errors() { return count_of(imports_book, &deleter_book::errors); }
