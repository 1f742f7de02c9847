// examples/04_data_parallel: the byte-level GPT of the demo, trained data-parallel on the fortunes
// text. Every rank builds the same model, draws its own rows of each batch (train::shard), trains
// with chunked<belady> offload under a device budget below the model data, and the gradient chunks
// are summed over the ranks in buckets while backward runs (comm::data_parallel over comm::mpi).
// ZeRO-2 by default: each rank keeps Adam's state of its own chunks only, and each chunk's
// gradients are reduced to that rank; the new parameters are all-gathered after the step. With
// --zero 3 a rank also keeps its own chunks' parameters only and receives the others' from their
// owners around the blocks that use them. With --density D the gradients are compressed instead:
// each rank sends the largest fraction D of every chunk's residual (compress::error_feedback in
// make_trainer's compression slot, over the same comm::data_parallel); with --powersgd R each
// matrix is sent as a rank-R product (compress::powersgd). Both take --zero 0 to 3.
//
// With --pipeline P the model is cut into P stages, one per rank (pipeline::on_ranks), each step
// runs --micro M micro-batches of B rows through them in --schedule order (one_f_one_b, gpipe, or
// with two pieces of the model per stage interleaved, zb_v or dualpipe_v),
// and the ranks beyond P are data-parallel replicas of the pipeline (ZeRO-0, or --zero 1, 2, 3:
// each stage's optimizer state, gradients and parameters sharded over its replicas). Each rank
// keeps its stage's parameters only, offloaded by chunked<belady> as before.
//
// With --tensor T the model's layers are split over groups of T ranks (tp::gpt_spec: Megatron-LM's
// column- and row-parallel layers, the vocabulary-parallel embedding and head; with
// --sequence-parallel the LayerNorm regions split along the sequence too), each group a
// data-parallel replica of the others (ZeRO as --zero says). Each rank keeps its shard only,
// offloaded by chunked<belady>; the checkpoint set keeps each shard under its rank's name and
// resumes at another --tensor.
//
// With --host-budget SIZE --spill-folder D (any ZeRO stage, or a pipeline) each rank keeps at
// most SIZE of model data on the host between steps; the optimizer state of its chunks past that
// goes to a file of its own under D/rank-R (the NVMe tier), and checkpoints read it from there.
// --recompute recomputes every block's activations in backward, --offload-activations moves
// every block's saved activations to the host between forward and backward: both bit-identical,
// both shrink the device budget the activations take (as in 01_train_gpt).
//
// AdamW at a peak lr of 1e-3 after 20 warm-up steps, the gradients' global norm clipped at 1.0:
// with lr 2e-3, 10 warm-up steps and no clipping, this small-batch model overshoots in single
// steps (3.4 -> 8.9 -> 3.3); docs/training.md, "Loss spikes", shows why.
//
//   mpiexec -n 2 ./example_04_data_parallel [--steps N] [--batch B] [--seq T] [--lr X] [--warmup N]
//                                           [--clip X] [--budget SIZE] [--host-budget SIZE
//                                           --spill-folder D] [--recompute] [--offload-activations]
//                                           [--bucket-kib K]
//                                           [--zero 0|1|2|3] [--density D | --powersgd R]
//                                           [--pipeline P [--micro M] [--schedule S]]
//                                           [--tensor T [--sequence-parallel]]
//                                           [--check-falls X] [--checkpoint-dir D] [--checkpoint-every N]
//                                           [--resume [RUN]] [--heartbeat S] [--deadline S]
//   ./tide demo --ranks 2 [flags]            (builds it and runs it under mpiexec)
//   ./tide demo --pipeline 2 [flags]         (the same, on P ranks, with --pipeline P)
//   ./tide demo --tensor 2 [flags]           (the same, on T ranks, with --tensor T)
//
// Each run writes to a folder of its own, tide-run/run-NNN (examples/common/run.hpp, shared with
// 01_train_gpt): a checkpoint every --checkpoint-every steps (a set of one shard per rank under
// ZeRO, a compressor or a pipeline), loss.svg, and rank 0's memory-tide.svg and
// step-trace.json of its last step; --resume [RUN] continues it. SIGINT or
// SIGTERM on any rank (./tide demo forwards a Ctrl-C to mpiexec as SIGUSR1) stops every rank after
// the same step, saves and exits 130 or 143. A comm::heartbeat on every rank names a rank that is
// silent for --heartbeat seconds, and the job ends.
//
// Rank 0 prints the progress line (with the gradient bytes reduced per step, and a pipeline's
// bubble measured on its stage). At the end every rank checks that the ranks that must hold the
// same parameters do, bit for bit (all of them; with a pipeline, each stage's replicas, and the
// tied embedding at both ends; tensor parallel, each shard's replicas and each replicated tensor's
// group); --check-falls X also fails the run unless the loss fell by X.

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tide/comm/data_parallel.hpp>
#include <tide/comm/heartbeat.hpp>
#include <tide/comm/mpi.hpp>
#include <tide/compress/sink.hpp>
#include <tide/offload/schedulers.hpp>
#include <tide/optim/adamw.hpp>
#include <tide/pipeline/stages.hpp>
#include <tide/train/interrupt.hpp>
#include <tide/train/report.hpp>
#include <tide/train/text_data.hpp>
#include <tide/tp/spec.hpp>
#include <tide/train/trainer.hpp>

#include "../common/run.hpp"

namespace {

using namespace tide::literals;
namespace fs = std::filesystem;

struct options {
  int steps = 60, batch = 4, seq = 64;
  float lr = 1e-3f;  // the peak; warm-up, then cosine down to a tenth
  int warmup = 20;
  float clip = 1.f;  // 0: none
  std::size_t budget = 0;  // device bytes a rank's scheduler may use; 0: auto
  std::size_t host_budget = 0;  // host bytes of model data a rank keeps between steps; 0: no limit
  std::string spill_folder;     // where a rank's optimizer state past host_budget goes
  bool recompute = false;            // every block's activations recomputed in backward
  bool offload_activations = false;  // every block's saved activations to host memory
  std::size_t bucket_kib = 256;
  int zero = 2;
  bool zero_given = false;
  double density = 0;  // > 0: sparse error feedback at this density
  int powersgd = 0;    // > 0: PowerSGD at this rank
  int pipeline = 0;    // > 0: stages of a pipeline, one per rank
  int tensor = 0;      // > 0: ranks of a tensor-parallel group
  bool sequence = false;  // sequence parallelism in the tensor-parallel groups
  int micro = 4;       // micro-batches per step of a pipeline
  std::string schedule = "one_f_one_b";
  double check_falls = 0;
  double check_steady = 0;  // > 0: fail if a step's loss is more than this above the step before
  std::string checkpoint_dir = "tide-run";
  int checkpoint_every = 20;  // 0: none
  bool resume = false;
  std::string resume_from;  // --resume RUN; empty: the latest run folder with a checkpoint
  int heartbeat_s = 10;     // a rank silent this long is lost
  int deadline_s = 600;     // the longest a collective may take
};

constexpr char const* usage_text =
    "usage: ./tide demo --ranks N [flags]   (or: mpiexec -n N example_04_data_parallel [flags])\n"
    "  --steps N          optimizer steps [60]\n"
    "  --batch B          rows per rank and step [4]\n"
    "  --seq T            tokens per row [64]\n"
    "  --lr X             peak learning rate; cosine down to lr/10 [0.001]\n"
    "  --warmup N         warm-up steps [20]\n"
    "  --clip X           clip the gradients' global norm at X, 0 for none [1]\n"
    "  --budget SIZE|auto a rank's device budget (48MiB, 1.5GiB, bytes) [auto: the activations plus half\n"
    "                     the model data, or the scheduler's minimum plus two chunks if that is more]\n"
    "  --host-budget SIZE model data a rank's host keeps between steps; past it the optimizer state of\n"
    "                     its chunks goes to a file in --spill-folder (parameters stay) [no limit]\n"
    "  --spill-folder D   where each rank's file goes (one file a rank)\n"
    "  --recompute        recompute every block's activations in backward (activation checkpointing)\n"
    "  --offload-activations  move every block's saved activations to host memory between forward\n"
    "                     and backward\n"
    "  --bucket-kib K     gradient bucket size [256]\n"
    "  --zero 0|1|2|3     ZeRO stage [2; a pipeline: 0]\n"
    "  --density D        send the largest fraction D of each chunk's residual (error feedback)\n"
    "  --powersgd R       send each matrix as a rank-R product\n"
    "  --pipeline P       P pipeline stages, one per rank (./tide demo --pipeline P [--ranks N])\n"
    "  --micro M          micro-batches per step of a pipeline [4]\n"
    "  --schedule S       one_f_one_b, gpipe, interleaved, zb_v or dualpipe_v [one_f_one_b]\n"
    "  --tensor T         tensor-parallel groups of T ranks, the model's layers split over them\n"
    "                     (./tide demo --tensor T [--ranks N]); the groups are data-parallel replicas\n"
    "  --sequence-parallel  with --tensor: the LayerNorm regions split along the sequence too\n"
    "  --check-falls X    fail unless the loss fell by X\n"
    "  --check-steady X   fail if any step's loss is more than X above the step before it\n"
    "  --checkpoint-dir D each run writes its checkpoint and loss picture to a new D/run-NNN [tide-run]\n"
    "  --checkpoint-every N  steps between checkpoints, 0 for none [20]\n"
    "  --resume [RUN]     continue RUN (a run folder), or the latest D/run-NNN with a checkpoint\n"
    "  --heartbeat S      a rank silent for S seconds is reported lost by the others [10]\n"
    "  --deadline S       the longest one collective may take before the ranks give up [600]\n"
    "SIGINT or SIGTERM (./tide demo forwards them; under a bare mpiexec send SIGUSR1 or SIGUSR2 to\n"
    "mpiexec) finishes the step in flight on every rank, saves, draws and exits 130 or 143.\n";

// Whether the arguments ask for the usage (--help or -h anywhere).
bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") return true;
  return false;
}

// --flag value pairs; a bad one is a tide::error(usage) that main prints on one line.
options parse(int argc, char** argv) {
  options o;
  auto number = [](std::string_view flag, char const* text, auto& out) {
    std::string_view const v = text;
    auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    TIDE_REQUIRE(ec == std::errc{} && end == v.data() + v.size() &&
                     (out > 0 || flag == "--zero" || flag == "--checkpoint-every" || flag == "--warmup" ||
                      flag == "--clip"),
                 flag,
                 " wants a positive number, got '", v, "'");
  };
  for (int i = 1; i < argc; i += 2) {
    std::string_view const flag = argv[i];
    if (flag == "--resume") {  // a run folder may follow
      o.resume = true;
      if (i + 1 < argc && !std::string_view(argv[i + 1]).starts_with('-')) o.resume_from = argv[i + 1];
      else --i;  // no value: the next flag is at i + 1
      continue;
    }
    if (flag == "--recompute" || flag == "--offload-activations" || flag == "--sequence-parallel") {  // switches
      (flag == "--recompute" ? o.recompute : flag == "--sequence-parallel" ? o.sequence : o.offload_activations) = true;
      --i;
      continue;
    }
    TIDE_REQUIRE(i + 1 < argc, flag, " needs a value");
    if (flag == "--steps") number(flag, argv[i + 1], o.steps);
    else if (flag == "--batch") number(flag, argv[i + 1], o.batch);
    else if (flag == "--seq") number(flag, argv[i + 1], o.seq);
    else if (flag == "--lr") number(flag, argv[i + 1], o.lr);
    else if (flag == "--warmup") number(flag, argv[i + 1], o.warmup);
    else if (flag == "--clip") number(flag, argv[i + 1], o.clip);
    else if (flag == "--host-budget") o.host_budget = demo::size_from(flag, argv[i + 1]);
    else if (flag == "--spill-folder") o.spill_folder = argv[i + 1];
    else if (flag == "--budget") o.budget = std::string_view(argv[i + 1]) == "auto" ? 0 : demo::size_from(flag, argv[i + 1]);
    else if (flag == "--bucket-kib") number(flag, argv[i + 1], o.bucket_kib);
    else if (flag == "--zero") number(flag, argv[i + 1], o.zero), o.zero_given = true;
    else if (flag == "--density") number(flag, argv[i + 1], o.density);
    else if (flag == "--powersgd") number(flag, argv[i + 1], o.powersgd);
    else if (flag == "--check-falls") number(flag, argv[i + 1], o.check_falls);
    else if (flag == "--check-steady") number(flag, argv[i + 1], o.check_steady);
    else if (flag == "--pipeline") number(flag, argv[i + 1], o.pipeline);
    else if (flag == "--tensor") number(flag, argv[i + 1], o.tensor);
    else if (flag == "--micro") number(flag, argv[i + 1], o.micro);
    else if (flag == "--schedule") o.schedule = argv[i + 1];
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = argv[i + 1];
    else if (flag == "--checkpoint-every") number(flag, argv[i + 1], o.checkpoint_every);
    else if (flag == "--heartbeat") number(flag, argv[i + 1], o.heartbeat_s);
    else if (flag == "--deadline") number(flag, argv[i + 1], o.deadline_s);
    else TIDE_FAIL(usage, "unknown flag ", flag,
                   " (flags: --steps --batch --seq --lr --warmup --clip --budget --host-budget --spill-folder --recompute "
                   "--offload-activations --bucket-kib --zero --density --powersgd --pipeline --micro "
                   "--schedule --tensor --sequence-parallel --check-falls --check-steady --checkpoint-dir --checkpoint-every --resume --heartbeat --deadline; "
                   "--help says what they do)");
  }
  TIDE_REQUIRE(!o.checkpoint_dir.empty(), "--checkpoint-dir is empty: name a folder");
  TIDE_REQUIRE((o.host_budget == 0) == o.spill_folder.empty(), "--host-budget and --spill-folder go together: the "
               "optimizer state past the host budget needs a folder, and a folder needs a budget to spill past");
  TIDE_REQUIRE(o.schedule == "one_f_one_b" || o.schedule == "gpipe" || o.schedule == "interleaved" ||
                   o.schedule == "zb_v" || o.schedule == "dualpipe_v",
               "--schedule must be one_f_one_b, gpipe, interleaved, zb_v or dualpipe_v");
  TIDE_REQUIRE(o.pipeline == 0 || !o.offload_activations, "--offload-activations runs with one micro-batch in "
               "flight, and a pipeline stage holds several: drop it, or use --recompute");
  TIDE_REQUIRE(o.pipeline == 0 || (o.density == 0 && o.powersgd == 0),
               "--pipeline runs with dense data parallelism: drop --density / --powersgd");
  TIDE_REQUIRE(o.pipeline > 0 || (o.schedule == "one_f_one_b" && o.micro == 4),
               "--schedule and --micro are a pipeline's: pass --pipeline P too");
  TIDE_REQUIRE(o.tensor == 0 || o.pipeline == 0 || o.schedule == "one_f_one_b", "--tensor with --pipeline runs "
               "1F1B: drop --schedule");
  TIDE_REQUIRE(o.tensor == 0 || (o.density == 0 && o.powersgd == 0 && !o.offload_activations),
               "--tensor trains with dense data parallelism and its activations on the device (or recomputed: "
               "--recompute): drop --density, --powersgd and --offload-activations");
  TIDE_REQUIRE(o.tensor > 0 || !o.sequence, "--sequence-parallel splits a tensor-parallel group's work: pass --tensor T too");
  TIDE_REQUIRE(o.seq >= 2 && o.seq <= 256, "--seq must be 2 to 256");
  TIDE_REQUIRE(o.lr <= 1.f, "--lr must be above 0 and at most 1, got ", o.lr);
  TIDE_REQUIRE(o.warmup >= 0, "--warmup must be 0 or more steps, got ", o.warmup);
  TIDE_REQUIRE(std::isfinite(o.clip) && o.clip >= 0.f, "--clip must be 0 (no clipping) or a positive norm, got ",
               o.clip);
  TIDE_REQUIRE(o.zero >= 0 && o.zero <= 3, "--zero must be 0, 1, 2 or 3");
  TIDE_REQUIRE(o.density <= 1, "--density must be in (0, 1]");
  TIDE_REQUIRE(o.density == 0 || o.powersgd == 0, "--density and --powersgd are two compressions: pass one");
  return o;
}

// The device budget: --budget, checked against the scheduler's minimum for this batch (the
// scheduler measures it from the activations and says what it is made of); auto: the activations
// plus half the model data, or that minimum plus two chunks if it is more.
// The model's options: the seed, a pipeline's slots and its tied gradient, and --recompute /
// --offload-activations for every block (demo::memory_options, as 01_train_gpt).
tide::nn::gpt_options model_options(options const& opt, tide::nn::gpt_config const& config, int slots = 1,
                                    bool tied = false) {
  tide::nn::gpt_options o{.seed = 1, .in_flight = slots, .separate_tied_grad = tied};
  demo::memory_options(o, config, opt.recompute, opt.offload_activations);
  return o;
}

// The offload policy of a rank: chunked<belady> under the device budget (--budget, checked
// against the scheduler's minimum for these activations; auto: the activations plus half the
// model data, or that minimum plus two chunks if it is more), and with --host-budget the NVMe
// tier in a folder of the rank's own. The offloaded activations take their host copies from the
// scheduler's pool: the host budget grows by them and keeps them as its reserve.
tide::offload::chunked<tide::offload::belady> offload_for(options const& opt, tide::parameter_list const& params,
                                                          tide::block_uses const& uses, std::size_t activation_bytes,
                                                          std::size_t reserve, int rank);
tide::offload::chunked<tide::offload::belady> offload_for(options const& opt, tide::nn::gpt_config const& config,
                                                          tide::nn::gpt_options const& model, int rank) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 256_MiB}};
  tide::nn::activation_report plan;
  {
    tide::nn::gpt<tide::host> m{config, arena, model};
    std::vector<std::int32_t> zeros(std::size_t(opt.batch) * std::size_t(opt.seq), 0);
    m.forward(ex, tide::tensor_view<std::int32_t const>(zeros.data(), {opt.batch, opt.seq}));
    plan = m.activations();
  }
  std::size_t const reserve = opt.host_budget != 0 && opt.offload_activations ? plan.host_bytes : 0;
  return offload_for(opt, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                     plan.footprint, reserve, rank);
}

// The same, for a model of these parameters whose activations take `activation_bytes`, the
// offloaded ones `reserve` of the host (a tensor-parallel rank's shard).
tide::offload::chunked<tide::offload::belady> offload_for(options const& opt, tide::parameter_list const& params,
                                                          tide::block_uses const& uses, std::size_t activation_bytes,
                                                          std::size_t reserve, int rank) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 256_MiB}};
  std::size_t const activations = tide::round_up(activation_bytes, 256);
  tide::offload::chunked<tide::offload::belady> off{
      .chunk_bytes = 256_KiB,
      .memory = {.host_budget = opt.host_budget == 0 ? 0 : opt.host_budget + reserve, .host_reserve = reserve}};
  if (opt.host_budget > 0) {  // one folder a rank: each rank's file holds its own chunks' state
    off.memory.spill_folder = fs::path(opt.spill_folder) / ("rank-" + std::to_string(rank));
    std::error_code ec;
    fs::create_directories(off.memory.spill_folder, ec);
    TIDE_CHECK(!ec, io, "--spill-folder ", off.memory.spill_folder.string(), ": cannot create it: ", ec.message());
  }
  tide::offload::scheduler<tide::host, float, decltype(off)> const probe{ex, arena, params, uses, off};
  std::size_t const model_data = 16 * static_cast<std::size_t>(params.count());
  std::size_t const minimum = probe.minimum_device_bytes(activations);
  if (opt.budget == 0) {
    off.device_budget = std::max(activations + model_data / 2, minimum + 2 * probe.chunk_bytes());
    return off;
  }
  // A usage error, not a budget one: the flag is wrong on every rank alike, and rank 0 says so once.
  TIDE_CHECK(opt.budget >= minimum, usage, "--budget ", tide::bytes_of{opt.budget}, " is below what ",
             decltype(probe)::name(), " needs for this model and --batch ", opt.batch, " --seq ", opt.seq, ", ",
             tide::bytes_of{minimum}, ": ", probe.minimum_explained(activations), "; pass more, or auto");
  off.device_budget = opt.budget;
  return off;
}

// The digest of the whole model, whatever the cut: each tensor's CRC-32C (-1 on the stages that
// do not hold it) taken from the stage that does, then the CRC-32C of those in the model's order
// (wte's, equal at both ends, once). Collective over the pipeline group.
std::uint32_t model_digest(tide::comm::mpi& pipeline, std::vector<std::int64_t> crcs) {
  pipeline.all_reduce(std::span<std::int64_t>(crcs), tide::comm::reduce_op::max);
  demo::digest d;
  for (std::int64_t c : crcs) d.crc = tide::train::crc32c(std::as_bytes(std::span(&c, 1)), d.crc);
  return d.crc;
}

// Whether every rank of `c` holds these bits.
bool same_on(tide::comm::mpi& c, std::vector<float> const& v) {
  std::vector<float> lo = v, hi = v;
  c.all_reduce(std::span<float>(lo), tide::comm::reduce_op::min);
  c.all_reduce(std::span<float>(hi), tide::comm::reduce_op::max);
  return std::memcmp(lo.data(), hi.data(), lo.size() * sizeof(float)) == 0;
}

// The step's loss over every rank (the mean: a pipeline's stages all report their replica's),
// shown on rank 0's progress line (every tenth step kept); returns it. One rank reduces nothing.
float report(tide::comm::mpi& world, tide::train::progress& progress, tide::train::step_stats shown, int steps,
             int replicas) {
  std::vector<float> loss{shown.loss / static_cast<float>(world.size())};
  world.all_reduce(std::span<float>(loss), tide::comm::reduce_op::sum);
  shown.loss = loss[0];
  if (replicas == 1) shown.bytes_reduced = 0;  // one replica sums nothing
  if (world.rank() == 0) {
    progress.update(shown, steps);  // counts the bytes moved
    if (shown.step % 10 == 0 || shown.step == steps) progress.line(shown, steps);
  }
  return loss[0];
}

// Rank 0 prints the losses and the equality check; the exit status: 1 if the ranks differ where
// they must not, the loss fell by less than --check-falls, or one step rose above the step before
// it by more than --check-steady (`losses`: the whole run's, one per step).
int verdict(options const& opt, int rank, float first, float last, std::vector<float> const& losses, bool same,
            std::string const& said_same, std::string const& said_different) {
  if (rank == 0)
    std::printf("loss %.4f -> %.4f; %s\n", static_cast<double>(first), static_cast<double>(last),
                (same ? said_same : said_different).c_str());
  if (!same) return 1;
  if (opt.check_falls > 0 && static_cast<double>(first - last) < opt.check_falls) {
    if (rank == 0) std::fprintf(stderr, "example_04_data_parallel: the loss fell by %.4f, less than --check-falls %.4f\n",
                                static_cast<double>(first - last), opt.check_falls);
    return 1;
  }
  for (std::size_t i = 1; opt.check_steady > 0 && i < losses.size(); ++i) {
    double const rise = static_cast<double>(losses[i] - losses[i - 1]);
    if (rise > opt.check_steady) {
      if (rank == 0)
        std::fprintf(stderr, "example_04_data_parallel: the loss rose by %.4f in one step (%.4f -> %.4f), more than "
                             "--check-steady %.4f\n", rise, static_cast<double>(losses[i - 1]),
                     static_cast<double>(losses[i]), opt.check_steady);
      return 1;
    }
  }
  return 0;
}

// What both modes share: the run folder (rank 0 makes a new one and tells the others its number;
// --resume finds it on every rank), the heartbeat, the stop on a signal, the progress line and
// the whole run's losses.
struct session {
  options const& opt;
  tide::comm::mpi& world;
  tide::comm::heartbeat beat;
  tide::train::stop_signals stop;
  std::optional<demo::new_run_folder> fresh;  // rank 0's, for a new run
  fs::path dir;                               // the run folder
  bool resumed = false;
  demo::loss_history history;
  tide::offload::trace_recorder timeline;  // rank 0's last step
  // On a terminal only when ./tide says its own output is one (every rank's stdout is a pty).
  tide::train::progress progress{stdout, std::getenv("TIDE_TERMINAL") != nullptr && ::isatty(1) != 0};

  session(options const& o, tide::comm::mpi& w, fs::path const& checkpoint)
      : opt(o), world(w), beat(w, {.timeout = std::chrono::seconds(o.heartbeat_s)}) {
    beat.set_note("No checkpoint yet: start the run again");
    if (o.resume) {
      dir = demo::resume_folder(o.checkpoint_dir, o.resume_from, checkpoint);
      resumed = true;
      return;
    }
    std::exception_ptr failed;
    std::int64_t n = -1;
    if (w.rank() == 0) {
      try {
        demo::make_checkpoint_dir(o.checkpoint_dir);
        fresh.emplace(o.checkpoint_dir);
        n = demo::run_number(fresh->path());
      } catch (...) {
        failed = std::current_exception();
      }
    }
    n = tide::comm::of_rank0(w, n);
    if (failed) std::rethrow_exception(failed);
    TIDE_CHECK(n > 0, usage, "rank 0 could not make the run folder (its error says why)");
    char name[32];
    std::snprintf(name, sizeof name, "run-%03lld", static_cast<long long>(n));
    dir = fs::path(o.checkpoint_dir) / name;
  }

  // The ./tide demo flags that launch this job's shape again.
  [[nodiscard]] std::string shape_flags() const {
    std::string out;
    if (opt.tensor > 0) out += tide::detail::concat("--tensor ", opt.tensor, " ");
    if (opt.pipeline > 0) out += tide::detail::concat("--pipeline ", opt.pipeline, " ");
    return out + tide::detail::concat("--ranks ", world.size());
  }

  // What a lost rank's message says to do, after each save.
  void saved(fs::path const& checkpoint, std::int64_t step) {
    beat.set_note(tide::detail::concat("The last checkpoint is ", checkpoint.string(), " (step ", step,
                                       "): continue with ./tide demo ", shape_flags(), " --resume ",
                                       dir.string(), " and the flags of this run"));
  }

  // Loads RUN/checkpoint, with the data position and the losses it carries.
  template <class Trainer>
  void load(Trainer& trainer, tide::train::window_loader& loader, fs::path const& checkpoint) {
    trainer.load(checkpoint, [&](tide::train::checkpoint_reader const& r) {
      if (r.contains("data.windows"))
        loader.seek_windows(r.read_value<std::uint64_t>("data.windows"));  // the job's: any shape
      else  // a set saved before data.windows: its position in batches of this shape
        loader.seek(r.read_value<std::uint64_t>("data.position"));
      history.read(r);
    });
    history.trim_to(trainer.steps());
    saved(checkpoint, trainer.steps());
  }

  // Saves RUN/checkpoint: a set of one shard per rank (ZeRO, a compressor, a pipeline), every
  // rank writing its own; otherwise one file, written by rank 0.
  template <class Trainer>
  void save(Trainer& trainer, tide::train::window_loader const& loader, fs::path const& checkpoint) {
    std::uint64_t const windows = loader.windows_drawn();  // the job's: loads at any shape
    if (trainer.sharded() || world.rank() == 0)
      trainer.save(checkpoint, [&](tide::train::checkpoint_writer& w) {
        w.add_value("data.windows", windows);
        history.write(w);
      });
    saved(checkpoint, trainer.steps());
  }

  // Rank 0's line after the job's own: where the run writes, and the step it resumed at.
  void where(fs::path const& checkpoint, std::int64_t step) const {
    if (resumed)
      std::printf("resumed from %s at step %lld; writing on in %s\n", checkpoint.c_str(), static_cast<long long>(step),
                  dir.c_str());
    else
      std::printf("run folder: %s (checkpoint, pictures, timeline)\n", dir.c_str());
    std::fflush(stdout);
  }

  // What a run did: the loss of its first and last step (the mean over
  // every rank), the signal that stopped it (0: none), the steps it trained.
  struct trained_steps {
    float first = 0, last = 0;
    int asked = 0, trained = 0;
  };
  // Steps `trainer` up to --steps, each on the loader's next `micro` windows of (B, T) rows,
  // reporting the loss over `replicas` replicas (a pipeline's stages all report their replica's)
  // and saving at checkpoint as saves_after says; a signal stops every rank after the same step.
  template <class Trainer>
  trained_steps train(Trainer& trainer, tide::train::window_loader& loader, fs::path const& checkpoint, int replicas,
                      int micro = 1) {
    auto const rows = std::size_t(opt.batch) * std::size_t(opt.seq);
    std::vector<std::int32_t> in(rows * std::size_t(micro)), tg(in.size());
    std::vector<typename Trainer::batch_type> batches;
    for (std::size_t k = 0; k < std::size_t(micro); ++k)
      batches.push_back({{in.data() + rows * k, {opt.batch, opt.seq}}, {tg.data() + rows * k, {opt.batch, opt.seq}}});
    trained_steps t;
    while (trainer.steps() < opt.steps && t.asked == 0) {
      beat.at_step(trainer.steps() + 1);
      record(trainer.scheduler());
      for (std::size_t k = 0; k < std::size_t(micro); ++k)
        loader.next({in.data() + rows * k, {opt.batch, opt.seq}}, {tg.data() + rows * k, {opt.batch, opt.seq}});
      auto const st = trainer.step(std::span<typename Trainer::batch_type const>(batches));
      t.last = report(world, progress, st, opt.steps, replicas);  // every replica's mean
      if (t.trained++ == 0) t.first = t.last;                      // this run's first
      history.losses.push_back(t.last);
      t.asked = tide::train::agreed_stop(world, stop.pending());  // every rank stops after the same step
      if (saves_after(st.step, t.asked)) save(trainer, loader, checkpoint);
    }
    return t;
  }

  // Whether step `step` ends with a checkpoint: every --checkpoint-every steps, the last step, and
  // a step after which a signal stops the run.
  [[nodiscard]] bool saves_after(std::int64_t step, int asked) const {
    return asked != 0 || (opt.checkpoint_every > 0 && (step % opt.checkpoint_every == 0 || step == opt.steps));
  }

  // Rank 0's pictures: the loss of the whole run, and its scheduler's last step (the memory tide
  // and the timeline `timeline` recorded).
  template <class Scheduler>
  void draw(Scheduler& sched) {
    sched.set_trace(nullptr);
    if (world.rank() != 0 || history.losses.empty()) return;
    tide::offload::write_file((dir / "loss.svg").string(),
                              tide::train::loss_svg(history.losses, history.validation, "04_data_parallel loss",
                                                    history.first_step));
    auto const [tide_svg, trace_json] =
        demo::draw_step(dir, sched, timeline, tide::detail::concat(Scheduler::name(), ", rank 0 of ", world.size()));
    std::printf("pictures: %s, %s; timeline %s\n", (dir / "loss.svg").c_str(), tide_svg.c_str(), trace_json.c_str());
  }

  // Rank 0 records its scheduler's steps, each afresh: the last one is drawn.
  template <class Scheduler>
  void record(Scheduler& sched) {
    timeline.clear();
    if (world.rank() == 0) sched.set_trace(&timeline);
  }

  // Rank 0's last lines after a stop; the exit status.
  int stopped(int asked, std::int64_t step, fs::path const& checkpoint) const {
    if (world.rank() == 0) {
      std::printf("stopped by %s after step %lld of %d on every rank: ", demo::signal_name(asked),
                  static_cast<long long>(step), opt.steps);
      std::printf("checkpoint %s\ncontinue with: ./tide demo %s --resume %s --steps %d (and the flags of this run)\n",
                  checkpoint.c_str(), shape_flags().c_str(), dir.c_str(), opt.steps);
    }
    return tide::train::stop_signals::exit_status(asked);
  }

  // The exit status at the end of a run that trained `trained` steps up to `step`: a stop's, or
  // nothing trained, or verdict()'s (`same`: whether the ranks hold the same bits where they must).
  int ended(int asked, std::int64_t step, fs::path const& checkpoint, int trained, float first, float last, bool same,
            std::string const& said_same, std::string const& said_different) const {
    if (asked != 0) return stopped(asked, step, checkpoint);
    if (trained == 0) {
      if (world.rank() == 0)
        std::printf("nothing to train: the checkpoint is at step %lld; raise --steps\n", static_cast<long long>(step));
      return 0;
    }
    return verdict(opt, world.rank(), first, last, history.losses, same, said_same, said_different);
  }
};

template <class Compress>
int train(options const& opt, tide::comm::mpi& world, Compress const& compress, std::string const& how) {
  // Under ZeRO, or with a compressor's residuals on several ranks, every rank writes its shard of
  // a checkpoint set (a folder); otherwise rank 0 writes one file. Either is RUN/checkpoint.
  fs::path const checkpoint_name = "checkpoint";
  session run{opt, world, checkpoint_name};
  int const rank = world.rank(), ranks = world.size();
  auto const corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
  tide::train::window_loader loader{corpus, tide::train::split::train, opt.batch, opt.seq, 1, {rank, ranks}};
  tide::nn::gpt_config const config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = opt.seq};
  auto const model = model_options(opt, config);
  auto const off = offload_for(opt, config, model, rank);
  auto trainer = tide::train::make_trainer(
      tide::nn::gpt_spec<tide::host>{.config = config, .options = model}, off,
      tide::optim::adamw{.lr = opt.lr, .clip_norm = opt.clip, .decay_matrices_only = true,
                         .schedule = {.warmup_steps = opt.warmup, .total_steps = opt.steps}},
      tide::comm::data_parallel{.comm = &world, .bucket_bytes = opt.bucket_kib << 10, .zero = opt.zero}, compress);
  fs::path const checkpoint = run.dir / checkpoint_name;
  if (run.resumed) run.load(trainer, loader, checkpoint);
  if (rank == 0) {
    std::printf("data parallel on %d ranks, ZeRO-%d, %s, %s, device budget %s per rank, global batch %d x %d tokens\n",
                ranks, opt.zero, how.c_str(), decltype(trainer)::scheduler_type::name().c_str(),
                tide::detail::concat(tide::bytes_of{off.device_budget}).c_str(), ranks * opt.batch, opt.seq);
    run.where(checkpoint, trainer.steps());
  }
  auto const [first, last, asked, trained] = run.train(trainer, loader, checkpoint, ranks);
  run.draw(trainer.scheduler());
  // The same parameters on every rank, bit for bit (ZeRO-3: gathered from their owners first).
  trainer.scheduler().gather_parameters();
  std::vector<float> p;
  for (std::uint32_t i = 0; i < trainer.model().parameters().size(); ++i) {
    auto const v = trainer.scheduler().read_param(i);
    p.insert(p.end(), v.begin(), v.end());
  }
  bool const same = same_on(world, p);
  if (rank == 0) {
    demo::digest d;
    d.add(p);
    std::printf("parameters after step %lld: crc32c %08x\n", static_cast<long long>(trainer.steps()), d.crc);
  }
  return run.ended(asked, trainer.steps(), checkpoint, trained, first, last, same,
                 tide::detail::concat("parameters identical on all ", ranks, " ranks"),
                 tide::detail::concat("parameters DIFFERENT on the ", ranks, " ranks"));
}

// --pipeline P: stages on ranks, replicas beyond them.
template <tide::pipeline::kind K>
int train_pipeline(options const& opt, tide::comm::mpi& world) {
  namespace pp = tide::pipeline;
  TIDE_REQUIRE(world.size() % opt.pipeline == 0, "--pipeline ", opt.pipeline, " on ", world.size(),
               " ranks: the ranks must be a multiple of the stages");
  fs::path const checkpoint_name = "checkpoint";  // a set: one shard per rank
  session run{opt, world, checkpoint_name};
  auto g = pp::make_groups(world, opt.pipeline);
  int const replicas = world.size() / opt.pipeline;
  auto const corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
  tide::train::window_loader loader{corpus, tide::train::split::train, opt.batch, opt.seq, 1, {g.replica, replicas}};
  tide::nn::gpt_config const config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = opt.seq};
  int const slots = pp::slots_needed(pp::generate(K, opt.pipeline, opt.micro, K == pp::kind::interleaved ? 2 : 1),
                                     g.stage);
  auto const model = model_options(opt, config, slots, true);
  auto const off = offload_for(opt, config, model, world.rank());
  auto trainer = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = model}, off,
      tide::optim::adamw{.lr = opt.lr, .clip_norm = opt.clip, .decay_matrices_only = true, .micro_steps = opt.micro,
                         .schedule = {.warmup_steps = opt.warmup, .total_steps = opt.steps}},
      tide::comm::data_parallel{.comm = &g.data, .bucket_bytes = opt.bucket_kib << 10, .zero = opt.zero_given ? opt.zero : 0},
      tide::train::no_compress{},
      pp::on_ranks<K, tide::comm::mpi>{.stages = opt.pipeline, .micro = opt.micro, .group = &g.pipeline, .tied = &g.tied});
  int const rank = world.rank();
  fs::path const checkpoint = run.dir / checkpoint_name;
  if (run.resumed) run.load(trainer, loader, checkpoint);
  if (rank == 0) {
    std::printf("pipeline of %d stages (%s, %d micro-batches of %d x %d tokens) x %d data-parallel replicas, %s, "
                "device budget %s per rank; stage 0 holds %zu of %zu tensors\n",
                opt.pipeline, std::string(pp::to_string(K)).c_str(), opt.micro, opt.batch, opt.seq, replicas,
                decltype(trainer)::scheduler_type::name().c_str(),
                tide::detail::concat(tide::bytes_of{off.device_budget}).c_str(),
                trainer.scheduler().parameters().size(), trainer.model().parameters().size());
    run.where(checkpoint, trainer.steps());
  }
  auto const [first, last, asked, trained] = run.train(trainer, loader, checkpoint, replicas, opt.micro);
  run.draw(trainer.scheduler());
  // Each stage's replicas hold the same parameters, and both ends the same wte, bit for bit.
  trainer.scheduler().gather_parameters();  // ZeRO-3: every chunk of the stage here
  auto const all = tide::nn::gpt_parameters(config, tide::dtype::f32);  // the whole model's, in order
  std::vector<std::int64_t> crcs(all.size(), -1);  // each parameter's CRC-32C, from the stages that hold it
  std::vector<float> p;
  auto const& list = trainer.scheduler().parameters();
  for (std::uint32_t i = 0; i < list.size(); ++i) {
    auto const v = trainer.scheduler().read_param(i);
    p.insert(p.end(), v.begin(), v.end());
    demo::digest one;
    one.add(v);
    crcs[static_cast<std::size_t>(&all.find(list[i].name()) - all.all().data())] = one.crc;
  }
  bool const replicas_same = same_on(g.data, p);
  // wte at both ends: the first and the last stage hold it unless a V placement puts both ends
  // on the first stage.
  pp::schedule const plan = trainer.pipeline().plan();
  bool const tied_across = pp::stage_of(plan, 0) != pp::stage_of(plan, plan.stages * plan.chunks - 1);
  bool tied_same = true;
  if (tied_across && (g.stage == 0 || g.stage == opt.pipeline - 1))
    tied_same = same_on(g.tied, trainer.scheduler().read_param(
                                    static_cast<std::uint32_t>(&list.find("wte") - list.all().data())));
  bool const ok = tide::comm::all_ranks(world, replicas_same && tied_same);
  std::uint32_t const digest = model_digest(g.pipeline, std::move(crcs));
  if (rank == 0) {
    std::printf("parameters after step %lld: crc32c %08x (of each parameter's, in the model's order)\n",
                static_cast<long long>(trainer.steps()), digest);
  }
  return run.ended(asked, trainer.steps(), checkpoint, trained, first, last, ok,
                 "each stage's parameters identical on its replicas, wte identical at both ends",
                 "parameters DIFFER where they must not");
}

// --tensor T: the model's layers split over groups of T ranks (tp::gpt_spec), the groups
// data-parallel replicas of each other (ZeRO as --zero says), each drawing its own rows; with
// --pipeline P the groups are the stages of pipelines (1F1B over --micro micro-batches), and the
// pipelines the replicas: tensor x pipeline x data.
template <bool Staged>
int train_tensor(options const& opt, tide::comm::mpi& world) {
  int const stages = Staged ? opt.pipeline : 1;
  TIDE_REQUIRE(world.size() % (opt.tensor * stages) == 0, "--tensor ", opt.tensor, Staged ? " --pipeline " : "",
               Staged ? std::to_string(stages) : std::string(), " on ", world.size(), " ranks: the ranks must be a "
               "multiple of ", opt.tensor * stages);
  namespace pp = tide::pipeline;
  fs::path const checkpoint_name = "checkpoint";  // a set: one shard per rank
  session run{opt, world, checkpoint_name};
  auto g = tide::tp::make_groups(world, opt.tensor, stages);
  int const replicas = world.size() / (opt.tensor * stages), rank = world.rank(), micro = Staged ? opt.micro : 1;
  auto const corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
  tide::train::window_loader loader{corpus, tide::train::split::train, opt.batch, opt.seq, 1, {g.data_rank, replicas}};
  tide::nn::gpt_config const config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = opt.seq};
  int const slots = Staged ? pp::slots_needed(pp::generate(pp::kind::one_f_one_b, stages, micro), g.stage) : 1;
  tide::tp::gpt_spec<tide::comm::mpi> const spec{.config = config, .tensor = {.group = &g.tensor, .sequence = opt.sequence},
                                                 .in_flight = slots, .separate_tied_grad = Staged,
                                                 .recompute = opt.recompute};
  std::vector<std::int32_t> in(std::size_t(opt.batch) * std::size_t(opt.seq)), tg(in.size());
  std::size_t activations = 0;  // of the rank's shard (every slot): one forward, on every rank of the group
  {
    tide::thread_pool pool{1};
    tide::tp::gpt<tide::comm::mpi> m(config, g.tensor,
                                     {.sequence = opt.sequence, .in_flight = slots, .separate_tied_grad = Staged,
                                      .recompute = opt.recompute});
    (void)m.forward(tide::exec<tide::host>{pool}, {in.data(), {opt.batch, opt.seq}}, {tg.data(), {opt.batch, opt.seq}});
    activations = m.activation_bytes();
  }
  auto const off = offload_for(opt, spec.parameters(), spec.uses(), activations, 0, rank);
  tide::optim::adamw const adamw{.lr = opt.lr, .clip_norm = opt.clip, .decay_matrices_only = true, .micro_steps = micro,
                                 .schedule = {.warmup_steps = opt.warmup, .total_steps = opt.steps}};
  tide::comm::data_parallel const dp{.comm = &g.data, .bucket_bytes = opt.bucket_kib << 10, .zero = opt.zero};
  auto trainer = [&] {
    if constexpr (Staged)
      return tide::train::make_trainer(spec, off, adamw, dp, tide::train::no_compress{},
                                       pp::on_ranks<pp::kind::one_f_one_b, tide::comm::mpi>{
                                           .stages = stages, .micro = micro, .group = &g.pipeline, .tied = &g.tied});
    else
      return tide::train::make_trainer(spec, off, adamw, dp);
  }();
  fs::path const checkpoint = run.dir / checkpoint_name;
  if (run.resumed) run.load(trainer, loader, checkpoint);
  if (rank == 0) {
    std::printf("tensor parallel in groups of %d%s%s x %d data-parallel replicas, ZeRO-%d, %s, device budget %s per "
                "rank; a rank holds %lld of the model's %lld parameters%s; global batch %d x %d x %d tokens\n",
                opt.tensor, opt.sequence ? " (sequence parallel)" : "",
                Staged ? tide::detail::concat(" in pipelines of ", stages, " stages (1F1B)").c_str() : "", replicas,
                opt.zero, decltype(trainer)::scheduler_type::name().c_str(),
                tide::detail::concat(tide::bytes_of{off.device_budget}).c_str(),
                static_cast<long long>(trainer.scheduler().parameters().count()),
                static_cast<long long>(tide::nn::gpt_parameters(config, tide::dtype::f32).count()),
                Staged ? " (its stage's shards)" : "", replicas * micro, opt.batch, opt.seq);
    run.where(checkpoint, trainer.steps());
  }
  auto const [first, last, asked, trained] = run.train(trainer, loader, checkpoint, replicas, micro);
  run.draw(trainer.scheduler());
  // Each shard the same on its replicas, each replicated tensor the same on its group, wte the
  // same at both ends, bit for bit. The digest is --pipeline's: the CRC-32C of each whole tensor's
  // (gathered from the shards, on the stage that holds it), in the model's order.
  trainer.scheduler().gather_parameters();
  auto const whole = tide::nn::gpt_parameters(config, tide::dtype::f32);
  auto const splits = spec.tensor_splits();
  auto const& held = trainer.scheduler().parameters();  // the stage's (all, without a pipeline)
  bool ok = true;
  std::vector<std::int64_t> crcs(whole.size(), -1);  // each whole tensor's CRC-32C, from the stage that holds it
  std::vector<float> gathered, full;
  for (std::uint32_t j = 0; j < held.size(); ++j) {
    auto const i = static_cast<std::size_t>(&whole.find(held[j].name()) - whole.all().data());
    auto const v = trainer.scheduler().read_param(j);
    ok = same_on(g.data, v) && ok;
    if (Staged && held[j].name() == "wte") ok = same_on(g.tied, v) && ok;
    std::vector<float> const* out = &v;
    if (splits[i] == tide::tp::split::replicated) {
      ok = same_on(g.tensor, v) && ok;
    } else {
      tide::index_t const rows = whole[i].shape[0], cols = whole[i].shape.rank == 2 ? whole[i].shape[1] : 1;
      gathered.resize(v.size() * static_cast<std::size_t>(opt.tensor));
      full.resize(static_cast<std::size_t>(rows * cols));
      g.tensor.all_gather(std::span<float const>(v), std::span<float>(gathered));
      tide::tp::put_shards(splits[i], std::span<float const>(gathered), std::span<float>(full), rows, cols, opt.tensor);
      out = &full;
    }
    demo::digest one;
    one.add(*out);
    crcs[i] = one.crc;
  }
  ok = tide::comm::all_ranks(world, ok);
  std::uint32_t const digest = model_digest(g.pipeline, std::move(crcs));
  if (rank == 0)
    std::printf("parameters after step %lld: crc32c %08x (of each whole tensor's, in the model's order)\n",
                static_cast<long long>(trainer.steps()), digest);
  return run.ended(asked, trainer.steps(), checkpoint, trained, first, last, ok,
                 Staged ? "each shard identical on its replicas, each replicated tensor on its group, wte at both ends"
                        : "each shard identical on its replicas, each replicated tensor identical on its group",
                 "parameters DIFFER where they must not");
}

int run(options const& opt, tide::comm::mpi& world) {
  namespace cx = tide::compress;
  if (opt.tensor > 0 && opt.pipeline > 0) return train_tensor<true>(opt, world);
  if (opt.tensor > 0) return train_tensor<false>(opt, world);
  if (opt.pipeline > 0)
  {
    using tide::pipeline::kind;
    if (opt.schedule == "gpipe") return train_pipeline<kind::gpipe>(opt, world);
    if (opt.schedule == "interleaved") return train_pipeline<kind::interleaved>(opt, world);
    if (opt.schedule == "zb_v") return train_pipeline<kind::zb_v>(opt, world);
    if (opt.schedule == "dualpipe_v") return train_pipeline<kind::dualpipe_v>(opt, world);
    return train_pipeline<kind::one_f_one_b>(opt, world);
  }
  if (opt.density > 0)
    return train(opt, world,
                 cx::error_feedback<>{.compressor = {.density = static_cast<float>(opt.density), .warmup_steps = 10}},
                 tide::detail::concat("gradients sent sparse at density ", opt.density));
  if (opt.powersgd > 0)
    return train(opt, world, cx::powersgd{.compressor = {.rank = opt.powersgd}},
                 tide::detail::concat("matrices sent by PowerSGD at rank ", opt.powersgd));
  return train(opt, world, tide::train::no_compress{}, tide::detail::concat("buckets of ", opt.bucket_kib, " KiB"));
}

}  // namespace

int main(int argc, char** argv) {
  tide::comm::mpi_session session{&argc, &argv};
  // The usage and the arguments' errors are the same on every rank: rank 0 says them, once.
  if (wants_help(argc, argv)) {
    if (session.rank() == 0) std::fputs(usage_text, stdout);
    return 0;
  }
  options opt;
  try {
    opt = parse(argc, argv);
  } catch (tide::error const& e) {
    if (session.rank() == 0) std::fprintf(stderr, "example_04_data_parallel: %s\n", e.message().c_str());
    return 2;
  }
  // A long deadline: a slow collective is no failure; the heartbeat notices a lost rank.
  tide::comm::mpi world{session, {.deadline = std::chrono::seconds(opt.deadline_s)}};
  try {
    return run(opt, world);
  } catch (tide::error const& e) {
    // A usage error (the flags against the ranks) is every rank's: rank 0 says it. Any other
    // failure is this rank's own, said on a line of its own.
    if (e.category() == tide::errc::usage) {
      if (world.rank() == 0) std::fprintf(stderr, "example_04_data_parallel: %s\n", e.message().c_str());
    } else {
      std::fflush(stdout);
      std::fprintf(stderr, "\nexample_04_data_parallel: rank %d: %s\n", world.rank(), e.message().c_str());
    }
    return 2;
  }
}
