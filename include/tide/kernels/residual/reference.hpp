#pragma once
// The scalar oracle of the residual kernels: one element at a time, the sum formed in double
// (exact for two float, bf16 or f16 values) and rounded once to the element type.

#include "tide/kernels/residual/checks.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::reference {

// out = a + b, elementwise. (N, C) or any shape, all equal.
template <class T, class A, class B>
  requires Real<T> && ReadView<A, T> && ReadView<B, T>
void residual_forward(tensor_view<T> out, A a, B b) {
  kernels::detail::check_residual_forward(out, a, b);
  for (index_t i = 0; i < out.size(); ++i) out.data()[i] = store<T>(load(a.data()[i]) + load(b.data()[i]));
}

// da += dout, db += dout: the gradient of a sum reaches both addends.
template <class T, class D>
  requires Real<T> && ReadView<D, T>
void residual_backward(tensor_view<T> da, tensor_view<T> db, D dout) {
  kernels::detail::check_residual_backward(da, db, dout);
  for (index_t i = 0; i < dout.size(); ++i) {
    double const g = load(dout.data()[i]);
    da.data()[i] = store<T>(load(da.data()[i]) + g);
    db.data()[i] = store<T>(load(db.data()[i]) + g);
  }
}

}  // namespace tide::kernels::reference
