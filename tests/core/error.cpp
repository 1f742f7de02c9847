#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <tide/core/bytes.hpp>
#include <tide/core/error.hpp>

TEST_CASE("TIDE_CHECK throws with category, message and location") {
  int const line = __LINE__ + 2;
  try {
    TIDE_CHECK(1 + 1 == 3, budget, "asked ", 42, " bytes");
    FAIL("did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(e.message() == "asked 42 bytes");
    CHECK(e.where().line() == static_cast<unsigned>(line));
    std::string const what = e.what();
    CHECK(what == "tide budget error: asked 42 bytes");  // no source path: that is where()'s
    CHECK(std::string(e.where().file_name()).find("error.cpp") != std::string::npos);
  }
  CHECK_NOTHROW(TIDE_REQUIRE(true, "never"));
}

TEST_CASE("byte literals and printing") {
  using namespace tide::literals;
  static_assert(64_MiB == 64u * 1024 * 1024);
  static_assert(2_GiB == 2ull << 30);
  static_assert(tide::round_up(1000, 256) == 1024);
  std::ostringstream os;
  os << tide::bytes_of{1536} << ", " << tide::bytes_of{12};
  CHECK(os.str() == "1.50 KiB, 12 B");
}
