// The CUDA consumer: everything tide has for nvcc, and the cast kernel run when a device exists.
#include <cstdio>

#include <tide/cuda.cuh>

int main() {
  if (!tide::has_cuda_device()) {
    std::puts("skipped: no CUDA device (built and linked against tide::cuda)");
    return 0;
  }
  float const x[3] = {1.0f, 3.14159265f, 1.0f + 0x1p-8f};
  float* dx = nullptr;
  tide::bf16* dy = nullptr;
  tide::bf16 y[3] = {};
  TIDE_CUDA_CHECK(cudaMalloc(&dx, sizeof x));
  TIDE_CUDA_CHECK(cudaMalloc(&dy, sizeof y));
  TIDE_CUDA_CHECK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
  tide::exec<tide::cuda> const ex{};
  tide::kernels::cast(ex, tide::tensor_view<float const, tide::cuda>{dx, {3}}, tide::tensor_view<tide::bf16, tide::cuda>{dy, {3}});
  TIDE_CUDA_CHECK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
  TIDE_CUDA_CHECK(cudaFree(dx));
  TIDE_CUDA_CHECK(cudaFree(dy));
  std::printf("bf16(pi) on the device: bits 0x%04x\n", static_cast<unsigned>(y[1].bits));
  return y[0].bits == 0x3f80 && y[1].bits == 0x4049 && y[2].bits == 0x3f80 ? 0 : 1;
}
