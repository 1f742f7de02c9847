#pragma once
// tide::train::make_trainer: a training loop assembled at compile time from policy objects.
//
//   auto trainer = tide::train::make_trainer(
//       tide::nn::gpt_spec<tide::host>{.config = {.layers = 4, .heads = 4, .channels = 256,
//                                                 .vocab = 256, .max_seq = 128}},
//       tide::offload::chunked<tide::offload::belady>{.device_budget = 32_MiB, .chunk_bytes = 1_MiB},
//       tide::optim::adamw{.lr = 1e-3f, .clip_norm = 1.f, .schedule = {.warmup_steps = 20, .total_steps = 500}});
//   tide::train::step_stats st = trainer.step(batch);     // one micro-batch per micro-step
//
// Every argument is a policy whose type the trainer is templated on (CTAD picks them), one per
// slot of train/slots.hpp: the model spec (nn::gpt_spec or your own, see examples/02_custom_model),
// the offload scheduler policy (offload/schedulers.hpp), the optimizer (optim::adamw, adam, sgd),
// and the communication, compression and pipeline policies, which default to none. The trainer
// stores each. A policy of the wrong kind fails with a static_assert saying what it must provide.
// Nothing on the step path is dispatched at run time: the model's hooks call the engine directly.
//
// One step: the learning rate of the schedule; the pipeline policy runs forward + backward over
// the micro-batches (no_pipeline: one after the other; the loss gradient scaled by the loss
// scale); if the optimizer needs every gradient (clipping, loss
// scaling) the global norm is measured, a non-finite one skips the step and halves the scale,
// else the update runs with grad_scale = clip / (loss scale * micro-steps); otherwise each chunk
// is stepped as soon as its gradients are complete, beside the rest of backward.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/kernels/grad_norm/grad_norm.hpp"
#include "tide/kernels/sealed.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/stream.hpp"
#include "tide/core/parameters.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/pipeline/stages.hpp"
#include "tide/train/checkpoint.hpp"
#include "tide/train/checkpoint_set.hpp"
#include "tide/train/composes.hpp"
#include "tide/train/detail/norm_scratch.hpp"
#include "tide/train/detail/offload_options.hpp"
#include "tide/train/detail/tensor_part.hpp"
#include "tide/train/model.hpp"
#include "tide/train/slots.hpp"
#include "tide/train/step_stats.hpp"

namespace tide::train {

template <class Spec, class Offload, class Optimizer, class Comm = no_comm, class Compress = no_compress,
          class Pipeline = no_pipeline>
class trainer {
  static_assert(OffloadPolicy<Offload>, "make_trainer: the 2nd argument must be an offload scheduler policy "
                                        "(tide::offload::SchedulerPolicy): resident, chunked<Policy>, "
                                        "layer_window<W>, static_partition, or your own");
  static_assert(OptimizerPolicy<Optimizer>, "make_trainer: the 3rd argument must be an optimizer "
                                            "(tide::optim::Optimizer: name, state_lists, state_name(k), lr, "
                                            "update(ex, args, tensors)) with schedule(lr, step), clip_norm, "
                                            "micro_steps, decay_matrices_only and scaling (tide::optim::adamw, "
                                            "adam and sgd have them)");
  static_assert(CommPolicy<Comm>, "make_trainer: the 4th argument must be a communication policy "
                                  "(tide::train::CommPolicy: name, rank(), world_size(), sink() giving a "
                                  "GradientSink, source() giving a ChunkSource); pass tide::train::no_comm{} or nothing for one process");
  static_assert(CompressionPolicy<Compress, Comm>,
                "make_trainer: the 5th argument must be a compression policy (tide::train::CompressionPolicy: name "
                "and over(comm) giving a comm policy): tide::compress::error_feedback<>, tide::compress::powersgd, "
                "or tide::train::no_compress{} (or nothing) for none");
  static_assert(PipelinePolicy<Pipeline>, "make_trainer: the 6th argument must be a pipeline policy "
                                          "(tide::train::PipelinePolicy: name, stages and run(ex, model, "
                                          "micro_batches, loss_scale)); pass tide::train::no_pipeline{} or nothing");

 public:
  using backend = spec_backend_t<Spec>;
  using element_type = spec_element_t<Spec>;
  // The comm policy that runs: the 4th argument under the 5th's compression (no_compress: itself).
  using comm_type = compressed_comm_t<Comm, Compress>;
  // A pipeline of one stage per rank: this rank's trainer holds its stage's parameters only.
  static constexpr bool staged = one_stage_per_rank_v<Pipeline>;
  static_assert(check_staged_pipeline<Pipeline, spec_element_t<Spec>>());  // one message per missing part
  // A spec of one rank's shard over a tensor-parallel group (tp::gpt_spec); in a pipeline too.
  static constexpr bool tensor_parallel = TensorParallelSpec<Spec>;
  using scheduler_type = offload::scheduler<backend, element_type, Offload, Optimizer, typename comm_type::sink_type,
                                            typename comm_type::source_type>;
  using hooks_type = offload::hooks<scheduler_type>;
  static_assert(check_model_spec<Spec, hooks_type>());  // one message per missing member (train/model.hpp)
  using model_type = spec_model_t<Spec, hooks_type>;
  using batch_type = model_batch_t<model_type>;
  static_assert(PipelinePolicyFor<Pipeline, model_type, batch_type, backend>,
                "make_trainer: the pipeline policy needs `double run(exec<B> const&, Model&, std::span<batch_type "
                "const>, float loss_scale)` for this model (tide::train::no_pipeline has it)");
  static_assert(Composes<Spec, Offload, Optimizer, Comm, Compress, Pipeline>);  // the same checks, as one concept

  trainer(Spec const& spec, Offload const& off, Optimizer const& opt, Comm const& comm = {},
          Compress const& compress = {}, Pipeline const& pipeline = {}, int threads = thread_pool::default_threads())
      : optimizer_(checked(opt)),
        comm_(checked(compress.over(comm))),
        compress_(compress),
        pipeline_(pipeline),
        pool_(threads),
        ex_(make_exec(spec)),
        arena_({.budget = budget_of(spec, off)}),
        stage_(stage_of(spec, pipeline, comm_, opt)),
        tensor_(spec),
        elsewhere_(std::max<std::size_t>(stage_.largest_elsewhere, 1)),
        // A stage sums wte before stepping, and hands its gradients to the sink once every stage
        // and replica ran backward.
        scheduler_(ex_, arena_, staged ? stage_.params : spec.parameters(), staged ? stage_.uses : spec.uses(), off,
                   detail::scheduler_options_of(off, opt, staged || needs_all_gradients(opt), staged), opt,
                   comm_.sink(), comm_.source()),
        model_(spec.build(arena_, staged ? hooks_type{&scheduler_, stage_.index.data(), elsewhere_.data()}
                                         : hooks_type{&scheduler_})),
        scaler_(opt.scaling) {}

  trainer(trainer const&) = delete;
  trainer& operator=(trainer const&) = delete;
  // On a device backend the model's last kernels finish before its memory goes.
  ~trainer() {
    if constexpr (backend::is_device) {
      try { compute_.synchronize(); } catch (...) {}  // a failure the last step reported already
    }
  }

  // One optimizer step over micro_steps micro-batches (one per micro-step). A step that throws
  // (the device budget, a copy, the model) changes nothing: parameters, optimizer state, the
  // step count and the loss scale stay as they were, and the trainer stays usable.
  step_stats step(std::span<batch_type const> micro_batches);
  step_stats step(batch_type const& b) { return step(std::span<batch_type const>(&b, 1)); }

 private:
  // Bytes the gradient sink summed so far (tide::train::CountingSink; 0 for a sink that does not count).
  std::size_t bytes_reduced() { return static_cast<std::size_t>(bytes_counted(scheduler_.sink())); }
  // The global gradient norm (the norm of the mean gradient times loss_scale m W); norm_of one
  // list, with the trainer's scratch.
  double gradient_norm();
  template <class List>
  double norm_of(List const& grads) {
    return kernels::global_grad_norm(ex_, grads, norm_ws_.at_least(kernels::global_grad_norm_scratch_bytes(ex_, grads)));
  }
  // The pipeline policy's forward and backward. A pipeline of one stage per rank then agrees with
  // the other data-parallel replicas that every stage of every replica ran (the executor already
  // agreed within the replica), before any gradient is summed: a step lost on one rank is lost on
  // every rank alike. Then the sums: over the replicas (the sink), and of the tied embedding over
  // the first and last stage (the first stage's gradient plus the last's zero, on both).
  double run_pipeline(std::span<batch_type const> micro_batches, float loss_scale);
  step_stats run_step(std::span<batch_type const> micro_batches);

 public:
  // ---- checkpoints ----------------------------------------------------------------------------
  // Writes parameters, the fp32 masters, the optimizer's state lists and the gradient sink's
  // extra lists (one section per tensor and list, "<list>/<tensor>", in the model's own order, so
  // a checkpoint loads under any scheduler and chunk size), the step counters and the
  // loss scale, plus whatever extra(writer) adds (data position, RNG), to `path` atomically: the
  // previous file stays until the new one is complete; missing parent folders are created.
  // Between steps.
  //
  // Under ZeRO (zero > 0), when the gradient sink keeps lists of its own on several ranks, in a
  // pipeline of one stage per rank, and on a tensor-parallel group of more than one rank, `path`
  // is a checkpoint set's folder and every rank calls save: each writes the tensors of its own
  // chunks (a pipeline: the first replica of each stage its stage's; tensor parallel: its shards,
  // and tensor rank 0 the replicated tensors), the sink's lists of every chunk (they are the
  // rank's own), and extra(writer), to its shard; the first rank commits the set with its manifest once every shard is on disk
  // (train/checkpoint_set.hpp). A rank that fails makes every rank throw, and the previous set
  // stays the checkpoint.
  template <class Extra>
  void save(std::filesystem::path const& path, Extra&& extra) {
    struct end_views {  // the block a save reads spilled state into, freed however the save ends
      scheduler_type& s;
      ~end_views() {
        try {
          s.end_views();
        } catch (...) {  // the next step frees it
        }
      }
    } const views{scheduler_};
    if constexpr (staged || tensor_parallel || RankAgreement<comm_type>) {
      if (sharded()) {
        save_set(path, extra);
        return;
      }
    }
    checkpoint_writer w;
    add_sections(w);
    add_extra(w, extra);
    w.commit(path, tensor_source());
  }
  void save(std::filesystem::path const& path) {
    save(path, [](checkpoint_writer&) {});
  }

  // Reads a checkpoint written by save(), a file or a checkpoint set's folder: every checksum
  // is verified before anything is written, so a corrupt, truncated, wrong-version or wrong-model
  // checkpoint throws tide::error (corrupt or usage, naming the section) and the trainer is left
  // as it was. Then extra(reader) reads the caller's sections. With data parallelism every rank
  // calls load, and a rank that cannot load makes every rank throw before any writes.
  //
  // A set loads on any number of ranks, any ZeRO stage and any pipeline shape: each rank reads
  // every shard and takes the parameters it holds (all of them, except under ZeRO-3 between
  // steps: its own chunks'; in a pipeline: its stage's) and the state of the chunks it owns now
  // (re-sharding). The sink's lists and extra(reader) come
  // from the shard this rank wrote when the rank count is the same. On another rank count
  // extra(reader) gets the shard of rank r mod the set's ranks, and a rank's own list (a
  // residual) is the sum of the shards r, r + W, ...: the sum over the ranks is kept.
  template <class Extra>
  void load(std::filesystem::path const& path, Extra&& extra) {
    if (checkpoint_set::is_set(path)) {
      load_set(path, extra);
      return;
    }
    std::vector<checkpoint_reader> files;
    std::exception_ptr failure;
    try {
      files.emplace_back(path);
      files.back().verify();
    } catch (...) {
      failure = std::current_exception();
    }
    load_from(files, path.string(), failure, extra, 0);
  }
  void load(std::filesystem::path const& path) {
    load(path, [](checkpoint_reader const&) {});
  }

  // Whether save writes a checkpoint set, one shard per rank, so that every rank calls save:
  // under ZeRO, in a pipeline, on a tensor-parallel group of more than one rank, and when the
  // gradient sink keeps lists of its own on several ranks (a compressor's residuals differ by rank). Otherwise every rank holds the same state,
  // and one rank (rank 0) saves the file.
  [[nodiscard]] bool sharded() const {
    if constexpr (staged) return true;  // every stage holds its own parameters
    if (tensor_.size() > 1) return true;  // every tensor rank its shards
    if (zero_stage() > 0) return true;
    if constexpr (!extra_lists.empty() && RankAgreement<comm_type>) return comm_.world_size() > 1;
    return false;
  }

 private:
  // Whether `ok` holds on every rank of the data-parallel group and of the tensor-parallel one.
  [[nodiscard]] bool agree(bool ok) const {
    if constexpr (RankAgreement<comm_type>) ok = comm_.all_ranks(ok);
    return tensor_.all(ok);
  }
  // Whether `ok` holds on every rank of the job: the replicas, then (a pipeline) every stage.
  [[nodiscard]] bool agree_everywhere(bool ok) const {
    ok = agree(ok);
    if constexpr (staged) ok = pipeline_.all_stages(ok);
    return ok;
  }
  // A value every rank of the job takes from the first (a checkpoint set's name).
  [[nodiscard]] std::int64_t of_first_rank(std::int64_t v) const {
    if constexpr (RankAgreement<comm_type>) v = comm_.of_rank0(v);
    if constexpr (staged) v = pipeline_.of_stage0(v);
    return tensor_.of_rank0(v);
  }
  // This rank's shard in a checkpoint set, and the set's shards, numbered as the make_groups
  // number the ranks: tensor rank + t (stage + p replica).
  [[nodiscard]] int set_rank() const { return tensor_.rank() + tensor_.size() * (stage() + stages() * comm_.rank()); }
  [[nodiscard]] int set_ranks() const { return tensor_.size() * stages() * comm_.world_size(); }
  [[nodiscard]] int stage() const {
    if constexpr (staged) return pipeline_.stage();
    else return 0;
  }
  [[nodiscard]] int stages() const {
    if constexpr (staged) return pipeline_.stages;
    else return 1;
  }
  // The scheduler's number of the model's parameter i: i itself, or in a pipeline stage its
  // index among the stage's parameters (offload::no_index: another stage holds it); whole(j): back.
  [[nodiscard]] std::uint32_t local(std::uint32_t i) const noexcept {
    if constexpr (staged) return stage_.index[i];
    else return i;
  }
  [[nodiscard]] std::uint32_t whole(std::uint32_t j) const noexcept {
    if constexpr (staged) return stage_.model[j];
    else return j;
  }
  // Whether this rank writes parameter i (scheduler number j) to its checkpoint: the owner of
  // its chunk under ZeRO; in a pipeline, of the stage that counts it (wte: the first stage, whose
  // copy equals the last's bit for bit), the replica that owns its chunk (ZeRO-1) or else the
  // first one; tensor parallel, every rank its shard and rank 0 a replicated tensor, of the
  // replica that owns its chunk (ZeRO) or else the first one.
  [[nodiscard]] bool writes(std::uint32_t j) const {
    if (!scheduler_.keeps_state(j) || !tensor_.counts(whole(j))) return false;
    if constexpr (staged) {
      bool const sharded_state = zero_stage() > 0;  // ZeRO: each replica keeps its own chunks' state
      return stage_.counted[j] && (sharded_state || comm_.rank() == 0);
    }
    if constexpr (tensor_parallel) return zero_stage() > 0 || comm_.rank() == 0;  // else the first replica
    return true;
  }
  // The sections of this trainer: all tensors, or under ZeRO those of this rank's chunks. The
  // model data is deferred: the commit reads each tensor when it writes it (tensor_source), so
  // optimizer state in the NVMe tier comes from the file one chunk at a time, never all at once.
  static constexpr std::size_t ids_per_tensor = 2 + Optimizer::state_lists;
  // A deferred section's id: ids_per_tensor i + what (0: parameter, 1 + k: state list k, then master).
  void add_sections(checkpoint_writer& w);
  // The caller's sections: with add or add_value, as the deferred ones are the trainer's.
  template <class Extra>
  void add_extra(checkpoint_writer& w, Extra& extra);
  // The bytes of add_sections' deferred sections, read at the commit.
  [[nodiscard]] auto tensor_source() {
    return [this](std::size_t id) -> std::span<std::byte const> {
      auto const i = static_cast<std::uint32_t>(id / ids_per_tensor);
      std::size_t const what = id % ids_per_tensor;
      if (what == 0) return scheduler_.tensor_view(chunk::chunk_role::param, i);
      if (what == ids_per_tensor - 1) return scheduler_.tensor_view(chunk::chunk_role::master, i);
      return scheduler_.state_view(what - 1, i);
    };
  }

  template <class Extra>
  void save_set(std::filesystem::path const& dir, Extra& extra);
  template <class Extra>
  void load_set(std::filesystem::path const& dir, Extra& extra);

  // Checks every file against this model (and the set's files against each other), agrees with
  // the other ranks that all could, then reads: every parameter, and the state of this rank's
  // chunks, each from the file that holds its "p/<name>" section (tensor parallel: each section
  // from the file that holds it, read_tensor).
  template <class Extra>
  void load_from(std::span<checkpoint_reader const> files, std::string const& where, std::exception_ptr failure,
                 Extra& extra, std::size_t extra_file);

  // Tensor i of the sink's lists, which are every rank's own. A resume at the shape that saved
  // them reads this rank's shard. At another shape (ranks, stages, or both) a rank's own list (a
  // residual, what it has not sent yet) is re-sharded so that its sum over the ranks that hold
  // the tensor stays what it was; a list the same on every rank comes from its first holder.
  void read_extras(std::span<checkpoint_reader const> files, std::uint32_t i, std::uint32_t j, std::size_t extra_file,
                   bool same_shape);
  // The shape that saves: {pipeline stages, data-parallel replicas}; and whether `files` were
  // saved at this one (a checkpoint older than its "trainer.ranks" section: as many shards).
  [[nodiscard]] std::array<std::int32_t, 2> run_shape() const;
  [[nodiscard]] bool saved_at_this_shape(std::span<checkpoint_reader const> files) const;

  void check_files(std::span<checkpoint_reader const> files, std::string const& where, std::vector<std::size_t>& from);

 public:
  // ---- parts ----------------------------------------------------------------------------------
  [[nodiscard]] model_type& model() noexcept { return model_; }
  [[nodiscard]] scheduler_type& scheduler() noexcept { return scheduler_; }
  [[nodiscard]] memory::device_arena<backend>& arena() noexcept { return arena_; }
  [[nodiscard]] exec<backend> const& executor() const noexcept { return ex_; }
  [[nodiscard]] Optimizer const& optimizer() const noexcept { return optimizer_; }
  [[nodiscard]] Offload const& offload() const noexcept { return scheduler_.policy(); }
  [[nodiscard]] comm_type const& comm() const noexcept { return comm_; }
  [[nodiscard]] Compress const& compression() const noexcept { return compress_; }
  [[nodiscard]] Pipeline& pipeline() noexcept { return pipeline_; }
  [[nodiscard]] optim::loss_scaler const& scaler() const noexcept { return scaler_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return step_; }

 private:
  struct state {
    std::int64_t step;
    std::int64_t adam_steps;
    float scale;
    int good;
    std::int64_t skipped;
  };
  // "p/h0.ln1.w": the section of a tensor in a list.
  static std::string section(std::string_view prefix, std::string_view name) {
    std::string out;
    out.reserve(prefix.size() + name.size());
    out.append(prefix).append(name);
    return out;
  }
  // "m/h0.ln1.w": the section of state list k (Optimizer::state_name(k)) of a tensor.
  static std::string state_prefix(std::size_t k) { return std::string(Optimizer::state_name(k)).append("/"); }
  static std::string state_section(std::size_t k, std::string_view name) { return section(state_prefix(k), name); }
  // The lists the gradient sink keeps (an error-feedback residual): "<name>/<tensor>" sections.
  static constexpr std::span<offload::extra_list const> extra_lists = offload::extra_lists_of<typename comm_type::sink_type>();
  static std::string extra_section(std::size_t k, std::string_view name) {
    std::string prefix(extra_lists[k].name);
    return section(prefix.append("/"), name);
  }
  static bool needs_all_gradients(Optimizer const& o) noexcept { return o.clip_norm > 0.f || o.scaling.enabled; }
  // A pipeline of one stage per rank: this stage's parameters (pipeline::part_of); empty otherwise.
  static pipeline::stage_part stage_of(Spec const& spec, Pipeline const& pipe, comm_type const& comm,
                                       Optimizer const& opt);
  // One line per parameter: "name dtype d0 d1 ..." (tensor parallel: the whole tensor's shape).
  [[nodiscard]] std::string shape_text() const;
  // Parameter i's name in a checkpoint: its own, or under tensor parallelism that of shard k of a
  // group of t when every rank holds a part (detail::shard_name).
  [[nodiscard]] std::string tensor_name(std::uint32_t i, int k, int t) const;
  // Reads parameter i's tensor of the list `prefix` ("p/", a state list's "m/", "w/") into out,
  // from files[from] (tensor parallel: its shard, cut from a saved group's shards when the
  // group size differs); check_files checks those sections before anything is read.
  void read_tensor(std::span<checkpoint_reader const> files, std::size_t from, std::string const& prefix,
                   std::uint32_t i, std::span<std::byte> out);
  // The tensor-parallel group size that saved `files` (1: none).
  [[nodiscard]] static int saved_tensor(std::span<checkpoint_reader const> files);

  // On a device the compute context's exec; on CUDA with the spec's TF32 and fused-attention
  // choices (gpt_spec::tf32, flash_attention).
  exec<backend> make_exec(Spec const& spec) {
    if constexpr (requires { compute_.tf32 = spec.tf32; }) compute_.tf32 = spec.tf32;
    if constexpr (requires { compute_.flash_attention = spec.flash_attention; })
      compute_.flash_attention = spec.flash_attention;
    if constexpr (backend::is_device) return compute_.exec_with(pool_);
    else return {pool_};
  }
  static Optimizer const& checked(Optimizer const& o) {
    TIDE_REQUIRE(o.micro_steps >= 1, "optimizer micro_steps = ", o.micro_steps, "; pass >= 1");
    TIDE_REQUIRE(o.clip_norm >= 0.f && std::isfinite(o.clip_norm), "optimizer clip_norm = ", o.clip_norm,
                 "; pass 0 (no clipping) or a positive norm");
    return o;
  }
  // The ZeRO stage of the comm policy (tide::train::ShardingPolicy), 0 without one.
  [[nodiscard]] int zero_stage() const noexcept {
    if constexpr (ShardingPolicy<comm_type>) return comm_.zero;
    else return 0;
  }
  static comm_type const& checked(comm_type const& c) {
    if constexpr (!RankAgreement<comm_type>)
      TIDE_REQUIRE(c.world_size() <= 1, "make_trainer: the comm policy ", comm_type::name, " runs on ", c.world_size(),
                   " ranks but has no all_ranks(bool), of_rank0(int64) and sum_over_ranks(double) "
                   "(tide::train::RankAgreement): without them a failure on one rank is invisible to the others; add them");
    return c;
  }
  static std::size_t budget_of(Spec const& spec, Offload const& off) {
    if (off.device_budget != 0) return off.device_budget;
    TIDE_REQUIRE(!Offload::moves_data, "make_trainer: ", offload::scheduler_name<Offload>(),
                 " needs a device_budget (bytes of the device it may use)");
    // Parameters, gradients, m and v with room for chunk padding, and 1 GiB for activations.
    return 8 * spec.parameters().bytes() + (std::size_t{1} << 30);
  }

  Optimizer optimizer_;
  comm_type comm_;
  Compress compress_;
  Pipeline pipeline_;
  thread_pool pool_;
  struct no_stream {};
  // A device backend's compute stream: the model's kernels, in order (the host's is the caller).
  [[no_unique_address]] std::conditional_t<backend::is_device, memory::compute_context<backend>, no_stream> compute_;
  exec<backend> ex_;
  memory::device_arena<backend> arena_;
  pipeline::stage_part stage_;         // a pipeline stage's parameters (empty without one)
  detail::tensor_part<Spec> tensor_;   // the tensor-parallel group and how each tensor splits (one rank without)
  std::vector<element_type> elsewhere_;  // what the model's initialisation writes of other stages' parameters
  scheduler_type scheduler_;
  model_type model_;
  detail::norm_scratch<backend> norm_ws_{arena_};
  optim::loss_scaler scaler_;
  std::int64_t step_ = 0;
  std::string shape_;  // what a checkpoint's "model.shape" section points to until its commit
  std::vector<kernels::grad_tensor<element_type>> owned_grads_;  // ZeRO-2: this rank's part of the norm
  std::vector<std::byte> reshard_;  // a shard's list while load re-shards it
  std::vector<element_type> shared_;  // device: a shared parameter's gradient, summed on the host
};

template <class Spec, class Offload, class Optimizer, class Comm = no_comm, class Compress = no_compress,
          class Pipeline = no_pipeline>
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline> make_trainer(Spec const& spec, Offload const& off,
                                                                         Optimizer const& opt, Comm comm = {},
                                                                         Compress compress = {}, Pipeline pipe = {}) {
  return {spec, off, opt, comm, compress, pipe};
}

}  // namespace tide::train

// The larger members, defined out of line by what they do.
#include "tide/train/detail/trainer_checkpoint.hpp"
#include "tide/train/detail/trainer_step.hpp"
