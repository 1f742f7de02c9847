// The header check's precompiled header: the standard library and the x86 intrinsics, parsed
// once instead of in each of the check's units. headers/std_includes checks on the text that a
// header includes what it uses of these. Nothing else: a tide header, a POSIX, MPI or CBLAS
// header missing from a header's includes still fails its compile. A standard header missing
// here costs only time.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <numbers>
#include <numeric>
#include <optional>
#include <ostream>
#include <queue>
#include <random>
#include <ranges>
#include <source_location>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#endif
#if __has_include(<experimental/simd>)
#  include <experimental/simd>
#endif
