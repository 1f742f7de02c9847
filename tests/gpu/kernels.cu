// The CUDA kernels against the host's, at GPT-2 124M shapes (B T = 2048 rows, C = 768, 4 C =
// 3072, NH = 12, T = 1024) and at odd ones, in f32 and bf16: matmul forward (with bias, and with
// bias and GELU) and backward, on cuBLASLt with fused epilogues and on the cublasGemmEx fallback
// (an exec<cuda> without the cuBLASLt handle), and f32 in TF32; LayerNorm forward and backward,
// GELU, attention forward and backward on tensor cores (cuBLAS) and on CUDA cores. The host kernels are
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
#include <tide/kernels/attention/attention.hpp>
#include <tide/kernels/gelu/gelu.hpp>
#include <tide/kernels/layernorm/layernorm.hpp>
#include <tide/kernels/matmul/matmul.hpp>

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

template <class T>
double bound(double f32) {
  return std::is_same_v<T, float> ? f32 : 2e-2;
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
  expect(db, tol, "matmul_backward dbias", at.c_str());
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

// path: "gemm" (tensor cores through cuBLAS: ex.blas set) or "cuda-cores" (the flash-style
// kernels: ex.blas null).
template <class T>
void attention(runner& r, index_t B, index_t T_, index_t C, index_t NH, char const* shape, char const* path = "gemm") {
  std::mt19937 rng(4);
  tide::exec<tide::cuda> dx = r.dx;
  if (path[0] == 'c') dx.blas = nullptr;
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
