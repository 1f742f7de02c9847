#include <doctest/doctest.h>

#include "support/files.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/file_store.hpp>
#include <tide/memory/pinned_pool.hpp>

namespace fs = std::filesystem;
namespace mem = tide::memory;
using mem::file_store;
using mem::file_store_mode;
using tide::test::scratch_dir;
using namespace tide::literals;

namespace {

using pool = mem::pinned_pool<tide::host>;

unsigned char* buffer(pool& p, std::size_t bytes) {
  return static_cast<unsigned char*>(p.allocate(bytes, file_store::alignment));
}

void fill(unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t const x = rng();
    std::memcpy(p + i, &x, std::min<std::size_t>(8, n - i));
  }
}

bool same(unsigned char const* a, unsigned char const* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

bool has(std::string const& text, std::string const& part) { return text.find(part) != std::string::npos; }

// The tide::error f throws (its category and full text); fails the test if none.
template <class F>
std::pair<tide::errc, std::string> refusal(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return {e.category(), e.what()};
  }
  FAIL("no tide::error thrown");
  return {tide::errc::internal, ""};
}

// Whether the folder's filesystem takes O_DIRECT, asked without the store.
bool takes_direct(fs::path const& folder) {
  auto const probe = folder / "direct_probe";
  int const fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  std::error_code ec;  // some filesystems create the file, then refuse O_DIRECT: remove it either way
  if (fd >= 0) ::close(fd);
  fs::remove(probe, ec);
  return fd >= 0;
}

// The open flags of this process's descriptor of `file`, from /proc/self/fdinfo; -1 if none.
long open_flags(fs::path const& file) {
  fs::path const want = fs::canonical(file);
  for (auto const& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec) != want || ec) continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    for (std::string line; std::getline(info, line);)
      if (line.rfind("flags:", 0) == 0) return std::stol(line.substr(6), nullptr, 8);
  }
  return -1;
}

// A filesystem mounted on a fresh folder for one test (root only), detached after. `type` ramfs
// has no direct I/O; tmpfs with size=... runs out of space on purpose.
struct mounted {
  fs::path path;
  bool ok = false;
  mounted(fs::path where, char const* type, unsigned long flags, char const* data = nullptr) : path(std::move(where)) {
    fs::create_directories(path);
    ok = ::mount("tide-test", path.c_str(), type, flags, data) == 0;
  }
  ~mounted() {
    if (ok) ::umount2(path.c_str(), MNT_DETACH);
  }
  mounted(mounted const&) = delete;
  mounted& operator=(mounted const&) = delete;
};

// Every block written from its own random source, read back into fresh buffers, compared.
void round_trip(file_store& store, pool& p, std::uint64_t seed) {
  std::size_t const n = store.block_bytes();
  std::vector<unsigned char*> src, dst;
  std::vector<file_store::ticket> t;
  for (std::size_t b = 0; b < store.blocks(); ++b) {
    src.push_back(buffer(p, n));
    dst.push_back(buffer(p, n));
    fill(src[b], n, seed + b);
    std::memset(dst[b], 0xee, n);
    t.push_back(store.write_async(b, src[b]));
  }
  for (auto x : t) store.wait(x);
  t.clear();
  for (std::size_t b = 0; b < store.blocks(); ++b) t.push_back(store.read_async(b, dst[b]));
  for (auto x : t) store.wait(x);
  for (std::size_t b = 0; b < store.blocks(); ++b) {
    CAPTURE(b);
    CHECK(same(src[b], dst[b], n));
  }
}

}  // namespace

TEST_CASE("random blocks round-trip, O_DIRECT when the filesystem takes it and buffered when asked") {
  scratch_dir const dir("file_store_round_trip");
  for (bool direct : {true, false}) {
    CAPTURE(direct);
    pool p{{.lock_pages = false}};
    file_store store{{.folder = dir.path, .block_bytes = 3_MiB + 5, .blocks = 6, .direct = direct}};
    CHECK(store.block_bytes() == 3_MiB + 4096);  // rounded up to the alignment
    CHECK(store.path().parent_path() == dir.path);
    CHECK(store.path().filename().string().rfind("tide-store-", 0) == 0);
    CHECK(fs::file_size(store.path()) == 6 * store.block_bytes());
    bool const expect_direct = direct && takes_direct(dir.path);
    CHECK(store.mode() == (expect_direct ? file_store_mode::direct : file_store_mode::buffered));
    CHECK(store.stats().mode == store.mode());
    long const flags = open_flags(store.path());
    REQUIRE(flags != -1);
    CHECK(((flags & O_DIRECT) != 0) == expect_direct);  // what the kernel holds, not what the store says

    round_trip(store, p, 100);
    auto const st = store.stats();
    CHECK(st.writes == 6);
    CHECK(st.reads == 6);
    CHECK(st.bytes_written == 6 * store.block_bytes());
    CHECK(st.bytes_read == 6 * store.block_bytes());
    CHECK(st.write_requests == 6 * 4);  // 3 MiB + 4 KiB in 1 MiB requests: 3 whole and a 4 KiB one
    CHECK(st.read_requests == 6 * 4);
    CHECK(st.failed == 0);
    CHECK(st.read_seconds > 0);
    CHECK(st.write_seconds > 0);
  }
  CHECK(fs::is_empty(dir.path));  // each store removed its file
}

TEST_CASE("a block that is not a multiple of the request size moves whole, its last request shorter") {
  scratch_dir const dir("file_store_odd_block");
  pool p{{.lock_pages = false}};
  file_store store{{.folder = dir.path, .block_bytes = 1_MiB + 12_KiB + 1, .blocks = 3, .request_bytes = 256_KiB}};
  CHECK(store.block_bytes() == 1_MiB + 16_KiB);
  round_trip(store, p, 200);
  CHECK(store.stats().write_requests == 3 * 5);  // four of 256 KiB and one of 16 KiB per block
  CHECK(store.stats().bytes_written == 3 * (1_MiB + 16_KiB));
}

TEST_CASE("many operations in flight: all issued before any wait, waited in another order") {
  scratch_dir const dir("file_store_in_flight");
  pool p{{.lock_pages = false}};
  constexpr std::size_t blocks = 48;
  file_store store{{.folder = dir.path, .block_bytes = 100_KiB, .blocks = blocks, .request_bytes = 16_KiB,
                    .queue_depth = 8}};
  std::size_t const n = store.block_bytes();
  std::vector<unsigned char*> src, dst;
  std::vector<file_store::ticket> w, r;
  for (std::size_t b = 0; b < blocks; ++b) {
    src.push_back(buffer(p, n));
    dst.push_back(buffer(p, n));
    fill(src[b], n, 300 + b);
  }
  for (std::size_t b = 0; b < blocks; ++b) w.push_back(store.write_async(b, src[b]));
  std::reverse(w.begin(), w.end());
  for (auto t : w) store.wait(t);
  for (std::size_t b = 0; b < blocks; ++b) r.push_back(store.read_async(b, dst[b]));
  std::shuffle(r.begin(), r.end(), std::mt19937(4));
  for (auto t : r) store.wait(t);
  for (std::size_t b = 0; b < blocks; ++b) {
    CAPTURE(b);
    CHECK(same(src[b], dst[b], n));
  }
  auto const st = store.stats();
  CHECK(st.write_requests == blocks * 7);  // 100 KiB in 16 KiB requests: six and a 4 KiB one
  CHECK(st.read_requests == blocks * 7);
}

TEST_CASE("operations on one block take effect in issue order, waited or not") {
  scratch_dir const dir("file_store_order");
  for (bool direct : {true, false}) {
    CAPTURE(direct);
    pool p{{.lock_pages = false}};
    // One request per block and four I/O threads: without the order, a read and the write after it
    // would run at the same time.
    file_store store{{.folder = dir.path, .block_bytes = 1_MiB, .blocks = 1, .request_bytes = 1_MiB,
                      .queue_depth = 4, .direct = direct}};
    std::size_t const n = store.block_bytes();
    auto* a = buffer(p, n);
    auto* b = buffer(p, n);
    auto* first = buffer(p, n);
    auto* second = buffer(p, n);
    auto* third = buffer(p, n);
    fill(a, n, 1);
    fill(b, n, 2);
    store.wait(store.write_async(0, a));
    for (int round = 0; round < 32; ++round) {
      CAPTURE(round);
      unsigned char const* old = round % 2 == 0 ? a : b;
      unsigned char const* next = round % 2 == 0 ? b : a;
      // Nothing waited in between: read (sees old), overwrite, read twice (see next).
      auto const r1 = store.read_async(0, first);
      auto const w = store.write_async(0, next);
      CHECK(store.query(r1));  // the write was issued only once the read before it finished
      auto const r2 = store.read_async(0, second);
      CHECK(store.query(w));   // and the read after it only once it finished
      auto const r3 = store.read_async(0, third);
      store.wait(r3);
      store.wait(r2);
      store.wait(w);
      store.wait(r1);
      CHECK(same(first, old, n));
      CHECK(same(second, next, n));
      CHECK(same(third, next, n));
    }
    // query: true once done, and wait then returns at once.
    auto const t = store.read_async(0, first);
    while (!store.query(t)) std::this_thread::yield();
    store.wait(t);
    CHECK(same(first, a, n));
  }
}

TEST_CASE("a misaligned buffer, a block out of range and a ticket waited twice are usage errors") {
  scratch_dir const dir("file_store_usage");
  pool p{{.lock_pages = false}};
  file_store store{{.folder = dir.path, .block_bytes = 64_KiB, .blocks = 2}};
  auto* buf = buffer(p, 2 * store.block_bytes());
  for (std::size_t off : {std::size_t{1}, std::size_t{512}, std::size_t{2048}}) {
    CAPTURE(off);
    auto const [wc, wmsg] = refusal([&] { (void)store.write_async(0, buf + off); });
    CHECK(wc == tide::errc::usage);
    CHECK(has(wmsg, "not aligned to 4096 bytes"));
    CHECK(has(wmsg, "pinned_pool::allocate(bytes, file_store::alignment)"));
    auto const [rc, rmsg] = refusal([&] { (void)store.read_async(1, buf + off); });
    CHECK(rc == tide::errc::usage);
    CHECK(has(rmsg, "read_async of block 1"));
  }
  CHECK(store.stats().writes == 0);  // nothing was issued
  CHECK(store.stats().reads == 0);

  auto const [bc, bmsg] = refusal([&] { (void)store.write_async(2, buf); });
  CHECK(bc == tide::errc::usage);
  CHECK(has(bmsg, "block 2 is out of range; the store holds 2 blocks, 0 to 1"));
  CHECK(refusal([&] { (void)store.read_async(0, nullptr); }).first == tide::errc::usage);

  auto const t = store.write_async(0, buf);
  store.wait(t);
  auto const [tc, tmsg] = refusal([&] { store.wait(t); });
  CHECK(tc == tide::errc::usage);
  CHECK(has(tmsg, "wait for each ticket once"));
  CHECK(refusal([&] { store.wait(file_store::ticket{}); }).first == tide::errc::usage);
  CHECK(refusal([&] { (void)store.query(t); }).first == tide::errc::usage);
}

TEST_CASE("options that cannot work are refused, saying what to give") {
  scratch_dir const dir("file_store_options");
  auto const [c1, m1] = refusal([&] { file_store s{{.folder = dir.path, .block_bytes = 4096, .blocks = 0}}; });
  CHECK(c1 == tide::errc::usage);
  CHECK(has(m1, "give both a positive value"));
  auto const [c2, m2] = refusal(
      [&] { file_store s{{.folder = dir.path, .block_bytes = 4096, .blocks = 1, .request_bytes = 1000}}; });
  CHECK(c2 == tide::errc::usage);
  CHECK(has(m2, "request_bytes = 1000 is not a positive multiple of 4096"));
  auto const [c3, m3] =
      refusal([&] { file_store s{{.folder = dir.path, .block_bytes = 4096, .blocks = 1, .queue_depth = 0}}; });
  CHECK(c3 == tide::errc::usage);
  CHECK(has(m3, "queue_depth = 0"));
  auto const [c4, m4] = refusal([&] { file_store s{{.folder = {}, .block_bytes = 4096, .blocks = 1}}; });
  CHECK(c4 == tide::errc::usage);
  CHECK(has(m4, "no folder given"));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a folder that is missing, is a file, or cannot be written is refused at construction") {
  scratch_dir const dir("file_store_folder");
  auto const refused = [](fs::path const& folder) {
    return refusal([&] { file_store s{{.folder = folder, .block_bytes = 4096, .blocks = 1}}; });
  };

  auto const missing = dir.path / "missing";
  auto const [c1, m1] = refused(missing);
  CHECK(c1 == tide::errc::io);
  CHECK(has(m1, missing.string()));
  CHECK(has(m1, "No such file or directory"));
  CHECK(has(m1, "create it first"));

  auto const plain = dir.path / "plain";
  std::ofstream(plain) << "not a folder";
  auto const [c2, m2] = refused(plain);
  CHECK(c2 == tide::errc::io);
  CHECK(has(m2, plain.string()));
  CHECK(has(m2, "Not a directory"));
  CHECK(has(m2, "is not a folder"));

  // Root writes through any permission bits, so an unwritable folder is a read-only mount.
  mounted const read_only(dir.path / "read_only", "ramfs", MS_RDONLY);
  if (!read_only.ok) {
    MESSAGE("read-only folder not checked: mounting a filesystem needs root");
    return;
  }
  auto const [c3, m3] = refused(read_only.path);
  CHECK(c3 == tide::errc::io);
  CHECK(has(m3, read_only.path.string()));
  CHECK(has(m3, "Read-only file system"));
  CHECK(has(m3, "cannot create a file in folder"));
}

TEST_CASE("a filesystem without O_DIRECT gets buffered I/O and says so") {
  scratch_dir const dir("file_store_fallback");
  mounted const ramfs(dir.path / "ramfs", "ramfs", 0);  // no direct I/O: O_DIRECT is EINVAL there
  if (!ramfs.ok) {
    MESSAGE("fallback not checked: mounting ramfs needs root");
    return;
  }
  REQUIRE_FALSE(takes_direct(ramfs.path));
  pool p{{.lock_pages = false}};
  file_store store{{.folder = ramfs.path, .block_bytes = 256_KiB, .blocks = 4, .request_bytes = 64_KiB}};
  CHECK(store.mode() == file_store_mode::buffered);
  CHECK(store.stats().mode == file_store_mode::buffered);
  CHECK(to_string(store.mode()) == "buffered");
  CHECK((open_flags(store.path()) & O_DIRECT) == 0);
  round_trip(store, p, 400);
}

TEST_CASE("a write past the file size limit fails with EFBIG, loses nothing, and the store serves on") {
  scratch_dir const dir("file_store_fsize");
  for (bool direct : {true, false}) {
    CAPTURE(direct);
    pool p{{.lock_pages = false}};
    // One I/O thread, so the failure is at one place: block 2's first request is cut short at the
    // limit, the rest of it is retried and refused, and its other requests are skipped.
    file_store store{{.folder = dir.path, .block_bytes = 1_MiB, .blocks = 4, .request_bytes = 256_KiB,
                      .queue_depth = 1, .direct = direct}};
    std::size_t const n = store.block_bytes();
    auto* src = buffer(p, n);
    auto* below = buffer(p, n);
    auto* back = buffer(p, n);
    fill(src, n, 500);
    fill(below, n, 501);
    std::vector<unsigned char> const before(src, src + n);
    {
      tide::test::file_size_capped const cap(2_MiB + 64_KiB);  // inside block 2
      REQUIRE(cap.capped);
      auto const st0 = store.stats();
      auto const t = store.write_async(2, src);
      auto const [c, msg] = refusal([&] { store.wait(t); });
      CHECK(c == tide::errc::io);
      CHECK(has(msg, "write of block 2"));
      CHECK(has(msg, store.path().string()));
      CHECK(has(msg, "failed at byte 2162688"));  // 2 MiB + 64 KiB: the short write went on to the limit
      CHECK(has(msg, "File too large"));
      CHECK(has(msg, "ulimit -f"));
      CHECK(has(msg, "source buffer was only read and is still yours"));
      CHECK(std::equal(before.begin(), before.end(), src));  // the source is untouched
      auto const st1 = store.stats();
      CHECK(st1.failed == st0.failed + 1);
      CHECK(st1.write_requests == st0.write_requests + 1);  // the other three skipped
      CHECK(st1.bytes_written == st0.bytes_written + 64_KiB);

      // Below the limit, with the limit still on, the store serves as before.
      store.wait(store.write_async(1, below));
      store.wait(store.read_async(1, back));
      CHECK(same(back, below, n));
    }
    // Limit lifted: the same source writes block 2; nothing of it was lost.
    store.wait(store.write_async(2, src));
    store.wait(store.read_async(2, back));
    CHECK(std::equal(before.begin(), before.end(), back));
  }
}

TEST_CASE("a full filesystem: refused at construction when reserving, a clear failed write when not") {
  scratch_dir const dir("file_store_full");
  mounted const small(dir.path / "small", "tmpfs", 0, "size=1m");
  if (!small.ok) {
    MESSAGE("full filesystem not checked: mounting tmpfs needs root");
    return;
  }
  auto const [c1, m1] =
      refusal([&] { file_store s{{.folder = small.path, .block_bytes = 1_MiB, .blocks = 4}}; });
  CHECK(c1 == tide::errc::io);
  CHECK(has(m1, "No space left on device"));
  CHECK(has(m1, "4 blocks of 1048576"));
  CHECK(has(m1, "the filesystem has "));
  CHECK(fs::is_empty(small.path));  // the half-made file is gone

  pool p{{.lock_pages = false}};
  file_store store{{.folder = small.path, .block_bytes = 256_KiB, .blocks = 8, .reserve = false}};
  std::size_t const n = store.block_bytes();
  std::vector<unsigned char*> src;
  std::size_t b = 0;
  std::string msg;
  for (; b < store.blocks() && msg.empty(); ++b) {
    src.push_back(buffer(p, n));
    fill(src[b], n, 600 + b);
    std::vector<unsigned char> const before(src[b], src[b] + n);
    try {
      store.wait(store.write_async(b, src[b]));
    } catch (tide::error const& e) {
      msg = e.what();
      CHECK(std::equal(before.begin(), before.end(), src[b]));
    }
  }
  REQUIRE_FALSE(msg.empty());  // 2 MiB do not fit in 1 MiB
  CHECK(has(msg, "No space left on device"));
  CHECK(has(msg, "the filesystem is full"));
  CHECK(has(msg, "with reserve = true the store claims its whole file at construction"));
  std::size_t const written = b - 1;  // blocks before the failed one
  CHECK(written >= 2);
  auto* back = buffer(p, n);
  for (std::size_t k = 0; k < written; ++k) {  // what was written is still there
    store.wait(store.read_async(k, back));
    CHECK(same(back, src[k], n));
  }
}

TEST_CASE("destruction with work in flight waits for it, then removes the file") {
  scratch_dir const dir("file_store_destroy");
  constexpr std::size_t blocks = 16, bytes = 512_KiB;
  // Heap buffers freed right after the store: an I/O thread still running would touch freed
  // memory (ASan) or race with the free (TSan).
  std::vector<unsigned char*> src, dst;
  for (std::size_t b = 0; b < blocks; ++b) {
    src.push_back(static_cast<unsigned char*>(std::aligned_alloc(file_store::alignment, bytes)));
    dst.push_back(static_cast<unsigned char*>(std::aligned_alloc(file_store::alignment, bytes)));
    fill(src[b], bytes, 700 + b);
  }
  fs::path file;
  {
    file_store store{{.folder = dir.path, .block_bytes = bytes, .blocks = blocks, .request_bytes = 64_KiB,
                      .queue_depth = 2}};
    file = store.path();
    CHECK(fs::exists(file));
    for (std::size_t b = 0; b < blocks; ++b) (void)store.write_async(b, src[b]);
    for (std::size_t b = 0; b < blocks; ++b) (void)store.read_async(b, dst[b]);  // each waits for its block's write
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    std::free(src[b]);
    std::free(dst[b]);
  }
  CHECK_FALSE(fs::exists(file));
}

TEST_CASE("threads share a store: each its own blocks, stats read meanwhile") {
  scratch_dir const dir("file_store_threads");
  pool p{{.lock_pages = false}};
  constexpr std::size_t users = 3, rounds = 12;
  file_store store{{.folder = dir.path, .block_bytes = 192_KiB, .blocks = users * 2, .request_bytes = 64_KiB}};
  std::size_t const n = store.block_bytes();
  std::atomic<bool> done{false};
  std::atomic<int> mismatches{0};
  std::vector<std::pair<unsigned char*, unsigned char*>> bufs;
  for (std::size_t u = 0; u < users; ++u) bufs.emplace_back(buffer(p, n), buffer(p, n));
  std::thread watcher([&] {
    while (!done) {
      (void)store.stats();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (std::size_t u = 0; u < users; ++u) {
    workers.emplace_back([&, u] {
      auto [src, dst] = bufs[u];
      for (std::size_t r = 0; r < rounds; ++r) {
        std::size_t const block = 2 * u + r % 2;
        fill(src, n, 1000 * u + r);
        store.wait(store.write_async(block, src));
        store.wait(store.read_async(block, dst));
        if (!same(src, dst, n)) ++mismatches;
      }
    });
  }
  for (auto& t : workers) t.join();
  done = true;
  watcher.join();
  CHECK(mismatches == 0);
  CHECK(store.stats().writes == users * rounds);
}

TEST_CASE("a moved store keeps its file, its tickets and its I/O threads") {
  scratch_dir const dir("file_store_move");
  pool p{{.lock_pages = false}};
  auto* src = buffer(p, 64_KiB);
  auto* dst = buffer(p, 64_KiB);
  fill(src, 64_KiB, 800);
  file_store a{{.folder = dir.path, .block_bytes = 64_KiB, .blocks = 2}};
  fs::path const file = a.path();
  auto const t = a.write_async(1, src);
  file_store b = std::move(a);
  b.wait(t);
  b.wait(b.read_async(1, dst));
  CHECK(same(src, dst, 64_KiB));
  CHECK(b.path() == file);
  file_store c{{.folder = dir.path, .block_bytes = 4096, .blocks = 1}};
  CHECK(c.path() != file);  // a second store in the folder gets a file of its own
  c = std::move(b);         // c's own file goes with its old state
  CHECK(c.path() == file);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 1);
}
