// bench/roofline: the machine's probes, each against the anchor it is usually read against.
#include "roofline.hpp"

int main() {
  using tide::bench::figure;
  double const copy = tide::bench::copy_probe_gbs();
  double const stream = tide::bench::stream_probe_gbs();
  double const triad = tide::bench::triad_probe_gbs();
  double const fma = tide::bench::fma_probe_gflops();
  // Triad and FMA are read against fixed reference figures, not measured in this run: 33.1 GB/s
  // triad (arrays of 1 GiB) and 462 GFLOP/s of fp32 AVX-512 FMA, both on 2 threads of a quiet
  // 2-vCPU Xeon VM.
  figure{"roofline", "triad_probe_gbs", triad, "GB/s", "reference_triad_2t", 33.1}.print();
  figure{"roofline", "copy_probe_gbs", copy, "GB/s", "triad_probe", triad}.print();
  figure{"roofline", "stream_probe_gbs", stream, "GB/s", "triad_probe", triad}.print();
  figure{"roofline", "fma_probe_gflops", fma, "GFLOP/s", "reference_fma_2t", 462.0}.print();
#if defined(TIDE_HAS_BLAS)
  double const sgemm = tide::bench::sgemm_probe_gflops();
  figure{"roofline", "sgemm_probe_gflops", sgemm, "GFLOP/s", "fma_probe", fma}.print();
#endif
}
