// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
#pragma once

#include <depot/hal/device.hpp>
#include <depot/storage/index_expr.hpp>
#include <depot/storage/strided_view.hpp>

#include <utility>

namespace depot {

// What x[expr] returns: a short-lived handle that reads (converts to strided_view, running
// x.index(expr)) or writes (x[expr] = tensor / = scalar, running x.index_put). Usable only
// as a temporary: conversion and assignment are rvalue-only, so `auto r = x[e]; r = y;` does
// not compile (write x.index(e) to keep a result). Holds x and the expression (shared, not
// copied); not synchronised.
template <class T, device D>
class index_ref {
 public:
  index_ref(strided_view<T, D> x, index_expr expr) : x_{std::move(x)}, expr_{std::move(expr)} {}
  index_ref(const index_ref&) = delete;
  index_ref& operator=(const index_ref&) = delete;
  ~index_ref() = default;

  // Reading: a view for basic indexing, a new contiguous array for advanced indexing.
  [[nodiscard]] strided_view<T, D> get() && { return x_.index(expr_); }
  operator strided_view<T, D>() && { return x_.index(expr_); }  // NOLINT: x[e] reads as a view

  // x[expr] = y: y (any device) broadcast to the shape of x[expr].
  template <device D2>
  void operator=(const strided_view<T, D2>& y) &&
  {
    x_.index_put(expr_, y);
  }
  // x[expr] = value
  void operator=(const T& value) && { x_.index_put(expr_, value); }
  // x[e] = z[f]
  void operator=(index_ref&& other) && { x_.index_put(expr_, std::move(other).get()); }

 private:
  strided_view<T, D> x_;
  index_expr expr_;
};

}  // namespace depot
