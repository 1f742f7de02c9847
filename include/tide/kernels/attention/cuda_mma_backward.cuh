#pragma once
// Causal attention backward fused on tensor cores (WMMA, bf16 in, fp32 accumulate): the backward
// of attention/cuda_mma.cuh's forward, taken with it when exec<cuda>::flash_attention is set
// (attention/cuda.cuh). FlashAttention-2's two passes, each gradient with one owner (no atomics,
// sums in a fixed order, the same bits run after run), every probability recomputed from the
// forward's lse, D = dout . out per row first (the rowdot kernel of attention/cuda.cuh):
//
//   dK, dV   a block of 4 warps takes 64 keys of one (b, h), 16 per warp, and walks the query
//            tiles of 32 rows from its first key on; each warp
//              S^T  (16, 32) = K_w Q^T          P^T = exp(scale S^T - lse), 0 where query < key
//              dV_w (16, HS) += P^T dO          dP^T (16, 32) = V_w dO^T
//              dS^T = P^T (dP^T - D)            dK_w (16, HS) += dS^T Q
//   dQ       a block of 4 warps takes 64 queries, 16 per warp, and walks the key tiles of 32
//            rows up to its last query; each warp
//              S (16, 32) = Q_w K^T, P, dP = dO_w V^T, dS = P (dP - D), dQ_w (16, HS) += dS K
//
// and adds scale dK, dV and scale dQ into dqkv (+=, rounded once to bf16). P and dS enter their
// products rounded to bf16, as FlashAttention's do. dK, dV, dQ accumulate in shared fp32 (O is
// kept so in the forward too). Shared memory a block: dK dV 80 KiB at HS 64, 136 KiB at 128;
// dQ 58 KiB and 98 KiB; where the device has less (sm_86: 99 KiB) the cuBLAS backward runs. Not
// tuned, and not yet run on a GPU: gpu/kernels compares it with the host.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/attention/cuda_mma.cuh"
#include "tide/kernels/attention/math.hpp"

namespace tide::kernels {
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

// The backward's shared layout: pitches as the forward's (attention_mma_layout), 64 rows of the
// block's own (keys for dK dV, queries for dQ) and tiles of 32 of the others, then per warp a
// (16, 32) fp32 score tile, bf16 tiles for P^T and dS (dS alone for dQ) and fp32 accumulators.
struct attention_mma_backward_layout {
  attention_mma_layout f;
  __host__ __device__ constexpr std::size_t own() const noexcept {
    return std::size_t{2} * attention_mma_tuning::rows * f.ldh();
  }
  __host__ __device__ constexpr std::size_t tile() const noexcept { return f.kv_bytes(); }
  __host__ __device__ constexpr std::size_t rows32() const noexcept { return std::size_t{4} * 32; }  // lse or D of a tile
  __host__ __device__ constexpr std::size_t kv_warp() const noexcept {
    return f.s_bytes() + 2 * f.p_bytes() + 2 * f.o_bytes();
  }
  __host__ __device__ constexpr std::size_t q_warp() const noexcept { return f.s_bytes() + f.p_bytes() + f.o_bytes(); }
  __host__ __device__ constexpr std::size_t kv_bytes() const noexcept {
    return 2 * own() + 2 * tile() + 2 * rows32() + attention_mma_tuning::warps * kv_warp();
  }
  __host__ __device__ constexpr std::size_t q_bytes() const noexcept {
    return 2 * own() + 2 * tile() + attention_mma_tuning::warps * q_warp();
  }
};

// dst[r, c0 + d] += scale * acc[r, d] for the row (bf16, rounded once), d over this lane's half.
__device__ inline void attention_mma_add_row(bf16* dst, float const* acc, int HS, int side, float scale) {
  for (int d = side * (HS / 2); d < (side + 1) * (HS / 2); ++d)
    dst[d] = from_float<bf16>(to_float(dst[d]) + scale * acc[d]);
}

template <class T>
__global__ void __launch_bounds__(32 * attention_mma_tuning::warps)
    attention_backward_kv_mma_kernel(T* __restrict__ dqkv, T const* __restrict__ dout, T const* __restrict__ qkv,
                                     float const* __restrict__ lse, float const* __restrict__ D, int Tn, int C, int NH,
                                     int HS, float scale) {
  static_assert(std::is_same_v<T, bf16>, "attention_backward_kv_mma_kernel: bf16 only (WMMA's bf16 fragments)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 fragments need sm_80; attention_mma_fits() keeps older devices off this path
#else
  constexpr int R = attention_mma_tuning::rows, Q = attention_mma_tuning::keys;
  extern __shared__ __align__(128) unsigned char attention_mma_smem[];
  attention_mma_backward_layout const L{{HS}};
  int const ldh = L.f.ldh(), lds = L.f.lds(), ldp = L.f.ldp(), ldo = L.f.ldo();
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* at = attention_mma_smem;
  auto* const ks = reinterpret_cast<std::uint16_t*>(at);  // (R, ldh): the block's keys
  auto* const vs = reinterpret_cast<std::uint16_t*>(at += L.own());
  auto* const qs = reinterpret_cast<std::uint16_t*>(at += L.own());  // (Q, ldh): a query tile
  auto* const gs = reinterpret_cast<std::uint16_t*>(at += L.tile());  // (Q, ldh): its dout
  auto* const lt = reinterpret_cast<float*>(at += L.tile());          // (Q): its lse
  auto* const dt = reinterpret_cast<float*>(at += L.rows32());        // (Q): its D
  at += L.rows32() + warp * L.kv_warp();
  auto* const ss = reinterpret_cast<float*>(at);                      // (16, lds): S^T, then dP^T
  auto* const ps = reinterpret_cast<std::uint16_t*>(at += L.f.s_bytes());  // (16, ldp): P^T
  auto* const ds = reinterpret_cast<std::uint16_t*>(at += L.f.p_bytes());  // (16, ldp): dS^T
  auto* const dk = reinterpret_cast<float*>(at += L.f.p_bytes());          // (16, ldo)
  auto* const dv = reinterpret_cast<float*>(at += L.f.o_bytes());          // (16, ldo)

  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const k0 = blockIdx.x * R, kw = k0 + 16 * warp;  // the block's and the warp's first key
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  T const* const gseq = dout + std::int64_t{b} * Tn * C;
  float const* const lrow = lse + std::int64_t{blockIdx.y} * Tn;
  float const* const drow = D + std::int64_t{blockIdx.y} * Tn;
  attention_mma_load(ks, ldh, seq, C3, C + h * HS, k0, R, Tn, HS);
  attention_mma_load(vs, ldh, seq, C3, 2 * C + h * HS, k0, R, Tn, HS);
  for (int e = lane; e < 16 * ldo; e += 32) dk[e] = dv[e] = 0.0f;

  // Lane l keeps key row l / 2 of the warp's 16, and its side l % 2 of the 32 query columns.
  int const rr = lane / 2, side = lane % 2, j = kw + rr;
  constexpr int per = Q / 2;
  for (int i0 = k0; i0 < Tn; i0 += Q) {  // queries at or after the block's first key
    __syncthreads();  // the previous tile is consumed (and the keys are written)
    attention_mma_load(qs, ldh, seq, C3, h * HS, i0, Q, Tn, HS);
    attention_mma_load(gs, ldh, gseq, C, h * HS, i0, Q, Tn, HS);
    for (int e = threadIdx.x; e < Q; e += blockDim.x) {
      lt[e] = i0 + e < Tn ? lrow[i0 + e] : 0.0f;
      dt[e] = i0 + e < Tn ? drow[i0 + e] : 0.0f;
    }
    __syncthreads();
    if (kw >= Tn || i0 + Q - 1 < kw) continue;  // uniform over the warp: no query of the tile sees its keys

    attention_mma_abt(ss, lds, ks + 16 * warp * ldh, qs, ldh, HS);  // S^T = K_w Q^T (16, 32)
    __syncwarp();
    float p[per];
#pragma unroll
    for (int c = 0; c < per; ++c) {
      int const q = side * per + c, i = i0 + q;
      p[c] = j < Tn && i < Tn && i >= j ? attention_prob(ss[rr * lds + q] * scale, lt[q]) : 0.0f;
      ps[rr * ldp + q] = from_float<bf16>(p[c]).bits;
    }
    __syncwarp();
    attention_mma_acc(dv, ldo, ps, ldp, gs, ldh, HS);                // dV_w += P^T dO
    attention_mma_abt(ss, lds, vs + 16 * warp * ldh, gs, ldh, HS);  // dP^T = V_w dO^T (16, 32)
    __syncwarp();
#pragma unroll
    for (int c = 0; c < per; ++c) {
      int const q = side * per + c;
      ds[rr * ldp + q] = from_float<bf16>(p[c] * (ss[rr * lds + q] - dt[q])).bits;
    }
    __syncwarp();
    attention_mma_acc(dk, ldo, ds, ldp, qs, ldh, HS);  // dK_w += dS^T Q
    __syncwarp();
  }
  if (j < Tn) {
    T* const row = dqkv + (std::int64_t{b} * Tn + j) * C3 + h * HS;
    attention_mma_add_row(row + C, dk + rr * ldo, HS, side, scale);
    attention_mma_add_row(row + 2 * C, dv + rr * ldo, HS, side, 1.0f);
  }
#endif
}

template <class T>
__global__ void __launch_bounds__(32 * attention_mma_tuning::warps)
    attention_backward_q_mma_kernel(T* __restrict__ dqkv, T const* __restrict__ dout, T const* __restrict__ qkv,
                                    float const* __restrict__ lse, float const* __restrict__ D, int Tn, int C, int NH,
                                    int HS, float scale) {
  static_assert(std::is_same_v<T, bf16>, "attention_backward_q_mma_kernel: bf16 only (WMMA's bf16 fragments)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 fragments need sm_80; attention_mma_fits() keeps older devices off this path
#else
  constexpr int R = attention_mma_tuning::rows, K = attention_mma_tuning::keys;
  extern __shared__ __align__(128) unsigned char attention_mma_smem[];
  attention_mma_backward_layout const L{{HS}};
  int const ldh = L.f.ldh(), lds = L.f.lds(), ldp = L.f.ldp(), ldo = L.f.ldo();
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* at = attention_mma_smem;
  auto* const qs = reinterpret_cast<std::uint16_t*>(at);  // (R, ldh): the block's queries
  auto* const gs = reinterpret_cast<std::uint16_t*>(at += L.own());   // (R, ldh): their dout
  auto* const ks = reinterpret_cast<std::uint16_t*>(at += L.own());   // (K, ldh): a key tile
  auto* const vs = reinterpret_cast<std::uint16_t*>(at += L.tile());  // (K, ldh)
  at += L.tile() + warp * L.q_warp();
  auto* const ss = reinterpret_cast<float*>(at);                           // (16, lds): S, then dP
  auto* const ds = reinterpret_cast<std::uint16_t*>(at += L.f.s_bytes());  // (16, ldp): dS
  auto* const dq = reinterpret_cast<float*>(at += L.f.p_bytes());          // (16, ldo)

  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const q0 = blockIdx.x * R, r0 = q0 + 16 * warp;  // the block's and the warp's first query
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  attention_mma_load(qs, ldh, seq, C3, h * HS, q0, R, Tn, HS);
  attention_mma_load(gs, ldh, dout + std::int64_t{b} * Tn * C, C, h * HS, q0, R, Tn, HS);
  for (int e = lane; e < 16 * ldo; e += 32) dq[e] = 0.0f;

  // Lane l keeps query row l / 2 of the warp's 16, and its side l % 2 of the 32 key columns.
  int const rr = lane / 2, side = lane % 2, i = r0 + rr;
  float const li = i < Tn ? lse[std::int64_t{blockIdx.y} * Tn + i] : 0.0f;
  float const di = i < Tn ? D[std::int64_t{blockIdx.y} * Tn + i] : 0.0f;
  constexpr int per = K / 2;
  int const last = min(q0 + R, Tn) - 1;  // keys 0 .. the block's last query
  for (int j0 = 0; j0 <= last; j0 += K) {
    __syncthreads();  // the previous tile is consumed (and the queries are written)
    attention_mma_load(ks, ldh, seq, C3, C + h * HS, j0, K, Tn, HS);
    attention_mma_load(vs, ldh, seq, C3, 2 * C + h * HS, j0, K, Tn, HS);
    __syncthreads();
    if (r0 >= Tn || j0 > r0 + 15) continue;  // uniform over the warp: no row of it sees this tile

    attention_mma_abt(ss, lds, qs + 16 * warp * ldh, ks, ldh, HS);  // S = Q_w K^T (16, 32)
    __syncwarp();
    float p[per];
#pragma unroll
    for (int c = 0; c < per; ++c) {
      int const k = side * per + c, j = j0 + k;
      p[c] = i < Tn && j <= i ? attention_prob(ss[rr * lds + k] * scale, li) : 0.0f;
    }
    __syncwarp();
    attention_mma_abt(ss, lds, gs + 16 * warp * ldh, vs, ldh, HS);  // dP = dO_w V^T (16, 32)
    __syncwarp();
#pragma unroll
    for (int c = 0; c < per; ++c) {
      int const k = side * per + c;
      ds[rr * ldp + k] = from_float<bf16>(p[c] * (ss[rr * lds + k] - di)).bits;
    }
    __syncwarp();
    attention_mma_acc(dq, ldo, ds, ldp, ks, ldh, HS);  // dQ_w += dS K
    __syncwarp();
  }
  if (i < Tn) attention_mma_add_row(dqkv + (std::int64_t{b} * Tn + i) * C3 + h * HS, dq + rr * ldo, HS, side, scale);
#endif
}

inline bool attention_mma_fits_backward(attention_dims const& d) {
  attention_mma_backward_layout const L{{static_cast<int>(d.HS)}};
  return attention_mma_fits(d, L.kv_bytes() > L.q_bytes() ? L.kv_bytes() : L.q_bytes());
}

// dqkv += the gradient, from dout, qkv, the forward's lse and D = dout . out per row (B NH T).
inline void attention_backward_mma(exec<tide::cuda> const& ex, attention_dims const& d, bf16* dqkv, bf16 const* dout,
                                   bf16 const* qkv, float const* lse, float const* D) {
  constexpr int R = attention_mma_tuning::rows;
  attention_mma_backward_layout const L{{static_cast<int>(d.HS)}};
  int const limit = attention_mma_smem_limit();  // the device's, always (see attention_forward_mma)
  TIDE_CUDA_CHECK(
      cudaFuncSetAttribute(attention_backward_kv_mma_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  TIDE_CUDA_CHECK(
      cudaFuncSetAttribute(attention_backward_q_mma_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  dim3 const grid(static_cast<unsigned>((d.T + R - 1) / R), static_cast<unsigned>(d.B * d.NH));
  int const Tn = static_cast<int>(d.T), C = static_cast<int>(d.C), NH = static_cast<int>(d.NH),
            HS = static_cast<int>(d.HS);
  float const scale = attention_scale(d.HS);
  attention_backward_kv_mma_kernel<bf16><<<grid, 32 * attention_mma_tuning::warps, static_cast<int>(L.kv_bytes()),
                                           ex.stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, HS, scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
  attention_backward_q_mma_kernel<bf16><<<grid, 32 * attention_mma_tuning::warps, static_cast<int>(L.q_bytes()),
                                          ex.stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, HS, scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace tide::kernels
