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
//   TIDE_HOST_DEVICE static step_sources<states> src_state_arrays(Record const& r)
//                                              where the states are read from (null: in place)
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
// into the optimizer's own pass. They also have src_p and the src state arrays (null: in place):
// a record that reads from sources takes the out-of-place form (step_range_from_sources), which
// leaves the sources as they were and streams every element of p and of each state with a source
// to the destinations; the engine's journal then keeps the old blocks instead of copying them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
// Where a record's states are read from in the out-of-place form (null: in place).
template <int S>
struct step_sources {
  float const* at[S];
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

// Whether record r reads any of its values from a source (the out-of-place form).
template <class Step, class Record>
TIDE_HOST_DEVICE inline bool step_reads_sources(Record const& r) {
  bool any = r.src_p != nullptr;
  step_sources<Step::states> const src = Step::src_state_arrays(r);
  for (int j = 0; j < Step::states; ++j) any = any || src.at[j] != nullptr;
  return any;
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

// step_width elements: p and the states s read from `from` (p_in, s_in) and written to `to`
// (p_out, s_out; the same arrays for the in-place form), g, and working (unless null). The
// states are null when the step does not use them. g and working may be the same array (the
// offload engine's gradient-slot reuse): every gradient of the vector is read before any working
// element is written, so none is __restrict.
template <class Step, class Grad, class Work>
inline void step_vector(float const* p_in, float* p_out, Grad const* g, step_sources<Step::states> const& s_in,
                        step_states<Step::states> const& s_out, Work* working, typename Step::coefficients const& c) {
  constexpr int S = Step::states;
  bool const stateful = stateful_at<Step>(s_out);
#if TIDE_ELEMENTWISE_SIMD
  namespace stdx = std::experimental;
  step_lanes pv(p_in, stdx::element_aligned), sv[S], gv;
  for (int j = 0; j < S; ++j) {
    if (stateful)
      sv[j].copy_from(s_in.at[j], stdx::element_aligned);
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
  pv.copy_to(p_out, stdx::element_aligned);
  if (stateful)
    for (int j = 0; j < S; ++j) sv[j].copy_to(s_out.at[j], stdx::element_aligned);
#else
  float pk[step_width];
  if (stateful) {
#  pragma GCC ivdep
    for (index_t k = 0; k < step_width; ++k) {
      float sk[S];
      for (int j = 0; j < S; ++j) sk[j] = s_in.at[j][k];
      pk[k] = p_in[k];
      Step::update(pk[k], sk, to_float(g[k]), c);
      for (int j = 0; j < S; ++j) s_out.at[j][k] = sk[j];
    }
  } else {
#  pragma GCC ivdep
    for (index_t k = 0; k < step_width; ++k) {
      float unused[S] = {};
      pk[k] = p_in[k];
      Step::update(pk[k], unused, to_float(g[k]), c);
    }
  }
  for (index_t k = 0; k < step_width; ++k) p_out[k] = pk[k];
#endif
  if (working != nullptr)
    for (index_t k = 0; k < step_width; ++k) working[k] = from_float<Work>(p_out[k]);
}

// The in-place form: the states read where they are written.
template <int S>
inline step_sources<S> in_place(step_states<S> const& s) {
  step_sources<S> r;
  for (int j = 0; j < S; ++j) r.at[j] = s.at[j];
  return r;
}

// States (step_states or step_sources) i elements on; a null one stays null.
template <class States>
inline States states_at(States s, index_t i) {
  for (auto& a : s.at)
    if (a != nullptr) a += i;
  return s;
}

// The last t < step_width elements of a range: the same vector code on zero-padded copies (zeros
// stay finite through every policy's update: Adam's 0 / (0 + eps) is 0), the t results to
// p_out, the states s_out (null: unused) and working (unless null).
template <class Step, class Grad, class Work>
void step_tail(float const* p_in, float* p_out, Grad const* g, step_sources<Step::states> const& s_in,
               step_states<Step::states> const& s_out, Work* working, index_t t,
               typename Step::coefficients const& c) {
  constexpr index_t w = step_width;
  constexpr int S = Step::states;
  bool const stateful = stateful_at<Step>(s_out);
  float pb[w] = {}, sb[S][w] = {};
  Grad gb[w] = {};
  Work wb[w] = {};
  step_states<S> padded;
  std::copy_n(p_in, t, pb);
  std::copy_n(g, t, gb);
  for (int j = 0; j < S; ++j) {
    padded.at[j] = stateful ? sb[j] : nullptr;
    if (stateful) std::copy_n(s_in.at[j], t, sb[j]);
  }
  step_vector<Step>(pb, pb, gb, in_place(padded), padded, working != nullptr ? wb : nullptr, c);
  std::copy_n(pb, t, p_out);
  if (stateful)
    for (int j = 0; j < S; ++j) std::copy_n(sb[j], t, s_out.at[j]);
  if (working != nullptr) std::copy_n(wb, t, working);
}

// Elements per piece of the out-of-place form: a piece's new values are written to buffers on
// the stack (about 20 KiB: L1) and streamed out from there (4 KiB per fp32 array:
// streaming_copy's smallest streamed copy).
inline constexpr index_t step_piece = 1024;

// Elements [begin, end) of a record that reads from sources: p and the states from src_p and the
// src states where set (else in place), the new values to p and the states, every element of an
// array with a source written (a state the step does not use is copied). The same vector code as
// step_range on the same values, so the results are bit-identical to the in-place form's.
template <class Step, class Record>
void step_range_from_sources(Record const& r, index_t begin, index_t end, typename Step::coefficients const& c) {
  constexpr index_t w = step_width;
  constexpr int S = Step::states;
  using Grad = std::remove_const_t<std::remove_pointer_t<decltype(r.g)>>;
  using Work = std::remove_pointer_t<decltype(r.working)>;
  step_states<S> const dst = Step::state_arrays(r), prev = Step::prev_state_arrays(r);
  step_sources<S> const src = Step::src_state_arrays(r);
  bool const use = Step::uses_states(c) && (!Step::optional_states || dst.at[0] != nullptr);
  // Streaming stores to a destination read from a source (nothing of it is in cache), plain ones
  // to one updated in place (its lines were just read). One fence at the end.
  auto const store = [](bool stream, auto* to, auto const* from, index_t k) {
    auto const bytes = static_cast<std::size_t>(k) * sizeof(*from);
    if (stream) memory::detail::streaming_copy_unfenced(to, from, bytes);
    else std::memcpy(to, from, bytes);
  };
  alignas(64) float pb[step_piece];
  alignas(64) float sb[S][step_piece];
  alignas(64) Work wb[step_piece];
  // The first piece ends where p's 64-byte lines begin, so the streamed pieces cover whole lines
  // (a line written partly by plain stores and partly by streaming ones is read and flushed:
  // measured 2.5x slower with arrays 16 bytes off a line). The other arrays of a record are
  // usually aligned as p is (the engine's blocks: 256 bytes).
  auto const on_line = [](float const* a) { return reinterpret_cast<std::uintptr_t>(a) % 64 == 0; };
  auto const skew = static_cast<index_t>((64 - reinterpret_cast<std::uintptr_t>(r.p + begin) % 64) % 64 / sizeof(float));
  for (index_t b = begin, k = 0; b < end; b += k) {
    k = std::min(b == begin && skew != 0 ? skew : step_piece, end - b);
    float const* const from_p = (r.src_p != nullptr ? r.src_p : r.p) + b;
    Grad const* const g = r.g + b;
    step_sources<S> from;  // the states' values before the step (null: not used)
    step_states<S> to;     // the piece's buffers (null: not used)
    for (int j = 0; j < S; ++j) {
      float const* const f = src.at[j] != nullptr ? src.at[j] : dst.at[j];
      from.at[j] = use ? f + b : nullptr;
      to.at[j] = use ? sb[j] : nullptr;
      if (f == nullptr || dst.at[j] == nullptr) continue;
      if (prev.at[j] != nullptr) store(true, prev.at[j] + b, f + b, k);
      if (!use && src.at[j] != nullptr) store(true, dst.at[j] + b, f + b, k);  // unused: its destination still gets it
    }
    if (r.prev_p != nullptr) store(true, r.prev_p + b, from_p, k);
    if (r.working != nullptr && r.prev_working != nullptr) store(true, r.prev_working + b, r.working + b, k);
    // A destination read from a source and starting on a line is streamed a line at a time, as
    // the piece is computed; the rest after the piece.
    bool const line_p = r.src_p != nullptr && on_line(r.p + b);
    bool line_s[S];
    for (int j = 0; j < S; ++j) line_s[j] = use && src.at[j] != nullptr && on_line(dst.at[j] + b);
    // Streamed a whole 64-byte line at a time (16 floats: one zmm, two ymm or four xmm vectors):
    // half lines streamed as each ymm was computed ran the step at 0.47 of in place on an AVX2
    // EPYC.
    constexpr index_t line = 16;
    static_assert(line % w == 0, "a vector of lanes must divide a cache line of floats");
    index_t i = 0, streamed = 0;
    for (; i + w <= k; i += w) {
      step_vector<Step>(from_p + i, pb + i, g + i, states_at(from, i), states_at(to, i), r.working ? wb + i : nullptr,
                        c);
      if ((i + w) % line != 0) continue;
      if (line_p) memory::detail::stream_floats_unfenced(r.p + b + streamed, pb + streamed, line);
      for (int j = 0; j < S; ++j)
        if (line_s[j]) memory::detail::stream_floats_unfenced(dst.at[j] + b + streamed, sb[j] + streamed, line);
      streamed += line;
    }
    if (i < k)  // the range's last partial vector
      step_tail<Step>(from_p + i, pb + i, g + i, states_at(from, i), states_at(to, i), r.working ? wb + i : nullptr,
                      k - i, c);
    index_t const p_from = line_p ? streamed : 0;
    store(r.src_p != nullptr, r.p + b + p_from, pb + p_from, k - p_from);
    if (use)
      for (int j = 0; j < S; ++j) {
        index_t const s_from = line_s[j] ? streamed : 0;
        store(src.at[j] != nullptr, dst.at[j] + b + s_from, sb[j] + s_from, k - s_from);
      }
    if (r.working != nullptr) store(true, r.working + b, wb, k);  // a new block (the record reads from sources)
  }
  memory::detail::streaming_fence();
}

// Elements [begin, end) of one record.
template <class Step, class Record>
void step_range(Record const& r, index_t begin, index_t end, typename Step::coefficients const& c) {
  if (step_reads_sources<Step>(r)) {
    step_range_from_sources<Step>(r, begin, end, c);
    return;
  }
  constexpr index_t w = step_width;
  constexpr int S = Step::states;
  using Grad = std::remove_const_t<std::remove_pointer_t<decltype(r.g)>>;
  using Work = std::remove_pointer_t<decltype(r.working)>;
  float* const p = r.p + begin;
  Grad const* const g = r.g + begin;
  step_states<S> s = Step::state_arrays(r);
  for (int j = 0; j < S; ++j) s.at[j] = Step::uses_states(c) ? s.at[j] + begin : nullptr;
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
    step_states<S> const si = states_at(s, i);
    step_vector<Step>(p + i, p + i, g + i, in_place(si), si, working ? working + i : nullptr, c);
  }
  if (i < n) {  // the last partial vector
    step_states<S> const si = states_at(s, i);
    step_tail<Step>(p + i, p + i, g + i, in_place(si), si, working ? working + i : nullptr, n - i, c);
  }
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
