// expect: memory_options.* has no non-static data member named .*host_budjet
// A misspelled host-side knob of an offload policy: the knobs are one struct (.memory), so the
// mistake does not compile, where a knob probed by name would be silently ignored.
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

int main() {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{},
                                     tide::offload::chunked<tide::offload::belady>{.memory = {.host_budjet = 1 << 30}},
                                     tide::optim::adamw{});
  (void)t;
}
