#pragma once
// The file-level pieces of train/checkpoint.hpp: the header's magic and size, little-endian
// fields, an owned file descriptor, and pwrite / pread that finish or say why not.

#include <algorithm>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"

namespace tide::train {

namespace checkpoint_detail {

inline constexpr std::array<char, 8> magic = {'T', 'I', 'D', 'E', 'C', 'K', 'P', 'T'};
// magic, version u32, section count u32, table bytes u64
inline constexpr std::size_t header_bytes = 24;
// A table entry (and the record header before each payload): name length u8, name, size u64, crc u32.
constexpr std::size_t entry_bytes(std::size_t name_bytes) { return 1 + name_bytes + 8 + 4; }

inline void put_le(std::vector<std::byte>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
}

inline std::uint64_t get_le(std::byte const* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

inline void put_entry(std::vector<std::byte>& out, std::string_view name, std::uint64_t size,
                      std::uint32_t crc) {
  out.push_back(static_cast<std::byte>(name.size()));
  for (char ch : name) out.push_back(static_cast<std::byte>(ch));
  put_le(out, size, 8);
  put_le(out, crc, 4);
}

inline std::string errno_text(int err) { return std::generic_category().message(err); }

// The directory that holds `path` ("." for a bare file name).
inline std::filesystem::path directory_of(std::filesystem::path const& path) {
  auto dir = path.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

// An owned file descriptor, closed on destruction.
class file_descriptor {
 public:
  file_descriptor() = default;
  explicit file_descriptor(int fd) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  file_descriptor& operator=(file_descriptor&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  file_descriptor(file_descriptor const&) = delete;
  file_descriptor& operator=(file_descriptor const&) = delete;
  ~file_descriptor() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  // close(2) and its result: a write error may only show up here (NFS, quotas).
  int close() noexcept {
    int const r = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return r;
  }
  void reset() noexcept { (void)close(); }

 private:
  int fd_ = -1;
};

// pwrite(2) of every byte at `offset`; returns 0 or the errno.
inline int pwrite_all(int fd, std::span<std::byte const> bytes, std::uint64_t offset) noexcept {
  constexpr std::size_t max_call = std::size_t{1} << 30;  // Linux caps one write near 2 GiB
  while (!bytes.empty()) {
    ssize_t const n = ::pwrite(fd, bytes.data(), std::min(bytes.size(), max_call), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

// The source of a writer without deferred sections (commit(path)).
struct no_source {
  std::span<std::byte const> operator()(std::size_t) const { return {}; }
};

// pread(2) of exactly out.size() bytes at `offset`; returns the bytes read (less at end of file)
// or -errno.
inline std::int64_t pread_all(int fd, std::span<std::byte> out, std::uint64_t offset) noexcept {
  constexpr std::size_t max_call = std::size_t{1} << 30;
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t const n = ::pread(fd, out.data() + done, std::min(out.size() - done, max_call),
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -static_cast<std::int64_t>(errno);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return static_cast<std::int64_t>(done);
}

}  // namespace checkpoint_detail

}  // namespace tide::train
