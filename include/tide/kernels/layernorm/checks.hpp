#pragma once
// Argument checks of the LayerNorm kernels, shared by both backends: they run before any memory
// is touched, so a bad call changes nothing.

#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::detail {

// C, once inp is rows of C, `name` (y) has inp's shape, and mean and rstd are one float per row.
template <class X, class Y, class M, class R>
index_t check_rows_with_stats(char const* op, X const& inp, char const* name, Y const& y, M const& mean,
                              R const& rstd) {
  index_t const C = check_rows(op, "inp", inp);
  check_same_shape(op, "inp", inp, name, y);
  check_per_row(op, "mean", mean, inp.size() / C, "inp", inp.extents());
  check_per_row(op, "rstd", rstd, inp.size() / C, "inp", inp.extents());
  return C;
}

// Returns C.
template <class O, class M, class R, class X, class W, class B>
index_t check_layernorm_forward(O const& out, M const& mean, R const& rstd, X const& inp, W const& weight,
                                B const& bias) {
  char const* const op = "layernorm_forward";
  index_t const C = check_rows_with_stats(op, inp, "out", out, mean, rstd);
  check_vector(op, "weight", weight, C, "inp");
  check_vector(op, "bias", bias, C, "inp");
  check_disjoint(op, {written("out", out), written("mean", mean), written("rstd", rstd), read("inp", inp),
                      read("weight", weight), read("bias", bias)});
  return C;
}

// Returns C.
template <class DI, class DW, class DB, class DO, class X, class W, class M, class R>
index_t check_layernorm_backward(DI const& dinp, DW const& dweight, DB const& dbias, DO const& dout, X const& inp,
                                 W const& weight, M const& mean, R const& rstd) {
  char const* const op = "layernorm_backward";
  index_t const C = check_rows_with_stats(op, inp, "dout", dout, mean, rstd);
  check_same_shape(op, "inp", inp, "dinp", dinp);
  check_vector(op, "weight", weight, C, "inp");
  check_vector(op, "dweight", dweight, C, "inp");
  check_vector(op, "dbias", dbias, C, "inp");
  check_disjoint(op, {written("dinp", dinp), written("dweight", dweight), written("dbias", dbias), read("dout", dout),
                      read("inp", inp), read("weight", weight), read("mean", mean), read("rstd", rstd)});
  return C;
}

// The halves of layernorm_backward (a backward split in two). Return C.
template <class DI, class DO, class X, class W, class M, class R>
index_t check_layernorm_backward_input(DI const& dinp, DO const& dout, X const& inp, W const& weight, M const& mean,
                                       R const& rstd) {
  char const* const op = "layernorm_backward_input";
  index_t const C = check_rows_with_stats(op, inp, "dout", dout, mean, rstd);
  check_same_shape(op, "inp", inp, "dinp", dinp);
  check_vector(op, "weight", weight, C, "inp");
  check_disjoint(op, {written("dinp", dinp), read("dout", dout), read("inp", inp), read("weight", weight),
                      read("mean", mean), read("rstd", rstd)});
  return C;
}
template <class DW, class DB, class DO, class X, class M, class R>
index_t check_layernorm_backward_weight(DW const& dweight, DB const& dbias, DO const& dout, X const& inp,
                                        M const& mean, R const& rstd) {
  char const* const op = "layernorm_backward_weight";
  index_t const C = check_rows_with_stats(op, inp, "dout", dout, mean, rstd);
  check_vector(op, "dweight", dweight, C, "inp");
  check_vector(op, "dbias", dbias, C, "inp");
  check_disjoint(op, {written("dweight", dweight), written("dbias", dbias), read("dout", dout), read("inp", inp),
                      read("mean", mean), read("rstd", rstd)});
  return C;
}

// Returns C.
template <class RO, class O, class M, class R, class A, class Bv, class W, class B>
index_t check_residual_layernorm_forward(RO const& residual, O const& out, M const& mean, R const& rstd, A const& a,
                                         Bv const& b, W const& weight, B const& bias) {
  char const* const op = "residual_layernorm_forward";
  index_t const C = check_rows(op, "a", a);
  check_same_shape(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "residual", residual);
  check_same_shape(op, "a", a, "out", out);
  check_per_row(op, "mean", mean, a.size() / C, "a", a.extents());
  check_per_row(op, "rstd", rstd, a.size() / C, "a", a.extents());
  check_vector(op, "weight", weight, C, "a");
  check_vector(op, "bias", bias, C, "a");
  check_disjoint(op, {written_in_place("residual", residual), written("out", out), written("mean", mean),
                      written("rstd", rstd), read("a", a), read("b", b), read("weight", weight), read("bias", bias)});
  return C;
}

}  // namespace tide::kernels::detail
