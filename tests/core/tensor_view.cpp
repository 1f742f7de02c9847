#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include <tide/core/tensor_view.hpp>

TEST_CASE("tensor_view: row-major strides, indexing, sub-views") {
  std::vector<float> buf(2 * 3 * 4);
  std::iota(buf.begin(), buf.end(), 0.f);
  tide::tensor_view<float> x{buf.data(), {2, 3, 4}};  // (B, T, C)
  CHECK(x.rank() == 3);
  CHECK(x.size() == 24);
  CHECK(x.bytes() == 96);
  CHECK(x.stride(0) == 12);
  CHECK(x.stride(2) == 1);
  CHECK(x.is_contiguous());
  CHECK(x(1, 2, 3) == 23.f);
  auto xb = x[1];  // (T, C)
  CHECK(xb.rank() == 2);
  CHECK(xb(0, 1) == 13.f);
  auto rows = x.slice(1, 2);  // (1, T, C)
  CHECK(rows.extent(0) == 1);
  CHECK(rows(0, 0, 0) == 12.f);
  auto flat = x.reshape({6, 4});
  CHECK(flat(5, 3) == 23.f);
  tide::tensor_view<float const> cx = x;
  CHECK(cx(0, 0, 1) == 1.f);
}

TEST_CASE("tensor_view: strided views are not contiguous and refuse reshape") {
  std::vector<float> buf(12);
  tide::tensor_view<float> t{buf.data(), {3, 2}, {4, 1, 1, 1}};  // every other pair of a (3, 4)
  CHECK_FALSE(t.is_contiguous());
  CHECK_THROWS_AS(t.reshape({6}), tide::error);
}

#if TIDE_DEBUG_CHECKS
TEST_CASE("tensor_view: out-of-bounds index throws a usage error in debug builds") {
  std::vector<float> buf(6);
  tide::tensor_view<float> x{buf.data(), {2, 3}};
  CHECK_THROWS_AS(x(2, 0), tide::error);
  CHECK_THROWS_AS(x(0, -1), tide::error);
  CHECK_THROWS_AS(x(0), tide::error);  // wrong number of indices
  CHECK_THROWS_AS(x[5], tide::error);
  try {
    x(0, 3);
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("extent 3") != std::string::npos);
  }
}
#endif
