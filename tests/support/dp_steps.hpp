#pragma once
// What the data-parallel tests on real ranks share: the tiny GPT's chunked offload just above its
// minimum (chunks move every step), and comparisons of flat parameter vectors across runs and ranks.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "support/gpt_steps.hpp"
#include "support/mpi_world.hpp"
#include "tide/offload/schedulers.hpp"

namespace tide::test {

// chunked<belady>, 20 KiB chunks, a budget 16 KiB above the minimum of a tiny_gpt step.
inline offload::chunked<offload::belady> tiny_tight() {
  offload::chunked<offload::belady> c{.chunk_bytes = std::size_t{20} << 10};
  c.device_budget = scheduler_minimum<decltype(c), float>(tiny_gpt, c, tiny_batch, tiny_seq) + (std::size_t{16} << 10);
  return c;
}

inline float max_difference(std::vector<float> const& a, std::vector<float> const& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// Whether every rank of the test's world holds these bits.
inline bool same_on_every_rank(std::vector<float> const& v) {
  std::vector<float> lo = v, hi = v;
  world().all_reduce(std::span<float>(lo), comm::reduce_op::min);
  world().all_reduce(std::span<float>(hi), comm::reduce_op::max);
  return std::memcmp(lo.data(), hi.data(), lo.size() * sizeof(float)) == 0;
}

}  // namespace tide::test
