#pragma once
// The host path of tide::kernels::adamw, and the checks every backend makes before touching
// memory (the CUDA entries include this header for them).
//
// Work is cut into grains of adamw_host_tuning::grain elements of one tensor; parallel_for hands
// contiguous runs of grains to the threads. Inside a grain, whole vectors of lanes run
// adamw_update on native_simd<float> (<experimental/simd>: its sqrt is a vector instruction
// whether or not -fno-math-errno is given), and the last partial vector runs the SAME vector
// code on a zero-padded copy. Every element therefore goes through identical instructions
// wherever a tensor, grain or slice boundary falls: results are bit-identical for any thread
// count and for a tensor list versus the same data as one flat chunk.
// Without <experimental/simd> (or when nvcc compiles this header) a fixed-width loop g++ can
// auto-vectorise takes its place; it then needs -fno-math-errno to vectorise the sqrt.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <sstream>
#include <string>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adamw/math.hpp"

// TIDE_ADAMW_SIMD: 1 to use <experimental/simd>, 0 for the plain loop; detected unless defined.
#if !defined(TIDE_ADAMW_SIMD)
#  if !defined(__CUDACC__) && __has_include(<experimental/simd>)
#    include <experimental/simd>
#  endif
#  if defined(__cpp_lib_experimental_parallel_simd) && !defined(__CUDACC__)
#    define TIDE_ADAMW_SIMD 1
#  else
#    define TIDE_ADAMW_SIMD 0
#  endif
#elif TIDE_ADAMW_SIMD
#  include <experimental/simd>
#endif

namespace tide::kernels {

// Elements per unit of work a thread takes. bench_kernels adamw_fp32_vs_stream (25M params,
// 2 threads, shared 2-vCPU machine) ran 4K, 16K, 64K and 256K within noise of each other
// (ratios 0.85-1.19 for all); 16K also lets a call of fewer than 16K elements (~10 us of work)
// run on the calling thread instead of paying a thread hand-off.
struct adamw_host_tuning {
  static constexpr index_t grain = index_t{1} << 14;
};

// The coefficients of step t (1-based). Throws tide::error(usage) for t < 1, hyper-parameters
// torch.optim.AdamW also rejects, and a non-finite grad_scale (an overflowed loss scale must
// skip the step, not poison the weights).
inline adamw_coefficients adamw_coefficients_for(adamw_hparams const& hp, std::int64_t t, float grad_scale) {
  TIDE_REQUIRE(t >= 1, "adamw step t is 1-based, got t = ", t, "; pass the number of steps taken before this one plus 1");
  TIDE_REQUIRE(std::isfinite(hp.lr) && hp.lr >= 0.f, "adamw needs a finite lr >= 0, got ", hp.lr);
  TIDE_REQUIRE(hp.beta1 >= 0.f && hp.beta1 < 1.f, "adamw needs 0 <= beta1 < 1, got ", hp.beta1);
  TIDE_REQUIRE(hp.beta2 >= 0.f && hp.beta2 < 1.f, "adamw needs 0 <= beta2 < 1, got ", hp.beta2);
  TIDE_REQUIRE(std::isfinite(hp.eps) && hp.eps >= 0.f, "adamw needs a finite eps >= 0, got ", hp.eps);
  TIDE_REQUIRE(std::isfinite(hp.weight_decay) && hp.weight_decay >= 0.f,
               "adamw needs a finite weight_decay >= 0, got ", hp.weight_decay);
  TIDE_REQUIRE(std::isfinite(grad_scale), "adamw got a non-finite grad_scale (", grad_scale,
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

namespace detail {

template <class T>
inline constexpr bool is_adamw_tensor = false;
template <class Grad, class Work>
inline constexpr bool is_adamw_tensor<adamw_tensor<Grad, Work>> = true;

inline std::string adamw_shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

// Record i of a list is usable: a size >= 0 and, when it has elements, p, g, m, v set.
template <class Grad, class Work>
void check_adamw_record(adamw_tensor<Grad, Work> const& r, std::size_t i) {
  TIDE_REQUIRE(r.n >= 0, "adamw tensor #", i, " has n = ", r.n, "; n counts elements and must be >= 0");
  TIDE_REQUIRE(r.n == 0 || (r.p && r.g && r.m && r.v), "adamw tensor #", i, " (n = ", r.n, ") has a null ",
               !r.p ? "p" : !r.g ? "g" : !r.m ? "m" : "v", " pointer; only `working` may be null");
}

// The flat-chunk form's views as one record, after checking they agree. Throws before anything
// is touched.
template <class Grad, class Work, class Space>
adamw_tensor<std::remove_const_t<Grad>, Work> adamw_flat_record(tensor_view<float, Space> p, tensor_view<Grad, Space> g,
                                                                tensor_view<float, Space> m, tensor_view<float, Space> v,
                                                                tensor_view<Work, Space> working) {
  auto const same = [&](auto const& x, char const* name) {
    TIDE_REQUIRE(x.extents() == p.extents(), "adamw needs ", name, " shaped like p ", adamw_shape_text(p.extents()),
                 ", got ", adamw_shape_text(x.extents()), "; pass views of the same tensor's state");
    TIDE_REQUIRE(x.is_contiguous(), "adamw needs a contiguous ", name, "; copy it to a contiguous buffer first");
  };
  TIDE_REQUIRE(p.is_contiguous(), "adamw needs a contiguous p; copy it to a contiguous buffer first");
  same(g, "g");
  same(m, "m");
  same(v, "v");
  if (working.data() != nullptr) same(working, "working");
  return {p.data(), g.data(), m.data(), v.data(), working.data(), p.size()};
}

// Calls f(record, begin, end) for each grain in [first, last) of the grain sequence of the
// records (each record cut into ceil(n / grain) grains, in order).
template <class Record, class F>
void for_each_adamw_grain(Record const* records, std::size_t count, std::size_t first, std::size_t last, F&& f) {
  constexpr index_t grain = adamw_host_tuning::grain;
  std::size_t before = 0;  // grains of the records already passed
  for (std::size_t r = 0; r < count && before < last; ++r) {
    index_t const n = records[r].n;
    auto const grains = static_cast<std::size_t>((n + grain - 1) / grain);
    for (std::size_t k = std::max(first, before); k < std::min(last, before + grains); ++k) {
      auto const begin = static_cast<index_t>(k - before) * grain;
      f(records[r], begin, std::min(begin + grain, n));
    }
    before += grains;
  }
}

template <class Record>
std::size_t adamw_grains(Record const* records, std::size_t count) {
  std::size_t total = 0;
  for (std::size_t r = 0; r < count; ++r)
    total += static_cast<std::size_t>((records[r].n + adamw_host_tuning::grain - 1) / adamw_host_tuning::grain);
  return total;
}

#if TIDE_ADAMW_SIMD
// g++ 12 flags the deliberately undefined pass-through operand of _mm512_sqrt_ps (a false
// positive inside avx512fintrin.h) when -march enables AVX-512.
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
using adamw_lanes = std::experimental::native_simd<float>;
inline constexpr index_t adamw_width = static_cast<index_t>(adamw_lanes::size());
#else
inline constexpr index_t adamw_width = 16;
#endif

// adamw_width elements at p, g, m, v (and working, unless null).
template <class Grad, class Work>
inline void adamw_vector(float* __restrict p, Grad const* __restrict g, float* __restrict m, float* __restrict v,
                         Work* __restrict working, adamw_coefficients const& c) {
#if TIDE_ADAMW_SIMD
  namespace stdx = std::experimental;
  adamw_lanes pv(p, stdx::element_aligned), mv(m, stdx::element_aligned), vv(v, stdx::element_aligned), gv;
  if constexpr (std::is_same_v<Grad, float>) {
    gv.copy_from(g, stdx::element_aligned);
  } else {
    float gf[adamw_width];
    for (index_t k = 0; k < adamw_width; ++k) gf[k] = to_float(g[k]);
    gv.copy_from(gf, stdx::element_aligned);
  }
  adamw_update(pv, mv, vv, gv, c);
  pv.copy_to(p, stdx::element_aligned);
  mv.copy_to(m, stdx::element_aligned);
  vv.copy_to(v, stdx::element_aligned);
#else
#  pragma GCC ivdep
  for (index_t k = 0; k < adamw_width; ++k) adamw_update(p[k], m[k], v[k], to_float(g[k]), c);
#endif
  if (working != nullptr)
    for (index_t k = 0; k < adamw_width; ++k) working[k] = from_float<Work>(p[k]);
}

// Elements [begin, end) of one record.
template <class Grad, class Work>
void adamw_range(adamw_tensor<Grad, Work> const& r, index_t begin, index_t end, adamw_coefficients const& c) {
  constexpr index_t w = adamw_width;
  float* const p = r.p + begin;
  Grad const* const g = r.g + begin;
  float* const m = r.m + begin;
  float* const v = r.v + begin;
  Work* const working = r.working ? r.working + begin : nullptr;
  index_t const n = end - begin;
  index_t i = 0;
  for (; i + w <= n; i += w) adamw_vector(p + i, g + i, m + i, v + i, working ? working + i : nullptr, c);
  if (i == n) return;
  // The tail: the same vector code on a zero-padded copy (zeros stay finite: 0 / (0 + eps)).
  index_t const k = n - i;
  float pb[w] = {}, mb[w] = {}, vb[w] = {};
  Grad gb[w] = {};
  Work wb[w] = {};
  std::copy_n(p + i, k, pb);
  std::copy_n(g + i, k, gb);
  std::copy_n(m + i, k, mb);
  std::copy_n(v + i, k, vb);
  adamw_vector(pb, gb, mb, vb, working ? wb : nullptr, c);
  std::copy_n(pb, k, p + i);
  std::copy_n(mb, k, m + i);
  std::copy_n(vb, k, v + i);
  if (working) std::copy_n(wb, k, working + i);
}
#if TIDE_ADAMW_SIMD
#  pragma GCC diagnostic pop
#endif

template <class Grad, class Work>
void adamw_records(thread_pool& pool, adamw_tensor<Grad, Work> const* records, std::size_t count,
                   adamw_coefficients const& c) {
  parallel_for(pool, adamw_grains(records, count), [&](std::size_t first, std::size_t last) {
    for_each_adamw_grain(records, count, first, last,
                         [&](adamw_tensor<Grad, Work> const& r, index_t b, index_t e) { adamw_range(r, b, e, c); });
  });
}

}  // namespace detail

// One AdamW step over a list of tensors (any contiguous range of adamw_tensor<Grad, Work>),
// in place, threaded over ex.pool. Bit-identical results for any thread count.
//
//   std::vector<tide::kernels::adamw_tensor<tide::bf16>> list = ...;  // fp32 p/m/v, bf16 g and working
//   tide::kernels::adamw(ex, {.lr = 3e-4f, .weight_decay = 0.1f}, step, list, clip);
template <std::ranges::contiguous_range List>
  requires detail::is_adamw_tensor<std::ranges::range_value_t<List>>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, List const& tensors, float grad_scale = 1.f) {
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  auto const* records = std::ranges::data(tensors);
  auto const count = static_cast<std::size_t>(std::ranges::size(tensors));
  for (std::size_t i = 0; i < count; ++i) detail::check_adamw_record(records[i], i);
  detail::adamw_records(ex.pool, records, count, c);
}

// One AdamW step over one flat chunk: p, g, m, v and the working copy share one shape.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
           tensor_view<float> m, tensor_view<float> v, tensor_view<Work> working, float grad_scale = 1.f) {
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adamw_flat_record(p, g, m, v, working);
  detail::adamw_records(ex.pool, &record, 1, c);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void adamw(exec<host> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float> p, tensor_view<Grad> g,
           tensor_view<float> m, tensor_view<float> v, float grad_scale = 1.f) {
  adamw(ex, hp, t, p, g, m, v, tensor_view<std::remove_const_t<Grad>>{}, grad_scale);
}

}  // namespace tide::kernels
