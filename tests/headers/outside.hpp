// The header check's precompiled header: the outside headers tide's headers include (the
// standard library, the intrinsics, MPI and CBLAS where tide uses them), parsed once instead of
// in each of the check's units. Nothing of tide's: each tide header still has to include the
// tide headers it needs. A standard header missing here costs only time.
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

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#endif
#if __has_include(<experimental/simd>)
#  include <experimental/simd>
#endif
#if defined(TIDE_HAS_MPI)  // as tide/comm/mpi.hpp includes it: the C API only
#  ifndef OMPI_SKIP_MPICXX
#    define OMPI_SKIP_MPICXX 1
#  endif
#  ifndef MPICH_SKIP_MPICXX
#    define MPICH_SKIP_MPICXX 1
#  endif
#  include <mpi.h>
#endif
#if defined(TIDE_HAS_BLAS)
#  include <cblas.h>
#endif
