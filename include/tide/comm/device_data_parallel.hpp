#pragma once
// make_trainer's data parallelism in device memory, over a communicator that reads and writes
// device memory on a stream of its own (a DeviceCollective: comm::nccl on tide::cuda). Gradient
// chunks are summed in place as backward completes them (device_sink); ZeRO-1, 2 and 3 keep each
// chunk's fp32 master and optimizer state on one rank (chunk c on rank c % W); 1 and 2 broadcast
// the stepped parameters from their owners after the step, 3 around the blocks that use them.
// comm/nccl_data_parallel.cuh names it for NCCL; docs/comm.md has the design. It is written once
// for any DeviceCollective, so the same code runs on tide::sealed in the tests (ranks as threads, tests/support/thread_ranks.hpp) and on
// GPUs under NCCL (tests/gpu/nccl.cu).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::comm {

// A communicator over device memory, as device_sink uses it: operations in call order on lane()
// (a stream of D::backend), each returning a request that wait() waits for under the
// communicator's deadline; abort(why) ends it for good. Optional: require_current_device(who),
// called as a trainer is built, for a communicator tied to one device (comm::nccl).
template <class D>
concept DeviceCollective =
    Backend<typename D::backend> && D::backend::is_device &&
    requires(D& d, D const& cd, std::span<float> f, typename D::request const& r) {
      { D::name } -> std::convertible_to<std::string_view>;
      { cd.rank() } -> std::same_as<int>;
      { cd.size() } -> std::same_as<int>;
      { d.lane() } -> std::same_as<memory::stream<typename D::backend>&>;
      { d.all_reduce_async(f, reduce_op::sum) } -> std::same_as<typename D::request>;
      { d.reduce_async(f, 0, reduce_op::sum) } -> std::same_as<typename D::request>;
      { d.broadcast_async(f, 0) } -> std::same_as<typename D::request>;
      d.wait(r);
      d.abort("why");
    };

// The gradient sink of device_data_parallel: each chunk's gradients summed in place, in device
// memory, on the communicator's lane after the event that says backward completed them (to
// every rank; under ZeRO-2 and 3 to the chunk's owner only, the others' copies left undefined, as NCCL
// leaves them); the chunk's `done` recorded on the lane behind it. No host staging
// (reads_device) and no buckets: an offload chunk is already the size of a DDP bucket, and the
// collective needs no packing. The engine's waits for a chunk go through the communicator's
// request (wait_reduced): under its deadline, so a lost rank aborts the communicator instead of
// hanging. A step abandoned after some of its sums were enqueued aborts the communicator: the
// ranks' operations no longer line up, and the job restarts from its last checkpoint. Called
// from the thread that runs the step; the communicator must not be used from another thread
// meanwhile.
template <DeviceCollective D>
class device_sink {
 public:
  using backend = typename D::backend;
  static constexpr bool reads_device = true;
  struct totals {
    std::uint64_t chunks = 0;        // chunks summed
    std::uint64_t bytes = 0;         // gradient bytes summed over the ranks (this rank's contribution)
    std::uint64_t bytes_shared = 0;  // ZeRO: parameter bytes this rank gave (shares after its steps,
                                     // ZeRO-3's broadcasts of its chunks)
    // ZeRO-1/2: chunks received or sent in place in device memory, and through the staging (this
    // rank keeps them in host memory, or the engine did not say where they lie).
    std::uint64_t shared_in_place = 0;
    std::uint64_t shared_staged = 0;
  };
  // zero: 0 (replicated), 1 (optimizer state and masters sharded), 2 (and gradients reduced to
  // their owner), 3 (and parameters kept by their owner only); device_data_parallel::sink()
  // refuses the rest.
  device_sink(D* comm, int zero) : comm_(comm) {
    st_->zero = zero;
    if (zero > 0) st_->shard = {comm->rank(), comm->size()};
  }

  template <Backend B, class T>
  bool reduce(offload::ready_chunk<B, T> const& r) {
    static_assert(std::is_same_v<B, backend>, "device_data_parallel: the trainer's backend must be the device "
                  "collective's (comm::nccl: tide::cuda; comm::data_parallel over comm::mpi is the host's)");
    TIDE_REQUIRE(r.tier == chunk::tier::device, "device_data_parallel over ", D::name, ": chunk ", r.chunk,
                 "'s gradients were handed over from host memory, which it cannot read; give the offload policy a "
                 "budget that keeps gradients on the device, or use comm::data_parallel over comm::mpi");
    state& s = *st_;
    if (r.valid_after != nullptr) comm_->lane().wait(*r.valid_after);
    if (s.requests.size() <= r.chunk) s.requests.resize(r.chunk + 1);
    s.in_step = true;  // a failure from here to the step's last collective leaves the ranks out of step
    if (s.zero >= 2 && s.shard.ranks > 1)  // to the owner only: half an all-reduce's traffic
      s.requests[r.chunk] = comm_->reduce_async(r.grads, s.shard.owner(r.chunk), reduce_op::sum);
    else
      s.requests[r.chunk] = comm_->all_reduce_async(r.grads, reduce_op::sum);
    if (r.last && !shares(s)) s.in_step = false;  // ZeRO-1 and 2: the share after the step is the last
    ++s.sums.chunks;
    s.sums.bytes += r.grads.size_bytes();
    if (r.done == nullptr) {
      comm_->wait(s.requests[r.chunk]);
      return false;
    }
    r.done->record(comm_->lane());
    return true;
  }
  // The engine's wait for chunk c: its sum, under the communicator's deadline. On a failure (the
  // communicator aborted: its kernels end) the chunk's event is waited for before the error goes
  // on, so the engine gets the gradient block back only once the communicator let go of it.
  void wait_reduced(std::uint32_t c, memory::event<backend> const& done) {
    try {
      comm_->wait(st_->requests.at(c));
    } catch (...) {
      try {
        while (!done.query()) std::this_thread::yield();
      } catch (...) {  // a sticky device error: the event says no more
      }
      throw;
    }
  }
  // A step abandoned after some of its collectives were enqueued (a gradient sum, ZeRO-3's gather,
  // until ZeRO-1 and 2's share is done): the other ranks' next operations would pair with this
  // step's leftovers, so the communicator ends here. (After a ZeRO-3 evaluation's gathers it ends
  // too, the ranks being in step then: a restart more than needed, never a mismatch.)
  void abandon_step() noexcept {
    if (!std::exchange(st_->in_step, false)) return;
    comm_->abort("device_data_parallel: a training step failed on this rank after some of its gradients were "
                 "being summed, and the ranks no longer run the same operations; restart every rank from the last "
                 "checkpoint set");
  }
  [[nodiscard]] totals stats() const noexcept { return st_->sums; }

  // ZeRO (offload::ShardingSink): chunk c's master and optimizer state live on rank c % W.
  [[nodiscard]] offload::chunk_shard shard() const noexcept { return st_->shard; }
  [[nodiscard]] int zero_stage() const noexcept { return st_->zero; }

  // ZeRO-3 (offload::ParameterShardingSink, DeviceGatheringSink): chunk `chunk`'s parameters
  // from its owner into `block`, in hook order on every rank, queued on the lane behind the
  // gradient sums enqueued before them. Into a device block (gather_into_device, where the
  // engine's budget has room), the broadcast runs on it, once the lane passed `valid_after`; into
  // a host block (gather_async), through one chunk of device staging: the owner's copied in,
  // broadcast, copied out on the others. The broadcasts are the same on every rank wherever each
  // rank receives. wait_gathered: every gather started has landed (under the deadline).
  [[nodiscard]] bool shards_parameters() const noexcept { return st_->zero == 3; }
  template <class T>
  void gather_into_device(std::uint32_t chunk, std::span<T> block, memory::event<backend> const& valid_after) {
    state& s = *st_;
    if (s.shard.ranks == 1) return;
    auto& lane = comm_->lane();
    s.in_step = true;
    try {
      lane.wait(valid_after);
      int const owner = s.shard.owner(chunk);
      s.gathering = comm_->broadcast_async(block, owner);
      s.gathered.record(lane);
      s.sums.bytes_shared += owner == s.shard.rank ? block.size_bytes() : 0;
    } catch (...) {
      abort_midway(gather_failed);
      throw;
    }
  }
  template <class T>
  void gather_async(std::uint32_t chunk, std::span<T> block) {
    state& s = *st_;
    if (s.shard.ranks == 1) return;
    auto& lane = comm_->lane();
    s.in_step = true;
    try {
      int const owner = s.shard.owner(chunk);
      bool const mine = owner == s.shard.rank;
      T* const staged = static_cast<T*>(s.staging_of(block.size_bytes(), lane));
      if (mine) lane.copy(staged, block.data(), block.size_bytes());
      s.gathering = comm_->broadcast_async(std::span<T>(staged, block.size()), owner);
      if (!mine) lane.copy(block.data(), staged, block.size_bytes());
      s.gathered.record(lane);
      s.sums.bytes_shared += mine ? block.size_bytes() : 0;
    } catch (...) {
      abort_midway(gather_failed);
      throw;
    }
  }
  void wait_gathered() {
    state& s = *st_;
    try {
      comm_->wait(std::exchange(s.gathering, typename D::request{}));
      s.gathered.synchronize();  // the copy out, behind the broadcast only
    } catch (...) {
      abort_midway(gather_failed);
      throw;
    }
  }
  // ZeRO-1 and 2, after the step's updates, on every rank with the same chunks (each the same
  // size): every rank gets the chunks the others stepped, one broadcast per chunk from its owner,
  // in chunk order. A chunk in device memory (`tiers`: where each lies) is broadcast in place,
  // straight into the other ranks' blocks; one in host memory, or where the tiers are not given,
  // through one chunk of device staging (the owner's copied in, the others' copied out; the
  // lane's copies reach both memories). The broadcasts are the same on every rank wherever each
  // rank keeps each chunk. Returns once every chunk is in place. A failure midway aborts the
  // communicator (the ranks are out of step) and goes on.
  template <class T>
  void share_parameters(std::span<std::span<T> const> chunks, std::span<chunk::tier const> tiers = {}) {
    state& s = *st_;
    if (!shares(s)) return;  // ZeRO-3 gathers at use
    if (chunks.empty()) {
      s.in_step = false;
      return;
    }
    std::size_t const n = chunks.size(), len = chunks[0].size(), bytes = len * sizeof(T);
    for (auto const& c : chunks)
      TIDE_CHECK(c.size() == len, usage, "device_data_parallel: parameter chunks of ", c.size(), " and ", len,
                 " elements; ZeRO shares chunks of one size");
    auto& lane = comm_->lane();
    try {
      typename D::request last{};
      std::size_t given = 0, in_place = 0, through_staging = 0;
      for (std::size_t c = 0; c < n; ++c) {
        int const owner = s.shard.owner(static_cast<std::uint32_t>(c));
        bool const mine = owner == s.shard.rank;
        given += mine ? bytes : 0;
        if (c < tiers.size() && tiers[c] == chunk::tier::device) {
          last = comm_->broadcast_async(chunks[c], owner);
          ++in_place;
          continue;
        }
        T* const staged = static_cast<T*>(s.staging_of(bytes, lane));
        if (mine) lane.copy(staged, chunks[c].data(), bytes);
        last = comm_->broadcast_async(std::span<T>(staged, len), owner);
        if (!mine) lane.copy(chunks[c].data(), staged, bytes);
        ++through_staging;
      }
      comm_->wait(last);
      lane.synchronize();  // the copies out, behind it
      s.sums.bytes_shared += given;
      s.sums.shared_in_place += in_place;
      s.sums.shared_staged += through_staging;
      s.in_step = false;  // the step's last collective
    } catch (...) {
      abort_midway(share_failed);
      throw;
    }
  }

 private:
  static bool shares(auto const& s) noexcept { return (s.zero == 1 || s.zero == 2) && s.shard.ranks > 1; }
  // A share or a gather failed on this rank: the ranks are out of step, so the communicator ends,
  // and nothing of the lane's writes a chunk after the caller restored it.
  static constexpr char const* gather_failed =
      "device_data_parallel: gathering a parameter chunk failed on this rank, and the ranks no longer run the same "
      "operations; restart every rank from the last checkpoint set";
  static constexpr char const* share_failed =
      "device_data_parallel: sharing the stepped parameters failed on this rank, and the ranks no longer run the "
      "same operations; restart every rank from the last checkpoint set";
  void abort_midway(char const* why) noexcept {
    comm_->abort(why);
    try {
      comm_->lane().synchronize();
    } catch (...) {
    }
  }

  struct state {
    totals sums;
    std::vector<typename D::request> requests;  // by chunk: its latest sum
    bool in_step = false;                       // chunks of this step handed over, not the last yet
    int zero = 0;
    offload::chunk_shard shard{};
    typename D::request gathering{};  // ZeRO-3: the last gather's broadcast
    memory::event<backend> gathered;  // ZeRO-3: recorded behind its copy out
    std::optional<memory::device_arena<backend>> staging;  // ZeRO: one chunk, for chunks in host memory
    void* staging_at = nullptr;
    std::size_t staging_bytes = 0;

    // At least `bytes` of staging; a larger one is made once the lane is done with the old.
    void* staging_of(std::size_t bytes, memory::stream<backend>& lane) {
      if (staging_bytes < bytes) {
        if (staging) lane.synchronize();
        staging.reset();
        staging_at = nullptr;
        staging_bytes = 0;
        staging.emplace(memory::arena_options{.budget = (bytes + 255) / 256 * 256});  // allocate() rounds to 256
        staging_at = staging->allocate(bytes);
        staging_bytes = bytes;
      }
      return staging_at;
    }
  };
  D* comm_;
  std::shared_ptr<state> st_ = std::make_shared<state>();  // shared by the trainer's copies
};

// make_trainer's data parallelism in device memory: every rank trains on its own data, one
// device each, and each gradient chunk is summed over the devices by `gpus` as soon as backward
// completes it (device_sink). The trainer divides by world_size with the rest of its gradient
// scale. The few agreements the trainer asks of the ranks on the host (a checkpoint set saved on
// every rank, its name, the gradient norm under ZeRO-2 and 3) go over `host`, the communicator that
// bootstrapped `gpus`. For NCCL (comm/nccl_data_parallel.cuh):
//
//   tide::comm::mpi world{session};
//   tide::comm::nccl gpus{world, local_rank};
//   using dp = tide::comm::nccl_data_parallel<tide::comm::mpi>;
//   auto trainer = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda>{...}, offload, optimizer,
//                                            dp{.gpus = &gpus, .host = &world, .zero = 1});
//
// ZeRO-1 and 2 (zero = 1, 2) shard the fp32 masters and the optimizer state by chunk (and under 2
// reduce each chunk's gradients to its owner only); after the step each chunk is broadcast from
// its owner, straight into the other ranks' device blocks (a chunk on the host tier goes through
// one chunk of device staging, beside the offload budget). ZeRO-3 (zero = 3) also keeps each
// chunk's parameters on its owner only: the engine gathers them around the blocks that use them,
// straight into device blocks where its budget has room, into host blocks through the same
// staging otherwise.
template <DeviceCollective D, Reducer Boot>
struct device_data_parallel {
  static constexpr std::string_view name = "device_data_parallel";
  D* gpus = nullptr;     // the devices' communicator; outlives the trainer
  Boot* host = nullptr;  // the communicator that bootstrapped gpus (the same ranks); outlives the trainer
  int zero = 0;  // ZeRO stage: 0 (replicated), 1 (optimizer state and masters), 2 (+ gradients), 3 (+ parameters)

  using sink_type = device_sink<D>;
  using source_type = offload::host_source;

  [[nodiscard]] int rank() const { return checked().rank(); }
  [[nodiscard]] int world_size() const { return checked().size(); }
  // Called as the trainer is built (whose streams are made on the current device).
  [[nodiscard]] sink_type sink() const {
    D& g = checked();
    TIDE_REQUIRE(zero >= 0 && zero <= 3, "device_data_parallel over ", D::name, ": zero = ", zero, "; pass 0 "
                 "(replicated), 1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters)");
    if constexpr (requires { g.require_current_device(name); }) g.require_current_device(name);
    return sink_type{&g, zero};
  }
  [[nodiscard]] source_type source() const { return {}; }
  [[nodiscard]] bool all_ranks(bool ok) const { return comm::all_ranks(checked_host(), ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t value) const { return comm::of_rank0(checked_host(), value); }
  [[nodiscard]] double sum_over_ranks(double x) const { return comm::sum_over_ranks(checked_host(), x); }

 private:
  D& checked() const {
    checked_host();
    return *gpus;
  }
  Boot& checked_host() const {
    TIDE_REQUIRE(gpus != nullptr && host != nullptr, "device_data_parallel: .gpus or .host is null; pass the "
                 "addresses of the devices' communicator and of the one that bootstrapped it, both outliving the "
                 "trainer");
    TIDE_REQUIRE(host->rank() == gpus->rank() && host->size() == gpus->size(), "device_data_parallel: .host is rank ",
                 host->rank(), " of ", host->size(), " but .gpus rank ", gpus->rank(), " of ", gpus->size(),
                 "; pass the communicator that bootstrapped .gpus");
    return *host;
  }
};

}  // namespace tide::comm
