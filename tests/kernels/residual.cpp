// tide::kernels residual add: the host is bit-identical to the reference (one rounding of an
// exact sum) for float, bf16 and f16, in place too; the backward adds dout into both addends;
// bad arguments throw and write nothing.

#include <doctest/doctest.h>

#include "support/kernel_checks.hpp"

#include <tide/kernels/residual/residual.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using tide::test::same_bits;
using tide::test::usage_error;
using tide::test::view;

using tide::bf16;
using tide::f16;
using tide::index_t;
using tide::tensor_view;
namespace tk = tide::kernels;
namespace ref = tide::kernels::reference;

template <class T>
std::vector<T> random_vector(std::size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<T> v(n);
  for (auto& x : v) x = tide::from_float<T>(dist(gen));
  return v;
}




// Sizes around the vector width and the per-task grain (row_tuning::min_task_elems = 32768).
constexpr index_t sizes[] = {1, 3, 17, 63, 773, 32768 * 2 + 5};

template <class T>
void check_forward(std::mt19937& gen) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (index_t n : sizes) {
    CAPTURE(n);
    auto const un = static_cast<std::size_t>(n);
    auto a = random_vector<T>(un, gen), b = random_vector<T>(un, gen);
    std::vector<T> out(un), out_ref(un);
    tk::residual_forward(ex, view(out, {n}), view(a, {n}), view(b, {n}));
    ref::residual_forward(view(out_ref, {n}), view(a, {n}), view(b, {n}));
    // float(a) + float(b) rounded once to T equals the exact sum rounded once: bit-identical.
    CHECK(same_bits(out, out_ref));
    // In place, over either addend.
    auto a2 = a;
    tk::residual_forward(ex, view(a2, {n}), view(a2, {n}), view(b, {n}));
    CHECK(same_bits(a2, out_ref));
    auto b2 = b;
    tk::residual_forward(ex, view(b2, {n}), view(a, {n}), view(b2, {n}));
    CHECK(same_bits(b2, out_ref));
  }
}

template <class T>
void check_backward(std::mt19937& gen) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (index_t n : sizes) {
    CAPTURE(n);
    auto const un = static_cast<std::size_t>(n);
    auto const da0 = random_vector<T>(un, gen), db0 = random_vector<T>(un, gen);
    auto g = random_vector<T>(un, gen);
    auto da = da0, db = db0, da_ref = da0, db_ref = db0;
    tk::residual_backward(ex, view(da, {n}), view(db, {n}), view(g, {n}));
    ref::residual_backward(view(da_ref, {n}), view(db_ref, {n}), view(g, {n}));
    CHECK(same_bits(da, da_ref));
    CHECK(same_bits(db, db_ref));
    // da += dout, literally: an old value of 0 gives dout back.
    std::vector<T> zeros(un, tide::from_float<T>(0.0f)), db_zero = zeros;
    tk::residual_backward(ex, view(zeros, {n}), view(db_zero, {n}), view(g, {n}));
    CHECK(same_bits(zeros, g));
    CHECK(same_bits(db_zero, g));
  }
}

}  // namespace

TEST_CASE("residual_forward: bit-identical to the reference, float, bf16, f16, in place") {
  std::mt19937 gen(1);
  check_forward<float>(gen);
  check_forward<bf16>(gen);
  check_forward<f16>(gen);
}

TEST_CASE("residual_backward: dout accumulates into both addends, float, bf16, f16") {
  std::mt19937 gen(2);
  check_backward<float>(gen);
  check_backward<bf16>(gen);
  check_backward<f16>(gen);
}

TEST_CASE("residual_forward: any shape, and the result does not depend on the thread count") {
  std::mt19937 gen(3);
  auto a = random_vector<float>(2 * 64 * 773, gen), b = random_vector<float>(2 * 64 * 773, gen);
  std::vector<float> one(a.size()), three(a.size());
  tide::thread_pool p1{1}, p3{3};
  tk::residual_forward(tide::exec<tide::host>{p1}, view(one, {2, 64, 773}), view(a, {2, 64, 773}), view(b, {2, 64, 773}));
  tk::residual_forward(tide::exec<tide::host>{p3}, view(three, {2, 64, 773}), view(a, {2, 64, 773}),
                       view(b, {2, 64, 773}));
  CHECK(same_bits(one, three));
  CHECK(one[5] == a[5] + b[5]);
}

TEST_CASE("residual: bad arguments throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  std::vector<float> a(12, 1.0f), b(12, 2.0f), out(12, -7.0f), big(24, -7.0f);
  std::vector<float> const untouched(12, -7.0f);
  auto msg = usage_error([&] { tk::residual_forward(ex, view(out, {3, 4}), view(a, {4, 3}), view(b, {3, 4})); });
  CHECK(msg.find("(3, 4)") != std::string::npos);
  CHECK(msg.find("(4, 3)") != std::string::npos);
  msg = usage_error([&] { tk::residual_forward(ex, view(out, {12}), view(a, {12}), view(b, {3, 4})); });
  CHECK(msg.find("b") != std::string::npos);
  tensor_view<float> strided(big.data(), {12}, {2, 1, 1, 1});
  msg = usage_error([&] { tk::residual_forward(ex, strided, view(a, {12}), view(b, {12})); });
  CHECK(msg.find("contiguous") != std::string::npos);
  // A partial overlap of out and a (shifted by one element) is not an in-place call.
  msg = usage_error([&] {
    tk::residual_forward(ex, tensor_view<float>(big.data() + 1, {12}), tensor_view<float>(big.data(), {12}),
                         view(b, {12}));
  });
  CHECK(msg.find("overlaps") != std::string::npos);
  CHECK(same_bits(out, untouched));
  CHECK(same_bits(big, std::vector<float>(24, -7.0f)));

  std::vector<float> da(12, -7.0f), g(12, 1.0f);
  msg = usage_error([&] { tk::residual_backward(ex, view(da, {12}), view(da, {12}), view(g, {12})); });
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] { tk::residual_backward(ex, view(da, {12}), view(g, {12}), view(g, {12})); });
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] { tk::residual_backward(ex, view(da, {12}), view(out, {3, 4}), view(g, {12})); });
  CHECK(msg.find("db") != std::string::npos);
  CHECK(same_bits(da, untouched));
  CHECK(same_bits(g, std::vector<float>(12, 1.0f)));
}
