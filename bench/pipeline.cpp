// bench_pipeline: the bubble of every schedule, simulated (tide::pipeline::simulate), against its
// closed form (the research notes, part A), for (p, m) = (4, 8), (8, 32), (16, 48) with
// F = B = W = 1 and no communication cost; interleaved with v = 2. The bubble fraction is the idle
// stage time over p · makespan:
//
//   gpipe, one_f_one_b    (p − 1) / (m + p − 1)
//   interleaved           (p − 1) / (v m + p − 1)
//   zb_h1                 (p − 1) / (3m + p − 1): the paper's (p − 1)(F + B − W) per stage
//   zb_h2                 the same fraction of the makespan, but that is only the stagger between
//                         stages: the paper's bubble (p − 1)(F + B − 2W) is 0, and each stage is
//                         busy without a gap (span_bubble 0 in the detail)
//   zb_v                  ((p − 1)/2) / (3m + (p − 1)/2): half ZB-H1's stagger, what tide's greedy
//                         V reaches for p <= 4 and here at (8, 32) (at (16, 48) it takes 2 steps
//                         more: a ratio above 1); the paper's is 0 with the optimizer overlapping
//                         steps
//   dualpipe_v            the same closed form, which DualPipeV's phases reach at every shape
//                         (its further gain, a pair's compute beside the other's communication, is
//                         not in the simulator)
//
// A ratio of 1 says the generator is the schedule of the paper.
//
// The thread executor (pipeline/executor.hpp) on p = 2 stages, m = 8 micro-batches of a GPT
// (L 8, C 128, B 4, T 64), uniform cut. Two stages of one thread each on this machine's two
// cores: each stage has a core. The zero-bubble schedules (zb_h1, zb_h2, zb_v, dualpipe_v) run a
// model whose backward splits in two (gpt_options::split_backward): W runs the weight pass; the
// others the one-pass backward.
//   executor_overhead_<schedule>     the makespan the simulator gives from the per-piece forward
//                                    and backward times measured in the same runs, over the
//                                    measured wall time of the step (goal 0.9): what the executor
//                                    loses to waits and hand-offs, nothing else
//   pipeline_utilisation_<schedule>  the stages' busy time summed over p x the step's wall time,
//                                    both measured, against 1 - the schedule's closed-form bubble
//                                    at the same (p, m) (the table above; goal 0.9 of it): what
//                                    the schedule reaches on a real model, unequal pieces included
//
//   zb_h1_bubble_vs_1f1b, zb_h2_bubble_vs_1f1b  (goals 0.6, 0.3) the zero-bubble schedule's
//                                    measured bubble over 1F1B's (the one-pass backward, what a
//                                    user runs without the split), same model, (p, m) and run.
//                                    The bubble is the idle time inside each stage's own span
//                                    (first action's start to last action's end) over the spans:
//                                    the bubble the schedules remove, which is 0 for ZB-H2 at
//                                    equal costs. The stagger between stages' starts stays in
//                                    the makespan (the detail's makespan_ratio: (m + p − 1) /
//                                    (3m + p − 1) = 0.36 at best here for both). The detail also
//                                    has the same schedule with the whole backward in B
//                                    (span_bubble_whole_backward: what the split buys), W / B,
//                                    F / B and the stages' unevenness (stage_cost_ratio), which
//                                    the ratio depends on.
//   zb_h1_bubble_vs_1f1b_ranks, zb_h2_bubble_vs_1f1b_ranks  the same on 2 MPI ranks, a stage and
//                                    a model per rank (pipeline::rank_executor), busy and span
//                                    summed over the ranks; when the build has MPI.
//   zb_h1_bubble_vs_1f1b_trainer, zb_h2_bubble_vs_1f1b_trainer  the same again through
//                                    make_trainer (pipeline::on_ranks with .blocks = the same
//                                    cut, AdamW, the offload engine's hooks around every block:
//                                    resident); the optimizer step is outside the measured span.
// The zero-bubble figures run on a cut of equal measured stage cost (measure_blocks,
// partition_layers), and the runs a figure compares step in rounds, one step of each in turn
// (in_rounds): both sides of a ratio see the same machine.
//
// partitioner_vs_uniform: a GPT whose head is several blocks' worth (vocab 8192, C 128, L 6),
// each block's forward and backward measured alone (measure_blocks), cut into 2 stages by
// partition_layers and uniformly; each cut runs 1F1B on threads and the slowest stage's measured
// busy time per step is compared (lower is better; a ratio below 1 is the partitioner's gain).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tide/memory/device_arena.hpp"
#if defined(TIDE_MPIEXEC)
#include "mpi_launch.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/pipeline/ranks.hpp"
#include "tide/pipeline/stages.hpp"
#include "tide/train/trainer.hpp"
#endif
#include "tide/nn/gpt.hpp"
#include "tide/pipeline/executor.hpp"
#include "tide/pipeline/simulate.hpp"

namespace {

namespace pp = tide::pipeline;
using host_gpt = tide::nn::gpt<tide::host>;
using batch = host_gpt::batch_type;

struct tokens {
  std::vector<std::vector<std::int32_t>> ids;
  std::vector<batch> micro;
  tokens(int m, tide::index_t B, tide::index_t T, int vocab) {
    std::mt19937 rng(3);
    for (int k = 0; k < 2 * m; ++k) {
      ids.emplace_back(static_cast<std::size_t>(B * T));
      for (auto& t : ids.back()) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab));
    }
    for (int k = 0; k < m; ++k)
      micro.push_back({{ids[static_cast<std::size_t>(2 * k)].data(), {B, T}},
                       {ids[static_cast<std::size_t>(2 * k + 1)].data(), {B, T}}});
  }
};

// The closed-form bubble fraction of schedule k at (p, m), v chunks per stage (the table above).
double closed_bubble(pp::kind k, int stages, int micro, int v) {
  double const p = stages, m = micro;
  if (k == pp::kind::gpipe || k == pp::kind::one_f_one_b) return (p - 1) / (m + p - 1);
  if (k == pp::kind::interleaved) return (p - 1) / (v * m + p - 1);
  if (k == pp::kind::zb_v || k == pp::kind::dualpipe_v) return (p - 1) / 2 / (3 * m + (p - 1) / 2);
  return (p - 1) / (3 * m + p - 1);
}

// Mean wall seconds per step, mean bubble fractions, mean per-piece costs and each stage's mean
// busy seconds over the steps added.
struct measured {
  double seconds = 0, bubble = 0, span_bubble = 0;
  std::vector<pp::costs> pieces;
  std::vector<double> busy;
  // One of `reps` steps of a run whose stats hold every stage (a thread executor's).
  void add(pp::run_stats const& st, int pieces_in_cut, int reps) {
    if (pieces.empty()) pieces.assign(static_cast<std::size_t>(pieces_in_cut), pp::costs{.f = 0, .b = 0, .w = 0, .comm = 0});
    if (busy.empty()) busy.assign(st.stages.size(), 0);
    seconds += st.seconds / reps;
    bubble += st.bubble_fraction / reps;
    span_bubble += st.span_bubble_fraction / reps;
    auto const pc = st.piece_costs(pieces_in_cut);
    for (std::size_t q = 0; q < pc.size(); ++q)
      pieces[q].f += pc[q].f / reps, pieces[q].b += pc[q].b / reps, pieces[q].w += pc[q].w / reps;
    for (std::size_t s = 0; s < busy.size(); ++s) busy[s] += st.stages[s].busy / reps;
  }
  [[nodiscard]] double slowest_busy() const { return busy.empty() ? 0 : *std::max_element(busy.begin(), busy.end()); }
};

// One step of a run, then its stats.
using step_fn = std::function<pp::run_stats const&()>;

// The runs stepped in rounds: 2 warm-up rounds, then `reps`, each round one step of every run in
// turn, so that the runs a figure compares see the same machine (its load drifts over seconds).
// add(j, stats) takes run j's measured steps.
template <class Add>
void in_rounds(std::span<step_fn const> runs, int reps, Add&& add) {
  for (int i = -2; i < reps; ++i)
    for (std::size_t j = 0; j < runs.size(); ++j) {
      pp::run_stats const& st = runs[j]();
      if (i >= 0) add(j, st);
    }
}

// The executor figures' model and step: p = 2 stages, m = 8 micro-batches of (B, T) = (4, 64).
constexpr tide::nn::gpt_config executor_gpt{.layers = 8, .heads = 4, .channels = 128, .vocab = 256, .max_seq = 64};
constexpr int executor_micro = 8;

bool zero_bubble(pp::kind k) {
  return k == pp::kind::zb_h1 || k == pp::kind::zb_h2 || k == pp::kind::zb_v || k == pp::kind::dualpipe_v;
}

// A model of `config` on the thread executor under schedule s and cut c, its backward split in two
// when `split`: one step per call over the micro-batches.
struct thread_run {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena;
  pp::thread_executor run;
  host_gpt model;
  std::span<batch const> micro;
  thread_run(tide::nn::gpt_config const& config, pp::schedule const& s, pp::cut const& c, bool split,
             std::span<batch const> data, std::size_t budget = std::size_t{1} << 30)
      : arena{{.budget = budget}},
        run{s, c},
        model(config, arena, {.seed = 1, .in_flight = run.slots(split), .split_backward = split}),
        micro(data) {}
  pp::run_stats const& step() {
    model.zero_grad(ex);
    tide::bench::keep(run.run(model, micro, 1.f / static_cast<float>(micro.size())));
    return run.last();
  }
};

// Schedule k of the executor figures' model on threads, split as `split`: on the uniform cut, or
// on `cut` when it has pieces.
step_fn on_threads(pp::kind k, bool split, tokens const& data, pp::cut const& cut = {}) {
  auto const s = pp::generate(k, 2, executor_micro, k == pp::kind::interleaved ? 2 : 1);
  auto r = std::make_shared<thread_run>(executor_gpt, s,
                                        cut.pieces() > 0 ? cut : pp::uniform_cut(-1, executor_gpt.layers, s.stages * s.chunks),
                                        split, std::span<batch const>(data.micro));
  return [r]() -> pp::run_stats const& { return r->step(); };
}

// The runs' measurements on threads (in_rounds), each of `pieces` pieces.
std::vector<measured> measure(std::span<step_fn const> runs, int pieces, int reps) {
  std::vector<measured> out(runs.size());
  in_rounds(runs, reps, [&](std::size_t j, pp::run_stats const& st) { out[j].add(st, pieces, reps); });
  return out;
}

// The executor model's blocks cut into 2 stages of equal measured cost (measure_blocks, then
// partition_layers): what a user runs to keep the stages even. `costs` may replace the
// measured ones (ranks pass every rank's mean, so all cut alike).
std::vector<pp::layer_cost> executor_block_costs(tokens const& data) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{1} << 30}};
  host_gpt model(executor_gpt, arena, {.seed = 1});
  model.zero_grad(ex);
  return pp::measure_blocks(model, ex, data.micro[0], 5);
}
pp::cut even_cut(std::span<pp::layer_cost const> costs) {
  return pp::cut_of(pp::partition_layers(costs, {.stages = 2, .micro = executor_micro}), -1);
}

// The span bubble the simulator gives schedule k at (2, m) from per-piece costs measured in a run.
double predicted_span_bubble(pp::kind k, std::span<pp::costs const> pieces) {
  auto const r = pp::simulate(pp::generate(k, 2, executor_micro, 1), pieces);
  double busy = 0, span = 0;
  for (auto const& st : r.stages) busy += st.busy, span += st.span();
  return span > 0 ? 1 - busy / span : 0;
}

// The dearer piece's F + B + W over the cheaper's (2 pieces).
double stage_cost_ratio(std::span<pp::costs const> pieces) {
  if (pieces.size() != 2) return 0;
  double const a = pieces[0].f + pieces[0].b + pieces[0].w, b = pieces[1].f + pieces[1].b + pieces[1].w;
  return std::min(a, b) > 0 ? std::max(a, b) / std::min(a, b) : 0;
}

// zb_<h1|h2>_bubble_vs_1f1b: the zero-bubble schedule's measured bubble over 1F1B's, same model,
// same (p, m), same cut, same run; `where`: "" on threads, "_ranks" on MPI ranks.
void zero_bubble_figure(pp::kind k, double goal, measured const& zb, measured const& whole, measured const& ofob,
                        std::string const& where, pp::cut const& cut) {
  tide::bench::figure{.bench = "pipeline",
                      .name = std::string(k == pp::kind::zb_h1 ? "zb_h1" : "zb_h2") + "_bubble_vs_1f1b" + where,
                      .value = zb.span_bubble,
                      .unit = "idle fraction of the stages' own spans (span_bubble_fraction), measured",
                      .anchor = "1F1B's, with the model's one-pass backward, same model and (p, m), same run",
                      .anchor_value = ofob.span_bubble,
                      .higher_is_better = false,
                      .goal = goal,
                      .detail = {{"stages", 2},
                                 {"micro", executor_micro},
                                 {"makespan_bubble", zb.bubble},
                                 {"makespan_bubble_1f1b", ofob.bubble},
                                 {"makespan_ratio", zb.bubble / ofob.bubble},
                                 {"span_bubble_whole_backward", whole.span_bubble},
                                 {"step_s", zb.seconds},
                                 {"step_s_1f1b", ofob.seconds},
                                 {"w_over_b", zb.pieces.empty() || zb.pieces[0].b == 0 ? 0 : zb.pieces[0].w / zb.pieces[0].b},
                                 {"f_over_b", zb.pieces.empty() || zb.pieces[0].b == 0 ? 0 : zb.pieces[0].f / zb.pieces[0].b},
                                 // the stages' unevenness: the dearer stage's F + B + W over the cheaper's
                                 {"stage_cost_ratio", stage_cost_ratio(zb.pieces)},
                                 {"stage0_last_block", cut.last.empty() ? 0 : cut.last[0]},
                                 // the same ratio simulated from each run's measured per-piece F, B, W:
                                 // what the costs allow, the executor's waits left out
                                 {"simulated_ratio", predicted_span_bubble(k, zb.pieces) /
                                                         predicted_span_bubble(pp::kind::one_f_one_b, ofob.pieces)}}}
      .print();
}

void executor_figures() {
  int const m = executor_micro;
  tokens const data(m, 4, 64, executor_gpt.vocab);

  for (pp::kind k : {pp::kind::gpipe, pp::kind::one_f_one_b, pp::kind::interleaved, pp::kind::zb_h1, pp::kind::zb_h2,
                     pp::kind::zb_v, pp::kind::dualpipe_v}) {
    int const v = k == pp::kind::interleaved ? 2 : 1;
    auto const s = pp::generate(k, 2, m, v);
    // The zero-bubble schedules with the backward split (their W's fill bubbles); the others whole.
    step_fn const one[] = {on_threads(k, zero_bubble(k), data)};
    measured const r = measure(one, s.stages * s.chunks, 5)[0];
    auto const sim = pp::check(s);  // valid
    auto const from_costs = pp::simulate(s, std::span<pp::costs const>(r.pieces));
    tide::bench::figure{.bench = "pipeline",
                        .name = "executor_overhead_" + std::string(pp::to_string(k)),
                        .value = from_costs.makespan,
                        .unit = "s",
                        .anchor = "the measured step (wall seconds); the value is the makespan simulated from the "
                                  "per-piece times measured in the same runs",
                        .anchor_value = r.seconds,
                        .higher_is_better = true,
                        .goal = 0.9,
                        .detail = {{"stages", 2},
                                   {"micro", m},
                                   {"chunks", s.chunks},
                                   {"measured_bubble", r.bubble},
                                   {"simulated_bubble", from_costs.bubble_fraction},
                                   {"unit_cost_bubble", sim.bubble_fraction}}}
        .print();
    double const closed = closed_bubble(k, 2, m, v);
    tide::bench::figure{.bench = "pipeline",
                        .name = "pipeline_utilisation_" + std::string(pp::to_string(k)),
                        .value = 1 - r.bubble,
                        .unit = "sum of stage busy s / (p x step wall s), both measured",
                        .anchor = "1 - the schedule's closed-form bubble at the same (p, m) (F = B = W)",
                        .anchor_value = 1 - closed,
                        .goal = 0.9,
                        .detail = {{"stages", 2},
                                   {"micro", m},
                                   {"closed_bubble", closed},
                                   {"simulated_bubble_from_measured_pieces", from_costs.bubble_fraction},
                                   {"slowest_stage_busy_s", r.slowest_busy()},
                                   {"step_s", r.seconds},
                                   {"span_bubble", r.span_bubble},
                                   {"split_backward", zero_bubble(k) ? 1.0 : 0.0}}}
        .print();
  }
  // The zero-bubble figures on a cut of equal stages, 1F1B's the same: the bubble the schedule
  // leaves, not the cut's imbalance.
  auto const costs = executor_block_costs(data);
  pp::cut const cut = even_cut(costs);
  int const reps = tide::bench::quick() ? 2 : 9;
  std::vector<step_fn> const runs{
      on_threads(pp::kind::one_f_one_b, false, data, cut), on_threads(pp::kind::zb_h1, true, data, cut),
      on_threads(pp::kind::zb_h1, false, data, cut),       on_threads(pp::kind::zb_h2, true, data, cut),
      on_threads(pp::kind::zb_h2, false, data, cut)};
  auto const r = measure(runs, 2, reps);
  zero_bubble_figure(pp::kind::zb_h1, 0.6, r[1], r[2], r[0], "", cut);
  zero_bubble_figure(pp::kind::zb_h2, 0.3, r[3], r[4], r[0], "", cut);
}

#if defined(TIDE_MPIEXEC)
// One rank's measured steps: its busy time, its span, its wall time and its pieces' mean costs
// (the other pieces 0), summed over the ranks by over().
struct rank_tally {
  measured r;
  double busy = 0, span = 0, seconds = 0;
  int reps = 1;
  void add(pp::run_stats const& st, int pieces, int n) {
    reps = n;
    if (r.pieces.empty()) r.pieces.assign(static_cast<std::size_t>(pieces), pp::costs{.f = 0, .b = 0, .w = 0, .comm = 0});
    busy += st.stages[0].busy;
    span += st.stages[0].busy / std::max(1e-12, 1 - st.span_bubble_fraction);
    seconds += st.seconds;
    auto const pc = st.piece_costs(pieces);
    for (std::size_t q = 0; q < pc.size(); ++q)
      r.pieces[q].f += pc[q].f / reps, r.pieces[q].b += pc[q].b / reps, r.pieces[q].w += pc[q].w / reps;
  }
  measured over(tide::comm::mpi& world) {
    for (pp::costs& c : r.pieces)
      c = {.f = tide::comm::sum_over_ranks(world, c.f), .b = tide::comm::sum_over_ranks(world, c.b),
           .w = tide::comm::sum_over_ranks(world, c.w), .comm = 0};
    double const all_busy = tide::comm::sum_over_ranks(world, busy), all_span = tide::comm::sum_over_ranks(world, span);
    double const wall = tide::comm::sum_over_ranks(world, seconds) / world.size();  // the ranks' mean wall time
    r.seconds = wall / reps;
    r.span_bubble = 1 - all_busy / all_span;
    r.bubble = 1 - all_busy / (world.size() * wall);
    return r;
  }
};

// Schedule k on MPI ranks, a stage per rank (pipeline::rank_executor), every rank its own model:
// a rank's bubble from its own timeline.
struct rank_run {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{1} << 30}};
  pp::rank_executor<tide::comm::mpi> run;
  host_gpt model;
  std::span<batch const> micro;
  rank_run(tide::comm::mpi& world, pp::kind k, bool split, tokens const& data, pp::cut const& cut)
      : run{world, pp::generate(k, world.size(), executor_micro, 1), cut},
        model(executor_gpt, arena,
              {.seed = 1, .in_flight = run.slots(split), .separate_tied_grad = true, .split_backward = split}),
        micro(data.micro) {}
  pp::run_stats const& step() {
    model.zero_grad(ex);
    tide::bench::keep(run.run(model, ex, micro, 1.f / executor_micro));
    return run.last();
  }
};
step_fn on_ranks(tide::comm::mpi& world, pp::kind k, bool split, tokens const& data, pp::cut const& cut) {
  auto r = std::make_shared<rank_run>(world, k, split, data, cut);
  return [r]() -> pp::run_stats const& { return r->step(); };
}

// Schedule K through make_trainer on the world's ranks, a stage per rank, on `cut`, resident,
// AdamW; the optimizer step is outside the measured span.
template <pp::kind K>
step_fn in_trainer(tide::comm::mpi& world, bool split, tokens const& data, pp::cut const& cut) {
  using policy = pp::on_ranks<K, tide::comm::mpi>;
  using spec_type = tide::nn::gpt_spec<tide::host>;
  using trainer_type = decltype(tide::train::make_trainer(
      std::declval<spec_type const&>(), tide::offload::resident{}, tide::optim::adamw{}, tide::train::no_comm{},
      tide::train::no_compress{}, std::declval<policy const&>()));
  struct state {  // the groups outlive the trainer that holds them
    pp::rank_groups<tide::comm::mpi> g;
    std::unique_ptr<trainer_type> t;
    std::vector<typename trainer_type::batch_type> batches;
  };
  auto st = std::make_shared<state>(state{pp::make_groups(world, world.size()), nullptr, {}});
  policy const pipe{.stages = world.size(), .micro = executor_micro, .group = &st->g.pipeline, .tied = &st->g.tied,
                    .blocks = cut};
  spec_type const spec{.config = executor_gpt,
                       .options = {.seed = 1, .in_flight = pp::slots_needed(pipe.plan(), st->g.stage, split),
                                   .separate_tied_grad = true, .split_backward = split}};
  st->t.reset(new trainer_type(tide::train::make_trainer(spec, tide::offload::resident{},
                                                         tide::optim::adamw{.lr = 1e-3f, .micro_steps = executor_micro},
                                                         tide::train::no_comm{}, tide::train::no_compress{}, pipe)));
  for (batch const& b : data.micro) st->batches.push_back({b.tokens, b.targets});
  return [st]() -> pp::run_stats const& {
    tide::bench::keep(st->t->step(st->batches).loss);
    return *st->t->pipeline().last();
  };
}

// The runs' measurements on ranks (in_rounds), each rank's stage summed over the ranks.
std::vector<measured> measure(tide::comm::mpi& world, std::span<step_fn const> runs, int pieces, int reps) {
  std::vector<rank_tally> tally(runs.size());
  in_rounds(runs, reps, [&](std::size_t j, pp::run_stats const& st) { tally[j].add(st, pieces, reps); });
  std::vector<measured> out;
  for (rank_tally& t : tally) out.push_back(t.over(world));
  return out;
}

void rank_figures(tide::comm::mpi& world) {
  tokens const data(executor_micro, 4, 64, executor_gpt.vocab);
  int const reps = tide::bench::quick() ? 2 : 9;
  auto costs = executor_block_costs(data);  // every rank's, then their mean: one cut everywhere
  for (pp::layer_cost& c : costs) {
    c.forward = tide::comm::sum_over_ranks(world, c.forward) / world.size();
    c.backward = tide::comm::sum_over_ranks(world, c.backward) / world.size();
  }
  pp::cut const cut = even_cut(costs);
  std::vector<step_fn> const runs{on_ranks(world, pp::kind::one_f_one_b, false, data, cut),
                                  on_ranks(world, pp::kind::zb_h1, true, data, cut),
                                  on_ranks(world, pp::kind::zb_h1, false, data, cut),
                                  on_ranks(world, pp::kind::zb_h2, true, data, cut),
                                  on_ranks(world, pp::kind::zb_h2, false, data, cut)};
  auto const r = measure(world, runs, world.size(), reps);
  std::vector<step_fn> const trainers{in_trainer<pp::kind::one_f_one_b>(world, false, data, cut),
                                      in_trainer<pp::kind::zb_h1>(world, true, data, cut),
                                      in_trainer<pp::kind::zb_h1>(world, false, data, cut),
                                      in_trainer<pp::kind::zb_h2>(world, true, data, cut),
                                      in_trainer<pp::kind::zb_h2>(world, false, data, cut)};
  auto const t = measure(world, trainers, world.size(), reps);
  if (world.rank() != 0) return;
  zero_bubble_figure(pp::kind::zb_h1, 0.6, r[1], r[2], r[0], "_ranks", cut);
  zero_bubble_figure(pp::kind::zb_h2, 0.3, r[3], r[4], r[0], "_ranks", cut);
  zero_bubble_figure(pp::kind::zb_h1, 0.6, t[1], t[2], t[0], "_trainer", cut);
  zero_bubble_figure(pp::kind::zb_h2, 0.3, t[3], t[4], t[0], "_trainer", cut);
}
#endif

void partitioner_vs_uniform() {
  tide::nn::gpt_config const config{.layers = 6, .heads = 4, .channels = 128, .vocab = 8192, .max_seq = 64};
  int const m = 8;
  tokens const data(m, 4, 64, config.vocab);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  auto const s = pp::one_f_one_b(2, m);
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{1} << 31}};
  host_gpt model(config, arena, {.seed = 1, .in_flight = pp::slots_needed(s, 0)});
  model.zero_grad(ex);
  auto const layers = pp::measure_blocks(model, ex, data.micro[0], 5);
  auto const plan = pp::partition_layers(layers, {.stages = 2, .micro = m});
  auto const uniform = pp::uniform_partition(layers, {.stages = 2, .micro = m});
  pp::thread_executor best{s, pp::cut_of(plan, model.first_block())};
  pp::thread_executor even{s, pp::cut_of(uniform, model.first_block())};
  auto const step = [&](pp::thread_executor& run) -> pp::run_stats const& {  // one model, either cut
    model.zero_grad(ex);
    tide::bench::keep(run.run(model, std::span<batch const>(data.micro), 1.f / m));
    return run.last();
  };
  std::vector<step_fn> const runs{[&]() -> pp::run_stats const& { return step(best); },
                                  [&]() -> pp::run_stats const& { return step(even); }};
  auto const r = measure(runs, 2, 5);
  measured const& a = r[0];
  measured const& b = r[1];
  double head = layers.back().forward + layers.back().backward, block = layers[1].forward + layers[1].backward;
  tide::bench::figure{.bench = "pipeline",
                      .name = "partitioner_vs_uniform",
                      .value = a.slowest_busy(),
                      .unit = "s",
                      .anchor = "the uniform cut's slowest stage, busy seconds per step, same runs",
                      .anchor_value = b.slowest_busy(),
                      .higher_is_better = false,
                      .goal = 1.0,
                      .detail = {{"partition_first_stage_blocks", plan.stages[0].last + 1},
                                 {"uniform_first_stage_blocks", uniform.stages[0].last + 1},
                                 {"predicted_slowest", plan.slowest},
                                 {"predicted_uniform_slowest", uniform.slowest},
                                 {"head_over_block", head / block},
                                 {"partition_step_s", a.seconds},
                                 {"uniform_step_s", b.seconds}}}
      .print();
}

}  // namespace

int main([[maybe_unused]] int argc, [[maybe_unused]] char** argv) {
#if defined(TIDE_MPIEXEC)
  if (tide::bench::under_mpiexec()) {
    tide::comm::mpi_session session{&argc, &argv};
    tide::comm::mpi world{session};
    rank_figures(world);
    return 0;
  }
#endif
  struct shape {
    int p, m;
  };
  for (shape const s : {shape{4, 8}, shape{8, 32}, shape{16, 48}})
    for (pp::kind k : {pp::kind::gpipe, pp::kind::one_f_one_b, pp::kind::interleaved, pp::kind::zb_h1,
                       pp::kind::zb_h2, pp::kind::zb_v, pp::kind::dualpipe_v}) {
      int const v = k == pp::kind::interleaved ? 2 : 1;
      if (k == pp::kind::dualpipe_v && s.m < 2 * s.p) continue;
      auto const r = pp::check(pp::generate(k, s.p, s.m, v));
      double const p = s.p, m = s.m;
      double const closed = closed_bubble(k, s.p, s.m, v);
      double peak = 0, span = 0;
      for (auto const& st : r.stages) peak = std::max(peak, st.peak_activations), span = std::max(span, st.span());
      tide::bench::figure{.bench = "pipeline",
                          .name = "bubble_" + std::string(pp::to_string(k)) + "_p" + std::to_string(s.p) + "_m" +
                                  std::to_string(s.m),
                          .value = r.bubble_fraction,
                          .unit = "fraction",
                          .anchor = k == pp::kind::zb_h2 ? "(p - 1) / (3m + p - 1): the stagger; each stage's own bubble is 0"
                                    : k == pp::kind::zb_v || k == pp::kind::dualpipe_v
                                        ? "((p - 1) / 2) / (3m + (p - 1) / 2): half ZB-H1's stagger"
                                                          : "the closed form of the schedule's paper",
                          .anchor_value = closed,
                          .higher_is_better = false,
                          .goal = 1.0,
                          .detail = {{"stages", p},
                                     {"micro", m},
                                     {"chunks", pp::generate(k, s.p, s.m, v).chunks},
                                     {"makespan", r.makespan},
                                     {"peak_activations", peak},
                                     {"span_bubble", 1 - 3 * m / span}}}
          .print();
    }
  executor_figures();
  partitioner_vs_uniform();
#if defined(TIDE_MPIEXEC)
  return tide::bench::run_on(argv[0], "2");  // the zero-bubble figures on ranks
#else
  return 0;
#endif
}
