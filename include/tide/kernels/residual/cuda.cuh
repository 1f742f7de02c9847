#pragma once
// The CUDA path of the residual kernels: grid-stride loops over 128-bit packs when every pointer
// allows it, elementwise, so the result is the host's bit for bit (one float add, one rounding).

#include <cuda_runtime.h>

#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/kernels/residual/residual.hpp"
#include "tide/kernels/residual/rows.cuh"

namespace tide::kernels::detail {
TIDE_ABI_NAMESPACE_BEGIN

// out = a + b over n elements; out may be a or b (no __restrict__). Width > 1: all three are
// aligned to a pack, threads take packs grid-stride, then the n % Width tail one by one.
template <class T, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    residual_forward_kernel(T* out, T const* a, T const* b, index_t n) {
  using p = pack<T, Width>;
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (index_t i = first; i < n / Width; i += stride) {
    p const x = reinterpret_cast<p const*>(a)[i];
    p const y = reinterpret_cast<p const*>(b)[i];
    p r;
#pragma unroll
    for (int k = 0; k < Width; ++k) r.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
    reinterpret_cast<p*>(out)[i] = r;
  }
  for (index_t i = n / Width * Width + first; i < n; i += stride) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// da += dout, db += dout over n elements (three separate tensors).
template <class T, int Width>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    residual_backward_kernel(T* __restrict__ da, T* __restrict__ db, T const* __restrict__ dout, index_t n) {
  using p = pack<T, Width>;
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (index_t i = first; i < n / Width; i += stride) {
    p const g = reinterpret_cast<p const*>(dout)[i];
    p x = reinterpret_cast<p*>(da)[i];
    p y = reinterpret_cast<p*>(db)[i];
#pragma unroll
    for (int k = 0; k < Width; ++k) {
      x.v[k] = from_float<T>(to_float(x.v[k]) + to_float(g.v[k]));
      y.v[k] = from_float<T>(to_float(y.v[k]) + to_float(g.v[k]));
    }
    reinterpret_cast<p*>(da)[i] = x;
    reinterpret_cast<p*>(db)[i] = y;
  }
  for (index_t i = n / Width * Width + first; i < n; i += stride) {
    float const g = to_float(dout[i]);
    da[i] = from_float<T>(to_float(da[i]) + g);
    db[i] = from_float<T>(to_float(db[i]) + g);
  }
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels::detail

namespace tide::kernels {
TIDE_ABI_NAMESPACE_BEGIN

// out = a + b on ex.stream, asynchronously; device views. Throws before enqueuing anything when
// an argument is wrong (residual.hpp).
template <Element T, class A, class B>
  requires ReadView<A, T, tide::cuda> && ReadView<B, T, tide::cuda>
void residual_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, A a, B b) {
  detail::check_residual_forward(out, a, b);
  index_t const n = out.size();
  if (n == 0) return;
  constexpr int w = detail::pack_width<T>;
  if (detail::pack_aligned<T, w>(out.data()) && detail::pack_aligned<T, w>(a.data()) &&
      detail::pack_aligned<T, w>(b.data()))
    detail::residual_forward_kernel<T, w>
        <<<detail::streaming_grid(n / w + 1), cuda_row_tuning::block, 0, ex.stream>>>(out.data(), a.data(), b.data(), n);
  else
    detail::residual_forward_kernel<T, 1>
        <<<detail::streaming_grid(n), cuda_row_tuning::block, 0, ex.stream>>>(out.data(), a.data(), b.data(), n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// da += dout, db += dout on ex.stream; device views.
template <Element T, class D>
  requires ReadView<D, T, tide::cuda>
void residual_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> da, tensor_view<T, tide::cuda> db, D dout) {
  detail::check_residual_backward(da, db, dout);
  index_t const n = dout.size();
  if (n == 0) return;
  constexpr int w = detail::pack_width<T>;
  if (detail::pack_aligned<T, w>(da.data()) && detail::pack_aligned<T, w>(db.data()) &&
      detail::pack_aligned<T, w>(dout.data()))
    detail::residual_backward_kernel<T, w>
        <<<detail::streaming_grid(n / w + 1), cuda_row_tuning::block, 0, ex.stream>>>(da.data(), db.data(), dout.data(), n);
  else
    detail::residual_backward_kernel<T, 1>
        <<<detail::streaming_grid(n), cuda_row_tuning::block, 0, ex.stream>>>(da.data(), db.data(), dout.data(), n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
