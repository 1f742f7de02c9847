#pragma once
// make_trainer's checkpoints, out of line (the class is in train/trainer.hpp, which includes this
// file): the sections a save writes (parameters, masters, optimizer state, a sink's extra lists,
// the caller's extra sections), a checkpoint set of one file per rank (ZeRO, per-rank residuals,
// pipeline stages), and the load: the checks it makes before it changes anything, then the reads.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "tide/train/trainer.hpp"

namespace tide::train {

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
std::string trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::shape_text() const {
  std::string out;
  auto const& list = model_.parameters();
  for (std::size_t i = 0; i < list.size(); ++i) {
    shape s = list[i].shape;
    if constexpr (tensor_parallel) s = tensor_.whole[i];
    out.append(list[i].name()).append(" ").append(to_string(list[i].type));
    for (int d = 0; d < s.rank; ++d) out.append(" ").append(std::to_string(s.dims[d]));
    out.append("\n");
  }
  return out;
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
std::string trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::tensor_name(std::uint32_t i, int k,
                                                                                   int t) const {
  auto const name = model_.parameters()[i].name();
  return t > 1 && tensor_.sharded(i) ? detail::shard_name(name, k, t) : std::string(name);
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
int trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::saved_tensor(std::span<checkpoint_reader const> files) {
  if (!files[0].contains("trainer.tensor") || files[0].size_of("trainer.tensor") != sizeof(std::int32_t)) return 1;
  return files[0].read_value<std::int32_t>("trainer.tensor");
}

namespace detail {
// The file of `files` that holds section `name` (files.size(): none).
inline std::size_t file_with(std::span<checkpoint_reader const> files, std::string const& name) {
  for (std::size_t f = 0; f < files.size(); ++f)
    if (files[f].contains(name)) return f;
  return files.size();
}
}  // namespace detail

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
void trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::read_tensor(std::span<checkpoint_reader const> files,
                                                                         std::size_t from, std::string const& prefix,
                                                                         std::uint32_t i, std::span<std::byte> out) {
  if constexpr (tensor_parallel) {
    int const ts = saved_tensor(files);
    auto read = [&](int k, std::span<std::byte> to) {
      std::string const name = section(prefix, tensor_name(i, k, ts));
      files[detail::file_with(files, name)].read(name, to);  // check_files found it
    };
    if (!tensor_.sharded(i) || ts == tensor_.size()) {
      read(tensor_.rank(), out);
    } else {
      std::span<float> const to(reinterpret_cast<float*>(out.data()), out.size() / sizeof(float));
      tensor_.reshard(i, ts, read, to);
    }
  } else {
    files[from].read(section(prefix, model_.parameters()[i].name()), out);
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
void trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::add_sections(checkpoint_writer& w) {
  shape_ = shape_text();
  w.add("model.shape", std::as_bytes(std::span(shape_)));
  state const st{step_, scheduler_.optimizer_steps(), scaler_.scale(), scaler_.good_steps(), scaler_.skipped()};
  w.add_value("trainer.state", st);
  w.add_value("trainer.ranks", run_shape());  // which shape wrote the sink's lists (read_extras)
  if constexpr (tensor_parallel) w.add_value("trainer.tensor", std::int32_t{tensor_.size()});
  auto const& list = model_.parameters();
  for (std::uint32_t i = 0; i < list.size(); ++i) {
    std::uint32_t const j = local(i);
    if (j == offload::no_index) continue;  // another pipeline stage's
    std::string const name = tensor_name(i, tensor_.rank(), tensor_.size());
    // A sink's lists are this rank's own (a residual), kept for every chunk: all in its shard.
    for (std::size_t k = 0; k < extra_lists.size(); ++k) w.add(extra_section(k, name), scheduler_.extra_bytes(k, j));
    // ZeRO: the rank that owns its chunk writes it; a pipeline: one copy; tensor parallel: each
    // rank its shard, rank 0 a replicated tensor.
    if (!writes(j)) continue;
    std::size_t const id = ids_per_tensor * std::size_t{j};
    w.add_deferred(section("p/", name), scheduler_.tensor_size(chunk::chunk_role::param, j), id);
    for (std::size_t k = 0; k < Optimizer::state_lists; ++k)
      w.add_deferred(state_section(k, name), scheduler_.tensor_size(chunk::chunk_role::state, j), id + 1 + k);
    if constexpr (scheduler_type::has_master)
      w.add_deferred(section("w/", name), scheduler_.tensor_size(chunk::chunk_role::master, j),
                     id + ids_per_tensor - 1);
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
template <class Extra>
void trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::add_extra(checkpoint_writer& w, Extra& extra) {
  std::size_t const own = w.deferred_count();
  extra(w);
  TIDE_REQUIRE(w.deferred_count() == own, "trainer::save: extra(writer) added ", w.deferred_count() - own,
               " deferred section(s); the trainer's source answers only its own tensors: add the caller's "
               "sections with add or add_value");
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
template <class Extra>
void
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::save_set(std::filesystem::path const& dir, Extra& extra) {
  int const rank = set_rank(), ranks = set_ranks();
  auto const nonce = static_cast<std::uint64_t>(
      of_first_rank(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string const set = checkpoint_set::set_name(step_, nonce);
  std::string why;
  try {
    checkpoint_writer w;
    add_sections(w);
    add_extra(w, extra);
    w.commit(checkpoint_set::shard_path(dir, set, rank, ranks), tensor_source());
  } catch (tide::error const& e) {
    why = e.message();
  } catch (std::exception const& e) {
    why = e.what();
  } catch (...) {
    why = "an exception that is not a std::exception";
  }
  bool const written = agree_everywhere(why.empty());
  TIDE_CHECK(written, io, "checkpoint set ", dir.string(), ": ", why.empty() ? "another rank" : "rank " +
             std::to_string(rank), " could not write its shard", why.empty() ? "" : " (" + why + ")",
             "; the previous checkpoint set stays the checkpoint");
  if (rank == 0) {
    try {
      checkpoint_set::write_manifest(dir, {set, ranks, step_});
    } catch (tide::error const& e) {
      why = e.message();
    } catch (std::exception const& e) {
      why = e.what();
    }
  }
  bool const committed = agree_everywhere(why.empty());
  TIDE_CHECK(committed, io, "checkpoint set ", dir.string(), ": the manifest was not written",
             why.empty() ? "" : " (" + why + ")", "; the previous checkpoint set stays the checkpoint");
  if (rank == 0) checkpoint_set::remove_other_sets(dir, set);
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
template <class Extra>
void
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::load_set(std::filesystem::path const& dir, Extra& extra) {
  std::vector<checkpoint_reader> files;
  std::exception_ptr failure;
  std::string where = dir.string();
  try {
    auto const m = checkpoint_set::read_manifest(dir);
    where += " (" + m.set + ", " + std::to_string(m.ranks) + " shards)";
    for (int r = 0; r < m.ranks; ++r) {
      files.emplace_back(checkpoint_set::shard_path(dir, m.set, r, m.ranks));
      files.back().verify();
    }
    TIDE_CHECK(files[0].contains("trainer.state") && files[0].size_of("trainer.state") == sizeof(state) &&
                   files[0].read_value<state>("trainer.state").step == m.step,
               corrupt, "checkpoint set ", where, ": shard 0 is not of step ", m.step, " as the manifest says");
  } catch (...) {
    failure = std::current_exception();
  }
  // The shard whose extra(reader) sections this rank reads: its own at the same shape; else that
  // of rank r mod the set's ranks, and under tensor parallelism the same replica's for every rank
  // of a tensor group (its ranks train on the same batches).
  int const n = static_cast<int>(files.size());
  int extra_file = n > 0 ? set_rank() % n : 0;
  if constexpr (tensor_parallel) {
    int const ts = failure || n == 0 ? 1 : saved_tensor(files);
    if (ts >= 1 && n % ts == 0) extra_file = tensor_.rank() % ts + ts * (set_rank() / tensor_.size() % (n / ts));
  }
  load_from(files, where, failure, extra, static_cast<std::size_t>(extra_file));
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
template <class Extra>
void trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::load_from(std::span<checkpoint_reader const> files,
                                                                       std::string const& where,
                                                                       std::exception_ptr failure, Extra& extra,
                                                                       std::size_t extra_file) {
  auto const& list = model_.parameters();
  std::vector<std::size_t> from(list.size(), files.size());
  if (!failure) {
    try {
      check_files(files, where, from);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  bool const everyone = agree_everywhere(!failure);
  if (failure) std::rethrow_exception(failure);
  TIDE_CHECK(everyone, usage, "checkpoint ", where, ": another rank could not load it (its error says why); "
             "nothing was loaded");
  auto const st = files[0].read_value<state>("trainer.state");
  bool const same_shape = saved_at_this_shape(files);
  for (std::uint32_t i = 0; i < list.size(); ++i) {
    std::uint32_t const j = local(i);
    if (j == offload::no_index) continue;  // another pipeline stage's
    // ZeRO-3: a chunk this rank does not hold now is gathered from its owner when next used.
    if (scheduler_.holds_parameter(j)) read_tensor(files, from[i], "p/", i, scheduler_.tensor_bytes(chunk::chunk_role::param, j));
    read_extras(files, i, j, extra_file, same_shape);
    if (!scheduler_.keeps_state(j)) continue;  // ZeRO: the rank that owns its chunk keeps it
    for (std::size_t k = 0; k < Optimizer::state_lists; ++k)
      read_tensor(files, from[i], state_prefix(k), i, scheduler_.state_bytes(k, j));
    if constexpr (scheduler_type::has_master)
      read_tensor(files, from[i], "w/", i, scheduler_.tensor_bytes(chunk::chunk_role::master, j));
  }
  step_ = st.step;
  scheduler_.set_optimizer_steps(st.adam_steps);
  scaler_.restore(st.scale, st.good, st.skipped);
  extra(files[extra_file]);
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
void
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::read_extras(std::span<checkpoint_reader const> files,
                                                                         std::uint32_t i, std::uint32_t j,
                                                                         std::size_t extra_file, bool same_shape) {
  for (std::size_t k = 0; k < extra_lists.size(); ++k) {
    std::string const x = extra_section(k, tensor_name(i, tensor_.rank(), tensor_.size()));
    auto const out = scheduler_.extra_bytes(k, j);
    // The shards that hold the list of this tensor, in shard order.
    // Tensor parallel (check_files made sure the group size is the saved one): the shards of
    // this tensor rank, as every rank of the group writes a replicated tensor's lists.
    std::vector<std::size_t> holders;
    for (std::size_t f = 0; f < files.size(); ++f)
      if (files[f].contains(x) && static_cast<int>(f) % tensor_.size() == tensor_.rank()) holders.push_back(f);
    if (same_shape) {  // a resume: this rank's own (check_files made sure its shard has it)
      files[extra_file].read(x, out);
      continue;
    }
    if (extra_lists[k].shared) {  // the same on every rank that holds it: the first holder's
      files[holders.front()].read(x, out);
      continue;
    }
    TIDE_ASSERT(extra_lists[k].type == dtype::f32);  // check_files refused the others
    std::fill(out.begin(), out.end(), std::byte{0});
    // Re-sharded so that the sum over the ranks that hold the tensor stays what it was: the
    // takers are every rank (no pipeline) or the replicas of the stage that counts the tensor (a
    // pipeline: a shared tensor's other end takes zeros, or its residual would be sent twice);
    // taker h of H sums the holders h, h + H, h + 2H, ...
    if constexpr (staged)
      if (!stage_.counted[j]) continue;
    auto const takers = static_cast<std::size_t>(comm_.world_size()), h = static_cast<std::size_t>(comm_.rank());
    reshard_.resize(out.size());
    auto* const acc = reinterpret_cast<float*>(out.data());
    auto const* const add = reinterpret_cast<float const*>(reshard_.data());
    for (std::size_t q = h; q < holders.size(); q += takers) {
      files[holders[q]].read(x, std::span<std::byte>(reshard_));
      for (std::size_t e = 0; e < out.size() / sizeof(float); ++e) acc[e] += add[e];
    }
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
std::array<std::int32_t, 2> trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::run_shape() const {
  return {stages(), comm_.world_size()};
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
bool trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::saved_at_this_shape(
    std::span<checkpoint_reader const> files) const {
  using shape = std::array<std::int32_t, 2>;
  if (saved_tensor(files) != tensor_.size()) return false;
  if (files[0].contains("trainer.ranks") && files[0].size_of("trainer.ranks") == sizeof(shape))
    return files[0].read_value<shape>("trainer.ranks") == run_shape();
  return files.size() == static_cast<std::size_t>(set_ranks());
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
void
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::check_files(std::span<checkpoint_reader const> files,
                                                                         std::string const& where,
                                                                         std::vector<std::size_t>& from) {
  std::string const shape = shape_text();
  bool const same_shape = saved_at_this_shape(files);
  state first{};
  for (std::size_t f = 0; f < files.size(); ++f) {
    checkpoint_reader const& r = files[f];
    TIDE_CHECK(r.contains("model.shape") && r.size_of("model.shape") == shape.size(), usage,
               "checkpoint ", where, ": section \"model.shape\" does not describe this model (",
               r.contains("model.shape") ? r.size_of("model.shape") : 0, " bytes, this model's is ", shape.size(),
               "); it was saved from another model configuration");
    std::string stored(shape.size(), '\0');
    r.read("model.shape", std::as_writable_bytes(std::span(stored)));
    TIDE_CHECK(stored == shape, usage, "checkpoint ", where,
               ": section \"model.shape\" differs from this model (shape mismatch); saved:\n", stored,
               "this model:\n", shape);
    TIDE_CHECK(r.contains("trainer.state") && r.size_of("trainer.state") == sizeof(state), usage, "checkpoint ",
               where, ": section \"trainer.state\" is missing or has another size (",
               r.contains("trainer.state") ? r.size_of("trainer.state") : 0, " bytes, this trainer's is ",
               sizeof(state), ")");
    auto const st = r.read_value<state>("trainer.state");
    if (f == 0) first = st;
    TIDE_CHECK(std::memcmp(&st, &first, sizeof(state)) == 0, corrupt, "checkpoint set ", where, ": shard ", f,
               " is of step ", st.step, ", shard 0 of step ", first.step, "; the set is mixed from two saves");
  }
  int const ts = saved_tensor(files);
  if constexpr (!tensor_parallel)
    TIDE_CHECK(ts == 1, usage, "checkpoint ", where, ": saved by a tensor-parallel group of ", ts, " ranks; load it "
               "with the tensor-parallel model (tp::gpt_spec), on a group of any size (one: comm::self)");
  else
    TIDE_CHECK(tensor_.splits_over(ts) && files.size() % static_cast<std::size_t>(ts) == 0, corrupt, "checkpoint ",
               where, ": section \"trainer.tensor\" says a group of ", ts, " ranks, which cannot have cut this model "
               "or written its ", files.size(), " shards");
  auto const& list = model_.parameters();
  for (std::uint32_t i = 0; i < list.size(); ++i)
    for (std::size_t f = 0; f < files.size() && from[i] == files.size(); ++f)
      if (files[f].contains(section("p/", tensor_name(i, tensor_.rank(), ts)))) from[i] = f;
  // Every section is checked (present, its size that of this model's tensor) before anything
  // is written: a mismatch anywhere leaves the trainer as it was.
  for (std::uint32_t i = 0; i < list.size(); ++i) {
    std::uint32_t const j = local(i);
    if (j == offload::no_index) continue;  // another pipeline stage's: not read here
    auto expect_in = [&](checkpoint_reader const& r, std::string const& name, std::size_t want) {
      TIDE_CHECK(r.contains(name), usage, "checkpoint ", where, ": no section \"", name, "\"",
                 tide::detail::concat(" (was it saved with another optimizer than ", Optimizer::name,
                                      " or another gradient sink?)"));
      TIDE_CHECK(r.size_of(name) == want, usage, "checkpoint ", where, ": section \"", name, "\" holds ",
                 r.size_of(name), " bytes, this model's tensor has ", want,
                 " (saved from a model of another shape or dtype); nothing was loaded");
    };
    // The sections read_tensor reads for list `prefix`: this rank's (its own name, or its shard's),
    // or every shard of a group of another size, each of the saved shard's bytes.
    bool const reshard = tensor_.sharded(i) && ts != tensor_.size();
    auto expect = [&](std::string const& prefix, std::size_t want) {
      for (int k = reshard ? 0 : tensor_.rank(); k < (reshard ? ts : tensor_.rank() + 1); ++k) {
        std::string const name = section(prefix, tensor_name(i, k, ts));
        std::size_t const f = tensor_parallel ? detail::file_with(files, name) : from[i];
        TIDE_CHECK(f < files.size(), usage, "checkpoint ", where, ": no section \"", name, "\"",
                   files.size() > 1 ? " in any shard" : "");
        std::size_t saved = want;  // a shard of the saved group: its elements at that size
        if constexpr (tensor_parallel)
          if (reshard) saved = want / static_cast<std::size_t>(list[i].numel()) * tensor_.shard_numel(i, ts);
        expect_in(files[f], name, saved);
      }
    };
    expect("p/", scheduler_.tensor_size(chunk::chunk_role::param, j));
    // The sink's lists: every shard that holds one has this tensor's size; a resume reads its own
    // shard's, another shape sums the holders' (f32 lists only: read_extras).
    for (std::size_t k = 0; k < extra_lists.size(); ++k) {
      std::string const x = extra_section(k, tensor_name(i, tensor_.rank(), tensor_.size()));
      TIDE_CHECK(ts == tensor_.size(), usage, "checkpoint ", where, ": the gradient sink's list \"", extra_lists[k].name,
                 "\" was saved by tensor-parallel groups of ", ts, " ranks; it is kept per shard: load it on groups of ",
                 ts, " (any number of them), or save without it");
      // A set without its shape (older than "trainer.ranks") counts as this shape by its number
      // of shards; if this rank's shard then lacks the list, the shape differed: refused.
      TIDE_CHECK(!same_shape || files[static_cast<std::size_t>(set_rank()) % files.size()].contains(x), usage,
                 "checkpoint ", where, ": this rank's shard has no \"", x, "\"; the set was saved at another shape "
                 "(stages x replicas) than this job's and does not say which: load it at the shape that saved it");
      bool any = false;
      for (checkpoint_reader const& f : files)
        if (f.contains(x)) {
          expect_in(f, x, scheduler_.extra_size(k, j));
          any = true;
        }
      if (!any) expect_in(files[0], x, scheduler_.extra_size(k, j));  // says which section is missing
      TIDE_CHECK(same_shape || extra_lists[k].type == dtype::f32 || extra_lists[k].shared, usage, "checkpoint ",
                 where, ": the gradient sink's list \"", extra_lists[k].name, "\" was saved at another shape (",
                 files.size(), " shards); loading it here sums shards, which tide does for f32 lists only: load it "
                 "on the shape that saved it");
    }
    if (!scheduler_.keeps_state(j)) continue;
    for (std::size_t k = 0; k < Optimizer::state_lists; ++k)
      expect(state_prefix(k), scheduler_.tensor_size(chunk::chunk_role::state, j));
    if constexpr (scheduler_type::has_master) expect("w/", scheduler_.tensor_size(chunk::chunk_role::master, j));
  }
}

}  // namespace tide::train
