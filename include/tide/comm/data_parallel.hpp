#pragma once
// Data parallelism through the offload engine's gradient sink: every rank trains the same model on
// its own shard of the data, and each gradient chunk is summed over the ranks as soon as backward
// completes it, in buckets, while backward goes on.
//
//   tide::comm::mpi world{session};
//   auto trainer = tide::train::make_trainer(spec, tide::offload::chunked<>{...}, tide::optim::adamw{...},
//                                            tide::comm::data_parallel{.comm = &world, .bucket_bytes = 8_MiB});
//
// Buckets. Chunks reach the sink in the order backward completes them, the same order on every
// rank. Consecutive chunks of one block's backward fill a bucket of bucket_bytes (at least one
// chunk); when it is full, or the block handed its last chunk, the bucket's all-reduce starts (a
// bucket never waits for a later block: under a tight budget backward may have to copy those
// gradients out before it can go on, and that copy waits for the sum). One call over a
// staging buffer the chunks are packed into (as Horovod's fusion buffer), or over the chunk itself
// when a bucket is one chunk. The work runs on the sink's own stream, calling the communicator,
// whose lane polls MPI, so compute never waits for it. A chunk's `done` event is recorded on a
// second stream behind a wait for its bucket, so the engine's optimizer step for that chunk (an
// event wait on the optimizer worker) runs once its bucket was summed, and not before.
//
// The sink sums; the trainer divides by the world size with the rest of its gradient scale (the
// mean over micro-batches and ranks), so data parallelism on W ranks is gradient accumulation over
// W micro-batches, as far as the order of the sum allows (docs/comm.md).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/comm/sharding.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::comm {

// What a data-parallel sink did, for reports and tests.
struct bucket_stats {
  std::uint64_t buckets = 0;        // all-reduces started
  std::uint64_t chunks = 0;         // chunks summed
  std::uint64_t bytes = 0;          // gradient bytes summed over the ranks: all-reduced, or (ZeRO-2)
                                    // reduced to their owner; each rank's contribution
  std::uint64_t packed_buckets = 0; // buckets of more than one chunk (packed into the staging buffer)
  std::uint64_t bytes_gathered = 0; // ZeRO: parameter bytes all-gathered after the steps (this rank's share)
};

template <Reducer C>
class bucket_sink {
 public:
  // zero: the ZeRO stage (0: replicated optimizer state; 1: sharded over the ranks by chunk;
  // 2: also each chunk's gradients reduced to its owner only, not to every rank; 3: also the
  // parameters, each rank keeping its own chunks' only and receiving the others around their use).
  bucket_sink(C* comm, std::size_t bucket_bytes, int zero = 0)
      : st_(std::make_shared<state>(comm, bucket_bytes, zero)) {
    TIDE_REQUIRE(comm != nullptr, "data_parallel: .comm is null; pass the address of a communicator that outlives "
                 "the trainer (tide::comm::mpi world{session}; .comm = &world)");
  }

  template <Backend B, class T>
  bool reduce(offload::ready_chunk<B, T> const& r) {
    static_assert(std::is_same_v<B, host>, "data_parallel: the sink runs on tide::host (comm::nccl is the CUDA path)");
    return st_->take(r.chunk, std::as_writable_bytes(r.grads), detail_elem<T>(), r.valid_after, r.done,
                     r.ends_block || r.last, r.trace);
  }

  [[nodiscard]] bucket_stats stats() const {
    std::lock_guard lock(st_->m);
    bucket_stats t = st_->totals;
    t.bytes_gathered = st_->zero.bytes_given();
    return t;
  }

  // ZeRO (comm::zero_sharding): chunk c's optimizer state lives on rank c % size (PatrickStar's
  // chunk groups); ZeRO-3 gathers other ranks' parameter chunks around the blocks that use them
  // (on a communicator split off for parameters, while the gradient sums run on this one from the
  // sink's own thread); ZeRO-1 and 2 share the stepped chunks after the step.
  [[nodiscard]] offload::chunk_shard shard() const noexcept { return st_->zero.shard(); }
  [[nodiscard]] int zero_stage() const noexcept { return st_->zero.stage(); }
  [[nodiscard]] bool shards_parameters() const noexcept { return st_->zero.shards_parameters(); }
  template <class T>
  void gather_async(std::uint32_t chunk, std::span<T> bytes) {
    st_->zero.gather_async(chunk, bytes);
  }
  void wait_gathered() { st_->zero.wait_gathered(); }
  template <class T>
  void share_parameters(std::span<std::span<T> const> chunks) {
    st_->zero.share(chunks);  // the engine drained the sink first
  }

 private:
  template <class T>
  static constexpr int detail_elem() {
    return std::is_same_v<T, float> ? 0 : std::is_same_v<T, bf16> ? 1 : 2;
  }

  struct state {
    static constexpr std::size_t ring = 256;  // chunk waits and bucket jobs in flight before reuse waits

    // The all-reduce of one bucket, on `work`.
    struct flush_job {
      state* st = nullptr;
      std::uint64_t bucket = 0;
      std::vector<std::span<std::byte>> chunks;  // reserved once; cleared per use
      std::vector<std::uint32_t> ids;            // their chunk indices (ZeRO-2: the owner of each)
      int type = 0;
      offload::trace_recorder* trace = nullptr;  // the step's timeline, or null
      memory::event<host> ran;
      void operator()() {
        double const start = trace != nullptr ? offload::trace_recorder::now_us() : 0;
        std::size_t bytes = 0;
        try {
          bytes = st->sum(chunks, ids, type);
        } catch (tide::error const& e) {
          st->mark(bucket, &e);
          throw;
        }
        if (trace != nullptr)
          trace->complete(tide::detail::concat("all_reduce bucket ", bucket, " (", chunks.size(), " chunk",
                                               chunks.size() == 1 ? ")" : "s)"),
                          "comm", offload::lane::comm, start, offload::trace_recorder::now_us(), bytes);
        st->mark(bucket, nullptr);
      }
    };
    // A chunk's wait for its bucket, on `hold`; the chunk's done event is recorded after it.
    struct hold_job {
      state* st = nullptr;
      std::uint64_t bucket = 0;
      memory::event<host> ran;
      void operator()() const { st->wait_for(bucket); }
    };

    C* comm;
    std::size_t bucket_bytes;
    zero_sharding<C> zero;
    mutable std::mutex m;
    std::condition_variable cv;
    std::uint64_t summed = 0;  // buckets summed so far, in order
    bool failed = false;
    std::string why;  // the all-reduce's error, if one failed
    bucket_stats totals;
    std::uint64_t opened = 0;  // buckets started (the open one is opened - 1)
    std::size_t open_bytes = 0;
    std::vector<std::byte> staging;
    std::vector<std::span<std::byte>> open;  // the open bucket's chunks
    std::vector<std::uint32_t> open_ids;
    std::vector<flush_job> flushes;
    std::vector<hold_job> holds;
    std::size_t next_flush = 0, next_hold = 0;
    memory::stream<host> work;  // after the jobs: destroyed (drained) first
    memory::stream<host> hold;

    state(C* c, std::size_t bytes, int stage)
        : comm(c), bucket_bytes(bytes), zero(c, stage, "data_parallel"), flushes(ring), holds(ring) {
      TIDE_REQUIRE(bytes > 0, "data_parallel: bucket_bytes = 0; pass the bytes one all-reduce should carry (25 MiB "
                   "is PyTorch DDP's default)");
      for (auto& f : flushes) f.st = this;
      for (auto& h : holds) h.st = this;
    }
    state(state const&) = delete;
    state& operator=(state const&) = delete;
    ~state() {
      {  // nothing waits for a bucket that will not come
        std::lock_guard lock(m);
        failed = true;
      }
      cv.notify_all();
    }

    bool take(std::uint32_t id, std::span<std::byte> grads, int type, memory::event<host> const* valid_after,
              memory::event<host>* done, bool close, offload::trace_recorder* trace) {
      if (open.empty()) {
        ++opened;
        open_bytes = 0;
      }
      if (valid_after != nullptr) work.wait(*valid_after);
      open.push_back(grads);
      open_ids.push_back(id);
      open_bytes += grads.size();
      std::uint64_t const bucket = opened - 1;
      if (open_bytes >= bucket_bytes || close) flush(bucket, type, trace);
      hold_job& h = holds[next_hold++ % ring];
      h.ran.synchronize();
      h.bucket = bucket;
      memory::launch(hold, h);
      h.ran.record(hold);
      done->record(hold);
      return true;
    }

    void flush(std::uint64_t bucket, int type, offload::trace_recorder* trace) {
      flush_job& f = flushes[next_flush++ % ring];
      f.ran.synchronize();  // its previous use ran
      if (f.chunks.capacity() < open.size()) f.chunks.reserve(std::max<std::size_t>(open.size(), 8));
      f.chunks.assign(open.begin(), open.end());
      f.ids.assign(open_ids.begin(), open_ids.end());
      f.bucket = bucket;
      f.type = type;
      f.trace = trace;
      if (open.size() > 1 && staging.size() < open_bytes) {  // the first steps only
        work.synchronize();  // an earlier bucket's job may still be packing into the old buffer
        staging.resize(open_bytes);
      }
      memory::launch(work, f);
      f.ran.record(work);
      open.clear();
      open_ids.clear();
    }

    // On `work`: sum the chunks over the ranks.
    std::size_t sum(std::vector<std::span<std::byte>> const& chunks, std::vector<std::uint32_t> const& ids, int type) {
      std::size_t bytes = 0;
      for (auto const& c : chunks) bytes += c.size();
      if (zero.stage() >= 2 && zero.shard().ranks > 1) {  // each chunk to its owner: half an all-reduce's traffic
        for (std::size_t k = 0; k < chunks.size(); ++k) reduce_to(chunks[k], zero.shard().owner(ids[k]), type);
      } else if (chunks.size() == 1) {
        all_reduce(chunks[0], type);
      } else {
        std::size_t at = 0;
        for (auto const& c : chunks) {
          std::memcpy(staging.data() + at, c.data(), c.size());
          at += c.size();
        }
        all_reduce(std::span<std::byte>(staging.data(), bytes), type);
        at = 0;
        for (auto const& c : chunks) {
          std::memcpy(c.data(), staging.data() + at, c.size());
          at += c.size();
        }
      }
      std::lock_guard lock(m);
      ++totals.buckets;
      totals.chunks += chunks.size();
      totals.bytes += bytes;
      totals.packed_buckets += chunks.size() > 1 ? 1 : 0;
      return bytes;
    }
    // f(the bytes as a span of the gradients' element type: 0 f32, 1 bf16, 2 f16).
    template <class F>
    static void typed(std::span<std::byte> b, int type, F&& f) {
      auto as = [&](auto* tag) {
        using E = std::remove_pointer_t<decltype(tag)>;
        return std::span<E>(reinterpret_cast<E*>(b.data()), b.size() / sizeof(E));
      };
      if (type == 0) f(as(static_cast<float*>(nullptr)));
      else if (type == 1) f(as(static_cast<bf16*>(nullptr)));
      else f(as(static_cast<f16*>(nullptr)));
    }
    void all_reduce(std::span<std::byte> b, int type) {
      typed(b, type, [&](auto s) { comm->all_reduce(s, reduce_op::sum); });
    }
    void reduce_to(std::span<std::byte> b, int root, int type) {
      if constexpr (requires(C& c, std::span<float> d) { c.reduce(d, 0, reduce_op::sum); })
        typed(b, type, [&](auto s) { comm->reduce(s, root, reduce_op::sum); });
      else  // data_parallel::sink() refuses zero = 2 over such a communicator before it gets here
        TIDE_FAIL(usage, "data_parallel: zero = 2 needs a communicator with reduce (tide::comm::mpi or self), not ",
                  C::name);
    }
    void mark(std::uint64_t bucket, tide::error const* failure) {
      {
        std::lock_guard lock(m);
        if (failure == nullptr) {
          summed = std::max(summed, bucket + 1);
        } else if (!failed) {
          failed = true;
          why = failure->message();
        }
      }
      cv.notify_all();
    }
    // On `hold`: until `bucket` was summed. The communicator's deadline bounds the wait: a lost
    // rank fails the all-reduce, which fails this wait too.
    void wait_for(std::uint64_t bucket) {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return summed > bucket || failed; });
      if (summed > bucket) return;
      // The all-reduce's own words (a lost rank, named): which bucket waited tells a user nothing.
      TIDE_CHECK(!why.empty(), mpi, "data_parallel: bucket ", bucket, " was not summed: the trainer is being destroyed");
      TIDE_FAIL(mpi, why);
    }
  };

  std::shared_ptr<state> st_;
};

// make_trainer's communication policy for data parallelism: the ranks of `comm` each train on
// their own data; gradients are summed over them by a bucket_sink. ZeRO over chunk groups:
// zero = 1 keeps each chunk's fp32 master and optimizer state on one rank only (chunk c on rank
// c % size), which steps it and all-gathers the new parameters to the others after the step;
// zero = 2 also reduces each chunk's gradients to that rank only; zero = 3 also keeps each
// chunk's parameters on that rank only: the others receive them before a block that uses them
// and free them when a block that does not begins (docs/comm.md).
template <Reducer C>
struct data_parallel {
  static constexpr std::string_view name = "data_parallel";
  C* comm = nullptr;                       // the ranks; outlives the trainer
  std::size_t bucket_bytes = 25u << 20;    // bytes per all-reduce (PyTorch DDP's bucket_cap_mb = 25)
  int zero = 0;  // ZeRO stage: 0 (replicated), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters)

  using sink_type = bucket_sink<C>;
  using source_type = offload::host_source;

  [[nodiscard]] int rank() const { return checked().rank(); }
  [[nodiscard]] int world_size() const { return checked().size(); }
  [[nodiscard]] sink_type sink() const {
    if constexpr (!requires(C& c, std::span<float const> in, std::span<float> out) {
                    c.all_gather(in, out);
                    c.reduce(out, 0, reduce_op::sum);
                  }) {
      TIDE_REQUIRE(zero == 0, "data_parallel: zero = ", zero, " needs a communicator with all_gather and reduce "
                   "(tide::comm::mpi or self); ", C::name, " only all-reduces: pass zero = 0");
    }
    if constexpr (!Communicator<parameter_comm_t<C>>) {
      TIDE_REQUIRE(zero < 3, "data_parallel: zero = 3 needs a full Communicator (split, broadcast_async, wait: "
                   "tide::comm::mpi or self, or one whose flat() is one, as comm::hierarchical); ", C::name,
                   " is not one: pass zero = 2 or less");
    }
    return sink_type{comm, bucket_bytes, zero};
  }
  [[nodiscard]] source_type source() const { return {}; }

  // What the trainer asks of the ranks besides gradients (checkpoint sets, ZeRO-2's norm):
  // whether `ok` holds on every rank; rank 0's `value`, on every rank; the sum of `x` over ranks.
  [[nodiscard]] bool all_ranks(bool ok) const { return comm::all_ranks(checked(), ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t value) const { return comm::of_rank0(checked(), value); }
  [[nodiscard]] double sum_over_ranks(double x) const { return comm::sum_over_ranks(checked(), x); }

 private:
  C& checked() const {
    TIDE_REQUIRE(comm != nullptr, "data_parallel: .comm is null; pass the address of a communicator that outlives "
                 "the trainer (.comm = &world)");
    return *comm;
  }
};

}  // namespace tide::comm
