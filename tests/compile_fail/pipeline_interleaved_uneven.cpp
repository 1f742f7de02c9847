// expect: the micro-batches M must be a multiple of the stages P
// Interleaved 1F1B with m % p != 0, the shape as template arguments.
#include <tide/pipeline/schedule.hpp>

int main() {
  auto s = tide::pipeline::generate<tide::pipeline::kind::interleaved, 4, 6, 2>();
  (void)s;
}
