// bench/gpu/gpt2: GPT-2 124M in bf16 (fp32 masters), B = 8, T = 1024, trained by make_trainer on
// tide::cuda with AdamW, resident and under chunked<belady> with a quarter of the model data's
// bytes on the device; and a cuBLAS bf16 GEMM probe (8192^3), the card's own roofline, in the same
// run. Prints harness JSON (bench/harness.hpp):
//   gpt2_124m_bf16_tokens_per_s       tide resident, tokens/s; the anchor is the GEMM probe's
//                                     tokens/s at 6 N + 12 L T C flops per token (so the ratio is
//                                     the MFU against the probe)
//   offload_4x_vs_resident_cuda       chunked<belady> at a quarter of the model data over resident
//   flash_attention_vs_gemm_cuda      resident with attention fused on tensor cores
//                                     (gpt_spec::flash_attention) over resident on cuBLAS's GEMMs;
//                                     both runs' losses in the detail (the same batches)
//   adamw_cuda_vs_copy_probe          the CUDA AdamW kernel's bytes per second over GPT-2's 124M
//                                     parameters (fp32 p, m, v; bf16 gradient and working copy: 28
//                                     B a parameter), against a device-to-device cudaMemcpy of as
//                                     many bytes (read + write) in the same run
// scripts/gpu-check runs it and measures PyTorch's GPT-2 in the same run for
// gpt2_124m_bf16_vs_torch_compile. TIDE_BENCH_QUICK=1: a 2-layer GPT of 256 channels, 3 steps.
// Exit 77 without a device. Compiled by nvcc in the suite (cuda/bench_gpu_gpt2.build); it has
// never run: no GPU has run tide yet (docs/cuda.md).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <tide/cuda.cuh>
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

#include "../../tests/gpu/skip.cuh"
#include "../harness.hpp"

namespace {

namespace off = tide::offload;
using tide::bf16;

struct shape {
  tide::nn::gpt_config config;
  tide::index_t batch, seq;
  int steps;  // timed: the median of the steps after the first two (the trace, the warm-up)
};

struct run {
  double seconds_per_step = 0;
  std::size_t peak = 0;
  float first_loss = 0, last_loss = 0;
};

template <class Policy>
run train(shape const& s, Policy const& policy, bool flash_attention = false) {
  auto t = tide::train::make_trainer(
      tide::nn::gpt_spec<tide::cuda, bf16>{
          .config = s.config, .options = {.seed = 1}, .flash_attention = flash_attention},
      policy, tide::optim::adamw{.lr = 3e-4f, .weight_decay = 0.1f});
  std::size_t const n = static_cast<std::size_t>(s.batch * s.seq);
  std::vector<std::int32_t> host(2 * n);
  std::mt19937 rng(7);
  for (auto& x : host) x = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(s.config.vocab));
  std::int32_t* device = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(std::int32_t)));
  TIDE_CUDA_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());  // landed before the trainer's stream reads them
  using view = tide::tensor_view<std::int32_t const, tide::cuda>;
  typename decltype(t)::batch_type const b{view(device, {s.batch, s.seq}), view(device + n, {s.batch, s.seq})};
  run out;
  std::vector<double> times;
  for (int i = 0; i < s.steps + 2; ++i) {
    auto const t0 = std::chrono::steady_clock::now();
    auto const st = t.step(b);  // returns after the step's work (the loss is read back)
    double const sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i == 0) out.first_loss = st.loss;
    out.last_loss = st.loss;
    out.peak = std::max(out.peak, st.device_bytes);
    if (i >= 2) times.push_back(sec);
  }
  TIDE_CUDA_CHECK(cudaFree(device));
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  out.seconds_per_step = times[times.size() / 2];
  return out;
}

// bf16 GEMM flops per second (fp32 accumulation), m = n = k = dim: the card's own roofline.
double gemm_probe(int dim) {
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  std::size_t const elems = static_cast<std::size_t>(dim) * static_cast<std::size_t>(dim);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&a, elems * 2));
  TIDE_CUDA_CHECK(cudaMalloc(&b, elems * 2));
  TIDE_CUDA_CHECK(cudaMalloc(&c, elems * 2));
  TIDE_CUDA_CHECK(cudaMemset(a, 0, elems * 2));
  TIDE_CUDA_CHECK(cudaMemset(b, 0, elems * 2));
  float const one = 1.f, zero = 0.f;
  auto gemm = [&] {
    (void)cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, dim, dim, dim, &one, a, CUDA_R_16BF, dim, b, CUDA_R_16BF, dim, &zero,
                       c, CUDA_R_16BF, dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  double const sec = tide::bench::median_seconds(
      [&] {
        for (int i = 0; i < 10; ++i) gemm();
        TIDE_CUDA_CHECK(cudaDeviceSynchronize());
      },
      5, 1);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cublasDestroy(h);
  return 10.0 * 2.0 * static_cast<double>(dim) * static_cast<double>(dim) * static_cast<double>(dim) / sec;
}

// Bytes per second, read + written: the CUDA AdamW step over n parameters (28 B each) and a
// device-to-device copy moving as many bytes.
struct adamw_probe_result {
  double adamw = 0, copy = 0;
};
adamw_probe_result adamw_and_copy(std::size_t n) {
  tide::thread_pool pool{1};
  tide::memory::compute_context<tide::cuda> ctx;
  tide::exec<tide::cuda> const ex = ctx.exec_with(pool);
  float *p = nullptr, *m = nullptr, *v = nullptr;
  bf16 *g = nullptr, *w = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&p, n * 4));
  TIDE_CUDA_CHECK(cudaMalloc(&m, n * 4));
  TIDE_CUDA_CHECK(cudaMalloc(&v, n * 4));
  TIDE_CUDA_CHECK(cudaMalloc(&g, n * 2));
  TIDE_CUDA_CHECK(cudaMalloc(&w, n * 2));
  for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v)})
    TIDE_CUDA_CHECK(cudaMemset(q, 0, n * 4));
  TIDE_CUDA_CHECK(cudaMemset(g, 0, n * 2));
  auto const i = static_cast<tide::index_t>(n);
  tide::kernels::adamw_hparams const hp{.lr = 3e-4f, .weight_decay = 0.1f};
  std::int64_t t = 1;
  double const step = tide::bench::median_seconds(
      [&] {
        for (int k = 0; k < 10; ++k)
          tide::kernels::adamw(ex, hp, t++, tide::tensor_view<float, tide::cuda>(p, {i}),
                               tide::tensor_view<bf16 const, tide::cuda>(g, {i}),
                               tide::tensor_view<float, tide::cuda>(m, {i}), tide::tensor_view<float, tide::cuda>(v, {i}),
                               tide::tensor_view<bf16, tide::cuda>(w, {i}));
        ctx.synchronize();
      },
      5, 1);
  // The copy: 14 n bytes read and 14 n written (p <- m, m <- v, v <- p, w <- g), 28 n bytes moved.
  auto const copy_bytes = [&](void* to, void const* from, std::size_t bytes) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, ex.stream));
  };
  double const copy = tide::bench::median_seconds(
      [&] {
        for (int k = 0; k < 10; ++k) {
          copy_bytes(p, m, n * 4);
          copy_bytes(m, v, n * 4);
          copy_bytes(v, p, n * 4);
          copy_bytes(w, g, n * 2);
        }
        ctx.synchronize();
      },
      5, 1);
  for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v), static_cast<void*>(g),
                  static_cast<void*>(w)})
    (void)cudaFree(q);
  double const bytes = 10.0 * 28.0 * static_cast<double>(n);
  return {bytes / step, bytes / copy};
}

}  // namespace

int main() {
  if (int const code = tide::test::gpu_or_skip(); code != 0) return code;
  bool const quick = tide::bench::quick();
  shape const s = quick ? shape{{.layers = 2, .heads = 4, .channels = 256, .vocab = 50257, .max_seq = 256}, 4, 256, 3}
                        : shape{{.layers = 12, .heads = 12, .channels = 768, .vocab = 50257, .max_seq = 1024}, 8, 1024, 10};
  auto const params = tide::nn::gpt_parameters(s.config, tide::dtype::bf16);
  double const n_params = static_cast<double>(params.bytes()) / 2.0;
  double const tokens = static_cast<double>(s.batch * s.seq);
  // 6 N per token for the products with the weights, 12 L T C for attention's two (T x T) products.
  double const flops_per_token = 6.0 * n_params + 12.0 * s.config.layers * static_cast<double>(s.seq) *
                                                      static_cast<double>(s.config.channels);
  double const probe = gemm_probe(quick ? 2048 : 8192);
  {
    std::size_t const n = static_cast<std::size_t>(n_params);
    adamw_probe_result const a = adamw_and_copy(n);
    tide::bench::figure{.bench = "gpu_gpt2",
                        .name = "adamw_cuda_vs_copy_probe",
                        .value = a.adamw / 1e9,
                        .unit = "GB/s",
                        .anchor = "cudaMemcpy device to device moving the same bytes, same run",
                        .anchor_value = a.copy / 1e9,
                        .goal = 0.8,
                        .detail = {{"parameters", static_cast<double>(n)}, {"bytes_per_parameter", 28.0}}}
        .print();
  }

  run const resident = train(s, off::resident{});
  double const resident_tps = tokens / resident.seconds_per_step;
  tide::bench::figure{.bench = "gpu_gpt2",
                      .name = "gpt2_124m_bf16_tokens_per_s",
                      .value = resident_tps,
                      .unit = "tokens/s",
                      .anchor = "bf16 cuBLAS GEMM probe at 6 N + 12 L T C flops per token",
                      .anchor_value = probe / flops_per_token,
                      .goal = 0.45,
                      .detail = {{"params", n_params},
                                 {"seconds_per_step", resident.seconds_per_step},
                                 {"gemm_probe_tflops", probe / 1e12},
                                 {"device_peak_bytes", static_cast<double>(resident.peak)},
                                 {"first_loss", resident.first_loss},
                                 {"last_loss", resident.last_loss}}}
      .print();

  run const flash = train(s, off::resident{}, true);
  tide::bench::figure{.bench = "gpu_gpt2",
                      .name = "flash_attention_vs_gemm_cuda",
                      .value = tokens / flash.seconds_per_step,
                      .unit = "tokens/s",
                      .anchor = "resident with attention on cuBLAS GEMMs, same GPU, same run",
                      .anchor_value = resident_tps,
                      .detail = {{"first_loss", flash.first_loss},
                                 {"last_loss", flash.last_loss},
                                 {"gemm_first_loss", resident.first_loss},
                                 {"gemm_last_loss", resident.last_loss}}}
      .print();

  // Model data: bf16 parameters and gradients, fp32 masters, m and v (16 B per parameter).
  double const model = 16.0 * n_params;
  std::size_t const activations = resident.peak > static_cast<std::size_t>(model)
                                      ? resident.peak - static_cast<std::size_t>(model)
                                      : resident.peak / 2;
  std::size_t const budget = activations + static_cast<std::size_t>(model / 4);
  run const chunked = train(s, off::chunked<off::belady>{.device_budget = budget});
  tide::bench::figure{.bench = "gpu_gpt2",
                      .name = "offload_4x_vs_resident_cuda",
                      .value = tokens / chunked.seconds_per_step,
                      .unit = "tokens/s",
                      .anchor = "resident on the same GPU, same run",
                      .anchor_value = resident_tps,
                      .goal = 0.8,
                      .detail = {{"device_budget_bytes", static_cast<double>(budget)},
                                 {"device_peak_bytes", static_cast<double>(chunked.peak)},
                                 {"first_loss", chunked.first_loss},
                                 {"last_loss", chunked.last_loss}}}
      .print();
  return 0;
}
