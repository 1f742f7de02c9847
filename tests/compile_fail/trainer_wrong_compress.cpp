// expect: the 5th argument must be a compression policy
// make_trainer with a policy of another slot where the compress policy goes: a static_assert names
// the slot's concept (train/slots.hpp) and what to pass.
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

int main() {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{}, tide::offload::resident{}, tide::optim::adamw{}, tide::train::no_comm{}, tide::train::no_comm{});
  (void)t;
}
