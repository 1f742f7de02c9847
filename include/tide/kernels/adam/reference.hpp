#pragma once
// The scalar oracle for tide::kernels::adam: Adam with L2 weight decay written out as
// torch.optim.Adam documents it, one element at a time in float, dividing by the bias
// corrections (the fast paths multiply by reciprocals). Independent of the update in math.hpp
// on purpose; tests compare the host and CUDA paths with it.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adam/math.hpp"

namespace tide::kernels::reference {

// One Adam step in place on contiguous views of n elements each: p, m, v (fp32), g, and the
// working copy when `working` views memory (a default view: none). t is 1-based.
template <class Grad, class Work = float>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adam(adam_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g, tensor_view<float> m,
          tensor_view<float> v, tensor_view<Work> working = {}, float grad_scale = 1.f) {
  TIDE_REQUIRE(t >= 1, "reference::adam needs t >= 1, got ", t);
  index_t const n = p.size();
  TIDE_REQUIRE(g.size() == n && m.size() == n && v.size() == n && (working.data() == nullptr || working.size() == n),
               "reference::adam needs equal sizes, got p ", n, ", g ", g.size(), ", m ", m.size(), ", v ", v.size(),
               ", working ", working.size());
  float const bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(t)));
  float const bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(t)));
  for (index_t i = 0; i < n; ++i) {
    float& mi = m.data()[i];
    float& vi = v.data()[i];
    float& pi = p.data()[i];
    float const gi = to_float(g.data()[i]) * grad_scale + hp.weight_decay * pi;  // L2: decay joins the gradient
    mi = hp.beta1 * mi + (1.f - hp.beta1) * gi;
    vi = hp.beta2 * vi + (1.f - hp.beta2) * gi * gi;
    float const m_hat = mi / bias1;
    float const v_hat = vi / bias2;
    pi = pi - hp.lr * (m_hat / (std::sqrt(v_hat) + hp.eps));
    if (working.data() != nullptr) working.data()[i] = from_float<Work>(pi);
  }
}

}  // namespace tide::kernels::reference
