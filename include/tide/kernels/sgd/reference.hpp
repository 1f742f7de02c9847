#pragma once
// The scalar oracle for tide::kernels::sgd: torch.optim.SGD's algorithm written out as its
// documentation gives it, one element at a time in float. Independent of math.hpp's update on
// purpose; tests compare the host and CUDA paths with it.

#include <cstdint>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/sgd/math.hpp"

namespace tide::kernels::reference {

// One SGD step in place on contiguous views of n elements each: p (fp32), g, the momentum
// buffer buf (fp32; ignored when hp.momentum == 0, may then be a default view) and the working
// copy when `working` views memory (a default view: none). t is 1-based.
template <class Grad, class Work = float>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void sgd(sgd_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g, tensor_view<float> buf,
         tensor_view<Work> working = {}, float grad_scale = 1.f) {
  TIDE_REQUIRE(t >= 1, "reference::sgd needs t >= 1, got ", t);
  index_t const n = p.size();
  bool const momentum = hp.momentum != 0.f;
  TIDE_REQUIRE(g.size() == n && (!momentum || buf.size() == n) && (working.data() == nullptr || working.size() == n),
               "reference::sgd needs equal sizes, got p ", n, ", g ", g.size(), ", buf ", buf.size(), ", working ",
               working.size());
  for (index_t i = 0; i < n; ++i) {
    float& pi = p.data()[i];
    float d = to_float(g.data()[i]) * grad_scale;
    if (hp.weight_decay != 0.f) d = d + hp.weight_decay * pi;
    if (momentum) {
      float& b = buf.data()[i];
      b = t == 1 ? d : hp.momentum * b + (1.f - hp.dampening) * d;
      d = hp.nesterov ? d + hp.momentum * b : b;
    }
    pi = pi - hp.lr * d;
    if (working.data() != nullptr) working.data()[i] = from_float<Work>(pi);
  }
}

}  // namespace tide::kernels::reference
