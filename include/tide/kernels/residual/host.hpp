#pragma once
// The host path of the residual kernels: flat loops g++ vectorises, threaded in tasks of
// row_tuning::min_task_elems elements. Elementwise, so the result is the same for any thread count.

#include "tide/core/exec.hpp"
#include "tide/kernels/residual/checks.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels {

namespace detail {

// out may be a or b (in place): no __restrict on it.
template <class T>
void residual_forward_span(T* out, T const* a, T const* b, index_t n) {
  for (index_t i = 0; i < n; ++i) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <class T>
void residual_backward_span(T* __restrict da, T* __restrict db, T const* __restrict dout, index_t n) {
#pragma GCC ivdep
  for (index_t i = 0; i < n; ++i) {
    float const g = to_float(dout[i]);
    da[i] = from_float<T>(to_float(da[i]) + g);
    db[i] = from_float<T>(to_float(db[i]) + g);
  }
}

}  // namespace detail

// out = a + b (float sum, one rounding to T). out may be a or b (in place).
template <Element T, class A, class B>
  requires ReadView<A, T> && ReadView<B, T>
void residual_forward(exec<host> const& ex, tensor_view<T> out, A a, B b) {
  detail::check_residual_forward(out, a, b);
  T* const o = out.data();
  T const* const pa = a.data();
  T const* const pb = b.data();
  detail::for_elements(ex.pool, out.size(),
                       [=](index_t i0, index_t i1) { detail::residual_forward_span(o + i0, pa + i0, pb + i0, i1 - i0); });
}

// da += dout and db += dout. da, db and dout are separate tensors.
template <Element T, class D>
  requires ReadView<D, T>
void residual_backward(exec<host> const& ex, tensor_view<T> da, tensor_view<T> db, D dout) {
  detail::check_residual_backward(da, db, dout);
  T* const pa = da.data();
  T* const pb = db.data();
  T const* const g = dout.data();
  detail::for_elements(ex.pool, dout.size(),
                       [=](index_t i0, index_t i1) { detail::residual_backward_span(pa + i0, pb + i0, g + i0, i1 - i0); });
}

}  // namespace tide::kernels
