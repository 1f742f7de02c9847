// pipeline::rank_executor on MPI ranks, one stage per rank: every schedule on 2 and on 4 ranks gives
// each rank's parameters the gradients of gradient accumulation in one process, bit for bit, and
// every rank the losses' sum; the parameters of other ranks' blocks keep a zero gradient (the
// head's share of wte travels to the embedding's rank); 2 stages x 2 data-parallel replicas on 4
// ranks equal one process summing the two replicas' accumulations.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <tide/comm/mpi.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/pipeline/ranks.hpp>

#include "support/mpi_world.hpp"

namespace pp = tide::pipeline;
using namespace tide::literals;
using tide::index_t;
using host_gpt = tide::nn::gpt<tide::host>;
using batch = host_gpt::batch_type;

namespace {

constexpr tide::nn::gpt_config config{.layers = 6, .heads = 2, .channels = 16, .vocab = 32, .padded_vocab = 40,
                                      .max_seq = 8};
constexpr index_t B = 2, T = 6;

struct data {
  std::vector<std::vector<std::int32_t>> tokens, targets;
  std::vector<batch> micro;
  data(int m, std::uint32_t seed) {
    std::mt19937 rng(seed);
    for (int k = 0; k < m; ++k) {
      tokens.emplace_back(B * T);
      targets.emplace_back(B * T);
      for (auto& t : tokens.back()) t = static_cast<std::int32_t>(rng() % config.vocab);
      for (auto& t : targets.back()) t = static_cast<std::int32_t>(rng() % config.vocab);
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) micro.push_back({{tokens[i].data(), {B, T}}, {targets[i].data(), {B, T}}});
  }
};

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
  for (auto const& s : {pp::gpipe(p, m), pp::one_f_one_b(p, m), pp::interleaved(p, m, 2), pp::zb_h1(p, m),
                        pp::zb_h2(p, m), pp::zb_v(p, m)}) {
    CAPTURE(s.name);
    tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
    host_gpt model(config, arena, {.seed = 5, .in_flight = pp::slots_needed(s, world.rank()), .separate_tied_grad = true});
    model.zero_grad(ex);
    pp::rank_executor run{world, s, pp::uniform_cut(model, s)};
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
      CHECK(run.last().bubble_fraction >= 0);
      CHECK(run.last().bubble_fraction < 1);
    }
  }
}

TEST_CASE("mpi pipeline: 2 stages x 2 data-parallel replicas equal one process summing the replicas") {
  auto& world = tide::test::world();
  if (world.size() != 4) return;  // the 4-rank launch runs it
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
