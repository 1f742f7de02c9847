#pragma once
// The host machinery the elementwise optimizer kernels (kernels/adamw, kernels/adam, kernels/sgd)
// share; each of them supplies only a step policy (below) with its update, its state arrays and
// its record checks. Also the checks every backend makes before touching memory (the CUDA side,
// detail/elementwise_step.cuh, includes this header for them).
//
// Work is cut into grains of elementwise_host_tuning::grain elements of one tensor; parallel_for
// hands contiguous runs of grains to the threads. Inside a grain, whole vectors of lanes run the
// policy's update on native_simd<float> (<experimental/simd>: its sqrt is a vector instruction
// whether or not -fno-math-errno is given), and the last partial vector runs the SAME vector code
// on a zero-padded copy. Every element therefore goes through identical instructions wherever a
// tensor, grain or slice boundary falls: results are bit-identical for any thread count and for a
// tensor list versus the same data as one flat chunk.
// Without <experimental/simd> (or when nvcc compiles this header) a fixed-width loop g++ can
// auto-vectorise takes its place; it then needs -fno-math-errno to vectorise a sqrt.
//
// A step policy Step (a type with static members only, every call resolved at compile time):
//   static constexpr char const* name          "adamw": the kernel's name in error messages
//   static constexpr char const* nullable      what a null-pointer message adds, e.g.
//                                              "only `working` may be null"
//   static constexpr int states                fp32 state arrays beside p (m, v: 2; buf: 1)
//   using coefficients                         the per-step constants the update takes
//   TIDE_HOST_DEVICE static step_states<states> state_arrays(Record const& r)   r's state pointers
//   TIDE_HOST_DEVICE static step_states<states> prev_state_arrays(Record const& r)
//                                              where the states before the step go (null: not kept)
//   TIDE_HOST_DEVICE static bool uses_states(coefficients const& c)
//                                              false: the states are neither read nor written
//                                              this step (and may be null); they then enter the
//                                              update as zeros
//   static constexpr bool optional_states      whether uses_states can be false (a constant
//                                              true lets the host code drop the checks)
//   TIDE_HOST_DEVICE static void update(V& p, V (&s)[states], V g, coefficients const& c)
//                                              one element (V = float) or one vector of lanes;
//                                              forwards to the kernel's math.hpp
//   static void check_states(Record const& r, std::size_t i, coefficients const& c)
//                                              throws tide::error(usage) for a bad state pointer
// Records (adamw_tensor, sgd_tensor) have members p (float*), g (Grad const*), working (Work*,
// null: none) and n (index_t) besides their state arrays, and prev_p, prev_working and the prev
// state arrays (null: not kept): a step that keeps them copies each grain's values there just
// before it updates that grain, so the values are read from memory once (the copy brings the
// grain into cache, the update finds it there): the undo journal of the offload engine folded
// into the optimizer's own pass.

#include <algorithm>
#include <cstddef>
#include <ranges>
#include <sstream>
#include <string>
#include <type_traits>

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/memory/detail/streaming_copy.hpp"

// TIDE_ELEMENTWISE_SIMD: 1 to use <experimental/simd>, 0 for the plain loop; detected unless
// defined (TIDE_ADAMW_SIMD, its name before the optimizers shared it, is honoured too).
#if !defined(TIDE_ELEMENTWISE_SIMD) && defined(TIDE_ADAMW_SIMD)
#  define TIDE_ELEMENTWISE_SIMD TIDE_ADAMW_SIMD
#endif
#if !defined(TIDE_ELEMENTWISE_SIMD)
#  if !defined(__CUDACC__) && __has_include(<experimental/simd>)
#    include <experimental/simd>
#  endif
#  if defined(__cpp_lib_experimental_parallel_simd) && !defined(__CUDACC__)
#    define TIDE_ELEMENTWISE_SIMD 1
#  else
#    define TIDE_ELEMENTWISE_SIMD 0
#  endif
#elif TIDE_ELEMENTWISE_SIMD
#  include <experimental/simd>
#endif

namespace tide::kernels {

// Elements per unit of work a thread takes. bench_kernels adamw_fp32_vs_stream (25M params,
// 2 threads, shared 2-vCPU machine) ran 4K, 16K, 64K and 256K within noise of each other
// (ratios 0.85-1.19 for all); 16K also lets a call of fewer than 16K elements (~10 us of work)
// run on the calling thread instead of paying a thread hand-off. Not re-measured for SGD's 20 B
// per parameter: the grain only has to amortise the hand-off.
struct elementwise_host_tuning {
  static constexpr index_t grain = index_t{1} << 14;
};

// A record's fp32 state arrays (m, v; or buf), as a step policy hands them out.
template <int S>
struct step_states {
  float* at[S];
};

namespace detail {

inline std::string elementwise_shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

// Record i of a list is usable: a size >= 0 and, when it has elements, p and g set, and the
// states as the policy requires. Throws before anything is touched.
template <class Step, class Record>
void check_step_record(Record const& r, std::size_t i, typename Step::coefficients const& c) {
  TIDE_REQUIRE(r.n >= 0, Step::name, " tensor #", i, " has n = ", r.n, "; n counts elements and must be >= 0");
  TIDE_REQUIRE(r.n == 0 || (r.p && r.g), Step::name, " tensor #", i, " (n = ", r.n, ") has a null ", !r.p ? "p" : "g",
               " pointer; ", Step::nullable);
  Step::check_states(r, i, c);
}

// For the flat-chunk forms: p is contiguous, and x (named `what`) is shaped like p and contiguous.
template <class Step, class Space>
void check_step_p(tensor_view<float, Space> const& p) {
  TIDE_REQUIRE(p.is_contiguous(), Step::name, " needs a contiguous p; copy it to a contiguous buffer first");
}

template <class Step, class Space, class X>
void check_step_like_p(tensor_view<float, Space> const& p, tensor_view<X, Space> const& x, char const* what) {
  TIDE_REQUIRE(x.extents() == p.extents(), Step::name, " needs ", what, " shaped like p ",
               elementwise_shape_text(p.extents()), ", got ", elementwise_shape_text(x.extents()),
               "; pass views of the same tensor's state");
  TIDE_REQUIRE(x.is_contiguous(), Step::name, " needs a contiguous ", what, "; copy it to a contiguous buffer first");
}

// Calls f(record, begin, end) for each grain in [first, last) of the grain sequence of the
// records (each record cut into ceil(n / grain) grains, in order).
template <class Record, class F>
void for_each_step_grain(Record const* records, std::size_t count, std::size_t first, std::size_t last, F&& f) {
  constexpr index_t grain = elementwise_host_tuning::grain;
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
std::size_t step_grains(Record const* records, std::size_t count) {
  constexpr index_t grain = elementwise_host_tuning::grain;
  std::size_t total = 0;
  for (std::size_t r = 0; r < count; ++r) total += static_cast<std::size_t>((records[r].n + grain - 1) / grain);
  return total;
}

#if TIDE_ELEMENTWISE_SIMD
// g++ 12 flags the deliberately undefined pass-through operand of _mm512_sqrt_ps (a false
// positive inside avx512fintrin.h) when -march enables AVX-512.
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#  pragma GCC diagnostic ignored "-Wuninitialized"
using step_lanes = std::experimental::native_simd<float>;
inline constexpr index_t step_width = static_cast<index_t>(step_lanes::size());
#else
inline constexpr index_t step_width = 16;
#endif

// Whether the states at s are read and written: s.at[0] is null when Step::uses_states(c) said no
// (step_range's rule).
template <class Step>
inline bool stateful_at(step_states<Step::states> const& s) {
  return !Step::optional_states || s.at[0] != nullptr;
}

// step_width elements at p, g, the states s (null when the step does not use them) and
// working (unless null). g and working may be the same array (the offload engine's
// gradient-slot reuse): every gradient of the vector is read before any working element is
// written, so neither is __restrict.
template <class Step, class Grad, class Work>
inline void step_vector(float* __restrict p, Grad const* g, step_states<Step::states> const& s, Work* working,
                        typename Step::coefficients const& c) {
  constexpr int S = Step::states;
  bool const stateful = stateful_at<Step>(s);
#if TIDE_ELEMENTWISE_SIMD
  namespace stdx = std::experimental;
  step_lanes pv(p, stdx::element_aligned), sv[S], gv;
  for (int j = 0; j < S; ++j) {
    if (stateful)
      sv[j].copy_from(s.at[j], stdx::element_aligned);
    else
      sv[j] = 0.f;
  }
  if constexpr (std::is_same_v<Grad, float>) {
    gv.copy_from(g, stdx::element_aligned);
  } else {
    float gf[step_width];
    for (index_t k = 0; k < step_width; ++k) gf[k] = to_float(g[k]);
    gv.copy_from(gf, stdx::element_aligned);
  }
  Step::update(pv, sv, gv, c);
  pv.copy_to(p, stdx::element_aligned);
  if (stateful)
    for (int j = 0; j < S; ++j) sv[j].copy_to(s.at[j], stdx::element_aligned);
#else
  if (stateful) {
#  pragma GCC ivdep
    for (index_t k = 0; k < step_width; ++k) {
      float sk[S];
      for (int j = 0; j < S; ++j) sk[j] = s.at[j][k];
      Step::update(p[k], sk, to_float(g[k]), c);
      for (int j = 0; j < S; ++j) s.at[j][k] = sk[j];
    }
  } else {
#  pragma GCC ivdep
    for (index_t k = 0; k < step_width; ++k) {
      float unused[S] = {};
      Step::update(p[k], unused, to_float(g[k]), c);
    }
  }
#endif
  if (working != nullptr)
    for (index_t k = 0; k < step_width; ++k) working[k] = from_float<Work>(p[k]);
}

// Elements [begin, end) of one record.
template <class Step, class Record>
void step_range(Record const& r, index_t begin, index_t end, typename Step::coefficients const& c) {
  constexpr index_t w = step_width;
  constexpr int S = Step::states;
  using Grad = std::remove_const_t<std::remove_pointer_t<decltype(r.g)>>;
  using Work = std::remove_pointer_t<decltype(r.working)>;
  float* const p = r.p + begin;
  Grad const* const g = r.g + begin;
  step_states<S> s = Step::state_arrays(r);
  for (int j = 0; j < S; ++j) s.at[j] = Step::uses_states(c) ? s.at[j] + begin : nullptr;
  bool const stateful = stateful_at<Step>(s);
  Work* const working = r.working ? r.working + begin : nullptr;
  index_t const n = end - begin;
  // The grain's values before the step, where the record keeps them.
  // (A state this step leaves alone is kept too, when it exists: the journal restores all of it.)
  // Streaming stores: the copies are not read again here, and a plain store would first read
  // each of their lines (12 B per parameter more for AdamW).
  auto const keep = [n](auto* to, auto const* from) {
    memory::detail::streaming_copy(to, from, static_cast<std::size_t>(n) * sizeof(*from));
  };
  if (r.prev_p != nullptr) keep(r.prev_p + begin, p);
  {
    step_states<S> const raw = Step::state_arrays(r), prev = Step::prev_state_arrays(r);
    for (int j = 0; j < S; ++j)
      if (prev.at[j] != nullptr && raw.at[j] != nullptr) keep(prev.at[j] + begin, raw.at[j] + begin);
  }
  if (working != nullptr && r.prev_working != nullptr) keep(r.prev_working + begin, working);
  index_t i = 0;
  for (; i + w <= n; i += w) {
    step_states<S> si;
    for (int j = 0; j < S; ++j) si.at[j] = stateful ? s.at[j] + i : nullptr;
    step_vector<Step>(p + i, g + i, si, working ? working + i : nullptr, c);
  }
  if (i == n) return;
  // The tail: the same vector code on a zero-padded copy (zeros stay finite through every
  // policy's update: Adam's 0 / (0 + eps) is 0).
  index_t const k = n - i;
  float pb[w] = {}, sb[S][w] = {};
  Grad gb[w] = {};
  Work wb[w] = {};
  step_states<S> padded;
  std::copy_n(p + i, k, pb);
  std::copy_n(g + i, k, gb);
  for (int j = 0; j < S; ++j) {
    padded.at[j] = stateful ? sb[j] : nullptr;
    if (stateful) std::copy_n(s.at[j] + i, k, sb[j]);
  }
  step_vector<Step>(pb, gb, padded, working ? wb : nullptr, c);
  std::copy_n(pb, k, p + i);
  if (stateful)
    for (int j = 0; j < S; ++j) std::copy_n(sb[j], k, s.at[j] + i);
  if (working) std::copy_n(wb, k, working + i);
}
#if TIDE_ELEMENTWISE_SIMD
#  pragma GCC diagnostic pop
#endif

// One step over `count` records, threaded over pool.
template <class Step, class Record>
void step_records(thread_pool& pool, Record const* records, std::size_t count, typename Step::coefficients const& c) {
  parallel_for(pool, step_grains(records, count), [&](std::size_t first, std::size_t last) {
    for_each_step_grain(records, count, first, last,
                        [&](Record const& r, index_t b, index_t e) { step_range<Step>(r, b, e, c); });
  });
}

// The list form of a host entry: checks every record (throwing before any is stepped), then steps.
template <class Step, std::ranges::contiguous_range List>
void step_list(thread_pool& pool, List const& tensors, typename Step::coefficients const& c) {
  auto const* records = std::ranges::data(tensors);
  auto const count = static_cast<std::size_t>(std::ranges::size(tensors));
  for (std::size_t i = 0; i < count; ++i) check_step_record<Step>(records[i], i, c);
  step_records<Step>(pool, records, count, c);
}

}  // namespace detail
}  // namespace tide::kernels
