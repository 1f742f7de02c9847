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
// Failures. A stage that throws (its model, its offload engine) goes on through the rest of its
// list without computing: it waits for what each action needs and sends zeros for what each
// action makes, in the list's order, so every stage reaches the end of its list as it would have
// (no deadlock where the schedule has none); there all agree, and every rank throws: the failed one
// its error, the others one saying another stage failed. The step is lost on every rank alike
// (make_trainer then undoes it everywhere). A lost peer: the communicator's deadline turns the
// wait into tide::error(errc::mpi) naming the operation.
//
// Measurements (last()) are of this rank's stage: its busy time, its timeline, and the costs of
// its own pieces (the others' read as zero).
//
// Bit for bit: the gradients of this rank's parameters equal those of gradient accumulation over
// the same micro-batches in one process (tests/mpi/pipeline.cpp), as on threads
// (pipeline/executor.hpp), because the same blocks add the same values in the same order.

#include <algorithm>
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
#include "tide/memory/ops.hpp"
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
    TIDE_REQUIRE(3 * cut_.pieces() * schedule_.micro <= 32767, "pipeline::rank_executor: ", cut_.pieces(),
                 " pieces x ", schedule_.micro, " micro-batches need more message tags than MPI promises (32767); "
                 "use fewer micro-batches per step");
    me_ = group.rank();
    slots_ = slots_needed(schedule_, me_);
    slots_split_ = slots_needed(schedule_, me_, true);
    if (schedule_.stages > 1)
      for (int i = 0; i < links; ++i) channels_.push_back(group.split(0, group.rank()));  // a duplicate per link kind
  }

  [[nodiscard]] int stage() const noexcept { return me_; }
  // This rank's model needs in_flight >= slots(split); split: its backward splits in two (W runs apart).
  [[nodiscard]] int slots(bool split = false) const noexcept { return split ? slots_split_ : slots_; }
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
    detail::check_staged<Model, B>();
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(model.boundary(0, 0).data())>>;
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>,
                  "pipeline::rank_executor: the model's activations must be float, bf16 or f16");
    int const Q = cut_.pieces();
    // Every rank checks its arguments, then all agree: a rank that cannot run makes every rank
    // throw here, before any message, rather than leave its peers to their deadline.
    std::exception_ptr failure;
    try {
      split_ = detail::runs_weights_apart<Model, B>(model, schedule_);
      detail::check_run("pipeline::rank_executor", schedule_, cut_, model, ex, micro, slots(split_));
      bool tied = false;  // the head's share of wte travels (a model with a tied buffer, two ranks)
      if constexpr (requires { model.tied_grad(0); }) tied = stage_of(schedule_, 0) != stage_of(schedule_, Q - 1);
      if (tied && (me_ == stage_of(schedule_, 0) || me_ == stage_of(schedule_, Q - 1)))
        (void)model.tied_grad(0);  // throws, saying what to pass, if the model keeps no tied buffer
      if (!planned_ || tied != tied_) plan_messages(tied);
      size_buffers<T>(model);
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
    for (inbox& in : inboxes_) {
      in.posted = in.completed = 0;
      std::fill(in.received.begin(), in.received.end(), false);
      post_ahead<T>(in, 0);
    }
    sends_.clear();
    std::fill(sent_.begin(), sent_.end(), false);
    auto const t0 = detail::clock::now();
    links_of<Model, B> l{*this, model, ex};
    try {
      detail::run_stage(me_, schedule_, cut_, model, ex, micro, scale, slots(split_), split_, l, t0, stats_.stages[0],
                        losses_.data());
    } catch (...) {
      failure = std::current_exception();
      try {
        settle<T>();  // the other stages get what they wait for, and finish their lists
      } catch (...) {  // a link failed too: the first error is the step's
      }
    }
    try {
      for (auto const& [ch, r] : sends_) channels_[static_cast<std::size_t>(ch)].wait(r);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    detail::finish_stats(stats_, t0);
    // Every stage ran its list (a failed one without computing): all agree, then all throw or none.
    bool const all_ran = comm::all_ranks(*group_, !failure);
    if (failure || !all_ran) detail::drop_owed<Model, B>(model, split_);
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
    std::vector<bool> received;
    std::size_t posted = 0;      // receives posted so far, in order
    std::size_t completed = 0;   // receives known complete: a lane finishes its operations in order
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

  // What action a of stage `st` needs from other ranks (each(message, from)) and what it makes for
  // them (each(message, to)), in that order.
  template <class Needs, class Makes>
  void messages_of(int st, action const& a, Needs&& needs, Makes&& makes) const {
    int const Q = cut_.pieces();
    int const head = stage_of(schedule_, Q - 1), embed = stage_of(schedule_, 0);
    int const q = schedule_.piece(st, a.chunk);
    auto at = [&](int piece) { return stage_of(schedule_, piece); };
    if (a.kind == op::F) {
      if (q > 0 && at(q - 1) != st) needs(message{kind::act, q, a.micro}, at(q - 1));
      if (q + 1 < Q && at(q + 1) != st) makes(message{kind::act, q + 1, a.micro}, at(q + 1));
    } else if (a.kind == op::B || a.kind == op::BW) {
      if (q + 1 < Q && at(q + 1) != st) needs(message{kind::grad, q, a.micro}, at(q + 1));
      if (q == 0 && tied_) needs(message{kind::tied, 0, a.micro}, head);
      if (q > 0 && at(q - 1) != st) makes(message{kind::grad, q - 1, a.micro}, at(q - 1));
      if (q == Q - 1 && tied_) makes(message{kind::tied, 0, a.micro}, embed);
    }
  }

  void plan_messages(bool tied) {
    tied_ = tied;
    planned_ = true;
    outgoing_.clear();
    inboxes_.clear();
    for (action const& a : schedule_.per_stage[static_cast<std::size_t>(me_)])
      messages_of(me_, a, [](message, int) {}, [&](message x, int to) { outgoing_.emplace_back(x, to); });
    sent_.assign(outgoing_.size(), false);
    for (int from = 0; from < schedule_.stages; ++from) {
      if (from == me_) continue;
      inbox in;
      in.from = from;
      for (action const& a : schedule_.per_stage[static_cast<std::size_t>(from)])
        messages_of(from, a, [](message, int) {}, [&](message x, int to) {
          if (to == me_) in.order.push_back(x);
        });
      in.requests.resize(in.order.size());
      in.received.assign(in.order.size(), false);
      if (!in.order.empty()) inboxes_.push_back(std::move(in));
    }
  }

  // One staging buffer per message this rank sends or receives (keyed by its tag), of the
  // model's element type.
  template <class T, class Model>
  void size_buffers(Model& model) {
    auto const act = static_cast<std::size_t>(model.boundary(model.first_block(), 0).size());
    std::size_t tied = 0;
    if constexpr (requires { model.tied_grad(0); })
      if (tied_ && (me_ == stage_of(schedule_, 0) || me_ == stage_of(schedule_, cut_.pieces() - 1)))
        tied = static_cast<std::size_t>(model.tied_grad(0).size());
    auto& buf = buffers<T>();
    buf.resize(static_cast<std::size_t>(3 * cut_.pieces() * schedule_.micro));
    auto size_of = [&](message const& x) { return x.what == kind::tied ? tied : act; };
    for (auto const& [x, to] : outgoing_) buf[key(x)].resize(size_of(x));
    for (inbox const& in : inboxes_)
      for (message const& x : in.order) buf[key(x)].resize(size_of(x));
  }
  template <class T>
  std::vector<std::vector<T>>& buffers() {
    if constexpr (std::is_same_v<T, float>) return f32_;
    else if constexpr (std::is_same_v<T, bf16>) return bf16_;
    else return f16_;
  }

  // Posts the receives of `in` up to a window beyond index `from`, in the sender's order.
  template <class T>
  void post_ahead(inbox& in, std::size_t from) {
    std::size_t const end = std::min(in.order.size(), from + window);
    auto& ch = channels_[static_cast<std::size_t>(link(in.from, me_))];
    for (; in.posted < end; ++in.posted) {
      message const& x = in.order[in.posted];
      in.requests[in.posted] = ch.recv_async(std::span<T>(buffers<T>()[key(x)]), in.from, tag(x));
    }
  }

  // Waits for message x from rank `from` and returns its buffer.
  template <class T>
  std::vector<T> const& receive(int from, message const& x) {
    for (inbox& in : inboxes_) {
      if (in.from != from) continue;
      for (std::size_t i = 0; i < in.order.size(); ++i) {
        if (!same(x, in.order[i])) continue;
        post_ahead<T>(in, i);
        if (i >= in.completed) {  // the lane may have reused an older slot: wait only past the mark
          channels_[static_cast<std::size_t>(link(from, me_))].wait(in.requests[i]);
          in.completed = i + 1;
        }
        in.received[i] = true;
        return buffers<T>()[key(x)];
      }
    }
    TIDE_FAIL(usage, "pipeline::rank_executor: rank ", me_, " waits for a message rank ", from,
              " never sends (kind ", static_cast<int>(x.what), ", piece ", x.piece, ", micro-batch ", x.micro, ")");
  }
  [[nodiscard]] bool was_received(int from, message const& x) const {
    for (inbox const& in : inboxes_)
      if (in.from == from)
        for (std::size_t i = 0; i < in.order.size(); ++i)
          if (same(x, in.order[i])) return in.received[i];
    return false;
  }
  // Sends n elements at `data` (the model's memory on B, read to the message's host buffer first,
  // after the compute work so far; or that buffer itself).
  template <class T, Backend B = host>
  void send(int to, message const& x, T const* data, std::size_t n, exec<B> const* on = nullptr) {
    auto& buf = buffers<T>()[key(x)];
    if (buf.data() != data) {
      if constexpr (B::is_device) memory::read_to_host(*on, buf.data(), data, n * sizeof(T));
      else std::memcpy(buf.data(), data, n * sizeof(T));
    }
    int const ch = link(me_, to);
    sends_.emplace_back(ch, channels_[static_cast<std::size_t>(ch)].send_async(std::span<T const>(buf), to, tag(x)));
    for (std::size_t i = 0; i < outgoing_.size(); ++i)
      if (!sent_[i] && same(outgoing_[i].first, x)) {
        sent_[i] = true;
        break;
      }
  }
  [[nodiscard]] bool was_sent(message const& x) const {
    for (std::size_t i = 0; i < outgoing_.size(); ++i)
      if (same(outgoing_[i].first, x)) return sent_[i];
    return false;
  }

  // After a failure on this stage: the rest of its list without computing. Each action's inputs
  // are waited for and its outputs sent as zeros, in the list's order, as a healthy stage would.
  template <class T>
  void settle() {
    for (action const& a : schedule_.per_stage[static_cast<std::size_t>(me_)])
      messages_of(
          me_, a,
          [&](message x, int from) {
            if (!was_received(from, x)) (void)receive<T>(from, x);
          },
          [&](message x, int to) {
            if (was_sent(x)) return;
            auto& b = buffers<T>()[key(x)];
            std::fill(b.begin(), b.end(), T{});
            send(to, x, b.data(), b.size());
          });
  }

  // What crosses stages, between the model's memory (on B) and the messages' host buffers: on a
  // device backend written in compute order and read after it (memory/ops.hpp).
  template <class Model, Backend B>
  struct links_of {
    rank_executor& ex;
    Model& model;
    exec<B> const& on;
    [[nodiscard]] int at(int q) const noexcept { return stage_of(ex.schedule_, q); }
    template <class View>
    void copy_in(View to, auto const& from) const {
      memory::write_from_host(on, to.data(), from.data(), from.size() * sizeof(from[0]));
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
      ex.send(at(q + 1), {kind::act, q + 1, k}, out.data(), static_cast<std::size_t>(out.size()), &on);
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
        ex.send(at(q - 1), {kind::grad, q - 1, k}, out.data(), static_cast<std::size_t>(out.size()), &on);
      }
      if constexpr (requires { model.tied_grad(0); }) {
        if (q == ex.cut_.pieces() - 1 && ex.tied_) {
          auto const out = model.tied_grad(slot);
          ex.send(at(0), {kind::tied, 0, k}, out.data(), static_cast<std::size_t>(out.size()), &on);
        }
      }
    }
  };

  C* group_;
  schedule schedule_;
  cut cut_;
  int me_ = 0, slots_ = 1, slots_split_ = 1;
  bool split_ = false;  // of the current run
  bool tied_ = false, planned_ = false;
  std::vector<inbox> inboxes_;
  std::vector<std::pair<message, int>> outgoing_;  // what this stage sends in a run, in order, and to whom
  std::vector<bool> sent_;                         // of outgoing_, in this run
  std::vector<std::pair<int, typename C::request>> sends_;
  std::vector<std::vector<float>> f32_;  // staging: one buffer per message (kind, piece, micro-batch)
  std::vector<std::vector<bf16>> bf16_;
  std::vector<std::vector<f16>> f16_;
  std::vector<double> losses_;
  run_stats stats_;
  // Last: destroyed first, so every lane drains (its operations use the staging buffers above)
  // before those buffers go.
  std::vector<C> channels_;
};

}  // namespace tide::pipeline
