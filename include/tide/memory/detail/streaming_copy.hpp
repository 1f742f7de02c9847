#pragma once
// memcpy with streaming (non-temporal) stores, for a destination this core will not read soon:
// the pieces of a large tier copy (memory/transfer_engine.hpp) and the optimizer's copies of the
// values before a step (kernels/detail/elementwise_step.hpp). A plain store first reads each
// destination line (read for ownership); a streaming store does not, so a copy moves 2 n bytes,
// not 3 n. glibc streams only above ~3/4 of the L3 share (41 MiB on the machine this was measured
// on), so smaller copies would otherwise read every destination line before writing it
// (measured: ~20 % less bandwidth on 64 MiB chunks cut in pieces).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#  define TIDE_STREAMING_COPY_AVX2 1
#else
#  define TIDE_STREAMING_COPY_AVX2 0
#endif

namespace tide::memory::detail {

#if TIDE_STREAMING_COPY_AVX2
// Without the closing fence: a caller making many small copies fences once (streaming_fence), not
// after each (a fence waits for every store in flight: measured 3x slower per 4 KiB piece).
__attribute__((target("avx2"))) inline void streaming_copy_avx2_unfenced(unsigned char* d, unsigned char const* s,
                                                                         std::size_t n) noexcept {
  std::size_t const head = std::min(n, static_cast<std::size_t>(-reinterpret_cast<std::uintptr_t>(d) & 31));
  std::memcpy(d, s, head);  // until d is 32-byte aligned, as streaming stores need
  d += head;
  s += head;
  n -= head;
  for (; n >= 128; n -= 128, d += 128, s += 128) {
    __m256i const a = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(s));
    __m256i const b = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(s + 32));
    __m256i const c = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(s + 64));
    __m256i const e = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  std::memcpy(d, s, n);
}
#endif

// Streaming stores are weakly ordered: this publishes every one this thread issued (a no-op
// where there are none).
inline void streaming_fence() noexcept {
#if TIDE_STREAMING_COPY_AVX2
  _mm_sfence();
#endif
}

// streaming_copy without its fence: call streaming_fence() before anyone may read the bytes.
inline void streaming_copy_unfenced(void* dst, void const* src, std::size_t n) noexcept {
#if TIDE_STREAMING_COPY_AVX2
  static bool const avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && n >= 4096) {
    streaming_copy_avx2_unfenced(static_cast<unsigned char*>(dst), static_cast<unsigned char const*>(src), n);
    return;
  }
#endif
  if (n != 0) std::memcpy(dst, src, n);
}

// Streams n floats from `from` (just written: in L1) to `to` (64-byte aligned), with the widest
// streaming store this build targets, unfenced. The optimizers' out-of-place step calls it a
// cache line at a time, as it computes: streaming each 4 KiB piece after computing it ran the
// AdamW step at 0.68 of in place, a vector (then a whole line, on AVX-512) at a time at 0.85 (0.92
// for the same traffic with no math: the machine's own cost of writing elsewhere; Intel Xeon,
// 2026-11-29).
inline void stream_floats_unfenced(float* to, float const* from, std::size_t n) noexcept {
  std::size_t i = 0;
#if TIDE_STREAMING_COPY_AVX2 && defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(to + i, _mm512_loadu_ps(from + i));
#endif
#if TIDE_STREAMING_COPY_AVX2 && defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(to + i, _mm256_loadu_ps(from + i));
#endif
#if TIDE_STREAMING_COPY_AVX2
  for (; i + 4 <= n; i += 4) _mm_stream_ps(to + i, _mm_loadu_ps(from + i));  // SSE: every x86-64
#endif
  if (i < n) std::memcpy(to + i, from + i, (n - i) * sizeof(float));
}

inline void streaming_copy(void* dst, void const* src, std::size_t n) noexcept {
  streaming_copy_unfenced(dst, src, n);
  streaming_fence();  // published before the copy reports done
}

}  // namespace tide::memory::detail
