// bench/offload: training a GPT whose model data is 4x the device budget, on the host backend
// (the "device" is an arena of host memory; copies are memcpy on the copy stream's thread).
//
//   offload_4x_vs_resident    tokens/s of chunked<belady> at budget = model data / 4 (model data =
//                             parameters + gradients + Adam m and v = 16 B/param), over the same
//                             model and data under `resident` with an unlimited budget; both
//                             trained in this run, their measured steps interleaved. Goal 0.9.
//                             detail: the offloaded run's offload_stats of a steady step.
//   undo_on_error_vs_off      tokens/s of that chunked<belady> run (undo copies on, the default)
//                             over the same run with scheduler_options::undo_on_error = false,
//                             steps interleaved. Goal 0.95. Host steps keep the values before
//                             them by swapping blocks (AdamW reads the chunk's and writes the
//                             journal's: optim::out_of_place); detail.fold_*: the same run with an
//                             AdamW that writes the copies in its own pass instead (keeps_prev,
//                             as device steps do); detail.copy_pass_*: with one that does neither,
//                             so the engine copies in a pass of its own first; steps interleaved.
//   offload_bytes_vs_offline_optimum  the bytes a steady step copies (h2d + d2h; a clean parameter
//                             chunk leaves the device without a copy) over a lower bound on the
//                             offline optimum for the run's own recorded trace (offline_optimum:
//                             min-cost flow, clean drops free, a dirty eviction a write; shares no
//                             code with the policies), 64 copies of the step, capacity = the least
//                             per-moment chunk budget / chunk bytes. Goal <= 1.05. detail: the upper
//                             bound (the flow's schedule at its true cost), the gap, the bounds at
//                             each moment's own budget, and belady (MIN), lru, fifo simulated on
//                             the same trace (every eviction a copy there).
//   max_model_vs_zero_offload_<d>gib  the largest GPT-2-family model (B=1, T=1024, heads = C/64,
//                             V=50257) chunked<belady> trains over the largest static_partition
//                             (ZeRO-Offload's placement) trains, at device budgets of 1, 2 and 4 GiB
//                             and a host capacity R = 0.8 (MemAvailable - D) (scheduler_options::
//                             host_capacity), both found by training 2 steps with the library's
//                             defaults, every block recomputed and its output offloaded; one layer
//                             more must fail on each side with the budget error (detail.*_next_*).
//                             The formula's depth is the search's start (detail.formula_*). Goal 2.5.
//   max_model_vs_capacity_<d>gib  tide's trained parameters over (D + R) / 24 B: how close it
//                             gets to the machine's bound for this configuration. Goal 0.9.
//                             detail.chunked_nvme_*: the NVMe tier's largest (computed; trained at
//                             the largest budget when TIDE_BENCH_TRAIN_NVME=1: detail.trained_nvme_*).
//   throughput_vs_zero_offload_at_its_max_<d>gib  tokens/s of chunked<belady> over static_partition's,
//                             both on static_partition's largest model, same budgets. Goal 1.2.
//                             The three take about 30 minutes: every trial is a model of up to a
//                             billion parameters trained for 2 steps.
//   recompute_overhead        tokens/s with every block recomputed over every activation kept,
//                             resident, steps interleaved. Goal 0.7.
//   activation_offload_vs_resident  tokens/s with every block's saved activations offloaded to the
//                             host (and fetched back one block ahead) over all kept. Goal 0.85.
//   wte_pieces_vs_whole       tokens/s with wte in 4 row pieces (gpt_config::wte_pieces) over wte
//                             whole, resident, steps interleaved. Goal 0.95.
//   grad_slot_reuse_bytes_per_param  a bf16 model's peak model data per parameter under
//                             chunked<belady> with the optimizer deferred to step() (as clipping
//                             runs it), with reuse_grad_slots over without, both without host
//                             copies of device-resident parameter chunks (with them: detail),
//                             same budget, steps interleaved. Goal 14/16 (PatrickStar: 14 vs 16).
//
// Activation bytes come from nn::gpt's own lifetime plan, without allocating parameters (see
// activation_model). The device minimum of a shape is the schedulers' own minimum_device_bytes
// where the scheduler can be built (it allocates 12 B/param of host chunks), and the same
// formula on the same layout (chunk::search_chunk_size) for larger shapes; every shape where
// both exist is cross-checked (detail.minimum_cross_checks, minimum_mismatches must be 0).
//
// TIDE_BENCH_SVG=path: the memory tide of a steady step of the offloaded run goes there.
// TIDE_BENCH_ENGINE_ONLY=1: offload_4x_vs_resident and undo_on_error_vs_off only (the engine's
// speed, about a minute; scripts/bench-engine-ab compares two commits' engines with it).
// TIDE_BENCH_MAX_MODEL_ONLY=1: the max_model and throughput_vs_zero_offload figures only (the
// half hour of (c)).
// TIDE_BENCH_QUICK=1 (the smoke test): tiny shapes, one budget, seconds.

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <tide/chunk/layout.hpp>
#include <tide/core/bytes.hpp>
#include <tide/core/error.hpp>
#include <tide/core/exec.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/lifetime_planner.hpp>
#include <tide/memory/pinned_pool.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/offload/offline_optimum.hpp>
#include <tide/offload/report.hpp>
#include <tide/offload/scheduler.hpp>
#include <tide/offload/simulate.hpp>

#include "harness.hpp"
#include "roofline.hpp"

namespace {

using namespace tide::literals;
using tide::host;
using tide::index_t;
namespace off = tide::offload;
using text_fields = std::vector<std::pair<std::string, std::string>>;

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// figure::print with text fields added to detail (harness details are numbers only).
void print_figure(tide::bench::figure const& f, text_fields const& text) {
  using tide::bench::json_escape;
  using tide::bench::json_number;
  std::ostringstream os;
  os << R"({"bench":")" << json_escape(f.bench) << R"(","figure":")" << json_escape(f.name) << R"(","value":)"
     << json_number(f.value) << R"(,"unit":")" << json_escape(f.unit) << R"(","anchor":")" << json_escape(f.anchor)
     << R"(","anchor_value":)" << json_number(f.anchor_value) << R"(,"ratio":)" << json_number(f.ratio())
     << R"(,"higher_is_better":)" << (f.higher_is_better ? "true" : "false") << R"(,"goal":)" << json_number(f.goal)
     << R"(,"machine":)" << tide::bench::machine_json() << R"(,"detail":{)";
  bool first = true;
  for (auto const& [k, v] : f.detail) {
    os << (first ? "" : ",") << '"' << json_escape(k) << "\":" << json_number(v);
    first = false;
  }
  for (auto const& [k, v] : text) {
    os << (first ? "" : ",") << '"' << json_escape(k) << "\":\"" << json_escape(v) << '"';
    first = false;
  }
  os << "}}\n";
  std::fputs(os.str().c_str(), stdout);
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double one = -1;
  in >> one;
  return one;
}

// This process's resident bytes (/proc/self/statm).
std::size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// The machine's MemAvailable, after this process gave back the heap the figures before it freed
// (glibc keeps freed memory below its mmap threshold, which the large blocks raise).
std::size_t mem_available_bytes() {
  ::malloc_trim(0);
  double const kb = tide::bench::meminfo("MemAvailable");
  TIDE_CHECK(kb >= 0, io, "bench_offload: no MemAvailable in /proc/meminfo");
  return static_cast<std::size_t>(kb) * 1024;
}

// ---- activation bytes without a model ---------------------------------------------------------

// nn::gpt's activations of L layers, planned for any (B, T, C, NH, Vp) and element size without
// allocating parameters. The tensors and their lifetimes depend on L and the options only; a
// probe model (C = 8, NH = 2, Vp = 128, the trainers' options) run on one token gives every
// tensor's kind by its bytes, and a copy of its planner replans with the real sizes: the same
// planner, the same footprint as the real model. The (Vp, C) tied gradient (vpc) exists only
// with gpt_options::separate_tied_grad or in_flight > 1; the trainers here use neither. The
// kernels' scratch tensors (named *scratch) are sized by the kernels' own queries
// (nn::gpt_scratch_of) for the trainers' pool.
class activation_model {
 public:
  explicit activation_model(int layers, tide::nn::gpt_options const& options = {}) : offloaded_(options.offload_activations) {
    tide::thread_pool pool{1};
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
    tide::nn::gpt<host> probe{{.layers = layers, .heads = 2, .channels = 8, .vocab = 1, .max_seq = 1}, arena, options};
    std::int32_t const token = 0;
    probe.forward(ex, tide::tensor_view<std::int32_t const, host>(&token, {1, 1}));
    planner_ = probe.activation_planner();
    for (std::uint32_t i = 0; i < planner_.size(); ++i) {
      std::string_view const name = planner_.name({i});
      if (name.ends_with("scratch")) {
        kinds_.push_back(name == "head.scratch"             ? kind::ws_head
                         : name == "encoder.dscratch"       ? kind::ws_encoder
                         : name.ends_with(".dscratch")      ? kind::ws_backward
                                                            : kind::ws_forward);
        continue;
      }
      std::size_t const b = planner_.bytes({i});
      kind const k = b == 32 ? kind::btc : b == 4 ? kind::bt : b == 96 ? kind::bt3c : b == 128 ? kind::bt4c
                   : b == 8 ? kind::bnht : b == 512 ? kind::btvp : b == 4096 ? kind::vpc : kind::unknown;
      TIDE_CHECK(k != kind::unknown, internal, "activation_model: tensor \"", planner_.name({i}), "\" has ", b,
                 " bytes in the probe; nn::gpt gained an activation kind this bench does not know");
      kinds_.push_back(k);
    }
  }

  // Bytes of the one activation buffer, rounded to the arena's 256 B (what the scheduler sees as
  // non-model data). element_bytes: of T (4 fp32, 2 fp16); statistics stay fp32.
  std::size_t footprint(index_t B, index_t T, tide::nn::gpt_config const& c, std::size_t element_bytes) {
    auto const key = std::tuple{B, T, c.channels, c.heads, tide::nn::padded_vocab_of(c), element_bytes};
    if (auto const it = memo_.find(key); it != memo_.end()) return it->second;
    return memo_[key] = plan(B, T, c, element_bytes);
  }
  // Host bytes of the offloaded activations, for the recompute + offload model only (each
  // offloaded block sends its output, (B, T, C), rounded to the alignment).
  [[nodiscard]] std::size_t host_bytes(index_t B, index_t T, tide::nn::gpt_config const& c,
                                       std::size_t element_bytes) const {
    return offloaded_.size() * tide::round_up(static_cast<std::size_t>(B * T * c.channels) * element_bytes, 256);
  }

 private:
  std::size_t plan(index_t B, index_t T, tide::nn::gpt_config const& c, std::size_t element_bytes) {
    tide::exec<host> const ex{pool_};
    tide::nn::gpt_scratch const ws = element_bytes == 4 ? tide::nn::gpt_scratch_of<float>(ex, c, B, T)
                                                        : tide::nn::gpt_scratch_of<tide::bf16>(ex, c, B, T);
    auto const C = static_cast<std::size_t>(c.channels), bt = static_cast<std::size_t>(B * T);
    auto const Vp = static_cast<std::size_t>(tide::nn::padded_vocab_of(c));
    sizes_.resize(kinds_.size());
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      switch (kinds_[i]) {
        case kind::btc: sizes_[i] = bt * C * element_bytes; break;
        case kind::bt: sizes_[i] = bt * 4; break;
        case kind::bt3c: sizes_[i] = 3 * bt * C * element_bytes; break;
        case kind::bt4c: sizes_[i] = 4 * bt * C * element_bytes; break;
        case kind::bnht: sizes_[i] = static_cast<std::size_t>(B * c.heads * T) * 4; break;
        case kind::btvp: sizes_[i] = bt * Vp * element_bytes; break;
        case kind::vpc: sizes_[i] = Vp * C * element_bytes; break;  // the tied gradient, whatever B and T
        case kind::ws_forward: sizes_[i] = std::max<std::size_t>(ws.block_forward, 1); break;
        case kind::ws_backward: sizes_[i] = std::max<std::size_t>(ws.block_backward, 1); break;
        case kind::ws_head: sizes_[i] = std::max<std::size_t>(ws.head, 1); break;
        case kind::ws_encoder: sizes_[i] = std::max<std::size_t>(ws.encoder_backward, 1); break;
        case kind::unknown: break;
      }
    }
    return tide::round_up(planner_.replan(sizes_).footprint(), 256);
  }

  enum class kind : std::uint8_t { btc, bt, bt3c, bt4c, bnht, btvp, vpc, ws_forward, ws_backward, ws_head, ws_encoder,
                                   unknown };
  tide::thread_pool pool_{tide::bench::probe_threads};  // the trainers' pool size: the host kernels' scratch follows it
  tide::nn::block_set offloaded_;
  tide::memory::lifetime_planner planner_;
  std::vector<kind> kinds_;
  std::vector<std::size_t> sizes_;
  std::map<std::tuple<index_t, index_t, int, int, index_t, std::size_t>, std::size_t> memo_;
};

activation_model& activations_of(int layers) {
  static std::map<int, std::unique_ptr<activation_model>> cache;
  auto& slot = cache[layers];
  if (!slot) slot = std::make_unique<activation_model>(layers);
  return *slot;
}

// Every block recomputed, every block's output (and the embeddings') offloaded: the least
// activation memory nn::gpt plans.
tide::nn::gpt_options lean_options(int layers) {
  return {.recompute = tide::nn::block_set::all(layers),
          .offload_activations = tide::nn::block_set::range(tide::nn::embedding_block, layers - 1)};
}

activation_model& lean_activations_of(int layers) {
  static std::map<int, std::unique_ptr<activation_model>> cache;
  auto& slot = cache[layers];
  if (!slot) slot = std::make_unique<activation_model>(layers, lean_options(layers));
  return *slot;
}

// ---- training -------------------------------------------------------------------------------

struct shape {
  tide::nn::gpt_config config;
  index_t B, T;
};

// Step s's tokens then targets (B, T) each: a fixed random stream, the same for every run.
std::vector<std::int32_t> batch_of(shape const& s, int step) {
  auto const n = static_cast<std::size_t>(s.B * s.T);
  std::vector<std::int32_t> v(2 * n);
  std::uint64_t state = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(step) * 0x2545f4914f6cdd1dull;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // Knuth's MMIX LCG
    return static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(s.config.vocab));
  };
  std::int32_t token = next();
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = token;
    token = next();
    v[n + i] = token;  // the next token of the stream
  }
  return v;
}

// AdamW without keeps_prev and out_of_place: the engine takes the undo copies in a pass of its
// own before each update, as it does for any optimizer that does neither (the anchor of the fold).
struct adamw_copy_pass : tide::optim::adamw {
  static constexpr bool keeps_prev = false;
  static constexpr bool out_of_place = false;
};
// AdamW without out_of_place: the undo copies are written in the update's own pass (the fold, as
// for a device step), not kept by swapping blocks.
struct adamw_fold : tide::optim::adamw {
  static constexpr bool out_of_place = false;
};

template <class Config, class T = float, class Opt = tide::optim::adamw>
struct trainer {
  using sched_t = off::scheduler<host, T, Config, Opt>;
  tide::memory::device_arena<host> arena;
  sched_t sched;
  tide::nn::gpt<host, T, off::hooks<sched_t>> model;
  std::vector<double> seconds;
  std::vector<off::offload_stats> stats;
  std::vector<off::tide_sample> last_tide;

  trainer(tide::exec<host> const& ex, tide::nn::gpt_config const& c, std::size_t budget, Config const& cfg,
          bool undo = true, tide::nn::gpt_options options = {}, off::scheduler_options so = {})
      : arena{{.budget = budget}},
        sched{ex, arena, tide::nn::gpt_parameters(c, tide::dtype_of<T>), tide::nn::gpt_block_uses(c), cfg,
              with_undo(so, undo), optimizer()},
        model{c, arena, with_seed(std::move(options)), {&sched}} {}

  static Opt optimizer() {
    tide::optim::adamw const o{.lr = 1e-4f, .weight_decay = 0.1f};
    if constexpr (std::is_same_v<Opt, tide::optim::adamw>) return o;
    else return Opt{o};
  }
  static off::scheduler_options with_undo(off::scheduler_options o, bool undo) {
    o.undo_on_error = undo;
    return o;
  }
  static tide::nn::gpt_options with_seed(tide::nn::gpt_options o) {
    o.seed = 1;
    return o;
  }

  float step(tide::exec<host> const& ex, shape const& s, int k) {
    auto const data = batch_of(s, k);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {s.B, s.T}), y(data.data() + s.B * s.T, {s.B, s.T});
    auto const t0 = std::chrono::steady_clock::now();
    float const loss = model.forward(ex, x, y);
    model.backward(ex);
    sched.step();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    stats.push_back(sched.last_step());
    auto const t = sched.memory_tide();
    last_tide.assign(t.begin(), t.end());
    return loss;
  }
};

// ---- the minimum of a shape -----------------------------------------------------------------

// scheduler::minimum_device_bytes on the layout the scheduler would search, without building
// it. chunked: non-model + the working set (2 k chunks: parameters and gradients of the block
// touching the most chunks, k). static_partition: non-model + every parameter chunk (n) + the
// gradient chunks of one block (k).
struct layout_facts {
  std::size_t chunk_bytes = 0, chunks = 0, k = 0;
};

std::optional<layout_facts> search_layout(tide::nn::gpt_config const& c, std::size_t budget) {
  auto const params = tide::nn::gpt_parameters(c, tide::dtype::f32);
  auto const uses = tide::nn::gpt_block_uses(c);
  tide::chunk::chunk_layout layout;
  try {
    layout = tide::chunk::search_chunk_size(
                 params, {.element_bytes = sizeof(float), .two_chunk_budget = budget / 4, .alignment_elements = 64})
                 .layout;
  } catch (tide::error const& e) {
    if (e.category() == tide::errc::budget) return std::nullopt;  // the largest tensor's chunk breaks budget / 4
    throw;
  }
  layout_facts f{tide::round_up(layout.chunk_elements * sizeof(float), 256), layout.chunks(), 0};
  for (int b = uses.first_block; b <= uses.last_block(); ++b) {
    std::vector<std::uint32_t> ids;
    for (std::uint32_t i : uses.of(b)) ids.push_back(layout.chunk_of[i]);
    std::ranges::sort(ids);
    f.k = std::max<std::size_t>(f.k, static_cast<std::size_t>(std::unique(ids.begin(), ids.end()) - ids.begin()));
  }
  return f;
}

// search_layout, remembered: chunked and static_partition search the same layout.
std::optional<layout_facts> layout_of(tide::nn::gpt_config const& c, std::size_t budget) {
  static std::map<std::tuple<int, int, int, std::size_t>, std::optional<layout_facts>> memo;
  auto const key = std::tuple{c.layers, c.channels, c.vocab, budget};
  auto const it = memo.find(key);
  if (it != memo.end()) return it->second;
  return memo[key] = search_layout(c, budget);
}

enum class which : std::uint8_t { chunked, fixed };  // chunked<belady>, static_partition

std::size_t minimum_of(which w, layout_facts const& f, std::size_t non_model) {
  return w == which::chunked ? non_model + 2 * f.k * f.chunk_bytes
                             : non_model + f.chunks * f.chunk_bytes + f.k * f.chunk_bytes;
}

struct cross_check {
  int checks = 0, mismatches = 0;
};

// The schedulers' own minimum for a shape small enough to build, against minimum_of.
void check_minimum(cross_check& cc, tide::nn::gpt_config const& c, std::size_t budget, std::size_t non_model) {
  auto const f = layout_of(c, budget);
  if (!f) return;
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = budget}};
  auto const params = tide::nn::gpt_parameters(c, tide::dtype::f32);
  auto const uses = tide::nn::gpt_block_uses(c);
  {
    off::scheduler<host, float, off::chunked<off::belady>> s{ex, arena, params, uses};
    ++cc.checks;
    if (s.minimum_device_bytes(non_model) != minimum_of(which::chunked, *f, non_model)) ++cc.mismatches;
  }
  {
    off::scheduler<host, float, off::static_partition> s{ex, arena, params, uses};
    ++cc.checks;
    if (s.minimum_device_bytes(non_model) != minimum_of(which::fixed, *f, non_model)) ++cc.mismatches;
  }
}

// ---- the largest model ------------------------------------------------------------------------

tide::nn::gpt_config gpt2_family(int layers, int channels) {
  return {.layers = layers, .heads = channels / 64, .channels = channels, .vocab = 50257, .max_seq = 1024};
}

struct best_model {
  double params = 0;
  int layers = 0, channels = 0;
  double activation_bytes = 0, device_bytes = 0, host_bytes = 0, chunk_bytes = 0;
};

// Largest parameter count over the channel grid; per C, the deepest L <= max_layers that passes
// `fits`: a binary search on the activation bound (monotone in L), then on the full test.
template <class Fits>
best_model largest(std::span<int const> channels, std::size_t device, std::size_t element_bytes, int max_layers,
                   Fits&& fits, bool lean = false) {
  best_model best;
  for (int C : channels) {
    auto const act = [&](int L) {
      return (lean ? lean_activations_of(L) : activations_of(L)).footprint(1, 1024, gpt2_family(L, C), element_bytes);
    };
    auto const try_fit = [&](int L, best_model& m) {
      if (!fits(gpt2_family(L, C), act(L), m)) return false;
      m.params = static_cast<double>(tide::nn::parameter_count(gpt2_family(L, C)));
      m.layers = L;
      m.channels = C;
      m.activation_bytes = static_cast<double>(act(L));
      return true;
    };
    if (act(1) >= device) continue;
    int lo = 1, hi = 2;  // the activation bound: act(lo) < device <= act(hi), or hi = max_layers
    while (hi < max_layers && act(hi) < device) hi *= 2;
    hi = std::min(hi, max_layers);
    while (hi - lo > 1) {
      int const mid = (lo + hi) / 2;
      (act(mid) < device ? lo : hi) = mid;
    }
    if (act(hi) < device) lo = hi;
    best_model m;
    if (!try_fit(1, m)) continue;
    if (!try_fit(lo, m)) {  // the full test (chunk sizes, host memory) stops earlier: bisect it too
      int good = 1, bad = lo;
      while (bad - good > 1) {
        int const mid = (good + bad) / 2;
        best_model t;
        (try_fit(mid, t) ? good : bad) = mid;
      }
      try_fit(good, m);
    }
    if (m.params > best.params) best = m;
  }
  return best;
}

void add_model(std::vector<std::pair<std::string, double>>& d, std::string const& who, best_model const& m,
               int max_layers) {
  d.insert(d.end(), {{who + "_params", m.params},
                     {who + "_layers", m.layers},
                     {who + "_channels", m.channels},
                     {who + "_activation_bytes", m.activation_bytes},
                     {who + "_device_bytes", m.device_bytes},
                     {who + "_host_bytes", m.host_bytes},
                     {who + "_at_layer_cap", m.layers >= max_layers ? 1.0 : 0.0}});
  if (m.chunk_bytes > 0) d.emplace_back(who + "_chunk_bytes", m.chunk_bytes);
}

// The process's peak resident set so far (getrusage: every earlier run of this process counts).
double peak_rss_bytes() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? 1024.0 * double(u.ru_maxrss) : 0.0;
}

// Trains the largest chunked model found at the smallest budget for 2 steps under that budget
// (every block recomputed, its output offloaded) on one fixed batch: the formula, run. The
// smoke run trains a small shape under 10 MiB instead (the 1 GiB model takes minutes).
// spill (a folder): the chunked_nvme model instead, as its formula assumes: every chunk's Adam
// state in the NVMe tier's file there (a host budget of the parameter chunks, one chunk more and
// the offloaded activations, reserved),
// no host copies of device-resident parameter chunks, no undo copies. Its details are named
// trained_nvme_*. params_on_file: a host budget of a page beside the reserve, so every parameter
// chunk goes to file too (trained_nvme_all_*).
void prove_by_training(tide::exec<host> const& ex, bool quick, best_model const& m, std::size_t budget,
                       tide::bench::figure& f, text_fields& text, std::filesystem::path const& spill = {},
                       bool params_on_file = false) {
  using chunked_t = off::chunked<off::belady>;
  shape s{gpt2_family(m.layers, m.channels), 1, 1024};
  // The smoke shape: 17 MB of model data under a 10 MiB budget (two 1 MiB wte chunks <= budget / 4).
  if (quick) s = {{.layers = 4, .heads = 2, .channels = 128, .vocab = 2048, .max_seq = 64}, 1, 64};
  if (s.config.layers == 0) return;
  auto const options = lean_options(s.config.layers);
  if (quick) budget = 10_MiB;
  bool const nvme = !spill.empty();
  off::scheduler_options so{};
  if (nvme) {
    auto const facts = layout_of(tide::nn::resolve(s.config), budget);
    TIDE_CHECK(facts.has_value(), internal, "bench_offload: no chunk layout for the model to train under the NVMe tier");
    // The offloaded block outputs take their host room from the scheduler's pool: reserved.
    so.host_reserve = lean_activations_of(s.config.layers).host_bytes(s.B, s.T, tide::nn::resolve(s.config), 4);
    so.host_budget = (params_on_file ? 4096 : (facts->chunks + 1) * tide::round_up(facts->chunk_bytes, 256)) +
                     so.host_reserve;
    so.spill_folder = spill;
    so.keep_host_copies = false;
  }
  auto const t0 = std::chrono::steady_clock::now();
  trainer<chunked_t> t{ex, s.config, budget, {}, false, options, so};
  std::vector<float> losses;
  for (int k = 0; k < 2; ++k) losses.push_back(t.step(ex, s, 0));  // one batch: the loss must fall
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool const falling = std::isfinite(losses[0]) && std::isfinite(losses[1]) && losses[1] < losses[0];
  std::string const p = !nvme ? "trained_" : params_on_file ? "trained_nvme_all_" : "trained_nvme_";
  auto const& last = t.stats.back();
  f.detail.insert(f.detail.end(), {{p + "layers", s.config.layers},
                                   {p + "channels", s.config.channels},
                                   {p + "params", double(tide::nn::parameter_count(tide::nn::resolve(s.config)))},
                                   {p + "budget_bytes", double(budget)},
                                   {p + "peak_device_bytes", double(last.peak_device_bytes)},
                                   {p + "activation_bytes", double(t.model.activations().footprint)},
                                   {p + "offloaded_activation_bytes", double(t.model.activations().host_bytes)},
                                   {p + "loss_step1", losses[0]},
                                   {p + "loss_step2", losses[1]},
                                   {p + "losses_finite_and_falling", falling ? 1.0 : 0.0},
                                   {p + "seconds", seconds},
                                   {p + "host_pool_peak_bytes", double(t.sched.host_pool_stats().peak_bytes_held)},
                                   {p + "process_peak_rss_bytes", peak_rss_bytes()}});
  if (nvme)
    f.detail.insert(f.detail.end(), {{p + "host_budget_bytes", double(so.host_budget)},
                                     {p + "host_pool_bytes_held", double(t.sched.host_pool_stats().bytes_held)},
                                     {p + "read_bytes_step2", double(last.nvme_read_bytes)},
                                     {p + "write_bytes_step2", double(last.nvme_write_bytes)}});
  text.emplace_back(p.substr(0, p.size() - 1),
                    quick ? "a small shape (L 4, C 128, V 2048) under 10 MiB (smoke run)"
                          : "the chunked model of this figure, under this budget");
  TIDE_CHECK(falling, internal, "bench_offload: the largest chunked model", nvme ? " with the NVMe tier" : "",
             " trained for 2 steps gave losses ", losses[0], ", ", losses[1], ": not finite and falling");
  TIDE_CHECK(!nvme || last.nvme_read_bytes > 0, internal, "bench_offload: the model trained with the NVMe tier read "
             "nothing from its file");
}

// ---- the largest model, trained on both sides ---------------------------------------------------

// One side's largest model, found by training. The formula's depth (at its best C) is the start;
// a trial builds the scheduler with host_capacity = the host room the bench grants and trains 2
// steps with the library's defaults (undo copies on), every block recomputed and its output
// offloaded. A budget error (the device budget, or the host capacity: at construction or inside a
// step) steps the depth down until a trial trains; then one layer more must fail with the budget
// error (up again while it trains). Other errors end the bench.
struct trained_max {
  int layers = 0, channels = 0, tries = 0;
  double params = 0, seconds = 0, loss1 = 0, loss2 = 0, peak_device = 0, peak_host = 0;
  double next_params = 0;        // the one-layer-deeper model
  bool next_failed = false;      // it failed with the budget error
  std::string next_error;        // that error's message
};

template <class Cfg>
std::optional<std::string> train_trial(tide::exec<host> const& ex, tide::nn::gpt_config const& c, std::size_t D,
                                       Cfg const& cfg, std::size_t host_capacity, trained_max* record) {
  shape const s{c, 1, c.max_seq};
  off::scheduler_options so{};
  so.host_capacity = host_capacity;
  try {
    auto const t0 = std::chrono::steady_clock::now();
    trainer<Cfg> t{ex, c, D, cfg, true, lean_options(c.layers), so};
    float const l1 = t.step(ex, s, 0), l2 = t.step(ex, s, 0);  // one batch: the loss must fall
    TIDE_CHECK(std::isfinite(l1) && std::isfinite(l2) && l2 < l1, internal, "bench_offload: ", Cfg::name(),
               " trained L ", c.layers, " C ", c.channels, " for 2 steps: losses ", l1, ", ", l2,
               ", not finite and falling");
    if (record != nullptr) {
      record->layers = c.layers;
      record->channels = c.channels;
      record->params = double(tide::nn::parameter_count(tide::nn::resolve(c)));
      record->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      record->loss1 = l1;
      record->loss2 = l2;
      record->peak_device = double(t.stats.back().peak_device_bytes);
      record->peak_host = double(t.sched.host_pool_stats().peak_bytes_held);
    }
    return std::nullopt;
  } catch (tide::error const& e) {
    if (e.category() != tide::errc::budget) throw;
    return e.message();
  }
}

template <class Cfg, class Family>
trained_max search_trained(tide::exec<host> const& ex, Family&& family, int C, int start, std::size_t D,
                           Cfg const& cfg, std::size_t host_capacity, int most_tries) {
  trained_max m;
  int L = std::max(start, 1);
  for (;;) {  // down until a trial trains
    ++m.tries;
    if (!train_trial(ex, family(L, C), D, cfg, host_capacity, &m)) break;
    TIDE_CHECK(L > 1 && m.tries < most_tries, internal, "bench_offload: ", Cfg::name(), " trains no depth from ",
               start, " down to ", L, " at C ", C);
    --L;
  }
  for (;;) {  // one deeper must fail
    ++m.tries;
    trained_max deeper = m;
    auto const c = family(L + 1, C);
    auto const err = train_trial(ex, c, D, cfg, host_capacity, &deeper);
    if (!err && m.tries < most_tries) {  // it trained: the largest is deeper
      m = deeper;
      ++L;
      continue;
    }
    m.next_params = double(tide::nn::parameter_count(tide::nn::resolve(c)));
    m.next_failed = err.has_value();
    m.next_error = err ? err->substr(0, 200) : tide::detail::concat("trained (the search stopped after ", most_tries,
                                                                     " trials)");
    return m;
  }
}

// Tokens/s of `cfg` on model c: 3 steps, the last 2 timed (the first records the trace).
template <class Cfg>
double tokens_per_second(tide::exec<host> const& ex, tide::nn::gpt_config const& c, std::size_t D, Cfg const& cfg,
                         std::size_t host_capacity) {
  shape const s{c, 1, c.max_seq};
  off::scheduler_options so{};
  so.host_capacity = host_capacity;
  trainer<Cfg> t{ex, c, D, cfg, true, lean_options(c.layers), so};
  for (int k = 0; k < 3; ++k) (void)t.step(ex, s, k);
  return double(s.B * s.T) / median(std::vector<double>(t.seconds.end() - 2, t.seconds.end()));
}

// TIDE_BENCH_MAX_MODEL_ONLY=1: the largest-model figures only.
bool max_model_only() {
  char const* const v = std::getenv("TIDE_BENCH_MAX_MODEL_ONLY");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// TIDE_BENCH_ENGINE_ONLY=1: stop after the engine's speed figures.
bool engine_only() {
  char const* const v = std::getenv("TIDE_BENCH_ENGINE_ONLY");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

}  // namespace

int main() {
  using namespace tide::bench;
  bool const q = quick();
  double const load_before = load_average();
  tide::thread_pool pool{probe_threads};
  tide::exec<host> ex{pool};

  // (a) to (f) in a scope of their own: their trainers (4.4 GB here) are gone before (c) reads
  // MemAvailable for its host room.
  cross_check cc;  // (c)'s formula of the least device bytes against the schedulers
  if (!max_model_only()) {
    // ---- (a) 4x the budget vs resident ----------------------------------------------------------
    shape const s = q ? shape{{.layers = 6, .heads = 2, .channels = 128, .vocab = 256, .max_seq = 32}, 2, 16}
                      : shape{{.layers = 8, .heads = 12, .channels = 768, .vocab = 2048, .max_seq = 128}, 4, 64};
    int const warm_steps = 2, measured = q ? 2 : 7;
    auto const params = static_cast<std::size_t>(tide::nn::parameter_count(tide::nn::resolve(s.config)));
    std::size_t const model_data = 16 * params, budget = tide::round_up(model_data / 4, 256);
    std::size_t const act = activations_of(s.config.layers).footprint(s.B, s.T, tide::nn::resolve(s.config), 4);

    using chunked_t = off::chunked<off::belady>;
    trainer<chunked_t> offl{ex, s.config, budget, {}};
    trainer<off::resident> res{ex, s.config, 2 * model_data + 2 * act + 64_MiB, {}};
    trainer<chunked_t> no_undo{ex, s.config, budget, {}, false};  // what keeping the undo copies costs
    trainer<chunked_t, float, adamw_copy_pass> copy_pass{ex, s.config, budget, {}};  // the copies in a pass of their own
    trainer<chunked_t, float, adamw_fold> fold{ex, s.config, budget, {}};  // the copies in the update's pass
    std::size_t const minimum = offl.sched.minimum_device_bytes(act);
    TIDE_CHECK(budget >= minimum, budget, "bench_offload: the shape's budget ", tide::bytes_of{budget},
               " (model data / 4) is below chunked<belady>'s minimum ", tide::bytes_of{minimum}, " = ",
               offl.sched.minimum_explained(act), "; pick another shape");
    float loss_off = 0, loss_res = 0;
    for (int k = 0; k < warm_steps; ++k) {
      loss_off = offl.step(ex, s, k);
      loss_res = res.step(ex, s, k);
      (void)no_undo.step(ex, s, k);
      (void)copy_pass.step(ex, s, k);
      (void)fold.step(ex, s, k);
    }
    // The measured steps interleave, so a burst of load on the shared machine hits them all.
    float loss_no_undo = 0, loss_copy_pass = 0, loss_fold = 0;
    for (int k = warm_steps; k < warm_steps + measured; ++k) {
      loss_res = res.step(ex, s, k);
      loss_off = offl.step(ex, s, k);
      loss_no_undo = no_undo.step(ex, s, k);
      loss_copy_pass = copy_pass.step(ex, s, k);
      loss_fold = fold.step(ex, s, k);
    }
    bool const activations_exact = tide::round_up(offl.model.activations().footprint, 256) == act;
    bool const same_loss = loss_off == loss_res;  // offloading changes no bit
    auto const tail = [&](std::vector<double> const& v) {
      return std::vector<double>(v.end() - measured, v.end());
    };
    double const tokens = static_cast<double>(s.B * s.T);
    double const off_tps = tokens / median(tail(offl.seconds)), res_tps = tokens / median(tail(res.seconds));
    off::offload_stats const& st = offl.stats.back();
    std::vector<double> stall;
    for (std::size_t i = offl.stats.size() - static_cast<std::size_t>(measured); i < offl.stats.size(); ++i)
      stall.push_back(offl.stats[i].stall_ms);
    std::size_t const chunk = offl.sched.chunk_bytes();

    figure a{.bench = "offload",
             .name = "offload_4x_vs_resident",
             .value = off_tps,
             .unit = "tokens/s",
             .anchor = "resident (unlimited budget), same model and data, this run",
             .anchor_value = res_tps,
             .higher_is_better = true,
             .goal = 0.9,
             .detail = {{"layers", s.config.layers},
                        {"channels", s.config.channels},
                        {"vocab", s.config.vocab},
                        {"batch", double(s.B)},
                        {"seq", double(s.T)},
                        {"parameters", double(params)},
                        {"model_data_bytes", double(model_data)},
                        {"budget_bytes", double(budget)},
                        {"model_data_over_budget", double(model_data) / double(budget)},
                        {"activation_bytes", double(act)},
                        {"activation_formula_exact", activations_exact ? 1.0 : 0.0},
                        {"minimum_device_bytes", double(minimum)},
                        {"chunk_bytes", double(chunk)},
                        {"chunks_per_list", double(offl.sched.layout().chunks())},
                        {"chunk_padding", offl.sched.layout().padding()},
                        {"resident_ms_per_step", 1e3 * median(tail(res.seconds))},
                        {"offloaded_ms_per_step", 1e3 * median(tail(offl.seconds))},
                        {"measured_steps", measured},
                        {"same_loss_bits", same_loss ? 1.0 : 0.0},
                        {"h2d_bytes", double(st.h2d_bytes)},
                        {"d2h_bytes", double(st.d2h_bytes)},
                        {"bytes_moved", double(st.bytes_moved())},
                        {"fetches", double(st.fetches)},
                        {"evictions", double(st.evictions)},
                        {"prefetches", double(st.prefetches)},
                        {"prefetch_hits", double(st.prefetch_hits)},
                        {"demand_fetches", double(st.demand_fetches)},
                        {"allocations", double(st.allocations)},
                        {"stall_ms_median", median(stall)},
                        {"stall_ms_last", st.stall_ms},
                        {"optimizer_ms", st.optimizer_ms},
                        {"host_optimizer_chunks", double(st.host_optimizer_chunks)},
                        {"device_optimizer_chunks", double(st.device_optimizer_chunks)},
                        {"peak_device_bytes", double(st.peak_device_bytes)},
                        {"moments", double(st.moments)},
                        {"threads", double(probe_threads)},
                        {"loadavg_1min_before", load_before},
                        {"loadavg_1min_after", load_average()}}};
    print_figure(a, {{"offload_stats_last_step", off::to_json(st)}});

    // ---- (a') what undo_on_error costs ----------------------------------------------------------
    {
      double const plain_tps = tokens / median(tail(no_undo.seconds));
      figure u{.bench = "offload",
               .name = "undo_on_error_vs_off",
               .value = off_tps,
               .unit = "tokens/s",
               .anchor = "the same chunked<belady> run with undo_on_error = false, this run, steps interleaved",
               .anchor_value = plain_tps,
               .higher_is_better = true,
               .goal = 0.95,
               .detail = {{"undo_bytes_per_step", double(12 * params)},
                          {"same_loss_bits", loss_no_undo == loss_off ? 1.0 : 0.0},
                          {"with_undo_ms_per_step", 1e3 * median(tail(offl.seconds))},
                          {"without_undo_ms_per_step", 1e3 * median(tail(no_undo.seconds))},
                          {"copy_pass_ms_per_step", 1e3 * median(tail(copy_pass.seconds))},
                          {"copy_pass_vs_off", median(tail(no_undo.seconds)) / median(tail(copy_pass.seconds))},
                          {"copy_pass_same_loss_bits", loss_copy_pass == loss_off ? 1.0 : 0.0},
                          {"fold_ms_per_step", 1e3 * median(tail(fold.seconds))},
                          {"fold_vs_off", median(tail(no_undo.seconds)) / median(tail(fold.seconds))},
                          {"fold_same_loss_bits", loss_fold == loss_off ? 1.0 : 0.0},
                          {"undo_swapped_bytes_last_step", double(st.undo_swapped_bytes)},
                          {"undo_copy_bytes_last_step", double(st.undo_copy_bytes)},
                          {"measured_steps", measured},
                          {"loadavg_1min_after", load_average()}}};
      print_figure(u, {});
    }
    if (engine_only()) return 0;

    // ---- (d) activation memory: recompute and offload against keeping every activation --------
    {
      using tide::nn::block_set;
      int const L = s.config.layers;
      std::size_t const room = 2 * model_data + 2 * act + 64_MiB;
      trainer<off::resident> keep{ex, s.config, room, {}};
      trainer<off::resident> rec{ex, s.config, room, {}, true, {.recompute = block_set::all(L)}};
      trainer<off::resident> moved{ex, s.config, room, {}, true,
                                   {.offload_activations = block_set::range(tide::nn::embedding_block, L - 1)}};
      float lk = 0, lr = 0, lm = 0;
      for (int k = 0; k < warm_steps + measured; ++k) {  // interleaved, as above
        lk = keep.step(ex, s, k);
        lr = rec.step(ex, s, k);
        lm = moved.step(ex, s, k);
      }
      double const keep_tps = tokens / median(tail(keep.seconds));
      auto const report = [&](trainer<off::resident>& t, char const* name, char const* anchor, double goal, float loss) {
        auto const acts = t.model.activations();
        figure r{.bench = "offload",
                 .name = name,
                 .value = tokens / median(tail(t.seconds)),
                 .unit = "tokens/s",
                 .anchor = anchor,
                 .anchor_value = keep_tps,
                 .higher_is_better = true,
                 .goal = goal,
                 .detail = {{"layers", L},
                            {"channels", s.config.channels},
                            {"batch", double(s.B)},
                            {"seq", double(s.T)},
                            {"activation_bytes", double(acts.footprint)},
                            {"kept_activation_bytes", double(keep.model.activations().footprint)},
                            {"activation_bytes_over_kept",
                             double(acts.footprint) / double(keep.model.activations().footprint)},
                            {"offloaded_host_bytes", double(acts.host_bytes)},
                            {"ms_per_step", 1e3 * median(tail(t.seconds))},
                            {"kept_ms_per_step", 1e3 * median(tail(keep.seconds))},
                            {"same_loss_bits", loss == lk ? 1.0 : 0.0},
                            {"measured_steps", measured},
                            {"loadavg_1min_after", load_average()}}};
        print_figure(r, {});
      };
      report(rec, "recompute_overhead", "every activation kept (resident, same model and data, steps interleaved)", 0.7,
             lr);
      report(moved, "activation_offload_vs_resident",
             "every activation kept on the device (resident, same model and data, steps interleaved)", 0.85, lm);
    }

    // ---- (e) wte in row pieces against wte whole ------------------------------------------------
    {
      constexpr int pieces = 4;
      tide::nn::gpt_config cut = s.config;
      cut.wte_pieces = pieces;
      std::size_t const room = 2 * model_data + 2 * act + 64_MiB;
      trainer<off::resident> whole{ex, s.config, room, {}};
      trainer<off::resident> in_pieces{ex, cut, room, {}};
      float lw = 0, lp = 0;
      for (int k = 0; k < warm_steps + measured; ++k) {  // interleaved, as above
        lw = whole.step(ex, s, k);
        lp = in_pieces.step(ex, s, k);
      }
      figure w{.bench = "offload",
               .name = "wte_pieces_vs_whole",
               .value = tokens / median(tail(in_pieces.seconds)),
               .unit = "tokens/s",
               .anchor = "wte whole (resident, same model and data, steps interleaved)",
               .anchor_value = tokens / median(tail(whole.seconds)),
               .higher_is_better = true,
               .goal = 0.95,
               .detail = {{"wte_pieces", pieces},
                          {"padded_vocab", double(tide::nn::padded_vocab_of(s.config))},
                          {"channels", s.config.channels},
                          {"batch", double(s.B)},
                          {"seq", double(s.T)},
                          {"ms_per_step", 1e3 * median(tail(in_pieces.seconds))},
                          {"whole_ms_per_step", 1e3 * median(tail(whole.seconds))},
                          {"loss_relative_difference", std::abs(double(lp) - double(lw)) / std::abs(double(lw))},
                          {"measured_steps", measured},
                          {"loadavg_1min_after", load_average()}}};
      print_figure(w, {{"note", "the head runs one GEMM per piece and copies each piece's logits columns in and out; "
                                "the loss differs by the head's fp32 reassociation only"}});
    }

    // ---- (f) gradient-slot reuse: bf16 model data per parameter at its peak ---------------------
    {
      // The optimizer deferred to step(), as clipping and loss scaling run it: every gradient chunk
      // lives until then, which is where the parameter slots save a copy of the model. The figure
      // compares runs without host copies of device-resident parameter chunks (keep_host_copies =
      // false), so that reuse is the only difference and the bytes are the model data itself; the
      // default runs (host copies kept) are in detail.
      using bf16_t = trainer<chunked_t, tide::bf16>;
      off::scheduler_options const deferred{.defer_optimizer = true};
      auto with = [&](bool reuse, bool copies) {
        off::scheduler_options o = deferred;
        o.reuse_grad_slots = reuse;
        o.keep_host_copies = copies;
        return o;
      };
      bf16_t plain{ex, s.config, budget, {}, true, {}, with(false, false)};
      bf16_t reuse{ex, s.config, budget, {}, true, {}, with(true, false)};
      bf16_t plain_copies{ex, s.config, budget, {}, true, {}, with(false, true)};
      bf16_t reuse_copies{ex, s.config, budget, {}, true, {}, with(true, true)};
      float lp = 0, lr = 0, lpc = 0, lrc = 0;
      int const bf16_measured = q ? 1 : 3;  // the figure is bytes; the speed is a detail
      for (int k = 0; k < warm_steps + bf16_measured; ++k) {  // interleaved, as above
        lp = plain.step(ex, s, k);
        lr = reuse.step(ex, s, k);
        lpc = plain_copies.step(ex, s, k);
        lrc = reuse_copies.step(ex, s, k);
      }
      auto const per_param = [&](bf16_t const& t) { return double(t.stats.back().peak_model_bytes) / double(params); };
      auto const ms = [&](bf16_t const& t) {
        return 1e3 * median(std::vector<double>(t.seconds.end() - bf16_measured, t.seconds.end()));
      };
      auto const& layout = reuse.sched.layout();
      double const padded = double(layout.chunks() * reuse.sched.chunk_bytes()) / 2.0 / double(params);
      figure g{.bench = "offload",
               .name = "grad_slot_reuse_bytes_per_param",
               .value = per_param(reuse),
               .unit = "bytes/param",
               .anchor = "the same bf16 chunked<belady> run without reuse_grad_slots, this run (PatrickStar: 14 vs 16)",
               .anchor_value = per_param(plain),
               .higher_is_better = false,
               .goal = 14.0 / 16.0,
               .detail = {{"parameters", double(params)},
                          {"chunk_bytes", double(reuse.sched.chunk_bytes())},
                          {"chunks_per_list", double(layout.chunks())},
                          {"chunk_slots_per_parameter", padded},
                          {"ideal_bytes_per_param", 14.0 * padded},
                          {"ideal_plain_bytes_per_param", 16.0 * padded},
                          {"with_host_copies_bytes_per_param", per_param(reuse_copies)},
                          {"with_host_copies_plain_bytes_per_param", per_param(plain_copies)},
                          {"budget_bytes", double(budget)},
                          {"same_loss_bits", lp == lr && lp == lpc && lp == lrc ? 1.0 : 0.0},
                          {"ms_per_step", ms(reuse)},
                          {"plain_ms_per_step", ms(plain)},
                          {"with_host_copies_ms_per_step", ms(reuse_copies)},
                          {"with_host_copies_plain_ms_per_step", ms(plain_copies)},
                          {"measured_steps", bf16_measured},
                          {"loadavg_1min_after", load_average()}}};
      print_figure(g, {{"note", "offload_stats::peak_model_bytes over a step: chunk payloads host and device, host "
                                "copies of device-resident parameter chunks, blocks awaiting free; bf16 parameters and "
                                "gradients, fp32 masters, Adam m and v. ideal_*: 14 or 16 B per chunk slot"}});
    }

    if (char const* svg = std::getenv("TIDE_BENCH_SVG"); svg != nullptr && svg[0] != '\0') {
      auto const title = tide::detail::concat("Memory tide of one step: chunked<belady>, GPT L=", s.config.layers,
                                              " C=", s.config.channels, ", model data ", tide::bytes_of{model_data},
                                              " = 4x the budget");
      // nn::gpt's lowest block is the embedding, its highest the head.
      off::write_file(svg, off::memory_tide_svg(offl.last_tide, title, {.first = "emb", .last = "head"}));
    }

    // ---- (b) bytes moved vs the offline optimum on the same trace ------------------------------
    {
      auto const& tracer = offl.sched.tracer();
      auto const& trace = tracer.trace();
      std::vector<std::size_t> room(tracer.moments());  // chunks the device holds at each moment
      std::size_t written = 0;
      for (std::size_t t = 0; t < tracer.moments(); ++t) {
        room[t] = tracer.chunk_budget(t) / chunk;
        written += trace.written(t).size();
      }
      TIDE_CHECK(written > 0, internal, "bench_offload: the recorded trace writes no chunk; backward writes the "
                 "gradients, so the tracer lost the writes");
      std::size_t const cap = *std::ranges::min_element(room), cap_hi = *std::ranges::max_element(room);
      // 64 copies of the step: the free start (any chunk may begin on the device) is worth at most
      // `cap` loads over them, a fraction of a chunk per step.
      constexpr std::size_t copies = 64;
      off::offline_bound const opt = off::offline_optimum(trace, cap, chunk, copies);
      off::offline_bound const opt_room = off::offline_optimum(trace, room, chunk, copies);
      // The measured steps, one after the other, against the bound for that many copies at each
      // moment's own room: a sound check from whatever state they started in (no periodicity assumed).
      auto const m = static_cast<std::size_t>(measured);
      double window = 0;
      for (std::size_t i = offl.stats.size() - m; i < offl.stats.size(); ++i)
        window += double(offl.stats[i].h2d_bytes + offl.stats[i].d2h_bytes);
      off::offline_bound const opt_window = off::offline_optimum(trace, room, chunk, m);
      auto const per_step = [&](auto policy, std::size_t capacity) {
        auto const three = off::simulate(trace, capacity, policy, 3), two = off::simulate(trace, capacity, policy, 2);
        return double((three.moves() - two.moves()) * chunk);
      };
      double const min_bytes = per_step(off::belady{}, cap), lru_bytes = per_step(off::lru{}, cap),
                   fifo_bytes = per_step(off::fifo{}, cap);
      // The scheduler's real copies: a clean parameter chunk (its host copy current) leaves the
      // device without one, as the offline optimum's cost model has it.
      double const real = double(st.h2d_bytes + st.d2h_bytes);
      TIDE_CHECK(window >= opt_window.lower_bytes * double(m) * (1 - 1e-9), internal, "bench_offload: the ",
                 measured, " measured steps copied ", window, " bytes, below the offline lower bound ",
                 opt_window.lower_bytes * double(m), " for that many steps of their own trace at each moment's room: "
                 "the bound's cost model disagrees with what the scheduler counts");
      figure b{.bench = "offload",
               .name = "offload_bytes_vs_offline_optimum",
               .value = real,
               .unit = "bytes/step",
               .anchor = "lower bound on the offline optimum (clean drops free, dirty evictions a write; min-cost "
                         "flow) for the run's own trace at the least per-moment chunk budget",
               .anchor_value = opt.lower_bytes,
               .higher_is_better = false,
               .goal = 1.05,
               .detail = {{"lower_bound_bytes", opt.lower_bytes},
                          {"upper_bound_bytes", opt.upper_bytes},
                          {"gap", opt.gap()},
                          {"exact", opt.exact ? 1.0 : 0.0},
                          {"over_upper_bound", real / opt.upper_bytes},
                          {"lower_bound_first_share_bytes", opt.lower_by_share[0]},
                          {"lower_bound_last_share_bytes", opt.lower_by_share[1]},
                          {"lower_bound_equal_share_bytes", opt.lower_by_share[2]},
                          {"split_epochs", double(opt.split_epochs)},
                          {"dirty_epochs", double(opt.epochs)},
                          {"intervals", double(opt.intervals)},
                          {"fixed_loads", double(opt.fixed_loads)},
                          {"fixed_writes", double(opt.fixed_writes)},
                          {"trace_copies", double(copies)},
                          {"per_moment_room_lower_bound_bytes", opt_room.lower_bytes},
                          {"per_moment_room_upper_bound_bytes", opt_room.upper_bytes},
                          {"over_per_moment_room_lower_bound", real / opt_room.lower_bytes},
                          {"measured_steps_bytes_per_step", window / double(m)},
                          {"measured_steps_lower_bound_bytes_per_step", opt_window.lower_bytes},
                          {"capacity_chunks", double(cap)},
                          {"capacity_chunks_largest_moment", double(cap_hi)},
                          {"working_set_chunks", double(trace.working_set())},
                          {"trace_moments", double(trace.moments())},
                          {"trace_chunk_ids", double(trace.chunks())},
                          {"trace_written_ids", double(written)},
                          {"chunk_bytes", double(chunk)},
                          {"real_h2d_bytes", double(st.h2d_bytes)},
                          {"real_d2h_bytes", double(st.d2h_bytes)},
                          {"clean_drops", double(st.clean_drops)},
                          {"belady_bytes_per_step", min_bytes},
                          {"belady_over_lower_bound", min_bytes / opt.lower_bytes},
                          {"over_belady", real / min_bytes},
                          {"lru_bytes_per_step", lru_bytes},
                          {"fifo_bytes_per_step", fifo_bytes},
                          {"lru_over_lower_bound", lru_bytes / opt.lower_bytes},
                          {"fifo_over_lower_bound", fifo_bytes / opt.lower_bytes}}};
      print_figure(b, {{"note", "belady, lru and fifo: simulate(), every eviction a copy (no clean drops); "
                                "the optimum of writeback-aware caching is NP-complete (Beckmann et al., APOCS "
                                "2020): lower <= optimum <= upper"}});
    }

    // (a)'s shape for (c)'s cross-check of the least device bytes.
    if (auto const f = layout_of(tide::nn::resolve(s.config), budget)) {
      ++cc.checks;
      if (minimum_of(which::chunked, *f, act) != minimum) ++cc.mismatches;
    }
  }

  // ---- (c) the largest model: chunked<belady> against ZeRO-Offload's placement, both trained ---
  std::size_t const available = mem_available_bytes();
  std::size_t const resident = resident_bytes();  // what the figures before left held
  int const max_layers = q ? 64 : 512;  // planning 20 L activations is O(L^2): the smoke run stays shallow
  // The formula against the schedulers themselves: small shapes that can be built, and (a) above.
  for (int L : {1, 2})
    for (int C : {128, 256, 512}) {
      if (q != (C == 128)) continue;  // the smoke run builds the smallest only
      auto const c = tide::nn::resolve(gpt2_family(L, C));
      check_minimum(cc, c, std::size_t(1_GiB), activations_of(L).footprint(1, 1024, c, 4));
    }
  TIDE_CHECK(cc.mismatches == 0, internal, "bench_offload: ", cc.mismatches, " of ", cc.checks,
             " shapes give a scheduler minimum_device_bytes other than this bench's copy of its formula "
             "(minimum_of); the scheduler's minimum changed: update minimum_of");

  static constexpr int grid_all[] = {512, 640, 768, 1024, 1280, 1536, 2048, 2560};
  static constexpr double budgets_all[] = {1, 2, 4};
  std::span<int const> const grid(grid_all, q ? 2 : std::size(grid_all));
  std::span<double const> const budgets_gib(budgets_all, q ? 1 : std::size(budgets_all));
  char const* const nvme_env = std::getenv("TIDE_BENCH_TRAIN_NVME");
  bool const train_nvme = nvme_env != nullptr && std::string_view(nvme_env) == "1";
  using chunked_t = off::chunked<off::belady>;
  // The smoke run's family: a small vocabulary and context, so that its searches train in seconds.
  auto const family = [q](int L, int C) {
    return q ? tide::nn::gpt_config{.layers = L, .heads = 2, .channels = C, .vocab = 2048, .max_seq = 64}
             : gpt2_family(L, C);
  };
  // Per parameter, what chunked<belady> keeps at once with the library's defaults: the fp32
  // parameter, Adam's m and v, and the undo copies of the three until the step completes (the
  // gradients stream through a few blocks).
  constexpr double state_bytes_per_param = 24;
  std::string const rule =
      "Both sides trained: each keeps its largest model, found by training 2 steps (B=1, T=maxT, one batch, the "
      "loss must fall) with the library's defaults (undo copies on) and every block recomputed and its output "
      "offloaded, under the device budget D and a host capacity R = 0.8 (MemAvailable - D) "
      "(scheduler_options::host_capacity: past it a budget error, at construction or inside a step). The search "
      "starts at the formula's depth for the formula's best C, steps down while a trial fails with a budget "
      "error, and up while one layer more trains; one layer more must fail with the budget error (next_*). "
      "Anchor: static_partition, ZeRO-Offload's placement as its paper gives it (Ren et al. 2021, sec. 4: "
      "parameters on the device for the whole step, gradients to the host as backward completes them, fp32 "
      "state and the update on the host): every parameter chunk and one block's gradient chunks on the device. "
      "throughput_vs_zero_offload_at_its_max: both at the anchor's largest model, 3 steps, the last 2 timed. "
      "max_model_vs_capacity: tide's trained parameters over (D + R) / 24 B (fp32 parameter, m, v and their "
      "undo copies; gradients stream). GPT-2 family: heads = C/64, V = 50257, maxT = 1024, C in {512..2560} "
      "(the smoke run: V 2048, maxT 64, C 128, D 10 MiB, R 48 MiB).";
  std::string const formula_here =
      "the starts: chunked<belady>: device >= A + 2 k S; host 3 n S + 3 n S (undo) + (q + 2) S + H <= R; "
      "static_partition: device >= A + n S + k S; host 3 n S + 3 n S (undo) + (q + 2) S + H <= R. chunked_nvme "
      "(computed; trained at the largest budget when TIDE_BENCH_TRAIN_NVME=1, without undo copies): Adam m and "
      "v in the NVMe tier's file, host n S + (q + 2) S + H + 4 S <= R, file 4 n S <= 0.8 of the temp folder's "
      "free space; chunked_nvme_all: the parameter chunks in the file too, host (q + 2) S + H + 4 S + 13 S, "
      "file 6 n S. A = nn::gpt's planned activation buffer at B=1, T=1024, every block recomputed; S = chunk "
      "bytes from search_chunk_size with two chunks <= D/4 (rounded up to the pinned pool's size class); n = "
      "chunks per list; k = most chunks one block touches; q = host_steps_in_flight (4); H = the offloaded "
      "block outputs.";
  tide::memory::pinned_pool<host> const host_pool{{.lock_pages = false}};  // its size classes only
  for (double dg : budgets_gib) {
    auto const D = q ? std::size_t{10_MiB} : static_cast<std::size_t>(dg * gib);
    double const host_room = q ? double(48_MiB) : 0.8 * (double(available) - double(D));
    auto const R = static_cast<std::size_t>(host_room);
    double const disk_room = 0.8 * double(std::filesystem::space(std::filesystem::temp_directory_path()).available);
    // lean: every block recomputed and its output offloaded (their host bytes count too).
    // nvme: the optimizer state (m, v) in the NVMe tier's file (two slots each), the host keeping
    // the parameter chunks and two chunks' state in staging. on_file: the parameter chunks in the
    // file too (two slots), the host keeping five of them in staging (two for the host steps, one
    // for a fetch, two for the reads ahead) and one per fetch whose copy is in flight (at most 8,
    // the copy engine's bound; the pool keeps them cached). undo: the undo copies of every
    // stepped chunk's parameters, m and v until the step completes.
    auto const fits_with = [&](which w, bool nvme = false, bool on_file = false) {
      return [&, w, nvme, on_file](tide::nn::gpt_config const& c, std::size_t A, best_model& m) {
        auto const f = layout_of(c, D);
        if (!f) return false;
        std::size_t const need = minimum_of(w, *f, A);
        double const S = double(host_pool.class_size(f->chunk_bytes)), n = double(f->chunks);
        double const queued = (off::scheduler_options{}.host_steps_in_flight + 2) * S;
        double const staging = nvme ? 2 * double(host_pool.class_size(2 * f->chunk_bytes)) + (on_file ? 13 * S : 0.0) : 0.0;
        double const kept = on_file ? 0.0 : nvme ? n * S : 6 * n * S;
        double const disk = nvme ? (on_file ? 6 : 4) * n * double(f->chunk_bytes) : 0.0;
        double const offloaded = double(lean_activations_of(c.layers).host_bytes(1, 1024, c, 4));
        double const host = kept + queued + offloaded + staging;
        m.device_bytes = double(need);
        m.host_bytes = host;
        m.chunk_bytes = double(f->chunk_bytes);
        return need <= D && host <= host_room && disk <= disk_room;
      };
    };
    best_model ch, st_m, nv, nvp;
    if (!q) {
      ch = largest(grid, D, 4, max_layers, fits_with(which::chunked), true);
      st_m = largest(grid, D, 4, max_layers, fits_with(which::fixed), true);
      nv = largest(grid, D, 4, max_layers, fits_with(which::chunked, true), true);
      nvp = largest(grid, D, 4, max_layers, fits_with(which::chunked, true, true), true);
    }
    int const C_tide = q ? 128 : ch.channels, C_zo = q ? 128 : st_m.channels;
    // The formula lands within a few layers (8 trials); the smoke run starts anywhere (its trials are cheap).
    int const tries = q ? 32 : 8;
    trained_max const tide_m = search_trained(ex, family, C_tide, q ? 4 : ch.layers, D, chunked_t{}, R, tries);
    trained_max const zo_m = search_trained(ex, family, C_zo, q ? 4 : st_m.layers, D, off::static_partition{}, R, tries);
    auto const at_anchor = family(zo_m.layers, zo_m.channels);
    double const tps_zo = tokens_per_second(ex, at_anchor, D, off::static_partition{}, R);
    double const tps_tide = tokens_per_second(ex, at_anchor, D, chunked_t{}, R);
    double const bound = (double(D) + host_room) / state_bytes_per_param;
    auto const trained_detail = [](std::vector<std::pair<std::string, double>>& d, std::string const& who,
                                   trained_max const& got) {
      d.insert(d.end(), {{who + "_layers", got.layers},
                         {who + "_channels", got.channels},
                         {who + "_params", got.params},
                         {who + "_loss_step1", got.loss1},
                         {who + "_loss_step2", got.loss2},
                         {who + "_seconds", got.seconds},
                         {who + "_peak_device_bytes", got.peak_device},
                         {who + "_peak_host_bytes", got.peak_host},
                         {who + "_trials", got.tries},
                         {who + "_next_params", got.next_params},
                         {who + "_next_over_params", got.params > 0 ? got.next_params / got.params : 0.0},
                         {who + "_next_failed_with_budget_error", got.next_failed ? 1.0 : 0.0}});
    };
    std::vector<std::pair<std::string, double>> common{{"device_budget_bytes", double(D)},
                                                       {"host_capacity_bytes", host_room},
                                                       {"mem_available_bytes", double(available)},
                                                       {"bench_resident_bytes", double(resident)}};
    text_fields text{{"rule", rule}, {"formula", formula_here}, {"tide_next_error", tide_m.next_error},
                     {"zero_offload_next_error", zo_m.next_error}};
    std::string const gib_name = q ? "smoke" : tide::detail::concat(static_cast<int>(dg), "gib");
    figure c{.bench = "offload",
             .name = "max_model_vs_zero_offload_" + gib_name,
             .value = tide_m.params,
             .unit = "parameters",
             .anchor = "static_partition (ZeRO-Offload's placement), same device budget and host capacity, trained",
             .anchor_value = zo_m.params,
             .higher_is_better = true,
             .goal = 2.5,
             .detail = common};
    trained_detail(c.detail, "tide", tide_m);
    trained_detail(c.detail, "zero_offload", zo_m);
    if (!q) {
      add_model(c.detail, "formula_tide", ch, max_layers);
      add_model(c.detail, "formula_zero_offload", st_m, max_layers);
    }
    print_figure(c, text);
    figure cap{.bench = "offload",
               .name = "max_model_vs_capacity_" + gib_name,
               .value = tide_m.params,
               .unit = "parameters",
               .anchor = "(device budget + host capacity) / 24 B per parameter: the machine's bound for this "
                         "configuration",
               .anchor_value = bound,
               .higher_is_better = true,
               .goal = 0.9,
               .detail = common};
    cap.detail.insert(cap.detail.end(), {{"bytes_per_param", state_bytes_per_param},
                                         {"tide_params", tide_m.params},
                                         {"tide_peak_host_bytes", tide_m.peak_host},
                                         {"disk_room_bytes", disk_room}});
    if (!q) {
      add_model(cap.detail, "chunked_nvme", nv, max_layers);
      add_model(cap.detail, "chunked_nvme_all", nvp, max_layers);
    }
    text_fields cap_text{{"rule", rule}, {"formula", formula_here}};
    // The NVMe model at the largest budget: trained when TIDE_BENCH_TRAIN_NVME=1 (at 4 GiB here
    // 1.4 G parameters: minutes of compute and a 22 GB file), and always in the smoke run.
    if (dg == budgets_gib.back() && (q || train_nvme)) {
      auto const folder = std::filesystem::temp_directory_path() / tide::detail::concat("tide-bench-nvme-", ::getpid());
      std::filesystem::create_directories(folder);
      struct remove_after {
        std::filesystem::path path;
        ~remove_after() {
          std::error_code ec;
          std::filesystem::remove_all(path, ec);
        }
      } const cleanup{folder};
      prove_by_training(ex, q, nv, D, cap, cap_text, folder);
      // Every parameter chunk on file as well: the smoke run's small shape (the largest model of
      // the formula is bounded by the drive, hundreds of GB).
      if (q) prove_by_training(ex, q, nvp, D, cap, cap_text, folder, true);
    }
    print_figure(cap, cap_text);
    figure th{.bench = "offload",
              .name = "throughput_vs_zero_offload_at_its_max_" + gib_name,
              .value = tps_tide,
              .unit = "tokens/s",
              .anchor = "static_partition (ZeRO-Offload's placement) on its own largest model, same budgets",
              .anchor_value = tps_zo,
              .higher_is_better = true,
              .goal = 1.2,
              .detail = common};
    th.detail.insert(th.detail.end(), {{"layers", at_anchor.layers},
                                       {"channels", at_anchor.channels},
                                       {"params", zo_m.params},
                                       {"timed_steps", 2},
                                       {"loadavg_1min_after", load_average()}});
    print_figure(th, {{"rule", rule}});
  }

  // On paper: mixed precision, fp16 activations, one GPU.
  struct gpu {
    char const* name;
    double device_gib, host_gib;
  };
  std::string const formula_paper =
      "PatrickStar chunked: device >= A16 + 2 S16 (S16 = fp16 chunk of max(64 Mi, largest tensor) elements); "
      "14 B/param (fp16 param+grad slot 2, fp32 param, m, v 12; gradient reuse) <= 0.8 host + device - A16 - 2 S16; "
      "chunked16 = the same at 16 B/param (no gradient reuse). ZeRO-Offload static: device >= 2 B/param (fp16 "
      "params) + A16; host: 12 B/param fp32 state + 2 B/param fp16 grads <= 0.8 host. A16 = nn::gpt's planned "
      "activations at B=1, T=1024 with 2-byte elements (fp32 statistics). GPT-2 family as above, C up to 12288.";
  static constexpr int paper_all[] = {1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288};
  std::span<int const> const paper_grid = q ? std::span<int const>(paper_all).last(2) : std::span<int const>(paper_all);
  for (gpu const g : {gpu{"v100_paper", 32, 240}, gpu{"h100_paper", 80, 1024}}) {
    auto const D = static_cast<std::size_t>(g.device_gib * gib);
    double const host = 0.8 * g.host_gib * gib;
    auto const chunked_fits = [&](double bytes_per_param) {
      return [&, bytes_per_param](tide::nn::gpt_config const& c, std::size_t A, best_model& m) {
        double const P = double(tide::nn::parameter_count(c));
        double const S = 2.0 * double(std::max<std::size_t>(std::size_t{64} << 20, std::size_t(tide::nn::padded_vocab_of(c)) * std::size_t(c.channels)));
        m.device_bytes = double(A) + 2 * S;
        m.host_bytes = std::max(0.0, bytes_per_param * P - (double(D) - m.device_bytes));
        m.chunk_bytes = S;
        return m.device_bytes <= double(D) && m.host_bytes <= host;
      };
    };
    auto const static_fits = [&](tide::nn::gpt_config const& c, std::size_t A, best_model& m) {
      double const P = double(tide::nn::parameter_count(c));
      m.device_bytes = double(A) + 2 * P;
      m.host_bytes = 14 * P;
      return m.device_bytes <= double(D) && m.host_bytes <= host;
    };
    best_model const ch14 = largest(paper_grid, D, 2, max_layers, chunked_fits(14));
    best_model const ch16 = largest(paper_grid, D, 2, max_layers, chunked_fits(16));
    best_model const zo = largest(paper_grid, D, 2, max_layers, static_fits);
    figure c{.bench = "offload",
             .name = tide::detail::concat("max_model_vs_static_", g.name),
             .value = ch14.params,
             .unit = "parameters",
             .anchor = "ZeRO-Offload static placement on paper, same GPU and host",
             .anchor_value = zo.params,
             .higher_is_better = true,
             .goal = 2.5,
             .detail = {{"device_bytes", double(D)}, {"host_bytes", g.host_gib * gib}, {"computed_not_measured", 1}}};
    add_model(c.detail, "chunked14", ch14, max_layers);
    add_model(c.detail, "chunked16", ch16, max_layers);
    add_model(c.detail, "zero_offload", zo, max_layers);
    c.detail.emplace_back("chunked16_over_static", ch16.params / zo.params);
    print_figure(c, {{"formula", formula_paper}});
  }
}
