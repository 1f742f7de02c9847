// Every template of every .cuh, instantiated, compiled by nvcc for sm_80 and sm_90 with ptxas -v
// and linked (ctest: cuda/instantiate_all). The hot kernels among the entry functions are listed
// in hot_kernels.txt and must not spill. A new .cuh goes into tide/cuda.cuh and gets its calls
// here, with the element types real callers use.
//
// Templates are instantiated by calling them from functions that are compiled and linked but
// never run (the views are empty): a call names no parameter types, so it keeps compiling when a
// signature gains a defaulted parameter, and it instantiates exactly what a caller would.

#include <array>
#include <cstdint>
#include <span>

#include <tide/comm/self.hpp>
#if defined(TIDE_HAS_MPI)
#include <tide/comm/mpi.hpp>
#endif
#include <tide/cuda.cuh>
#include <tide/nn/gpt.hpp>
#include <tide/offload/scheduler.hpp>
#include <tide/offload/simulate.hpp>
#include <tide/optim/adam.hpp>
#include <tide/optim/sgd.hpp>
#include <tide/train/trainer.hpp>

namespace {

using tide::bf16;
using tide::f16;
template <class T>
using device_view = tide::tensor_view<T, tide::cuda>;
template <class T>
using host_view = tide::tensor_view<T, tide::host>;
using cuda_exec = tide::exec<tide::cuda>;
using tokens_view = device_view<std::int32_t const>;

// ---- kernels/cast: every pair of f32, bf16, f16, on both backends ----------------------------
template <class From, class To>
void cast_pair(cuda_exec const& ex, tide::exec<tide::host> const& hx) {
  tide::kernels::cast(ex, device_view<From const>{}, device_view<To>{});
  tide::kernels::cast(hx, host_view<From const>{}, host_view<To>{});  // host code through nvcc
}

template <class From>
void cast_from(cuda_exec const& ex, tide::exec<tide::host> const& hx) {
  cast_pair<From, float>(ex, hx);
  cast_pair<From, bf16>(ex, hx);
  cast_pair<From, f16>(ex, hx);
}

// ---- kernels/adamw: fp32 master weights; f32, bf16, f16 gradients; working copies ------------
template <class Grad, class Work>
void adamw_of(cuda_exec const& ex, float const* device_scale) {
  tide::kernels::adamw_hparams const hp{};
  tide::kernels::adamw(ex, hp, 1, device_view<tide::kernels::adamw_tensor<Grad, Work> const>{}, 1.f, device_scale);
  tide::kernels::adamw(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{},
                       device_view<float>{}, device_view<Work>{}, 1.f, device_scale);
  tide::kernels::adamw(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{},
                       device_view<float>{});
}

// ---- kernels/adam: as adamw (its records are adamw's) -----------------------------------------
template <class Grad, class Work>
void adam_of(cuda_exec const& ex, float const* device_scale) {
  tide::kernels::adam_hparams const hp{};
  tide::kernels::adam(ex, hp, 1, device_view<tide::kernels::adam_tensor<Grad, Work> const>{}, 1.f, device_scale);
  tide::kernels::adam(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{},
                      device_view<float>{}, device_view<Work>{}, 1.f, device_scale);
  tide::kernels::adam(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{},
                      device_view<float>{});
}

// ---- kernels/sgd: fp32 master weights and momentum; f32, bf16, f16 gradients; working copies ----
template <class Grad, class Work>
void sgd_of(cuda_exec const& ex, float const* device_scale) {
  tide::kernels::sgd_hparams const hp{.momentum = 0.9f};
  tide::kernels::sgd(ex, hp, 1, device_view<tide::kernels::sgd_tensor<Grad, Work> const>{}, 1.f, device_scale);
  tide::kernels::sgd(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{},
                     device_view<Work>{}, 1.f, device_scale);
  tide::kernels::sgd(ex, hp, 1, device_view<float>{}, device_view<Grad const>{}, device_view<float>{});
}

// ---- kernels/grad_norm: flat chunks and both record types -------------------------------------
template <class Grad>
void grad_norm_of(cuda_exec const& ex, tide::kernels::grad_norm_scratch* scratch) {
  tide::kernels::global_grad_norm(ex, device_view<Grad const>{}, scratch, 1.f);
  tide::kernels::global_grad_norm(ex, device_view<tide::kernels::grad_tensor<Grad> const>{}, scratch);
  tide::kernels::global_grad_norm(ex, device_view<tide::kernels::adamw_tensor<Grad, bf16> const>{}, scratch);
}

// ---- the layer kernels (softmax ... attention): activations and weights in f32 and bf16 -----
template <class T>
void activations_of(cuda_exec const& ex) {
  namespace k = tide::kernels;
  device_view<T> y{};
  device_view<T const> x{};
  device_view<float> losses{};
  tokens_view tokens{};

  // Every kernel that takes scratch, with its query (kernels/scratch.hpp); none allocates.
  k::scratch<tide::cuda> const ws{};
  (void)k::softmax_forward_scratch_bytes(ex, 4, 8);
  k::softmax_forward(ex, y, x);
  k::softmax_forward(ex, y, x, 1.f, ws);
  k::softmax_forward_causal(ex, y, x, 0.125f, ws);
  k::softmax_forward_masked(ex, y, x, tokens, 1.f, ws);
  k::softmax_backward(ex, y, x, x);

  (void)k::fused_classifier_scratch_bytes(ex, 4, 50257);
  k::fused_classifier(ex, y, losses, x, tokens, 50257, ws);
  k::fused_classifier(ex, y, losses, x, tokens, 50257, 0.5f, ws);
  k::fused_classifier(ex, y, losses, x, tokens, 50257, device_view<float const>{}, ws);
  k::crossentropy_forward(ex, losses, x, tokens, 50257);
  k::crossentropy_softmax_backward(ex, y, x, tokens, 50257, 0.5f);

  (void)k::encoder_backward_scratch_bytes(ex, 4, 64, 768, 50257);
  k::encoder_forward(ex, y, tokens, x, x);
  k::encoder_backward(ex, device_view<float>{}, device_view<float>{}, x, tokens, ws);
  k::encoder_forward(ex, y, tokens, k::row_table<T const>{}, x);  // a table in row pieces
  k::encoder_backward(ex, k::row_table<T>{}, device_view<T>{}, x, tokens, ws);

  (void)k::matmul_forward_scratch_bytes<T>(ex, 4, 8, 8);
  (void)k::matmul_backward_scratch_bytes<T>(ex, 4, 8, 8);
  k::matmul_forward(ex, y, x, x);
  k::matmul_forward(ex, y, x, x, x, ws);
  k::matmul_forward_gelu(ex, y, y, x, x, x, ws);
  k::matmul_backward(ex, y, y, y, x, x, x, ws);
  k::matmul_backward_gelu(ex, y, y, y, y, x, x, x, ws);
  k::matmul_backward_input(ex, y, x, x);
  k::matmul_backward_input(ex, y, x, x, ws);
  k::matmul_backward_weight(ex, y, y, x, x);
  k::matmul_backward_weight(ex, y, y, x, x, ws);
  k::matmul_backward_gelu_input(ex, y, y, x, x);
  k::matmul_backward_gelu_input(ex, y, y, x, x, ws);

  k::gelu_forward(ex, y, x);
  k::gelu_backward(ex, y, x, x);
  k::bias_gelu_forward(ex, y, x, x);
  (void)k::bias_gelu_backward_scratch_bytes(ex, 4, 8);
  k::bias_gelu_backward(ex, y, y, x, x, x, ws);

  device_view<float> stats{};
  device_view<float const> saved{};
  k::layernorm_forward(ex, y, stats, stats, x, x, x);
  k::residual_layernorm_forward(ex, y, y, stats, stats, x, x, x, x);
  (void)k::layernorm_backward_scratch_bytes(ex, 4, 8);
  k::layernorm_backward(ex, y, y, y, x, x, x, saved, saved, ws);
  k::layernorm_backward_input(ex, y, x, x, x, saved, saved);
  k::layernorm_backward_weight(ex, y, y, x, x, saved, saved, ws);

  k::residual_forward(ex, y, x, x);
  k::residual_backward(ex, y, y, x);

  (void)k::attention_forward_scratch_bytes(ex, 1, 4, 8, 2);
  (void)k::attention_backward_scratch_bytes(ex, 1, 4, 8, 2);
  k::attention_forward(ex, y, losses, x, 12, ws);
  k::attention_backward(ex, y, x, x, x, device_view<float const>{}, 12, ws);
}

// ---- memory: the cuda specialisations and the class templates over them ----------------------
struct host_step {
  int* counter;
  void operator()() const { ++*counter; }
};

void memory_of() {
  tide::memory::stream<tide::cuda> s;
  tide::memory::event<tide::cuda> e;
  e.record(s);
  s.wait(e);
  int counter = 0;
  host_step step{&counter};
  tide::memory::launch(s, step);
  tide::memory::device_arena<tide::cuda> arena{{}};
  tide::memory::caching_allocator<tide::cuda> cache{arena};
  (void)cache.allocate(256);
}

// ---- chunk/ and offload/: host logic through nvcc ------------------------------------------------
void offload_of(tide::exec<tide::host> const& hx) {
  tide::memory::device_arena<tide::host> arena{{.budget = 1 << 20}};
  tide::nn::gpt_config const cfg{.layers = 1, .heads = 1, .channels = 8, .vocab = 8, .max_seq = 4};
  tide::offload::scheduler<tide::host, float, tide::offload::chunked<tide::offload::belady>> s{
      hx, arena, tide::nn::gpt_parameters(cfg, tide::dtype::f32), tide::nn::gpt_block_uses(cfg)};
  s.step();
  tide::chunk::access_trace const trace(2);
  (void)tide::offload::simulate(trace, 2, tide::offload::lru{});
  (void)tide::offload::simulate(trace, 2, tide::offload::fifo{});
}

// ---- the engine, nn::gpt and make_trainer on tide::cuda: compiled, never run on a GPU ----------
// The scheduler under every policy with the model's hooks (forward, backward, the step, the
// gathers), f32 and bf16; then make_trainer with each optimizer's device update, clipping (the
// norm on the device), checkpoints.
template <class Policy, class T>
void engine_on_cuda(cuda_exec const& ex, tide::memory::device_arena<tide::cuda>& arena) {
  namespace off = tide::offload;
  tide::nn::gpt_config const cfg{.layers = 1, .heads = 1, .channels = 8, .vocab = 8, .max_seq = 4};
  using sched = off::scheduler<tide::cuda, T, Policy>;
  sched s{ex, arena, tide::nn::gpt_parameters(cfg, tide::dtype_of<T>), tide::nn::gpt_block_uses(cfg), Policy{}};
  tide::nn::gpt<tide::cuda, T, off::hooks<sched>> m{cfg, arena, {}, off::hooks<sched>{&s}};
  typename decltype(m)::batch_type const b{};
  (void)m.forward(ex, b);
  m.backward(ex);
  s.step();
  s.gather_parameters();
  (void)s.read_param(0);
}
template <class T, class Policy, class Optimizer>
void trainer_on_cuda(Policy const& policy, Optimizer const& opt) {
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda, T>{}, policy, opt);
  typename decltype(t)::batch_type const b{};
  (void)t.step(b);
  t.save("never");
  t.load("never");
}
void engine_and_trainer_of(cuda_exec const& ex) {
  namespace off = tide::offload;
  tide::memory::device_arena<tide::cuda> arena{{}};
  engine_on_cuda<off::resident, float>(ex, arena);
  engine_on_cuda<off::chunked<off::belady>, float>(ex, arena);
  engine_on_cuda<off::chunked<off::belady>, bf16>(ex, arena);
  engine_on_cuda<off::layer_window<2>, float>(ex, arena);
  engine_on_cuda<off::static_partition, bf16>(ex, arena);
  trainer_on_cuda<float>(off::chunked<off::belady>{}, tide::optim::adamw{.clip_norm = 1.f});
  trainer_on_cuda<bf16>(off::resident{}, tide::optim::sgd{});
  trainer_on_cuda<bf16>(off::layer_window<2>{}, tide::optim::adam{});
  // generate on the device, f32 and bf16 logits read back
  tide::nn::gpt_config const cfg{.layers = 1, .heads = 1, .channels = 8, .vocab = 8, .max_seq = 4};
  std::int32_t const prompt[] = {1};
  (void)tide::nn::gpt<tide::cuda>(cfg, arena).generate(ex, prompt, 2, 1.f, 0);
  (void)tide::nn::gpt<tide::cuda, bf16>(cfg, arena).generate(ex, prompt, 2, 0.f, 0);
}

#if defined(TIDE_HAS_NCCL)
// ---- comm/nccl: every operation, blocking and asynchronous, for every element type -------------
template <class T>
void nccl_ops(tide::comm::nccl& c) {
  std::span<T> d;
  std::span<T const> cd;
  std::array<tide::index_t, 1> counts{};
  c.all_reduce(d, tide::comm::reduce_op::sum);
  c.reduce(d, 0, tide::comm::reduce_op::max);
  c.reduce_scatter(cd, d, tide::comm::reduce_op::min);
  c.all_gather(cd, d);
  c.all_gatherv(cd, d, std::span<tide::index_t const>(counts));
  c.broadcast(d, 0);
  c.send(cd, 0, 0);
  c.recv(d, 0, 0);
  c.wait(c.all_reduce_async(d, tide::comm::reduce_op::sum));
  (void)c.test(c.broadcast_async(d, 0));
}
// Bootstrapped from any Communicator: comm::self (one process), comm::mpi (many).
template <class Boot>
void nccl_of(Boot& bootstrap) {
  tide::comm::nccl c{bootstrap, 0};
  nccl_ops<float>(c);
  nccl_ops<double>(c);
  nccl_ops<std::int32_t>(c);
  nccl_ops<std::int64_t>(c);
  nccl_ops<std::uint8_t>(c);
  nccl_ops<bf16>(c);
  nccl_ops<f16>(c);
  c.barrier();
  tide::comm::nccl half = c.split(0, c.rank());
  half.barrier();
  // make_trainer's data parallelism in device memory (comm::nccl_data_parallel), f32 and bf16,
  // with ZeRO (the sink's reduce to the owner and the share of the stepped chunks)
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda>{}, tide::offload::chunked<>{},
                                     tide::optim::adamw{.clip_norm = 1.f},
                                     tide::comm::nccl_data_parallel<Boot>{.gpus = &c, .host = &bootstrap, .zero = 2});
  (void)t.step(typename decltype(t)::batch_type{});
  t.save("never");
  auto h = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda, bf16>{}, tide::offload::resident{},
                                     tide::optim::adamw{}, tide::comm::nccl_data_parallel<Boot>{&c, &bootstrap});
  (void)h.step(typename decltype(h)::batch_type{});
}
#endif

// ---- compress/select: the device selectors ----------------------------------------------------
void compress_of(cuda_exec const& ex) {
  tide::compress::device_select_scratch scratch{{nullptr, tide::compress::select_scratch_bytes(1)}};
  tide::compress::threshold_search_cuda t;
  (void)t.select(ex, device_view<float const>{}, 1, device_view<std::uint32_t>{}, scratch);
  (void)tide::compress::exact_topk_cuda{}.select(ex, device_view<float const>{}, 1, device_view<std::uint32_t>{},
                                                 scratch);
  (void)tide::compress::trimmed_topk_cuda{}.select(ex, device_view<float const>{}, 1, device_view<std::uint32_t>{},
                                                   scratch);
  (void)tide::compress::sampled_threshold_cuda{}.select(ex, device_view<float const>{}, 1,
                                                        device_view<std::uint32_t>{}, scratch);
  tide::compress::random_k_cuda r;
  (void)r.select(ex, device_view<float const>{}, 1, device_view<std::uint32_t>{}, scratch);
}

}  // namespace

template class tide::memory::device_arena<tide::cuda>;
template class tide::memory::pinned_pool<tide::cuda>;
template struct tide::memory::device_streams<tide::cuda>;
template class tide::memory::transfer_engine<tide::cuda>;

// Linked, never run: main refers to every function above without calling it on a device.
int main(int argc, char**) {
  if (argc < 1000 || !tide::has_cuda_device()) return 0;
  cuda_exec const ex{};
  tide::thread_pool pool{1};
  tide::exec<tide::host> const hx{pool};
  cast_from<float>(ex, hx);
  cast_from<bf16>(ex, hx);
  cast_from<f16>(ex, hx);
  adamw_of<float, bf16>(ex, nullptr);
  adamw_of<bf16, bf16>(ex, nullptr);
  adamw_of<f16, f16>(ex, nullptr);
  adam_of<float, bf16>(ex, nullptr);
  adam_of<bf16, bf16>(ex, nullptr);
  adam_of<f16, f16>(ex, nullptr);
  sgd_of<float, bf16>(ex, nullptr);
  sgd_of<bf16, bf16>(ex, nullptr);
  sgd_of<f16, f16>(ex, nullptr);
  grad_norm_of<float>(ex, nullptr);
  grad_norm_of<bf16>(ex, nullptr);
  grad_norm_of<f16>(ex, nullptr);
  activations_of<float>(ex);
  activations_of<bf16>(ex);
  memory_of();
  offload_of(hx);
  engine_and_trainer_of(ex);
  compress_of(ex);
#if defined(TIDE_HAS_NCCL)
  tide::comm::self one;
  nccl_of(one);
#endif
#if defined(TIDE_HAS_NCCL) && defined(TIDE_HAS_MPI)
  tide::comm::mpi_session session;
  tide::comm::mpi world{session};
  nccl_of(world);
#endif
  return 0;
}
