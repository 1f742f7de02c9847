// make_trainer with tp::gpt_spec over MPI ranks: tensor x data parallelism (t = 2, d = world / 2;
// ZeRO-0, 2 and 3; resident and chunked offload; plain and sequence parallel; the ZeRO-3 row with
// recompute) against one process training nn::gpt_spec on every data rank's micro-batch: the
// loss and the clipped global norm within 1e-5, the parameters' distance from the reference under 1e-3 of how far a step moves
// them, the replicated tensors the same bits on the tensor group and each shard on its replicas.
// A checkpoint set saved at (t, d) = (2, 2) loads at (1, 1) and (4, 1): the shards gathered and
// cut again, bit for bit, and the optimizer state with them (the next step matches the run that
// went on); at (4, 1) without a data-parallel comm policy a set saves and loads back.
// Tensor x pipeline x data, (t, p, d) = (2, 2, world / 4) under 1F1B, ZeRO-2 and chunked offload,
// sequence parallel, against one process on every replica's micro-batches, the same bounds; its
// set loads at (1, 1, 1) and at (1, 2, world / 2): the parameters bit for bit, the next step's
// loss within 1e-5 of the run that went on.

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
#include "tide/pipeline/stages.hpp"
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

// Shard `got` of the whole model's parameter i: adds its squared distance from `want` to left and
// how far the steps moved it (from `before`) to moved; returns the groups on which its bits
// differ (its replicas; a replicated tensor's tensor group).
int add_shard(mpi& data, mpi& tensor, std::size_t i, std::vector<float> const& got, std::vector<float> const& want,
              std::vector<float> const& before, double& left, double& moved) {
  for (std::size_t e = 0; e < got.size(); ++e) {
    left += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
    moved += (double(before[e]) - want[e]) * (double(before[e]) - want[e]);
  }
  int differ = !same_on(data, got);
  if (tide::tp::split_of(config, tide::nn::gpt_parameters(config, tide::dtype::f32)[i], i) == tide::tp::split::replicated)
    differ += !same_on(tensor, got);
  return differ;
}

// The number of parameter `name` in the whole model's list.
std::size_t index_of(std::string_view name) {
  auto const list = tide::nn::gpt_parameters(config, tide::dtype::f32);
  for (std::size_t i = 0; i < list.size(); ++i)
    if (list[i].name() == name) return i;
  FAIL("no parameter " << std::string(name));
  return 0;
}

struct row {
  bool chunked_offload;
  int zero;
  bool sequence;
  bool recompute = false;
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
    CAPTURE(r.recompute);
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
    for (std::size_t i = 0; i < got.size(); ++i)
      differ += add_shard(g.data, g.tensor, i, got[i], want[i], before[i], left, moved);
    double const distance = std::sqrt(tide::comm::sum_over_ranks(world, left) / tide::comm::sum_over_ranks(world, moved));
    if (world.rank() == 0)
      MESSAGE("t = 2, d = ", d, ", ", std::string(r.chunked_offload ? "chunked" : "resident"), ", ZeRO-", r.zero,
              std::string(r.sequence ? ", sequence parallel" : ""), std::string(r.recompute ? ", recompute" : ""),
              ": loss within ", worst_loss, ", norm within ",
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
    auto tr = tide::train::make_trainer(
        spec{.config = config, .tensor = {.group = &g.tensor, .sequence = true}, .seed = 4, .recompute = true}, offload,
        adamw(1), dp{.comm = &g.data, .zero = 3});
    check(tr, {true, 3, true, true});
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

TEST_CASE("mpi tp trainer: tensor x pipeline x data parallelism trains as one process; its set loads at another "
          "(t, p, d)") {
  auto& world = tide::test::world();
  if (world.size() % 4 != 0) return;
  int const t = 2, p = 2, d = world.size() / 4, m = 2;
  auto g = tide::tp::make_groups(world, t, p);
  using spec = tide::tp::gpt_spec<mpi>;
  using dp = tide::comm::data_parallel<mpi>;
  using pipe = tide::pipeline::on_ranks<tide::pipeline::kind::one_f_one_b, mpi>;
  // Replica k's micro-batches of step s: k m .. k m + m - 1 of the m d.
  auto mine = [&](int s, int k, int per) {
    auto const all = step_data(s, m * d);
    return std::vector<data>(all.begin() + k * per, all.begin() + (k + 1) * per);
  };

  auto reference = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 4}},
                                             tide::offload::resident{}, adamw(m * d));
  auto const start = params_of(reference);
  std::vector<float> ref_loss, ref_norm;
  for (int s = 0; s < steps; ++s) {
    auto const st = reference.step(all_of<decltype(reference)::batch_type>(step_data(s, m * d)));
    ref_loss.push_back(st.loss), ref_norm.push_back(static_cast<float>(st.grad_norm));
  }
  auto const want = shards_of(params_of(reference), g.tensor_rank, t), before = shards_of(start, g.tensor_rank, t);

  auto tr = tide::train::make_trainer(
      spec{.config = config, .tensor = {.group = &g.tensor, .sequence = true}, .seed = 4, .in_flight = 2,
           .separate_tied_grad = true},
      offload, adamw(m), dp{.comm = &g.data, .zero = 2}, tide::train::no_compress{},
      pipe{.stages = p, .micro = m, .group = &g.pipeline, .tied = &g.tied});
  using batch = decltype(tr)::batch_type;
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < steps; ++s) {
    auto const st = tr.step(all_of<batch>(mine(s, g.data_rank, m)));
    double const loss = tide::comm::sum_over_ranks(g.data, st.loss) / d;
    auto const k = static_cast<std::size_t>(s);
    worst_loss = std::max(worst_loss, std::fabs(loss - ref_loss[k]) / ref_loss[k]);
    worst_norm = std::max(worst_norm, std::fabs(st.grad_norm - ref_norm[k]) / ref_norm[k]);
    CHECK(st.grad_norm > 0.5);  // the clip acted
  }
  CHECK(worst_loss < 1e-5);
  CHECK(worst_norm < 1e-5);
  // The stage's shards against the reference's; each the same bits on its replicas, a replicated
  // one on the tensor group, wte on both ends.
  auto const got = params_of(tr);
  auto const& stage_list = tr.scheduler().parameters();
  double left = 0, moved = 0;
  int differ = 0;
  for (std::uint32_t j = 0; j < stage_list.size(); ++j) {
    std::size_t const i = index_of(stage_list[j].name());
    differ += add_shard(g.data, g.tensor, i, got[j], want[i], before[i], left, moved);
    if (stage_list[j].name() == "wte") differ += !same_on(g.tied, got[j]);
  }
  double const distance = std::sqrt(tide::comm::sum_over_ranks(world, left) / tide::comm::sum_over_ranks(world, moved));
  if (world.rank() == 0)
    MESSAGE("(t, p, d) = (2, 2, ", d, "), 1F1B, ZeRO-2, chunked, sequence parallel: loss within ", worst_loss,
            ", norm within ", worst_norm, ", distance ", distance);
  CHECK(distance < 1e-3);
  CHECK(differ == 0);

  // The set at (2, 2, d), then the run goes on one step.
  auto const scratch = std::filesystem::temp_directory_path() /
                       ("tide_tp_pipeline_" + std::to_string(tide::comm::of_rank0(world, ::getpid())));
  tr.save(scratch);
  auto const saved = params_of(tr);
  double const went_on =
      tide::comm::sum_over_ranks(g.data, tr.step(all_of<batch>(mine(steps, g.data_rank, m))).loss) / d;

  // At (1, 1, 1) on every rank: the whole tensors, this rank's shards of them the ones it saved.
  tide::comm::self self;
  auto one = tide::train::make_trainer(
      tide::tp::gpt_spec<tide::comm::self>{.config = config, .tensor = {.group = &self}, .seed = 9}, offload,
      adamw(m * d));
  one.load(scratch);
  auto const whole = params_of(one);
  auto const cut = shards_of(whole, g.tensor_rank, t);
  for (std::uint32_t j = 0; j < stage_list.size(); ++j) differ += cut[index_of(stage_list[j].name())] != saved[j];
  CHECK(differ == 0);
  double const loss_one = one.step(all_of<decltype(one)::batch_type>(step_data(steps, m * d))).loss;
  CHECK(std::fabs(loss_one - went_on) <= 1e-5 * went_on);

  // At (1, 2, 2 d): no tensor parallelism, twice the replicas, one micro-batch each.
  auto g1 = tide::tp::make_groups(world, 1, p);
  auto wide = tide::train::make_trainer(
      spec{.config = config, .tensor = {.group = &g1.tensor}, .seed = 11, .separate_tied_grad = true}, offload,
      adamw(1), dp{.comm = &g1.data, .zero = 2}, tide::train::no_compress{},
      pipe{.stages = p, .micro = 1, .group = &g1.pipeline, .tied = &g1.tied});
  wide.load(scratch);
  auto const loaded = params_of(wide);
  auto const& wide_list = wide.scheduler().parameters();
  for (std::uint32_t j = 0; j < wide_list.size(); ++j) differ += loaded[j] != whole[index_of(wide_list[j].name())];
  CHECK(differ == 0);
  double const loss_wide = tide::comm::sum_over_ranks(
      g1.data, wide.step(all_of<batch>(mine(steps, g1.data_rank, 1))).loss) / (2 * d);
  CHECK(std::fabs(loss_wide - went_on) <= 1e-5 * went_on);
  if (world.rank() == 0)
    MESSAGE("the set of (2, 2, ", d, ") at (1, 1, 1) and (1, 2, ", 2 * d, "): the next step's loss within ",
            std::fabs(loss_one - went_on) / went_on, " and ", std::fabs(loss_wide - went_on) / went_on);
  tide::comm::all_ranks(world, true);
  if (world.rank() == 0) std::filesystem::remove_all(scratch);
}
