#pragma once
// Argument checks of the matmul kernels, shared by both backends and the reference: they run
// before any memory is touched, so a bad call changes nothing.
//
// inp is seen as rows: (N, C) or (B, T, C) (N = B*T rows of C); out has inp's leading extents and
// a last extent OC; weight is (OC, C), bias (OC). An absent bias is a view with no data ({}).

#include <climits>

#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::detail {

struct matmul_dims {
  index_t N;   // rows of inp and out
  index_t C;   // input channels
  index_t OC;  // output channels
};

// An optional view (bias, dbias) is given when it has data.
template <class V>
constexpr bool matmul_given(V const& v) noexcept {
  return v.data() != nullptr;
}

// The region of an optional view: empty when it is absent.
template <class V>
region matmul_optional(region r, V const& v) {
  if (!matmul_given(v)) r.bytes = 0;
  return r;
}

// out has inp's leading extents and a last extent OC.
template <class X, class O>
void check_rows_like(char const* op, char const* x_name, X const& x, char const* o_name, O const& o, index_t OC) {
  bool ok = o.rank() == x.rank() && o.extent(o.rank() - 1) == OC;
  for (int d = 0; ok && d + 1 < x.rank(); ++d) ok = o.extent(d) == x.extent(d);
  TIDE_REQUIRE(ok, op, " needs ", o_name, " with the leading extents of ", x_name, " ", rows_shape_text(x.extents()),
               " and a last extent ", OC, " (the first extent of the (OC, C) matrix), got ", rows_shape_text(o.extents()));
  check_contiguous(op, o_name, o);
}

// x_name, w_name: what the caller calls the rows and the (OC, C) matrix (dinp, dweight in the
// halves of the backward).
template <class X, class W>
matmul_dims check_matmul_operands(char const* op, X const& inp, W const& weight, char const* x_name = "inp",
                                  char const* w_name = "weight") {
  TIDE_REQUIRE(inp.rank() >= 2, op, " needs ", x_name, " of shape (N, C) or (B, T, C), got ",
               rows_shape_text(inp.extents()));
  index_t const C = check_rows(op, x_name, inp);
  TIDE_REQUIRE(weight.rank() == 2 && weight.extent(0) >= 1 && weight.extent(1) == C, op, " needs ", w_name,
               " of shape (OC, C) with OC >= 1 and C = ", C, " (the last extent of ", x_name, " ",
               rows_shape_text(inp.extents()), "), got ", rows_shape_text(weight.extents()));
  check_contiguous(op, w_name, weight);
  matmul_dims const d{inp.size() / C, C, weight.extent(0)};
  // BLAS takes int sizes.
  TIDE_REQUIRE(d.N <= INT_MAX && d.C <= INT_MAX && d.OC <= INT_MAX, op, " supports at most ", INT_MAX,
               " rows and channels, got N = ", d.N, ", C = ", d.C, ", OC = ", d.OC, "; split the rows");
  return d;
}

template <class O, class X, class W, class B>
matmul_dims check_matmul_forward(O const& out, X const& inp, W const& weight, B const& bias) {
  char const* const op = "matmul_forward";
  matmul_dims const d = check_matmul_operands(op, inp, weight);
  check_rows_like(op, "inp", inp, "out", out, d.OC);
  if (matmul_given(bias)) check_vector(op, "bias", bias, d.OC, "out");
  check_disjoint(
      op, {written("out", out), read("inp", inp), read("weight", weight), matmul_optional(read("bias", bias), bias)});
  return d;
}

template <class O, class P, class X, class W, class B>
matmul_dims check_matmul_forward_gelu(O const& out, P const& pre, X const& inp, W const& weight, B const& bias) {
  char const* const op = "matmul_forward_gelu";
  matmul_dims const d = check_matmul_operands(op, inp, weight);
  check_rows_like(op, "inp", inp, "out", out, d.OC);
  check_same_shape(op, "out", out, "pre", pre);
  if (matmul_given(bias)) check_vector(op, "bias", bias, d.OC, "out");
  check_disjoint(op, {written("out", out), written("pre", pre), read("inp", inp), read("weight", weight),
                      matmul_optional(read("bias", bias), bias)});
  return d;
}

// dout_use: how the kernel treats dout: read, or written in place (the GELU form).
template <class DI, class DW, class DB, class DO, class X, class W>
matmul_dims check_matmul_backward(char const* op, DI const& dinp, DW const& dweight, DB const& dbias, DO const& dout,
                                  X const& inp, W const& weight, region::use dout_use) {
  matmul_dims const d = check_matmul_operands(op, inp, weight);
  check_same_shape(op, "inp", inp, "dinp", dinp);
  check_same_shape(op, "weight", weight, "dweight", dweight);
  check_rows_like(op, "inp", inp, "dout", dout, d.OC);
  if (matmul_given(dbias)) check_vector(op, "dbias", dbias, d.OC, "dout");
  check_disjoint(op,
                 {written("dinp", dinp), written("dweight", dweight), matmul_optional(written("dbias", dbias), dbias),
                  region{"dout", static_cast<void const*>(dout.data()), dout.bytes(),
                         dout_use == region::use::read ? region::use::read : region::use::written},
                  read("inp", inp), read("weight", weight)});
  return d;
}

// The two halves of matmul_backward (zero-bubble pipelines run them apart): the input gradient
// (dinp's shape gives N and C, weight's OC) and the weight gradients (inp's N and C, dweight's OC).
template <class DI, class DO, class W>
matmul_dims check_matmul_backward_input(char const* op, DI const& dinp, DO const& dout, W const& weight,
                                        region::use dout_use) {
  matmul_dims const d = check_matmul_operands(op, dinp, weight, "dinp");
  check_rows_like(op, "dinp", dinp, "dout", dout, d.OC);
  check_disjoint(op, {written("dinp", dinp),
                      region{"dout", static_cast<void const*>(dout.data()), dout.bytes(),
                             dout_use == region::use::read ? region::use::read : region::use::written},
                      read("weight", weight)});
  return d;
}
template <class DW, class DB, class DO, class X>
matmul_dims check_matmul_backward_weight(DW const& dweight, DB const& dbias, DO const& dout, X const& inp) {
  char const* const op = "matmul_backward_weight";
  matmul_dims const d = check_matmul_operands(op, inp, dweight, "inp", "dweight");
  check_rows_like(op, "inp", inp, "dout", dout, d.OC);
  if (matmul_given(dbias)) check_vector(op, "dbias", dbias, d.OC, "dout");
  check_disjoint(op, {written("dweight", dweight), matmul_optional(written("dbias", dbias), dbias),
                      read("dout", dout), read("inp", inp)});
  return d;
}

template <class DO, class P>
void check_matmul_gelu_pre(DO const& dout, P const& pre, char const* op = "matmul_backward_gelu") {
  check_same_shape(op, "dout", dout, "pre", pre);
  check_disjoint(op, {written("dout", dout), read("pre", pre)});
}

}  // namespace tide::kernels::detail
