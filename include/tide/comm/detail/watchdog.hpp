#pragma once
// A communicator's watchdog, in two pieces that need no GPU (comm::nccl puts them together):
//
//   stall_watch      which operation has been the oldest unfinished one for longer than the
//                    deadline: no progress on the lane for that long, whatever the host waits on
//   periodic_thread  calls f() every period on a thread of its own, until destroyed
//
//   tide::comm::detail::stall_watch w;
//   if (auto late = w.overdue(next, [&](std::uint64_t seq) { return finished(seq); }, now, deadline))
//     abort("operation #", *late, " made no progress");
//
// PyTorch's NCCL watchdog does the same job: a host wait that sits behind a collective on a
// stream (a copy that waits for a gradient's sum) has no deadline of its own, so a lost peer would
// hang it; ending the communicator ends the collective's kernels, and the wait returns.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace tide::comm::detail {

class stall_watch {
 public:
  using clock = std::chrono::steady_clock;

  // Operations are numbered from 1 in call order; `next` is the number the next one will get, and
  // done(seq) says whether operation seq finished (asked from the oldest unfinished one on, in
  // order; one lane: when seq finished, every earlier one did). Returns the oldest unfinished
  // operation when it has been the oldest for longer than `deadline` (measured from the first
  // call that saw it so: call this often, a small fraction of the deadline apart), else nothing.
  template <class Done>
  std::optional<std::uint64_t> overdue(std::uint64_t next, Done&& done, clock::time_point now,
                                       std::chrono::milliseconds deadline) {
    while (oldest_ < next && done(oldest_)) ++oldest_;
    if (oldest_ >= next) {  // nothing in flight
      watched_ = 0;
      return std::nullopt;
    }
    if (watched_ != oldest_) {  // a new oldest: timed from now
      watched_ = oldest_;
      since_ = now;
    }
    if (now - since_ > deadline) return oldest_;
    return std::nullopt;
  }

 private:
  std::uint64_t oldest_ = 1;   // the oldest operation not seen finished
  std::uint64_t watched_ = 0;  // the one since_ is for (0: none in flight when last asked)
  clock::time_point since_{};  // when it was first seen the oldest unfinished one
};

// f() every `period` on a thread of its own, from construction until destruction (which waits
// for a call in progress to end). f must not throw; what it throws is dropped.
template <class F>
class periodic_thread {
 public:
  periodic_thread(std::chrono::milliseconds period, F f) : f_(std::move(f)), thread_([this, period] { loop(period); }) {}
  periodic_thread(periodic_thread const&) = delete;
  periodic_thread& operator=(periodic_thread const&) = delete;
  ~periodic_thread() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // A period for a deadline: an eighth of it, between 10 ms and 1 s.
  static std::chrono::milliseconds period_for(std::chrono::milliseconds deadline) noexcept {
    return std::clamp(deadline / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  }

 private:
  void loop(std::chrono::milliseconds period) noexcept {
    std::unique_lock lock(m_);
    while (!cv_.wait_for(lock, period, [&] { return stop_; })) {
      lock.unlock();
      try {
        f_();
      } catch (...) {
      }
      lock.lock();
    }
  }

  F f_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace tide::comm::detail
