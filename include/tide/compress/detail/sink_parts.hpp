#pragma once
// What the compressing gradient sinks of compress/sink.hpp share: chunk_jobs (each chunk's work
// as one job on the sink's own worker, in the order backward hands the chunks over) and
// sink_front (the GradientSink members both sinks have, the ZeRO ones from comm::zero_sharding).

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

#include "tide/comm/sharding.hpp"
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

// CRTP: Sink has a std::shared_ptr<state> st_ whose state has comm, zero (a comm::zero_sharding),
// jobs (a chunk_jobs), run(ready_chunk), totals (its stats) and a mutex m.
//
// ZeRO composes as for dense data parallelism: each rank keeps and steps its own chunks' optimizer
// state, the engine frees another rank's gradients once their sum is done, and the stepped chunks
// are shared after the step (ZeRO-1 and 2) or gathered around their use (ZeRO-3). The compression
// does not change: a rank's residual (or PowerSGD error) is its own, of its own gradients, so
// every rank keeps it for every chunk; the sums reach every rank, as without ZeRO.
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
  [[nodiscard]] offload::chunk_shard shard() const noexcept { return self().st_->zero.shard(); }
  void abandon_step() noexcept { self().st_->jobs.abandon(); }
  // What the sink sent so far (this rank's side).
  [[nodiscard]] auto stats() const {
    auto const& st = *self().st_;
    std::lock_guard lock(st.m);
    auto t = st.totals;
    t.bytes_gathered = st.zero.bytes_given();
    return t;
  }
  [[nodiscard]] bool shards_parameters() const noexcept { return self().st_->zero.shards_parameters(); }
  template <class T>
  void gather_async(std::uint32_t chunk, std::span<T> bytes) {
    self().st_->zero.gather_async(chunk, bytes);
  }
  void wait_gathered() { self().st_->zero.wait_gathered(); }
  template <class T>
  void share_parameters(std::span<std::span<T> const> chunks) {
    self().st_->zero.share(chunks);  // the engine drained the sink first
  }

 private:
  Sink& self() noexcept { return static_cast<Sink&>(*this); }
  Sink const& self() const noexcept { return static_cast<Sink const&>(*this); }
};

}  // namespace detail

}  // namespace tide::compress
