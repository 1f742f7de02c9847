#pragma once
// One rank's shard of a whole GPT over a tensor-parallel group: the vocabulary-parallel
// embedding, the layers' tensor-parallel blocks and the vocabulary-parallel head with its
// cross-entropy (tp/head.hpp, tp/block.hpp), with the rank's parameters, gradients and
// activations in host memory. Its parameters are nn::gpt's, cut (same names, initialised from
// the same seed as nn::gpt's whole tensors, then take_shard), so a group of t equals nn::gpt
// within the sum-order bound of tests/mpi/tensor_parallel.cpp. make_trainer does not take it
// yet.
//
//   tide::tp::gpt<tide::comm::mpi> model(config, group, {.sequence = true, .seed = 1}, B, T);
//   float loss = model.forward(ex, tokens, targets);     // every rank: the mean loss
//   model.backward(ex);                                  // gradients += (the rank's shards)
//   model.reduce_replicated();                           // once per step, after the last backward

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parameters.hpp"
#include "tide/nn/gpt_blocks.hpp"
#include "tide/nn/gpt_config.hpp"
#include "tide/tp/block.hpp"
#include "tide/tp/head.hpp"
#include "tide/tp/shard.hpp"

namespace tide::tp {

struct gpt_options {
  bool sequence = false;   // sequence parallelism
  std::uint64_t seed = 1;  // nn::gpt's initialisation of the whole tensors
};

// How parameter i of nn::gpt_parameters(c) (wte whole: wte_pieces = 1) splits: wte by rows of
// the vocabulary, wpe and the final LayerNorm replicated, a block's as tp/shard.hpp says.
inline split split_of(nn::gpt_config const& c, parameter const& p, std::size_t i) noexcept {
  if (i == 0) return split::rows;
  if (i == 1 || p.layer == nn::head_block(c)) return split::replicated;
  return split_of(static_cast<nn::block_param>((i - 2) % nn::params_per_block));
}
// Its shard's shape on a group of t.
inline shape shard_shape_of(nn::gpt_config const& c, parameter const& p, std::size_t i, int t) {
  auto const s = shape_of(split_of(c, p, i), p.shape[0], p.shape.rank == 2 ? p.shape[1] : 1, t);
  return p.shape.rank == 2 ? shape{s.rows, s.cols} : shape{s.rows};
}

// The rank's parameter list: nn::gpt's names and order, its shards' shapes.
inline parameter_list shard_parameters(nn::gpt_config const& config, int t) {
  nn::gpt_config const c = nn::resolve(config);
  TIDE_REQUIRE(c.wte_pieces == 1, "tp::gpt: wte in ", c.wte_pieces, " pieces; tensor parallelism splits wte by "
               "vocabulary itself: pass wte_pieces = 1");
  check_group(c, t);
  (void)vocab_part_of(c, 0, t);  // Vp must split
  parameter_list const whole = nn::gpt_parameters(c, dtype::f32);
  parameter_list list(whole.alignment());
  for (std::size_t i = 0; i < whole.size(); ++i)
    list.add(whole[i].name(), whole[i].layer, shard_shape_of(c, whole[i], i, t), dtype::f32);
  return list;
}

template <comm::Communicator G>
class gpt {
 public:
  using token_view = tensor_view<std::int32_t const>;

  // Group: the tensor-parallel group, this rank's shard; (Bn, Tn): the batches it runs.
  gpt(nn::gpt_config const& config, G& group, gpt_options const& o, index_t Bn, index_t Tn)
      : config_(nn::resolve(config)),
        group_(&group),
        o_(o),
        list_(shard_parameters(config_, group.size())),
        part_(vocab_part_of(config_, group.rank(), group.size())),
        Bn_(Bn),
        Tn_(Tn) {
    TIDE_REQUIRE(Tn >= 1 && Tn <= config_.max_seq && Bn >= 1, "tp::gpt: (B, T) = (", Bn, ", ", Tn,
                 ") with max_seq ", config_.max_seq);
    TIDE_REQUIRE(!o.sequence || (Bn * Tn) % group.size() == 0, "tp::gpt: B T = ", Bn * Tn,
                 " rows do not split over ", group.size(), " ranks for sequence parallelism");
    values_.assign(list_.bytes() / sizeof(float), 0.f);
    grads_.assign(values_.size(), 0.f);
    init(o.seed);
    plan();
  }
  gpt(gpt const&) = delete;  // the views point into its own vectors
  gpt& operator=(gpt const&) = delete;

  [[nodiscard]] parameter_list const& parameters() const noexcept { return list_; }
  [[nodiscard]] std::span<float> values(std::string_view name) { return at(values_, list_.find(name)); }
  [[nodiscard]] std::span<float> grads(std::string_view name) { return at(grads_, list_.find(name)); }
  void zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.f); }

  // The mean cross-entropy over the B T positions (every rank), leaving what backward reads. The
  // caller's tokens and targets must stay unchanged until backward (they are read there again,
  // not copied).
  float forward(exec<host> const& ex, token_view tokens, token_view targets) {
    TIDE_REQUIRE(tokens.size() == Bn_ * Tn_ && targets.size() == tokens.size(), "tp::gpt: tokens and targets must "
                 "be (", Bn_, ", ", Tn_, "), the shape the model was made for");
    size_scratch(ex);
    tokens_ = token_view(tokens.data(), {Bn_, Tn_});
    targets_ = token_view(targets.data(), {Bn_ * Tn_});
    embedding_forward(ex, *group_, o_.sequence, x0_, tokens_, cview(0), cview(1), part_, embedding_, config_.vocab);
    for (int l = 0; l < config_.layers; ++l)
      block_forward(ex, *group_, o_.sequence, input(l), blocks_[static_cast<std::size_t>(l)], weights(l), heads());
    head_forward(ex, *group_, o_.sequence, input(config_.layers), head_, lnf(0), lnf(1), cview(0), targets_, part_,
                 config_.vocab);
    ready_ = true;
    double sum = 0;
    for (index_t r = 0; r < head_.losses.size(); ++r) sum += head_.losses.data()[r];
    return static_cast<float>(sum / static_cast<double>(head_.losses.size()));
  }

  // Gradients += d(mean loss)/d(the rank's shards) × loss_scale; accumulates until zero_grad.
  void backward(exec<host> const& ex, float loss_scale = 1.f) {
    TIDE_REQUIRE(ready_, "tp::gpt::backward: no forward since the last backward; run forward (one backward per "
                 "forward: the head's backward overwrites the logits with their gradient)");
    ready_ = false;
    size_scratch(ex);
    auto const dloss = loss_scale / static_cast<float>(Bn_ * Tn_);
    std::size_t const L = static_cast<std::size_t>(config_.layers);
    head_backward(ex, *group_, o_.sequence, dres_, input(config_.layers), head_, lnf(0), cview(0), view(grads_, 0),
                  view(grads_, list_.size() - 2), view(grads_, list_.size() - 1), targets_, part_, dloss);
    for (std::size_t l = L; l-- > 0;)
      block_backward(ex, *group_, o_.sequence, dres_, input(static_cast<int>(l)), blocks_[l], weights(static_cast<int>(l)),
                     gradients(static_cast<int>(l)), heads());
    embedding_backward(ex, *group_, o_.sequence, view(grads_, 0), view(grads_, 1), tensor_view<float const>(dres_),
                       tokens_, part_, embedding_);
  }

  // Under sequence parallelism, sums the LayerNorms' gradients (each rank's rows' share) over
  // the group: once per step, after the last micro-batch's backward, on gradients zeroed at the
  // step's start (a second sum would count the first t times).
  void reduce_replicated() {
    for (int l = 0; l < config_.layers; ++l) tp::reduce_replicated(*group_, o_.sequence, gradients(l));
    tp::reduce_replicated(*group_, o_.sequence, view(grads_, list_.size() - 2));
    tp::reduce_replicated(*group_, o_.sequence, view(grads_, list_.size() - 1));
  }

 private:
  std::span<float> at(std::vector<float>& v, parameter const& p) {
    return {v.data() + p.offset / sizeof(float), static_cast<std::size_t>(p.numel())};
  }
  tensor_view<float> view(std::vector<float>& v, std::size_t i) {
    return tensor_view<float>(v.data() + list_[i].offset / sizeof(float), list_[i].shape);
  }
  tensor_view<float const> cview(std::size_t i) { return tensor_view<float const>(view(values_, i)); }
  tensor_view<float const> lnf(int j) { return cview(list_.size() - 2 + static_cast<std::size_t>(j)); }
  [[nodiscard]] index_t heads() const noexcept { return config_.heads / group_->size(); }
  [[nodiscard]] std::size_t index_of(int l, int k) const noexcept {
    return 2 + static_cast<std::size_t>(l) * nn::params_per_block + static_cast<std::size_t>(k);
  }
  nn::detail::block_params<tensor_view<float const>> weights(int l) {
    nn::detail::block_params<tensor_view<float const>> p;
    for (int k = 0; k < nn::params_per_block; ++k) p.at[k] = cview(index_of(l, k));
    return p;
  }
  nn::detail::block_params<tensor_view<float>> gradients(int l) {
    nn::detail::block_params<tensor_view<float>> p;
    for (int k = 0; k < nn::params_per_block; ++k) p.at[k] = view(grads_, index_of(l, k));
    return p;
  }
  // Block l's input (the rank's rows): the embedding's output, or block l - 1's.
  tensor_view<float const> input(int l) {
    return l == 0 ? tensor_view<float const>(x0_) : tensor_view<float const>(blocks_[static_cast<std::size_t>(l - 1)].res3);
  }

  // Every parameter as nn::gpt initialises its whole tensor, then this rank's shard of it.
  void init(std::uint64_t seed) {
    parameter_list const whole = nn::gpt_parameters(config_, dtype::f32);
    int const t = group_->size(), r = group_->rank();
    std::vector<float> buf;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      parameter const& p = whole[i];
      buf.assign(static_cast<std::size_t>(p.numel()), 0.f);
      nn::detail::initialise_parameter<float>(nullptr, config_, i, p, buf.data(), seed);
      index_t const rows = p.shape[0], cols = p.shape.rank == 2 ? p.shape[1] : 1;
      take_shard(split_of(config_, p, i), std::span<float const>(buf), at(values_, list_[i]), rows, cols, r, t);
    }
  }

  // The activations of one micro-batch at (Bn, Tn).
  void plan() {
    index_t const C = config_.channels, t = group_->size(), N = Bn_ * Tn_, n = o_.sequence ? N / t : N;
    index_t const Cl = C / t, NHl = heads(), R = part_.rows;
    auto make = [&](shape s) {
      store_.emplace_back(static_cast<std::size_t>(s.numel()), 0.f);
      return tensor_view<float>(store_.back().data(), s);
    };
    for (int l = 0; l < config_.layers; ++l) {
      block_views<host, float> a;
      a.ln1 = make({n, C}), a.attproj = make({n, C}), a.res2 = make({n, C}), a.ln2 = make({n, C});
      a.fcproj = make({n, C}), a.res3 = make({n, C});
      a.ln1_mean = make({n}), a.ln1_rstd = make({n}), a.ln2_mean = make({n}), a.ln2_rstd = make({n});
      a.qkv = make({Bn_, Tn_, 3 * Cl}), a.atty = make({Bn_, Tn_, Cl}), a.lse = make({Bn_, NHl, Tn_});
      a.fch = make({Bn_, Tn_, 4 * Cl}), a.fch_gelu = make({Bn_, Tn_, 4 * Cl});
      a.dfch = make({Bn_, Tn_, 4 * Cl}), a.datty = make({Bn_, Tn_, Cl}), a.dqkv = make({Bn_, Tn_, 3 * Cl});
      a.dln = make({Bn_, Tn_, C});
      if (o_.sequence) a.whole = make({Bn_, Tn_, C}), a.partial = make({Bn_, Tn_, C}), a.dln_rows = make({n, C});
      blocks_.push_back(a);
    }
    head_.lnf = make({n, C}), head_.lnf_mean = make({n}), head_.lnf_rstd = make({n});
    head_.logits = make({N, R}), head_.stats = make({3, N}), head_.losses = make({N}), head_.dlnf = make({N, C});
    if (o_.sequence) head_.whole = make({N, C}), head_.dlnf_rows = make({n, C});
    mapped_.assign(static_cast<std::size_t>(N), 0);
    embedding_.mapped = tensor_view<std::int32_t>(mapped_.data(), {Bn_, Tn_});
    embedding_.spare = make({1, C});
    if (o_.sequence) embedding_.whole = make({N, C});
    x0_ = make({n, C});
    dres_ = make({n, C});
  }
  // The kernels' scratch for ex's pool (what they ask for depends on its threads), one buffer
  // that every piece uses in turn.
  void size_scratch(exec<host> const& ex) {
    int const t = group_->size();
    std::size_t const bytes = std::max({block_scratch_bytes<float>(ex, config_, t, Bn_, Tn_),
                                        head_scratch_bytes<float>(ex, config_, t, Bn_, Tn_),
                                        embedding_scratch_bytes(ex, config_, t, Bn_, Tn_)});
    if (scratch_ && bytes <= scratch_->get().bytes) return;
    scratch_ = std::make_unique<kernels::detail::call_scratch>(bytes);
    kernels::scratch<host> const ws = scratch_->get();
    for (auto& a : blocks_) a.ws = ws;
    head_.ws = ws;
    embedding_.ws = ws;
  }

  nn::gpt_config config_;
  G* group_;
  gpt_options o_;
  parameter_list list_;
  vocab_part part_;
  index_t Bn_, Tn_;
  std::vector<float> values_, grads_;
  std::unique_ptr<kernels::detail::call_scratch> scratch_;  // aligned, sized for the last pool
  std::deque<std::vector<float>> store_;  // the activations, each at a fixed address
  std::vector<std::int32_t> mapped_;
  std::vector<block_views<host, float>> blocks_;
  head_views<float> head_;
  embedding_views<float> embedding_;
  tensor_view<float> x0_, dres_;
  token_view tokens_, targets_;
  bool ready_ = false;  // a forward ran since the last backward
};

}  // namespace tide::tp
