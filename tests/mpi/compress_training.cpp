// Compressed data parallelism through make_trainer on real ranks: density 1 is dense data
// parallelism bit for bit; at density 0.05 the GPT still learns, every rank ends with the same
// bits and sends a fraction of the dense bytes; a per-rank checkpoint set resumes bit-identically
// (each rank takes its own residuals back).

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/dp_steps.hpp"
#include "support/gpt_steps.hpp"
#include "support/mpi_world.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/compress/sink.hpp"
#include "tide/optim/adamw.hpp"
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

}  // namespace

TEST_CASE("compressed data parallelism at density 1 is dense data parallelism, bit for bit") {
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

TEST_CASE("at density 0.05 the GPT learns, the ranks agree, and a per-rank checkpoint set resumes bit-identically") {
  auto& world = tide::test::world();
  int const w = world.size(), r = world.rank();
  sparse_dp const policy{.comm = &world, .compressor = {.density = 0.05f}};
  auto t = tide::train::make_trainer(spec, tide::test::tiny_tight(), adamw(), policy);
  float const first = train(t, 0, 1, w, r);
  float const last = train(t, 1, 40, w, r);
  if (r == 0) MESSAGE(w, " ranks, density 0.05: loss ", first, " -> ", last);
  CHECK(last < 0.8f * first);  // loose: it learns
  CHECK(tide::test::same_on_every_rank(tide::test::flat_params(t)));
  auto const st = t.scheduler().sink().stats();
  CHECK(st.sparse_chunks == st.chunks);  // 0.05 < 1/W: every chunk goes sparse
  CHECK(st.wire_bytes < st.dense_bytes / 2);
  if (r == 0)
    MESSAGE("wire bytes ", st.wire_bytes, " against dense ", st.dense_bytes, " (",
            static_cast<double>(st.wire_bytes) / static_cast<double>(st.dense_bytes), ")");

  // A checkpoint set: every rank's residuals in its own shard.
  std::int64_t pid = r == 0 ? static_cast<std::int64_t>(::getpid()) : 0;
  world.all_reduce(std::span<std::int64_t>(&pid, 1), tide::comm::reduce_op::max);
  std::filesystem::path const dir = std::filesystem::temp_directory_path() / ("tide_sparse_set_" + std::to_string(pid));
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
  {  // the residuals matter: the same load without them (zeroed) ends elsewhere
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
