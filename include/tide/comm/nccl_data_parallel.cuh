#pragma once
// make_trainer's data parallelism on CUDA over comm::nccl: gradient chunks all-reduced in device
// memory (nccl_sink), the trainer's host agreements over the communicator that bootstrapped it
// (nccl_data_parallel). docs/comm.md has the design; tests/gpu/nccl.cu runs it where GPUs are.

#include <cstdint>
#include <memory>
#include <thread>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/comm/communicator.hpp"
#include "tide/comm/nccl.cuh"
#include "tide/core/backend.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/error.hpp"
#include "tide/memory/stream.cuh"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::comm {

// The gradient sink of nccl_data_parallel: each chunk's gradients all-reduced in place, in device
// memory, on the communicator's lane, after the event that says backward completed them; the
// chunk's `done` recorded on the lane behind it. No host staging (reads_device) and no buckets:
// an offload chunk is already the size of a DDP bucket, and NCCL needs no packing. The engine's
// waits for a chunk go through the communicator's request (wait_reduced): polled under its
// deadline, so a lost rank aborts NCCL instead of hanging. A step abandoned after some of its
// all-reduces were enqueued aborts the communicator: the ranks' operations no longer line up,
// and the job restarts from its last checkpoint. Called from the thread that runs the step; the
// communicator must not be used from another thread meanwhile (comm::nccl takes no locks).
class nccl_sink {
 public:
  static constexpr bool reads_device = true;
  struct totals {
    std::uint64_t chunks = 0;  // chunks summed
    std::uint64_t bytes = 0;   // gradient bytes summed over the ranks (this rank's contribution)
  };
  explicit nccl_sink(nccl* comm) : comm_(comm) {}

  template <Backend B, class T>
  bool reduce(offload::ready_chunk<B, T> const& r) {
    static_assert(std::is_same_v<B, cuda>, "comm::nccl_data_parallel sums device chunks: train on tide::cuda "
                  "(comm::data_parallel over comm::mpi is the host's)");
    TIDE_REQUIRE(r.tier == chunk::tier::device, "nccl_data_parallel: chunk ", r.chunk, "'s gradients were handed "
                 "over from host memory, which NCCL cannot read; use comm::data_parallel over comm::mpi with this "
                 "offload or pipeline policy");
    state& s = *st_;
    if (r.valid_after != nullptr) comm_->lane().wait(*r.valid_after);
    if (s.requests.size() <= r.chunk) s.requests.resize(r.chunk + 1);
    s.in_step = true;  // a failure from here to the step's last hand-over leaves the ranks out of step
    s.requests[r.chunk] = comm_->all_reduce_async(r.grads, reduce_op::sum);
    if (r.last) s.in_step = false;
    ++s.totals.chunks;
    s.totals.bytes += r.grads.size_bytes();
    if (r.done == nullptr) {
      comm_->wait(s.requests[r.chunk]);
      return false;
    }
    r.done->record(comm_->lane());
    return true;
  }
  // The engine's wait for chunk c: its all-reduce, polled under the communicator's deadline. On a
  // failure (the communicator aborted: its kernels end) the chunk's event is waited for before
  // the error goes on, so the engine gets the gradient block back only once NCCL let go of it.
  void wait_reduced(std::uint32_t c, memory::event<cuda> const& done) {
    try {
      comm_->wait(st_->requests.at(c));
    } catch (...) {
      try {
        while (!done.query()) std::this_thread::yield();
      } catch (...) {  // a sticky CUDA error: the event says no more
      }
      throw;
    }
  }
  // A step abandoned after some of its chunks reached NCCL: the other ranks' next operations would
  // pair with this step's leftovers, so the communicator ends here.
  void abandon_step() noexcept {
    if (!std::exchange(st_->in_step, false)) return;
    comm_->abort("comm::nccl: a training step failed on this rank after some of its gradients went to NCCL, "
                 "whose ranks then no longer run the same operations; restart every rank from the last "
                 "checkpoint set");
  }
  [[nodiscard]] totals stats() const noexcept { return st_->totals; }

 private:
  struct state {
    totals totals;
    std::vector<nccl::request> requests;  // by chunk: its latest all-reduce
    bool in_step = false;                 // chunks of this step handed over, not the last yet
  };
  nccl* comm_;
  std::shared_ptr<state> st_ = std::make_shared<state>();  // shared by the trainer's copies
};

// make_trainer's data parallelism on CUDA: every rank trains on its own data, one GPU each, and
// each gradient chunk is summed over the GPUs by NCCL in device memory as soon as backward
// completes it (nccl_sink). The trainer divides by world_size with the rest of its gradient scale.
// The few agreements the trainer asks of the ranks on the host (a checkpoint set saved on every
// rank, its name) go over `host`, the communicator that bootstrapped `gpus`:
//
//   tide::comm::mpi world{session};
//   tide::comm::nccl gpus{world, local_rank};
//   auto trainer = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda>{...}, offload, optimizer,
//                                            tide::comm::nccl_data_parallel<tide::comm::mpi>{&gpus, &world});
//
// ZeRO is not on this path yet: its optimizer-state shards and parameter gathers run on the host
// (comm::data_parallel over comm::mpi, which a CUDA trainer also takes, staging through host memory).
template <Communicator Boot>
struct nccl_data_parallel {
  static constexpr std::string_view name = "nccl_data_parallel";
  nccl* gpus = nullptr;  // the GPUs' communicator; outlives the trainer
  Boot* host = nullptr;  // the communicator that bootstrapped gpus (the same ranks); outlives the trainer

  using sink_type = nccl_sink;
  using source_type = offload::host_source;

  [[nodiscard]] int rank() const { return checked().rank(); }
  [[nodiscard]] int world_size() const { return checked().size(); }
  // Called as the trainer is built, whose streams are made on the current device: it must be the
  // communicator's GPU.
  [[nodiscard]] sink_type sink() const {
    nccl& g = checked();
    int current = 0;
    TIDE_CUDA_CHECK(cudaGetDevice(&current));
    TIDE_REQUIRE(current == g.device(), "nccl_data_parallel: the trainer is being built on CUDA device ", current,
                 " but .gpus runs on device ", g.device(), "; call cudaSetDevice(", g.device(),
                 ") before make_trainer (comm::nccl's constructor does, on the thread that builds it)");
    return sink_type{&g};
  }
  [[nodiscard]] source_type source() const { return {}; }
  [[nodiscard]] bool all_ranks(bool ok) const { return comm::all_ranks(checked_host(), ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t value) const { return comm::of_rank0(checked_host(), value); }
  [[nodiscard]] double sum_over_ranks(double x) const { return comm::sum_over_ranks(checked_host(), x); }

 private:
  nccl& checked() const {
    TIDE_REQUIRE(gpus != nullptr, "nccl_data_parallel: .gpus is null; pass the address of a comm::nccl that outlives "
                 "the trainer");
    checked_host();
    return *gpus;
  }
  Boot& checked_host() const {
    TIDE_REQUIRE(gpus != nullptr && host != nullptr, "nccl_data_parallel: .gpus or .host is null; pass the addresses of "
                 "a comm::nccl and of the communicator that bootstrapped it, both outliving the trainer");
    TIDE_REQUIRE(host->rank() == gpus->rank() && host->size() == gpus->size(), "nccl_data_parallel: .host is rank ",
                 host->rank(), " of ", host->size(), " but .gpus rank ", gpus->rank(), " of ", gpus->size(),
                 "; pass the communicator that bootstrapped .gpus");
    return *host;
  }
};

}  // namespace tide::comm
