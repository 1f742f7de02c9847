#pragma once
// Argument checks of the attention kernels, shared by both backends and the reference: they run
// before any memory is touched, so a bad call changes nothing.

#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::detail {

struct attention_dims {
  index_t B;   // batch
  index_t T;   // sequence length
  index_t C;   // channels of q (= of k, of v, of out)
  index_t NH;  // heads
  index_t HS;  // head size, C / NH
};

// qkv (B, T, 3C) with C a multiple of NH.
template <class Q>
attention_dims check_attention_qkv(char const* op, char const* name, Q const& qkv, index_t NH) {
  TIDE_REQUIRE(qkv.rank() == 3 && qkv.extent(2) >= 3 && qkv.extent(2) % 3 == 0, op, " needs ", name,
               " of shape (B, T, 3C) (q, k, v of C channels each, per token), got ", rows_shape_text(qkv.extents()));
  check_contiguous(op, name, qkv);
  index_t const C = qkv.extent(2) / 3;
  TIDE_REQUIRE(NH >= 1 && C % NH == 0, op, " needs a head count NH >= 1 that divides C = ", C, " (", name, " ",
               rows_shape_text(qkv.extents()), "), got NH = ", NH);
  return {qkv.extent(0), qkv.extent(1), C, NH, C / NH};
}

template <class O>
void check_attention_out(char const* op, char const* name, O const& out, attention_dims const& d) {
  TIDE_REQUIRE(out.rank() == 3 && out.extent(0) == d.B && out.extent(1) == d.T && out.extent(2) == d.C, op, " needs ",
               name, " of shape (B, T, C) = (", d.B, ", ", d.T, ", ", d.C, ") from qkv, got ",
               rows_shape_text(out.extents()));
  check_contiguous(op, name, out);
}

template <class L>
void check_attention_lse(char const* op, L const& lse, attention_dims const& d) {
  TIDE_REQUIRE(lse.rank() == 3 && lse.extent(0) == d.B && lse.extent(1) == d.NH && lse.extent(2) == d.T, op,
               " needs lse of shape (B, NH, T) = (", d.B, ", ", d.NH, ", ", d.T, "), got ",
               rows_shape_text(lse.extents()));
  check_contiguous(op, "lse", lse);
}

template <class O, class L, class Q>
attention_dims check_attention_forward(O const& out, L const& lse, Q const& qkv, index_t NH) {
  char const* const op = "attention_forward";
  attention_dims const d = check_attention_qkv(op, "qkv", qkv, NH);
  check_attention_out(op, "out", out, d);
  check_attention_lse(op, lse, d);
  check_disjoint(op, {written("out", out), written("lse", lse), read("qkv", qkv)});
  return d;
}

template <class DQ, class DO, class Q, class O, class L>
attention_dims check_attention_backward(DQ const& dqkv, DO const& dout, Q const& qkv, O const& out, L const& lse,
                                        index_t NH) {
  char const* const op = "attention_backward";
  attention_dims const d = check_attention_qkv(op, "qkv", qkv, NH);
  check_same_shape(op, "qkv", qkv, "dqkv", dqkv);
  check_attention_out(op, "dout", dout, d);
  check_attention_out(op, "out", out, d);
  check_attention_lse(op, lse, d);
  check_disjoint(op, {written("dqkv", dqkv), read("dout", dout), read("qkv", qkv), read("out", out), read("lse", lse)});
  return d;
}

}  // namespace tide::kernels::detail
