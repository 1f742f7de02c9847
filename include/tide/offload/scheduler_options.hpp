#pragma once
// scheduler_options: how an offload::scheduler runs a step, beside its policy (where the chunks
// live) and its slots (optimizer, gradient sink, chunk source). Every field has the default a
// single-rank run wants; train::make_trainer fills them from the trainer's options.
//
//   tide::offload::scheduler_options opts{.micro_steps = 4, .defer_optimizer = true};  // clipping
//   opts.host_budget = 8_GiB;                 // past it, optimizer state goes to file
//   opts.spill_folder = "/mnt/nvme/spill";

#include <cstddef>
#include <filesystem>

namespace tide::offload {

// The host-side memory knobs every scheduler policy carries as `.memory`, which make_trainer
// passes to its scheduler: the fields of scheduler_options below of the same names say what each
// does. One struct, so a misspelled knob is a compile error, not a knob silently ignored.
//
//   tide::offload::chunked<tide::offload::belady>{.device_budget = 2_GiB,
//       .memory = {.host_budget = 48_GiB, .spill_folder = "/mnt/nvme/tide"}}
struct memory_options {
  bool reuse_grad_slots = false;  // bf16 / f16: gradients take their parameters' slots (14 B/param)
  bool keep_host_copies = true;   // a fetched parameter chunk keeps its host block
  int host_steps_in_flight = 4;   // the gradient ring of the host steps (0: none)
  std::size_t host_capacity = 0;  // the most host memory the engine may hold (0: no limit)
  // The NVMe tier (chunked only: its policy says nvme_tier): model data kept on the host between
  // steps (0: no limit), the folder for what goes past it, and the room kept for activations.
  std::size_t host_budget = 0;
  std::filesystem::path spill_folder{};
  std::size_t host_reserve = 0;
};

struct scheduler_options {
  float grad_scale = 1.f;        // multiplies every gradient in the step (clipping, loss-scale unscaling)
  int micro_steps = 1;           // backward passes per optimizer step (gradient accumulation)
  bool overlap_optimizer = true; // host steps run on the optimizer worker beside backward
  // Host steps queued on the optimizer worker with their gradients copied out of the device, at
  // most (0: no bound). Their gradients go to a ring of this many host blocks, pinned at the first
  // host step and reused (a steady step allocates nothing); with none free, the queuing thread
  // (backward, or step() with defer_optimizer) waits for the oldest step, and a worker slower
  // than backward shows as offload_stats::stall_ms in backward instead of in step(). So the host
  // keeps the parameters, the optimizer state and this many chunks of gradients, not every
  // chunk's. While a gradient sink (data parallel, ZeRO) still reduces a chunk of the step nothing
  // waits (the sink paces the steps) and the gradients take pool blocks, as they do with 0.
  int host_steps_in_flight = 4;
  // The optimizer runs in step() instead of after each block's backward: what global-norm
  // clipping and loss scaling need (the norm and the overflow check read every gradient first).
  bool defer_optimizer = false;
  // The gradient sink gets the completed chunks from hand_over_gradients(), after backward, not
  // during it (needs defer_optimizer): a pipeline stage first agrees with the other stages and
  // replicas that the step's backward ran everywhere, so a step lost on one rank is summed nowhere.
  bool defer_sink = false;
  // Weight decay on matrices only (rank >= 2), not on biases and LayerNorm gains (GPT-2's rule).
  bool decay_matrices_only = false;
  bool lock_host_pages = false;  // host tier: mlock (pointless on tide::host, where nothing DMAs)
  // A chunk stepped inside a step keeps a host copy of its parameters and optimizer state until
  // the step completes, so a step that throws can be undone (abort_step). Costs host memory of up
  // to the stepped state (12 B per fp32 parameter with Adam) and one copy of it per step
  // (bench/offload undo_on_error_vs_off); off, a step that throws after the optimizer started
  // may leave some chunks updated.
  bool undo_on_error = true;
  // The NVMe tier. host_budget: host bytes the model data kept between steps may take (the
  // parameter chunks, the optimizer state, a sink's extra lists; 0: no limit). Past it, the
  // optimizer state of the last chunks (with bf16 / f16 their fp32 masters too, unless
  // reuse_grad_slots) lives in a file under spill_folder (a memory::file_store,
  // O_DIRECT where the filesystem has it): read before each host step of such a chunk, written
  // after it to a second slot that the step's end makes current, so a failed write loses nothing.
  // Past every chunk's state, the last parameter chunks go to a second file (not under a
  // sharding sink or reuse_grad_slots): read when fetched, and with their state when stepped.
  std::size_t host_budget = 0;
  std::filesystem::path spill_folder{};
  // Of host_budget, the room kept for the model's offloaded activations (nn::gpt_options::
  // offload_activations through offload::hooks, which take their host copies from this pool):
  // the NVMe tier takes that much more optimizer state to file. Without it, activations that need
  // more than the model data leaves of host_budget are refused at the first forward.
  std::size_t host_reserve = 0;
  // Gradient-slot reuse (bf16 / f16 parameters): once a chunk's gradients are complete, its
  // parameters are not read again before the update, and its fp32 master holds them exactly
  // (parameter = round(master) between steps). So the gradient block becomes the parameter
  // chunk's payload and the parameter block is freed: 14 bytes per parameter with Adam, not 16,
  // when every gradient lives until step() (defer_optimizer: clipping, loss scaling). The update
  // reads the gradient and writes the rounded parameter into the same slot; a step that is
  // skipped or abandoned rounds the masters back into it. Refused where it cannot be exact:
  // fp32 parameters (the parameter chunk is the master), micro_steps > 1 (the next micro-step's
  // forward reads the parameters) and ZeRO (a rank keeps the masters of its own chunks only).
  bool reuse_grad_slots = false;
  // A parameter chunk fetched to the device keeps its host block while it is unchanged, so
  // evicting it needs no copy (a clean drop). false: the host block is freed once the copy
  // landed, and an eviction copies the chunk back: less host memory (by the device-resident
  // parameter chunks), more copies.
  bool keep_host_copies = true;
  // The most host memory the engine's pool may hold (memory::pinned_pool_options::capacity; 0: no
  // limit): the model data kept on the host, the undo copies and gradients of the host steps,
  // staging, the offloaded activations. Past it, what asks for more is tide::error(budget): the
  // construction when the model data alone does not fit, a step (undone, as any failure) when
  // what the step takes on top of it does not. The largest model a machine trains is then found
  // without the kernel's out-of-memory killer (bench/offload's max_model figures).
  std::size_t host_capacity = 0;
};

}  // namespace tide::offload
