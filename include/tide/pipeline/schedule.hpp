#pragma once
// Pipeline schedules as data: each stage's list of actions, in the order that stage runs them.
// The generators are constexpr, so a schedule can be built, simulated (pipeline/simulate.hpp) and
// checked inside a static_assert:
//
//   auto s = tide::pipeline::one_f_one_b(4, 8);                      // p = 4 stages, m = 8 micro-batches
//   static_assert(tide::pipeline::simulate(tide::pipeline::one_f_one_b(4, 8)).makespan == 33);
//   auto g = tide::pipeline::gpipe(stages, micro);                   // run-time values: tide::error if impossible
//   auto z = tide::pipeline::generate<tide::pipeline::kind::zb_h1, 4, 8>();  // static_assert if impossible
// (A schedule holds vectors: it lives inside a constant expression, not in a constexpr variable.)
//
// The actions (PyTorch's pipelining IR has the same letters):
//   F   forward of one micro-batch through one stage (or one chunk of it)
//   B   backward for the input gradient only (zero-bubble schedules split backward in two)
//   W   backward for the weight gradient only, after B of the same micro-batch
//   BW  the whole backward, B then W
// Sends and receives are implied by the dependencies (a forward needs the previous stage's
// forward of the same micro-batch, a backward the next stage's); the simulator charges them a
// communication cost when the two actions run on different stages.
//
// Stages hold chunks of the model: with v chunks per stage the model is cut into p·v pieces.
// Which piece chunk c of stage s is, is the schedule's placement: looped (Megatron's
// interleaving, piece c·p + s) or v_shape (zero bubble's V: chunk 0 on the way down, chunk 1 on
// the way back up, piece s or 2p − 1 − s).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tide/core/error.hpp"

namespace tide::pipeline {

enum class op : std::uint8_t {
  F,   // forward
  B,   // backward, input gradient
  W,   // backward, weight gradient
  BW,  // backward, both
};

constexpr std::string_view to_string(op k) noexcept {
  switch (k) {
    case op::F: return "F";
    case op::B: return "B";
    case op::W: return "W";
    case op::BW: return "BW";
  }
  return "?";
}

struct action {
  op kind = op::F;
  int micro = 0;  // the micro-batch, 0 .. m − 1
  int chunk = 0;  // the stage's chunk, 0 .. v − 1
  friend constexpr bool operator==(action, action) = default;
};

enum class placement : std::uint8_t {
  looped,  // chunk c of stage s is piece c·p + s
  v_shape, // two chunks: chunk 0 is piece s, chunk 1 is 2p − 1 − s
};

struct schedule {
  std::string_view name;
  int stages = 1;  // p
  int micro = 1;   // m
  int chunks = 1;  // v: model chunks per stage
  placement place = placement::looped;
  std::vector<std::vector<action>> per_stage;  // per_stage[s]: what stage s runs, in order

  // The piece (position in the model, 0 .. p·v − 1) of chunk c on stage s.
  [[nodiscard]] constexpr int piece(int s, int c) const noexcept {
    if (place == placement::v_shape) return c == 0 ? s : 2 * stages - 1 - s;
    return c * stages + s;
  }
};

namespace detail {

// Refuses an impossible shape. In a constant expression the throw is the compile error; at run
// time it is a tide::error of category usage that says what to pass.
constexpr void require_shape(std::string_view name, int p, int m) {
  if (p < 1 || m < 1) {
    if (std::is_constant_evaluated()) throw "pipeline schedule: stages and micro-batches must be >= 1";
    TIDE_FAIL(usage, name, ": ", p, " stages and ", m, " micro-batches; pass p >= 1 and m >= 1");
  }
}

constexpr schedule make(std::string_view name, int p, int m) {
  schedule s{.name = name, .stages = p, .micro = m, .chunks = 1, .place = placement::looped, .per_stage = {}};
  s.per_stage.resize(static_cast<std::size_t>(p));
  return s;
}

}  // namespace detail

// GPipe: every forward, then every backward, in micro-batch order. Bubble (p − 1)(F + B + W);
// stage s holds all m micro-batches' activations at once.
constexpr schedule gpipe(int p, int m) {
  detail::require_shape("gpipe", p, m);
  schedule s = detail::make("gpipe", p, m);
  for (auto& list : s.per_stage) {
    for (int k = 0; k < m; ++k) list.push_back({op::F, k, 0});
    for (int k = 0; k < m; ++k) list.push_back({op::BW, k, 0});
  }
  return s;
}

// 1F1B (PipeDream-Flush, DAPPLE): stage s runs min(p − s − 1, m) forwards, then alternates one
// forward and one backward, then the remaining backwards. GPipe's bubble, but at most p − s
// micro-batches in flight on stage s, whatever m.
constexpr schedule one_f_one_b(int p, int m) {
  detail::require_shape("one_f_one_b", p, m);
  schedule s = detail::make("one_f_one_b", p, m);
  for (int st = 0; st < p; ++st) {
    auto& list = s.per_stage[static_cast<std::size_t>(st)];
    int const warm = p - st - 1 < m ? p - st - 1 : m;
    int f = 0, b = 0;
    while (f < warm) list.push_back({op::F, f++, 0});
    while (f < m) {
      list.push_back({op::F, f++, 0});
      list.push_back({op::BW, b++, 0});
    }
    while (b < m) list.push_back({op::BW, b++, 0});
  }
  return s;
}

namespace detail {
// The handcrafted zero-bubble schedules: stage s runs min(warm(s), m) forwards, then for each
// micro-batch k its B, the W of micro-batch k − lag(s) when there is one, and the next forward;
// the remaining W's last.
template <class Warm, class Lag>
constexpr schedule zero_bubble(std::string_view name, int p, int m, Warm warm_of, Lag lag_of) {
  require_shape(name, p, m);
  schedule s = make(name, p, m);
  for (int st = 0; st < p; ++st) {
    auto& list = s.per_stage[static_cast<std::size_t>(st)];
    int const warm = std::min(warm_of(st), m);
    int f = 0, w = 0;
    while (f < warm) list.push_back({op::F, f++, 0});
    for (int k = 0; k < m; ++k) {
      list.push_back({op::B, k, 0});
      if (k >= lag_of(st)) list.push_back({op::W, w++, 0});
      if (f < m) list.push_back({op::F, f++, 0});
    }
    while (w < m) list.push_back({op::W, w++, 0});
  }
  return s;
}
}  // namespace detail

// ZB-H1 (zero bubble, Qi et al. 2024): backward split into B and W. Stage s runs p − s forwards
// and lets W lag s micro-batches behind B, so at most p micro-batches are held, as in 1F1B. With
// F = B = W its bubble is a third of 1F1B's: (p − 1)(F + B − W).
constexpr schedule zb_h1(int p, int m) {
  return detail::zero_bubble("zb_h1", p, m, [p](int st) { return p - st; }, [](int st) { return st; });
}

// ZB-H2: more forwards in the warm-up, 2(p − s) − 1 on stage s, to fill the bubble before the
// first backward, and W lagging 2s behind B to fill the one after the last: with F = B = W each
// stage is busy without a gap for 3m (its span) once m >= 2p, at the cost of 2p − 1 micro-batches
// held on every stage. (The paper also lets the optimizer step begin before every stage is done,
// which hides the stagger of p − 1 across steps; tide's steps end with a flush.)
constexpr schedule zb_h2(int p, int m) {
  return detail::zero_bubble("zb_h2", p, m, [p](int st) { return 2 * (p - st) - 1; }, [](int st) { return 2 * st; });
}

// ZB-V (zero bubble, V-shaped): two chunks per stage placed in a V, chunk 0 of stage s the
// model's s-th piece on the way down, chunk 1 its (2p − 1 − s)-th on the way back up, so stage 0
// holds both the first and the last piece. The order is built step by step, every action one step
// (the stage's work per micro-batch split evenly over the chunks): each stage runs a B whose
// input gradient has arrived (chunk 0 first), else a forward while it holds fewer than 2p chunk
// activations (chunk 1 first: it turns the V), else the W of its oldest B. With F = B = W and
// m >= p the makespan is 3m + (p − 1)/2 for p <= 4 (half ZB-H1's stagger); at larger p this greedy
// order is not the paper's and takes up to (p − 4)/2 steps more at some m (measured for p <= 16,
// m <= 4p + 8; at p = 8 it is exact for m = 32): dualpipe_v below reaches 3m + (p − 1)/2 at every
// such shape. Each stage holds at most p stages of activations, as 1F1B.
constexpr schedule zb_v(int p, int m) {
  detail::require_shape("zb_v", p, m);
  schedule s = detail::make("zb_v", p, m);
  s.chunks = 2;
  s.place = placement::v_shape;
  int const Q = 2 * p;
  auto at = [m](int q, int k) { return static_cast<std::size_t>(q * m + k); };
  // The step each action ran in (−1: not yet); an input made at step t is usable from t + 1.
  std::vector<int> f(static_cast<std::size_t>(Q * m), -1), b(f), w(f);
  std::vector<int> held(static_cast<std::size_t>(p), 0), next_f(static_cast<std::size_t>(Q), 0);
  std::vector<int> next_b(static_cast<std::size_t>(Q), 0);
  int left = 3 * Q * m;
  for (int t = 0; left > 0; ++t) {
    int const before = left;
    for (int st = 0; st < p; ++st) {
      auto& list = s.per_stage[static_cast<std::size_t>(st)];
      int const q_of[2] = {st, Q - 1 - st};  // chunk 0, chunk 1
      auto done_before = [t](int step) { return step >= 0 && step < t; };
      bool acted = false;
      for (int c = 0; c < 2 && !acted; ++c) {  // B: the next micro-batch of a chunk, its input ready
        int const q = q_of[c], k = next_b[static_cast<std::size_t>(q)];
        if (k >= m || !done_before(q == Q - 1 ? f[at(q, k)] : b[at(q + 1, k)])) continue;
        b[at(q, k)] = t, ++next_b[static_cast<std::size_t>(q)];
        list.push_back({op::B, k, c});
        acted = true;
      }
      for (int c = 1; c >= 0 && !acted && held[static_cast<std::size_t>(st)] < 2 * p; --c) {  // F
        int const q = q_of[c], k = next_f[static_cast<std::size_t>(q)];
        if (k >= m || (q > 0 && !done_before(f[at(q - 1, k)]))) continue;
        f[at(q, k)] = t, ++next_f[static_cast<std::size_t>(q)], ++held[static_cast<std::size_t>(st)];
        list.push_back({op::F, k, c});
        acted = true;
      }
      if (!acted) {  // W: of the oldest B
        int best_q = -1, best_k = -1, oldest = t;
        for (int c = 0; c < 2; ++c)
          for (int k = 0; k < m; ++k) {
            int const q = q_of[c];
            if (w[at(q, k)] < 0 && done_before(b[at(q, k)]) && b[at(q, k)] < oldest)
              oldest = b[at(q, k)], best_q = q, best_k = k;
          }
        if (best_q >= 0) {
          w[at(best_q, best_k)] = t, --held[static_cast<std::size_t>(st)];
          list.push_back({op::W, best_k, best_q == st ? 0 : 1});
          acted = true;
        }
      }
      left -= acted ? 1 : 0;
    }
    if (left == before) break;  // nothing ran, so nothing will: cannot happen (the simulator would name it)
  }
  return s;
}

// Interleaved 1F1B (Megatron-LM): v chunks per stage, looped placement (chunk c of stage s is
// piece c·p + s). Stage s runs its m·v chunk-forwards in groups of p micro-batches, chunk
// after chunk, the backwards in the same order with the chunks reversed; a warm-up of
// 2(p − s − 1) + (v − 1)p forwards (all of them when m = p; with v = 1 it is 1F1B), then one
// forward and one backward alternately. The bubble shrinks to (p − 1)(F + B + W)/v; peak
// p + (p − 1)/v stages of activations on stage 0 when m > p. m must be a multiple of p (Megatron asserts it): m % p != 0 is refused.
constexpr schedule interleaved(int p, int m, int v) {
  detail::require_shape("interleaved", p, m);
  if (v < 1 || m % p != 0) {
    if (std::is_constant_evaluated()) throw "interleaved: v >= 1 and m a multiple of p are required";
    TIDE_FAIL(usage, "interleaved: p = ", p, ", m = ", m, ", v = ", v,
              "; pass v >= 1 chunks per stage and m a multiple of p (Megatron's rule: the micro-batches go "
              "through the chunks in groups of p), or use one_f_one_b");
  }
  schedule s = detail::make("interleaved", p, m);
  s.chunks = v;
  int const total = m * v;
  auto chunk_of = [&](int i, bool forward) {
    int const c = (i / p) % v;
    return forward ? c : v - 1 - c;
  };
  auto micro_of = [&](int i) { return (i / (p * v)) * p + i % p; };
  for (int st = 0; st < p; ++st) {
    auto& list = s.per_stage[static_cast<std::size_t>(st)];
    // Megatron's warm-up; with one chunk per stage it is 1F1B's p − s − 1.
    int const warm = v == 1 ? std::min(total, p - st - 1)
                     : m == p ? total
                              : std::min(total, 2 * (p - st - 1) + (v - 1) * p);
    int f = 0, b = 0;
    while (f < warm) list.push_back({op::F, micro_of(f), chunk_of(f, true)}), ++f;
    while (f < total) {
      list.push_back({op::F, micro_of(f), chunk_of(f, true)}), ++f;
      list.push_back({op::BW, micro_of(b), chunk_of(b, false)}), ++b;
    }
    while (b < total) list.push_back({op::BW, micro_of(b), chunk_of(b, false)}), ++b;
  }
  return s;
}

// DualPipeV (DeepSeek's V-shaped cut of DualPipe): the V of zb_v (chunk 0 of stage s is piece s,
// chunk 1 piece 2p − 1 − s), in DualPipe's eight phases per stage s, with each chunk's forwards
// and backwards in micro-batch order:
//   1  2(p − s − 1) forwards of chunk 0
//   2  s + 1 pairs: a forward of chunk 0, a forward of chunk 1
//   3  p − s − 1 times: B of chunk 1, the oldest pending W, a forward of chunk 1
//   4  m − 2p + s + 1 times: F of chunk 0 with BW of chunk 1, then F of chunk 1 with BW of chunk 0
//      (DualPipe overlaps each pair's compute with the other's communication; here they run one
//      after the other)
//   5  p − s − 1 times: BW of chunk 1, then F of chunk 1 with BW of chunk 0
//   6  s + 1 pairs: backward of chunk 1, backward of chunk 0, split into B and W from the middle
//      pair on (the odd stages from its chunk 1, the even ones from its chunk 0)
//   7  p − s − 1 times: the oldest pending W, B of chunk 0
//   8  the remaining W's
// It needs m >= 2p micro-batches (a tide::error otherwise). With F = B = W its makespan is
// 3m + (p − 1)/2, half ZB-H1's stagger, for every p <= 16 and 2p <= m <= 4p + 8 (tests/pipeline:
// never more than zb_v's), and stage 0 holds up to 2p + 1 chunks' activations (p + 1/2 stages).
constexpr schedule dualpipe_v(int p, int m) {
  detail::require_shape("dualpipe_v", p, m);
  if (m < 2 * p) {
    if (std::is_constant_evaluated()) throw "dualpipe_v: m >= 2p micro-batches are required";
    TIDE_FAIL(usage, "dualpipe_v: p = ", p, ", m = ", m, "; DualPipeV needs m >= 2p = ", 2 * p,
              " micro-batches (its warm-up fills both arms of the V): pass more, or use zb_v");
  }
  schedule s = detail::make("dualpipe_v", p, m);
  s.chunks = 2;
  s.place = placement::v_shape;
  for (int st = 0; st < p; ++st) {
    auto& list = s.per_stage[static_cast<std::size_t>(st)];
    int f[2] = {0, 0}, b[2] = {0, 0};
    std::vector<action> pending;  // W's owed, oldest first
    std::size_t next_w = 0;
    auto fwd = [&](int c) { list.push_back({op::F, f[c]++, c}); };
    auto bwd = [&](int c, bool split) {
      if (!split) {
        list.push_back({op::BW, b[c]++, c});
        return;
      }
      list.push_back({op::B, b[c], c});
      pending.push_back({op::W, b[c]++, c});
    };
    auto weight = [&] {
      if (next_w < pending.size()) list.push_back(pending[next_w++]);
    };
    int const down = p - st - 1;
    for (int i = 0; i < 2 * down; ++i) fwd(0);             // 1
    for (int i = 0; i < st + 1; ++i) fwd(0), fwd(1);       // 2
    for (int i = 0; i < down; ++i) bwd(1, true), weight(), fwd(1);  // 3
    for (int i = 0; i < m - 2 * p + st + 1; ++i) {          // 4
      fwd(0), bwd(1, false);
      fwd(1), bwd(0, false);
    }
    for (int i = 0; i < down; ++i) bwd(1, false), fwd(1), bwd(0, false);  // 5
    bool split = false;                                     // 6
    for (int i = 0; i < st + 1; ++i) {
      if (i == (st + 1) / 2 && st % 2 == 1) split = true;
      bwd(1, split);
      if (i == (st + 1) / 2 && st % 2 == 0) split = true;
      bwd(0, split);
    }
    for (int i = 0; i < down; ++i) weight(), bwd(0, true);  // 7
    while (next_w < pending.size()) weight();              // 8
  }
  return s;
}

// Every generator by name, for tools and policies that choose one at run time.
enum class kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zb_v, dualpipe_v };

constexpr std::string_view to_string(kind k) noexcept {
  switch (k) {
    case kind::gpipe: return "gpipe";
    case kind::one_f_one_b: return "one_f_one_b";
    case kind::interleaved: return "interleaved";
    case kind::zb_h1: return "zb_h1";
    case kind::zb_h2: return "zb_h2";
    case kind::zb_v: return "zb_v";
    case kind::dualpipe_v: return "dualpipe_v";
  }
  return "?";
}

// v is the chunks per stage of interleaved; the others take v = 1.
constexpr schedule generate(kind k, int p, int m, int v = 1) {
  if (k != kind::interleaved && v != 1) {
    if (std::is_constant_evaluated()) throw "pipeline schedule: v != 1 is for interleaved only";
    TIDE_FAIL(usage, to_string(k), ": v = ", v, " chunks per stage; only interleaved places several chunks on a "
              "stage: pass v = 1");
  }
  switch (k) {
    case kind::gpipe: return gpipe(p, m);
    case kind::one_f_one_b: return one_f_one_b(p, m);
    case kind::interleaved: return interleaved(p, m, v);
    case kind::zb_h1: return zb_h1(p, m);
    case kind::zb_h2: return zb_h2(p, m);
    case kind::zb_v: return zb_v(p, m);
    case kind::dualpipe_v: return dualpipe_v(p, m);
  }
  return gpipe(p, m);
}

// The shape as template arguments: an impossible one is a compile error that says what to pass.
//   auto s = tide::pipeline::generate<tide::pipeline::kind::interleaved, 4, 8, 2>();
template <kind K, int P, int M, int V = 1>
constexpr schedule generate() {
  static_assert(P >= 1, "tide::pipeline: the number of stages P must be >= 1");
  static_assert(M >= 1, "tide::pipeline: the number of micro-batches M must be >= 1");
  static_assert(V >= 1, "tide::pipeline: the chunks per stage V must be >= 1");
  static_assert(K == kind::interleaved || V == 1, "tide::pipeline: V > 1 chunks per stage is for interleaved only");
  static_assert(K != kind::interleaved || M % P == 0,
                "tide::pipeline::interleaved: the micro-batches M must be a multiple of the stages P (Megatron's "
                "rule); use one_f_one_b otherwise");
  static_assert(K != kind::dualpipe_v || M >= 2 * P,
                "tide::pipeline::dualpipe_v: DualPipeV needs M >= 2P micro-batches; pass more, or use zb_v");
  return generate(K, P, M, V);
}

}  // namespace tide::pipeline
