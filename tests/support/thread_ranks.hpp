#pragma once
// Ranks as threads of one process, for the device-memory data parallelism on tide::sealed
// (comm/device_data_parallel.hpp). thread_rank is a DeviceCollective, as comm::nccl is one on
// CUDA: its operations run on its lane, a stream of tide::sealed, each meeting the other ranks'
// same operation there and reading their device memory through unseal. It is also the host
// Reducer of the trainer's agreements, over a rendezvous of its own (as MPI beside NCCL).
//
//   tide::test::thread_world world{2};
//   run_ranks(world, [&](int rank) {                             // one thread per rank
//     tide::test::thread_rank r{world, rank};
//     auto t = make_trainer(spec, offload, opt, tide::comm::device_data_parallel<thread_rank, thread_rank>{&r, &r});
//     ...
//   });
//
// Sums run in rank order, so every rank gets the same bits. reduce leaves NaN in the non-roots'
// floating-point buffers (NCCL leaves them undefined), so code that reads them shows it. abort(),
// an operation past the deadline or the failure injected by fail_at fails the device rendezvous
// for every rank: their waiting operations throw tide::error(nccl), and so does every later one.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/stream.hpp"

namespace tide::test {

// One collective round after another among `size` threads: each posts its buffer; once all have,
// each reads what it needs; once all have read, each writes its own buffer. A barrier that waits
// past the deadline, or an abort, fails the rendezvous for good.
class rendezvous {
 public:
  rendezvous(int size, std::chrono::milliseconds deadline) : size_(size), deadline_(deadline), posted_(size) {}

  template <class Read, class Write>
  void round(int rank, void const* mine, Read&& read, Write&& write) {
    std::unique_lock lock(m_);
    posted_[static_cast<std::size_t>(rank)] = mine;
    barrier(lock);
    std::vector<void const*> const all = posted_;
    ++readers_;  // a rank that fails from here waits for the readers before its buffer may go
    lock.unlock();
    try {
      read(all);
    } catch (...) {
      lock.lock();
      --readers_;
      fail("thread_rank: a rank failed reading the others' buffers");
      cv_.notify_all();
      throw;
    }
    lock.lock();
    --readers_;
    cv_.notify_all();
    barrier(lock);
    lock.unlock();
    write();
  }
  void abort(std::string const& why) {
    {
      std::lock_guard lock(m_);
      fail(why);
    }
    cv_.notify_all();
  }
  [[nodiscard]] bool failed() const {
    std::lock_guard lock(m_);
    return failed_;
  }

 private:
  void fail(std::string const& why) {
    if (failed_) return;
    failed_ = true;
    why_ = why;
  }
  // Throws the rendezvous' failure once no rank reads another's buffer (this one may go then).
  [[noreturn]] void thrown(std::unique_lock<std::mutex>& lock) {
    cv_.wait(lock, [&] { return readers_ == 0; });
    TIDE_FAIL(nccl, why_);
  }
  void barrier(std::unique_lock<std::mutex>& lock) {
    if (failed_) thrown(lock);
    std::uint64_t const generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, deadline_, [&] { return generation_ != generation || failed_; })) {
      fail("thread_rank: a collective did not complete within its deadline");
      cv_.notify_all();
    }
    if (generation_ == generation) thrown(lock);
  }

  int const size_;
  std::chrono::milliseconds const deadline_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<void const*> posted_;
  int arrived_ = 0;
  int readers_ = 0;  // ranks between the two barriers of a round, reading
  std::uint64_t generation_ = 0;
  bool failed_ = false;
  std::string why_;
};

// What the ranks share: the device rendezvous, the host one, and the failure to inject.
struct thread_world {
  explicit thread_world(int ranks, std::chrono::milliseconds deadline = std::chrono::seconds(60))
      : size(ranks), device(ranks, deadline), host(ranks, deadline) {}
  int size;
  rendezvous device;
  rendezvous host;
  int fail_rank = -1;   // the rank whose fail_at-th device operation (1-based) fails, -1: none
  int fail_at = 0;      // in the collective: every rank's waiting operations fail
  int local_rank = -1;  // the rank whose local_at-th device operation fails on its own, as it is
  int local_at = 0;     // enqueued (a launch that fails): the others hear of it only if it aborts
};

class thread_rank {
 public:
  using backend = sealed;
  static constexpr std::string_view name = "thread_rank";
  struct request {
    std::uint64_t seq = 0;  // 0: nothing to wait for
  };

  thread_rank(thread_world& world, int rank) : world_(&world), rank_(rank) {}
  thread_rank(thread_rank const&) = delete;
  thread_rank& operator=(thread_rank const&) = delete;
  // Left by an exception: the other ranks are told before this lane drains into a round they may
  // never join.
  ~thread_rank() {
    if (std::uncaught_exceptions() > unwinding_) {
      world_->device.abort("thread_rank: another rank's thread failed");
      world_->host.abort("thread_rank: another rank's thread failed");
    }
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return world_->size; }
  [[nodiscard]] memory::stream<sealed>& lane() noexcept { return lane_; }
  [[nodiscard]] std::uint64_t operations() const noexcept { return ops_; }

  // ---- device memory, on the lane -------------------------------------------------------------
  template <class T>
  request all_reduce_async(std::span<T> data, comm::reduce_op op) {
    return enqueue([this, data, op] { all_reduce_on(world_->device, unsealed(data), op); });
  }
  template <class T>
  request reduce_async(std::span<T> data, int root, comm::reduce_op op) {
    return enqueue([this, data, root, op] {
      std::span<T> const mine = unsealed(data);
      std::vector<T> sum;
      world_->device.round(
          rank_, mine.data(), [&](auto const& all) { if (rank_ == root) sum = fold<T>(all, mine.size(), op); },
          [&] {
            if (rank_ == root) std::memcpy(mine.data(), sum.data(), mine.size_bytes());
            else poison(mine);
          });
    });
  }
  template <class T>
  request all_gather_async(std::span<T const> in, std::span<T> out) {
    TIDE_REQUIRE(out.size() == in.size() * static_cast<std::size_t>(size()), "thread_rank all_gather: ", in.size(),
                 " in, ", out.size(), " out");
    return enqueue([this, in, out] {
      std::span<T const> const mine = unsealed(in);
      std::span<T> const to = unsealed(out);
      std::vector<T> all(to.size());
      world_->device.round(
          rank_, mine.data(),
          [&](auto const& posted) {
            for (std::size_t k = 0; k < posted.size(); ++k)
              std::memcpy(all.data() + k * mine.size(), posted[k], mine.size_bytes());
          },
          [&] { std::memcpy(to.data(), all.data(), to.size_bytes()); });
    });
  }
  template <class T>
  request broadcast_async(std::span<T> data, int root) {
    return enqueue([this, data, root] {
      std::span<T> const mine = unsealed(data);
      std::vector<T> got;
      world_->device.round(
          rank_, mine.data(),
          [&](auto const& all) {
            auto const* from = static_cast<T const*>(all[static_cast<std::size_t>(root)]);
            if (rank_ != root) got.assign(from, from + mine.size());
          },
          [&] {
            if (rank_ != root) std::memcpy(mine.data(), got.data(), mine.size_bytes());
          });
    });
  }
  // Until the operation ran; throws what failed it (or any earlier one).
  void wait(request const& r) {
    if (r.seq == 0) return;
    events_.at(r.seq - 1).synchronize();
    rethrow();
  }
  void abort(char const* why) noexcept {
    try {
      world_->device.abort(why);
    } catch (...) {
    }
  }

  // ---- host memory, blocking: the trainer's agreements ----------------------------------------
  template <class T>
  void all_reduce(std::span<T> data, comm::reduce_op op) {
    all_reduce_on(world_->host, data, op);
  }

 private:
  template <class T>
  static std::span<T> unsealed(std::span<T> s) {
    return {unseal(s.data()), s.size()};
  }
  template <class T>
  static T combine(T a, T b, comm::reduce_op op) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {  // in fp32, rounded back, as NCCL does
      return T(combine(static_cast<float>(a), static_cast<float>(b), op));
    } else {
      switch (op) {
        case comm::reduce_op::sum: return static_cast<T>(a + b);
        case comm::reduce_op::max: return a < b ? b : a;
        default: return b < a ? b : a;
      }
    }
  }
  // Element by element over the ranks, in rank order.
  template <class T>
  static std::vector<T> fold(std::vector<void const*> const& all, std::size_t n, comm::reduce_op op) {
    auto const* first = static_cast<T const*>(all[0]);
    std::vector<T> out(first, first + n);
    for (std::size_t k = 1; k < all.size(); ++k) {
      auto const* x = static_cast<T const*>(all[k]);
      for (std::size_t i = 0; i < n; ++i) out[i] = combine(out[i], x[i], op);
    }
    return out;
  }
  template <class T>
  static void poison(std::span<T> s) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      for (T& x : s) x = T(std::numeric_limits<float>::quiet_NaN());
    else if constexpr (std::is_floating_point_v<T>)
      for (T& x : s) x = std::numeric_limits<T>::quiet_NaN();
  }
  template <class T>
  void all_reduce_on(rendezvous& where, std::span<T> mine, comm::reduce_op op) {
    std::vector<T> out;
    where.round(rank_, mine.data(), [&](auto const& all) { out = fold<T>(all, mine.size(), op); },
                [&] { std::memcpy(mine.data(), out.data(), mine.size_bytes()); });
  }
  template <class F>
  request enqueue(F run) {
    std::uint64_t const seq = ops_ + 1;  // counted once enqueued: operation n is events_[n - 1]
    if (world_->local_rank == rank_ && world_->local_at == static_cast<int>(seq))
      TIDE_FAIL(nccl, "thread_rank: the local failure injected by local_at (nothing enqueued)");
    bool const injected = world_->fail_rank == rank_ && world_->fail_at == static_cast<int>(seq);
    lane_.launch_owned([this, run = std::move(run), injected] {
      try {
        if (injected) TIDE_FAIL(nccl, "thread_rank: the failure injected by fail_at");
        run();
      } catch (...) {  // every rank's round fails with it, and this lane's later operations
        std::string const why = failure_text();
        world_->device.abort(why);
        std::lock_guard lock(m_);
        if (failure_.empty()) failure_ = why;
        throw;
      }
    });
    events_.emplace_back().record(lane_);
    ops_ = seq;
    return {seq};
  }
  // The exception in flight, as text.
  static std::string failure_text() {
    try {
      throw;
    } catch (tide::error const& e) {
      return e.message();
    } catch (std::exception const& e) {
      return e.what();
    } catch (...) {
      return "thread_rank: an operation threw";
    }
  }
  void rethrow() {
    std::lock_guard lock(m_);
    if (!failure_.empty()) TIDE_FAIL(nccl, failure_);
  }

  thread_world* world_;
  int rank_;
  int unwinding_ = std::uncaught_exceptions();
  std::uint64_t ops_ = 0;
  std::deque<memory::event<sealed>> events_;  // by operation: recorded behind it
  std::mutex m_;
  std::string failure_;  // the first operation of this rank that failed
  memory::stream<sealed> lane_;  // last: destroyed (drained) first
};

// f(rank) on one thread per rank of `world`, joined; the first rank's exception (by rank) rethrown.
template <class F>
void run_ranks(thread_world& world, F&& f) {
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(world.size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
        world.device.abort("thread_rank: another rank's thread failed");
        world.host.abort("thread_rank: another rank's thread failed");
      }
    });
  for (auto& t : threads) t.join();
  for (auto const& e : failures)
    if (e) std::rethrow_exception(e);
}

}  // namespace tide::test
