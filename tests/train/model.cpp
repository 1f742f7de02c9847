// train/model.hpp: nn::gpt_spec and a minimal model of one's own satisfy ModelSpec; a spec or a
// model missing any one member does not (and check_model_spec names it: tests/compile_fail/);
// the minimal model of docs/trainer.md runs forward and backward through a scheduler's hooks.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tide/nn/gpt.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/train/model.hpp"

namespace {

using namespace tide::literals;
namespace tt = tide::train;
using host_exec = tide::exec<tide::host>;

// ---- the minimal model of docs/trainer.md, "Writing your own model" ---------------------------

// y = x w + b for x (N, 4): one block (0) reading both parameters; loss = mean (y - t)^2.
template <class Hooks>
class linear {
 public:
  struct batch_type {
    tide::tensor_view<float const> x, t;  // (N, 4), (N)
  };

  linear(tide::parameter_list params, Hooks hooks) : params_(std::move(params)), hooks_(hooks) {
    float* w = hooks_.param_data(0);  // before the first step: host addresses, to initialise
    for (int k = 0; k < 4; ++k) w[k] = 0.25f * float(k + 1);
  }

  float forward(host_exec const&, batch_type const& b) {
    tide::index_t const n = b.x.extent(0);
    x_ = b.x;
    r_.resize(static_cast<std::size_t>(n));
    hooks_.pre_forward(0);  // block 0's parameters are on the device from here ...
    float const* w = hooks_.param_data(0);
    float const bias = *hooks_.param_data(1);
    double loss = 0;
    for (tide::index_t i = 0; i < n; ++i) {
      float y = bias;
      for (tide::index_t k = 0; k < 4; ++k) y += b.x(i, k) * w[k];
      r_[static_cast<std::size_t>(i)] = y - b.t(i);
      loss += double(y - b.t(i)) * double(y - b.t(i));
    }
    hooks_.post_forward(0);  // ... to here: do not keep w past this line
    return float(loss / double(n));
  }

  void backward(host_exec const&, float loss_scale) {
    tide::index_t const n = x_.extent(0);
    hooks_.pre_backward(0);
    float* dw = hooks_.grad_data(0);  // zero-filled the first time: accumulate (+=)
    float* db = hooks_.grad_data(1);
    for (tide::index_t i = 0; i < n; ++i) {
      float const g = loss_scale * 2.f * r_[static_cast<std::size_t>(i)] / float(n);
      for (tide::index_t k = 0; k < 4; ++k) dw[k] += g * x_(i, k);
      *db += g;
    }
    hooks_.post_backward(0);
  }

  [[nodiscard]] tide::parameter_list const& parameters() const noexcept { return params_; }
  static std::size_t tokens_in(batch_type const& b) noexcept { return static_cast<std::size_t>(b.x.extent(0)); }

 private:
  tide::parameter_list params_;
  Hooks hooks_;
  tide::tensor_view<float const> x_;  // the caller keeps the batch alive until backward
  std::vector<float> r_;              // y - t, (N); host memory is fine on tide::host
};

struct linear_spec {
  using backend = tide::host;
  using element_type = float;
  template <class Hooks>
  using model_type = linear<Hooks>;

  [[nodiscard]] tide::parameter_list parameters() const {
    tide::parameter_list p;
    p.add("w", 0, {4}, tide::dtype::f32);  // name, owning block, shape, dtype of element_type
    p.add("b", 0, {1}, tide::dtype::f32);
    return p;
  }
  [[nodiscard]] tide::block_uses uses() const { return {0, {{0, 1}}}; }  // block 0 reads 0 and 1
  template <class Hooks>
  [[nodiscard]] model_type<Hooks> build(tide::memory::device_arena<tide::host>&, Hooks hooks) const {
    return model_type<Hooks>(parameters(), hooks);
  }
};

using resident_scheduler = tide::offload::scheduler<tide::host, float, tide::offload::resident>;
using resident_hooks = tide::offload::hooks<resident_scheduler>;

// ---- what satisfies the concepts ----------------------------------------------------------------

static_assert(tt::ModelSpec<linear_spec>);
static_assert(tt::ModelSpec<linear_spec, resident_hooks>);
static_assert(tt::ModelSpec<tide::nn::gpt_spec<tide::host>>);
static_assert(tt::ModelSpec<tide::nn::gpt_spec<tide::host, tide::bf16>>);
static_assert(tt::ModelSpec<tide::nn::gpt_spec<tide::host, tide::f16>>);
static_assert(tt::Model<linear<resident_hooks>, tide::host>);
static_assert(tt::Model<tide::nn::gpt<tide::host, float, resident_hooks>, tide::host>);
static_assert(std::is_same_v<tt::trainer_hooks_t<linear_spec>, resident_hooks>);
static_assert(tt::check_model_spec<linear_spec, resident_hooks>());
static_assert(tt::check_model_spec<tide::nn::gpt_spec<tide::host>, resident_hooks>());

// ---- specs missing one member each ----------------------------------------------------------------

struct missing_backend {
  using element_type = float;
};
struct backend_not_a_backend {
  using backend = int;
  using element_type = float;
};
struct missing_element_type {
  using backend = tide::host;
};
struct element_type_double {
  using backend = tide::host;
  using element_type = double;
};
struct missing_parameters {
  using backend = tide::host;
  using element_type = float;
  tide::block_uses uses() const;
};
struct missing_uses {
  using backend = tide::host;
  using element_type = float;
  tide::parameter_list parameters() const;
};
struct missing_model_type {
  using backend = tide::host;
  using element_type = float;
  tide::parameter_list parameters() const;
  tide::block_uses uses() const;
};
struct missing_build : missing_model_type {
  template <class Hooks>
  using model_type = linear<Hooks>;
};
struct build_returns_a_reference : missing_build {
  template <class Hooks>
  model_type<Hooks>& build(tide::memory::device_arena<tide::host>&, Hooks) const;
};

static_assert(!tt::ModelSpec<int>);
static_assert(!tt::ModelSpec<missing_backend> && !tt::SpecHasBackend<missing_backend>);
static_assert(!tt::ModelSpec<backend_not_a_backend> && !tt::SpecHasBackend<backend_not_a_backend>);
static_assert(!tt::ModelSpec<missing_element_type> && !tt::SpecHasElementType<missing_element_type>);
static_assert(!tt::ModelSpec<element_type_double> && !tt::SpecHasElementType<element_type_double>);
static_assert(!tt::ModelSpec<missing_parameters> && !tt::SpecHasParameters<missing_parameters>);
static_assert(!tt::ModelSpec<missing_uses> && !tt::SpecHasUses<missing_uses>);
static_assert(!tt::ModelSpec<missing_model_type> && !tt::SpecHasModelType<missing_model_type, resident_hooks>);
static_assert(!tt::ModelSpec<missing_build> && !tt::SpecBuildsModel<missing_build, resident_hooks>);
static_assert(!tt::ModelSpec<build_returns_a_reference>);
// Each fails only its own requirement: the earlier ones still hold.
static_assert(tt::SpecHasUses<missing_model_type> && tt::SpecHasModelType<missing_build, resident_hooks>);

// ---- models missing one member each (declarations suffice: concepts call nothing) -----------------

struct rows {
  int n;
};
struct missing_batch_type {
  float forward(host_exec const&, rows const&);
  void backward(host_exec const&, float);
  tide::parameter_list const& parameters() const;
  static std::size_t tokens_in(rows const&);
};
struct missing_forward {
  using batch_type = rows;
  void backward(host_exec const&, float);
  tide::parameter_list const& parameters() const;
  static std::size_t tokens_in(rows const&);
};
struct forward_returns_void : missing_forward {
  void forward(host_exec const&, rows const&);
};
struct missing_backward {
  using batch_type = rows;
  float forward(host_exec const&, rows const&);
  tide::parameter_list const& parameters() const;
  static std::size_t tokens_in(rows const&);
};
struct missing_model_parameters {
  using batch_type = rows;
  float forward(host_exec const&, rows const&);
  void backward(host_exec const&, float);
  static std::size_t tokens_in(rows const&);
};
struct parameters_by_value : missing_model_parameters {
  tide::parameter_list parameters() const;
};
struct missing_tokens_in {
  using batch_type = rows;
  float forward(host_exec const&, rows const&);
  void backward(host_exec const&, float);
  tide::parameter_list const& parameters() const;
};
struct tokens_in_not_static : missing_tokens_in {
  std::size_t tokens_in(rows const&) const;
};

// A spec that is right in itself, building M.
template <class M>
struct spec_of : missing_model_type {
  template <class Hooks>
  using model_type = M;
  template <class Hooks>
  M build(tide::memory::device_arena<tide::host>&, Hooks) const;
};

static_assert(!tt::Model<missing_batch_type, tide::host> && !tt::ModelHasBatchType<missing_batch_type>);
static_assert(!tt::Model<missing_forward, tide::host> && !tt::ModelHasForward<missing_forward, tide::host>);
static_assert(tt::ModelHasForward<forward_returns_void, tide::host> &&
              !tt::ModelForwardReturnsLoss<forward_returns_void, tide::host>);
static_assert(!tt::Model<missing_backward, tide::host> && !tt::ModelHasBackward<missing_backward, tide::host>);
static_assert(!tt::Model<missing_model_parameters, tide::host> && !tt::ModelHasParameters<missing_model_parameters>);
static_assert(!tt::ModelHasParameters<parameters_by_value>);
static_assert(!tt::Model<missing_tokens_in, tide::host> && !tt::ModelCountsTokens<missing_tokens_in>);
static_assert(!tt::ModelCountsTokens<tokens_in_not_static>);
static_assert(!tt::ModelSpec<spec_of<missing_batch_type>> && !tt::ModelSpec<spec_of<missing_forward>> &&
              !tt::ModelSpec<spec_of<forward_returns_void>> && !tt::ModelSpec<spec_of<missing_backward>> &&
              !tt::ModelSpec<spec_of<missing_model_parameters>> && !tt::ModelSpec<spec_of<missing_tokens_in>>);
static_assert(tt::SpecBuildsModel<spec_of<missing_backward>, resident_hooks>);  // the spec part is right

// ---- stages: nn::gpt is a StagedModel (and a SplitBackwardModel); a model without forward_blocks still trains

struct staged_but_no_forward_blocks : missing_tokens_in {
  static std::size_t tokens_in(rows const&);
  int first_block() const;
  int last_block() const;
  void backward_blocks(host_exec const&, int, int, int, float);
};
static_assert(tt::StagedModel<tide::nn::gpt<tide::host>, tide::host>);
static_assert(tt::StagedModel<tide::nn::gpt<tide::host, float, resident_hooks>, tide::host>);
static_assert(tt::check_staged_model<tide::nn::gpt<tide::host>, tide::host>());
static_assert(tt::Model<linear<resident_hooks>, tide::host> && !tt::StagedModel<linear<resident_hooks>, tide::host>);
static_assert(tt::Model<staged_but_no_forward_blocks, tide::host> &&
              tt::StagedHasBlocks<staged_but_no_forward_blocks> &&
              !tt::StagedHasForwardBlocks<staged_but_no_forward_blocks, tide::host> &&
              !tt::StagedModel<staged_but_no_forward_blocks, tide::host>);
static_assert(tt::ModelSpec<linear_spec>);  // and it still trains: the spec needs no stages
// What the executors need is declared where they are (pipeline/model.hpp): nn::gpt, with or
// without hooks, also runs its backward in two passes; a staged model without them does not.
static_assert(tide::pipeline::StagedModel<tide::nn::gpt<tide::host>, tide::host>);
static_assert(tide::pipeline::SplitBackwardModel<tide::nn::gpt<tide::host>, tide::host>);
static_assert(tide::pipeline::SplitBackwardModel<tide::nn::gpt<tide::sealed, tide::bf16>, tide::sealed>);
static_assert(!tide::pipeline::StagedModel<staged_but_no_forward_blocks, tide::host>);
static_assert(!tide::pipeline::SplitBackwardModel<linear<resident_hooks>, tide::host>);

// ---- the stand-ins a trainer names for a wrong spec --------------------------------------------

static_assert(std::is_same_v<tt::spec_backend_t<int>, tide::host> && std::is_same_v<tt::spec_element_t<int>, float>);
static_assert(std::is_same_v<tt::spec_element_t<tide::nn::gpt_spec<tide::host, tide::bf16>>, tide::bf16>);
static_assert(std::is_same_v<tt::spec_model_t<missing_model_type, resident_hooks>, tt::rejected_model>);
static_assert(std::is_same_v<tt::spec_model_t<linear_spec, resident_hooks>, linear<resident_hooks>>);
static_assert(std::is_same_v<tt::model_batch_t<missing_batch_type>, tt::rejected_model::batch_type>);
static_assert(std::is_same_v<tt::model_batch_t<missing_backward>, rows>);

}  // namespace

TEST_CASE("model: the minimal spec lists two parameters, both read by block 0") {
  linear_spec const spec;
  auto const params = spec.parameters();
  CHECK(params.size() == 2);
  CHECK(params.count() == 5);
  CHECK(params[0].name() == "w");
  CHECK(params[1].layer == 0);
  auto const uses = spec.uses();
  CHECK(uses.first_block == 0);
  CHECK(uses.last_block() == 0);
  CHECK(uses.of(0).size() == 2);
}

TEST_CASE("model: the minimal model's gradients through a scheduler's hooks are the hand-computed ones") {
  tide::thread_pool pool(1);
  host_exec const ex{pool};
  tide::memory::device_arena<tide::host> arena({.budget = 4_MiB});
  linear_spec const spec;
  resident_scheduler sched(ex, arena, spec.parameters(), spec.uses(), {}, {.defer_optimizer = true});
  auto model = spec.build(arena, resident_hooks{&sched});

  std::vector<float> const x = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1};  // (3, 4)
  std::vector<float> const t = {1, 1, 1};                                // (3)
  linear<resident_hooks>::batch_type const b{{x.data(), {3, 4}}, {t.data(), {3}}};
  // w = (0.25, 0.5, 0.75, 1), b = 0: y = (0.25, 0.5, 2.5), r = y - t = (-0.75, -0.5, 1.5).
  float const loss = model.forward(ex, b);
  CHECK(loss == doctest::Approx((0.5625 + 0.25 + 2.25) / 3));
  model.backward(ex, 1.f);
  auto const grads = sched.gradients();
  REQUIRE(grads.size() == 2);
  // dw_k = 2/3 sum_i r_i x_ik; db = 2/3 sum_i r_i.
  float const expect_w[4] = {2.f / 3 * 0.75f, 2.f / 3 * 1.0f, 2.f / 3 * 1.5f, 2.f / 3 * 1.5f};
  for (int k = 0; k < 4; ++k) CHECK(grads[0].g[k] == doctest::Approx(expect_w[k]));
  CHECK(grads[1].g[0] == doctest::Approx(2.f / 3 * 0.25f));
  sched.step();
  CHECK(linear_spec::model_type<resident_hooks>::tokens_in(b) == 3);
}
