#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of tide's checkpoints.
//
//   std::uint32_t c = tide::train::crc32c(bytes);          // crc32c("123456789") == 0xE3069283
//   c = tide::train::crc32c(more, c);                      // == crc32c(bytes + more)
//
// The `crc` argument is a previous result, so a long stream is checksummed piece by piece.
// On x86-64 with SSE4.2 the crc32 instruction does the work (checked at run time); elsewhere a
// slice-by-8 table walk does. Both give the same bits; the tests compare them.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  define TIDE_CRC32C_SSE42 1
#  include <nmmintrin.h>
#else
#  define TIDE_CRC32C_SSE42 0
#endif

namespace tide::train {

namespace detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;

// table[0] is the byte-at-a-time table; table[k][b] is the CRC of byte b followed by k zero bytes,
// which lets slice-by-8 fold eight bytes per step.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ crc32c_polynomial : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

inline constexpr auto crc32c_tables = make_crc32c_tables();

inline std::uint64_t load_le64(std::byte const* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// The portable path: slice-by-8.
inline std::uint32_t crc32c_software(std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
  auto const& t = crc32c_tables;
  std::uint32_t c = ~crc;
  std::byte const* p = data.data();
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t const w = load_le64(p) ^ c;
    c = t[7][w & 0xFFu] ^ t[6][(w >> 8) & 0xFFu] ^ t[5][(w >> 16) & 0xFFu] ^ t[4][(w >> 24) & 0xFFu] ^
        t[3][(w >> 32) & 0xFFu] ^ t[2][(w >> 40) & 0xFFu] ^ t[1][(w >> 48) & 0xFFu] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ std::to_integer<std::uint32_t>(*p)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

#if TIDE_CRC32C_SSE42
inline bool crc32c_hardware_available() noexcept {
  // Also right when called before main (a static initializer): cpu_init is idempotent.
  static bool const has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}

// The crc32 instruction: call only when crc32c_hardware_available().
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hardware(std::span<std::byte const> data,
                                                                       std::uint32_t crc = 0) noexcept {
  std::byte const* p = data.data();
  std::size_t n = data.size();
#  if defined(__x86_64__)
  std::uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);
    c = _mm_crc32_u64(c, v);
  }
  auto c32 = static_cast<std::uint32_t>(c);
#  else
  std::uint32_t c32 = ~crc;
  for (; n >= 4; n -= 4, p += 4) {
    std::uint32_t v;
    std::memcpy(&v, p, sizeof v);
    c32 = _mm_crc32_u32(c32, v);
  }
#  endif
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, std::to_integer<unsigned char>(*p));
  return ~c32;
}
#else
inline bool crc32c_hardware_available() noexcept { return false; }
inline std::uint32_t crc32c_hardware(std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
  return crc32c_software(data, crc);
}
#endif

}  // namespace detail

// CRC-32C of `data`, continuing from `crc` (the result for the bytes before `data`; 0 to start).
inline std::uint32_t crc32c(std::span<std::byte const> data, std::uint32_t crc = 0) noexcept {
  if (detail::crc32c_hardware_available()) return detail::crc32c_hardware(data, crc);
  return detail::crc32c_software(data, crc);
}

}  // namespace tide::train
