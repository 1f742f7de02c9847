// The kernels on tide::sealed: a GPT block's forward and backward, a classifier, a grad norm and
// an AdamW step, run on memory the host cannot read, give the bits of the same calls on tide::host;
// so do the backward's input and weight halves, against the host's fused backward.
#include <doctest/doctest.h>

#include "support/gate.hpp"
#include "support/kernel_checks.hpp"

#include <tide/kernels/sealed.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/stream.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace tide::literals;
namespace k = tide::kernels;
namespace mem = tide::memory;
using tide::index_t;
using tide::tensor_view;

namespace {

constexpr index_t B = 2, T = 8, C = 32, NH = 4, V = 64, H = 4 * C;

// Offsets of every tensor in one flat float buffer, so a run is one upload and one download.
struct layout {
  index_t at = 0;
  index_t take(index_t n) {
    index_t const o = at;
    at += (n + 63) / 64 * 64;  // 256-byte aligned, as arena blocks are
    return o;
  }
  // parameters
  index_t wte = take(V * C), wpe = take(T * C), lnw = take(C), lnb = take(C), wqkv = take(3 * C * C),
          bqkv = take(3 * C), wfc = take(H * C), bfc = take(H), wout = take(V * H);
  index_t params_end = at;
  // activations
  index_t x = take(B * T * C), ln = take(B * T * C), mean = take(B * T), rstd = take(B * T), qkv = take(B * T * 3 * C),
          att = take(B * T * C), lse = take(B * NH * T), h = take(B * T * H), pre = take(B * T * H),
          logits = take(B * T * V), losses = take(B * T);
  // gradients, in the parameters' order, then the activations'
  index_t dwte = take(V * C), dwpe = take(T * C), dlnw = take(C), dlnb = take(C), dwqkv = take(3 * C * C),
          dbqkv = take(3 * C), dwfc = take(H * C), dbfc = take(H), dwout = take(V * H);
  index_t grads_end = at;
  index_t dh = take(B * T * H), dpre = take(B * T * H), datt = take(B * T * C), dqkv = take(B * T * 3 * C),
          dln = take(B * T * C), dx = take(B * T * C), m = take(V * C), v = take(V * C);
  index_t total = at;
};

// The scratch the step's kernels need at most (each call has all of it: they run in order).
template <class Ex>
std::size_t step_scratch(Ex const& ex) {
  layout const L;
  return std::max({k::matmul_forward_scratch_bytes<float>(ex, B * T, C, 3 * C),
                   k::matmul_forward_scratch_bytes<float>(ex, B * T, C, H),
                   k::matmul_forward_scratch_bytes<float>(ex, B * T, H, V),
                   k::matmul_backward_scratch_bytes<float>(ex, B * T, H, V),
                   k::matmul_backward_scratch_bytes<float>(ex, B * T, C, H),
                   k::matmul_backward_scratch_bytes<float>(ex, B * T, C, 3 * C),
                   k::attention_forward_scratch_bytes(ex, B, T, C, NH), k::attention_backward_scratch_bytes(ex, B, T, C, NH),
                   k::fused_classifier_scratch_bytes(ex, B * T, V), k::layernorm_backward_scratch_bytes(ex, B * T, C),
                   k::encoder_backward_scratch_bytes(ex, B, T, C, V),
                   k::global_grad_norm_scratch_bytes(ex, tensor_view<float const>{nullptr, {L.grads_end - L.dwte}})});
}

// One forward, backward and AdamW step of a one-block model, written once for both backends:
// `base` is the buffer's first float (host memory, or a sealed device address); `ws` the
// kernels' scratch, step_scratch bytes of it.
template <class Ex, class Space>
double train_step(Ex const& ex, float* base, std::int32_t const* tok, std::int32_t const* tgt, k::scratch<Space> ws) {
  layout const L;
  auto t = [&](index_t off, tide::shape s) { return tensor_view<float, Space>{base + off, s}; };
  auto c = [&](index_t off, tide::shape s) { return tensor_view<float const, Space>{base + off, s}; };
  tensor_view<std::int32_t const, Space> tokens{tok, {B, T}}, targets{tgt, {B, T}};

  k::encoder_forward(ex, t(L.x, {B, T, C}), tokens, c(L.wte, {V, C}), c(L.wpe, {T, C}));
  k::layernorm_forward(ex, t(L.ln, {B, T, C}), t(L.mean, {B, T}), t(L.rstd, {B, T}), c(L.x, {B, T, C}),
                       c(L.lnw, {C}), c(L.lnb, {C}));
  k::matmul_forward(ex, t(L.qkv, {B, T, 3 * C}), c(L.ln, {B, T, C}), c(L.wqkv, {3 * C, C}), c(L.bqkv, {3 * C}), ws);
  k::attention_forward(ex, t(L.att, {B, T, C}), t(L.lse, {B, NH, T}), c(L.qkv, {B, T, 3 * C}), NH, ws);
  k::matmul_forward_gelu(ex, t(L.h, {B, T, H}), t(L.pre, {B, T, H}), c(L.att, {B, T, C}), c(L.wfc, {H, C}),
                         c(L.bfc, {H}), ws);
  k::matmul_forward(ex, t(L.logits, {B, T, V}), c(L.h, {B, T, H}), c(L.wout, {V, H}), tensor_view<float const, Space>{}, ws);
  k::fused_classifier(ex, t(L.logits, {B, T, V}), t(L.losses, {B, T}), c(L.logits, {B, T, V}), targets, V, ws);

  k::matmul_backward(ex, t(L.dh, {B, T, H}), t(L.dwout, {V, H}), tensor_view<float, Space>{}, c(L.logits, {B, T, V}),
                     c(L.h, {B, T, H}), c(L.wout, {V, H}), ws);
  k::gelu_backward(ex, t(L.dpre, {B, T, H}), c(L.pre, {B, T, H}), c(L.dh, {B, T, H}));
  k::matmul_backward(ex, t(L.datt, {B, T, C}), t(L.dwfc, {H, C}), t(L.dbfc, {H}), c(L.dpre, {B, T, H}),
                     c(L.att, {B, T, C}), c(L.wfc, {H, C}), ws);
  k::attention_backward(ex, t(L.dqkv, {B, T, 3 * C}), c(L.datt, {B, T, C}), c(L.qkv, {B, T, 3 * C}),
                        c(L.att, {B, T, C}), c(L.lse, {B, NH, T}), NH, ws);
  k::matmul_backward(ex, t(L.dln, {B, T, C}), t(L.dwqkv, {3 * C, C}), t(L.dbqkv, {3 * C}), c(L.dqkv, {B, T, 3 * C}),
                     c(L.ln, {B, T, C}), c(L.wqkv, {3 * C, C}), ws);
  k::layernorm_backward(ex, t(L.dx, {B, T, C}), t(L.dlnw, {C}), t(L.dlnb, {C}), c(L.dln, {B, T, C}), c(L.x, {B, T, C}),
                        c(L.lnw, {C}), c(L.mean, {B, T}), c(L.rstd, {B, T}), ws);
  k::encoder_backward(ex, t(L.dwte, {V, C}), t(L.dwpe, {T, C}), t(L.dx, {B, T, C}), tokens, ws);
  double const norm = k::global_grad_norm(ex, c(L.dwte, {L.grads_end - L.dwte}), ws);
  k::adamw(ex, k::adamw_hparams{.lr = 1e-2f, .weight_decay = 0.1f}, 1, t(L.wte, {V * C}), c(L.dwte, {V * C}), t(L.m, {V * C}),
           t(L.v, {V * C}));
  return norm;
}

}  // namespace

TEST_CASE("a training step's kernels on sealed give the host's bits") {
  layout const L;
  auto const n = static_cast<std::size_t>(L.total);
  std::vector<float> init(n, 0.f);
  for (index_t i = 0; i < L.params_end; ++i) init[static_cast<std::size_t>(i)] = 0.2f * tide::test::noise(7, i);
  for (index_t i = 0; i < C; ++i) init[static_cast<std::size_t>(L.lnw + i)] = 1.f + 0.1f * tide::test::noise(8, i);
  std::vector<std::int32_t> ids(2 * B * T);  // tokens, then targets
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37 + 11) % V);

  tide::thread_pool host_pool{2};
  tide::exec<tide::host> const hx{host_pool};
  std::vector<float> on_host = init;
  k::detail::call_scratch const host_ws(step_scratch(hx));
  double const host_norm =
      train_step<tide::exec<tide::host>, tide::host>(hx, on_host.data(), ids.data(), ids.data() + B * T, host_ws.get());

  mem::device_arena<tide::sealed> arena{{.budget = 4_MiB}};
  mem::stream<tide::sealed> compute;
  tide::thread_pool worker_pool{2};
  tide::exec<tide::sealed> ex{worker_pool, compute};
  auto* dev = static_cast<float*>(arena.allocate(n * sizeof(float)));
  auto* dev_ids = static_cast<std::int32_t*>(arena.allocate(ids.size() * sizeof(std::int32_t)));
  compute.copy(dev, init.data(), n * sizeof(float));
  compute.copy(dev_ids, ids.data(), ids.size() * sizeof(std::int32_t));
  compute.synchronize();  // the copy stream below reads x unordered: the uploads must have landed

  // The kernels are enqueued: held at a gate, none has run when every call has returned.
  tide::test::gate g;
  compute.launch(&tide::test::gate::pass, &g);
  std::vector<float> snapshot(n, -1.f);
  mem::stream<tide::sealed> copy;
  {
    // global_grad_norm waits for its result, so take the step in two halves around the gate.
    layout const l;
    tensor_view<float, tide::sealed> x{dev + l.x, {B, T, C}};
    k::encoder_forward(ex, x, tensor_view<std::int32_t const, tide::sealed>{dev_ids, {B, T}},
                       tensor_view<float const, tide::sealed>{dev + l.wte, {V, C}},
                       tensor_view<float const, tide::sealed>{dev + l.wpe, {T, C}});
    copy.copy(snapshot.data(), dev + l.x, static_cast<std::size_t>(B * T * C) * sizeof(float));
    copy.synchronize();
    CHECK(snapshot[0] == 0.f);  // x still holds the zeros uploaded: the kernel has not run
    g.open();
    compute.synchronize();
    copy.copy(snapshot.data(), dev + l.x, static_cast<std::size_t>(B * T * C) * sizeof(float));
    copy.synchronize();
    CHECK(snapshot[0] != 0.f);
    compute.copy(dev + l.x, init.data() + l.x, static_cast<std::size_t>(B * T * C) * sizeof(float));  // zero again
  }
  // The scratch is device memory from the arena; the queries answer as on the host (the same pool size).
  std::size_t const need = step_scratch(ex);
  CHECK(need == step_scratch(hx));
  CHECK(need > 0);
  k::scratch<tide::sealed> const ws{static_cast<std::byte*>(arena.allocate(need)), need};
  double const sealed_norm = train_step<tide::exec<tide::sealed>, tide::sealed>(ex, dev, dev_ids, dev_ids + B * T, ws);
  std::vector<float> on_sealed(n, -1.f);
  compute.copy(on_sealed.data(), dev, n * sizeof(float));
  compute.synchronize();

  CHECK(sealed_norm == host_norm);
  CHECK(host_norm > 0);
  CHECK(tide::test::same_bits(on_sealed, on_host));
  // The step changed what it should: the loss rows, the gradients and the updated wte.
  CHECK(on_host[static_cast<std::size_t>(L.losses)] > 0.f);
  CHECK(on_host[static_cast<std::size_t>(L.wte)] != init[static_cast<std::size_t>(L.wte)]);
  arena.deallocate(ws.data, need);
  arena.deallocate(dev_ids, ids.size() * sizeof(std::int32_t));
  arena.deallocate(dev, n * sizeof(float));
}

namespace {

// A matmul (plain and GELU form) and a LayerNorm backward in one flat buffer of E: inputs, then
// the old accumulators (non-zero: the halves add), at odd sizes.
struct split_layout {
  static constexpr index_t N = 37, IC = 24, OC = 40;
  index_t at = 0;
  index_t take(index_t n) {
    index_t const o = at;
    at += (n + 127) / 128 * 128;  // 256-byte aligned for 2-byte elements too
    return o;
  }
  index_t x = take(N * IC), w = take(OC * IC), pre = take(N * OC), lnw = take(IC);
  index_t inputs_end = at;
  index_t dout = take(N * OC), dinp = take(N * IC), dw = take(OC * IC), db = take(OC);  // matmul_backward
  index_t gdout = take(N * OC), gdinp = take(N * IC), gdw = take(OC * IC), gdb = take(OC);  // the GELU form
  index_t ldout = take(N * IC), ldinp = take(N * IC), ldw = take(IC), ldb = take(IC);  // layernorm_backward
  index_t total = at;
};

// Runs the three backwards: fused (split = false) or as the input halves, then the weight halves.
// `base`: the buffer's first element (host or sealed); `stats`: mean, then rstd (N floats each).
template <class E, class Ex, class Space>
void split_backward(Ex const& ex, bool split, E* base, float const* stats, k::scratch<Space> ws) {
  using L = split_layout;
  L const l;
  auto t = [&](index_t off, tide::shape s) { return tensor_view<E, Space>{base + off, s}; };
  auto c = [&](index_t off, tide::shape s) { return tensor_view<E const, Space>{base + off, s}; };
  tensor_view<float const, Space> const mean{stats, {L::N}}, rstd{stats + L::N, {L::N}};
  auto const x = c(l.x, {L::N, L::IC});
  auto const w = c(l.w, {L::OC, L::IC});
  if (!split) {
    k::matmul_backward(ex, t(l.dinp, {L::N, L::IC}), t(l.dw, {L::OC, L::IC}), t(l.db, {L::OC}),
                       c(l.dout, {L::N, L::OC}), x, w, ws);
    k::matmul_backward_gelu(ex, t(l.gdinp, {L::N, L::IC}), t(l.gdw, {L::OC, L::IC}), t(l.gdb, {L::OC}),
                            t(l.gdout, {L::N, L::OC}), c(l.pre, {L::N, L::OC}), x, w, ws);
    k::layernorm_backward(ex, t(l.ldinp, {L::N, L::IC}), t(l.ldw, {L::IC}), t(l.ldb, {L::IC}),
                          c(l.ldout, {L::N, L::IC}), x, c(l.lnw, {L::IC}), mean, rstd, ws);
    return;
  }
  k::matmul_backward_input(ex, t(l.dinp, {L::N, L::IC}), c(l.dout, {L::N, L::OC}), w, ws);
  k::matmul_backward_gelu_input(ex, t(l.gdinp, {L::N, L::IC}), t(l.gdout, {L::N, L::OC}), c(l.pre, {L::N, L::OC}), w,
                                ws);
  k::layernorm_backward_input(ex, t(l.ldinp, {L::N, L::IC}), c(l.ldout, {L::N, L::IC}), x, c(l.lnw, {L::IC}), mean,
                              rstd);
  k::matmul_backward_weight(ex, t(l.dw, {L::OC, L::IC}), t(l.db, {L::OC}), c(l.dout, {L::N, L::OC}), x, ws);
  k::matmul_backward_weight(ex, t(l.gdw, {L::OC, L::IC}), t(l.gdb, {L::OC}), c(l.gdout, {L::N, L::OC}), x, ws);
  k::layernorm_backward_weight(ex, t(l.ldw, {L::IC}), t(l.ldb, {L::IC}), c(l.ldout, {L::N, L::IC}), x, mean, rstd,
                               ws);
}

template <class E, class Ex>
std::size_t split_scratch(Ex const& ex) {
  using L = split_layout;
  return std::max(k::matmul_backward_scratch_bytes<E>(ex, L::N, L::IC, L::OC),
                  k::layernorm_backward_scratch_bytes(ex, L::N, L::IC));
}

}  // namespace

TEST_CASE_TEMPLATE("the split backward on sealed: the input and weight halves give the host's fused bits", E, float,
                   tide::bf16, tide::f16) {
  using L = split_layout;
  L const l;
  auto const n = static_cast<std::size_t>(l.total);
  std::vector<E> init(n, tide::from_float<E>(0.f));
  for (index_t i = 0; i < l.total; ++i)
    init[static_cast<std::size_t>(i)] = tide::from_float<E>((i < l.inputs_end ? 1.f : 0.1f) * tide::test::noise(11, i));
  // mean and rstd of the LayerNorm's inp, from the host forward.
  std::vector<float> stats(2 * L::N);
  {
    std::vector<E> out(static_cast<std::size_t>(L::N * L::IC)), bias(L::IC, tide::from_float<E>(0.f));
    tide::thread_pool pool{1};
    k::layernorm_forward(tide::exec<tide::host>{pool}, tensor_view<E>{out.data(), {L::N, L::IC}},
                         tensor_view<float>{stats.data(), {L::N}}, tensor_view<float>{stats.data() + L::N, {L::N}},
                         tensor_view<E const>{init.data() + l.x, {L::N, L::IC}},
                         tensor_view<E const>{init.data() + l.lnw, {L::IC}}, tensor_view<E const>{bias.data(), {L::IC}});
  }

  tide::thread_pool host_pool{2};
  tide::exec<tide::host> const hx{host_pool};
  std::vector<E> on_host = init;
  k::detail::call_scratch const host_ws(split_scratch<E>(hx));
  split_backward<E, tide::exec<tide::host>, tide::host>(hx, false, on_host.data(), stats.data(), host_ws.get());

  mem::device_arena<tide::sealed> arena{{.budget = 1_MiB}};
  mem::stream<tide::sealed> compute;
  tide::thread_pool worker_pool{2};
  tide::exec<tide::sealed> ex{worker_pool, compute};
  auto* dev = static_cast<E*>(arena.allocate(n * sizeof(E)));
  auto* dev_stats = static_cast<float*>(arena.allocate(stats.size() * sizeof(float)));
  compute.copy(dev, init.data(), n * sizeof(E));
  compute.copy(dev_stats, stats.data(), stats.size() * sizeof(float));
  std::size_t const need = split_scratch<E>(ex);
  CHECK(need == split_scratch<E>(hx));
  REQUIRE(need > 0);
  k::scratch<tide::sealed> const ws{static_cast<std::byte*>(arena.allocate(need)), need};
  split_backward<E, tide::exec<tide::sealed>, tide::sealed>(ex, true, dev, dev_stats, ws);
  std::vector<E> on_sealed(n, tide::from_float<E>(-1.f));
  compute.copy(on_sealed.data(), dev, n * sizeof(E));
  compute.synchronize();

  // Every output (dinp, dweight, dbias of the three, and dout rewritten by the GELU input half).
  auto const region = [&](std::vector<E> const& v, index_t off, index_t len) {
    return std::vector<E>(v.begin() + off, v.begin() + off + len);
  };
  struct named {
    char const* name;
    index_t off, len;
  };
  for (named const o : {named{"dinp", l.dinp, L::N * L::IC}, named{"dweight", l.dw, L::OC * L::IC},
                        named{"dbias", l.db, L::OC}, named{"gelu dout", l.gdout, L::N * L::OC},
                        named{"gelu dinp", l.gdinp, L::N * L::IC}, named{"gelu dweight", l.gdw, L::OC * L::IC},
                        named{"gelu dbias", l.gdb, L::OC}, named{"layernorm dinp", l.ldinp, L::N * L::IC},
                        named{"layernorm dweight", l.ldw, L::IC}, named{"layernorm dbias", l.ldb, L::IC}}) {
    CAPTURE(o.name);
    CHECK(tide::test::same_bits(region(on_sealed, o.off, o.len), region(on_host, o.off, o.len)));
    CHECK(!tide::test::same_bits(region(on_host, o.off, o.len), region(init, o.off, o.len)));  // the backward ran
  }
  CHECK(tide::test::same_bits(on_sealed, on_host));  // and nothing else was written
  arena.deallocate(ws.data, need);
  arena.deallocate(dev_stats, stats.size() * sizeof(float));
  arena.deallocate(dev, n * sizeof(E));
}

TEST_CASE("kernel scratch: a call with less than its query asks is refused before it writes") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  constexpr index_t N = 8;
  std::vector<float> dout(N * C, 1.f), inp(N * C, 0.5f), w(C, 1.f), mean(N, 0.f), rstd(N, 1.f), dinp(N * C, 0.f),
      dw(C, 0.f), db(C, 0.f);
  std::size_t const need = k::layernorm_backward_scratch_bytes(ex, N, C);
  REQUIRE(need > 0);
  k::detail::call_scratch const small(need - 4), enough(need);
  auto call = [&](k::scratch<> ws) {
    k::layernorm_backward(ex, tensor_view<float>{dinp.data(), {N, C}}, tensor_view<float>{dw.data(), {C}},
                          tensor_view<float>{db.data(), {C}}, tensor_view<float const>{dout.data(), {N, C}},
                          tensor_view<float const>{inp.data(), {N, C}}, tensor_view<float const>{w.data(), {C}},
                          tensor_view<float const>{mean.data(), {N}}, tensor_view<float const>{rstd.data(), {N}}, ws);
  };
  CHECK_THROWS_WITH_AS(call(small.get()), doctest::Contains("layernorm_backward_scratch_bytes"), tide::error);
  CHECK(std::all_of(db.begin(), db.end(), [](float x) { return x == 0.f; }));  // nothing written
  k::scratch<> const misaligned{enough.get().data + 4, need};
  CHECK_THROWS_WITH_AS(call(misaligned), doctest::Contains("aligned"), tide::error);
  call(enough.get());
  CHECK(db[0] == static_cast<float>(N));  // dbias = the column sums of dout
}

TEST_CASE("the list entries on sealed: every record's pointers reach the kernel as aliases") {
  // Two tensors of a list: a grad norm and an AdamW step over them, against the host's bits.
  constexpr index_t n0 = 300, n1 = 77;
  std::vector<float> host_mem(static_cast<std::size_t>(4 * (n0 + n1)));  // p, g, m, v of both
  for (std::size_t i = 0; i < host_mem.size(); ++i) host_mem[i] = i < 2 * (n0 + n1) ? tide::test::noise(3, static_cast<index_t>(i)) : 0.f;
  auto records = [&](float* base) {
    index_t const n = n0 + n1;
    return std::vector<k::adamw_tensor<float>>{{base, base + n, base + 2 * n, base + 3 * n, nullptr, n0},
                                              {base + n0, base + n + n0, base + 2 * n + n0, base + 3 * n + n0, nullptr, n1}};
  };
  auto grads = [&](float* base) {
    return std::vector<k::grad_tensor<float>>{{base + (n0 + n1), n0}, {base + (n0 + n1) + n0, n1}};
  };
  std::vector<float> on_host = host_mem;
  tide::thread_pool pool{2};
  tide::exec<tide::host> hx{pool};
  double const hn = k::global_grad_norm(hx, grads(on_host.data()));  // scratch for the call
  k::adamw(hx, k::adamw_hparams{.lr = 1e-2f}, 1, records(on_host.data()), 0.5f);

  mem::device_arena<tide::sealed> arena{{.budget = 1_MiB}};
  mem::stream<tide::sealed> compute;
  tide::thread_pool worker{2};
  tide::exec<tide::sealed> ex{worker, compute};
  std::size_t const bytes = host_mem.size() * sizeof(float);
  auto* dev = static_cast<float*>(arena.allocate(bytes));
  compute.copy(dev, host_mem.data(), bytes);
  std::size_t const need = k::global_grad_norm_scratch_bytes(ex, grads(dev));
  k::scratch<tide::sealed> const ws{static_cast<std::byte*>(arena.allocate(need)), need};
  double const sn = k::global_grad_norm(ex, grads(dev), ws);
  k::adamw(ex, k::adamw_hparams{.lr = 1e-2f}, 1, records(dev), 0.5f);  // the list is a temporary: copied
  std::vector<float> on_sealed(host_mem.size());
  compute.copy(on_sealed.data(), dev, bytes);
  compute.synchronize();
  CHECK(sn == hn);
  CHECK(hn > 0);
  CHECK(tide::test::same_bits(on_sealed, on_host));
  CHECK(on_host[0] != host_mem[0]);
  arena.deallocate(ws.data, need);
  arena.deallocate(dev, bytes);
}

TEST_CASE("a kernel's usage error on sealed is the stream's sticky failure, as a device error is") {
  mem::device_arena<tide::sealed> arena{{.budget = 1_MiB}};
  mem::stream<tide::sealed> compute;
  tide::thread_pool pool{1};
  tide::exec<tide::sealed> ex{pool, compute};
  auto* d = static_cast<float*>(arena.allocate(1024 * sizeof(float)));
  // Mismatched shapes: out (4, 8) against inp (4, 16).
  k::gelu_forward(ex, tensor_view<float, tide::sealed>{d, {4, 8}}, tensor_view<float const, tide::sealed>{d + 64, {4, 16}});
  CHECK_THROWS_AS(compute.synchronize(), tide::error);
  CHECK_THROWS_AS(compute.synchronize(), tide::error);  // sticky
  arena.deallocate(d, 1024 * sizeof(float));
}
