#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/exec.hpp>
#include <tide/kernels/embedding/embedding.hpp>

namespace {

using tide::bf16;
using tide::f16;
using tide::index_t;
using tide::tensor_view;
namespace k = tide::kernels;
namespace ref = tide::kernels::reference;

constexpr double u32 = 0x1p-24;  // fp32 unit roundoff

template <class T>
std::vector<T> random_values(index_t n, float stddev, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = tide::from_float<T>(dist(gen));
  return v;
}

std::vector<std::int32_t> random_tokens(index_t n, index_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = pick(gen);
  return t;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class F>
bool throws_usage(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e.category() == tide::errc::usage;
  }
  return false;
}

struct dims {
  index_t b, t, c, v, max_t;
};

// C not a multiple of the 16-channel block (1, 3, 17, 773), a vocabulary small enough that
// tokens repeat many times (so runs are long), and maxT > T.
constexpr dims shapes[] = {
    {1, 1, 1, 1, 1}, {2, 5, 3, 4, 7}, {3, 7, 17, 5, 9}, {2, 16, 773, 11, 20}, {4, 64, 48, 50, 64}};

}  // namespace

TEST_CASE_TEMPLATE("encoder_forward equals the reference bit for bit", T, float, bf16, f16) {
  // One float add per element, rounded once to T, in both: the same bits.
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (auto const d : shapes) {
    CAPTURE(d.c);
    auto const wte = random_values<T>(d.v * d.c, 1.f, 1);
    auto const wpe = random_values<T>(d.max_t * d.c, 1.f, 2);
    auto const tok = random_tokens(d.b * d.t, d.v, 3);
    std::vector<T> out(static_cast<std::size_t>(d.b * d.t * d.c)), expect(out.size());
    tensor_view<std::int32_t const> tv{tok.data(), {d.b, d.t}};
    tensor_view<T const> te{wte.data(), {d.v, d.c}}, pe{wpe.data(), {d.max_t, d.c}};
    k::encoder_forward(ex, tensor_view<T>{out.data(), {d.b, d.t, d.c}}, tv, te, pe);
    ref::encoder_forward(tensor_view<T>{expect.data(), {d.b, d.t, d.c}}, tv, te, pe);
    CHECK(same_bits(out, expect));
    // One spot by hand: out[b, t] = wte[tok] + wpe[t].
    index_t const b = d.b - 1, t = d.t - 1, c = d.c - 1;
    index_t const v = tok[static_cast<std::size_t>(b * d.t + t)];
    float const want = tide::to_float(wte[static_cast<std::size_t>(v * d.c + c)]) +
                       tide::to_float(wpe[static_cast<std::size_t>(t * d.c + c)]);
    CHECK(tide::to_float(out[static_cast<std::size_t>((b * d.t + t) * d.c + c)]) ==
          tide::to_float(tide::from_float<T>(want)));
  }
}

TEST_CASE_TEMPLATE("encoder_backward accumulates into the tables like the double reference", G, float, bf16) {
  // Each table element adds its k contributions in float (fixed order), then once into the
  // table: |err| <= (k + 1) u sum|terms| (recursive summation), plus for a bf16 table the
  // rounding of the result, u_T |result| (the reference rounds too: both are compared unrounded
  // against the double sum, so 2 u_T).
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (auto const d : shapes) {
    CAPTURE(d.c);
    auto const dout = random_values<float>(d.b * d.t * d.c, 1.f, 5);
    auto const tok = random_tokens(d.b * d.t, d.v, 6);
    auto dwte = random_values<G>(d.v * d.c, 0.5f, 7);  // += into existing gradients
    auto dwpe = random_values<G>(d.max_t * d.c, 0.5f, 8);
    auto const te0 = dwte, pe0 = dwpe;
    auto expect_te = dwte, expect_pe = dwpe;
    tensor_view<std::int32_t const> tv{tok.data(), {d.b, d.t}};
    tensor_view<float const> dv{dout.data(), {d.b, d.t, d.c}};
    k::encoder_backward(ex, tensor_view<G>{dwte.data(), {d.v, d.c}}, tensor_view<G>{dwpe.data(), {d.max_t, d.c}}, dv,
                        tv);
    ref::encoder_backward(tensor_view<G>{expect_te.data(), {d.v, d.c}},
                          tensor_view<G>{expect_pe.data(), {d.max_t, d.c}}, dv, tv);

    // Per element: the count k and sum|terms|, from the inputs.
    std::vector<double> abs_te(te0.size(), 0.0), abs_pe(pe0.size(), 0.0);
    std::vector<int> k_te(te0.size(), 0), k_pe(pe0.size(), 0);
    for (index_t i = 0; i < d.b * d.t; ++i)
      for (index_t c = 0; c < d.c; ++c) {
        double const g = std::fabs(dout[static_cast<std::size_t>(i * d.c + c)]);
        auto const e = static_cast<std::size_t>(tok[static_cast<std::size_t>(i)] * d.c + c);
        auto const p = static_cast<std::size_t>((i % d.t) * d.c + c);
        abs_te[e] += g, ++k_te[e];
        abs_pe[p] += g, ++k_pe[p];
      }
    double const ut = std::is_same_v<G, float> ? 0.0 : 2.0 * double(tide::unit_roundoff<G>);
    auto const check = [&](std::vector<G> const& got, std::vector<G> const& want, std::vector<G> const& before,
                           std::vector<double> const& abs, std::vector<int> const& count, char const* name) {
      int bad = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        double const w = tide::to_float(want[i]);
        double const tol =
            (count[i] + 1) * u32 * (abs[i] + std::fabs(tide::to_float(before[i]))) + ut * std::fabs(w) + 1e-30;
        if (!(std::fabs(tide::to_float(got[i]) - w) <= tol) && ++bad < 5)
          FAIL_CHECK(name, "[", i, "]: got ", tide::to_float(got[i]), " expected ", w, " tol ", tol);
        if (count[i] == 0 && !same_bits(std::vector<G>{got[i]}, std::vector<G>{before[i]}) && ++bad < 5)
          FAIL_CHECK(name, "[", i, "] has no contribution but changed");
      }
      CHECK(bad == 0);
    };
    check(dwte, expect_te, te0, abs_te, k_te, "dwte");
    check(dwpe, expect_pe, pe0, abs_pe, k_pe, "dwpe");
  }
}

TEST_CASE("encoder_backward: bit-identical on 1, 2 and 3 threads, fp32 and bf16 tables") {
  index_t const b = 4, t = 32, c = 100, v = 13, max_t = 40;
  auto const dout = random_values<float>(b * t * c, 1.f, 9);
  auto const dout16 = random_values<bf16>(b * t * c, 1.f, 10);
  auto const tok = random_tokens(b * t, v, 11);
  auto const te0 = random_values<float>(v * c, 1.f, 12);
  auto const pe0 = random_values<float>(max_t * c, 1.f, 13);
  auto const te16 = random_values<bf16>(v * c, 1.f, 14);
  auto const pe16 = random_values<bf16>(max_t * c, 1.f, 15);
  std::vector<float> te[3], pe[3];
  std::vector<bf16> te_b[3], pe_b[3];
  for (int threads = 1; threads <= 3; ++threads) {
    tide::thread_pool pool{threads};
    tide::exec<tide::host> ex{pool};
    auto const i = static_cast<std::size_t>(threads - 1);
    te[i] = te0, pe[i] = pe0, te_b[i] = te16, pe_b[i] = pe16;
    tensor_view<std::int32_t const> tv{tok.data(), {b, t}};
    k::encoder_backward(ex, tensor_view<float>{te[i].data(), {v, c}}, tensor_view<float>{pe[i].data(), {max_t, c}},
                        tensor_view<float const>{dout.data(), {b, t, c}}, tv);
    k::encoder_backward(ex, tensor_view<bf16>{te_b[i].data(), {v, c}}, tensor_view<bf16>{pe_b[i].data(), {max_t, c}},
                        tensor_view<bf16 const>{dout16.data(), {b, t, c}}, tv);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    CAPTURE(i + 1);
    CHECK(same_bits(te[0], te[i]));
    CHECK(same_bits(pe[0], pe[i]));
    CHECK(same_bits(te_b[0], te_b[i]));
    CHECK(same_bits(pe_b[0], pe_b[i]));
  }
  CHECK(!same_bits(te[0], te0));  // something was accumulated
}

TEST_CASE("embedding: tokens out of range and bad shapes throw tide::error(usage), nothing written") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const b = 2, t = 3, c = 4, v = 5, max_t = 3;
  auto const wte = random_values<float>(v * c, 1.f, 1);
  auto const wpe = random_values<float>(max_t * c, 1.f, 2);
  std::vector<float> out(static_cast<std::size_t>(b * t * c), 7.f);
  std::vector<float> dwte(wte.size(), 3.f), dwpe(wpe.size(), 3.f);
  auto const out0 = out, dwte0 = dwte, dwpe0 = dwpe;
  tensor_view<float const> te{wte.data(), {v, c}}, pe{wpe.data(), {max_t, c}};
  tensor_view<float> o{out.data(), {b, t, c}}, gte{dwte.data(), {v, c}}, gpe{dwpe.data(), {max_t, c}};
  for (std::int32_t bad : {-1, 5, 1 << 30}) {
    std::vector<std::int32_t> tok{0, 1, 2, 3, 4, bad};
    tensor_view<std::int32_t const> tv{tok.data(), {b, t}};
    CHECK(throws_usage([&] { k::encoder_forward(ex, o, tv, te, pe); }));
    CHECK(throws_usage([&] {
      k::encoder_backward(ex, gte, gpe, tensor_view<float const>{out.data(), {b, t, c}}, tv);
    }));
  }
  std::vector<std::int32_t> tok{0, 1, 2, 3, 4, 0};
  tensor_view<std::int32_t const> tv{tok.data(), {b, t}};
  // tokens (B, T) must match out; C must match the tables; maxT >= T.
  CHECK(throws_usage([&] { k::encoder_forward(ex, o, tensor_view<std::int32_t const>{tok.data(), {t, b}}, te, pe); }));
  CHECK(throws_usage([&] { k::encoder_forward(ex, o, tv, tensor_view<float const>{wte.data(), {c, v}}, pe); }));
  CHECK(throws_usage([&] { k::encoder_forward(ex, o, tv, te, tensor_view<float const>{wpe.data(), {2, c}}); }));
  CHECK(throws_usage([&] { k::encoder_forward(ex, tensor_view<float>{out.data(), {b * t, c}}, tv, te, pe); }));
  // The gradient tables must not overlap each other.
  CHECK(throws_usage([&] {
    k::encoder_backward(ex, gte, tensor_view<float>{dwte.data() + 4, {max_t, c}},
                        tensor_view<float const>{out.data(), {b, t, c}}, tv);
  }));
  CHECK(same_bits(out, out0));
  CHECK(same_bits(dwte, dwte0));
  CHECK(same_bits(dwpe, dwpe0));
}

TEST_CASE_TEMPLATE("embedding: a table in row pieces gives the bits of the whole table", T, float, bf16) {
  // The pieces live in separate buffers; every element is read or summed exactly as from the
  // whole table, so forward and backward give the same bits. Pieces of 1, 2, 3 and 4 rows
  // (the last piece short: one piece per row at 1), and the whole table as one piece.
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  dims const d{3, 7, 17, 10, 9};
  auto const wte = random_values<T>(d.v * d.c, 1.f, 1);
  auto const wpe = random_values<T>(d.max_t * d.c, 1.f, 2);
  auto const tok = random_tokens(d.b * d.t, d.v, 3);
  auto const dout = random_values<T>(d.b * d.t * d.c, 1.f, 4);
  tensor_view<std::int32_t const> tv{tok.data(), {d.b, d.t}};
  tensor_view<T const> te{wte.data(), {d.v, d.c}}, pe{wpe.data(), {d.max_t, d.c}}, go{dout.data(), {d.b, d.t, d.c}};
  std::vector<T> out(static_cast<std::size_t>(d.b * d.t * d.c));
  k::encoder_forward(ex, tensor_view<T>{out.data(), {d.b, d.t, d.c}}, tv, te, pe);
  std::vector<T> gte(wte.size(), tide::from_float<T>(0.5f)), gpe(wpe.size(), tide::from_float<T>(0.25f));
  auto const gpe0 = gpe;
  k::encoder_backward(ex, tensor_view<T>{gte.data(), {d.v, d.c}}, tensor_view<T>{gpe.data(), {d.max_t, d.c}}, go, tv);
  for (index_t rows : {index_t{1}, index_t{2}, index_t{3}, index_t{4}, d.v}) {
    CAPTURE(rows);
    int const pieces = static_cast<int>((d.v + rows - 1) / rows);
    std::vector<std::vector<T>> table(static_cast<std::size_t>(pieces)), grad(table.size());
    k::row_table<T const> rt{.piece_rows = rows, .rows = d.v, .cols = d.c, .pieces = pieces};
    k::row_table<T> rg{.piece_rows = rows, .rows = d.v, .cols = d.c, .pieces = pieces};
    for (int j = 0; j < pieces; ++j) {
      auto const r0 = static_cast<std::size_t>(j * rows * d.c), n = static_cast<std::size_t>(rt.rows_of(j) * d.c);
      table[static_cast<std::size_t>(j)].assign(wte.begin() + static_cast<std::ptrdiff_t>(r0),
                                                wte.begin() + static_cast<std::ptrdiff_t>(r0 + n));
      grad[static_cast<std::size_t>(j)].assign(n, tide::from_float<T>(0.5f));
      rt.piece[j] = table[static_cast<std::size_t>(j)].data();
      rg.piece[j] = grad[static_cast<std::size_t>(j)].data();
    }
    std::vector<T> out2(out.size());
    k::encoder_forward(ex, tensor_view<T>{out2.data(), {d.b, d.t, d.c}}, tv, rt, pe);
    CHECK(same_bits(out2, out));
    std::vector<T> gpe2 = gpe0;
    k::encoder_backward(ex, rg, tensor_view<T>{gpe2.data(), {d.max_t, d.c}}, go, tv);
    std::vector<T> joined;
    for (auto const& g : grad) joined.insert(joined.end(), g.begin(), g.end());
    CHECK(same_bits(joined, gte));
    CHECK(same_bits(gpe2, gpe));
  }
  // A table whose pieces do not cover its rows, or a piece without an address, throws.
  k::row_table<T const> bad{.piece_rows = 3, .rows = d.v, .cols = d.c, .pieces = 3};  // 9 < 10 rows
  for (int j = 0; j < 3; ++j) bad.piece[j] = wte.data() + j * 3 * d.c;
  std::vector<T> out3(out.size());
  CHECK(throws_usage([&] { k::encoder_forward(ex, tensor_view<T>{out3.data(), {d.b, d.t, d.c}}, tv, bad, pe); }));
  bad.pieces = 4;  // 4 x 3 >= 10, but piece 3 has no address
  CHECK(throws_usage([&] { k::encoder_forward(ex, tensor_view<T>{out3.data(), {d.b, d.t, d.c}}, tv, bad, pe); }));
  bad.piece[3] = wte.data() + 8 * d.c;  // rows 8 .. 9 of the table: overlaps piece 2 (rows 6 .. 8)
  CHECK(throws_usage([&] { k::encoder_forward(ex, tensor_view<T>{out3.data(), {d.b, d.t, d.c}}, tv, bad, pe); }));
  bad.piece[3] = wte.data() + 9 * d.c;  // now disjoint: accepted
  k::encoder_forward(ex, tensor_view<T>{out3.data(), {d.b, d.t, d.c}}, tv, bad, pe);
  CHECK(same_bits(out3, out));
}
