#pragma once
// stream<B> and event<B>: in-order queues of work and markers in them, with CUDA's semantics.
//
//   tide::memory::device_streams<tide::host> s;           // {compute, copy}
//   tide::memory::event<tide::host> loaded;
//   s.copy.copy(dst, src, bytes);                          // runs on the copy stream's worker
//   loaded.record(s.copy);
//   s.compute.wait(loaded);                                // compute waits for that copy only
//   tide::memory::launch(s.compute, step);                 // step() runs after the copy
//   s.compute.synchronize();                               // host waits; rethrows a failure
//
// tide::host: a stream is a ring of plain commands (copy, host function, event record, event
// wait) served in order by the stream's own worker thread, so two streams really overlap.
//   - enqueue blocks while the ring is full (stream_options::capacity commands wait behind the
//     running one); enqueueing onto a full stream from its own worker throws (it would deadlock);
//   - a host function is `void(*)(void*)` plus its argument, the shape of cudaLaunchHostFunc;
//     launch(stream, f) passes a pointer to a caller-owned callable: keep f alive until it ran;
//   - the first exception a host function throws is kept (category + text) and rethrown as
//     tide::error by every later synchronize() of the stream and of events recorded on it
//     (sticky, like a CUDA error); later copies and host functions are skipped, records and
//     waits still pass so nothing waiting on the stream hangs. Recreate the stream to recover;
//   - the destructor drains the queue, then joins the worker.
// Events: record(s) enqueues a marker; query() is true once s passed the marker of the most
// recent record; an event never recorded is complete. s.wait(e) makes s wait for the record
// that was most recent when wait was called (later records do not move it). elapsed_ms(a, b)
// is the time between the two markers, read on the workers as they passed them.
// Thread safety: every member may be called from any thread; calls on one stream from several
// threads are ordered by whoever gets the queue first.
//
// tide::sealed: the same streams; a copy reaches sealed memory through its alias (core/sealed.hpp),
// and kernels are host functions on the compute stream's worker (launch_owned), so they run
// asynchronously to the host, as CUDA kernels do.
//
// tide::cuda (stream.cuh): the same names over a non-blocking cudaStream_t and a cudaEvent_t.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/concepts.hpp"
#include "tide/core/error.hpp"
#include "tide/core/sealed.hpp"

namespace tide::memory {

// The shape of a host function on every backend (cudaHostFn_t on Linux).
using host_function = void (*)(void*);

struct stream_options {
  // cuda: the device the stream belongs to; -1: the device current when the stream is made (a
  // process on GPU 3 calls cudaSetDevice(3), or comm::nccl does, and every stream tide makes
  // afterwards is on it); host: ignored
  int device = -1;
  std::size_t capacity = 1024; // host: commands that may wait in the ring before enqueue blocks
};

// Options for a stream on the same device as `s` (cuda: s.device(); elsewhere the defaults), for
// a stream made later than s, when another device may be current.
template <class Stream>
stream_options options_like(Stream const& s) {
  stream_options o;
  if constexpr (requires { s.device(); }) o.device = s.device();
  return o;
}

namespace detail {
template <class B>
inline constexpr bool backend_has_no_streams = false;
// Backends whose streams are in-order queues served by a worker thread (below).
template <class B>
inline constexpr bool worker_streams = std::is_same_v<B, host> || std::is_same_v<B, sealed>;
}  // namespace detail

template <Backend B>
class stream {
  static_assert(detail::backend_has_no_streams<B>,
                "stream<B> has no implementation for this backend: for tide::cuda include "
                "<tide/memory/stream.cuh> and compile with nvcc");
};

template <Backend B>
class event {
  static_assert(detail::backend_has_no_streams<B>,
                "event<B> has no implementation for this backend: for tide::cuda include "
                "<tide/memory/stream.cuh> and compile with nvcc");
};

// A compute and a copy stream for one device: kernels on one, tier-to-tier copies on the other.
template <Backend B>
struct device_streams {
  explicit device_streams(stream_options const& opts = {}) : compute(opts), copy(opts) {}
  stream<B> compute;
  stream<B> copy;
};

namespace detail {

template <class F>
void call_callable(void* f) {
  (*static_cast<F*>(f))();
}

using stream_clock = std::chrono::steady_clock;

struct host_stream_state;

struct host_event_state {
  std::mutex mutex;
  std::shared_ptr<host_stream_state> stream;  // of the most recent record; null: never recorded
  std::uint64_t ticket = 0;                   // that record's position in `stream`
  std::uint64_t generation = 0;               // records so far
  std::uint64_t stamped_generation = 0;       // the record `stamp` belongs to
  stream_clock::time_point stamp{};           // when the worker passed that record's marker
};

enum class command_kind : std::uint8_t { copy, host_function, record, wait };

// One queued operation; the fields a kind does not use stay empty.
struct host_command {
  command_kind kind = command_kind::host_function;
  void* dst = nullptr;                         // copy
  void const* src = nullptr;                   // copy
  std::size_t bytes = 0;                       // copy
  host_function fn = nullptr;                  // host_function
  void* arg = nullptr;                         // host_function
  std::shared_ptr<host_event_state> event;     // record: the event to stamp
  std::shared_ptr<host_stream_state> waited;   // wait: the stream holding the awaited marker
  std::uint64_t sequence = 0;                  // record: generation; wait: ticket in `waited`
  std::shared_ptr<void> owned;                 // host_function: the callable arg points to, if owned
};

struct host_stream_state {
  explicit host_stream_state(std::size_t capacity) : ring(capacity) {}

  std::mutex mutex;
  std::condition_variable not_empty;   // the worker waits for commands
  std::condition_variable not_full;    // producers wait for a free slot
  std::condition_variable progressed;  // synchronize, events and other workers wait for `done`
  std::vector<host_command> ring;
  std::uint64_t enqueued = 0;          // commands ever enqueued; the last one's ticket
  std::uint64_t taken = 0;             // commands the worker took out of the ring
  std::uint64_t done = 0;              // commands finished: done <= taken <= enqueued
  bool stopping = false;
  bool failed = false;                 // sticky: the first host function that threw
  errc failure_kind = errc::internal;
  std::string failure;
  std::thread::id worker;

  // Appends c and returns its ticket; blocks while the ring is full.
  std::uint64_t enqueue(host_command&& c) {
    std::unique_lock lock(mutex);
    if (enqueued - taken == ring.size()) {
      TIDE_REQUIRE(std::this_thread::get_id() != worker, "a host function enqueued onto its own stream, whose ",
                   ring.size(), "-command ring is full: that waits for itself forever; enqueue from another "
                   "thread, or give the stream a larger stream_options::capacity");
      not_full.wait(lock, [&] { return enqueued - taken < ring.size(); });
    }
    ring[enqueued % ring.size()] = std::move(c);
    std::uint64_t const ticket = ++enqueued;
    lock.unlock();
    not_empty.notify_one();
    return ticket;
  }

  // Blocks until the command with this ticket finished.
  void wait_done(std::uint64_t ticket) {
    std::unique_lock lock(mutex);
    if (done >= ticket) return;
    TIDE_REQUIRE(std::this_thread::get_id() != worker, "a host function waited (synchronize) for later work on "
                 "its own stream: that waits for itself forever; order it with an event and stream.wait instead");
    progressed.wait(lock, [&] { return done >= ticket; });
  }

  bool is_done(std::uint64_t ticket) {
    std::lock_guard lock(mutex);
    return done >= ticket;
  }

  void rethrow_failure() {
    std::unique_lock lock(mutex);
    if (!failed) return;
    errc const kind = failure_kind;
    // The failure's own words: the user reads what went wrong (a lost rank, a budget), not how it
    // travelled. Every later synchronize reports it again, until the stream is made anew.
    std::string message = failure;
    lock.unlock();
    throw error(kind, message);
  }

  void record_failure(errc kind, std::string text) {
    std::lock_guard lock(mutex);
    if (failed) return;
    failed = true;
    failure_kind = kind;
    failure = std::move(text);
  }

  void execute(host_command& c) noexcept {
    switch (c.kind) {
      case command_kind::copy:
        if (!failed && c.bytes != 0) std::memcpy(c.dst, c.src, c.bytes);
        break;
      case command_kind::host_function:
        if (failed) break;
        try {
          c.fn(c.arg);
        } catch (error const& e) {
          record_failure(e.category(), e.message());
        } catch (std::exception const& e) {
          record_failure(errc::usage, std::string("it threw ") + e.what());
        } catch (...) {
          record_failure(errc::usage, "it threw an exception that is not a std::exception");
        }
        break;
      case command_kind::record: {
        auto const now = stream_clock::now();
        std::lock_guard lock(c.event->mutex);
        if (c.event->generation == c.sequence) {
          c.event->stamp = now;
          c.event->stamped_generation = c.sequence;
        }
        break;
      }
      case command_kind::wait:
        c.waited->wait_done(c.sequence);
        break;
    }
  }

  void serve() noexcept {
    std::unique_lock lock(mutex);
    for (;;) {
      not_empty.wait(lock, [&] { return taken < enqueued || stopping; });
      if (taken == enqueued) return;  // stopping, and drained
      host_command c = std::move(ring[taken % ring.size()]);
      ++taken;
      lock.unlock();
      not_full.notify_one();
      execute(c);
      c = host_command{};  // drop shared states before publishing: the last owner may be here
      lock.lock();
      done = taken;
      progressed.notify_all();
    }
  }
};

}  // namespace detail

template <Backend B>
  requires detail::worker_streams<B>
class stream<B> {
 public:
  using backend = B;
  using options = stream_options;

  explicit stream(options const& opts = {}) {
    TIDE_REQUIRE(opts.capacity > 0, "stream<", B::name, "> asked for a ring of 0 commands; give capacity >= 1");
    state_ = std::make_shared<detail::host_stream_state>(opts.capacity);
    {
      std::lock_guard lock(state_->mutex);  // the worker reads `worker` under this mutex
      worker_ = std::thread([s = state_] { s->serve(); });
      state_->worker = worker_.get_id();
    }
  }
  stream(stream const&) = delete;
  stream& operator=(stream const&) = delete;
  stream(stream&& other) noexcept = default;
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      close();
      state_ = std::move(other.state_);
      worker_ = std::move(other.worker_);
    }
    return *this;
  }
  ~stream() { close(); }

  // memcpy(dst, src, bytes) on the worker, after everything enqueued before.
  void copy(void* dst, void const* src, std::size_t bytes) {
    TIDE_REQUIRE(bytes == 0 || (dst != nullptr && src != nullptr), "stream copy of ", bytes,
                 " bytes with a null ", dst == nullptr ? "destination" : "source", "; pass valid buffers");
    detail::host_command c;
    c.kind = detail::command_kind::copy;
    if constexpr (std::is_same_v<B, sealed>) {  // the worker copies through the alias
      c.dst = unseal(dst);
      c.src = unseal(src);
    } else {
      c.dst = dst;
      c.src = src;
    }
    c.bytes = bytes;
    state_->enqueue(std::move(c));
  }

  // fn(arg) on the worker, after everything enqueued before (cudaLaunchHostFunc).
  void launch(host_function fn, void* arg) {
    TIDE_REQUIRE(fn != nullptr, "stream launch of a null host function; pass a function pointer");
    detail::host_command c;
    c.kind = detail::command_kind::host_function;
    c.fn = fn;
    c.arg = arg;
    state_->enqueue(std::move(c));
  }

  // f() on the worker, after everything enqueued before; the stream keeps its own copy of f
  // until it ran (one allocation per call: for kernels of tide::sealed, not for hot host paths).
  template <class F>
  void launch_owned(F f) {
    auto owned = std::make_shared<F>(std::move(f));
    detail::host_command c;
    c.kind = detail::command_kind::host_function;
    c.fn = &detail::call_callable<F>;
    c.arg = owned.get();
    c.owned = std::move(owned);
    state_->enqueue(std::move(c));
  }

  // Work enqueued after this waits until e's most recent record (as of now) has passed.
  void wait(event<B> const& e);

  // Blocks until everything enqueued so far has finished; rethrows the stream's sticky failure.
  void synchronize() {
    std::uint64_t target = 0;
    {
      std::lock_guard lock(state_->mutex);
      target = state_->enqueued;
    }
    state_->wait_done(target);
    state_->rethrow_failure();
  }

  // True when everything enqueued so far has finished. Never throws; synchronize() reports.
  [[nodiscard]] bool query() {
    std::lock_guard lock(state_->mutex);
    return state_->done == state_->enqueued;
  }

  // The thread that runs this stream's commands.
  [[nodiscard]] std::thread::id worker_id() const noexcept { return worker_.get_id(); }

 private:
  friend class event<B>;

  void close() noexcept {
    if (!state_) return;
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->not_empty.notify_one();
    worker_.join();
    state_.reset();
  }

  std::shared_ptr<detail::host_stream_state> state_;
  std::thread worker_;
};

template <Backend B>
  requires detail::worker_streams<B>
class event<B> {
 public:
  using backend = B;
  using stream_type = stream<B>;

  event() : state_(std::make_shared<detail::host_event_state>()) {}
  event(event const&) = delete;
  event& operator=(event const&) = delete;
  event(event&&) noexcept = default;
  event& operator=(event&&) noexcept = default;
  // Never blocks: a pending marker keeps the event's state alive until it passes.
  ~event() = default;

  // Enqueues a marker on s; from now on the event reports that marker.
  void record(stream<B>& s) {
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(state_->mutex);
      generation = ++state_->generation;
    }
    detail::host_command c;
    c.kind = detail::command_kind::record;
    c.event = state_;
    c.sequence = generation;
    // Not under the event's mutex: a full ring waits for the worker, which may need that mutex.
    std::uint64_t ticket = 0;
    try {
      ticket = s.state_->enqueue(std::move(c));
    } catch (...) {
      std::lock_guard lock(state_->mutex);
      if (state_->generation == generation) --state_->generation;  // the record did not happen
      throw;
    }
    std::lock_guard lock(state_->mutex);
    if (state_->generation == generation) {
      state_->stream = s.state_;
      state_->ticket = ticket;
    }
  }

  // Records a marker that has already passed: the calling thread's own timeline, which is where
  // exec<host> runs its kernels (memory/ops.hpp: record on the host's compute timeline).
  void record_passed() {
    std::lock_guard lock(state_->mutex);
    ++state_->generation;
    state_->stream.reset();
    state_->ticket = 0;
    state_->stamp = detail::stream_clock::now();
    state_->stamped_generation = state_->generation;
  }

  // True once the stream passed the most recent record's marker, or if never recorded.
  [[nodiscard]] bool query() const {
    auto [s, ticket] = last_record();
    return s == nullptr || s->is_done(ticket);
  }

  // Blocks until query() would be true; rethrows the sticky failure of the recording stream.
  void synchronize() const {
    auto [s, ticket] = last_record();
    if (s == nullptr) return;
    s->wait_done(ticket);
    s->rethrow_failure();
  }

 private:
  friend class stream<B>;
  template <Backend C>
    requires detail::worker_streams<C>
  friend double elapsed_ms(event<C> const& start, event<C> const& end);

  [[nodiscard]] std::pair<std::shared_ptr<detail::host_stream_state>, std::uint64_t> last_record() const {
    std::lock_guard lock(state_->mutex);
    return {state_->stream, state_->ticket};
  }

  std::shared_ptr<detail::host_event_state> state_;
};

template <Backend B>
  requires detail::worker_streams<B>
void stream<B>::wait(event<B> const& e) {
  auto [s, ticket] = e.last_record();
  if (s == nullptr || s->is_done(ticket)) return;  // nothing left to wait for
  detail::host_command c;
  c.kind = detail::command_kind::wait;
  c.waited = std::move(s);
  c.sequence = ticket;
  state_->enqueue(std::move(c));
}

// Milliseconds between the markers of start's and end's most recent records, as the workers
// passed them (cudaEventElapsedTime). Both must be recorded and complete.
template <Backend B>
  requires detail::worker_streams<B>
double elapsed_ms(event<B> const& start, event<B> const& end) {
  auto stamp_of = [](event<B> const& e, char const* which) {
    TIDE_REQUIRE(e.query(), "elapsed_ms: the ", which, " event is not complete; synchronize it first");
    std::lock_guard lock(e.state_->mutex);
    TIDE_REQUIRE(e.state_->generation != 0, "elapsed_ms: the ", which, " event was never recorded; record it "
                 "on a stream first");
    TIDE_REQUIRE(e.state_->stamped_generation == e.state_->generation, "elapsed_ms: the ", which,
                 " event was recorded again and its new marker has not passed; synchronize it first");
    return e.state_->stamp;
  };
  auto const t0 = stamp_of(start, "start");
  auto const t1 = stamp_of(end, "end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// Runs f() on s's worker, after everything enqueued before. f is the caller's: it must stay
// alive until the stream has run it (as an argument of cudaLaunchHostFunc must).
template <class S, class F>
  requires requires(S& s, F& f) {
    s.launch(host_function{}, static_cast<void*>(nullptr));
    f();
  }
void launch(S& s, F& f) {
  s.launch(&detail::call_callable<F>, const_cast<void*>(static_cast<void const*>(std::addressof(f))));
}
// A temporary would be gone before the stream runs it.
template <class S, class F>
void launch(S&, F const&&) = delete;

static_assert(Stream<stream<host>> && Stream<stream<sealed>>);
static_assert(Event<event<host>> && Event<event<sealed>>);

}  // namespace tide::memory
