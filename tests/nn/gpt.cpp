#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <tide/kernels/adamw/adamw.hpp>
#include <tide/kernels/grad_norm/grad_norm.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/ops.hpp>
#include <tide/nn/gpt.hpp>

#include "nn/gpt_reference.hpp"

using namespace tide::literals;
using tide::index_t;
using tide::nn::gpt_config;
using vec = std::vector<double>;

namespace {

using host_gpt = tide::nn::gpt<tide::host>;

// The tiny config of the gradient checks: Vp > V so the padding is exercised.
constexpr gpt_config tiny{.layers = 2, .heads = 2, .channels = 8, .vocab = 16, .padded_vocab = 24, .max_seq = 8};
constexpr int tiny_B = 2, tiny_T = 5;

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& t : ids) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab));
  return ids;
}

tide::tensor_view<std::int32_t const> ids_view(std::vector<std::int32_t> const& v, index_t B, index_t T) {
  return {v.data(), {B, T}};
}

vec random_vec(std::size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(vec const& a, vec const& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of s(x) = <r, f(x)> over every element of every input, against the
// analytic gradients `grads` (of the same s). Returns max |fd - analytic| / (1 + |analytic|).
double fd_error(std::vector<vec*> const& inputs, std::vector<vec> const& grads, std::function<double()> const& s) {
  constexpr double h = 1e-5;
  double worst = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    vec& x = *inputs[k];
    for (std::size_t i = 0; i < x.size(); ++i) {
      double const keep = x[i];
      x[i] = keep + h;
      double const up = s();
      x[i] = keep - h;
      double const down = s();
      x[i] = keep;
      double const fd = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(fd - grads[k][i]) / (1.0 + std::abs(grads[k][i])));
    }
  }
  return worst;
}

// Central differences in double, h = 1e-5: truncation h^2 f'''/6 ~ 1e-11 and cancellation
// eps |s| / h ~ 1e-11 for these O(1) functions, so 1e-8 leaves a 1000x margin and still fails
// any real mistake in a backward (those are O(|gradient|)).
constexpr double fd_tolerance = 1e-8;

// Normwise relative error of a tensor: max |a - b| / max |b|.
double normwise(float const* a, double const* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den == 0 ? num : num / den;
}

// The model's parameters as doubles, in the reference's flat layout (the same offsets).
vec params_of(host_gpt const& m) {
  auto const flat = m.flat_params();
  return vec(flat.data(), flat.data() + flat.size());
}

}  // namespace

// ---- every layer's backward, in double, against finite differences ---------------------------

TEST_CASE("reference layers: backward matches central finite differences (double)") {
  std::mt19937 rng(7);
  int const B = 2, T = 5, C = 8, NH = 2, N = B * T, OC = 12, V = 10, Vp = 13;
  auto sz = [](int n) { return static_cast<std::size_t>(n); };

  SUBCASE("layernorm") {
    vec x = random_vec(sz(N * C), rng), w = random_vec(sz(C), rng), b = random_vec(sz(C), rng);
    vec const r = random_vec(sz(N * C), rng);
    vec out(sz(N * C)), mean(sz(N)), rstd(sz(N));
    auto s = [&] {
      gpt_ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      return dot(r, out);
    };
    s();
    std::vector<vec> g = {vec(x.size()), vec(w.size()), vec(b.size())};
    gpt_ref::layernorm_backward(g[0].data(), g[1].data(), g[2].data(), r.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C);
    CHECK(fd_error({&x, &w, &b}, g, s) < fd_tolerance);
  }
  SUBCASE("matmul") {
    vec x = random_vec(sz(N * C), rng), w = random_vec(sz(OC * C), rng), b = random_vec(sz(OC), rng);
    vec const r = random_vec(sz(N * OC), rng);
    vec out(sz(N * OC));
    auto s = [&] {
      gpt_ref::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
      return dot(r, out);
    };
    std::vector<vec> g = {vec(x.size()), vec(w.size()), vec(b.size())};
    gpt_ref::matmul_backward(g[0].data(), g[1].data(), g[2].data(), r.data(), x.data(), w.data(), N, C, OC);
    CHECK(fd_error({&x, &w, &b}, g, s) < fd_tolerance);
  }
  SUBCASE("causal self-attention") {
    vec qkv = random_vec(sz(N * 3 * C), rng);
    vec const r = random_vec(sz(N * C), rng);
    vec out(sz(N * C)), pre(sz(B * NH * T * T)), att(sz(B * NH * T * T));
    auto s = [&] {
      gpt_ref::attention_forward(out.data(), pre.data(), att.data(), qkv.data(), B, T, C, NH);
      return dot(r, out);
    };
    s();
    std::vector<vec> g = {vec(qkv.size())};
    gpt_ref::attention_backward(g[0].data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
    CHECK(fd_error({&qkv}, g, s) < fd_tolerance);
  }
  SUBCASE("gelu (tanh)") {
    vec x = random_vec(sz(N * 4), rng, 2.0);
    vec const r = random_vec(x.size(), rng);
    vec out(x.size());
    auto s = [&] {
      gpt_ref::gelu_forward(out.data(), x.data(), static_cast<int>(x.size()));
      return dot(r, out);
    };
    std::vector<vec> g = {vec(x.size())};
    gpt_ref::gelu_backward(g[0].data(), x.data(), r.data(), static_cast<int>(x.size()));
    CHECK(fd_error({&x}, g, s) < fd_tolerance);
  }
  SUBCASE("token + position embedding") {
    auto const tok = random_ids(sz(N), V, 3);
    vec wte = random_vec(sz(V * C), rng), wpe = random_vec(sz(T * C), rng);
    vec const r = random_vec(sz(N * C), rng);
    vec out(sz(N * C));
    auto s = [&] {
      gpt_ref::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
      return dot(r, out);
    };
    std::vector<vec> g = {vec(wte.size()), vec(wpe.size())};
    gpt_ref::encoder_backward(g[0].data(), g[1].data(), r.data(), tok.data(), B, T, C);
    CHECK(fd_error({&wte, &wpe}, g, s) < fd_tolerance);
  }
  SUBCASE("softmax + cross-entropy over the real columns") {
    auto const tgt = random_ids(sz(N), V, 4);
    vec logits = random_vec(sz(N * Vp), rng, 2.0);
    vec probs(logits.size()), losses(sz(N));
    auto s = [&] { return gpt_ref::crossentropy_forward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V, Vp); };
    s();
    std::vector<vec> g = {vec(logits.size())};
    gpt_ref::crossentropy_backward(g[0].data(), probs.data(), tgt.data(), N, V, Vp);
    CHECK(fd_error({&logits}, g, s) < fd_tolerance);
    for (int n = 0; n < N; ++n)
      for (int j = V; j < Vp; ++j) CHECK(g[0][sz(n * Vp + j)] == 0.0);  // padding takes no gradient
  }
}

TEST_CASE("reference model: whole-model backward matches central finite differences (double)") {
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt const m(tiny, arena, {.seed = 11});
  gpt_ref::model ref(tiny);
  vec p = params_of(m);
  // Spread LayerNorm weights and biases away from 1 and 0, so their gradients are not special.
  std::mt19937 rng(5);
  for (auto const& prm : ref.list)
    if (prm.name().find("ln") != std::string_view::npos)
      for (index_t i = 0; i < prm.numel(); ++i) p[prm.offset / 4 + static_cast<std::size_t>(i)] += 0.3 * random_vec(1, rng)[0];
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 1), tgt = random_ids(tiny_B * tiny_T, tiny.vocab, 2);
  auto s = [&] { return ref.forward(p, tok, tgt, tiny_B, tiny_T); };
  double const loss = s();
  CHECK(std::isfinite(loss));
  std::vector<vec> g = {vec(p.size(), 0.0)};
  ref.backward(p, g[0]);
  // All ~2000 parameters, padding included (its gradient is 0 both ways).
  CHECK(fd_error({&p}, g, s) < fd_tolerance);
}

// ---- the model (float kernels) against the double reference ---------------------------------

// Tolerances, normwise per tensor (max |x - ref| / max |ref|), for the float model against the
// double reference on the tiny config. Each kernel is within a few (K + 2) u of its own double
// sum (u = 2^-24, K <= 4C = 32 terms; docs/kernels/*), and the errors of ~20 chained ops add:
// about 20 * 34 u ~ 4e-5 in the worst case; measured 2e-7 (logits, loss) and 1e-6 (gradients).
// 1e-5 and 5e-5 leave 10-50x over the measured values and stay far below the O(1) error of a
// wrong formula.
constexpr double forward_tolerance = 1e-5;
constexpr double gradient_tolerance = 5e-5;

TEST_CASE("gpt<host, float>: logits, loss and every gradient match the double reference") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m(tiny, arena, {.seed = 3, .keep_logits = true});
  gpt_ref::model ref(tiny);
  // LayerNorm weights and biases away from 1 and 0 (as above), in both models.
  std::mt19937 rng(9);
  for (auto const& prm : m.parameters())
    if (prm.name().find("ln") != std::string_view::npos)
      for (auto& x : std::span(m.param(prm).data(), static_cast<std::size_t>(prm.numel())))
        x += static_cast<float>(0.3 * random_vec(1, rng)[0]);
  vec const p = params_of(m);
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 21), tgt = random_ids(tiny_B * tiny_T, tiny.vocab, 22);

  double const ref_loss = ref.forward(p, tok, tgt, tiny_B, tiny_T);
  m.zero_grad(ex);
  float const loss = m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T));
  CHECK(std::abs(loss - ref_loss) <= forward_tolerance * std::abs(ref_loss));
  auto const logits = m.logits();
  REQUIRE(logits.size() == static_cast<index_t>(ref.logits.size()));
  double const logits_err = normwise(logits.data(), ref.logits.data(), ref.logits.size());
  MESSAGE("float model vs double reference: loss error ", std::abs(loss - ref_loss) / ref_loss, ", logits ", logits_err);
  CHECK(logits_err <= forward_tolerance);
  for (int i = 0; i < tiny_B * tiny_T; ++i)
    CHECK(std::abs(m.losses().data()[i] - ref.losses[static_cast<std::size_t>(i)]) <= forward_tolerance * 4);

  m.backward(ex);
  vec g(p.size(), 0.0);
  ref.backward(p, g);
  double worst = 0;
  for (auto const& prm : m.parameters()) {
    auto const n = static_cast<std::size_t>(prm.numel());
    double const err = normwise(m.grad(prm).data(), g.data() + prm.offset / 4, n);
    worst = std::max(worst, err);
    INFO(prm.name(), " normwise error ", err);
    CHECK(err <= gradient_tolerance);
  }
  MESSAGE("float model vs double reference: worst normwise gradient error ", worst);

  // Gradients accumulate: a second forward + backward doubles them, up to the roundings of
  // adding into the old value (sgemm folds it into its k-sum: a few u of the largest value).
  // backward needs its own forward: it reuses the memory of activations it is done with.
  std::vector<float> once(m.flat_grads().data(), m.flat_grads().data() + m.flat_grads().size());
  CHECK_THROWS_AS(m.backward(ex), tide::error);
  m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T));
  m.backward(ex);
  double off = 0, top = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    off = std::max(off, std::abs(static_cast<double>(m.flat_grads().data()[i]) - 2.0 * once[i]));
    top = std::max(top, 2.0 * std::abs(once[i]));
  }
  CHECK(off <= 1e-6 * top);
  m.zero_grad(ex);
  CHECK(tide::kernels::global_grad_norm(ex, m.flat_grads()) == 0.0);
}

TEST_CASE("gpt<host, bf16>: the same model in bf16 runs and stays near float") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m32(tiny, arena, {.seed = 3});
  tide::nn::gpt<tide::host, tide::bf16> m16(tiny, arena, {.seed = 3});
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 31), tgt = random_ids(tiny_B * tiny_T, tiny.vocab, 32);
  float const l32 = m32.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T));
  float const l16 = m16.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T));
  // bf16 keeps 8 bits: every activation is rounded to 2^-8 relative; over ~20 ops of a loss near
  // log(16) ~ 2.8 that is ~20 * 2^-9 * 2.8 ~ 0.1 in the worst case; measured ~1e-3.
  CHECK(std::abs(l16 - l32) < 0.05);
  m16.backward(ex);
  m32.backward(ex);
  // Gradients, normwise: each of the ~20 ops on a gradient's path rounds its output to bf16
  // (2^-8 relative), so 20 * 2^-8 ~ 0.08 in the worst case; measured up to 1.5e-2.
  for (auto const& prm : m32.parameters()) {
    auto const n = static_cast<std::size_t>(prm.numel());
    auto const p16 = m16.parameters().find(prm.name());  // bf16 offsets differ from float's
    CHECK(p16.type == tide::dtype::bf16);
    vec g32(m32.grad(prm).data(), m32.grad(prm).data() + n), g16(n);
    for (std::size_t i = 0; i < n; ++i) g16[i] = static_cast<double>(static_cast<float>(m16.grad(p16).data()[i]));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < n; ++i) num = std::max(num, std::abs(g16[i] - g32[i])), den = std::max(den, std::abs(g32[i]));
    INFO(prm.name());
    CHECK(num <= 0.08 * den);
  }
  // A float model's parameter record does not index the bf16 model.
  CHECK_THROWS_AS((void)m16.param(m32.parameters()[3]), tide::error);
}

// ---- training, determinism ------------------------------------------------------------------

namespace {

// `steps` AdamW steps on one fixed batch; returns the losses.
std::vector<float> train(tide::exec<tide::host> const& ex, gpt_config const& c, int B, int T, int steps,
                         std::vector<float>* final_params = nullptr, tide::nn::gpt_options options = {.seed = 42}) {
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  host_gpt m(c, arena, options);
  auto const tok = random_ids(static_cast<std::size_t>(B * T), c.vocab, 77);
  auto const tgt = random_ids(static_cast<std::size_t>(B * T), c.vocab, 78);
  auto const n = static_cast<std::size_t>(m.flat_params().size());
  std::vector<float> mom(n, 0.f), var(n, 0.f);
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    m.zero_grad(ex);
    losses.push_back(m.forward(ex, ids_view(tok, B, T), ids_view(tgt, B, T)));
    m.backward(ex);
    double const norm = tide::kernels::global_grad_norm(ex, m.flat_grads());
    tide::kernels::adamw(ex, {.lr = 1e-2f, .weight_decay = 0.0f}, step, m.flat_params(), m.flat_grads(),
                         tide::tensor_view<float>(mom.data(), {static_cast<index_t>(n)}),
                         tide::tensor_view<float>(var.data(), {static_cast<index_t>(n)}),
                         tide::kernels::clip_scale(norm, 1.0f));
  }
  if (final_params) final_params->assign(m.flat_params().data(), m.flat_params().data() + n);
  return losses;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// train() on tide::sealed: the model, its tokens and Adam's state in memory the host cannot read,
// every kernel enqueued on the compute stream; the losses come back through the loss's read.
std::vector<float> train_sealed(gpt_config const& c, int B, int T, int steps, std::vector<float>* final_params,
                                tide::nn::gpt_options options = {.seed = 42}) {
  namespace mem = tide::memory;
  using tide::sealed;
  mem::device_arena<sealed> arena{{.budget = 64_MiB}};
  mem::stream<sealed> compute;
  tide::thread_pool pool{2};
  tide::exec<sealed> const ex{pool, compute};
  std::vector<float> losses;
  {
    tide::nn::gpt<sealed> m(c, arena, options);
    auto const n = static_cast<std::size_t>(m.flat_params().size());
    auto ids = random_ids(static_cast<std::size_t>(B * T), c.vocab, 77);
    auto const tgt = random_ids(static_cast<std::size_t>(B * T), c.vocab, 78);
    ids.insert(ids.end(), tgt.begin(), tgt.end());  // tokens (B, T), then targets (B, T)
    auto* dev_ids = static_cast<std::int32_t*>(arena.allocate(ids.size() * sizeof(std::int32_t)));
    mem::copy_to_device(sealed{}, dev_ids, ids.data(), ids.size() * sizeof(std::int32_t));
    auto* state = static_cast<float*>(arena.allocate(2 * n * sizeof(float)));  // Adam's m, then v
    mem::fill_zeros(ex, state, 2 * n * sizeof(float));
    tide::tensor_view<std::int32_t const, sealed> const tokens{dev_ids, {B, T}}, targets{dev_ids + B * T, {B, T}};
    tide::tensor_view<float, sealed> const mom{state, {static_cast<index_t>(n)}}, var{state + n, {static_cast<index_t>(n)}};
    // The norm's scratch: device memory, as every kernel's on a device.
    std::size_t const norm_bytes =
        tide::kernels::global_grad_norm_scratch_bytes(ex, tide::tensor_view<float const, sealed>(m.flat_params()));
    tide::kernels::scratch<sealed> const norm_ws{static_cast<std::byte*>(arena.allocate(norm_bytes)), norm_bytes};
    for (int step = 1; step <= steps; ++step) {
      m.zero_grad(ex);
      losses.push_back(m.forward(ex, tokens, targets));
      m.backward(ex);
      double const norm = tide::kernels::global_grad_norm(ex, m.flat_grads(), norm_ws);
      tide::kernels::adamw(ex, tide::kernels::adamw_hparams{.lr = 1e-2f, .weight_decay = 0.0f}, step, m.flat_params(),
                           m.flat_grads(), mom, var, tide::kernels::clip_scale(norm, 1.0f));
    }
    if (final_params) {
      final_params->resize(n);
      mem::read_to_host(ex, final_params->data(), m.flat_params().data(), n * sizeof(float));
    }
    compute.synchronize();  // nothing queued may outlive the memory it reads
    arena.deallocate(norm_ws.data, norm_bytes);
    arena.deallocate(state, 2 * n * sizeof(float));
    arena.deallocate(dev_ids, ids.size() * sizeof(std::int32_t));
  }
  return losses;
}

}  // namespace

TEST_CASE("gpt: 10 AdamW steps on a fixed batch lower the loss") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  auto const losses = train(ex, tiny, tiny_B, tiny_T, 10);
  REQUIRE(losses.size() == 10);
  // Initial loss near log(V) = 2.77 (logits ~ 0 at init); memorising one batch drives it down.
  CHECK(losses.front() == doctest::Approx(std::log(16.0)).epsilon(0.05));
  CHECK(losses.back() < 0.8f * losses.front());
  int rises = 0;
  for (std::size_t i = 1; i < losses.size(); ++i) rises += losses[i] > losses[i - 1];
  CHECK(rises == 0);
}

TEST_CASE("gpt: training is bit-identical across runs and across 1 and 2 threads") {
  // Big enough that the row kernels split into several tasks (rows of 4C = 512 floats, tasks of
  // 64 rows; N = B T = 128 rows) and attention spreads its B NH = 16 pairs over both threads.
  gpt_config const c{.layers = 2, .heads = 4, .channels = 128, .vocab = 64, .max_seq = 32};
  int const B = 4, T = 32;
  tide::thread_pool one{1}, two{2};
  std::vector<float> p1, p2, p3;
  auto const l1 = train(tide::exec<tide::host>{two}, c, B, T, 2, &p1);
  auto const l2 = train(tide::exec<tide::host>{two}, c, B, T, 2, &p2);
  CHECK(same_bits(l1, l2));
  CHECK(same_bits(p1, p2));
  // Every kernel the model calls documents results independent of the thread count (matmul by
  // cutting products into shape-determined blocks of single-threaded sgemm): the whole step.
  auto const l3 = train(tide::exec<tide::host>{one}, c, B, T, 2, &p3);
  CHECK(same_bits(l1, l3));
  CHECK(same_bits(p1, p3));
}

// ---- recompute and activation offload ---------------------------------------------------------

TEST_CASE("gpt: recompute, activation offload and a split backward train bit-identically to keeping every activation, on host and sealed") {
  // Rows split over both threads, as in the test above; 3 blocks so sets can leave some out.
  gpt_config const c{.layers = 3, .heads = 4, .channels = 128, .vocab = 64, .max_seq = 32};
  int const B = 4, T = 32;
  tide::thread_pool two{2};
  tide::exec<tide::host> const ex{two};
  using tide::nn::block_set;
  std::vector<float> kept;
  auto const base = train(ex, c, B, T, 3, &kept);
  struct variant {
    char const* name;
    block_set recompute, offload;
    bool split = false;  // the backward in two passes, B then W per block
  };
  variant const variants[] = {
      {"split backward", {}, {}, true},
      {"split backward, recompute block 1", block_set({1}), {}, true},
      {"recompute every block", block_set::all(3), {}},
      {"recompute block 1", block_set({1}), {}},
      {"offload every block and the embeddings", {}, block_set::range(-1, 2)},
      {"offload block 0", {}, block_set({0})},
      {"offload the last block", {}, block_set({2})},
      {"recompute and offload every block", block_set::all(3), block_set::range(-1, 2)},
      {"recompute 0 and 2, offload -1 and 1", block_set({0, 2}), block_set({-1, 1})},
  };
  for (variant const& v : variants) {
    INFO(std::string(v.name));
    std::vector<float> params;
    auto const losses = train(ex, c, B, T, 3, &params, {.seed = 42, .recompute = v.recompute,
                                                        .offload_activations = v.offload, .split_backward = v.split});
    CHECK(same_bits(losses, base));
    CHECK(same_bits(params, kept));
  }
  // The same on tide::sealed, memory the host cannot read: initialised on the host from the same
  // streams and copied, every kernel queued on the compute stream, offloaded activations on the
  // model's own copy stream, ordered against the kernels by events only.
  for (variant const& v : {variant{"sealed, every activation kept", {}, {}}, variants[1], variants[2], variants[4],
                           variants[8]}) {
    INFO("sealed: " << std::string(v.name));
    std::vector<float> params;
    auto const losses = train_sealed(c, B, T, 3, &params, {.seed = 42, .recompute = v.recompute,
                                                           .offload_activations = v.offload, .split_backward = v.split});
    CHECK(same_bits(losses, base));
    CHECK(same_bits(params, kept));
  }
}

TEST_CASE("gpt<sealed>: init() on the device re-initialises to the host's bits") {
  gpt_config const c{.layers = 3, .heads = 4, .channels = 128, .vocab = 64, .max_seq = 32};
  tide::memory::device_arena<tide::sealed> arena{{.budget = 16_MiB}};
  tide::memory::stream<tide::sealed> compute;
  tide::thread_pool pool{1};
  tide::exec<tide::sealed> const sx{pool, compute};
  tide::nn::gpt<tide::sealed> m(c, arena, {.seed = 42});
  tide::memory::device_arena<tide::host> host_arena{{.budget = 16_MiB}};
  host_gpt h(c, host_arena, {.seed = 7});
  auto const n = static_cast<std::size_t>(m.flat_params().size());
  std::vector<float> got(n);
  m.init(sx, 7);
  tide::memory::read_to_host(sx, got.data(), m.flat_params().data(), n * sizeof(float));
  CHECK(std::memcmp(got.data(), h.flat_params().data(), n * sizeof(float)) == 0);
}

TEST_CASE("gpt: recompute and offload shrink the plan; offload keeps its activations on the host") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  gpt_config const c{.layers = 4, .heads = 2, .channels = 32, .vocab = 32, .max_seq = 16};
  int const B = 2, T = 16;
  auto const tok = random_ids(B * T, c.vocab, 5);
  using tide::nn::block_set;
  auto const plan = [&](tide::nn::gpt_options const& o) {
    tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
    host_gpt m(c, arena, o);
    m.forward(ex, ids_view(tok, B, T), ids_view(tok, B, T));
    CHECK_FALSE(tide::memory::find_conflict(m.activation_planner(), m.activation_offsets()).has_value());
    m.backward(ex);
    return m.activations();
  };
  auto const none = plan({});
  auto const rec = plan({.recompute = block_set::all(4)});
  auto const off = plan({.offload_activations = block_set::range(-1, 3)});
  auto const both = plan({.recompute = block_set::all(4), .offload_activations = block_set::range(-1, 3)});
  CHECK(none.host_bytes == 0);
  CHECK(rec.host_bytes == 0);
  CHECK(rec.footprint < none.footprint);
  CHECK(off.footprint < none.footprint);
  CHECK(both.footprint < rec.footprint);
  // Offloaded: every saved activation of 5 blocks (13 per block, x_0 for the embeddings);
  // with recompute only the 5 block outputs (B, T, C), each rounded to the alignment.
  std::size_t const btc = tide::round_up(std::size_t{B * T * 32} * sizeof(float), 256);
  CHECK(both.host_bytes == 5 * btc);
  CHECK(off.host_bytes > both.host_bytes);
  // Recomputing a block costs one more forward of it and keeps only its output: less than the
  // block's activations remain, so the plan falls by at least one block's worth per 2 blocks.
  CHECK(rec.footprint + 4 * btc < none.footprint);
}

TEST_CASE("gpt: recompute_within picks the cheapest blocks that fit, and says when none do") {
  gpt_config const c{.layers = 6, .heads = 2, .channels = 32, .vocab = 32, .max_seq = 16};
  using tide::nn::block_set;
  using tide::nn::recompute_within;
  tide::nn::gpt_options const none{};
  // The kernels' scratch the model plans with its activations (the host kernels' on 2 threads).
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  tide::nn::gpt_scratch const sc = tide::nn::gpt_scratch_of<float>(ex, c, 2, 16);
  CHECK(sc.block_backward > 0);  // attention's backward and the layernorms' partials, at least
  std::size_t const all = tide::nn::activation_bytes(c, none, 2, 16, 4, sc);
  std::size_t const least = tide::nn::activation_bytes(c, {.recompute = block_set::all(6)}, 2, 16, 4, sc);
  CHECK(recompute_within(c, none, 2, 16, all, {}, 4, sc).empty());  // fits as it is
  // At the footprint of every block recomputed: the fewest blocks (earliest first) that reach it.
  // Here that is 5: the backward's kernel scratch (attention's), live in every backward, is the
  // floor once five blocks recompute, so the sixth saves nothing.
  block_set const most = recompute_within(c, none, 2, 16, least, {}, 4, sc);
  REQUIRE(most.size() > 0);
  CHECK(tide::nn::activation_bytes(c, {.recompute = most}, 2, 16, 4, sc) <= least);
  std::vector<int> fewer;
  for (int l = 0; l + 1 < static_cast<int>(most.size()); ++l) fewer.push_back(l);
  CHECK(tide::nn::activation_bytes(c, {.recompute = block_set(fewer)}, 2, 16, 4, sc) > least);
  // A budget between: fewer blocks than all, and the plan with them fits it, the one with a
  // block fewer does not (the fewest blocks of that order).
  std::size_t const mid = (all + least) / 2;
  double const costs[6] = {5, 1, 4, 2, 6, 3};  // cheapest first: 1, 3, 5, 2, 0, 4
  block_set const chosen = recompute_within(c, none, 2, 16, mid, costs, 4, sc);
  REQUIRE(chosen.size() > 0);
  REQUIRE(chosen.size() < 6);
  int const order[6] = {1, 3, 5, 2, 0, 4};
  CHECK(chosen == block_set(std::vector<int>(order, order + chosen.size())));
  CHECK(tide::nn::activation_bytes(c, {.recompute = chosen}, 2, 16, 4, sc) <= mid);
  CHECK(tide::nn::activation_bytes(c, {.recompute = block_set(std::vector<int>(order, order + chosen.size() - 1))}, 2,
                            16, 4, sc) > mid);
  // The model built with it plans exactly that.
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  host_gpt m(c, arena, {.recompute = chosen});
  m.plan_activations(ex, 2, 16);
  CHECK(m.activations().footprint == tide::nn::activation_bytes(c, {.recompute = chosen}, 2, 16, 4, sc));
  try {
    (void)recompute_within(c, none, 2, 16, least - 1, {}, 4, sc);
    FAIL("expected a budget error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(std::string(e.what()).find(std::to_string(least)) != std::string::npos);
  }
  double const too_few[2] = {1, 2};
  CHECK_THROWS_AS((void)recompute_within(c, none, 2, 16, mid, too_few), tide::error);
}

TEST_CASE("gpt: recompute and offload options are checked") {
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  using tide::nn::block_set;
  CHECK_THROWS_AS(host_gpt(tiny, arena, {.recompute = block_set({-1})}), tide::error);
  CHECK_THROWS_AS(host_gpt(tiny, arena, {.recompute = block_set({2})}), tide::error);  // the head
  CHECK_THROWS_AS(host_gpt(tiny, arena, {.offload_activations = block_set({2})}), tide::error);
  CHECK_THROWS_AS(host_gpt(tiny, arena, {.in_flight = 2, .offload_activations = block_set({0})}), tide::error);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  host_gpt m(tiny, arena, {.offload_activations = block_set({0})});
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 1);
  host_gpt::batch_type const batch{ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T)};
  try {
    m.forward_blocks(ex, -1, 2, 0, batch);
    FAIL("expected a usage error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(std::string(e.what()).find("recompute") != std::string::npos);
  }
  // Pipelines recompute: stages run their blocks' forward and backward as one model does.
  host_gpt r(tiny, arena, {.recompute = block_set::all(2)});
  host_gpt k(tiny, arena, {});
  for (host_gpt* x : {&r, &k}) {
    x->zero_grad(ex);
    x->forward_blocks(ex, -1, 0, 0, batch);
    x->forward_blocks(ex, 1, 2, 0, batch);
    x->backward_blocks(ex, 1, 2, 0);
    x->backward_blocks(ex, -1, 0, 0);
  }
  std::vector<float> const gr(r.flat_grads().data(), r.flat_grads().data() + r.flat_grads().size());
  std::vector<float> const gk(k.flat_grads().data(), k.flat_grads().data() + k.flat_grads().size());
  CHECK(same_bits(gr, gk));
}

TEST_CASE("gpt: a backward that throws with offloaded activations leaves the model ready for the next step") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  struct failing_hooks {
    int* fail_at;
    void pre_forward(int) const {}
    void post_forward(int) const {}
    void pre_backward(int b) const {
      if (b == *fail_at) throw std::runtime_error("injected");
    }
    void post_backward(int) const {}
  };
  int fail_at = 0;
  using tide::nn::block_set;
  tide::nn::gpt<tide::host, float, failing_hooks> m(tiny, arena, {.offload_activations = block_set::range(-1, 1)},
                                                    failing_hooks{&fail_at});
  host_gpt ref(tiny, arena, {});
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 9);
  m.zero_grad(ex);
  m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T));
  CHECK_THROWS_AS(m.backward(ex), std::runtime_error);
  fail_at = 99;
  m.zero_grad(ex);
  float const loss = m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T));
  m.backward(ex);
  ref.zero_grad(ex);
  CHECK(ref.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T)) == loss);
  ref.backward(ex);
  std::vector<float> const g(m.flat_grads().data(), m.flat_grads().data() + m.flat_grads().size());
  std::vector<float> const gr(ref.flat_grads().data(), ref.flat_grads().data() + ref.flat_grads().size());
  CHECK(same_bits(g, gr));
}

// ---- hooks ----------------------------------------------------------------------------------

namespace {
struct recording_hooks {
  std::vector<std::string>* log;
  void pre_forward(int b) { log->push_back("F<" + std::to_string(b)); }
  void post_forward(int b) { log->push_back("F>" + std::to_string(b)); }
  void pre_backward(int b) { log->push_back("B<" + std::to_string(b)); }
  void post_backward(int b) { log->push_back("B>" + std::to_string(b)); }
};
static_assert(tide::nn::GptHooks<recording_hooks>);
static_assert(tide::nn::GptHooks<tide::nn::no_hooks>);
static_assert(!tide::nn::GptHooks<int>);
}  // namespace

TEST_CASE("gpt: hooks run around every block, forward then backward in reverse") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  std::vector<std::string> log;
  tide::nn::gpt<tide::host, float, recording_hooks> m(tiny, arena, {}, recording_hooks{&log});
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 1);
  m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T));
  m.backward(ex);
  std::vector<std::string> const expect = {"F<-1", "F>-1", "F<0", "F>0", "F<1", "F>1", "F<2", "F>2",
                                           "B<2",  "B>2",  "B<1", "B>1", "B<0", "B>0", "B<-1", "B>-1"};
  CHECK(log == expect);

  // A hook that throws stops the pass; the model then needs a new forward before backward.
  struct throwing_hooks {
    int at;
    void pre_forward(int b) const {
      if (b == at) throw std::runtime_error("hook");
    }
    void post_forward(int) const {}
    void pre_backward(int) const {}
    void post_backward(int) const {}
  };
  tide::nn::gpt<tide::host, float, throwing_hooks> t(tiny, arena, {}, throwing_hooks{1});
  CHECK_THROWS_AS(t.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T)), std::runtime_error);
  CHECK_THROWS_AS(t.backward(ex), tide::error);
}

// Which block reads which parameters, as a scheduler sees it: every parameter a block's kernels
// touch has layer_of == the block, except the head's tied wte (block -1's).
TEST_CASE("gpt: hooks bracket exactly the parameter reads of their block") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  // The hooks poison every parameter outside the current block with NaN and restore it after:
  // if a block read another block's parameter, the loss or a gradient would be NaN. In backward
  // they also check that only the block's own gradients changed.
  struct fencing_hooks {
    tide::nn::gpt<tide::host, float, fencing_hooks>* model = nullptr;
    std::vector<float> saved, grads;
    int foreign_writes = 0;
    [[nodiscard]] bool uses(int block, tide::parameter const& p) const {
      return tide::layer_of(p) == block || (block == tide::nn::head_block(model->config()) && p.name() == "wte");
    }
    void fence(int block) {
      auto const flat = model->flat_params();
      saved.assign(flat.data(), flat.data() + flat.size());
      for (auto const& p : model->parameters())
        if (!uses(block, p)) std::fill_n(model->param(p).data(), p.numel(), std::nanf(""));
    }
    void restore() { std::copy(saved.begin(), saved.end(), model->flat_params().data()); }
    void pre_forward(int b) { fence(b); }
    void post_forward(int) { restore(); }
    void pre_backward(int b) {
      fence(b);
      grads.assign(model->flat_grads().data(), model->flat_grads().data() + model->flat_grads().size());
    }
    void post_backward(int b) {
      restore();
      for (auto const& p : model->parameters())
        if (!uses(b, p))
          foreign_writes += !std::equal(grads.begin() + static_cast<std::ptrdiff_t>(p.offset / 4),
                                        grads.begin() + static_cast<std::ptrdiff_t>(p.end() / 4), model->grad(p).data());
    }
  };
  tide::nn::gpt<tide::host, float, fencing_hooks> m(tiny, arena, {.seed = 5});
  m.hooks().model = &m;
  auto const tok = random_ids(tiny_B * tiny_T, tiny.vocab, 1), tgt = random_ids(tiny_B * tiny_T, tiny.vocab, 2);
  m.zero_grad(ex);
  float const loss = m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T));
  m.backward(ex);
  CHECK(std::isfinite(loss));
  CHECK(std::isfinite(tide::kernels::global_grad_norm(ex, m.flat_grads())));
  CHECK(m.hooks().foreign_writes == 0);
  // The same model without fences gives the same loss.
  tide::memory::device_arena<tide::host> arena2{{.budget = 4_MiB}};
  host_gpt plain(tiny, arena2, {.seed = 5});
  CHECK(plain.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tgt, tiny_B, tiny_T)) == loss);
}

// ---- memory: the arena, the activation plan -------------------------------------------------

TEST_CASE("gpt: activations are planned in one arena buffer, replanned when (B, T) changes") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  host_gpt m(tiny, arena, {.seed = 1});
  std::size_t const param_bytes = m.parameters().bytes();
  CHECK(arena.stats().in_use == param_bytes);
  CHECK(m.activations().footprint == 0);

  auto const tok = random_ids(4 * 8, tiny.vocab, 1);
  m.forward(ex, ids_view(tok, tiny_B, tiny_T), ids_view(tok, tiny_B, tiny_T));
  auto const r1 = m.activations();
  CHECK(r1.batch == tiny_B);
  CHECK(r1.seq == tiny_T);
  CHECK(r1.tensors == m.activation_planner().size());
  // 20 per block and 2 of kernel scratch (forward, backward), 8 around them and 2 of scratch
  // (the head's, the embedding backward's) (+1 with keep_logits, +1 with a tied buffer; more
  // with recompute and offload)
  CHECK(r1.tensors == 22 * 2 + 10);
  CHECK(r1.footprint >= r1.peak_live);
  CHECK(r1.footprint < r1.unplanned);  // tensors share memory
  CHECK_FALSE(tide::memory::find_conflict(m.activation_planner(), m.activation_offsets()).has_value());
  auto const block = [](std::size_t n) { return tide::round_up(n, 256); };  // the arena's granule
  CHECK(arena.stats().in_use == param_bytes + block(r1.footprint));
  m.backward(ex);  // allocates the gradients
  CHECK(arena.stats().in_use == 2 * param_bytes + block(r1.footprint));

  // A longer sequence: a new plan, a bigger buffer, the old one returned.
  m.forward(ex, ids_view(tok, 4, 8), ids_view(tok, 4, 8));
  auto const r2 = m.activations();
  CHECK(r2.batch == 4);
  CHECK(r2.seq == 8);
  CHECK(r2.footprint > r1.footprint);
  CHECK_FALSE(tide::memory::find_conflict(m.activation_planner(), m.activation_offsets()).has_value());
  CHECK(arena.stats().in_use == 2 * param_bytes + block(r2.footprint));

  // The same (B, T) again keeps the plan and the buffer.
  auto const* before = m.losses().data();
  m.forward(ex, ids_view(tok, 4, 8), ids_view(tok, 4, 8));
  CHECK(m.losses().data() == before);
}

TEST_CASE("gpt: a batch that does not fit the arena throws budget and keeps the parameters") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  gpt_config const c{.layers = 2, .heads = 2, .channels = 16, .vocab = 32, .max_seq = 64};
  std::size_t const param_bytes = tide::nn::gpt_parameters(c, tide::dtype::f32).bytes();
  // Room for the parameters, the gradients and a small batch's activations only.
  tide::memory::device_arena<tide::host> arena{{.budget = 2 * param_bytes + 256_KiB}};
  host_gpt m(c, arena, {.seed = 2});
  auto const tok = random_ids(8 * 64, c.vocab, 3);
  m.zero_grad(ex);
  float const small = m.forward(ex, ids_view(tok, 1, 8), ids_view(tok, 1, 8));
  std::vector<float> const params(m.flat_params().data(), m.flat_params().data() + m.flat_params().size());
  try {
    m.forward(ex, ids_view(tok, 8, 64), ids_view(tok, 8, 64));
    FAIL("expected a budget error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
  }
  CHECK(same_bits(params, std::vector<float>(m.flat_params().data(), m.flat_params().data() + params.size())));
  CHECK_THROWS_AS(m.backward(ex), tide::error);  // no forward to go back through
  CHECK(m.forward(ex, ids_view(tok, 1, 8), ids_view(tok, 1, 8)) == small);
  // The parameters alone do not fit a smaller arena.
  tide::memory::device_arena<tide::host> tiny_arena{{.budget = param_bytes / 2}};
  CHECK_THROWS_AS(host_gpt(c, tiny_arena), tide::error);
  CHECK(tiny_arena.stats().in_use == 0);
}

// ---- inputs, errors -------------------------------------------------------------------------

TEST_CASE("gpt: bad inputs throw usage errors and change nothing") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m(tiny, arena, {.seed = 1});
  auto tok = random_ids(4 * 16, tiny.vocab, 1);
  auto expect_usage = [](auto&& f) {
    try {
      f();
      FAIL("expected a usage error");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
    }
  };
  expect_usage([&] { (void)m.grad("wte"); });  // no gradients yet
  expect_usage([&] { m.backward(ex); });        // no forward yet
  expect_usage([&] { (void)m.logits(); });
  expect_usage([&] { m.forward(ex, ids_view(tok, 1, 9)); });  // T > max_seq
  expect_usage([&] { m.forward(ex, ids_view(tok, 2, 5), ids_view(tok, 5, 2)); });  // targets' shape
  expect_usage([&] { (void)m.param("h7.ln1.w"); });
  auto bad = tok;
  bad[3] = tiny.vocab;  // in the padding: not a real token
  expect_usage([&] { m.forward(ex, ids_view(bad, 2, 5)); });
  expect_usage([&] { m.forward(ex, ids_view(tok, 2, 5), ids_view(bad, 2, 5)); });
  bad[3] = -1;
  expect_usage([&] { m.forward(ex, ids_view(bad, 2, 5)); });

  // Without targets the logits stay, backward is refused; with targets (keep_logits false) the
  // logits became dlogits and logits() says so.
  m.forward(ex, ids_view(tok, 2, 5));
  CHECK(m.logits().extents() == tide::shape(2, 5, 24));
  CHECK(std::isnan(m.loss()));
  expect_usage([&] { m.backward(ex); });
  m.forward(ex, ids_view(tok, 2, 5), ids_view(tok, 2, 5));
  expect_usage([&] { (void)m.logits(); });
  CHECK(std::isfinite(m.loss()));
}

TEST_CASE("gpt: init is deterministic, GPT-2 shaped, and independent of the thread count") {
  tide::thread_pool one{1}, two{2};
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  gpt_config const c{.layers = 4, .heads = 2, .channels = 32, .vocab = 100, .max_seq = 16};
  host_gpt a(c, arena, {.seed = 9}), b(c, arena, {.seed = 9}), d(c, arena, {.seed = 10});
  auto flat = [](host_gpt const& m) { return std::vector<float>(m.flat_params().data(), m.flat_params().data() + m.flat_params().size()); };
  CHECK(same_bits(flat(a), flat(b)));
  CHECK_FALSE(same_bits(flat(a), flat(d)));
  b.init(tide::exec<tide::host>{two}, 9);
  CHECK(same_bits(flat(a), flat(b)));
  d.init(tide::exec<tide::host>{one}, 9);
  CHECK(same_bits(flat(a), flat(d)));

  auto stats = [&](std::string_view name) {
    auto const v = a.param(name);
    double s = 0, s2 = 0;
    for (index_t i = 0; i < v.size(); ++i) s += v.data()[i], s2 += double(v.data()[i]) * v.data()[i];
    double const n = static_cast<double>(v.size());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  auto const [m_fc, sd_fc] = stats("h1.mlp.fc.w");  // 4096 samples: sd within ~3%
  CHECK(std::abs(m_fc) < 0.002);
  CHECK(sd_fc == doctest::Approx(0.02).epsilon(0.05));
  auto const [m_pr, sd_pr] = stats("h2.mlp.proj.w");
  CHECK(sd_pr == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stats("h0.attn.proj.w").second == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.1));
  CHECK(stats("h3.ln2.w") == std::pair{1.0, 0.0});
  CHECK(stats("h3.mlp.fc.b") == std::pair{0.0, 0.0});
  CHECK(stats("lnf.b") == std::pair{0.0, 0.0});
  // wte's padding rows (100 .. 127) are zero.
  auto const wte = a.param("wte");
  CHECK(std::all_of(wte.data() + 100 * 32, wte.data() + 128 * 32, [](float x) { return x == 0.f; }));
  CHECK(std::any_of(wte.data(), wte.data() + 100 * 32, [](float x) { return x != 0.f; }));
}

// ---- wte in row pieces ------------------------------------------------------------------------

namespace {

template <class F>
void expect_usage(F&& f) {
  try {
    f();
    FAIL("no error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
  }
}

// Every parameter's values in list order (no alignment gaps): wte's pieces join into wte.
std::vector<float> logical_params(host_gpt const& m) {
  std::vector<float> v;
  for (tide::parameter const& p : m.parameters().all()) {
    auto const x = m.param(p);
    v.insert(v.end(), x.data(), x.data() + x.size());
  }
  return v;
}

// The gradients of one forward and backward from the seed-42 initialisation, in logical order,
// and the loss.
float logical_grads(tide::exec<tide::host> const& ex, gpt_config const& c, int B, int T, std::vector<std::vector<float>>& g,
                    tide::nn::gpt_options const& options = {.seed = 42}) {
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  host_gpt m(c, arena, options);
  auto const tok = random_ids(static_cast<std::size_t>(B * T), c.vocab, 77);
  auto const tgt = random_ids(static_cast<std::size_t>(B * T), c.vocab, 78);
  m.zero_grad(ex);
  float const loss = m.forward(ex, ids_view(tok, B, T), ids_view(tgt, B, T));
  m.backward(ex);
  g.clear();
  std::vector<float> wte;  // the pieces joined
  for (tide::parameter const& p : m.parameters().all()) {
    auto const x = m.grad(p);
    if (p.name().starts_with("wte")) {
      wte.insert(wte.end(), x.data(), x.data() + x.size());
      continue;
    }
    if (!wte.empty()) g.push_back(std::exchange(wte, {}));
    g.emplace_back(x.data(), x.data() + x.size());
  }
  return loss;
}

// Losses of `steps` AdamW steps (per-parameter AdamW state, so no flat layout is assumed), and
// the final parameters in logical order.
std::vector<float> train_logical(tide::exec<tide::host> const& ex, gpt_config const& c, int B, int T, int steps,
                                 std::vector<float>& final_params) {
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  host_gpt m(c, arena, {.seed = 42});
  auto const tok = random_ids(static_cast<std::size_t>(B * T), c.vocab, 77);
  auto const tgt = random_ids(static_cast<std::size_t>(B * T), c.vocab, 78);
  auto const all = m.parameters().all();
  std::vector<std::vector<float>> mom(all.size()), var(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    mom[i].assign(static_cast<std::size_t>(all[i].numel()), 0.f);
    var[i].assign(mom[i].size(), 0.f);
  }
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    m.zero_grad(ex);
    losses.push_back(m.forward(ex, ids_view(tok, B, T), ids_view(tgt, B, T)));
    m.backward(ex);
    for (std::size_t i = 0; i < all.size(); ++i) {
      auto const n = static_cast<index_t>(mom[i].size());
      auto const flat = [n](auto v) { return tide::tensor_view<float>(v.data(), {n}); };
      tide::kernels::adamw(ex, {.lr = 1e-2f, .weight_decay = 0.0f}, step, flat(m.param(all[i])), flat(m.grad(all[i])),
                           tide::tensor_view<float>(mom[i].data(), {n}), tide::tensor_view<float>(var[i].data(), {n}),
                           1.0f);
    }
  }
  final_params = logical_params(m);
  return losses;
}

}  // namespace

TEST_CASE("gpt: wte in row pieces: the same model, initialised alike, gradients within the head's reassociation") {
  // Vp = 384 rows of C = 64: 2 pieces of 192, 3 of 128, 5 of 77 (the last 76), 7 of 55 (the last 54).
  gpt_config const whole{.layers = 2, .heads = 4, .channels = 64, .vocab = 300, .max_seq = 32};
  int const B = 4, T = 32;
  tide::thread_pool two{2};
  tide::exec<tide::host> const ex{two};
  std::vector<float> base_params;
  auto const base = train_logical(ex, whole, B, T, 3, base_params);
  std::vector<std::vector<float>> base_grads;
  float const base_loss = logical_grads(ex, whole, B, T, base_grads);
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  host_gpt const w(whole, arena, {.seed = 42});
  for (int k : {2, 3, 5, 7}) {
    CAPTURE(k);
    gpt_config c = whole;
    c.wte_pieces = k;
    auto const list = tide::nn::gpt_parameters(c, tide::dtype::f32);
    REQUIRE(list.size() == tide::nn::gpt_parameters(whole, tide::dtype::f32).size() + static_cast<std::size_t>(k - 1));
    CHECK(list.count() == tide::nn::parameter_count(whole));
    CHECK(list[0].name() == "wte.0");
    CHECK(list[static_cast<std::size_t>(k - 1)].shape ==
          tide::shape(384 - (k - 1) * tide::nn::wte_piece_rows(c), 64));
    CHECK(list[static_cast<std::size_t>(k)].name() == "wpe");
    // The head block reads every piece.
    auto const uses = tide::nn::gpt_block_uses(c);
    auto const head = uses.of(tide::nn::head_block(c));
    for (int j = 0; j < k; ++j) CHECK(std::ranges::find(head, static_cast<std::uint32_t>(j)) != head.end());
    // The same initial values, parameter for parameter (the pieces draw from wte's stream).
    host_gpt const m(c, arena, {.seed = 42});
    CHECK(same_bits(logical_params(m), logical_params(w)));
    // The forward computes the same dot products over C per logit (the same bits with the
    // OpenBLAS here, but a BLAS may order a dot product by the output's width): the loss within
    // 1e-6 relative. The backward's d lnf sums over the vocabulary in k GEMMs, one per piece,
    // instead of one: fp32 reassociation of Vp = 384 terms, at most about Vp u = 2.3e-5 of the
    // terms' sum per element, carried into every gradient below the head. Each gradient stays
    // within 1e-4 of its tensor's largest element (measured: under 1e-6); a piece cut at the
    // wrong row, or missing, is off by the size of the gradient itself. Also with dlogits kept
    // apart and the head's share of wte's gradient in the tied buffer (k = 3).
    std::vector<tide::nn::gpt_options> variants{{.seed = 42}};
    if (k == 3) variants.push_back({.seed = 42, .keep_logits = true, .separate_tied_grad = true});
    for (auto const& o : variants) {
      std::vector<std::vector<float>> g;
      CHECK(logical_grads(ex, c, B, T, g, o) == doctest::Approx(base_loss).epsilon(1e-6));
      REQUIRE(g.size() == base_grads.size());
      double worst = 0;
      for (std::size_t t = 0; t < g.size(); ++t) {
        REQUIRE(g[t].size() == base_grads[t].size());
        double top = 0, diff = 0;
        for (std::size_t i = 0; i < g[t].size(); ++i) {
          top = std::max(top, static_cast<double>(std::abs(base_grads[t][i])));
          diff = std::max(diff, static_cast<double>(std::abs(g[t][i] - base_grads[t][i])));
        }
        CHECK(diff <= 1e-4 * top);
        worst = std::max(worst, top > 0 ? diff / top : diff);
      }
      MESSAGE("wte_pieces = " << k << std::string(o.keep_logits ? " (keep_logits, tied buffer)" : "")
                              << ": largest gradient difference " << worst << " of its tensor's largest");
    }
    // Three AdamW steps: the losses stay within 1e-5 relative.
    std::vector<float> params;
    auto const losses = train_logical(ex, c, B, T, 3, params);
    CHECK(losses[0] == doctest::Approx(base[0]).epsilon(1e-6));
    for (std::size_t i = 1; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(base[i]).epsilon(1e-5));
  }
}

TEST_CASE("gpt: wte in pieces initialises to wte's values at odd widths, with padding rows across pieces") {
  // C = 9 and R odd: pieces start at odd elements of wte's stream (half a normal pair); Vp = 37
  // rows of which 14 are padding, spread over the last pieces.
  gpt_config const whole{.layers = 1, .heads = 3, .channels = 9, .vocab = 23, .padded_vocab = 37, .max_seq = 8};
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  tide::thread_pool two{2};
  host_gpt const w(whole, arena, {.seed = 5});
  for (int k = 1; k <= 7; ++k) {
    CAPTURE(k);
    gpt_config c = whole;
    c.wte_pieces = k;
    host_gpt m(c, arena, {.seed = 5});
    CHECK(same_bits(logical_params(m), logical_params(w)));
    m.init(tide::exec<tide::host>{two}, 5);  // threaded: the same again
    CHECK(same_bits(logical_params(m), logical_params(w)));
  }
}

TEST_CASE("gpt: wte_pieces is checked, and wte_pieces_within finds the fewest that fit a chunk") {
  gpt_config c{.layers = 1, .heads = 2, .channels = 64, .vocab = 300, .max_seq = 16};  // Vp 384
  for (int bad : {0, -1, 65}) {
    c.wte_pieces = bad;
    expect_usage([&] { (void)tide::nn::resolve(c); });
  }
  c.wte_pieces = 383;  // 1 row each would do, but more than 64 pieces
  expect_usage([&] { (void)tide::nn::resolve(c); });
  gpt_config tiny_v{.layers = 1, .heads = 1, .channels = 4, .vocab = 9, .padded_vocab = 9, .max_seq = 4};
  tiny_v.wte_pieces = 4;  // ceil(9 / 4) = 3 rows each: 3 + 3 + 3 leaves piece 3 empty
  expect_usage([&] { (void)tide::nn::resolve(tiny_v); });
  tiny_v.wte_pieces = 5;  // 2 rows each: 2 + 2 + 2 + 2 + 1
  CHECK(tide::nn::resolve(tiny_v).wte_pieces == 5);
  c.wte_pieces = 1;
  CHECK(tide::nn::wte_pieces_within(c, 384 * 64) == 1);
  CHECK(tide::nn::wte_pieces_within(c, 384 * 64 - 1) == 2);  // 383 rows fit: 2 of 192
  CHECK(tide::nn::wte_pieces_within(c, 100 * 64) == 4);      // 100 rows: 4 of 96
  CHECK(tide::nn::wte_pieces_within(c, 77 * 64) == 5);       // 77 rows: 5 of 77
  expect_usage([&] { (void)tide::nn::wte_pieces_within(c, 63); });      // not one row
  expect_usage([&] { (void)tide::nn::wte_pieces_within(c, 5 * 64); });  // 77 pieces of 5 rows
  // The pieces found fit: every piece's elements <= the chunk.
  for (std::size_t chunk : {std::size_t{384 * 64}, std::size_t{6000}, std::size_t{1000}}) {
    gpt_config d = c;
    d.wte_pieces = tide::nn::wte_pieces_within(c, chunk);
    auto const list = tide::nn::gpt_parameters(d, tide::dtype::f32);
    for (tide::parameter const& p : list.all())
      if (p.layer == tide::nn::embedding_block && p.name() != "wpe")
        CHECK(static_cast<std::size_t>(p.numel()) <= chunk);
  }
}

// ---- sampling -------------------------------------------------------------------------------

TEST_CASE("gpt: generate is seeded, stays in the vocabulary and slides past max_seq") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m(tiny, arena, {.seed = 4});
  std::vector<std::int32_t> const prompt = {1, 2, 3};
  auto const a = m.generate(ex, prompt, 10, 1.0f, 123);  // 13 tokens > max_seq 8: a window slides
  auto const b = m.generate(ex, prompt, 10, 1.0f, 123);
  auto const c = m.generate(ex, prompt, 10, 1.0f, 124);
  REQUIRE(a.size() == 13);
  CHECK(std::equal(prompt.begin(), prompt.end(), a.begin()));
  CHECK(a == b);
  CHECK(a != c);
  CHECK(std::all_of(a.begin(), a.end(), [](std::int32_t t) { return t >= 0 && t < tiny.vocab; }));
  // Greedy sampling picks the argmax of the last position's logits.
  auto const g = m.generate(ex, prompt, 1, 0.0f, 0);
  m.forward(ex, ids_view(prompt, 1, 3));
  auto const logits = m.logits();
  float const* last = logits.data() + 2 * 24;
  CHECK(g.back() == std::max_element(last, last + tiny.vocab) - last);
  CHECK_THROWS_AS(m.generate(ex, {}, 1, 1.0f, 0), tide::error);

  // On tide::sealed, a device the host cannot read: the forwards run there, each window's
  // tokens copied in and its last logits row out, and the same parameters sample the same
  // tokens (the sealed kernels give the host's bits).
  tide::memory::device_arena<tide::sealed> dev_arena{{.budget = 4_MiB}};
  tide::memory::stream<tide::sealed> compute;
  tide::exec<tide::sealed> const dex{pool, compute};
  tide::nn::gpt<tide::sealed> d(tiny, dev_arena, {.seed = 4});
  CHECK(d.generate(dex, prompt, 10, 1.0f, 123) == a);
  CHECK(d.generate(dex, prompt, 10, 1.0f, 124) == c);
  CHECK(d.generate(dex, prompt, 1, 0.0f, 0) == g);
  std::size_t const live = dev_arena.stats().in_use;
  CHECK(d.generate(dex, prompt, 1, 0.0f, 0) == g);
  CHECK(dev_arena.stats().in_use == live);  // the token buffer went back to the arena
  CHECK_THROWS_AS(d.generate(dex, {}, 1, 1.0f, 0), tide::error);
}
