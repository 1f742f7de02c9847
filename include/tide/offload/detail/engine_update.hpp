#pragma once
// The offload engine's updates, out of line (the class is in detail/engine_core.hpp): the
// placement members policies call, the hand-over to the gradient sink, each chunk's optimizer
// step on the tier where its state lives (the update runner takes the host ones), ZeRO's
// shared parameters, and gradient-slot reuse.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "tide/offload/detail/engine_core.hpp"

namespace tide::offload::detail {

// Chunk c's master, optimizer state and extra lists to the device (those the store keeps: under
// ZeRO another rank keeps the state of chunks this one does not own). All or nothing: every
// device block is acquired before any list lets go of its host block.
template <Backend B, Element T, class Engine>
void move_state_to_device(chunk_store<B, T, Engine>& st, std::uint32_t c) {
  std::array<chunk::chunk*, 1 + max_state_lists + max_extra_lists> lists{};
  std::size_t k = 0;
  auto add = [&](chunk::chunk& ch) {
    if (ch.payload() != nullptr) lists[k++] = &ch;
  };
  for (auto& l : st.state_) add(l[c]);
  if constexpr (!B::is_device)  // on a device the sink that keeps them reads them on the host
    for (auto& l : st.extra_) add(l[c]);
  if constexpr (chunk_store<B, T, Engine>::has_master) add(st.master_[c]);
  std::array<std::byte*, lists.size()> dev{};
  try {
    for (std::size_t i = 0; i < k; ++i) dev[i] = static_cast<std::byte*>(st.arena_->allocate(lists[i]->capacity(), 256));
  } catch (...) {
    for (std::size_t i = 0; i < k; ++i)
      if (dev[i] != nullptr) st.arena_->deallocate(dev[i], lists[i]->capacity(), 256);
    throw;
  }
  for (std::size_t i = 0; i < k; ++i) {
    chunk::chunk& ch = *lists[i];
    memory::write_from_host(st.ex_, dev[i], ch.payload(), ch.capacity());  // in compute order; staged
    std::byte* host = ch.detach();
    ch.attach(dev[i], chunk::tier::device);
    st.host_.deallocate(host, ch.capacity(), 256);
    st.device_bytes_ += round_up(ch.capacity(), 256);
    st.cur_.h2d_bytes += ch.capacity();
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::pin_parameters() {
  for (std::uint32_t c = 0; c < store_.n_; ++c) {
    if (params_sharded_ && !store_.shard_.owns(c)) continue;
    if (!store_.on_device(c)) store_.fetch(c, 0, {});
    if (store_.param_[c].pinned()) continue;
    store_.param_[c].set_pinned(true);
    res_.plan_.ctx.pinned_bytes += store_.block_bytes();
  }
  store_.engine_.synchronize();
  for (std::uint32_t c = 0; c < store_.n_; ++c) store_.settle(c);
}

template <Backend B, Element T, class P, class O, class S, class Src>
std::uint32_t engine_core<B, T, P, O, S, Src>::place_state_on_device(std::uint32_t count, bool required) {
  init_master();
  std::uint32_t placed = 0;
  for (std::uint32_t c = 0; c < store_.n_ && c < count; ++c, ++placed) {
    if (os_on_device_[c] || !store_.shard_.owns(c)) continue;  // another rank keeps (and steps) its state
    if (state_on_file(c)) {
      if (!required) continue;  // its state stays on file and is stepped on the host
      // A policy that needs every state on the device takes it from file, and the parameters
      // leave the file for good: a clean device copy becomes the chunk's only one, else they
      // come to a host block. Both are read before either file lets go of the chunk.
      if (params_spilled(c) && !store_.on_device(c)) materialize_param(c);
      materialize(c);
      if (files_->forget(c)) host_kept_ += round_up(store_.param_[c].capacity(), 256);  // on the host again
    }
    try {
      move_state_to_device(store_, c);
    } catch (tide::error const& e) {
      if (required || e.category() != errc::budget) throw;
      break;
    }
    os_on_device_[c] = true;
  }
  if (res_.plan_.tracer.warm()) {  // a planned change, not a divergence: the optimizer moments now touch them
    res_.plan_.tracer.amend([&](std::size_t, chunk::moment m, std::vector<std::uint32_t>& touched,
                      std::vector<std::uint32_t>& on_host, std::vector<std::uint32_t>& released,
                      std::vector<std::uint32_t>& written) {
      if (m.phase != chunk::phase::optimizer) return;
      optimizer_moment(m.block, touched, on_host, released);
      written.clear();  // a device step writes the parameter chunks it touches
      for (std::uint32_t id : touched)
        if (id < store_.n_) written.push_back(id);
    });
  }
  return placed;
}

template <Backend B, Element T, class P, class O, class S, class Src>
void
engine_core<B, T, P, O, S, Src>::optimizer_moment(int block, std::vector<std::uint32_t>& touched,
                                                    std::vector<std::uint32_t>& on_host,
                                                    std::vector<std::uint32_t>& released) const {
  touched.clear();
  on_host.clear();
  released.clear();
  for (std::uint32_t c : res_.completes_at(block)) {
    released.push_back(store_.n_ + c);
    if (!store_.shard_.owns(c)) continue;  // another rank steps it: nothing moves here
    auto& list = os_on_device_[c] ? touched : on_host;
    list.push_back(c);
    if (!options_.reuse_grad_slots) list.push_back(store_.n_ + c);  // reuse: the gradients are in c
  }
  std::ranges::sort(touched);
}

template <Backend B, Element T, class P, class O, class S, class Src>
update_targets<T, O::state_lists> engine_core<B, T, P, O, S, Src>::targets_of(std::uint32_t c) {
  update_targets<T, O::state_lists> x;
  x.param = reinterpret_cast<T*>(store_.param_[c].payload());
  if constexpr (store::has_master) x.master = reinterpret_cast<float*>(store_.master_[c].payload());
  for (std::size_t k = 0; k < state_lists; ++k) x.state[k] = reinterpret_cast<float*>(store_.state_[k][c].payload());
  return x;
}

template <Backend B, Element T, class P, class O, class S, class Src>
optim::update_tensor<T, O::state_lists> engine_core<B, T, P, O, S, Src>::update_of(std::uint32_t c) {
  update_targets<T, O::state_lists> const x = targets_of(c);
  optim::update_tensor<T, O::state_lists> u;
  u.master = store::has_master ? x.master : reinterpret_cast<float*>(x.param);
  u.grad = reinterpret_cast<T const*>(grad_chunk(c).payload());  // reuse_grad_slots: u.grad == u.working
  u.state = x.state;
  u.working = store::has_master ? x.param : nullptr;
  u.n = step_elements(c);
  return u;
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::swap_in_update(std::uint32_t c) {
  undo_record<O::state_lists>* const u = runner_.job_of(c).undo;
  if (u == nullptr) return;
  store_.cur_.undo_swapped_bytes += undo_.swap_in(*u, [&](std::size_t k) -> chunk::chunk& {
    if (k == 0) return store_.param_[c];
    if (k == 1) return store_.master_[c];
    return store_.state_[k - 2][c];
  });
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::hand_to_sink(int block) {
  auto const complete = res_.completes_at(block);
  if (complete.empty()) return;
  // The kernels that completed them run on the compute timeline: the sink starts after them.
  memory::event<B> const* valid_after = nullptr;
  if constexpr (B::is_device) {
    memory::record(store_.ex_, handed_);
    valid_after = &handed_;
  }
  for (std::uint32_t c : complete) {
    store_.grad_.transition_chunk(c, chunk::tensor_state::ready_for_reduce);
    chunk::chunk& g = grad_chunk(c);
    ready_chunk<B, T> r{c, {reinterpret_cast<T*>(g.payload()), g.capacity() / sizeof(T)}, g.tier(), valid_after,
                        nullptr, t_, c == complete.back()};
    if constexpr (extra_count > 0) {
      if (options_.undo_on_error) extra_undo_.save(c, store_.extra_);  // the sink may change them
      for (std::size_t k = 0; k < extra_count; ++k)
        r.lists[k] = {store_.extra_[k][c].payload(), store_.extra_[k][c].capacity()};
    }
    r.trace = store_.tracing() ? store_.trace_ : nullptr;
    sinks_.hand(r);
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::optimizer_moments_of(int block, bool apply) {
  optimizer_moment(block, touched_, on_host_, released_);
  if (released_.empty()) return;
  written_.clear();  // a device step writes the parameter chunks it touches
  for (std::uint32_t id : touched_)
    if (id < store_.n_) written_.push_back(id);
  res_.current_ = res_.plan_.tracer.at({block, chunk::phase::optimizer}, touched_, on_host_, released_, written_);
  free_reduced_unowned(false);
  for (std::uint32_t c : res_.completes_at(block)) optimizer_step(c, apply);
  store_.cur_.peak_model_bytes = std::max(store_.cur_.peak_model_bytes, model_bytes_now());  // copies out in flight
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::share_parameters() {
  if constexpr (ShardingSink<S>) {
    auto& shared = sinks_.shared();
    auto& tiers = sinks_.shared_tiers();
    shared.clear();
    tiers.clear();
    for (std::uint32_t c = 0; c < store_.n_; ++c) {
      if (!store_.shard_.owns(c)) {
        if (undo_record<O::state_lists>* u = begin_undo(c, step_elements(c))) undo_.save(*u, targets_of(c), store_.ex_);
        store_.drop_shadow(c);  // its device copy changes: the host one would be stale
      }
      chunk::chunk& p = store_.param_[c];
      std::byte* bytes = p.payload();
      chunk::tier where = p.tier();
      if constexpr (decltype(sinks_)::staged)  // the sink shares them on the host: a device chunk through staging
        if (p.tier() == chunk::tier::device) {
          bytes = sinks_.share_staging(c, p.capacity());
          memory::read_to_host(store_.ex_, bytes, p.payload(), p.capacity());
          where = chunk::tier::host;
        }
      shared.push_back({reinterpret_cast<T*>(bytes), p.capacity() / sizeof(T)});
      tiers.push_back(where);
    }
    // A sink that reads the device itself shares on its own stream: the steps enqueued on the
    // compute stream land first.
    if constexpr (B::is_device && !decltype(sinks_)::staged) memory::synchronize(store_.ex_);
    sinks_.share_parameters(std::span<std::span<T> const>(shared));
    if constexpr (decltype(sinks_)::staged)
      for (std::uint32_t c = 0; c < store_.n_; ++c) {
        chunk::chunk& p = store_.param_[c];
        if (!store_.shard_.owns(c) && p.tier() == chunk::tier::device)
          memory::write_from_host(store_.ex_, p.payload(), shared[c].data(), p.capacity());
      }
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::optimizer_step(std::uint32_t c, bool apply) {
  if (!store_.shard_.owns(c)) {  // ZeRO: another rank steps it; its parameters come in share_parameters
    store_.param_.transition_chunk(c, chunk::tensor_state::hold);
    if (sinks_.busy(c)) {
      sinks_.defer_unowned(c);  // freed once the sink is done with it, without waiting here
      return;
    }
    wait_reduced(c);
    release_grad(c);
    return;
  }
  index_t const n = step_elements(c);
  optim::update_args const args{t_, lr_, options_.grad_scale, true};
  if (os_on_device_[c]) {
    // The update runs after the sink finished with the gradients. A sink that reads device
    // memory (NCCL) records its event on the device: the compute stream waits for it, and the
    // host goes on enqueuing backward (the step's drain waits for the sink, under its deadline).
    // Every other sink: the host waits here.
    if constexpr (B::is_device && !decltype(sinks_)::staged) {
      if (sinks_.pending(c)) memory::wait(store_.ex_, sinks_.reduced(c));
    } else {
      wait_reduced(c);
    }
    if (!store_.on_device(c) || (!swapped_[c] && !store_.on_device(store_.n_ + c))) {  // deferred: evicted since?
      ids_pair_.assign({c, store_.n_ + c});
      if (swapped_[c]) ids_pair_.pop_back();  // the gradients are in c
      res_.make_resident(ids_pair_, res_.current_);
    }
    auto const t0 = std::chrono::steady_clock::now();
    undo_record<O::state_lists>* const u = apply ? begin_undo(c, n) : nullptr;
    if (apply) store_.drop_shadow(c);  // the device copy changes: the host one is stale
    bool const traced = apply && store_.tracing();
    if (traced) compute_lane_.open(store_.ex_, store_.copy_stream_);
    if (apply) runner_.journalled_update(store_.ex_, c, update_of(c), targets_of(c), u, args);
    if (traced)
      compute_lane_.close(store_.ex_, *store_.trace_, tide::detail::concat(O::name, " chunk ", c, " (device)"),
                          "optimizer", static_cast<std::size_t>(n) * (8 + 4 * fp32_lists));
    store_.cur_.optimizer_ms += ms_since(t0);
    ++store_.cur_.device_optimizer_chunks;
    store_.param_.transition_chunk(c, chunk::tensor_state::hold);
    release_grad(c);
    return;
  }
  // Host state: parameters and gradients go to the host; the step runs on the optimizer worker
  // after both copies, and the parameter chunk is not fetched again before it finished.
  // The gradients copied out for a step queued on the worker go to a block of the gradient
  // ring (host_steps_in_flight blocks), acquired before anything moves; on a device backend,
  // gradients whose fetch is still in flight go to the block they came from (copy_out), and the
  // ring block goes back.
  std::byte* const ring =
      apply && options_.overlap_optimizer && store_.on_device(store_.n_ + c)
          ? runner_.take_ring_block(c, [this] { return sinks_.outstanding(); })
          : nullptr;
  undo_record<O::state_lists>* undo = nullptr;
  try {
    undo = apply ? begin_undo(c, n, swaps_undo(c)) : nullptr;  // acquired before anything moves
    if (store_.on_device(c)) store_.set_stale(c, store_.copy_out(c), chunk::tier::device);
    if (store_.on_device(store_.n_ + c))
      store_.set_stale(store_.n_ + c, store_.copy_out(store_.n_ + c, ring), chunk::tier::device);
    if (ring != nullptr && store_.grad_[c].payload() != ring) runner_.reclaim_ring_block(ring);
  } catch (...) {
    if (ring != nullptr && store_.grad_[c].payload() != ring) runner_.reclaim_ring_block(ring);  // not taken
    throw;
  }
  unpin_param(c);
  ++store_.cur_.host_optimizer_chunks;
  if (!apply) {  // the moves happened; nothing to compute
    wait_reduced(c);  // the gradients are freed below
    store_.param_.transition_chunk(c, chunk::tensor_state::hold);
    release_grad(c);
    return;
  }
  host_job& job = runner_.job_of(c);
  job = {&runner_, c, update_of(c), targets_of(c), args, store_.tracing() ? store_.trace_ : nullptr, undo, {}};
  if (state_on_file(c)) stage_spilled(job);
  store_.param_.transition_chunk(c, chunk::tensor_state::hold);
  store_.grad_.transition_chunk(c, chunk::tensor_state::free);
  if (options_.overlap_optimizer) {
    // The worker waits for the copies and for the sink; backward goes on (the gradients' copy
    // out, if any, already waits for the sink on the copy stream).
    if (sinks_.pending(c)) runner_.stream().wait(sinks_.reduced(c));
    runner_.stream().wait(store_.ready_[c]);
    runner_.stream().wait(store_.ready_[store_.n_ + c]);
    runner_.queue(c);
    // The gradient's host block is freed once the step read it: a ring block goes back to the
    // ring when a later host step finds the step done (take_ring_block); a block from the pool
    // (gradients the policy evicted before they were complete) at drain.
    if (!swapped_[c]) {
      std::byte* const g = store_.grad_[c].detach();
      if (g != ring) runner_.free_after_drain(c, g);  // a ring block is in the ring's used list already
    }
  } else {
    wait_reduced(c);
    store_.settle(c);
    store_.settle(store_.n_ + c);
    runner_.run(c);
    swap_in_update(c);
    store_.free_payload(store_.grad_[c]);
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::take_grad_slots(int block) {
  if (!options_.reuse_grad_slots) return;
  for (std::uint32_t c : res_.completes_at(block)) {
    chunk::chunk& p = store_.param_[c];
    chunk::chunk& g = store_.grad_[c];
    store_.settle(c);
    store_.settle(store_.n_ + c);  // a copy out of the gradients lands first
    TIDE_ASSERT(g.payload() != nullptr && !swapped_[c]);
    store_.drop_shadow(c);
    bool const was_on_device = store_.on_device(c);
    if (g.tier() != chunk::tier::device) unpin_param(c);  // a pinned chunk stays on the device
    store_.free_payload(p);
    if (was_on_device) this->released(c);
    chunk::tier const where = g.tier();
    p.attach(g.detach(), where);
    swapped_[c] = true;
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::round_masters_back(std::uint32_t c) {
  if constexpr (store::has_master) {
    store_.drop_shadow(c);  // the host copy of a device-resident chunk holds gradients
    chunk::chunk const& m = store_.master_[c];
    chunk::chunk& p = store_.param_[c];
    index_t const n = step_elements(c);
    if constexpr (B::is_device) {  // either may be in device memory: the rounding runs on host copies
      std::vector<float> master(static_cast<std::size_t>(n));
      std::vector<T> param(static_cast<std::size_t>(n));
      store_.read_to_host(m, master.data(), master.size() * sizeof(float));
      kernels::detail::cast_contiguous(master.data(), param.data(), n);
      store_.write_from_host(p, param.data(), param.size() * sizeof(T));
    } else {
      kernels::detail::cast_contiguous(reinterpret_cast<float const*>(m.payload()), reinterpret_cast<T*>(p.payload()),
                                       n);
    }
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::return_grad_slots(bool stepped) {
  for (std::uint32_t c = 0; c < store_.n_; ++c) {
    if (!swapped_[c]) continue;
    if (!stepped) round_masters_back(c);
    swapped_[c] = false;
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
std::size_t engine_core<B, T, P, O, S, Src>::model_bytes_now() const {
  std::size_t bytes = 0;
  auto add = [&](chunk::chunk_list const& list) {
    for (std::uint32_t c = 0; c < store_.n_; ++c)
      if (list[c].payload() != nullptr) bytes += list[c].capacity();
  };
  add(store_.param_);
  add(store_.grad_);
  add(store_.master_);
  for (auto const& l : store_.state_) add(l);
  for (auto const& l : store_.extra_) add(l);
  for (std::uint32_t c = 0; c < store_.n_; ++c)
    if (store_.shadow_[c] != nullptr) bytes += store_.param_[c].capacity();
  for (std::uint32_t id = 0; id < store_.ids_; ++id)
    if (store_.stale_[id] != nullptr) bytes += store_.param_.chunk_bytes();  // parameter and gradient chunks: one size
  bytes += runner_.held_blocks() * store_.param_.chunk_bytes();
  return bytes;
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::release_grad(std::uint32_t c) {
  chunk::chunk& g = store_.grad_[c];
  if (g.payload() == nullptr && store_.stale_[store_.n_ + c] == nullptr) {
    store_.grad_.transition_chunk(c, chunk::tensor_state::free);  // reuse_grad_slots: the gradients were in c
    return;
  }
  store_.settle(store_.n_ + c);
  store_.grad_.transition_chunk(c, chunk::tensor_state::free);
  store_.free_payload(g);
}

}  // namespace tide::offload::detail
