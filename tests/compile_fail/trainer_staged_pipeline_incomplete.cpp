// expect: one_stage_per_rank needs all_stages
// A pipeline policy of one stage per rank of the user's own that places its stage but cannot agree
// with the other stages: the static_assert names the missing part (train/composes.hpp) rather
// than the trainer failing somewhere inside a checkpoint.
#include <span>
#include <string_view>

#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

struct my_stages {
  static constexpr std::string_view name = "my stages";
  static constexpr bool one_stage_per_rank = true;
  int stages = 2;
  [[nodiscard]] int stage() const { return 0; }
  [[nodiscard]] tide::pipeline::schedule plan() const { return tide::pipeline::one_f_one_b(2, 2); }
  [[nodiscard]] tide::pipeline::cut cut_for(int first, int last, int, int) const {
    return tide::pipeline::uniform_cut(first, last, 2);
  }
  template <tide::Backend B, class Model, class Batch>
  double run(tide::exec<B> const&, Model&, std::span<Batch const>, float) {
    return 0;
  }
};

int main() {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{}, tide::offload::resident{}, tide::optim::adamw{},
                                     tide::train::no_comm{}, tide::train::no_compress{}, my_stages{});
  (void)t;
}
