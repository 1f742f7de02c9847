#pragma once
// The host path of tide::kernels::adam, and the checks every backend makes before touching
// memory (the CUDA entries include this header for them).
//
// Adam's records and coefficients are AdamW's, and so are their checks (kernels/adamw/host.hpp:
// adam_family_coefficients, adam_family_step); the grain walk, the vector body with its
// zero-padded tail and the threaded driver are the elementwise optimizers' shared machinery
// (kernels/detail/elementwise_step.hpp). This file keeps what is Adam's own: its coefficients'
// entry and adam_step, the policy that plugs adam_update (math.hpp) into that machinery. Every
// element goes through identical instructions wherever a tensor, grain or slice boundary falls:
// results are bit-identical for any thread count and for a tensor list versus one flat chunk.

#include <cstdint>
#include <ranges>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adam/math.hpp"
#include "tide/kernels/adamw/host.hpp"
#include "tide/kernels/detail/elementwise_step.hpp"

namespace tide::kernels {

// The coefficients of step t (1-based). Throws tide::error(usage) for t < 1, hyper-parameters
// torch.optim.Adam also rejects, and a non-finite grad_scale (an overflowed loss scale must
// skip the step, not poison the weights).
inline adam_coefficients adam_coefficients_for(adam_hparams const& hp, std::int64_t t, float grad_scale) {
  return detail::adam_family_coefficients("adam", hp, t, grad_scale);
}

namespace detail {

// Adam's step policy: adam_update on AdamW's records.
struct adam_step : adam_family_step<adam_step> {
  static constexpr char const* name = "adam";

  template <class V>
  TIDE_HOST_DEVICE static void update(V& p, V (&s)[2], V g, adam_coefficients const& c) {
    adam_update(p, s[0], s[1], g, c);
  }
};

}  // namespace detail

// One Adam step over a list of tensors (any contiguous range of adam_tensor<Grad, Work>, the
// same type as adamw_tensor), in place, threaded over ex.pool. Bit-identical results for any
// thread count.
//
//   std::vector<tide::kernels::adam_tensor<tide::bf16>> list = ...;  // fp32 p/m/v, bf16 g and working
//   tide::kernels::adam(ex, {.lr = 1e-3f, .weight_decay = 1e-4f}, step, list, clip);
template <std::ranges::contiguous_range List>
  requires detail::is_adamw_tensor<std::ranges::range_value_t<List>>
void adam(exec<host> const& ex, adam_hparams const& hp, std::int64_t t, List const& tensors, float grad_scale = 1.f) {
  detail::step_list<detail::adam_step>(ex.pool, tensors, adam_coefficients_for(hp, t, grad_scale));
}

// One Adam step over one flat chunk: p, g, m, v and the working copy share one shape.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adam(exec<host> const& ex, adam_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
          tensor_view<float> m, tensor_view<float> v, tensor_view<Work> working, float grad_scale = 1.f) {
  adam_coefficients const c = adam_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adam_step::flat_record(p, g, m, v, working);
  detail::step_records<detail::adam_step>(ex.pool, &record, 1, c);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void adam(exec<host> const& ex, adam_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
          tensor_view<float> m, tensor_view<float> v, float grad_scale = 1.f) {
  adam(ex, hp, t, p, g, m, v, tensor_view<std::remove_const_t<Grad>>{}, grad_scale);
}

}  // namespace tide::kernels
