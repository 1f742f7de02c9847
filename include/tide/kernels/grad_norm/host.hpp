#pragma once
// The host path of the global gradient norm, the non-finite check and the clip scale, and the
// record checks every backend makes.
//
// Sums of squares are taken per grain (grad_norm_host_tuning::grain elements of one tensor,
// the same cut whatever the thread count) into 32 double lanes by position, folded pairwise;
// the grains' partials are then added in grain order on the calling thread. The result is
// therefore bit-identical for any thread count (not only deterministic for a given one).
//
// Why double and not compensated float: a float's square is exact in double, so the only
// rounding is the running sums', relative error <= n 2^-53 in the worst case, far below what a
// float norm can show; double never overflows on float gradients (3.4e38^2 = 1.2e77), so the
// norm is non-finite exactly when a gradient is (the fused overflow check loss scaling needs,
// where a float sum of squares overflows on finite gradients above 1.8e19); and the kernel reads
// 4 B (2 B for bf16) per element, memory-bound, so converting to double costs no time. Kahan
// summation in float would be 4 dependent operations per element and still overflow.

#include <algorithm>
#include <atomic>
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
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/grad_norm/math.hpp"

namespace tide::kernels {

// grain: elements per partial sum and per unit of thread work; 64K (256 KiB of fp32) makes the
// partials array 1/65536 of the data and the thread hand-off negligible. lanes: independent
// double accumulators, enough to hide the add latency at 2 doubles a cycle.
struct grad_norm_host_tuning {
  static constexpr index_t grain = index_t{1} << 16;
  static constexpr int lanes = 32;
};

namespace detail {

template <class Record>
void check_grad_record(Record const& r, std::size_t i) {
  TIDE_REQUIRE(r.n >= 0, "gradient tensor #", i, " has n = ", r.n, "; n counts elements and must be >= 0");
  TIDE_REQUIRE(r.n == 0 || r.g != nullptr, "gradient tensor #", i, " (n = ", r.n, ") has a null g pointer");
}

template <class Record>
std::size_t grad_grains(Record const* records, std::size_t count) {
  constexpr index_t grain = grad_norm_host_tuning::grain;
  std::size_t total = 0;
  for (std::size_t r = 0; r < count; ++r) total += static_cast<std::size_t>((records[r].n + grain - 1) / grain);
  return total;
}

// f(data, size, grain index) for each grain in [first, last) of the records' grain sequence.
template <class Record, class F>
void for_each_grad_grain(Record const* records, std::size_t count, std::size_t first, std::size_t last, F&& f) {
  constexpr index_t grain = grad_norm_host_tuning::grain;
  std::size_t before = 0;
  for (std::size_t r = 0; r < count && before < last; ++r) {
    index_t const n = records[r].n;
    auto const grains = static_cast<std::size_t>((n + grain - 1) / grain);
    for (std::size_t k = std::max(first, before); k < std::min(last, before + grains); ++k) {
      auto const begin = static_cast<index_t>(k - before) * grain;
      f(records[r].g + begin, std::min(grain, n - begin), k);
    }
    before += grains;
  }
}

// Sum of x[i]^2, i in [0, n), in a fixed order: lane i % lanes, then the lanes pairwise.
template <Element Grad>
double sum_squares(Grad const* __restrict x, index_t n) {
  constexpr int lanes = grad_norm_host_tuning::lanes;
  double acc[lanes] = {};
  index_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int k = 0; k < lanes; ++k) acc[k] += grad_square(x[i + k]);
  for (int k = 0; i + k < n; ++k) acc[k] += grad_square(x[i + k]);
  for (int width = lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

template <Element Grad>
bool has_non_finite(Grad const* __restrict x, index_t n) {
  std::uint32_t found = 0;  // branch-free, so the loop vectorises
  for (index_t i = 0; i < n; ++i)
    found |= (tide::detail::bits_of(to_float(x[i])) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
  return found != 0;
}

// The grains' partials are the caller's scratch (one double per grain).
template <class Record>
double grad_sum_squares(thread_pool& pool, Record const* records, std::size_t count, double* partial) {
  std::size_t const grains = grad_grains(records, count);
  parallel_for(pool, grains, [&](std::size_t first, std::size_t last) {
    for_each_grad_grain(records, count, first, last,
                        [&](auto const* x, index_t n, std::size_t k) { partial[k] = sum_squares(x, n); });
  });
  double sum = 0;
  for (std::size_t k = 0; k < grains; ++k) sum += partial[k];
  return sum;
}

template <class Record>
bool grads_non_finite(thread_pool& pool, Record const* records, std::size_t count) {
  std::atomic<bool> found{false};
  parallel_for(pool, grad_grains(records, count), [&](std::size_t first, std::size_t last) {
    bool mine = false;
    for_each_grad_grain(records, count, first, last,
                        [&](auto const* x, index_t n, std::size_t) { mine = mine || has_non_finite(x, n); });
    if (mine) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

template <class List>
auto const* checked_grad_records(List const& grads) {
  auto const* records = std::ranges::data(grads);
  auto const count = static_cast<std::size_t>(std::ranges::size(grads));
  for (std::size_t i = 0; i < count; ++i) check_grad_record(records[i], i);
  return records;
}

template <class Grad>
grad_tensor<std::remove_const_t<Grad>> flat_grad_record(tensor_view<Grad> const& grads) {
  TIDE_REQUIRE(grads.is_contiguous(), "the gradient norm needs a contiguous view of the gradients; "
                                      "copy a strided one to a contiguous buffer, or pass a list of tensors");
  return {grads.data(), grads.size()};
}

}  // namespace detail

// Scratch of global_grad_norm on the host: one double per grain of the gradients.
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
std::size_t global_grad_norm_scratch_bytes(exec<host> const&, List const& grads) {
  return sizeof(double) * detail::grad_grains(std::ranges::data(grads), static_cast<std::size_t>(std::ranges::size(grads)));
}
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
std::size_t global_grad_norm_scratch_bytes(exec<host> const&, tensor_view<Grad> const& grads) {
  grad_tensor<std::remove_const_t<Grad>> const record{nullptr, grads.size()};
  return sizeof(double) * detail::grad_grains(&record, 1);
}

// sqrt(sum over tensors of sum g^2) over a list (any contiguous range of GradientRecord:
// grad_tensor, adamw_tensor), threaded over ex.pool; identical for any thread count. Non-finite
// exactly when some gradient is.
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
double global_grad_norm(exec<host> const& ex, List const& grads, scratch<host> ws) {
  auto const* records = detail::checked_grad_records(grads);
  detail::check_scratch("global_grad_norm", "global_grad_norm_scratch_bytes", ws,
                        global_grad_norm_scratch_bytes(ex, grads));
  return std::sqrt(detail::grad_sum_squares(ex.pool, records, static_cast<std::size_t>(std::ranges::size(grads)),
                                            detail::scratch_part<double>(ws, 0)));
}
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
double global_grad_norm(exec<host> const& ex, List const& grads) {
  (void)detail::checked_grad_records(grads);
  detail::call_scratch const ws(global_grad_norm_scratch_bytes(ex, grads));
  return global_grad_norm(ex, grads, ws.get());
}

// The same over one flat chunk of gradients, any shape, contiguous.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
double global_grad_norm(exec<host> const& ex, tensor_view<Grad> grads, scratch<host> ws) {
  auto const record = detail::flat_grad_record(grads);
  detail::check_scratch("global_grad_norm", "global_grad_norm_scratch_bytes", ws,
                        global_grad_norm_scratch_bytes(ex, grads));
  return std::sqrt(detail::grad_sum_squares(ex.pool, &record, 1, detail::scratch_part<double>(ws, 0)));
}
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
double global_grad_norm(exec<host> const& ex, tensor_view<Grad> grads) {
  detail::call_scratch const ws(global_grad_norm_scratch_bytes(ex, grads));
  return global_grad_norm(ex, grads, ws.get());
}

// Whether any gradient is Inf or NaN (for loss scaling when no norm is needed; with a norm, test
// std::isfinite(norm) instead and save the pass).
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
bool any_non_finite(exec<host> const& ex, List const& grads) {
  auto const* records = detail::checked_grad_records(grads);
  return detail::grads_non_finite(ex.pool, records, static_cast<std::size_t>(std::ranges::size(grads)));
}

template <class Grad>
  requires Element<std::remove_const_t<Grad>>
bool any_non_finite(exec<host> const& ex, tensor_view<Grad> grads) {
  auto const record = detail::flat_grad_record(grads);
  return detail::grads_non_finite(ex.pool, &record, 1);
}

// The gradient scale that clips to max_norm: min(1, max_norm / (norm + 1e-6)), PyTorch's
// clip_grad_norm_ coefficient; pass it as adamw's grad_scale. NaN when the norm is not finite
// (skip the step). max_norm = +Inf never clips. Throws tide::error(usage) unless max_norm > 0.
inline float clip_scale(double norm, float max_norm) {
  TIDE_REQUIRE(max_norm > 0.f, "clip_scale needs max_norm > 0, got ", max_norm,
               "; to only measure the norm, pass +infinity (the scale is then 1)");
  return detail::clip_scale_of(norm, max_norm);
}

}  // namespace tide::kernels
