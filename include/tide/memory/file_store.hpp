#pragma once
// file_store: fixed-size blocks (offload chunks) in one file, read and written by I/O threads with
// pread/pwrite, through O_DIRECT when the filesystem allows it. The I/O half of an NVMe tier.
//
//   tide::memory::file_store store{{.folder = "/mnt/nvme", .block_bytes = 64_MiB, .blocks = 32}};
//   tide::memory::pinned_pool<tide::host> pool;
//   void* buf = pool.allocate(store.block_bytes(), tide::memory::file_store::alignment);
//   auto t = store.write_async(7, buf);   // block 7 <- buf: buf is read until wait(t), keep it alive
//   store.wait(t);                        // throws tide::error(io) if the write failed
//   store.wait(store.read_async(7, buf)); // buf <- block 7
//
// - The file: a new one with a unique name, tide-store-XXXXXX, in `folder`, of blocks ×
//   block_bytes() bytes, claimed with fallocate at construction (reserve = true, where the
//   filesystem can) so a full disk is an error there and not in the middle of a run. Destruction removes it; a process that
//   crashes leaves it behind. A folder that does not exist, is not a folder or cannot be written
//   is tide::error(io) at construction, naming the path and the system's reason.
// - O_DIRECT moves the bytes between the device and the caller's buffer, skipping the page cache
//   (the copy into it and the memory it takes). It needs buffers, file offsets and sizes aligned
//   to `alignment` (4096 B, the largest logical block size of common devices), so: block_bytes is
//   rounded up to it, and block_bytes() is the size every buffer must hold; request_bytes must be
//   a multiple of it; a buffer that does not start at a multiple of it is tide::error(usage) in
//   either mode (code that works on tmpfs works on NVMe). Aligned buffers:
//   pinned_pool::allocate(bytes, file_store::alignment), std::aligned_alloc(4096, bytes). Each
//   request pins its buffer's pages, so buffers in transparent huge pages read faster (1.6-1.85x
//   on the virtio disk of docs/memory-file-store.md).
// - A filesystem without direct I/O (EINVAL when O_DIRECT is switched on, or on a first aligned
//   4 KiB read: ramfs, tmpfs before Linux 6.6, some FUSE mounts) gets buffered I/O instead, as
//   does direct = false; mode() and stats().mode say which is in use.
// - Requests: a block moves as requests of request_bytes (the last one shorter when the block is
//   not a multiple), served in issue order by queue_depth I/O threads: up to queue_depth requests
//   are at the device at once, as DeepSpeed's aio queue depth. Short transfers and EINTR are
//   retried until the request is complete.
// - Order on a block: a read_async of a block with a write pending on it, or a write_async of a
//   block with anything pending on it, blocks until those finished: operations on one block take
//   effect in issue order. Operations on different blocks overlap.
// - Failures: wait(ticket) throws tide::error(io) naming the file, the block, the byte offset and
//   the system's reason ("No space left on device", "File too large"), with what to do. A failed
//   write loses nothing: the source buffer is only ever read, stays the caller's and unchanged,
//   and the store serves every block as before; only the failed block's bytes in the file are
//   undefined until a write of it succeeds. A failed read leaves its buffer undefined. A write
//   past the file size limit (ulimit -f) raises SIGXFSZ, which ends the process unless ignored;
//   ignored, the write fails with EFBIG ("File too large").
// - Tickets: wait each one exactly once, as a future's get (its record stays until then);
//   query(ticket) says whether wait would block.
// - Thread safety: every member function may be called concurrently. Destruction drops the
//   requests not started, waits for the running ones (no I/O thread touches a buffer after it),
//   then closes and removes the file. A moved-from store may only be destroyed or assigned to.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"

namespace tide::memory {

enum class file_store_mode : std::uint8_t {
  direct,    // O_DIRECT: device <-> caller's buffer
  buffered,  // through the page cache
};

constexpr std::string_view to_string(file_store_mode m) noexcept {
  return m == file_store_mode::direct ? "direct" : "buffered";
}

struct file_store_options {
  std::filesystem::path folder;          // where the file goes: an existing folder this process may write
  std::size_t block_bytes = 0;           // of one block; rounded up to file_store::alignment
  std::size_t blocks = 0;                // capacity
  std::size_t request_bytes = 1_MiB;     // a block moves as requests of this size (a multiple of 4096); DeepSpeed's
  std::size_t queue_depth = 8;           // requests in flight, one I/O thread each; DeepSpeed's (bench/scale.cpp:
                                         // 2 to 8 read alike on a virtio disk, 1 is 5-9 % slower)
  bool direct = true;                    // O_DIRECT when the filesystem has it; false: buffered I/O
  bool reserve = true;                   // fallocate the whole file at construction
};

struct file_store_stats {
  file_store_mode mode = file_store_mode::buffered;
  std::size_t bytes_read = 0;       // moved by pread
  std::size_t bytes_written = 0;    // moved by pwrite
  std::size_t reads = 0;            // read_async calls
  std::size_t writes = 0;           // write_async calls
  std::size_t read_requests = 0;    // requests that ran (each one or more preads)
  std::size_t write_requests = 0;   // requests that ran (each one or more pwrites)
  std::size_t failed = 0;           // operations that ended in an error
  double read_seconds = 0;          // I/O threads in pread, summed over threads: exceeds wall time when they overlap
  double write_seconds = 0;         // I/O threads in pwrite, summed likewise
};

namespace detail {

inline constexpr int file_ended = -1;  // pread found the end of the file inside a block

// What to do about a failed transfer, after the system's reason.
inline std::string file_io_advice(int err, file_store_mode mode) {
  switch (err) {
    case file_ended:
      return "the file ends before this block does: something else truncated it; the store's file must be left alone";
    case ENOSPC: return "the filesystem is full: free space there, or give the store a folder with room";
    case EDQUOT: return "the disk quota is used up: raise it, or give the store a folder under another quota";
    case EFBIG:
      return "the file would pass the file size limit (ulimit -f) or the filesystem's largest file: raise the "
             "limit, or store fewer or smaller blocks";
    case EIO: return "the device reported an error: check it (dmesg) or give the store a folder on another device";
    case EINVAL:
      return mode == file_store_mode::direct
                 ? "O_DIRECT refused the request: the device's logical block size may be larger than 4096; use "
                   "direct = false"
                 : "the system refused the request's arguments";
    default: return "the system refused the request";
  }
}

// Moves `bytes` between buf and the file at `offset`, retrying short transfers and EINTR.
struct transfer_result {
  int err = 0;            // 0, an errno, or file_ended
  std::size_t moved = 0;  // bytes transferred before it stopped
};

inline transfer_result transfer_all(int fd, bool write, unsigned char* buf, std::size_t bytes, std::size_t offset) {
  std::size_t moved = 0;
  while (moved < bytes) {
    auto const at = static_cast<off_t>(offset + moved);
    ssize_t const n =
        write ? ::pwrite(fd, buf + moved, bytes - moved, at) : ::pread(fd, buf + moved, bytes - moved, at);
    if (n > 0) {
      moved += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return {n < 0 ? errno : (write ? EIO : file_ended), moved};  // pwrite of 0 bytes: nothing moves it on
    }
  }
  return {0, moved};
}

}  // namespace detail

class file_store {
 public:
  using options = file_store_options;
  static constexpr std::size_t alignment = 4096;  // of buffers, offsets and sizes under O_DIRECT

  // An operation in flight; wait for it once.
  struct ticket {
    std::uint64_t id = 0;
  };

  explicit file_store(options const& opts) : state_(std::make_unique<state>(opts)) {
    state& s = *state_;
    s.threads.reserve(s.opts.queue_depth);
    for (std::size_t i = 0; i < s.opts.queue_depth; ++i) s.threads.emplace_back([&s] { s.serve(); });
  }
  file_store(file_store&&) noexcept = default;
  file_store& operator=(file_store&&) noexcept = default;
  file_store(file_store const&) = delete;
  file_store& operator=(file_store const&) = delete;
  ~file_store() = default;  // state's destructor: drop, wait, close, remove

  // Block `block` <- src[0, block_bytes()). src: aligned to `alignment`, read until wait.
  [[nodiscard]] ticket write_async(std::size_t block, void const* src) {
    // The buffer is only read for a write: pwrite takes it as const.
    return state_->submit(block, static_cast<unsigned char*>(const_cast<void*>(src)), true);
  }

  // dst[0, block_bytes()) <- block `block`. dst: aligned to `alignment`, written until wait.
  [[nodiscard]] ticket read_async(std::size_t block, void* dst) {
    return state_->submit(block, static_cast<unsigned char*>(dst), false);
  }

  // Blocks until the operation finished; throws tide::error(io) if it failed.
  void wait(ticket t) { state_->wait(t); }

  // True when wait(t) would not block.
  [[nodiscard]] bool query(ticket t) const {
    state const& s = *state_;
    std::lock_guard lock(s.mutex);
    check_pending(s, t, "query");
    op const& o = s.at(t.id);
    return o.done == o.pieces;
  }

  [[nodiscard]] file_store_stats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
  }

  [[nodiscard]] file_store_mode mode() const noexcept { return state_->mode; }
  [[nodiscard]] std::size_t block_bytes() const noexcept { return state_->block_bytes; }  // rounded
  [[nodiscard]] std::size_t blocks() const noexcept { return state_->opts.blocks; }
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return state_->file; }
  [[nodiscard]] options const& opts() const noexcept { return state_->opts; }

 private:
  struct op {
    unsigned char* buffer = nullptr;
    std::size_t block = 0;
    std::size_t pieces = 0;  // requests it splits into
    std::size_t issued = 0;  // taken by I/O threads
    std::size_t done = 0;    // finished (or skipped after a failure)
    bool write = false;
    bool waited = false;
    int err = 0;                  // the first failure: an errno or detail::file_ended
    std::size_t err_offset = 0;   // the file offset it happened at
  };

  struct state {
    options opts;
    std::size_t block_bytes = 0;
    std::filesystem::path file;
    int fd = -1;
    file_store_mode mode = file_store_mode::buffered;

    mutable std::mutex mutex;
    std::condition_variable work;     // I/O threads: a request to take, or stop
    std::condition_variable finished; // callers: an operation finished
    std::deque<op> ops;               // by ticket id, from first_id; popped once waited, from the front
    std::uint64_t first_id = 1;
    std::uint64_t next_issue = 1;     // the first operation with requests not taken yet
    std::vector<std::uint32_t> pending_on_block;  // operations not finished, per block
    std::vector<std::uint8_t> writing_block;      // a write among them
    file_store_stats stats;
    bool stop = false;
    std::vector<std::thread> threads;  // started by file_store once the file is ready

    explicit state(options const& o) : opts(o) {
      check_options();
      block_bytes = round_up(opts.block_bytes, alignment);
      pending_on_block.assign(opts.blocks, 0);
      writing_block.assign(opts.blocks, 0);
      open_file();  // last: once the file exists nothing may throw before the destructor can remove it
      stats.mode = mode;
    }

    state(state const&) = delete;
    state& operator=(state const&) = delete;

    ~state() {
      {
        std::lock_guard lock(mutex);
        stop = true;
      }
      work.notify_all();
      for (auto& t : threads) t.join();
      if (fd >= 0) ::close(fd);
      if (!file.empty()) ::unlink(file.c_str());
    }

    [[nodiscard]] op& at(std::uint64_t id) { return ops[static_cast<std::size_t>(id - first_id)]; }
    [[nodiscard]] op const& at(std::uint64_t id) const { return ops[static_cast<std::size_t>(id - first_id)]; }
    [[nodiscard]] std::uint64_t end_id() const { return first_id + ops.size(); }

    void check_options() const {
      TIDE_REQUIRE(!opts.folder.empty(), "file_store: no folder given; set .folder to the folder the store's file "
                   "should go in (a folder on the NVMe drive)");
      TIDE_REQUIRE(opts.block_bytes > 0 && opts.blocks > 0, "file_store: block_bytes = ", opts.block_bytes,
                   " and blocks = ", opts.blocks, " hold nothing; give both a positive value");
      TIDE_REQUIRE(opts.request_bytes > 0 && opts.request_bytes % alignment == 0, "file_store: request_bytes = ",
                   opts.request_bytes, " is not a positive multiple of ", alignment,
                   " (O_DIRECT moves whole aligned sizes); use e.g. 1 MiB");
      TIDE_REQUIRE(opts.queue_depth >= 1, "file_store: queue_depth = 0 would never run a request; give at least 1");
      constexpr std::size_t most = static_cast<std::size_t>(std::numeric_limits<off_t>::max());
      std::size_t const rounded = round_up(opts.block_bytes, alignment);
      TIDE_REQUIRE(rounded >= opts.block_bytes && opts.blocks <= most / rounded, "file_store: ", opts.blocks,
                   " blocks of ", opts.block_bytes, " bytes do not fit in one file's offsets; store fewer blocks");
    }

    void open_file() {
      auto const& folder = opts.folder;
      struct stat st {};
      if (::stat(folder.c_str(), &st) != 0) {
        int const err = errno;
        TIDE_FAIL(io, "file_store: folder ", folder, " cannot be used (", std::strerror(err), "): ",
                  err == ENOENT ? "create it first, or set .folder to an existing folder"
                                : "set .folder to a folder this process may write");
      }
      if (!S_ISDIR(st.st_mode))
        TIDE_FAIL(io, "file_store: folder ", folder, " is not a folder (", std::strerror(ENOTDIR),
                  "): set .folder to the folder the store's file should go in, not to a file");
      std::string name = (folder / "tide-store-XXXXXX").string();
      fd = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd < 0) {
        int const err = errno;
        TIDE_FAIL(io, "file_store: cannot create a file in folder ", folder, " (", std::strerror(err),
                  "): set .folder to a folder this process may write");
      }
      try {
        file = name;
        size_file();
        if (opts.direct) try_direct();
      } catch (...) {
        ::close(fd);
        ::unlink(file.c_str());
        fd = -1;
        file.clear();
        throw;
      }
    }

    void size_file() {
      std::size_t const bytes = block_bytes * opts.blocks;
      int err = 0;
      if (opts.reserve) {
        // fallocate, not posix_fallocate: where the filesystem cannot reserve, glibc's emulation
        // writes every block; a sparse file is the better fallback.
        err = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
        if (err == EOPNOTSUPP) err = 0;
        else if (err == 0) return;
      }
      if (err == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
      if (err == 0) return;
      std::string room;
      if (struct statvfs vfs {}; ::fstatvfs(fd, &vfs) == 0) {
        std::ostringstream os;
        os << "; the filesystem has " << bytes_of{static_cast<std::size_t>(vfs.f_bavail) * vfs.f_frsize} << " free";
        room = os.str();
      }
      TIDE_FAIL(io, "file_store: cannot size ", file, " to ", bytes, " bytes (", bytes_of{bytes}, ", ", opts.blocks,
                " blocks of ", block_bytes, ") (", std::strerror(err), ")", room, ": ",
                detail::file_io_advice(err, file_store_mode::buffered));
    }

    // O_DIRECT on, then one aligned 4 KiB write and read (the new file is zeros: the page
    // written is zeros): some filesystems take the flag and refuse the transfers. Any refusal
    // leaves buffered I/O.
    void try_direct() {
      int const flags = ::fcntl(fd, F_GETFL);
      if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return;
      struct page {
        alignas(alignment) unsigned char bytes[alignment];
      };
      auto const probe = std::make_unique<page>();
      if (detail::transfer_all(fd, true, probe->bytes, alignment, 0).err == 0 &&
          detail::transfer_all(fd, false, probe->bytes, alignment, 0).err == 0) {
        mode = file_store_mode::direct;
        return;
      }
      ::fcntl(fd, F_SETFL, flags);
    }

    ticket submit(std::size_t block, unsigned char* buffer, bool write) {
      char const* const call = write ? "write_async" : "read_async";
      TIDE_REQUIRE(block < opts.blocks, "file_store::", call, ": block ", block, " is out of range; the store holds ",
                   opts.blocks, " blocks, 0 to ", opts.blocks - 1);
      TIDE_REQUIRE(buffer != nullptr, "file_store::", call, " of block ", block, " with a null buffer");
      TIDE_REQUIRE(reinterpret_cast<std::uintptr_t>(buffer) % alignment == 0, "file_store::", call, " of block ",
                   block, ": the buffer at ", static_cast<void const*>(buffer), " is not aligned to ", alignment,
                   " bytes, as O_DIRECT needs; allocate it with pinned_pool::allocate(bytes, file_store::alignment) "
                   "or std::aligned_alloc(", alignment, ", bytes)");
      std::unique_lock lock(mutex);
      // Issue order per block: a read waits for a pending write, a write for anything pending.
      finished.wait(lock, [&] {
        return write ? pending_on_block[block] == 0 : writing_block[block] == 0;
      });
      op o;
      o.buffer = buffer;
      o.block = block;
      o.pieces = (block_bytes + opts.request_bytes - 1) / opts.request_bytes;
      o.write = write;
      ops.push_back(o);
      ++pending_on_block[block];
      if (write) writing_block[block] = 1;
      ++(write ? stats.writes : stats.reads);
      ticket const t{end_id() - 1};
      lock.unlock();
      work.notify_all();
      return t;
    }

    void wait(ticket t) {
      std::unique_lock lock(mutex);
      check_pending(*this, t, "wait");
      finished.wait(lock, [&] { return t.id < first_id || at(t.id).waited || at(t.id).done == at(t.id).pieces; });
      check_pending(*this, t, "wait");  // another thread may have waited for it meanwhile
      op& o = at(t.id);
      o.waited = true;
      op const result = o;
      while (!ops.empty() && ops.front().waited) {
        ops.pop_front();
        ++first_id;
      }
      lock.unlock();
      if (result.err == 0) return;
      std::size_t const start = result.block * block_bytes;
      if (result.write)
        TIDE_FAIL(io, "file_store: write of block ", result.block, " (bytes ", start, " to ", start + block_bytes,
                  " of ", file, ") failed at byte ", result.err_offset, " (", reason(result.err), "): ",
                  detail::file_io_advice(result.err, mode),
                  result.err == ENOSPC && !opts.reserve
                      ? " (with reserve = true the store claims its whole file at construction, so a full disk "
                        "shows there)"
                      : "",
                  ". The source buffer was only read and is still yours, unchanged; the store serves other blocks "
                  "as before; this block's bytes in the file are undefined until a write of it succeeds");
      TIDE_FAIL(io, "file_store: read of block ", result.block, " (bytes ", start, " to ", start + block_bytes, " of ",
                file, ") failed at byte ", result.err_offset, " (", reason(result.err), "): ",
                detail::file_io_advice(result.err, mode), ". The destination buffer's bytes are undefined");
    }

    static char const* reason(int err) { return err == detail::file_ended ? "end of file" : std::strerror(err); }

    // One I/O thread: takes requests in issue order until stopped.
    void serve() {
      std::unique_lock lock(mutex);
      for (;;) {
        work.wait(lock, [&] { return stop || next_issue < end_id(); });
        if (stop) return;  // requests not taken are dropped: nobody can wait for them any more
        op& o = at(next_issue);
        std::size_t const piece = o.issued++;
        if (o.issued == o.pieces) ++next_issue;
        if (o.err == 0) {  // after a failure the rest of the operation is skipped
          std::size_t const skip = piece * opts.request_bytes;
          std::size_t const bytes = std::min(opts.request_bytes, block_bytes - skip);
          std::size_t const offset = o.block * block_bytes + skip;
          lock.unlock();
          auto const t0 = std::chrono::steady_clock::now();
          auto const r = detail::transfer_all(fd, o.write, o.buffer + skip, bytes, offset);
          double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          lock.lock();
          (o.write ? stats.bytes_written : stats.bytes_read) += r.moved;
          ++(o.write ? stats.write_requests : stats.read_requests);
          (o.write ? stats.write_seconds : stats.read_seconds) += seconds;
          if (r.err != 0 && o.err == 0) {
            o.err = r.err;
            o.err_offset = offset + r.moved;
          }
        }
        if (++o.done == o.pieces) {
          if (--pending_on_block[o.block] == 0) writing_block[o.block] = 0;
          if (o.err != 0) ++stats.failed;
          finished.notify_all();
        }
      }
    }
  };

  static void check_pending(state const& s, ticket t, char const* call) {
    TIDE_REQUIRE(t.id >= s.first_id && t.id < s.end_id() && !s.at(t.id).waited, "file_store::", call, ": ticket ",
                 t.id, " is not pending in this store: it was waited for already, or comes from another store; "
                 "wait for each ticket once");
  }

  std::unique_ptr<state> state_;
};

}  // namespace tide::memory
