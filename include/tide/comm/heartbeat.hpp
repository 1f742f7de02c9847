#pragma once
// comm::heartbeat: a stopped or dead rank noticed in seconds, told apart from a slow collective.
// Needs tide::mpi and MPI_THREAD_MULTIPLE, as comm::mpi does.
//
//   tide::comm::mpi world{session, {.deadline = 30min}};         // a slow operation is no failure
//   tide::comm::heartbeat beat{world, {.timeout = 10s}};          // collective
//   for (...) {
//     beat.at_step(step);                                         // what the others report
//     ...
//     beat.set_note("the last checkpoint is run-003 (step 200); resume it with --resume run-003");
//   }
//
// Each rank runs a thread on a communicator of its own (a duplicate of the world's, so nothing
// else travels there) that sends its step to every other rank each `period` and listens for
// theirs, the way PyTorch's NCCL watchdog and torchrun's agent keep a side channel. The thread
// runs whatever the rank's main thread does, so a long but live operation (a slow checkpoint
// write, a long step) keeps beating; a rank that is stopped (SIGSTOP), hangs in the kernel or
// died falls silent. When a rank has not been heard from for `timeout`, every other rank's
// heartbeat marks comm::mpi broken with a message for people:
//
//   rank 1 (node7, pid 4242) stopped answering at step 257: no heartbeat for 10.0 s. <note>
//
// and every wait of a comm::mpi on this process (a collective, a send, a receive) throws
// tide::error(errc::mpi) with it at its next poll, rather than at its deadline. The caller prints
// it and exits non-zero; mpiexec then ends the job, the stopped rank too. lost() and report()
// say it to a caller that is not waiting on a collective.
//
// A rank that ends its heartbeat (its destructor) says goodbye first, so a peer that finishes
// later does not take it for lost.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tide/comm/mpi.hpp"

namespace tide::comm {

struct heartbeat_options {
  // Silence after which a rank counts as lost. Longer than any pause of a live process: a swap
  // storm, a debugger's breakpoint. 10 s by default.
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  // Between two beats; 0: a tenth of the timeout, at least 20 ms.
  std::chrono::milliseconds period{0};
};

class heartbeat {
 public:
  heartbeat(mpi& world, heartbeat_options const& o = {}) : opts_(o), rank_(world.rank()), size_(world.size()) {
    TIDE_REQUIRE(o.timeout.count() > 0, "heartbeat: timeout must be positive, got ", o.timeout.count(), " ms");
    if (opts_.period.count() <= 0) opts_.period = std::max(opts_.timeout / 10, std::chrono::milliseconds(20));
    TIDE_REQUIRE(opts_.period < opts_.timeout, "heartbeat: period ", opts_.period.count(),
                 " ms must be shorter than timeout ", opts_.timeout.count(), " ms");
    // Who each rank is: its host and pid, for the message.
    std::vector<std::uint8_t> mine(id_bytes, 0), all(id_bytes * static_cast<std::size_t>(size_));
    auto const pid = static_cast<std::int64_t>(::getpid());
    std::memcpy(mine.data(), &pid, sizeof pid);
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    if (MPI_Get_processor_name(host, &length) != MPI_SUCCESS) length = 0;
    std::memcpy(mine.data() + sizeof pid, host, std::min<std::size_t>(static_cast<std::size_t>(length), id_bytes - sizeof pid - 1));
    world.all_gather(std::span<std::uint8_t const>(mine), std::span<std::uint8_t>(all));
    for (int r = 0; r < size_; ++r) {
      std::uint8_t const* at = all.data() + id_bytes * static_cast<std::size_t>(r);
      std::int64_t p = 0;
      std::memcpy(&p, at, sizeof p);
      who_.push_back(tide::detail::concat(reinterpret_cast<char const*>(at + sizeof p), ", pid ", p));
    }
    detail::mpi_check(MPI_Comm_dup(world.native(), &comm_), "MPI_Comm_dup (heartbeat)");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    if (size_ > 1) thread_ = std::thread([this] { run(); });
  }
  heartbeat(heartbeat const&) = delete;
  heartbeat& operator=(heartbeat const&) = delete;
  ~heartbeat() {
    stop_ = true;
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0 && !detail::mpi_broken()) MPI_Comm_free(&comm_);
  }

  // The step this rank reports (the others name it if this rank falls silent); sent at once.
  void at_step(std::int64_t step) noexcept {
    step_.store(step, std::memory_order_relaxed);
    wake_.notify_one();
  }
  // Appended to the message when a rank is lost: what to do (where the last checkpoint is).
  void set_note(std::string note) {
    std::lock_guard lock(mutex_);
    note_ = std::move(note);
  }
  // Whether a rank was lost, and the message that says which (empty while none).
  [[nodiscard]] bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string report() const {
    std::lock_guard lock(mutex_);
    return report_;
  }
  [[nodiscard]] heartbeat_options const& options() const noexcept { return opts_; }

 private:
  static constexpr std::size_t id_bytes = 72;  // pid, then the host name (NUL-terminated, cut to fit)
  static constexpr std::int64_t goodbye = -1;  // the last beat of a rank that ends its heartbeat

  void run() {
    using clock = std::chrono::steady_clock;
    auto const n = static_cast<std::size_t>(size_);
    std::vector<std::int64_t> inbox(n, 0), outbox(n, 0), heard_step(n, 0);
    std::vector<MPI_Request> recv(n, MPI_REQUEST_NULL), send(n, MPI_REQUEST_NULL);
    std::vector<clock::time_point> heard(n, clock::now());
    std::vector<bool> watching(n, true);
    watching[static_cast<std::size_t>(rank_)] = false;
    for (std::size_t r = 0; r < n; ++r)
      if (watching[r]) MPI_Irecv(&inbox[r], 1, MPI_INT64_T, static_cast<int>(r), 0, comm_, &recv[r]);
    auto beat = [&](std::int64_t value) {
      for (std::size_t r = 0; r < n; ++r) {
        if (static_cast<int>(r) == rank_) continue;
        int done = 1;
        if (send[r] != MPI_REQUEST_NULL) MPI_Test(&send[r], &done, MPI_STATUS_IGNORE);
        if (done == 0) continue;  // the last beat to r is not out yet: one in flight at most
        outbox[r] = value;
        MPI_Isend(&outbox[r], 1, MPI_INT64_T, static_cast<int>(r), 0, comm_, &send[r]);
      }
    };
    auto const poll = std::min<std::chrono::milliseconds>(opts_.period / 4 + std::chrono::milliseconds(1),
                                                          std::chrono::milliseconds(50));
    auto next_beat = clock::now();
    std::int64_t said = -2;
    while (!stop_.load(std::memory_order_relaxed)) {
      auto const now = clock::now();
      std::int64_t const step = step_.load(std::memory_order_relaxed);
      if (now >= next_beat || step != said) {
        beat(step);
        said = step;
        next_beat = now + opts_.period;
      }
      for (std::size_t r = 0; r < n; ++r) {
        if (!watching[r]) continue;
        int done = 0;
        if (MPI_Test(&recv[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done == 0) continue;
        heard[r] = now;
        if (inbox[r] == goodbye) {
          watching[r] = false;  // it ended its heartbeat: silence from it is not a loss
          continue;
        }
        heard_step[r] = inbox[r];
        MPI_Irecv(&inbox[r], 1, MPI_INT64_T, static_cast<int>(r), 0, comm_, &recv[r]);
      }
      for (std::size_t r = 0; r < n; ++r) {
        if (!watching[r] || now - heard[r] < opts_.timeout) continue;
        declare_lost(static_cast<int>(r), heard_step[r], now - heard[r]);
        return;  // the communicators are broken: nothing more travels
      }
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, poll);
    }
    beat(goodbye);
    for (std::size_t r = 0; r < n; ++r) {
      if (send[r] != MPI_REQUEST_NULL) MPI_Request_free(&send[r]);  // completes on its own
      if (recv[r] != MPI_REQUEST_NULL) {
        MPI_Cancel(&recv[r]);
        MPI_Request_free(&recv[r]);
      }
    }
  }

  void declare_lost(int r, std::int64_t step, std::chrono::steady_clock::duration silent) {
    double const seconds = std::chrono::duration<double>(silent).count();
    char quiet[32];
    std::snprintf(quiet, sizeof quiet, "%.1f", seconds);
    {
      std::lock_guard lock(mutex_);
      report_ = tide::detail::concat("rank ", r, " (", who_[static_cast<std::size_t>(r)], ") stopped answering at step ",
                                     step, ": no heartbeat for ", quiet, " s (timeout ",
                                     std::chrono::duration<double>(opts_.timeout).count(), " s)",
                                     note_.empty() ? "" : ". ", note_);
      detail::mpi_lose_peer(report_);
    }
    lost_.store(true, std::memory_order_release);
  }

  heartbeat_options opts_;
  int rank_, size_;
  std::vector<std::string> who_;  // "host, pid N" of each rank
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> stop_{false}, lost_{false};
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // at_step: beat now
  std::string note_, report_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace tide::comm
