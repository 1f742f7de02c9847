// tide-offload-sim: replays a recorded access trace (tide::chunk::access_trace text form) on a
// device of N chunks under belady, lru and fifo, and prints one JSON object per policy:
//
//   tide-offload-sim bench/offload_sim/gpt_tiny.trace --capacity 5 --policy all --iterations 2
//   {"policy":"belady","capacity":5,"moments":26,"h2d":..,"d2h":..,"evictions":..,"allocations":..,"bytes_moved":..}
//
// The counts are tide::offload::simulate's; bytes_moved = (h2d + d2h) * --chunk-bytes.
// Bad flags, an unreadable or malformed file, or a capacity below the working set: a message on
// stderr and exit code 2. A malformed file (a chunk count or id it cannot hold, a token that is
// not a non-negative integer) is reported as a corrupt trace naming the line, before anything is
// allocated for it.

#include <charconv>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include <tide/chunk/access_trace.hpp>
#include <tide/core/error.hpp>
#include <tide/offload/policy.hpp>
#include <tide/offload/simulate.hpp>

namespace {

constexpr std::string_view usage =
    "usage: tide-offload-sim TRACE_FILE --capacity N [--policy belady|lru|fifo|all] [--iterations K] "
    "[--chunk-bytes BYTES]\n"
    "  TRACE_FILE     an access trace in text form: per line the touched chunk ids, 'h:' on-host ids,\n"
    "                 'r:' released ids; '#' comments (see include/tide/chunk/access_trace.hpp)\n"
    "  --capacity     chunks the device holds (at least the trace's working set)\n"
    "  --policy       eviction policy to simulate (default: all)\n"
    "  --iterations   passes over the cyclic trace (default: 2)\n"
    "  --chunk-bytes  bytes per chunk, for bytes_moved (default: 1, i.e. bytes_moved counts chunk moves)\n";

struct bad_arguments {
  std::string what;
};

std::size_t positive(std::string_view flag, std::string_view value, bool zero_ok) {
  std::size_t v = 0;
  auto const [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc{} || end != value.data() + value.size() || (!zero_ok && v == 0))
    throw bad_arguments{tide::detail::concat(flag, " needs a ", zero_ok ? "non-negative" : "positive",
                                             " integer, got '", value, "'")};
  return v;
}

template <class Policy>
void run(tide::chunk::access_trace const& trace, std::size_t capacity, std::size_t iterations,
         std::size_t chunk_bytes) {
  auto const r = tide::offload::simulate(trace, capacity, Policy{}, iterations);
  std::cout << R"({"policy":")" << Policy::name << R"(","capacity":)" << capacity << R"(,"moments":)" << r.moments
            << R"(,"h2d":)" << r.h2d << R"(,"d2h":)" << r.d2h << R"(,"evictions":)" << r.evictions
            << R"(,"allocations":)" << r.allocations << R"(,"bytes_moved":)" << r.moves() * chunk_bytes << "}\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, policy = "all";
  std::size_t capacity = 0, iterations = 2, chunk_bytes = 1;
  bool capacity_given = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string_view const arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        std::cout << usage;
        return 0;
      }
      if (arg.starts_with("--")) {
        if (i + 1 >= argc) throw bad_arguments{tide::detail::concat(arg, " needs a value")};
        std::string_view const value = argv[++i];
        if (arg == "--capacity") {
          capacity = positive(arg, value, true);
          capacity_given = true;
        } else if (arg == "--iterations") {
          iterations = positive(arg, value, false);
        } else if (arg == "--chunk-bytes") {
          chunk_bytes = positive(arg, value, false);
        } else if (arg == "--policy") {
          if (value != "belady" && value != "lru" && value != "fifo" && value != "all")
            throw bad_arguments{tide::detail::concat("--policy is one of belady, lru, fifo, all; got '", value, "'")};
          policy = value;
        } else {
          throw bad_arguments{tide::detail::concat("unknown flag '", arg, "'")};
        }
      } else if (path.empty()) {
        path = arg;
      } else {
        throw bad_arguments{tide::detail::concat("one TRACE_FILE only; got '", path, "' and '", arg, "'")};
      }
    }
    if (path.empty()) throw bad_arguments{"pass the TRACE_FILE to simulate"};
    if (!capacity_given) throw bad_arguments{"pass --capacity N, the chunks the device holds"};

    std::ifstream in(path, std::ios::binary);
    if (!in) throw bad_arguments{tide::detail::concat("cannot read '", path, "'")};
    std::ostringstream text;
    text << in.rdbuf();
    auto const trace = tide::chunk::access_trace::parse(text.str());

    if (policy == "belady" || policy == "all") run<tide::offload::belady>(trace, capacity, iterations, chunk_bytes);
    if (policy == "lru" || policy == "all") run<tide::offload::lru>(trace, capacity, iterations, chunk_bytes);
    if (policy == "fifo" || policy == "all") run<tide::offload::fifo>(trace, capacity, iterations, chunk_bytes);
  } catch (bad_arguments const& e) {
    std::cerr << "tide-offload-sim: " << e.what << "\n" << usage;
    return 2;
  } catch (tide::error const& e) {
    // A malformed trace (tide::error(corrupt), naming the line and the value) or a capacity
    // below the working set.
    std::cerr << "tide-offload-sim: " << path << ": " << (e.category() == tide::errc::corrupt ? "corrupt trace: " : "")
              << e.message() << '\n';
    return 2;
  }
  return 0;
}
