// expect: DualPipeV needs M >= 2P micro-batches
// DualPipeV with fewer than 2p micro-batches, the shape as template arguments.
#include <tide/pipeline/schedule.hpp>

int main() {
  auto s = tide::pipeline::generate<tide::pipeline::kind::dualpipe_v, 4, 7>();
  (void)s;
}
