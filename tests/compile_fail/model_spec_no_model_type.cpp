// expect: model spec has no `model_type<Hooks>` member template
// make_trainer with a model spec without `template <class Hooks> using model_type = ...`. The check
// names the missing member and what to write.
#include <cstddef>

#include <tide/train/trainer.hpp>

template <class Hooks>
struct one_layer {
  struct batch_type {
    tide::tensor_view<float const> x;  // (N, 4)
  };
  tide::nn::parameter_list params;
  Hooks hooks;
  float forward(tide::exec<tide::host> const&, batch_type const&) { return 0.f; }
  void backward(tide::exec<tide::host> const&, float) {}
  tide::nn::parameter_list const& parameters() const { return params; }
  static std::size_t tokens_in(batch_type const& b) { return static_cast<std::size_t>(b.x.extent(0)); }
};

struct one_layer_spec {
  using backend = tide::host;
  using element_type = float;
  tide::nn::parameter_list parameters() const {
    tide::nn::parameter_list p;
    p.add("w", 0, {4}, tide::dtype::f32);
    return p;
  }
  tide::nn::block_uses uses() const { return {0, {{0}}}; }
  template <class Hooks>
  one_layer<Hooks> build(tide::memory::device_arena<tide::host>&, Hooks hooks) const {
    return {parameters(), hooks};
  }
};

int main() {
  auto t = tide::train::make_trainer(one_layer_spec{}, tide::offload::resident{}, tide::optim::adamw{});
  (void)t;
}
