// Figure nvme_read_vs_fio: sequential read bandwidth of memory::file_store, the I/O half of an
// NVMe tier. The store writes a file of 64 MiB blocks (1 GiB; 16 MiB under TIDE_BENCH_QUICK=1),
// then reads every block in order into pinned_pool buffers (what a tier reads into: transparent
// huge pages), two blocks in flight, each split into requests of request_bytes served by
// queue_depth I/O threads (the defaults). Anchor: fio reading the same file, 1 MiB requests, 8 in
// flight (libaio), O_DIRECT when the store uses it, into hugetlb buffers (the best a tool does on
// this disk: 4 KiB-page buffers read 2x slower into a virtio disk), in the same run. When the
// kernel has too few free hugetlb pages the bench raises vm.nr_hugepages for the run if it may
// (root) and restores it; otherwise fio reads into ordinary pages and the anchor's text says so.
// Every measurement takes its turn in each of 7 rounds and the figures are medians (on a shared
// machine the load drifts). Goal: ratio >= 0.9.
// Detail: the median of the per-round ratios; dd bs=1M reading the same file (the anchor of the
// earlier nvme_read_vs_probe); a plain loop of 1 MiB preads into the same buffers (what the store
// costs over the system calls themselves); the store reading into buffers in transparent huge
// pages, and into hugetlb pages as fio's (0 when none could be had); queue depths 1, 2, 4 (stores
// of their own, in the same rounds: the sweep behind the default, 8); write bandwidth against dd
// overwriting a file of the same size; the mode and the sizes. The file, its mode and the machine
// go to stderr.
// The folder is TIDE_BENCH_FOLDER, or the system's temp folder. The files shrink, with a note,
// when the folder has less than twice their size free.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/file_store.hpp>
#include <tide/memory/pinned_pool.hpp>

#include "harness.hpp"

namespace mem = tide::memory;
namespace fs = std::filesystem;
using namespace tide::literals;

namespace {

constexpr std::size_t in_flight = 2;  // blocks issued ahead: the next block's requests queue behind this one's

// `in_flight` block buffers, touched so no page fault is timed.
struct buffers {
  std::vector<void*> ring;
};

struct pinned_buffers : buffers {
  mem::pinned_pool<tide::host> pool{{.lock_pages = false}};  // ulimit -l is often small; locking does not change I/O
  explicit pinned_buffers(std::size_t bytes) {
    for (std::size_t i = 0; i < in_flight; ++i) {
      ring.push_back(pool.allocate(bytes, mem::file_store::alignment));
      std::memset(ring.back(), static_cast<int>(0x5a + i), bytes);
    }
  }
};

// The same in transparent huge pages mapped here (madvise before the first touch): a 1 MiB
// O_DIRECT read then pins 1 page instead of 256. pinned_pool's blocks are such pages too; this
// checks that the pool's buffers read as fast as hand-made ones.
struct huge_page_buffers : buffers {
  static constexpr std::size_t huge = 2_MiB;
  std::size_t mapped;
  std::vector<void*> maps;
  bool advised = true;
  explicit huge_page_buffers(std::size_t n) : mapped(tide::round_up(n, huge) + huge) {
    for (std::size_t i = 0; i < in_flight; ++i) {
      void* const m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) {
        std::perror("bench_scale: mmap");
        std::exit(1);
      }
      maps.push_back(m);
      auto* p = reinterpret_cast<unsigned char*>(tide::round_up(reinterpret_cast<std::uintptr_t>(m), huge));
      advised = ::madvise(p, tide::round_up(n, huge), MADV_HUGEPAGE) == 0 && advised;
      std::memset(p, static_cast<int>(0x5a + i), n);
      ring.push_back(p);
    }
  }
  ~huge_page_buffers() {
    for (void* m : maps) ::munmap(m, mapped);
  }
  huge_page_buffers(huge_page_buffers const&) = delete;
  huge_page_buffers& operator=(huge_page_buffers const&) = delete;
};

// The same in hugetlb pages (MAP_HUGETLB: 2 MiB pages the kernel reserved, never split), when
// there are enough free: what fio reads into. Empty (`ring` has no buffers) otherwise.
struct hugetlb_buffers : buffers {
  std::size_t mapped = 0;
  std::vector<void*> maps;
  explicit hugetlb_buffers(std::size_t n) : mapped(tide::round_up(n, 2_MiB)) {
    for (std::size_t i = 0; i < in_flight; ++i) {
      void* const m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
      if (m == MAP_FAILED) break;
      maps.push_back(m);
      std::memset(m, static_cast<int>(0x5a + i), n);
    }
    if (maps.size() == in_flight) ring = maps;
  }
  ~hugetlb_buffers() {
    for (void* m : maps) ::munmap(m, mapped);
  }
  hugetlb_buffers(hugetlb_buffers const&) = delete;
  hugetlb_buffers& operator=(hugetlb_buffers const&) = delete;
};

// Every block in order, `in_flight` at a time.
void pass(mem::file_store& store, buffers const& b, bool write) {
  std::vector<mem::file_store::ticket> t(store.blocks());
  for (std::size_t i = 0; i < store.blocks(); ++i) {
    if (i >= in_flight) store.wait(t[i - in_flight]);
    void* buf = b.ring[i % in_flight];
    t[i] = write ? store.write_async(i, buf) : store.read_async(i, buf);
  }
  for (std::size_t i = store.blocks() > in_flight ? store.blocks() - in_flight : 0; i < store.blocks(); ++i)
    store.wait(t[i]);
}

// The same bytes into the same buffers by one thread's 1 MiB preads, no store.
void pread_loop(int fd, std::size_t block, std::size_t blocks, buffers const& b) {
  for (std::size_t i = 0; i < blocks; ++i) {
    auto* buf = static_cast<unsigned char*>(b.ring[i % in_flight]);
    for (std::size_t at = 0; at < block; at += 1_MiB) {
      if (::pread(fd, buf + at, 1_MiB, static_cast<off_t>(i * block + at)) != static_cast<ssize_t>(1_MiB)) {
        std::perror("bench_scale: pread");
        std::exit(1);
      }
    }
  }
}

double gbs(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

template <class F>
double seconds_of(F&& f) {
  auto const t0 = tide::bench::clock::now();
  f();
  return std::chrono::duration<double>(tide::bench::clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string shell_quoted(std::string const& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

std::string size_text(std::size_t bytes) {
  std::ostringstream os;
  os << tide::bytes_of{bytes};
  return os.str();
}

// What `cmd` prints (stdout and stderr); its exit status in `status`.
std::string output_of(std::string const& cmd, int& status) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    std::fprintf(stderr, "bench_scale: cannot run %s\n", cmd.c_str());
    std::exit(1);
  }
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) out += line;
  status = ::pclose(p);
  return out;
}

// GB/s by dd's own count: "<bytes> bytes (...) copied, <seconds> s, ..." on its last line.
double dd_gbs(std::string const& args) {
  int status = 0;
  std::string const cmd = "LC_ALL=C dd " + args, out = output_of(cmd, status);
  auto const copied = out.rfind(" copied, ");
  if (status != 0 || copied == std::string::npos) {
    std::fprintf(stderr, "bench_scale: %s failed:\n%s", cmd.c_str(), out.c_str());
    std::exit(1);
  }
  auto const line_start = out.rfind('\n', copied);
  double const bytes = std::strtod(out.c_str() + (line_start == std::string::npos ? 0 : line_start + 1), nullptr);
  double const seconds = std::strtod(out.c_str() + copied + 9, nullptr);
  return bytes / seconds / 1e9;
}

// Whether the kernel has free hugetlb pages for `bytes` of fio's buffers (vm.nr_hugepages; none
// unless an administrator reserved them).
bool hugetlb_free_for(std::size_t bytes) {
  double const pages = tide::bench::meminfo("HugePages_Free"), page_kib = tide::bench::meminfo("Hugepagesize");
  return pages >= 0 && page_kib > 0 && pages * page_kib * 1024 >= static_cast<double>(bytes);
}

// vm.nr_hugepages before the bench raised it, or -1.
long hugetlb_pages_before = -1;

bool write_hugetlb_pages(long n) {
  FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "w");
  if (f == nullptr) return false;
  bool const ok = std::fprintf(f, "%ld\n", n) > 0;
  return std::fclose(f) == 0 && ok;
}

// Makes room in hugetlb pages for `bytes` of fio's buffers when the kernel has too few free and
// lets this process raise vm.nr_hugepages (root); the old value comes back when the bench exits,
// however it exits (atexit). Otherwise leaves the setting alone: fio then reads into ordinary
// pages, and the figure says so. Returns whether it raised the setting.
bool reserve_hugetlb(std::size_t bytes) {
  if (hugetlb_free_for(bytes)) return false;
  long n = -1;
  if (FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "r")) {
    if (std::fscanf(f, "%ld", &n) != 1) n = -1;
    std::fclose(f);
  }
  if (n < 0 || !write_hugetlb_pages(n + static_cast<long>(bytes / 2_MiB) + 1)) return false;
  hugetlb_pages_before = n;
  std::atexit([] { write_hugetlb_pages(hugetlb_pages_before); });
  return true;
}

// GB/s by fio's own count reading `bytes` of `path` sequentially: 1 MiB requests, 8 in flight
// (libaio), O_DIRECT when `direct`, into hugetlb buffers when `huge` (--iomem=shmhuge).
double fio_gbs(std::string const& path, std::size_t bytes, bool direct, bool huge) {
  int status = 0;
  std::string const cmd = "fio --name=probe --readonly --rw=read --bs=1M --iodepth=8 --ioengine=libaio --direct=" +
                          std::string(direct ? "1" : "0") + " --size=" + std::to_string(bytes) +
                          (huge ? " --iomem=shmhuge" : "") + " --output-format=json --filename=" + shell_quoted(path);
  std::string const out = output_of(cmd, status);
  auto const read = out.find("\"read\"");
  auto const bw = read == std::string::npos ? read : out.find("\"bw_bytes\"", read);
  auto const colon = bw == std::string::npos ? bw : out.find(':', bw);
  if (status != 0 || colon == std::string::npos) {
    std::fprintf(stderr, "bench_scale: %s failed (install fio: ./tide bench installs it):\n%s", cmd.c_str(),
                 out.c_str());
    std::exit(1);
  }
  return std::strtod(out.c_str() + colon + 1, nullptr) / 1e9;
}

}  // namespace

int main() {
  bool const quick = tide::bench::quick();
  char const* env = std::getenv("TIDE_BENCH_FOLDER");
  fs::path const folder = env != nullptr && env[0] != '\0' ? fs::path(env) : fs::temp_directory_path();
  std::size_t const block = quick ? 4_MiB : 64_MiB;
  std::size_t blocks = quick ? 4 : 16;  // 1 GiB: far beyond the device's and the VM host's caches of it
  int const rounds = quick ? 1 : 7;
  std::vector<std::size_t> const depths = {1, 2, 4};  // the sweep; the default (8) is the main store

  // Room for the main store's file and the sweep's, then dd's, with as much again to spare.
  std::size_t const files = 1 + depths.size();
  std::size_t const free_bytes = static_cast<std::size_t>(fs::space(folder).available);
  bool const shrunk = free_bytes < 2 * files * block * blocks;
  if (shrunk) {
    blocks = std::max<std::size_t>(1, free_bytes / (2 * files) / block);
    std::fprintf(stderr, "bench_scale: only %s free in %s: each file shrinks to %zu blocks of %zu MiB\n",
                 size_text(free_bytes).c_str(), folder.c_str(), blocks, block >> 20);
  }
  std::size_t const bytes = block * blocks;
  pinned_buffers pinned(block);
  huge_page_buffers huge(block);

  mem::file_store::options const defaults{.folder = folder, .block_bytes = block, .blocks = blocks};
  double write = 0, read = 0, read_huge = 0, read_hugetlb = 0, loop = 0, fio = 0, dd = 0, dd_write = 0, per_round = 0;
  std::vector<double> swept(depths.size());
  bool direct = false, fio_huge = false;
  constexpr std::size_t fio_buffers = 32 * 1_MiB;  // iodepth 8 of 1 MiB, and what fio adds (24 MiB were refused)
  // fio's buffers and the store's in hugetlb pages too (the detail's hugetlb_read_gbs).
  bool const reserved = reserve_hugetlb(fio_buffers + in_flight * tide::round_up(block, 2_MiB));
  hugetlb_buffers hugetlb(block);
  {
    mem::file_store store{defaults};
    direct = store.mode() == mem::file_store_mode::direct;
    std::fprintf(stderr,
                 "bench_scale: %s, mode %s, file %s (%zu blocks of %zu MiB), requests of %zu KiB, queue depth %zu, "
                 "machine %s\n",
                 store.path().c_str(), std::string(to_string(store.mode())).c_str(), size_text(bytes).c_str(), blocks,
                 block >> 20, defaults.request_bytes >> 10, defaults.queue_depth, tide::bench::machine_json().c_str());
    // The first pass fills the reserved extents; the timed ones overwrite, as a tier does.
    write = gbs(bytes, tide::bench::median_seconds([&] { pass(store, pinned, true); }, quick ? 1 : 3, 1));

    std::vector<std::unique_ptr<mem::file_store>> sweep;
    for (std::size_t depth : depths) {
      auto opts = defaults;
      opts.queue_depth = depth;
      sweep.push_back(std::make_unique<mem::file_store>(opts));
      pass(*sweep.back(), pinned, true);
    }
    int const fd = ::open(store.path().c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
      std::perror("bench_scale: open");
      return 1;
    }
    std::string const dd_read =
        "if=" + shell_quoted(store.path().string()) + " of=/dev/null bs=1M" + (direct ? " iflag=direct" : "");
    pass(store, pinned, false);  // warm-up, every path once
    pass(store, huge, false);
    if (!hugetlb.ring.empty()) pass(store, hugetlb, false);
    pread_loop(fd, block, blocks, pinned);
    dd_gbs(dd_read);
    fio_huge = hugetlb_free_for(fio_buffers);
    fio_gbs(store.path().string(), bytes, direct, fio_huge);
    std::vector<double> mine, mine_huge, mine_hugetlb, theirs, dd_rounds, plain, ratios;
    std::vector<std::vector<double>> depth_gbs(depths.size());
    for (int r = 0; r < rounds; ++r) {  // in turns: drift hits every path alike
      mine.push_back(gbs(bytes, seconds_of([&] { pass(store, pinned, false); })));
      theirs.push_back(fio_gbs(store.path().string(), bytes, direct, fio_huge));
      ratios.push_back(mine.back() / theirs.back());
      dd_rounds.push_back(dd_gbs(dd_read));
      plain.push_back(gbs(bytes, seconds_of([&] { pread_loop(fd, block, blocks, pinned); })));
      mine_huge.push_back(gbs(bytes, seconds_of([&] { pass(store, huge, false); })));
      if (!hugetlb.ring.empty()) mine_hugetlb.push_back(gbs(bytes, seconds_of([&] { pass(store, hugetlb, false); })));
      for (std::size_t d = 0; d < depths.size(); ++d)
        depth_gbs[d].push_back(gbs(bytes, seconds_of([&] { pass(*sweep[d], pinned, false); })));
    }
    ::close(fd);
    read = median(mine);
    fio = median(theirs);
    dd = median(dd_rounds);
    per_round = median(ratios);
    loop = median(plain);
    read_huge = median(mine_huge);
    read_hugetlb = mine_hugetlb.empty() ? 0 : median(mine_hugetlb);
    for (std::size_t d = 0; d < depths.size(); ++d) swept[d] = median(depth_gbs[d]);
  }

  {
    // dd overwriting a file of the same size (the second of two runs), as the store's timed writes overwrite.
    std::string name = (folder / "tide-dd-XXXXXX").string();
    int const fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd < 0) {
      std::perror("bench_scale: mkostemp");
      return 1;
    }
    ::close(fd);
    std::string const args = "if=/dev/zero of=" + shell_quoted(name) + " bs=1M count=" + std::to_string(bytes >> 20) +
                             " conv=notrunc" + (direct ? " oflag=direct" : "");
    dd_gbs(args);
    dd_write = dd_gbs(args);
    fs::remove(name);
  }

  tide::bench::figure f{
      .bench = "scale",
      .name = "nvme_read_vs_fio",
      .value = read,
      .unit = "GB/s",
      .anchor = std::string("fio --rw=read --bs=1M --iodepth=8 --ioengine=libaio") + (direct ? " --direct=1" : "") +
                (fio_huge ? " --iomem=shmhuge" : " (malloc buffers: no hugetlb pages reserved)"),
      .anchor_value = fio,
      .higher_is_better = true,
      .goal = 0.9,
      .detail = {{"direct", direct ? 1.0 : 0.0},
                 {"fio_huge_pages", fio_huge ? 1.0 : 0.0},
                 {"huge_pages_reserved_by_bench", reserved ? 1.0 : 0.0},
                 {"dd_read_gbs", dd},
                 {"vs_dd", read / dd},
                 {"file_mib", static_cast<double>(bytes >> 20)},
                 {"block_mib", static_cast<double>(block >> 20)},
                 {"blocks", static_cast<double>(blocks)},
                 {"request_kib", static_cast<double>(defaults.request_bytes >> 10)},
                 {"queue_depth", static_cast<double>(defaults.queue_depth)},
                 {"shrunk", shrunk ? 1.0 : 0.0},
                 {"rounds", static_cast<double>(rounds)},
                 {"ratio_median_of_rounds", per_round},
                 {"pread_loop_gbs", loop},
                 {"vs_pread_loop", read / loop},
                 {"huge_page_read_gbs", read_huge},
                 {"huge_page_ratio", read_huge / fio},
                 {"hugetlb_read_gbs", read_hugetlb},
                 {"hugetlb_ratio", read_hugetlb / fio},
                 {"huge_page_advised", huge.advised ? 1.0 : 0.0},
                 {"write_gbs", write},
                 {"dd_write_gbs", dd_write},
                 {"write_vs_dd", write / dd_write}},
  };
  for (std::size_t d = 0; d < depths.size(); ++d)
    f.detail.emplace_back("read_gbs_qd" + std::to_string(depths[d]), swept[d]);
  f.print();
}
