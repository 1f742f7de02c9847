#pragma once
// LayerNorm per element, shared by the host loops and the CUDA kernels. Per row of C:
//
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C  (biased, as PyTorch and llm.c),
//   rstd = 1 / sqrt(var + eps),  xhat = (x - mean) rstd,  out = xhat w + b
//
// Backward, with dnorm = w dout and means over the row:
//
//   dinp = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)),  dw += xhat dout,  db += dout

#include <cmath>

#include "tide/core/config.hpp"

namespace tide::kernels {

inline constexpr float layernorm_eps = 1e-5f;

TIDE_HOST_DEVICE inline float layernorm_rstd(float var) noexcept { return 1.0f / sqrtf(var + layernorm_eps); }

TIDE_HOST_DEVICE inline float layernorm_xhat(float x, float mean, float rstd) noexcept { return (x - mean) * rstd; }

TIDE_HOST_DEVICE inline float layernorm_out(float xhat, float w, float b) noexcept { return xhat * w + b; }

TIDE_HOST_DEVICE inline float layernorm_dinp(float dnorm, float xhat, float mean_dnorm, float mean_dnorm_xhat,
                                             float rstd) noexcept {
  return rstd * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat);
}

}  // namespace tide::kernels
