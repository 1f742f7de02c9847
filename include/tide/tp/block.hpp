#pragma once
// A GPT transformer block split over a tensor-parallel group (Megatron-LM: Shoeybi et al. 2019;
// sequence parallelism: Korthikanti et al. 2022), over any Communicator. Each of the group's t
// ranks holds its shard of the block's parameters (tp/shard.hpp) and computes its NH/t heads and
// 4C/t hidden units:
//
//   ln1 ─f─ qkv (column) ─ attention ─ proj (row) ─g─ + x ─ ln2 ─f─ fc (column) ─ gelu ─ proj (row) ─g─ + res2
//
//   f: identity forward; backward, the input gradient's all-reduce over the group.
//   g: forward, the partial outputs' all-reduce; identity backward.
// Two all-reduces forward, two backward. The row-parallel bias is added once, by rank 0, into
// its partial sum. Backward, each f's all-reduce runs while the column-parallel GEMM's weight
// gradient is computed (its data does not need the sum): the collective overlaps a GEMM.
//
// Sequence parallel (`sequence`): the LayerNorms and residuals run on the rank's n = B T / t rows
// of the (B T) rows (rank r: rows [r n, (r + 1) n)); f becomes an all-gather of the LayerNorm's
// rows and g a reduce-scatter of the partial sums to the rows' owners; backward, the gradient of
// an all-gather is a reduce-scatter and the other way round. Forward, the same bytes on the wire
// as the two all-reduces; the LayerNorm regions' activations / t. The backward gathers the
// LayerNorm's rows again rather than keeping them whole (as Megatron does): one all-gather more
// per half-block, 1.5 times plain tensor parallelism's backward bytes. The LayerNorms' weight
// gradients are then each rank's rows' share: reduce_replicated sums them over the group, once
// per step.
//
// With t = 1 (comm::self) the block runs nn::gpt's kernels in nn::gpt's order: the same bits.
// The collectives take the views' memory as host spans: the host backend only.
//
//   tide::tp::block_forward(ex, group, sequence, x, views, shard, heads_per_rank);
//   tide::tp::block_backward(ex, group, sequence, dres, x, views, shard, dshard, heads_per_rank);

#include <algorithm>
#include <cstddef>
#include <span>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/nn/backend_ops.hpp"
#include "tide/nn/gpt_blocks.hpp"
#include "tide/tp/shard.hpp"

namespace tide::tp {

// One rank's activations of a tensor-parallel block. n: the rank's rows, B T (plain) or B T / t
// (sequence parallel); C/t, 3C/t and 4C/t: the rank's heads and hidden units.
template <Backend B, class T>
struct block_views {
  tensor_view<T, B> ln1, attproj, res2, ln2, fcproj, res3;      // (n, C)
  tensor_view<float, B> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;  // (n)
  tensor_view<T, B> qkv;                                         // (B, T, 3C/t)
  tensor_view<T, B> atty;                                        // (B, T, C/t)
  tensor_view<float, B> lse;                                     // (B, NH/t, T)
  tensor_view<T, B> fch, fch_gelu;                               // (B, T, 4C/t)
  // Backward: the rank's heads' and hidden units' gradients, and the column-parallel GEMMs'
  // input gradient (summed over the group in place).
  tensor_view<T, B> dfch, datty, dqkv;  // (B, T, 4C/t), (B, T, C/t), (B, T, 3C/t)
  tensor_view<T, B> dln;                // (B, T, C)
  // Sequence parallel only (empty otherwise): every row of a LayerNorm's output (gathered) or of
  // a gradient, the row-parallel GEMM's partial sums, and dln's sum for the rank's rows.
  tensor_view<T, B> whole, partial;  // (B, T, C)
  tensor_view<T, B> dln_rows;        // (n, C)
  kernels::scratch<B> ws;            // block_scratch_bytes
};

// The scratch block_forward and block_backward ask for at (Bn, Tn) on a group of t.
template <Element T, Backend B>
std::size_t block_scratch_bytes(exec<B> const& ex, nn::gpt_config const& c, int t, index_t Bn, index_t Tn) {
  using namespace kernels;
  index_t const N = Bn * Tn, C = c.channels, Cl = C / t, NHl = c.heads / t;
  return std::max({matmul_forward_scratch_bytes<T>(ex, N, C, 3 * Cl), attention_forward_scratch_bytes(ex, Bn, Tn, Cl, NHl),
                   matmul_forward_scratch_bytes<T>(ex, N, Cl, C), matmul_forward_scratch_bytes<T>(ex, N, C, 4 * Cl),
                   matmul_forward_scratch_bytes<T>(ex, N, 4 * Cl, C), matmul_backward_scratch_bytes<T>(ex, N, 4 * Cl, C),
                   matmul_backward_scratch_bytes<T>(ex, N, C, 4 * Cl), layernorm_backward_scratch_bytes(ex, N, C),
                   matmul_backward_scratch_bytes<T>(ex, N, Cl, C), attention_backward_scratch_bytes(ex, Bn, Tn, Cl, NHl),
                   matmul_backward_scratch_bytes<T>(ex, N, C, 3 * Cl)});
}

namespace detail {

template <class T, Backend B>
std::span<T> span_of(tensor_view<T, B> v) noexcept {
  return {v.data(), static_cast<std::size_t>(v.size())};
}
template <class T, Backend B>
std::span<T const> cspan_of(tensor_view<T, B> v) noexcept {
  return {v.data(), static_cast<std::size_t>(v.size())};
}

template <Backend B, class T, comm::Communicator G>
void check_block(G const& group, bool sequence, tensor_view<T const, B> x, block_views<B, T> const& a, index_t NH) {
  static_assert(!B::is_device, "tide::tp: the block's collectives take its memory as host spans; run it on tide::host");
  TIDE_REQUIRE((x.rank() == 2 || x.rank() == 3) && a.qkv.rank() == 3, "tp::block: x must be (n, C) or (B, T, C) and "
               "views.qkv (B, T, 3C/t); got ranks ", x.rank(), " and ", a.qkv.rank());
  index_t const t = group.size(), n = x.size() / x.extent(x.rank() - 1);
  index_t const N = a.qkv.extent(0) * a.qkv.extent(1);  // B T, from views.qkv
  TIDE_REQUIRE(n == (sequence ? N / t : N) && (!sequence || N % t == 0), "tp::block: x has ", n, " rows and views.qkv ",
               N, "; ", sequence ? "sequence parallel, each rank holds B T / t = " : "each rank holds all B T = ",
               sequence ? N / t : N, (N % t != 0 ? " (B T must be a multiple of t)" : ""));
  TIDE_REQUIRE(NH >= 1 && a.lse.rank() == 3 && a.lse.extent(1) == NH, "tp::block: lse holds ",
               a.lse.rank() == 3 ? a.lse.extent(1) : 0, " heads, the rank computes ", NH,
               "; pass heads / t heads per rank");
  TIDE_REQUIRE(!sequence || (a.whole.size() == N * x.extent(x.rank() - 1) && a.partial.size() == a.whole.size() &&
                             a.dln_rows.size() == x.size()),
               "tp::block: sequence parallel needs whole and partial of B T C = ", N * x.extent(x.rank() - 1),
               " and dln_rows of n C = ", x.size(), " elements; got ", a.whole.size(), ", ", a.partial.size(), " and ",
               a.dln_rows.size());
}

// The rows of a (B, T, C) tensor as (B T, C).
template <class T, Backend B>
tensor_view<T, B> as_rows(tensor_view<T, B> v) noexcept {
  index_t const C = v.extent(v.rank() - 1);
  return tensor_view<T, B>(v.data(), {v.size() / C, C});
}

}  // namespace detail

// x_{l+1} (a.res3) from x_l (the rank's rows) and the rank's shard w.
template <Backend B, class T, comm::Communicator G>
void block_forward(exec<B> const& ex, G& group, bool sequence, tensor_view<T const, B> x, block_views<B, T> const& a,
                   nn::detail::block_params<tensor_view<T const, B>> const& w, index_t NH) {
  using enum nn::block_param;
  using cview = tensor_view<T const, B>;
  using detail::as_rows;
  detail::check_block(group, sequence, x, a, NH);
  bool const bias_here = group.rank() == 0;  // the row-parallel biases, once over the group
  // The column-parallel GEMMs' input: the LayerNorm's rows, all of them (f).
  auto const gathered = [&](tensor_view<T, B> ln) {
    if (!sequence) return cview(ln);
    group.all_gather(detail::cspan_of(ln), detail::span_of(a.whole));
    return cview(as_rows(a.whole));
  };
  // A row-parallel GEMM's partial sums into `out`, the rank's rows (g).
  auto const row_parallel = [&](tensor_view<T, B> out, cview inp, cview weight, cview bias) {
    tensor_view<T, B> const p = sequence ? as_rows(a.partial) : out;
    kernels::matmul_forward(ex, p, inp, weight, bias_here ? bias : cview{}, a.ws);
    if (sequence)
      group.reduce_scatter(detail::cspan_of(p), detail::span_of(out), comm::reduce_op::sum);
    else if (group.size() > 1)
      group.all_reduce(detail::span_of(p), comm::reduce_op::sum);
  };
  cview const xr = as_rows(x);
  kernels::layernorm_forward(ex, a.ln1, a.ln1_mean, a.ln1_rstd, xr, w[ln1_w], w[ln1_b]);
  kernels::matmul_forward(ex, as_rows(a.qkv), gathered(a.ln1), w[qkv_w], w[qkv_b], a.ws);
  kernels::attention_forward(ex, a.atty, a.lse, cview(a.qkv), NH, a.ws);
  row_parallel(a.attproj, cview(as_rows(a.atty)), w[attn_proj_w], w[attn_proj_b]);
  kernels::residual_layernorm_forward(ex, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, xr, cview(a.attproj), w[ln2_w],
                                      w[ln2_b]);
  kernels::matmul_forward_gelu(ex, as_rows(a.fch_gelu), as_rows(a.fch), gathered(a.ln2), w[fc_w], w[fc_b], a.ws);
  row_parallel(a.fcproj, cview(as_rows(a.fch_gelu)), w[mlp_proj_w], w[mlp_proj_b]);
  kernels::residual_forward(ex, a.res3, cview(a.res2), cview(a.fcproj));
}

// dres: d x_{l+1} (the rank's rows) on entry, d x_l on return; dw += the gradients of the rank's
// shard (the LayerNorms' of its rows only under sequence parallelism: reduce_replicated).
template <Backend B, class T, comm::Communicator G>
void block_backward(exec<B> const& ex, G& group, bool sequence, tensor_view<T, B> dres, tensor_view<T const, B> x,
                    block_views<B, T> const& a, nn::detail::block_params<tensor_view<T const, B>> const& w,
                    nn::detail::block_params<tensor_view<T, B>> const& dw, index_t NH) {
  using enum nn::block_param;
  using cview = tensor_view<T const, B>;
  using fview = tensor_view<float const, B>;
  using detail::as_rows;
  detail::check_block(group, sequence, x, a, NH);
  tensor_view<T, B> const dr = as_rows(dres);
  // A row-parallel GEMM's output gradient, every row of it: g's gradient is the identity, or
  // under sequence parallelism the all-gather of the rows.
  auto const all_rows = [&]() -> cview {
    if (!sequence) return cview(dr);
    group.all_gather(detail::cspan_of(dr), detail::span_of(a.whole));
    return cview(as_rows(a.whole));
  };
  // A column-parallel GEMM's backward from its output gradient dout: dln = dout @ W (this rank's
  // part), summed over the group (f's gradient: an all-reduce, or a reduce-scatter to the rows'
  // owners) while the weight gradient is computed; then dres += the LayerNorm's input gradient.
  // Under sequence parallelism the LayerNorm's rows `ln` are gathered again (into `partial`)
  // while the input gradient is computed.
  auto const column_backward = [&](tensor_view<T, B> dout, tensor_view<T, B> ln, bool gelu, tensor_view<T, B> dweight,
                                   tensor_view<T, B> dbias, cview weight, cview ln_w, fview mean, fview rstd,
                                   tensor_view<T, B> ln_dw, tensor_view<T, B> ln_db, cview ln_in) {
    typename G::request gather{}, sum{};
    if (sequence) gather = group.all_gather_async(detail::cspan_of(ln), detail::span_of(a.partial));
    tensor_view<T, B> const dln = as_rows(a.dln), d = as_rows(dout);
    nn::detail::zero_fill(ex, dln);
    if (gelu)
      kernels::matmul_backward_gelu_input(ex, dln, d, cview(as_rows(a.fch)), weight, a.ws);
    else
      kernels::matmul_backward_input(ex, dln, cview(d), weight, a.ws);
    if (sequence)
      sum = group.reduce_scatter_async(detail::cspan_of(dln), detail::span_of(a.dln_rows), comm::reduce_op::sum);
    else if (group.size() > 1)
      sum = group.all_reduce_async(detail::span_of(dln), comm::reduce_op::sum);
    if (sequence) group.wait(gather);
    kernels::matmul_backward_weight(ex, dweight, dbias, cview(d), sequence ? cview(as_rows(a.partial)) : cview(ln),
                                    a.ws);
    group.wait(sum);
    kernels::layernorm_backward(ex, dr, ln_dw, ln_db, sequence ? cview(a.dln_rows) : cview(dln), ln_in, ln_w, mean,
                                rstd, a.ws);
  };
  // MLP: x_{l+1} = res2 + g(gelu(f(ln2) fc^T) proj^T): proj's output gradient is dres, which also
  // flows on into res2.
  nn::detail::zero_fill(ex, a.dfch);
  kernels::matmul_backward(ex, as_rows(a.dfch), dw[mlp_proj_w], dw[mlp_proj_b], all_rows(), cview(as_rows(a.fch_gelu)),
                           w[mlp_proj_w], a.ws);
  column_backward(a.dfch, a.ln2, true, dw[fc_w], dw[fc_b], w[fc_w], w[ln2_w], fview(a.ln2_mean), fview(a.ln2_rstd),
                  dw[ln2_w], dw[ln2_b], cview(a.res2));
  // Attention: res2 = x_l + g(attention(f(ln1) qkv^T) proj^T).
  nn::detail::zero_fill(ex, a.datty);
  kernels::matmul_backward(ex, as_rows(a.datty), dw[attn_proj_w], dw[attn_proj_b], all_rows(), cview(as_rows(a.atty)),
                           w[attn_proj_w], a.ws);
  nn::detail::zero_fill(ex, a.dqkv);
  kernels::attention_backward(ex, a.dqkv, cview(a.datty), cview(a.qkv), cview(a.atty), fview(a.lse), NH, a.ws);
  column_backward(a.dqkv, a.ln1, false, dw[qkv_w], dw[qkv_b], w[qkv_w], w[ln1_w], fview(a.ln1_mean),
                  fview(a.ln1_rstd), dw[ln1_w], dw[ln1_b], as_rows(x));
}

// Under sequence parallelism, each rank's LayerNorm weight gradients hold its rows' share: sums
// them over the group (every rank then has the whole gradient), once per step after the last
// micro-batch's backward, on gradients zeroed at the step's start (a second sum would count the
// first t times). Without sequence parallelism they are whole already: nothing to do.
// The head's final LayerNorm: the same, one gradient at a time.
template <Backend B, class T, comm::Communicator G>
void reduce_replicated(G& group, bool sequence, tensor_view<T, B> gradient) {
  static_assert(!B::is_device, "tide::tp: the collectives take host memory; run it on tide::host");
  if (sequence && group.size() > 1) group.all_reduce(detail::span_of(gradient), comm::reduce_op::sum);
}
template <Backend B, class T, comm::Communicator G>
void reduce_replicated(G& group, bool sequence, nn::detail::block_params<tensor_view<T, B>> const& dw) {
  using enum nn::block_param;
  for (nn::block_param p : {ln1_w, ln1_b, ln2_w, ln2_b}) reduce_replicated(group, sequence, dw[p]);
}

}  // namespace tide::tp
