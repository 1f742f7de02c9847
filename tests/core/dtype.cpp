// Conversions to bf16 and f16: round to nearest even, checked exhaustively against a
// reference that rounds through double arithmetic (every 16-bit pattern, and a sweep of floats).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <tide/core/dtype.hpp>

namespace {

float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The float value of every f16 pattern, decoded independently with ldexp.
double f16_value(std::uint16_t h) {
  int const e = (h >> 10) & 0x1f;
  int const m = h & 0x3ff;
  double const s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  return s * std::ldexp(1024 + m, e - 25);
}

// Nearest f16 to x, ties to even: positive finite patterns are ordered like their values, so
// a binary search finds the two neighbours of |x| and the nearer one wins.
std::uint16_t f16_nearest(double x) {
  std::uint16_t const sign = std::signbit(x) ? 0x8000 : 0;
  double const a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;
  std::uint16_t lo = 0, hi = 0x7bff;  // largest pattern with value <= a lies in [lo, hi]
  while (lo < hi) {
    auto const mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (f16_value(mid) <= a) lo = mid; else hi = static_cast<std::uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | lo;
  double const below = a - f16_value(lo), above = f16_value(lo + 1) - a;
  std::uint16_t const pick = below < above ? lo : above < below ? lo + 1 : (lo & 1) ? lo + 1 : lo;
  return sign | pick;
}

}  // namespace

TEST_CASE("bf16: round trip of every pattern and ties to even") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    float const f = tide::bf16_bits_to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(tide::bf16_bits_to_float(tide::float_to_bf16_bits(f))));
      continue;
    }
    REQUIRE(tide::float_to_bf16_bits(f) == h);
  }
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(tide::float_to_bf16_bits(1.0f + 0x1p-8f) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  CHECK(tide::float_to_bf16_bits(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(tide::float_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above the tie
  CHECK(tide::float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to Inf
  CHECK(std::isnan(float(tide::bf16(NAN))));
}

TEST_CASE("f16: every pattern round-trips and decodes like ldexp") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    float const f = tide::f16_bits_to_float(h);
    double const want = f16_value(h);
    if (std::isnan(want)) {
      CHECK(std::isnan(f));
      continue;
    }
    REQUIRE(static_cast<double>(f) == want);
    REQUIRE(tide::float_to_f16_bits(f) == h);
  }
}

TEST_CASE("f16: rounding of floats between the patterns matches brute force") {
  // Midpoints, near-midpoints and subnormals are where rounding goes wrong.
  float const probes[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f,
                          0x1p-25f, 0x1.000002p-25f, 0x1p-24f, 3 * 0x1p-25f, 0x1.8p-15f,
                          65504.0f, 65519.0f, 65520.0f, 6.1e-5f, 5.9e-8f, 2.98e-8f, 1e-3f, 3.14159f};
  for (float p : probes) {
    for (float s : {1.0f, -1.0f}) {
      float const x = s * p;
      CAPTURE(x);
      CHECK(tide::float_to_f16_bits(x) == f16_nearest(x));
    }
  }
  // A sweep over the binary16 range, one float in every 2^13 float patterns.
  for (std::uint32_t u = 0x33000000u; u < 0x47800000u; u += 0x1fffu) {
    float const x = from_bits32(u);
    CAPTURE(x);
    REQUIRE(tide::float_to_f16_bits(x) == f16_nearest(x));
  }
}

TEST_CASE("dtype facts") {
  static_assert(tide::dtype_of<float> == tide::dtype::f32);
  static_assert(tide::dtype_of<tide::bf16> == tide::dtype::bf16);
  static_assert(tide::size_of(tide::dtype::f16) == 2);
  CHECK(tide::to_string(tide::dtype::bf16) == "bf16");
  CHECK(tide::to_float(tide::from_float<tide::f16>(0.5f)) == 0.5f);
}
