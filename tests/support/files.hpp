#pragma once
// Files for tests: a scratch folder removed with everything in it, and a file's bytes as text.

#include <unistd.h>

#include <atomic>
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

}  // namespace tide::test
