#pragma once
// The CUDA machinery the elementwise optimizer kernels (kernels/adamw, kernels/adam,
// kernels/sgd) share, parameterised by the same step policies as the host side
// (detail/elementwise_step.hpp describes them): a grid-stride walk that runs the policy's update
// (the kernel's math.hpp, the host's own arithmetic) four elements per thread-iteration with
// 128-bit loads of p and the fp32 states (and 4-element loads of g and stores of the working
// copy) where a record's pointers are aligned for them, element by element where they are not.
//
// Multi-tensor: the list is a DEVICE array of records, built once by the caller (parameters do
// not move between steps). One launch covers every record: each thread walks the records in
// order and takes the items (packs or elements) whose index in the concatenation of all records
// is congruent to its own index modulo the grid size. So there is no per-launch table, no
// kernel-argument limit on the number of tensors (Apex's 36 per launch), and the load balances
// across tensors; the cost is a loop over the records in every thread, fine up to thousands of
// tensors. For very many tiny tensors, step one flat chunk instead (tide's chunks are exactly
// that).
//
// The optional `device_scale` (device memory, e.g. the clip scale global_grad_norm's CUDA path
// writes) multiplies grad_scale inside the kernel without a host round trip. When it is not
// finite the kernel returns without writing: the step is skipped, as dynamic loss scaling wants
// after an overflow.
//
// Each optimizer's cuda.cuh keeps its own __global__ entries (named after it, so register and
// spill reports, and tests/cuda/hot_kernels.txt, see them by name): two lines that call
// run_flat_step / run_list_step here, launched with launch_step_flat / launch_step_list.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/elementwise_step.hpp"

namespace tide::kernels {

// Not tuned on a GPU (none where this was written): 256 threads x 4 blocks per SM fill half of
// an sm_80/sm_90 SM's threads, which a streaming kernel with 4 independent 16-byte loads in
// flight per thread needs to saturate HBM (llm.c's AdamW uses 512 x full occupancy).
struct elementwise_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 4;
  static constexpr int pack = 4;  // elements per thread-iteration: one 128-bit fp32 load
};

// Device code sits in detail's ABI namespace (not an ABI namespace's own detail, which would make
// every `detail::` lookup in tide::kernels ambiguous with the .hpp files' detail).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class T, int N>
struct alignas(sizeof(T) * N) step_pack {
  T v[N];
};

TIDE_HOST_DEVICE inline bool step_aligned(void const* ptr, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}

template <class Record>
using step_grad_t = std::remove_const_t<std::remove_pointer_t<decltype(Record::g)>>;
template <class Record>
using step_work_t = std::remove_pointer_t<decltype(Record::working)>;

// Whether record r takes the packed path (a null state, unused this step, counts as aligned),
// and how many items (packs or elements) it has.
template <class Step, class Record>
TIDE_HOST_DEVICE inline bool step_packed(Record const& r) {
  constexpr int P = elementwise_cuda_tuning::pack;
  step_states<Step::states> const s = Step::state_arrays(r);
  bool aligned = step_aligned(r.p, sizeof(float) * P) && step_aligned(r.g, sizeof(step_grad_t<Record>) * P) &&
                 (r.working == nullptr || step_aligned(r.working, sizeof(step_work_t<Record>) * P));
#pragma unroll
  for (int j = 0; j < Step::states; ++j) aligned = aligned && step_aligned(s.at[j], sizeof(float) * P);
  // A record that keeps its values from before the step takes the element path, which writes them.
  step_states<Step::states> const prev = Step::prev_state_arrays(r);
  bool keeps = r.prev_p != nullptr || r.prev_working != nullptr;
#pragma unroll
  for (int j = 0; j < Step::states; ++j) keeps = keeps || prev.at[j] != nullptr;
  return aligned && !keeps && !step_reads_sources<Step>(r);  // so does one that reads from sources
}

template <class Step, class Record>
TIDE_HOST_DEVICE inline index_t step_items(Record const& r) {
  constexpr int P = elementwise_cuda_tuning::pack;
  return step_packed<Step>(r) ? (r.n + P - 1) / P : r.n;
}

template <class Step, class Record>
__device__ inline void step_element(Record const& r, index_t e, typename Step::coefficients const& c) {
  constexpr int S = Step::states;
  bool const stateful = Step::uses_states(c);
  step_states<S> const s = Step::state_arrays(r);
  step_sources<S> const src = Step::src_state_arrays(r);  // null: in place
  float p = r.src_p != nullptr ? r.src_p[e] : r.p[e];
  float sv[S];
#pragma unroll
  for (int j = 0; j < S; ++j) sv[j] = stateful ? (src.at[j] != nullptr ? src.at[j][e] : s.at[j][e]) : 0.f;
  if (r.prev_p != nullptr) r.prev_p[e] = p;
  {
    step_states<S> const prev = Step::prev_state_arrays(r);  // s: the record's own, even when unused
#pragma unroll
    for (int j = 0; j < S; ++j) {
      if (s.at[j] == nullptr) continue;
      float const old = src.at[j] != nullptr ? src.at[j][e] : s.at[j][e];
      if (prev.at[j] != nullptr) prev.at[j][e] = old;
      if (!stateful && src.at[j] != nullptr) s.at[j][e] = old;  // unused this step: its destination still gets it
    }
  }
  if (r.working != nullptr && r.prev_working != nullptr) r.prev_working[e] = r.working[e];
  Step::update(p, sv, to_float(r.g[e]), c);
  r.p[e] = p;
  if (stateful) {
#pragma unroll
    for (int j = 0; j < S; ++j) s.at[j][e] = sv[j];
  }
  if (r.working != nullptr) r.working[e] = from_float<step_work_t<Record>>(p);
}

// The items of record r that thread `thread` of a grid of `threads` owns, r's items starting at
// `offset` in the concatenation of all records' items.
template <class Step, class Record>
__device__ void step_record(Record const& r, typename Step::coefficients const& c, index_t thread, index_t threads,
                            index_t offset) {
  constexpr int P = elementwise_cuda_tuning::pack;
  constexpr int S = Step::states;
  using Grad = step_grad_t<Record>;
  using Work = step_work_t<Record>;
  bool const packed = step_packed<Step>(r);
  index_t const items = packed ? (r.n + P - 1) / P : r.n;
  index_t i = ((thread - offset) % threads + threads) % threads;
  if (!packed) {
    for (; i < items; i += threads) step_element<Step>(r, i, c);
    return;
  }
  bool const stateful = Step::uses_states(c);
  step_states<S> const s = Step::state_arrays(r);
  for (; i < items; i += threads) {
    index_t const base = i * P;
    if (base + P > r.n) {  // the record's last, partial pack
      for (index_t e = base; e < r.n; ++e) step_element<Step>(r, e, c);
      continue;
    }
    auto p = *reinterpret_cast<step_pack<float, P> const*>(r.p + base);
    step_pack<float, P> sp[S];
#pragma unroll
    for (int j = 0; j < S; ++j) {
      if (stateful)
        sp[j] = *reinterpret_cast<step_pack<float, P> const*>(s.at[j] + base);
      else
        sp[j] = {};
    }
    auto const g = *reinterpret_cast<step_pack<Grad, P> const*>(r.g + base);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      float sk[S];
#pragma unroll
      for (int j = 0; j < S; ++j) sk[j] = sp[j].v[k];
      Step::update(p.v[k], sk, to_float(g.v[k]), c);
#pragma unroll
      for (int j = 0; j < S; ++j) sp[j].v[k] = sk[j];
    }
    *reinterpret_cast<step_pack<float, P>*>(r.p + base) = p;
    if (stateful) {
#pragma unroll
      for (int j = 0; j < S; ++j) *reinterpret_cast<step_pack<float, P>*>(s.at[j] + base) = sp[j];
    }
    if (r.working != nullptr) {
      step_pack<Work, P> w;
#pragma unroll
      for (int k = 0; k < P; ++k) w.v[k] = from_float<Work>(p.v[k]);
      *reinterpret_cast<step_pack<Work, P>*>(r.working + base) = w;
    }
  }
}

// False when the device scale says to skip the step; otherwise folds it into c.
template <class Coefficients>
__device__ inline bool step_apply_device_scale(Coefficients& c, float const* device_scale) {
  if (device_scale == nullptr) return true;
  float const s = *device_scale;
  if (!isfinite(s)) return false;
  c.grad_scale *= s;
  return true;
}

// The bodies of an optimizer's flat and list kernels.
template <class Step, class Record>
__device__ inline void run_flat_step(Record const& record, typename Step::coefficients c, float const* device_scale) {
  if (!step_apply_device_scale(c, device_scale)) return;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  step_record<Step>(record, c, thread, threads, 0);
}

template <class Step, class Record>
__device__ inline void run_list_step(Record const* records, index_t count, typename Step::coefficients c,
                                     float const* device_scale) {
  if (!step_apply_device_scale(c, device_scale)) return;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  index_t offset = 0;
  for (index_t r = 0; r < count; ++r) {
    Record const record = records[r];
    step_record<Step>(record, c, thread, threads, offset);
    offset += step_items<Step>(record);
  }
}

// Blocks for `items` items (all the device can hold when items < 0: unknown on the host).
inline unsigned step_blocks(index_t items) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const full = index_t{sms} * elementwise_cuda_tuning::blocks_per_sm;
  if (items < 0) return static_cast<unsigned>(full);
  index_t const needed = (items + elementwise_cuda_tuning::block - 1) / elementwise_cuda_tuning::block;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, full));
}

// Enqueues `kernel` (an optimizer's list kernel) over a device array of records on `stream`.
// The records' contents live on the device and are not checked here.
template <class Step, class Record, class Kernel>
void launch_step_list(Kernel kernel, cudaStream_t stream, tensor_view<Record, tide::cuda> records,
                      typename Step::coefficients const& c, float const* device_scale) {
  TIDE_REQUIRE(records.is_contiguous(), Step::name, " needs its records as a contiguous device array");
  if (records.size() == 0) return;
  kernel<<<step_blocks(-1), elementwise_cuda_tuning::block, 0, stream>>>(records.data(), records.size(), c,
                                                                         device_scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// Enqueues `kernel` (an optimizer's flat kernel) over one record of device memory on `stream`.
template <class Step, class Record, class Kernel>
void launch_step_flat(Kernel kernel, cudaStream_t stream, Record const& record, typename Step::coefficients const& c,
                      float const* device_scale) {
  if (record.n == 0) return;
  kernel<<<step_blocks(step_items<Step>(record)), elementwise_cuda_tuning::block, 0, stream>>>(record, c,
                                                                                               device_scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// A host array of records (the offload engine's batches of chunks, optim/optimizer.hpp), copied
// to a device array of their own on ex.stream (stream-ordered: cudaMallocAsync, freed behind the
// launch) for one list launch. The host array may go once this returns: a copy from pageable
// memory has read it by then.
template <class Record, class Launch>
void with_device_records(exec<tide::cuda> const& ex, std::span<Record const> host, Launch&& launch) {
  if (host.empty()) return;
  void* d = nullptr;
  TIDE_CUDA_CHECK(cudaMallocAsync(&d, host.size_bytes(), ex.stream));
  struct release {
    void* p;
    cudaStream_t s;
    ~release() { (void)cudaFreeAsync(p, s); }
  } const guard{d, ex.stream};
  TIDE_CUDA_CHECK(cudaMemcpyAsync(d, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, ex.stream));
  launch(tensor_view<Record const, tide::cuda>(static_cast<Record const*>(d), {static_cast<index_t>(host.size())}));
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace tide::kernels
