// expect: Policy must satisfy tide::offload::EvictionPolicy
// chunked<Policy> with a type that is not an eviction policy.
#include <tide/offload/schedulers.hpp>

struct not_a_policy {};
int main() {
  tide::offload::chunked<not_a_policy> c{};
  (void)c;
}
