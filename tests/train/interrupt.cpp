// train::stop_signals: the first SIGINT / SIGTERM (or SIGUSR1 / SIGUSR2, as mpiexec forwards them)
// is recorded for the loop to act on; the second ends the process; the handlers before it are
// restored; agreed_stop over one rank is its own signal.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "support/errors.hpp"
#include "tide/comm/self.hpp"
#include "tide/train/interrupt.hpp"

namespace {

extern "C" void mark(int) {}

}  // namespace

TEST_CASE("stop_signals: the first signal is recorded, SIGUSR1/2 read as SIGINT/TERM, handlers restored") {
  struct sigaction mine {};
  mine.sa_handler = mark;
  sigemptyset(&mine.sa_mask);
  struct sigaction before {};
  REQUIRE(::sigaction(SIGINT, &mine, &before) == 0);
  {
    tide::train::stop_signals stop;
    CHECK(stop.pending() == 0);
    std::raise(SIGINT);
    CHECK(stop.pending() == SIGINT);
    CHECK(tide::train::stop_signals::exit_status(stop.pending()) == 130);
    tide::comm::self one;
    CHECK(tide::train::agreed_stop(one, stop.pending()) == SIGINT);
    // Only one at a time: a second would take the first's handlers.
    CHECK(tide::test::category_of([] { tide::train::stop_signals again; }) == tide::errc::usage);
  }
  struct sigaction now {};
  REQUIRE(::sigaction(SIGINT, nullptr, &now) == 0);
  bool const restored = now.sa_handler == &mark;
  CHECK(restored);  // the handler before it is back
  REQUIRE(::sigaction(SIGINT, &before, nullptr) == 0);
  {
    tide::train::stop_signals stop;
    CHECK(stop.pending() == 0);  // a new one starts clear
    std::raise(SIGUSR2);
    CHECK(stop.pending() == SIGTERM);
    CHECK(tide::train::stop_signals::exit_status(stop.pending()) == 143);
  }
  {
    tide::train::stop_signals stop;
    std::raise(SIGUSR1);
    CHECK(stop.pending() == SIGINT);
  }
}

TEST_CASE("stop_signals: a second signal ends the process at once, by that signal") {
  for (int sig : {SIGINT, SIGTERM}) {
    pid_t const child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      tide::train::stop_signals stop;
      std::raise(sig);
      if (stop.pending() != sig) ::_exit(3);  // the first is only recorded
      std::raise(sig);
      ::_exit(0);  // not reached: the second ends the process
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
  }
}
