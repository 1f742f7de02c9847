#pragma once
// Causal attention forward fused on tensor cores (WMMA: bf16 in, fp32 accumulate), for bf16 and
// head sizes that are multiples of 16 up to 128; taken when exec<cuda>::flash_attention is set
// (attention/cuda.cuh). FlashAttention-2's loop: a block of 4 warps takes 64 query rows of one
// (b, h), 16 per warp, and walks the key tiles of 32 rows up to its last query; each warp
//
//   S (16, 32)   = Q_w K_tile^T           WMMA into fp32, stored to the warp's shared scores
//   online softmax of S * scale           two lanes a row, with attention/math.hpp's online_softmax
//                                         and exp_poly: the same per-row math as the other paths
//   O_w (16, HS) = alpha O_w + P V_tile   O_w kept in shared fp32, scaled by the lanes, then
//                                         loaded as the accumulator of P (bf16) V (WMMA)
//
// and at the end writes out = O / l (bf16) and lse = m + log l, which the backward of either
// other path reads (the cuBLAS one recomputes P from lse). No (T, T) buffer, no scratch, and the
// tiles above the diagonal are skipped. P enters the second product rounded to bf16 while l sums
// it in fp32, as FlashAttention does: a difference of 2^-9 relative per weight, inside bf16's
// tolerance. Not tuned, and not yet run on a GPU: gpu/kernels compares it with the host.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/error.hpp"
#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/attention/math.hpp"

namespace tide::kernels {

struct attention_mma_tuning {
  // The product helpers below take tiles of 32 keys (queries, in the backward's dK dV kernel).
  static constexpr int warps = 4;                // 16 query rows each
  static constexpr int rows = 16 * warps;        // query rows of a block
  static constexpr int keys = 32;                // key and value rows of a tile
  static constexpr int max_head_size = 128;
};

namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

// The shared layout, in elements of each region; every region and every fragment's first
// element start on 32 bytes (WMMA's alignment), the row pitches are multiples of 8 bf16 or 4
// floats (WMMA's ldm), padded past the row to spread the banks.
struct attention_mma_layout {
  int hs;
  __host__ __device__ constexpr int ldh() const noexcept { return hs + 8; }  // q, k, v rows (bf16)
  __host__ __device__ constexpr int lds() const noexcept { return attention_mma_tuning::keys + 4; }  // scores (float)
  __host__ __device__ constexpr int ldp() const noexcept { return attention_mma_tuning::keys + 8; }  // P (bf16)
  __host__ __device__ constexpr int ldo() const noexcept { return hs + 4; }  // O (float)
  __host__ __device__ constexpr std::size_t q_bytes() const noexcept {
    return std::size_t{2} * attention_mma_tuning::rows * ldh();
  }
  __host__ __device__ constexpr std::size_t kv_bytes() const noexcept {
    return std::size_t{2} * attention_mma_tuning::keys * ldh();
  }
  __host__ __device__ constexpr std::size_t s_bytes() const noexcept { return std::size_t{4} * 16 * lds(); }  // a warp's
  __host__ __device__ constexpr std::size_t p_bytes() const noexcept { return std::size_t{2} * 16 * ldp(); }
  __host__ __device__ constexpr std::size_t o_bytes() const noexcept { return std::size_t{4} * 16 * ldo(); }
  __host__ __device__ constexpr std::size_t bytes() const noexcept {
    return q_bytes() + 2 * kv_bytes() + attention_mma_tuning::warps * (s_bytes() + p_bytes() + o_bytes());
  }
};

// Rows [r0, r0 + rows) of channels [c0, c0 + HS) of a (T, ld) bf16 sequence into shared
// (rows, pitch) as bf16 bits; rows past T read as 0.
__device__ inline void attention_mma_load(std::uint16_t* dst, int pitch, bf16 const* seq, std::int64_t ld, int c0,
                                          int r0, int rows, int Tn, int HS) {
  for (int e = threadIdx.x; e < rows * HS; e += blockDim.x) {
    int const r = e / HS, d = e % HS;
    dst[r * pitch + d] = r0 + r < Tn ? seq[(r0 + r) * ld + c0 + d].bits : std::uint16_t{0};
  }
}

// The warp's two products on shared memory (bf16 operands as bits, row-major, pitches and 32-byte
// alignment as attention_mma_layout's; sm_80 and later):
//   s (16, 32) fp32  = a (16, HS) b^T, b (32, HS): b's rows read as the columns of a col-major B
//   c (16, HS) fp32 += a (16, 32) b,   b (32, HS): c loaded as the accumulator, stored back
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ inline void attention_mma_abt(float* s, int lds, std::uint16_t const* a, std::uint16_t const* b, int ld,
                                         int HS) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
  wmma::fill_fragment(acc[0], 0.0f);
  wmma::fill_fragment(acc[1], 0.0f);
  for (int k0 = 0; k0 < HS; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> x;
    wmma::load_matrix_sync(x, reinterpret_cast<__nv_bfloat16 const*>(a + k0), ld);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> y;
      wmma::load_matrix_sync(y, reinterpret_cast<__nv_bfloat16 const*>(b + 16 * n * ld + k0), ld);
      wmma::mma_sync(acc[n], x, y, acc[n]);
    }
  }
  wmma::store_matrix_sync(s, acc[0], lds, wmma::mem_row_major);
  wmma::store_matrix_sync(s + 16, acc[1], lds, wmma::mem_row_major);
}
__device__ inline void attention_mma_acc(float* c, int ldc, std::uint16_t const* a, int lda, std::uint16_t const* b,
                                         int ldb, int HS) {
  namespace wmma = nvcuda::wmma;
  for (int n0 = 0; n0 < HS; n0 += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, c + n0, ldc, wmma::mem_row_major);
#pragma unroll
    for (int k0 = 0; k0 < 32; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> x;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> y;
      wmma::load_matrix_sync(x, reinterpret_cast<__nv_bfloat16 const*>(a + k0), lda);
      wmma::load_matrix_sync(y, reinterpret_cast<__nv_bfloat16 const*>(b + k0 * ldb + n0), ldb);
      wmma::mma_sync(acc, x, y, acc);
    }
    wmma::store_matrix_sync(c + n0, acc, ldc, wmma::mem_row_major);
  }
}
#endif

// T is bf16 (a template, as every kernel in a header: one definition across translation units).
template <class T>
__global__ void __launch_bounds__(32 * attention_mma_tuning::warps)
    attention_forward_mma_kernel(T* __restrict__ out, float* __restrict__ lse, T const* __restrict__ qkv, int Tn, int C,
                                 int NH, int HS, float scale) {
  static_assert(std::is_same_v<T, bf16>, "attention_forward_mma_kernel: bf16 only (WMMA's bf16 fragments)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 fragments need sm_80; attention_mma_fits() keeps older devices off this path
#else
  constexpr int W = attention_mma_tuning::warps, R = attention_mma_tuning::rows, K = attention_mma_tuning::keys;
  extern __shared__ __align__(128) unsigned char attention_mma_smem[];
  attention_mma_layout const L{HS};
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* at = attention_mma_smem;
  auto* const qs = reinterpret_cast<std::uint16_t*>(at);  // (R, ldh)
  at += L.q_bytes();
  auto* const ks = reinterpret_cast<std::uint16_t*>(at);  // (K, ldh)
  at += L.kv_bytes();
  auto* const vs = reinterpret_cast<std::uint16_t*>(at);  // (K, ldh)
  at += L.kv_bytes();
  auto* const ss = reinterpret_cast<float*>(at + warp * L.s_bytes());  // this warp's (16, lds)
  at += W * L.s_bytes();
  auto* const ps = reinterpret_cast<std::uint16_t*>(at + warp * L.p_bytes());  // (16, ldp)
  at += W * L.p_bytes();
  auto* const os = reinterpret_cast<float*>(at + warp * L.o_bytes());  // (16, ldo)

  int const b = blockIdx.y / NH, h = blockIdx.y % NH;
  int const q0 = blockIdx.x * R, r0 = q0 + 16 * warp;  // the block's and the warp's first query
  std::int64_t const C3 = 3 * std::int64_t{C};
  T const* const seq = qkv + std::int64_t{b} * Tn * C3;
  attention_mma_load(qs, L.ldh(), seq, C3, h * HS, q0, R, Tn, HS);
  for (int e = lane; e < 16 * L.ldo(); e += 32) os[e] = 0.0f;

  // Lane l keeps row l / 2 of the warp's 16: its side l % 2 (a half) of the scores' and the output's
  // columns.
  int const rr = lane / 2, side = lane % 2, i = r0 + rr;
  online_softmax st;
  int const last = min(q0 + R, Tn) - 1;  // keys 0 .. the block's last query
  for (int j0 = 0; j0 <= last; j0 += K) {
    __syncthreads();  // the previous tile is consumed (and qs is written)
    attention_mma_load(ks, L.ldh(), seq, C3, C + h * HS, j0, K, Tn, HS);
    attention_mma_load(vs, L.ldh(), seq, C3, 2 * C + h * HS, j0, K, Tn, HS);
    __syncthreads();
    if (r0 >= Tn || j0 > r0 + 15) continue;  // uniform over the warp: no row of it sees this tile

    attention_mma_abt(ss, L.lds(), qs + 16 * warp * L.ldh(), ks, L.ldh(), HS);  // S = Q_w K^T (16, 32)
    __syncwarp();

    // The online softmax of row i over this tile's 32 keys, 16 per lane of the pair.
    constexpr int per = K / 2;
    float z[per];
    float block_max = -__builtin_huge_valf();
#pragma unroll
    for (int c = 0; c < per; ++c) {
      int const j = j0 + side * per + c;
      z[c] = i < Tn && j <= i ? ss[rr * L.lds() + side * per + c] * scale : -__builtin_huge_valf();
      block_max = fmaxf(block_max, z[c]);
    }
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
    float alpha = 1.0f;
    float part = 0.0f;
    bool const any = block_max > -__builtin_huge_valf();  // the row has a key in this tile
    if (any) alpha = st.rescale(block_max);
#pragma unroll
    for (int c = 0; c < per; ++c) {
      float const p = any && z[c] > -__builtin_huge_valf() ? st.weight(z[c]) : 0.0f;
      part += p;
      ps[rr * L.ldp() + side * per + c] = from_float<bf16>(p).bits;
    }
    st.sum += part + __shfl_xor_sync(0xffffffffu, part, 1);
    int const d0 = side * (HS / 2);
    for (int d = d0; d < d0 + HS / 2; ++d) os[rr * L.ldo() + d] *= alpha;
    __syncwarp();

    attention_mma_acc(os, L.ldo(), ps, L.ldp(), vs, L.ldh(), HS);  // O_w += P V (16, HS)
    __syncwarp();
  }
  if (i < Tn) {
    float const inv = 1.0f / st.sum;
    int const d0 = side * (HS / 2);
    T* const row = out + (std::int64_t{b} * Tn + i) * C + h * HS;
    for (int d = d0; d < d0 + HS / 2; ++d) row[d] = from_float<bf16>(os[rr * L.ldo() + d] * inv);
    if (side == 0) lse[(std::int64_t{b} * NH + h) * Tn + i] = st.lse();
  }
#endif
}

// The shared memory a block of the fused kernels may have on the current device: its opt-in
// limit (99 KiB on sm_86 and sm_89, 163 KiB on sm_80, 227 KiB on sm_90), or 0 before compute
// capability 8.0 (no bf16 fragments).
inline int attention_mma_smem_limit() {
  int device = 0, major = 0, limit = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return major >= 8 ? limit : 0;
}

// Whether a fused kernel needing `smem` bytes of shared memory a block takes these dims on the
// current device (bf16 only: the caller checks the element type).
inline bool attention_mma_fits(attention_dims const& d, std::size_t smem) {
  return d.HS % 16 == 0 && d.HS <= attention_mma_tuning::max_head_size && d.B * d.NH <= 65535 &&
         d.T <= (std::int64_t{1} << 30) && d.C <= INT_MAX / 3 &&
         smem <= static_cast<std::size_t>(attention_mma_smem_limit());
}
inline bool attention_mma_fits_forward(attention_dims const& d) {
  return attention_mma_fits(d, attention_mma_layout{static_cast<int>(d.HS)}.bytes());
}

inline void attention_forward_mma(exec<tide::cuda> const& ex, attention_dims const& d, bf16* out, float* lse,
                                  bf16 const* qkv) {
  constexpr int R = attention_mma_tuning::rows;
  attention_mma_layout const L{static_cast<int>(d.HS)};
  auto const smem = static_cast<int>(L.bytes());  // 49 KiB at HS 64, 81 KiB at 128: over the default 48
  // The device's limit, always: a call with another HS on another thread never lowers it.
  TIDE_CUDA_CHECK(cudaFuncSetAttribute(attention_forward_mma_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       attention_mma_smem_limit()));
  dim3 const grid(static_cast<unsigned>((d.T + R - 1) / R), static_cast<unsigned>(d.B * d.NH));
  attention_forward_mma_kernel<bf16><<<grid, 32 * attention_mma_tuning::warps, smem, ex.stream>>>(
      out, lse, qkv, static_cast<int>(d.T), static_cast<int>(d.C), static_cast<int>(d.NH), static_cast<int>(d.HS),
      attention_scale(d.HS));
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace tide::kernels
