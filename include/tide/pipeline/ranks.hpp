#pragma once
// A pipeline stage per rank: rank s of `group` runs stage s's action list over its own model (every
// rank builds the whole model and touches only its pieces' blocks), and what crosses stages
// travels through the communicator: a piece's output activations forward, the gradient at its
// input backward, and the head's share of the tied embedding gradient from the head's rank to the
// embedding's, per micro-batch.
//
//   tide::comm::mpi world{session};
//   auto s = tide::pipeline::one_f_one_b(world.size(), 8);
//   tide::pipeline::rank_executor run{world, s, tide::pipeline::uniform_cut(model, s)};  // every rank
//   model.zero_grad(ex);
//   double loss_sum = run.run(model, ex, std::span(micro_batches), 1.f / 8);  // on every rank
//   // gradients: this rank's pieces' parameters hold the pipeline's, the others stay zero
//
// Overlap and no deadlock. Each directed link between two ranks (s to s + 1, s + 1 to s, and the
// wrap between the last stage and the first that interleaved and V schedules use) is a duplicate of
// `group` of its own, so on each rank a link's lane carries only sends or only receives. A
// receiving rank knows the schedule, so it posts its receives in exactly the order the sender
// sends (into staging buffers, a window ahead of what it needs); sends are asynchronous and
// waited for at the end of the run. A stage therefore blocks only on a receive it needs, and any
// schedule the simulator finds free of deadlock runs without one.
//
// Failures. A stage that throws (its model, its offload engine) still sends what the others wait
// for (zeros) and takes what they send, so every stage reaches the end of its list; there all
// agree, and every rank throws: the failed one its error, the others one saying another stage
// failed. The step is lost on every rank alike (make_trainer then undoes it everywhere). A lost
// peer: the communicator's deadline turns the wait into tide::error(errc::mpi) naming the operation.
//
// Bit for bit: the gradients of this rank's parameters equal those of gradient accumulation over
// the same micro-batches in one process (tests/mpi/pipeline.cpp), as on threads
// (pipeline/executor.hpp), because the same blocks add the same values in the same order.

#include <algorithm>
#include <utility>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/pipeline/executor.hpp"
#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"

namespace tide::pipeline {

template <comm::Communicator C>
class rank_executor {
 public:
  // Collective over `group`: every rank constructs it with the same schedule and cut; rank s of
  // the group runs stage s (group.size() must be the schedule's stages).
  rank_executor(C& group, schedule s, cut c) : group_(&group), schedule_(std::move(s)), cut_(std::move(c)) {
    check(schedule_);
    TIDE_REQUIRE(group.size() == schedule_.stages, "pipeline::rank_executor: the schedule ", schedule_.name, " has ",
                 schedule_.stages, " stages, the group ", group.size(), " ranks; pass a group of one rank per stage "
                 "(split the world by data-parallel index)");
    TIDE_REQUIRE(cut_.pieces() == schedule_.stages * schedule_.chunks, "pipeline::rank_executor: the cut has ",
                 cut_.pieces(), " pieces, the schedule ", schedule_.name, " ", schedule_.stages * schedule_.chunks,
                 "; cut the model with uniform_cut(model, schedule)");
    me_ = group.rank();
    slots_ = slots_needed(schedule_, me_);
    if (schedule_.stages > 1)
      for (int i = 0; i < links; ++i) channels_.push_back(group.split(0, group.rank()));  // a duplicate per link kind
    plan_messages();
  }

  [[nodiscard]] int stage() const noexcept { return me_; }
  [[nodiscard]] int slots() const noexcept { return slots_; }  // this rank's model needs in_flight >= slots()
  [[nodiscard]] schedule const& plan() const noexcept { return schedule_; }
  [[nodiscard]] cut const& pieces() const noexcept { return cut_; }
  // This rank's stage only: stages.size() == 1; bubble_fraction = 1 − busy / seconds.
  [[nodiscard]] run_stats const& last() const noexcept { return stats_; }
  // Whether parameter block `block` is computed on this rank.
  [[nodiscard]] bool holds_block(int block) const noexcept {
    for (int q = 0; q < cut_.pieces(); ++q)
      if (block >= cut_.first[static_cast<std::size_t>(q)] && block <= cut_.last[static_cast<std::size_t>(q)])
        return stage_of(schedule_, q) == me_;
    return false;
  }

  // This rank's stage of one pipelined forward and backward over `micro` (every rank passes the
  // same micro-batches; a stage reads only what its pieces need). Gradients of this rank's blocks
  // += as m forward + backward pairs would. Returns the sum of the losses, on every rank.
  template <class Model, class Batch, Backend B>
  double run(Model& model, exec<B> const& ex, std::span<Batch const> micro, float scale) {
    int const Q = cut_.pieces();
    // Every rank checks its arguments, then all agree: a rank that cannot run makes every rank
    // throw here, before any message, rather than leave its peers to their deadline.
    std::exception_ptr failure;
    try {
      detail::check_run("pipeline::rank_executor", schedule_, cut_, model, micro, slots_);
      tied_ = false;
      if constexpr (requires { model.tied_grad(0); })
        tied_ = stage_of(schedule_, 0) != stage_of(schedule_, Q - 1) &&
                (me_ == stage_of(schedule_, 0) || me_ == stage_of(schedule_, Q - 1));
      if (tied_) (void)model.tied_grad(0);  // throws, saying what to pass, if the model keeps no tied buffer
      size_buffers(model);
    } catch (...) {
      failure = std::current_exception();
    }
    bool const everyone = comm::all_ranks(*group_, !failure);
    if (failure) std::rethrow_exception(failure);
    TIDE_CHECK(everyone, usage, "pipeline::rank_executor: another stage's rank refused the step (its error says "
                                "why); nothing ran");
    stats_ = {};
    stats_.stages.resize(1);
    losses_.assign(static_cast<std::size_t>(schedule_.micro), 0.0);
    for (inbox& in : inboxes_) in.posted = 0;
    for (inbox& in : inboxes_) post_ahead(in, 0);
    sends_.clear();
    std::fill(sent_.begin(), sent_.end(), false);
    auto const t0 = detail::clock::now();
    links_of<Model> l{*this, model};
    try {
      detail::run_stage(me_, schedule_, cut_, model, ex, micro, scale, slots_, l, t0, stats_.stages[0], losses_.data());
    } catch (...) {
      failure = std::current_exception();
      settle_messages();  // the other stages get what they wait for, and finish their lists
    }
    for (auto const& [ch, r] : sends_) channels_[static_cast<std::size_t>(ch)].wait(r);
    detail::finish_stats(stats_, t0);
    // Every stage ran its list (a failed one with placeholders): all agree, then all throw or none.
    bool const all_ran = comm::all_ranks(*group_, !failure);
    if (failure) std::rethrow_exception(failure);
    TIDE_CHECK(all_ran, usage, "pipeline::rank_executor: another stage failed in this step (its error says why); "
                               "this stage's results are discarded");
    double sum = 0;
    if (me_ == stage_of(schedule_, Q - 1))
      for (double x : losses_) sum += x;
    group_->broadcast(std::span<double>(&sum, 1), stage_of(schedule_, Q - 1));
    return sum;
  }

 private:
  enum class kind : int { act, grad, tied };
  // A message: kind, the piece it is for (act: the piece whose input it is; grad: the piece whose
  // output gradient it is; tied: piece 0), the micro-batch.
  struct message {
    kind what;
    int piece, micro;
  };
  struct inbox {
    int from = 0;
    std::vector<message> order;  // the sender's order
    std::vector<typename C::request> requests;
    std::size_t posted = 0;
  };
  static constexpr int links = 6;
  static constexpr std::size_t window = 32;  // receives posted ahead per link (a lane holds 64 operations)

  // The link (which duplicate) a message from rank a to rank b travels on: on each rank the links
  // it sends on and the ones it receives on are different duplicates.
  [[nodiscard]] int link(int a, int b) const noexcept {
    int const p = schedule_.stages;
    if (b == a + 1) return a % 2;
    if (b == a - 1) return 2 + b % 2;
    return a == p - 1 ? 4 : 5;  // the wrap: last to first, or first to last
  }
  [[nodiscard]] int tag(message const& x) const noexcept {
    return (static_cast<int>(x.what) * cut_.pieces() + x.piece) * schedule_.micro + x.micro;
  }
  [[nodiscard]] std::size_t key(message const& x) const noexcept { return static_cast<std::size_t>(tag(x)); }
  [[nodiscard]] static bool same(message const& a, message const& b) noexcept {
    return a.what == b.what && a.piece == b.piece && a.micro == b.micro;
  }

  // What rank `from` sends, in its order, with the receiving rank: from its action list.
  template <class Each>
  void sends_of(int from, Each&& each) const {
    int const Q = cut_.pieces();
    int const head = stage_of(schedule_, Q - 1), embed = stage_of(schedule_, 0);
    for (action const& a : schedule_.per_stage[static_cast<std::size_t>(from)]) {
      int const q = schedule_.piece(from, a.chunk);
      if (a.kind == op::F && q + 1 < Q && stage_of(schedule_, q + 1) != from)
        each(message{kind::act, q + 1, a.micro}, stage_of(schedule_, q + 1));
      if (a.kind == op::B || a.kind == op::BW) {
        if (q > 0 && stage_of(schedule_, q - 1) != from) each(message{kind::grad, q - 1, a.micro}, stage_of(schedule_, q - 1));
        if (q == Q - 1 && head != embed) each(message{kind::tied, 0, a.micro}, embed);
      }
    }
  }

  // After a failure on this stage: sends every message it still owes (zeros) and receives every one
  // it is still owed, so the other stages run their lists to the end instead of waiting for their
  // deadline; the step then fails on every rank.
  void settle_messages() {
    for (std::size_t i = 0; i < outgoing_.size(); ++i) {
      if (sent_[i]) continue;
      auto const& [x, to] = outgoing_[i];
      if (!f32_.empty()) send_zeros(to, x, f32_);
      else if (!bf16_.empty()) send_zeros(to, x, bf16_);
      else send_zeros(to, x, f16_);
    }
    for (inbox& in : inboxes_) {
      post_ahead(in, in.order.size());
      for (std::size_t i = 0; i < in.posted; ++i) channels_[static_cast<std::size_t>(link(in.from, me_))].wait(in.requests[i]);
    }
  }
  template <class T>
  void send_zeros(int to, message const& x, std::vector<std::vector<T>>& buf) {
    auto& b = buf[key(x)];
    std::fill(b.begin(), b.end(), T{});
    send(to, x, b.data(), b.size());
  }

  void plan_messages() {
    sends_of(me_, [&](message x, int to) { outgoing_.emplace_back(x, to); });
    sent_.assign(outgoing_.size(), false);
    for (int from = 0; from < schedule_.stages; ++from) {
      if (from == me_) continue;
      inbox in;
      in.from = from;
      sends_of(from, [&](message x, int to) {
        if (to == me_) in.order.push_back(x);
      });
      if (!in.order.empty()) inboxes_.push_back(std::move(in));
    }
  }

  template <class Model>
  void size_buffers(Model& model) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(model.boundary(0, 0).data())>>;
    auto const act = static_cast<std::size_t>(model.boundary(model.first_block(), 0).size());
    std::size_t tied = 0;
    if constexpr (requires { model.tied_grad(0); })
      if (tied_) tied = static_cast<std::size_t>(model.tied_grad(0).size());
    std::size_t const n = static_cast<std::size_t>(3 * cut_.pieces() * schedule_.micro);
    auto& buf = buffers<T>();
    buf.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      bool const is_tied = i >= static_cast<std::size_t>(2 * cut_.pieces() * schedule_.micro);
      buf[i].resize(is_tied ? tied : act);
    }
  }
  template <class T>
  std::vector<std::vector<T>>& buffers() {
    if constexpr (std::is_same_v<T, float>) return f32_;
    else if constexpr (std::is_same_v<T, bf16>) return bf16_;
    else return f16_;
  }

  // Posts the receives of `in` up to a window beyond index `from`, in the sender's order.
  void post_ahead(inbox& in, std::size_t from) {
    std::size_t const end = std::min(in.order.size(), from + window);
    in.requests.resize(in.order.size());
    for (; in.posted < end; ++in.posted) post(in, in.posted);
  }
  void post(inbox& in, std::size_t i) {
    message const& x = in.order[i];
    post_typed(in, i, channels_[static_cast<std::size_t>(link(in.from, me_))], x);
  }
  template <class Ch>
  void post_typed(inbox& in, std::size_t i, Ch& ch, message const& x) {
    if (!f32_.empty()) in.requests[i] = ch.recv_async(std::span<float>(f32_[key(x)]), in.from, tag(x));
    else if (!bf16_.empty()) in.requests[i] = ch.recv_async(std::span<bf16>(bf16_[key(x)]), in.from, tag(x));
    else in.requests[i] = ch.recv_async(std::span<f16>(f16_[key(x)]), in.from, tag(x));
  }

  // Waits for message x from rank `from` and returns its buffer.
  template <class T>
  std::vector<T> const& receive(int from, message const& x) {
    for (inbox& in : inboxes_) {
      if (in.from != from) continue;
      for (std::size_t i = 0; i < in.order.size(); ++i) {
        message const& y = in.order[i];
        if (!same(x, y)) continue;
        post_ahead(in, i);
        channels_[static_cast<std::size_t>(link(from, me_))].wait(in.requests[i]);
        return buffers<T>()[key(x)];
      }
    }
    TIDE_FAIL(usage, "pipeline::rank_executor: rank ", me_, " waits for a message rank ", from,
              " never sends (kind ", static_cast<int>(x.what), ", piece ", x.piece, ", micro-batch ", x.micro, ")");
  }
  template <class T>
  void send(int to, message const& x, T const* data, std::size_t n) {
    auto& buf = buffers<T>()[key(x)];
    if (buf.data() != data) std::memcpy(buf.data(), data, n * sizeof(T));
    for (std::size_t i = 0; i < outgoing_.size(); ++i)
      if (!sent_[i] && same(outgoing_[i].first, x)) {
        sent_[i] = true;
        break;
      }
    int const ch = link(me_, to);
    sends_.emplace_back(ch, channels_[static_cast<std::size_t>(ch)].send_async(std::span<T const>(buf), to, tag(x)));
  }

  template <class Model>
  struct links_of {
    rank_executor& ex;
    Model& model;
    [[nodiscard]] int at(int q) const noexcept { return stage_of(ex.schedule_, q); }
    template <class View>
    static void copy_in(View to, auto const& from) {
      std::memcpy(to.data(), from.data(), from.size() * sizeof(from[0]));
    }
    void before_forward(int q, int k, int slot) {
      if (q == 0 || at(q - 1) == ex.me_) return;
      auto const to = model.boundary(ex.cut_.first[static_cast<std::size_t>(q)] - 1, slot);
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(to.data())>>;
      copy_in(to, ex.template receive<T>(at(q - 1), {kind::act, q, k}));
    }
    void after_forward(int q, int k, int slot) {
      if (q + 1 == ex.cut_.pieces() || at(q + 1) == ex.me_) return;
      auto const out = model.boundary(ex.cut_.last[static_cast<std::size_t>(q)], slot);
      ex.send(at(q + 1), {kind::act, q + 1, k}, out.data(), static_cast<std::size_t>(out.size()));
    }
    void before_backward(int q, int k, int slot) {
      if (q + 1 < ex.cut_.pieces() && at(q + 1) != ex.me_) {
        auto const to = model.boundary_grad(slot);
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(to.data())>>;
        copy_in(to, ex.template receive<T>(at(q + 1), {kind::grad, q, k}));
      }
      if constexpr (requires { model.tied_grad(0); }) {
        if (q == 0 && ex.tied_) {
          auto const to = model.tied_grad(slot);
          using T = std::remove_cv_t<std::remove_pointer_t<decltype(to.data())>>;
          copy_in(to, ex.template receive<T>(at(ex.cut_.pieces() - 1), {kind::tied, 0, k}));
        }
      }
    }
    void after_backward(int q, int k, int slot) {
      if (q > 0 && at(q - 1) != ex.me_) {
        auto const out = model.boundary_grad(slot);
        ex.send(at(q - 1), {kind::grad, q - 1, k}, out.data(), static_cast<std::size_t>(out.size()));
      }
      if constexpr (requires { model.tied_grad(0); }) {
        if (q == ex.cut_.pieces() - 1 && ex.tied_) {
          auto const out = model.tied_grad(slot);
          ex.send(at(0), {kind::tied, 0, k}, out.data(), static_cast<std::size_t>(out.size()));
        }
      }
    }
  };

  C* group_;
  schedule schedule_;
  cut cut_;
  int me_ = 0, slots_ = 1;
  bool tied_ = false;
  std::vector<C> channels_;
  std::vector<inbox> inboxes_;
  std::vector<std::pair<message, int>> outgoing_;  // what this stage sends in a run, in order, and to whom
  std::vector<bool> sent_;                         // of outgoing_, in this run
  std::vector<std::pair<int, typename C::request>> sends_;
  std::vector<std::vector<float>> f32_;  // staging: one buffer per message (kind, piece, micro-batch)
  std::vector<std::vector<bf16>> bf16_;
  std::vector<std::vector<f16>> f16_;
  std::vector<double> losses_;
  run_stats stats_;
};

}  // namespace tide::pipeline
