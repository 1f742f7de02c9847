// comm::nccl, launched on 2 ranks (mpiexec -n 2): first each rank alone, a communicator
// bootstrapped from comm::self (what a machine with one GPU runs); then both ranks over MPI with
// a GPU each, or, with fewer GPUs than ranks, the refusal that names the shared GPU on every rank
// (NCCL itself would stop with "Duplicate GPU detected"). Built without MPI (TIDE_HAS_MPI unset,
// as scripts/gpu-check does on a machine without one), it is one process: the part alone only. Every operation against values each
// rank computes itself (small integers: every sum is exact), asynchronous ones through their
// requests, bf16 sums, a split, and the errors that are checked before anything is enqueued.
// On each communicator, make_trainer with comm::nccl_data_parallel, without ZeRO and under ZeRO-1,
// 2 and 3: a tiny GPT trained 3 steps on the same batches on every rank, whose losses must equal,
// bit for bit, those of the same trainer without data parallelism (each chunk's sum over W ranks
// is W g exactly for W <= 2, and the trainer's 1 / W undoes it exactly; ZeRO-2 and 3 without
// clipping, whose norm they sum by chunk owner, in another order). The same code runs on
// tide::sealed in tests/comm/device_data_parallel.cpp, with the ranks as threads.
// Exit 77 (ctest: skipped) on every rank without a usable device.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#if TIDE_HAS_MPI
#include <tide/comm/mpi.hpp>
#endif
#include <tide/comm/nccl.cuh>
#include <tide/comm/nccl_data_parallel.cuh>
#include <tide/comm/self.hpp>
#include <tide/cuda.cuh>
#include <tide/nn/gpt.hpp>
#include <tide/train/trainer.hpp>

#include "skip.cuh"

namespace {

int failures = 0;
void expect(bool ok, char const* what, int rank) {
  if (!ok) {
    ++failures;
    std::printf("FAILED on rank %d: %s\n", rank, what);
  }
}

// A device buffer with host copies in and out.
template <class T>
struct device_buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::size_t count) : n(count) { TIDE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T))); }
  ~device_buffer() { cudaFree(p); }
  // Landed before the call returns: a kernel on a non-blocking stream may read it next.
  void put(std::vector<T> const& v) {
    TIDE_CUDA_CHECK(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    TIDE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  std::span<T> span() { return {p, n}; }
  std::span<T const> cspan() const { return {p, n}; }
};


// Every operation of c, checked on each of its ranks.
void exercise(tide::comm::nccl& c) {
  int const r = c.rank(), w = c.size();
  std::size_t const n = 1000;

  {  // all_reduce: sum, max, min
    device_buffer<float> b(n);
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
    b.put(v);
    c.all_reduce(b.span(), tide::comm::reduce_op::sum);
    auto const got = b.get();
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok = ok && got[i] == static_cast<float>(w * (w + 1) / 2) * static_cast<float>(i % 7);
    expect(ok, "all_reduce sum", r);
    b.put(v);
    c.wait(c.all_reduce_async(b.span(), tide::comm::reduce_op::max));
    ok = true;
    for (std::size_t i = 0; i < n; ++i) ok = ok && b.get()[i] == static_cast<float>(w) * static_cast<float>(i % 7);
    expect(ok, "all_reduce max (async)", r);
  }
  {  // bf16 sums of small integers are exact
    device_buffer<tide::bf16> b(n);
    std::vector<tide::bf16> v(n, tide::from_float<tide::bf16>(static_cast<float>(r + 1)));
    b.put(v);
    c.all_reduce(b.span(), tide::comm::reduce_op::sum);
    bool ok = true;
    for (auto x : b.get()) ok = ok && tide::to_float(x) == static_cast<float>(w * (w + 1) / 2);
    expect(ok, "all_reduce bf16", r);
  }
  {  // reduce_scatter and all_gather
    device_buffer<std::int32_t> in(n * static_cast<std::size_t>(w)), out(n);
    std::vector<std::int32_t> v(in.n);
    std::iota(v.begin(), v.end(), r);
    in.put(v);
    c.reduce_scatter(in.cspan(), out.span(), tide::comm::reduce_op::sum);
    bool ok = true;
    auto const got = out.get();
    for (std::size_t i = 0; i < n; ++i) {
      auto const at = static_cast<std::int32_t>(static_cast<std::size_t>(r) * n + i);
      ok = ok && got[i] == w * at + w * (w - 1) / 2;
    }
    expect(ok, "reduce_scatter", r);
    device_buffer<std::int32_t> all(n * static_cast<std::size_t>(w));
    out.put(std::vector<std::int32_t>(n, r));
    c.all_gather(out.cspan(), all.span());
    ok = true;
    auto const g = all.get();
    for (std::size_t i = 0; i < g.size(); ++i) ok = ok && g[i] == static_cast<std::int32_t>(i / n);
    expect(ok, "all_gather", r);
  }
  {  // all_gatherv: rank k gives k + 1 elements of value k
    std::vector<tide::index_t> counts(static_cast<std::size_t>(w));
    for (int k = 0; k < w; ++k) counts[static_cast<std::size_t>(k)] = k + 1;
    device_buffer<float> in(static_cast<std::size_t>(r + 1)), out(static_cast<std::size_t>(w * (w + 1) / 2));
    in.put(std::vector<float>(in.n, static_cast<float>(r)));
    c.all_gatherv(in.cspan(), out.span(), std::span<tide::index_t const>(counts));
    auto const g = out.get();
    bool ok = true;
    std::size_t at = 0;
    for (int k = 0; k < w; ++k)
      for (int j = 0; j <= k; ++j) ok = ok && g[at++] == static_cast<float>(k);
    expect(ok, "all_gatherv", r);
  }
  {  // broadcast, reduce, a send/recv ring, barrier
    device_buffer<double> b(n);
    b.put(std::vector<double>(n, r == 1 % w ? 3.5 : 0.0));
    c.broadcast(b.span(), 1 % w);
    expect(b.get()[n - 1] == 3.5, "broadcast", r);
    b.put(std::vector<double>(n, 1.0));
    c.reduce(b.span(), 0, tide::comm::reduce_op::sum);
    if (r == 0) expect(b.get()[0] == static_cast<double>(w), "reduce to root 0", r);
    if (w > 1) {  // a rank's send to itself outside a group would wait forever
      device_buffer<std::int64_t> s(n), q(n);
      s.put(std::vector<std::int64_t>(n, r));
      if (r % 2 == 0) {
        c.send(s.cspan(), (r + 1) % w, 0);
        c.recv(q.span(), (r + w - 1) % w, 0);
      } else {
        c.recv(q.span(), (r + w - 1) % w, 0);
        c.send(s.cspan(), (r + 1) % w, 0);
      }
      expect(q.get()[0] == (r + w - 1) % w, "send/recv ring", r);
    }
    c.barrier();
  }
  {  // split into one communicator per rank parity
    tide::comm::nccl part = c.split(r % 2, r);
    expect(part.size() == (w + 1 - r % 2) / 2, "split size", r);
    part.barrier();
  }
  // Errors checked before anything is enqueued.
  try {
    device_buffer<float> b(4);
    c.send(b.cspan(), 0, 7);
    expect(false, "a send with tag 7 is refused", r);
  } catch (tide::error const& e) {
    expect(std::string(e.what()).find("by call order") != std::string::npos, "the tag error names the reason", r);
  }
  c.barrier();
}

// Losses of 3 steps of a tiny GPT on CUDA, the same batches on every rank, under `comm`;
// `gathered`: ZeRO-3's bytes received straight into device blocks, added up.
template <class Comm>
std::vector<float> losses_under(Comm const& comm, float clip_norm = 1.f, std::size_t* gathered = nullptr) {
  constexpr tide::index_t B = 2, T = 16;
  tide::nn::gpt_config const config{.layers = 2, .heads = 2, .channels = 32, .vocab = 64, .max_seq = T};
  auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::cuda>{.config = config, .options = {.seed = 3}},
                                     tide::offload::resident{.chunk_bytes = 32 << 10},  // several chunks
                                     tide::optim::adamw{.lr = 1e-3f, .clip_norm = clip_norm},
                                     comm);
  device_buffer<std::int32_t> tokens(2 * B * T);
  std::vector<float> out;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::int32_t> v(2 * B * T);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((i * 5 + s * 11) % 64);
    tokens.put(v);
    using view = tide::tensor_view<std::int32_t const, tide::cuda>;
    out.push_back(t.step({view(tokens.p, {B, T}), view(tokens.p + B * T, {B, T})}).loss);
    if (gathered != nullptr) *gathered += t.scheduler().last_step().gathered_device_bytes;
  }
  return out;
}

template <class Boot>
void data_parallel_trainer(tide::comm::nccl& c, Boot& boot) {
  for (int zero : {0, 1, 2, 3}) {
    float const clip = zero >= 2 ? 0.f : 1.f;
    std::vector<float> const alone = losses_under(tide::train::no_comm{}, clip);
    std::size_t gathered = 0;
    std::vector<float> const summed =
        losses_under(tide::comm::nccl_data_parallel<Boot>{.gpus = &c, .host = &boot, .zero = zero}, clip, &gathered);
    expect(alone == summed, "nccl_data_parallel: the losses of one rank's trainer, bit for bit", c.rank());
    // resident: room for every gather, and several chunks, so that under ZeRO-3 every rank of
    // several gathers some, in device memory.
    expect((gathered > 0) == (zero == 3 && c.size() > 1), "ZeRO-3's gathers straight into device blocks", c.rank());
    std::printf("rank %d of %d, ZeRO-%d: losses %.7f %.7f %.7f under nccl_data_parallel (alone %.7f %.7f %.7f)\n",
                c.rank(), c.size(), zero, static_cast<double>(summed[0]), static_cast<double>(summed[1]),
                static_cast<double>(summed[2]), static_cast<double>(alone[0]), static_cast<double>(alone[1]),
                static_cast<double>(alone[2]));
  }
}

}  // namespace

int main(int argc, char** argv) {
#if TIDE_HAS_MPI
  tide::comm::mpi_session session{&argc, &argv};
  tide::comm::mpi world{session};
  int const r = world.rank(), w = world.size();
#else
  (void)argc, (void)argv;
  int const r = 0, w = 1;
#endif
  if (int const code = tide::test::gpu_or_skip(r == 0); code != 0) return code;
  int devices = 0;
  TIDE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  int const device = r % devices;
  tide::comm::comm_options const options{.deadline = std::chrono::seconds(60)};
  {  // each rank alone
    tide::comm::self one;
    tide::comm::nccl alone{one, device, options};
    exercise(alone);
    data_parallel_trainer(alone, one);
  }
#if TIDE_HAS_MPI
  if (devices >= w) {
    tide::comm::nccl c{world, device, options};
    exercise(c);
    data_parallel_trainer(c, world);
  } else {
    try {
      tide::comm::nccl c{world, device, options};
      expect(false, "ranks sharing a GPU are refused", r);
    } catch (tide::error const& e) {
      std::string const what = e.what();
      expect(e.category() == tide::errc::usage && what.find("chose the same GPU") != std::string::npos &&
                 what.find("one rank per GPU") != std::string::npos,
             "the refusal names the shared GPU and what to do", r);
    }
  }
  world.barrier();
#endif
  std::printf("rank %d of %d: %s\n", r, w, failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
