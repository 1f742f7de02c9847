#pragma once
// What an executor run measured (pipeline/executor.hpp, pipeline/ranks.hpp): each stage's
// actions as they ran, its busy time, and the costs the simulator takes from them.

#include <cstddef>
#include <vector>

#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"

namespace tide::pipeline {

// One action as it ran, in seconds from the start of the run.
struct ran_action {
  action a{};
  int piece = 0;
  double start = 0, end = 0;
};

struct stage_times {
  double busy = 0;       // seconds in forward and backward (not waiting)
  double forward = 0;    // of which forward
  double weight = 0;     // of which weight passes (W run apart)
  int forwards = 0, backwards = 0, weights = 0;  // backwards: B and BW
  std::vector<ran_action> timeline;  // in the order it ran them
};

// What one run measured.
struct run_stats {
  double seconds = 0;          // wall time of the step's forward and backward
  double bubble_fraction = 0;  // 1 − Σ busy / (p · seconds)
  // 1 − Σ busy / Σ span, a stage's span from the start of its first action that computed to the
  // end of its last: the idle time inside the stages' own spans, the bubble zero-bubble
  // schedules remove (ZB-H2's is 0 at equal costs), without the stagger between stages' starts
  // and ends that bubble_fraction also counts.
  double span_bubble_fraction = 0;
  std::vector<stage_times> stages;
  // Per-action costs as the simulator takes them (a whole stage's per micro-batch: one chunk's
  // mean times v), from the measured means over every stage; W is 0 when it ran inside B.
  [[nodiscard]] costs measured_costs(int chunks) const {
    double f = 0, b = 0, w = 0;
    int nf = 0, nb = 0, nw = 0;
    for (stage_times const& st : stages) {
      f += st.forward;
      b += st.busy - st.forward - st.weight;
      w += st.weight;
      nf += st.forwards;
      nb += st.backwards;
      nw += st.weights;
    }
    auto const mean = [chunks](double t, int n) { return n > 0 ? t / n * chunks : 0; };
    return {.f = mean(f, nf), .b = mean(b, nb), .w = mean(w, nw), .comm = 0};
  }
  // Per piece (0 .. pieces − 1): its mean F, B (or BW) and W time, for simulate(s, per_piece).
  [[nodiscard]] std::vector<costs> piece_costs(int pieces) const {
    std::vector<costs> out(static_cast<std::size_t>(pieces), costs{.f = 0, .b = 0, .w = 0, .comm = 0});
    std::vector<int> nf(out.size(), 0), nb(out.size(), 0), nw(out.size(), 0);
    for (stage_times const& st : stages)
      for (ran_action const& r : st.timeline) {
        auto const q = static_cast<std::size_t>(r.piece);
        if (q >= out.size()) continue;
        double const t = r.end - r.start;
        if (r.a.kind == op::F) out[q].f += t, ++nf[q];
        else if (r.a.kind == op::W) out[q].w += t, ++nw[q];
        else out[q].b += t, ++nb[q];
      }
    for (std::size_t q = 0; q < out.size(); ++q) {
      if (nf[q] > 0) out[q].f /= nf[q];
      if (nb[q] > 0) out[q].b /= nb[q];
      if (nw[q] > 0) out[q].w /= nw[q];
    }
    return out;
  }
};

}  // namespace tide::pipeline
