#pragma once
// The CUDA path of encoder_forward / encoder_backward: the same entry names with exec<cuda> and
// device views, enqueued on ex.stream.
//
// Forward: one thread per pack of channels (128 bits when C and the pointers allow), grid-stride
// over (B*T, C / pack). A token outside [0, V) gives a NaN row (kernels cannot throw).
// Backward, deterministic without atomics, in the host path's order:
//   1. keys = tokens (V for an out-of-range token, which then sorts last and is skipped),
//      values = positions 0..N-1; cub::DeviceRadixSort::SortPairs, which is stable, so each
//      token's positions come out in increasing order;
//   2. dwte: one block per sorted index and per channel chunk; a block whose index starts a
//      token's run sums dout over the run in position order (float, from 0) and adds the sum to
//      dwte once; the other blocks return at once. Each (token, channel) has one writer;
//   3. dwpe: one thread per (t, c) sums over b in order and adds once.
// The same sums in the same order as host.hpp, so both backends give the same bits for the
// same inputs. Scratch for the sort (CUB's temporary + 4 N ints) is the caller's
// (encoder_backward_scratch_bytes, kernels/scratch.hpp).

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/embedding/check.hpp"
#include "tide/kernels/embedding/row_table.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Not tuned on a GPU: 256 threads, and a grid bounded by blocks_per_sm for the grid-stride
// kernels (the run-per-block dwte kernel launches one block per position and channel chunk).
struct encoder_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 8;
};

namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class T, int Pack>
struct alignas(sizeof(T) * Pack) encoder_pack {
  T v[Pack];
};

template <int Pack, class T>
__global__ void __launch_bounds__(encoder_cuda_tuning::block)
    encoder_forward_kernel(T* out, std::int32_t const* tokens, row_table<T const> wte, T const* wpe, index_t n, index_t t_len,
                           index_t c_len, index_t vocab) {
  index_t const packs_per_row = c_len / Pack;
  index_t const total = n * packs_per_row;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    index_t const row = i / packs_per_row, p = i % packs_per_row;
    std::int32_t const v = tokens[row];
    encoder_pack<T, Pack> y;
    if (v >= 0 && v < vocab) {
      auto const a = reinterpret_cast<encoder_pack<T, Pack> const*>(wte.row(index_t{v}))[p];
      auto const b = reinterpret_cast<encoder_pack<T, Pack> const*>(wpe + (row % t_len) * c_len)[p];
#pragma unroll
      for (int k = 0; k < Pack; ++k) y.v[k] = from_float<T>(to_float(a.v[k]) + to_float(b.v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < Pack; ++k) y.v[k] = from_float<T>(__builtin_nanf(""));
    }
    reinterpret_cast<encoder_pack<T, Pack>*>(out + row * c_len)[p] = y;
  }
}

// keys[i] = tokens[i] (vocab when out of range), positions[i] = i.
__global__ void encoder_sort_input_kernel(std::uint32_t* keys, std::int32_t* positions, std::int32_t const* tokens,
                                          index_t n, index_t vocab) {
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    std::int32_t const v = tokens[i];
    keys[i] = static_cast<std::uint32_t>(v >= 0 && v < vocab ? index_t{v} : vocab);
    positions[i] = static_cast<std::int32_t>(i);
  }
}

// Block (i, chunk): if sorted index i starts a run of token v < vocab, dwte[v, c] += the sum of
// dout[positions[j], c] over the run, for the chunk's channels c.
template <class G, class D>
__global__ void __launch_bounds__(encoder_cuda_tuning::block)
    encoder_backward_wte_kernel(row_table<G> dwte, D const* dout, std::uint32_t const* keys, std::int32_t const* positions,
                                index_t n, index_t c_len, index_t vocab) {
  index_t const i = blockIdx.x;
  std::uint32_t const v = keys[i];
  if (index_t{v} >= vocab || (i > 0 && keys[i - 1] == v)) return;
  for (index_t c = static_cast<index_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < c_len;
       c += static_cast<index_t>(gridDim.y) * blockDim.x) {
    float acc = 0.f;
    for (index_t j = i; j < n && keys[j] == v; ++j) acc += to_float(dout[index_t{positions[j]} * c_len + c]);
    G* g = dwte.row(index_t{v}) + c;
    *g = from_float<G>(to_float(*g) + acc);
  }
}

// dwpe[t, c] += sum over b of dout[b, t, c], b in order.
template <class G, class D>
__global__ void __launch_bounds__(encoder_cuda_tuning::block)
    encoder_backward_wpe_kernel(G* dwpe, D const* dout, index_t b_len, index_t t_len, index_t c_len) {
  index_t const total = t_len * c_len;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (index_t b = 0; b < b_len; ++b) acc += to_float(dout[b * total + i]);
    dwpe[i] = from_float<G>(to_float(dwpe[i]) + acc);
  }
}

inline unsigned encoder_grid(index_t items) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const needed = (items + encoder_cuda_tuning::block - 1) / encoder_cuda_tuning::block;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, index_t{sms} * encoder_cuda_tuning::blocks_per_sm));
}

TIDE_ABI_NAMESPACE_END

// encoder_backward's scratch on CUDA: CUB's temporary storage for the sort of n keys in
// [0, vocab], then keys and positions, in and out.
struct encoder_cuda_layout {
  std::size_t cub_bytes = 0, keys = 0, bytes = 0;
};
inline encoder_cuda_layout encoder_cuda_parts(index_t n, index_t vocab) {
  encoder_cuda_layout e;
  if (n == 0) return e;
  int const end_bit = std::bit_width(static_cast<std::uint32_t>(vocab));
  TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, e.cub_bytes, static_cast<std::uint32_t const*>(nullptr), static_cast<std::uint32_t*>(nullptr),
      static_cast<std::int32_t const*>(nullptr), static_cast<std::int32_t*>(nullptr), n, 0, end_bit));
  scratch_parts p;
  (void)p.add<std::byte>(e.cub_bytes);
  e.keys = p.add<std::int32_t>(4 * static_cast<std::size_t>(n));
  e.bytes = p.bytes();
  return e;
}

}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

template <Element T>
void encoder_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                     tensor_view<std::int32_t const, tide::cuda> tokens,
                     std::type_identity_t<row_table<T const>> const& wte,
                     std::type_identity_t<tensor_view<T const, tide::cuda>> wpe) {
  char const* what = "encoder_forward";
  detail::encoder_check_act(what, "out", out, tokens, wpe);
  detail::check_row_table(what, "the token table", wte, out.extent(2));
  TIDE_REQUIRE(detail::disjoint_from(wte, out.data(), out.bytes()) && detail::encoder_disjoint(out, wpe), what,
               ": out overlaps an embedding table; pass a separate buffer");
  index_t const n = tokens.size(), t_len = out.extent(1), c_len = out.extent(2);
  if (n == 0 || c_len == 0) return;
  constexpr int pack = 16 / static_cast<int>(sizeof(T));
  auto const aligned = [](void const* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  bool packed = c_len % pack == 0 && aligned(out.data()) && aligned(wpe.data());
  for (int j = 0; j < wte.pieces; ++j) packed = packed && aligned(wte.piece[j]);
  if (packed)
    detail::encoder_forward_kernel<pack>
        <<<detail::encoder_grid(n * c_len / pack), encoder_cuda_tuning::block, 0, ex.stream>>>(
            out.data(), tokens.data(), wte, wpe.data(), n, t_len, c_len, wte.rows);
  else
    detail::encoder_forward_kernel<1><<<detail::encoder_grid(n * c_len), encoder_cuda_tuning::block, 0, ex.stream>>>(
        out.data(), tokens.data(), wte, wpe.data(), n, t_len, c_len, wte.rows);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

template <Element T>
void encoder_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                     tensor_view<std::int32_t const, tide::cuda> tokens,
                     std::type_identity_t<tensor_view<T const, tide::cuda>> wte,
                     std::type_identity_t<tensor_view<T const, tide::cuda>> wpe) {
  detail::encoder_check_shapes("encoder_forward", "out", out, tokens, wte, wpe);
  encoder_forward(ex, out, tokens, row_table_of(wte), wpe);
}


// Scratch of encoder_backward on CUDA for dout (batch, T, C) and a table of V rows.
inline std::size_t encoder_backward_scratch_bytes(exec<tide::cuda> const&, index_t batch, index_t T, index_t,
                                                  index_t V) {
  return detail::encoder_cuda_parts(batch * T, V).bytes;
}

template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<tide::cuda> const& ex, row_table<G> const& dwte, tensor_view<G, tide::cuda> dwpe,
                      tensor_view<D, tide::cuda> dout, tensor_view<std::int32_t const, tide::cuda> tokens,
                      scratch<tide::cuda> ws) {
  char const* what = "encoder_backward";
  detail::encoder_check_act(what, "dout", dout, tokens, dwpe);
  detail::check_row_table(what, "the token table", dwte, dout.extent(2));
  TIDE_REQUIRE(detail::disjoint_from(dwte, dwpe.data(), dwpe.bytes()), what,
               ": dwte and dwpe overlap; pass separate tables");
  TIDE_REQUIRE(detail::disjoint_from(dwte, dout.data(), dout.bytes()) && detail::encoder_disjoint(dout, dwpe), what,
               ": dout overlaps a gradient table; pass a separate buffer");
  index_t const b_len = dout.extent(0), t_len = dout.extent(1), c_len = dout.extent(2), vocab = dwte.rows;
  index_t const n = b_len * t_len;
  TIDE_REQUIRE(n < (index_t{1} << 31) && vocab < (index_t{1} << 31) - 1, what, ": ", n,
               " positions or a vocabulary of ", vocab, " do not fit the 32-bit sort keys; split the batch");
  auto const parts = detail::encoder_cuda_parts(n, vocab);
  detail::check_scratch(what, "encoder_backward_scratch_bytes", ws, parts.bytes);
  if (n == 0 || c_len == 0) return;
  cudaStream_t const stream = ex.stream;
  int const end_bit = std::bit_width(static_cast<std::uint32_t>(vocab));  // keys are in [0, vocab]
  std::size_t cub_bytes = parts.cub_bytes;
  void* cub_temp = ws.data;
  auto const un = static_cast<std::size_t>(n);
  auto* keys_in = detail::scratch_part<std::uint32_t>(ws, parts.keys);
  auto* keys = keys_in + un;
  auto* pos_in = reinterpret_cast<std::int32_t*>(keys + un);
  auto* pos = pos_in + un;
  unsigned const grid_n = detail::encoder_grid(n);
  detail::encoder_sort_input_kernel<<<grid_n, encoder_cuda_tuning::block, 0, stream>>>(keys_in, pos_in, tokens.data(),
                                                                                       n, vocab);
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess)
    status = cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, keys_in, keys, pos_in, pos, n, 0, end_bit, stream);
  if (status == cudaSuccess) {
    index_t const chunks = (c_len + encoder_cuda_tuning::block - 1) / encoder_cuda_tuning::block;
    dim3 const grid(static_cast<unsigned>(n), static_cast<unsigned>(std::min<index_t>(chunks, 65535)));
    detail::encoder_backward_wte_kernel<<<grid, encoder_cuda_tuning::block, 0, stream>>>(dwte, dout.data(), keys,
                                                                                         pos, n, c_len, vocab);
    status = cudaGetLastError();
  }
  if (status == cudaSuccess) {
    detail::encoder_backward_wpe_kernel<<<detail::encoder_grid(t_len * c_len), encoder_cuda_tuning::block, 0, stream>>>(
        dwpe.data(), dout.data(), b_len, t_len, c_len);
    status = cudaGetLastError();
  }
  TIDE_CUDA_CHECK(status);
}

template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<tide::cuda> const& ex, tensor_view<G, tide::cuda> dwte, tensor_view<G, tide::cuda> dwpe,
                      tensor_view<D, tide::cuda> dout, tensor_view<std::int32_t const, tide::cuda> tokens,
                      scratch<tide::cuda> ws) {
  detail::encoder_check_shapes("encoder_backward", "dout", dout, tokens, dwte, dwpe);
  encoder_backward(ex, row_table_of(dwte), dwpe, dout, tokens, ws);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
