// Compressed data parallelism through make_trainer on real ranks: at density 1 the sink sends
// every chunk dense (its fallback when pairs cost more than a dense all-reduce), which is dense data
// parallelism bit for bit; at density 0.05 and with PowerSGD at rank 2 the GPT still learns,
// every rank ends with the same bits and sends a fraction of the dense bytes, and a per-rank
// checkpoint set resumes bit-identically (each rank takes its own lists back). The PowerSGD sink
// on one chunk: a summed matrix of rank <= r comes back as that sum, its vectors exactly. Under
// ZeRO-1 and ZeRO-2 both train the bits of stage 0.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "support/dp_steps.hpp"
#include "support/gpt_steps.hpp"
#include "support/mpi_world.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/comm/self.hpp"
#include "tide/compress/sink.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/stream.hpp"
#include "tide/train/trainer.hpp"

namespace {

using namespace tide::literals;
namespace cx = tide::compress;
auto const spec = tide::test::tiny_spec();
tide::optim::adamw adamw() { return {.lr = 3e-3f, .weight_decay = 0.01f}; }
std::vector<std::int32_t> data_of(int s) {
  return tide::test::token_runs(s, tide::test::tiny_batch, tide::test::tiny_seq, 64);
}
template <class Trainer>
float train(Trainer& t, int from, int to, int w, int r) {
  float loss = 0;
  for (int s = from; s < to; ++s) {
    auto const d = data_of(s * w + r);
    loss = t.step(tide::test::tiny_view<Trainer>(d)).loss;
  }
  return loss;
}
using sparse_dp = cx::sparse_data_parallel<tide::comm::mpi>;
using powersgd_dp = cx::powersgd_data_parallel<tide::comm::mpi>;

// A fresh directory name shared by the ranks (rank 0's pid).
std::filesystem::path shared_dir(tide::comm::mpi& world, char const* prefix) {
  std::int64_t pid = world.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0;
  world.all_reduce(std::span<std::int64_t>(&pid, 1), tide::comm::reduce_op::max);
  return std::filesystem::temp_directory_path() / (prefix + std::to_string(pid));
}

}  // namespace

TEST_CASE("compressed data parallelism at density 1 falls back to dense all-reduces: dense data parallelism, bit for bit") {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  // One chunk per all-reduce on both sides: the same calls, so the same sums on any rank count.
  auto dense = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(),
                                         tide::comm::data_parallel{.comm = &world, .bucket_bytes = 1});
  auto full = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(),
                                        sparse_dp{.comm = &world, .compressor = {.density = 1.f}});
  train(dense, 0, 3, w, r);
  train(full, 0, 3, w, r);
  CHECK(tide::test::max_difference(tide::test::flat_params(full), tide::test::flat_params(dense)) == 0.f);
  auto const st = full.scheduler().sink().stats();
  CHECK(st.sparse_chunks == 0);
  CHECK(st.chunks > 0);
}

// The two compressions this file trains with: sparse error feedback at density 0.05 and
// PowerSGD at rank 2.
template <class Policy>
Policy compressed(tide::comm::mpi& world, int zero = 0) {
  Policy p{.comm = &world, .zero = zero};
  if constexpr (std::is_same_v<Policy, sparse_dp>) p.compressor.density = 0.05f;
  else p.compressor.rank = 2;
  return p;
}

// make_trainer's compression slot over comm::data_parallel gives the compressing comm policy
// itself: the same ranks, ZeRO stage, compressor and threads, so the same bits.
TEST_CASE_TEMPLATE("the compression slot over data parallelism trains the bits of the compressing comm policy",
                   Policy, sparse_dp, powersgd_dp) {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  auto const whole = compressed<Policy>(world, 1);
  auto const slot = [&] {
    if constexpr (std::is_same_v<Policy, sparse_dp>) return cx::error_feedback<>{.compressor = whole.compressor};
    else return cx::powersgd{.compressor = whole.compressor};
  }();
  auto a = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), whole);
  auto b = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(),
                                     tide::comm::data_parallel{.comm = &world, .zero = 1}, slot);
  static_assert(std::is_same_v<typename decltype(b)::comm_type, Policy>);
  CHECK(b.comm().zero == 1);
  CHECK(b.comm().comm == &world);
  train(a, 0, 3, w, r);
  train(b, 0, 3, w, r);
  CHECK(tide::test::max_difference(tide::test::flat_params(b), tide::test::flat_params(a)) == 0.f);
  CHECK(b.scheduler().sink().stats().wire_bytes == a.scheduler().sink().stats().wire_bytes);
}

TEST_CASE_TEMPLATE("compressed training learns, the ranks agree, and a per-rank checkpoint set resumes bit-identically",
                   Policy, sparse_dp, powersgd_dp) {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  auto const policy = compressed<Policy>(world);
  auto t = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy);
  float const first = train(t, 0, 1, w, r);
  float const last = train(t, 1, 40, w, r);
  if (r == 0) MESSAGE(w, " ranks, ", Policy::name, ": loss ", first, " -> ", last);
  CHECK(last < 0.8f * first);  // loose: it learns
  CHECK(tide::test::same_on_every_rank(tide::test::flat_params(t)));
  auto const st = t.scheduler().sink().stats();
  if constexpr (std::is_same_v<Policy, sparse_dp>) CHECK(st.sparse_chunks == st.chunks);  // 0.05 < 1/W: all sparse
  else CHECK(st.low_rank > 0);
  CHECK(st.wire_bytes < st.dense_bytes / 2);
  if (r == 0)
    MESSAGE("wire bytes ", st.wire_bytes, " against dense ", st.dense_bytes, " (",
            static_cast<double>(st.wire_bytes) / static_cast<double>(st.dense_bytes), ")");

  // A checkpoint set: every rank's lists (residual, or PowerSGD's error and Q) in its own shard.
  std::filesystem::path const dir = shared_dir(world, "tide_compress_set_");
  if (r == 0) std::filesystem::remove_all(dir);
  world.barrier();
  t.save(dir);
  CHECK(tide::train::checkpoint_set::read_manifest(dir).ranks == w);
  train(t, 40, 43, w, r);
  auto const after = tide::test::flat_params(t);
  {
    auto resumed = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy);
    resumed.load(dir);
    train(resumed, 40, 43, w, r);
    CHECK(tide::test::max_difference(tide::test::flat_params(resumed), after) == 0.f);
  }
  {  // the lists matter: the same load with the first one zeroed ends elsewhere
    auto forgetful = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy);
    forgetful.load(dir);
    for (std::uint32_t i = 0; i < forgetful.model().parameters().size(); ++i) {
      auto const x = forgetful.scheduler().extra_bytes(0, i);
      std::fill(x.begin(), x.end(), std::byte{0});
    }
    train(forgetful, 40, 43, w, r);
    CHECK(tide::test::max_difference(tide::test::flat_params(forgetful), after) > 0.f);
  }
  world.barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the PowerSGD sink: a chunk's rank-r matrix sum comes back, its vectors and small matrices exactly") {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  // One chunk: a (48, 32) matrix whose sum over the ranks has rank 2, a bias, a (4, 4) matrix too
  // small to pay (2 · 2 · 8 floats > 16 / 2) and so sent dense, and a (40, 24) matrix whose sum
  // has rank 1 (P's second column is rounding noise: orthonormalise drops it).
  tide::parameter_list params;
  params.add("w", 0, {48, 32}, tide::dtype::f32);
  params.add("b", 0, {32}, tide::dtype::f32);
  params.add("s", 0, {4, 4}, tide::dtype::f32);
  params.add("v", 0, {40, 24}, tide::dtype::f32);
  auto const layout = tide::chunk::pack(params, 4096);
  REQUIRE(layout.chunks() == 1);
  std::vector<float> g(layout.chunk_elements, 0.f), error(g.size(), 0.f), q(g.size(), 0.f);
  auto at = [&](std::size_t i) { return g.data() + layout.offset_of[i]; };
  // rank k adds (k + 1) u1 v1ᵀ + (k + 1)² u2 v2ᵀ / 8 to w: the sum has rank 2 for any W; and
  // (k + 1) u1 v1ᵀ + (-1)^k u2 v2ᵀ to v: rank 1 for an even W
  auto const u1 = [](std::size_t i) { return static_cast<float>(i % 7) - 3.f; };
  auto const v1 = [](std::size_t j) { return static_cast<float>(j % 5) - 2.f; };
  auto const u2 = [](std::size_t i) { return static_cast<float>((i * 3) % 11) / 4.f; };
  auto const v2 = [](std::size_t j) { return static_cast<float>(j % 3) - 1.f; };
  float const k1 = static_cast<float>(r + 1);
  for (std::size_t i = 0; i < 48; ++i)
    for (std::size_t j = 0; j < 32; ++j) at(0)[i * 32 + j] = k1 * u1(i) * v1(j) + k1 * k1 * u2(i) * v2(j) / 8.f;
  for (std::size_t i = 0; i < 40; ++i)
    for (std::size_t j = 0; j < 24; ++j) at(3)[i * 24 + j] = k1 * u1(i) * v1(j) + (r % 2 == 0 ? 1.f : -1.f) * u2(i) * v2(j);
  for (std::size_t j = 0; j < 32; ++j) at(1)[j] = static_cast<float>(static_cast<int>(j) * (r + 1) % 9);
  for (std::size_t j = 0; j < 16; ++j) at(2)[j] = static_cast<float>(static_cast<int>(j) - r * 3);
  std::vector<float> expect = g;  // the dense sum (small integers and products: exact in fp32 here)
  world.all_reduce(std::span<float>(expect), tide::comm::reduce_op::sum);

  cx::powersgd_sink<tide::comm::mpi> sink{&world, {.rank = 2}};
  sink.bind_layout(layout, params.all());
  tide::offload::ready_chunk<tide::host, float> rc{.chunk = 0, .grads = std::span<float>(g), .step = 1};
  rc.lists[0] = std::as_writable_bytes(std::span<float>(error));
  rc.lists[1] = std::as_writable_bytes(std::span<float>(q));
  tide::memory::event<tide::host> done;
  rc.done = &done;
  CHECK(sink.reduce(rc));  // on the sink's worker: finished when done is
  done.synchronize();
  // The matrices: one power step from any Q recovers a sum of rank <= 2, to fp32 rounding
  // (1e-5 relative: products over at most 48 terms). Each rank keeps M_i − S / W; summed over the
  // ranks that is what S missed: nothing.
  std::vector<float> errors = error;
  world.all_reduce(std::span<float>(errors), tide::comm::reduce_op::sum);
  for (std::size_t m : {std::size_t{0}, std::size_t{3}}) {
    CAPTURE(m);
    std::size_t const o = layout.offset_of[m], e = static_cast<std::size_t>(params.all()[m].numel());
    double miss = 0, scale = 0, left = 0;
    for (std::size_t i = 0; i < e; ++i) {
      miss += (double(g[o + i]) - expect[o + i]) * (double(g[o + i]) - expect[o + i]);
      scale += double(expect[o + i]) * expect[o + i];
      left += double(errors[o + i]) * errors[o + i];
    }
    CHECK(std::sqrt(miss) <= 1e-5 * std::sqrt(scale));
    CHECK(std::sqrt(left) <= 1e-5 * std::sqrt(scale));
  }
  // The vector and the small matrix: the dense sum, bit for bit; padding stays zero.
  for (std::size_t i : {std::size_t{1}, std::size_t{2}})
    for (std::size_t j = 0; j < static_cast<std::size_t>(params.all()[i].numel()); ++j)
      CHECK(at(i)[j] == expect[layout.offset_of[i] + j]);
  for (std::size_t j = 48 * 32; j < layout.offset_of[1]; ++j) CHECK(g[j] == 0.f);
  CHECK(tide::test::same_on_every_rank(g));
  CHECK(tide::test::same_on_every_rank(q));  // Q, the warm start, is shared
  auto const st = sink.stats();
  CHECK(st.low_rank == 2);
  CHECK(st.dense_floats == 32 + 16);
  if (w > 1) CHECK(st.wire_bytes < st.dense_bytes / 4);
}

TEST_CASE_TEMPLATE("compressed data parallelism under ZeRO-1, 2 and 3 trains the same bits, and its sets resume bit-identically",
                   Policy, sparse_dp, powersgd_dp) {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  auto policy = [&](int zero) { return compressed<Policy>(world, zero); };
  auto plain = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy(0));
  train(plain, 0, 10, w, r);
  auto const reference = tide::test::flat_params(plain);
  for (int zero : {1, 2, 3}) {
    CAPTURE(zero);
    auto t = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy(zero));
    CHECK(t.scheduler().shards_parameters() == (zero == 3 && w > 1));
    train(t, 0, 10, w, r);
    if (zero == 3) {  // a rank holds its own chunks only, until every rank gathers the rest
      std::uint32_t held = 0;
      for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) held += t.scheduler().holds_parameter(i);
      CHECK((held < t.model().parameters().size()) == (w > 1));
      t.scheduler().gather_parameters();
    }
    // The owner of each chunk stepped it with the same sums: the same bits, on every rank.
    CHECK(tide::test::max_difference(tide::test::flat_params(t), reference) == 0.f);
    std::uint32_t kept = 0;
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) kept += t.scheduler().keeps_state(i) ? 1 : 0;
    CHECK(kept < t.model().parameters().size());  // another rank keeps the rest
    CHECK(t.scheduler().sink().stats().bytes_gathered > 0);
    // A set under ZeRO: the owned state in the owner's shard, every chunk's residual in each
    // rank's own; a resume gives the same bits.
    std::filesystem::path const dir = shared_dir(world, "tide_compress_zero_set_");
    if (r == 0) std::filesystem::remove_all(dir);
    world.barrier();
    t.save(dir);
    train(t, 10, 13, w, r);
    auto resumed = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy(zero));
    resumed.load(dir);
    train(resumed, 10, 13, w, r);
    if (zero == 3) {
      t.scheduler().gather_parameters();
      resumed.scheduler().gather_parameters();
    }
    CHECK(tide::test::max_difference(tide::test::flat_params(resumed), tide::test::flat_params(t)) == 0.f);
    world.barrier();
    if (r == 0) std::filesystem::remove_all(dir);
  }
  CHECK_THROWS_WITH_AS(tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy(4)),
                       doctest::Contains("pass 0 to 3"), tide::error);
}

TEST_CASE("a set of residuals loaded on another rank count keeps their sum; PowerSGD's shared Q is copied") {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  auto lists_of = [](auto& t, std::size_t k) {  // list k of every tensor, in order
    std::vector<float> all;
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
      auto const x = t.scheduler().extra_bytes(k, i);
      auto const* f = reinterpret_cast<float const*>(x.data());
      all.insert(all.end(), f, f + x.size() / sizeof(float));
    }
    return all;
  };
  auto check = [&](auto policy, auto one_rank_policy, char const* prefix) {
    auto t = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy);
    train(t, 0, 5, w, r);
    std::filesystem::path const dir = shared_dir(world, prefix);
    if (r == 0) std::filesystem::remove_all(dir);
    world.barrier();
    t.save(dir);
    // What every rank keeps, gathered: the sum over the ranks in rank order.
    auto const mine = lists_of(t, 0);
    std::vector<float> all(mine.size() * static_cast<std::size_t>(w));
    world.all_gather(std::span<float const>(mine), std::span<float>(all));
    std::vector<float> sum(mine.size(), 0.f);
    for (int j = 0; j < w; ++j)
      for (std::size_t e = 0; e < sum.size(); ++e) sum[e] += all[static_cast<std::size_t>(j) * mine.size() + e];
    if (r == 0) {  // one rank alone loads the W-rank set
      auto alone = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), one_rank_policy);
      alone.load(dir);
      CHECK(lists_of(alone, 0) == sum);
      if constexpr (decltype(t)::comm_type::sink_type::lists.size() > 1)
        CHECK(lists_of(alone, 1) == lists_of(t, 1));  // Q: the same on every rank, copied
      CHECK(tide::test::max_difference(tide::test::flat_params(alone), tide::test::flat_params(t)) == 0.f);
    }
    world.barrier();
    if (r == 0) std::filesystem::remove_all(dir);
  };
  tide::comm::self one;
  check(compressed<sparse_dp>(world), cx::sparse_data_parallel<tide::comm::self>{.comm = &one,
                                                                                  .compressor = {.density = 0.05f}},
        "tide_reshard_sparse_");
  check(compressed<powersgd_dp>(world),
        cx::powersgd_data_parallel<tide::comm::self>{.comm = &one, .compressor = {.rank = 2}}, "tide_reshard_psgd_");
}
