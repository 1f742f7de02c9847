// Compression's transports on real ranks: sparse_all_sum of every rank's (index, value) pairs
// equals the dense all-reduce of the same sparse vectors (integer values: every sum exact), with
// the same bits on every rank, also when a rank sends nothing; the α–β rule's break-even density
// is 1/P for large vectors; PowerSGD at full rank gives the sum.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "support/mpi_world.hpp"
#include "tide/compress/powersgd.hpp"
#include "tide/compress/sparse_sum.hpp"
#include "tide/core/parallel.hpp"

TEST_CASE("sparse_all_sum equals the dense all-reduce of the ranks' sparse vectors") {
  auto& world = tide::test::world();
  int const r = world.rank();
  std::size_t const n = 5003;
  tide::compress::sparse_scratch scratch;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    // Rank r sends every (r + 1)-th index from an offset, values small integers; rank 1 sends
    // nothing in round 1.
    std::vector<std::uint32_t> idx;
    std::vector<float> val;
    if (!(round == 1 && r == 1))
      for (std::size_t i = static_cast<std::size_t>(round + r); i < n; i += static_cast<std::size_t>(r + 1 + round)) {
        idx.push_back(static_cast<std::uint32_t>(i));
        val.push_back(static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r)) % 17) - 8));
      }
    std::vector<float> dense(n, 0.f);
    for (std::size_t j = 0; j < idx.size(); ++j) dense[idx[j]] = val[j];
    world.all_reduce(std::span<float>(dense), tide::comm::reduce_op::sum);
    std::vector<float> sum(n, 123.f);  // overwritten
    tide::compress::sparse_all_sum(world, std::span<std::uint32_t const>(idx), std::span<float const>(val),
                                   std::span<float>(sum), scratch);
    CHECK(std::memcmp(sum.data(), dense.data(), n * sizeof(float)) == 0);
    std::vector<float> lo = sum, hi = sum;
    world.all_reduce(std::span<float>(lo), tide::comm::reduce_op::min);
    world.all_reduce(std::span<float>(hi), tide::comm::reduce_op::max);
    CHECK(std::memcmp(lo.data(), hi.data(), n * sizeof(float)) == 0);
  }
  // An index outside the vector is refused before anything is sent (on every rank alike).
  std::vector<std::uint32_t> const bad{static_cast<std::uint32_t>(n)};
  std::vector<float> const one{1.f};
  std::vector<float> sum(n);
  CHECK_THROWS_AS(tide::compress::sparse_all_sum(world, std::span<std::uint32_t const>(bad),
                                                 std::span<float const>(one), std::span<float>(sum), scratch),
                  tide::error);
}

TEST_CASE("the α–β rule: sparse below a density of 1/P, dense above, for large vectors") {
  std::size_t const n = 10'000'000;
  for (int p : {2, 4, 8}) {
    CAPTURE(p);
    auto const at = [&](double d) { return static_cast<std::size_t>(d * static_cast<double>(n)); };
    CHECK(tide::compress::sparse_is_cheaper(n, at(0.9 / p), p));
    CHECK_FALSE(tide::compress::sparse_is_cheaper(n, at(1.1 / p), p));
  }
  CHECK_FALSE(tide::compress::sparse_is_cheaper(n, 1, 1));  // one rank: nothing to send either way
}

TEST_CASE("PowerSGD on real ranks: full rank gives the sum, the same bits everywhere; the errors add up to what was missed") {
  auto& world = tide::test::world();
  int const r = world.rank();
  tide::thread_pool pool(1);
  tide::exec<tide::host> const ex{pool};
  std::size_t const rows = 24, cols = 6;
  auto matrix = [&](std::size_t salt) {
    std::vector<float> m(rows * cols);
    for (std::size_t i = 0; i < m.size(); ++i)
      m[i] = static_cast<float>(static_cast<int>((i * 13 + salt * 7 + static_cast<std::size_t>(r) * 29) % 23) - 11) / 8.f;
    return m;
  };
  double scale = 0;
  for (int rank : {6, 2}) {
    CAPTURE(rank);
    tide::compress::powersgd_state s{rows, cols, {.rank = rank}};
    auto const m = matrix(static_cast<std::size_t>(rank));
    std::vector<float> dense = m;
    world.all_reduce(std::span<float>(dense), tide::comm::reduce_op::sum);
    auto g = m;
    tide::compress::powersgd_sum(ex, world, std::span<float>(g), s);
    std::vector<float> lo = g, hi = g;
    world.all_reduce(std::span<float>(lo), tide::comm::reduce_op::min);
    world.all_reduce(std::span<float>(hi), tide::comm::reduce_op::max);
    CHECK(std::memcmp(lo.data(), hi.data(), g.size() * sizeof(float)) == 0);
    double miss = 0, sum = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      miss += (double(g[i]) - dense[i]) * (double(g[i]) - dense[i]);
      sum += double(dense[i]) * dense[i];
    }
    scale = std::sqrt(sum);
    // Full rank: the sum, to fp32 rounding of products over 6 to 24 terms (1e-5 relative).
    if (rank == 6) CHECK(std::sqrt(miss) <= 1e-5 * scale);
    else CHECK(std::sqrt(miss) < scale);
    // Σ_i E_i = Σ_i M_i − S: the errors keep, over the ranks, exactly what the sum missed.
    std::vector<float> errors = s.error;
    world.all_reduce(std::span<float>(errors), tide::comm::reduce_op::sum);
    double off = 0;
    for (std::size_t i = 0; i < g.size(); ++i) off += std::fabs(double(errors[i]) - (double(dense[i]) - g[i]));
    CHECK(off <= 1e-5 * scale * static_cast<double>(g.size()));
  }
}
