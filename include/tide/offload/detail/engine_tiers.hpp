#pragma once
// Where the offload engine's bytes come from, out of line (the class is in detail/engine_core.hpp):
// the NVMe tier's moves (detail/file_tier.hpp holds the files), the masters' first values, ZeRO-3's
// gathered parameter chunks (detail/shard_map.hpp decides, these members move), the chunk
// source's fills, and the model's offloaded activations.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/offload/detail/engine_core.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::stage_spilled(host_job& job) {
  job.io = files_->stage(job.c, update_of_chunk_done());
  for (std::size_t k = 0; k < files_->lists(); ++k) {
    float* const list = files_->list_of(job.io, k);
    if (k < state_lists) {
      job.whole.state[k] = list;
      job.targets.state[k] = list;
    } else {  // the fp32 master
      job.whole.master = list;
      job.targets.master = list;
    }
  }
  if (job.io.params != nullptr) {  // the parameters (fp32: the master; else the working copy) too
    if constexpr (store::has_master) job.whole.working = reinterpret_cast<T*>(job.io.params);
    else job.whole.master = reinterpret_cast<float*>(job.io.params);
    job.targets.param = nullptr;
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::prefetch_spilled(int block) {
  if (!files_ || !options_.defer_optimizer) return;
  for (std::uint32_t c : res_.completes_at(block)) {
    if (!files_->state_on_file(c) || !store_.shard_.owns(c) || os_on_device_[c]) continue;
    if (!files_->prefetch(c, update_of_chunk_done())) return;
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::open_files() {
  bool const masters_may_go = store::has_master && !options_.reuse_grad_slots;
  std::size_t const lists = state_lists + (masters_may_go ? 1 : 0);
  std::size_t kept = 0;
  std::vector<std::uint32_t> owned;
  for (std::uint32_t c = 0; c < store_.n_; ++c) {
    if (!params_sharded_ || store_.shard_.owns(c)) kept += round_up(store_.param_[c].capacity(), 256);  // ZeRO-3: own only
    for (auto& l : store_.extra_) kept += round_up(l[c].capacity(), 256);
    if (!store_.shard_.owns(c)) continue;
    owned.push_back(c);
    if constexpr (store::has_master)
      if (!masters_may_go) kept += round_up(store_.master_[c].capacity(), 256);
  }
  // Parameter chunks go to file past the state, but not under a sharding sink (ZeRO: other
  // ranks write a rank's parameter chunks) nor with reuse_grad_slots (the gradients take them).
  file_plan const plan = plan_files({.host_budget = options_.host_budget,
                                     .host_reserve = options_.host_reserve,
                                     .have_folder = !options_.spill_folder.empty(),
                                     .kept = kept,
                                     .owned = owned,
                                     .lists = lists,
                                     .list_bytes = store_.state_block_bytes(),
                                     .param_bytes = round_up(store_.param_[0].capacity(), 256),
                                     .chunks = store_.n_,
                                     .params_may_go = !ShardingSink<S> && !options_.reuse_grad_slots,
                                     .masters_stay = store::has_master && !masters_may_go,
                                     .extra_lists = extra_count > 0,
                                     .sharding = ShardingSink<S>,
                                     .masters_go = masters_may_go});
  host_kept_ = plan.host_kept;
  if (plan.empty()) return;
  std::array<chunk::chunk_list*, file_tier<B>::max_lists> to_file{};
  for (std::size_t k = 0; k < state_lists; ++k) to_file[k] = &store_.state_[k];
  if (masters_may_go) to_file[state_lists] = &store_.master_;
  files_ = std::make_unique<file_tier<B>>(store_.host_, store_.cur_, std::span(to_file.data(), lists), store_.param_,
                                          plan, options_.spill_folder, store_.n_, store_.state_block_bytes());
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::attach_host_state() {
  bool const masters_on_file = files_ && files_->holds_masters(state_lists);
  for (std::uint32_t c = 0; c < store_.n_; ++c) {
    if (!params_spilled(c)) store_.attach_host_zeroed(store_.param_[c]);
    if (!store_.shard_.owns(c)) continue;
    for (std::size_t k = 0; k < state_lists; ++k)
      if (!state_on_file(c)) store_.attach_host_zeroed(store_.state_[k][c]);
    if constexpr (store::has_master)
      if (!masters_on_file || !state_on_file(c)) store_.attach_host_zeroed(store_.master_[c]);
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::materialize_param(std::uint32_t c) {
  if (!param_in_file(c)) return;
  TIDE_REQUIRE(!evaluating_, "offload::scheduler: parameter chunk ", c, " is on file (host_budget), and its "
               "bytes can be written only between steps and evaluations; call end_evaluation() first");
  chunk::chunk& p = store_.param_[c];
  std::byte* const host = files_->take_param(c, step_open_ || evaluating_);
  if (p.payload() != nullptr) {  // a clean device copy
    store_.settle(c);
    free_param_payload(c);
  }
  p.attach(host, chunk::tier::host);
  files_->params_attached(c);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::init_master() {
  if constexpr (store::has_master) {
    if (master_written_) return;
    drain();
    std::optional<typename file_tier<B>::staging> staging;  // one block, for the masters that go to file
    for (std::uint32_t c = 0; c < store_.n_; ++c) {
      if (!store_.shard_.owns(c)) continue;  // another rank keeps its master
      bool const to_file = files_ && files_->master_on_file(c, state_lists);
      if (to_file && !staging) staging.emplace(store_.host_, files_->list_bytes());
      if (to_file) std::memset(staging->data, 0, staging->bytes);
      std::byte const* const on_file = param_file_view(c);
      for (std::uint32_t i = store_.layout_.first_param[c]; i < store_.layout_.first_param[c + 1]; ++i) {
        auto const* src = on_file != nullptr ? reinterpret_cast<T const*>(on_file) + store_.layout_.offset_of[i]
                                             : reinterpret_cast<T const*>(store_.param_.data(i));
        auto* dst = to_file ? reinterpret_cast<float*>(staging->data) + store_.layout_.offset_of[i]
                            : reinterpret_cast<float*>(store_.master_.data(i));
        for (index_t k = 0; k < store_.params_[i].numel(); ++k) dst[k] = to_float(src[k]);
      }
      if (to_file) files_->write_master(c, staging->data);
    }
    master_written_ = true;
    if (files_) files_->end_param_view();  // the views of parameter chunks on file end with it
    if (staging || (files_ && !files_->param_chunks().empty())) {
      staging.reset();
      store_.host_.trim();  // the pool caches freed blocks: back under host_budget
    }
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::check_spill() {
  if (!files_) return;
  for (std::uint32_t c : files_->stepped())
    if (runner_.job_of(c).io.failure) {
      std::exception_ptr const e = std::exchange(runner_.job_of(c).io.failure, nullptr);
      forget_spill_failures();
      files_->discard();
      std::rethrow_exception(e);
    }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::drop_param_file_copies() noexcept {
  if (!files_) return;
  for (std::uint32_t c : files_->param_chunks())
    if (files_->param_in_file(c) && store_.param_[c].payload() != nullptr) free_param_payload(c);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::gather_for(int block, chunk::phase ph) {
  if (!params_sharded_) return;
  gather_protect_ = res_.ids_of(block, ph);
  shards_.gather_for(*this, gather_protect_);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::gather_ahead(int block, chunk::phase ph) {
  if (!params_sharded_) return;
  auto const next = next_moment(block, ph);
  if (!next) return;
  gather_protect_ = res_.ids_of(block, ph);
  shards_.gather_ahead(*this, res_.ids_of(next->first, next->second));
}

template <Backend B, Element T, class P, class O, class S, class Src>
std::optional<std::pair<int, chunk::phase>>
engine_core<B, T, P, O, S, Src>::next_moment(int block, chunk::phase ph) const {
  // Within a run of blocks the next moment is the next block; after a run's end, with several
  // runs (a pipeline stage's pieces), the schedule decides, and no guess is made.
  // A split backward's passes interleave as the schedule orders them: no guess either.
  if (ph == chunk::phase::input) return std::nullopt;
  auto const [first, last] = backward_.run_of(block);
  bool const one = backward_.one_run();
  if (ph == chunk::phase::forward) {
    if (block < last) return std::pair{block + 1, ph};
    if (evaluating_ || !one) return std::nullopt;
    return std::pair{last, chunk::phase::backward};
  }
  if (block > first) return std::pair{block - 1, ph};
  if (one && !evaluating_ && backward_.more_passes(block, static_cast<std::size_t>(options_.micro_steps)))
    return std::pair{first, chunk::phase::forward};  // another micro-step's pass follows
  return std::nullopt;
}

// A device block, inside a step or an evaluation, when the budget has room for one more chunk
// at this moment and the next two (the block holds it until the next hook); nothing is evicted
// for it, nor waited for (the arena refusing a block the accounting allowed: nullptr).
// gather_parameters() between steps gathers into host blocks: the host reads them there
// (param_data), and no chunk is evicted.
template <Backend B, Element T, class P, class O, class S, class Src>
std::byte* engine_core<B, T, P, O, S, Src>::device_gather_block(std::uint32_t c) {
  if constexpr (gathers_device) {
    if (!step_open_ && !evaluating_) return nullptr;
    std::size_t const t = evaluating_ ? store::untraced : res_.current_;
    std::size_t const non_model = store_.non_model_now();
    std::size_t room = res_.plan_.capacity(t, non_model);
    if (t != store::untraced)  // the moments the trace holds (none while it records)
      for (std::size_t u = t + 1; u <= t + 2 && u < res_.plan_.tracer.moments(); ++u)
        room = std::min(room, res_.plan_.capacity(u, non_model));
    if (store_.model_on_device() + store_.block_bytes() > room) return nullptr;
    try {
      return store_.allocate_device(store_.param_[c].capacity(), t, gather_protect_, false);
    } catch (tide::error const& e) {
      if (e.category() != errc::budget) throw;
    }
  }
  (void)c;
  return nullptr;
}

template <Backend B, Element T, class P, class O, class S, class Src>
std::byte* engine_core<B, T, P, O, S, Src>::gather_block(std::uint32_t c) {
  if (std::byte* const p = device_gather_block(c)) {
    gather_where_[c] = chunk::tier::device;
    if (!store_.shard_.owns(c)) fetched(c);  // the eviction policy: it arrives as a fetch would
    return p;
  }
  gather_where_[c] = chunk::tier::host;
  return static_cast<std::byte*>(store_.host_.allocate(store_.param_[c].capacity(), 256));
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::free_gather_block(std::uint32_t c, std::byte* block) noexcept {
  if (gather_where_[c] == chunk::tier::device) store_.free_block(block, chunk::tier::device, store_.param_[c].capacity());
  else store_.host_.deallocate(block, store_.param_[c].capacity(), 256);
}

// A device block: the sink let go of it before its failure reached here (DeviceGatheringSink). A
// host block is never unmapped: the communicator may still write it.
template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::abandon_gather_block(std::uint32_t c, std::byte* block) noexcept {
  if (gather_where_[c] == chunk::tier::device) free_gather_block(c, block);
  else store_.host_.abandon(block);
}

// The owner's chunk c, as it is now, into the block it sends from: a copy, as the chunk may move
// (or a host step write it) while the broadcast runs. Into a device block in compute order,
// behind the kernels that wrote the chunk; into a host block through a read after them.
template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::send_own(std::uint32_t c, std::byte* block) {
  wait_optimizer(c);  // a host step writes the chunk's host payload
  store_.settle(c);
  chunk::chunk const& own = store_.param_[c];
  std::size_t const bytes = own.capacity();
  if (gather_where_[c] == chunk::tier::host) store_.read_to_host(own, block, bytes);
  else if (own.tier() == chunk::tier::device) memory::copy_in_order(store_.ex_, block, own.payload(), bytes);
  else memory::write_from_host(store_.ex_, block, own.payload(), bytes);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::gather_async(std::uint32_t c, std::byte* block) {
  if constexpr (ParameterShardingSink<S>) {
    std::span<T> const bytes(reinterpret_cast<T*>(block), store_.param_[c].capacity() / sizeof(T));
    if constexpr (gathers_device) {
      if (gather_where_[c] == chunk::tier::device) {
        // The block's last reader (the chunk it held before) and, on the owner, the copy into it.
        memory::record(store_.ex_, gathers_after_);
        sinks_.sink().gather_into_device(c, bytes, gathers_after_);
        return;
      }
    }
    sinks_.sink().gather_async(c, bytes);
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::attach_gathered(std::uint32_t c, std::byte* block) noexcept {
  chunk::chunk& ch = store_.param_[c];
  TIDE_ASSERT(ch.payload() == nullptr);
  ch.attach(block, gather_where_[c]);
  (gather_where_[c] == chunk::tier::device ? store_.cur_.gathered_device_bytes : store_.cur_.gathered_host_bytes) +=
      ch.capacity();
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::wait_gathered() {
  auto const t0 = std::chrono::steady_clock::now();
  if constexpr (ParameterShardingSink<S>) sinks_.sink().wait_gathered();
  store_.cur_.stall_ms += ms_since(t0);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::drop_param(std::uint32_t c) {
  store_.settle(c);  // a copy in flight reads or writes it
  store_.drop_shadow(c);
  free_param_payload(c);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::free_param_payload(std::uint32_t c) noexcept {
  unpin_param(c);
  bool const was_on_device = store_.on_device(c);
  store_.free_payload(store_.param_[c]);
  if (was_on_device) this->released(c);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void
engine_core<B, T, P, O, S, Src>::fill_chunk(std::uint32_t c, std::byte* device, std::byte const* host,
                                              std::size_t bytes, bool after_copy_stream) {
  if (swapped_[c]) {  // it holds gradients (reuse_grad_slots), not what the source makes: a plain copy
    store_.engine_.copy_async(device, host, bytes, memory::copy_direction::host_to_device, store_.ready_[c]);
    return;
  }
  memory::event<B> const* free_after = nullptr;
  if constexpr (!std::is_same_v<Src, host_source>) {
    if (after_copy_stream) {
      block_free_[c].record(store_.copy_stream_);
      free_after = &block_free_[c];
    }
  }
  source_.fill(fill_request<B>{c, device, host, bytes, &store_.engine_, &store_.copy_stream_, free_after,
                               &store_.ready_[c]});
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::before_fetch(std::uint32_t id) {
  // Gradients (a gradient chunk, or a parameter chunk whose slot they took) are copied after
  // the sink finished with them: the copy stream waits for its event, this thread does not.
  std::uint32_t const c = id < store_.n_ ? id : id - store_.n_;
  if ((id >= store_.n_ || swapped_[c]) && sinks_.pending(c)) store_.copy_stream_.wait(sinks_.reduced(c));
  if (id >= store_.n_) return;
  TIDE_CHECK(has_param(id), internal, "offload ", P::name(), ": parameter chunk ", id, " was to be fetched, but "
             "under ZeRO-3 this rank does not hold it (it is gathered only for the blocks that use it)");
  wait_optimizer(id);  // the host step writes the chunk's host payload
}

template <Backend B, Element T, class P, class O, class S, class Src>
void
engine_core<B, T, P, O, S, Src>::copy_activations(int block, memory::copy_direction d,
                                                    std::span<memory::copy_request const> copies,
                                                    memory::event<B> const& ready, memory::event<B>& done) {
  std::size_t bytes = 0;
  for (auto const& c : copies) bytes += c.bytes;
  bool const out = d == memory::copy_direction::device_to_host;
  auto& engine = store_.activation_engine();
  auto* span = store_.open_span(tide::detail::concat("activations ", block, out ? " out" : " back"), bytes, true);
  engine.copy_stream().wait(ready);
  engine.copy_async(copies, d, done);
  store_.close_span(span);
  (out ? store_.cur_.activation_d2h_bytes : store_.cur_.activation_h2d_bytes) += bytes;
}

template <Backend B, Element T, class P, class O, class S, class Src>
std::byte* engine_core<B, T, P, O, S, Src>::activation_host(std::size_t bytes) {
  (void)store_.activation_engine();  // their copy stream, from the first request on
  if (options_.host_budget != 0) {
    std::size_t const used = host_kept_ + activation_host_bytes_;
    std::size_t const left = options_.host_budget - std::min(options_.host_budget, used);
    TIDE_CHECK(bytes <= left, budget, "offload::scheduler: the model's offloaded activations need ",
               bytes_of{bytes}, " of host memory, and host_budget ", bytes_of{options_.host_budget}, " leaves ",
               bytes_of{left}, " beside the model data kept on the host (", bytes_of{host_kept_}, ")",
               activation_host_bytes_ != 0 ? tide::detail::concat(" and the activations already held (",
                                                                  bytes_of{activation_host_bytes_}, ")")
                                           : std::string(),
               "; set host_reserve to at least ", bytes_of{bytes + activation_host_bytes_},
               " (the NVMe tier then takes that much more optimizer state to file), raise host_budget, or "
               "offload fewer blocks");
  }
  auto* p = static_cast<std::byte*>(store_.host_.allocate(bytes, 256));
  activation_host_bytes_ += bytes;
  return p;
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::release_activation_host(std::byte* p, std::size_t bytes) noexcept {
  store_.host_.deallocate(p, bytes, 256);
  activation_host_bytes_ -= bytes;
  if (options_.host_budget != 0) store_.host_.trim();  // the pool caches freed blocks: back under host_budget
}

}  // namespace tide::offload::detail
