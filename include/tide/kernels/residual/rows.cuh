#pragma once
// Device plumbing the row-wise CUDA kernels share (residual, layernorm, gelu): 128-bit packs,
// the grid of a streaming kernel, sums over the threads of one row (CUB warp or block
// reductions), fixed-order column sums of per-chunk partials, and stream-ordered scratch.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels {
TIDE_ABI_NAMESPACE_BEGIN

// Not tuned on a GPU (none where this was written); the choices follow llm.c and
// TurboTransformers: 256 threads; 8 resident blocks per SM fill an sm_80 / sm_90 SM (2048
// threads); rows up to 1024 wide get one warp each, 8 rows per block, so a block's reductions
// are warp shuffles with no __syncthreads; wider rows get a whole block.
struct cuda_row_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 8;
  static constexpr index_t warp_row_max = 1024;
  static constexpr index_t chunk_rows = 32;            // rows per block in the backward kernels
  // Row kernels promise ptxas 4 resident blocks (64 registers a thread): without a minimum it
  // kept the fused residual + LayerNorm at 40 registers and spilled 8 bytes.
  static constexpr int row_min_blocks = 4;
  static constexpr std::size_t shared_partials_max = 48 * 1024;  // dynamic shared memory without opt-in
};

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels

// Device code sits in detail's ABI namespace (not a detail inside tide::kernels' ABI namespace,
// which would hide the host-side tide::kernels::detail from the launchers).
namespace tide::kernels::detail {
TIDE_ABI_NAMESPACE_BEGIN

// Width elements moved as one aligned load or store: 128 bits of T when Width = pack_width<T>.
template <class T, int Width>
struct alignas(sizeof(T) * Width) pack {
  T v[Width];
};

template <class T>
inline constexpr int pack_width = 16 / static_cast<int>(sizeof(T));

template <class T, int Width>
inline bool pack_aligned(T const* p) {
  return reinterpret_cast<std::uintptr_t>(p) % alignof(pack<T, Width>) == 0;
}

// Blocks for `items` threads' worth of work, capped at blocks_per_sm per SM: the kernels loop
// grid-stride over the rest.
inline unsigned streaming_grid(index_t items) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const needed = (items + cuda_row_tuning::block - 1) / cuda_row_tuning::block;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, index_t{sms} * cuda_row_tuning::blocks_per_sm));
}

template <int K>
struct float_sums {
  float v[K];
};

template <int K>
struct add_float_sums {
  __device__ float_sums<K> operator()(float_sums<K> a, float_sums<K> const& b) const {
    for (int k = 0; k < K; ++k) a.v[k] += b.v[k];
    return a;
  }
};

// Sums K floats over the RowThreads threads that share a row and hands the sums to all of them.
// RowThreads == 32: a warp per row, cub::WarpReduce then a shuffle from lane 0; RowThreads ==
// Block: the block on one row, cub::BlockReduce then shared memory (every thread must call).
// Both reduce in a fixed order: the same inputs give the same bits.
template <int Block, int RowThreads, int K>
struct row_sum {
  static_assert(RowThreads == 32 || RowThreads == Block, "a row is one warp or the whole block");
  static constexpr bool by_warp = RowThreads == 32;
  using warp_reduce = cub::WarpReduce<float_sums<K>>;
  using block_reduce = cub::BlockReduce<float_sums<K>, Block>;
  struct block_storage {
    typename block_reduce::TempStorage reduce;
    float_sums<K> result;
  };
  struct warp_storage {
    typename warp_reduce::TempStorage reduce[Block / 32];
  };
  using storage = std::conditional_t<by_warp, warp_storage, block_storage>;

  __device__ static float_sums<K> sum(float_sums<K> x, storage& s) {
    if constexpr (by_warp) {
      float_sums<K> r = warp_reduce(s.reduce[threadIdx.x / 32]).Reduce(x, add_float_sums<K>{});
#pragma unroll
      for (int k = 0; k < K; ++k) r.v[k] = __shfl_sync(0xffffffffu, r.v[k], 0);
      return r;
    } else {
      float_sums<K> const r = block_reduce(s.reduce).Reduce(x, add_float_sums<K>{});
      if (threadIdx.x == 0) s.result = r;
      __syncthreads();
      float_sums<K> const all = s.result;
      __syncthreads();  // the storage is reused by the next call
      return all;
    }
  }
};

// K destination vectors of a column sum.
template <class W, int K>
struct column_targets {
  W* p[K];
};

// dst.p[k][c] += sum over chunks of partials[chunk][k][c]: one thread per column, the chunks
// in a fixed order (four interleaved accumulators, combined as (s0 + s1) + (s2 + s3)), so the
// result does not depend on the grid or the device. partials: (chunks, K, C).
template <class W, int K>
__global__ void __launch_bounds__(cuda_row_tuning::block)
    column_sums_kernel(float const* __restrict__ partials, index_t chunks, index_t C, column_targets<W, K> dst) {
  index_t const c = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    index_t ch = 0;
    for (; ch + 4 <= chunks; ch += 4)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] += partials[((ch + j) * K + k) * C + c];
    if (ch < chunks) s[0] += partials[(ch * K + k) * C + c];
    if (ch + 1 < chunks) s[1] += partials[((ch + 1) * K + k) * C + c];
    if (ch + 2 < chunks) s[2] += partials[((ch + 2) * K + k) * C + c];
    dst.p[k][c] = from_float<W>(to_float(dst.p[k][c]) + ((s[0] + s[1]) + (s[2] + s[3])));
  }
}

template <class W, int K>
void launch_column_sums(cudaStream_t stream, float const* partials, index_t chunks, index_t C,
                        column_targets<W, K> dst) {
  auto const blocks = static_cast<unsigned>((C + cuda_row_tuning::block - 1) / cuda_row_tuning::block);
  column_sums_kernel<W, K><<<blocks, cuda_row_tuning::block, 0, stream>>>(partials, chunks, C, dst);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// Floats of column-sum partials for N rows of C channels, K sums per column: ceil(N / chunk_rows)
// chunks of K C.
template <int K>
constexpr std::size_t cuda_column_sums_floats(index_t N, index_t C) noexcept {
  index_t const chunks = (N + cuda_row_tuning::chunk_rows - 1) / cuda_row_tuning::chunk_rows;
  return static_cast<std::size_t>(chunks * K * C);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels::detail
