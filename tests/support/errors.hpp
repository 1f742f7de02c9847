#pragma once
// The category of the tide::error that f() throws; the test fails if it throws none.

#include <doctest/doctest.h>

#include <tide/core/error.hpp>

namespace tide::test {

template <class F>
tide::errc category_of(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e.category();
  }
  FAIL("no tide::error thrown");
  return tide::errc::internal;
}

}  // namespace tide::test
