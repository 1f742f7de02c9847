#pragma once
// The memory operations of tide/memory/ops.hpp on tide::cuda: the compute timeline of exec<cuda>
// is ex.stream. Fills and copies are enqueued on it (cudaMemsetAsync, cudaMemcpyAsync with
// cudaMemcpyDefault, so either side may be pinned, pageable or device memory), record() and
// wait() are cudaEventRecord and cudaStreamWaitEvent, and read_to_host() waits for the stream.
// Compiled by nvcc (cuda/instantiate_all), never run yet: no GPU has run tide (docs/cuda.md).
// memory/ops.hpp includes this file under nvcc before its MemoryOps concept, so that the engine's
// calls (tide::memory::fill_zeros(ex, ...), looked up where the engine is defined) see these.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/core/lt_cache.cuh"
#include "tide/memory/stream.cuh"

namespace tide::memory {

inline void fill_zeros(exec<cuda> const& ex, void* p, std::size_t bytes) {
  if (bytes != 0) TIDE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ex.stream));
}

inline void copy_in_order(exec<cuda> const& ex, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ex.stream));
}

inline void record(exec<cuda> const& ex, event<cuda>& e) { TIDE_CUDA_CHECK(cudaEventRecord(e.native(), ex.stream)); }

inline void wait(exec<cuda> const& ex, event<cuda> const& e) {
  TIDE_CUDA_CHECK(cudaStreamWaitEvent(ex.stream, e.native(), 0));
}

inline void synchronize(exec<cuda> const& ex) { TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream)); }

inline event<cuda> event_like(stream<cuda> const& s) {
  detail::current_device on(s.device());
  return event<cuda>{};
}

inline void read_to_host(exec<cuda> const& ex, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ex.stream));
  TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
}

// From pageable memory cudaMemcpyAsync returns once the source is staged, so the caller's block
// is free at once; from pinned or managed memory the copy is asynchronous, so it is waited for.
inline void write_from_host(exec<cuda> const& ex, void* dst, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ex.stream));
  cudaPointerAttributes a{};
  TIDE_CUDA_CHECK(cudaPointerGetAttributes(&a, src));
  if (a.type != cudaMemoryTypeUnregistered && a.type != cudaMemoryTypeDevice)
    TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
}

// cudaMemcpy from pageable memory may return before the data lands, on the legacy stream, which
// a non-blocking compute stream does not wait for: the device is synchronised before returning.
inline void copy_to_device(cuda, void* dst, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  TIDE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
}

template <Backend B>
struct compute_context;  // memory/ops.hpp
// The compute stream, a cuBLAS handle bound to it, a cuBLASLt handle and its workspace:
// exec<cuda> is all of them. tf32 and flash_attention (false by default) are copied into every
// exec handed out.
template <>
struct compute_context<cuda> {
  // cuBLAS's advice for Hopper; 4 MiB is enough before it (cuBLAS docs, "cublasSetWorkspace").
  static constexpr std::size_t lt_workspace_bytes = std::size_t{32} << 20;
  stream<cuda> s{};
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  bool tf32 = false;
  bool flash_attention = false;
  std::unique_ptr<tide::detail::lt_algo_cache> lt_algos = std::make_unique<tide::detail::lt_algo_cache>();
  compute_context() {
    cublasStatus_t st = cublasCreate(&blas);
    TIDE_CHECK(st == CUBLAS_STATUS_SUCCESS, cuda, "cublasCreate returned ", static_cast<int>(st),
               " (cublasStatus_t); is a CUDA device present and not out of memory?");
    try {
      st = cublasSetStream(blas, s.native());
      TIDE_CHECK(st == CUBLAS_STATUS_SUCCESS, cuda, "cublasSetStream returned ", static_cast<int>(st),
                 " (cublasStatus_t)");
      st = cublasLtCreate(&lt);
      TIDE_CHECK(st == CUBLAS_STATUS_SUCCESS, cuda, "cublasLtCreate returned ", static_cast<int>(st),
                 " (cublasStatus_t); is a CUDA device present and not out of memory?");
      TIDE_CUDA_CHECK(cudaMalloc(&lt_workspace, lt_workspace_bytes));
    } catch (...) {
      release();
      throw;
    }
  }
  compute_context(compute_context const&) = delete;
  compute_context& operator=(compute_context const&) = delete;
  ~compute_context() { release(); }
  [[nodiscard]] exec<cuda> exec_with(thread_pool&) {
    return {.stream = s.native(), .blas = blas, .lt = lt, .lt_workspace = lt_workspace,
            .lt_workspace_bytes = lt_workspace_bytes, .tf32 = tf32, .flash_attention = flash_attention,
            .lt_algos = lt_algos.get()};
  }
  void synchronize() { s.synchronize(); }

 private:
  void release() noexcept {
    if (lt_workspace != nullptr) {
      (void)cudaStreamSynchronize(s.native());  // no GEMM of this context still reads it
      (void)cudaFree(lt_workspace);
    }
    if (lt != nullptr) (void)cublasLtDestroy(lt);
    if (blas != nullptr) (void)cublasDestroy(blas);
    lt_workspace = nullptr;
    lt = nullptr;
    blas = nullptr;
  }
};

}  // namespace tide::memory
