#pragma once
// The host path of tide::kernels::sgd, and the checks every backend makes before touching
// memory (the CUDA entries include this header for them).
//
// The grain walk, the vector body with its zero-padded tail and the threaded driver are the
// elementwise optimizers' shared machinery (kernels/detail/elementwise_step.hpp), as for Adam
// and AdamW: grains of elementwise_host_tuning::grain elements of one tensor, contiguous runs of
// grains per thread, whole vectors of lanes through sgd_update and the last partial vector
// through the SAME vector code on a zero-padded copy. Every element goes through identical
// instructions wherever a tensor, grain or slice boundary falls: results are bit-identical for
// any thread count and for a tensor list versus one flat chunk. This file keeps SGD's own parts:
// the coefficients, the hyper-parameter and record checks, and sgd_step, the policy that plugs
// sgd_update (math.hpp) into that machinery, with buf as its one state, untouched without
// momentum.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/elementwise_step.hpp"
#include "tide/kernels/sgd/math.hpp"

namespace tide::kernels {

// The coefficients of step t (1-based). Throws tide::error(usage) for t < 1, hyper-parameters
// torch.optim.SGD also rejects (negative lr, momentum or weight_decay; nesterov without
// momentum > 0 and dampening == 0), non-finite ones, and a non-finite grad_scale (an overflowed
// loss scale must skip the step, not poison the weights).
inline sgd_coefficients sgd_coefficients_for(sgd_hparams const& hp, std::int64_t t, float grad_scale) {
  TIDE_REQUIRE(t >= 1, "sgd step t is 1-based, got t = ", t, "; pass the number of steps taken before this one plus 1");
  TIDE_REQUIRE(std::isfinite(hp.lr) && hp.lr >= 0.f, "sgd needs a finite lr >= 0, got ", hp.lr);
  TIDE_REQUIRE(std::isfinite(hp.momentum) && hp.momentum >= 0.f, "sgd needs a finite momentum >= 0, got ",
               hp.momentum);
  TIDE_REQUIRE(std::isfinite(hp.dampening), "sgd needs a finite dampening, got ", hp.dampening);
  TIDE_REQUIRE(std::isfinite(hp.weight_decay) && hp.weight_decay >= 0.f,
               "sgd needs a finite weight_decay >= 0, got ", hp.weight_decay);
  TIDE_REQUIRE(!hp.nesterov || (hp.momentum > 0.f && hp.dampening == 0.f),
               "sgd with nesterov needs momentum > 0 and dampening == 0 (as torch.optim.SGD), got momentum ",
               hp.momentum, ", dampening ", hp.dampening);
  TIDE_REQUIRE(std::isfinite(grad_scale), "sgd got a non-finite grad_scale (", grad_scale,
               "); skip the step when the gradients overflowed (any_non_finite, global_grad_norm)");
  return {hp.lr,           hp.momentum, 1.f - hp.dampening, hp.weight_decay, grad_scale,
          hp.momentum != 0.f, t == 1,    hp.nesterov};
}

namespace detail {

template <class T>
inline constexpr bool is_sgd_tensor = false;
template <class Grad, class Work>
inline constexpr bool is_sgd_tensor<sgd_tensor<Grad, Work>> = true;

// SGD's step policy (detail/elementwise_step.hpp): sgd_update on p and one state, the momentum
// buffer buf, which is read and written only when the step uses momentum (and may be null
// otherwise).
struct sgd_step {
  static constexpr char const* name = "sgd";
  static constexpr char const* nullable = "only `working` (and `buf` without momentum) may be null";
  static constexpr bool optional_states = true;
  static constexpr int states = 1;
  using coefficients = sgd_coefficients;

  template <class Record>
  TIDE_HOST_DEVICE static step_states<1> state_arrays(Record const& r) {
    return {{r.buf}};
  }
  template <class Record>
  TIDE_HOST_DEVICE static step_states<1> prev_state_arrays(Record const& r) {
    return {{r.prev_buf}};
  }
  template <class Record>
  TIDE_HOST_DEVICE static step_sources<1> src_state_arrays(Record const& r) {
    return {{r.src_buf}};
  }
  TIDE_HOST_DEVICE static bool uses_states(sgd_coefficients const& c) { return c.use_momentum; }

  template <class V>
  TIDE_HOST_DEVICE static void update(V& p, V (&s)[1], V g, sgd_coefficients const& c) {
    sgd_update(p, s[0], g, c);
  }

  // Record i has a buf when the step uses momentum.
  template <class Record>
  static void check_states(Record const& r, std::size_t i, sgd_coefficients const& c) {
    TIDE_REQUIRE(r.n == 0 || !c.use_momentum || r.buf, "sgd tensor #", i, " (n = ", r.n,
                 ") has a null buf with momentum != 0; pass an fp32 momentum buffer of n elements (any contents "
                 "at t == 1)");
  }

  // The flat-chunk form's views as one record, after checking they agree. buf may be a default
  // view when the step has no momentum. Throws before anything is touched.
  template <class Grad, class Work, class Space>
  static sgd_tensor<std::remove_const_t<Grad>, Work> flat_record(tensor_view<float, Space> p,
                                                                 tensor_view<Grad, Space> g,
                                                                 tensor_view<float, Space> buf,
                                                                 tensor_view<Work, Space> working,
                                                                 bool use_momentum) {
    check_step_p<sgd_step>(p);
    check_step_like_p<sgd_step>(p, g, "g");
    if (use_momentum || buf.data() != nullptr) check_step_like_p<sgd_step>(p, buf, "buf (the momentum buffer)");
    if (working.data() != nullptr) check_step_like_p<sgd_step>(p, working, "working");
    return {p.data(), g.data(), use_momentum ? buf.data() : nullptr, working.data(), p.size()};
  }
};

}  // namespace detail

// One SGD step over a list of tensors (any contiguous range of sgd_tensor<Grad, Work>), in
// place, threaded over ex.pool. Bit-identical results for any thread count.
//
//   std::vector<tide::kernels::sgd_tensor<tide::bf16>> list = ...;  // fp32 p/buf, bf16 g and working
//   tide::kernels::sgd(ex, {.lr = 0.1f, .momentum = 0.9f, .nesterov = true}, step, list, clip);
template <std::ranges::contiguous_range List>
  requires detail::is_sgd_tensor<std::ranges::range_value_t<List>>
void sgd(exec<host> const& ex, sgd_hparams const& hp, std::int64_t t, List const& tensors, float grad_scale = 1.f) {
  detail::step_list<detail::sgd_step>(ex.pool, tensors, sgd_coefficients_for(hp, t, grad_scale));
}

// One SGD step over one flat chunk: p, g, buf and the working copy share one shape (buf may be
// a default view when hp.momentum == 0).
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void sgd(exec<host> const& ex, sgd_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
         tensor_view<float> buf, tensor_view<Work> working, float grad_scale = 1.f) {
  sgd_coefficients const c = sgd_coefficients_for(hp, t, grad_scale);
  auto const record = detail::sgd_step::flat_record(p, g, buf, working, c.use_momentum);
  detail::step_records<detail::sgd_step>(ex.pool, &record, 1, c);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void sgd(exec<host> const& ex, sgd_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
         tensor_view<float> buf, float grad_scale = 1.f) {
  sgd(ex, hp, t, p, g, buf, tensor_view<std::remove_const_t<Grad>>{}, grad_scale);
}

}  // namespace tide::kernels
