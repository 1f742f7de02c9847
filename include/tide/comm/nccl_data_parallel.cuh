#pragma once
// make_trainer's data parallelism on CUDA over comm::nccl: comm::device_data_parallel
// (comm/device_data_parallel.hpp) with NCCL as the devices' communicator. Gradient chunks are
// all-reduced in device memory on the communicator's stream (under ZeRO-2 and 3 reduced to their
// owner), ZeRO-1 and 2 share the stepped parameters with all-gathers in device memory, ZeRO-3
// broadcasts each parameter chunk from its owner around its use, and the trainer's host
// agreements go over the communicator that bootstrapped NCCL:
//
//   tide::comm::mpi world{session};
//   tide::comm::nccl gpus{world, local_rank};
//   using dp = tide::comm::nccl_data_parallel<tide::comm::mpi>;
//   auto trainer = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda>{...}, offload, optimizer,
//                                            dp{.gpus = &gpus, .host = &world, .zero = 1});
//
// docs/comm.md has the design; tests/gpu/nccl.cu runs it where GPUs are, and
// tests/comm/device_data_parallel.cpp runs the same code on tide::sealed.

#include "tide/comm/communicator.hpp"
#include "tide/comm/device_data_parallel.hpp"
#include "tide/comm/nccl.cuh"
#include "tide/memory/device_arena.cuh"
#include "tide/memory/stream.cuh"

namespace tide::comm {

static_assert(DeviceCollective<nccl>);

using nccl_sink = device_sink<nccl>;

template <Reducer Boot>
using nccl_data_parallel = device_data_parallel<nccl, Boot>;

}  // namespace tide::comm
