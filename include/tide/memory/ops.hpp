#pragma once
// The operations code above the kernels may apply to a backend's memory, as functions of the
// exec<B> they run on. An engine written against these (and the transfer engine for copies
// between tiers, kernels::cast, an optimizer's update) never reads device memory on the host,
// so it runs on every backend: tide::host, tide::sealed (which faults where it would), and a
// GPU that supplies the same functions.
//
//   tide::memory::fill_zeros(ex, grad_chunk, bytes);       // in compute order
//   tide::memory::event<B> done;
//   tide::memory::record(ex, done);                        // marks the compute work so far
//   copy_stream.wait(done);                                // a copy that reads it waits for it
//   tide::memory::read_to_host(ex, staging, chunk, bytes); // a checkpoint's read: waits, then copies
//
// The compute timeline of exec<host> is the calling thread: kernels have finished when they
// return, so record() marks a point already passed, wait() blocks the caller, and the copies run
// at once. Of exec<sealed> it is ex.stream: record() and wait() are stream operations, fills and
// copies are enqueued, and read_to_host() waits for the stream (a synchronous cudaMemcpy).
// A stream's failure (a kernel that threw) is rethrown by read_to_host and synchronize.

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/stream.hpp"

namespace tide::memory {

// ---- tide::host: the caller's timeline

// bytes of p set to 0, in compute order.
inline void fill_zeros(exec<host> const&, void* p, std::size_t bytes) {
  if (bytes != 0) std::memset(p, 0, bytes);
}

// memcpy(dst, src, bytes) in compute order (a copy inside one tier, or between a device block
// and a host staging block that the compute timeline owns).
inline void copy_in_order(exec<host> const&, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

// e marks the compute work enqueued so far.
inline void record(exec<host> const&, event<host>& e) { e.record_passed(); }

// Compute work issued after this runs after e.
inline void wait(exec<host> const&, event<host> const& e) { e.synchronize(); }

// The compute work so far has finished (and its failure, if any, is thrown).
inline void synchronize(exec<host> const&) {}

// bytes at src (device memory of this backend) into host memory at dst, after the compute work
// so far; returns when dst holds them.
inline void read_to_host(exec<host> const&, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

// bytes from host memory at src to src's device copy at dst, in compute order. src may be
// reused once the call returns (the copy is made first, as a pageable cudaMemcpyAsync does).
inline void write_from_host(exec<host> const&, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

// bytes from host memory at src to this backend's memory at dst, now, on the calling thread
// (cudaMemcpy): for what is written before any stream uses dst, such as a model's initial
// parameters.
inline void copy_to_device(host, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

// ---- tide::sealed: the compute stream

inline void fill_zeros(exec<sealed> const& ex, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  ex.stream.launch_owned([a = unseal(p), bytes] { std::memset(a, 0, bytes); });
}

inline void copy_in_order(exec<sealed> const& ex, void* dst, void const* src, std::size_t bytes) {
  if (bytes != 0) ex.stream.copy(dst, src, bytes);
}

inline void record(exec<sealed> const& ex, event<sealed>& e) { e.record(ex.stream); }

inline void wait(exec<sealed> const& ex, event<sealed> const& e) { ex.stream.wait(e); }

inline void synchronize(exec<sealed> const& ex) { ex.stream.synchronize(); }

inline void copy_to_device(sealed, void* dst, void const* src, std::size_t bytes) {
  TIDE_REQUIRE(!is_sealed(src), "copy_to_device: the source is device memory; pass a host block");
  if (bytes != 0) std::memcpy(unseal(dst), src, bytes);
}

inline void read_to_host(exec<sealed> const& ex, void* dst, void const* src, std::size_t bytes) {
  TIDE_REQUIRE(!is_sealed(dst), "read_to_host: the destination is device memory; pass a host block");
  if (bytes != 0) ex.stream.copy(dst, src, bytes);
  ex.stream.synchronize();
}

inline void write_from_host(exec<sealed> const& ex, void* dst, void const* src, std::size_t bytes) {
  TIDE_REQUIRE(!is_sealed(src), "write_from_host: the source is device memory; pass a host block");
  if (bytes == 0) return;
  // The stream keeps its own copy of the bytes, so the caller's block is free at once.
  auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<unsigned char const*>(src),
                                                             static_cast<unsigned char const*>(src) + bytes);
  ex.stream.launch_owned([a = unseal(dst), staged] { std::memcpy(a, staged->data(), staged->size()); });
}

// What a device backend's exec<B> is made from, owned together: the compute stream (tide::sealed),
// and on tide::cuda a cuBLAS handle on that stream too (memory/ops.cuh). make_trainer keeps one.
template <Backend B>
struct compute_context {
  stream<B> s{};
  [[nodiscard]] exec<B> exec_with(thread_pool& pool) { return {pool, s}; }
  void synchronize() { s.synchronize(); }
};

// An event for streams on s's device. tide::cuda makes it with that device current (ops.cuh), as
// cudaEventRecord on s requires when the calling thread's current device is another trainer's;
// host and sealed events belong to no device.
template <Backend B>
  requires(!std::is_same_v<B, cuda>)
event<B> event_like(stream<B> const&) {
  return event<B>{};
}

#if defined(__CUDACC__)
}  // namespace tide::memory
#include "tide/memory/ops.cuh"  // tide::cuda's, declared before the concept and the engine's calls
namespace tide::memory {
#endif

// The backends that supply every operation above: the offload engine runs on these.
template <class B>
concept MemoryOps = Backend<B> && requires(exec<B> const& ex, event<B>& e, void* p, void const* q) {
  fill_zeros(ex, p, std::size_t{0});
  copy_in_order(ex, p, q, std::size_t{0});
  record(ex, e);
  wait(ex, e);
  synchronize(ex);
  read_to_host(ex, p, q, std::size_t{0});
  write_from_host(ex, p, q, std::size_t{0});
  copy_to_device(B{}, p, q, std::size_t{0});
};
static_assert(MemoryOps<host> && MemoryOps<sealed>);
#if defined(__CUDACC__)
static_assert(MemoryOps<cuda>);
#endif

}  // namespace tide::memory
