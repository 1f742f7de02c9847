// expect: model has no member `backward
// make_trainer with a model without `backward(ex, loss_scale)`. The check names the missing member
// and what to write.
#include <tide/train/trainer.hpp>

#include "minimal_model.hpp"

using namespace tide::test::minimal;

// Every part of minimal_model.hpp but has_backward.
template <class Hooks>
using one_layer = model<Hooks, has_batch_type, has_forward, has_parameters, has_tokens_in>;
struct one_layer_spec : spec_types, spec_parameters, spec_uses, spec_model_type<one_layer>, spec_build<one_layer> {};

int main() {
  auto t = tide::train::make_trainer(one_layer_spec{}, tide::offload::resident{}, tide::optim::adamw{});
  (void)t;
}
