#pragma once
// Byte sizes: 64_MiB, 2_GiB, and a printer that picks a readable unit.

#include <cstddef>
#include <cstdint>
#include <ostream>

namespace tide {

inline namespace literals {
constexpr std::size_t operator""_B(unsigned long long n) { return static_cast<std::size_t>(n); }
constexpr std::size_t operator""_KiB(unsigned long long n) { return static_cast<std::size_t>(n) << 10; }
constexpr std::size_t operator""_MiB(unsigned long long n) { return static_cast<std::size_t>(n) << 20; }
constexpr std::size_t operator""_GiB(unsigned long long n) { return static_cast<std::size_t>(n) << 30; }
}  // namespace literals

constexpr std::size_t round_up(std::size_t n, std::size_t multiple) {
  return multiple == 0 ? n : (n + multiple - 1) / multiple * multiple;
}

constexpr bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

// `os << bytes_of{n}` prints "1.50 MiB", "512 B".
struct bytes_of {
  std::size_t n;
};

inline std::ostream& operator<<(std::ostream& os, bytes_of b) {
  constexpr char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (b.n < 1024) return os << b.n << " B";
  double v = static_cast<double>(b.n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  auto const flags = os.flags();
  auto const prec = os.precision();
  os.setf(std::ios::fixed, std::ios::floatfield);
  os.precision(2);
  os << v << ' ' << units[u];
  os.flags(flags);
  os.precision(prec);
  return os;
}

}  // namespace tide
