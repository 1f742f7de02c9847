// bench/planner: lifetime_planner on the activations and activation gradients of one GPT-2 124M
// training step (fp32, llm.c-style explicit forward and backward), one figure per sequence
// length: footprint / peak live bytes (1.0 is the lower bound; goal <= 1.2).
//
// The op list follows llm.c's train_gpt2.c. Forward activations live until their last use in
// backward; gradients of activations live from the op that writes them to the op that consumes
// them. Parameters, parameter gradients and optimizer state are not activations: not planned.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <tide/memory/lifetime_planner.hpp>

#include "harness.hpp"

namespace {

using tide::memory::op_index;

struct gpt2_shape {
  std::size_t L = 12, C = 768, NH = 12, V = 50257, B = 4;
};

struct activation {
  std::string name;
  std::size_t bytes;
  op_index first_use, last_use;
};

// "l7." (built by append: g++ 12 -O3 warns falsely on "l" + std::to_string(l)).
std::string layer_prefix(std::size_t l) {
  std::string p("l");
  p.append(std::to_string(l)).append(".");
  return p;
}

// The activation tensors of one training step at sequence length T, in the order llm.c runs
// its ops. `op` counts kernels; each tensor records the first op that writes it and the last
// op that reads it.
std::vector<activation> gpt2_step(gpt2_shape const& g, std::size_t T) {
  std::size_t const L = g.L, C = g.C, NH = g.NH, V = g.V, B = g.B;
  std::size_t const f32 = 4;
  std::size_t const btc = B * T * C * f32;       // (B, T, C)
  std::size_t const bt = B * T * f32;            // (B, T)
  std::size_t const btt = B * NH * T * T * f32;  // (B, NH, T, T)
  std::size_t const btv = B * T * V * f32;       // (B, T, V)

  // The ops, numbered in execution order: forward, then backward.
  op_index op = 0;
  op_index const encoder = op++;
  struct layer_ops {
    op_index ln1, qkv, scores, softmax, values, attproj, res2, ln2, fc, gelu, fcproj, res3;
  };
  std::vector<layer_ops> fwd(L);
  for (auto& f : fwd) f = {op++, op++, op++, op++, op++, op++, op++, op++, op++, op++, op++, op++};
  op_index const lnf = op++, head = op++, softmax = op++, loss = op++;
  op_index const loss_bwd = op++, head_bwd = op++, lnf_bwd = op++;
  struct layer_bwd_ops {
    op_index res3, fcproj, gelu, fc, ln2, res2, attproj, values, softmax, scores, qkv, ln1;
  };
  std::vector<layer_bwd_ops> bwd(L);
  for (std::size_t l = L; l-- > 0;)
    bwd[l] = {op++, op++, op++, op++, op++, op++, op++, op++, op++, op++, op++, op++};
  op_index const encoder_bwd = op++;

  std::vector<activation> t;
  auto add = [&t](std::string name, std::size_t bytes, op_index first, op_index last) {
    t.push_back({std::move(name), bytes, first, last});
  };
  // Forward activations.
  add("encoded", btc, encoder, bwd[0].ln1);  // (B, T, C): layer 0's residual input
  for (std::size_t l = 0; l < L; ++l) {
    auto const& f = fwd[l];
    auto const& b = bwd[l];
    std::string const p = layer_prefix(l);
    add(p + "ln1", btc, f.ln1, b.qkv);              // (B, T, C): read by d(W_qkv)
    add(p + "ln1_mean", bt, f.ln1, b.ln1);          // (B, T)
    add(p + "ln1_rstd", bt, f.ln1, b.ln1);          // (B, T)
    add(p + "qkv", 3 * btc, f.qkv, b.scores);       // (B, T, 3C): q, k read by dscores, v by dvalues
    add(p + "preatt", btt, f.scores, f.softmax);    // (B, NH, T, T): dead after the softmax
    add(p + "att", btt, f.softmax, b.softmax);      // (B, NH, T, T)
    add(p + "atty", btc, f.values, b.attproj);      // (B, T, C)
    add(p + "attproj", btc, f.attproj, f.res2);     // (B, T, C): residual add needs no input
    add(p + "residual2", btc, f.res2, b.ln2);       // (B, T, C)
    add(p + "ln2", btc, f.ln2, b.fc);               // (B, T, C)
    add(p + "ln2_mean", bt, f.ln2, b.ln2);          // (B, T)
    add(p + "ln2_rstd", bt, f.ln2, b.ln2);          // (B, T)
    add(p + "fch", 4 * btc, f.fc, b.gelu);          // (B, T, 4C)
    add(p + "fch_gelu", 4 * btc, f.gelu, b.fcproj); // (B, T, 4C)
    add(p + "fcproj", btc, f.fcproj, f.res3);       // (B, T, C)
    // (B, T, C): the next layer's residual input, read by its ln1 backward; the last one by lnf's.
    add(p + "residual3", btc, f.res3, l + 1 < L ? bwd[l + 1].ln1 : lnf_bwd);
  }
  add("lnf", btc, lnf, head_bwd);      // (B, T, C)
  add("lnf_mean", bt, lnf, lnf_bwd);   // (B, T)
  add("lnf_rstd", bt, lnf, lnf_bwd);   // (B, T)
  add("logits", btv, head, softmax);   // (B, T, V)
  add("probs", btv, softmax, loss_bwd);  // (B, T, V)
  add("losses", bt, loss, loss_bwd);   // (B, T)

  // Gradients of activations: short-lived, from the op that writes them to the one that reads.
  add("dlogits", btv, loss_bwd, head_bwd);   // (B, T, V)
  add("dlnf", btc, head_bwd, lnf_bwd);       // (B, T, C)
  add(layer_prefix(L - 1) + "dresidual3", btc, lnf_bwd, bwd[L - 1].res3);  // (B, T, C)
  for (std::size_t l = L; l-- > 0;) {
    auto const& b = bwd[l];
    std::string const p = layer_prefix(l);
    add(p + "dresidual2", btc, b.res3, b.res2);       // (B, T, C): += by ln2 backward
    add(p + "dfcproj", btc, b.res3, b.fcproj);        // (B, T, C)
    add(p + "dfch_gelu", 4 * btc, b.fcproj, b.gelu);  // (B, T, 4C)
    add(p + "dfch", 4 * btc, b.gelu, b.fc);           // (B, T, 4C)
    add(p + "dln2", btc, b.fc, b.ln2);                // (B, T, C)
    add(p + "dattproj", btc, b.res2, b.attproj);      // (B, T, C)
    add(p + "datty", btc, b.attproj, b.values);       // (B, T, C)
    add(p + "datt", btt, b.values, b.softmax);        // (B, NH, T, T)
    add(p + "dpreatt", btt, b.softmax, b.scores);     // (B, NH, T, T)
    add(p + "dqkv", 3 * btc, b.values, b.qkv);        // (B, T, 3C): v part first, then q, k
    add(p + "dln1", btc, b.qkv, b.ln1);               // (B, T, C)
    // (B, T, C): the layer's input gradient, += by ln1 backward, then the previous layer's dresidual3.
    add(p + "dresidual", btc, b.res2, l > 0 ? bwd[l - 1].res3 : encoder_bwd);
  }
  return t;
}

// Loads a step's tensors into the planner; returns their sizes, by id, for `replan`.
std::vector<std::size_t> load(tide::memory::lifetime_planner& planner, std::vector<activation> const& step) {
  planner.clear();
  std::vector<std::size_t> sizes;
  for (auto const& a : step) {
    planner.add(a.name, a.bytes, a.first_use, a.last_use);
    sizes.push_back(a.bytes);
  }
  return sizes;
}

// Median seconds of one `replan` of the loaded tensors.
double replan_seconds(tide::memory::lifetime_planner& planner, std::vector<std::size_t> const& sizes) {
  int const reps = tide::bench::quick() ? 5 : 201;
  return tide::bench::median_seconds([&] { tide::bench::keep(planner.replan(sizes).footprint()); }, reps, 3);
}

}  // namespace

int main() {
  gpt2_shape const g;
  tide::memory::lifetime_planner planner;
  for (std::size_t const T : {std::size_t{64}, std::size_t{256}, std::size_t{1024}}) {
    // The goal for planning time is stated for about 100 tensors: a 3-layer model.
    auto const small = gpt2_step(gpt2_shape{.L = 3}, T);
    double const replan_small_s = replan_seconds(planner, load(planner, small));

    auto const step = gpt2_step(g, T);
    auto const sizes = load(planner, step);
    std::size_t total = 0;
    for (std::size_t b : sizes) total += b;
    auto const plan = planner.plan();
    tide::memory::check(plan);
    double const footprint = static_cast<double>(plan.footprint());
    double const peak = static_cast<double>(plan.peak_live());
    double const replan_s = replan_seconds(planner, sizes);
    tide::bench::figure{
        .bench = "planner",
        .name = "planner_footprint_vs_peak_live_t" + std::to_string(T),
        .value = footprint / peak,
        .unit = "ratio",
        .anchor = "ideal_footprint_equals_peak_live",
        .anchor_value = 1.0,
        .higher_is_better = false,
        .goal = 1.2,
        .detail = {{"T", static_cast<double>(T)},
                   {"tensors", static_cast<double>(step.size())},
                   {"footprint_mib", footprint / (1 << 20)},
                   {"peak_live_mib", peak / (1 << 20)},
                   {"sum_of_tensors_mib", static_cast<double>(total) / (1 << 20)},
                   {"replan_us", replan_s * 1e6},
                   {"tensors_3_layers", static_cast<double>(small.size())},
                   {"replan_us_3_layers", replan_small_s * 1e6}},
    }
        .print();
  }
}
