#pragma once
// comm::mpi: a Communicator over Open MPI, for CPU ranks and host memory (and to bootstrap NCCL).
// Needs tide::mpi (MPI's headers and library) and MPI_THREAD_MULTIPLE.
//
//   int main(int argc, char** argv) {
//     tide::comm::mpi_session session{&argc, &argv};          // MPI_Init_thread .. MPI_Finalize
//     tide::comm::mpi world{session, {.deadline = 60s}};      // a duplicate of MPI_COMM_WORLD
//     world.all_reduce(std::span<float>(g), tide::comm::reduce_op::sum);
//   }
//
// Progress. Open MPI advances a non-blocking collective only inside MPI calls ("OMPI progress:
// no"): a collective started and then left alone while the caller computes barely moves. So each
// communicator runs its operations on its own lane, a thread that starts the non-blocking call and
// polls it (MPI_Test, yielding for 2 ms, then sleeping up to 1 ms between polls) until it completes: the
// caller's compute overlaps it for real.
//
// Lost ranks. MPI does not notice a rank that stopped or hangs: its peers would spin in the
// collective forever. Here the poll has a deadline (comm_options::deadline). When it passes, the
// rank takes a roll call on a second communicator (every rank sends its operation count to every
// other and listens for a grace period of half the deadline, 0.2 s to 5 s) and throws
// tide::error(errc::mpi) naming the operation, the deadline and the ranks not heard from. From
// then on the communicator is broken: every later call rethrows, communicators are not freed and
// mpi_session does not call MPI_Finalize (it would wait for the lost rank); the process should
// exit, non-zero, and mpiexec then ends the job. A rank that dies is noticed by mpiexec itself,
// which ends the job. comm::heartbeat (heartbeat.hpp) notices a silent rank in seconds on a side
// channel: the waits then give up at their next poll with its message, long before a deadline
// that must stay longer than any live operation.
//
// Sums of bf16 and f16 use MPI operations of tide's (each pair added in fp32 and rounded back).
// Reductions follow Open MPI's algorithm for the size and rank count: deterministic from run to
// run, but not the rank-order sum of a single process.

// MPI's C API only: the deprecated C++ bindings are neither needed nor warning-clean.
#ifndef OMPI_SKIP_MPICXX
#  define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#  define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/comm/detail/lane.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"

namespace tide::comm {

namespace detail {

inline void mpi_check(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  TIDE_FAIL(mpi, "comm::mpi: ", what, ": ", std::string_view(text, static_cast<std::size_t>(length)));
}

// Set when a communicator gave up on a lost rank: nothing may wait for that rank again.
inline std::atomic<bool>& mpi_broken() noexcept {
  static std::atomic<bool> broken{false};
  return broken;
}

// Set by comm::heartbeat when a rank stopped answering: every wait of this process gives up at its
// next poll with the heartbeat's message (who, since which step, what to do).
struct peer_loss {
  std::atomic<bool> lost{false};
  std::mutex mutex;
  std::string text;
};
inline peer_loss& peer_loss_of_process() noexcept {
  static peer_loss loss;
  return loss;
}
inline void mpi_lose_peer(std::string const& text) {
  peer_loss& p = peer_loss_of_process();
  {
    std::lock_guard lock(p.mutex);
    p.text = text;
  }
  mpi_broken() = true;
  p.lost.store(true, std::memory_order_release);
}

inline MPI_Datatype datatype_of(elem e) noexcept {
  switch (e) {
    case elem::f32: return MPI_FLOAT;
    case elem::f64: return MPI_DOUBLE;
    case elem::i32: return MPI_INT32_T;
    case elem::i64: return MPI_INT64_T;
    case elem::u8: return MPI_UINT8_T;
    default: return MPI_UINT16_T;  // bf16, f16: their bits; reductions use half_ops
  }
}

// MPI_User_function for 16-bit floats: inout[i] = in[i] (op) inout[i], in fp32, rounded back.
template <class H, reduce_op Op>
void half_reduce(void* in, void* inout, int* count, MPI_Datatype*) {
  auto const* a = static_cast<H const*>(in);
  auto* b = static_cast<H*>(inout);
  for (int i = 0; i < *count; ++i) {
    float const x = to_float(a[i]);
    float const y = to_float(b[i]);
    float const r = Op == reduce_op::sum ? x + y : Op == reduce_op::max ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = from_float<H>(r);
  }
}

struct half_ops {
  MPI_Op op[2][3]{};  // [bf16, f16][sum, max, min]
  bool made = false;
};
inline half_ops& half_ops_of_process() noexcept {
  static half_ops ops;
  return ops;
}

inline MPI_Op op_of(elem e, reduce_op op) {
  if (e == elem::bf16 || e == elem::f16) {
    half_ops const& h = half_ops_of_process();
    TIDE_CHECK(h.made, usage, "comm::mpi: a bf16 / f16 reduction needs an mpi_session alive");
    return h.op[e == elem::bf16 ? 0 : 1][static_cast<int>(op)];
  }
  return op == reduce_op::sum ? MPI_SUM : op == reduce_op::max ? MPI_MAX : MPI_MIN;
}

}  // namespace detail

// MPI_Init_thread (MPI_THREAD_MULTIPLE) and MPI_Finalize, if MPI was not initialised already.
// Create it first in main and let it outlive every communicator.
class mpi_session {
 public:
  mpi_session() : mpi_session(nullptr, nullptr) {}
  mpi_session(int* argc, char*** argv) {
    int initialised = 0;
    detail::mpi_check(MPI_Initialized(&initialised), "MPI_Initialized");
    int provided = 0;
    if (initialised == 0) {
      // comm::mpi's all-reduces are nonblocking (MPI_Iallreduce, so that a wait can have a
      // deadline), and Open MPI's libnbc picks its binomial tree for them by default: 1.5 GB/s for
      // 25 MiB buckets on 2 ranks of this project's machine, where its ring gives 4.5 GB/s (and
      // the blocking MPI_Allreduce 2.4-3 GB/s for the whole 498 MB). Its default for MPI_Ireduce
      // (ZeRO-2's reduce of a chunk to its owner) took twice as long as its binomial tree for
      // 256 KiB chunks, and the GPT demo with ZeRO-2 ran at 2,300-5,100 tokens/s against 14,400
      // with the tree. A value set in the environment stays (one set in an MCA parameter file
      // does not: the environment takes precedence there; set it in the environment instead).
      ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
      ::setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", 0);
      detail::mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      owns_ = true;
    } else {
      detail::mpi_check(MPI_Query_thread(&provided), "MPI_Query_thread");
    }
    TIDE_CHECK(provided == MPI_THREAD_MULTIPLE, mpi, "comm::mpi needs MPI_THREAD_MULTIPLE (each communicator "
               "calls MPI from its own lane thread) but this MPI provides level ", provided, ": use an MPI built "
               "with thread support (ompi_info | grep THREAD_MULTIPLE), or initialise it with that level");
    detail::half_ops& h = detail::half_ops_of_process();
    if (!h.made) {
      using detail::half_reduce;
      MPI_User_function* const fns[2][3] = {
          {&half_reduce<bf16, reduce_op::sum>, &half_reduce<bf16, reduce_op::max>, &half_reduce<bf16, reduce_op::min>},
          {&half_reduce<f16, reduce_op::sum>, &half_reduce<f16, reduce_op::max>, &half_reduce<f16, reduce_op::min>}};
      for (int t = 0; t < 2; ++t)
        for (int o = 0; o < 3; ++o) detail::mpi_check(MPI_Op_create(fns[t][o], 1, &h.op[t][o]), "MPI_Op_create");
      h.made = true;
    }
    detail::mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  mpi_session(mpi_session const&) = delete;
  mpi_session& operator=(mpi_session const&) = delete;
  ~mpi_session() {
    if (!owns_ || detail::mpi_broken()) return;  // after a lost rank, MPI_Finalize would wait for it
    detail::half_ops& h = detail::half_ops_of_process();
    if (h.made)
      for (auto& row : h.op)
        for (MPI_Op& op : row) MPI_Op_free(&op);
    h.made = false;
    MPI_Finalize();
  }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

 private:
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
};

class mpi : public detail::front<mpi> {
 public:
  static constexpr std::string_view name = "mpi";

  // A duplicate of MPI_COMM_WORLD: tide's messages never match the application's.
  explicit mpi(mpi_session const&, comm_options const& opts = {}) : mpi(MPI_COMM_WORLD, opts) {}
  // A duplicate of `parent` (collective over it).
  mpi(MPI_Comm parent, comm_options const& opts) : state_(std::make_unique<state>(parent, opts)) {}

  [[nodiscard]] int rank() const noexcept { return state_->rank; }
  [[nodiscard]] int size() const noexcept { return state_->size; }
  [[nodiscard]] comm_options const& options() const noexcept { return state_->opts; }
  [[nodiscard]] MPI_Comm native() const noexcept { return state_->comm; }

  // The ranks with the same color, ordered by key (then by rank): MPI_Comm_split, after the
  // operations called so far completed. The (color, key) of every rank is first exchanged under
  // the deadline, so a lost rank is named here rather than waited for.
  [[nodiscard]] mpi split(int color, int key) {
    TIDE_REQUIRE(color >= 0, "comm::mpi split: color ", color, " must be >= 0 (key ", key, ")");
    std::vector<std::int32_t> mine{color, key}, all(2 * static_cast<std::size_t>(size()));
    all_gather(std::span<std::int32_t const>(mine), std::span<std::int32_t>(all));
    MPI_Comm part = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(state_->comm, color, key, &part), "MPI_Comm_split");
    mpi out(part, state_->opts);
    MPI_Comm_free(&part);
    return out;
  }

  // Runs the operations, on the lane.
  struct state {
    comm_options opts;
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm roll = MPI_COMM_NULL;  // the roll call after a deadline: nothing else travels here
    int rank = 0;
    int size = 1;
    std::vector<int> counts, displs;  // all_gatherv, as MPI wants them
    std::vector<long long> heard;     // the roll call's answers (alive after a failure: MPI may write them late)
    long long said = 0;
    detail::lane<state> ops{this};    // last: destroyed first, after its operations ran

    state(MPI_Comm parent, comm_options const& o) : opts(o) {
      detail::mpi_check(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
      detail::mpi_check(MPI_Comm_dup(parent, &roll), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(roll, MPI_ERRORS_RETURN);
      detail::mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
      detail::mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
      counts.resize(static_cast<std::size_t>(size));
      displs.resize(static_cast<std::size_t>(size));
      heard.assign(static_cast<std::size_t>(size), -1);
    }
    state(state const&) = delete;
    state& operator=(state const&) = delete;
    ~state() {
      try {
        ops.stream().synchronize();  // nothing of ours may still use the communicators
      } catch (...) {                // a failure was reported to whoever waited
      }
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized != 0 || detail::mpi_broken()) return;
      MPI_Comm_free(&comm);
      MPI_Comm_free(&roll);
    }

    void execute(detail::operation const& o) {
      MPI_Request req = MPI_REQUEST_NULL;
      MPI_Datatype const dt = detail::datatype_of(o.type);
      auto const n = static_cast<int>(o.n);
      auto const m = static_cast<int>(o.out_n);
      int rc = MPI_SUCCESS;
      switch (o.kind) {
        case detail::op_kind::all_reduce: {
          // Above twice the segment, in segments: Open MPI's shared-memory path runs a large
          // all-reduce at well under what it reaches on a few MiB (bench_comm's sweep on 2 ranks
          // of this project's machine: 1.9 GB/s at 512 MiB, 4.7 at 16 MiB), and a 25 MiB bucket
          // ran slower cut into 4 MiB segments than whole.
          std::size_t const elem = detail::bytes_of_elem(o.type);
          std::size_t const bytes = static_cast<std::size_t>(m) * elem;
          auto const per = bytes > 2 * all_reduce_segment ? static_cast<int>(all_reduce_segment / elem) : std::max(m, 1);
          for (int at = 0; at < m; at += per) {
            MPI_Request part = MPI_REQUEST_NULL;
            rc = MPI_Iallreduce(MPI_IN_PLACE, static_cast<std::byte*>(o.out) + static_cast<std::size_t>(at) * elem,
                                std::min(per, m - at), dt, detail::op_of(o.type, o.op), comm, &part);
            if (rc != MPI_SUCCESS) detail::mpi_check(rc, detail::describe(o));
            if (at + per >= m) {
              req = part;  // the last: completed below, as every other operation
              break;
            }
            complete(part, o);
          }
          break;
        }
        case detail::op_kind::reduce_scatter:
          rc = MPI_Ireduce_scatter_block(o.in, o.out, m, dt, detail::op_of(o.type, o.op), comm, &req);
          break;
        case detail::op_kind::all_gather: rc = MPI_Iallgather(o.in, n, dt, o.out, n, dt, comm, &req); break;
        case detail::op_kind::all_gatherv: {
          int at = 0;
          for (int r = 0; r < size; ++r) {
            counts[static_cast<std::size_t>(r)] = static_cast<int>(o.counts[r]);
            displs[static_cast<std::size_t>(r)] = at;
            at += counts[static_cast<std::size_t>(r)];
          }
          rc = MPI_Iallgatherv(o.in, n, dt, o.out, counts.data(), displs.data(), dt, comm, &req);
          break;
        }
        case detail::op_kind::broadcast: rc = MPI_Ibcast(o.out, m, dt, o.peer, comm, &req); break;
        case detail::op_kind::reduce:
          rc = MPI_Ireduce(rank == o.peer ? MPI_IN_PLACE : o.in, rank == o.peer ? o.out : nullptr, n, dt,
                           detail::op_of(o.type, o.op), o.peer, comm, &req);
          break;
        case detail::op_kind::send: rc = MPI_Isend(o.in, n, dt, o.peer, o.tag, comm, &req); break;
        case detail::op_kind::recv: rc = MPI_Irecv(o.out, m, dt, o.peer, o.tag, comm, &req); break;
        case detail::op_kind::barrier: rc = MPI_Ibarrier(comm, &req); break;
      }
      if (rc != MPI_SUCCESS) detail::mpi_check(rc, detail::describe(o));
      complete(req, o);
    }

    // Polls req until it completes or the deadline passes: yielding between polls for the first
    // `spin` (or as long as the operation's bytes take at 1 GB/s, if longer: a large message
    // moves a fragment per poll, and sleeping made 25 MiB buckets 5-9 % slower than blocking
    // calls), then sleeping, the pause doubling up to max_pause. Open MPI moves a message only
    // while its ranks poll, and a protocol round trip costs a pause on each side: sleeping from
    // the start (up to 1 ms) made a 256 KiB MPI_Ireduce on 2 ranks take 33 ms, against 0.1 ms in
    // MPI_Wait. Spinning costs little: yield gives the core to any thread that has work.
    static constexpr auto spin = std::chrono::milliseconds(2);
    static constexpr std::size_t all_reduce_segment = std::size_t{16} << 20;  // bytes
    static constexpr auto max_pause = std::chrono::microseconds(1000);
    void complete(MPI_Request& req, detail::operation const& o) {
      using clock = std::chrono::steady_clock;
      auto const until = clock::now() + opts.deadline;
      std::size_t const bytes = static_cast<std::size_t>(std::max(o.n, o.out_n)) * detail::bytes_of_elem(o.type);
      auto const spin_until = clock::now() + std::max<std::chrono::nanoseconds>(spin, std::chrono::nanoseconds(bytes));
      auto pause = std::chrono::microseconds(1);
      for (;;) {
        int done = 0;
        MPI_Status status;
        int const rc = MPI_Test(&req, &done, &status);
        if (rc != MPI_SUCCESS) detail::mpi_check(rc, detail::describe(o));
        if (done != 0) {
          if (o.kind == detail::op_kind::recv) check_received(status, o);
          return;
        }
        if (clock::now() >= until) lost(o);
        if (detail::peer_loss_of_process().lost.load(std::memory_order_acquire)) peer_lost(o);
        if (clock::now() < spin_until) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, max_pause);
        }
      }
    }
    void check_received(MPI_Status const& status, detail::operation const& o) const {
      int got = 0;
      MPI_Get_count(&status, detail::datatype_of(o.type), &got);
      TIDE_CHECK(got == static_cast<int>(o.out_n), mpi, "comm::mpi: ", detail::describe(o), " received ", got,
                 " elements; the matching send must send as many as this receive takes");
    }

    // comm::heartbeat found a rank silent: its message first, then what gave up.
    [[noreturn]] void peer_lost(detail::operation const& o) {
      detail::peer_loss& p = detail::peer_loss_of_process();
      std::string text;
      {
        std::lock_guard lock(p.mutex);
        text = p.text;
      }
      TIDE_FAIL(mpi, text, " [comm::mpi: ", detail::describe(o), " on rank ", rank, " of ", size, " gave up waiting]");
    }

    // The deadline passed: who still answers? Then throw, naming them.
    [[noreturn]] void lost(detail::operation const& o) {
      detail::mpi_broken() = true;
      using clock = std::chrono::steady_clock;
      auto const grace = std::clamp<std::chrono::milliseconds>(opts.deadline / 2, std::chrono::milliseconds(200),
                                                               std::chrono::milliseconds(5000));
      said = static_cast<long long>(o.seq);
      std::vector<MPI_Request> asks, answers;
      std::vector<int> from;
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        MPI_Request q = MPI_REQUEST_NULL;
        if (MPI_Irecv(&heard[static_cast<std::size_t>(r)], 1, MPI_LONG_LONG, r, 0, roll, &q) == MPI_SUCCESS) {
          answers.push_back(q);
          from.push_back(r);
        }
        if (MPI_Isend(&said, 1, MPI_LONG_LONG, r, 0, roll, &q) == MPI_SUCCESS) asks.push_back(q);
      }
      std::vector<bool> answered(answers.size(), false);
      auto const until = clock::now() + grace;
      std::size_t count = 0;
      while (count < answers.size() && clock::now() < until) {
        for (std::size_t k = 0; k < answers.size(); ++k) {
          if (answered[k]) continue;
          int done = 0;
          if (MPI_Test(&answers[k], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done != 0) {
            answered[k] = true;
            ++count;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::string silent;
      for (std::size_t k = 0; k < answers.size(); ++k)
        if (!answered[k]) silent += tide::detail::concat(silent.empty() ? "" : ", ", from[k]);
      std::string const who = silent.empty()
                                  ? std::string("none: every rank answered a roll call, so they are alive but did not "
                                                "join this operation (called in another order, or much later, on some "
                                                "rank?)")
                                  : tide::detail::concat(silent.find(',') == std::string::npos ? "rank " : "ranks ", silent,
                                                         " (died, stopped or hangs)");
      TIDE_FAIL(mpi, "comm::mpi: ", detail::describe(o), " on rank ", rank, " of ", size,
                " did not complete within its deadline of ", opts.deadline.count(), " ms; not heard from: ", who,
                ". The communicator is broken; end the job and restart from the last checkpoint");
    }
  };
  detail::lane<state>& ops() noexcept { return state_->ops; }

 private:
  std::unique_ptr<state> state_;
};

static_assert(Communicator<mpi>);

// The ranks on this rank's node (MPI_COMM_TYPE_SHARED), for comm::hierarchical. Collective. Every
// node must have as many, and mpiexec's default mapping places consecutive ranks on a node.
inline int node_size(mpi& world) {
  MPI_Comm node = MPI_COMM_NULL;
  detail::mpi_check(MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node),
                    "MPI_Comm_split_type");
  int n = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  std::vector<std::int32_t> lo{n}, hi{n};
  world.all_reduce(std::span<std::int32_t>(lo), reduce_op::min);
  world.all_reduce(std::span<std::int32_t>(hi), reduce_op::max);
  TIDE_CHECK(lo[0] == hi[0], usage, "comm::node_size: nodes hold ", lo[0], " to ", hi[0], " ranks; hierarchical "
             "reduction needs as many ranks on every node");
  return n;
}

}  // namespace tide::comm
