#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <tide/train/crc32c.hpp>

namespace tt = tide::train;

namespace {
std::span<std::byte const> bytes_of(std::string_view s) { return std::as_bytes(std::span{s.data(), s.size()}); }

std::vector<std::byte> filled(std::size_t n, auto&& byte_at) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(byte_at(i));
  return v;
}
}  // namespace

TEST_CASE("crc32c: the check value and the RFC 3720 (iSCSI) vectors, on every path") {
  auto const zeros = filled(32, [](std::size_t) { return 0x00; });
  auto const ones = filled(32, [](std::size_t) { return 0xFF; });
  auto const up = filled(32, [](std::size_t i) { return i; });
  auto const down = filled(32, [](std::size_t i) { return 31 - i; });
  for (auto* f : {+[](std::span<std::byte const> d, std::uint32_t c) { return tt::crc32c(d, c); },
                  +[](std::span<std::byte const> d, std::uint32_t c) { return tt::detail::crc32c_software(d, c); }}) {
    CHECK(f(bytes_of("123456789"), 0) == 0xE3069283u);
    CHECK(f(zeros, 0) == 0x8A9136AAu);
    CHECK(f(ones, 0) == 0x62A8AB43u);
    CHECK(f(up, 0) == 0x46DD794Eu);
    CHECK(f(down, 0) == 0x113FDB5Cu);
    CHECK(f({}, 0) == 0u);
    CHECK(f(bytes_of("a"), 0) == 0xC1D04330u);
  }
  if (tt::detail::crc32c_hardware_available()) {
    CHECK(tt::detail::crc32c_hardware(bytes_of("123456789")) == 0xE3069283u);
    CHECK(tt::detail::crc32c_hardware(up) == 0x46DD794Eu);
  } else {
    MESSAGE("no SSE4.2 crc32 instruction here: only the software path was checked");
  }
}

TEST_CASE("crc32c: incremental equals whole, at every split point") {
  auto const data = filled(301, [](std::size_t i) { return (i * 131 + 7) ^ (i >> 3); });
  std::span<std::byte const> const all{data};
  auto const whole = tt::crc32c(all);
  for (std::size_t cut = 0; cut <= all.size(); ++cut) {
    REQUIRE(tt::crc32c(all.subspan(cut), tt::crc32c(all.first(cut))) == whole);
    REQUIRE(tt::detail::crc32c_software(all.subspan(cut), tt::detail::crc32c_software(all.first(cut))) == whole);
  }
  // Three pieces, one of them empty.
  auto c = tt::crc32c(all.first(100));
  c = tt::crc32c(all.subspan(100, 0), c);
  c = tt::crc32c(all.subspan(100), c);
  CHECK(c == whole);
}

TEST_CASE("crc32c: hardware and software agree on every length and alignment") {
  if (!tt::detail::crc32c_hardware_available()) {
    MESSAGE("no SSE4.2 crc32 instruction here: nothing to compare");
    return;
  }
  auto const data = filled(4096 + 64, [](std::size_t i) { return (i * 2654435761u) >> 13; });
  std::span<std::byte const> const all{data};
  for (std::size_t start = 0; start < 8; ++start)
    for (std::size_t n = 0; n < 200; ++n) {
      auto const piece = all.subspan(start, n);
      REQUIRE(tt::detail::crc32c_hardware(piece, 0x12345678u) == tt::detail::crc32c_software(piece, 0x12345678u));
    }
  CHECK(tt::detail::crc32c_hardware(all) == tt::detail::crc32c_software(all));
}

TEST_CASE("crc32c: one flipped bit anywhere changes the checksum") {
  auto data = filled(256, [](std::size_t i) { return i * 7; });
  auto const clean = tt::crc32c(data);
  for (std::size_t i = 0; i < data.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= static_cast<std::byte>(1 << bit);
      REQUIRE(tt::crc32c(data) != clean);
      data[i] ^= static_cast<std::byte>(1 << bit);
    }
  CHECK(tt::crc32c(data) == clean);
}
