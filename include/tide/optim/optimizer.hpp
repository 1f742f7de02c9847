#pragma once
// The optimizer slot: what the offload engine calls once per chunk, on the tier where the chunk's
// optimizer state lives, as soon as the chunk's gradients are complete (or in step(), when the
// trainer needs every gradient first).
//
//   struct my_optimizer {                                  // tide::optim::adamw, adam and sgd are three
//     static constexpr std::string_view name = "mine";
//     static constexpr std::size_t state_lists = 1;      // fp32 values per parameter it keeps (any number)
//     static constexpr std::string_view state_name(std::size_t k) { return "buf"; }  // checkpoint sections
//     float lr = 1e-3f;                                  // the base learning rate (the trainer's schedule scales it)
//     template <Backend B, class T>
//     void update(exec<B> const& ex, update_args const& a,
//                 std::span<update_tensor<T, state_lists> const> tensors) const;
//     static constexpr bool keeps_prev = true;  // optional: update writes the prev_* arrays (below)
//     static constexpr bool out_of_place = true;  // optional: update reads the src_* arrays (below)
//   };
//   static_assert(tide::optim::check_optimizer<my_optimizer>());   // names a missing member
//
// The engine owns the state: state_lists fp32 chunk lists, zero-initialised, placed and moved with
// the parameters, saved in checkpoints as "<state_name(k)>/<parameter>". Their number and names
// are the optimizer's (the offload engine keeps up to offload::max_state_lists: its NVMe tier's
// file holds them and the masters). One update call covers
// one chunk (or, with decay_matrices_only, the chunk's matrices and then the rest, `a.decay`
// telling which): each update_tensor is a run of elements with its fp32 master, gradient, state
// and the optional bf16/f16 working copy to round the new value into. Padding between tensors is
// zero and must stay zero. An optimizer is elementwise, so the engine may split or join runs
// freely; a result must not depend on how the elements are grouped.
//
// The slot takes the exec of the tier where the chunk's state lives: exec<host> for state on the
// host (every optimizer must take it), the engine's exec<B> for state on a device backend's
// device (tide::sealed: the kernel is enqueued on its compute stream; adamw, adam and sgd take
// any exec their kernels have an entry for). The CUDA kernels (tide::kernels::adamw, adam, sgd in
// their cuda.cuh) are compiled by the nvcc test; the slot reaches them when the engine runs on
// tide::cuda.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::optim {

// One run of elements to update in place, for an optimizer of N state lists.
template <class T, std::size_t N>
struct update_tensor {
  float* master = nullptr;   // (n) fp32 values updated in place (the parameter itself when T = float)
  T const* grad = nullptr;   // (n) the accumulated gradient, times grad_scale
  std::array<float*, N> state{};  // (n) each: the optimizer's state lists, in its order
  // (n) bf16 / f16: the parameter, written with the rounded new master; else null. May be the
  // same array as grad (the offload engine's gradient-slot reuse): an update must read each
  // element's gradient before it writes that element's working copy.
  T* working = nullptr;
  index_t n = 0;
  // Optional (null: not kept): where the update writes each element's values from before it (the
  // engine's undo journal; an optimizer whose `keeps_prev` is true writes them in its own pass,
  // for any other the engine copies them first): master, state, working copy. Every element of
  // each non-null array, changed by the step or not (a restore copies the whole array back); an
  // update that keeps them throws, if at all, before it writes anything.
  float* prev_master = nullptr;
  std::array<float*, N> prev_state{};
  T* prev_working = nullptr;
  // Optional (null: in place; only for an optimizer whose `out_of_place` is true): where the
  // update reads the master and the state from. The new values then go to master and state, every
  // element of each, and these stay as they were: the engine's undo journal keeps the old blocks
  // and swaps the new ones in once the step succeeded, so nothing is copied.
  float const* src_master = nullptr;
  std::array<float const*, N> src_state{};
};

// The run type an optimizer O takes.
template <class O, class T>
using update_tensor_of = update_tensor<T, O::state_lists>;

// Whether O's update writes the prev_* arrays of its update_tensors (adamw, adam and sgd do):
// `static constexpr bool keeps_prev = true`. Optional; without it the engine copies first.
template <class O>
inline constexpr bool keeps_prev_v = [] {
  if constexpr (requires { { O::keeps_prev } -> std::convertible_to<bool>; }) return bool(O::keeps_prev);
  else return false;
}();

// Whether O's update reads the src_* arrays of its update_tensors when they are set (adamw,
// adam and sgd do): `static constexpr bool out_of_place = true`. Optional; without it the engine
// keeps the values before the step as keeps_prev says.
template <class O>
inline constexpr bool out_of_place_v = [] {
  if constexpr (requires { { O::out_of_place } -> std::convertible_to<bool>; }) return bool(O::out_of_place);
  else return false;
}();

// What changes between calls.
struct update_args {
  std::int64_t step = 1;   // 1-based number of this update (bias corrections, SGD's first step)
  float lr = 0;            // the learning rate of this step
  float grad_scale = 1;    // multiplies every gradient (clipping, loss-scale unscaling, accumulation)
  bool decay = true;       // false: no weight decay for these tensors (biases and gains)
};

template <class O>
concept Optimizer = requires(O const& o, exec<host> const& ex, update_args const& a) {
  { O::name } -> std::convertible_to<std::string_view>;
  { O::state_lists } -> std::convertible_to<std::size_t>;
  { O::state_name(std::size_t{0}) } -> std::convertible_to<std::string_view>;
  { o.lr } -> std::convertible_to<float>;
  o.update(ex, a, std::span<update_tensor<float, O::state_lists> const>{});
};

// `static_assert(check_optimizer<O>())`: the first missing member fails with a sentence.
template <class O>
consteval bool check_optimizer() {
  static_assert(requires { { O::name } -> std::convertible_to<std::string_view>; },
                "Optimizer: O needs a static `name` convertible to std::string_view (for reports)");
  static_assert(requires { { O::state_lists } -> std::convertible_to<std::size_t>; },
                "Optimizer: O needs `static constexpr std::size_t state_lists`, the fp32 values it keeps per "
                "parameter (SGD with momentum 1, Adam 2, AMSGrad 3)");
  static_assert(requires { { O::state_name(std::size_t{0}) } -> std::convertible_to<std::string_view>; },
                "Optimizer: O needs `static constexpr std::string_view state_name(std::size_t k)`, the checkpoint "
                "name of state list k (\"m\", \"v\", \"momentum\")");
  static_assert(requires(O const& o) { { o.lr } -> std::convertible_to<float>; },
                "Optimizer: O needs a member `float lr`, the base learning rate");
  if constexpr (requires { { O::state_lists } -> std::convertible_to<std::size_t>; })
    static_assert(requires(O const& o, exec<host> const& ex, update_args const& a,
                           std::span<update_tensor<float, O::state_lists> const> ts) { o.update(ex, a, ts); },
                  "Optimizer: O needs `template <class T> void update(exec<host> const&, update_args const&, "
                  "std::span<update_tensor<T, state_lists> const>) const`, the in-place update of a chunk's runs of "
                  "elements");
  return Optimizer<O>;
}

namespace detail {
// Calls kernel(records) for the tensors converted to Record, at most 32 at a time from a stack
// array (an update allocates nothing). Elementwise optimizers give the same bits for any grouping.
template <class Record, class T, std::size_t N, class Convert, class Kernel>
void in_batches(std::span<update_tensor<T, N> const> tensors, Convert&& convert, Kernel&& kernel) {
  constexpr std::size_t batch = 32;
  std::array<Record, batch> records{};
  for (std::size_t at = 0; at < tensors.size(); at += batch) {
    std::size_t const k = tensors.size() - at < batch ? tensors.size() - at : batch;
    for (std::size_t i = 0; i < k; ++i) records[i] = convert(tensors[at + i]);
    kernel(std::span<Record const>(records.data(), k));
  }
}
}  // namespace detail

}  // namespace tide::optim
