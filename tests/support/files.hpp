#pragma once
// Files for tests: a scratch folder removed with everything in it, a file's bytes as text, and a
// cap on the size of files this process writes (a write past it fails as on a full drive).

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

namespace tide::test {

// A fresh folder under the system's temp dir, named after `what`, the process and a counter.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(std::string const& what) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("tide_" + what + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  scratch_dir(scratch_dir const&) = delete;
  scratch_dir& operator=(scratch_dir const&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Every byte of the file at p ("" if it cannot be read).
inline std::string file_text(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// RLIMIT_FSIZE's soft limit at `bytes` with SIGXFSZ ignored, so a write past it fails with EFBIG
// instead of ending the process; both restored on exit. Root needs no capability to lower a soft
// limit and raise it back up to the hard one.
struct file_size_capped {
  rlimit saved{};
  struct sigaction old_action {};
  bool capped = false;
  explicit file_size_capped(std::size_t bytes) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGXFSZ, &ignore, &old_action);
    if (::getrlimit(RLIMIT_FSIZE, &saved) != 0) return;
    rlimit lower = saved;
    lower.rlim_cur = bytes;
    if (saved.rlim_max != RLIM_INFINITY && bytes > saved.rlim_max) return;
    capped = ::setrlimit(RLIMIT_FSIZE, &lower) == 0;
  }
  ~file_size_capped() {
    if (capped) ::setrlimit(RLIMIT_FSIZE, &saved);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
  }
  file_size_capped(file_size_capped const&) = delete;
  file_size_capped& operator=(file_size_capped const&) = delete;
};

}  // namespace tide::test
