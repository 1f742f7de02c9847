#pragma once
// Compressed data parallelism in training: gradient sinks that compress each completed chunk and
// sum it over the ranks, and make_trainer's policies for them. Compression is make_trainer's 5th
// slot, over the comm policy's ranks and ZeRO stage:
//
//   tide::comm::mpi world{session};
//   auto trainer = tide::train::make_trainer(spec, offload, tide::optim::adamw{...},
//       tide::comm::data_parallel<tide::comm::mpi>{.comm = &world, .zero = 2},
//       tide::compress::error_feedback<>{.compressor = {.density = 0.01f, .warmup_steps = 50}});
//   // or tide::compress::powersgd{.compressor = {.rank = 4}}
//
// The slot gives the comm policy the trainer runs (error_feedback: sparse_data_parallel,
// powersgd: powersgd_data_parallel), which can also be passed as the comm policy itself.
//
// sparse_sink, per chunk, when backward completes it (offload/gradient_sink.hpp):
//   1. the chunk's residual (and DGC momentum) take the gradients and a selector chooses what to
//      send (compress/residual.hpp);
//   2. when the α–β rule says sparse pays (density below about 1/W: compress/sparse_sum.hpp),
//      the pairs are all-gathered and scatter-added in rank order; otherwise the chunk is sent
//      dense: every element chosen, one all-reduce of the residual, which then keeps nothing
//      (density 1 is dense data parallelism, bit for bit);
//   3. the chunk's gradients become the sum over the ranks (the trainer divides by W).
// powersgd_sink sends each matrix of the chunk as a rank-r product instead (below).
//
// The residual and the momentum (PowerSGD: the error and Q) are the sink's extra chunk lists:
// the engine allocates them per chunk next to the optimizer state, moves them with it (host or
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
// The work runs on the sink's own worker, chunk after chunk in the order backward completes them,
// while backward goes on (detail::chunk_jobs). ZeRO stages 1 to 3 compose (comm::zero_sharding):
// the owners step, every rank keeps its own residual of every chunk.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/compress/detail/sink_parts.hpp"
#include "tide/compress/powersgd.hpp"
#include "tide/compress/residual.hpp"
#include "tide/compress/sparse_sum.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/stream.hpp"
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
  std::uint64_t bytes_gathered = 0; // ZeRO: parameter bytes this rank gave after the steps
};

template <class C, Selector Sel = sampled_threshold, bool Momentum = false>
class sparse_sink : public detail::sink_front<sparse_sink<C, Sel, Momentum>> {
  friend detail::sink_front<sparse_sink>;

 public:
  using comm_type = C;
  using compressor_type = residual_compressor<Sel>;
  static constexpr std::string_view policy_name = "sparse_data_parallel";
  static constexpr std::array<offload::extra_list, Momentum ? 2 : 1> lists = [] {
    std::array<offload::extra_list, Momentum ? 2 : 1> l{};
    l[0] = {"residual", dtype::f32, false};
    if constexpr (Momentum) l[1] = {"momentum", dtype::f32, false};
    return l;
  }();

  sparse_sink(C* comm, residual_compressor<Sel> const& compressor, int threads = 1, int zero = 0)
      : st_(std::make_shared<state>(comm, compressor, threads, zero)) {
    TIDE_REQUIRE(comm != nullptr, "sparse_data_parallel: .comm is null; pass the address of a communicator that "
                 "outlives the trainer");
    TIDE_REQUIRE(Momentum == (compressor.momentum != 0.f), "sparse_data_parallel: compressor.momentum = ",
                 compressor.momentum, " but the sink ", Momentum ? "keeps" : "does not keep",
                 " a momentum list; use sparse_data_parallel<C, Sel, ", Momentum ? "false" : "true", ">");
  }


 private:
  struct state {
    static constexpr std::string_view label = "sparse sum";
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
    comm::zero_sharding<C> zero;
    detail::chunk_jobs<state> jobs;  // last: drained before the rest goes

    state(C* c, residual_compressor<Sel> const& proto_, int threads, int zero_stage)
        : comm(c),
          proto(proto_),
          dense{.density = 1.f, .momentum = proto_.momentum, .clip_norm = proto_.clip_norm, .ranks = proto_.ranks},
          pool(threads),
          zero(c, zero_stage, policy_name) {
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

// What a powersgd_sink sent, this rank's side.
struct powersgd_stats {
  std::uint64_t chunks = 0;        // chunks summed
  std::uint64_t low_rank = 0;      // matrices sent as P and Q (summed over the steps)
  std::uint64_t dense_floats = 0;  // floats summed dense (vectors, small matrices, dense steps)
  std::uint64_t wire_bytes = 0;    // bytes this rank sent: ring all-reduces of P, then Q
  std::uint64_t dense_bytes = 0;   // what the dense all-reduce of the same chunks would have sent
  std::uint64_t bytes_gathered = 0; // ZeRO: parameter bytes this rank gave after the steps
};

// PowerSGD in training: each matrix of a completed chunk summed over the ranks as a rank-r
// product with error feedback and a warm start (compress/powersgd.hpp, the same products), the
// chunk's vectors and small matrices dense in the same all-reduce as the P's:
//
//   M ← g + E per matrix; all_reduce([P = M Q of every matrix | the dense tensors]);
//   orthonormalise each P; all_reduce([Q = Mᵀ P of every matrix]); g ← P Qᵀ, E ← M − g / W.
//
// Two all-reduces per chunk, whatever its tensors. The error E and Q are the sink's extra lists
// ("error", "powersgd_q"): E over every element of a matrix, Q (cols × r) in the first cols · r
// elements of its matrix's slot (r <= rows, so it fits). Both move, undo and checkpoint with the
// optimizer state; Q is the same on every rank, E is the rank's own. A column of Q that is all
// zeros (the first step, or a column dropped because the summed gradient had rank below r) starts
// again from its seeded values, the same on every rank.
// Where each matrix lies comes from the engine (offload::LayoutAwareSink): a matrix is a tensor of
// rank >= 2, rows = its elements / its last dimension, cols = its last dimension.
template <class C>
class powersgd_sink : public detail::sink_front<powersgd_sink<C>> {
  friend detail::sink_front<powersgd_sink>;

 public:
  using comm_type = C;
  using compressor_type = powersgd_options;
  static constexpr std::string_view policy_name = "powersgd_data_parallel";
  static constexpr std::array<offload::extra_list, 2> lists{
      {{"error", dtype::f32, false}, {"powersgd_q", dtype::f32, true}}};

  powersgd_sink(C* comm, powersgd_options const& o, int threads = 1, int zero = 0)
      : st_(std::make_shared<state>(comm, o, threads, zero)) {
    TIDE_REQUIRE(comm != nullptr, policy_name,
                 ": .comm is null; pass the address of a communicator that outlives the trainer");
    TIDE_REQUIRE(o.rank >= 1, policy_name, ": compressor.rank = ", o.rank, "; pass a rank >= 1 (PowerSGD's r)");
    TIDE_REQUIRE(o.min_compression_rate >= 1.f, policy_name, ": compressor.min_compression_rate = ",
                 o.min_compression_rate, "; pass at least 1 (a matrix is compressed when that saves that factor)");
  }

  void bind_layout(chunk::chunk_layout const& layout, std::span<parameter const> params) {
    st_->bind(layout, params);
  }

 private:
  struct matrix_at {
    std::size_t offset = 0;  // elements into the chunk
    std::size_t rows = 0, cols = 0;
    bool low_rank = false;   // else summed dense (cols = its elements, rows = 1)
    std::uint32_t seed = 0;
  };
  struct state {
    static constexpr std::string_view label = "PowerSGD sum";
    C* comm;
    powersgd_options o;
    thread_pool pool;
    std::vector<std::vector<matrix_at>> by_chunk;  // from bind_layout
    std::vector<float> p, q;                       // the two all-reduce buffers
    mutable std::mutex m;
    powersgd_stats totals;
    comm::zero_sharding<C> zero;
    detail::chunk_jobs<state> jobs;  // last: drained before the rest goes

    state(C* c, powersgd_options const& o_, int threads, int zero_stage)
        : comm(c), o(o_), pool(threads), zero(c, zero_stage, policy_name) {}

    void bind(chunk::chunk_layout const& layout, std::span<parameter const> params) {
      auto const r = static_cast<std::size_t>(o.rank);
      by_chunk.assign(layout.chunks(), {});
      for (std::size_t i = 0; i < params.size(); ++i) {
        auto const n = static_cast<std::size_t>(params[i].numel());
        matrix_at t{.offset = layout.offset_of[i], .rows = 1, .cols = n, .seed = o.seed + static_cast<std::uint32_t>(i)};
        if (params[i].shape.rank >= 2) {
          std::size_t const cols = static_cast<std::size_t>(params[i].shape[params[i].shape.rank - 1]);
          std::size_t const rows = n / cols;
          bool const pays = static_cast<double>(r * (rows + cols)) * o.min_compression_rate <=
                            static_cast<double>(rows * cols);
          if (r <= std::min(rows, cols) && pays) t.rows = rows, t.cols = cols, t.low_rank = true;
        }
        by_chunk[layout.chunk_of[i]].push_back(t);
      }
    }

    template <Backend B, class T>
    void run(offload::ready_chunk<B, T> const& rc) {
      TIDE_REQUIRE(rc.chunk < by_chunk.size(), "powersgd_data_parallel: chunk ", rc.chunk,
                   " of a layout the sink was not given (the engine calls bind_layout at construction)");
      auto const r = static_cast<std::size_t>(o.rank);
      std::size_t const n = rc.grads.size();
      auto* const error = reinterpret_cast<float*>(rc.lists[0].data());
      auto* const qs = reinterpret_cast<float*>(rc.lists[1].data());
      TIDE_REQUIRE(rc.lists[0].size() >= n * sizeof(float) && rc.lists[1].size() >= n * sizeof(float),
                   "powersgd_data_parallel: error and Q lists smaller than the chunk's ", n, " gradients");
      T* const g = rc.grads.data();
      bool const dense_step = rc.step <= o.dense_steps;
      std::size_t np = 0, nq = 0, low = 0, dense = 0;
      for (matrix_at const& t : by_chunk[rc.chunk]) {
        bool const lr = t.low_rank && !dense_step;
        np += lr ? t.rows * r : t.rows * t.cols;
        nq += lr ? t.cols * r : 0;
        low += lr ? 1 : 0;
        dense += lr ? 0 : t.rows * t.cols;
      }
      if (p.size() < np) p.resize(np);
      if (q.size() < nq) q.resize(nq);
      // M ← g + E, then P ← M Q, of each matrix; the dense tensors as they are
      std::size_t ip = 0;
      for (matrix_at const& t : by_chunk[rc.chunk]) {
        std::size_t const e = t.rows * t.cols;
        if (!t.low_rank || dense_step) {
          for (std::size_t i = 0; i < e; ++i) p[ip + i] = to_float(g[t.offset + i]);
          ip += e;
          continue;
        }
        std::span<float> const mt(error + t.offset, e);
        for (std::size_t i = 0; i < e; ++i) mt[i] = to_float(g[t.offset + i]) + (o.error_feedback ? mt[i] : 0.f);
        std::span<float> const qt(qs + t.offset, t.cols * r);
        detail::powersgd_reseed(qt, r, t.seed);  // the first step; a column dropped at the last one
        detail::powersgd_project(pool, mt, qt, std::span<float>(p).subspan(ip, t.rows * r), t.rows, t.cols, r);
        ip += t.rows * r;
      }
      comm->all_reduce(std::span<float>(p.data(), np), tide::comm::reduce_op::sum);
      // Q ← Mᵀ P of each matrix, P orthonormal
      ip = 0;
      std::size_t iq = 0;
      for (matrix_at const& t : by_chunk[rc.chunk]) {
        if (!t.low_rank || dense_step) {
          ip += t.rows * t.cols;
          continue;
        }
        std::span<float> const pt = std::span<float>(p).subspan(ip, t.rows * r);
        detail::orthonormalise(pt, t.rows, r);
        detail::powersgd_back(pool, std::span<float const>(error + t.offset, t.rows * t.cols), pt,
                              std::span<float>(q).subspan(iq, t.cols * r), t.rows, t.cols, r);
        ip += t.rows * r;
        iq += t.cols * r;
      }
      comm->all_reduce(std::span<float>(q.data(), nq), tide::comm::reduce_op::sum);
      // g ← P Qᵀ and E ← M − g / W of each matrix, Q kept for the next step; the dense sums back
      ip = iq = 0;
      float const w = static_cast<float>(comm->size());
      for (matrix_at const& t : by_chunk[rc.chunk]) {
        std::size_t const e = t.rows * t.cols;
        if (!t.low_rank || dense_step) {
          for (std::size_t i = 0; i < e; ++i) g[t.offset + i] = from_float<T>(p[ip + i]);
          ip += e;
          continue;
        }
        std::span<float> const mt(error + t.offset, e);
        detail::powersgd_expand(pool, std::span<float const>(p).subspan(ip, t.rows * r),
                                std::span<float const>(q).subspan(iq, t.cols * r), g + t.offset, mt,
                                o.error_feedback ? mt : std::span<float>{}, w, t.rows, t.cols, r);
        if (!o.error_feedback) std::fill(mt.begin(), mt.end(), 0.f);  // M was scratch
        std::copy_n(q.data() + iq, t.cols * r, qs + t.offset);
        ip += t.rows * r;
        iq += t.cols * r;
      }
      auto const ring = [&](std::size_t floats) {
        int const ranks = comm->size();
        return ranks > 1 ? static_cast<std::uint64_t>(2 * (ranks - 1)) * 4 * floats / static_cast<std::uint64_t>(ranks)
                         : std::uint64_t{0};
      };
      std::lock_guard lock(m);
      ++totals.chunks;
      totals.low_rank += low;
      totals.dense_floats += dense;
      totals.wire_bytes += ring(np) + ring(nq);
      totals.dense_bytes += ring(n);
    }
  };
  std::shared_ptr<state> st_;
};

// make_trainer's communication policy for compressed data parallelism: the ranks of `comm` each
// train on their own data, and the sink sums each completed gradient chunk over the ranks,
// compressed. Two sinks:
//
//   sparse_data_parallel<C, Sel, Momentum>   error feedback and a selector per chunk (sparse_sink)
//   powersgd_data_parallel<C>                PowerSGD per matrix (powersgd_sink)
template <class Sink>
struct compressed_data_parallel {
  using comm_type = typename Sink::comm_type;
  using compressor_type = typename Sink::compressor_type;
  static constexpr std::string_view name = Sink::policy_name;
  comm_type* comm = nullptr;       // the ranks; outlives the trainer
  compressor_type compressor{};    // what the sink compresses with
  int threads = 1;                 // the sink's own threads (selection, products, accumulation)
  int zero = 0;                    // ZeRO stage: 0, 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters)
  // Set by a compression policy over one process (train::no_comm): the comm::self .comm points to.
  std::shared_ptr<comm_type> owned_comm{};

  using sink_type = Sink;
  using source_type = offload::host_source;

  [[nodiscard]] int rank() const { return checked().rank(); }
  [[nodiscard]] int world_size() const { return checked().size(); }
  [[nodiscard]] sink_type sink() const {
    auto c = compressor;
    if constexpr (requires { c.ranks; }) c.ranks = checked().size();  // local clipping at clip_norm / √W
    return sink_type{comm, c, threads, zero};
  }
  [[nodiscard]] source_type source() const { return {}; }

  // What the trainer asks of the ranks for per-rank checkpoint sets (the sinks' lists are per rank).
  [[nodiscard]] bool all_ranks(bool ok) const { return tide::comm::all_ranks(checked(), ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t value) const { return tide::comm::of_rank0(checked(), value); }
  [[nodiscard]] double sum_over_ranks(double x) const { return tide::comm::sum_over_ranks(checked(), x); }

 private:
  comm_type& checked() const {
    TIDE_REQUIRE(comm != nullptr, name, ": .comm is null; pass the address of a communicator that outlives the "
                 "trainer (.comm = &world)");
    return *comm;
  }
};

// Sparse error feedback: Momentum = true keeps DGC's momentum list (compressor.momentum > 0).
template <class C, Selector Sel = sampled_threshold, bool Momentum = false>
using sparse_data_parallel = compressed_data_parallel<sparse_sink<C, Sel, Momentum>>;
// PowerSGD: compressor = powersgd_options{.rank = r, ...}.
template <class C>
using powersgd_data_parallel = compressed_data_parallel<powersgd_sink<C>>;

// ---- make_trainer's compression slot ----------------------------------------------------------
namespace detail {
// Compression X over comm policy P: X's compressor and threads, P's ranks and ZeRO stage
// (comm::data_parallel's bucket_bytes does not apply: a compressing sink sends chunk by chunk).
// Over one process (a comm policy without a gradient sink, train::no_comm) the compressor runs
// over a comm::self of its own: each step compresses with error feedback, nothing is sent.
template <class X, class P>
auto compressing(X const& x, P const& p) {
  static_assert(!requires(P const& q) { q.compressor; }, "compression slot: the comm policy compresses already (a "
                "compress::sparse_data_parallel or powersgd_data_parallel); pass comm::data_parallel<C> as the comm "
                "policy with the compression here, or the compressing policy with train::no_compress{}");
  if constexpr (requires(P const& q) { q.comm; q.zero; }) {
    using C = std::remove_pointer_t<decltype(p.comm)>;
    using policy = compressed_data_parallel<typename X::template sink_for<C>>;
    return policy{.comm = p.comm, .compressor = x.compressor, .threads = x.threads, .zero = p.zero};
  } else {
    static_assert(std::is_same_v<typename P::sink_type, offload::no_sink>,
                  "compression slot: the comm policy must be comm::data_parallel<C> (its .comm and .zero) or "
                  "train::no_comm (one process)");
    using policy = compressed_data_parallel<typename X::template sink_for<comm::self>>;
    auto one = std::make_shared<comm::self>();
    policy out{.comm = one.get(), .compressor = x.compressor, .threads = x.threads, .zero = 0};
    out.owned_comm = std::move(one);
    return out;
  }
}
}  // namespace detail

// Sparse error feedback (sparse_sink): each chunk's residual takes the gradients, the selector
// chooses what to send. Momentum = true keeps DGC's momentum list (compressor.momentum > 0).
template <Selector Sel = sampled_threshold, bool Momentum = false>
struct error_feedback {
  static constexpr std::string_view name = "error_feedback";
  residual_compressor<Sel> compressor{};
  int threads = 1;  // the sink's own threads
  template <class C>
  using sink_for = sparse_sink<C, Sel, Momentum>;
  template <class P>
  [[nodiscard]] auto over(P const& comm) const {
    return detail::compressing(*this, comm);
  }
};

// PowerSGD per matrix (powersgd_sink): compressor = powersgd_options{.rank = r, ...}.
struct powersgd {
  static constexpr std::string_view name = "powersgd";
  powersgd_options compressor{};
  int threads = 1;  // the sink's own threads
  template <class C>
  using sink_for = powersgd_sink<C>;
  template <class P>
  [[nodiscard]] auto over(P const& comm) const {
    return detail::compressing(*this, comm);
  }
};

}  // namespace tide::compress
