// expect: the 2nd argument must be an offload scheduler policy
// make_trainer with an optimizer where the offload policy goes: a static_assert says what to pass.
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

int main() {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{}, tide::optim::adamw{}, tide::optim::adamw{});
  (void)t;
}
