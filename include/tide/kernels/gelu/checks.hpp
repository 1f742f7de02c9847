#pragma once
// Argument checks of the GELU kernels, shared by both backends: they run before any memory is
// touched, so a bad call changes nothing.

#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::detail {

template <class O, class X>
void check_gelu_forward(O const& out, X const& inp) {
  char const* const op = "gelu_forward";
  check_contiguous(op, "inp", inp);
  check_same_shape(op, "inp", inp, "out", out);
  check_disjoint(op, {written_in_place("out", out), read("inp", inp)});
}

template <class DI, class X, class DO>
void check_gelu_backward(DI const& dinp, X const& inp, DO const& dout) {
  char const* const op = "gelu_backward";
  check_contiguous(op, "inp", inp);
  check_same_shape(op, "inp", inp, "dout", dout);
  check_same_shape(op, "inp", inp, "dinp", dinp);
  check_disjoint(op, {written_in_place("dinp", dinp), read("inp", inp), read("dout", dout)});
}

// Returns C.
template <class O, class X, class B>
index_t check_bias_gelu_forward(O const& out, X const& inp, B const& bias) {
  char const* const op = "bias_gelu_forward";
  index_t const C = check_rows(op, "inp", inp);
  check_same_shape(op, "inp", inp, "out", out);
  check_vector(op, "bias", bias, C, "inp");
  check_disjoint(op, {written_in_place("out", out), read("inp", inp), read("bias", bias)});
  return C;
}

// Returns C.
template <class DI, class DB, class X, class B, class DO>
index_t check_bias_gelu_backward(DI const& dinp, DB const& dbias, X const& inp, B const& bias, DO const& dout) {
  char const* const op = "bias_gelu_backward";
  index_t const C = check_rows(op, "inp", inp);
  check_same_shape(op, "inp", inp, "dout", dout);
  check_same_shape(op, "inp", inp, "dinp", dinp);
  check_vector(op, "bias", bias, C, "inp");
  check_vector(op, "dbias", dbias, C, "inp");
  check_disjoint(op, {written_in_place("dinp", dinp), written("dbias", dbias), read("inp", inp), read("bias", bias),
                      read("dout", dout)});
  return C;
}

}  // namespace tide::kernels::detail
