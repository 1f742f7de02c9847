#pragma once
// Residual gradient compression in training: a gradient sink that compresses each completed
// chunk with error feedback and sums it over the ranks sparsely, and make_trainer's policy for it.
//
//   tide::comm::mpi world{session};
//   auto trainer = tide::train::make_trainer(spec, offload, tide::optim::adamw{...},
//       tide::compress::sparse_data_parallel<tide::comm::mpi>{
//           .comm = &world, .compressor = {.density = 0.01f, .warmup_steps = 50}});
//
// Per chunk, when backward completes it (offload/gradient_sink.hpp):
//   1. the chunk's residual (and DGC momentum) take the gradients and a selector chooses what to
//      send (compress/residual.hpp);
//   2. when the α–β rule says sparse pays (density below about 1/W: compress/sparse_sum.hpp),
//      the pairs are all-gathered and scatter-added in rank order; otherwise the chunk is sent
//      dense: every element chosen, one all-reduce of the residual, which then keeps nothing
//      (density 1 is dense data parallelism, bit for bit);
//   3. the chunk's gradients become the sum over the ranks (the trainer divides by W).
//
// The residual and the momentum are the sink's extra chunk lists ("residual", "momentum"): the
// engine allocates them per chunk next to the optimizer state, moves them with it (host or
// device), undoes them with a failed step, and checkpoints them. A rank's residual is its own, so
// checkpoints are per-rank sets (every rank writes its shard; train/checkpoint_set.hpp) and a
// resume on the same ranks takes each rank's own residuals back: bit-identical.
//
// The selector: sampled_threshold (DGC's) by default. A selector's choice must depend on the
// residual alone for a resume to be bit-identical: sampled_threshold, exact_topk and trimmed_topk
// are such. threshold_search starts from its last τ and random_k counts its calls; checkpoints do
// not carry that state, so after a resume they choose from a fresh state (correct, not the same
// bits).
//
// The sink runs on the compute thread, chunk after chunk: the transport does not overlap backward
// yet, and ZeRO is not combined with it (docs/compress.md says what is missing).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/compress/residual.hpp"
#include "tide/compress/sparse_sum.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::compress {

// What the sink sent, for reports, tests and benchmarks (this rank's side).
struct sparse_stats {
  std::uint64_t chunks = 0;        // chunks summed
  std::uint64_t sparse_chunks = 0; // of them, as pairs
  std::uint64_t pairs = 0;         // pairs this rank sent
  std::uint64_t wire_bytes = 0;    // bytes this rank sent: 8 per pair, or a ring all-reduce's 2 (W-1)/W of 4 n
  std::uint64_t dense_bytes = 0;   // what the dense all-reduce of the same chunks would have sent
};

template <class C, Selector Sel = sampled_threshold, bool Momentum = false>
class sparse_sink {
 public:
  static constexpr std::array<offload::extra_list, Momentum ? 2 : 1> lists = [] {
    std::array<offload::extra_list, Momentum ? 2 : 1> l{};
    l[0] = {"residual", dtype::f32};
    if constexpr (Momentum) l[1] = {"momentum", dtype::f32};
    return l;
  }();

  sparse_sink(C* comm, residual_compressor<Sel> const& compressor, int threads = 1)
      : st_(std::make_shared<state>(comm, compressor, threads)) {
    TIDE_REQUIRE(comm != nullptr, "sparse_data_parallel: .comm is null; pass the address of a communicator that "
                 "outlives the trainer");
    TIDE_REQUIRE(Momentum == (compressor.momentum != 0.f), "sparse_data_parallel: compressor.momentum = ",
                 compressor.momentum, " but the sink ", Momentum ? "keeps" : "does not keep",
                 " a momentum list; use sparse_data_parallel<C, Sel, ", Momentum ? "false" : "true", ">");
  }

  template <Backend B, class T>
  bool reduce(offload::ready_chunk<B, T> const& r) {
    static_assert(std::is_same_v<B, host>, "sparse_data_parallel: the sink runs on tide::host");
    st_->run(r);
    return false;  // finished here
  }
  [[nodiscard]] sparse_stats stats() const {
    std::lock_guard lock(st_->m);
    return st_->totals;
  }

 private:
  struct state {
    C* comm;
    residual_compressor<Sel> proto;             // copied per chunk: each keeps its selector's state
    std::vector<residual_compressor<Sel>> by_chunk;
    residual_compressor<exact_topk> dense;      // the dense path: every element, in order
    thread_pool pool;
    std::vector<std::uint32_t> idx;
    std::vector<float> val, sum;
    sparse_scratch scratch;
    mutable std::mutex m;
    sparse_stats totals;

    state(C* c, residual_compressor<Sel> const& proto_, int threads)
        : comm(c),
          proto(proto_),
          dense{.density = 1.f, .momentum = proto_.momentum, .clip_norm = proto_.clip_norm, .ranks = proto_.ranks},
          pool(threads) {
      (void)proto.density_at(1);  // a density outside (0, 1] is refused here, at construction
    }

    template <Backend B, class T>
    void run(offload::ready_chunk<B, T> const& r) {
      if (by_chunk.size() <= r.chunk) by_chunk.resize(r.chunk + 1, proto);
      residual_compressor<Sel>& c = by_chunk[r.chunk];
      exec<host> const ex{pool};
      std::size_t const n = r.grads.size();
      int const w = comm->size();
      std::span<float> residual(reinterpret_cast<float*>(r.lists[0].data()), r.lists[0].size() / sizeof(float));
      std::span<float> u;
      if constexpr (Momentum) u = {reinterpret_cast<float*>(r.lists[1].data()), r.lists[1].size() / sizeof(float)};
      TIDE_REQUIRE(residual.size() >= n, "sparse_data_parallel: a residual of ", residual.size(), " for ", n,
                   " gradients");
      residual = residual.first(n);
      if constexpr (Momentum) u = u.first(n);
      std::span<T const> grads(r.grads.data(), n);
      bool const sparse = w > 1 && sparse_is_cheaper(n, c.k_at(n, r.step), w);
      std::size_t const room = sparse ? c.capacity(n, r.step) : n;
      if (idx.size() < room) idx.resize(room), val.resize(room);
      if (sum.size() < n) sum.resize(n);
      std::size_t m_sent = 0;
      std::uint64_t wire = 0;
      if (sparse) {
        m_sent = c.compress(ex, r.step, grads, residual, u, std::span(idx), std::span(val));
        sparse_all_sum(*comm, std::span<std::uint32_t const>(idx.data(), m_sent),
                       std::span<float const>(val.data(), m_sent), std::span<float>(sum.data(), n), scratch);
        wire = 8 * m_sent;
      } else {
        // Every element: val holds r + g in index order, the residual keeps nothing.
        m_sent = dense.compress(ex, r.step, grads, residual, u, std::span(idx), std::span(val));
        TIDE_ASSERT(m_sent == n);
        comm->all_reduce(std::span<float>(val.data(), n), tide::comm::reduce_op::sum);
        std::copy_n(val.data(), n, sum.data());
        wire = w > 1 ? static_cast<std::uint64_t>(2 * (w - 1)) * 4 * n / static_cast<std::uint64_t>(w) : 0;
      }
      T* out = r.grads.data();
      for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(sum[i]);
      std::lock_guard lock(m);
      ++totals.chunks;
      totals.sparse_chunks += sparse ? 1 : 0;
      totals.pairs += sparse ? m_sent : 0;
      totals.wire_bytes += wire;
      totals.dense_bytes += w > 1 ? static_cast<std::uint64_t>(2 * (w - 1)) * 4 * n / static_cast<std::uint64_t>(w) : 0;
    }
  };
  std::shared_ptr<state> st_;
};

// make_trainer's communication policy for compressed data parallelism: the ranks of `comm` each
// train on their own data; each gradient chunk is compressed with error feedback and summed over
// the ranks by a sparse_sink. Momentum = true keeps DGC's momentum list (compressor.momentum > 0).
template <class C, Selector Sel = sampled_threshold, bool Momentum = false>
struct sparse_data_parallel {
  static constexpr std::string_view name = "sparse_data_parallel";
  C* comm = nullptr;                        // the ranks; outlives the trainer
  residual_compressor<Sel> compressor{};    // density, warm-up, momentum, clipping, the selector
  int threads = 1;                          // the sink's own threads (selection, accumulation)

  using sink_type = sparse_sink<C, Sel, Momentum>;
  using source_type = offload::host_source;

  [[nodiscard]] int rank() const { return checked().rank(); }
  [[nodiscard]] int world_size() const { return checked().size(); }
  [[nodiscard]] sink_type sink() const {
    auto c = compressor;
    c.ranks = checked().size();  // local clipping at clip_norm / √W
    return sink_type{comm, c, threads};
  }
  [[nodiscard]] source_type source() const { return {}; }

  // What the trainer asks of the ranks for per-rank checkpoint sets (the residuals are per rank).
  [[nodiscard]] bool all_ranks(bool ok) const { return tide::comm::all_ranks(checked(), ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t value) const { return tide::comm::of_rank0(checked(), value); }
  [[nodiscard]] double sum_over_ranks(double x) const { return tide::comm::sum_over_ranks(checked(), x); }

 private:
  C& checked() const {
    TIDE_REQUIRE(comm != nullptr, "sparse_data_parallel: .comm is null; pass the address of a communicator that "
                 "outlives the trainer (.comm = &world)");
    return *comm;
  }
};

}  // namespace tide::compress
