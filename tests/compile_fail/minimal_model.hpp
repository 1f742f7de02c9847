#pragma once
// The smallest model and spec make_trainer accepts, in parts, for the compile-fail tests of
// tide::train::check_model_spec (train/model.hpp). A test composes every part but the one whose
// message it expects (or puts a wrong one in its place):
//
//   template <class Hooks>
//   using one_layer = model<Hooks, has_batch_type, has_forward, has_backward, has_parameters, has_tokens_in>;
//   struct one_layer_spec : spec_types, spec_parameters, spec_uses, spec_model_type<one_layer>,
//                           spec_build<one_layer> {};
//
// With every part, make_trainer(one_layer_spec{}, tide::offload::resident{}, tide::optim::adamw{})
// compiles. This is a header, not a test: tests/CMakeLists.txt globs only compile_fail/*.cpp.

#include <cstddef>
#include <utility>

#include <tide/train/trainer.hpp>

namespace tide::test::minimal {

// One micro-batch: (N, 4) inputs.
struct batch {
  tide::tensor_view<float const> x;
};

// The model's one tensor, "w" of 4 floats in block 0.
inline tide::parameter_list one_weight() {
  tide::parameter_list p;
  p.add("w", 0, {4}, tide::dtype::f32);
  return p;
}

// ---- the spec's parts ------------------------------------------------------------------------

struct spec_types {
  using backend = tide::host;
  using element_type = float;
};

struct spec_parameters {
  tide::parameter_list parameters() const { return one_weight(); }
};

struct spec_uses {
  tide::block_uses uses() const { return {0, {{0}}}; }
};

template <template <class> class Model>
struct spec_model_type {
  template <class Hooks>
  using model_type = Model<Hooks>;
};

template <template <class> class Model>
struct spec_build {
  template <class Hooks>
  Model<Hooks> build(tide::memory::device_arena<tide::host>&, Hooks hooks) const {
    return Model<Hooks>(std::move(hooks));
  }
};

// ---- the model's parts -----------------------------------------------------------------------

struct has_batch_type {
  using batch_type = batch;
};

struct has_forward {
  float forward(tide::exec<tide::host> const&, batch const&) { return 0.f; }
};

struct has_backward {
  void backward(tide::exec<tide::host> const&, float) {}
};

struct has_parameters {
  tide::parameter_list params = one_weight();
  tide::parameter_list const& parameters() const { return params; }
};

struct has_tokens_in {
  static std::size_t tokens_in(batch const& b) { return static_cast<std::size_t>(b.x.extent(0)); }
};

// The model: the parts given, and the hooks the trainer passes to build.
template <class Hooks, class... Parts>
struct model : Parts... {
  explicit model(Hooks h) : hooks(std::move(h)) {}
  Hooks hooks;
};

}  // namespace tide::test::minimal
