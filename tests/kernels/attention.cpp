#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tide/kernels/attention/attention.hpp>
#include <vector>

namespace {

namespace k = tide::kernels;
using tide::index_t;
using tide::tensor_view;

constexpr double u32 = 0x1p-24;

struct dims {
  index_t B, T, C, NH;
};

// Values held as T with their exact double copies (bf16 / f16 values are exact in double).
template <class T>
struct values {
  std::vector<T> v;
  std::vector<double> exact;
  tide::shape s;
  values(tide::shape shape, std::mt19937& rng) : s(shape) {
    std::normal_distribution<double> d;
    for (index_t i = 0; i < s.numel(); ++i) {
      v.push_back(tide::from_float<T>(static_cast<float>(d(rng))));
      exact.push_back(static_cast<double>(tide::to_float(v.back())));
    }
  }
  tensor_view<T> view() { return {v.data(), s}; }
  tensor_view<double> dview() { return {exact.data(), s}; }
  double at(std::size_t i) const { return static_cast<double>(tide::to_float(v[i])); }
};

// max |got - ref| / max |ref| over the elements [first, first + count) of every row of `row` elements
// (one part of qkv: q, k or v), or over everything when row == 0.
template <class G>
double normwise(G const& got, std::vector<double> const& ref, std::size_t row = 0, std::size_t first = 0,
                std::size_t count = 0) {
  double err = 0, top = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (row != 0 && (i % row < first || i % row >= first + count)) continue;
    err = std::max(err, std::abs(got(i) - ref[i]));
    top = std::max(top, std::abs(ref[i]));
  }
  return top == 0 ? err : err / top;
}

// The bounds of attention.hpp. float: (T + HS + 16) u forward (sums of up to T probabilities and
// HS-term dot products, reordered into blocks and lanes, plus exp_poly's ulp), four times that for
// the backward (its gradients chain two such sums through dS = P (dP - D)). bf16 / f16: the
// output's rounding, 2^-8 / 2^-11 relative per element, hence normwise; the backward also starts
// from an out that was rounded (D = dout . out carries it), hence 4 roundings.
template <class T>
double forward_tol(dims d) {
  double const f = static_cast<double>(d.T + d.C / d.NH + 16) * u32;
  return std::is_same_v<T, float> ? f : double{tide::unit_roundoff<T>} + f;
}
template <class T>
double backward_tol(dims d) {
  double const f = 4 * static_cast<double>(d.T + d.C / d.NH + 16) * u32;
  return std::is_same_v<T, float> ? f : 4 * double{tide::unit_roundoff<T>} + f;
}

template <class T>
void check_case(dims d, unsigned seed, int threads = 2) {
  CAPTURE(d.B);
  CAPTURE(d.T);
  CAPTURE(d.C);
  CAPTURE(d.NH);
  std::mt19937 rng(seed);
  values<T> qkv({d.B, d.T, 3 * d.C}, rng), out({d.B, d.T, d.C}, rng), dout({d.B, d.T, d.C}, rng),
      dqkv({d.B, d.T, 3 * d.C}, rng);
  std::vector<float> lse(static_cast<std::size_t>(d.B * d.NH * d.T), -1.f);
  tide::thread_pool pool{threads};
  tide::exec<tide::host> ex{pool};
  tensor_view<float> const L{lse.data(), {d.B, d.NH, d.T}};
  k::attention_forward(ex, out.view(), L, qkv.view(), d.NH);
  auto const old = dqkv.exact;
  k::attention_backward(ex, dqkv.view(), dout.view(), qkv.view(), out.view(), L, d.NH);

  std::vector<double> rout(out.exact.size()), rlse(lse.size()), rd(old);
  k::reference::attention_forward(tensor_view<double>{rout.data(), out.s},
                                  tensor_view<double>{rlse.data(), L.extents()}, qkv.dview(), d.NH);
  k::reference::attention_backward(tensor_view<double>{rd.data(), qkv.s}, dout.dview(), qkv.dview(), d.NH);

  double const ftol = forward_tol<T>(d), btol = backward_tol<T>(d);
  double const e_out = normwise([&](std::size_t i) { return out.at(i); }, rout);
  INFO("out: normwise error ", e_out, ", bound ", ftol);
  CHECK(e_out <= ftol);
  // lse ~ log T + O(|s|), float for every T: absolute and relative parts, the float bound.
  double const ltol = forward_tol<float>(d);
  double e_lse = 0;
  for (std::size_t i = 0; i < lse.size(); ++i)
    e_lse = std::max(e_lse, std::abs(double{lse[i]} - rlse[i]) / (1 + std::abs(rlse[i])));
  INFO("lse: error / (1 + |lse|) ", e_lse, ", bound ", ltol);
  CHECK(e_lse <= ltol);
  auto const C = static_cast<std::size_t>(d.C);
  char const* names[] = {"dq", "dk", "dv"};
  for (std::size_t part = 0; part < 3; ++part) {
    double const e = normwise([&](std::size_t i) { return dqkv.at(i); }, rd, 3 * C, part * C, C);
    INFO(names[part], ": normwise error ", e, ", bound ", btol);
    CHECK(e <= btol);
  }
}

// Odd sizes: T = 1, 7, 33 (a partial block), 130 (three blocks, the last partial), head sizes
// 1, 4, 10, 17, 32 (not multiples of the vector width), T = 0.
dims const shapes[] = {{1, 1, 8, 2},   {2, 7, 12, 3}, {1, 33, 20, 2}, {2, 64, 64, 2},
                       {1, 65, 17, 1}, {3, 5, 6, 6},  {1, 130, 8, 2}, {2, 0, 8, 2}};

TEST_CASE_TEMPLATE("attention forward and backward match the reference", T, float, tide::bf16, tide::f16) {
  unsigned seed = 1;
  for (dims const d : shapes) check_case<T>(d, seed++);
}

TEST_CASE("attention runs on a single thread and on more threads than pairs") {
  check_case<float>({1, 20, 12, 3}, 9, 1);
  check_case<float>({1, 20, 12, 1}, 9, 3);
}

// ---- determinism: a (b, h) pair is computed by one thread in a fixed order ---------------------

template <class T>
std::vector<T> run(int threads) {
  dims const d{2, 70, 24, 3};
  std::mt19937 rng(5);
  values<T> qkv({d.B, d.T, 3 * d.C}, rng), out({d.B, d.T, d.C}, rng), dout({d.B, d.T, d.C}, rng),
      dqkv({d.B, d.T, 3 * d.C}, rng);
  std::vector<float> lse(static_cast<std::size_t>(d.B * d.NH * d.T));
  tide::thread_pool pool{threads};
  tide::exec<tide::host> ex{pool};
  tensor_view<float> const L{lse.data(), {d.B, d.NH, d.T}};
  k::attention_forward(ex, out.view(), L, qkv.view(), d.NH);
  k::attention_backward(ex, dqkv.view(), dout.view(), qkv.view(), out.view(), L, d.NH);
  std::vector<T> all = out.v;
  all.insert(all.end(), dqkv.v.begin(), dqkv.v.end());
  for (float x : lse) all.push_back(tide::from_float<T>(x));
  if constexpr (std::is_same_v<T, float>) all.insert(all.end(), lse.begin(), lse.end());
  return all;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST_CASE_TEMPLATE("attention results are identical for 1, 2 and 4 threads", T, float, tide::bf16) {
  auto const one = run<T>(1);
  CHECK(same_bits(one, run<T>(2)));
  CHECK(same_bits(one, run<T>(4)));
}

// ---- the reference itself against finite differences ----------------------------------------

// loss = sum r . out for fixed random r, so dout = r. Central differences in double, h = 1e-5:
// truncation ~ h^2 |f'''| ~ 1e-10, cancellation ~ 1e-16 / h ~ 1e-11.
TEST_CASE("attention reference backward equals central finite differences (double)") {
  index_t const B = 1, T = 5, C = 8, NH = 2;
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  std::vector<double> qkv(static_cast<std::size_t>(B * T * 3 * C)), r(static_cast<std::size_t>(B * T * C));
  for (double& x : qkv) x = nd(rng);
  for (double& x : r) x = nd(rng);
  auto loss = [&] {
    std::vector<double> out(r.size()), lse(static_cast<std::size_t>(B * NH * T));
    k::reference::attention_forward(tensor_view<double>{out.data(), {B, T, C}},
                                    tensor_view<double>{lse.data(), {B, NH, T}},
                                    tensor_view<double const>{qkv.data(), {B, T, 3 * C}}, NH);
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
    return s;
  };
  std::vector<double> grad(qkv.size(), 0.0);
  k::reference::attention_backward(tensor_view<double>{grad.data(), {B, T, 3 * C}},
                                   tensor_view<double const>{r.data(), {B, T, C}},
                                   tensor_view<double const>{qkv.data(), {B, T, 3 * C}}, NH);
  double const h = 1e-5;
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    double const keep = qkv[i];
    qkv[i] = keep + h;
    double const up = loss();
    qkv[i] = keep - h;
    double const down = loss();
    qkv[i] = keep;
    double const fd = (up - down) / (2 * h);
    INFO("dqkv[", i, "]: analytic ", grad[i], ", finite difference ", fd);
    CHECK(std::abs(fd - grad[i]) <= 1e-7 * (1 + std::abs(fd)));
  }
}

// The last query row sees every key, the first only itself: its output is v_0 exactly (a softmax
// of one element), a check of the causal mask that needs no reference.
TEST_CASE("the first token attends only to itself") {
  index_t const B = 1, T = 9, C = 4, NH = 2;
  std::mt19937 rng(11);
  values<float> qkv({B, T, 3 * C}, rng), out({B, T, C}, rng);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T));
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  k::attention_forward(ex, out.view(), tensor_view<float>{lse.data(), {B, NH, T}}, qkv.view(), NH);
  for (index_t c = 0; c < C; ++c)
    CHECK(out.v[static_cast<std::size_t>(c)] == qkv.v[static_cast<std::size_t>(2 * C + c)]);
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

TEST_CASE("bad attention shapes throw usage errors and touch nothing") {
  index_t const B = 2, T = 3, C = 8, NH = 2;
  std::vector<float> qkv(static_cast<std::size_t>(B * T * 3 * C), 1.f), out(static_cast<std::size_t>(B * T * C), 7.f),
      lse(static_cast<std::size_t>(B * NH * T), 7.f), dqkv(qkv.size(), 2.f), dout(out.size(), 1.f);
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tensor_view<float> const Q{qkv.data(), {B, T, 3 * C}}, O{out.data(), {B, T, C}}, L{lse.data(), {B, NH, T}},
      DQ{dqkv.data(), {B, T, 3 * C}}, DO{dout.data(), {B, T, C}};
  throws_usage(
      [&] {
        k::attention_forward(ex, O, L, tensor_view<float>{qkv.data(), {B, T, 3 * C - 1}}, NH);
      },
      "(B, T, 3C)");
  throws_usage(
      [&] {
        k::attention_forward(ex, O, L, tensor_view<float>{qkv.data(), {B * T, 3 * C}}, NH);
      },
      "(B, T, 3C)");
  throws_usage([&] { k::attention_forward(ex, O, L, Q, 3); }, "divides C = 8");
  throws_usage([&] { k::attention_forward(ex, O, L, Q, 0); }, "NH >= 1");
  throws_usage(
      [&] {
        k::attention_forward(ex, tensor_view<float>{out.data(), {B, T - 1, C}}, L, Q, NH);
      },
      "out of shape");
  throws_usage([&] { k::attention_forward(ex, O, tensor_view<float>{lse.data(), {B, T, NH}}, Q, NH); }, "lse of shape");
  throws_usage([&] { k::attention_forward(ex, tensor_view<float>{qkv.data(), {B, T, C}}, L, Q, NH); }, "overlaps");
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.f; }));
  CHECK(std::all_of(lse.begin(), lse.end(), [](float v) { return v == 7.f; }));

  throws_usage(
      [&] {
        k::attention_backward(ex, tensor_view<float>{dqkv.data(), {B, T, 3 * C - 3}}, DO, Q, O, L, NH);
      },
      "dqkv of the shape");
  throws_usage(
      [&] {
        k::attention_backward(ex, DQ, tensor_view<float>{dout.data(), {B, T, C - 1}}, Q, O, L, NH);
      },
      "dout of shape");
  throws_usage(
      [&] {
        k::attention_backward(ex, DQ, DO, Q, O, tensor_view<float>{lse.data(), {B * NH * T}}, NH);
      },
      "lse of shape");
  throws_usage(
      [&] {
        k::attention_backward(ex, tensor_view<float>{qkv.data(), {B, T, 3 * C}}, DO, Q, O, L, NH);
      },
      "overlaps");
  CHECK(std::all_of(dqkv.begin(), dqkv.end(), [](float v) { return v == 2.f; }));
}

}  // namespace
