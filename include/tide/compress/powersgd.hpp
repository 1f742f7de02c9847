#pragma once
// PowerSGD (Vogels et al., NeurIPS 2019; PyTorch's powerSGD_hook): a matrix gradient summed over
// the ranks as a rank-r product, with error feedback and a warm start.
//
//   tide::compress::powersgd_state s{rows, cols, {.rank = 2}};   // one per matrix: Q and the error
//   tide::compress::powersgd_sum(ex, world, grad, s);             // grad (rows, cols): in, then the sum
//
// One step on rank i's matrix M_i (rows × cols, row-major) with its error E_i and the shared Q
// (cols × r, the same on every rank):
//
//   M_i ← M_i + E_i                     error feedback
//   P   ← all_reduce(M_i Q)             (rows × r): Σ_i M_i Q
//   P   ← orthonormal columns of P      modified Gram-Schmidt, the same on every rank
//   Q   ← all_reduce(M_iᵀ P)            (cols × r): (Σ_i M_i)ᵀ P, kept for the next step (warm start)
//   S   ← P Qᵀ                          the rank-r sum, written into grad
//   E_i ← M_i − S / W                   what this rank's share missed
//
// So the ranks send r·(rows + cols) floats each instead of rows·cols, in two all-reduces, and the
// errors add up to what the sum missed: Σ_i E_i = Σ_i M_i − S. At full rank (r = cols <= rows)
// P spans the columns of Σ_i M_i and S is the sum, up to rounding (tests/compress/powersgd.cpp,
// tests/mpi/compress.cpp). Vectors (biases, LayerNorm gains) should be summed dense, as PyTorch does.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"

namespace tide::compress {

struct powersgd_options {
  int rank = 2;                 // r: the columns of P and Q
  bool error_feedback = true;   // keep what the rank-r sum missed for the next step
  std::uint32_t seed = 7;       // Q's first values (the same on every rank)
  // In training (compress/sink.hpp): a matrix is compressed only when its r (rows + cols) floats
  // are at most 1 / min_compression_rate of its rows · cols (PyTorch's rule, default 2); smaller
  // ones, and vectors, are summed dense. The first dense_steps optimizer steps are all dense
  // (PyTorch's start_powerSGD_iter): compression starts from gradients past their first transient.
  float min_compression_rate = 2.f;
  std::int64_t dense_steps = 0;
};

namespace detail {
// Columns of a (n × r, row-major) made orthonormal in place, in column order (modified
// Gram-Schmidt). A column that (nearly) lies in the span of the earlier ones becomes zero: what
// is left of it is rounding noise, and normalising noise would give a column far from orthogonal
// to the others (a summed gradient of rank below r does that).
inline void orthonormalise(std::span<float> a, std::size_t n, std::size_t r) {
  for (std::size_t j = 0; j < r; ++j) {
    double before = 0;
    for (std::size_t i = 0; i < n; ++i) before += double(a[i * r + j]) * a[i * r + j];
    for (std::size_t k = 0; k < j; ++k) {
      double dot = 0;
      for (std::size_t i = 0; i < n; ++i) dot += double(a[i * r + j]) * a[i * r + k];
      for (std::size_t i = 0; i < n; ++i) a[i * r + j] -= static_cast<float>(dot) * a[i * r + k];
    }
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) norm += double(a[i * r + j]) * a[i * r + j];
    // 1e-8 of the squared norm: the column kept at least 1e-4 of its length, far above fp32 noise
    float const inv = norm > 1e-8 * before && norm > 1e-60 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.f;
    for (std::size_t i = 0; i < n; ++i) a[i * r + j] *= inv;
  }
}

// The three products of one PowerSGD step, shared by powersgd_sum and the training sink
// (compress/sink.hpp). m (rows × cols), p (rows × r), q (cols × r), all row-major. Each output
// element is one sum in a fixed order, whatever the thread count.

// p ← m q
inline void powersgd_project(thread_pool& pool, std::span<float const> m, std::span<float const> q, std::span<float> p,
                             std::size_t rows, std::size_t cols, std::size_t r) {
  parallel_for(pool, rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t k = 0; k < r; ++k) {
        float acc = 0;
        for (std::size_t j = 0; j < cols; ++j) acc += m[i * cols + j] * q[j * r + k];
        p[i * r + k] = acc;
      }
  });
}
// q ← mᵀ p (rows outermost: m is read along its rows)
inline void powersgd_back(thread_pool& pool, std::span<float const> m, std::span<float const> p, std::span<float> q,
                          std::size_t rows, std::size_t cols, std::size_t r) {
  parallel_for(pool, cols, [&](std::size_t b, std::size_t e) {
    std::fill(q.begin() + static_cast<std::ptrdiff_t>(b * r), q.begin() + static_cast<std::ptrdiff_t>(e * r), 0.f);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = b; j < e; ++j)
        for (std::size_t k = 0; k < r; ++k) q[j * r + k] += m[i * cols + j] * p[i * r + k];
  });
}
// out ← p qᵀ; and with an error (not empty): error ← m − out / w, this rank's share of what the
// rank-r sum missed. m and error may be the same span.
template <class T>
void powersgd_expand(thread_pool& pool, std::span<float const> p, std::span<float const> q, T* out,
                     std::span<float const> m, std::span<float> error, float w, std::size_t rows, std::size_t cols,
                     std::size_t r) {
  parallel_for(pool, rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t j = 0; j < cols; ++j) {
        float acc = 0;
        for (std::size_t k = 0; k < r; ++k) acc += p[i * r + k] * q[j * r + k];
        out[i * cols + j] = from_float<T>(acc);
        if (!error.empty()) error[i * cols + j] = m[i * cols + j] - acc / w;
      }
  });
}
// Q's columns that are all zero get their seeded values, uniform in [-1, 1) (any full-rank start
// works): at the first step, and for a column that orthonormalise dropped when the summed
// gradient had rank below r. The same on every rank; a rank lost at one step is tried again at
// the next.
inline void powersgd_reseed(std::span<float> q, std::size_t r, std::uint32_t seed) {
  for (std::size_t k = 0; k < r; ++k) {
    bool zero = true;
    for (std::size_t i = k; i < q.size() && zero; i += r) zero = q[i] == 0.f;
    if (!zero) continue;
    std::uint32_t s = seed * 2654435761u + 1;  // one sequence over all of Q: column k of it
    for (std::size_t i = 0; i < q.size(); ++i) {
      s = s * 1664525u + 1013904223u;
      if (i % r == k) q[i] = static_cast<float>(s >> 8) / 8388608.f - 1.f;
    }
  }
}
}  // namespace detail

// One matrix's state: Q (cols × r, row-major) and this rank's error (rows × cols).
struct powersgd_state {
  std::size_t rows = 0, cols = 0;
  powersgd_options options{};
  std::vector<float> q, error, p, m;  // p (rows × r) and m (rows × cols): scratch

  powersgd_state(std::size_t rows_, std::size_t cols_, powersgd_options const& o = {})
      : rows(rows_), cols(cols_), options(o) {
    TIDE_REQUIRE(o.rank >= 1 && static_cast<std::size_t>(o.rank) <= std::min(rows_, cols_), "powersgd: rank ", o.rank,
                 " for a ", rows_, " x ", cols_, " matrix; pass 1 <= rank <= min(rows, cols)");
    auto const r = static_cast<std::size_t>(o.rank);
    q.assign(cols * r, 0.f);
    detail::powersgd_reseed(q, r, o.seed);
    error.assign(o.error_feedback ? rows * cols : 0, 0.f);
    p.resize(rows * r);
    m.resize(rows * cols);
  }
  // Floats each rank sends per step, against rows · cols dense.
  [[nodiscard]] std::size_t wire_floats() const noexcept {
    return static_cast<std::size_t>(options.rank) * (rows + cols);
  }
};

// grad (rows × cols): this rank's gradient in, the rank-r sum over the ranks out (every rank the
// same bits). Every rank calls it, with the same state shape and options.
template <class C>
void powersgd_sum(exec<host> const& ex, C& comm, std::span<float> grad, powersgd_state& s) {
  std::size_t const rows = s.rows, cols = s.cols, r = static_cast<std::size_t>(s.options.rank);
  TIDE_REQUIRE(grad.size() == rows * cols, "powersgd: a gradient of ", grad.size(), " floats for a ", rows, " x ",
               cols, " state");
  // M ← grad + E (kept: the error needs it after grad holds the sum)
  for (std::size_t i = 0; i < rows * cols; ++i) s.m[i] = grad[i] + (s.options.error_feedback ? s.error[i] : 0.f);
  detail::powersgd_reseed(s.q, r, s.options.seed);
  detail::powersgd_project(ex.pool, s.m, s.q, s.p, rows, cols, r);  // P ← M Q, summed
  comm.all_reduce(std::span<float>(s.p), tide::comm::reduce_op::sum);
  detail::orthonormalise(std::span<float>(s.p), rows, r);
  detail::powersgd_back(ex.pool, s.m, s.p, s.q, rows, cols, r);  // Q ← Mᵀ P, summed
  comm.all_reduce(std::span<float>(s.q), tide::comm::reduce_op::sum);
  // grad ← P Qᵀ; E ← M − grad / W
  detail::powersgd_expand(ex.pool, s.p, s.q, grad.data(), s.m, std::span<float>(s.error),
                          static_cast<float>(comm.size()), rows, cols, r);
}

}  // namespace tide::compress
