#pragma once
// Element types: f32, bf16, f16. The conversions are TIDE_HOST_DEVICE bit manipulations, so
// the host backend and CUDA kernels round identically (round to nearest, ties to even).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tide/core/config.hpp"

namespace tide {

namespace detail {
TIDE_HOST_DEVICE constexpr std::uint32_t bits_of(float f) noexcept { return __builtin_bit_cast(std::uint32_t, f); }
TIDE_HOST_DEVICE constexpr float float_of(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }
}  // namespace detail

// float -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
TIDE_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  std::uint32_t u = detail::bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

TIDE_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t h) noexcept {
  return detail::float_of(static_cast<std::uint32_t>(h) << 16);
}

// float -> IEEE binary16 bits, round to nearest even, with subnormals; |f| >= 65520 gives Inf.
TIDE_HOST_DEVICE constexpr std::uint16_t float_to_f16_bits(float f) noexcept {
  std::uint32_t const x = detail::bits_of(f);
  std::uint32_t const sign = (x >> 16) & 0x8000u;
  std::uint32_t const ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (ax < 0x38800000u) {                                                    // f16 subnormal or 0
    if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);          // <= 2^-25: ties to 0
    std::uint32_t const e = ax >> 23;
    std::uint32_t const m = (ax & 0x7fffffu) | 0x800000u;
    std::uint32_t const shift = 126u - e;  // value / 2^-24 = m * 2^(e - 126)
    std::uint32_t r = m >> shift;
    std::uint32_t const rem = m & ((1u << shift) - 1u);
    std::uint32_t const half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  std::uint32_t const rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

TIDE_HOST_DEVICE constexpr float f16_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t const e = (h >> 10) & 0x1fu;
  std::uint32_t const m = h & 0x3ffu;
  if (e == 0) {
    float const v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return detail::float_of(sign | 0x7f800000u | (m << 13));
  return detail::float_of(sign | ((e + 112u) << 23) | (m << 13));
}

// Storage types: 16 bits, trivially copyable, explicit conversions through float.
struct bf16 {
  std::uint16_t bits;
  bf16() = default;
  TIDE_HOST_DEVICE constexpr explicit bf16(float f) noexcept : bits(float_to_bf16_bits(f)) {}
  TIDE_HOST_DEVICE constexpr explicit operator float() const noexcept { return bf16_bits_to_float(bits); }
  TIDE_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r;
    r.bits = b;
    return r;
  }
};

struct f16 {
  std::uint16_t bits;
  f16() = default;
  TIDE_HOST_DEVICE constexpr explicit f16(float f) noexcept : bits(float_to_f16_bits(f)) {}
  TIDE_HOST_DEVICE constexpr explicit operator float() const noexcept { return f16_bits_to_float(bits); }
  TIDE_HOST_DEVICE static constexpr f16 from_bits(std::uint16_t b) noexcept {
    f16 r;
    r.bits = b;
    return r;
  }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>);

template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// Generic code converts with these two, which are the identity for float.
template <Element T>
TIDE_HOST_DEVICE constexpr float to_float(T x) noexcept {
  return static_cast<float>(x);
}
template <Element T>
TIDE_HOST_DEVICE constexpr T from_float(float x) noexcept {
  return T(x);
}

enum class dtype : std::uint8_t { f32, bf16, f16 };

template <Element T>
inline constexpr dtype dtype_of = std::is_same_v<T, float> ? dtype::f32
                                  : std::is_same_v<T, bf16> ? dtype::bf16
                                                            : dtype::f16;

constexpr std::size_t size_of(dtype t) noexcept { return t == dtype::f32 ? 4 : 2; }

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
  }
  return "?";
}

// Unit roundoff (half an ulp at 1) per dtype: the base of the tolerances tests state.
template <Element T>
inline constexpr float unit_roundoff = std::is_same_v<T, float> ? 0x1p-24f
                                       : std::is_same_v<T, bf16> ? 0x1p-8f
                                                                 : 0x1p-11f;

}  // namespace tide
