#pragma once
// The training knobs every tide optimizer carries beside its update: a learning-rate schedule
// and dynamic loss scaling (clipping and gradient accumulation are plain fields of the
// optimizer; make_trainer reads them).
//
// Loss scaling (for f16 gradients): the loss gradient is multiplied by the scale S before
// backward and the update divides by it again (inside AdamW's grad_scale, no extra pass). A step
// whose gradients hold a NaN or an Inf is skipped: parameters, optimizer state and AdamW's step
// number stay, the scale is multiplied by `backoff`; after `growth_interval` good steps in a row
// it is multiplied by `growth`. Powers of two keep the scaling exact in floating point.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "tide/core/error.hpp"

namespace tide::optim {

// Linear warm-up over warmup_steps, then cosine decay to min_ratio * lr at total_steps (and
// constant after). total_steps = 0: constant after the warm-up.
struct warmup_cosine {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;
  float min_ratio = 0.1f;

  [[nodiscard]] float operator()(float lr, std::int64_t step) const {
    TIDE_REQUIRE(step >= 0, "warmup_cosine: step ", step, " is negative");
    if (step < warmup_steps) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    if (total_steps <= warmup_steps) return lr;
    double const progress = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                              static_cast<double>(total_steps - warmup_steps));
    double const cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return static_cast<float>(lr * (min_ratio + (1.0 - min_ratio) * cosine));
  }
};

struct loss_scaling {
  bool enabled = false;
  float initial = 65536.f;  // 2^16
  float growth = 2.f;
  float backoff = 0.5f;
  int growth_interval = 2000;
  float min_scale = 1.f;
};

// The dynamic loss scale between steps.
class loss_scaler {
 public:
  explicit loss_scaler(loss_scaling const& s = {}) : cfg_(s), scale_(s.enabled ? s.initial : 1.f) {
    TIDE_REQUIRE(!s.enabled || (s.initial > 0.f && std::isfinite(s.initial) && s.backoff > 0.f && s.backoff < 1.f &&
                                s.growth >= 1.f && s.growth_interval >= 1),
                 "loss_scaling: need initial > 0 and finite, 0 < backoff < 1, growth >= 1, growth_interval >= 1; got "
                 "initial = ", s.initial, ", backoff = ", s.backoff, ", growth = ", s.growth,
                 ", growth_interval = ", s.growth_interval);
  }
  [[nodiscard]] float scale() const noexcept { return scale_; }
  [[nodiscard]] bool enabled() const noexcept { return cfg_.enabled; }
  [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }

  // After a step: `overflow` says whether some gradient was NaN or Inf (the step was skipped).
  void update(bool overflow) noexcept {
    if (!cfg_.enabled) return;
    if (overflow) {
      scale_ = std::max(cfg_.min_scale, scale_ * cfg_.backoff);
      good_ = 0;
      ++skipped_;
    } else if (++good_ >= cfg_.growth_interval) {
      scale_ *= cfg_.growth;
      good_ = 0;
    }
  }
  // For checkpoints.
  void restore(float scale, int good, std::int64_t skipped) noexcept {
    scale_ = scale;
    good_ = good;
    skipped_ = skipped;
  }
  [[nodiscard]] int good_steps() const noexcept { return good_; }

 private:
  loss_scaling cfg_;
  float scale_;
  int good_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace tide::optim
