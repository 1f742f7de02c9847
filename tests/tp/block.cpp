// tide::tp on a group of one rank (comm::self): the tensor-parallel block is nn::gpt's block, bit
// for bit, plain and sequence parallel; shards cut and join whole tensors exactly; a group size
// that does not divide the heads, a shard of the wrong size and rows that are not the rank's are
// refused. The groups of 2 and 4 ranks are in tests/mpi/tensor_parallel.cpp.

#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <vector>

#include "support/tp_block.hpp"
#include "tide/comm/self.hpp"

namespace {

using namespace tide::test;
using tide::index_t;

constexpr tide::nn::gpt_config config{.layers = 1, .heads = 4, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr index_t Bn = 2, Tn = 8, C = config.channels;

bool same(tp_view a, tp_view b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * 4) == 0;
}
bool same(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("tp block: on a group of one it is nn::gpt's block, bit for bit, plain and sequence parallel") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  tp_store mref;
  auto const x = tp_values(Bn * Tn * C, 1);
  auto const dy = tp_values(Bn * Tn * C, 2, 0.1f);
  tp_cview const xv(x.data(), {Bn, Tn, C});

  tp_params ref = whole_block(C, 7);
  auto r = gpt_views(mref, ex, config, Bn, Tn);
  tide::nn::detail::block_forward(ex, xv, r, ref.views(), config.heads);
  std::vector<float> dref = dy;
  tide::nn::detail::block_backward(ex, tp_view(dref.data(), {Bn, Tn, C}), xv, r, ref.views(), ref.grads(),
                                   config.heads);

  for (bool const sequence : {false, true}) {
    CAPTURE(sequence);
    tp_params mine = whole_block(C, 7);
    tp_store m;
    auto a = tp_views(m, ex, config, 1, Bn, Tn, sequence);
    tide::tp::block_forward(ex, self, sequence, xv, a, mine.views(), config.heads);
    std::vector<float> d = dy;
    tide::tp::block_backward(ex, self, sequence, tp_view(d.data(), {Bn, Tn, C}), xv, a, mine.views(), mine.grads(),
                             config.heads);
    tide::tp::reduce_replicated<tide::host, float>(self, sequence, mine.grads());
    CHECK(same(a.res3, r.res3));
    CHECK(same(a.qkv, r.qkv));
    CHECK(same(d, dref));
    for (int k = 0; k < tide::nn::params_per_block; ++k) {
      CAPTURE(tide::nn::block_param_names[k]);
      CHECK(same(mine.dw[static_cast<std::size_t>(k)], ref.dw[static_cast<std::size_t>(k)]));
    }
  }
}

TEST_CASE("tp shards: every rank's shard put back gives the whole tensor; qkv keeps each rank's heads") {
  tp_params const whole = whole_block(C, 3);
  for (int t : {1, 2, 4}) {
    CAPTURE(t);
    for (int k = 0; k < tide::nn::params_per_block; ++k) {
      auto const b = static_cast<tide::nn::block_param>(k);
      auto const s = tide::tp::whole_shape(b, C);
      std::vector<float> back(whole.w[static_cast<std::size_t>(k)].size(), -1.f);
      for (int rank = 0; rank < t; ++rank) {
        tp_params const part = shard_of(whole, C, rank, t);
        tide::tp::put_shard(tide::tp::split_of(b), std::span<float const>(part.w[static_cast<std::size_t>(k)]), std::span<float>(back),
                            s.rows, s.cols, rank, t);
      }
      CHECK(same(back, whole.w[static_cast<std::size_t>(k)]));
    }
  }
  // Rank 1 of 2 holds heads 2 and 3: rows C/2 .. C of q, of k (C + C/2 ..) and of v.
  tp_params const part = shard_of(whole, C, 1, 2);
  auto const& q = whole.w[static_cast<std::size_t>(tide::nn::block_param::qkv_w)];
  auto const& mine = part.w[static_cast<std::size_t>(tide::nn::block_param::qkv_w)];
  CHECK(mine[0] == q[static_cast<std::size_t>(C / 2 * C)]);
  CHECK(mine[static_cast<std::size_t>(C / 2 * C)] == q[static_cast<std::size_t>((C + C / 2) * C)]);
  CHECK(mine[static_cast<std::size_t>(C * C + 5)] == q[static_cast<std::size_t>((2 * C + C / 2) * C + 5)]);
  // attn.proj.w is row-parallel: rank 1 keeps columns C/2 .. C of every row.
  auto const& p = whole.w[static_cast<std::size_t>(tide::nn::block_param::attn_proj_w)];
  auto const& pm = part.w[static_cast<std::size_t>(tide::nn::block_param::attn_proj_w)];
  CHECK(pm[static_cast<std::size_t>(3 * (C / 2) + 1)] == p[static_cast<std::size_t>(3 * C + C / 2 + 1)]);
}

TEST_CASE("tp: a group that cannot split the heads, a shard of the wrong size and rows not the rank's are refused") {
  CHECK_THROWS_WITH_AS(tide::tp::check_group(config, 3), doctest::Contains("cannot split 4 heads"), tide::error);
  CHECK_NOTHROW(tide::tp::check_group(config, 4));
  std::vector<float> whole(static_cast<std::size_t>(4 * C * C)), shard(static_cast<std::size_t>(C * C));
  CHECK_THROWS_WITH_AS(tide::tp::take_shard(tide::tp::split_of(tide::nn::block_param::fc_w), std::span<float const>(whole),
                                            std::span<float>(shard), 4 * C, C, 0, 2),
                       doctest::Contains("the shard has"), tide::error);
  CHECK_THROWS_WITH_AS(tide::tp::take_shard(tide::tp::split_of(tide::nn::block_param::fc_w), std::span<float const>(whole),
                                            std::span<float>(shard), 4 * C, C, 2, 2),
                       doctest::Contains("rank 2 is not in [0, 2)"), tide::error);

  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  tp_store m;
  tp_params w = whole_block(C, 7);
  auto a = tp_views(m, ex, config, 1, Bn, Tn, false);
  std::vector<float> x(static_cast<std::size_t>(Bn * Tn * C / 2));  // half the rows
  CHECK_THROWS_WITH_AS(tide::tp::block_forward(ex, self, false, tp_cview(x.data(), {Bn * Tn / 2, C}), a, w.views(),
                                               config.heads),
                       doctest::Contains("each rank holds all B T"), tide::error);
  std::vector<float> full(static_cast<std::size_t>(Bn * Tn * C));
  CHECK_THROWS_WITH_AS(tide::tp::block_forward(ex, self, false, tp_cview(full.data(), {Bn, Tn, C}), a, w.views(), 2),
                       doctest::Contains("the rank computes 2"), tide::error);
}
