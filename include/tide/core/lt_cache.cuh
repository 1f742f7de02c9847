#pragma once
// The cuBLASLt algorithms chosen so far, by call shape: the matmul kernels ask
// cublasLtMatmulAlgoGetHeuristic once per shape (tens of microseconds of host time, a hundred
// times a GPT-2 step) and take the answer from here after. memory::compute_context<cuda> owns one
// and hands it out in exec<cuda>::lt_algos (null: ask every time). The answer depends on the
// shape, the types, the epilogue and the workspace alone, as every call tells the heuristic the
// same 16-byte alignment (kernels/matmul/cuda.cuh), so a cached algorithm gives the same bits as
// a fresh answer would. "No algorithm" is cached too: such a shape goes to cublasGemmEx at once.
// A fixed table of 128 shapes, replaced round robin when full; a lock, as execs are copied.

#include <cublasLt.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace tide::detail {

struct lt_algo_cache {
  struct key {
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, ldaux = 0;
    std::size_t workspace = 0;
    int type = 0, compute = 0, epilogue = 0;
    bool transpose_a = false, transpose_b = false;
    bool operator==(key const&) const = default;
  };
  struct answer {
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;  // false: the heuristic had none; cublasGemmEx takes the call
  };
  static constexpr std::size_t capacity = 128;

  [[nodiscard]] std::optional<answer> find(key const& k) {
    std::lock_guard guard(m_);
    for (std::size_t i = 0; i < size_; ++i)
      if (entries_[i].k == k) return entries_[i].a;
    return std::nullopt;
  }
  void put(key const& k, answer const& a) {
    std::lock_guard guard(m_);
    for (std::size_t i = 0; i < size_; ++i)
      if (entries_[i].k == k) return;
    std::size_t const at = size_ < capacity ? size_++ : next_++ % capacity;
    entries_[at] = {k, a};
  }
  [[nodiscard]] std::size_t size() {
    std::lock_guard guard(m_);
    return size_;
  }

 private:
  struct entry {
    key k;
    answer a;
  };
  std::mutex m_;
  std::array<entry, capacity> entries_{};
  std::size_t size_ = 0, next_ = 0;
};

}  // namespace tide::detail
