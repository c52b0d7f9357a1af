// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#include "test_devices.hpp"

#include <doctest/doctest.h>

#include <depot/hal/invalid_argument.hpp>
#include <depot/pool/memory_functions.hpp>
#include <depot/storage/dlpack.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace {

depot::strided_view<float> iota_view(std::initializer_list<std::int64_t> shape)
{
  auto v = depot::strided_view<float>::empty(shape);
  std::iota(v.data(), v.data() + v.numel(), 0.0F);
  return v;
}

// A tensor owned by "another framework": a host vector and a counting deleter.
struct foreign {
  std::vector<double> data;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  int* deleted;
  DLManagedTensor tensor{};
};

DLManagedTensor* make_foreign(int* deleted)
{
  auto* f = new foreign{std::vector<double>(12), {3, 4}, {1, 3}, deleted};  // column-major
  std::iota(f->data.begin(), f->data.end(), 0.0);
  f->tensor.dl_tensor = DLTensor{f->data.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLFloat, 64, 1},
                                 f->shape.data(), f->strides.data(), 0};
  f->tensor.manager_ctx = f;
  f->tensor.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<foreign*>(self->manager_ctx);
    ++*owner->deleted;
    delete owner;
  };
  return &f->tensor;
}

template <class T>
void import_on_host(DLManagedTensor* t)
{
  (void)depot::from_dlpack<T, depot::host>(t);
}

}  // namespace

TEST_CASE_TEMPLATE("dlpack: export describes the view and keeps its storage alive", D, DEPOT_TEST_DEVICES)
{
  const auto base = depot::memory_allocated<D>();
  DLManagedTensor* t = nullptr;
  {
    const auto dev = iota_view({4, 6}).template to<D>();
    const auto view = dev.slice(1, 1, 6, 2).transpose(0, 1);  // shape (3, 4), strides (2, 6)
    t = depot::to_dlpack(view);
    CHECK(t->dl_tensor.ndim == 2);
    CHECK(t->dl_tensor.shape[0] == 3);
    CHECK(t->dl_tensor.shape[1] == 4);
    CHECK(t->dl_tensor.strides[0] == 2);
    CHECK(t->dl_tensor.strides[1] == 6);
    CHECK(t->dl_tensor.byte_offset == 0);  // data points at the first element, as torch expects
    CHECK(t->dl_tensor.data == static_cast<const void*>(view.data()));
    CHECK(t->dl_tensor.dtype.code == kDLFloat);
    CHECK(t->dl_tensor.dtype.bits == 32);
    CHECK(t->dl_tensor.device.device_type == depot::dlpack_device_type<D>());
    // One float past the storage's base, which is aligned as the pool's blocks.
    CHECK((reinterpret_cast<std::uintptr_t>(t->dl_tensor.data) - sizeof(float)) % 256 == 0);
  }
  // The views are gone; the tensor still holds the storage.
  CHECK(depot::memory_allocated<D>() > base);
  {
    const auto back = depot::from_dlpack<float, D>(t);  // depot owns t now
    CHECK(back.to_host_vector() == std::vector<float>{1, 7, 13, 19, 3, 9, 15, 21, 5, 11, 17, 23});
    auto again = back;  // a second handle on the same adopted memory
    CHECK(again.get_storage().ref_count() == 2);
  }
  depot::synchronize<D>();
  CHECK(depot::memory_allocated<D>() == base);  // the deleter ran, the pool got its memory back
}

TEST_CASE("dlpack: a foreign tensor is adopted, aliased and released exactly once")
{
  int deleted = 0;
  DLManagedTensor* t = make_foreign(&deleted);
  auto* owner = static_cast<foreign*>(t->manager_ctx);
  {
    auto v = depot::from_dlpack<double, depot::host>(t);
    CHECK(v.shape()[0] == 3);
    CHECK_FALSE(v.is_contiguous());
    CHECK(v.at({1, 2}) == 7.0);  // column-major: 1 + 2 * 3
    v.at({0, 0}) = -1.0;
    CHECK(owner->data[0] == -1.0);  // zero-copy
    auto copy = v.transpose(0, 1);
    CHECK(deleted == 0);
  }
  CHECK(deleted == 1);
}

TEST_CASE("dlpack: negative strides and empty tensors import correctly")
{
  std::vector<std::int32_t> values{10, 11, 12, 13, 14};
  std::int64_t shape[] = {5};
  std::int64_t strides[] = {-1};
  int released = 0;
  DLManagedTensor t{};
  t.dl_tensor = DLTensor{values.data(), DLDevice{kDLCPU, 0}, 1, DLDataType{kDLInt, 32, 1}, shape, strides,
                         4 * sizeof(std::int32_t)};  // starts at the last element
  t.manager_ctx = &released;
  t.deleter = [](DLManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };
  {
    const auto v = depot::from_dlpack<std::int32_t, depot::host>(&t);
    CHECK(v.to_host_vector() == std::vector<std::int32_t>{14, 13, 12, 11, 10});
  }
  CHECK(released == 1);
  std::int64_t empty_shape[] = {0, 3};
  t.dl_tensor = DLTensor{values.data(), DLDevice{kDLCPU, 0}, 2, DLDataType{kDLInt, 32, 1}, empty_shape, nullptr, 0};
  {
    const auto e = depot::from_dlpack<std::int32_t, depot::host>(&t);
    CHECK(e.numel() == 0);
  }
  CHECK(released == 2);  // released even though it held no element
}

TEST_CASE("dlpack: refused imports leave the tensor with the caller")
{
  int deleted = 0;
  DLManagedTensor* t = make_foreign(&deleted);
  CHECK_THROWS_AS(import_on_host<float>(t), depot::invalid_argument);  // 64-bit data
  CHECK_THROWS_AS(import_on_host<std::int64_t>(t), depot::invalid_argument);
  t->dl_tensor.device.device_type = kDLCUDA;
  CHECK_THROWS_AS(import_on_host<double>(t), depot::invalid_argument);
  t->dl_tensor.device.device_type = kDLCPU;
  t->dl_tensor.byte_offset = 3;
  CHECK_THROWS_AS(import_on_host<double>(t), depot::invalid_argument);
  t->dl_tensor.byte_offset = 0;
  t->dl_tensor.ndim = 9;
  CHECK_THROWS_AS(import_on_host<double>(t), depot::invalid_argument);
  t->dl_tensor.ndim = 2;
  CHECK_THROWS_AS(import_on_host<double>(nullptr), depot::invalid_argument);
  CHECK(deleted == 0);  // nothing consumed it
  t->deleter(t);        // the caller still owns it
  CHECK(deleted == 1);
}
