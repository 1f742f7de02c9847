#pragma once
// The host path of tide::kernels::adamw, and the checks every backend makes before touching
// memory (the CUDA entries include this header for them). Also what AdamW shares with Adam
// (kernels/adam/host.hpp), whose records and coefficients are AdamW's: the coefficients, the
// record checks and the step-policy base.
//
// The grain walk, the vector body with its zero-padded tail and the threaded driver are the
// elementwise optimizers' shared machinery (kernels/detail/elementwise_step.hpp): grains of
// elementwise_host_tuning::grain elements of one tensor, contiguous runs of grains per thread,
// whole vectors of lanes through adamw_update and the last partial vector through the SAME
// vector code on a zero-padded copy. Results are bit-identical for any thread count and for a
// tensor list versus the same data as one flat chunk. This file keeps AdamW's own parts: the
// coefficients, the hyper-parameter and record checks, and adamw_step, the policy that plugs
// adamw_update (math.hpp) into that machinery.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adamw/math.hpp"
#include "tide/kernels/detail/elementwise_step.hpp"

namespace tide::kernels {

namespace detail {

// The coefficients of step t (1-based) of Adam or AdamW (`name`: which, for the messages; HP:
// adam_hparams or adamw_hparams, the same fields). Throws tide::error(usage) for t < 1,
// hyper-parameters torch.optim.Adam(W) also rejects, and a non-finite grad_scale (an overflowed
// loss scale must skip the step, not poison the weights).
template <class HP>
adamw_coefficients adam_family_coefficients(char const* name, HP const& hp, std::int64_t t, float grad_scale) {
  TIDE_REQUIRE(t >= 1, name, " step t is 1-based, got t = ", t,
               "; pass the number of steps taken before this one plus 1");
  TIDE_REQUIRE(std::isfinite(hp.lr) && hp.lr >= 0.f, name, " needs a finite lr >= 0, got ", hp.lr);
  TIDE_REQUIRE(hp.beta1 >= 0.f && hp.beta1 < 1.f, name, " needs 0 <= beta1 < 1, got ", hp.beta1);
  TIDE_REQUIRE(hp.beta2 >= 0.f && hp.beta2 < 1.f, name, " needs 0 <= beta2 < 1, got ", hp.beta2);
  TIDE_REQUIRE(std::isfinite(hp.eps) && hp.eps >= 0.f, name, " needs a finite eps >= 0, got ", hp.eps);
  TIDE_REQUIRE(std::isfinite(hp.weight_decay) && hp.weight_decay >= 0.f, name,
               " needs a finite weight_decay >= 0, got ", hp.weight_decay);
  TIDE_REQUIRE(std::isfinite(grad_scale), name, " got a non-finite grad_scale (", grad_scale,
               "); skip the step when the gradients overflowed (any_non_finite, global_grad_norm)");
  double const td = static_cast<double>(t);
  double const bias1 = 1.0 - std::pow(static_cast<double>(hp.beta1), td);
  double const bias2 = 1.0 - std::pow(static_cast<double>(hp.beta2), td);
  return {hp.lr,
          hp.beta1,
          hp.beta2,
          1.f - hp.beta1,  // exact (Sterbenz) for beta in [0.5, 1); one rounding below that
          1.f - hp.beta2,
          hp.eps,
          hp.weight_decay,
          static_cast<float>(1.0 / bias1),
          static_cast<float>(1.0 / bias2),
          grad_scale};
}

template <class T>
inline constexpr bool is_adamw_tensor = false;
template <class Grad, class Work>
inline constexpr bool is_adamw_tensor<adamw_tensor<Grad, Work>> = true;

// What Adam's and AdamW's step policies (detail/elementwise_step.hpp) share: the record
// (adamw_tensor) with its two states m and v, always read and written, and never null when
// the record has elements. Step supplies name and update.
template <class Step>
struct adam_family_step {
  static constexpr char const* nullable = "only `working` may be null";
  static constexpr bool optional_states = false;
  static constexpr int states = 2;
  using coefficients = adamw_coefficients;

  template <class Record>
  TIDE_HOST_DEVICE static step_states<2> state_arrays(Record const& r) {
    return {{r.m, r.v}};
  }
  template <class Record>
  TIDE_HOST_DEVICE static step_states<2> prev_state_arrays(Record const& r) {
    return {{r.prev_m, r.prev_v}};
  }
  template <class Record>
  TIDE_HOST_DEVICE static step_sources<2> src_state_arrays(Record const& r) {
    return {{r.src_m, r.src_v}};
  }
  TIDE_HOST_DEVICE static constexpr bool uses_states(coefficients const&) { return true; }

  template <class Record>
  static void check_states(Record const& r, std::size_t i, coefficients const&) {
    TIDE_REQUIRE(r.n == 0 || (r.m && r.v), Step::name, " tensor #", i, " (n = ", r.n, ") has a null ",
                 !r.m ? "m" : "v", " pointer; ", nullable);
  }

  // The flat-chunk form's views as one record, after checking they agree. Throws before
  // anything is touched.
  template <class Grad, class Work, class Space>
  static adamw_tensor<std::remove_const_t<Grad>, Work> flat_record(tensor_view<float, Space> p,
                                                                   tensor_view<Grad, Space> g,
                                                                   tensor_view<float, Space> m,
                                                                   tensor_view<float, Space> v,
                                                                   tensor_view<Work, Space> working) {
    check_step_p<Step>(p);
    check_step_like_p<Step>(p, g, "g");
    check_step_like_p<Step>(p, m, "m");
    check_step_like_p<Step>(p, v, "v");
    if (working.data() != nullptr) check_step_like_p<Step>(p, working, "working");
    return {p.data(), g.data(), m.data(), v.data(), working.data(), p.size()};
  }
};

// AdamW's step policy: adamw_update on p, m, v.
struct adamw_step : adam_family_step<adamw_step> {
  static constexpr char const* name = "adamw";

  template <class V>
  TIDE_HOST_DEVICE static void update(V& p, V (&s)[2], V g, adamw_coefficients const& c) {
    adamw_update(p, s[0], s[1], g, c);
  }
};

}  // namespace detail

// The coefficients of step t (1-based). Throws tide::error(usage) for t < 1, hyper-parameters
// torch.optim.AdamW also rejects, and a non-finite grad_scale (an overflowed loss scale must
// skip the step, not poison the weights).
inline adamw_coefficients adamw_coefficients_for(adamw_hparams const& hp, std::int64_t t, float grad_scale) {
  return detail::adam_family_coefficients("adamw", hp, t, grad_scale);
}

// One AdamW step over a list of tensors (any contiguous range of adamw_tensor<Grad, Work>),
// in place, threaded over ex.pool. Bit-identical results for any thread count.
//
//   std::vector<tide::kernels::adamw_tensor<tide::bf16>> list = ...;  // fp32 p/m/v, bf16 g and working
//   tide::kernels::adamw(ex, {.lr = 3e-4f, .weight_decay = 0.1f}, step, list, clip);
template <std::ranges::contiguous_range List>
  requires detail::is_adamw_tensor<std::ranges::range_value_t<List>>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, List const& tensors, float grad_scale = 1.f) {
  detail::step_list<detail::adamw_step>(ex.pool, tensors, adamw_coefficients_for(hp, t, grad_scale));
}

// One AdamW step over one flat chunk: p, g, m, v and the working copy share one shape.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
           tensor_view<float> m, tensor_view<float> v, tensor_view<Work> working, float grad_scale = 1.f) {
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adamw_step::flat_record(p, g, m, v, working);
  detail::step_records<detail::adamw_step>(ex.pool, &record, 1, c);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
           tensor_view<float> m, tensor_view<float> v, float grad_scale = 1.f) {
  adamw(ex, hp, t, p, g, m, v, tensor_view<std::remove_const_t<Grad>>{}, grad_scale);
}

}  // namespace tide::kernels
