// pipeline::rank_executor on MPI ranks, one stage per rank: every schedule on 2 and on 4 ranks (the
// zero-bubble ones also with the backward split, W's apart) gives each rank's parameters the
// gradients of gradient accumulation in one process, bit for bit, and
// every rank the losses' sum; the parameters of other ranks' blocks keep a zero gradient (the
// head's share of wte travels to the embedding's rank); 2 stages x 2 data-parallel replicas on 4
// ranks equal one process summing the two replicas' accumulations.

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <tide/comm/mpi.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/pipeline/ranks.hpp>

#include "support/mpi_world.hpp"
#include "support/pipeline_data.hpp"

namespace pp = tide::pipeline;
using namespace tide::literals;
using tide::index_t;
using host_gpt = tide::nn::gpt<tide::host>;
using batch = host_gpt::batch_type;

namespace {

constexpr auto config = tide::test::pipeline_gpt;
constexpr index_t B = tide::test::pipeline_B, T = tide::test::pipeline_T;
using data = tide::test::pipeline_micro_batches;

// Gradient accumulation in this process: the loss sum and the flat gradients.
std::pair<double, std::vector<float>> accumulate(data const& d, float scale) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  host_gpt m(config, arena, {.seed = 5, .separate_tied_grad = true});
  m.zero_grad(ex);
  double loss = 0;
  for (batch const& b : d.micro) {
    loss += static_cast<double>(m.forward(ex, b));
    m.backward(ex, scale);
  }
  auto const g = m.flat_grads();
  return {loss, {g.data(), g.data() + g.size()}};
}

// Parameters of this rank's blocks whose gradient differs from `ref`, and of other blocks whose
// gradient is not zero.
struct compare_result {
  int own_differ = 0, foreign_nonzero = 0, own = 0;
};
template <class Run>
compare_result compare(host_gpt const& m, Run const& run, std::vector<float> const& ref) {
  compare_result r;
  for (auto const& p : m.parameters()) {
    auto const g = m.grad(p);
    if (run.holds_block(p.layer)) {
      ++r.own;
      r.own_differ += std::memcmp(g.data(), ref.data() + p.offset / sizeof(float), p.bytes) != 0;
    } else {
      for (index_t i = 0; i < p.numel(); ++i) r.foreign_nonzero += g.data()[i] != 0.f;
    }
  }
  return r;
}

}  // namespace

TEST_CASE("mpi pipeline: every schedule, one stage per rank, equals gradient accumulation bit for bit") {
  auto& world = tide::test::world();
  int const p = world.size();
  int const m = 8;
  data const d(m, 11);
  float const scale = 1.f / m;
  auto const [ref_loss, ref] = accumulate(d, scale);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  std::vector<std::pair<pp::schedule, bool>> runs;  // every schedule; the zero-bubble ones with a split backward too
  for (auto const& s : {pp::gpipe(p, m), pp::one_f_one_b(p, m), pp::interleaved(p, m, 2), pp::zb_h1(p, m),
                        pp::zb_h2(p, m), pp::zb_v(p, m), pp::dualpipe_v(p, m)}) {
    runs.emplace_back(s, false);
    if (s.name != "gpipe" && s.name != "one_f_one_b" && s.name != "interleaved") runs.emplace_back(s, true);
  }
  for (auto const& [s, split] : runs) {
    CAPTURE(s.name);
    CAPTURE(split);
    tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
    // split: W's run the weight pass apart, so a micro-batch holds its slot until its last W here
    int const slots = pp::slots_needed(s, world.rank(), split);
    host_gpt model(config, arena, {.seed = 5, .in_flight = slots, .separate_tied_grad = true, .split_backward = split});
    model.zero_grad(ex);
    pp::rank_executor run{world, s, pp::uniform_cut(model, s)};
    CHECK(run.slots(split) == slots);
    CHECK(run.stage() == world.rank());
    for (int rep = 0; rep < 2; ++rep) {  // a second step reuses the links and buffers
      model.zero_grad(ex);
      double const loss = run.run(model, ex, std::span<batch const>(d.micro), scale);
      CHECK(loss == ref_loss);
      auto const c = compare(model, run, ref);
      CHECK(c.own > 0);
      CHECK(c.own_differ == 0);
      CHECK(c.foreign_nonzero == 0);
      REQUIRE(run.last().stages.size() == 1);
      CHECK(run.last().stages[0].forwards == m * s.chunks);
      CHECK((run.last().stages[0].weights > 0) == split);  // the weight passes ran apart, and were timed
      CHECK(run.last().bubble_fraction > 0);  // every stage waits for a neighbour at least once
      CHECK(run.last().bubble_fraction < 1);
    }
  }
}

TEST_CASE("mpi pipeline: a stage that fails makes every stage throw, without waiting for a deadline") {
  auto& world = tide::test::world();
  int const p = world.size(), m = 4;
  data const good(m, 11);
  data bad(m, 11);
  bad.targets[2][3] = config.vocab;  // out of range: only the head's stage checks targets
  float const scale = 1.f / m;
  auto const [ref_loss, ref] = accumulate(good, scale);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  auto const s = pp::one_f_one_b(p, m);
  host_gpt model(config, arena, {.seed = 5, .in_flight = pp::slots_needed(s, world.rank()), .separate_tied_grad = true});
  pp::rank_executor run{world, s, pp::uniform_cut(model, s)};
  bool const head = world.rank() == p - 1;
  for (int round = 0; round < 2; ++round) {
    model.zero_grad(ex);
    auto const t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(run.run(model, ex, std::span<batch const>(bad.micro), scale),
                         doctest::Contains(head ? "targets" : "another stage failed"), tide::error);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));  // not the 60 s deadline
    // The links still work: a good run is exact.
    model.zero_grad(ex);
    CHECK(run.run(model, ex, std::span<batch const>(good.micro), scale) == ref_loss);
    auto const c = compare(model, run, ref);
    CHECK(c.own_differ == 0);
    CHECK(c.foreign_nonzero == 0);
  }
}

TEST_CASE("mpi pipeline: a stage that fails early under GPipe with 100 micro-batches settles without a deadlock") {
  // Messages above MPI's eager size (8 KiB activations) and more of them than a lane holds: the
  // failed stage goes on through its list without computing, so nothing waits for a deadline.
  auto& world = tide::test::world();
  int const p = world.size(), m = 100;
  constexpr tide::nn::gpt_config wide{.layers = 2, .heads = 2, .channels = 64, .vocab = 32, .padded_vocab = 40,
                                      .max_seq = 8};
  constexpr index_t Bw = 4, Tw = 8;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(Bw * Tw), 1), targets = ids, bad = ids;
  bad[0] = -1;
  std::vector<batch> micro;
  for (int k = 0; k < m; ++k) micro.push_back({{ids.data(), {Bw, Tw}}, {(k == 1 ? bad : targets).data(), {Bw, Tw}}});
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 256_MiB}};
  auto const s = pp::gpipe(p, m);
  host_gpt model(wide, arena, {.seed = 5, .in_flight = pp::slots_needed(s, world.rank()), .separate_tied_grad = true});
  model.zero_grad(ex);
  pp::rank_executor run{world, s, pp::uniform_cut(model, s)};
  auto const t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(run.run(model, ex, std::span<batch const>(micro), 1.f / m),
                       doctest::Contains(world.rank() == p - 1 ? "targets" : "another stage failed"), tide::error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  micro[1].targets = {targets.data(), {Bw, Tw}};
  model.zero_grad(ex);
  CHECK(std::isfinite(run.run(model, ex, std::span<batch const>(micro), 1.f / m)));  // the links still work
}

TEST_CASE("mpi pipeline: 2 stages x 2 data-parallel replicas equal one process summing the replicas") {
  auto& world = tide::test::world();
  if (world.size() != 4) {  // the 4-rank launch runs it
    if (world.rank() == 0) MESSAGE("skipped on ", world.size(), " ranks: 2 stages x 2 replicas need 4 (mpi/np4 runs it)");
    return;
  }
  int const m = 4;
  int const replica = world.rank() / 2, st = world.rank() % 2;
  auto pipe = world.split(replica, st);  // the replica's two stages
  auto dp = world.split(st, replica);    // the same stage of both replicas
  data const mine(m, 20 + static_cast<std::uint32_t>(replica));
  float const scale = 1.f / (2 * m);
  // One process: each replica's micro-batches accumulated, then the two sums added.
  auto const [loss0, g0] = accumulate(data(m, 20), scale);
  auto const [loss1, g1] = accumulate(data(m, 21), scale);
  std::vector<float> ref(g0.size());
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = g0[i] + g1[i];

  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  auto const s = pp::one_f_one_b(2, m);
  host_gpt model(config, arena, {.seed = 5, .in_flight = pp::slots_needed(s, st), .separate_tied_grad = true});
  model.zero_grad(ex);
  pp::rank_executor run{pipe, s, pp::uniform_cut(model, s)};
  double const loss = run.run(model, ex, std::span<batch const>(mine.micro), scale);
  CHECK(loss == (replica == 0 ? loss0 : loss1));
  auto const g = model.flat_grads();
  dp.all_reduce(std::span<float>(g.data(), static_cast<std::size_t>(g.size())), tide::comm::reduce_op::sum);
  auto const c = compare(model, run, ref);
  CHECK(c.own > 0);
  CHECK(c.own_differ == 0);
  CHECK(c.foreign_nonzero == 0);
}

// ---- make_trainer with a pipeline of one stage per rank -----------------------------------------

#include <tide/comm/data_parallel.hpp>
#include <tide/compress/sink.hpp>
#include <tide/optim/adamw.hpp>
#include <tide/train/trainer.hpp>

namespace {

using spec_type = tide::nn::gpt_spec<tide::host>;
spec_type const staged_spec{.config = config, .options = {.seed = 5, .in_flight = 2, .separate_tied_grad = true}};

// The micro-batches as the trainer's model takes them.
template <class Trainer>
std::vector<typename Trainer::batch_type> batches_for(data const& d) {
  std::vector<typename Trainer::batch_type> out;
  for (batch const& b : d.micro) out.push_back({b.tokens, b.targets});
  return out;
}

// Every parameter of the trainer's scheduler, by name.
template <class Trainer>
std::vector<std::pair<std::string, std::vector<float>>> params_of(Trainer& t) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  t.scheduler().gather_parameters();  // ZeRO-3: every chunk here (collective over the replicas)
  auto const& list = t.scheduler().parameters();
  for (std::uint32_t i = 0; i < list.size(); ++i)
    out.emplace_back(std::string(list[i].name()), t.scheduler().read_param(i));
  return out;
}

using named_params = std::vector<std::pair<std::string, std::vector<float>>>;
// How many of got's parameters differ from want's of the same name (or have none there).
int differing(named_params const& got, named_params const& want) {
  int differ = 0;
  for (auto const& [name, values] : got) {
    bool same = false;
    for (auto const& [n, v] : want)
      if (n == name)
        same = v.size() == values.size() && std::memcmp(v.data(), values.data(), v.size() * sizeof(float)) == 0;
    differ += !same;
  }
  return differ;
}

// The gradient sink's list 0 (a residual) of every tensor of `order`, summed over the ranks that
// hold it: each rank adds its own, and the job sums them.
template <class Trainer>
std::vector<float> residual_sums(Trainer& t, named_params const& order) {
  std::vector<float> all;
  std::vector<std::size_t> at;
  for (auto const& [name, values] : order) {
    at.push_back(all.size());
    all.resize(all.size() + values.size(), 0.f);
  }
  auto const& list = t.scheduler().parameters();
  for (std::uint32_t j = 0; j < list.size(); ++j) {
    auto const x = t.scheduler().extra_bytes(0, j);
    auto const* f = reinterpret_cast<float const*>(x.data());
    std::size_t p = 0;
    while (order[p].first != list[j].name()) ++p;
    for (std::size_t e = 0; e < x.size() / sizeof(float); ++e) all[at[p] + e] += f[e];
  }
  tide::test::world().all_reduce(std::span<float>(all), tide::comm::reduce_op::sum);
  return all;
}

// Pipelines of 2 stages (1F1B over 4 micro-batches) on every pair of ranks, the pairs
// data-parallel replicas (ZeRO stage `zero`); AdamW with a clip norm the gradients never reach
// (the norm is measured, over both stages, but scales by 1); chunked<belady> in 16 KiB chunks
// under 4 MiB; each replica's micro-batches of `steps` steps, from `seed`.
template <pp::kind K>
struct two_stages_of {
  static constexpr int stages = 2, m = 4;
  pp::rank_groups<tide::comm::mpi> g;
  tide::optim::adamw opt{.lr = 1e-2f, .clip_norm = 1e6f, .micro_steps = m};
  tide::comm::data_parallel<tide::comm::mpi> dp;
  tide::offload::chunked<tide::offload::belady> tight{.chunk_bytes = std::size_t{16} << 10};
  pp::on_ranks<K, tide::comm::mpi> policy;
  std::vector<data> batches;

  two_stages_of(int steps, std::uint32_t seed, int zero = 0) : g(pp::make_groups(tide::test::world(), stages)) {
    dp = {.comm = &g.data, .zero = zero};
    tight.device_budget = std::size_t{4} << 20;
    policy = {.stages = stages, .micro = m, .group = &g.pipeline, .tied = &g.tied};
    for (int s = 0; s < steps; ++s)
      batches.emplace_back(m, seed + 10 * static_cast<std::uint32_t>(s) + static_cast<std::uint32_t>(g.replica));
  }
  two_stages_of(two_stages_of const&) = delete;  // dp and policy point into g
  two_stages_of& operator=(two_stages_of const&) = delete;

  // Steps from .. to - 1 of `t`, on this replica's micro-batches.
  template <class Trainer>
  void run(Trainer& t, int from, int to) const {
    for (int s = from; s < to; ++s) t.step(batches_for<Trainer>(batches[static_cast<std::size_t>(s)]));
  }
};

using two_stages = two_stages_of<pp::kind::one_f_one_b>;

// split: the model's backward in two passes, the zero-bubble schedules' W's apart from their B's.
// blocks: the pipeline's cut (empty: uniform).
template <pp::kind K = pp::kind::one_f_one_b, class Offload>
void pipelined_trainer_matches(Offload const& off, char const* what, int zero = 0, bool split = false,
                               pp::cut const& blocks = {}) {
  CAPTURE(what);
  CAPTURE(zero);
  CAPTURE(split);
  CAPTURE(pp::to_string(K));
  int const steps = 3;
  two_stages_of<K> const setup(steps, 100, zero);
  auto const& g = setup.g;
  auto const& batches = setup.batches;
  auto const& opt = setup.opt;
  auto const& dp = setup.dp;
  // The reference: the same replicas, data parallel, no pipeline.
  auto ref = tide::train::make_trainer(staged_spec, off, opt, dp);
  std::vector<tide::train::step_stats> ref_stats;
  for (data const& d : batches) ref_stats.push_back(ref.step(batches_for<decltype(ref)>(d)));
  auto const want = params_of(ref);

  // The slots this schedule holds on this stage.
  pp::schedule const plan = setup.policy.plan();
  auto spec = staged_spec;
  spec.options.in_flight = pp::slots_needed(plan, g.stage, split);
  spec.options.split_backward = split;
  auto policy = setup.policy;
  policy.blocks = blocks;
  auto pipe = tide::train::make_trainer(spec, off, opt, dp, tide::train::no_compress{}, policy);
  data bad = batches[0];  // a copy views its own vectors
  if (g.replica == 0) bad.targets[1][0] = -1;  // one replica's head stage refuses it, mid-step
  for (int s = 0; s < steps; ++s) {
    // A step that fails on one stage of one replica is lost on every rank, and changes nothing.
    // Not under ZeRO-3: its per-block gathers are collectives over the replicas, so a stage that
    // stops computing mid-step leaves the other replica's stage in a gather until the deadline
    // (docs/pipeline.md says so).
    if (s == 1 && zero < 3) {
      CHECK_THROWS_AS(pipe.step(batches_for<decltype(pipe)>(bad)), tide::error);
    }
    auto const st = pipe.step(batches_for<decltype(pipe)>(batches[static_cast<std::size_t>(s)]));
    auto const& r = ref_stats[static_cast<std::size_t>(s)];
    CHECK(st.loss == r.loss);
    CHECK(st.grad_norm == doctest::Approx(r.grad_norm).epsilon(1e-5));
    CHECK(st.tokens == r.tokens);
  }
  REQUIRE(pipe.pipeline().last() != nullptr);
  CHECK(pipe.pipeline().last()->bubble_fraction < 1);
  CHECK((pipe.pipeline().last()->stages[0].weights > 0) == split);  // the weight passes ran apart
  auto const got = params_of(pipe);
  // This stage's parameters only: under 1F1B the first stage has wte, wpe and h0 .. h2, the last
  // wte, h3 .. h5, lnf; in a V the first stage has both ends, wte once.
  CHECK(got.size() < want.size());
  int const Q = plan.stages * plan.chunks;
  bool const keeps_wte = pp::stage_of(plan, 0) == g.stage || pp::stage_of(plan, Q - 1) == g.stage;
  int found = 0, differ = 0, has_wte = 0;
  for (auto const& [name, values] : got) {
    has_wte += name == "wte";
    for (auto const& [n, v] : want)
      if (n == name) {
        ++found;
        differ += v.size() != values.size() || std::memcmp(v.data(), values.data(), v.size() * sizeof(float)) != 0;
      }
  }
  CHECK(found == static_cast<int>(got.size()));
  CHECK(differ == 0);
  CHECK(has_wte == (keeps_wte ? 1 : 0));  // both ends keep the tied embedding, equal to the reference's
}

}  // namespace

TEST_CASE("mpi pipeline: part_of ties a parameter where another stage keeps a copy; an untied one read by two "
          "stages is refused") {
  if (tide::test::world().rank() != 0) return;  // no communication: one rank checks it
  auto const all = tide::nn::gpt_parameters(config, tide::dtype::f32);
  auto const uses = tide::nn::gpt_block_uses(config);
  pp::schedule const s = pp::one_f_one_b(3, 3);
  pp::cut const c = pp::uniform_cut(uses.first_block, uses.last_block(), 3);
  // 1F1B on 3 stages: the first and the last stage keep wte, tied; the middle one none of it.
  for (int st = 0; st < 3; ++st) {
    CAPTURE(st);
    auto const part = pp::part_of(all, uses, c, s, st);
    CHECK(part.params.contains("wte") == (st != 1));
    CHECK(part.params.ties() == (st != 1 ? 1 : 0));
    for (tide::parameter const& p : part.params) CHECK(p.tie == (p.name() == "wte" ? 0 : -1));
  }
  // A V: the first stage runs the embedding and the head, so its wte is read nowhere else.
  pp::schedule const v = pp::zb_v(2, 4);
  auto const both = pp::part_of(all, uses, pp::uniform_cut(uses.first_block, uses.last_block(), 4), v, 0);
  CHECK(both.params.find("wte").tie == -1);
  CHECK(both.params.ties() == 0);
  // The same list without the tie: refused where two stages read wte, naming it and what to do.
  tide::parameter_list untied(all.alignment());
  for (tide::parameter const& p : all) untied.add(p.name(), p.layer, p.shape, p.type);
  CHECK_THROWS_WITH_AS(pp::part_of(untied, uses, c, s, 0), doctest::Contains("\"wte\" is read by stages 0 and 2 but "
                                                                            "is not tied"), tide::error);
}

TEST_CASE("mpi pipeline: make_trainer with 1F1B on ranks equals data parallelism without it, bit for bit") {
  if (tide::test::world().size() % 2 != 0) return;
  pipelined_trainer_matches(tide::offload::resident{}, "resident");
  tide::offload::chunked<tide::offload::belady> tight{.chunk_bytes = std::size_t{16} << 10};
  tight.device_budget = std::size_t{4} << 20;
  pipelined_trainer_matches(tight, "chunked");
  // One layer per chunk: the last stage's list holds wte, of a layer outside its blocks.
  pipelined_trainer_matches(tide::offload::layer_window<2>{.device_budget = std::size_t{8} << 20}, "layer_window");
  pipelined_trainer_matches(tight, "chunked", 1);  // ZeRO-1 over the replicas of each stage
  // ZeRO-2 and 3: wte's gradient summed over the replicas on the first stage only, then handed
  // to whichever replica owns its chunk on either end.
  pipelined_trainer_matches(tight, "chunked", 2);
  pipelined_trainer_matches(tight, "chunked", 3);
  pipelined_trainer_matches<pp::kind::interleaved>(tight, "chunked", 3);
  // A cut of the user's: the embedding and h0 on the first stage, h1 .. h5 and the head on the last.
  pipelined_trainer_matches(tight, "chunked, uneven cut", 2, false, pp::cut{.first = {-1, 1}, .last = {0, 6}});
  pipelined_trainer_matches<pp::kind::zb_h1>(tide::offload::resident{}, "resident, uneven cut", 0, true,
                                             pp::cut{.first = {-1, 4}, .last = {3, 6}});
}

TEST_CASE("mpi pipeline: make_trainer refuses a cut that is not the schedule's pieces in order") {
  if (tide::test::world().size() % 2 != 0) return;
  two_stages const setup(1, 100);
  auto const uses = tide::nn::gpt_block_uses(config);
  auto const bad = [&](pp::cut c) {
    auto policy = setup.policy;
    policy.blocks = std::move(c);
    return policy.cut_for(uses.first_block, uses.last_block(), two_stages::m, tide::test::world().size() / 2);
  };
  CHECK(bad(pp::cut{.first = {-1, 2}, .last = {1, 6}}).last[0] == 1);  // a good one comes back as given
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1}, .last = {6}}), doctest::Contains("the cut has 1 pieces"), tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1, 3}, .last = {1, 6}}), doctest::Contains("piece 1 of the cut starts at "
                                                                                          "block 3 but piece 0 ends at 1"),
                       tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {0, 2}, .last = {1, 6}}), doctest::Contains("cut every block"), tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1, 2}, .last = {1, 5}}), doctest::Contains("cut every block"), tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1, 2, 2}, .last = {1, 1, 6}}), doctest::Contains("the cut has 3 pieces"),
                       tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1, 2}, .last = {6}}), doctest::Contains("(1 ends)"), tide::error);
  CHECK_THROWS_WITH_AS(bad(pp::cut{.first = {-1, 7}, .last = {6, 6}}), doctest::Contains("needs at least one block"),
                       tide::error);
}

TEST_CASE("mpi pipeline: make_trainer with several pieces per stage (interleaved, ZB-V, DualPipeV) equals data "
          "parallelism without it, bit for bit") {
  if (tide::test::world().size() % 2 != 0) return;
  tide::offload::chunked<tide::offload::belady> tight{.chunk_bytes = std::size_t{16} << 10};
  tight.device_budget = std::size_t{4} << 20;
  pipelined_trainer_matches<pp::kind::interleaved>(tight, "chunked");
  pipelined_trainer_matches<pp::kind::zb_v>(tight, "chunked");
  pipelined_trainer_matches<pp::kind::dualpipe_v>(tight, "chunked", 1);
  pipelined_trainer_matches<pp::kind::interleaved>(tide::offload::layer_window<2>{.device_budget = std::size_t{8} << 20},
                                                   "layer_window");
  pipelined_trainer_matches<pp::kind::dualpipe_v>(tide::offload::resident{}, "resident");
}

TEST_CASE("mpi pipeline: make_trainer with the backward split (W apart from B: ZB-H1, ZB-H2, ZB-V, DualPipeV) "
          "equals data parallelism without it, bit for bit") {
  if (tide::test::world().size() % 2 != 0) return;
  tide::offload::chunked<tide::offload::belady> tight{.chunk_bytes = std::size_t{16} << 10};
  tight.device_budget = std::size_t{4} << 20;
  pipelined_trainer_matches<pp::kind::zb_h1>(tight, "chunked", 0, true);
  pipelined_trainer_matches<pp::kind::zb_h2>(tide::offload::layer_window<2>{.device_budget = std::size_t{8} << 20},
                                             "layer_window", 1, true);
  pipelined_trainer_matches<pp::kind::zb_v>(tight, "chunked", 2, true);
  pipelined_trainer_matches<pp::kind::dualpipe_v>(tight, "chunked", 3, true);
  pipelined_trainer_matches<pp::kind::zb_h1>(tide::offload::resident{}, "resident", 0, true);
}

TEST_CASE("mpi pipeline: make_trainer with 1F1B on ranks takes a compressing sink over the replicas") {
  // At density 1 the sparse sink sends each chunk by a dense all-reduce: the dense sink with one
  // chunk per bucket makes the same calls, so the same bits. At density 0.1 there is no bit-exact
  // reference (the chunks are a stage's, not the whole model's): the replicas agree, both ends
  // hold one tied embedding (the head's share reaches the first stage before the sink, and the
  // sum over the stages follows it), it learns, and a set (each rank its own residuals) resumes
  // bit for bit, and loads at another shape with every tensor's residual summed over its holders kept.
  auto& world = tide::test::world();
  if (world.size() % 2 != 0) return;
  using sparse = tide::compress::sparse_data_parallel<tide::comm::mpi>;
  two_stages setup(6, 500);
  auto const& [opt, tight, policy] = std::tie(setup.opt, setup.tight, setup.policy);
  tide::comm::mpi* const replicas = &setup.g.data;
  auto dense = tide::train::make_trainer(staged_spec, tight, opt,
                                         tide::comm::data_parallel{.comm = replicas, .bucket_bytes = 1},
                                         tide::train::no_compress{}, policy);
  auto full = tide::train::make_trainer(staged_spec, tight, opt, sparse{.comm = replicas, .compressor = {.density = 1.f}},
                                        tide::train::no_compress{}, policy);
  setup.run(full, 0, 3);
  std::vector<float> dense_loss;
  for (int s = 0; s < 4; ++s) {
    dense_loss.push_back(dense.step(batches_for<decltype(dense)>(setup.batches[static_cast<std::size_t>(s)])).loss);
    if (s == 2) CHECK(differing(params_of(full), params_of(dense)) == 0);
  }
  CHECK(full.scheduler().sink().stats().sparse_chunks == 0);

  // Error feedback sends a tenth of each chunk a step and carries the rest: the losses follow
  // the dense pipeline's on the same micro-batches, not its bits.
  sparse const tenth{.comm = replicas, .compressor = {.density = 0.1f}};
  auto t = tide::train::make_trainer(staged_spec, tight, opt, tenth, tide::train::no_compress{}, policy);
  auto const initial = params_of(t);
  for (int s = 0; s < 4; ++s) {
    float const loss = t.step(batches_for<decltype(t)>(setup.batches[static_cast<std::size_t>(s)])).loss;
    float const want = dense_loss[static_cast<std::size_t>(s)];
    if (world.rank() == 0) MESSAGE("step ", s, ": loss ", loss, ", dense ", want);
    CHECK(std::abs(loss - want) <= 0.005f * want);  // measured: at most 0.16 % on 4 ranks
  }
  // It trained: its parameters moved towards the dense run's (measured on 4 ranks: 1.70 from it
  // against 2.49 at the start; Adam on a tenth of each chunk a step, the rest carried, is not
  // Adam on all of it).
  auto const distance = [](named_params const& a, named_params const& b) {
    double sum = 0;
    for (std::size_t p = 0; p < a.size(); ++p)
      for (std::size_t e = 0; e < a[p].second.size(); ++e) {
        double const d = static_cast<double>(a[p].second[e]) - static_cast<double>(b[p].second[e]);
        sum += d * d;
      }
    return std::sqrt(sum);
  };
  auto const trained = params_of(t), reference = params_of(dense);
  if (world.rank() == 0)
    MESSAGE("distance to the dense run: ", distance(trained, reference), ", from the start ", distance(initial, reference));
  CHECK(distance(trained, reference) < 0.8 * distance(initial, reference));
  if (setup.g.data.size() > 1) CHECK(t.scheduler().sink().stats().sparse_chunks > 0);
  auto const mine = params_of(t);
  for (auto const& [name, values] : mine) {
    std::vector<float> lo = values, hi = values;  // equal on every rank that holds it: min = max = own
    tide::comm::mpi* const c = name == "wte" ? &setup.g.tied : &setup.g.data;
    c->all_reduce(std::span<float>(lo), tide::comm::reduce_op::min);
    c->all_reduce(std::span<float>(hi), tide::comm::reduce_op::max);
    bool const agree = lo == values && hi == values;
    CHECK_MESSAGE(agree, name, " differs between the ranks that hold it");
  }
  std::int64_t pid = world.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0;
  world.all_reduce(std::span<std::int64_t>(&pid, 1), tide::comm::reduce_op::max);
  std::filesystem::path const dir = std::filesystem::temp_directory_path() / ("tide_pipeline_sparse_" + std::to_string(pid));
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  t.save(dir);

  // At another shape: the set (2 stages x W/2 replicas) loads without a pipeline on all W ranks
  // (the compression in its own slot), and that one's set loads back into the pipeline. Each
  // rank's residual is re-sharded so that every tensor's sum over the ranks that hold it stays
  // what it was: wte's, kept at both ends, goes to the first stage's replicas only.
  auto flat = tide::train::make_trainer(staged_spec, tight, opt, tide::comm::data_parallel{.comm = &world},
                                        tide::compress::error_feedback<>{.compressor = tenth.compressor});
  flat.load(dir);
  auto const order = params_of(flat);
  auto const saved = residual_sums(t, order);
  auto const near = [](std::vector<float> const& got, std::vector<float> const& want) {
    float worst = 0, largest = 0;
    for (std::size_t e = 0; e < want.size(); ++e) {
      worst = std::max(worst, std::abs(got[e] - want[e]));
      largest = std::max(largest, std::abs(want[e]));
    }
    return worst <= 1e-6f * largest;  // the sums' order changes with the shape
  };
  // One replica sends nothing and keeps no residual; several keep one.
  if (setup.g.data.size() > 1) CHECK(std::any_of(saved.begin(), saved.end(), [](float x) { return x != 0.f; }));
  CHECK(near(residual_sums(flat, order), saved));
  CHECK(differing(params_of(t), order) == 0);
  std::filesystem::path flat_dir = dir;
  flat_dir += "_flat";
  if (world.rank() == 0) std::filesystem::remove_all(flat_dir);
  world.barrier();
  flat.save(flat_dir);
  auto back = tide::train::make_trainer(staged_spec, tight, opt, tenth, tide::train::no_compress{}, policy);
  back.load(flat_dir);
  CHECK(near(residual_sums(back, order), saved));
  CHECK(differing(params_of(back), params_of(t)) == 0);
  // It trains on: the residuals sit on other ranks than before, so the second step's loss is
  // near the continuing run's, not equal (the first only reads the parameters).
  auto const step_of = [&](auto& trainer, int s) {
    return trainer.step(batches_for<std::remove_reference_t<decltype(trainer)>>(setup.batches[static_cast<std::size_t>(s)])).loss;
  };
  float const t4 = step_of(t, 4), t5 = step_of(t, 5);
  float const b4 = step_of(back, 4), b5 = step_of(back, 5);
  CHECK(b4 == t4);
  if (world.rank() == 0) MESSAGE("after re-sharding: loss ", b5, ", continuing ", t5);
  CHECK(std::abs(b5 - t5) <= 0.01f * t5);
  auto resumed = tide::train::make_trainer(staged_spec, tight, opt, tenth, tide::train::no_compress{}, policy);
  resumed.load(dir);
  setup.run(resumed, 4, 6);
  CHECK(differing(params_of(resumed), params_of(t)) == 0);
  world.barrier();
  if (world.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(flat_dir);
  }
}

TEST_CASE("mpi pipeline: make_trainer with 1F1B on ranks on sealed, a device the host cannot read, gives the host's bits") {
  // Activations and gradients cross stages through host buffers: read from the device after the
  // compute work that made them, written in compute order; the tied embedding's gradient is
  // summed over the first and last stage on the host.
  if (tide::test::world().size() % 2 != 0) return;
  int const m = two_stages::m;
  two_stages const setup(2, 200);
  auto const& [opt, dp, tight, policy] = std::tie(setup.opt, setup.dp, setup.tight, setup.policy);
  auto const& batches = setup.batches;
  auto on_host = tide::train::make_trainer(staged_spec, tight, opt, dp, tide::train::no_compress{}, policy);
  std::vector<float> host_losses;
  for (data const& d : batches) host_losses.push_back(on_host.step(batches_for<decltype(on_host)>(d)).loss);

  tide::nn::gpt_spec<tide::sealed> const sealed_spec{.config = config, .options = staged_spec.options};
  auto on_device = tide::train::make_trainer(sealed_spec, tight, opt, dp, tide::train::no_compress{}, policy);
  // The micro-batches' tokens and targets in device memory of their own, written in compute order.
  std::size_t const each = static_cast<std::size_t>(B * T) * sizeof(std::int32_t);
  tide::memory::device_arena<tide::sealed> inputs{{.budget = 2 * static_cast<std::size_t>(m) * each + 64_KiB}};
  auto* tokens = static_cast<std::int32_t*>(inputs.allocate(2 * static_cast<std::size_t>(m) * each));
  std::vector<float> sealed_losses;
  for (data const& d : batches) {
    std::vector<decltype(on_device)::batch_type> micro;
    for (int k = 0; k < m; ++k) {
      std::int32_t* at = tokens + 2 * k * B * T;
      auto const& b = d.micro[static_cast<std::size_t>(k)];
      tide::memory::write_from_host(on_device.executor(), at, b.tokens.data(), each);
      tide::memory::write_from_host(on_device.executor(), at + B * T, b.targets.data(), each);
      micro.push_back({{at, {B, T}}, {at + B * T, {B, T}}});
    }
    sealed_losses.push_back(on_device.step(micro).loss);
  }
  CHECK(sealed_losses == host_losses);
  auto const want = params_of(on_host);
  auto const got = params_of(on_device);
  REQUIRE(got.size() == want.size());
  int differ = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    differ += got[i].first != want[i].first || got[i].second.size() != want[i].second.size() ||
              std::memcmp(got[i].second.data(), want[i].second.data(), got[i].second.size() * sizeof(float)) != 0;
  CHECK(differ == 0);
  tide::memory::synchronize(on_device.executor());
  inputs.deallocate(tokens, 2 * static_cast<std::size_t>(m) * each);
}

namespace {
void pipelined_checkpoints(int zero) {
  CAPTURE(zero);
  auto& world = tide::test::world();
  int const m = two_stages::m, r = world.rank(), w = world.size();
  two_stages const setup(4, 300, zero);
  auto const& [opt, dp, tight, policy] = std::tie(setup.opt, setup.dp, setup.tight, setup.policy);
  auto run = [&](auto& t, int from, int to) { setup.run(t, from, to); };
  std::int64_t pid = r == 0 ? static_cast<std::int64_t>(::getpid()) : 0;  // one folder for the job
  world.all_reduce(std::span<std::int64_t>(&pid, 1), tide::comm::reduce_op::max);
  std::filesystem::path const dir = std::filesystem::temp_directory_path() / ("tide_pipeline_set_" + std::to_string(pid));
  std::filesystem::path const set = dir / "pipelined", flat = dir / (zero > 0 ? "flat" : "flat.tide");
  if (r == 0) std::filesystem::remove_all(dir);
  world.barrier();

  // The reference: the same replicas without a pipeline (equal to the pipeline bit for bit).
  auto ref = tide::train::make_trainer(staged_spec, tight, opt, dp);
  run(ref, 0, 2);
  auto const at2 = params_of(ref);
  // Each stage's ranks train the reference alike; the first stage's save it (ZeRO-0: one file,
  // which their first rank writes; ZeRO-1: a set, a shard each).
  if (setup.g.stage == 0 && (ref.sharded() || r == 0)) ref.save(flat);
  run(ref, 2, 4);
  auto const want = params_of(ref);
  world.barrier();

  {
    auto pipe = tide::train::make_trainer(staged_spec, tight, opt, dp, tide::train::no_compress{}, policy);
    CHECK(pipe.sharded());
    run(pipe, 0, 2);
    pipe.save(set);
  }
  world.barrier();
  auto const mf = tide::train::checkpoint_set::read_manifest(set);
  CHECK(mf.ranks == w);
  CHECK(mf.step == 2);
  {  // the tensors once: the first replica's stages (wte from the first stage only); the other replicas none
    int with_wte = 0, with_tensors = 0;
    for (int k = 0; k < w; ++k) {
      tide::train::checkpoint_reader const f(tide::train::checkpoint_set::shard_path(set, mf.set, k, w));
      with_wte += f.contains("p/wte");
      with_tensors += f.contains("p/lnf.w") || f.contains("p/wpe");
    }
    CHECK(with_wte == 1);
    CHECK(with_tensors == 2);
  }
  {  // resumed at the same shape: the straight run's bits
    auto pipe = tide::train::make_trainer(staged_spec, tight, opt, dp, tide::train::no_compress{}, policy);
    pipe.load(set);
    CHECK(pipe.steps() == 2);
    CHECK(differing(params_of(pipe), at2) == 0);
    run(pipe, 2, 4);
    CHECK(differing(params_of(pipe), want) == 0);
  }
  {  // the pipelined set loads without the pipeline, and the file saved without one loads into it
    auto flat_trainer = tide::train::make_trainer(staged_spec, tight, opt, dp);
    flat_trainer.load(set);
    run(flat_trainer, 2, 4);
    CHECK(differing(params_of(flat_trainer), want) == 0);
    auto pipe = tide::train::make_trainer(staged_spec, tight, opt, dp, tide::train::no_compress{}, policy);
    pipe.load(flat);
    run(pipe, 2, 4);
    CHECK(differing(params_of(pipe), want) == 0);
  }
  {  // at another stage count (one replica of w stages; 4 on 4 ranks) it takes each stage's tensors and
     // state by name: one step equals one process without a pipeline loading the same set
    auto wide = pp::make_groups(world, w);
    auto deep_spec = staged_spec;
    deep_spec.options.in_flight = w;  // 1F1B's first stage holds p micro-batches' activations
    auto deep = tide::train::make_trainer(
        deep_spec, tight, opt, tide::train::no_comm{}, tide::train::no_compress{},
        pp::on_ranks<pp::kind::one_f_one_b, tide::comm::mpi>{.stages = w, .micro = m, .group = &wide.pipeline,
                                                              .tied = &wide.tied});
    deep.load(set);
    CHECK(deep.steps() == 2);
    CHECK(differing(params_of(deep), at2) == 0);
    auto alone = tide::train::make_trainer(staged_spec, tight, opt);
    alone.load(set);
    data const same(m, 400);  // every stage of the one pipeline takes the same micro-batches
    deep.step(batches_for<decltype(deep)>(same));
    alone.step(batches_for<decltype(alone)>(same));
    CHECK(params_of(deep).size() < params_of(alone).size());
    CHECK(differing(params_of(deep), params_of(alone)) == 0);
    CHECK(differing(params_of(deep), at2) > 0);  // it did step
  }
  // A damaged shard is refused on every rank, and loads nothing.
  if (r == 0) {
    auto const shard = tide::train::checkpoint_set::shard_path(set, mf.set, 1, w);  // the second stage's
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 7);
  }
  world.barrier();
  auto victim = tide::train::make_trainer(staged_spec, tight, opt, dp, tide::train::no_compress{}, policy);
  auto const before = params_of(victim);
  CHECK_THROWS_AS(victim.load(set), tide::error);
  CHECK(victim.steps() == 0);
  CHECK(differing(params_of(victim), before) == 0);
  world.barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}
}  // namespace

TEST_CASE("mpi pipeline: a pipelined trainer's checkpoint set resumes bit for bit, and loads at another shape") {
  if (tide::test::world().size() % 2 != 0) return;
  pipelined_checkpoints(0);
  pipelined_checkpoints(1);  // ZeRO-1: each replica writes the state of its own chunks
  pipelined_checkpoints(3);  // ZeRO-3: and the parameters of its own chunks only
}
