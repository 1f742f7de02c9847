#pragma once
// What the demos share (examples/01_train_gpt and examples/04_data_parallel): each run's folder,
// resuming one, the loss history a checkpoint carries so that a resumed run's picture covers the
// whole run, the stop on a signal, the digest of the parameters a test compares, and the model's
// memory options (--recompute, --offload-activations).
//
// Run folders: DIR/run-001, run-002, ...; a new run takes the next free number, --resume takes
// the latest one holding a checkpoint, or the run folder named after it.

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/core/error.hpp>
#include <tide/nn/gpt_config.hpp>
#include <tide/offload/report.hpp>
#include <tide/offload/trace_events.hpp>
#include <tide/train/checkpoint.hpp>
#include <tide/train/crc32c.hpp>

namespace demo {

namespace fs = std::filesystem;

// The number of a run folder's name ("run-007": 7), 0 for any other name.
inline int run_number(fs::path const& p) {
  std::string const name = p.filename().string();
  if (!name.starts_with("run-") || name.size() < 5 || name.size() > 13) return 0;
  int n = 0;
  auto const [end, ec] = std::from_chars(name.data() + 4, name.data() + name.size(), n);
  return ec == std::errc{} && end == name.data() + name.size() && n > 0 ? n : 0;
}

// The latest run folder under `dir` holding `checkpoint` (a file, or a checkpoint set's folder);
// empty if none.
inline fs::path latest_checkpointed_run(fs::path const& dir, fs::path const& checkpoint) {
  std::error_code ec;
  fs::path latest;
  int latest_n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    int const n = run_number(it->path());
    if (n > latest_n && fs::exists(it->path() / checkpoint, ec)) latest = it->path(), latest_n = n;
  }
  return latest;
}

// Creates the checkpoint dir (early: a bad --checkpoint-dir fails before any work).
inline void make_checkpoint_dir(fs::path const& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TIDE_CHECK(!ec, io, "--checkpoint-dir ", dir.string(), ": cannot create it: ", ec.message());
  TIDE_CHECK(fs::is_directory(dir, ec), io, "--checkpoint-dir ", dir.string(), ": not a folder");
}

// The run folder --resume continues: `named` (a run folder) when given, else the latest one under
// `dir` holding `checkpoint`. Throws tide::error(usage) saying what to pass when there is none.
inline fs::path resume_folder(fs::path const& dir, fs::path const& named, fs::path const& checkpoint) {
  std::error_code ec;
  if (!named.empty()) {
    TIDE_CHECK(fs::exists(named / checkpoint, ec), usage, "--resume ", named.string(), ": no ", checkpoint.string(),
               " in it; name a run folder that has one (or pass --resume alone for the latest under ", dir.string(),
               ")");
    return named;
  }
  fs::path const latest = latest_checkpointed_run(dir, checkpoint);
  if (latest.empty()) {
    bool const old_layout = fs::is_regular_file(dir / checkpoint, ec);  // before run folders
    TIDE_FAIL(usage, "--resume: no run folder under ", dir.string(), " has a ", checkpoint.string(),
              old_layout ? tide::detail::concat(" (", (dir / checkpoint).string(), " is from an older version: move it into ",
                                                (dir / "run-001").string(), "/ to resume it)")
                         : std::string("; start a run without --resume"));
  }
  return latest;
}

// The next free DIR/run-NNN, created; removed again at the end if nothing was written to it (a
// run that stopped on bad input leaves no empty folder behind). Under MPI rank 0 makes it and
// tells the others its number.
class new_run_folder {
 public:
  explicit new_run_folder(fs::path const& dir) {
    int highest = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      highest = std::max(highest, run_number(it->path()));
    TIDE_CHECK(!ec, io, "--checkpoint-dir ", dir.string(), ": cannot list it: ", ec.message());
    for (int n = highest + 1;; ++n) {  // create_directory is false when another run took n first
      char name[32];
      std::snprintf(name, sizeof name, "run-%03d", n);
      path_ = dir / name;
      if (fs::create_directory(path_, ec)) break;
      TIDE_CHECK(!ec, io, "--checkpoint-dir ", dir.string(), ": cannot create ", path_.string(), ": ", ec.message());
    }
  }
  ~new_run_folder() {
    std::error_code ec;
    if (fs::is_empty(path_, ec) && !ec) fs::remove(path_, ec);
  }
  new_run_folder(new_run_folder const&) = delete;
  new_run_folder& operator=(new_run_folder const&) = delete;
  [[nodiscard]] fs::path const& path() const noexcept { return path_; }

 private:
  fs::path path_;
};

// The losses of every step since the run began and the validation losses, carried in the
// checkpoint (sections "demo.losses", "demo.validation") so that a resumed run draws all of them.
struct loss_history {
  std::int64_t first_step = 1;                                // the step losses[0] belongs to
  std::vector<float> losses;                                  // one per step
  std::vector<std::pair<std::int64_t, float>> validation;     // (step, loss)

  // The writer keeps pointers to the sections until it commits: this history must outlive that.
  void write(tide::train::checkpoint_writer& w) {
    w.add_value("demo.first_step", first_step);
    w.add("demo.losses", std::as_bytes(std::span(losses)));
    packed_.clear();  // (step, loss) pairs as doubles: one trivially copyable array
    for (auto const& [s, l] : validation) packed_.insert(packed_.end(), {static_cast<double>(s), static_cast<double>(l)});
    w.add("demo.validation", std::as_bytes(std::span(packed_)));
  }
  // From a checkpoint that has them (one written before they existed leaves this empty).
  void read(tide::train::checkpoint_reader const& r) {
    if (!r.contains("demo.losses")) return;
    first_step = r.read_value<std::int64_t>("demo.first_step");
    losses.resize(r.size_of("demo.losses") / sizeof(float));
    r.read("demo.losses", std::as_writable_bytes(std::span(losses)));
    std::vector<double> v(r.size_of("demo.validation") / sizeof(double));
    r.read("demo.validation", std::as_writable_bytes(std::span(v)));
    validation.clear();
    for (std::size_t i = 0; i + 1 < v.size(); i += 2)
      validation.emplace_back(static_cast<std::int64_t>(v[i]), static_cast<float>(v[i + 1]));
  }
  // Drops what lies past `step` (a checkpoint older than the history it was read with).
  void trim_to(std::int64_t step) {
    auto const keep = static_cast<std::size_t>(std::clamp<std::int64_t>(step - first_step + 1, 0,
                                                                         static_cast<std::int64_t>(losses.size())));
    losses.resize(keep);
    std::erase_if(validation, [&](auto const& p) { return p.first > step; });
  }

 private:
  std::vector<double> packed_;
};

// CRC-32C of a run's parameters, in the model's order: two runs that end on the same bits print
// the same digest (the interrupt-and-resume test compares it with a straight run's).
struct digest {
  std::uint32_t crc = 0;
  void add(std::span<float const> v) { crc = tide::train::crc32c(std::as_bytes(v), crc); }
};

// --recompute: every block's activations recomputed in backward; --offload-activations: every
// block's saved activations moved to host memory between forward and backward (the head's
// logits stay). Both demos take both.
inline void memory_options(tide::nn::gpt_options& o, tide::nn::gpt_config const& config, bool recompute,
                           bool offload_activations) {
  if (recompute) o.recompute = tide::nn::block_set::all(config.layers);
  if (offload_activations)
    o.offload_activations = tide::nn::block_set::range(tide::nn::embedding_block, config.layers - 1);
}

// "SIGINT" / "SIGTERM".
inline char const* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// "48MiB", "1.5GiB", "500MB", "50000000": KiB, MiB, GiB are powers of 1024, KB, MB, GB powers of
// 1000, no unit is bytes. At most 1 PiB (no device has more); a fraction needs a unit.
inline std::size_t size_from(std::string_view flag, std::string_view text) {
  using namespace tide::literals;
  constexpr std::size_t most = std::size_t{1} << 50;
  auto const not_a_size = [&] {
    TIDE_FAIL(usage, flag, " ", text,
              ": not a size; pass bytes or a number and a unit, e.g. 48MiB, 1.5GiB, 500MB (KiB, MiB, GiB: "
              "powers of 1024; KB, MB, GB: powers of 1000)");
  };
  TIDE_CHECK(!text.starts_with('-'), usage, flag, " ", text, ": a size cannot be negative");
  std::size_t const digits = std::min(text.find_first_not_of("0123456789."), text.size());
  std::string_view const number = text.substr(0, digits), unit_text = text.substr(digits);
  if (number.find_first_of("0123456789") == std::string_view::npos || number.find('.') != number.rfind('.'))
    not_a_size();
  std::size_t unit = 0;
  for (auto const& [name, bytes] : {std::pair{"", 1_B}, std::pair{"B", 1_B}, std::pair{"KiB", 1_KiB},
                                    std::pair{"MiB", 1_MiB}, std::pair{"GiB", 1_GiB}, std::pair{"KB", 1_B * 1000},
                                    std::pair{"MB", 1_B * 1000 * 1000}, std::pair{"GB", 1_B * 1000 * 1000 * 1000}})
    if (unit_text == name) unit = bytes;
  if (unit == 0) not_a_size();
  std::size_t bytes = 0;
  if (number.find('.') == std::string_view::npos) {
    std::uint64_t n = 0;
    auto const [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    TIDE_CHECK(ec != std::errc::result_out_of_range && n <= most / unit, usage, flag, " ", text,
               ": too large (more than 1 PiB)");
    if (ec != std::errc{} || end != number.data() + number.size()) not_a_size();
    bytes = static_cast<std::size_t>(n) * unit;
  } else {
    TIDE_CHECK(unit > 1, usage, flag, " ", text, ": not a whole number of bytes; use a unit for a fraction (1.5MiB)");
    double v = 0;
    auto const [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc{} || end != number.data() + number.size()) not_a_size();
    double const b = v * static_cast<double>(unit);
    TIDE_CHECK(b <= static_cast<double>(most), usage, flag, " ", text, ": too large (more than 1 PiB)");
    bytes = static_cast<std::size_t>(b);
  }
  TIDE_CHECK(bytes > 0, usage, flag, " ", text, ": must be more than 0 bytes");
  return bytes;
}

// One step of the run, as the demos draw it: the memory tide of the scheduler's last step
// (memory-tide.svg) and the timeline `recorded` holds (step-trace.json, Chrome trace events) in
// `dir`. `what` names the scheduler and the rank in both titles. Returns the two paths.
template <class Scheduler>
std::pair<fs::path, fs::path> draw_step(fs::path const& dir, Scheduler const& sched,
                                        tide::offload::trace_recorder const& recorded, std::string const& what) {
  auto const tide_svg = dir / "memory-tide.svg", trace_json = dir / "step-trace.json";
  recorded.write(trace_json.string(), what + ", the last step of the demo");
  tide::offload::write_file(tide_svg.string(),
                            tide::offload::memory_tide_svg(sched.memory_tide(), what + ", one step of the demo",
                                                           {.first = "emb", .last = "head"}));  // nn::gpt's blocks
  return {tide_svg, trace_json};
}

}  // namespace demo
