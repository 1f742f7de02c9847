// The program every consumer project builds: tide's host headers only (dtype, tensor_view, the
// cast kernel), compiled with the consumer's strict warnings. Prints one line, checks the bits.
#include <cstdio>

#include <tide/core/config.hpp>
#include <tide/core/dtype.hpp>
#include <tide/core/exec.hpp>
#include <tide/core/tensor_view.hpp>
#include <tide/kernels/cast/cast.hpp>

int main() {
  float const x[6] = {1.0f, 0.5f, -2.0f, 3.14159265f, 65504.0f, 1.0f + 0x1p-8f};  // (2, 3)
  tide::bf16 y[6] = {};
  tide::thread_pool pool{1};
  tide::exec<tide::host> const ex{pool};
  tide::kernels::cast(ex, tide::tensor_view<float const>{x, {2, 3}}, tide::tensor_view<tide::bf16>{y, {2, 3}});
  tide::tensor_view<tide::bf16 const> const v{y, {2, 3}};
  std::printf("tide %d.%d.%d: bf16(pi) = %.7g (bits 0x%04x)\n", TIDE_VERSION_MAJOR, TIDE_VERSION_MINOR,
              TIDE_VERSION_PATCH, static_cast<double>(static_cast<float>(v(1, 0))), static_cast<unsigned>(v(1, 0).bits));
  // pi rounds down to 3.140625; 1 + 2^-8 is a tie that goes to the even 1.0.
  bool const ok = v(1, 0).bits == 0x4049 && v(1, 2).bits == 0x3f80 && static_cast<float>(v(0, 2)) == -2.0f;
  if (!ok) std::puts("mismatch: tide's conversions gave unexpected bits");
  return ok ? 0 : 1;
}
