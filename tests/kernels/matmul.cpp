#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tide/kernels/matmul/matmul.hpp>
#include <vector>

namespace {

namespace k = tide::kernels;
using tide::index_t;
using tide::tensor_view;

constexpr double u32 = 0x1p-24;

// Unit roundoff of the output type: the one rounding of a result stored as T.
template <class T>
constexpr double out_roundoff = std::is_same_v<T, float> ? 0.0 : double{tide::unit_roundoff<T>};

// A tensor held as T, with its exact double values (bf16 / f16 values are exact in double).
template <class T>
struct tensor {
  std::vector<T> v;
  std::vector<double> exact;
  tide::shape s;

  tensor(tide::shape shape, std::mt19937& rng, double scale = 1.0) : s(shape) {
    std::normal_distribution<double> d(0.0, scale);
    for (index_t i = 0; i < s.numel(); ++i) {
      v.push_back(tide::from_float<T>(static_cast<float>(d(rng))));
      exact.push_back(static_cast<double>(tide::to_float(v.back())));
    }
  }
  tensor_view<T> view() { return {v.data(), s}; }
  tensor_view<double> dview() { return {exact.data(), s}; }
  std::vector<double> abs() const {
    std::vector<double> a(exact);
    for (double& x : a) x = std::abs(x);
    return a;
  }
  double at(index_t i) const { return static_cast<double>(tide::to_float(v[static_cast<std::size_t>(i)])); }
};

struct dims {
  index_t N, C, OC;
};

// Rows given as (N, C), or as (B, T, C) with B = 2 when N is even: both layouts are accepted.
tide::shape rows_shape(index_t N, index_t X) {
  return N % 2 == 0 && N > 0 ? tide::shape{2, N / 2, X} : tide::shape{N, X};
}

// Asserts |got - ref| <= bound elementwise and reports the worst ratio.
template <class T>
void check_within(char const* what, tensor<T> const& got, std::vector<double> const& ref,
                  std::vector<double> const& bound) {
  double worst = 0.0;
  index_t worst_i = 0;
  for (index_t i = 0; i < static_cast<index_t>(ref.size()); ++i) {
    double const e = std::abs(got.at(i) - ref[static_cast<std::size_t>(i)]);
    double const b = bound[static_cast<std::size_t>(i)] + 1e-300;
    if (e / b > worst) worst = e / b, worst_i = i;
  }
  INFO(what, ": worst error / bound = ", worst, " at ", worst_i);
  CHECK(worst <= 1.0);
}

// Forward: out and the bound (K + 2) u S + u_T |ref|, S = sum |x w| + |b|.
template <class T>
void forward_case(dims d, bool with_bias, unsigned seed) {
  CAPTURE(d.N);
  CAPTURE(d.C);
  CAPTURE(d.OC);
  CAPTURE(with_bias);
  std::mt19937 rng(seed);
  tensor<T> x(rows_shape(d.N, d.C), rng), w({d.OC, d.C}, rng, 0.5), b({d.OC}, rng), out(rows_shape(d.N, d.OC), rng);
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  k::matmul_forward(ex, out.view(), x.view(), w.view(),
                    with_bias ? tensor_view<T const>(b.view()) : tensor_view<T const>{});

  std::vector<double> ref(out.exact.size()), S(out.exact.size());
  k::reference::matmul_forward(tensor_view<double>{ref.data(), out.s}, x.dview(), w.dview(),
                               with_bias ? tensor_view<double const>(b.dview()) : tensor_view<double const>{});
  auto xa = x.abs(), wa = w.abs(), ba = b.abs();
  k::reference::matmul_forward(tensor_view<double>{S.data(), out.s}, tensor_view<double const>{xa.data(), x.s},
                               tensor_view<double const>{wa.data(), w.s},
                               with_bias ? tensor_view<double const>{ba.data(), b.s} : tensor_view<double const>{});
  std::vector<double> bound(S.size());
  for (std::size_t i = 0; i < S.size(); ++i)
    bound[i] = static_cast<double>(d.C + 2) * u32 * S[i] * (1 + out_roundoff<T>)+out_roundoff<T> * std::abs(ref[i]);
  check_within("out", out, ref, bound);
}

// The shapes: 1, odd sizes, sizes around a register tile (16 / 32 floats), 768 + 5.
dims const shapes[] = {{1, 1, 1}, {3, 17, 5}, {7, 63, 33}, {4, 773, 3}, {16, 64, 96}, {5, 3, 129}, {0, 4, 6}};

TEST_CASE_TEMPLATE("matmul_forward matches the reference", T, float, tide::bf16, tide::f16) {
  unsigned seed = 1;
  for (dims const d : shapes) {
    forward_case<T>(d, true, seed++);
    forward_case<T>(d, false, seed++);
  }
}

// Backward: dinp, dweight, dbias (+= onto random old values) against the reference, with the
// bound (K + 2) u S + u_T |ref|, S the same sums over |.| including |old|.
template <class T>
void backward_case(dims d, bool with_bias, bool gelu, unsigned seed) {
  CAPTURE(d.N);
  CAPTURE(d.C);
  CAPTURE(d.OC);
  CAPTURE(with_bias);
  CAPTURE(gelu);
  std::mt19937 rng(seed);
  tensor<T> x(rows_shape(d.N, d.C), rng), w({d.OC, d.C}, rng, 0.5), dout(rows_shape(d.N, d.OC), rng),
      pre(rows_shape(d.N, d.OC), rng, 2.0);
  tensor<T> dinp(x.s, rng), dw(w.s, rng), db({d.OC}, rng);
  auto const old_dinp = dinp.exact, old_dw = dw.exact, old_db = db.exact;
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tensor_view<T> const dbv = with_bias ? db.view() : tensor_view<T>{};
  if (gelu)
    k::matmul_backward_gelu(ex, dinp.view(), dw.view(), dbv, dout.view(), pre.view(), x.view(), w.view());
  else
    k::matmul_backward(ex, dinp.view(), dw.view(), dbv, dout.view(), x.view(), w.view());

  // g = d loss / d(pre or out), exact; the reference sums from it, in double.
  std::vector<double> g(dout.exact), ga(dout.exact.size()), dabs(dout.exact.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (gelu) g[i] *= k::reference::gelu_tanh_grad(pre.exact[i]);
    ga[i] = std::abs(g[i]);
    dabs[i] = std::abs(dout.exact[i]);
  }
  if (gelu) {  // dout now holds dout * gelu'(pre), rounded to T; gelu.hpp's bound: 8 u |dout| + u |g|
    std::vector<double> b(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      b[i] =
          8 * u32 * dabs[i] + u32 * ga[i] + double{tide::unit_roundoff<T>} * ga[i] * (std::is_same_v<T, float> ? 0 : 1);
    check_within("dout (gradient of pre)", dout, g, b);
  }
  auto run = [&](std::vector<double> const& gv, std::vector<double> const& xi, std::vector<double> const& wi,
                 std::vector<double> di, std::vector<double> dwi, std::vector<double> dbi) {
    tensor_view<double> const dbd = with_bias ? tensor_view<double>{dbi.data(), db.s} : tensor_view<double>{};
    k::reference::matmul_backward(tensor_view<double>{di.data(), x.s}, tensor_view<double>{dwi.data(), w.s}, dbd,
                                  tensor_view<double const>{gv.data(), dout.s},
                                  tensor_view<double const>{xi.data(), x.s}, tensor_view<double const>{wi.data(), w.s});
    return std::vector<std::vector<double>>{di, dwi, dbi};
  };
  auto abs_of = [](std::vector<double> v) {
    for (double& e : v) e = std::abs(e);
    return v;
  };
  auto const ref = run(g, x.exact, w.exact, old_dinp, old_dw, old_db);
  auto const S = run(ga, x.abs(), w.abs(), abs_of(old_dinp), abs_of(old_dw), abs_of(old_db));
  // With GELU, the host's g went through T once (bf16: 2^-8 relative) and through gelu' (float):
  // terms of S scaled by (9 u + u_T).
  double const g_rel = gelu ? 9 * u32 + (std::is_same_v<T, float> ? 0.0 : double{tide::unit_roundoff<T>}) : 0.0;
  index_t const K[3] = {d.OC, d.N, d.N};
  tensor<T> const* got[3] = {&dinp, &dw, &db};
  char const* names[3] = {"dinp", "dweight", "dbias"};
  for (int t = 0; t < (with_bias ? 3 : 2); ++t) {
    std::vector<double> bound(ref[static_cast<std::size_t>(t)].size());
    for (std::size_t i = 0; i < bound.size(); ++i) {
      double const s = S[static_cast<std::size_t>(t)][i];
      bound[i] = (static_cast<double>(K[t] + 2) * u32 + g_rel) * s * (1 + out_roundoff<T>)+out_roundoff<T> *
                 std::abs(ref[static_cast<std::size_t>(t)][i]);
    }
    check_within(names[t], *got[t], ref[static_cast<std::size_t>(t)], bound);
  }
  if (!with_bias) CHECK(db.exact == old_db);  // untouched
}

TEST_CASE_TEMPLATE("matmul_backward matches the reference", T, float, tide::bf16, tide::f16) {
  unsigned seed = 100;
  for (dims const d : shapes) {
    backward_case<T>(d, true, false, seed++);
    backward_case<T>(d, false, false, seed++);
  }
}

TEST_CASE_TEMPLATE("matmul_forward_gelu keeps pre and applies the GELU", T, float, tide::bf16) {
  unsigned seed = 200;
  for (dims const d : shapes) {
    CAPTURE(d.N);
    CAPTURE(d.C);
    CAPTURE(d.OC);
    std::mt19937 rng(seed++);
    tensor<T> x(rows_shape(d.N, d.C), rng), w({d.OC, d.C}, rng, 0.5), b({d.OC}, rng), out(rows_shape(d.N, d.OC), rng),
        pre(out.s, rng);
    tide::thread_pool pool{2};
    tide::exec<tide::host> ex{pool};
    k::matmul_forward_gelu(ex, out.view(), pre.view(), x.view(), w.view(), b.view());
    std::vector<double> rpre(out.exact.size()), rout(out.exact.size()), S(out.exact.size());
    k::reference::matmul_forward_gelu(tensor_view<double>{rout.data(), out.s}, tensor_view<double>{rpre.data(), out.s},
                                      x.dview(), w.dview(), b.dview());
    auto xa = x.abs(), wa = w.abs(), ba = b.abs();
    k::reference::matmul_forward(tensor_view<double>{S.data(), out.s}, tensor_view<double const>{xa.data(), x.s},
                                 tensor_view<double const>{wa.data(), w.s}, tensor_view<double const>{ba.data(), b.s});
    // pre: as matmul_forward. out = gelu(stored pre): |gelu'| <= 1.13 carries pre's error, the
    // float GELU adds 4 u |pre| (gelu.hpp), the output rounding u_T |out|.
    double const uT = out_roundoff<T>;
    std::vector<double> bpre(S.size()), bout(S.size());
    for (std::size_t i = 0; i < S.size(); ++i) {
      bpre[i] = static_cast<double>(d.C + 2) * u32 * S[i] * (1 + uT) + uT * std::abs(rpre[i]);
      bout[i] = 1.13 * bpre[i] + 4 * u32 * std::abs(rpre[i]) * (1 + uT) + uT * std::abs(rout[i]);
    }
    check_within("pre", pre, rpre, bpre);
    check_within("out", out, rout, bout);
  }
}

TEST_CASE_TEMPLATE("matmul_backward_gelu matches the reference", T, float, tide::bf16) {
  unsigned seed = 300;
  for (dims const d : shapes) {
    backward_case<T>(d, true, true, seed++);
    backward_case<T>(d, false, true, seed++);
  }
}

// ---- the reference itself against finite differences ---------------------------------------

// loss = sum_i r_i out_i for fixed random r, so d loss / d out = r. Central differences in double
// with h = 1e-5: truncation ~ h^2 |f'''| ~ 1e-10, cancellation ~ 1e-16 / h ~ 1e-11.
TEST_CASE("matmul reference backward equals central finite differences (double)") {
  for (bool gelu : {false, true}) {
    CAPTURE(gelu);
    index_t const N = 3, C = 4, OC = 5;
    std::mt19937 rng(7);
    std::normal_distribution<double> nd;
    auto fill = [&](index_t n) {
      std::vector<double> v(static_cast<std::size_t>(n));
      for (double& e : v) e = nd(rng);
      return v;
    };
    std::vector<double> x = fill(N * C), w = fill(OC * C), b = fill(OC), r = fill(N * OC);
    auto loss = [&] {
      std::vector<double> out(static_cast<std::size_t>(N * OC)), pre(out.size());
      tensor_view<double> const ov{out.data(), {N, OC}};
      tensor_view<double const> const xv{x.data(), {N, C}}, wv{w.data(), {OC, C}}, bv{b.data(), {OC}};
      if (gelu)
        k::reference::matmul_forward_gelu(ov, tensor_view<double>{pre.data(), {N, OC}}, xv, wv, bv);
      else
        k::reference::matmul_forward(ov, xv, wv, bv);
      double s = 0;
      for (std::size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
      return s;
    };
    std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0), dout(r);
    std::vector<double> pre(static_cast<std::size_t>(N * OC)), out(pre.size());
    k::reference::matmul_forward_gelu(
        tensor_view<double>{out.data(), {N, OC}}, tensor_view<double>{pre.data(), {N, OC}},
        tensor_view<double const>{x.data(), {N, C}}, tensor_view<double const>{w.data(), {OC, C}},
        tensor_view<double const>{b.data(), {OC}});
    tensor_view<double> const dxv{dx.data(), {N, C}}, dwv{dw.data(), {OC, C}}, dbv{db.data(), {OC}};
    tensor_view<double const> const xv{x.data(), {N, C}}, wv{w.data(), {OC, C}};
    if (gelu)
      k::reference::matmul_backward_gelu(dxv, dwv, dbv, tensor_view<double>{dout.data(), {N, OC}},
                                         tensor_view<double const>{pre.data(), {N, OC}}, xv, wv);
    else
      k::reference::matmul_backward(dxv, dwv, dbv, tensor_view<double const>{dout.data(), {N, OC}}, xv, wv);

    double const h = 1e-5;
    auto check_grad = [&](char const* name, std::vector<double>& p, std::vector<double> const& grad) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        double const keep = p[i];
        p[i] = keep + h;
        double const up = loss();
        p[i] = keep - h;
        double const down = loss();
        p[i] = keep;
        double const fd = (up - down) / (2 * h);
        INFO(name, "[", i, "]: analytic ", grad[i], ", finite difference ", fd);
        CHECK(std::abs(fd - grad[i]) <= 1e-7 * (1 + std::abs(fd)));
      }
    };
    check_grad("dinp", x, dx);
    check_grad("dweight", w, dw);
    check_grad("dbias", b, db);
  }
}

// ---- determinism and the portable path --------------------------------------------------------

template <class T>
std::vector<T> run_all(int threads, dims d) {
  std::mt19937 rng(42);
  tensor<T> x(rows_shape(d.N, d.C), rng), w({d.OC, d.C}, rng), b({d.OC}, rng), out(rows_shape(d.N, d.OC), rng),
      pre(out.s, rng), dout(out.s, rng), dinp(x.s, rng), dw(w.s, rng), db(b.s, rng);
  tide::thread_pool pool{threads};
  tide::exec<tide::host> ex{pool};
  k::matmul_forward_gelu(ex, out.view(), pre.view(), x.view(), w.view(), b.view());
  k::matmul_backward_gelu(ex, dinp.view(), dw.view(), db.view(), dout.view(), pre.view(), x.view(), w.view());
  std::vector<T> all;
  for (auto const* t : {&out, &pre, &dout, &dinp, &dw, &db}) all.insert(all.end(), t->v.begin(), t->v.end());
  return all;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Sizes where OpenBLAS does use both threads (it stays on one below ~64^3).
TEST_CASE_TEMPLATE("matmul results are identical for 1 and 2 threads", T, float, tide::bf16) {
  dims const d{96, 160, 200};
  CHECK(same_bits(run_all<T>(1, d), run_all<T>(2, d)));
}

// The sgemm used when no BLAS is linked, tested here directly: every transpose form, against
// double sums, and bit-identical across thread counts.
TEST_CASE("sgemm_portable matches double sums and is identical for 1 and 3 threads") {
  for (auto const [M, N, K] :
       {std::array<index_t, 3>{1, 1, 1}, {5, 33, 7}, {70, 47, 300}, {9, 100, 513}, {64, 64, 0}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          CAPTURE(M);
          CAPTURE(N);
          CAPTURE(K);
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(acc);
          std::mt19937 rng(static_cast<unsigned>(M * 7 + N * 3 + K + (ta ? 1000 : 0) + (tb ? 2000 : 0)));
          std::normal_distribution<float> nd;
          std::vector<float> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(K * N)),
              c0(static_cast<std::size_t>(M * N));
          for (auto* v : {&a, &b, &c0})
            for (float& e : *v) e = nd(rng);
          index_t const lda = ta ? M : K, ldb = tb ? K : N;
          auto A = [&](index_t i, index_t kk) {
            return double{a[static_cast<std::size_t>(ta ? kk * lda + i : i * lda + kk)]};
          };
          auto B = [&](index_t kk, index_t j) {
            return double{b[static_cast<std::size_t>(tb ? j * ldb + kk : kk * ldb + j)]};
          };
          std::vector<float> c1 = c0, c3 = c0;
          tide::thread_pool p1{1}, p3{3};
          std::vector<float> bt(static_cast<std::size_t>(K * N));  // the transposed B's scratch
          k::detail::sgemm_portable(p1, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, acc, c1.data(), N, bt.data());
          k::detail::sgemm_portable(p3, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, acc, c3.data(), N, bt.data());
          CHECK(same_bits(c1, c3));
          double worst = 0;
          for (index_t i = 0; i < M; ++i)
            for (index_t j = 0; j < N; ++j) {
              double s = acc ? double{c0[static_cast<std::size_t>(i * N + j)]} : 0.0;
              double sa = std::abs(s);
              for (index_t kk = 0; kk < K; ++kk) s += A(i, kk) * B(kk, j), sa += std::abs(A(i, kk) * B(kk, j));
              double const e = std::abs(double{c1[static_cast<std::size_t>(i * N + j)]} - s);
              worst = std::max(worst, e / (static_cast<double>(K + 2) * u32 * sa + 1e-300));
            }
          CHECK(worst <= 1.0);
        }
  }
}

// ---- bad calls --------------------------------------------------------------------------------

template <class F>
void throws_usage(F&& f, std::string const& needle) {
  try {
    f();
    FAIL("expected tide::error(usage) mentioning '", needle, "'");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    INFO(e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

TEST_CASE("bad matmul shapes throw usage errors and touch nothing") {
  std::vector<float> x(6 * 4, 1.f), w(5 * 4, 1.f), b(5, 1.f), out(6 * 5, 7.f), big(64, 3.f);
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tensor_view<float> const X{x.data(), {6, 4}}, W{w.data(), {5, 4}}, B{b.data(), {5}}, O{out.data(), {6, 5}};
  throws_usage(
      [&] {
        k::matmul_forward(ex, O, X, tensor_view<float>{w.data(), {5, 3}}, B);
      },
      "weight of shape (OC, C)");
  throws_usage(
      [&] {
        k::matmul_forward(ex, tensor_view<float>{out.data(), {6, 4}}, X, W, B);
      },
      "out with the leading extents");
  throws_usage([&] { k::matmul_forward(ex, tensor_view<float>{out.data(), {5, 5}}, X, W, B); }, "got (5, 5)");
  throws_usage([&] { k::matmul_forward(ex, O, X, W, tensor_view<float const>{b.data(), {4}}); }, "bias of shape (5)");
  throws_usage([&] { k::matmul_forward(ex, O, tensor_view<float>{x.data(), {24}}, W, B); }, "inp of shape (N, C)");
  throws_usage(
      [&] {
        k::matmul_forward(ex, tensor_view<float>{x.data(), {6, 5}}, tensor_view<float>{x.data(), {6, 4}}, W, B);
      },
      "overlaps");
  tensor_view<float> const strided{out.data(), {6, 4}, {5, 1, 1, 1}};
  throws_usage([&] { k::matmul_forward(ex, O, strided, W, B); }, "contiguous");
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.f; }));

  std::vector<float> dx(x.size(), 2.f), dw(w.size(), 2.f), db(5, 2.f), dout(out.size(), 1.f), pre(out.size(), 1.f);
  tensor_view<float> const DX{dx.data(), {6, 4}}, DW{dw.data(), {5, 4}}, DB{db.data(), {5}}, DO{dout.data(), {6, 5}},
      P{pre.data(), {6, 5}};
  throws_usage(
      [&] {
        k::matmul_backward(ex, tensor_view<float>{dx.data(), {4, 6}}, DW, DB, DO, X, W);
      },
      "dinp of the shape");
  throws_usage([&] { k::matmul_backward(ex, DX, tensor_view<float>{dw.data(), {4, 5}}, DB, DO, X, W); }, "dweight");
  throws_usage(
      [&] {
        k::matmul_backward(ex, DX, DW, tensor_view<float>{db.data(), {3}}, DO, X, W);
      },
      "dbias of shape (5)");
  throws_usage([&] { k::matmul_backward(ex, DX, DW, DB, tensor_view<float>{dout.data(), {6, 4}}, X, W); }, "dout with");
  throws_usage([&] { k::matmul_backward(ex, DX, DW, DB, DX, X, W); }, "dout with");
  throws_usage(
      [&] {
        k::matmul_backward_gelu(ex, DX, DW, DB, DO, tensor_view<float>{pre.data(), {6, 4}}, X, W);
      },
      "pre");
  throws_usage([&] { k::matmul_backward_gelu(ex, DX, DW, DB, DO, DO, X, W); }, "overlaps");
  throws_usage([&] { k::matmul_forward_gelu(ex, O, O, X, W, B); }, "overlaps");
  throws_usage([&] { k::matmul_forward_gelu(ex, O, tensor_view<float>{pre.data(), {6, 4}}, X, W, B); }, "pre");
  for (auto const* v : {&dx, &dw, &db}) CHECK(std::all_of(v->begin(), v->end(), [](float e) { return e == 2.f; }));
  CHECK(std::all_of(dout.begin(), dout.end(), [](float e) { return e == 1.f; }));
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.f; }));
}

// ---- the backward in two halves ---------------------------------------------------------------

// One backward's inputs and old accumulators (non-zero: the halves add, as the fused call does).
template <class T>
struct split_case {
  dims d;
  std::mt19937 rng;
  tensor<T> x, w, dout, pre, dinp, dw, db;
  split_case(dims shape, unsigned seed)
      : d(shape),
        rng(seed),
        x(rows_shape(d.N, d.C), rng),
        w({d.OC, d.C}, rng, 0.5),
        dout(rows_shape(d.N, d.OC), rng),
        pre(dout.s, rng, 2.0),
        dinp(x.s, rng),
        dw(w.s, rng),
        db({d.OC}, rng) {}
};

template <class T>
struct split_grads {
  std::vector<T> dinp, dw, db, dout;
};

// How the backward runs: fused, the input half then the weight half, the weight half then the
// input half, or only one of them.
enum class split { fused, input_then_weight, weight_then_input, input_only, weight_only };

// Runs the backward (the GELU form when gelu: its input half rewrites dout, which the weight half
// then reads, so it runs input first) on copies of the accumulators and dout.
template <class T>
split_grads<T> run_split(split_case<T> const& p, int threads, split how, bool gelu, bool with_bias) {
  split_grads<T> g{p.dinp.v, p.dw.v, p.db.v, p.dout.v};
  tide::thread_pool pool{threads};
  tide::exec<tide::host> ex{pool};
  k::detail::call_scratch const scratch(k::matmul_backward_scratch_bytes<T>(ex, p.d.N, p.d.C, p.d.OC));
  auto const ws = scratch.get();
  tensor_view<T> const dinp{g.dinp.data(), p.x.s}, dw{g.dw.data(), p.w.s}, dout{g.dout.data(), p.dout.s};
  tensor_view<T> const db = with_bias ? tensor_view<T>{g.db.data(), {p.d.OC}} : tensor_view<T>{};
  tensor_view<T const> const x{p.x.v.data(), p.x.s}, w{p.w.v.data(), p.w.s}, pre{p.pre.v.data(), p.pre.s};
  auto input = [&] {
    if (gelu)
      k::matmul_backward_gelu_input(ex, dinp, dout, pre, w, ws);
    else
      k::matmul_backward_input(ex, dinp, tensor_view<T const>(dout), w, ws);
  };
  auto weight = [&] { k::matmul_backward_weight(ex, dw, db, tensor_view<T const>(dout), x, ws); };
  switch (how) {
    case split::fused:
      if (gelu)
        k::matmul_backward_gelu(ex, dinp, dw, db, dout, pre, x, w, ws);
      else
        k::matmul_backward(ex, dinp, dw, db, tensor_view<T const>(dout), x, w, ws);
      break;
    case split::input_then_weight: input(), weight(); break;
    case split::weight_then_input: weight(), input(); break;
    case split::input_only: input(); break;
    case split::weight_only: weight(); break;
  }
  return g;
}

// Bitwise equality, with the count and the first index of differing elements when not.
template <class T>
void check_bits(char const* what, std::vector<T> const& got, std::vector<T> const& want) {
  REQUIRE(got.size() == want.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
  INFO(what, ": ", differ, " of ", got.size(), " elements differ, the first at ", first);
  CHECK(differ == 0);
}

// N = 37 is odd (one (N, C) view); N = 300 rows cut the sgemm into several blocks of rows and
// OC = 72 the dbias sums into two column tasks.
dims const split_shapes[] = {{37, 24, 40}, {300, 40, 72}};

TEST_CASE_TEMPLATE("matmul backward split: the input and weight halves give the fused bits", T, float, tide::bf16,
                   tide::f16) {
  unsigned seed = 400;
  for (dims const d : split_shapes) {
    split_case<T> const p(d, seed++);
    for (int threads : {1, 2})
      for (bool with_bias : {true, false}) {
        INFO("N ", d.N, ", C ", d.C, ", OC ", d.OC, ", threads ", threads, ", bias ", with_bias);
        auto const fused = run_split(p, threads, split::fused, false, with_bias);
        CHECK(!same_bits(fused.dinp, p.dinp.v));  // the backward ran
        CHECK(!same_bits(fused.dw, p.dw.v));
        for (split how : {split::input_then_weight, split::weight_then_input}) {
          CAPTURE(how == split::input_then_weight);
          auto const halves = run_split(p, threads, how, false, with_bias);
          check_bits("dinp", halves.dinp, fused.dinp);
          check_bits("dweight", halves.dw, fused.dw);
          check_bits("dbias", halves.db, fused.db);
          check_bits("dout (read only)", halves.dout, p.dout.v);
        }
        // Each half writes only its own outputs.
        auto const input = run_split(p, threads, split::input_only, false, with_bias);
        check_bits("dinp, input half alone", input.dinp, fused.dinp);
        check_bits("dweight, input half alone", input.dw, p.dw.v);
        check_bits("dbias, input half alone", input.db, p.db.v);
        auto const weight = run_split(p, threads, split::weight_only, false, with_bias);
        check_bits("dinp, weight half alone", weight.dinp, p.dinp.v);
        check_bits("dweight, weight half alone", weight.dw, fused.dw);
        check_bits("dbias, weight half alone", weight.db, fused.db);
        if (!with_bias) check_bits("dbias absent", fused.db, p.db.v);
      }
  }
}

TEST_CASE_TEMPLATE("matmul backward split, GELU form: the input half rewrites dout as the fused call does", T, float,
                   tide::bf16, tide::f16) {
  unsigned seed = 500;
  for (dims const d : split_shapes) {
    split_case<T> const p(d, seed++);
    for (int threads : {1, 2})
      for (bool with_bias : {true, false}) {
        INFO("N ", d.N, ", C ", d.C, ", OC ", d.OC, ", threads ", threads, ", bias ", with_bias);
        auto const fused = run_split(p, threads, split::fused, true, with_bias);
        CHECK(!same_bits(fused.dout, p.dout.v));  // dout now holds the gradient of pre
        auto const input = run_split(p, threads, split::input_only, true, with_bias);
        check_bits("dout after the input half", input.dout, fused.dout);
        check_bits("dinp after the input half", input.dinp, fused.dinp);
        check_bits("dweight, input half alone", input.dw, p.dw.v);
        check_bits("dbias, input half alone", input.db, p.db.v);
        auto const halves = run_split(p, threads, split::input_then_weight, true, with_bias);
        check_bits("dinp", halves.dinp, fused.dinp);
        check_bits("dweight", halves.dw, fused.dw);
        check_bits("dbias", halves.db, fused.db);
        check_bits("dout", halves.dout, fused.dout);
      }
  }
}

TEST_CASE("matmul backward split: bad calls throw usage errors and touch nothing") {
  std::vector<float> x(6 * 4, 1.f), w(5 * 4, 1.f), dx(x.size(), 2.f), dw(w.size(), 2.f), db(5, 2.f),
      dout(6 * 5, 1.f), pre(dout.size(), 1.f);
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  k::detail::call_scratch const scratch(k::matmul_backward_scratch_bytes<float>(ex, 6, 4, 5));
  auto const ws = scratch.get();
  tensor_view<float> const X{x.data(), {6, 4}}, W{w.data(), {5, 4}}, DX{dx.data(), {6, 4}}, DW{dw.data(), {5, 4}},
      DB{db.data(), {5}}, DO{dout.data(), {6, 5}}, P{pre.data(), {6, 5}};
  using in_view = tensor_view<float const>;

  // The input half: dinp (N, C) against dout (N, OC) and weight (OC, C).
  throws_usage([&] { k::matmul_backward_input(ex, tensor_view<float>{dx.data(), {4, 6}}, DO, W, ws); }, "(4, 6)");
  throws_usage([&] { k::matmul_backward_input(ex, tensor_view<float>{dx.data(), {5, 4}}, DO, W, ws); }, "(5, 4)");
  throws_usage([&] { k::matmul_backward_input(ex, DX, in_view{dout.data(), {6, 4}}, W, ws); }, "dout with");
  throws_usage([&] { k::matmul_backward_input(ex, DX, DO, in_view{w.data(), {4, 5}}, ws); }, "(4, 5)");
  throws_usage([&] { k::matmul_backward_input(ex, tensor_view<float>{dout.data(), {6, 4}}, DO, W, ws); }, "overlaps");
  throws_usage(  // dinp over weight
      [&] { k::matmul_backward_input(ex, tensor_view<float>{w.data(), {5, 4}}, in_view{dout.data(), {5, 5}}, W, ws); },
      "overlaps");
  tensor_view<float> const strided{dx.data(), {3, 4}, {8, 1, 1, 1}};
  throws_usage([&] { k::matmul_backward_input(ex, strided, in_view{dout.data(), {3, 5}}, W, ws); }, "contiguous");

  // The weight half: dweight (OC, C) against inp (N, C) and dout (N, OC); dbias (OC).
  throws_usage([&] { k::matmul_backward_weight(ex, tensor_view<float>{dw.data(), {4, 5}}, DB, DO, X, ws); }, "(4, 5)");
  throws_usage([&] { k::matmul_backward_weight(ex, tensor_view<float>{dw.data(), {4, 4}}, DB, DO, X, ws); }, "dout with");
  throws_usage([&] { k::matmul_backward_weight(ex, DW, tensor_view<float>{db.data(), {3}}, DO, X, ws); },
               "dbias of shape (5)");
  throws_usage([&] { k::matmul_backward_weight(ex, DW, DB, DO, in_view{x.data(), {4, 6}}, ws); }, "weight");
  throws_usage([&] { k::matmul_backward_weight(ex, DW, DB, in_view{dout.data(), {5, 5}}, X, ws); }, "dout with");
  throws_usage([&] { k::matmul_backward_weight(ex, DW, tensor_view<float>{dw.data(), {5}}, DO, X, ws); }, "overlaps");
  throws_usage([&] { k::matmul_backward_weight(ex, tensor_view<float>{dout.data(), {5, 4}}, DB, DO, X, ws); },
               "overlaps");
  throws_usage([&] { k::matmul_backward_weight(ex, DW, tensor_view<float>{x.data(), {5}}, DO, X, ws); }, "overlaps");

  // The GELU input half: also pre, of dout's shape, apart from dout.
  throws_usage([&] { k::matmul_backward_gelu_input(ex, DX, DO, in_view{pre.data(), {6, 4}}, W, ws); }, "pre");
  throws_usage([&] { k::matmul_backward_gelu_input(ex, DX, DO, DO, W, ws); }, "overlaps");
  throws_usage([&] { k::matmul_backward_gelu_input(ex, tensor_view<float>{dx.data(), {4, 6}}, DO, P, W, ws); },
               "(4, 6)");
  throws_usage([&] { k::matmul_backward_gelu_input(ex, tensor_view<float>{dout.data(), {6, 4}}, DO, P, W, ws); },
               "overlaps");

  for (auto const* v : {&dx, &dw, &db}) CHECK(std::all_of(v->begin(), v->end(), [](float e) { return e == 2.f; }));
  CHECK(std::all_of(dout.begin(), dout.end(), [](float e) { return e == 1.f; }));
}

TEST_CASE("matmul backward split: less scratch than the query asks is refused before anything is written") {
  using T = tide::bf16;  // float needs no scratch with BLAS; bf16 needs its float copies
  index_t const N = 6, C = 4, OC = 5;
  std::mt19937 rng(9);
  tensor<T> x({N, C}, rng), w({OC, C}, rng), dout({N, OC}, rng), pre({N, OC}, rng), dinp({N, C}, rng),
      dw({OC, C}, rng), db({OC}, rng);
  auto const old_dinp = dinp.v, old_dw = dw.v, old_db = db.v, old_dout = dout.v;
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  std::size_t const need = k::matmul_backward_scratch_bytes<T>(ex, N, C, OC);
  REQUIRE(need > 4);
  k::detail::call_scratch const small(need - 4), none(0);
  for (k::scratch<> const ws : {small.get(), none.get()}) {
    CAPTURE(ws.bytes);
    CHECK_THROWS_WITH_AS(k::matmul_backward_input(ex, dinp.view(), tensor_view<T const>(dout.view()), w.view(), ws),
                         doctest::Contains("matmul_backward_scratch_bytes"), tide::error);
    CHECK_THROWS_WITH_AS(
        k::matmul_backward_weight(ex, dw.view(), db.view(), tensor_view<T const>(dout.view()), x.view(), ws),
        doctest::Contains("matmul_backward_scratch_bytes"), tide::error);
    CHECK_THROWS_WITH_AS(k::matmul_backward_gelu_input(ex, dinp.view(), dout.view(), pre.view(), w.view(), ws),
                         doctest::Contains("matmul_backward_scratch_bytes"), tide::error);
  }
  CHECK(same_bits(dinp.v, old_dinp));
  CHECK(same_bits(dw.v, old_dw));
  CHECK(same_bits(db.v, old_db));
  CHECK(same_bits(dout.v, old_dout));  // the GELU input half rewrites dout only after its checks
}

}  // namespace
