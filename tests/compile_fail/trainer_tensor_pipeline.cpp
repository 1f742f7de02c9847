// expect: a tensor-parallel model .tp::gpt_spec. in a pipeline of one stage per rank is not supported yet
// A tensor-parallel spec in a pipeline of one stage per rank: tp::gpt has no stages yet, and the
// trainer says so by name rather than failing inside the pipeline's executor.
#include <tide/comm/self.hpp>
#include <tide/pipeline/stages.hpp>
#include <tide/tp/spec.hpp>
#include <tide/train/trainer.hpp>

int main() {
  tide::comm::self group;
  auto t = tide::train::make_trainer(
      tide::tp::gpt_spec<tide::comm::self>{.tensor = {.group = &group}}, tide::offload::resident{},
      tide::optim::adamw{}, tide::train::no_comm{}, tide::train::no_compress{},
      tide::pipeline::on_ranks<tide::pipeline::kind::one_f_one_b, tide::comm::self>{.stages = 1, .group = &group});
  (void)t;
}
