#pragma once
// What comm::self and comm::mpi share: an operation as plain data, and the lane that runs a
// communicator's operations in call order on its own stream (the progress thread), with a fixed
// ring of slots so that an operation allocates nothing.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "tide/comm/communicator.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/stream.hpp"

namespace tide::comm::detail {

enum class op_kind : std::uint8_t { all_reduce, reduce_scatter, all_gather, all_gatherv, broadcast, send, recv, barrier, reduce };
enum class elem : std::uint8_t { f32, f64, i32, i64, u8, bf16, f16 };

template <Transferable T>
inline constexpr elem elem_of = std::is_same_v<T, float>          ? elem::f32
                                : std::is_same_v<T, double>       ? elem::f64
                                : std::is_same_v<T, std::int32_t> ? elem::i32
                                : std::is_same_v<T, std::int64_t> ? elem::i64
                                : std::is_same_v<T, std::uint8_t> ? elem::u8
                                : std::is_same_v<T, bf16>         ? elem::bf16
                                                                  : elem::f16;

constexpr std::size_t bytes_of_elem(elem e) noexcept {
  switch (e) {
    case elem::f64:
    case elem::i64: return 8;
    case elem::f32:
    case elem::i32: return 4;
    case elem::u8: return 1;
    default: return 2;
  }
}
constexpr std::string_view to_string(elem e) noexcept {
  constexpr std::string_view names[] = {"f32", "f64", "i32", "i64", "u8", "bf16", "f16"};
  return names[static_cast<int>(e)];
}
constexpr std::string_view to_string(op_kind k) noexcept {
  constexpr std::string_view names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_gatherv", "broadcast",
                                        "send",       "recv",           "barrier",    "reduce"};
  return names[static_cast<int>(k)];
}

// One operation. `in` / `n`: what this rank contributes; `out` / `out_n`: what it receives.
struct operation {
  op_kind kind = op_kind::barrier;
  elem type = elem::u8;
  reduce_op op = reduce_op::sum;
  void const* in = nullptr;
  void* out = nullptr;
  index_t n = 0;
  index_t out_n = 0;
  index_t const* counts = nullptr;  // all_gatherv: one per rank
  int peer = 0;                     // broadcast: the root; send / recv: the other rank
  int tag = 0;
  std::uint64_t seq = 0;            // the communicator's count of operations, from 1
};

// "all_reduce #12 (1.00 MiB of f32, sum)": for errors.
inline std::string describe(operation const& o) {
  std::string what = tide::detail::concat(to_string(o.kind), " #", o.seq);
  if (o.kind == op_kind::barrier) return what;
  index_t const elems = o.kind == op_kind::recv || o.kind == op_kind::broadcast ? o.out_n : o.n;
  what += tide::detail::concat(" (", bytes_of{static_cast<std::size_t>(elems) * bytes_of_elem(o.type)}, " of ",
                               to_string(o.type));
  if (o.kind == op_kind::all_reduce || o.kind == op_kind::reduce_scatter || o.kind == op_kind::reduce)
    what += tide::detail::concat(", ", to_string(o.op));
  if (o.kind == op_kind::broadcast || o.kind == op_kind::reduce) what += tide::detail::concat(", root ", o.peer);
  if (o.kind == op_kind::send) what += tide::detail::concat(" to rank ", o.peer, ", tag ", o.tag);
  if (o.kind == op_kind::recv) what += tide::detail::concat(" from rank ", o.peer, ", tag ", o.tag);
  return what + ")";
}

// A request: which slot of the lane, and which use of it.
struct lane_request {
  std::uint32_t slot = 0;
  std::uint64_t seq = 0;  // 0: nothing to wait for
};

// Runs Exec::execute(operation const&) for each submitted operation, in order, on its own stream.
// Exec must outlive the lane and stay at one address (communicators keep it behind a pointer).
template <class Exec>
class lane {
 public:
  static constexpr std::uint32_t slots = 64;  // operations in flight before submit waits for the oldest

  explicit lane(Exec* exec) : exec_(exec) {}
  lane(lane const&) = delete;
  lane& operator=(lane const&) = delete;

  lane_request submit(operation o) {
    auto const index = static_cast<std::uint32_t>(count_ % slots);
    slot& s = slots_[index];
    finish(s);  // the slot's previous operation (rethrows a failure)
    o.seq = ++count_;
    s.op = o;
    s.owner = this;
    memory::launch(stream_, s);
    s.done.record(stream_);
    return {index, o.seq};
  }
  // Blocks until r completed; rethrows the lane's failure (a lost rank, an MPI error).
  void wait(lane_request const& r) {
    if (r.seq == 0) return;
    finish(slots_[r.slot]);  // a reused slot's event is later still: also complete then
  }
  bool test(lane_request const& r) {
    if (r.seq == 0) return true;
    if (!slots_[r.slot].done.query()) return false;
    wait(r);  // complete: report a failure
    return true;
  }
  memory::stream<host>& stream() noexcept { return stream_; }
  [[nodiscard]] std::uint64_t operations() const noexcept { return count_; }

 private:
  struct slot {
    operation op{};
    lane* owner = nullptr;
    memory::event<host> done;
    void operator()() const {
      try {
        owner->exec_->execute(op);
      } catch (tide::error const& e) {
        owner->remember(e);
        throw;  // the stream skips what was queued after it
      }
    }
  };
  // The first failure, as it was thrown: every later wait rethrows it (the stream's own report
  // would wrap it in words about streams).
  void remember(tide::error const& e) {
    std::lock_guard lock(failure_mutex_);
    if (!first_failure_) first_failure_.emplace(e);
  }
  void finish(slot& s) {
    try {
      s.done.synchronize();
    } catch (tide::error const&) {
      std::unique_lock lock(failure_mutex_);
      if (first_failure_) {
        tide::error const e = *first_failure_;
        lock.unlock();
        throw e;
      }
      throw;
    }
  }

  Exec* exec_;
  std::mutex failure_mutex_;
  std::optional<tide::error> first_failure_;
  std::array<slot, slots> slots_{};
  std::uint64_t count_ = 0;
  memory::stream<host> stream_;  // last: destroyed first, it drains while the slots still exist
};

// The typed face every communicator shares (CRTP, resolved at compile time): it turns each call
// into an operation, checks its sizes and submits it to the derived communicator's lane. D has
// rank(), size() and ops() (its lane<...>).
template <class D>
class front {
 public:
  using request = lane_request;

  template <Transferable T>
  request all_reduce_async(std::span<T> data, reduce_op op) {
    return submit({op_kind::all_reduce, elem_of<T>, op, data.data(), data.data(), len(data), len(data)});
  }
  template <Transferable T>
  request reduce_scatter_async(std::span<T const> in, std::span<T> out, reduce_op op) {
    TIDE_REQUIRE(len(in) == len(out) * self().size(), "comm ", D::name, " reduce_scatter: the input holds ", in.size(),
                 " elements; it must hold size() x the output's ", out.size(), " = ", len(out) * self().size());
    return submit({op_kind::reduce_scatter, elem_of<T>, op, in.data(), out.data(), len(in), len(out)});
  }
  template <Transferable T>
  request all_gather_async(std::span<T const> in, std::span<T> out) {
    TIDE_REQUIRE(len(out) == len(in) * self().size(), "comm ", D::name, " all_gather: the output holds ", out.size(),
                 " elements; it must hold size() x the input's ", in.size(), " = ", len(in) * self().size());
    return submit({op_kind::all_gather, elem_of<T>, reduce_op::sum, in.data(), out.data(), len(in), len(out)});
  }
  template <Transferable T>
  request all_gatherv_async(std::span<T const> in, std::span<T> out, std::span<index_t const> counts) {
    auto const size = static_cast<std::size_t>(self().size());
    TIDE_REQUIRE(counts.size() == size, "comm ", D::name, " all_gatherv: counts holds ", counts.size(),
                 " entries; it must hold one per rank (", size, ")");
    TIDE_REQUIRE(counts[static_cast<std::size_t>(self().rank())] == len(in), "comm ", D::name, " all_gatherv: counts[",
                 self().rank(), "] = ", counts[static_cast<std::size_t>(self().rank())],
                 " but this rank's input holds ", in.size(), " elements");
    index_t total = 0;
    for (index_t c : counts) {
      TIDE_REQUIRE(c >= 0, "comm ", D::name, " all_gatherv: a count is negative (", c, ")");
      total += c;
    }
    TIDE_REQUIRE(len(out) == total, "comm ", D::name, " all_gatherv: the output holds ", out.size(),
                 " elements; it must hold the sum of counts, ", total);
    return submit({op_kind::all_gatherv, elem_of<T>, reduce_op::sum, in.data(), out.data(), len(in), len(out),
                   counts.data()});
  }
  template <Transferable T>
  request broadcast_async(std::span<T> data, int root) {
    check_rank(root, "broadcast root");
    return submit({op_kind::broadcast, elem_of<T>, reduce_op::sum, data.data(), data.data(), len(data), len(data),
                   nullptr, root});
  }
  // The reduction over the ranks lands in `root`'s data (in place); the others' data is unchanged.
  template <Transferable T>
  request reduce_async(std::span<T> data, int root, reduce_op op) {
    check_rank(root, "reduce root");
    return submit({op_kind::reduce, elem_of<T>, op, data.data(), data.data(), len(data), len(data), nullptr, root});
  }
  template <Transferable T>
  request send_async(std::span<T const> data, int to, int tag) {
    check_rank(to, "send destination");
    return submit({op_kind::send, elem_of<T>, reduce_op::sum, data.data(), nullptr, len(data), 0, nullptr, to, tag});
  }
  template <Transferable T>
  request recv_async(std::span<T> data, int from, int tag) {
    check_rank(from, "recv source");
    return submit({op_kind::recv, elem_of<T>, reduce_op::sum, nullptr, data.data(), 0, len(data), nullptr, from, tag});
  }
  request barrier_async() { return submit({}); }

  template <Transferable T>
  void all_reduce(std::span<T> data, reduce_op op) {
    wait(all_reduce_async(data, op));
  }
  template <Transferable T>
  void reduce_scatter(std::span<T const> in, std::span<T> out, reduce_op op) {
    wait(reduce_scatter_async(in, out, op));
  }
  template <Transferable T>
  void all_gather(std::span<T const> in, std::span<T> out) {
    wait(all_gather_async(in, out));
  }
  template <Transferable T>
  void all_gatherv(std::span<T const> in, std::span<T> out, std::span<index_t const> counts) {
    wait(all_gatherv_async(in, out, counts));
  }
  template <Transferable T>
  void broadcast(std::span<T> data, int root) {
    wait(broadcast_async(data, root));
  }
  template <Transferable T>
  void reduce(std::span<T> data, int root, reduce_op op) {
    wait(reduce_async(data, root, op));
  }
  template <Transferable T>
  void send(std::span<T const> data, int to, int tag) {
    wait(send_async(data, to, tag));
  }
  template <Transferable T>
  void recv(std::span<T> data, int from, int tag) {
    wait(recv_async(data, from, tag));
  }
  void barrier() { wait(barrier_async()); }

  // Blocks until r completed (within the deadline); rethrows the communicator's failure.
  void wait(request const& r) { self().ops().wait(r); }
  // True once r completed; rethrows a failure then.
  bool test(request const& r) { return self().ops().test(r); }
  // The stream the operations run on, in call order: record an event here to learn when the
  // operations called so far completed; lane().wait(e) delays the ones called after it.
  memory::stream<host>& lane() { return self().ops().stream(); }
  // Operations called so far.
  [[nodiscard]] std::uint64_t operations() { return self().ops().operations(); }

 private:
  D& self() { return static_cast<D&>(*this); }
  template <class T>
  static index_t len(std::span<T> s) noexcept {
    return static_cast<index_t>(s.size());
  }
  void check_rank(int r, char const* what) {
    TIDE_REQUIRE(r >= 0 && r < self().size(), "comm ", D::name, ": ", what, " ", r, " is not a rank of this "
                 "communicator (0 to ", self().size() - 1, ")");
  }
  request submit(operation const& o) {
    constexpr index_t most = 2147483647;  // MPI and NCCL counts are int
    TIDE_REQUIRE(o.n <= most && o.out_n <= most, "comm ", D::name, " ", to_string(o.kind), ": ", o.n > o.out_n ? o.n : o.out_n,
                 " elements in one operation; counts are int: split it into parts of at most 2^31 - 1");
    return self().ops().submit(o);
  }
};

}  // namespace tide::comm::detail
