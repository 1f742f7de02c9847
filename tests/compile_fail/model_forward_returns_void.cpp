// expect: `forward` does not return the loss
// make_trainer with a model whose `forward(ex, batch)` returns void instead of the loss. The check
// says what forward must return.
#include <tide/train/trainer.hpp>

#include "minimal_model.hpp"

using namespace tide::test::minimal;

// Every part of minimal_model.hpp, with this one for has_forward: forward returns nothing.
struct forward_returns_void {
  void forward(tide::exec<tide::host> const&, batch const&) {}
};

template <class Hooks>
using one_layer = model<Hooks, has_batch_type, forward_returns_void, has_backward, has_parameters, has_tokens_in>;
struct one_layer_spec : spec_types, spec_parameters, spec_uses, spec_model_type<one_layer>, spec_build<one_layer> {};

int main() {
  auto t = tide::train::make_trainer(one_layer_spec{}, tide::offload::resident{}, tide::optim::adamw{});
  (void)t;
}
