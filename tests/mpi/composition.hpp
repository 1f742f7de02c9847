#pragma once
// The composition matrix: every choice in four of make_trainer's slots with every other.
//
//   offload      resident, chunked<belady>, layer_window<2>
//   comm         none, data parallel (ZeRO-0), ZeRO-1, ZeRO-2, ZeRO-3
//   compression  none, top-k with error feedback, PowerSGD
//   pipeline     none, 1F1B, interleaved, ZB-H1, DualPipeV
//
// Compression is its own slot over the comm choice: top-k is compress::error_feedback and PowerSGD
// compress::powersgd, over the replicas' comm::data_parallel (its .zero the ZeRO stage), or over
// one process when the comm choice is none (each rank compressing its own gradient with error
// feedback, over a comm::self the slot makes). All 225 are checked at compile time with train::Composes (composition.cpp); the
// rows below run on 4 MPI ranks, two replicas of a pipeline of two stages (rank r: stage r % 2,
// replica r / 2; without a pipeline both stages' ranks train the whole model alike). Every pair of
// choices from two slots appears in at least one row (a pairwise covering array; checked at
// compile time below), plus the combinations tide changed code for.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/mpi_world.hpp"
#include "support/pipeline_data.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/comm/self.hpp"
#include "tide/compress/sink.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/pipeline/stages.hpp"
#include "tide/train/crc32c.hpp"
#include "tide/train/trainer.hpp"

namespace tide::test::matrix {

namespace pp = tide::pipeline;
using mpi = tide::comm::mpi;

// ---- the slots' choices, as indices and types ---------------------------------------------------

inline constexpr std::array<std::string_view, 3> offload_names{"resident", "chunked<belady>", "layer_window<2>"};
inline constexpr std::array<std::string_view, 5> comm_names{"none", "DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
inline constexpr std::array<std::string_view, 3> compression_names{"none", "top-k + EF", "PowerSGD"};
inline constexpr std::array<std::string_view, 5> pipeline_names{"none", "1F1B", "interleaved", "ZB-H1", "DualPipeV"};

template <int O>
using offload_t = std::tuple_element_t<static_cast<std::size_t>(O),
                                       std::tuple<tide::offload::resident, tide::offload::chunked<tide::offload::belady>,
                                                  tide::offload::layer_window<2>>>;
// Comm choice C (0: none; 1 .. 4: ZeRO-(C - 1)) and compression X (0: none, 1: top-k, 2: PowerSGD).
template <int C>
using comm_t = std::conditional_t<C == 0, tide::train::no_comm, tide::comm::data_parallel<mpi>>;
template <int X>
using compression_t = std::tuple_element_t<
    static_cast<std::size_t>(X),
    std::tuple<tide::train::no_compress, tide::compress::error_feedback<>, tide::compress::powersgd>>;
inline constexpr std::array<pp::kind, 4> kinds{pp::kind::one_f_one_b, pp::kind::interleaved, pp::kind::zb_h1,
                                               pp::kind::dualpipe_v};
template <int P>
using pipeline_t = std::conditional_t<P == 0, tide::train::no_pipeline,
                                      pp::on_ranks<kinds[static_cast<std::size_t>(P == 0 ? 0 : P - 1)], mpi>>;
using spec_t = tide::nn::gpt_spec<tide::host>;

// ---- the rows that run ------------------------------------------------------------------------

struct row {
  int offload, comm, compression, pipeline;
};
// A pairwise covering array of the four slots (25 rows, one per comm x pipeline pair), then the
// combinations tide changed code for that the array checks only under compression: ZeRO-2 and 3
// with several pieces per stage, dense.
inline constexpr std::array<row, 27> rows{{
    {0, 0, 1, 0}, {0, 0, 0, 1}, {2, 0, 2, 2}, {1, 0, 1, 3}, {1, 0, 0, 4},  //
    {2, 1, 1, 0}, {1, 1, 2, 1}, {0, 1, 0, 2}, {1, 1, 2, 3}, {0, 1, 1, 4},  //
    {1, 2, 0, 0}, {0, 2, 1, 1}, {1, 2, 1, 2}, {1, 2, 2, 3}, {2, 2, 2, 4},  //
    {2, 3, 0, 0}, {2, 3, 0, 1}, {1, 3, 1, 2}, {0, 3, 2, 3}, {0, 3, 1, 4},  //
    {0, 4, 2, 0}, {0, 4, 1, 1}, {1, 4, 1, 2}, {2, 4, 0, 3}, {0, 4, 2, 4},  //
    {1, 4, 0, 2}, {1, 3, 0, 4},
}};
inline constexpr std::array<int, 4> slot_sizes{3, 5, 3, 5};
constexpr int choice(row r, int slot) {
  return slot == 0 ? r.offload : slot == 1 ? r.comm : slot == 2 ? r.compression : r.pipeline;
}
// Whether every pair of choices from two different slots appears in some row.
constexpr bool covers_every_pair() {
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b)
      for (int x = 0; x < slot_sizes[static_cast<std::size_t>(a)]; ++x)
        for (int y = 0; y < slot_sizes[static_cast<std::size_t>(b)]; ++y) {
          bool found = false;
          for (row r : rows) found = found || (choice(r, a) == x && choice(r, b) == y);
          if (!found) return false;
        }
  return true;
}
static_assert(covers_every_pair(), "the composition matrix's rows must cover every pair of choices");

// ---- what a run gives, and the references -----------------------------------------------------

inline constexpr int stages = 2, micro = 4, steps = 3;

// Losses per step and this rank's parameters by name at the end.
struct outcome {
  std::vector<float> losses;
  std::vector<std::pair<std::string, std::vector<float>>> params;
};

// The setup every row shares: the groups (of the whole job, and of each replica alone for the
// rows without data parallelism), the replica's micro-batches, the optimizer.
struct setup {
  pp::rank_groups<mpi> g;
  mpi replica;  // this replica's ranks
  pp::rank_groups<mpi> alone;
  std::vector<pipeline_micro_batches> batches;
  tide::optim::adamw opt{.lr = 1e-2f, .clip_norm = 1e6f, .micro_steps = micro};
  setup()
      : g(pp::make_groups(world(), stages)),
        replica(world().split(g.replica, world().rank())),
        alone(pp::make_groups(replica, stages)) {
    for (int s = 0; s < steps; ++s)
      batches.emplace_back(micro, 900 + 10 * static_cast<std::uint32_t>(s) + static_cast<std::uint32_t>(g.replica));
  }
  setup(setup const&) = delete;
  setup& operator=(setup const&) = delete;
};
inline setup& shared_setup() {
  static setup s;  // made on first use, by every rank at the same test
  return s;
}

template <int O>
offload_t<O> offload_of() {
  if constexpr (O == 0) return {};
  else if constexpr (O == 1) return {.device_budget = std::size_t{4} << 20, .chunk_bytes = std::size_t{16} << 10};
  else return {.device_budget = std::size_t{8} << 20};
}
template <int C>
comm_t<C> comm_of(setup& s) {
  if constexpr (C == 0) return {};
  else return {.comm = &s.g.data, .zero = C - 1};
}
template <int X>
compression_t<X> compression_of() {
  if constexpr (X == 0) return {};
  else if constexpr (X == 1) return {.compressor = {.density = 0.1f}};
  else return {.compressor = {.rank = 2}};
}
template <int P>
pipeline_t<P> pipeline_of(setup& s, bool data_parallel) {
  auto& g = data_parallel ? s.g : s.alone;
  if constexpr (P == 0) return {};
  else return {.stages = stages, .micro = micro, .group = &g.pipeline, .tied = &g.tied};
}

template <class Trainer>
outcome train_rows(Trainer& t, setup& s) {
  outcome out;
  for (auto const& d : s.batches) {
    std::vector<typename Trainer::batch_type> micro_batches;
    for (auto const& b : d.micro) micro_batches.push_back({b.tokens, b.targets});
    out.losses.push_back(t.step(micro_batches).loss);
  }
  t.scheduler().gather_parameters();  // ZeRO-3: every chunk here
  auto const& list = t.scheduler().parameters();
  for (std::uint32_t i = 0; i < list.size(); ++i)
    out.params.emplace_back(std::string(list[i].name()), t.scheduler().read_param(i));
  return out;
}

// Offload O, comm C, compression X, pipeline P on this rank.
template <int O, int C, int X, int P>
outcome run(setup& s) {
  auto spec = spec_t{.config = pipeline_gpt, .options = {.seed = 5, .in_flight = 1, .separate_tied_grad = true}};
  auto const pipe = pipeline_of<P>(s, C > 0);
  if constexpr (P > 0) {  // the zero-bubble schedules run W apart from B: the model's backward splits
    pp::schedule const plan = pipe.plan();
    bool const split = std::ranges::any_of(plan.per_stage, [](auto const& list) {
      return std::ranges::any_of(list, [](pp::action a) { return a.kind == pp::op::W; });
    });
    spec.options.split_backward = split;
    spec.options.in_flight = pp::slots_needed(plan, s.g.stage, split);
  }
  auto t = tide::train::make_trainer(spec, offload_of<O>(), s.opt, comm_of<C>(s), compression_of<X>(), pipe);
  return train_rows(t, s);
}

// The dense references, made once: resident, no compression, no pipeline; alone (each replica's
// ranks on their own) or data parallel over the replicas. start(): the parameters before a step.
outcome const& reference(bool data_parallel);
outcome const& start();

// Checks row r's outcome against its reference (composition.cpp): bit for bit without
// compression; with it, within the bounds stated there. Every rank calls it, in row order.
void check(row r, outcome const& got);

template <std::size_t I>
void run_row() {
  constexpr row r = rows[I];
  CAPTURE(I);
  CAPTURE(offload_names[static_cast<std::size_t>(r.offload)]);
  CAPTURE(comm_names[static_cast<std::size_t>(r.comm)]);
  CAPTURE(compression_names[static_cast<std::size_t>(r.compression)]);
  CAPTURE(pipeline_names[static_cast<std::size_t>(r.pipeline)]);
  check(r, run<r.offload, r.comm, r.compression, r.pipeline>(shared_setup()));
}
// Rows Begin .. Begin + sizeof...(I) - 1.
template <std::size_t Begin, std::size_t... I>
void run_rows(std::index_sequence<I...>) {
  (run_row<Begin + I>(), ...);
}

// The CRC-32C of a run's parameters by name (every rank that holds a tensor must hold its bits).
inline std::uint32_t crc_of(std::vector<float> const& v) {
  return tide::train::crc32c(std::as_bytes(std::span(v)));
}

}  // namespace tide::test::matrix
