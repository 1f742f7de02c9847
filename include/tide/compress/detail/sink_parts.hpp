#pragma once
// What the compressing gradient sinks of compress/sink.hpp share: chunk_jobs (each chunk's work
// as one job on the sink's own worker, in the order backward hands the chunks over), zero_part
// (the ZeRO stages) and sink_front (the GradientSink members both sinks have).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::compress {

namespace detail {

// A compressing sink's work, off the compute thread. Each chunk's compression and transport run
// as one job on the sink's own worker (a host stream), in the order backward hands the chunks
// over: the same order on every rank, so the collectives match. Backward goes on meanwhile; the
// chunk's done event is recorded behind its job, and the engine's optimizer step for the chunk
// waits for it. A job that throws fails its step: the worker skips the rest of its queue, the
// engine waits for it and abandons the step, and abandon() then starts a fresh worker for the
// next one (every rank abandons the step, so they start afresh together).
template <class State>
class chunk_jobs {
 public:
  static constexpr std::size_t ring = 256;  // jobs in flight before a job's slot is reused

  chunk_jobs() = default;
  chunk_jobs(chunk_jobs const&) = delete;
  chunk_jobs& operator=(chunk_jobs const&) = delete;

  template <class T>
  void take(State* st, offload::ready_chunk<host, T> const& r) {
    auto& slots = std::get<std::vector<job<T>>>(rings_);
    if (slots.empty()) slots = std::vector<job<T>>(ring);
    job<T>& j = slots[next_++ % ring];
    j.ran.synchronize();  // its previous use ran
    j.st = st;
    j.r = r;
    j.r.done = nullptr;
    j.r.valid_after = nullptr;
    if (r.valid_after != nullptr) work_.wait(*r.valid_after);
    memory::launch(work_, j);
    j.ran.record(work_);
    r.done->record(work_);
  }

  // The step was abandoned and its jobs have ended: after a failure, a fresh worker.
  void abandon() noexcept {
    try {
      work_.synchronize();
      return;  // nothing failed
    } catch (tide::error const&) {  // the failure the step reported
    }
    try {
      memory::stream<host> fresh;
      std::apply([](auto&... v) { (reset(v), ...); }, rings_);
      work_ = std::move(fresh);
    } catch (...) {  // no thread for a new worker: the next step's jobs fail and say so
    }
  }

 private:
  template <class T>
  struct job {
    State* st = nullptr;
    offload::ready_chunk<host, T> r{};
    memory::event<host> ran{};
    void operator()() {
      double const start = r.trace != nullptr ? offload::trace_recorder::now_us() : 0;
      st->run(r);  // a throw stays with the worker: done's wait reports it in the engine
      if (r.trace != nullptr)
        r.trace->complete(tide::detail::concat(State::label, " chunk ", r.chunk), "comm", offload::lane::comm, start,
                          offload::trace_recorder::now_us(), r.grads.size_bytes());
    }
  };
  template <class J>
  static void reset(std::vector<J>& v) {
    for (J& j : v) j.ran = memory::event<host>{};  // their records were on the failed worker
  }

  std::tuple<std::vector<job<float>>, std::vector<job<bf16>>, std::vector<job<f16>>> rings_;
  std::size_t next_ = 0;
  memory::stream<host> work_;  // last: destroyed (drained) before the jobs
};

// What both compressing sinks share: the chunk's work queued on the sink's worker, and the ZeRO
// stages. Under ZeRO each rank keeps the optimizer state of its own chunks (chunk c on rank
// c % W) and steps them; the engine frees another rank's gradients once their sum is done, and
// share_parameters all-gathers the new parameters after the step (ZeRO-1 and 2). ZeRO-3 keeps a
// rank's own parameter chunks only: the engine gathers another rank's around the blocks that use
// it (comm::parameter_gatherer: each broadcast from its owner on a communicator split off for
// parameters), while the sink's worker sums gradients on the other. The compression
// does not change: a rank's residual (or PowerSGD error) is its own, of its own gradients, so
// every rank keeps it for every chunk; the sums reach every rank, as without ZeRO.
template <class C>
struct zero_part {
  int stage = 0;
  offload::chunk_shard shard{};        // {0, 1}: everything here
  std::vector<std::byte> staging{};    // share_parameters' all-gather
  std::uint64_t bytes_gathered = 0;    // this rank's parameter bytes given in share_parameters or gathers
  comm::parameter_gatherer<C> params{};  // ZeRO-3: parameter chunks from their owners, in hook order

  zero_part(C* comm, int zero, std::string_view policy) : stage(zero) {
    TIDE_REQUIRE(zero >= 0 && zero <= 3, policy, ": zero = ", zero, "; compressed data parallelism shards the "
                 "optimizer state (zero = 1), the gradients (zero = 2) and the parameters (zero = 3): pass 0 to 3");
    if constexpr (!requires(C& c, std::span<float const> in, std::span<float> out) {
                    c.all_gather(in, out);
                    c.broadcast(out, 0);
                  })
      TIDE_REQUIRE(zero == 0, policy, ": zero = ", zero, " needs a communicator with all_gather and broadcast "
                   "(tide::comm::mpi or self), not ", C::name, ": pass zero = 0");
    if (zero > 0 && comm != nullptr) shard = {comm->rank(), comm->size()};
    if (zero == 3 && comm != nullptr) params = comm::parameter_gatherer<C>(comm, shard, policy);
  }
};

// CRTP: Sink has a std::shared_ptr<state> st_ whose state has comm, zero (a zero_part), jobs (a
// chunk_jobs), run(ready_chunk), totals (its stats) and a mutex m.
template <class Sink>
class sink_front {
 public:
  template <Backend B, class T>
  bool reduce(offload::ready_chunk<B, T> const& r) {
    static_assert(std::is_same_v<B, host>, "compressed data parallelism: the sink runs on tide::host");
    auto& st = *self().st_;
    st.jobs.take(&st, r);
    return true;  // done is recorded behind the chunk's job
  }
  [[nodiscard]] offload::chunk_shard shard() const noexcept { return self().st_->zero.shard; }
  void abandon_step() noexcept { self().st_->jobs.abandon(); }
  // What the sink sent so far (this rank's side).
  [[nodiscard]] auto stats() const {
    auto const& st = *self().st_;
    std::lock_guard lock(st.m);
    auto t = st.totals;
    t.bytes_gathered = st.zero.bytes_gathered;
    return t;
  }
  // ZeRO-3 (offload::ParameterShardingSink): chunk `chunk` from its owner, in hook order on every
  // rank, on the parameters' communicator; wait_gathered: every gather started has landed.
  [[nodiscard]] bool shards_parameters() const noexcept { return self().st_->zero.stage == 3; }
  template <class T>
  void gather_async(std::uint32_t chunk, std::span<T> bytes) {
    auto& z = self().st_->zero;
    if (std::size_t const given = z.params.gather_async(chunk, bytes); given != 0) {
      std::lock_guard lock(self().st_->m);
      z.bytes_gathered += given;
    }
  }
  void wait_gathered() { self().st_->zero.params.wait(); }
  // After the step's updates (the engine drained the sink first): the chunks other ranks stepped.
  // ZeRO-3 gathers at use instead.
  template <class T>
  void share_parameters(std::span<std::span<T> const> chunks) {
    auto& st = *self().st_;
    if (st.zero.shard.ranks == 1 || st.zero.stage == 3) return;
    if constexpr (requires(std::span<T> x, std::span<T const> y) {
                    st.comm->all_gather(y, x);
                    st.comm->broadcast(x, 0);
                  }) {
      std::size_t const bytes = tide::comm::share_stepped_chunks(*st.comm, st.zero.shard, chunks, st.zero.staging);
      std::lock_guard lock(st.m);
      st.zero.bytes_gathered += bytes;
    }
  }

 private:
  Sink& self() noexcept { return static_cast<Sink&>(*this); }
  Sink const& self() const noexcept { return static_cast<Sink const&>(*this); }
};

}  // namespace detail

}  // namespace tide::compress
