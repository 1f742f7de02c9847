#pragma once
// A latch a host function blocks on until the test opens it. The timeout only turns a bug
// (a gate never opened) into a failure instead of a hang; no result depends on time.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>

namespace tide::test {

struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool is_open = false;

  void open() {
    {
      std::lock_guard lock(m);
      is_open = true;
    }
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock lock(m);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return is_open; });
  }
  static void pass(void* g) {
    if (!static_cast<gate*>(g)->wait()) throw std::runtime_error("test gate never opened");
  }
};

}  // namespace tide::test
