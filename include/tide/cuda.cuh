#pragma once
// Everything in tide that needs nvcc. Every .cuh under include/tide is listed here: the test
// cuda/umbrella fails when one is missing, and tests/cuda/instantiate_all.cu compiles this file.

#if defined(TIDE_HAS_NCCL)
#include "tide/comm/nccl.cuh"  // needs tide::nccl
#include "tide/comm/nccl_data_parallel.cuh"
#endif
#include "tide/compress/select.cuh"
#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/core/lt_cache.cuh"
#include "tide/kernels/adam/cuda.cuh"
#include "tide/kernels/adamw/cuda.cuh"
#include "tide/kernels/attention/cuda.cuh"
#include "tide/kernels/attention/cuda_gemm.cuh"
#include "tide/kernels/attention/cuda_mma.cuh"
#include "tide/kernels/attention/cuda_mma_backward.cuh"
#include "tide/kernels/cast/cuda.cuh"
#include "tide/kernels/classifier/cuda.cuh"
#include "tide/kernels/detail/elementwise_step.cuh"
#include "tide/kernels/embedding/cuda.cuh"
#include "tide/kernels/gelu/cuda.cuh"
#include "tide/kernels/grad_norm/cuda.cuh"
#include "tide/kernels/layernorm/cuda.cuh"
#include "tide/kernels/matmul/cuda.cuh"
#include "tide/kernels/residual/cuda.cuh"
#include "tide/kernels/residual/rows.cuh"
#include "tide/kernels/sgd/cuda.cuh"
#include "tide/kernels/softmax/cuda.cuh"
#include "tide/nn/backend_ops.cuh"
#include "tide/memory/caching_allocator.cuh"
#include "tide/memory/device_arena.cuh"
#include "tide/memory/ops.cuh"
#include "tide/memory/pinned_pool.cuh"
#include "tide/memory/stream.cuh"
#include "tide/memory/transfer_engine.cuh"
