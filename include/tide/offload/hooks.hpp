#pragma once
// What a model sees of an offload engine: per-block hooks and the addresses of parameters and
// gradients. A scheduler satisfies OffloadScheduler: pre_forward, post_forward, pre_backward,
// post_backward (per block), step() (per optimizer step), and the addresses of every parameter
// and gradient (the model asks for them between a block's pre_* and post_* hooks). hooks<S> also
// forwards a split backward's pre_/post_backward_input when S has them (SplitsBackward), and carries a model's offloaded activations through the scheduler (nn::ActivationCarrier).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"

#include "tide/offload/stats.hpp"

namespace tide::offload {

template <class S>
concept OffloadScheduler = requires(S& s, S const& cs, int block, std::uint32_t i) {
  typename S::element_type;
  s.pre_forward(block);
  s.post_forward(block);
  s.pre_backward(block);
  s.post_backward(block);
  s.step();
  { s.param_data(i) } -> std::same_as<typename S::element_type*>;
  { s.grad_data(i) } -> std::same_as<typename S::element_type*>;
  { cs.last_step() } -> std::convertible_to<offload_stats>;
};

// What a model's Hooks parameter holds: a pointer to the scheduler, forwarding every hook and
// address (nn::gpt<B, T, offload::hooks<S>> keeps its parameters in the scheduler's chunks).
//
// A pipeline stage's model (pipeline/stages.hpp) numbers every parameter of the whole model, while
// its scheduler holds the stage's only: `index` maps the model's parameter i to the scheduler's
// (no_index: another stage's parameter, whose address is `elsewhere`, room the model's initialisation
// writes and nothing reads). Without `index` the numbers are the same.
// In hooks::index: a parameter the scheduler does not hold (another pipeline stage's).
inline constexpr std::uint32_t no_index = 0xffffffffu;

// A scheduler that carries a model's offloaded activations (offload::scheduler does).
template <class S>
concept CarriesActivations = requires(S& s, std::byte* p, std::size_t n, int block, memory::copy_direction d,
                                      std::span<memory::copy_request const> copies,
                                      memory::event<typename S::backend> const& ready,
                                      memory::event<typename S::backend>& done) {
  { s.activation_host(n) } -> std::same_as<std::byte*>;
  { s.release_activation_host(p, n) } noexcept;
  s.copy_activations(block, d, copies, ready, done);
  { s.drain_activations() } noexcept;
};

// A scheduler that serves a split backward's input pass as a moment of its own (offload::scheduler
// does): hooks<S> then satisfies nn::SplitBackwardHooks.
template <class S>
concept SplitsBackward = requires(S& s, int block) {
  s.pre_backward_input(block);
  s.post_backward_input(block);
};

template <class S>
struct hooks {
  S* scheduler = nullptr;
  std::uint32_t const* index = nullptr;
  typename S::element_type* elsewhere = nullptr;
  void pre_forward(int b) { scheduler->pre_forward(b); }
  void post_forward(int b) { scheduler->post_forward(b); }
  void pre_backward(int b) { scheduler->pre_backward(b); }
  void post_backward(int b) { scheduler->post_backward(b); }
  // A split backward's input pass (nn::SplitBackwardHooks): the parameters only.
  void pre_backward_input(int b)
    requires SplitsBackward<S>
  {
    scheduler->pre_backward_input(b);
  }
  void post_backward_input(int b)
    requires SplitsBackward<S>
  {
    scheduler->post_backward_input(b);
  }
  typename S::element_type* param_data(std::uint32_t i) {
    if (index == nullptr) return scheduler->param_data(i);
    return index[i] == no_index ? elsewhere : scheduler->param_data(index[i]);
  }
  typename S::element_type* grad_data(std::uint32_t i) {
    if (index == nullptr) return scheduler->grad_data(i);
    return index[i] == no_index ? elsewhere : scheduler->grad_data(index[i]);
  }
  void zero_grad() { scheduler->zero_grad(); }
  // The model's offloaded activations (nn::ActivationCarrier), when the scheduler carries them
  // (offload::scheduler does): host room from its pool under its host_budget, copies on its
  // activation copy stream, on its timeline and in its counters. The scheduler must outlive the model: the
  // model returns its host room when it is destroyed.
  std::byte* activation_host(std::size_t bytes)
    requires CarriesActivations<S>
  {
    return scheduler->activation_host(bytes);
  }
  void release_activation_host(std::byte* p, std::size_t bytes) noexcept
    requires CarriesActivations<S>
  {
    scheduler->release_activation_host(p, bytes);
  }
  template <class Event>
    requires CarriesActivations<S>
  void copy_activations(int block, memory::copy_direction d, std::span<memory::copy_request const> copies,
                        Event const& ready, Event& done) {
    scheduler->copy_activations(block, d, copies, ready, done);
  }
  void drain_activations() noexcept
    requires CarriesActivations<S>
  {
    scheduler->drain_activations();
  }
};

}  // namespace tide::offload
