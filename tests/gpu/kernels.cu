// The CUDA kernels against the host's, at GPT-2 124M shapes (B T = 2048 rows, C = 768, 4 C =
// 3072, NH = 12, T = 1024) and at odd ones, in f32 and bf16: matmul forward (with bias, and with
// bias and GELU) and backward, on cuBLASLt with fused epilogues and on the cublasGemmEx fallback
// (an exec<cuda> without the cuBLASLt handle), and f32 in TF32; LayerNorm forward and backward,
// GELU, attention forward and backward on tensor cores (cuBLAS) and on CUDA cores (and in bf16
// fused on tensor cores, WMMA), the fused
// classifier (GPT-2's V = 50257 padded to 50304), the embedding forward and backward, the
// residual add forward and backward, softmax (plain, causal) and its backward, AdamW, Adam and
// SGD with momentum (f32 masters, f32 or bf16 gradients, a bf16 working copy) and the global
// gradient norm. The host kernels are
// checked against the scalar references in tests/kernels/; here each CUDA output is compared with
// the host's on the same inputs. Exit 77 (ctest: skipped) without a device (skip.cuh).
//
// Tolerances, as the largest difference over the largest host magnitude of the output, derived
// (no GPU has run this yet; the first run records what it saw in docs/cuda.md):
//   f32:  matmul and attention 1e-4 (sums of up to 3072 products in another order: a few hundred
//         ulp of the largest term at worst, 2e-5 relative, with room), LayerNorm and GELU 1e-5
//         (a row's mean and variance reordered; FMA contraction);
//   bf16: 2e-2 for every kernel (outputs are rounded once to bf16, whose ulp is 2^-8 = 3.9e-3 of
//         the value: a sum that lands on the other side of a rounding boundary is off by one ulp,
//         and gradients summed over rows by a few).
//   classifier: losses 1e-5 (a row's max and sum over V reordered: the loss's absolute error
//         (8 + sqrt(V) / 2 + ...) u, docs/kernels/classifier.md, is 8e-6 at V = 50257 against
//         losses near ln V = 10.8); dlogits element by element (bounds in classifier());
//   embedding: forward 0 (one float add rounded once, on both sides: the same bits); backward
//         f32 1e-6 (the same position order on both sides; room for FMA-free reassociation
//         only), bf16 2e-2 (a float sum a hair apart may round to the neighbouring bf16);
//   residual: forward 0 and backward 0 (a float add rounded once, on both sides: the same bits);
//   softmax: forward and backward f32 1e-5 (the row's max and sum reordered: (8 + sqrt(L) / 2)
//         u of the largest probability at L = 1024 is 2.4e-6, docs/kernels/softmax.md), bf16 2e-2;
//   Adam and SGD: as AdamW (docs/kernels/adam.md, sgd.md: m, v and the momentum buffer within
//         2^-22 of their terms under FMA contraction, p within 1 ulp plus 2^-20 of the update);
//   AdamW: 1e-6 of the largest value for p, m and v (docs/kernels/adamw.md: 1 ulp plus 2^-20 of
//         the update, FMA contraction in m and v); the gradient norm 1e-9 relative (double sums,
//         n 2^-53 for n = 2^22 elements is 5e-10).
//   TF32: 2e-2 for f32 matmuls with ex.tf32 (inputs cut to a 10-bit mantissa, 2^-10 relative per
//         input if truncated, 2^-9 per product; the sum's error is then at most 2^-9 sum |a b|.
//         For normal inputs sum |a b| ~ (2/pi) K s_a s_b and the largest output ~ 4 sqrt(K) s_a
//         s_b, a ratio of 0.16 sqrt(K): 4.4 at K = 768 (forward), 7.2 at 2048 (dweight), 8.8 at
//         3072 (dinp): 1.7e-2 at worst).

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <new>
#include <thread>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <tide/cuda.cuh>
#include <tide/kernels/adamw/adamw.hpp>
#include <tide/kernels/attention/attention.hpp>
#include <tide/kernels/classifier/classifier.hpp>
#include <tide/kernels/embedding/embedding.hpp>
#include <tide/kernels/grad_norm/grad_norm.hpp>
#include <tide/kernels/gelu/gelu.hpp>
#include <tide/kernels/layernorm/layernorm.hpp>
#include <tide/kernels/matmul/matmul.hpp>
#include <tide/kernels/adam/adam.hpp>
#include <tide/kernels/residual/residual.hpp>
#include <tide/kernels/sgd/sgd.hpp>
#include <tide/kernels/softmax/softmax.hpp>

#include "skip.cuh"

namespace {

using tide::index_t;
int failures = 0;

// A tensor on both sides: host values and a device copy of them.
template <class T>
struct twin {
  std::vector<T> h;
  T* d = nullptr;
  std::array<index_t, 4> dims{};
  int rank = 0;
  twin(std::initializer_list<index_t> shape, std::mt19937& rng, float scale) {
    std::size_t n = 1;
    for (index_t x : shape) {
      dims[static_cast<std::size_t>(rank++)] = x;
      n *= static_cast<std::size_t>(x);
    }
    std::normal_distribution<float> dist(0.f, scale);
    h.resize(n);
    for (auto& x : h) x = tide::from_float<T>(scale == 0.f ? 0.f : dist(rng));
    TIDE_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(n, 1) * sizeof(T)));
    TIDE_CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());  // landed: the kernels run on a non-blocking stream
  }
  twin(twin const&) = delete;
  ~twin() { cudaFree(d); }
  template <class B>
  tide::tensor_view<T, B> view(T* p) {
    if (rank == 1) return tide::tensor_view<T, B>(p, {dims[0]});
    if (rank == 2) return tide::tensor_view<T, B>(p, {dims[0], dims[1]});
    if (rank == 3) return tide::tensor_view<T, B>(p, {dims[0], dims[1], dims[2]});
    return tide::tensor_view<T, B>(p, {dims[0], dims[1], dims[2], dims[3]});
  }
  // The host's and the device's views, writable (hv, dv) and read-only (hc, dc).
  tide::tensor_view<T, tide::host> hv() { return view<tide::host>(h.data()); }
  tide::tensor_view<T, tide::cuda> dv() { return view<tide::cuda>(d); }
  tide::tensor_view<T const, tide::host> hc() { return hv(); }
  tide::tensor_view<T const, tide::cuda> dc() { return dv(); }
  // Both sides set to v (NaN: whatever a kernel fails to write stays NaN and fails the check).
  void fill(float v) {
    std::fill(h.begin(), h.end(), tide::from_float<T>(v));
    TIDE_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The worst element's |device - host| / (rtol |host| + atol): at most 1 passes.
  double elementwise(double rtol, double atol) const {
    std::vector<T> got(h.size());
    TIDE_CUDA_CHECK(cudaMemcpy(got.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      double const want = tide::to_float(h[i]), g = tide::to_float(got[i]);
      if (!std::isfinite(g) || !std::isfinite(want)) return INFINITY;
      worst = std::max(worst, std::abs(g - want) / (rtol * std::abs(want) + atol));
    }
    return worst;
  }
  // The device's bytes.
  std::vector<unsigned char> device_bits() const {
    std::vector<unsigned char> got(h.size() * sizeof(T));
    TIDE_CUDA_CHECK(cudaMemcpy(got.data(), d, got.size(), cudaMemcpyDeviceToHost));
    return got;
  }
  // max |device - host| / max |host|
  double relative_difference() const {
    std::vector<T> got(h.size());
    TIDE_CUDA_CHECK(cudaMemcpy(got.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    double worst = 0, largest = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      double const want = tide::to_float(h[i]), g = tide::to_float(got[i]);
      if (!std::isfinite(g)) return INFINITY;
      worst = std::max(worst, std::abs(g - want));
      largest = std::max(largest, std::abs(want));
    }
    return largest > 0 ? worst / largest : worst;
  }
};

// Integers (tokens, targets) on both sides: uniform in [0, n).
struct ints {
  std::vector<std::int32_t> h;
  std::int32_t* d = nullptr;
  ints(std::size_t count, std::int32_t n, std::mt19937& rng) : h(count) {
    std::uniform_int_distribution<std::int32_t> dist(0, n - 1);
    for (auto& x : h) x = dist(rng);
    TIDE_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(count, 1) * sizeof(std::int32_t)));
    TIDE_CUDA_CHECK(cudaMemcpy(d, h.data(), count * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ints(ints const&) = delete;
  ~ints() { cudaFree(d); }
  tide::tensor_view<std::int32_t const, tide::host> hv(tide::shape shape) const { return {h.data(), shape}; }
  tide::tensor_view<std::int32_t const, tide::cuda> dv(tide::shape shape) const { return {d, shape}; }
};

template <class T>
double bound(double f32) {
  return std::is_same_v<T, float> ? f32 : 2e-2;
}
// Every element within rtol of the host's (plus atol, for values near 0).
template <class T>
void expect_each(twin<T> const& t, double rtol, double atol, char const* what, char const* shape) {
  double const r = t.elementwise(rtol, atol);
  bool const ok = r <= 1.0;
  std::printf("%s %s %s: %.3g of the bound (rtol %.3g, atol %.3g)%s\n", what,
              std::is_same_v<T, float> ? "f32" : "bf16", shape, r, rtol, atol, ok ? "" : "  FAILED");
  failures += !ok;
}

template <class T>
void expect(twin<T> const& t, double tolerance, char const* what, char const* shape) {
  double const r = t.relative_difference();
  bool const ok = r <= tolerance;
  std::printf("%s %s %s: %.3g (bound %.3g)%s\n", what, std::is_same_v<T, float> ? "f32" : "bf16", shape, r, tolerance,
              ok ? "" : "  FAILED");
  failures += !ok;
}

struct runner {
  tide::thread_pool pool{static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  tide::exec<tide::host> hx{pool};
  tide::memory::compute_context<tide::cuda> ctx{};
  tide::exec<tide::cuda> dx = ctx.exec_with(pool);
  void sync() { TIDE_CUDA_CHECK(cudaStreamSynchronize(dx.stream)); }
};

// path: "lt" (cuBLASLt, fused epilogues), "gemmex" (no cuBLASLt handle: the fallback), "tf32",
// "no-bias" (cuBLASLt without bias: no epilogue, GELU_AUX alone).
template <class T>
void matmul(runner& r, index_t N, index_t C, index_t OC, char const* shape, char const* path = "lt") {
  std::mt19937 rng(1);
  twin<T> inp({N, C}, rng, 1.f), w({OC, C}, rng, 0.02f), bias({OC}, rng, 0.1f), out({N, OC}, rng, 0.f);
  bool const with_bias = std::string(path) != "no-bias";
  twin<T> gout({N, OC}, rng, 0.f), pre({N, OC}, rng, 0.f);
  twin<T> dout({N, OC}, rng, 1.f), dinp({N, C}, rng, 0.f), dw({OC, C}, rng, 0.f), db({OC}, rng, 0.f);
  tide::exec<tide::cuda> dx = r.dx;
  if (path[0] == 'g') dx.lt = nullptr;
  dx.tf32 = path[0] == 't';
  // Without bias: the LM head's forward (no epilogue) and GELU_AUX alone.
  auto const hb = with_bias ? bias.hc() : tide::tensor_view<T const, tide::host>{};
  auto const db_ = with_bias ? bias.dc() : tide::tensor_view<T const, tide::cuda>{};
  auto const hdb = with_bias ? db.hv() : tide::tensor_view<T, tide::host>{};
  auto const ddb = with_bias ? db.dv() : tide::tensor_view<T, tide::cuda>{};
  tide::kernels::matmul_forward(r.hx, out.hv(), inp.hc(), w.hc(), hb);
  tide::kernels::matmul_forward(dx, out.dv(), inp.dc(), w.dc(), db_);
  tide::kernels::matmul_forward_gelu(r.hx, gout.hv(), pre.hv(), inp.hc(), w.hc(), hb);
  tide::kernels::matmul_forward_gelu(dx, gout.dv(), pre.dv(), inp.dc(), w.dc(), db_);
  tide::kernels::matmul_backward(r.hx, dinp.hv(), dw.hv(), hdb, dout.hc(), inp.hc(), w.hc());
  tide::kernels::matmul_backward(dx, dinp.dv(), dw.dv(), ddb, dout.dc(), inp.dc(), w.dc());
  r.sync();
  double const tol = path[0] == 't' && std::is_same_v<T, float> ? 2e-2 : bound<T>(1e-4);
  std::string const at = std::string(shape) + " " + path;
  expect(out, tol, "matmul_forward", at.c_str());
  expect(pre, tol, "matmul_forward_gelu pre", at.c_str());
  expect(gout, tol, "matmul_forward_gelu out", at.c_str());
  expect(dinp, tol, "matmul_backward dinp", at.c_str());
  expect(dw, tol, "matmul_backward dweight", at.c_str());
  if (with_bias) expect(db, tol, "matmul_backward dbias", at.c_str());  // without: nothing passed, nothing to see
  if (path[0] == 'l' && dx.lt_algos != nullptr) {
    // The forward again, its algorithm from the compute context's cache this time, and once with
    // the heuristic asked afresh: the same bits (the answer depends on the shape alone).
    std::size_t const cached = dx.lt_algos->size();
    twin<T> again({N, OC}, rng, 0.f), fresh({N, OC}, rng, 0.f);
    tide::kernels::matmul_forward(dx, again.dv(), inp.dc(), w.dc(), db_);
    tide::exec<tide::cuda> uncached = dx;
    uncached.lt_algos = nullptr;
    tide::kernels::matmul_forward(uncached, fresh.dv(), inp.dc(), w.dc(), db_);
    r.sync();
    bool const same = again.device_bits() == out.device_bits() && fresh.device_bits() == out.device_bits();
    bool const kept = cached > 0 && dx.lt_algos->size() == cached;  // no new shape: no new entry
    std::printf("matmul_forward %s %s: cached algorithm, fresh heuristic and first call give the same bits: %s%s\n",
                std::is_same_v<T, float> ? "f32" : "bf16", at.c_str(), same && kept ? "yes" : "no",
                same && kept ? "" : "  FAILED");
    failures += !(same && kept);
  }
}

template <class T>
void layernorm(runner& r, index_t N, index_t C, char const* shape) {
  std::mt19937 rng(2);
  twin<T> inp({N, C}, rng, 1.f), w({C}, rng, 1.f), b({C}, rng, 0.1f), out({N, C}, rng, 0.f);
  twin<float> mean({N}, rng, 0.f), rstd({N}, rng, 0.f);
  twin<T> dout({N, C}, rng, 1.f), dinp({N, C}, rng, 0.f), dw({C}, rng, 0.f), db({C}, rng, 0.f);
  tide::kernels::layernorm_forward(r.hx, out.hv(), mean.hv(), rstd.hv(),
                                   inp.hc(), w.hc(), b.hc());
  tide::kernels::layernorm_forward(r.dx, out.dv(), mean.dv(), rstd.dv(),
                                   inp.dc(), w.dc(), b.dc());
  std::vector<std::byte> hws(tide::kernels::layernorm_backward_scratch_bytes(r.hx, N, C) + 256);
  void* dws = nullptr;
  std::size_t const dbytes = tide::kernels::layernorm_backward_scratch_bytes(r.dx, N, C);
  TIDE_CUDA_CHECK(cudaMalloc(&dws, std::max<std::size_t>(dbytes, 1)));
  auto* const aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(hws.data()) + 255) / 256 * 256);
  tide::kernels::layernorm_backward(r.hx, dinp.hv(), dw.hv(), db.hv(),
                                    dout.hc(), inp.hc(), w.hc(),
                                    mean.hc(), rstd.hc(),
                                    tide::kernels::scratch<tide::host>{aligned, hws.size() - 256});
  tide::kernels::layernorm_backward(r.dx, dinp.dv(), dw.dv(), db.dv(),
                                    dout.dc(), inp.dc(), w.dc(),
                                    mean.dc(), rstd.dc(),
                                    tide::kernels::scratch<tide::cuda>{static_cast<std::byte*>(dws), dbytes});
  r.sync();
  TIDE_CUDA_CHECK(cudaFree(dws));
  expect(out, bound<T>(1e-5), "layernorm_forward", shape);
  expect(dinp, bound<T>(1e-5), "layernorm_backward dinp", shape);
  expect(dw, bound<T>(1e-5), "layernorm_backward dweight", shape);
  expect(db, bound<T>(1e-5), "layernorm_backward dbias", shape);
}

template <class T>
void gelu(runner& r, index_t N, char const* shape) {
  std::mt19937 rng(3);
  twin<T> inp({N}, rng, 2.f), out({N}, rng, 0.f);
  tide::kernels::gelu_forward(r.hx, out.hv(), inp.hc());
  tide::kernels::gelu_forward(r.dx, out.dv(), inp.dc());
  r.sync();
  expect(out, bound<T>(1e-5), "gelu_forward", shape);
}

template <class T>
void residual(runner& r, index_t N, char const* shape) {
  std::mt19937 rng(5);
  twin<T> a({N}, rng, 1.f), b({N}, rng, 1.f), out({N}, rng, 0.f), dout({N}, rng, 1.f);
  twin<T> da({N}, rng, 1.f), db({N}, rng, 1.f);  // accumulated into
  tide::kernels::residual_forward(r.hx, out.hv(), a.hc(), b.hc());
  tide::kernels::residual_forward(r.dx, out.dv(), a.dc(), b.dc());
  tide::kernels::residual_backward(r.hx, da.hv(), db.hv(), dout.hc());
  tide::kernels::residual_backward(r.dx, da.dv(), db.dv(), dout.dc());
  r.sync();
  expect(out, 0.0, "residual_forward", shape);
  expect(da, 0.0, "residual_backward da", shape);
  expect(db, 0.0, "residual_backward db", shape);
}

template <class T>
void softmax(runner& r, index_t rows, index_t L, char const* shape) {
  std::mt19937 rng(6);
  float const scale = 0.125f;
  twin<T> x({rows, L}, rng, 4.f), y({rows, L}, rng, 0.f), yc({rows / L, L, L}, rng, 0.f);
  twin<T> xc({rows / L, L, L}, rng, 4.f), dy({rows, L}, rng, 1.f), dx({rows, L}, rng, 0.f);
  tide::kernels::softmax_forward(r.hx, y.hv(), x.hc(), scale);
  tide::kernels::softmax_forward(r.dx, y.dv(), x.dc(), scale);
  tide::kernels::softmax_forward_causal(r.hx, yc.hv(), xc.hc(), scale);
  tide::kernels::softmax_forward_causal(r.dx, yc.dv(), xc.dc(), scale);
  r.sync();
  expect(y, bound<T>(1e-5), "softmax_forward", shape);
  expect(yc, bound<T>(1e-5), "softmax_forward_causal", shape);
  // The backward from the host's probabilities on both sides, so only the backward is compared.
  TIDE_CUDA_CHECK(cudaMemcpy(y.d, y.h.data(), y.h.size() * sizeof(T), cudaMemcpyHostToDevice));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  tide::kernels::softmax_backward(r.hx, dx.hv(), y.hc(), dy.hc(), scale);
  tide::kernels::softmax_backward(r.dx, dx.dv(), y.dc(), dy.dc(), scale);
  r.sync();
  expect(dx, bound<T>(1e-5), "softmax_backward", shape);
}

// One Adam step and one SGD step (momentum, Nesterov) on a flat chunk of n parameters (f32
// masters, gradients of G; with G = bf16 a bf16 working copy too), from the same state as AdamW's.
template <class G>
void adam_and_sgd(runner& r, index_t n, char const* shape) {
  std::mt19937 rng(8);
  twin<float> p({n}, rng, 0.02f), m({n}, rng, 1e-3f), v({n}, rng, 1e-2f), q({n}, rng, 0.02f), buf({n}, rng, 1e-3f);
  twin<G> g({n}, rng, 1e-2f), wa({n}, rng, 0.f), ws({n}, rng, 0.f);
  for (auto& x : v.h) x = x * x;  // v >= 0
  TIDE_CUDA_CHECK(cudaMemcpy(v.d, v.h.data(), v.h.size() * sizeof(float), cudaMemcpyHostToDevice));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  tide::kernels::adam_hparams const ha{.lr = 1e-3f, .weight_decay = 0.01f};
  tide::kernels::sgd_hparams const hs{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = true};
  if constexpr (std::is_same_v<G, float>) {
    tide::kernels::adam(r.hx, ha, 3, p.hv(), g.hc(), m.hv(), v.hv(), 0.5f);
    tide::kernels::adam(r.dx, ha, 3, p.dv(), g.dc(), m.dv(), v.dv(), 0.5f);
    tide::kernels::sgd(r.hx, hs, 3, q.hv(), g.hc(), buf.hv(), 0.5f);
    tide::kernels::sgd(r.dx, hs, 3, q.dv(), g.dc(), buf.dv(), 0.5f);
  } else {
    tide::kernels::adam(r.hx, ha, 3, p.hv(), g.hc(), m.hv(), v.hv(), wa.hv(), 0.5f);
    tide::kernels::adam(r.dx, ha, 3, p.dv(), g.dc(), m.dv(), v.dv(), wa.dv(), 0.5f);
    tide::kernels::sgd(r.hx, hs, 3, q.hv(), g.hc(), buf.hv(), ws.hv(), 0.5f);
    tide::kernels::sgd(r.dx, hs, 3, q.dv(), g.dc(), buf.dv(), ws.dv(), 0.5f);
  }
  r.sync();
  std::string const at = std::string(shape) + (std::is_same_v<G, float> ? " f32 grads" : " bf16 grads");
  expect(p, 1e-6, "adam p", at.c_str());
  expect(m, 1e-6, "adam m", at.c_str());
  expect(v, 1e-6, "adam v", at.c_str());
  expect(q, 1e-6, "sgd p", at.c_str());
  expect(buf, 1e-6, "sgd momentum", at.c_str());
  if constexpr (!std::is_same_v<G, float>) {
    expect(wa, 2e-2, "adam working copy", at.c_str());
    expect(ws, 2e-2, "sgd working copy", at.c_str());
  }
}

// path: "gemm" (tensor cores through cuBLAS: ex.blas set) or "cuda-cores" (the flash-style
// kernels: ex.blas null).
template <class T>
void attention(runner& r, index_t B, index_t T_, index_t C, index_t NH, char const* shape, char const* path = "gemm") {
  std::mt19937 rng(4);
  tide::exec<tide::cuda> dx = r.dx;
  if (path[0] == 'c') dx.blas = nullptr;
  if (path[0] == 'f') dx.flash_attention = true;  // bf16: forward and backward fused (WMMA)
  std::string const at = std::string(shape) + " " + path;
  twin<T> qkv({B, T_, 3 * C}, rng, 1.f), out({B, T_, C}, rng, 0.f), dout({B, T_, C}, rng, 1.f),
      dqkv({B, T_, 3 * C}, rng, 0.1f);  // not 0: the gradient must be added (+=), not written
  twin<float> lse({B, NH, T_}, rng, 0.f);
  auto scratch_h = [&](std::size_t bytes) {
    return tide::kernels::scratch<tide::host>{
        static_cast<std::byte*>(::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{256})), bytes};
  };
  auto const fh = scratch_h(tide::kernels::attention_forward_scratch_bytes(r.hx, B, T_, C, NH));
  auto const bh = scratch_h(tide::kernels::attention_backward_scratch_bytes(r.hx, B, T_, C, NH));
  std::size_t const fd_bytes = tide::kernels::attention_forward_scratch_bytes(dx, B, T_, C, NH);
  std::size_t const bd_bytes = tide::kernels::attention_backward_scratch_bytes(dx, B, T_, C, NH);
  void* fd = nullptr;
  void* bd = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&fd, std::max<std::size_t>(fd_bytes, 1)));
  TIDE_CUDA_CHECK(cudaMalloc(&bd, std::max<std::size_t>(bd_bytes, 1)));
  tide::kernels::attention_forward(r.hx, out.hv(), lse.hv(), qkv.hc(), NH,
                                   fh);
  tide::kernels::attention_forward(dx, out.dv(), lse.dv(), qkv.dc(), NH,
                                   tide::kernels::scratch<tide::cuda>{static_cast<std::byte*>(fd), fd_bytes});
  tide::kernels::attention_backward(r.hx, dqkv.hv(), dout.hc(), qkv.hc(),
                                    out.hc(), lse.hc(), NH, bh);
  // The device's backward reads the device's forward outputs (as training does).
  tide::kernels::attention_backward(dx, dqkv.dv(), dout.dc(), qkv.dc(),
                                    out.dc(), lse.dc(), NH,
                                    tide::kernels::scratch<tide::cuda>{static_cast<std::byte*>(bd), bd_bytes});
  r.sync();
  TIDE_CUDA_CHECK(cudaFree(fd));
  TIDE_CUDA_CHECK(cudaFree(bd));
  ::operator delete(fh.data, std::align_val_t{256});
  ::operator delete(bh.data, std::align_val_t{256});
  expect(out, bound<T>(1e-4), "attention_forward", at.c_str());
  expect(lse, 1e-4, "attention_forward lse", at.c_str());
  expect(dqkv, bound<T>(1e-4), "attention_backward dqkv", at.c_str());
}

// Logits (N, Vp) of which the first V are the vocabulary (the padding random too); dlogits
// written into a buffer of NaNs (the padding must become 0), and in place over a copy of the
// logits, as the model calls it. dlogits element by element: each is (p - [j == t]) / N, and most
// p are tiny at V = 50257, which a comparison against the largest would not see.
template <class T>
void classifier(runner& r, index_t N, index_t V, index_t Vp, char const* shape) {
  std::mt19937 rng(5);
  twin<T> logits({N, Vp}, rng, 2.f), dlogits({N, Vp}, rng, 0.f);
  twin<T> inplace({N, Vp}, rng, 0.f);
  inplace.h = logits.h;
  TIDE_CUDA_CHECK(cudaMemcpy(inplace.d, logits.d, logits.h.size() * sizeof(T), cudaMemcpyDeviceToDevice));
  dlogits.fill(NAN);
  twin<float> losses({N}, rng, 0.f), losses2({N}, rng, 0.f);
  ints targets(static_cast<std::size_t>(N), static_cast<std::int32_t>(V), rng);
  tide::kernels::fused_classifier(r.hx, dlogits.hv(), losses.hv(), logits.hc(), targets.hv({N}), V);
  tide::kernels::fused_classifier(r.dx, dlogits.dv(), losses.dv(), logits.dc(), targets.dv({N}), V);
  tide::kernels::fused_classifier(r.hx, inplace.hv(), losses2.hv(), inplace.hc(), targets.hv({N}), V);
  tide::kernels::fused_classifier(r.dx, inplace.dv(), losses2.dv(), inplace.dc(), targets.dv({N}), V);
  r.sync();
  // f32: a probability is e^(x - m) / s with s's reordering error (sqrt(V) / 2 + 8) u and a few
  // ulp more: 1e-4 of each element; bf16: its rounding, 2^-8, doubled.
  double const rtol = std::is_same_v<T, float> ? 1e-4 : 8e-3, atol = 1e-30;
  std::string const at = std::string(shape), in_place = at + " in place";
  expect(losses, 1e-5, "fused_classifier losses", at.c_str());
  expect_each(dlogits, rtol, atol, "fused_classifier dlogits", at.c_str());
  expect(losses2, 1e-5, "fused_classifier losses", in_place.c_str());
  expect_each(inplace, rtol, atol, "fused_classifier dlogits", in_place.c_str());
}

// x (B, T, C) = wte[tokens] + wpe[:T]; dwte, dwpe += from dx.
template <class T>
void embedding(runner& r, index_t B, index_t T_, index_t C, index_t V, char const* shape) {
  std::mt19937 rng(6);
  twin<T> wte({V, C}, rng, 0.02f), wpe({T_, C}, rng, 0.01f), x({B, T_, C}, rng, 0.f);
  // Gradients start non-zero: the backward adds (the model adds the tied head's share first).
  twin<T> dx({B, T_, C}, rng, 1.f), dwte({V, C}, rng, 0.01f), dwpe({T_, C}, rng, 0.01f);
  ints tokens(static_cast<std::size_t>(B * T_), static_cast<std::int32_t>(V), rng);
  tide::kernels::encoder_forward(r.hx, x.hv(), tokens.hv({B, T_}), wte.hc(), wpe.hc());
  tide::kernels::encoder_forward(r.dx, x.dv(), tokens.dv({B, T_}), wte.dc(), wpe.dc());
  tide::kernels::encoder_backward(r.hx, dwte.hv(), dwpe.hv(), dx.hv(), tokens.hv({B, T_}));
  std::size_t const bytes = tide::kernels::encoder_backward_scratch_bytes(r.dx, B, T_, C, V);
  void* ws = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&ws, std::max<std::size_t>(bytes, 1)));
  tide::kernels::encoder_backward(r.dx, dwte.dv(), dwpe.dv(), dx.dv(), tokens.dv({B, T_}),
                                  tide::kernels::scratch<tide::cuda>{static_cast<std::byte*>(ws), bytes});
  r.sync();
  TIDE_CUDA_CHECK(cudaFree(ws));
  expect(x, 0.0, "encoder_forward", shape);
  expect(dwte, bound<T>(1e-6), "encoder_backward dwte", shape);
  expect(dwpe, bound<T>(1e-6), "encoder_backward dwpe", shape);
}

// One AdamW step on a flat chunk of n parameters (f32 masters, gradients of G), then the norm.
template <class G>
void adamw_and_norm(runner& r, index_t n, char const* shape) {
  std::mt19937 rng(7);
  twin<float> p({n}, rng, 0.02f), m({n}, rng, 1e-3f), v({n}, rng, 1e-2f);
  twin<G> g({n}, rng, 1e-2f);
  for (auto& x : v.h) x = x * x;  // v >= 0: squares of N(0, ...) draws
  for (auto& x : m.h) x = std::abs(x);
  TIDE_CUDA_CHECK(cudaMemcpy(v.d, v.h.data(), v.h.size() * sizeof(float), cudaMemcpyHostToDevice));
  TIDE_CUDA_CHECK(cudaMemcpy(m.d, m.h.data(), m.h.size() * sizeof(float), cudaMemcpyHostToDevice));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  tide::kernels::adamw_hparams const hp{.lr = 1e-3f, .weight_decay = 0.1f};
  twin<G> working({n}, rng, 0.f);  // bf16: the working copy the trainer's bf16 model reads
  if constexpr (std::is_same_v<G, float>) {
    tide::kernels::adamw(r.hx, hp, 3, p.hv(), g.hc(), m.hv(), v.hv(), 0.5f);
    tide::kernels::adamw(r.dx, hp, 3, p.dv(), g.dc(), m.dv(), v.dv(), 0.5f);
  } else {
    tide::kernels::adamw(r.hx, hp, 3, p.hv(), g.hc(), m.hv(), v.hv(), working.hv(), 0.5f);
    tide::kernels::adamw(r.dx, hp, 3, p.dv(), g.dc(), m.dv(), v.dv(), working.dv(), 0.5f);
  }
  double const want = tide::kernels::global_grad_norm(r.hx, g.hc());
  tide::kernels::grad_norm_scratch* s = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&s, sizeof *s));
  tide::kernels::global_grad_norm(r.dx, g.dc(), s);
  double got = 0;
  TIDE_CUDA_CHECK(cudaMemcpyAsync(&got, &s->norm, sizeof got, cudaMemcpyDeviceToHost, r.dx.stream));
  r.sync();
  TIDE_CUDA_CHECK(cudaFree(s));
  char const* type = std::is_same_v<G, float> ? "f32 grads" : "bf16 grads";
  std::string const at = std::string(shape) + " " + type;
  expect(p, 1e-6, "adamw p", at.c_str());
  expect(m, 1e-6, "adamw m", at.c_str());
  expect(v, 1e-6, "adamw v", at.c_str());
  if constexpr (!std::is_same_v<G, float>) expect(working, 2e-2, "adamw working copy", at.c_str());
  double const gap = std::abs(got - want) / want;
  bool const ok = std::isfinite(got) && gap <= 1e-9;
  std::printf("global_grad_norm %s: %.3g (bound 1e-09)%s\n", at.c_str(), gap, ok ? "" : "  FAILED");
  failures += !ok;
}

template <class T>
void all(runner& r) {
  matmul<T>(r, 2048, 768, 3072, "2048x768x3072");
  matmul<T>(r, 2048, 768, 3072, "2048x768x3072", "gemmex");
  matmul<T>(r, 37, 24, 40, "37x24x40");
  matmul<T>(r, 37, 24, 40, "37x24x40", "gemmex");
  matmul<T>(r, 37, 24, 40, "37x24x40", "no-bias");
  // OC = 36: cuBLASLt takes the forward, the GELU's aux (rows of 36, not a multiple of 8) falls back.
  matmul<T>(r, 37, 24, 36, "37x24x36");
  if constexpr (std::is_same_v<T, float>) matmul<T>(r, 2048, 768, 3072, "2048x768x3072", "tf32");
  layernorm<T>(r, 2048, 768, "2048x768");
  layernorm<T>(r, 37, 40, "37x40");
  gelu<T>(r, 2048 * 3072, "2048x3072");
  gelu<T>(r, 1001, "1001");
  attention<T>(r, 2, 1024, 768, 12, "B2 T1024 C768 NH12");
  attention<T>(r, 2, 1024, 768, 12, "B2 T1024 C768 NH12", "cuda-cores");
  attention<T>(r, 1, 37, 48, 4, "B1 T37 C48 NH4");
  attention<T>(r, 1, 37, 48, 4, "B1 T37 C48 NH4", "cuda-cores");
  if constexpr (std::is_same_v<T, tide::bf16>) {  // fused: GPT-2's HS 64, HS 16, HS 128
    attention<T>(r, 2, 1024, 768, 12, "B2 T1024 C768 NH12", "flash");
    attention<T>(r, 1, 37, 64, 4, "B1 T37 C64 NH4", "flash");
    attention<T>(r, 3, 200, 256, 2, "B3 T200 C256 NH2", "flash");
  }
  classifier<T>(r, 512, 50257, 50304, "N512 V50257 Vp50304");
  classifier<T>(r, 37, 1000, 1001, "N37 V1000 Vp1001");
  embedding<T>(r, 8, 1024, 768, 50304, "B8 T1024 C768 V50304");
  embedding<T>(r, 3, 37, 37, 100, "B3 T37 C37 V100");
  adamw_and_norm<T>(r, index_t{1} << 22, "n 4194304");
  adamw_and_norm<T>(r, 1001, "n 1001");
  adam_and_sgd<T>(r, index_t{1} << 22, "n 4194304");
  adam_and_sgd<T>(r, 1001, "n 1001");
  residual<T>(r, 2048 * 768, "2048x768");
  residual<T>(r, 1001, "1001");
  softmax<T>(r, 2 * 12 * 1024, 1024, "B2 NH12 T1024");
  softmax<T>(r, 37 * 37, 37, "37x37x37");
}

}  // namespace

int main() {
  if (int const code = tide::test::gpu_or_skip(); code != 0) return code;
  runner r;
  all<float>(r);
  all<tide::bf16>(r);
  std::printf("%s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
