// PowerSGD on one rank (comm::self): at full rank the product is the matrix, a rank-1 matrix
// needs rank 1, the warm start makes repeated steps converge like power iteration, the error
// feedback keeps exactly what the product missed, and the bits do not depend on the threads. On
// a matrix with a spectral gap, rank r converges to the top-r singular subspace that LAPACK's SVD
// (OpenBLAS) finds, and to the best rank-r approximation's error.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "tide/comm/self.hpp"
#include "tide/compress/powersgd.hpp"

namespace {

namespace cx = tide::compress;

std::vector<float> random_matrix(std::size_t rows, std::size_t cols, std::uint32_t seed) {
  std::vector<float> m(rows * cols);
  std::uint32_t s = seed;
  for (float& v : m) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / 8388608.f - 1.f;
  }
  return m;
}

double norm(std::vector<float> const& a) {
  double s = 0;
  for (float v : a) s += double(v) * v;
  return std::sqrt(s);
}
double distance(std::vector<float> const& a, std::vector<float> const& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("PowerSGD on one rank: full rank is the matrix; a rank-1 matrix needs rank 1") {
  tide::thread_pool pool(2);
  tide::exec<tide::host> const ex{pool};
  tide::comm::self one;
  {  // r = cols: P spans M's columns, P Pᵀ M = M. fp32 products over 5 and 12 terms: 1e-5 relative.
    auto const m = random_matrix(12, 5, 1);
    auto g = m;
    cx::powersgd_state s{12, 5, {.rank = 5}};
    cx::powersgd_sum(ex, one, std::span(g), s);
    CHECK(distance(g, m) <= 1e-5 * norm(m));
    CHECK(norm(s.error) <= 1e-5 * norm(m));
    CHECK(s.wire_floats() == 5 * (12 + 5));
  }
  {  // u vᵀ with r = 1
    std::vector<float> m(30 * 8);
    for (std::size_t i = 0; i < 30; ++i)
      for (std::size_t j = 0; j < 8; ++j) m[i * 8 + j] = (0.1f * static_cast<float>(i) - 1.f) * (0.5f + static_cast<float>(j));
    auto g = m;
    cx::powersgd_state s{30, 8, {.rank = 1}};
    cx::powersgd_sum(ex, one, std::span(g), s);
    CHECK(distance(g, m) <= 1e-5 * norm(m));
  }
  CHECK_THROWS_AS((cx::powersgd_state{4, 3, {.rank = 4}}), tide::error);  // rank > min(rows, cols)
}

TEST_CASE("PowerSGD: the warm start converges, the error keeps what the product missed, threads change no bit") {
  tide::comm::self one;
  std::size_t const rows = 40, cols = 16;
  auto const m = random_matrix(rows, cols, 3);
  std::vector<double> miss;
  std::vector<float> first;
  for (int threads : {1, 3}) {
    tide::thread_pool pool(threads);
    tide::exec<tide::host> const ex{pool};
    cx::powersgd_state s{rows, cols, {.rank = 2, .error_feedback = false}};
    std::vector<float> g;
    for (int step = 0; step < 6; ++step) {  // the same matrix each step: Q converges to its top-2 space
      g = m;
      cx::powersgd_sum(ex, one, std::span(g), s);
      if (threads == 1) miss.push_back(distance(g, m));
    }
    if (threads == 1) first = g;
    else CHECK(std::memcmp(first.data(), g.data(), g.size() * sizeof(float)) == 0);
  }
  CHECK(miss.back() < miss.front());         // the best rank-2 approximation, reached by iterating
  CHECK(miss.back() <= miss[4] * (1 + 1e-3));  // converged: another step changes little
  CHECK(miss.back() < norm(m));                // it contracts

  {  // with error feedback: after a step, the product plus the error is the input, to rounding
    tide::thread_pool pool(2);
    tide::exec<tide::host> const ex{pool};
    cx::powersgd_state s{rows, cols, {.rank = 2}};
    auto g = m;
    cx::powersgd_sum(ex, one, std::span(g), s);
    std::vector<float> back(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) back[i] = g[i] + s.error[i];
    CHECK(distance(back, m) <= 1e-6 * norm(m));
    // The next step adds the error first: a zero gradient still sends what was missed.
    std::vector<float> zero(g.size(), 0.f);
    cx::powersgd_sum(ex, one, std::span(zero), s);
    CHECK(norm(zero) > 0);
  }
}

TEST_CASE("PowerSGD: a column dropped for a rank-deficient sum is seeded again at the next step") {
  tide::thread_pool pool(1);
  tide::exec<tide::host> const ex{pool};
  tide::comm::self one;
  std::size_t const rows = 20, cols = 9;
  cx::powersgd_state s{rows, cols, {.rank = 2, .error_feedback = false}};
  // Step 1: a rank-1 matrix. P's second column is rounding noise: dropped, and Q's with it.
  std::vector<float> g(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) g[i * cols + j] = (static_cast<float>(i) - 9.5f) * (static_cast<float>(j) + 1.f);
  auto const m1 = g;
  cx::powersgd_sum(ex, one, std::span(g), s);
  CHECK(distance(g, m1) <= 1e-5 * norm(m1));
  bool dropped = true;
  for (std::size_t j = 0; j < cols; ++j) dropped = dropped && s.q[j * 2 + 1] == 0.f;
  CHECK(dropped);
  // Step 2: a rank-2 matrix. One power step from a full-rank Q recovers it; from the rank-1 Q it
  // could not.
  auto const m2 = random_matrix(rows, 2, 5), v2 = random_matrix(2, cols, 6);
  std::vector<float> b(rows * cols, 0.f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) b[i * cols + j] = m2[i * 2] * v2[j] + m2[i * 2 + 1] * v2[cols + j];
  g = b;
  cx::powersgd_sum(ex, one, std::span(g), s);
  CHECK(distance(g, b) <= 1e-5 * norm(b));
}

#if defined(TIDE_HAS_BLAS)
// LAPACK's SVD (OpenBLAS carries LAPACK), in double, as the reference.
extern "C" void dgesvd_(char const* jobu, char const* jobvt, int const* m, int const* n, double* a, int const* lda,
                        double* s, double* u, int const* ldu, double* vt, int const* ldvt, double* work,
                        int const* lwork, int* info);

TEST_CASE("PowerSGD: at rank r the product spans the top r singular vectors LAPACK's SVD finds, and is the best "
          "rank-r approximation") {
  // Two strong directions and a weak remainder: singular values 5- and 3-ish, then about 0.01.
  // Repeated steps on the same matrix are power iteration (the warm start): the product converges
  // to the projection on the top-2 left singular vectors, the best rank-2 approximation.
  std::size_t const rows = 40, cols = 16;
  int const r = 2;
  auto const a = random_matrix(rows, 2, 11), b = random_matrix(2, cols, 12), noise = random_matrix(rows, cols, 13);
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      m[i * cols + j] = 1.5f * a[i * 2] * b[j] + 0.9f * a[i * 2 + 1] * b[cols + j] + 0.002f * noise[i * cols + j];
  // The SVD of m (column-major for LAPACK): singular values s, left singular vectors u (rows x k).
  int const mr = static_cast<int>(rows), nc = static_cast<int>(cols), k = nc;
  std::vector<double> col(rows * cols), s(cols), u(rows * cols), work(1);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) col[i + j * rows] = m[i * cols + j];
  int lwork = -1, info = 0, one_ld = 1;
  dgesvd_("S", "N", &mr, &nc, col.data(), &mr, s.data(), u.data(), &mr, nullptr, &one_ld, work.data(), &lwork, &info);
  REQUIRE(info == 0);
  lwork = static_cast<int>(work[0]);
  work.resize(static_cast<std::size_t>(lwork));
  dgesvd_("S", "N", &mr, &nc, col.data(), &mr, s.data(), u.data(), &mr, nullptr, &one_ld, work.data(), &lwork, &info);
  REQUIRE(info == 0);
  REQUIRE(s[1] > 50 * s[2]);  // the gap the power iteration converges across
  double tail = 0;
  for (int i = r; i < k; ++i) tail += s[static_cast<std::size_t>(i)] * s[static_cast<std::size_t>(i)];
  tail = std::sqrt(tail);  // ||m - best rank-2||_F (Eckart-Young)

  tide::thread_pool pool(2);
  tide::exec<tide::host> const ex{pool};
  tide::comm::self one;
  cx::powersgd_state st{rows, cols, {.rank = r, .error_feedback = false}};
  std::vector<float> g;
  for (int step = 0; step < 8; ++step) {
    g = m;
    cx::powersgd_sum(ex, one, std::span(g), st);
  }
  // What of g lies outside span(u_1, u_2): g - U2 U2^T g.
  std::vector<double> outside(g.begin(), g.end());
  for (std::size_t j = 0; j < cols; ++j)
    for (int c = 0; c < r; ++c) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += u[i + static_cast<std::size_t>(c) * rows] * g[i * cols + j];
      for (std::size_t i = 0; i < rows; ++i) outside[i * cols + j] -= dot * u[i + static_cast<std::size_t>(c) * rows];
    }
  double out = 0;
  for (double x : outside) out += x * x;
  out = std::sqrt(out);
  double const miss = distance(g, m);
  MESSAGE("singular values ", s[0], ", ", s[1], ", ", s[2], "; outside the top-2 space ", out / norm(g),
          " of the product; ||m - product|| ", miss, " against the best rank-2 ", tail);
  CHECK(out <= 1e-4 * norm(g));
  CHECK(miss <= (1 + 1e-3) * tail);
  CHECK(miss >= (1 - 1e-3) * tail);  // no rank-2 matrix does better: a check that the SVD is the bound
}
#endif
