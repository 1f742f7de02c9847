// The spill check's own test: this kernel must spill (96 live floats, and __launch_bounds__
// asking for 2048 resident threads per SM caps it at 32 registers), so ctest's
// cuda/spill_check_sees_spills proves the ptxas -v parsing still finds spills.

__global__ void __launch_bounds__(1024, 2) spill_canary(float const* x, float* y, int n) {
  float acc[96];
#pragma unroll
  for (int k = 0; k < 96; ++k) acc[k] = x[k * n + static_cast<int>(threadIdx.x)];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int k = 0; k < 96; ++k) acc[k] = acc[k] * acc[(k + 1) % 96] + acc[(k + 7) % 96];
#pragma unroll
  for (int k = 0; k < 96; ++k) y[k * n + static_cast<int>(threadIdx.x)] = acc[k];
}

int main() { return 0; }
