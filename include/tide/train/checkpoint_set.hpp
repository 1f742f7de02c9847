#pragma once
// A checkpoint set: the checkpoint of a ZeRO trainer, one shard per rank plus a manifest, in one
// folder. Each rank writes the tensors of the chunks it owns (parameters, master, optimizer
// state) to its own shard; once every rank's shard is on disk, rank 0 replaces the manifest, and
// that rename is the commit: until then the manifest names the previous set, whose files are
// left alone, so a job killed anywhere in a save leaves the last complete set to resume from.
//
//   run/ckpt/manifest.tide                  the set that is the checkpoint: its folder, ranks, step
//   run/ckpt/set-000012-1a2b3c/rank-0-of-2.tide
//   run/ckpt/set-000012-1a2b3c/rank-1-of-2.tide
//
// Sections are per tensor, by name ("p/h0.ln1.w", "m/h0.ln1.w", ...), as in a single-file
// checkpoint, so a set loads on any number of ranks: each rank reads every shard and takes the
// parameters and the state of the chunks it owns now (train/trainer.hpp, docs/comm.md).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>

#include "tide/core/error.hpp"
#include "tide/train/checkpoint.hpp"

namespace tide::train {

struct checkpoint_manifest {
  std::string set;          // the folder of the set's shards, next to the manifest
  std::int32_t ranks = 0;   // shards in the set: rank-<r>-of-<ranks>.tide, r < ranks
  std::int64_t step = 0;    // the trainer's step count when saved
};

namespace checkpoint_set {

inline std::filesystem::path manifest_path(std::filesystem::path const& dir) { return dir / "manifest.tide"; }

// Whether `path` is a checkpoint set's folder (it holds a manifest).
inline bool is_set(std::filesystem::path const& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(manifest_path(path), ec);
}

// "set-000012-1a2b3c": a new name for every save (the nonce: rank 0's clock, shared by all ranks),
// so a save never writes into the files of the set the manifest names.
inline std::string set_name(std::int64_t step, std::uint64_t nonce) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "set-%06lld-%llx", static_cast<long long>(step),
                static_cast<unsigned long long>(nonce & 0xffffffffffull));
  return buf;
}

inline std::filesystem::path shard_path(std::filesystem::path const& dir, std::string const& set, int rank, int ranks) {
  return dir / set / ("rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".tide");
}

// The commit of a set: atomically, as every checkpoint file.
inline void write_manifest(std::filesystem::path const& dir, checkpoint_manifest const& m) {
  checkpoint_writer w;
  w.add("manifest.set", std::as_bytes(std::span(m.set)));
  w.add_value("manifest.ranks", m.ranks);
  w.add_value("manifest.step", m.step);
  w.commit(manifest_path(dir));
}

// The manifest of the set at `dir`; a missing or damaged one is a tide::error naming it.
inline checkpoint_manifest read_manifest(std::filesystem::path const& dir) {
  auto const path = manifest_path(dir);
  TIDE_CHECK(is_set(dir), io, "checkpoint set ", dir.string(), ": no manifest (", path.string(),
             "); it is not a checkpoint set, or no save of one ever completed");
  checkpoint_reader const r(path);
  r.verify();
  for (char const* s : {"manifest.set", "manifest.ranks", "manifest.step"})
    TIDE_CHECK(r.contains(s), corrupt, path.string(), ": no section \"", s, "\"; not a tide checkpoint manifest");
  checkpoint_manifest m;
  m.set.resize(r.size_of("manifest.set"));
  r.read("manifest.set", std::as_writable_bytes(std::span(m.set)));
  m.ranks = r.read_value<std::int32_t>("manifest.ranks");
  m.step = r.read_value<std::int64_t>("manifest.step");
  TIDE_CHECK(m.ranks >= 1 && m.set.starts_with("set-") && m.set.find('/') == std::string::npos, corrupt, path.string(),
             ": the manifest names ", m.ranks, " shards in folder \"", m.set, "\"; it is damaged");
  return m;
}

// After a commit: the folders of older sets (and of saves that never committed) go. Best effort:
// what cannot be removed stays, and the checkpoint is already complete.
inline void remove_other_sets(std::filesystem::path const& dir, std::string const& keep) noexcept {
  std::error_code ec;
  for (auto const& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string const name = e.path().filename().string();
    if (name != keep && name.starts_with("set-") && e.is_directory(ec)) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace checkpoint_set
}  // namespace tide::train
