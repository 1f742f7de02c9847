#pragma once
// The CUDA path of the matmul kernels: the same entry names with exec<cuda> and device views,
// enqueued on ex.stream. The row-major products map onto column-major cuBLAS as
// C^T = op(B)^T op(A)^T, the mapping llm.c uses. Sums in fp32 for every element type; f32 inputs
// in TF32 on tensor cores only when ex.tf32 is set (bf16 and f16 always run on tensor cores).
//
// With ex.lt (cuBLASLt) set, as memory::compute_context<cuda> hands out:
//   forward        one cublasLtMatmul: bias added in the epilogue (CUBLASLT_EPILOGUE_BIAS), and
//                  for matmul_forward_gelu the GELU too, the pre-activation written to `pre` as
//                  the epilogue's aux output (CUBLASLT_EPILOGUE_GELU_AUX_BIAS): one pass over
//                  the output instead of three. bf16 outputs are rounded once, from fp32.
//   backward       cublasLtMatmul with beta = 1 (the gradients accumulate); dbias and the GELU
//                  backward as below
// A call cuBLASLt cannot take (a pointer not 16-byte aligned, a GELU output whose row length is
// not a multiple of 8, no algorithm from the heuristic) enqueues nothing there and runs the
// unfused path. Without ex.lt, and in that fallback, cublasGemmEx on ex.blas:
//   bias      written into the output rows by a kernel first, then the GEMM adds with beta = 1,
//             so a bf16 output is rounded once (as on the host)
//   GELU      the GELU kernel's gelu_forward (out = gelu(pre) on the stored pre) after the GEMM
// Either way:
//   GELU bwd  gelu_backward in place on dout first (as on the host); cuBLASLt's DGELU epilogue
//             would apply gelu' to a GEMM's output, the layer before this one's dinp, which the
//             model's separate calls do not line up with
//   dbias     column sums in a fixed order (32 columns x 8 row groups per block, partials added
//             in row-group order): deterministic, no atomics, and accumulating (+=), which
//             cuBLASLt's BGRAD epilogues (they overwrite) are not
// cuBLASLt's GELU is the tanh form, as tide's: tests/gpu/kernels.cu holds both paths to the
// host's outputs. The heuristic is asked once per shape (ex.lt_algos keeps its answers; without
// it, on every call, as llm.c does), always told 16-byte buffers, so that the bits depend on the
// shape and not on where offload put the tensors (the chunked policies are bit-identical to
// resident on CUDA). Not tuned (no GPU where it was written).

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <source_location>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/lt_cache.cuh"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/gelu/cuda.cuh"
#include "tide/kernels/matmul/checks.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Not tuned on a GPU: 256 threads per elementwise block, 32 x 8 threads per dbias block.
struct matmul_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 8;
  static constexpr int bias_columns = 32;  // threads along columns of a dbias block
  static constexpr int bias_rows = 8;      // row groups of a dbias block
};

// Kernels in detail's ABI namespace (tests/cuda/README.md).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

// out(n, o) = bias(o) for the N x OC rows.
template <class T>
__global__ void __launch_bounds__(matmul_cuda_tuning::block)
    matmul_bias_fill_kernel(T* __restrict__ out, T const* __restrict__ bias, index_t N, index_t OC) {
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * OC; i += stride)
    out[i] = bias[i % OC];
}

// dbias(o) += sum over n of dout(n, o). Block (32, 8) takes 32 columns; thread (x, y) sums rows
// y, y + 8, ... in order, then row group 0 adds the 8 partials in order: a fixed order.
template <class T>
__global__ void __launch_bounds__(matmul_cuda_tuning::bias_columns* matmul_cuda_tuning::bias_rows)
    matmul_dbias_kernel(T* __restrict__ dbias, T const* __restrict__ dout, index_t N, index_t OC) {
  constexpr int X = matmul_cuda_tuning::bias_columns, Y = matmul_cuda_tuning::bias_rows;
  __shared__ float partial[Y][X];
  index_t const o = static_cast<index_t>(blockIdx.x) * X + threadIdx.x;
  float acc = 0.0f;
  if (o < OC)
    for (index_t n = threadIdx.y; n < N; n += Y) acc += to_float(dout[n * OC + o]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < Y; ++y) s += partial[y][threadIdx.x];
    dbias[o] = from_float<T>(to_float(dbias[o]) + s);
  }
}

TIDE_ABI_NAMESPACE_END

[[noreturn]] inline void cublas_failed(cublasStatus_t status, char const* call, std::source_location where) {
  tide::detail::fail(errc::cuda, where, call, " returned ", cublasGetStatusName(status), " (",
                     cublasGetStatusString(status),
                     "); check the handle (exec<cuda>::blas), the shapes and the pointers");
}

inline void check_cublas(cublasStatus_t status, char const* call,
                         std::source_location where = std::source_location::current()) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    cublas_failed(status, call, where);
}

template <class T>
inline constexpr cudaDataType_t cublas_type = std::is_same_v<T, float>  ? CUDA_R_32F
                                              : std::is_same_v<T, bf16> ? CUDA_R_16BF
                                                                        : CUDA_R_16F;

// fp32 sums; f32 inputs as TF32 on tensor cores when the caller allows it.
template <class T>
cublasComputeType_t compute_type(exec<tide::cuda> const& ex) {
  return std::is_same_v<T, float> && ex.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The buffer alignment cuBLASLt's heuristic is told for every call (it assumes 256 bytes unless
// told; CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), whatever the pointers' own: the algorithm,
// and so the bits, then depend on the shape alone, not on where an offload policy placed the
// tensors. Pointers less aligned than this take the cublasGemmEx path.
inline constexpr std::uint32_t lt_alignment = 16;
inline bool lt_aligned(void const* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % lt_alignment == 0;
}

// The descriptors of one cuBLASLt call, destroyed on every path out of it.
struct lt_descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  lt_descriptors() = default;
  lt_descriptors(lt_descriptors const&) = delete;
  lt_descriptors& operator=(lt_descriptors const&) = delete;
  ~lt_descriptors() {
    if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
    if (c != nullptr) (void)cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
  }
};

template <class V>
void set_attribute(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t what, V const& value) {
  check_cublas(cublasLtMatmulDescSetAttribute(op, what, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}
template <class V>
void set_preference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t what, V const& value) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, what, &value, sizeof value),
               "cublasLtMatmulPreferenceSetAttribute");
}

}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

namespace matmul_cuda {

// A grid for a grid-stride loop over n elements.
inline unsigned grid_for(index_t n) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const needed = (n + matmul_cuda_tuning::block - 1) / matmul_cuda_tuning::block;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, index_t{sms} * matmul_cuda_tuning::blocks_per_sm));
}

// Row-major C (M, N) = op(A) @ op(B) + beta C (A stored (K, M) when transposed, B (N, K)).
template <class T>
void gemm(exec<tide::cuda> const& ex, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K, T const* a,
          index_t lda, T const* b, index_t ldb, float beta, T* c, index_t ldc) {
  float const alpha = 1.0f;
  detail::check_cublas(cublasSetStream(ex.blas, ex.stream), "cublasSetStream");
  constexpr cudaDataType_t type = detail::cublas_type<T>;
  detail::check_cublas(
      cublasGemmEx(ex.blas, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b, type,
                   static_cast<int>(ldb), a, type, static_cast<int>(lda), &beta, c, type, static_cast<int>(ldc),
                   detail::compute_type<T>(ex), CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

// The same product on cuBLASLt, with an epilogue: bias(N) added to every row when not null, and
// with aux set, out = gelu(pre) and pre (M, N) written to aux (leading dimension ldaux). Returns
// false, having enqueued nothing, when cuBLASLt cannot take the call (see the top of this file).
template <class T>
bool gemm_lt(exec<tide::cuda> const& ex, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K,
             T const* a, index_t lda, T const* b, index_t ldb, float beta, T* c, index_t ldc, T const* bias = nullptr,
             T* aux = nullptr, index_t ldaux = 0) {
  if (ex.lt == nullptr || ex.lt_workspace == nullptr) return false;
  for (void const* p : {static_cast<void const*>(a), static_cast<void const*>(b), static_cast<void const*>(c),
                        static_cast<void const*>(bias), static_cast<void const*>(aux)})
    if (p != nullptr && !detail::lt_aligned(p)) return false;
  if (aux != nullptr && ldaux % 8 != 0) return false;  // cuBLASLt's rule for the GELU aux
  constexpr cudaDataType_t type = detail::cublas_type<T>;
  detail::lt_descriptors lt;
  detail::check_cublas(cublasLtMatmulDescCreate(&lt.op, detail::compute_type<T>(ex), CUDA_R_32F),
                       "cublasLtMatmulDescCreate");
  // Column-major D (N x M) = op(b) (N x K) op(a) (K x M): b is cuBLAS's A, a its B.
  cublasOperation_t const op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t const op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, op_b);
  detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, op_a);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (aux != nullptr) epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else if (bias != nullptr) epilogue = CUBLASLT_EPILOGUE_BIAS;
  detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (bias != nullptr) detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux != nullptr) {
    detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
    detail::set_attribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{ldaux});
  }
  auto const u = [](index_t x) { return static_cast<std::uint64_t>(x); };
  detail::check_cublas(transpose_b ? cublasLtMatrixLayoutCreate(&lt.a, type, u(K), u(N), ldb)
                                   : cublasLtMatrixLayoutCreate(&lt.a, type, u(N), u(K), ldb),
                       "cublasLtMatrixLayoutCreate");
  detail::check_cublas(transpose_a ? cublasLtMatrixLayoutCreate(&lt.b, type, u(M), u(K), lda)
                                   : cublasLtMatrixLayoutCreate(&lt.b, type, u(K), u(M), lda),
                       "cublasLtMatrixLayoutCreate");
  detail::check_cublas(cublasLtMatrixLayoutCreate(&lt.c, type, u(N), u(M), ldc), "cublasLtMatrixLayoutCreate");
  detail::check_cublas(cublasLtMatmulPreferenceCreate(&lt.preference), "cublasLtMatmulPreferenceCreate");
  detail::set_preference(lt.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ex.lt_workspace_bytes);
  for (auto const which : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    detail::set_preference(lt.preference, which, detail::lt_alignment);
  tide::detail::lt_algo_cache::key const key{
      .m = M, .n = N, .k = K, .lda = lda, .ldb = ldb, .ldc = ldc, .ldaux = aux != nullptr ? ldaux : 0,
      .workspace = ex.lt_workspace_bytes, .type = static_cast<int>(type),
      .compute = static_cast<int>(detail::compute_type<T>(ex)), .epilogue = static_cast<int>(epilogue),
      .transpose_a = transpose_a, .transpose_b = transpose_b};
  std::optional<tide::detail::lt_algo_cache::answer> known;
  if (ex.lt_algos != nullptr) known = ex.lt_algos->find(key);
  if (!known) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    cublasStatus_t const asked = cublasLtMatmulAlgoGetHeuristic(ex.lt, lt.op, lt.a, lt.b, lt.c, lt.c, lt.preference,
                                                                1, &heuristic, &found);
    bool const none = asked == CUBLAS_STATUS_NOT_SUPPORTED || (asked == CUBLAS_STATUS_SUCCESS && found == 0);
    if (!none) detail::check_cublas(asked, "cublasLtMatmulAlgoGetHeuristic");
    known = tide::detail::lt_algo_cache::answer{.algo = heuristic.algo, .usable = !none};
    if (ex.lt_algos != nullptr) ex.lt_algos->put(key, *known);
  }
  if (!known->usable) return false;
  float const alpha = 1.0f;
  cublasStatus_t const ran = cublasLtMatmul(ex.lt, lt.op, &alpha, b, lt.a, a, lt.b, &beta, c, lt.c, c, lt.c,
                                            &known->algo, ex.lt_workspace, ex.lt_workspace_bytes, ex.stream);
  if (ran == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // launched nothing
  detail::check_cublas(ran, "cublasLtMatmul");
  return true;
}

template <class T>
void forward(exec<tide::cuda> const& ex, detail::matmul_dims const& d, T* out, T const* inp, T const* weight,
             T const* bias) {
  if (d.N == 0) return;
  // out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias, the bias in the epilogue
  if (gemm_lt(ex, false, true, d.N, d.OC, d.C, inp, d.C, weight, d.C, 0.0f, out, d.OC, bias)) return;
  if (bias != nullptr) {
    detail::matmul_bias_fill_kernel<T>
        <<<grid_for(d.N * d.OC), matmul_cuda_tuning::block, 0, ex.stream>>>(out, bias, d.N, d.OC);
    TIDE_CUDA_CHECK(cudaGetLastError());
  }
  // out (N, OC) (+)= inp (N, C) @ weight (OC, C)^T
  gemm(ex, false, true, d.N, d.OC, d.C, inp, d.C, weight, d.C, bias != nullptr ? 1.0f : 0.0f, out, d.OC);
}

// The backward in its two halves, which the fused backward runs in turn: the split and fused
// entries issue the same cuBLAS calls and kernels.
// dinp (N, C) += dout (N, OC) @ weight (OC, C)
template <class T>
void backward_input(exec<tide::cuda> const& ex, detail::matmul_dims const& d, T* dinp, T const* dout,
                    T const* weight) {
  if (d.N == 0) return;
  if (!gemm_lt(ex, false, false, d.N, d.C, d.OC, dout, d.OC, weight, d.C, 1.0f, dinp, d.C))
    gemm(ex, false, false, d.N, d.C, d.OC, dout, d.OC, weight, d.C, 1.0f, dinp, d.C);
}
// dweight (OC, C) += dout^T (OC, N) @ inp (N, C); dbias (OC), when not null, += column sums of dout
template <class T>
void backward_weight(exec<tide::cuda> const& ex, detail::matmul_dims const& d, T* dweight, T* dbias, T const* dout,
                     T const* inp) {
  if (d.N == 0) return;
  if (!gemm_lt(ex, true, false, d.OC, d.C, d.N, dout, d.OC, inp, d.C, 1.0f, dweight, d.C))
    gemm(ex, true, false, d.OC, d.C, d.N, dout, d.OC, inp, d.C, 1.0f, dweight, d.C);
  if (dbias != nullptr) {
    constexpr int X = matmul_cuda_tuning::bias_columns, Y = matmul_cuda_tuning::bias_rows;
    auto const blocks = static_cast<unsigned>((d.OC + X - 1) / X);
    detail::matmul_dbias_kernel<T><<<blocks, dim3(X, Y), 0, ex.stream>>>(dbias, dout, d.N, d.OC);
    TIDE_CUDA_CHECK(cudaGetLastError());
  }
}
template <class T>
void backward(exec<tide::cuda> const& ex, detail::matmul_dims const& d, T* dinp, T* dweight, T* dbias, T const* dout,
              T const* inp, T const* weight) {
  backward_input(ex, d, dinp, dout, weight);
  backward_weight(ex, d, dweight, dbias, dout, inp);
}

}  // namespace matmul_cuda

// out = inp @ weight^T + bias (bias may be {}). Shapes and types as the host overload.
template <Element T, class X, class W>
  requires ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, X inp, W weight,
                    std::type_identity_t<tensor_view<T const, tide::cuda>> bias = {}) {
  auto const d = detail::check_matmul_forward(out, inp, weight, bias);
  matmul_cuda::forward(ex, d, out.data(), inp.data(), weight.data(), bias.data());
}

// pre = inp @ weight^T + bias, out = gelu(pre).
template <Element T, class X, class W>
  requires ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_forward_gelu(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, tensor_view<T, tide::cuda> pre,
                         X inp, W weight, std::type_identity_t<tensor_view<T const, tide::cuda>> bias = {}) {
  auto const d = detail::check_matmul_forward_gelu(out, pre, inp, weight, bias);
  if (d.N == 0) return;
  // One GEMM with GELU (and bias) in the epilogue, pre as its aux output; else three passes.
  if (matmul_cuda::gemm_lt(ex, false, true, d.N, d.OC, d.C, inp.data(), d.C, weight.data(), d.C, 0.0f, out.data(),
                           d.OC, bias.data(), pre.data(), d.OC))
    return;
  matmul_cuda::forward(ex, d, pre.data(), inp.data(), weight.data(), bias.data());
  gelu_forward(ex, out, tensor_view<T const, tide::cuda>(pre));
}

// dinp += dout @ weight, dweight += dout^T @ inp, dbias += column sums of dout (dbias may be {}).
template <Element T, class D, class X, class W>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, tensor_view<T, tide::cuda> dweight,
                     std::type_identity_t<tensor_view<T, tide::cuda>> dbias, D dout, X inp, W weight) {
  auto const d = detail::check_matmul_backward("matmul_backward", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::read);
  matmul_cuda::backward(ex, d, dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data());
}

// dout <- dout * gelu'(pre) in place, then matmul_backward.
template <Element T, class P, class X, class W>
  requires ReadView<P, T, tide::cuda> && ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_gelu(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp,
                          tensor_view<T, tide::cuda> dweight, std::type_identity_t<tensor_view<T, tide::cuda>> dbias,
                          tensor_view<T, tide::cuda> dout, P pre, X inp, W weight) {
  auto const d = detail::check_matmul_backward("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::written);
  detail::check_matmul_gelu_pre(dout, pre);
  gelu_backward(ex, dout, tensor_view<T const, tide::cuda>(pre), tensor_view<T const, tide::cuda>(dout));
  matmul_cuda::backward(ex, d, dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data());
}

// The two halves of matmul_backward (a backward split in two: input gradients in B, weight
// gradients later in W), each with the same cuBLAS calls as matmul_backward.
//   matmul_backward_input(ex, dinp, dout, weight);          // dinp += dout @ weight
//   matmul_backward_weight(ex, dweight, dbias, dout, inp);  // dweight += dout^T @ inp, dbias +=
template <Element T, class D, class W>
  requires ReadView<D, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_input(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, D dout, W weight) {
  auto const d = detail::check_matmul_backward_input("matmul_backward_input", dinp, dout, weight,
                                                     detail::region::use::read);
  matmul_cuda::backward_input(ex, d, dinp.data(), dout.data(), weight.data());
}
template <Element T, class D, class X>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda>
void matmul_backward_weight(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dweight,
                            std::type_identity_t<tensor_view<T, tide::cuda>> dbias, D dout, X inp) {
  auto const d = detail::check_matmul_backward_weight(dweight, dbias, dout, inp);
  matmul_cuda::backward_weight(ex, d, dweight.data(), dbias.data(), dout.data(), inp.data());
}

// matmul_backward_gelu's first half: dout <- dout * gelu'(pre) in place, then dinp += dout @
// weight; matmul_backward_weight then takes the rewritten dout.
template <Element T, class P, class W>
  requires ReadView<P, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_gelu_input(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp,
                                tensor_view<T, tide::cuda> dout, P pre, W weight) {
  auto const d = detail::check_matmul_backward_input("matmul_backward_gelu_input", dinp, dout, weight,
                                                     detail::region::use::written);
  detail::check_matmul_gelu_pre(dout, pre, "matmul_backward_gelu_input");
  gelu_backward(ex, dout, tensor_view<T const, tide::cuda>(pre), tensor_view<T const, tide::cuda>(dout));
  matmul_cuda::backward_input(ex, d, dinp.data(), dout.data(), weight.data());
}

// The scratch protocol on CUDA: cuBLAS needs none of the caller's (it keeps its own workspace per
// handle), so the queries answer 0 and the overloads with scratch check it and run the above.
template <Element T>
std::size_t matmul_forward_scratch_bytes(exec<tide::cuda> const&, index_t, index_t, index_t) noexcept {
  return 0;
}
template <Element T>
std::size_t matmul_backward_scratch_bytes(exec<tide::cuda> const&, index_t, index_t, index_t) noexcept {
  return 0;
}
template <Element T, class X, class W>
  requires ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, X inp, W weight,
                    std::type_identity_t<tensor_view<T const, tide::cuda>> bias, scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_forward", "matmul_forward_scratch_bytes", ws, 0);
  matmul_forward(ex, out, inp, weight, bias);
}
template <Element T, class X, class W>
  requires ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_forward_gelu(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out, tensor_view<T, tide::cuda> pre,
                         X inp, W weight, std::type_identity_t<tensor_view<T const, tide::cuda>> bias,
                         scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_forward_gelu", "matmul_forward_scratch_bytes", ws, 0);
  matmul_forward_gelu(ex, out, pre, inp, weight, bias);
}
template <Element T, class D, class X, class W>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, tensor_view<T, tide::cuda> dweight,
                     std::type_identity_t<tensor_view<T, tide::cuda>> dbias, D dout, X inp, W weight,
                     scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_backward", "matmul_backward_scratch_bytes", ws, 0);
  matmul_backward(ex, dinp, dweight, dbias, dout, inp, weight);
}
template <Element T, class P, class X, class W>
  requires ReadView<P, T, tide::cuda> && ReadView<X, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_gelu(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp,
                          tensor_view<T, tide::cuda> dweight, std::type_identity_t<tensor_view<T, tide::cuda>> dbias,
                          tensor_view<T, tide::cuda> dout, P pre, X inp, W weight, scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_backward_gelu", "matmul_backward_scratch_bytes", ws, 0);
  matmul_backward_gelu(ex, dinp, dweight, dbias, dout, pre, inp, weight);
}
template <Element T, class D, class W>
  requires ReadView<D, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_input(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp, D dout, W weight,
                           scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_backward_input", "matmul_backward_scratch_bytes", ws, 0);
  matmul_backward_input(ex, dinp, dout, weight);
}
template <Element T, class D, class X>
  requires ReadView<D, T, tide::cuda> && ReadView<X, T, tide::cuda>
void matmul_backward_weight(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dweight,
                            std::type_identity_t<tensor_view<T, tide::cuda>> dbias, D dout, X inp,
                            scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_backward_weight", "matmul_backward_scratch_bytes", ws, 0);
  matmul_backward_weight(ex, dweight, dbias, dout, inp);
}
template <Element T, class P, class W>
  requires ReadView<P, T, tide::cuda> && ReadView<W, T, tide::cuda>
void matmul_backward_gelu_input(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp,
                                tensor_view<T, tide::cuda> dout, P pre, W weight, scratch<tide::cuda> ws) {
  detail::check_scratch("matmul_backward_gelu_input", "matmul_backward_scratch_bytes", ws, 0);
  matmul_backward_gelu_input(ex, dinp, dout, pre, weight);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
