#pragma once
// nn/backend_ops.hpp's operations on tide::cuda, enqueued on ex.stream: zero_fill is
// cudaMemsetAsync, add_in_place the residual kernel in place (x = x + y, one float add and one
// rounding per element: the host's bits), scale_in_place a grid-stride kernel of the same
// arithmetic, copy_columns one cudaMemcpy2DAsync, ordered_sum a copy of the losses back and the
// host's sum in index order (the same bits as the host). backend_ops.hpp includes this file under
// nvcc, so nn::gpt's calls see these overloads where it is defined. Compiled by nvcc
// (cuda/instantiate_all), never run yet: no GPU has run tide (docs/cuda.md).

#include <cstddef>
#include <cuda_runtime.h>

#include <vector>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/residual/cuda.cuh"
#include "tide/kernels/residual/rows.cuh"
#include "tide/memory/ops.cuh"
#include "tide/nn/backend_ops.hpp"  // the checks (under nvcc it includes this file at its end)

namespace tide::nn::detail {

// x *= s over n elements, grid-stride.
template <class T>
__global__ void __launch_bounds__(kernels::cuda_row_tuning::block) scale_in_place_kernel(T* x, float s, index_t n) {
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = from_float<T>(to_float(x[i]) * s);
}

template <class T>
void zero_fill(exec<cuda> const& ex, tensor_view<T, cuda> x) {
  memory::fill_zeros(ex, static_cast<void*>(x.data()), x.bytes());
}

template <class T>
void scale_in_place(exec<cuda> const& ex, tensor_view<T, cuda> x, float s) {
  if (x.size() == 0) return;
  scale_in_place_kernel<T><<<kernels::detail::streaming_grid(x.size()), kernels::cuda_row_tuning::block, 0, ex.stream>>>(
      x.data(), s, x.size());
  TIDE_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void add_in_place(exec<cuda> const& ex, tensor_view<T, cuda> x, tensor_view<T const, cuda> y) {
  kernels::residual_forward(ex, x, tensor_view<T const, cuda>(x), y);
}

template <class T>
void copy_columns(exec<cuda> const& ex, tensor_view<T, cuda> dst, index_t dst_col, tensor_view<T const, cuda> src,
                  index_t src_col, index_t w) {
  check_columns(dst.extent(0), dst.extent(1), dst_col, src.extent(0), src.extent(1), src_col, w);
  if (dst.extent(0) == 0 || w == 0) return;
  TIDE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data() + dst_col, static_cast<std::size_t>(dst.extent(1)) * sizeof(T),
                                    src.data() + src_col, static_cast<std::size_t>(src.extent(1)) * sizeof(T),
                                    static_cast<std::size_t>(w) * sizeof(T), static_cast<std::size_t>(dst.extent(0)),
                                    cudaMemcpyDeviceToDevice, ex.stream));
}

inline double ordered_sum(exec<cuda> const& ex, tensor_view<float const, cuda> x) {
  std::vector<float> h(static_cast<std::size_t>(x.size()));
  memory::read_to_host(ex, h.data(), x.data(), x.bytes());
  double s = 0;
  for (float const v : h) s += static_cast<double>(v);
  return s;
}

}  // namespace tide::nn::detail
