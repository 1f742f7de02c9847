#pragma once
// exec<cuda>: the stream kernels are enqueued on and the cuBLAS handles GEMMs use. Non-owning:
// the caller owns the stream, the handles and the workspace (memory::compute_context<cuda> in
// memory/ops.cuh owns one of each and hands out an exec<cuda> over them).
//
//   stream, blas            every kernel and cublasGemmEx call (blas may be null for code that
//                           runs no GEMM)
//   lt, lt_workspace(_bytes) when lt is set, the matmul kernels run cuBLASLt with the bias and
//                           GELU fused into the GEMM's epilogue, and fall back to cublasGemmEx
//                           (bias and GELU as separate passes) for a call cuBLASLt has no
//                           algorithm for (kernels/matmul/cuda.cuh)
//   tf32                    f32 GEMMs may run on tensor cores in TF32 (inputs rounded to a
//                           10-bit mantissa, sums in fp32): about 8x the fp32 rate on an A100
//                           or H100, and about 1e-3 relative error per product. Off by default:
//                           f32 results then match the host's within fp32 reordering. bf16 and
//                           f16 GEMMs use tensor cores either way.
//   lt_algos                the cuBLASLt algorithms chosen so far, by shape (null: the heuristic
//                           is asked on every call; core/lt_cache.cuh)

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "tide/core/exec.hpp"

namespace tide::detail {
struct lt_algo_cache;  // core/lt_cache.cuh
}  // namespace tide::detail

namespace tide {

template <>
struct exec<cuda> {
  using backend = cuda;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  std::size_t lt_workspace_bytes = 0;
  bool tf32 = false;
  // bf16 causal attention, forward and backward, fused on tensor cores (kernels/attention/
  // cuda_mma.cuh, cuda_mma_backward.cuh) where its shapes fit; off: the cuBLAS path. Off by
  // default until a GPU has checked it.
  bool flash_attention = false;
  detail::lt_algo_cache* lt_algos = nullptr;
};

}  // namespace tide
