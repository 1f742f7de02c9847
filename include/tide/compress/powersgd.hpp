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
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"

namespace tide::compress {

struct powersgd_options {
  int rank = 2;                 // r: the columns of P and Q
  bool error_feedback = true;   // keep what the rank-r sum missed for the next step
  std::uint32_t seed = 7;       // Q's first values (the same on every rank)
};

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
    q.resize(cols * r);
    std::uint32_t s = o.seed * 2654435761u + 1;  // uniform in [-1, 1): any full-rank start works
    for (float& v : q) {
      s = s * 1664525u + 1013904223u;
      v = static_cast<float>(s >> 8) / 8388608.f - 1.f;
    }
    error.assign(o.error_feedback ? rows * cols : 0, 0.f);
    p.resize(rows * r);
    m.resize(rows * cols);
  }
  // Floats each rank sends per step, against rows · cols dense.
  [[nodiscard]] std::size_t wire_floats() const noexcept {
    return static_cast<std::size_t>(options.rank) * (rows + cols);
  }
};

namespace detail {
// Columns of a (n × r, row-major) made orthonormal in place, in column order (modified
// Gram-Schmidt); a column that vanishes stays zero.
inline void orthonormalise(std::span<float> a, std::size_t n, std::size_t r) {
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t k = 0; k < j; ++k) {
      double dot = 0;
      for (std::size_t i = 0; i < n; ++i) dot += double(a[i * r + j]) * a[i * r + k];
      for (std::size_t i = 0; i < n; ++i) a[i * r + j] -= static_cast<float>(dot) * a[i * r + k];
    }
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) norm += double(a[i * r + j]) * a[i * r + j];
    norm = std::sqrt(norm);
    float const inv = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.f;
    for (std::size_t i = 0; i < n; ++i) a[i * r + j] *= inv;
  }
}
}  // namespace detail

// grad (rows × cols): this rank's gradient in, the rank-r sum over the ranks out (every rank the
// same bits). Every rank calls it, with the same state shape and options.
template <class C>
void powersgd_sum(exec<host> const& ex, C& comm, std::span<float> grad, powersgd_state& s) {
  std::size_t const rows = s.rows, cols = s.cols, r = static_cast<std::size_t>(s.options.rank);
  TIDE_REQUIRE(grad.size() == rows * cols, "powersgd: a gradient of ", grad.size(), " floats for a ", rows, " x ",
               cols, " state");
  float const w = static_cast<float>(comm.size());
  // M ← grad + E (kept: the error needs it after grad holds the sum)
  parallel_for(ex.pool, rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t j = 0; j < cols; ++j)
        s.m[i * cols + j] = grad[i * cols + j] + (s.options.error_feedback ? s.error[i * cols + j] : 0.f);
  });
  // P ← M Q, summed
  parallel_for(ex.pool, rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t k = 0; k < r; ++k) {
        float acc = 0;
        for (std::size_t j = 0; j < cols; ++j) acc += s.m[i * cols + j] * s.q[j * r + k];
        s.p[i * r + k] = acc;
      }
  });
  comm.all_reduce(std::span<float>(s.p), tide::comm::reduce_op::sum);
  detail::orthonormalise(std::span<float>(s.p), rows, r);
  // Q ← Mᵀ P, summed
  parallel_for(ex.pool, cols, [&](std::size_t b, std::size_t e) {
    for (std::size_t j = b; j < e; ++j)
      for (std::size_t k = 0; k < r; ++k) {
        float acc = 0;
        for (std::size_t i = 0; i < rows; ++i) acc += s.m[i * cols + j] * s.p[i * r + k];
        s.q[j * r + k] = acc;
      }
  });
  comm.all_reduce(std::span<float>(s.q), tide::comm::reduce_op::sum);
  // grad ← P Qᵀ; E ← M − grad / W
  parallel_for(ex.pool, rows, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t j = 0; j < cols; ++j) {
        float acc = 0;
        for (std::size_t k = 0; k < r; ++k) acc += s.p[i * r + k] * s.q[j * r + k];
        grad[i * cols + j] = acc;
        if (s.options.error_feedback) s.error[i * cols + j] = s.m[i * cols + j] - acc / w;
      }
  });
}

}  // namespace tide::compress
