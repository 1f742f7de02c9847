#pragma once
// The host path of the classifier ops. fused_classifier does one row per thread step in three
// passes over a float scratch row (the softmax passes of softmax/host.hpp):
//   1. z = float(logits), and the row max;
//   2. z = exp(z - m) in place, and the row sum; loss = log s + m - x_t;
//   3. dlogits = T((z / s - [j == t]) * w), then 0 in the padded columns.
// The logits are read in full (pass 1) before dlogits is written (pass 3), so dlogits may be
// the logits' own memory. No (N, V) probability buffer exists; the scratch is one row of V floats
// per thread, the caller's (kernels/scratch.hpp).
// Rows are reduced in a fixed order: losses and dlogits are bit-identical for any thread count.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/classifier/check.hpp"
#include "tide/kernels/classifier/math.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/softmax/host.hpp"

namespace tide::kernels {

namespace detail {

// Pass 3 of one row: d[j] for every column of the padded row.
template <class T>
void classifier_row_store(T* __restrict d, float const* __restrict e, index_t vocab, index_t vp, std::int32_t target,
                          float inv_sum, float w) noexcept {
  for (index_t j = 0; j < vocab; ++j) d[j] = from_float<T>(classifier_dlogit(e[j], inv_sum, false, w));
  d[target] = from_float<T>(classifier_dlogit(e[target], inv_sum, true, w));
  for (index_t j = vocab; j < vp; ++j) d[j] = from_float<T>(0.f);
}

// One scratch row of `vocab` floats per slice of the rows (softmax_slices of them), at `scratch`.
template <class T, class Weight>
void classifier_rows(thread_pool& pool, T* dlogits, float* losses, T const* logits, std::int32_t const* targets,
                     index_t rows, index_t vocab, index_t vp, Weight weight, float* scratch) {
  if (rows == 0) return;
  int const slices = softmax_slices(pool, rows);
  parallel_for(pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    auto const slice = thread_pool::slice_at(static_cast<std::size_t>(rows), slices, begin);
    float* const z = scratch + static_cast<index_t>(slice) * vocab;
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r) {
      std::int32_t const t = targets[r];
      float const m = softmax_row_load_max(z, logits + r * vp, vocab, 1.f);
      float const xt = z[t];
      float const s = softmax_row_exp_sum(z, vocab, m);
      losses[r] = classifier_loss(m, s, xt);
      classifier_row_store(dlogits + r * vp, z, vocab, vp, t, 1.f / s, weight(r));
    }
  });
}

template <class T, class Weight>
void fused_classifier_host(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                           tensor_view<T const> logits, tensor_view<std::int32_t const> targets, index_t vocab,
                           Weight weight, scratch<host> const* given) {
  char const* what = "fused_classifier";
  classifier_check_logits(what, "dlogits", dlogits, logits, vocab);
  index_t const rows = softmax_rows_of(logits);
  classifier_check_rows(what, "losses", losses, rows, logits);
  classifier_check_rows(what, "losses", losses, rows, dlogits);
  classifier_check_rows(what, "targets", targets, rows, dlogits);
  classifier_check_targets(what, targets, vocab);
  std::size_t const need = sizeof(float) * static_cast<std::size_t>(softmax_slices(ex.pool, rows) * vocab);
  if (given != nullptr) check_scratch(what, "fused_classifier_scratch_bytes", *given, need);
  call_scratch const own(given != nullptr ? 0 : need);  // the overloads without scratch: for this call
  scratch<host> const ws = given != nullptr ? *given : own.get();
  classifier_rows(ex.pool, dlogits.data(), losses.data(), logits.data(), targets.data(), rows, vocab,
                  logits.extent(logits.rank() - 1), weight, scratch_part<float>(ws, 0));
}

}  // namespace detail

// The fused classifier (llm.c's fused_classifier): for every row of logits (N, Vp) with V = vocab
// real columns and Vp - V padding, and targets (N) in [0, V):
//   losses[r] = -log softmax(logits[r, :V])[targets[r]]
//   dlogits[r, j] = (softmax(logits[r, :V])_j - [j == targets[r]]) * dloss,  0 for j >= V.
// dlogits may be the logits' memory (in place). dloss is the weight of every row's loss (the
// default, 1 / N, makes losses average into the mean loss's gradient). A target outside [0, V)
// throws tide::error(usage) before anything is written.
//
// Scratch: fused_classifier_scratch_bytes(ex, rows, vocab), one row of V floats per thread; each
// form takes it last (the forms without allocate it for the call).
inline std::size_t fused_classifier_scratch_bytes(exec<host> const& ex, index_t rows, index_t vocab) noexcept {
  return sizeof(float) * static_cast<std::size_t>(detail::softmax_slices(ex.pool, rows) * vocab);
}

template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, float dloss, scratch<host> ws) {
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss}, &ws);
}
template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, float dloss) {
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss}, nullptr);
}

// dloss = 1 / N: the mean loss's gradient.
template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, scratch<host> ws) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  float const dloss = rows == 0 ? 0.f : 1.f / static_cast<float>(rows);
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss}, &ws);
}
template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  float const dloss = rows == 0 ? 0.f : 1.f / static_cast<float>(rows);
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss}, nullptr);
}

// A weight per row: dlosses (N), e.g. 0 for rows that must not train (padding) and 1 / (valid
// rows) for the others.
template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, tensor_view<float const> dlosses, scratch<host> ws) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  detail::classifier_check_rows("fused_classifier", "dlosses", dlosses, rows, dlogits);
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::row_weights{dlosses.data()}, &ws);
}
template <Element T>
void fused_classifier(exec<host> const& ex, tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, tensor_view<float const> dlosses) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  detail::classifier_check_rows("fused_classifier", "dlosses", dlosses, rows, dlogits);
  detail::fused_classifier_host(ex, dlogits, losses, logits, targets, vocab, detail::row_weights{dlosses.data()},
                                nullptr);
}

// The unfused path, and the anchor of the classifier benchmark: probabilities (N, Vp) from
// softmax_forward_masked (lengths = {V}) first, then these two.
// losses[r] = -log probs[r, targets[r]] (inf when that probability underflowed to 0).
template <class T>
  requires Element<std::remove_const_t<T>>
void crossentropy_forward(exec<host> const& ex, tensor_view<float> losses, tensor_view<T> probs,
                          tensor_view<std::int32_t const> targets, index_t vocab) {
  char const* what = "crossentropy_forward";
  detail::classifier_check_logits(what, "probs", probs, probs, vocab);
  index_t const rows = detail::softmax_rows_of(probs);
  index_t const vp = probs.extent(probs.rank() - 1);
  detail::classifier_check_rows(what, "losses", losses, rows, probs);
  detail::classifier_check_rows(what, "targets", targets, rows, probs);
  detail::classifier_check_targets(what, targets, vocab);
  float* l = losses.data();
  std::remove_const_t<T> const* p = probs.data();
  std::int32_t const* t = targets.data();
  parallel_for(ex.pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r)
      l[r] = -::logf(to_float(p[r * vp + t[r]]));
  });
}

// dlogits[r, j] = (probs[r, j] - [j == targets[r]]) * dloss for j < V, 0 for the padding.
// dlogits may be the probs' memory.
template <Element T>
void crossentropy_softmax_backward(exec<host> const& ex, tensor_view<T> dlogits,
                                   std::type_identity_t<tensor_view<T const>> probs,
                                   tensor_view<std::int32_t const> targets, index_t vocab, float dloss) {
  char const* what = "crossentropy_softmax_backward";
  detail::classifier_check_logits(what, "dlogits", dlogits, probs, vocab);
  index_t const rows = detail::softmax_rows_of(probs);
  index_t const vp = probs.extent(probs.rank() - 1);
  detail::classifier_check_rows(what, "targets", targets, rows, probs);
  detail::classifier_check_targets(what, targets, vocab);
  T* d = dlogits.data();
  T const* p = probs.data();
  std::int32_t const* t = targets.data();
  parallel_for(ex.pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r) {
      T* dr = d + r * vp;
      T const* pr = p + r * vp;
      float const pt = to_float(pr[t[r]]);
      TIDE_PRAGMA_IVDEP
      for (index_t j = 0; j < vocab; ++j)
        dr[j] = from_float<T>(detail::classifier_dlogit(to_float(pr[j]), 1.f, false, dloss));
      dr[t[r]] = from_float<T>(detail::classifier_dlogit(pt, 1.f, true, dloss));
      for (index_t j = vocab; j < vp; ++j) dr[j] = from_float<T>(0.f);
    }
  });
}

}  // namespace tide::kernels
