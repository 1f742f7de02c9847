#pragma once
// The CUDA path of the GELU kernels: grid-stride loops over 128-bit packs calling the same
// gelu_tanh / gelu_tanh_grad as the host (math.hpp). dbias: each block sums a fixed chunk of
// rows into its own partial (shared memory when it fits), then column_sums_kernel adds the
// partials in chunk order: deterministic, independent of the device.

#include <cstddef>
#include <cuda_runtime.h>

#include <algorithm>

#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/kernels/gelu/gelu.hpp"
#include "tide/kernels/residual/rows.cuh"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels::detail {
TIDE_ABI_NAMESPACE_BEGIN

// out = gelu(inp) over n elements; out may be inp. Width > 1: both aligned to a pack.
template <class T, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block) gelu_forward_kernel(T* out, T const* inp, index_t n) {
  using p = pack<T, Width>;
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (index_t i = first; i < n / Width; i += stride) {
    p x = reinterpret_cast<p const*>(inp)[i];
#pragma unroll
    for (int k = 0; k < Width; ++k) x.v[k] = from_float<T>(gelu_tanh(to_float(x.v[k])));
    reinterpret_cast<p*>(out)[i] = x;
  }
  for (index_t i = n / Width * Width + first; i < n; i += stride) out[i] = from_float<T>(gelu_tanh(to_float(inp[i])));
}

// dinp = gelu'(inp) * dout over n elements; dinp may be inp or dout.
template <class T, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    gelu_backward_kernel(T* dinp, T const* inp, T const* dout, index_t n) {
  using p = pack<T, Width>;
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (index_t i = first; i < n / Width; i += stride) {
    p const x = reinterpret_cast<p const*>(inp)[i];
    p g = reinterpret_cast<p const*>(dout)[i];
#pragma unroll
    for (int k = 0; k < Width; ++k) g.v[k] = from_float<T>(gelu_tanh_grad(to_float(x.v[k])) * to_float(g.v[k]));
    reinterpret_cast<p*>(dinp)[i] = g;
  }
  for (index_t i = n / Width * Width + first; i < n; i += stride)
    dinp[i] = from_float<T>(gelu_tanh_grad(to_float(inp[i])) * to_float(dout[i]));
}

// out(n, c) = gelu(inp(n, c) + bias(c)) over N rows of C; out may be inp. Width > 1: C % Width
// == 0 and every pointer aligned to its pack, so a pack never crosses a row.
template <class T, class W, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    bias_gelu_forward_kernel(T* out, T const* inp, W const* __restrict__ bias, index_t N, index_t C) {
  using p = pack<T, Width>;
  using q = pack<W, Width>;
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  index_t const row_packs = C / Width;
  for (index_t i = first; i < N * row_packs; i += stride) {
    p x = reinterpret_cast<p const*>(inp)[i];
    q const b = reinterpret_cast<q const*>(bias)[i % row_packs];
#pragma unroll
    for (int k = 0; k < Width; ++k) x.v[k] = from_float<T>(gelu_tanh(to_float(x.v[k]) + to_float(b.v[k])));
    reinterpret_cast<p*>(out)[i] = x;
  }
}

// One block per chunk of chunk_rows rows: dinp = gelu'(inp + bias) * dout, and the chunk's sum
// of it per column into partials[chunk] (C floats). A thread owns the same columns on every row,
// so the accumulator needs no atomics; it is shared memory when `shared` (C floats fit), else
// the chunk's slot in global memory.
template <class T, class W, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    bias_gelu_backward_kernel(T* dinp, float* __restrict__ partials, T const* inp, W const* __restrict__ bias,
                              T const* dout, index_t N, index_t C, bool shared) {
  extern __shared__ float shared_acc[];
  using p = pack<T, Width>;
  using q = pack<W, Width>;
  index_t const chunk = blockIdx.x;
  float* const slot = partials + chunk * C;
  float* const acc = shared ? shared_acc : slot;
  index_t const row_packs = C / Width;
  for (index_t j = threadIdx.x; j < row_packs; j += blockDim.x)
#pragma unroll
    for (int k = 0; k < Width; ++k) acc[j * Width + k] = 0.0f;
  index_t const r1 = (chunk + 1) * cuda_row_tuning::chunk_rows < N ? (chunk + 1) * cuda_row_tuning::chunk_rows : N;
  for (index_t r = chunk * cuda_row_tuning::chunk_rows; r < r1; ++r) {
    for (index_t j = threadIdx.x; j < row_packs; j += blockDim.x) {
      index_t const i = r * row_packs + j;
      p const x = reinterpret_cast<p const*>(inp)[i];
      p g = reinterpret_cast<p const*>(dout)[i];
      q const b = reinterpret_cast<q const*>(bias)[j];
#pragma unroll
      for (int k = 0; k < Width; ++k) {
        float const d = gelu_tanh_grad(to_float(x.v[k]) + to_float(b.v[k])) * to_float(g.v[k]);
        acc[j * Width + k] += d;
        g.v[k] = from_float<T>(d);
      }
      reinterpret_cast<p*>(dinp)[i] = g;
    }
  }
  if (shared)
    for (index_t j = threadIdx.x; j < row_packs; j += blockDim.x)
#pragma unroll
      for (int k = 0; k < Width; ++k) slot[j * Width + k] = acc[j * Width + k];
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels::detail

namespace tide::kernels {
TIDE_ABI_NAMESPACE_BEGIN

// out = gelu(inp) on ex.stream, asynchronously; device views; out may be inp.
template <Element T, class X>
  requires ReadView<X, T, tide::cuda>
void gelu_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, X inp) {
  detail::check_gelu_forward(out, inp);
  index_t const n = inp.size();
  if (n == 0) return;
  constexpr int w = detail::pack_width<T>;
  if (detail::pack_aligned<T, w>(out.data()) && detail::pack_aligned<T, w>(inp.data()))
    detail::gelu_forward_kernel<T, w>
        <<<detail::streaming_grid(n / w + 1), cuda_row_tuning::block, 0, ex.stream>>>(out.data(), inp.data(), n);
  else
    detail::gelu_forward_kernel<T, 1>
        <<<detail::streaming_grid(n), cuda_row_tuning::block, 0, ex.stream>>>(out.data(), inp.data(), n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// dinp = gelu'(inp) * dout (assigned) on ex.stream; dinp may be inp or dout.
template <Element T, class X, class D>
  requires ReadView<X, T, tide::cuda> && ReadView<D, T, tide::cuda>
void gelu_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, X inp, D dout) {
  detail::check_gelu_backward(dinp, inp, dout);
  index_t const n = inp.size();
  if (n == 0) return;
  constexpr int w = detail::pack_width<T>;
  if (detail::pack_aligned<T, w>(dinp.data()) && detail::pack_aligned<T, w>(inp.data()) &&
      detail::pack_aligned<T, w>(dout.data()))
    detail::gelu_backward_kernel<T, w><<<detail::streaming_grid(n / w + 1), cuda_row_tuning::block, 0, ex.stream>>>(
        dinp.data(), inp.data(), dout.data(), n);
  else
    detail::gelu_backward_kernel<T, 1>
        <<<detail::streaming_grid(n), cuda_row_tuning::block, 0, ex.stream>>>(dinp.data(), inp.data(), dout.data(), n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// out(n, c) = gelu(inp(n, c) + bias(c)) on ex.stream; device views; out may be inp.
template <Element T, class X, class B>
  requires ReadView<X, T, tide::cuda> && Element<element_of<B>> && ReadView<B, element_of<B>, tide::cuda>
void bias_gelu_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, X inp, B bias) {
  using W = element_of<B>;
  index_t const C = detail::check_bias_gelu_forward(out, inp, bias);
  index_t const N = inp.size() / C;
  if (N == 0) return;
  constexpr int w = detail::pack_width<T>;
  if (C % w == 0 && detail::pack_aligned<T, w>(out.data()) && detail::pack_aligned<T, w>(inp.data()) &&
      detail::pack_aligned<W, w>(bias.data()))
    detail::bias_gelu_forward_kernel<T, W, w><<<detail::streaming_grid(N * (C / w)), cuda_row_tuning::block, 0, ex.stream>>>(
        out.data(), inp.data(), bias.data(), N, C);
  else
    detail::bias_gelu_forward_kernel<T, W, 1>
        <<<detail::streaming_grid(N * C), cuda_row_tuning::block, 0, ex.stream>>>(out.data(), inp.data(), bias.data(), N, C);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// Scratch of bias_gelu_backward on CUDA: ceil(N / chunk_rows) * C floats of partials.
inline std::size_t bias_gelu_backward_scratch_bytes(exec<tide::cuda> const&, index_t rows, index_t C) noexcept {
  return sizeof(float) * detail::cuda_column_sums_floats<1>(rows, C);
}

// dinp = gelu'(inp + bias) * dout (assigned), dbias += its sum over rows, on ex.stream.
template <Element T, Element W, class X, class B, class D>
  requires ReadView<X, T, tide::cuda> && ReadView<B, W, tide::cuda> && ReadView<D, T, tide::cuda>
void bias_gelu_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, tensor_view<W, tide::cuda> dbias,
                        X inp, B bias, D dout, scratch<tide::cuda> ws) {
  index_t const C = detail::check_bias_gelu_backward(dinp, dbias, inp, bias, dout);
  index_t const N = inp.size() / C;
  detail::check_scratch("bias_gelu_backward", "bias_gelu_backward_scratch_bytes", ws,
                        bias_gelu_backward_scratch_bytes(ex, N, C));
  if (N == 0) return;
  index_t const chunks = (N + cuda_row_tuning::chunk_rows - 1) / cuda_row_tuning::chunk_rows;
  float* const partials = detail::scratch_part<float>(ws, 0);
  std::size_t const acc_bytes = static_cast<std::size_t>(C) * sizeof(float);
  bool const shared = acc_bytes <= cuda_row_tuning::shared_partials_max;
  std::size_t const smem = shared ? acc_bytes : 0;
  auto const blocks = static_cast<unsigned>(chunks);
  constexpr int w = detail::pack_width<T>;
  if (C % w == 0 && detail::pack_aligned<T, w>(dinp.data()) && detail::pack_aligned<T, w>(inp.data()) &&
      detail::pack_aligned<W, w>(bias.data()) && detail::pack_aligned<T, w>(dout.data()))
    detail::bias_gelu_backward_kernel<T, W, w><<<blocks, cuda_row_tuning::block, smem, ex.stream>>>(
        dinp.data(), partials, inp.data(), bias.data(), dout.data(), N, C, shared);
  else
    detail::bias_gelu_backward_kernel<T, W, 1><<<blocks, cuda_row_tuning::block, smem, ex.stream>>>(
        dinp.data(), partials, inp.data(), bias.data(), dout.data(), N, C, shared);
  TIDE_CUDA_CHECK(cudaGetLastError());
  detail::launch_column_sums<W, 1>(ex.stream, partials, chunks, C, {{dbias.data()}});
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
