#pragma once
// What make_trainer needs from a model of your own, as concepts, and check_model_spec, which
// states the first thing missing as a sentence instead of a page of template errors. Also
// StagedModel / check_staged_model: what a pipeline needs on top (optional for training), and
// TensorParallelSpec: a spec of one rank's shard over a tensor-parallel group (tp::gpt_spec).
//
//   struct my_spec {                                         // what make_trainer takes
//     using backend = tide::host;
//     using element_type = float;
//     template <class Hooks> using model_type = my_model<Hooks>;
//     tide::parameter_list parameters() const;
//     tide::block_uses uses() const;
//     template <class Hooks> model_type<Hooks> build(tide::memory::device_arena<backend>&, Hooks) const;
//   };
//   static_assert(tide::train::ModelSpec<my_spec>);          // or, with the messages:
//   static_assert(tide::train::check_model_spec<my_spec, Hooks>());
//
// The requirements are exactly what trainer.hpp uses, with the argument kinds it passes: a const
// spec, a non-const arena and executor lvalue, a batch_type const&, a float loss scale, a const
// model for parameters(). docs/trainer.md, "Writing your own model", explains each.

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/nn/gpt.hpp"  // nn::no_hooks
#include "tide/core/parameters.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/pipeline/model.hpp"
#include "tide/tp/shard.hpp"

namespace tide::train {

// ---- the spec, one requirement each -------------------------------------------------------

template <class S>
concept SpecHasBackend = requires { typename S::backend; } && Backend<typename S::backend>;

template <class S>
concept SpecHasElementType = requires { typename S::element_type; } && Element<typename S::element_type>;

template <class S>
concept SpecHasParameters = requires(S const& s) {
  { s.parameters() } -> std::same_as<tide::parameter_list>;
};

template <class S>
concept SpecHasUses = requires(S const& s) {
  { s.uses() } -> std::same_as<tide::block_uses>;
};

template <class S, class Hooks>
concept SpecHasModelType = requires { typename S::template model_type<Hooks>; };

// Exactly model_type<Hooks>, returned by value: the trainer constructs its member from the
// prvalue, so a model that cannot be copied or moved still works.
template <class S, class Hooks>
concept SpecBuildsModel =
    SpecHasBackend<S> && SpecHasModelType<S, Hooks> &&
    requires(S const& s, memory::device_arena<typename S::backend>& arena, Hooks hooks) {
      { s.build(arena, std::move(hooks)) } -> std::same_as<typename S::template model_type<Hooks>>;
    };

// ---- the model, one requirement each ------------------------------------------------------

// An object type: the trainer takes a span of them (one per micro-step).
template <class M>
concept ModelHasBatchType = requires { typename M::batch_type; } && std::is_object_v<typename M::batch_type>;

template <class M, class B>
concept ModelHasForward = requires(M& m, exec<B>& ex, typename M::batch_type const& batch) { m.forward(ex, batch); };

template <class M, class B>
concept ModelForwardReturnsLoss = requires(M& m, exec<B>& ex, typename M::batch_type const& batch) {
  { m.forward(ex, batch) } -> std::convertible_to<float>;
};

template <class M, class B>
concept ModelHasBackward = requires(M& m, exec<B>& ex, float loss_scale) { m.backward(ex, loss_scale); };

template <class M>
concept ModelHasParameters = requires(M const& m) {
  { m.parameters() } -> std::same_as<tide::parameter_list const&>;
};

// Static: the trainer counts tokens as model_type::tokens_in(batch).
template <class M>
concept ModelCountsTokens = requires(typename M::batch_type const& batch) {
  { M::tokens_in(batch) } -> std::convertible_to<std::size_t>;
};

// ---- the whole -----------------------------------------------------------------------------

// A model a trainer on backend B can drive.
template <class M, class B>
concept Model = ModelHasBatchType<M> && ModelHasForward<M, B> && ModelForwardReturnsLoss<M, B> &&
                ModelHasBackward<M, B> && ModelHasParameters<M> && ModelCountsTokens<M>;

// ---- stages, for a pipeline (optional: Model does not ask for them) --------------------------
// The requirements are the executors' (pipeline/model.hpp); a trainer's staged model is also a Model.
using pipeline::StagedHasBlocks;
using pipeline::StagedHasForwardBlocks;
using pipeline::StagedHasBackwardBlocks;
using pipeline::StagedHasBoundaries;

// A Model a pipeline can split into stages (nn::gpt is one).
template <class M, class B>
concept StagedModel = Model<M, B> && pipeline::StagedModel<M, B>;

namespace detail {
// The hooks a trainer hands the model: the interface is the same under every offload policy, so
// resident stands for them all. A spec whose backend the engine does not run on gets no_hooks,
// which keeps ModelSpec<S> false rather than a hard error (scheduler<cuda, ...> does not exist yet).
template <class S>
struct trainer_hooks {
  using type = nn::no_hooks;
};
template <class S>
  requires SpecHasBackend<S> && SpecHasElementType<S> && memory::MemoryOps<typename S::backend>
struct trainer_hooks<S> {
  using type = offload::hooks<offload::scheduler<typename S::backend, typename S::element_type, offload::resident>>;
};
}  // namespace detail

template <class S>
using trainer_hooks_t = typename detail::trainer_hooks<S>::type;

// What make_trainer can build a model from; Hooks defaults to the trainer's own.
template <class S, class Hooks = trainer_hooks_t<S>>
concept ModelSpec = SpecHasBackend<S> && SpecHasElementType<S> && SpecHasParameters<S> && SpecHasUses<S> &&
                    SpecHasModelType<S, Hooks> && SpecBuildsModel<S, Hooks> &&
                    Model<typename S::template model_type<Hooks>, typename S::backend>;

// ---- tensor parallelism (optional) ----------------------------------------------------------

// A spec whose model is this rank's shard over a tensor-parallel group (tp::gpt_spec): the group
// (tensor_group(), a comm::Reducer), and for every parameter of the whole model, in the order
// of parameters(), how it splits (tensor_splits()) and its whole shape (whole_shapes()). The
// trainer then counts a replicated tensor once in the global norm, sums the norm over the group,
// and keeps each shard under its rank's name in a checkpoint set (docs/tensor_parallel.md).
template <class S>
concept TensorParallelSpec = requires(S const& s) {
  s.tensor_group();
  { s.tensor_splits() } -> std::same_as<std::vector<tp::split>>;
  { s.whole_shapes() } -> std::same_as<std::vector<shape>>;
} && comm::Reducer<std::remove_cvref_t<decltype(std::declval<S const&>().tensor_group())>>;

// ---- the types a trainer names, even for a wrong spec ----------------------------------------

// The trainer forms its member types (scheduler, hooks, model, batch) before check_model_spec can
// speak; each of these falls back to a stand-in when the spec or model lacks the member, so the
// static_assert's message is the only error rather than the first of many.
struct rejected_model {
  struct batch_type {};
};

namespace detail {
template <class S>
struct spec_backend {
  using type = host;
};
template <SpecHasBackend S>
struct spec_backend<S> {
  using type = typename S::backend;
};
template <class S>
struct spec_element {
  using type = float;
};
template <SpecHasElementType S>
struct spec_element<S> {
  using type = typename S::element_type;
};
template <class S, class Hooks>
struct spec_model {
  using type = rejected_model;
};
template <class S, class Hooks>
  requires SpecHasModelType<S, Hooks> && std::is_object_v<typename S::template model_type<Hooks>>
struct spec_model<S, Hooks> {
  using type = typename S::template model_type<Hooks>;
};
template <class M>
struct model_batch {
  using type = rejected_model::batch_type;
};
template <ModelHasBatchType M>
struct model_batch<M> {
  using type = typename M::batch_type;
};
}  // namespace detail

template <class S>
using spec_backend_t = typename detail::spec_backend<S>::type;  // S::backend, else tide::host
template <class S>
using spec_element_t = typename detail::spec_element<S>::type;  // S::element_type, else float
template <class S, class Hooks>
using spec_model_t = typename detail::spec_model<S, Hooks>::type;  // S::model_type<Hooks>, else rejected_model
template <class M>
using model_batch_t = typename detail::model_batch<M>::type;  // M::batch_type, else rejected_model::batch_type

// ---- the messages --------------------------------------------------------------------------

// One static_assert per requirement of the model, in the order of check_model_spec; each branch
// is taken only when every earlier requirement holds, so exactly one message appears.
template <class M, class B>
consteval bool check_model() {
  if constexpr (!ModelHasBatchType<M>) {
    static_assert(ModelHasBatchType<M>,
                  "make_trainer: the model (the spec's model_type<Hooks>) has no member type `batch_type`; add "
                  "`struct batch_type { ... };` holding one micro-batch, e.g. views of its inputs and targets "
                  "(docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!ModelHasForward<M, B>) {
    static_assert(ModelHasForward<M, B>,
                  "make_trainer: the model has no member `forward(ex, batch)` taking a tide::exec<backend>& and a "
                  "batch_type const&; add `float forward(tide::exec<backend> const& ex, batch_type const& batch);` "
                  "returning the loss (docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!ModelForwardReturnsLoss<M, B>) {
    static_assert(ModelForwardReturnsLoss<M, B>,
                  "make_trainer: the model's `forward` does not return the loss; return it as a float: "
                  "`float forward(tide::exec<backend> const& ex, batch_type const& batch);` "
                  "(docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!ModelHasBackward<M, B>) {
    static_assert(ModelHasBackward<M, B>,
                  "make_trainer: the model has no member `backward(ex, loss_scale)`; add "
                  "`void backward(tide::exec<backend> const& ex, float loss_scale);`, which multiplies the loss "
                  "gradient by loss_scale (docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!ModelHasParameters<M>) {
    static_assert(ModelHasParameters<M>,
                  "make_trainer: the model has no member `parameters() const` returning "
                  "tide::parameter_list const&; add `tide::parameter_list const& parameters() const;` "
                  "returning the list the spec gave (docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!ModelCountsTokens<M>) {
    static_assert(ModelCountsTokens<M>,
                  "make_trainer: the model has no static member `tokens_in(batch)` returning std::size_t; add "
                  "`static std::size_t tokens_in(batch_type const& batch);`, the tokens (or rows) one micro-batch "
                  "trains on (docs/trainer.md, 'Writing your own model')");
  }
  return true;  // a failed static_assert above is the one error; a false here would add a second
}

// One static_assert per requirement of a staged model, after those of check_model: exactly one
// message appears, naming the member to add.
template <class M, class B>
consteval bool check_staged_model() {
  if constexpr (!Model<M, B>) {
    check_model<M, B>();
  } else if constexpr (!StagedHasBlocks<M>) {
    static_assert(StagedHasBlocks<M>,
                  "pipeline: the model has no members `first_block() const` and `last_block() const` returning int; "
                  "add them, the numbers of its first and last blocks (nn::gpt: -1 and L)");
  } else if constexpr (!StagedHasForwardBlocks<M, B>) {
    static_assert(StagedHasForwardBlocks<M, B>,
                  "pipeline: the model has no member `forward_blocks(ex, first, last, micro, batch)` returning the "
                  "loss; add `float forward_blocks(tide::exec<backend> const& ex, int first, int last, int micro, "
                  "batch_type const& batch);` running blocks first .. last for micro-batch slot micro");
  } else if constexpr (!StagedHasBackwardBlocks<M, B>) {
    static_assert(StagedHasBackwardBlocks<M, B>,
                  "pipeline: the model has no member `backward_blocks(ex, first, last, micro, loss_scale)`; add "
                  "`void backward_blocks(tide::exec<backend> const& ex, int first, int last, int micro, float "
                  "loss_scale);` running blocks last .. first backward for micro-batch slot micro");
  } else if constexpr (!StagedHasBoundaries<M>) {
    static_assert(StagedHasBoundaries<M>,
                  "pipeline: the model has no members `boundary(block, micro) const` and `boundary_grad(micro) "
                  "const` returning tensor views; add them: the activations leaving a block and the gradient at a "
                  "stage's edge, which the pipeline sends between stages");
  }
  return true;
}

// One static_assert per requirement of the spec, then of the model it builds. The trainer calls
// it in its class body, so Spec may be any type at all (int, a struct missing build).
template <class Spec, class Hooks>
consteval bool check_model_spec() {
  if constexpr (!SpecHasBackend<Spec>) {
    static_assert(SpecHasBackend<Spec>,
                  "make_trainer: the model spec has no member type `backend` naming a tide backend; add "
                  "`using backend = tide::host;` (docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!SpecHasElementType<Spec>) {
    static_assert(SpecHasElementType<Spec>,
                  "make_trainer: the model spec has no member type `element_type` that is float, tide::bf16 or "
                  "tide::f16; add `using element_type = float;`, the type of its parameters and gradients "
                  "(docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!SpecHasParameters<Spec>) {
    static_assert(SpecHasParameters<Spec>,
                  "make_trainer: the model spec has no member `parameters() const` returning "
                  "tide::parameter_list; add `tide::parameter_list parameters() const;` that adds each "
                  "tensor with its block (docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!SpecHasUses<Spec>) {
    static_assert(SpecHasUses<Spec>,
                  "make_trainer: the model spec has no member `uses() const` returning tide::block_uses; add "
                  "`tide::block_uses uses() const;` listing the parameters each block reads "
                  "(docs/trainer.md, 'Writing your own model')");
  } else if constexpr (!SpecHasModelType<Spec, Hooks>) {
    static_assert(SpecHasModelType<Spec, Hooks>,
                  "make_trainer: the model spec has no `model_type<Hooks>` member template; add "
                  "`template <class Hooks> using model_type = my_model<Hooks>;` (docs/trainer.md, "
                  "'Writing your own model')");
  } else if constexpr (!SpecBuildsModel<Spec, Hooks>) {
    static_assert(SpecBuildsModel<Spec, Hooks>,
                  "make_trainer: the model spec has no member `build(arena, hooks) const` returning "
                  "model_type<Hooks>; add `template <class Hooks> model_type<Hooks> "
                  "build(tide::memory::device_arena<backend>& arena, Hooks hooks) const;` (docs/trainer.md, "
                  "'Writing your own model')");
  } else {
    check_model<typename Spec::template model_type<Hooks>, typename Spec::backend>();
  }
  return true;
}

}  // namespace tide::train
