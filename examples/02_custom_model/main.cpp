// 02_custom_model: your own model, trained through tide::train::make_trainer with its model
// data offloaded in chunks. Here a two-layer MLP learns a synthetic regression,
//   y = sin(x A) (N, O) from x (N, D), A a fixed random (D, O) matrix,
// under a device budget smaller than its parameters, gradients and AdamW state.
//
// What a model needs to plug in (docs/trainer.md):
//   1. a spec: `backend`, `parameters()` (a named parameter_list, each tensor tagged with the
//      block that owns it), `uses()` (which parameters each block reads), `model_type<Hooks>`
//      and `build(arena, hooks)`;
//   2. the model: `forward(ex, batch) -> loss`, `backward(ex, loss_scale)`, `parameters()`,
//      `batch_type`, `tokens_in(batch)`; around each block's forward and backward it calls the
//      hooks, and it asks the hooks for parameter and gradient addresses only between a block's
//      pre_* and post_* calls (the chunks may move in between).
//
//   example_02_custom_model [--steps 1000] [--budget-ratio 0.85] [--check BELOW]
// --check BELOW: exit 1 unless the final validation loss is below BELOW.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <vector>

#include <tide/kernels/gelu/gelu.hpp>
#include <tide/kernels/matmul/matmul.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/core/parameters.hpp>
#include <tide/offload/schedulers.hpp>
#include <tide/optim/adamw.hpp>
#include <tide/train/trainer.hpp>

using namespace tide::literals;
using tide::index_t;
using host_exec = tide::exec<tide::host>;

constexpr index_t D = 64, H = 256, O = 16;  // input, hidden, output widths

// ---- the model --------------------------------------------------------------------------------

// Block 0: h = gelu(x W1^T + b1); block 1: out = h W2^T + b2; loss = mean (out - y)^2.
template <class Hooks>
class mlp {
 public:
  using view = tide::tensor_view<float>;
  using cview = tide::tensor_view<float const>;
  struct batch_type {
    cview x, y;  // (N, D), (N, O)
  };

  mlp(tide::parameter_list params, tide::memory::device_arena<tide::host>& arena, Hooks hooks)
      : params_(std::move(params)), arena_(&arena), hooks_(hooks) {
    init();
  }
  mlp(mlp const&) = delete;
  ~mlp() { release(); }

  [[nodiscard]] tide::parameter_list const& parameters() const noexcept { return params_; }
  static std::size_t tokens_in(batch_type const& b) noexcept { return static_cast<std::size_t>(b.x.extent(0)); }

  float forward(host_exec const& ex, batch_type const& b) {
    index_t const N = b.x.extent(0);
    prepare(N);
    x_ = b.x;
    hooks_.pre_forward(0);  // block 0's chunks are now on the device: ask for addresses after this
    tide::kernels::matmul_forward_gelu(ex, act(h_, {N, H}), act(pre_, {N, H}), b.x, param(0, {H, D}),
                                       cview(param(1, {H})));
    hooks_.post_forward(0);
    hooks_.pre_forward(1);
    auto const out = act(out_, {N, O});
    tide::kernels::matmul_forward(ex, out, cview(act(h_, {N, H})), cview(param(2, {O, H})), cview(param(3, {O})));
    hooks_.post_forward(1);
    // The loss and its gradient (the "head"; no parameters, so no hooks).
    double loss = 0;
    auto const dout = act(dout_, {N, O});
    for (index_t i = 0; i < N * O; ++i) {
      float const d = out.data()[i] - b.y.data()[i];
      loss += double(d) * d;
      dout.data()[i] = 2.f * d / float(N * O);
    }
    return float(loss / double(N * O));
  }

  void backward(host_exec const& ex, float loss_scale = 1.f) {
    index_t const N = rows_;
    auto const dout = act(dout_, {N, O});
    for (index_t i = 0; i < N * O; ++i) dout.data()[i] *= loss_scale;
    auto const dh = act(dh_, {N, H});
    std::fill(dh.data(), dh.data() + N * H, 0.f);
    hooks_.pre_backward(1);  // gradient chunks arrive zero-filled the first time: kernels add (+=)
    tide::kernels::matmul_backward(ex, dh, grad(2, {O, H}), grad(3, {O}), cview(dout), cview(act(h_, {N, H})),
                                   cview(param(2, {O, H})));
    hooks_.post_backward(1);
    hooks_.pre_backward(0);
    auto const dx = act(dx_, {N, D});  // unused, but the kernel writes it
    std::fill(dx.data(), dx.data() + N * D, 0.f);
    tide::kernels::matmul_backward_gelu(ex, dx, grad(0, {H, D}), grad(1, {H}), dh, cview(act(pre_, {N, H})), x_,
                                        cview(param(0, {H, D})));
    hooks_.post_backward(0);
  }

 private:
  view param(std::uint32_t i, tide::shape s) { return {hooks_.param_data(i), s}; }
  view grad(std::uint32_t i, tide::shape s) { return {hooks_.grad_data(i), s}; }

  // Parameters are initialised on the host before the first step (the scheduler hands out their
  // host addresses then): W ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), b = 0.
  void init() {
    std::uint64_t s = 12345;
    auto uniform = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<std::uint32_t>(s >> 40)) * 0x1p-24f * 2.f - 1.f;
    };
    for (std::uint32_t i = 0; i < params_.size(); ++i) {
      auto const& p = params_[i];
      float* w = hooks_.param_data(i);
      float const scale = p.shape.rank == 2 ? 1.f / std::sqrt(float(p.shape.dims[1])) : 0.f;
      for (index_t k = 0; k < p.numel(); ++k) w[k] = scale * uniform();
    }
  }

  // Activations: plain arena blocks sized for N rows (non-model data, which the tracer measures).
  void prepare(index_t N) {
    if (N == rows_) return;
    release();
    std::size_t const f = sizeof(float);
    for (auto [slot, n] : {std::pair{&h_, N * H}, {&pre_, N * H}, {&out_, N * O}, {&dout_, N * O}, {&dh_, N * H},
                           {&dx_, N * D}})
      *slot = static_cast<float*>(arena_->allocate(std::size_t(n) * f));
    rows_ = N;
  }
  void release() {
    if (rows_ == 0) return;
    std::size_t const f = sizeof(float);
    for (auto [slot, n] : {std::pair{h_, rows_ * H}, {pre_, rows_ * H}, {out_, rows_ * O}, {dout_, rows_ * O},
                           {dh_, rows_ * H}, {dx_, rows_ * D}})
      arena_->deallocate(slot, std::size_t(n) * f);
    rows_ = 0;
  }
  view act(float* p, tide::shape s) { return {p, s}; }

  tide::parameter_list params_;
  tide::memory::device_arena<tide::host>* arena_;
  Hooks hooks_;
  index_t rows_ = 0;
  float *h_ = nullptr, *pre_ = nullptr, *out_ = nullptr, *dout_ = nullptr, *dh_ = nullptr, *dx_ = nullptr;
  cview x_;
};

// ---- the spec the trainer builds it from -----------------------------------------------------

struct mlp_spec {
  using backend = tide::host;
  using element_type = float;  // of parameters and gradients
  template <class Hooks>
  using model_type = mlp<Hooks>;

  [[nodiscard]] tide::parameter_list parameters() const {
    tide::parameter_list p;
    p.add("fc1.w", 0, {H, D}, tide::dtype::f32);  // block 0
    p.add("fc1.b", 0, {H}, tide::dtype::f32);
    p.add("fc2.w", 1, {O, H}, tide::dtype::f32);  // block 1
    p.add("fc2.b", 1, {O}, tide::dtype::f32);
    return p;
  }
  [[nodiscard]] tide::block_uses uses() const { return {0, {{0, 1}, {2, 3}}}; }
  template <class Hooks>
  [[nodiscard]] model_type<Hooks> build(tide::memory::device_arena<tide::host>& arena, Hooks hooks) const {
    return model_type<Hooks>(parameters(), arena, hooks);
  }
};

// ---- the data ---------------------------------------------------------------------------------

struct dataset {
  std::vector<float> x, y;  // (N, D), (N, O)
  index_t n;
  dataset(index_t rows, std::uint64_t seed) : x(std::size_t(rows * D)), y(std::size_t(rows * O)), n(rows) {
    std::uint64_t s = seed;
    auto normal = [&] {  // a sum of 4 uniforms, scaled: close enough to N(0, 1) for data
      float t = 0;
      for (int k = 0; k < 4; ++k) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t += static_cast<float>(static_cast<std::uint32_t>(s >> 40)) * 0x1p-24f - 0.5f;
      }
      return t * 1.7320508f;
    };
    for (auto& v : x) v = normal();
    std::vector<float> A(std::size_t(D * O));  // the same A for every dataset
    std::uint64_t a = 99;
    for (auto& v : A) {
      a = a * 6364136223846793005ull + 1442695040888963407ull;
      v = (static_cast<float>(static_cast<std::uint32_t>(a >> 40)) * 0x1p-24f * 2.f - 1.f) * 0.25f;
    }
    for (index_t i = 0; i < rows; ++i)
      for (index_t o = 0; o < O; ++o) {
        float t = 0;
        for (index_t d = 0; d < D; ++d) t += x[std::size_t(i * D + d)] * A[std::size_t(d * O + o)];
        y[std::size_t(i * O + o)] = std::sin(t);
      }
  }
};

int main(int argc, char** argv) try {
  int steps = 1000;
  double ratio = 0.85, check = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view const k = argv[i], v = argv[i + 1];
    auto num = [&](auto& out) {
      auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
      TIDE_CHECK(ec == std::errc{} && end == v.data() + v.size(), usage, k, " wants a number, got '", v, "'");
    };
    if (k == "--steps") num(steps);
    else if (k == "--budget-ratio") num(ratio);
    else if (k == "--check") num(check);
    else TIDE_FAIL(usage, "unknown flag ", k, "; flags: --steps --budget-ratio --check");
  }
  constexpr index_t batch = 64;
  std::size_t const model_data = 16 * static_cast<std::size_t>(mlp_spec{}.parameters().count());
  std::size_t const activations = std::size_t(batch) * (3 * H + 2 * O + D) * sizeof(float) + 4_KiB;
  auto const budget = activations + static_cast<std::size_t>(ratio * double(model_data));
  namespace off = tide::offload;
  auto trainer = tide::train::make_trainer(
      mlp_spec{}, off::chunked<off::belady>{.device_budget = budget, .chunk_bytes = 64_KiB},
      tide::optim::adamw{.lr = 3e-3f, .weight_decay = 0.f, .schedule = {.warmup_steps = 10, .total_steps = steps}});
  std::printf("MLP %lld -> %lld -> %lld, %lld parameters; model data %.2f MiB, device budget %.2f MiB "
              "(activations %.2f MiB + %.0f%% of the model data)\n",
              static_cast<long long>(D), static_cast<long long>(H), static_cast<long long>(O),
              static_cast<long long>(mlp_spec{}.parameters().count()), double(model_data) / double(1_MiB),
              double(budget) / double(1_MiB), double(activations) / double(1_MiB), 100 * ratio);

  dataset const train(16384, 1), validation(1024, 2);
  auto slice = [&](dataset const& d, index_t at) {
    return decltype(trainer)::batch_type{{d.x.data() + at * D, {batch, D}}, {d.y.data() + at * O, {batch, O}}};
  };
  auto evaluate = [&] {
    trainer.scheduler().begin_evaluation();
    double sum = 0;
    for (index_t at = 0; at < validation.n; at += batch) sum += trainer.model().forward(trainer.executor(), slice(validation, at));
    trainer.scheduler().end_evaluation();
    return sum / double(validation.n / batch);
  };
  double const before = evaluate();
  tide::train::step_stats st{};
  for (int s = 0; s < steps; ++s) {
    st = trainer.step(slice(train, (s * batch) % train.n));
    if ((s + 1) % 200 == 0)
      std::printf("step %4d  loss %.5f  moved %.2f MiB  evictions %zu  stall %.2f ms\n", s + 1, double(st.loss),
                  double(st.bytes_moved) / double(1_MiB), st.offload.evictions, st.stall_ms);
  }
  double const after = evaluate();
  std::printf("validation loss (mean squared error): %.5f before, %.5f after (predicting 0 scores %.3f)\n", before,
              after, 0.5);
  if (check >= 0) {
    if (st.bytes_moved == 0) {  // the check is of an offloaded run: the budget must not hold the model
      std::fprintf(stderr, "the last step moved no bytes: the budget held the whole model, nothing was offloaded\n");
      return 1;
    }
    return after < check ? 0 : 1;
  }
  return 0;
} catch (tide::error const& e) {
  std::fprintf(stderr, "example_02_custom_model: %s\n", e.message().c_str());
  return 2;
}
