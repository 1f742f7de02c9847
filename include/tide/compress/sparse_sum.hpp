#pragma once
// The transport of sparse gradients (RedSync's): every rank's (index, value) pairs summed over the
// ranks into a dense fp32 vector, the same bits on every rank.
//
//   tide::compress::sparse_scratch scratch;
//   tide::compress::sparse_all_sum(world, idx.first(m), val.first(m), sum, scratch);  // sum: n floats
//
// Three steps: an all_gather of the ranks' pair counts, an all_gatherv of the pairs (each an
// int32 index and the value's bits, 8 bytes), and a scatter-add into `sum`, rank after rank and
// pair after pair, so the order of every addition is fixed.
//
// When is it worth it? A rank receives the pairs of the P − 1 others, 8 B each: 8·k·(P − 1)
// bytes, against 8·n·(P − 1)/P for a ring all-reduce of the dense fp32 vector (each element sent
// and received once per half). Sparse wins below the break-even density 2·s_v / (P·(s_i + s_v))
// = 1/P with 4-byte indices and values. Both run as rings of P − 1 steps (Open MPI's all-gathers
// and the ring all-reduce), so the latency terms are alike and the bytes decide.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::compress {

struct sparse_scratch {
  std::vector<std::int32_t> counts;   // per rank: elements of its pairs (2 per pair)
  std::vector<index_t> gather_counts;
  std::vector<std::int32_t> mine;     // this rank's pairs, packed
  std::vector<std::int32_t> all;      // every rank's, rank after rank
};

// The α–β model of one step's transport. alpha: seconds per message; beta: seconds per byte.
struct wire_model {
  double alpha = 5e-6;
  double beta = 1.0 / 10e9;
  // Seconds to all-reduce n fp32 values dense over p ranks (a ring: 2(p − 1) steps of n/p each).
  [[nodiscard]] double dense(std::size_t n, int p) const {
    if (p <= 1) return 0;
    double const steps = 2.0 * (p - 1);
    return steps * alpha + steps * beta * 4.0 * static_cast<double>(n) / p;
  }
  // Seconds to all-gather the counts and then k pairs from each of p ranks (rings of p − 1 steps).
  [[nodiscard]] double sparse(std::size_t k, int p) const {
    if (p <= 1) return 0;
    double const steps = 2.0 * (p - 1);
    return steps * alpha + beta * 8.0 * static_cast<double>(k) * (p - 1);
  }
};
// Whether sending k pairs per rank beats the dense all-reduce of n values on p ranks.
[[nodiscard]] inline bool sparse_is_cheaper(std::size_t n, std::size_t k, int p, wire_model const& w = {}) {
  return w.sparse(k, p) < w.dense(n, p);
}

// sum ← the sum over the ranks of every rank's pairs (sum is overwritten). Every rank calls it.
template <class C>
void sparse_all_sum(C& comm, std::span<std::uint32_t const> idx, std::span<float const> val, std::span<float> sum,
                    sparse_scratch& s) {
  TIDE_REQUIRE(idx.size() == val.size(), "sparse_all_sum: ", idx.size(), " indices and ", val.size(), " values");
  TIDE_REQUIRE(idx.size() <= static_cast<std::size_t>(INT32_MAX / 2), "sparse_all_sum: ", idx.size(),
               " pairs; at most 2^30 per rank and call");
  auto const p = static_cast<std::size_t>(comm.size());
  s.mine.resize(2 * idx.size());
  for (std::size_t j = 0; j < idx.size(); ++j) {
    TIDE_REQUIRE(idx[j] < sum.size(), "sparse_all_sum: index ", idx[j], " of a vector of ", sum.size());
    s.mine[2 * j] = static_cast<std::int32_t>(idx[j]);
    s.mine[2 * j + 1] = std::bit_cast<std::int32_t>(val[j]);
  }
  s.counts.assign(p, 0);
  std::int32_t const mine = static_cast<std::int32_t>(s.mine.size());
  comm.all_gather(std::span<std::int32_t const>(&mine, 1), std::span<std::int32_t>(s.counts));
  s.gather_counts.assign(s.counts.begin(), s.counts.end());
  std::size_t total = 0;
  for (std::int32_t c : s.counts) total += static_cast<std::size_t>(c);
  s.all.resize(total);
  comm.all_gatherv(std::span<std::int32_t const>(s.mine), std::span<std::int32_t>(s.all),
                   std::span<index_t const>(s.gather_counts));
  std::fill(sum.begin(), sum.end(), 0.f);
  for (std::size_t j = 0; j + 1 < total; j += 2) {  // rank after rank, pair after pair
    auto const i = static_cast<std::uint32_t>(s.all[j]);
    TIDE_CHECK(i < sum.size(), corrupt, "sparse_all_sum: a rank sent index ", i, " of a vector of ", sum.size(),
               "; the ranks disagree on the sizes");
    sum[i] += std::bit_cast<float>(s.all[j + 1]);
  }
}

}  // namespace tide::compress
