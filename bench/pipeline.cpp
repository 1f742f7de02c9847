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
//                         V reaches for p <= 8 (at p = 16 it takes 2 steps more: a ratio above 1);
//                         the paper's is 0 with the optimizer overlapping steps
//
// A ratio of 1 says the generator is the schedule of the paper. The executor's measured
// efficiency is not here yet (no executor).

#include <algorithm>
#include <string>

#include "harness.hpp"
#include "tide/pipeline/simulate.hpp"

int main() {
  namespace pp = tide::pipeline;
  struct shape {
    int p, m;
  };
  for (shape const s : {shape{4, 8}, shape{8, 32}, shape{16, 48}})
    for (pp::kind k : {pp::kind::gpipe, pp::kind::one_f_one_b, pp::kind::interleaved, pp::kind::zb_h1,
                       pp::kind::zb_h2, pp::kind::zb_v}) {
      int const v = k == pp::kind::interleaved ? 2 : 1;
      auto const r = pp::check(pp::generate(k, s.p, s.m, v));
      double const p = s.p, m = s.m;
      double const closed = k == pp::kind::gpipe || k == pp::kind::one_f_one_b ? (p - 1) / (m + p - 1)
                            : k == pp::kind::interleaved                     ? (p - 1) / (v * m + p - 1)
                            : k == pp::kind::zb_v                            ? (p - 1) / 2 / (3 * m + (p - 1) / 2)
                                                                             : (p - 1) / (3 * m + p - 1);
      double peak = 0, span = 0;
      for (auto const& st : r.stages) peak = std::max(peak, st.peak_activations), span = std::max(span, st.span());
      tide::bench::figure{.bench = "pipeline",
                          .name = "bubble_" + std::string(pp::to_string(k)) + "_p" + std::to_string(s.p) + "_m" +
                                  std::to_string(s.m),
                          .value = r.bubble_fraction,
                          .unit = "fraction",
                          .anchor = k == pp::kind::zb_h2 ? "(p - 1) / (3m + p - 1): the stagger; each stage's own bubble is 0"
                                    : k == pp::kind::zb_v ? "((p - 1) / 2) / (3m + (p - 1) / 2): half ZB-H1's stagger"
                                                          : "the closed form of the schedule's paper",
                          .anchor_value = closed,
                          .higher_is_better = false,
                          .goal = 1.0,
                          .detail = {{"stages", p},
                                     {"micro", m},
                                     {"chunks", v},
                                     {"makespan", r.makespan},
                                     {"peak_activations", peak},
                                     {"span_bubble", 1 - 3 * m / span}}}
          .print();
    }
  return 0;
}
