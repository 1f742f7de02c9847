#pragma once
// Where a data-parallel job's model data is sharded: ZeRO over chunk groups, as one part that
// every gradient sink composes with its own reduction (comm::data_parallel's bucket_sink, and the
// compressing sinks of compress/sink.hpp). A sink says how gradients are summed; zero_sharding
// says which rank keeps what, and moves parameters to where they are needed:
//
//   tide::comm::zero_sharding<tide::comm::mpi> z{&world, 2, "data_parallel"};  // collective (ZeRO-3 splits)
//   z.shard();                 // the owner map: chunk c's master, optimizer state (and ZeRO-2 gradient,
//                              // ZeRO-3 parameters) on rank c % W
//   z.gather_async(c, bytes);  // ZeRO-3: chunk c from its owner, in hook order on every rank
//   z.wait_gathered();
//   z.share(chunks);           // ZeRO-1 and 2, after the step: the chunks the other ranks stepped
//
// Stage 0 keeps everything everywhere; 1 shards the optimizer state and the fp32 masters; 2 also
// reduces each chunk's gradients to its owner only (the sink's reduction asks stage()); 3 also
// keeps each chunk's parameters on its owner only, gathered around the blocks that read them.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/error.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::comm {

// ZeRO after the step's updates: every rank gets the parameters of the chunks other ranks
// stepped. Each group of W consecutive chunks is one all-gather, every rank giving the chunk it
// stepped; a last group of fewer chunks is broadcast from each owner. `staging` holds a group
// (grown on demand). Returns the bytes this rank gave. Every rank calls it, with the same chunks.
template <class C, class T>
std::size_t share_stepped_chunks(C& comm, offload::chunk_shard shard, std::span<std::span<T> const> chunks,
                                 std::vector<std::byte>& staging) {
  auto const w = static_cast<std::size_t>(shard.ranks);
  auto const r = static_cast<std::size_t>(shard.rank);
  std::size_t const n = chunks.size();
  std::size_t const len = n == 0 ? 0 : chunks[0].size();
  if (staging.size() < w * len * sizeof(T)) staging.resize(w * len * sizeof(T));
  std::span<T> const all(reinterpret_cast<T*>(staging.data()), w * len);
  std::size_t bytes = 0;
  std::size_t g = 0;
  for (; g + w <= n; g += w) {  // full groups: one all-gather each
    comm.all_gather(std::span<T const>(chunks[g + r]), all);
    for (std::size_t k = 0; k < w; ++k)
      if (k != r) std::copy_n(all.data() + k * len, len, chunks[g + k].data());
    bytes += len * sizeof(T);
  }
  for (std::size_t c = g; c < n; ++c) {  // the last, partial group
    comm.broadcast(chunks[c], shard.owner(static_cast<std::uint32_t>(c)));
    if (shard.owns(static_cast<std::uint32_t>(c))) bytes += len * sizeof(T);
  }
  return bytes;
}

template <class C>
struct request_of {
  struct type {};
};
template <Communicator C>
struct request_of<C> {
  using type = typename C::request;
};

// The communicator ZeRO-3's gathers run on: C itself, or the flat() one of a C that only reduces
// hierarchically (comm::hierarchical).
template <class C>
struct parameter_comm {
  using type = C;
};
template <class C>
  requires(!Communicator<C> && requires(C& c) { c.flat(); } &&
           Communicator<std::remove_cvref_t<decltype(std::declval<C&>().flat())>>)
struct parameter_comm<C> {
  using type = std::remove_cvref_t<decltype(std::declval<C&>().flat())>;
};
template <class C>
using parameter_comm_t = typename parameter_comm<C>::type;

// ZeRO-3's gathers of parameter chunks, for the gradient sinks that shard parameters
// (comm/data_parallel.hpp's and compress/sink.hpp's, through zero_sharding below): chunk c is broadcast from its owner on a communicator split off for
// parameters, so a gather never queues behind the gradient sums on the other one. Every rank
// calls gather_async in hook order; wait() waits for the last one started, which is enough
// because a communicator completes its operations in call order. Default-constructed, or on one
// rank, it gathers nothing (the rank owns every chunk).
template <class C>
class parameter_gatherer {
  using P = parameter_comm_t<C>;

 public:
  parameter_gatherer() = default;
  // Collective over `comm` on more than one rank: every rank makes it at the same point (its
  // sink, in the trainer's constructor). Needs a full Communicator; `policy` names the sink.
  parameter_gatherer(C* comm, offload::chunk_shard shard, std::string_view policy) : shard_(shard) {
    if constexpr (Communicator<C>) {
      if (comm != nullptr && comm->size() > 1) params_.emplace(comm->split(0, comm->rank()));
    } else if constexpr (Communicator<P>) {
      if (comm != nullptr && comm->size() > 1) params_.emplace(comm->flat().split(0, comm->rank()));
    } else {
      TIDE_FAIL(usage, policy, ": zero = 3 needs a full Communicator (split, broadcast_async, wait: tide::comm::mpi "
                "or self); ", C::name, " is not one: pass zero = 2 or less");
    }
  }
  // Starts gathering `chunk` into `bytes`. Returns the bytes this rank gave: the chunk's, when it
  // owns it.
  template <class T>
  std::size_t gather_async(std::uint32_t chunk, std::span<T> bytes) {
    if constexpr (Communicator<P>) {
      if (!params_) return 0;
      int const root = shard_.owner(chunk);
      last_ = params_->broadcast_async(bytes, root);
      return root == shard_.rank ? bytes.size_bytes() : 0;
    } else {
      return 0;
    }
  }
  // Every gather started has landed (throws what one threw).
  void wait() {
    if constexpr (Communicator<P>) {
      if (params_) params_->wait(std::exchange(last_, typename P::request{}));
    }
  }

 private:
  std::conditional_t<Communicator<P>, std::optional<P>, std::monostate> params_{};
  typename request_of<P>::type last_{};
  offload::chunk_shard shard_{};
};

// ZeRO over chunk groups, for one gradient sink: the stage, the owner map, ZeRO-3's gathers and
// ZeRO-1/2's share after the step, and the parameter bytes this rank gave. `policy` names the
// sink in messages. Collective over `comm` for stage 3 (a communicator is split off for the
// gathers): every rank makes it at the same point.
template <class C>
class zero_sharding {
 public:
  zero_sharding() = default;
  zero_sharding(C* comm, int stage, std::string_view policy) : comm_(comm), stage_(stage), policy_(policy) {
    TIDE_REQUIRE(stage >= 0 && stage <= 3, policy, ": zero = ", stage, "; tide shards the optimizer state (zero = 1), "
                 "the gradients (zero = 2) and the parameters (zero = 3) over chunk groups: pass 0 to 3");
    if constexpr (!shares<float>)
      TIDE_REQUIRE(stage == 0, policy, ": zero = ", stage, " needs a communicator with all_gather and broadcast "
                   "(tide::comm::mpi or self), not ", C::name, ": pass zero = 0");
    if (stage > 0 && comm != nullptr) shard_ = {comm->rank(), comm->size()};
    if (stage == 3 && comm != nullptr) params_ = parameter_gatherer<C>(comm, shard_, policy);
  }
  zero_sharding(zero_sharding const&) = delete;
  zero_sharding& operator=(zero_sharding const&) = delete;

  [[nodiscard]] int stage() const noexcept { return stage_; }
  // Chunk c's owner: rank c % W ({0, 1} below stage 1: everything here).
  [[nodiscard]] offload::chunk_shard shard() const noexcept { return shard_; }
  // ZeRO-3 (offload::ParameterShardingSink): chunk `chunk` from its owner into `bytes`, in hook
  // order on every rank; wait_gathered: every gather started has landed.
  [[nodiscard]] bool shards_parameters() const noexcept { return stage_ == 3; }
  template <class T>
  void gather_async(std::uint32_t chunk, std::span<T> bytes) {
    given_ += params_.gather_async(chunk, bytes);
  }
  void wait_gathered() { params_.wait(); }
  // ZeRO-1 and 2, after the step's updates (the engine drained the sink first): every rank gets
  // the chunks the others stepped. ZeRO-3 gathers at use instead; stage 0 and one rank: nothing.
  template <class T>
  void share(std::span<std::span<T> const> chunks) {
    if (stage_ == 0 || stage_ == 3 || shard_.ranks == 1) return;
    if constexpr (shares<T>)
      given_ += share_stepped_chunks(*comm_, shard_, chunks, staging_);
    else  // the ranks' parameters would drift apart
      TIDE_FAIL(usage, policy_, ": zero = ", stage_, " shares the stepped parameters with all_gather and broadcast, "
                "which ", C::name, " lacks for this element type: pass zero = 0, or a communicator that has them");
  }
  // The parameter bytes this rank gave, in shares and gathers.
  [[nodiscard]] std::uint64_t bytes_given() const noexcept { return given_.load(); }

 private:
  template <class T>
  static constexpr bool shares = requires(C& c, std::span<T const> in, std::span<T> out) {
    c.all_gather(in, out);
    c.broadcast(out, 0);
  };

  C* comm_ = nullptr;
  int stage_ = 0;
  std::string_view policy_{};  // a literal: the sink's name, for messages
  offload::chunk_shard shard_{};
  std::vector<std::byte> staging_{};  // share's all-gather: a group of W chunks
  parameter_gatherer<C> params_{};
  std::atomic<std::uint64_t> given_{0};  // gathers on the compute thread, shares on the caller's
};

}  // namespace tide::comm
