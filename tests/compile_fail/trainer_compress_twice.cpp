// expect: the comm policy compresses already
// A compressing comm policy with a compression in the 5th slot as well: one of them would be
// dropped silently, so the slot refuses it and says which to pass (compress/sink.hpp).
#include <tide/comm/self.hpp>
#include <tide/compress/sink.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

int main() {
  tide::comm::self one;
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{}, tide::offload::resident{}, tide::optim::adamw{},
                                     tide::compress::sparse_data_parallel<tide::comm::self>{.comm = &one},
                                     tide::compress::error_feedback<>{});
  (void)t;
}
