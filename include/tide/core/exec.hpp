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
// exec<cuda>: a CUDA stream and a cuBLAS handle; kernels are enqueued and return at once
//             (core/exec.cuh).

#include "tide/core/backend.hpp"
#include "tide/core/parallel.hpp"

namespace tide {

template <Backend B>
struct exec;

template <>
struct exec<host> {
  using backend = host;
  thread_pool& pool;
};

}  // namespace tide
