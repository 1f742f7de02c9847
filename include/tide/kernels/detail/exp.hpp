#pragma once
// exp_poly(x): e^x in float, branch-free, so g++ vectorises a loop that calls it and CUDA runs
// the same arithmetic. Softmax and the fused classifier spend most of their time in exp on a
// CPU, and libm's scalar expf does not vectorise (measured on a 2-core AVX-512 Xeon: a 256 x
// 50257 softmax on 2 threads took 1.78 ns/elem with scalar expf, 0.95 with a vectorised exp).
// exp_poly_nonpositive(x) is the same arithmetic without the overflow handling, for softmax's
// exp(z - max): about 1.8x faster in a vectorised loop, and bit-identical to exp_poly on
// [-87.3365, 0].
//
// Accuracy: within 1.02 ulp of the exact e^x, so at most 1 ulp from the correctly rounded float,
// for every x in [-87.3365, 88.7228] (where e^x is a normal float). Checked over every float of
// that range once (max 1.011 ulp with FMA, 0.991 without); tests/kernels/softmax.cpp
// ("exp_poly") re-checks a sweep of 2^20 points and the edges.
//   x < -87.3365 (e^x below FLT_MIN, subnormal or 0): returns +0, an absolute error < 2^-126.
//   x > 88.7228 (e^x above FLT_MAX): +inf.   NaN: NaN.
//
// Method (Cephes expf): n = round(x / ln2), r = x - n ln2 in two parts (Cody-Waite; the product
// with the 9-bit high part is exact), e^r = 1 + r + r^2 P(r) with the degree-5 minimax P on
// |r| <= ln2/2, then 2^n built in the exponent field.

#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"

namespace tide::kernels::detail {

// a*b + c, fused wherever the hardware fuses (CUDA; x86 built with FMA), so the host and the
// device evaluate shared math with the same roundings. Without FMA: a multiply and an add.
TIDE_HOST_DEVICE inline float fmadd(float a, float b, float c) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#elif defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// c ? a : b, on the values' bits. g++ turns `(c ? 1 : e) * d` into a branch around a multiply,
// which with -ftrapping-math (the default) it will not if-convert, so the loop does not vectorise
// without AVX-512's masks (measured: GELU forward 6.1 ns/elem on a 2-core AVX2 EPYC). A select on
// bits stays a blend.
TIDE_HOST_DEVICE inline float pick(bool c, float a, float b) noexcept {
  std::uint32_t const m = 0u - static_cast<std::uint32_t>(c);
  return tide::detail::float_of((tide::detail::bits_of(a) & m) | (tide::detail::bits_of(b) & ~m));
}

// Constants of exp_poly, exposed so tests can probe its boundaries.
struct exp_poly_range {
  // The largest float whose e^x is finite (0x1.62e42ep+6) ...
  static constexpr float max_finite = 88.72283172607421875f;
  // ... and the smallest whose e^x is a normal float (-0x1.5d589ep+6).
  static constexpr float min_normal = -87.33654022216796875f;
};

TIDE_HOST_DEVICE inline float exp_poly(float x) noexcept {
  constexpr float hi = exp_poly_range::max_finite;
  constexpr float lo = exp_poly_range::min_normal;
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;     // 355/512: n * ln2_hi is exact for |n| <= 2^14
  constexpr float ln2_lo = -2.12194440e-4f;  // ln2 - ln2_hi
  constexpr float shifter = 12582912.f;      // 1.5 * 2^23: adding it rounds to an integer
  constexpr float inf = __builtin_huge_valf();

  // Clamp without std::min/max, so NaN flows through to the result.
  float const xc = x < lo ? lo : (x > hi ? hi : x);
  float const t = fmadd(xc, log2e, shifter);  // shifter + n, n = round(x log2 e) in [-126, 128]
  float const n = t - shifter;
  float r = fmadd(n, -ln2_hi, xc);
  r = fmadd(n, -ln2_lo, r);  // |r| <= ln2/2 (+ a rounding)

  float p = 1.9875691500e-4f;
  p = fmadd(p, r, 1.3981999507e-3f);
  p = fmadd(p, r, 8.3334519073e-3f);
  p = fmadd(p, r, 4.1665795894e-2f);
  p = fmadd(p, r, 1.6666665459e-1f);
  p = fmadd(p, r, 5.0000001201e-1f);
  p = fmadd(p, r * r, r);  // e^r - 1
  p = p + 1.f;

  // 2^n through the exponent field; n = 128 (x in (88.376, 88.723]) as 2^127 * 2.
  auto ni =
      static_cast<std::int32_t>(__builtin_bit_cast(std::uint32_t, t) - __builtin_bit_cast(std::uint32_t, shifter));
  std::int32_t const big = ni > 127 ? 1 : 0;
  ni -= big;
  float const scale = __builtin_bit_cast(float, static_cast<std::uint32_t>(ni + 127) << 23);
  float y = p * scale * pick(big != 0, 2.f, 1.f);  // y * 1 is y; pick: see above
  y = pick(x < lo, 0.f, y);
  return pick(x > hi, inf, y);
}

// e^x for the arguments of a softmax, x = z - max(z) <= 0: the arithmetic of exp_poly without
// its overflow handling, so about a quarter fewer vector instructions. Bit-identical to
// exp_poly for x in [-87.3365, 0] (also correct up to x = 88.37, where 2^n still fits);
// x < -87.3365 gives a subnormal or +0 (|error| < 2^-126); -inf gives 0, NaN gives NaN.
TIDE_HOST_DEVICE inline float exp_poly_nonpositive(float x) noexcept {
  constexpr float lo = -88.02969f;  // -127 ln2: n = -127 there, and 2^-127 is built as +0
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;
  constexpr float ln2_lo = -2.12194440e-4f;
  constexpr float shifter = 12582912.f;

  float const xc = x < lo ? lo : x;  // NaN flows through
  float const t = fmadd(xc, log2e, shifter);
  float const n = t - shifter;  // in [-127, 127]
  float r = fmadd(n, -ln2_hi, xc);
  r = fmadd(n, -ln2_lo, r);

  float p = 1.9875691500e-4f;
  p = fmadd(p, r, 1.3981999507e-3f);
  p = fmadd(p, r, 8.3334519073e-3f);
  p = fmadd(p, r, 4.1665795894e-2f);
  p = fmadd(p, r, 1.6666665459e-1f);
  p = fmadd(p, r, 5.0000001201e-1f);
  p = fmadd(p, r * r, r);
  p = p + 1.f;

  auto const ni =
      static_cast<std::int32_t>(__builtin_bit_cast(std::uint32_t, t) - __builtin_bit_cast(std::uint32_t, shifter));
  return p * __builtin_bit_cast(float, static_cast<std::uint32_t>(ni + 127) << 23);
}

}  // namespace tide::kernels::detail
