#pragma once
// The GPT's two ends split over a tensor-parallel group by vocabulary (Megatron-LM): rank r of t
// holds rows [r Vp/t, (r + 1) Vp/t) of wte (Vp, the padded vocabulary, a multiple of t), of which
// the real tokens are [first, first + real) (vocab_part_of).
//
//   embedding   out = Σ_ranks (the token's row if it is the rank's, else 0) + wpe (rank 0), one
//               all-reduce (a reduce-scatter to the rows' owners under sequence parallelism).
//               Adding zeros is exact: the bits of the whole table's lookup. Backward needs no
//               collective: each rank adds its tokens' gradients to its rows, and every rank
//               wpe's gradient from every row (wpe is replicated).
//   head        the logits of the rank's vocabulary columns only, (N, Vp/t): never gathered.
//               The cross-entropy reduces three numbers per row across the group: the row's
//               max (an all-reduce of max), then the sum of exp(logit − max) and the target's
//               logit (one all-reduce of sum, 2N floats). loss = log s + max − x_target on every
//               rank. Backward, each rank's logits' gradient (softmax − onehot) · dloss, its
//               product with wte's rows summed over the group (f's gradient, overlapped with
//               the GEMM of wte's gradient), then the final LayerNorm's backward.
//
// The per-row passes are the fused classifier's (kernels/classifier): on a group of one, the
// losses, the logits' gradient, and every gradient are the whole head's bits.
//
//   tide::tp::vocab_part const part = tide::tp::vocab_part_of(config, group.rank(), group.size());
//   tide::tp::embedding_forward(ex, group, sequence, out, tokens, wte_part, wpe, part, embedding, V);
//   ... blocks ...
//   tide::tp::head_forward(ex, group, sequence, x, head, lnf_w, lnf_b, wte_part, targets, part, V);
//   tide::tp::head_backward(ex, group, sequence, dx, x, head, lnf_w, wte_part, dwte_part, dlnf_w, dlnf_b,
//                           targets, part, dloss);
//   tide::tp::embedding_backward(ex, group, sequence, dwte_part, dwpe, dx, tokens, part, embedding);

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tide/comm/communicator.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/classifier/classifier.hpp"
#include "tide/kernels/embedding/embedding.hpp"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/matmul/matmul.hpp"
#include "tide/kernels/softmax/host.hpp"
#include "tide/nn/backend_ops.hpp"
#include "tide/nn/gpt_config.hpp"
#include "tide/tp/block.hpp"

namespace tide::tp {

// Rank r's rows of wte: [first, first + rows), the real tokens among them [first, first + real).
struct vocab_part {
  index_t first = 0, rows = 0, real = 0;
};
inline vocab_part vocab_part_of(nn::gpt_config const& config, int rank, int t) {
  nn::gpt_config const c = nn::resolve(config);  // refuses padded_vocab < vocab
  index_t const Vp = c.padded_vocab, V = c.vocab;
  TIDE_REQUIRE(t >= 1 && rank >= 0 && rank < t, "tp: rank ", rank, " is not in [0, ", t, ")");
  TIDE_REQUIRE(Vp % t == 0, "tp: the padded vocabulary Vp = ", Vp, " does not split over ", t,
               " ranks; pass gpt_config::padded_vocab a multiple of ", t);
  vocab_part p;
  p.rows = Vp / t;
  p.first = rank * p.rows;
  p.real = std::max<index_t>(0, std::min(p.rows, V - p.first));
  return p;
}

// One rank's activations of the two ends. n: the rank's rows (B T, or B T / t under sequence
// parallelism); N = B T.
template <class T>
struct head_views {
  tensor_view<T> lnf;                     // (n, C)
  tensor_view<float> lnf_mean, lnf_rstd;  // (n)
  tensor_view<T> logits;                  // (N, Vp/t): the rank's columns; their gradient after head_backward
  tensor_view<float> stats;               // (3, N): every row's max, sum of exp and target logit
  tensor_view<float> losses;              // (N): every row's loss, on every rank
  tensor_view<T> dlnf;                    // (N, C)
  // Sequence parallel only (empty otherwise): every row of lnf (gathered by head_forward, read by
  // head_backward: keep it between them), and dlnf's sum for the rank's rows.
  tensor_view<T> whole;      // (N, C)
  tensor_view<T> dlnf_rows;  // (n, C)
  kernels::scratch<host> ws;  // head_scratch_bytes
};

// The rank's embedding state: the whole rows under sequence parallelism, and what the backward
// maps tokens to (the rank's rows, other ranks' tokens to a spare row it then drops).
template <class T>
struct embedding_views {
  tensor_view<T> whole;               // (N, C), sequence parallel only
  tensor_view<std::int32_t> mapped;   // (B, T)
  tensor_view<T> spare;               // (1, C), zeroed by each call
  kernels::scratch<host> ws;          // embedding_scratch_bytes
};

template <Element T>
std::size_t head_scratch_bytes(exec<host> const& ex, nn::gpt_config const& c, int t, index_t Bn, index_t Tn) {
  using namespace kernels;
  index_t const N = Bn * Tn, C = c.channels, R = nn::padded_vocab_of(c) / t;
  return std::max({matmul_forward_scratch_bytes<T>(ex, N, C, R), matmul_backward_scratch_bytes<T>(ex, N, C, R),
                   layernorm_backward_scratch_bytes(ex, N, C),
                   sizeof(float) * static_cast<std::size_t>(kernels::detail::softmax_slices(ex.pool, N) * R)});
}
inline std::size_t embedding_scratch_bytes(exec<host> const& ex, nn::gpt_config const& c, int t, index_t Bn,
                                           index_t Tn) {
  return kernels::encoder_backward_scratch_bytes(ex, Bn, Tn, c.channels, nn::padded_vocab_of(c) / t + 1);
}

namespace detail {

// f(row, z) for every row of the rank's logits, z a scratch row of `cols` floats per slice.
template <class F>
void for_logit_rows(char const* what, exec<host> const& ex, kernels::scratch<host> const& ws, index_t rows, index_t cols,
                    F&& f) {
  int const slices = kernels::detail::softmax_slices(ex.pool, rows);
  kernels::detail::check_scratch(what, "head_scratch_bytes", ws,
                                 sizeof(float) * static_cast<std::size_t>(slices) * static_cast<std::size_t>(cols));
  float* const scratch = kernels::detail::scratch_part<float>(ws, 0);
  parallel_for(ex.pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    auto const slice = thread_pool::slice_at(static_cast<std::size_t>(rows), slices, begin);
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r)
      f(r, scratch + static_cast<index_t>(slice) * cols);
  });
}

}  // namespace detail

// out: the rank's rows of wte[tokens] + wpe[position]. tokens (B, T), every row; wte_part
// (rows, C); wpe (maxT, C).
template <class T, comm::Communicator G>
void embedding_forward(exec<host> const& ex, G& group, bool sequence, tensor_view<T> out,
                       tensor_view<std::int32_t const> tokens, tensor_view<T const> wte_part, tensor_view<T const> wpe,
                       vocab_part const& part, embedding_views<T> const& e, index_t vocab) {
  char const* what = "tp::embedding_forward";
  TIDE_REQUIRE(tokens.rank() == 2 && wpe.rank() == 2 && wte_part.rank() == 2, what,
               ": tokens must be (B, T), wpe (maxT, C) and wte_part (rows, C)");
  index_t const N = tokens.size(), Tn = tokens.extent(1), C = wpe.extent(1), t = group.size();
  TIDE_REQUIRE(Tn <= wpe.extent(0) && wte_part.extent(1) == C, what, ": T = ", Tn, " positions against wpe's ",
               wpe.extent(0), " rows, wte_part's ", wte_part.extent(1), " columns against wpe's ", C);
  TIDE_REQUIRE(!sequence || (N % t == 0 && e.whole.size() == N * C), what, ": sequence parallel needs B T = ", N,
               " a multiple of ", t, " and embedding_views::whole of B T C = ", N * C, " elements (it has ",
               e.whole.size(), ")");
  TIDE_REQUIRE(wte_part.extent(0) == part.rows && out.size() == (sequence ? N / t : N) * C, what, ": wte_part has ",
               wte_part.extent(0), " rows (the part has ", part.rows, ") and out ", out.size(),
               " elements; out holds the rank's rows of C");
  nn::detail::check_token_ids(ex, what, "tokens", tokens, vocab);
  T* const o = sequence ? e.whole.data() : out.data();
  bool const adds_pe = group.rank() == 0;
  parallel_for(ex.pool, static_cast<std::size_t>(N), [&](std::size_t begin, std::size_t end) {
    for (auto i = static_cast<index_t>(begin); i < static_cast<index_t>(end); ++i) {
      index_t const v = tokens.data()[i] - part.first;
      T const* const a = v >= 0 && v < part.rows ? wte_part.data() + v * C : nullptr;  // the rank's token
      T const* const p = wpe.data() + (i % Tn) * C;
      for (index_t c = 0; c < C; ++c)
        o[i * C + c] = from_float<T>((a != nullptr ? to_float(a[c]) : 0.f) + (adds_pe ? to_float(p[c]) : 0.f));
    }
  });
  if (sequence)
    group.reduce_scatter(std::span<T const>(o, static_cast<std::size_t>(N * C)), detail::span_of(out),
                         comm::reduce_op::sum);
  else if (group.size() > 1)
    group.all_reduce(detail::span_of(out), comm::reduce_op::sum);
}

// dwte_part += the rank's tokens' gradients (each token's positions summed in order, added once,
// as kernels::encoder_backward); dwpe += every row's (the same on every rank).
template <class T, comm::Communicator G>
void embedding_backward(exec<host> const& ex, G& group, bool sequence, tensor_view<T> dwte_part, tensor_view<T> dwpe,
                        tensor_view<T const> dout, tensor_view<std::int32_t const> tokens, vocab_part const& part,
                        embedding_views<T> const& e) {
  char const* what = "tp::embedding_backward";
  TIDE_REQUIRE(tokens.rank() == 2 && dwpe.rank() == 2, what, ": tokens must be (B, T) and dwpe (maxT, C)");
  index_t const N = tokens.size(), C = dwpe.extent(1), t = group.size();
  TIDE_REQUIRE(dwte_part.size() == part.rows * C && e.mapped.size() == N && e.spare.size() == C &&
                   dout.size() == (sequence ? N / t : N) * C && (!sequence || e.whole.size() == N * C),
               what, ": dwte_part must hold the part's ", part.rows, " rows of C = ", C, ", mapped B T = ", N,
               ", spare C, dout the rank's rows of C", sequence ? " and whole B T C" : "", " elements");
  tensor_view<T const> d(dout.data(), {tokens.extent(0), tokens.extent(1), C});
  if (sequence) {
    group.all_gather(detail::cspan_of(dout), detail::span_of(e.whole));
    d = tensor_view<T const>(e.whole.data(), {tokens.extent(0), tokens.extent(1), C});
  }
  for (index_t i = 0; i < N; ++i) {
    index_t const v = tokens.data()[i] - part.first;
    e.mapped.data()[i] = static_cast<std::int32_t>(v >= 0 && v < part.rows ? v : part.rows);  // others: the spare row
  }
  nn::detail::zero_fill(ex, e.spare);  // the other ranks' tokens' sums land there, unread
  kernels::row_table<T> table;
  table.piece[0] = dwte_part.data();
  table.piece[1] = e.spare.data();
  table.piece_rows = part.rows;
  table.rows = part.rows + 1;
  table.cols = C;
  table.pieces = 2;
  kernels::encoder_backward(ex, table, dwpe, d, tensor_view<std::int32_t const>(e.mapped), e.ws);
}

// losses (every row, every rank) of the logits of x's final LayerNorm against wte: the rank's
// columns in h.logits, the rows' max, sum of exp and target logit in h.stats.
template <class T, comm::Communicator G>
void head_forward(exec<host> const& ex, G& group, bool sequence, tensor_view<T const> x, head_views<T> const& h,
                  tensor_view<T const> lnf_w, tensor_view<T const> lnf_b, tensor_view<T const> wte_part,
                  tensor_view<std::int32_t const> targets, vocab_part const& part, index_t vocab) {
  nn::detail::check_token_ids(ex, "tp::head_forward", "targets", targets, vocab);
  index_t const N = targets.size(), R = part.rows;
  TIDE_REQUIRE(h.logits.size() == N * R && h.stats.size() == 3 * N && h.losses.size() == N,
               "tp::head_forward: logits must hold N x Vp/t = ", N * R, ", stats 3 N = ", 3 * N, " and losses N = ", N,
               " elements; got ", h.logits.size(), ", ", h.stats.size(), " and ", h.losses.size());
  index_t const C = lnf_w.size(), t = group.size(), n = sequence ? N / t : N;
  TIDE_REQUIRE(x.size() == n * C && h.lnf.size() == x.size() && wte_part.size() == R * C &&
                   (!sequence || (N % t == 0 && h.whole.size() == N * C && h.dlnf_rows.size() == n * C)),
               "tp::head_forward: x and lnf must hold the rank's ", n, " rows of C = ", C, " (got ", x.size(),
               " elements), wte_part the part's ", R, " rows", sequence ? ", whole B T C and dlnf_rows n C" : "");
  kernels::layernorm_forward(ex, h.lnf, h.lnf_mean, h.lnf_rstd, x, lnf_w, lnf_b);
  tensor_view<T const> inp(h.lnf);
  if (sequence) {
    group.all_gather(detail::cspan_of(h.lnf), detail::span_of(h.whole));
    inp = tensor_view<T const>(h.whole);
  }
  tensor_view<T> const logits(h.logits.data(), {N, R});
  kernels::matmul_forward(ex, logits, detail::as_rows(inp), wte_part, tensor_view<T const>{}, h.ws);
  float* const m = h.stats.data();
  float* const s = m + N;
  float* const xt = s + N;
  detail::for_logit_rows("tp::head_forward", ex, h.ws, N, R, [&](index_t r, float* z) {
    m[r] = part.real > 0 ? kernels::detail::softmax_row_load_max(z, logits.data() + r * R, part.real, 1.f)
                         : -__builtin_huge_valf();
  });
  if (group.size() > 1) group.all_reduce(std::span<float>(m, static_cast<std::size_t>(N)), comm::reduce_op::max);
  detail::for_logit_rows("tp::head_forward", ex, h.ws, N, R, [&](index_t r, float* z) {
    index_t const col = targets.data()[r] - part.first;  // the target's column here, if it is the rank's
    s[r] = 0.f;
    xt[r] = col >= 0 && col < part.real ? to_float(logits.data()[r * R + col]) : 0.f;
    if (part.real == 0) return;
    (void)kernels::detail::softmax_row_load_max(z, logits.data() + r * R, part.real, 1.f);
    s[r] = kernels::detail::softmax_row_exp_sum(z, part.real, m[r]);
  });
  if (group.size() > 1) group.all_reduce(std::span<float>(s, static_cast<std::size_t>(2 * N)), comm::reduce_op::sum);
  for (index_t r = 0; r < N; ++r) h.losses.data()[r] = kernels::detail::classifier_loss(m[r], s[r], xt[r]);
}

// dres = d x (overwritten, the rank's rows); dwte_part +=, dlnf_w, dlnf_b += (under sequence
// parallelism the rank's rows' share: reduce_replicated). dloss: every row's loss's weight.
template <class T, comm::Communicator G>
void head_backward(exec<host> const& ex, G& group, bool sequence, tensor_view<T> dres, tensor_view<T const> x,
                   head_views<T> const& h, tensor_view<T const> lnf_w, tensor_view<T const> wte_part,
                   tensor_view<T> dwte_part, tensor_view<T> dlnf_w, tensor_view<T> dlnf_b,
                   tensor_view<std::int32_t const> targets, vocab_part const& part, float dloss) {
  index_t const N = targets.size(), R = part.rows;
  TIDE_REQUIRE(h.logits.size() == N * R && h.stats.size() == 3 * N && dres.size() == x.size() &&
                   dwte_part.size() == wte_part.size() && dlnf_w.size() == lnf_w.size() && dlnf_b.size() == lnf_w.size(),
               "tp::head_backward: the views must be head_forward's (logits N x Vp/t = ", N * R, ", stats 3 N), dres "
               "x's shape, and the gradients their parameters'");
  tensor_view<T> const dlogits(h.logits.data(), {N, R});  // in place
  float const* const m = h.stats.data();
  float const* const s = m + N;
  detail::for_logit_rows("tp::head_backward", ex, h.ws, N, R, [&](index_t r, float* z) {
    T* d = dlogits.data() + r * R;
    if (part.real > 0) {
      (void)kernels::detail::softmax_row_load_max(z, d, part.real, 1.f);
      (void)kernels::detail::softmax_row_exp_sum(z, part.real, m[r]);
    }
    index_t const t = targets.data()[r] - part.first;
    float const inv = 1.f / s[r];
    for (index_t j = 0; j < part.real; ++j) d[j] = from_float<T>(kernels::detail::classifier_dlogit(z[j], inv, j == t, dloss));
    for (index_t j = part.real; j < R; ++j) d[j] = from_float<T>(0.f);
  });
  tensor_view<T> const dlnf = detail::as_rows(h.dlnf);
  nn::detail::zero_fill(ex, dlnf);
  kernels::matmul_backward_input(ex, dlnf, tensor_view<T const>(dlogits), wte_part, h.ws);
  typename G::request sum{};
  if (sequence)
    sum = group.reduce_scatter_async(detail::cspan_of(dlnf), detail::span_of(h.dlnf_rows), comm::reduce_op::sum);
  else if (group.size() > 1)
    sum = group.all_reduce_async(detail::span_of(dlnf), comm::reduce_op::sum);
  tensor_view<T const> const inp = sequence ? tensor_view<T const>(h.whole) : tensor_view<T const>(h.lnf);
  kernels::matmul_backward_weight(ex, dwte_part, tensor_view<T>{}, tensor_view<T const>(dlogits), detail::as_rows(inp),
                                  h.ws);
  group.wait(sum);
  nn::detail::zero_fill(ex, dres);
  kernels::layernorm_backward(ex, dres, dlnf_w, dlnf_b, sequence ? tensor_view<T const>(h.dlnf_rows) : tensor_view<T const>(dlnf),
                              x, lnf_w, tensor_view<float const>(h.lnf_mean), tensor_view<float const>(h.lnf_rstd), h.ws);
}

}  // namespace tide::tp
