// The composition matrix's rows 14 .. 26 (composition.cpp runs the first 14 and says what each
// is checked against), in a translation unit of their own: each row instantiates a trainer.

#include "composition.hpp"

TEST_CASE("composition matrix: rows 14 .. 26 train as their references say") {
  auto& world = tide::test::world();
  if (world.size() != 4) return;  // composition.cpp says why
  tide::test::matrix::run_rows<14>(std::make_index_sequence<tide::test::matrix::rows.size() - 14>{});
}
