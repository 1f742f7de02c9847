// The sparse transport on real ranks: sparse_all_sum of every rank's (index, value) pairs equals
// the dense all-reduce of the same sparse vectors (integer values: every sum exact), with the
// same bits on every rank, also when a rank sends nothing; and the α–β rule's break-even
// density is 1/P for large vectors.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "support/mpi_world.hpp"
#include "tide/compress/sparse_sum.hpp"

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
