#pragma once
// Stopping a run cleanly on a signal, as a production trainer does: the first SIGINT (Ctrl-C) or
// SIGTERM asks the run to stop after the step in flight, so it can save a checkpoint and its
// pictures and exit with 128 + the signal (130, 143); a second one ends the process at once.
//
//   tide::train::stop_signals stop;                       // installs the handlers; restores them after
//   for (...) {
//     trainer.step(batch);
//     int const asked = tide::train::agreed_stop(world, stop.pending());  // every rank the same
//     if (asked != 0) { trainer.save(...); return tide::train::stop_signals::exit_status(asked); }
//   }
//
// Under MPI, agreed_stop() takes the signal of any rank (a 4-byte all-reduce per step), so every
// rank stops after the same step and their checkpoint set is one step's. Open MPI's mpiexec turns
// SIGINT and SIGTERM into a kill of the whole job (SIGTERM to the ranks, SIGKILL a second later)
// and forwards only SIGUSR1 and SIGUSR2: a launcher that wants the ranks to stop cleanly sends
// those to mpiexec (./tide demo --ranks does, for Ctrl-C and SIGTERM). So SIGUSR1 is taken as
// SIGINT and SIGUSR2 as SIGTERM, the way batch systems use SIGUSR1 for "checkpoint and stop".
//
// The handlers set one flag (a lock-free atomic: async-signal-safe) and are installed with
// SA_RESTART, so a system call of the step in flight (a file read of the NVMe tier, a wait) goes
// on rather than failing with EINTR. One stop_signals may be alive at a time.

#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <span>

#include <signal.h>

#include "tide/comm/communicator.hpp"
#include "tide/core/error.hpp"

namespace tide::train {

namespace detail {

inline std::atomic<int>& stop_asked() noexcept {
  static std::atomic<int> asked{0};
  return asked;
}
inline std::atomic<bool>& stop_installed() noexcept {
  static std::atomic<bool> installed{false};
  return installed;
}
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

extern "C" inline void on_stop_signal(int sig) {
  int const asked = sig == SIGUSR1 ? SIGINT : sig == SIGUSR2 ? SIGTERM : sig;
  int expected = 0;
  if (stop_asked().compare_exchange_strong(expected, asked)) return;
  // The second: end at once, as if no handler were installed (the signal is blocked while this
  // handler runs, so it is delivered as soon as the handler returns).
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace detail

class stop_signals {
 public:
  static constexpr int handled[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

  stop_signals() {
    bool was = false;
    TIDE_CHECK(detail::stop_installed().compare_exchange_strong(was, true), usage,
               "stop_signals: another one is alive; keep one for the process (it handles SIGINT, SIGTERM, SIGUSR1 "
               "and SIGUSR2)");
    detail::stop_asked() = 0;
    struct sigaction sa {};
    sa.sa_handler = detail::on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (std::size_t k = 0; k < std::size(handled); ++k) ::sigaction(handled[k], &sa, &before_[k]);
  }
  ~stop_signals() {
    for (std::size_t k = 0; k < std::size(handled); ++k) ::sigaction(handled[k], &before_[k], nullptr);
    detail::stop_installed() = false;
  }
  stop_signals(stop_signals const&) = delete;
  stop_signals& operator=(stop_signals const&) = delete;

  // The signal that asked this process to stop (SIGINT or SIGTERM; SIGUSR1 and SIGUSR2 read as
  // them), 0 while none did.
  [[nodiscard]] int pending() const noexcept { return detail::stop_asked().load(); }

  // The status a process stopped by `signal` exits with, as a shell reports one killed by it.
  [[nodiscard]] static constexpr int exit_status(int signal) noexcept { return 128 + signal; }

 private:
  struct sigaction before_[std::size(handled)] {};
};

// The stop every rank takes: the largest signal asked on any rank (SIGTERM over SIGINT), 0 if
// none. Collective: every rank calls it at the same point of every step.
template <comm::Reducer C>
int agreed_stop(C& c, int pending) {
  std::int32_t v = pending;
  c.all_reduce(std::span<std::int32_t>(&v, 1), comm::reduce_op::max);
  return v;
}

}  // namespace tide::train
