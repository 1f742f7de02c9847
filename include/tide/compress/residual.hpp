#pragma once
// The per-chunk math of residual gradient compression (error feedback), before any transport:
// what a rank adds to its residual, which elements it sends, and what it keeps.
//
//   tide::compress::residual_compressor<tide::compress::threshold_search> c{.density = 0.01f};
//   std::size_t m = c.compress(ex, step, grads, residual, {}, idx, val);  // idx/val: capacity(n, step)
//   // send (idx[j], val[j]) for j < m; the residual keeps the rest
//
// One call, on one chunk of n gradients g (any element type) and its fp32 residual r:
//
//   local clipping   g ← g · min(1, clip_norm / (√ranks ‖g‖))   (DGC; clip_norm = 0: off)
//   accumulate       r ← r + g; or with momentum correction (DGC; momentum > 0): u ← m u + g,
//                    r ← r + u
//   select           k = ⌈density(step) · n⌉ indices of r (the Selector: compress/select.hpp)
//   send             the pairs (i, r_i) of the chosen i; then r_i ← 0 (and u_i ← 0: DGC's
//                    momentum-factor masking)
//
// So with momentum = 0, everything sent over the steps plus the residual is exactly the sum of
// the gradients (every step moves values between r and the pairs, never changes them:
// tests/compress/residual.cpp checks it bit for bit). density(step) warms up as DGC's does:
// warmup_start, divided by 4 every warmup_steps steps, until it reaches density (warmup_steps =
// 0: density from the first step). Density 1 sends every element and leaves the residual zero.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tide/compress/select.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"

namespace tide::compress {

template <Selector Sel>
struct residual_compressor {
  float density = 0.01f;       // the fraction of a chunk's elements sent per step, after warm-up
  float warmup_start = 0.25f;  // DGC's first density
  int warmup_steps = 0;        // steps per warm-up stage (density / 4 each stage); 0: no warm-up
  float momentum = 0.f;        // DGC momentum correction (0: plain error feedback)
  float clip_norm = 0.f;       // DGC local clipping at clip_norm / √ranks (0: off)
  int ranks = 1;               // for the clipping threshold
  Sel selector{};              // keeps its own state between calls (threshold_search: its τ)

  static constexpr std::string_view name = Sel::name;

  // The density of optimizer step `step` (1-based).
  [[nodiscard]] float density_at(std::int64_t step) const {
    TIDE_REQUIRE(density > 0.f && density <= 1.f, "residual_compressor: density = ", density,
                 "; pass the fraction of elements sent per step, in (0, 1]");
    if (warmup_steps <= 0 || warmup_start <= density) return density;
    std::int64_t const stage = std::max<std::int64_t>(0, step - 1) / warmup_steps;
    float d = std::min(warmup_start, 1.f);
    for (std::int64_t s = 0; s < stage && d > density; ++s) d *= 0.25f;
    return std::max(d, density);
  }
  // Elements chosen from a chunk of n at `step`: at least one.
  [[nodiscard]] std::size_t k_at(std::size_t n, std::int64_t step) const {
    if (n == 0) return 0;
    // ⌈density · n⌉ of the density the user wrote: a float's excess (up to 2^-24 relative) is taken
    // off first, so 0.1f of 400 is 40, not 41.
    double const x = static_cast<double>(density_at(step)) * static_cast<double>(n) * (1.0 - 0x1p-23);
    auto const k = static_cast<std::size_t>(std::ceil(x));
    return std::clamp<std::size_t>(k, 1, n);
  }
  // The pairs one call may write.
  [[nodiscard]] std::size_t capacity(std::size_t n, std::int64_t step) const {
    return std::min(n, Sel::capacity(k_at(n, step)));
  }

  // One step of one chunk: accumulates grads into residual (through u with momentum), writes the
  // chosen indices and values, ascending, and clears them in residual (and u). Returns how many.
  // u is empty without momentum.
  template <class T>
  std::size_t compress(exec<host> const& ex, std::int64_t step, std::span<T const> grads, std::span<float> residual,
                       std::span<float> u, std::span<std::uint32_t> idx, std::span<float> val) {
    std::size_t const n = grads.size();
    TIDE_REQUIRE(residual.size() == n && (momentum == 0.f || u.size() == n), "residual_compressor: ", n,
                 " gradients, a residual of ", residual.size(), " and a momentum of ", u.size(),
                 " (momentum > 0 needs it as long as the gradients)");
    std::size_t const room = capacity(n, step);
    TIDE_REQUIRE(idx.size() >= room && val.size() >= room, "residual_compressor: room for ", idx.size(), " indices and ",
                 val.size(), " values; this step needs ", room, " (capacity(n, step))");
    float scale = 1.f;
    if (clip_norm > 0.f) {
      double sq = 0;  // serial: the same sum for any thread count
      for (std::size_t i = 0; i < n; ++i) sq += static_cast<double>(to_float(grads[i])) * to_float(grads[i]);
      double const limit = static_cast<double>(clip_norm) / std::sqrt(static_cast<double>(std::max(ranks, 1)));
      double const norm = std::sqrt(sq);
      if (norm > limit) scale = static_cast<float>(limit / norm);
    }
    float const m = momentum;
    parallel_for(ex.pool, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        float const g = to_float(grads[i]) * scale;
        if (m != 0.f) {
          u[i] = m * u[i] + g;
          residual[i] += u[i];
        } else {
          residual[i] += g;
        }
      }
    });
    std::size_t const k = k_at(n, step);
    std::size_t const chosen =
        selector.select(ex, std::span<float const>(residual), k, idx.first(std::min(n, Sel::capacity(k))));
    for (std::size_t j = 0; j < chosen; ++j) {
      std::uint32_t const i = idx[j];
      val[j] = residual[i];
      residual[i] = 0.f;
      if (m != 0.f) u[i] = 0.f;  // momentum-factor masking
    }
    return chosen;
  }
};

}  // namespace tide::compress
