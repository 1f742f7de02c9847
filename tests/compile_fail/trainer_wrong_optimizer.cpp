// expect: the 3rd argument must be an optimizer
// make_trainer with an offload policy where the optimizer goes.
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

int main() {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{}, tide::offload::resident{},
                                     tide::offload::resident{});
  (void)t;
}
