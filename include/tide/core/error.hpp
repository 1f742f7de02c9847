#pragma once
// tide::error: every failure tide reports, with a category and the place it was detected.
//
//   TIDE_CHECK(cond, budget, "asked ", n, " bytes, ", free, " free");   // throws if !cond
//   TIDE_REQUIRE(cond, "message");                                       // category usage
//   TIDE_ASSERT(cond);                                                   // debug-only invariant

#include <cstdint>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "tide/core/config.hpp"

namespace tide {

enum class errc : std::uint8_t {
  usage,     // the caller asked for something impossible: bad shape, impossible schedule, ...
  budget,    // a memory budget is too small for the request
  corrupt,   // a file or message failed its checks (checksum, version, truncation)
  io,        // the operating system refused a read, write, mmap or mlock
  cuda,      // the CUDA runtime or cuBLAS reported an error
  nccl,      // NCCL reported an error
  mpi,       // MPI reported an error
  internal,  // an invariant of tide itself broke: a bug in tide
};

constexpr std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::usage: return "usage";
    case errc::budget: return "budget";
    case errc::corrupt: return "corrupt";
    case errc::io: return "io";
    case errc::cuda: return "cuda";
    case errc::nccl: return "nccl";
    case errc::mpi: return "mpi";
    case errc::internal: return "internal";
  }
  return "unknown";
}

class error : public std::runtime_error {
 public:
  error(errc category, std::string const& message,
        std::source_location where = std::source_location::current())
      : std::runtime_error(format(category, message, where)),
        category_(category),
        message_(message),
        where_(where) {}

  [[nodiscard]] errc category() const noexcept { return category_; }
  // The message without what()'s "tide <category> error: " prefix.
  [[nodiscard]] std::string const& message() const noexcept { return message_; }
  [[nodiscard]] std::source_location const& where() const noexcept { return where_; }

 private:
  // what(): for the person who reads it, so no source path; where() keeps the location for
  // whoever debugs tide.
  static std::string format(errc category, std::string const& message, std::source_location) {
    std::ostringstream os;
    os << "tide " << to_string(category) << " error: " << message;
    return os.str();
  }

  errc category_;
  std::string message_;
  std::source_location where_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(errc category, std::source_location where, Parts&&... parts) {
  throw error(category, concat(std::forward<Parts>(parts)...), where);
}
}  // namespace detail

}  // namespace tide

// Throws tide::error(errc::KIND, message) when `cond` is false. The message parts are streamed.
#define TIDE_CHECK(cond, kind, ...)                                                       \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::tide::detail::fail(::tide::errc::kind, ::std::source_location::current(),         \
                           __VA_ARGS__);                                                  \
  } while (0)

#define TIDE_REQUIRE(cond, ...) TIDE_CHECK(cond, usage, __VA_ARGS__)

#define TIDE_FAIL(kind, ...) \
  ::tide::detail::fail(::tide::errc::kind, ::std::source_location::current(), __VA_ARGS__)

// Internal invariants: checked in debug builds (and when TIDE_DEBUG is defined), free in release.
#if TIDE_DEBUG_CHECKS
#  define TIDE_ASSERT(cond) TIDE_CHECK(cond, internal, "assertion failed: " #cond)
#else
#  define TIDE_ASSERT(cond) ((void)0)
#endif
