#pragma once
// The CUDA path of the LayerNorm kernels, with the per-element math of math.hpp.
//
// Forward (and the fused residual forward): rows up to cuda_row_tuning::warp_row_max wide get a
// warp each, 8 rows per block (TurboTransformers' several rows per block: the reductions are
// warp shuffles, no __syncthreads); wider rows get the whole block and cub::BlockReduce. The
// row is read three times (sum, squared deviations, output): the second and third reads hit L1
// / L2, so DRAM sees inp once, as on the host.
//
// Backward: a block per chunk of chunk_rows rows, one row at a time, both row sums in one
// cub::BlockReduce; a thread owns the same columns on every row, so its share of dweight and
// dbias accumulates without atomics (in shared memory when 2C floats fit, else in the chunk's
// global slot). column_sums_kernel then adds the chunks' partials in chunk order. Every output
// is deterministic, independent of the device. The split backward's halves (input gradient,
// weight gradients) run the same kernel with one set of outputs each, so the same bits.

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/residual/rows.cuh"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels::detail {
TIDE_ABI_NAMESPACE_BEGIN

// This lane's share of a row's sum: packs lane, lane + RowThreads, ...
template <int RowThreads, int Width, class T>
__device__ float row_lane_sum(T const* __restrict__ x, index_t C, int lane) {
  using p = pack<T, Width>;
  float s = 0.0f;
  for (index_t j = lane; j < C / Width; j += RowThreads) {
    p const a = reinterpret_cast<p const*>(x)[j];
#pragma unroll
    for (int k = 0; k < Width; ++k) s += to_float(a.v[k]);
  }
  return s;
}

// One row: out, mean, rstd, given this lane's share of the row's sum. The RowThreads threads of
// the row call it with lane in [0, RowThreads); lane j takes packs j, j + RowThreads, ... in
// every pass, so x may have been written by the same threads just before (the fused residual):
// each reads back its own packs.
template <int RowThreads, int Width, class Sum, class T, class W>
__device__ void layernorm_forward_row(T* __restrict__ out, float* mean_out, float* rstd_out, T const* __restrict__ x,
                                      W const* __restrict__ weight, W const* __restrict__ bias, index_t C, int lane,
                                      float lane_sum, typename Sum::storage& storage) {
  using p = pack<T, Width>;
  using q = pack<W, Width>;
  index_t const packs = C / Width;
  auto const* xs = reinterpret_cast<p const*>(x);
  float const inv_c = 1.0f / static_cast<float>(C);
  float const mean = Sum::sum({{lane_sum}}, storage).v[0] * inv_c;
  float v = 0.0f;
  for (index_t j = lane; j < packs; j += RowThreads) {
    p const a = xs[j];
#pragma unroll
    for (int k = 0; k < Width; ++k) {
      float const d = to_float(a.v[k]) - mean;
      v += d * d;
    }
  }
  float const rstd = layernorm_rstd(Sum::sum({{v}}, storage).v[0] * inv_c);
  for (index_t j = lane; j < packs; j += RowThreads) {
    p const a = xs[j];
    q const w = reinterpret_cast<q const*>(weight)[j];
    q const b = reinterpret_cast<q const*>(bias)[j];
    p o;
#pragma unroll
    for (int k = 0; k < Width; ++k)
      o.v[k] = from_float<T>(layernorm_out(layernorm_xhat(to_float(a.v[k]), mean, rstd), to_float(w.v[k]), to_float(b.v[k])));
    reinterpret_cast<p*>(out)[j] = o;
  }
  if (lane == 0) {
    *mean_out = mean;
    *rstd_out = rstd;
  }
}

// out = layernorm(inp): (N, C) rows, Block / RowThreads rows per block. Width > 1: C % Width
// == 0 and every pointer aligned to its pack.
template <class T, class W, int RowThreads, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block, cuda_row_tuning::row_min_blocks)
    layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             T const* __restrict__ inp, W const* __restrict__ weight, W const* __restrict__ bias,
                             index_t N, index_t C) {
  constexpr int block = cuda_row_tuning::block;
  using sum = row_sum<block, RowThreads, 1>;
  __shared__ typename sum::storage storage;
  index_t const row = static_cast<index_t>(blockIdx.x) * (block / RowThreads) + threadIdx.x / RowThreads;
  if (row >= N) return;  // whole warps (RowThreads 32), or never (a block per row)
  int const lane = static_cast<int>(threadIdx.x % RowThreads);
  float const s = row_lane_sum<RowThreads, Width>(inp + row * C, C, lane);
  layernorm_forward_row<RowThreads, Width, sum>(out + row * C, mean + row, rstd + row, inp + row * C, weight, bias, C,
                                                lane, s, storage);
}

// residual = a + b, out = layernorm(residual), one row per RowThreads threads. residual may be a
// or b (no __restrict__ on those).
template <class T, class W, int RowThreads, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block, cuda_row_tuning::row_min_blocks)
    residual_layernorm_forward_kernel(T* residual, T* __restrict__ out, float* __restrict__ mean,
                                      float* __restrict__ rstd, T const* a, T const* b, W const* __restrict__ weight,
                                      W const* __restrict__ bias, index_t N, index_t C) {
  constexpr int block = cuda_row_tuning::block;
  using sum = row_sum<block, RowThreads, 1>;
  using p = pack<T, Width>;
  __shared__ typename sum::storage storage;
  index_t const row = static_cast<index_t>(blockIdx.x) * (block / RowThreads) + threadIdx.x / RowThreads;
  if (row >= N) return;
  int const lane = static_cast<int>(threadIdx.x % RowThreads);
  T* const res_row = residual + row * C;
  auto const* as = reinterpret_cast<p const*>(a + row * C);
  auto const* bs = reinterpret_cast<p const*>(b + row * C);
  float s = 0.0f;  // the row's sum, of the rounded residual, in the same pass
  for (index_t j = lane; j < C / Width; j += RowThreads) {
    p const x = as[j];
    p const y = bs[j];
    p r;
#pragma unroll
    for (int k = 0; k < Width; ++k) {
      r.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
      s += to_float(r.v[k]);
    }
    reinterpret_cast<p*>(res_row)[j] = r;
  }
  layernorm_forward_row<RowThreads, Width, sum>(out + row * C, mean + row, rstd + row, res_row, weight, bias, C, lane, s,
                                                storage);
}

// Which outputs layernorm_backward_kernel computes: the fused backward's, or one half of a
// backward split in two (input gradient in B, weight gradients later in W).
enum class layernorm_grads { input, weights, both };

// One block per chunk of chunk_rows rows: dinp += ..., and the chunk's dweight, dbias terms into
// partials[chunk] = (2, C) floats (see the file comment). Grads picks the outputs: `weights`
// reads neither weight nor dinp and skips the row sums; `input` writes no partials (null). Each
// output gets the same operations in every variant, so the same bits.
template <class T, class W, int Width, layernorm_grads Grads>
__global__ void __launch_bounds__(cuda_row_tuning::block, cuda_row_tuning::row_min_blocks)
    layernorm_backward_kernel(T* __restrict__ dinp, float* __restrict__ partials, T const* __restrict__ dout,
                              T const* __restrict__ inp, W const* __restrict__ weight, float const* __restrict__ mean,
                              float const* __restrict__ rstd, index_t N, index_t C, bool shared) {
  constexpr bool input = Grads != layernorm_grads::weights;
  constexpr bool weights = Grads != layernorm_grads::input;
  constexpr int block = cuda_row_tuning::block;
  using sum = row_sum<block, block, 2>;
  using p = pack<T, Width>;
  using q = pack<W, Width>;
  [[maybe_unused]] __shared__ typename sum::storage storage;
  extern __shared__ float shared_acc[];
  index_t const chunk = blockIdx.x;
  index_t const packs = C / Width;
  [[maybe_unused]] float const inv_c = 1.0f / static_cast<float>(C);
  float* slot = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  if constexpr (weights) {
    slot = partials + chunk * 2 * C;
    dw = shared ? shared_acc : slot;
    db = dw + C;
    for (index_t j = threadIdx.x; j < packs; j += block)
#pragma unroll
      for (int k = 0; k < Width; ++k) dw[j * Width + k] = db[j * Width + k] = 0.0f;
  }
  index_t const end = (chunk + 1) * cuda_row_tuning::chunk_rows < N ? (chunk + 1) * cuda_row_tuning::chunk_rows : N;
  for (index_t r = chunk * cuda_row_tuning::chunk_rows; r < end; ++r) {
    auto const* xs = reinterpret_cast<p const*>(inp + r * C);
    auto const* gs = reinterpret_cast<p const*>(dout + r * C);
    float const m = mean[r], s = rstd[r];
    [[maybe_unused]] float mean_dnorm = 0.0f, mean_dnorm_xhat = 0.0f;
    if constexpr (input) {
      float_sums<2> part{{0.0f, 0.0f}};
      for (index_t j = threadIdx.x; j < packs; j += block) {
        p const x = xs[j];
        p const g = gs[j];
        q const w = reinterpret_cast<q const*>(weight)[j];
#pragma unroll
        for (int k = 0; k < Width; ++k) {
          float const dnorm = to_float(w.v[k]) * to_float(g.v[k]);
          part.v[0] += dnorm;
          part.v[1] += dnorm * layernorm_xhat(to_float(x.v[k]), m, s);
        }
      }
      float_sums<2> const total = sum::sum(part, storage);
      mean_dnorm = total.v[0] * inv_c;
      mean_dnorm_xhat = total.v[1] * inv_c;
    }
    for (index_t j = threadIdx.x; j < packs; j += block) {
      p const x = xs[j];
      p const g = gs[j];
      [[maybe_unused]] q w;
      [[maybe_unused]] p d;
      if constexpr (input) {
        w = reinterpret_cast<q const*>(weight)[j];
        d = reinterpret_cast<p*>(dinp + r * C)[j];
      }
#pragma unroll
      for (int k = 0; k < Width; ++k) {
        float const gk = to_float(g.v[k]);
        float const xhat = layernorm_xhat(to_float(x.v[k]), m, s);
        if constexpr (input)
          d.v[k] = from_float<T>(to_float(d.v[k]) +
                                 layernorm_dinp(to_float(w.v[k]) * gk, xhat, mean_dnorm, mean_dnorm_xhat, s));
        if constexpr (weights) {
          dw[j * Width + k] += xhat * gk;
          db[j * Width + k] += gk;
        }
      }
      if constexpr (input) reinterpret_cast<p*>(dinp + r * C)[j] = d;
    }
  }
  if constexpr (weights)
    if (shared)
      for (index_t j = threadIdx.x; j < packs; j += block)
#pragma unroll
        for (int k = 0; k < Width; ++k) {
          slot[j * Width + k] = dw[j * Width + k];
          slot[C + j * Width + k] = db[j * Width + k];
        }
}

// Width of the packs a row kernel may use: pack_width<T> when C is a multiple and every pointer
// is aligned to its pack, else 1.
template <class T, class W>
bool rows_packable(index_t C, std::initializer_list<void const*> rows, std::initializer_list<void const*> vectors) {
  constexpr int w = pack_width<T>;
  if (C % w != 0) return false;
  for (void const* r : rows)
    if (reinterpret_cast<std::uintptr_t>(r) % alignof(pack<T, w>) != 0) return false;
  for (void const* v : vectors)
    if (reinterpret_cast<std::uintptr_t>(v) % alignof(pack<W, w>) != 0) return false;
  return true;
}

// Launches Kernel<RowThreads, Width> over N rows: a warp per row for short rows, a block per row
// for long ones; packs when `packed`. Kernel is a callable template taking the two constants.
template <class T, class Launch>
void launch_rows(index_t N, index_t C, bool packed, Launch&& launch) {
  constexpr int block = cuda_row_tuning::block;
  constexpr int w = pack_width<T>;
  if (C <= cuda_row_tuning::warp_row_max) {
    auto const blocks = static_cast<unsigned>((N + block / 32 - 1) / (block / 32));
    if (packed) launch.template operator()<32, w>(blocks);
    else launch.template operator()<32, 1>(blocks);
  } else {
    auto const blocks = static_cast<unsigned>(N);
    if (packed) launch.template operator()<block, w>(blocks);
    else launch.template operator()<block, 1>(blocks);
  }
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// Launches layernorm_backward_kernel<Grads> over N rows, a block per chunk_rows rows. partials:
// cuda_column_sums_floats<2>(N, C) floats, null for `input`; dinp and weight null for `weights`.
template <layernorm_grads Grads, class T, class W>
void launch_layernorm_backward(cudaStream_t stream, T* dinp, float* partials, T const* dout, T const* inp,
                               W const* weight, float const* mean, float const* rstd, index_t N, index_t C) {
  index_t const chunks = (N + cuda_row_tuning::chunk_rows - 1) / cuda_row_tuning::chunk_rows;
  std::size_t const acc_bytes = static_cast<std::size_t>(2 * C) * sizeof(float);
  bool const shared = Grads != layernorm_grads::input && acc_bytes <= cuda_row_tuning::shared_partials_max;
  std::size_t const smem = shared ? acc_bytes : 0;
  auto const blocks = static_cast<unsigned>(chunks);
  constexpr int w = pack_width<T>;
  if (rows_packable<T, W>(C, {dinp, dout, inp}, {weight}))  // a null pointer counts as aligned
    layernorm_backward_kernel<T, W, w, Grads><<<blocks, cuda_row_tuning::block, smem, stream>>>(
        dinp, partials, dout, inp, weight, mean, rstd, N, C, shared);
  else
    layernorm_backward_kernel<T, W, 1, Grads><<<blocks, cuda_row_tuning::block, smem, stream>>>(
        dinp, partials, dout, inp, weight, mean, rstd, N, C, shared);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels::detail

namespace tide::kernels {
TIDE_ABI_NAMESPACE_BEGIN

// out = layernorm(inp), mean and rstd saved, on ex.stream, asynchronously; device views.
template <Element T, class X, class Wv, class Bv>
  requires ReadView<X, T, tide::cuda> && Element<element_of<Wv>> && ReadView<Wv, element_of<Wv>, tide::cuda> &&
           ReadView<Bv, element_of<Wv>, tide::cuda>
void layernorm_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, tensor_view<float, tide::cuda> mean,
                       tensor_view<float, tide::cuda> rstd, X inp, Wv weight, Bv bias) {
  using W = element_of<Wv>;
  index_t const C = detail::check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  index_t const N = inp.size() / C;
  if (N == 0) return;
  bool const packed = detail::rows_packable<T, W>(C, {out.data(), inp.data()}, {weight.data(), bias.data()});
  detail::launch_rows<T>(N, C, packed, [&]<int RowThreads, int Width>(unsigned blocks) {
    detail::layernorm_forward_kernel<T, W, RowThreads, Width><<<blocks, cuda_row_tuning::block, 0, ex.stream>>>(
        out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  });
}

// residual = a + b, out = layernorm(residual), on ex.stream; device views; residual may be a or b.
template <Element T, class A, class Bv, class Wv, class Bi>
  requires ReadView<A, T, tide::cuda> && ReadView<Bv, T, tide::cuda> && Element<element_of<Wv>> &&
           ReadView<Wv, element_of<Wv>, tide::cuda> && ReadView<Bi, element_of<Wv>, tide::cuda>
void residual_layernorm_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> residual,
                                tensor_view<T, tide::cuda> out, tensor_view<float, tide::cuda> mean,
                                tensor_view<float, tide::cuda> rstd, A a, Bv b, Wv weight, Bi bias) {
  using W = element_of<Wv>;
  index_t const C = detail::check_residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias);
  index_t const N = a.size() / C;
  if (N == 0) return;
  bool const packed = detail::rows_packable<T, W>(C, {residual.data(), out.data(), a.data(), b.data()},
                                                  {weight.data(), bias.data()});
  detail::launch_rows<T>(N, C, packed, [&]<int RowThreads, int Width>(unsigned blocks) {
    detail::residual_layernorm_forward_kernel<T, W, RowThreads, Width><<<blocks, cuda_row_tuning::block, 0, ex.stream>>>(
        residual.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), weight.data(), bias.data(), N, C);
  });
}

// Scratch of layernorm_backward on CUDA: ceil(N / chunk_rows) * 2C floats of partials.
inline std::size_t layernorm_backward_scratch_bytes(exec<tide::cuda> const&, index_t rows, index_t C) noexcept {
  return sizeof(float) * detail::cuda_column_sums_floats<2>(rows, C);
}

// dinp += ..., dweight += ..., dbias += ... on ex.stream; device views.
template <Element T, Element W, class D, class X, class Wv, class M, class R>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda> && ReadView<Wv, W, tide::cuda> &&
           ReadView<M, float, tide::cuda> && ReadView<R, float, tide::cuda>
void layernorm_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, tensor_view<W, tide::cuda> dweight,
                        tensor_view<W, tide::cuda> dbias, D dout, X inp, Wv weight, M mean, R rstd,
                        scratch<tide::cuda> ws) {
  index_t const C = detail::check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  index_t const N = inp.size() / C;
  detail::check_scratch("layernorm_backward", "layernorm_backward_scratch_bytes", ws,
                        layernorm_backward_scratch_bytes(ex, N, C));
  if (N == 0) return;
  float* const partials = detail::scratch_part<float>(ws, 0);
  detail::launch_layernorm_backward<detail::layernorm_grads::both, T, W>(
      ex.stream, dinp.data(), partials, dout.data(), inp.data(), weight.data(), mean.data(), rstd.data(), N, C);
  index_t const chunks = (N + cuda_row_tuning::chunk_rows - 1) / cuda_row_tuning::chunk_rows;
  detail::launch_column_sums<W, 2>(ex.stream, partials, chunks, C, {{dweight.data(), dbias.data()}});
}

// The two halves of layernorm_backward (a backward split in two: the input gradient in B, the
// weight gradients later in W), each with the bits of its outputs in layernorm_backward; device
// views, on ex.stream. The weight half's scratch is layernorm_backward_scratch_bytes; the input
// half needs none.
//   layernorm_backward_input(ex, dinp, dout, inp, weight, mean, rstd);         // dinp +=
//   layernorm_backward_weight(ex, dweight, dbias, dout, inp, mean, rstd, ws);  // dweight, dbias +=
template <Element T, class D, class X, class Wv, class M, class R>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda> && Element<element_of<Wv>> &&
           ReadView<Wv, element_of<Wv>, tide::cuda> && ReadView<M, float, tide::cuda> && ReadView<R, float, tide::cuda>
void layernorm_backward_input(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, D dout, X inp, Wv weight,
                              M mean, R rstd) {
  using W = element_of<Wv>;
  index_t const C = detail::check_layernorm_backward_input(dinp, dout, inp, weight, mean, rstd);
  index_t const N = inp.size() / C;
  if (N == 0) return;
  detail::launch_layernorm_backward<detail::layernorm_grads::input, T, W>(
      ex.stream, dinp.data(), nullptr, dout.data(), inp.data(), weight.data(), mean.data(), rstd.data(), N, C);
}
template <Element W, class D, class X, class M, class R>
  requires Element<element_of<D>> && ReadView<D, element_of<D>, tide::cuda> &&
           ReadView<X, element_of<D>, tide::cuda> && ReadView<M, float, tide::cuda> && ReadView<R, float, tide::cuda>
void layernorm_backward_weight(exec<tide::cuda> const& ex, tensor_view<W, tide::cuda> dweight,
                               tensor_view<W, tide::cuda> dbias, D dout, X inp, M mean, R rstd,
                               scratch<tide::cuda> ws) {
  using T = element_of<D>;
  index_t const C = detail::check_layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd);
  index_t const N = inp.size() / C;
  detail::check_scratch("layernorm_backward_weight", "layernorm_backward_scratch_bytes", ws,
                        layernorm_backward_scratch_bytes(ex, N, C));
  if (N == 0) return;
  float* const partials = detail::scratch_part<float>(ws, 0);
  detail::launch_layernorm_backward<detail::layernorm_grads::weights, T, W>(
      ex.stream, nullptr, partials, dout.data(), inp.data(), nullptr, mean.data(), rstd.data(), N, C);
  index_t const chunks = (N + cuda_row_tuning::chunk_rows - 1) / cuda_row_tuning::chunk_rows;
  detail::launch_column_sums<W, 2>(ex.stream, partials, chunks, C, {{dweight.data(), dbias.data()}});
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
