#pragma once
// Byte-level text data: a corpus of bytes (vocabulary 256), split into train and validation, and a
// loader of random windows of T+1 bytes, deterministic from a seed.
//
//   auto corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
//   tide::train::window_loader train{corpus, tide::train::split::train, B, T, /*seed=*/1};
//   train.next(inputs, targets);   // (B, T) int32 each: targets[b][t] = inputs[b][t+1] in the text
//
// A checkpoint stores one integer, windows_drawn() (the windows the whole job has drawn), and a
// resumed run, at the same shape or another, draws exactly what the uninterrupted run would have.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::train {

// The English `fortunes` Debian package: about 2.8 MB of text in one folder.
inline std::filesystem::path fortunes_path() { return "/usr/share/games/fortunes"; }

enum class split : std::uint8_t { train, validation };

class byte_corpus {
 public:
  byte_corpus() = default;
  // The last `validation_fraction` of the bytes are held out for validation.
  explicit byte_corpus(std::string text, double validation_fraction = 0.1) : text_(std::move(text)) {
    TIDE_REQUIRE(validation_fraction > 0.0 && validation_fraction < 1.0,
                 "validation_fraction must be in (0, 1), got ", validation_fraction);
    boundary_ = static_cast<std::size_t>(static_cast<double>(text_.size()) * (1.0 - validation_fraction));
  }

  // A file, or a folder whose regular files are read in name order (fortune's index files
  // *.dat and its *.u8 duplicates are skipped).
  static byte_corpus from_path(std::filesystem::path const& path, double validation_fraction = 0.1) {
    namespace fs = std::filesystem;
    std::error_code ec;
    TIDE_CHECK(fs::exists(path, ec), io, "no text at ", path.string(),
               path == fortunes_path() ? " (install the Debian package `fortunes`; ./tide does)" : "");
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (auto const& entry : fs::directory_iterator(path)) {
        auto const ext = entry.path().extension();
        if (entry.is_regular_file() && !entry.is_symlink() && ext != ".dat" && ext != ".u8")
          files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    std::string text;
    for (auto const& f : files) {
      std::ifstream in(f, std::ios::binary);
      TIDE_CHECK(in.good(), io, "cannot read ", f.string());
      text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    TIDE_CHECK(!text.empty(), io, "no bytes read from ", path.string());
    return byte_corpus(std::move(text), validation_fraction);
  }

  [[nodiscard]] std::string_view bytes() const noexcept { return text_; }
  [[nodiscard]] std::string_view part(split s) const noexcept {
    std::string_view const all = text_;
    return s == split::train ? all.substr(0, boundary_) : all.substr(boundary_);
  }

 private:
  std::string text_;
  std::size_t boundary_ = 0;
};

// SplitMix64 of (seed, counter): a counter-based generator, so any draw can be recomputed from
// its index alone (that is what makes the loader's position a single integer).
constexpr std::uint64_t splitmix64(std::uint64_t seed, std::uint64_t counter) noexcept {
  std::uint64_t z = seed + (counter + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Which part of each global batch this process draws: with data parallelism, rank r of W draws
// rows [r B, (r + 1) B) of the W B windows that one process with batch W B would draw at the same
// position. So the ranks together see exactly one process's batches, nothing twice, and a resumed
// run (position and shard) draws what the uninterrupted one would have.
struct shard {
  int rank = 0;
  int ranks = 1;
};

class window_loader {
 public:
  window_loader(byte_corpus const& corpus, split which, int batch, int seq, std::uint64_t seed, shard part = {})
      : text_(corpus.part(which)), batch_(batch), seq_(seq), seed_(seed), shard_(part) {
    TIDE_REQUIRE(batch >= 1 && seq >= 1, "window_loader needs B >= 1 and T >= 1, got B=", batch, " T=", seq);
    TIDE_REQUIRE(part.ranks >= 1 && part.rank >= 0 && part.rank < part.ranks, "window_loader: shard rank ",
                 part.rank, " of ", part.ranks, " ranks; pass 0 <= rank < ranks (the communicator's rank() and size())");
    TIDE_REQUIRE(text_.size() > static_cast<std::size_t>(seq) + 1, "the ",
                 which == split::train ? "training" : "validation", " text has ", text_.size(),
                 " bytes, fewer than a window of T+1 = ", seq + 1);
  }

  [[nodiscard]] int batch() const noexcept { return batch_; }
  [[nodiscard]] int seq() const noexcept { return seq_; }
  [[nodiscard]] shard part() const noexcept { return shard_; }

  // inputs, targets: (B, T) int32, contiguous.
  void next(tensor_view<std::int32_t> inputs, tensor_view<std::int32_t> targets) {
    shape const want{batch_, seq_};
    TIDE_REQUIRE(inputs.extents() == want && targets.extents() == want && inputs.is_contiguous() &&
                     targets.is_contiguous(),
                 "window_loader::next wants contiguous (B, T) = (", batch_, ", ", seq_, ") views");
    std::uint64_t const windows = text_.size() - static_cast<std::size_t>(seq_);  // start positions
    for (int b = 0; b < batch_; ++b) {
      std::uint64_t const draw = position_ * global_batch() +
                                 static_cast<std::uint64_t>(shard_.rank) * static_cast<std::uint64_t>(batch_) +
                                 static_cast<std::uint64_t>(b);
      std::size_t const start = static_cast<std::size_t>(splitmix64(seed_, draw) % windows);
      for (int t = 0; t < seq_; ++t) {
        auto const at = start + static_cast<std::size_t>(t);
        inputs(b, t) = static_cast<unsigned char>(text_[at]);
        targets(b, t) = static_cast<unsigned char>(text_[at + 1]);
      }
    }
    ++position_;
  }

  // Batches this loader has drawn; seek() restores it (same batch and shard).
  [[nodiscard]] std::uint64_t position() const noexcept { return position_; }
  void seek(std::uint64_t position) noexcept { position_ = position; }

  // Windows the whole job has drawn, every rank's together: what a checkpoint keeps, so that a
  // run resumed with other rows per rank, ranks or micro-batches draws on where the job stopped.
  [[nodiscard]] std::uint64_t windows_drawn() const noexcept { return position_ * global_batch(); }
  void seek_windows(std::uint64_t drawn) {
    TIDE_REQUIRE(drawn % global_batch() == 0, "window_loader: the job drew ", drawn, " windows, not a whole number "
                 "of this job's batches of ", global_batch(), " (", batch_, " rows x ", shard_.ranks, " ranks); resume "
                 "with rows per rank and ranks whose product divides ", drawn);
    position_ = drawn / global_batch();
  }

 private:
  [[nodiscard]] std::uint64_t global_batch() const noexcept {
    return static_cast<std::uint64_t>(batch_) * static_cast<std::uint64_t>(shard_.ranks);
  }

  std::string_view text_;
  int batch_, seq_;
  std::uint64_t seed_;
  shard shard_;
  std::uint64_t position_ = 0;
};

}  // namespace tide::train
