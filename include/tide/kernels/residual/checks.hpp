#pragma once
// Argument checks of the residual kernels, shared by both backends: they run before any memory is
// touched, so a bad call changes nothing.

#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::detail {

template <class O, class A, class B>
void check_residual_forward(O const& out, A const& a, B const& b) {
  char const* const op = "residual_forward";
  check_contiguous(op, "out", out);
  check_same_shape(op, "out", out, "a", a);
  check_same_shape(op, "out", out, "b", b);
  check_disjoint(op, {written_in_place("out", out), read("a", a), read("b", b)});
}

template <class DA, class DB, class DO>
void check_residual_backward(DA const& da, DB const& db, DO const& dout) {
  char const* const op = "residual_backward";
  check_contiguous(op, "dout", dout);
  check_same_shape(op, "dout", dout, "da", da);
  check_same_shape(op, "dout", dout, "db", db);
  check_disjoint(op, {written("da", da), written("db", db), read("dout", dout)});
}

}  // namespace tide::kernels::detail
