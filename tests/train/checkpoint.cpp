#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/train/checkpoint.hpp>

namespace fs = std::filesystem;
namespace tt = tide::train;
using namespace tide::literals;

extern char** environ;

namespace {

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

std::vector<std::byte> read_file(fs::path const& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_file(fs::path const& p, std::span<std::byte const> bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<char const*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// A fresh directory under the system's temp dir, removed with everything in it.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("tide_checkpoint_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  [[nodiscard]] std::vector<std::string> leftovers() const {
    std::vector<std::string> names;
    for (auto const& e : fs::directory_iterator(path))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) names.push_back(e.path().filename());
    return names;
  }
};

// The error `f` throws; fails the test when it throws nothing.
tide::error error_of(std::function<void()> const& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e;
  }
  FAIL("expected a tide::error, got success");
  return tide::error(tide::errc::internal, "unreachable");
}

bool has(std::string const& text, std::string const& part) { return text.find(part) != std::string::npos; }

// ---- the small checkpoint of the corruption tests ---------------------------------------------
struct small_section {
  std::string name;
  std::vector<std::byte> bytes;
};

std::vector<small_section> small_sections() {
  std::int64_t const step = 7;
  auto const step_bytes = std::as_bytes(std::span{&step, 1});
  return {{"params", pattern(64, 1)},
          {"empty", {}},
          {"step", {step_bytes.begin(), step_bytes.end()}},
          {"moments", pattern(37, 2)}};
}

void write_small(fs::path const& p) {
  auto const secs = small_sections();
  tt::checkpoint_writer w;
  for (auto const& s : secs)
    if (s.name == "step")
      w.add_value("step", std::int64_t{7});
    else
      w.add(s.name, s.bytes);
  w.commit(p);
}

// Loads the small checkpoint the way a model would: it knows every section's size.
void load_small(fs::path const& p) {
  tt::checkpoint_reader r{p};
  for (auto const& s : small_sections()) {
    std::vector<std::byte> out(s.bytes.size());
    r.read(s.name, out);
    REQUIRE(out == s.bytes);  // a success must be a correct load
  }
}

// Where each part of the small file lives: [0, 24) header, then the table and its CRC, then one
// record (name length, name, size, crc, payload) per section.
struct region {
  std::size_t end;
  std::string name;  // what a failure there must name
};

std::vector<region> small_layout() {
  std::vector<region> out;
  out.push_back({24, "header"});
  std::size_t at = 24;
  auto const secs = small_sections();
  for (auto const& s : secs) at += 13 + s.name.size();
  out.push_back({at + 4, "section table"});
  at += 4;
  for (auto const& s : secs) {
    at += 13 + s.name.size() + s.bytes.size();
    out.push_back({at, "section \"" + s.name + "\""});
  }
  return out;
}

// ---- the child of the crash test ----------------------------------------------------------------
// When TIDE_CHECKPOINT_CHILD=<path> is set, this binary commits a 64 MiB checkpoint to <path>
// before main() runs and exits: the crash test forks and execs /proc/self/exe in this mode, so the
// child is a fresh process under every sanitizer. It writes one byte to the pipe
// TIDE_CHECKPOINT_CHILD_FD just before commit(), which opens the tmp file first thing.
constexpr std::size_t child_block = 8_MiB;
constexpr int child_blocks = 8;

int run_child_if_asked() {
  char const* path = std::getenv("TIDE_CHECKPOINT_CHILD");
  char const* fd = std::getenv("TIDE_CHECKPOINT_CHILD_FD");
  if (path == nullptr || fd == nullptr) return 0;
  try {
    // Filled a word at a time: byte stores are slow under TSan.
    std::vector<std::uint64_t> block(child_block / 8);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = i * 0x9E3779B97F4A7C15u;
    tt::checkpoint_writer w;
    for (int i = 0; i < child_blocks; ++i)  // 64 MiB from one buffer
      w.add("block" + std::to_string(i), std::as_bytes(std::span{block}));
    w.add_value("step", std::int64_t{2});
    char const go = 'g';
    if (::write(std::atoi(fd), &go, 1) != 1) ::_exit(2);
    w.commit(path);
  } catch (...) {
    ::_exit(3);
  }
  ::_exit(0);
}
[[maybe_unused]] int const child_mode = run_child_if_asked();

}  // namespace

TEST_CASE("checkpoint: sections round-trip, including empty, 1 MiB, 3 MiB + 5 and 64-byte names") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  struct adam_state {
    std::int32_t step;
    float lr;
    double beta2;
  };
  auto const params = pattern(1_MiB, 3);
  auto const moments = pattern(3_MiB + 5, 9);  // streamed in several pieces
  auto const odd = pattern(3, 4);
  std::string const long_name(64, 'n');
  {
    tt::checkpoint_writer w;
    w.add("params", params);
    w.add("empty", {});
    w.add_value("step", std::int64_t{123456789012});
    w.add_value("adam", adam_state{5, 1.5e-3f, 0.99});
    w.add(long_name, odd);
    w.add("moments", moments);
    CHECK(w.section_count() == 6);
    w.commit(path);
    CHECK(fs::file_size(path) == w.file_bytes());
  }
  CHECK(dir.leftovers().empty());

  tt::checkpoint_reader r{path};
  CHECK(r.sections() == std::vector<std::string>{"params", "empty", "step", "adam", long_name, "moments"});
  CHECK(r.contains("params"));
  CHECK_FALSE(r.contains("param"));
  CHECK(r.size_of("params") == 1_MiB);
  CHECK(r.size_of("empty") == 0);
  CHECK(r.size_of("adam") == sizeof(adam_state));
  r.verify();

  std::vector<std::byte> got(1_MiB);
  r.read("params", got);
  CHECK(got == params);
  r.read("empty", {});
  CHECK(r.read_value<std::int64_t>("step") == 123456789012);
  auto const adam = r.read_value<adam_state>("adam");
  CHECK(adam.step == 5);
  CHECK(adam.lr == 1.5e-3f);
  CHECK(adam.beta2 == 0.99);
  std::vector<std::byte> small(3);
  r.read(long_name, small);
  CHECK(small == odd);
  std::vector<std::byte> m(moments.size());
  r.read("moments", m);
  CHECK(m == moments);
}

TEST_CASE("checkpoint: a second commit replaces the first, leaving no tmp file") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  tt::checkpoint_writer a;
  a.add_value("step", std::int64_t{1});
  a.commit(path);
  tt::checkpoint_writer b;
  b.add_value("step", std::int64_t{2});
  b.add_value("extra", 3.0f);
  b.commit(path);
  tt::checkpoint_reader r{path};
  CHECK(r.read_value<std::int64_t>("step") == 2);
  CHECK(r.read_value<float>("extra") == 3.0f);
  CHECK(dir.leftovers().empty());
}

TEST_CASE("checkpoint_writer: deferred sections are asked for once each, in order, and write the same file") {
  scratch_dir dir;
  auto const a = pattern(3_KiB + 5, 11), b = pattern(1_MiB, 12), c = pattern(0, 13);
  tt::checkpoint_writer plain;
  plain.add("a", a);
  plain.add_value("step", std::int64_t{7});
  plain.add("b", b);
  plain.add("c", c);
  plain.commit(dir.path / "plain.tide");

  tt::checkpoint_writer w;
  w.add_deferred("a", a.size(), 20);
  w.add_value("step", std::int64_t{7});
  w.add_deferred("b", b.size(), 21);
  w.add_deferred("c", c.size(), 22);
  CHECK(w.file_bytes() == plain.file_bytes());
  // The source reuses one buffer: each section's bytes are needed only until the next call.
  std::vector<std::size_t> asked;
  std::vector<std::byte> buffer;
  w.commit(dir.path / "deferred.tide", [&](std::size_t id) -> std::span<std::byte const> {
    asked.push_back(id);
    auto const& from = id == 20 ? a : id == 21 ? b : c;
    buffer.assign(from.begin(), from.end());
    return buffer;
  });
  CHECK(asked == std::vector<std::size_t>{20, 21, 22});
  CHECK(read_file(dir.path / "deferred.tide") == read_file(dir.path / "plain.tide"));
  // A source may return the bytes as a value it owns: they live until the section is written.
  w.commit(dir.path / "owned.tide", [&](std::size_t id) { return id == 20 ? a : id == 21 ? b : c; });
  CHECK(read_file(dir.path / "owned.tide") == read_file(dir.path / "plain.tide"));
  CHECK(fs::file_size(dir.path / "deferred.tide") == w.file_bytes());
  tt::checkpoint_reader r{dir.path / "deferred.tide"};
  std::vector<std::byte> got(b.size());
  r.read("b", got);
  CHECK(got == b);
  CHECK(r.read_value<std::int64_t>("step") == 7);
}

TEST_CASE("checkpoint_writer: a deferred section without its source, of the wrong size, or whose source throws "
          "is refused, and the previous file stays") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  write_small(path);
  auto const before = read_file(path);
  auto const data = pattern(4_KiB, 3);
  tt::checkpoint_writer w;
  w.add("first", data);
  w.add_deferred("state", data.size(), 0);
  auto const none = error_of([&] { w.commit(path); });
  CHECK(none.category() == tide::errc::usage);
  CHECK(has(none.message(), "commit(path, source)"));
  auto const short_by_one = error_of([&] {
    w.commit(path, [&](std::size_t) { return std::span<std::byte const>(data).first(data.size() - 1); });
  });
  CHECK(short_by_one.category() == tide::errc::usage);
  CHECK(has(short_by_one.message(), "gave 4095 bytes for section \"state\", added with 4096"));
  CHECK(has(short_by_one.message(), "is untouched"));
  auto const thrown = error_of([&] {
    w.commit(path, [&](std::size_t) -> std::span<std::byte const> { TIDE_FAIL(io, "the source's file is gone"); });
  });
  CHECK(thrown.category() == tide::errc::io);
  CHECK(has(thrown.message(), "the source's file is gone"));
  CHECK(read_file(path) == before);
  CHECK(dir.leftovers().empty());
  load_small(path);
}

TEST_CASE("checkpoint: concurrent reads of one reader") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  auto const a = pattern(256_KiB, 5), b = pattern(300_KiB, 6);
  tt::checkpoint_writer w;
  w.add("a", a);
  w.add("b", b);
  w.commit(path);
  tt::checkpoint_reader const r{path};
  std::vector<std::byte> ga(a.size()), gb(b.size());
  std::thread t{[&] { r.read("a", ga); }};
  r.read("b", gb);
  t.join();
  CHECK(ga == a);
  CHECK(gb == b);
}

TEST_CASE("checkpoint_writer: bad names are refused") {
  tt::checkpoint_writer w;
  auto const x = pattern(4, 1);
  CHECK(error_of([&] { w.add("", x); }).category() == tide::errc::usage);
  auto const e = error_of([&] { w.add(std::string(65, 'x'), x); });
  CHECK(e.category() == tide::errc::usage);
  CHECK(has(e.message(), "has 65 bytes; names have 1 to 64"));
  w.add("x", x);
  auto const dup = error_of([&] { w.add_value("x", 1); });
  CHECK(dup.category() == tide::errc::usage);
  CHECK(has(dup.message(), "\"x\" was already added"));
  CHECK(w.section_count() == 1);
}

TEST_CASE("checkpoint_writer: a failed commit removes its tmp file and leaves the path untouched") {
  scratch_dir dir;
  auto const data = pattern(1000, 7);
  tt::checkpoint_writer w;
  w.add("params", data);

  SUBCASE("missing folders are created; a folder that cannot be is an io error naming it") {
    auto const path = dir.path / "no" / "such" / "ckpt.tide";
    w.commit(path);
    CHECK(tt::checkpoint_reader(path).size_of("params") == data.size());
    std::ofstream(dir.path / "a-file") << "x";  // a file where a folder should be
    auto const blocked = dir.path / "a-file" / "sub" / "ckpt.tide";
    auto const e = error_of([&] { w.commit(blocked); });
    CHECK(e.category() == tide::errc::io);
    CHECK(has(e.message(), blocked.string()));
    CHECK(has(e.message(), "cannot create the folder"));
    CHECK(!fs::exists(blocked));
  }
  SUBCASE("the path is a directory: the rename fails") {
    auto const path = dir.path / "ckpt.tide";
    fs::create_directory(path);
    auto const e = error_of([&] { w.commit(path); });
    CHECK(e.category() == tide::errc::io);
    CHECK(has(e.message(), "rename"));
    CHECK(has(e.message(), path.string()));
    CHECK(fs::is_directory(path));
    CHECK(dir.leftovers().empty());
  }
  SUBCASE("a write fails half way (file size limit): the previous checkpoint survives") {
    auto const path = dir.path / "ckpt.tide";
    write_small(path);
    auto const before = read_file(path);
    auto const big = pattern(256_KiB, 8);
    tt::checkpoint_writer w2;
    w2.add("params", big);
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    rlimit small = old;
    small.rlim_cur = 64_KiB;
    auto* const previous = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    auto const e = error_of([&] { w2.commit(path); });
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, previous);
    CHECK(e.category() == tide::errc::io);
    CHECK(has(e.message(), "write of"));
    CHECK(has(e.message(), "File too large"));
    CHECK(has(e.message(), "is untouched"));
    CHECK(read_file(path) == before);
    CHECK(dir.leftovers().empty());
    load_small(path);
  }
}

TEST_CASE("checkpoint_reader: wrong magic, wrong version, size mismatch, missing section") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  write_small(path);
  auto const good = read_file(path);

  SUBCASE("not a checkpoint") {
    auto const text = std::string("hello, this is a text file and not a checkpoint\n");
    write_file(path, std::as_bytes(std::span{text.data(), text.size()}));
    auto const e = error_of([&] { tt::checkpoint_reader{path}; });
    CHECK(e.category() == tide::errc::corrupt);
    CHECK(has(e.message(), "not a tide checkpoint"));
    CHECK(has(e.message(), path.string()));
  }
  SUBCASE("a newer format version") {
    auto bad = good;
    bad[8] = std::byte{2};
    write_file(path, bad);
    auto const e = error_of([&] { tt::checkpoint_reader{path}; });
    CHECK(e.category() == tide::errc::usage);
    CHECK(has(e.message(), "checkpoint format version 2, this tide reads 1"));
  }
  SUBCASE("missing file") {
    auto const e = error_of([&] { tt::checkpoint_reader{dir.path / "nothing.tide"}; });
    CHECK(e.category() == tide::errc::io);
    CHECK(has(e.message(), "nothing.tide"));
  }
  SUBCASE("trailing bytes") {
    auto bad = good;
    bad.push_back(std::byte{0});
    write_file(path, bad);
    auto const e = error_of([&] { tt::checkpoint_reader{path}; });
    CHECK(e.category() == tide::errc::corrupt);
    CHECK(has(e.message(), "1 unexpected bytes after section \"moments\""));
  }
  SUBCASE("size mismatch: the buffer is left alone") {
    tt::checkpoint_reader r{path};
    std::vector<std::byte> out(32, std::byte{0xAB});
    auto const e = error_of([&] { r.read("params", out); });
    CHECK(e.category() == tide::errc::usage);
    CHECK(has(e.message(), "section \"params\" holds 64 bytes, the model needs 32 (shape mismatch"));
    CHECK(out == std::vector<std::byte>(32, std::byte{0xAB}));
    CHECK(error_of([&] { (void)r.read_value<std::int32_t>("step"); }).category() == tide::errc::usage);
  }
  SUBCASE("missing section: the message lists the present ones") {
    tt::checkpoint_reader r{path};
    std::vector<std::byte> out(8);
    auto const e = error_of([&] { r.read("optimizer", out); });
    CHECK(e.category() == tide::errc::usage);
    CHECK(has(e.message(), "no section \"optimizer\""));
    CHECK(has(e.message(), "\"params\", \"empty\", \"step\", \"moments\""));
    CHECK(error_of([&] { (void)r.size_of("optimizer"); }).category() == tide::errc::usage);
  }
  SUBCASE("checksum mismatch: named, stored and computed; verify() finds it too") {
    auto bad = good;
    bad[bad.size() - 1] ^= std::byte{0x10};  // last byte of "moments"
    write_file(path, bad);
    tt::checkpoint_reader r{path};  // the header and table are fine
    std::vector<std::byte> params(64);
    r.read("params", params);
    CHECK(params == pattern(64, 1));
    std::vector<std::byte> out(37);
    auto const e = error_of([&] { r.read("moments", out); });
    CHECK(e.category() == tide::errc::corrupt);
    CHECK(has(e.message(), "section \"moments\": checksum mismatch (stored 0x"));
    CHECK(has(e.message(), ", computed 0x"));
    auto const v = error_of([&] { r.verify(); });
    CHECK(v.category() == tide::errc::corrupt);
    CHECK(has(v.message(), "section \"moments\""));
  }
}

TEST_CASE("checkpoint_reader: one flipped byte anywhere is caught and named") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  write_small(path);
  auto const good = read_file(path);
  auto const layout = small_layout();
  REQUIRE(layout.back().end == good.size());
  load_small(path);  // the clean file loads

  // Flip in place with pwrite: rewriting the whole file each time is slow on ext4 (a truncating
  // rewrite forces a flush on close).
  tt::checkpoint_detail::file_descriptor fd{::open(path.c_str(), O_RDWR | O_CLOEXEC)};
  REQUIRE(fd.valid());
  auto const put = [&](std::size_t at, std::byte b) {
    REQUIRE(::pwrite(fd.get(), &b, 1, static_cast<off_t>(at)) == 1);
  };
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string const& where =
        std::find_if(layout.begin(), layout.end(), [&](region const& g) { return i < g.end; })->name;
    for (auto const mask : {std::byte{0x01}, std::byte{0x80}, std::byte{0xFF}}) {
      put(i, good[i] ^ mask);
      CAPTURE(i);
      CAPTURE(where);
      auto const e = error_of([&] { load_small(path); });
      CAPTURE(e.message());
      REQUIRE((e.category() == tide::errc::corrupt || e.category() == tide::errc::usage));
      // The header's count and table-size fields are checked with the table.
      bool const named = has(e.message(), where) || (where == "header" && has(e.message(), "section table"));
      REQUIRE(named);
    }
    put(i, good[i]);
  }
  CHECK(read_file(path) == good);
  load_small(path);
}

TEST_CASE("checkpoint_reader: truncation at every length is caught and names what was being read") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  write_small(path);
  auto const good = read_file(path);
  auto const layout = small_layout();
  auto const cut = dir.path / "cut.tide";
  write_file(cut, good);
  for (std::size_t n = good.size(); n-- > 0;) {  // shrink in place: no rewrite per length
    REQUIRE(::truncate(cut.c_str(), static_cast<off_t>(n)) == 0);
    // The first part that the n bytes do not hold whole.
    std::string const& where =
        std::find_if(layout.begin(), layout.end(), [&](region const& g) { return n < g.end; })->name;
    CAPTURE(n);
    auto const e = error_of([&] { tt::checkpoint_reader{cut}; });  // caught at open, before any read
    CAPTURE(e.message());
    REQUIRE(e.category() == tide::errc::corrupt);
    REQUIRE((has(e.message(), "truncated in the " + where) || has(e.message(), "truncated in " + where)));
  }
}

TEST_CASE("checkpoint: SIGKILL in the middle of a commit leaves the previous checkpoint intact") {
  scratch_dir dir;
  auto const path = dir.path / "ckpt.tide";
  write_small(path);
  auto const good = read_file(path);
  std::uint64_t const big = child_block * child_blocks;

  // Kill once the tmp file holds `at_least` bytes, `delay_ms` later.
  struct when {
    std::uint64_t at_least;
    int delay_ms;
  };
  int landed_total = 0;
  for (auto const plan : {when{0, 0}, when{1, 2}, when{8_MiB, 1}, when{24_MiB, 3}, when{40_MiB, 0}}) {
    CAPTURE(plan.at_least);
    CAPTURE(plan.delay_ms);
    bool landed = false;
    for (int attempt = 0; attempt < 4 && !landed; ++attempt) {
      int fds[2];
      REQUIRE(::pipe(fds) == 0);
      REQUIRE(::fcntl(fds[0], F_SETFD, FD_CLOEXEC) == 0);  // the write end stays open across exec
      std::vector<std::string> env_strings;
      for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
      env_strings.push_back("TIDE_CHECKPOINT_CHILD=" + path.string());
      env_strings.push_back("TIDE_CHECKPOINT_CHILD_FD=" + std::to_string(fds[1]));
      std::vector<char*> envp;
      for (auto& s : env_strings) envp.push_back(s.data());
      envp.push_back(nullptr);
      char exe[] = "/proc/self/exe";
      char* argv[] = {exe, nullptr};

      pid_t const pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::execve(exe, argv, envp.data());
        ::_exit(127);
      }
      ::close(fds[1]);
      char go = 0;
      ssize_t const got = ::read(fds[0], &go, 1);
      ::close(fds[0]);
      int status = 0;
      if (got != 1) {
        ::waitpid(pid, &status, 0);
        FAIL("the child died before committing, status ", status);
      }

      fs::path tmp = path;
      tmp += ".tmp-" + std::to_string(pid);
      bool reaped = false;
      auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (;;) {
        struct stat st{};
        if (::stat(tmp.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= plan.at_least) break;
        if (::waitpid(pid, &status, WNOHANG) == pid) {
          reaped = true;  // finished before we saw the tmp file grow that far
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) {  // a hang guard, not a timing check
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          FAIL("the child never grew its tmp file ", tmp.string(), " to ", plan.at_least, " bytes");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(plan.delay_ms));
      std::uint64_t tmp_bytes = 0;
      if (!reaped) {
        std::error_code ec;
        tmp_bytes = fs::file_size(tmp, ec);
        bool const tmp_at_kill = !ec;
        ::kill(pid, SIGKILL);
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        // The child is dead: if its tmp file is still there, it died before the rename.
        landed = tmp_at_kill && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && fs::exists(tmp);
      }

      // Whatever happened, the path holds one whole checkpoint: the old one, or the new one.
      if (landed) {
        CHECK(read_file(path) == good);
        load_small(path);
        tt::checkpoint_reader{path}.verify();
        MESSAGE("killed with ", tide::bytes_of{tmp_bytes}, " of ", tide::bytes_of{big}, " in the tmp file");
        fs::remove(tmp);
        ++landed_total;
      } else {
        tt::checkpoint_reader r{path};
        if (r.contains("params")) {
          CHECK(read_file(path) == good);
        } else {
          r.verify();  // the child finished: its checkpoint is whole
          CHECK(r.read_value<std::int64_t>("step") == 2);
          write_small(path);
        }
        fs::remove(tmp);
      }
    }
    CHECK(landed);
  }
  CHECK(landed_total == 5);
  CHECK(dir.leftovers().empty());
}
