#pragma once
// The CUDA path of the attention kernels: the same entry names with exec<cuda> and device views,
// enqueued on ex.stream. Three implementations, picked by the exec:
//
//   ex.flash_attention, bf16, HS a multiple of 16 up to 128: forward and backward fused on
//                  tensor cores (attention/cuda_mma.cuh, cuda_mma_backward.cuh: WMMA), where the
//                  device has the shared memory (else the paths below)
//   ex.blas set    on tensor cores through cuBLAS (attention/cuda_gemm.cuh): batched GEMMs per
//                  sequence, one sequence's (NH, T, T) scores in the caller's scratch
//   ex.blas null   flash-style like the host path (online softmax, lse saved, no (T, T)
//                  buffer), with the per-row math of attention/math.hpp, on CUDA cores, below
//
// The scratch queries take the same exec, so a plan made with it fits the call. The CUDA-core
// kernels:
//
//   forward   a block of `warps` warps takes `warps` consecutive query rows of one (b, h), one
//             row per warp; key and value tiles of 32 rows go through shared memory, lane l
//             scores key j0 + l, the warp reduces max and sum with shuffles, and each lane
//             accumulates the output channels l, l + 32, ... in registers
//   backward  D = dout . out per row (B NH T floats of the caller's scratch, scratch_bytes first);
//             then dK, dV with one warp per key row (lane = query of a 32-query tile) and dQ with
//             one warp per query row (lane = key of a 32-key tile): each gradient has one owner,
//             sums in a fixed order, no atomics, so results repeat bit for bit
//
// Limits: HS <= 128 (4 channels per lane in registers), B * NH <= 65535 (grid y), T < 2^31.
// A correct baseline written without a GPU at hand, kept as the check of the cuBLAS path
// (tests/gpu/kernels.cu runs both against the host); a fused flash kernel on tensor cores, or
// cuDNN's, would need neither the (T, T) scratch nor the wasted upper triangle (docs/kernels/attention.md).

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/attention/cuda_gemm.cuh"
#include "tide/kernels/attention/cuda_mma.cuh"
#include "tide/kernels/attention/cuda_mma_backward.cuh"
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/attention/math.hpp"

namespace tide::kernels {

// Not tuned on a GPU. 4 warps share each key / query tile; 32-row tiles give one row per lane.
struct attention_cuda_tuning {
  static constexpr int warps = 4;
  static constexpr int tile = 32;
  static constexpr int max_head_size = 128;
  static constexpr int rows_block = 256;  // threads of the D = dout . out kernel (8 rows)
};

// Kernels in detail's ABI namespace (tests/cuda/README.md).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

inline constexpr int attention_lane_channels = attention_cuda_tuning::max_head_size / 32;

// Row stride of a shared (32, HS) tile: odd, so lane l reading row l, column d hits bank
// (l * stride + d) % 32, a different bank for every lane.
TIDE_HOST_DEVICE constexpr int attention_tile_stride(int hs) noexcept { return hs % 2 == 0 ? hs + 1 : hs; }

// attention_warp_max, attention_warp_sum: attention/cuda_gemm.cuh, which both paths include.

// Rows [r0, r0 + rows) of channels [c0, c0 + HS) of a (T, ld) sequence into shared (rows, stride),
// times scale; rows past T read as 0.
template <class T>
__device__ void attention_tile_load(float* dst, int stride, T const* seq, std::int64_t ld, int c0, int r0, int rows,
                                    int Tn, int HS, float scale) {
  for (int e = threadIdx.x; e < rows * HS; e += blockDim.x) {
    int const r = e / HS, d = e % HS;
    dst[r * stride + d] = r0 + r < Tn ? to_float(seq[(r0 + r) * ld + c0 + d]) * scale : 0.0f;
  }
}

template <class T>
__global__ void __launch_bounds__(32 * attention_cuda_tuning::warps)
    attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse, T const* __restrict__ qkv, int Tn, int C,
                             int NH, int HS, float scale) {
  constexpr int W = attention_cuda_tuning::warps, K = attention_cuda_tuning::tile, P = attention_lane_channels;
  extern __shared__ float attention_smem[];
  int const stride = attention_tile_stride(HS);
  float* const ks = attention_smem;   // (K, stride)
  float* const vs = ks + K * stride;  // (K, stride)
  float* const qs = vs + K * stride;  // (W, HS), scaled
  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const i0 = blockIdx.x * W, i = i0 + warp;
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  attention_tile_load(qs, HS, seq, C3, h * HS, i0, W, Tn, HS, scale);

  online_softmax st;
  float o[P] = {};
  int const last = min(i0 + W, Tn) - 1;  // keys 0 .. the block's last query
  for (int j0 = 0; j0 <= last; j0 += K) {
    __syncthreads();  // the previous tile is consumed (and qs is written)
    attention_tile_load(ks, stride, seq, C3, C + h * HS, j0, K, Tn, HS, 1.0f);
    attention_tile_load(vs, stride, seq, C3, 2 * C + h * HS, j0, K, Tn, HS, 1.0f);
    __syncthreads();
    if (i >= Tn || j0 > i) continue;  // uniform over the warp
    int const j = j0 + lane;
    float s = -__builtin_huge_valf();
    if (j <= i) {
      float acc = 0.0f;
      for (int d = 0; d < HS; ++d) acc += qs[warp * HS + d] * ks[lane * stride + d];
      s = acc;
    }
    float const alpha = st.rescale(attention_warp_max(s));  // key j0 <= i: the max is finite
    float const p = j <= i ? st.weight(s) : 0.0f;
    st.sum += attention_warp_sum(p);
#pragma unroll
    for (int k = 0; k < P; ++k) o[k] *= alpha;
    for (int jj = 0; jj < K; ++jj) {
      float const pj = __shfl_sync(attention_full_mask, p, jj);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        int const d = lane + 32 * k;
        if (d < HS) o[k] += pj * vs[jj * stride + d];
      }
    }
  }
  if (i < Tn) {
    float const inv = 1.0f / st.sum;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      int const d = lane + 32 * k;
      if (d < HS) out[(std::int64_t{b} * Tn + i) * C + h * HS + d] = from_float<T>(o[k] * inv);
    }
    if (lane == 0) lse[(std::int64_t{b} * NH + h) * Tn + i] = st.lse();
  }
}

// D(b, h, t) = dout(b, t, head h) . out(b, t, head h): one warp per row, lanes over channels,
// a fixed shuffle tree.
template <class T>
__global__ void __launch_bounds__(attention_cuda_tuning::rows_block)
    attention_rowdot_kernel(float* __restrict__ D, T const* __restrict__ dout, T const* __restrict__ out, int B, int Tn,
                            int C, int NH, int HS) {
  std::int64_t const row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;  // (b, h, t)
  int const lane = threadIdx.x % 32;
  if (row >= std::int64_t{B} * NH * Tn) return;
  std::int64_t const t = row % Tn, bh = row / Tn;
  std::int64_t const b = bh / NH, h = bh % NH;
  std::int64_t const base = (b * Tn + t) * C + h * HS;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32) acc += to_float(dout[base + d]) * to_float(out[base + d]);
  acc = attention_warp_sum(acc);
  if (lane == 0) D[row] = acc;
}

// dK, dV: warp w takes key row j = blockIdx.x * W + w; lane l the query i0 + l of each tile.
template <class T>
__global__ void __launch_bounds__(32 * attention_cuda_tuning::warps)
    attention_backward_kv_kernel(T* __restrict__ dqkv, T const* __restrict__ dout, T const* __restrict__ qkv,
                                 float const* __restrict__ lse, float const* __restrict__ D, int Tn, int C, int NH,
                                 int HS, float scale) {
  constexpr int W = attention_cuda_tuning::warps, K = attention_cuda_tuning::tile, P = attention_lane_channels;
  extern __shared__ float attention_smem[];
  int const stride = attention_tile_stride(HS);
  float* const qt = attention_smem;   // (K, stride), scaled q of the query tile
  float* const gt = qt + K * stride;  // (K, stride), dout of the query tile
  float* const kr = gt + K * stride;  // (W, HS), this block's keys
  float* const vr = kr + W * HS;      // (W, HS), this block's values
  float* const lt = vr + W * HS;      // (K), lse of the query tile
  float* const dt = lt + K;           // (K), D of the query tile
  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const j0 = blockIdx.x * W, j = j0 + warp;
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  T const* const gseq = dout + std::int64_t{b} * Tn * C;
  float const* const lrow = lse + std::int64_t{blockIdx.y} * Tn;  // (b, h) row of lse and D
  float const* const drow = D + std::int64_t{blockIdx.y} * Tn;
  attention_tile_load(kr, HS, seq, C3, C + h * HS, j0, W, Tn, HS, 1.0f);
  attention_tile_load(vr, HS, seq, C3, 2 * C + h * HS, j0, W, Tn, HS, 1.0f);

  float dk[P] = {}, dv[P] = {};
  for (int i0 = j0; i0 < Tn; i0 += K) {  // queries i >= the block's first key
    __syncthreads();
    attention_tile_load(qt, stride, seq, C3, h * HS, i0, K, Tn, HS, scale);
    attention_tile_load(gt, stride, gseq, C, h * HS, i0, K, Tn, HS, 1.0f);
    for (int e = threadIdx.x; e < K; e += blockDim.x) {
      lt[e] = i0 + e < Tn ? lrow[i0 + e] : 0.0f;
      dt[e] = i0 + e < Tn ? drow[i0 + e] : 0.0f;
    }
    __syncthreads();
    if (j >= Tn) continue;  // uniform over the warp
    int const i = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (i < Tn && i >= j) {
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < HS; ++d) {
        s += qt[lane * stride + d] * kr[warp * HS + d];
        dp += gt[lane * stride + d] * vr[warp * HS + d];
      }
      p = attention_prob(s, lt[lane]);
      ds = p * (dp - dt[lane]);
    }
    for (int q = 0; q < K; ++q) {
      float const pq = __shfl_sync(attention_full_mask, p, q);
      float const dsq = __shfl_sync(attention_full_mask, ds, q);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        int const d = lane + 32 * k;
        if (d < HS) {
          dv[k] += pq * gt[q * stride + d];
          dk[k] += dsq * qt[q * stride + d];  // q is scaled: dK = scale dS^T q
        }
      }
    }
  }
  if (j < Tn) {
    T* const row = dqkv + (std::int64_t{b} * Tn + j) * C3;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      int const d = lane + 32 * k;
      if (d < HS) {
        T& gk = row[C + h * HS + d];
        T& gv = row[2 * C + h * HS + d];
        gk = from_float<T>(to_float(gk) + dk[k]);
        gv = from_float<T>(to_float(gv) + dv[k]);
      }
    }
  }
}

// dQ: warp w takes query row i = blockIdx.x * W + w; lane l the key j0 + l of each tile.
template <class T>
__global__ void __launch_bounds__(32 * attention_cuda_tuning::warps)
    attention_backward_q_kernel(T* __restrict__ dqkv, T const* __restrict__ dout, T const* __restrict__ qkv,
                                float const* __restrict__ lse, float const* __restrict__ D, int Tn, int C, int NH,
                                int HS, float scale) {
  constexpr int W = attention_cuda_tuning::warps, K = attention_cuda_tuning::tile, P = attention_lane_channels;
  extern __shared__ float attention_smem[];
  int const stride = attention_tile_stride(HS);
  float* const kt = attention_smem;   // (K, stride)
  float* const vt = kt + K * stride;  // (K, stride)
  float* const qr = vt + K * stride;  // (W, HS), scaled
  float* const gr = qr + W * HS;      // (W, HS), dout rows
  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const i0 = blockIdx.x * W, i = i0 + warp;
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  attention_tile_load(qr, HS, seq, C3, h * HS, i0, W, Tn, HS, scale);
  attention_tile_load(gr, HS, dout + std::int64_t{b} * Tn * C, C, h * HS, i0, W, Tn, HS, 1.0f);
  float const li = i < Tn ? lse[std::int64_t{blockIdx.y} * Tn + i] : 0.0f;
  float const di = i < Tn ? D[std::int64_t{blockIdx.y} * Tn + i] : 0.0f;

  float dq[P] = {};
  int const last = min(i0 + W, Tn) - 1;
  for (int j0 = 0; j0 <= last; j0 += K) {
    __syncthreads();
    attention_tile_load(kt, stride, seq, C3, C + h * HS, j0, K, Tn, HS, 1.0f);
    attention_tile_load(vt, stride, seq, C3, 2 * C + h * HS, j0, K, Tn, HS, 1.0f);
    __syncthreads();
    if (i >= Tn || j0 > i) continue;  // uniform over the warp
    int const j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < HS; ++d) {
        s += qr[warp * HS + d] * kt[lane * stride + d];
        dp += gr[warp * HS + d] * vt[lane * stride + d];
      }
      ds = attention_prob(s, li) * (dp - di);
    }
    for (int jj = 0; jj < K; ++jj) {
      float const dsj = __shfl_sync(attention_full_mask, ds, jj);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        int const d = lane + 32 * k;
        if (d < HS) dq[k] += dsj * kt[jj * stride + d];
      }
    }
  }
  if (i < Tn) {
    T* const row = dqkv + (std::int64_t{b} * Tn + i) * C3 + h * HS;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      int const d = lane + 32 * k;
      if (d < HS) row[d] = from_float<T>(to_float(row[d]) + dq[k] * scale);
    }
  }
}

TIDE_ABI_NAMESPACE_END

inline void check_attention_cuda_limits(char const* op, attention_dims const& d) {
  TIDE_REQUIRE(d.HS <= attention_cuda_tuning::max_head_size, op, " on CUDA supports head sizes up to ",
               attention_cuda_tuning::max_head_size, ", got HS = C / NH = ", d.C, " / ", d.NH, " = ", d.HS,
               "; use more heads");
  TIDE_REQUIRE(d.B * d.NH <= 65535 && d.T <= INT_MAX / 3 && d.C <= INT_MAX / 3, op,
               " on CUDA supports B * NH <= 65535 and T, 3C < 2^31, got B = ", d.B, ", NH = ", d.NH, ", T = ", d.T,
               ", C = ", d.C, "; split the batch");
}

// Shared memory of the three tiled kernels, in bytes.
inline std::size_t attention_smem_bytes(attention_dims const& d, int extra_rows_of_hs, int extra_floats) {
  constexpr int K = attention_cuda_tuning::tile;
  auto const hs = static_cast<int>(d.HS);
  return sizeof(float) *
         static_cast<std::size_t>(2 * K * attention_tile_stride(hs) + extra_rows_of_hs * hs + extra_floats);
}

}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

// Scratch on CUDA. With ex.blas (cuBLAS): one sequence's scores, (NH, T, T) fp32 and as much
// again for P (the backward: dP too, and the rows' dout . out, B NH T floats first). Without:
// none forward; backward, each query row's dout . out (B NH T floats). The fused bf16 kernels
// (ex.flash_attention) use none of the forward's and the rows' dout . out of the backward's; the
// rest is asked for all the same (the query does not know the element type).
inline std::size_t attention_forward_scratch_bytes(exec<tide::cuda> const& ex, index_t batch, index_t T, index_t,
                                                   index_t NH) noexcept {
  return ex.blas != nullptr ? detail::attention_gemm_parts(false, batch, T, NH).bytes : 0;
}
inline std::size_t attention_backward_scratch_bytes(exec<tide::cuda> const& ex, index_t batch, index_t T, index_t,
                                                    index_t NH) noexcept {
  if (ex.blas != nullptr) return detail::attention_gemm_parts(true, batch, T, NH).bytes;
  return static_cast<std::size_t>(batch * NH * T) * sizeof(float);
}

// out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C); as the host overload. HS <= 128.
template <Element T, class Q>
  requires ReadView<Q, T, tide::cuda>
void attention_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, tensor_view<float, tide::cuda> lse,
                       Q qkv, index_t NH, scratch<tide::cuda> ws) {
  auto const d = detail::check_attention_forward(out, lse, qkv, NH);
  detail::check_scratch("attention_forward", "attention_forward_scratch_bytes", ws,
                        attention_forward_scratch_bytes(ex, d.B, d.T, d.C, d.NH));
  if constexpr (std::is_same_v<T, bf16>) {
    if (ex.flash_attention && detail::attention_mma_fits_forward(d)) {  // fused on tensor cores; the scratch unused
      if (d.B != 0 && d.T != 0) detail::attention_forward_mma(ex, d, out.data(), lse.data(), qkv.data());
      return;
    }
  }
  if (ex.blas != nullptr) {
    detail::check_attention_gemm_limits("attention_forward", d);
    if (d.B != 0 && d.T != 0) attention_gemm::forward(ex, d, out.data(), lse.data(), qkv.data(), ws);
    return;
  }
  detail::check_attention_cuda_limits("attention_forward", d);
  if (d.B == 0 || d.T == 0) return;
  constexpr int W = attention_cuda_tuning::warps;
  dim3 const grid(static_cast<unsigned>((d.T + W - 1) / W), static_cast<unsigned>(d.B * d.NH));
  detail::attention_forward_kernel<T><<<grid, 32 * W, detail::attention_smem_bytes(d, W, 0), ex.stream>>>(
      out.data(), lse.data(), qkv.data(), static_cast<int>(d.T), static_cast<int>(d.C), static_cast<int>(d.NH),
      static_cast<int>(d.HS), attention_scale(d.HS));
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// dqkv (B, T, 3C) += the gradient, from dout and the forward's out and lse; as the host overload.
template <Element T, class D, class Q, class O, class L>
  requires ReadView<D, T, tide::cuda> && ReadView<Q, T, tide::cuda> && ReadView<O, T, tide::cuda> &&
      ReadView<L, float, tide::cuda>
void attention_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dqkv, D dout, Q qkv, O out, L lse,
                        index_t NH, scratch<tide::cuda> ws) {
  auto const d = detail::check_attention_backward(dqkv, dout, qkv, out, lse, NH);
  bool fused = false;  // on tensor cores, WMMA (bf16, ex.flash_attention): the cuBLAS path's T limit does not apply
  if constexpr (std::is_same_v<T, bf16>) fused = ex.flash_attention && detail::attention_mma_fits_backward(d);
  if (ex.blas != nullptr && !fused) detail::check_attention_gemm_limits("attention_backward", d);
  else detail::check_attention_cuda_limits("attention_backward", d);
  detail::check_scratch("attention_backward", "attention_backward_scratch_bytes", ws,
                        attention_backward_scratch_bytes(ex, d.B, d.T, d.C, d.NH));
  if (d.B == 0 || d.T == 0) return;
  constexpr int W = attention_cuda_tuning::warps, K = attention_cuda_tuning::tile;
  int const Tn = static_cast<int>(d.T), C = static_cast<int>(d.C), NHi = static_cast<int>(d.NH),
            HS = static_cast<int>(d.HS);
  float* const rowdot = detail::scratch_part<float>(ws, 0);  // (B, NH, T), first on both paths

  constexpr int rows_per_block = attention_cuda_tuning::rows_block / 32;
  auto const rowdot_blocks = static_cast<unsigned>((d.B * d.NH * d.T + rows_per_block - 1) / rows_per_block);
  detail::attention_rowdot_kernel<T><<<rowdot_blocks, attention_cuda_tuning::rows_block, 0, ex.stream>>>(
      rowdot, dout.data(), out.data(), static_cast<int>(d.B), Tn, C, NHi, HS);
  TIDE_CUDA_CHECK(cudaGetLastError());
  if constexpr (std::is_same_v<T, bf16>) {
    if (fused) {
      detail::attention_backward_mma(ex, d, dqkv.data(), dout.data(), qkv.data(), lse.data(), rowdot);
      return;
    }
  }
  if (ex.blas != nullptr) {
    attention_gemm::backward(ex, d, dqkv.data(), dout.data(), qkv.data(), lse.data(), ws);
    return;
  }

  dim3 const grid(static_cast<unsigned>((d.T + W - 1) / W), static_cast<unsigned>(d.B * d.NH));
  float const scale = attention_scale(d.HS);
  detail::attention_backward_kv_kernel<T><<<grid, 32 * W, detail::attention_smem_bytes(d, 2 * W, 2 * K), ex.stream>>>(
      dqkv.data(), dout.data(), qkv.data(), lse.data(), rowdot, Tn, C, NHi, HS, scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
  detail::attention_backward_q_kernel<T><<<grid, 32 * W, detail::attention_smem_bytes(d, 2 * W, 0), ex.stream>>>(
      dqkv.data(), dout.data(), qkv.data(), lse.data(), rowdot, Tn, C, NHi, HS, scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
