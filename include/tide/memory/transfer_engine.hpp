#pragma once
// transfer_engine<B>: copies between memory tiers (device arena <-> pinned host) on a copy
// stream, bounded, counted and timed.
//
//   tide::memory::device_streams<tide::host> s;
//   tide::memory::transfer_engine<tide::host> engine{s.copy, {.max_in_flight = 4}};
//   tide::memory::event<tide::host> fetched;
//   engine.copy_async(dev, pinned, 64_MiB, copy_direction::host_to_device, fetched);
//   s.compute.wait(fetched);              // compute that needs the chunk runs after the copy
//   auto st = engine.stats();             // bytes per direction, copies in flight, copy time
//
// - copy_async enqueues the copy on the copy stream and returns; with an event, it also records
//   the event right after the copy so the compute stream (wait) or the host (synchronize) can
//   order against that copy alone.
// - At most max_in_flight copies are outstanding: the next copy_async blocks until the oldest
//   finished (back-pressure, so a producer cannot run arbitrarily far ahead of the copies).
// - Bytes are counted per direction when issued; the time of each copy is read from two events
//   around it, stamped where the copy ran (the copy worker; on CUDA the GPU), and added to
//   copy_ms once the copy is known finished (stats(), synchronize(), or back-pressure).
// - tide::host: the copy really runs on the copy stream's worker thread, so it overlaps compute.
//   One memcpy thread does not reach the machine's copy bandwidth (about 0.55 of the two-thread
//   copy_probe on 64 MiB chunks, measured by bench/copy_engine.cpp), so a copy of at least
//   split_bytes is shared, piece by piece, between that worker and one helper thread the engine
//   owns (copy_lane), inside the same stream command: it stays one in-order copy. When the
//   helper gets no core the worker takes every piece. split_bytes = 0: no helper thread.
// - Failures of the copy stream surface from synchronize() and copy_async (sticky, as on the
//   stream). An engine is driven by one thread at a time, never by its copy stream's worker.
//   Destruction waits for the engine's copies. The copy stream must outlive the engine.
//
// tide::sealed: the same copies, through the aliases of sealed addresses.
// tide::cuda: include <tide/memory/transfer_engine.cuh>; copies are cudaMemcpyAsync.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/detail/streaming_copy.hpp"
#include "tide/memory/stream.hpp"


namespace tide::memory {

enum class copy_direction : std::uint8_t { host_to_device, device_to_host };

// One copy of a batch issued together (a block's offloaded activations): memcpy(dst, src, bytes).
struct copy_request {
  void* dst = nullptr;
  void const* src = nullptr;
  std::size_t bytes = 0;
};

struct transfer_options {
  std::size_t max_in_flight = 4;          // copies outstanding before copy_async blocks (>= 1)
  std::size_t split_bytes = 4_MiB;        // host: copies this large use the helper lane; 0: never
};

struct transfer_stats {
  std::size_t host_to_device_bytes = 0;  // issued
  std::size_t device_to_host_bytes = 0;  // issued
  std::size_t copies = 0;                // issued
  std::size_t completed = 0;             // known finished and timed
  std::size_t in_flight = 0;             // issued and not known finished (<= max_in_flight)
  std::size_t peak_in_flight = 0;
  double copy_ms = 0;                    // sum of the completed copies' times
};

// A helper thread that shares large copies with the thread that asks for them. The copy is cut
// into pieces both threads take from a shared cursor, so when the helper gets no core (the
// machine is busy) the caller simply takes every piece, and a helper that never started is
// called off instead of waited for: the copy is never slower than one thread by more than the
// hand-off. Pieces use streaming stores (detail::streaming_copy).
class copy_lane {
 public:
  static constexpr std::size_t piece_bytes = std::size_t{1} << 20;

  copy_lane() : thread_([this] { serve(); }) {}
  copy_lane(copy_lane const&) = delete;
  copy_lane& operator=(copy_lane const&) = delete;
  ~copy_lane() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // memcpy(dst, src, bytes), shared with the lane's thread; returns when every piece is done.
  // One caller at a time (others wait their turn).
  void copy(void* dst, void const* src, std::size_t bytes) {
    auto* d = static_cast<unsigned char*>(dst);
    auto const* s = static_cast<unsigned char const*>(src);
    if (bytes <= piece_bytes) {
      detail::streaming_copy(d, s, bytes);
      return;
    }
    std::lock_guard turn(turn_);
    {
      std::lock_guard lock(mutex_);
      dst_ = d;
      src_ = s;
      bytes_ = bytes;
      next_.store(0, std::memory_order_relaxed);
      posted_ = true;
    }
    cv_.notify_all();
    take_pieces();
    std::unique_lock lock(mutex_);
    if (posted_) {
      posted_ = false;  // the lane never started: nothing of it to wait for
    } else {
      cv_.wait(lock, [this] { return !working_; });
    }
  }

  [[nodiscard]] std::thread::id thread_id() const noexcept { return thread_.get_id(); }

 private:
  // The job's fields are written only while neither thread is inside this loop.
  void take_pieces() noexcept {
    for (;;) {
      std::size_t const at = next_.fetch_add(piece_bytes, std::memory_order_relaxed);
      if (at >= bytes_) return;
      detail::streaming_copy(dst_ + at, src_ + at, std::min(piece_bytes, bytes_ - at));
    }
  }

  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return posted_ || stop_; });
      if (!posted_) return;
      posted_ = false;
      working_ = true;
      lock.unlock();
      take_pieces();
      lock.lock();
      working_ = false;
      cv_.notify_all();
    }
  }

  std::mutex turn_;
  std::mutex mutex_;
  std::condition_variable cv_;
  unsigned char* dst_ = nullptr;
  unsigned char const* src_ = nullptr;
  std::size_t bytes_ = 0;
  std::atomic<std::size_t> next_{0};  // the next piece's offset
  bool posted_ = false;               // a job waits for the lane
  bool working_ = false;              // the lane is taking pieces
  bool stop_ = false;
  std::thread thread_;  // last: starts once the fields above exist
};

namespace detail {

// How a backend puts one copy on a stream; slot indexes per-copy storage that stays untouched
// until the copy's end event passed. Specialised per backend (cuda: transfer_engine.cuh).
template <Backend B>
class copy_path;

template <>
class copy_path<host> {
 public:
  copy_path(transfer_options const& opts, std::size_t slots) : jobs_(slots) {
    if (opts.split_bytes != 0) lane_ = std::make_unique<copy_lane>();
    for (auto& j : jobs_) {
      j.lane = lane_.get();
      j.split_bytes = opts.split_bytes;
    }
  }

  void check_caller(stream<host> const& s) const {
    TIDE_REQUIRE(std::this_thread::get_id() != s.worker_id(),
                 "transfer_engine used from its own copy stream's worker: it would wait for itself; "
                 "call copy_async from another thread (the caller of the stream, not its worker)");
  }

  void issue(stream<host>& s, std::size_t slot, void* dst, void const* src, std::size_t bytes) {
    issue_on(s, slot, dst, src, bytes);
  }

  // The copy as a host function on any worker stream (tide::sealed passes the aliases).
  template <class S>
  void issue_on(S& s, std::size_t slot, void* dst, void const* src, std::size_t bytes) {
    job& j = jobs_[slot];
    j.dst = dst;
    j.src = src;
    j.bytes = bytes;
    s.launch(&run, &j);
  }

 private:
  struct job {
    copy_lane* lane = nullptr;
    std::size_t split_bytes = 0;
    void* dst = nullptr;
    void const* src = nullptr;
    std::size_t bytes = 0;
  };

  static void run(void* p) {
    job const& j = *static_cast<job const*>(p);
    if (j.bytes == 0) return;
    if (j.lane != nullptr && j.bytes >= j.split_bytes) {
      j.lane->copy(j.dst, j.src, j.bytes);
    } else {
      std::memcpy(j.dst, j.src, j.bytes);
    }
  }

  std::unique_ptr<copy_lane> lane_;
  std::vector<job> jobs_;
};

// tide::sealed: the host's path over the aliases of sealed addresses (core/sealed.hpp).
template <>
class copy_path<sealed> {
 public:
  copy_path(transfer_options const& opts, std::size_t slots) : path_(opts, slots) {}

  void check_caller(stream<sealed> const& s) const {
    TIDE_REQUIRE(std::this_thread::get_id() != s.worker_id(),
                 "transfer_engine used from its own copy stream's worker: it would wait for itself; "
                 "call copy_async from another thread (the caller of the stream, not its worker)");
  }

  void issue(stream<sealed>& s, std::size_t slot, void* dst, void const* src, std::size_t bytes) {
    path_.issue_on(s, slot, unseal(dst), unseal(src), bytes);
  }

 private:
  copy_path<host> path_;
};

}  // namespace detail

template <Backend B>
class transfer_engine {
 public:
  using backend = B;
  using stream_type = stream<B>;
  using event_type = event<B>;
  using options = transfer_options;

  explicit transfer_engine(stream<B>& copy_stream, options const& opts = {})
      : stream_(&copy_stream), opts_(checked(opts)), slots_(opts.max_in_flight), path_(opts, opts.max_in_flight) {}
  transfer_engine(transfer_engine const&) = delete;
  transfer_engine& operator=(transfer_engine const&) = delete;
  ~transfer_engine() {
    for (auto& s : slots_) {
      try {
        s.end.synchronize();  // waits even when it then reports a failure
      } catch (...) {
      }
    }
  }

  // Enqueues memcpy(dst, src, bytes) on the copy stream; blocks while max_in_flight copies are
  // outstanding. `direction` says which counter the bytes go to.
  void copy_async(void* dst, void const* src, std::size_t bytes, copy_direction direction) {
    issue(dst, src, bytes, direction, nullptr);
  }

  // The same, then records `done` after the copy: wait on it from a stream or the host.
  void copy_async(void* dst, void const* src, std::size_t bytes, copy_direction direction, event<B>& done) {
    issue(dst, src, bytes, direction, &done);
  }

  // A batch issued together (a block's offloaded activations), in order; `done` is recorded
  // after the last copy.
  void copy_async(std::span<copy_request const> batch, copy_direction direction, event<B>& done) {
    if (batch.empty()) {
      done.record(*stream_);
      return;
    }
    for (std::size_t i = 0; i + 1 < batch.size(); ++i) issue(batch[i].dst, batch[i].src, batch[i].bytes, direction, nullptr);
    issue(batch.back().dst, batch.back().src, batch.back().bytes, direction, &done);
  }

  // Blocks until every copy issued so far finished; rethrows a failure of the copy stream.
  void synchronize() {
    while (in_flight_ > 0) retire(oldest(), true);
  }
  // The same without reporting (a pass that already throws, or is about to): the failure stays
  // with the stream, and the next synchronize() reports it.
  void drain() noexcept {
    try {
      synchronize();
    } catch (...) {
    }
  }

  // The counters, after accounting every copy already finished. Never blocks.
  [[nodiscard]] transfer_stats stats() {
    while (in_flight_ > 0 && oldest().end.query()) retire(oldest(), false);
    transfer_stats s = stats_;
    s.in_flight = in_flight_;
    return s;
  }

  [[nodiscard]] stream<B>& copy_stream() noexcept { return *stream_; }
  [[nodiscard]] options const& opts() const noexcept { return opts_; }

  // Fault injection: the n-th copy_async from now throws tide::error(io) before anything is
  // enqueued, as a refused cudaMemcpyAsync would (n = 0: none). For tests that check a caller
  // loses nothing when a copy cannot be issued.
  void fail_copy(std::size_t n) noexcept { fail_at_ = n; }

 private:
  struct slot {
    event<B> start;
    event<B> end;
  };

  static options const& checked(options const& opts) {
    TIDE_REQUIRE(opts.max_in_flight >= 1, "transfer_engine asked for max_in_flight = 0: no copy could "
                 "ever be issued; give at least 1");
    return opts;
  }

  slot& oldest() { return slots_[(next_ - in_flight_) % slots_.size()]; }

  // Accounts the oldest outstanding copy; `wait` blocks for it and reports a stream failure.
  void retire(slot& s, bool wait) {
    if (wait) s.end.synchronize();
    stats_.copy_ms += elapsed_ms(s.start, s.end);
    ++stats_.completed;
    --in_flight_;
  }

  void issue(void* dst, void const* src, std::size_t bytes, copy_direction direction, event<B>* done) {
    TIDE_REQUIRE(bytes == 0 || (dst != nullptr && src != nullptr), "copy_async of ", bytes, " bytes with a null ",
                 dst == nullptr ? "destination" : "source", "; pass valid buffers");
    TIDE_REQUIRE(direction == copy_direction::host_to_device || direction == copy_direction::device_to_host,
                 "copy_async with copy_direction ", static_cast<int>(direction),
                 "; use host_to_device or device_to_host");
    path_.check_caller(*stream_);
    if (fail_at_ != 0 && --fail_at_ == 0)
      TIDE_FAIL(io, "transfer_engine: copy of ", bytes, " bytes refused: the failure injected by fail_copy()");
    if (in_flight_ == slots_.size()) retire(oldest(), true);  // back-pressure
    std::size_t const i = next_ % slots_.size();
    slot& s = slots_[i];
    s.start.record(*stream_);
    path_.issue(*stream_, i, dst, src, bytes);
    s.end.record(*stream_);
    if (done != nullptr) done->record(*stream_);
    ++next_;
    ++in_flight_;
    ++stats_.copies;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
    (direction == copy_direction::host_to_device ? stats_.host_to_device_bytes : stats_.device_to_host_bytes) +=
        bytes;
  }

  stream<B>* stream_;
  options opts_;
  std::vector<slot> slots_;  // a ring: copy k uses slot k % max_in_flight
  detail::copy_path<B> path_;
  std::size_t next_ = 0;     // copies issued
  std::size_t in_flight_ = 0;
  std::size_t fail_at_ = 0;  // fault injection: copy_async calls until the injected failure
  transfer_stats stats_{};
};

}  // namespace tide::memory
