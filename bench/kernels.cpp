// bench/kernels: the fused kernels' figures, each against its anchor measured in this run.
//   adamw_fp32_vs_stream, adamw_fp32_vs_naive      bench/kernels_adamw.hpp
//   layernorm_fwd_vs_copy, layernorm_bwd_vs_copy   bench/kernels_layernorm.hpp
//   gelu_fwd_vs_copy                               bench/kernels_gelu.hpp
//   classifier_ns_per_elem, softmax_ns_per_elem    bench/kernels_classifier.hpp
//   attention_vs_sgemm, matmul_vs_sgemm            bench/kernels_attention.hpp (needs OpenBLAS)
#include "kernels_adamw.hpp"
#include "kernels_classifier.hpp"
#include "kernels_gelu.hpp"
#include "kernels_layernorm.hpp"
#if defined(TIDE_HAS_BLAS)
#include "kernels_attention.hpp"
#endif

int main() {
  tide::bench::bench_adamw();
  tide::bench::bench_layernorm();
  tide::bench::bench_gelu();
  tide::bench::bench_classifier();
#if defined(TIDE_HAS_BLAS)
  tide::bench::bench_attention();
#endif
}
