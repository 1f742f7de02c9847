#pragma once
// tide: everything that compiles with any C++20 compiler. tide/cuda.cuh adds the CUDA parts.

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/concepts.hpp"
#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"

#include "tide/memory/caching_allocator.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/lifetime_planner.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"

#include "tide/train/checkpoint.hpp"
#include "tide/train/crc32c.hpp"
#include "tide/train/text_data.hpp"

#include "tide/kernels/adamw/adamw.hpp"
#include "tide/kernels/attention/attention.hpp"
#include "tide/kernels/cast/cast.hpp"
#include "tide/kernels/classifier/classifier.hpp"
#include "tide/kernels/embedding/embedding.hpp"
#include "tide/kernels/gelu/gelu.hpp"
#include "tide/kernels/grad_norm/grad_norm.hpp"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/matmul/matmul.hpp"
#include "tide/kernels/residual/residual.hpp"
#include "tide/kernels/softmax/softmax.hpp"

#include "tide/nn/gpt.hpp"

#include "tide/chunk/access_trace.hpp"
#include "tide/chunk/chunk.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/chunk/memory_tracer.hpp"
#include "tide/chunk/tensor_state.hpp"

#include "tide/offload/policy.hpp"
#include "tide/offload/report.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/offload/simulate.hpp"
#include "tide/offload/stats.hpp"

#include "tide/optim/adamw.hpp"
#include "tide/train/report.hpp"
#include "tide/train/trainer.hpp"
