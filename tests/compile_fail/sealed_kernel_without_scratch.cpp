// expect: on tide::sealed takes its scratch last
// A kernel that needs scratch, called on the sealed device without it: the host kernel's
// overload that allocates its own would put the scratch where the device budget never sees it.
#include <tide/kernels/sealed.hpp>

int main() {
  tide::memory::stream<tide::sealed> compute;
  tide::thread_pool pool{1};
  tide::exec<tide::sealed> ex{pool, compute};
  tide::tensor_view<float, tide::sealed> d{};
  tide::tensor_view<float const, tide::sealed> c{};
  tide::kernels::layernorm_backward(ex, d, d, d, c, c, c, c, c);
}
