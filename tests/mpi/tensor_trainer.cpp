// make_trainer with tp::gpt_spec over MPI ranks: tensor x data parallelism (t = 2, d = world / 2;
// ZeRO-0, 2 and 3; resident and chunked offload; plain and sequence parallel) against one process
// training nn::gpt_spec on every data rank's micro-batch: the loss and the clipped global norm
// within 1e-5, the parameters' distance from the reference under 1e-3 of how far a step moves
// them, the replicated tensors the same bits on the tensor group and each shard on its replicas.
// A checkpoint set saved at (t, d) = (2, 2) loads at (1, 1) and (4, 1): the shards gathered and
// cut again, bit for bit, and the optimizer state with them (the next step matches the run that
// went on); at (4, 1) without a data-parallel comm policy a set saves and loads back.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "support/mpi_world.hpp"
#include "support/tp_block.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/comm/self.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/tp/spec.hpp"
#include "tide/train/crc32c.hpp"
#include "tide/train/trainer.hpp"

namespace {

using tide::index_t;
using mpi = tide::comm::mpi;
constexpr tide::nn::gpt_config config{.layers = 2, .heads = 4, .channels = 32, .vocab = 60, .padded_vocab = 64,
                                      .max_seq = 8};
constexpr index_t Bn = 2, Tn = 8;
constexpr int steps = 3;
using chunked = tide::offload::chunked<tide::offload::belady>;
chunked const offload{.device_budget = std::size_t{4} << 20, .chunk_bytes = std::size_t{16} << 10};

// Data rank k's micro-batch of step s (the same on every tensor rank).
struct data {
  std::vector<std::int32_t> tokens, targets;
  data(int s, int k)
      : tokens(tide::test::tp_tokens(Bn * Tn, config.vocab, static_cast<std::uint32_t>(500 + 16 * s + k))),
        targets(tide::test::tp_tokens(Bn * Tn, config.vocab, static_cast<std::uint32_t>(700 + 16 * s + k))) {}
  template <class Batch>
  Batch view() const {
    return {{tokens.data(), {Bn, Tn}}, {targets.data(), {Bn, Tn}}};
  }
};
// Every data rank's micro-batch of step s, for a trainer that runs them all.
template <class Batch>
std::vector<Batch> all_of(std::vector<data> const& d) {
  std::vector<Batch> out;
  for (auto const& x : d) out.push_back(x.view<Batch>());
  return out;
}
std::vector<data> step_data(int s, int d) {
  std::vector<data> out;
  for (int k = 0; k < d; ++k) out.emplace_back(s, k);
  return out;
}

tide::optim::adamw adamw(int micro) { return {.lr = 1e-2f, .clip_norm = 0.5f, .micro_steps = micro}; }

template <class Trainer>
std::vector<std::vector<float>> params_of(Trainer& t) {
  t.scheduler().gather_parameters();  // ZeRO-3: every chunk here
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < t.scheduler().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
  return out;
}

// Rank r's shard of every parameter of a whole model's list on a group of t.
std::vector<std::vector<float>> shards_of(std::vector<std::vector<float>> const& whole, int r, int t) {
  auto const list = tide::nn::gpt_parameters(config, tide::dtype::f32);
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto const& p = list[i];
    out.emplace_back(static_cast<std::size_t>(tide::tp::shard_shape_of(config, p, i, t).numel()));
    tide::tp::take_shard(tide::tp::split_of(config, p, i), std::span<float const>(whole[i]), std::span<float>(out.back()),
                         p.shape[0], p.shape.rank == 2 ? p.shape[1] : 1, r, t);
  }
  return out;
}

// Whether v's bits are the same on every rank of c.
bool same_on(mpi& c, std::vector<float> const& v) {
  auto const crc = static_cast<std::int64_t>(tide::train::crc32c(std::as_bytes(std::span(v))));
  return tide::comm::of_rank0(c, crc) == crc && tide::comm::all_ranks(c, true);
}

struct row {
  bool chunked_offload;
  int zero;
  bool sequence;
};

}  // namespace

TEST_CASE("mpi tp trainer: tensor x data parallelism trains as one process on the same data; a checkpoint set "
          "loads at other group sizes") {
  auto& world = tide::test::world();
  if (world.size() % 2 != 0) return;
  int const t = 2, d = world.size() / t;
  auto g = tide::tp::make_groups(world, t);
  using spec = tide::tp::gpt_spec<mpi>;
  using dp = tide::comm::data_parallel<mpi>;

  // The reference: one process, every data rank's micro-batch in each step.
  auto reference = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 4}},
                                             tide::offload::resident{}, adamw(d));
  auto const start = params_of(reference);
  std::vector<float> ref_loss, ref_norm;
  for (int s = 0; s < steps; ++s) {
    auto const st = reference.step(all_of<decltype(reference)::batch_type>(step_data(s, d)));
    ref_loss.push_back(st.loss), ref_norm.push_back(static_cast<float>(st.grad_norm));
  }
  auto const want = shards_of(params_of(reference), g.tensor_rank, t), before = shards_of(start, g.tensor_rank, t);
  auto const list = tide::tp::shard_parameters(config, t);

  auto const scratch = std::filesystem::temp_directory_path() /
                       ("tide_tp_trainer_" + std::to_string(tide::comm::of_rank0(world, ::getpid())));
  auto check = [&](auto& trainer, row r) {
    CAPTURE(r.chunked_offload);
    CAPTURE(r.zero);
    CAPTURE(r.sequence);
    double worst_loss = 0, worst_norm = 0;
    for (int s = 0; s < steps; ++s) {
      auto const st = trainer.step(step_data(s, d)[static_cast<std::size_t>(g.data_rank)]
                                       .template view<typename std::remove_cvref_t<decltype(trainer)>::batch_type>());
      double const loss = tide::comm::sum_over_ranks(g.data, st.loss) / d;
      worst_loss = std::max(worst_loss, std::fabs(loss - ref_loss[static_cast<std::size_t>(s)]) / ref_loss[static_cast<std::size_t>(s)]);
      worst_norm = std::max(worst_norm, std::fabs(st.grad_norm - ref_norm[static_cast<std::size_t>(s)]) / ref_norm[static_cast<std::size_t>(s)]);
      CHECK(st.grad_norm > 0.5);  // the clip acted
    }
    CHECK(worst_loss < 1e-5);
    CHECK(worst_norm < 1e-5);
    auto const got = params_of(trainer);
    double left = 0, moved = 0;
    int differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      for (std::size_t e = 0; e < got[i].size(); ++e) {
        left += (double(got[i][e]) - want[i][e]) * (double(got[i][e]) - want[i][e]);
        moved += (double(before[i][e]) - want[i][e]) * (double(before[i][e]) - want[i][e]);
      }
      differ += !same_on(g.data, got[i]);
      if (tide::tp::split_of(config, tide::nn::gpt_parameters(config, tide::dtype::f32)[i], i) == tide::tp::split::replicated)
        differ += !same_on(g.tensor, got[i]);
    }
    double const distance = std::sqrt(tide::comm::sum_over_ranks(world, left) / tide::comm::sum_over_ranks(world, moved));
    if (world.rank() == 0)
      MESSAGE("t = 2, d = ", d, ", ", std::string(r.chunked_offload ? "chunked" : "resident"), ", ZeRO-", r.zero,
              std::string(r.sequence ? ", sequence parallel" : ""), ": loss within ", worst_loss, ", norm within ",
              worst_norm, ", distance ", distance);
    CHECK(distance < 1e-3);
    CHECK(differ == 0);
  };
  {
    auto tr = tide::train::make_trainer(spec{.config = config, .tensor = {.group = &g.tensor}, .seed = 4},
                                        tide::offload::resident{}, adamw(1), dp{.comm = &g.data});
    check(tr, {false, 0, false});
  }
  {
    auto tr = tide::train::make_trainer(spec{.config = config, .tensor = {.group = &g.tensor, .sequence = true}, .seed = 4},
                                        offload, adamw(1), dp{.comm = &g.data, .zero = 3});
    check(tr, {true, 3, true});
  }
  auto tr = tide::train::make_trainer(spec{.config = config, .tensor = {.group = &g.tensor, .sequence = true}, .seed = 4},
                                      offload, adamw(1), dp{.comm = &g.data, .zero = 2});
  check(tr, {true, 2, true});

  // The set at (2, d), then the run goes on one step.
  CHECK(tr.sharded());
  tr.save(scratch);
  auto const saved = params_of(tr);
  auto const next = step_data(steps, d);
  double const went_on = tide::comm::sum_over_ranks(
      g.data, tr.step(next[static_cast<std::size_t>(g.data_rank)].view<decltype(tr)::batch_type>()).loss) / d;

  auto const after = params_of(tr);
  // The distance of another run's shards after that step from this run's, over how far the step moved them.
  auto const distance = [&](std::vector<std::vector<float>> const& other) {
    double left = 0, moved = 0;
    for (std::size_t i = 0; i < after.size(); ++i)
      for (std::size_t e = 0; e < after[i].size(); ++e) {
        left += (double(other[i][e]) - after[i][e]) * (double(other[i][e]) - after[i][e]);
        moved += (double(saved[i][e]) - after[i][e]) * (double(saved[i][e]) - after[i][e]);
      }
    return std::sqrt(tide::comm::sum_over_ranks(world, left) / tide::comm::sum_over_ranks(world, moved));
  };

  // At (1, 1) on every rank: the shards gathered; then the same step, with the optimizer state
  // it loaded (fresh moments would move the parameters far from the run that went on).
  tide::comm::self self;
  auto one = tide::train::make_trainer(tide::tp::gpt_spec<tide::comm::self>{.config = config, .tensor = {.group = &self},
                                                                           .seed = 9},
                                       offload, adamw(d));
  one.load(scratch);
  auto const whole = params_of(one);
  CHECK(shards_of(whole, g.tensor_rank, t) == saved);
  double const loss_one = one.step(all_of<decltype(one)::batch_type>(next)).loss;
  CHECK(std::fabs(loss_one - went_on) <= 1e-5 * went_on);
  double const far_one = distance(shards_of(params_of(one), g.tensor_rank, t));
  CHECK(far_one < 1e-3);

  // At (4, 1) on 4 ranks: cut again for a group of 4.
  if (world.size() == 4) {
    auto four = tide::train::make_trainer(spec{.config = config, .tensor = {.group = &world}, .seed = 9}, offload,
                                          adamw(d));
    four.load(scratch);
    CHECK(params_of(four) == shards_of(whole, world.rank(), 4));
    double const loss_four = four.step(all_of<decltype(four)::batch_type>(next)).loss;
    CHECK(std::fabs(loss_four - went_on) <= 1e-5 * went_on);
    // Without a data-parallel comm policy too, every rank writes its shard of one set.
    auto const again_dir = std::filesystem::path(scratch.string() + "_4");
    four.save(again_dir);
    auto again = tide::train::make_trainer(spec{.config = config, .tensor = {.group = &world}, .seed = 11}, offload,
                                           adamw(d));
    again.load(again_dir);
    CHECK(params_of(again) == params_of(four));
    tide::comm::all_ranks(world, true);
    if (world.rank() == 0) std::filesystem::remove_all(again_dir);
  }
  if (world.rank() == 0)
    MESSAGE("the set of (2, ", d, ") at (1, 1): the next step's parameters at ", far_one, " of its move from the "
            "run that went on");

  // A model that is not tensor parallel refuses it, saying which loads it.
  auto plain = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config}, tide::offload::resident{},
                                         adamw(d));
  CHECK_THROWS_WITH_AS(plain.load(scratch), doctest::Contains("saved by a tensor-parallel group of 2 ranks"),
                       tide::error);
  tide::comm::all_ranks(world, true);
  if (world.rank() == 0) std::filesystem::remove_all(scratch);
}
