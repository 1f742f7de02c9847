#pragma once
// exec<cuda>: the stream kernels are enqueued on and the cuBLAS handle GEMMs use. Non-owning:
// the caller owns the stream and the handle (RAII wrappers live in memory/stream.cuh).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tide/core/exec.hpp"

namespace tide {

template <>
struct exec<cuda> {
  using backend = cuda;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};

}  // namespace tide
