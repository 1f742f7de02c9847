#pragma once
// exec<B>: where a kernel runs. Kernel entries take it as their first argument, and overload
// resolution on its type picks the backend:
//
//   tide::thread_pool pool{2};
//   tide::exec<tide::host> ex{pool};
//   tide::kernels::layernorm_forward(ex, out, mean, rstd, inp, weight, bias);
//
// exec<host>: kernels run on the calling thread, threaded over rows by the pool; they return
//             when done (the host "compute stream" is the caller's timeline; copies run on the
//             transfer engine's worker and are ordered against compute with events).
// exec<sealed>: the compute stream of the sealed test device and the pool its kernels thread
//             over; kernels are enqueued (the host kernels, on the stream's worker, over the
//             aliases of their views) and return at once (kernels/sealed.hpp). Only that worker
//             runs on the pool: give the exec a pool of its own.
// exec<cuda>: a CUDA stream, the cuBLAS and cuBLASLt handles and whether f32 GEMMs may use
//             TF32; kernels are enqueued and return at once (core/exec.cuh).

#include "tide/core/backend.hpp"
#include "tide/core/parallel.hpp"

namespace tide {

template <Backend B>
struct exec;

namespace memory {
template <Backend B>
class stream;
}

template <>
struct exec<host> {
  using backend = host;
  thread_pool& pool;
};

template <>
struct exec<sealed> {
  using backend = sealed;
  thread_pool& pool;              // used by the stream's worker only
  memory::stream<sealed>& stream;  // the compute stream kernels are enqueued on
};

}  // namespace tide
