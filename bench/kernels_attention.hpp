#pragma once
// Figures of the matmul and attention kernels (wired into bench/kernels.cpp):
//
//   attention_vs_sgemm  causal attention forward + backward, fp32, B=4 NH=12 T=1024 HS=64 (GPT-2
//                       124M's shape), useful GFLOP/s over OpenBLAS sgemm (n = 2048) on the same
//                       2 threads in the same run. FLOP model, per (b, h) and causal pair j <= i
//                       (T (T + 1) / 2 pairs): forward 4 HS (q.k and p v), backward 8 HS (dv, dp,
//                       dq, dk); the backward's recomputation of q.k (2 HS) and the softmax's
//                       exp are not counted. detail.flash_convention_gflops counts 2.5x the
//                       forward for the backward (FlashAttention's convention, recompute
//                       included).
//   matmul_vs_sgemm     GPT-2's MLP at N = 256 rows: fc (768 -> 3072, bias + GELU epilogue) and
//                       proj (3072 -> 768, bias), forward + backward (dinp, dweight, dbias): 6 N C OC
//                       FLOP per layer, over the same sgemm probe.
// Without BLAS (no sgemm probe) the anchor is fma_probe. TIDE_BENCH_QUICK=1 shrinks every size.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <tide/kernels/attention/attention.hpp>
#include <tide/kernels/matmul/matmul.hpp>
#include <vector>

#include "harness.hpp"
#include "roofline.hpp"

namespace tide::bench {

namespace attention_figures {

inline std::vector<float> normal_floats(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct anchor {
  char const* name;
  double gflops;
};

inline anchor probe() {
#if defined(TIDE_HAS_BLAS)
  return {"sgemm_probe", sgemm_probe_gflops()};
#else
  return {"fma_probe", fma_probe_gflops()};
#endif
}

}  // namespace attention_figures

inline void bench_attention() {
  using namespace attention_figures;
  bool const q = quick();
  anchor const a = probe();
  tide::thread_pool pool{probe_threads};
  tide::exec<tide::host> ex{pool};

  // ---- attention_vs_sgemm ----
  {
    index_t const B = q ? 1 : 4, NH = q ? 4 : 12, T = q ? 128 : 1024, HS = 64, C = NH * HS;
    auto const n = static_cast<std::size_t>(B * T);
    std::vector<float> qkv = normal_floats(n * 3 * static_cast<std::size_t>(C), 1), dout = normal_floats(n * C, 2);
    std::vector<float> out(n * C), dqkv(n * 3 * C, 0.0f), lse(static_cast<std::size_t>(B * NH * T));
    tensor_view<float> const Q{qkv.data(), {B, T, 3 * C}}, O{out.data(), {B, T, C}}, L{lse.data(), {B, NH, T}},
        DO{dout.data(), {B, T, C}}, DQ{dqkv.data(), {B, T, 3 * C}};
    int const reps = q ? 3 : 5;
    // The kernels' scratch, made once (a training loop plans it with its activations).
    tide::kernels::detail::call_scratch const fws(tide::kernels::attention_forward_scratch_bytes(ex, B, T, C, NH)),
        bws(tide::kernels::attention_backward_scratch_bytes(ex, B, T, C, NH));
    double const fwd =
        median_seconds([&] { tide::kernels::attention_forward(ex, O, L, Q, NH, fws.get()); }, reps, 1);
    double const bwd =
        median_seconds([&] { tide::kernels::attention_backward(ex, DQ, DO, Q, O, L, NH, bws.get()); }, reps, 1);
    keep(dqkv[dqkv.size() / 2]);
    double const pairs = static_cast<double>(B * NH) * static_cast<double>(T) * static_cast<double>(T + 1) / 2;
    double const fwd_flop = 4.0 * HS * pairs, bwd_flop = 8.0 * HS * pairs;
    double const gflops = (fwd_flop + bwd_flop) / (fwd + bwd) / 1e9;
    figure{.bench = "kernels",
           .name = "attention_vs_sgemm",
           .value = gflops,
           .unit = "GFLOP/s",
           .anchor = a.name,
           .anchor_value = a.gflops,
           .detail = {{"B", double(B)},
                      {"NH", double(NH)},
                      {"T", double(T)},
                      {"HS", double(HS)},
                      {"threads", double(probe_threads)},
                      {"forward_ms", fwd * 1e3},
                      {"backward_ms", bwd * 1e3},
                      {"forward_gflops", fwd_flop / fwd / 1e9},
                      {"backward_gflops", bwd_flop / bwd / 1e9},
                      {"flash_convention_gflops", 3.5 * fwd_flop / (fwd + bwd) / 1e9}}}
        .print();
  }

  // ---- matmul_vs_sgemm ----
  {
    index_t const N = q ? 64 : 256, C = q ? 128 : 768, H = 4 * C;
    auto const nc = static_cast<std::size_t>(N * C), nh = static_cast<std::size_t>(N * H),
               ch = static_cast<std::size_t>(C * H);
    std::vector<float> x = normal_floats(nc, 3), w1 = normal_floats(ch, 4, 0.02f), b1 = normal_floats(H, 5, 0.02f),
                       w2 = normal_floats(ch, 6, 0.02f), b2 = normal_floats(C, 7, 0.02f), dy = normal_floats(nc, 8);
    std::vector<float> pre(nh), h(nh), y(nc), dh(nh), dx(nc, 0.f), dw1(ch, 0.f), db1(H, 0.f), dw2(ch, 0.f), db2(C, 0.f);
    tensor_view<float> const X{x.data(), {N, C}}, W1{w1.data(), {H, C}}, B1{b1.data(), {H}}, W2{w2.data(), {C, H}},
        B2{b2.data(), {C}}, P{pre.data(), {N, H}}, Hv{h.data(), {N, H}}, Y{y.data(), {N, C}}, DY{dy.data(), {N, C}},
        DH{dh.data(), {N, H}}, DX{dx.data(), {N, C}}, DW1{dw1.data(), {H, C}}, DB1{db1.data(), {H}},
        DW2{dw2.data(), {C, H}}, DB2{db2.data(), {C}};
    namespace k = tide::kernels;
    int const reps = q ? 3 : 7;
    k::detail::call_scratch const ws(std::max({k::matmul_forward_scratch_bytes<float>(ex, N, C, H),
                                              k::matmul_forward_scratch_bytes<float>(ex, N, H, C),
                                              k::matmul_backward_scratch_bytes<float>(ex, N, H, C),
                                              k::matmul_backward_scratch_bytes<float>(ex, N, C, H)}));
    double const fwd = median_seconds(
        [&] {
          k::matmul_forward_gelu(ex, Hv, P, X, W1, B1, ws.get());
          k::matmul_forward(ex, Y, Hv, W2, B2, ws.get());
        },
        reps, 1);
    double const bwd = median_seconds(
        [&] {
          std::fill(dh.begin(), dh.end(), 0.0f);
          k::matmul_backward(ex, DH, DW2, DB2, DY, Hv, W2, ws.get());
          k::matmul_backward_gelu(ex, DX, DW1, DB1, DH, P, X, W1, ws.get());
        },
        reps, 1);
    keep(dx[nc / 2]);
    double const layer = 2.0 * static_cast<double>(N) * static_cast<double>(C) * static_cast<double>(H);
    double const gflops = 6.0 * layer / (fwd + bwd) / 1e9;
    figure{.bench = "kernels",
           .name = "matmul_vs_sgemm",
           .value = gflops,
           .unit = "GFLOP/s",
           .anchor = a.name,
           .anchor_value = a.gflops,
           .detail = {{"N", double(N)},
                      {"C", double(C)},
                      {"OC", double(H)},
                      {"threads", double(probe_threads)},
                      {"forward_ms", fwd * 1e3},
                      {"backward_ms", bwd * 1e3},
                      {"forward_gflops", 2.0 * layer / fwd / 1e9},
                      {"backward_gflops", 4.0 * layer / bwd / 1e9}}}
        .print();
  }
}

}  // namespace tide::bench
