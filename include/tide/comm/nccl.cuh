#pragma once
// comm::nccl: a Communicator over NCCL, for GPU ranks: device memory, every operation enqueued on
// a CUDA stream of the communicator's own (its lane). Needs tide::nccl and any Communicator to
// bootstrap: rank 0's ncclUniqueId is broadcast over it (comm::mpi for many processes,
// comm::self for one). NCCL runs one rank per GPU: ranks of the bootstrap communicator that chose
// the same GPU are refused before NCCL starts, naming them (NCCL itself would stop with
// "Duplicate GPU detected"), on every rank alike.
//
//   tide::comm::mpi world{session};
//   tide::comm::nccl gpus{world, world.rank() % devices};        // one device per rank
//   tide::comm::self one;
//   tide::comm::nccl alone{one, 0};                               // one process, one GPU
//   gpus.all_reduce(std::span<float>(device_grads, n), tide::comm::reduce_op::sum);
//   auto r = gpus.all_reduce_async(std::span<float>(device_grads, n), tide::comm::reduce_op::sum);
//   gpus.lane().wait(backward_done);                             // or order it after an event
//
// Spans are device (or managed) memory. Operations run in call order on lane(); an asynchronous one
// returns a request (an event recorded after it) that wait() and test() look at, and an event
// recorded on lane() orders other streams after it. NCCL matches send and receive by call order,
// not by tag: the tag of send / recv must be 0.
//
// No wait without a deadline. The communicator is created non-blocking (ncclConfig_t::blocking =
// 0): initialisation and every call that NCCL leaves in progress are polled with
// ncclCommGetAsyncError, and a request's event with cudaEventQuery, each until the deadline. Past
// it, or when NCCL reports an error, the communicator is aborted (ncclCommAbort: this rank's
// kernels and resources end; the other ranks reach their own deadlines) and every later call
// throws the same tide::error(errc::nccl), which names the operation and the deadline. NCCL does
// not say which rank it did not hear from; the bootstrap communicator's roll call (comm::mpi)
// does. Destruction finalises the communicator under the deadline too (ncclCommFinalize, polled),
// and aborts it past the deadline. A watchdog thread per communicator (comm/detail/watchdog.hpp)
// ends it too when its lane makes no progress for the deadline, whatever the host waits on
// meanwhile: a host wait behind a collective on a stream (a copy that waits for a gradient
// chunk's sum) has no deadline of its own, and ending the communicator ends the collective's
// kernels, so that wait returns and the next call throws. The deadline must exceed the longest
// a lane may wait for the compute it is ordered after (a step's backward), and the longest an
// asynchronous operation nobody waits on may wait for its peers (a barrier_async posted while
// rank 0 writes a checkpoint). Every communicator's NCCL calls and every watchdog take one
// process-wide lock (NCCL asks that calls on communicators of one device not run concurrently);
// a communicator is still for one thread at a time.
//
// A request stays valid for the next 63 operations: its event is then recorded again for a newer
// one (the communicator waits for the old operation before it reuses the event), and waiting on
// it asks whether that newer operation completed, which implies the old one did (one stream).
//
// comm::nccl_data_parallel (comm/nccl_data_parallel.cuh) is make_trainer's data parallelism over
// it. No GPU runs this here: tests/cuda/instantiate_all.cu compiles every operation for every
// type with nvcc; tests/gpu/nccl.cu (label gpu) checks them where a device is.

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/comm/detail/lane.hpp"
#include "tide/comm/detail/watchdog.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/error.hpp"
#include "tide/memory/stream.cuh"

namespace tide::comm {
namespace detail {

inline std::recursive_mutex nccl_lock;  // comm::nccl::lock()

template <Transferable T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ncclUint8;
  else if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;
  else return ncclFloat16;
}
constexpr ncclRedOp_t nccl_op(reduce_op op) noexcept {
  return op == reduce_op::sum ? ncclSum : op == reduce_op::max ? ncclMax : ncclMin;
}

}  // namespace detail

class nccl {
 public:
  static constexpr std::string_view name = "nccl";
  using backend = cuda;  // spans are device (or managed) memory
  struct request {
    std::uint64_t seq = 0;  // the operation's number; 0: nothing to wait for
  };

  // Every rank of `bootstrap` calls this with its own device; the ranks of the new communicator
  // are those of bootstrap.
  template <Communicator Boot>
  nccl(Boot& bootstrap, int device, comm_options options = {}) : st_(std::make_unique<state>(options, device)) {
    one_rank_per_gpu(bootstrap, device);
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(&id), sizeof(id)), 0);
    st_->rank = bootstrap.rank();
    st_->size = bootstrap.size();
    TIDE_CUDA_CHECK(cudaSetDevice(device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // initialisation and calls return at once; settle() polls them
    st_->start("ncclCommInitRankConfig");
    check(ncclCommInitRankConfig(&st_->comm, st_->size, id, st_->rank, &config), "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
    st_->make_events();
    st_->watch();
  }
  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;

  // Every rank's GPU, by UUID, gathered over the bootstrap communicator: two ranks on one GPU
  // throw tide::error(usage) on every rank, before any NCCL call.
  template <Communicator Boot>
  static void one_rank_per_gpu(Boot& bootstrap, int device) {
    cudaDeviceProp prop{};
    TIDE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    constexpr std::size_t id_bytes = sizeof(prop.uuid.bytes);
    std::array<std::uint8_t, id_bytes> mine{};
    std::memcpy(mine.data(), prop.uuid.bytes, id_bytes);
    std::vector<std::uint8_t> all(id_bytes * static_cast<std::size_t>(bootstrap.size()));
    bootstrap.all_gather(std::span<std::uint8_t const>(mine), std::span<std::uint8_t>(all));
    int devices = 0;
    TIDE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    for (int a = 0; a < bootstrap.size(); ++a)
      for (int b = a + 1; b < bootstrap.size(); ++b)
        TIDE_CHECK(std::memcmp(&all[static_cast<std::size_t>(a) * id_bytes], &all[static_cast<std::size_t>(b) * id_bytes],
                               id_bytes) != 0,
                   usage, "comm::nccl: ranks ", a, " and ", b, " of the bootstrap communicator chose the same GPU; NCCL "
                   "runs one rank per GPU: launch at most as many ranks on a node as it has GPUs (this one has ",
                   devices, "), or give each process a communicator of its own (bootstrap from comm::self)");
  }

  [[nodiscard]] int rank() const noexcept { return st_->rank; }
  [[nodiscard]] int size() const noexcept { return st_->size; }
  [[nodiscard]] int device() const noexcept { return st_->device; }
  // For `who` (a comm policy's name), being built on the current device: it must be this one's.
  void require_current_device(std::string_view who) const {
    int current = 0;
    TIDE_CUDA_CHECK(cudaGetDevice(&current));
    TIDE_REQUIRE(current == device(), who, " over comm::nccl: the trainer is being built on CUDA device ", current,
                 " but the communicator runs on device ", device(), "; call cudaSetDevice(", device(),
                 ") before make_trainer (comm::nccl's constructor does, on the thread that builds it)");
  }
  // The NCCL handle, for a call tide does not make: under comm::nccl::lock(), as the watchdog may
  // end it at any moment (null once it has).
  [[nodiscard]] ncclComm_t native() const noexcept {
    std::lock_guard guard(lock());
    return st_->comm;
  }
  // The lock every communicator's NCCL calls and every watchdog take.
  static std::recursive_mutex& lock() noexcept { return detail::nccl_lock; }
  // The stream every operation is enqueued on.
  [[nodiscard]] memory::stream<cuda>& lane() noexcept { return st_->stream; }

  // ---- asynchronous ------------------------------------------------------------------------
  template <Transferable T>
  request all_reduce_async(std::span<T> data, reduce_op op) {
    return run(detail::op_kind::all_reduce, detail::elem_of<T>, op, len(data), [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data.data(), data.data(), data.size(), detail::nccl_type<T>(), detail::nccl_op(op), c, s);
    });
  }
  template <Transferable T>
  request reduce_async(std::span<T> data, int root, reduce_op op) {
    check_rank(root, "reduce");
    return run(detail::op_kind::reduce, detail::elem_of<T>, op, len(data), [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(data.data(), data.data(), data.size(), detail::nccl_type<T>(), detail::nccl_op(op), root, c, s);
    });
  }
  template <Transferable T>
  request reduce_scatter_async(std::span<T const> in, std::span<T> out, reduce_op op) {
    TIDE_REQUIRE(in.size() == out.size() * static_cast<std::size_t>(size()), "comm::nccl reduce_scatter: ", in.size(),
                 " elements in, ", out.size(), " out on ", size(), " ranks; in must be size() * out");
    return run(detail::op_kind::reduce_scatter, detail::elem_of<T>, op, len(in), [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl_type<T>(), detail::nccl_op(op), c, s);
    });
  }
  template <Transferable T>
  request all_gather_async(std::span<T const> in, std::span<T> out) {
    TIDE_REQUIRE(out.size() == in.size() * static_cast<std::size_t>(size()), "comm::nccl all_gather: ", in.size(),
                 " elements in, ", out.size(), " out on ", size(), " ranks; out must be size() * in");
    return run(detail::op_kind::all_gather, detail::elem_of<T>, reduce_op::sum, len(in),
               [&](ncclComm_t c, cudaStream_t s) {
                 return ncclAllGather(in.data(), out.data(), in.size(), detail::nccl_type<T>(), c, s);
               });
  }
  // NCCL has no all-gather of uneven parts: one broadcast from each rank into its place, grouped.
  template <Transferable T>
  request all_gatherv_async(std::span<T const> in, std::span<T> out, std::span<index_t const> counts) {
    TIDE_REQUIRE(counts.size() == static_cast<std::size_t>(size()) &&
                     static_cast<index_t>(in.size()) == counts[static_cast<std::size_t>(rank())] &&
                     static_cast<index_t>(out.size()) == detail::total_of(counts),
                 "comm::nccl all_gatherv: needs one count per rank, in.size() == counts[rank] and out.size() == the "
                 "sum of counts (", in.size(), " in, ", out.size(), " out, ", counts.size(), " counts)");
    return run(detail::op_kind::all_gatherv, detail::elem_of<T>, reduce_op::sum, len(in),
               [&](ncclComm_t c, cudaStream_t s) {
                 ncclResult_t r = ncclGroupStart();
                 std::size_t at = 0;
                 for (int root = 0; root < size() && (r == ncclSuccess || r == ncclInProgress); ++root) {
                   auto const n = static_cast<std::size_t>(counts[static_cast<std::size_t>(root)]);
                   r = ncclBroadcast(root == rank() ? static_cast<void const*>(in.data()) : nullptr, out.data() + at,
                                     n, detail::nccl_type<T>(), root, c, s);
                   at += n;
                 }
                 ncclResult_t const end = ncclGroupEnd();
                 return r == ncclSuccess || r == ncclInProgress ? end : r;
               });
  }
  template <Transferable T>
  request broadcast_async(std::span<T> data, int root) {
    check_rank(root, "broadcast");
    return run(detail::op_kind::broadcast, detail::elem_of<T>, reduce_op::sum, len(data),
               [&](ncclComm_t c, cudaStream_t s) {
                 return ncclBroadcast(data.data(), data.data(), data.size(), detail::nccl_type<T>(), root, c, s);
               });
  }
  template <Transferable T>
  request send_async(std::span<T const> data, int to, int tag) {
    check_peer(to, tag, "send");
    return run(detail::op_kind::send, detail::elem_of<T>, reduce_op::sum, len(data), [&](ncclComm_t c, cudaStream_t s) {
      return ncclSend(data.data(), data.size(), detail::nccl_type<T>(), to, c, s);
    });
  }
  template <Transferable T>
  request recv_async(std::span<T> data, int from, int tag) {
    check_peer(from, tag, "recv");
    return run(detail::op_kind::recv, detail::elem_of<T>, reduce_op::sum, len(data), [&](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(data.data(), data.size(), detail::nccl_type<T>(), from, c, s);
    });
  }
  // An all-reduce of one int on the device.
  request barrier_async() {
    return run(detail::op_kind::barrier, detail::elem::i32, reduce_op::sum, 1, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(st_->scratch, st_->scratch, 1, ncclInt32, ncclSum, c, s);
    });
  }

  // ---- blocking ---------------------------------------------------------------------------------
  template <Transferable T>
  void all_reduce(std::span<T> data, reduce_op op) { wait(all_reduce_async(data, op)); }
  template <Transferable T>
  void reduce(std::span<T> data, int root, reduce_op op) { wait(reduce_async(data, root, op)); }
  template <Transferable T>
  void reduce_scatter(std::span<T const> in, std::span<T> out, reduce_op op) { wait(reduce_scatter_async(in, out, op)); }
  template <Transferable T>
  void all_gather(std::span<T const> in, std::span<T> out) { wait(all_gather_async(in, out)); }
  template <Transferable T>
  void all_gatherv(std::span<T const> in, std::span<T> out, std::span<index_t const> counts) {
    wait(all_gatherv_async(in, out, counts));
  }
  template <Transferable T>
  void broadcast(std::span<T> data, int root) { wait(broadcast_async(data, root)); }
  template <Transferable T>
  void send(std::span<T const> data, int to, int tag) { wait(send_async(data, to, tag)); }
  template <Transferable T>
  void recv(std::span<T> data, int from, int tag) { wait(recv_async(data, from, tag)); }
  void barrier() { wait(barrier_async()); }

  // Until the operation completed, or the deadline passed (then the communicator is aborted).
  void wait(request const& r) {
    if (r.seq == 0) return;
    st_->require_intact();
    auto const until = std::chrono::steady_clock::now() + st_->options.deadline;
    auto pause = std::chrono::microseconds(1);
    while (!test(r)) {
      if (std::chrono::steady_clock::now() >= until) fail(r.seq, "did not complete within its deadline");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
  }
  // Whether the operation completed; an error NCCL reported meanwhile fails the communicator.
  bool test(request const& r) {
    if (r.seq == 0) return true;
    std::lock_guard guard(lock());  // the watchdog may end the communicator meanwhile
    st_->require_intact();
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(st_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) fail(r.seq, ncclGetErrorString(async));
    cudaError_t const e = cudaEventQuery(st_->events[r.seq % ring]);
    if (e == cudaErrorNotReady) return false;
    TIDE_CUDA_CHECK(e);
    return true;
  }

  // The ranks with the same color (>= 0), ordered by key: ncclCommSplit, on the same device.
  [[nodiscard]] nccl split(int color, int key) {
    TIDE_REQUIRE(color >= 0, "comm::nccl split: color ", color, " must be >= 0 (key ", key, ")");
    std::lock_guard guard(lock());
    st_->require_intact();
    nccl part{st_->options, st_->device};
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    part.st_->start("ncclCommSplit");
    check(ncclCommSplit(st_->comm, color, key, &part.st_->comm, &config), "ncclCommSplit");
    settle("ncclCommSplit");
    part.settle("ncclCommSplit");
    check(ncclCommUserRank(part.st_->comm, &part.st_->rank), "ncclCommUserRank");
    check(ncclCommCount(part.st_->comm, &part.st_->size), "ncclCommCount");
    part.st_->make_events();
    part.st_->watch();
    return part;
  }

 private:
  static constexpr std::uint64_t ring = 64;  // requests in flight before an event is reused

  struct state {
    comm_options options;
    int device = 0;
    int rank = 0, size = 1;
    ncclComm_t comm = nullptr;
    memory::stream<cuda> stream;
    std::array<cudaEvent_t, ring> events{};
    int* scratch = nullptr;   // the barrier's int, on the device
    std::uint64_t next = 1;   // the next operation's number
    std::string what;         // the call in progress, for errors
    std::string failure;      // set once: every later call throws it
    detail::stall_watch stall;  // comm, failure, next, the events: under lock() once the watchdog runs
    // The watchdog's look at the lane, every period: past the deadline without progress, the end
    // (the handle taken under the lock, aborted outside it: ncclCommAbort may block).
    struct watcher {
      state* st;
      void operator()() const {
        ncclComm_t ended = nullptr;
        {
          std::lock_guard guard(lock());
          if (!st->failure.empty() || st->comm == nullptr) return;
          if (cudaSetDevice(st->device) != cudaSuccess) return;
          std::uint64_t const next = st->next;
          auto finished = [&](std::uint64_t seq) {
            if (seq + ring < next) return true;  // its event was recorded again: the communicator waited for it first
            return cudaEventQuery(st->events[seq % ring]) != cudaErrorNotReady;  // an error: the next call's to report
          };
          auto const late = st->stall.overdue(next, finished, detail::stall_watch::clock::now(), st->options.deadline);
          if (!late) return;
          ended = st->take(tide::detail::concat(
              "comm::nccl: operation #", *late, " on rank ", st->rank, " of ", st->size,
              " made no progress within its deadline of ", st->options.deadline.count(),
              " ms, and the communicator's watchdog ended it; NCCL does not say which rank it waits for (comm::mpi's "
              "roll call on the bootstrap communicator does)"));
        }
        ncclCommAbort(ended);
      }
    };
    std::optional<detail::periodic_thread<watcher>> dog;  // destroyed first, by ~state
    state(comm_options o, int dev) : options(o), device(dev), stream(memory::stream_options{.device = dev}) {}
    state(state const&) = delete;
    state& operator=(state const&) = delete;
    // The communicator first, under the deadline (a peer that is gone would make a blocking
    // destroy wait forever), then what its operations used.
    ~state() {
      dog.reset();  // no look at the lane from here on
      std::lock_guard guard(lock());  // no other communicator's NCCL call meanwhile
      if (comm != nullptr) {
        bool finished = false;
        if (failure.empty() && ncclCommFinalize(comm) == ncclSuccess) {
          auto const until = std::chrono::steady_clock::now() + options.deadline;
          ncclResult_t progress = ncclInProgress;
          while (ncclCommGetAsyncError(comm, &progress) == ncclSuccess && progress == ncclInProgress &&
                 std::chrono::steady_clock::now() < until)
            std::this_thread::yield();
          finished = progress == ncclSuccess;
        }
        if (finished) ncclCommDestroy(comm);
        else ncclCommAbort(comm);
      }
      for (cudaEvent_t e : events)
        if (e != nullptr) cudaEventDestroy(e);
      if (scratch != nullptr) cudaFree(scratch);
    }
    void start(std::string_view call) { what = std::string(call); }
    void watch() { dog.emplace(detail::periodic_thread<watcher>::period_for(options.deadline), watcher{this}); }
    // The handle, taken (null from now on; the caller aborts it), and `message` as the failure.
    ncclComm_t take(std::string_view message) noexcept {
      std::lock_guard guard(lock());
      ncclComm_t const c = std::exchange(comm, nullptr);
      try {
        if (failure.empty()) failure = message;
      } catch (...) {  // no memory for the text: require_intact still sees the null handle
      }
      return c;
    }
    // Ends the communicator (ncclCommAbort: its kernels end) with `message`, once.
    void end(std::string_view message) noexcept {
      if (ncclComm_t const c = take(message); c != nullptr) ncclCommAbort(c);
    }
    void make_events() {
      TIDE_CUDA_CHECK(cudaSetDevice(device));
      for (cudaEvent_t& e : events) TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      TIDE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(int)));
      TIDE_CUDA_CHECK(cudaMemset(scratch, 0, sizeof(int)));
    }
    void require_intact() {
      std::lock_guard guard(lock());
      TIDE_CHECK(failure.empty() && comm != nullptr, nccl, failure.empty() ? "comm::nccl: ended" : failure,
                 " (the communicator failed earlier; restart from the last checkpoint)");
    }
  };

  nccl(comm_options options, int device) : st_(std::make_unique<state>(options, device)) {}

  template <class T>
  static index_t len(std::span<T> s) noexcept {
    return static_cast<index_t>(s.size());
  }
  void check_rank(int r, char const* what) const {
    TIDE_REQUIRE(r >= 0 && r < size(), "comm::nccl ", what, ": rank ", r, " is not one of 0..", size() - 1);
  }
  void check_peer(int peer, int tag, char const* what) const {
    check_rank(peer, what);
    TIDE_REQUIRE(tag == 0, "comm::nccl ", what, ": tag ", tag, "; NCCL matches sends and receives by call order, "
                 "not by tag: pass tag 0 and call them in the same order on both ranks");
  }

  // Enqueues one operation (its event slot free first), settles the call, records its event.
  template <class Enqueue>
  request run(detail::op_kind kind, detail::elem type, reduce_op op, index_t n, Enqueue&& enqueue) {
    st_->require_intact();
    std::uint64_t const seq = st_->next;
    if (seq > ring) wait(request{seq - ring});  // the slot's previous operation, before its event is reused
    std::lock_guard guard(lock());  // to the event's record: the watchdog sees the operation whole or not at all
    st_->require_intact();
    detail::operation o;
    o.kind = kind;
    o.type = type;
    o.op = op;
    o.n = n;
    o.out_n = n;
    o.seq = seq;
    st_->what = detail::describe(o);
    TIDE_CUDA_CHECK(cudaSetDevice(st_->device));
    check(enqueue(st_->comm, st_->stream.native()), st_->what);
    settle(st_->what);
    TIDE_CUDA_CHECK(cudaEventRecord(st_->events[seq % ring], st_->stream.native()));
    ++st_->next;
    return {seq};
  }
  void check(ncclResult_t r, std::string_view call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    fail_with(tide::detail::concat("comm::nccl: ", call, " on rank ", rank(), " of ", size(), ": ",
                                   ncclGetErrorString(r), " (", ncclGetLastError(st_->comm), ")"));
  }
  // A non-blocking communicator's call returns before NCCL finished taking it: poll its state.
  void settle(std::string_view call) {
    auto const until = std::chrono::steady_clock::now() + st_->options.deadline;
    for (;;) {
      ncclResult_t progress = ncclInProgress;
      check(ncclCommGetAsyncError(st_->comm, &progress), call);
      if (progress == ncclSuccess) return;
      if (progress != ncclInProgress) check(progress, call);
      if (std::chrono::steady_clock::now() >= until)
        fail_with(tide::detail::concat("comm::nccl: ", call, " on rank ", rank(), " of ", size(),
                                       " did not complete within its deadline of ", st_->options.deadline.count(),
                                       " ms; NCCL does not say which rank it waits for (comm::mpi's roll call on the "
                                       "bootstrap communicator does)"));
      std::this_thread::yield();
    }
  }
  [[noreturn]] void fail(std::uint64_t seq, std::string_view why) {
    fail_with(tide::detail::concat("comm::nccl: operation #", seq, " on rank ", rank(), " of ", size(), " ", why,
                                   why.starts_with("did not") ? tide::detail::concat(" of ", st_->options.deadline.count(), " ms") : "",
                                   "; NCCL does not say which rank it waits for (comm::mpi's roll call on the bootstrap "
                                   "communicator does)"));
  }

 public:
  // Ends the communicator for good (ncclCommAbort: its kernels end): every later call throws
  // tide::error(nccl) with `why`. For a caller whose ranks can no longer agree on the order of
  // the operations (NCCL matches them by call order), such as a training step abandoned on one
  // rank after some of its all-reduces were enqueued.
  void abort(char const* why) noexcept { st_->end(why != nullptr ? why : "comm::nccl: aborted"); }

 private:
  [[noreturn]] void fail_with(std::string message) {
    st_->end(message);  // ends the kernels waiting; the first failure stays the communicator's
    TIDE_FAIL(nccl, message);
  }

  std::unique_ptr<state> st_;
};

static_assert(Communicator<nccl>);

}  // namespace tide::comm
