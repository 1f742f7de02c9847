#pragma once
// A persistent pool of host threads and a deterministic parallel_for over index ranges.
//
// Host kernels are threaded over rows: `parallel_for(pool, n, f)` calls f(begin, end) on
// contiguous slices of [0, n), one slice per thread, the calling thread taking the first. The
// partition depends only on n and the thread count, so a kernel whose per-row math is serial
// gives bit-identical results for any thread count, and reductions across rows can be made
// deterministic by reducing per-slice partials in slice order.
//
// One launch is one plain command (a function pointer and a pointer to the caller's callable),
// the shape of a kernel launch: no allocation, no type erasure on the per-element path.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"

namespace tide {

class thread_pool {
 public:
  // threads = total threads a parallel_for uses, the caller included (>= 1).
  explicit thread_pool(int threads = default_threads()) : threads_(threads) {
    TIDE_REQUIRE(threads >= 1, "thread_pool needs at least 1 thread, got ", threads);
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { serve(t); });
  }
  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  [[nodiscard]] int threads() const noexcept { return threads_; }

  // The slice of [0, n) that thread t of `threads` takes.
  static constexpr std::pair<std::size_t, std::size_t> slice(std::size_t n, int threads, int t) noexcept {
    std::size_t const per = n / static_cast<std::size_t>(threads);
    std::size_t const extra = n % static_cast<std::size_t>(threads);
    auto const ut = static_cast<std::size_t>(t);
    std::size_t const begin = ut * per + std::min(ut, extra);
    return {begin, begin + per + (ut < extra ? 1 : 0)};
  }

  // The thread whose slice of [0, n) begins at `begin` (the inverse of slice, for a non-empty
  // slice): what a callable of run() uses to index per-slice partials.
  static constexpr int slice_at(std::size_t n, int threads, std::size_t begin) noexcept {
    std::size_t const per = n / static_cast<std::size_t>(threads);
    std::size_t const extra = n % static_cast<std::size_t>(threads);
    std::size_t const long_end = extra * (per + 1);  // the first `extra` slices hold one more
    return static_cast<int>(begin < long_end ? begin / (per + 1) : extra + (begin - long_end) / per);
  }

  // f(begin, end) on every non-empty slice; returns when all are done. The first exception a
  // slice throws is rethrown here. Not reentrant: a slice must not call run() on the same pool.
  template <class F>
  void run(std::size_t n, F&& f) {
    if (n == 0) return;
    int const used = static_cast<int>(std::min<std::size_t>(n, static_cast<std::size_t>(threads_)));
    if (used == 1) {
      f(std::size_t{0}, n);
      return;
    }
    auto* callable = &f;
    {
      std::lock_guard lock(mutex_);
      task_ = {[](void* c, std::size_t b, std::size_t e) { (*static_cast<decltype(callable)>(c))(b, e); },
               static_cast<void*>(callable), n, used};
      pending_ = used - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      auto const [b, e] = slice(n, used, 0);
      f(b, e);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

  static int default_threads() noexcept {
    unsigned const hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
  }

 private:
  struct task {
    void (*fn)(void*, std::size_t, std::size_t) = nullptr;
    void* ctx = nullptr;
    std::size_t n = 0;
    int used = 0;
  };

  void serve(int t) {
    std::uint64_t seen = 0;
    for (;;) {
      task job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = task_;
      }
      if (t >= job.used) continue;  // this launch needs fewer threads
      std::exception_ptr err;
      try {
        auto const [b, e] = slice(job.n, job.used, t);
        job.fn(job.ctx, b, e);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  task task_{};
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// parallel_for(pool, n, f): f(begin, end) over slices of [0, n).
template <class F>
void parallel_for(thread_pool& pool, std::size_t n, F&& f) {
  pool.run(n, std::forward<F>(f));
}

}  // namespace tide
