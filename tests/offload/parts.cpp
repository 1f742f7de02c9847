// The parts the offload engine owns, each on its own, without a scheduler:
// - moment_map (offload/detail/moments.hpp): what each moment of a step touches and completes;
// - residency_planner (offload/detail/residency_planner.hpp): budgets, victims and what to fetch
//   ahead, from a recorded trace and a set of resident ids, without memory;
// - chunk_store (offload/detail/chunk_store.hpp): the tier store, on tide::sealed, with an owner
//   that records what the store asks;
// - block_access (offload/detail/block_access.hpp): what the open block may touch;
// - plan_files (offload/detail/file_plan.hpp): which chunks go to file, a pure decision;
// - file_tier (offload/detail/file_tier.hpp): the files, their slots and their staging blocks;
// - shard_map (offload/detail/shard_map.hpp): ZeRO-3's held chunks and gathers, through a port
//   that records what the engine would do;
// - update_runner (offload/detail/update_runner.hpp): the optimizer lane and the gradient ring;
// - sink_lane (offload/detail/sink_lane.hpp): the gradient sink's work on this step's chunks, and
//   on tide::sealed its host staging.
// The scheduler's runs with them are in offload/faults.cpp, offload/slots.cpp, train/trainer.cpp
// and the MPI tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <span>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <tide/chunk/chunk.hpp>
#include <tide/chunk/layout.hpp>
#include <tide/core/error.hpp>
#include <tide/core/sealed.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/ops.hpp>
#include <tide/memory/stream.hpp>
#include <tide/core/parameters.hpp>
#include <tide/offload/detail/block_access.hpp>
#include <tide/offload/detail/chunk_store.hpp>
#include <tide/offload/detail/file_plan.hpp>
#include <tide/offload/detail/file_tier.hpp>
#include <tide/offload/detail/moments.hpp>
#include <tide/offload/detail/residency_planner.hpp>
#include <tide/offload/schedulers.hpp>
#include <tide/offload/detail/shard_map.hpp>
#include <tide/offload/detail/sink_lane.hpp>
#include <tide/offload/detail/update_runner.hpp>
#include <tide/optim/sgd.hpp>

#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/gate.hpp"

using tide::offload::detail::file_plan;
using tide::offload::detail::file_plan_input;
using tide::offload::detail::plan_files;
using ids = std::vector<std::uint32_t>;
using tide::test::category_of;

namespace {

constexpr std::size_t KiB = 1024;

// 8 chunks, each 4 KiB of parameters that stay, 2 state lists of 4 KiB that may go.
file_plan_input eight_chunks(std::vector<std::uint32_t> const& owned, std::size_t budget) {
  return {.host_budget = budget, .have_folder = true, .kept = 8 * 4 * KiB, .owned = owned, .lists = 2,
          .list_bytes = 4 * KiB, .param_bytes = 4 * KiB, .chunks = 8};
}

}  // namespace

TEST_CASE("moment_map: each moment's chunks, where each chunk's gradients complete, and the working set") {
  // 4 parameters in 3 chunks (1 and 2 share chunk 1); block 2 reads parameter 0 again (a tied
  // embedding), so chunk 0's gradients are complete only after block 0's backward.
  tide::chunk::chunk_layout layout;
  layout.chunk_of = {0, 1, 1, 2};
  layout.offset_of = {0, 0, 64, 0};
  layout.first_param = {0, 1, 3, 4};
  tide::block_uses const uses{.first_block = 0, .params = {{0}, {1, 2}, {0, 3}}};
  tide::offload::detail::moment_map const m{uses, layout, 3};
  using tide::chunk::phase;
  CHECK(m.ids_of(0, phase::forward) == ids{0});
  CHECK(m.ids_of(1, phase::forward) == ids{1});
  CHECK(m.ids_of(2, phase::forward) == ids{0, 2});
  CHECK(m.ids_of(2, phase::backward) == ids{0, 2, 3, 5});  // gradient chunks are 3 + c
  CHECK(ids(m.completes_at(2).begin(), m.completes_at(2).end()) == ids{2});
  CHECK(ids(m.completes_at(1).begin(), m.completes_at(1).end()) == ids{1});
  CHECK(ids(m.completes_at(0).begin(), m.completes_at(0).end()) == ids{0});  // after its last use in backward
  CHECK(m.working_set() == 4);
  CHECK(m.working_set_moment() == "block 2's backward");
  CHECK(m.grads_per_moment() == 2);
  CHECK(category_of([&] { (void)m.ids_of(3, phase::forward); }) == tide::errc::usage);
}

TEST_CASE("residency_planner: budgets, victims, demands and the walk ahead, from a trace alone") {
  namespace off = tide::offload;
  using off::detail::residency_move;
  using kind = residency_move::kind;
  constexpr std::size_t block = 1 * KiB, budget = 6 * KiB, reserved = 512;
  // 4 parameter chunks (ids 0..3) and their gradients (4..7); a step forward 0..3, backward 3..0.
  off::chunked<off::belady> const policy{.reserved = reserved, .prefetch_moments = 2};
  off::detail::residency_planner<off::chunked<off::belady>> plan(policy, budget, 8);
  plan.ctx.block_bytes = block;
  std::vector<ids> const step = {{0}, {1}, {2}, {3}, {3, 7}, {2, 6}, {1, 5}, {0, 4}};
  auto record = [&](std::size_t non_model) {
    plan.tracer.begin_step();
    plan.ctx.recording = plan.tracer.recording();
    for (std::size_t m = 0; m < step.size(); ++m) {
      int const b = m < 4 ? static_cast<int>(m) : static_cast<int>(7 - m);
      auto const ph = m < 4 ? tide::chunk::phase::forward : tide::chunk::phase::backward;
      std::size_t const t = plan.tracer.at({b, ph}, step[m]);
      plan.tracer.non_model(t, non_model);
    }
    plan.tracer.end_step();
    plan.ctx.recording = false;
  };

  // Budgets: the hard limit is what the non-model bytes and the reserve leave; in the warm-up a
  // traced moment's budget is 0 (nothing movable yet), untraced it is the hard limit.
  CHECK(plan.hard_limit(1 * KiB) == budget - 1 * KiB - reserved);
  CHECK(plan.hard_limit(budget) == 0);
  plan.tracer.begin_step();
  plan.ctx.recording = true;
  CHECK(plan.capacity(0, 1 * KiB) == 0);
  CHECK(plan.capacity(plan.untraced, 1 * KiB) == budget - 1 * KiB - reserved);
  plan.tracer.abort_step();
  plan.ctx.recording = false;
  // Before the trace is known: the first candidate, whatever its next use.
  std::vector<bool> resident(8, false);
  for (std::uint32_t id : {0u, 1u, 2u, 3u}) resident[id] = true;
  auto const on_device = [&](std::uint32_t id) { return static_cast<bool>(resident[id]); };
  CHECK(plan.victim(4, ids{0}, plan.untraced, on_device) == 1u);
  record(1 * KiB);
  REQUIRE(plan.tracer.warm());
  plan.trace_known();
  CHECK(plan.capacity(3, 0) == budget - 1 * KiB - reserved);  // the trace's non-model bytes, not the caller's

  // Victims: moment 4 (block 3's backward) with parameters 0..3 resident and 3 protected. Belady
  // evicts the one used furthest ahead: 0 (moment 7), then 1 (6), then 2 (5).
  ids const protect = {3, 7};
  CHECK(plan.victim(4, protect, plan.untraced, on_device) == 0u);
  auto const distance = [&](std::uint32_t id) { return plan.tracer.trace().next_use_distance(id, 4); };
  REQUIRE(distance(0) > distance(1));
  REQUIRE(distance(1) > distance(2));
  // beyond: only chunks used later than that many moments ahead (the prefetch rule).
  CHECK(plan.victim(4, protect, distance(1), on_device) == 0u);
  CHECK_FALSE(plan.victim(4, protect, distance(0), on_device).has_value());
  // Not evictable (pinned, or in use): never chosen.
  resident[0] = false;
  CHECK(plan.victim(4, protect, plan.untraced, on_device) == 1u);
  resident[0] = true;

  // A demand at moment 4: room (capacity 4.5 KiB) for a fifth block? With 4 resident (4 KiB) plus
  // one: over it, so evict Belady's victim first; with nothing evictable but room under the hard
  // limit (the non-model bytes of now are lower), fetch; above even that: stop.
  std::size_t const cap = plan.capacity(4, 1 * KiB);
  CHECK(plan.demand(4, protect, 2 * block, block, 1 * KiB, on_device).what == kind::fetch);
  residency_move const m = plan.demand(4, protect, 4 * block, block, 1 * KiB, on_device);
  CHECK(m.what == kind::evict_then_fetch);
  CHECK(m.victim == 0u);
  auto const nothing = [](std::uint32_t) { return false; };
  CHECK(plan.demand(4, protect, cap, block, 0, nothing).what == kind::fetch);  // hard limit 5.5 KiB
  CHECK(plan.demand(4, protect, 5 * block, block, 1 * KiB, nothing).what == kind::stop);

  // The walk ahead from moment 0: moments 1 and 2 (prefetch_moments = 2), nearest first, each
  // with what moments 0 .. u touch protected; the callback's false ends it.
  std::vector<std::array<std::size_t, 3>> walked;  // (id, k, u)
  std::vector<ids> protected_then;
  plan.ahead(0, [&](std::uint32_t id, int k, std::size_t u, std::span<std::uint32_t const> p) {
    walked.push_back({id, static_cast<std::size_t>(k), u});
    protected_then.emplace_back(p.begin(), p.end());
    return true;
  });
  CHECK(walked == std::vector<std::array<std::size_t, 3>>{{1, 1, 1}, {2, 2, 2}});
  CHECK(protected_then == std::vector<ids>{{0, 1}, {0, 1, 2}});
  int calls = 0;
  plan.ahead(4, [&](std::uint32_t, int, std::size_t, std::span<std::uint32_t const>) { return ++calls < 1; });
  CHECK(calls == 1);
  // One chunk of the walk: room in both moments' budgets: fetch; else a victim used later than
  // the chunk (k moments ahead); none: stop, fetching further ahead would undo MIN.
  CHECK(plan.prefetch(0, 2, 2, ids{0, 1, 2}, 0, block, 0, on_device).what == kind::fetch);
  residency_move const p = plan.prefetch(4, 5, 1, ids{3, 7, 2, 6}, 4 * block, block, 0, on_device);
  CHECK(p.what == kind::evict_then_fetch);
  CHECK(p.victim == 0u);
  CHECK(plan.prefetch(4, 5, 1, ids{3, 7, 2, 6}, 4 * block, block, 0, nothing).what == kind::stop);
}

TEST_CASE("block_access: a block's parameters while it is open, their gradients in its backward only") {
  tide::offload::detail::block_access a{4};
  ids const block1{1, 2};
  CHECK_FALSE(a.in_block());
  a.open(block1, 1, tide::chunk::phase::forward);
  CHECK(a.in_block());
  CHECK(a.block() == 1);
  CHECK((a.may_read(1) && a.may_read(2)));
  CHECK_FALSE(a.may_read(0));
  CHECK_FALSE(a.may_write_grad(1));  // forward: no gradients
  a.leave(block1);
  CHECK_FALSE(a.in_block());
  CHECK_FALSE(a.may_read(1));
  a.open(block1, 1, tide::chunk::phase::backward);
  CHECK(a.may_write_grad(2));
  CHECK(a.phase() == tide::chunk::phase::backward);
  a.abort();  // a failed step: nothing open, nothing touchable
  CHECK_FALSE(a.in_block());
  CHECK_FALSE(a.may_read(1));
  CHECK_FALSE(a.may_write_grad(2));
}

TEST_CASE("plan_files: nothing goes to file without a budget or when everything fits") {
  ids const owned{0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(plan_files(eight_chunks(owned, 0)).empty());
  file_plan const fits = plan_files(eight_chunks(owned, 96 * KiB));  // 32 KiB params + 64 KiB state
  CHECK(fits.empty());
  CHECK(fits.host_kept == 96 * KiB);
}

TEST_CASE("plan_files: the last owned chunks' state goes, as few as bring the data under the budget") {
  ids const owned{0, 1, 2, 3, 4, 5, 6, 7};
  for (std::size_t over_by : {std::size_t{1}, 8 * KiB, 8 * KiB + 1, 40 * KiB}) {
    CAPTURE(over_by);
    std::size_t const budget = 96 * KiB - over_by;
    file_plan const p = plan_files(eight_chunks(owned, budget));
    std::size_t const going = (over_by + 8 * KiB - 1) / (8 * KiB);
    REQUIRE(p.state_chunks.size() == going);
    CHECK(p.state_chunks.back() == 7);
    CHECK(std::ranges::is_sorted(p.state_chunks));
    CHECK(p.param_chunks.empty());
    CHECK(p.host_kept <= budget);
    CHECK(p.host_kept == 96 * KiB - going * 8 * KiB);
  }
  // Under ZeRO only the rank's own chunks count, and only they go.
  ids const mine{1, 3, 5, 7};
  file_plan const p = plan_files(eight_chunks(mine, 8 * 4 * KiB + 4 * 8 * KiB - 1));
  CHECK(p.state_chunks == ids{7});
}

TEST_CASE("plan_files: past every chunk's state, parameter chunks go too, when they may") {
  ids const owned{0, 1, 2, 3, 4, 5, 6, 7};
  file_plan_input in = eight_chunks(owned, 20 * KiB);  // below the 32 KiB of parameters
  in.params_may_go = true;
  file_plan const p = plan_files(in);
  CHECK(p.state_chunks == owned);
  // 32 - 20 = 12 KiB over: (12 / 4) + 1 = 4 parameter chunks, the last ones.
  CHECK(p.param_chunks == ids{4, 5, 6, 7});
  CHECK(p.host_kept == 16 * KiB);
  in.params_may_go = false;  // a sharding sink, reuse_grad_slots: the parameters must stay
  CHECK(category_of([&] { (void)plan_files(in); }) == tide::errc::budget);
}

TEST_CASE("plan_files: refusals say what to do") {
  ids const owned{0, 1, 2, 3};
  file_plan_input in = eight_chunks(owned, 8 * KiB);
  in.have_folder = false;
  CHECK(category_of([&] { (void)plan_files(in); }) == tide::errc::usage);
  in = eight_chunks(owned, 8 * KiB);
  in.host_reserve = 8 * KiB;  // leaves nothing for the model data
  CHECK(category_of([&] { (void)plan_files(in); }) == tide::errc::usage);
  in = eight_chunks(owned, 0);
  in.host_reserve = 1;  // a reserve without a budget
  CHECK(category_of([&] { (void)plan_files(in); }) == tide::errc::usage);
}

namespace {

// Two fp32 parameters per chunk over 4 chunks; the state lists and parameters that go to file.
struct model {
  tide::parameter_list params;
  tide::chunk::chunk_layout layout;
  std::vector<tide::chunk::chunk_list> lists;  // m, v, then the parameters
  tide::memory::pinned_pool<tide::host> host;
  tide::offload::offload_stats stats{};
  model() {
    constexpr std::array<std::string_view, 4> w{"w0", "w1", "w2", "w3"}, b{"b0", "b1", "b2", "b3"};
    for (int l = 0; l < 4; ++l) {
      params.add(w[l], l, tide::shape{16, 16}, tide::dtype::f32);
      params.add(b[l], l, tide::shape{16}, tide::dtype::f32);
    }
    layout = tide::chunk::pack(params, 16 * 16 + 64);
    using tide::chunk::chunk_role;
    for (chunk_role r : {chunk_role::state, chunk_role::state, chunk_role::param})
      lists.emplace_back(r, tide::dtype::f32, layout, params);
  }
};

}  // namespace

TEST_CASE("file_tier: a host step reads the current slot, writes the other; commit makes it current, abort keeps it") {
  using tier = tide::offload::detail::file_tier<tide::host>;
  tide::test::scratch_dir const dir("file_tier");
  model m;
  REQUIRE(m.layout.chunks() == 4);
  file_plan plan;
  plan.state_chunks = {2, 3};
  std::array<tide::chunk::chunk_list*, 2> to_file{&m.lists[0], &m.lists[1]};
  std::size_t const bytes = m.lists[0].chunk_bytes();
  tier files(m.host, m.stats, to_file, m.lists[2], plan, dir.path, 4, bytes);
  CHECK(files.state_on_file(3));
  CHECK_FALSE(files.state_on_file(1));
  CHECK_FALSE(files.params_spilled(3));
  std::size_t const n = bytes / sizeof(float);
  auto no_wait = [](std::uint32_t) { FAIL("no update is in flight"); };

  // Step 1: chunk 3's lists start as zeros; the update writes 1, 2 and commits.
  files.begin_step();
  tier::job j = files.stage(3, no_wait);
  REQUIRE(files.finish_reads(j));
  for (std::size_t k = 0; k < 2; ++k) {
    float* list = files.list_of(j, k);
    CHECK(std::all_of(list, list + n, [](float x) { return x == 0.f; }));
    std::fill(list, list + n, static_cast<float>(k + 1));
  }
  files.write_back(j);
  REQUIRE_FALSE(j.failure);
  CHECK(files.stepped().size() == 1);
  files.commit();
  CHECK(files.stepped().empty());
  CHECK(*reinterpret_cast<float const*>(files.state_view(3, 1)) == 2.f);

  // Step 2 writes 7 and is abandoned: the current slot still holds step 1's values.
  files.drop_view();
  files.begin_step();
  tier::job k = files.stage(3, [](std::uint32_t) {});
  REQUIRE(files.finish_reads(k));
  CHECK(files.list_of(k, 0)[0] == 1.f);
  std::fill(files.list_of(k, 0), files.list_of(k, 0) + n, 7.f);
  files.write_back(k);
  files.abort();
  CHECK(*reinterpret_cast<float const*>(files.state_view(3, 0)) == 1.f);

  // A checkpoint's load: the lists come to host blocks, are written, and flush takes them to file.
  files.drop_view();
  files.materialize(2);
  REQUIRE(m.lists[0][2].payload() != nullptr);
  reinterpret_cast<float*>(m.lists[0][2].payload())[5] = 42.f;
  CHECK(files.flush());
  CHECK(m.lists[0][2].payload() == nullptr);
  CHECK(reinterpret_cast<float const*>(files.state_view(2, 0))[5] == 42.f);
  CHECK(m.stats.nvme_read_bytes > 0);
  CHECK(m.stats.nvme_write_bytes > 0);
}

namespace {

// "what c" (built by appending: GCC 12 warns, wrongly, of an overlapping memcpy in "what " + s).
std::string said(char const* what, std::size_t c) {
  std::string s(what);
  s += ' ';
  s += std::to_string(c);
  return s;
}

// What the engine would do for a shard_map: each call appended as text, blocks numbered.
struct recording_port {
  std::vector<std::string> calls;
  std::vector<bool> attached = std::vector<bool>(4, true);
  std::array<std::byte, 16> blocks{};
  int next_block = 0;
  bool fail_wait = false;
  std::string name(std::byte* b) const { return std::string("b") += std::to_string(b - blocks.data()); }
  std::byte* gather_block(std::uint32_t c) {
    calls.push_back(said("alloc", c));
    return blocks.data() + next_block++;
  }
  void free_gather_block(std::uint32_t c, std::byte* b) { calls.push_back((said("free", c) += ' ') += name(b)); }
  void abandon_gather_block(std::uint32_t c, std::byte* b) { calls.push_back((said("abandon", c) += ' ') += name(b)); }
  void send_own(std::uint32_t c, std::byte*) { calls.push_back(said("send", c)); }
  void gather_async(std::uint32_t c, std::byte*) { calls.push_back(said("gather", c)); }
  void wait_gathered() {
    calls.push_back("wait");
    if (fail_wait) throw std::runtime_error("peer lost");
  }
  void attach_gathered(std::uint32_t c, std::byte*) {
    CHECK_FALSE(attached[c]);
    attached[c] = true;
    calls.push_back(said("attach", c));
  }
  void drop_param(std::uint32_t c) {
    CHECK(attached[c]);
    attached[c] = false;
    calls.push_back(said("drop", c));
  }
};

using strings = std::vector<std::string>;

}  // namespace

TEST_CASE("shard_map: rank 1 of 2 holds its own chunks, gathers a block's others around it, frees the rest") {
  tide::offload::detail::shard_map map({.rank = 1, .ranks = 2}, true, 4);
  recording_port port;
  REQUIRE(map.params_sharded());
  CHECK(map.has_param(0));  // the model initialised every chunk
  map.release_all(port);    // a step begins: the others' chunks go
  CHECK(port.calls == strings{"drop 0", "drop 2"});
  CHECK_FALSE(map.has_param(0));
  CHECK(map.has_param(1));

  // A block uses chunks 0 and 1; the next one chunk 2. Chunk 1 is this rank's: it sends it.
  port.calls.clear();
  ids const block{0, 1, 5}, next{2};  // 5: a gradient id, ignored
  map.gather_for(port, block);
  CHECK(port.calls == strings{"alloc 0", "gather 0", "alloc 1", "send 1", "gather 1", "wait", "attach 0",
                              "free 1 b1"});
  CHECK_FALSE(map.gathering());
  port.calls.clear();
  map.gather_ahead(port, next);  // once the block's chunks are resident
  CHECK(port.calls == strings{"alloc 2", "gather 2"});
  CHECK(map.has_param(0));
  CHECK(map.gathering());

  // The next block: chunk 2's gather lands, 0 and 1 are no longer held (1 stays: it owns it).
  port.calls.clear();
  map.gather_for(port, next);
  CHECK(port.calls == strings{"wait", "attach 2", "drop 0"});
  CHECK(map.has_param(2));
  CHECK_FALSE(map.has_param(0));
  CHECK(map.has_param(1));
}

TEST_CASE("shard_map: a failed gather abandons its blocks, holds nothing new, and abort() reports nothing") {
  tide::offload::detail::shard_map map({.rank = 0, .ranks = 2}, true, 4);
  recording_port port;
  map.release_all(port);
  port.calls.clear();
  port.fail_wait = true;
  ids const block{1, 3};
  CHECK_THROWS_AS(map.gather_for(port, block), std::runtime_error);
  CHECK(port.calls == strings{"alloc 1", "gather 1", "alloc 3", "gather 3", "wait", "abandon 1 b0", "abandon 3 b1"});
  CHECK_FALSE(map.has_param(1));
  CHECK_FALSE(map.gathering());
  port.calls.clear();
  map.abort(port);  // nothing in flight, nothing held: nothing to do, and nothing thrown
  CHECK(port.calls.empty());
  // Without parameter sharding, or on one rank, every chunk is held and nothing moves.
  tide::offload::detail::shard_map whole({.rank = 0, .ranks = 2}, false, 4), one({.rank = 0, .ranks = 1}, true, 4);
  for (auto* m : {&whole, &one}) {
    m->release_all(port);
    m->gather_for(port, block);
    m->gather_ahead(port, block);
    CHECK(m->has_param(3));
  }
  CHECK(port.calls.empty());
}

namespace {

// The update_runner over model's chunks: SGD, gradients in their own list, the journal beside.
struct lane_fixture {
  using runner = tide::offload::detail::update_runner<tide::host, float, tide::optim::sgd>;
  model m;
  tide::chunk::chunk_list grads{tide::chunk::chunk_role::grad, tide::dtype::f32, m.layout, m.params};
  tide::offload::detail::undo_journal<tide::host, float, 1> journal{m.host, 4};
  std::vector<std::vector<float>> param, grad, momentum;  // by chunk: chunk_elements each
  lane_fixture() {
    std::size_t const n = m.layout.chunk_elements;
    param.assign(4, std::vector<float>(n, 1.f));
    grad.assign(4, std::vector<float>(n, 2.f));
    momentum.assign(4, std::vector<float>(n, 0.f));
  }
  // Chunk c's job: its whole run, the journal's record when `journalled`.
  runner::job& stage(runner& r, std::uint32_t c, tide::optim::update_args a, bool journalled) {
    tide::offload::detail::update_targets<float, 1> x{param[c].data(), nullptr, {momentum[c].data()}};
    auto const n = static_cast<tide::index_t>(param[c].size());
    tide::offload::detail::undo_record<1>* u = journalled ? journal.begin(c, param[c].size(), x) : nullptr;
    runner::job& j = r.job_of(c);
    j = {&r, c, {param[c].data(), grad[c].data(), {momentum[c].data()}, nullptr, n}, x, a, nullptr, u, {}};
    return j;
  }
  runner make(tide::optim::sgd o, bool decay_matrices_only, std::size_t ring) {
    return runner(o, decay_matrices_only, m.layout, m.params.all(), journal, m.host, grads, m.stats, 1, ring);
  }
};

}  // namespace

TEST_CASE("update_runner: a queued step runs on the lane, journalled, and the journal puts it back") {
  lane_fixture f;
  auto r = f.make({.lr = 0.5f, .momentum = 0.9f}, false, 2);
  f.stage(r, 1, {1, 0.5f, 1.f, true}, true);
  r.queue(1);
  CHECK(r.pending(1));
  r.wait(1);
  CHECK_FALSE(r.pending(1));
  CHECK(f.param[1][0] == 0.f);     // 1 - 0.5 * 2 (the first step's momentum buffer is the gradient)
  CHECK(f.momentum[1][0] == 2.f);
  CHECK(f.param[0][0] == 1.f);     // no other chunk moved
  CHECK(r.take_ms() > 0);
  CHECK(r.take_ms() == 0);
  REQUIRE(f.journal.records().size() == 1);
  CHECK(f.journal.records()[0].saved);  // written by SGD's own pass (keeps_prev)
  tide::thread_pool pool{1};
  f.journal.restore(f.journal.records()[0], {f.param[1].data(), nullptr, {f.momentum[1].data()}},
                    tide::exec<tide::host>{pool});
  CHECK(f.param[1][0] == 1.f);
  CHECK(f.momentum[1][0] == 0.f);
  f.journal.discard();
}

TEST_CASE("update_runner: decay_matrices_only decays the matrices and leaves the vectors") {
  for (bool matrices_only : {false, true}) {
    CAPTURE(matrices_only);
    lane_fixture f;
    std::fill(f.grad[2].begin(), f.grad[2].end(), 0.f);
    auto r = f.make({.lr = 1.f, .weight_decay = 0.5f}, matrices_only, 0);
    f.stage(r, 2, {1, 1.f, 1.f, true}, false);
    r.run(2);  // on this thread
    auto const& layout = f.m.layout;
    std::uint32_t const w = layout.first_param[2], b = w + 1;  // w2 (16 x 16), b2 (16)
    CHECK(f.param[2][layout.offset_of[w]] == 0.5f);
    CHECK(f.param[2][layout.offset_of[b]] == (matrices_only ? 1.f : 0.5f));
  }
}

lane_fixture::runner make_lane_without_ring(lane_fixture& f) { return f.make({}, false, 0); }

TEST_CASE("update_runner: the gradient ring lends its blocks, keeps one its chunk still holds, and takes back a freed one") {
  lane_fixture f;
  auto r = f.make({}, false, 2);
  auto never = [] { return false; };
  // A block taken is attached to its gradient chunk at once (the copy out lands in it).
  std::byte* const a = r.take_ring_block(0, never);
  REQUIRE(a != nullptr);
  f.grads[0].attach(a, tide::chunk::tier::host);
  std::byte* const b = r.take_ring_block(1, never);
  REQUIRE(b != nullptr);
  f.grads[1].attach(b, tide::chunk::tier::host);
  CHECK(a != b);
  CHECK(r.held_blocks() == 2);
  CHECK(r.take_ring_block(2, never) == nullptr);  // both held by their chunks: the pool serves
  (void)f.grads[1].detach();                      // chunk 1's step was queued: its block left the chunk
  CHECK(r.take_ring_block(2, never) == b);        // and its step (none queued) ran
  f.grads[2].attach(b, tide::chunk::tier::host);
  CHECK(r.reclaim_ring_block(f.grads[0].detach()));  // a chunk freeing a ring block gives it back
  int dummy = 0;
  CHECK_FALSE(r.reclaim_ring_block(reinterpret_cast<std::byte*>(&dummy)));  // not the ring's
  CHECK(r.take_ring_block(3, never) == a);
  CHECK(r.held_blocks() == 2);
  (void)f.grads[2].detach();  // the ring's blocks go back to the pool with the runner, not with the chunks
  auto none = make_lane_without_ring(f);
  CHECK(none.take_ring_block(0, never) == nullptr);  // host_steps_in_flight = 0: no ring
}

namespace {

// A sink whose work runs on its own stream behind a gate, recording `done` after it; the chunk
// named `fails` fails there.
struct gated_sink {
  tide::memory::stream<tide::host>* work = nullptr;
  tide::test::gate* open = nullptr;
  std::vector<std::pair<std::uint32_t, bool>>* seen = nullptr;  // (chunk, last) as handed
  std::uint32_t fails = 99;
  struct failing {
    void operator()() const { throw std::runtime_error("the network went away"); }
  };
  bool reduce(tide::offload::ready_chunk<tide::host, float> const& r) {
    seen->push_back({r.chunk, r.last});
    work->launch(&tide::test::gate::pass, open);
    if (r.chunk == fails) work->launch_owned(failing{});
    r.done->record(*work);
    return true;
  }
};

}  // namespace

namespace {

// A sink_lane over 3 chunks, 2 per step, whose sink fails on chunk `fails`; each case has its own
// stream, as a failed stream takes no more work.
struct sink_fixture {
  tide::memory::stream<tide::host> work;
  tide::test::gate open;
  std::vector<std::pair<std::uint32_t, bool>> seen;
  tide::offload::offload_stats stats{};
  tide::offload::detail::sink_lane<tide::host, float, gated_sink> lane;
  std::array<float, 4> grads{};
  explicit sink_fixture(std::uint32_t fails) : lane({&work, &open, &seen, fails}, 3, stats) {
    lane.set_chunks_per_step(2);
    lane.begin_step();
  }
  void hand(std::initializer_list<std::uint32_t> chunks) {
    for (std::uint32_t c : chunks) {
      tide::offload::ready_chunk<tide::host, float> r{c, grads};
      lane.hand(r);
    }
  }
};

}  // namespace

TEST_CASE("sink_lane: the sink's work is waited for per chunk, and each failure reported once") {
  sink_fixture f(1);
  auto& lane = f.lane;
  f.hand({2, 1});
  CHECK(f.seen == std::vector<std::pair<std::uint32_t, bool>>{{2, false}, {1, true}});  // the step's last chunk
  CHECK(lane.pending(2));
  CHECK_FALSE(lane.pending(0));
  CHECK(lane.busy(2));          // behind the gate
  CHECK(lane.outstanding());
  f.open.open();
  // Chunk 1's work fails, and the sink's stream stays failed (sticky, as CUDA's): whichever wait
  // meets it reports it, once per chunk.
  CHECK_THROWS(lane.wait(1));
  CHECK_FALSE(lane.pending(1));
  lane.wait(1);  // once
  CHECK_THROWS(lane.wait(2));
  lane.wait(2);
  CHECK_FALSE(lane.outstanding());
}

TEST_CASE("sink_lane: an abandoned step's quiet() waits for the sink's work and reports nothing, its failure included") {
  sink_fixture f(0);
  auto& lane = f.lane;
  f.hand({0, 2});
  CHECK(lane.busy(0));
  f.open.open();
  lane.quiet();  // chunk 0's work failed: not reported here
  CHECK_FALSE(lane.pending(0));
  CHECK_FALSE(lane.pending(2));
  CHECK_FALSE(lane.busy(2));
}

namespace {

// A host sink on tide::sealed: it doubles the gradients it gets, on its own stream, after they
// are valid; the chunk `fails` fails there. It notes whether each span was host memory.
struct doubling_sink {
  tide::memory::stream<tide::host>* work = nullptr;
  std::vector<bool>* on_host = nullptr;
  std::uint32_t fails = 99;
  bool reduce(tide::offload::ready_chunk<tide::host, float> const& r) {
    on_host->push_back(!tide::is_sealed(r.grads.data()));
    if (r.valid_after != nullptr) work->wait(*r.valid_after);
    if (r.chunk == fails) work->launch_owned(gated_sink::failing{});
    work->launch_owned([g = r.grads] {
      for (float& x : g) x *= 2;
    });
    r.done->record(*work);
    return true;
  }
};

}  // namespace

TEST_CASE("sink_lane on sealed: a host sink gets a host copy of a device chunk after its kernels, and its writes "
          "come back; an abandoned step remakes the streams a failure reached") {
  namespace mem = tide::memory;
  tide::thread_pool pool{1};
  mem::stream<tide::sealed> compute;
  tide::exec<tide::sealed> const ex{pool, compute};
  mem::device_arena<tide::sealed> arena{{.budget = 64 * KiB}};
  constexpr std::size_t n = 1024;
  auto* grads = static_cast<float*>(arena.allocate(n * sizeof(float)));
  std::vector<float> const ones(n, 1.f);
  mem::write_from_host(ex, grads, ones.data(), n * sizeof(float));
  // A late kernel writes the gradients: the lane's copy must wait for the event after it.
  compute.launch_owned([a = tide::unseal(grads)] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (std::size_t k = 0; k < n; ++k) a[k] = 3.f;
  });
  mem::event<tide::sealed> computed;
  mem::record(ex, computed);

  mem::stream<tide::host> work;
  std::vector<bool> on_host;
  tide::offload::offload_stats stats{};
  using lane_t = tide::offload::detail::sink_lane<tide::sealed, float, doubling_sink>;
  static_assert(lane_t::staged);
  lane_t lane({&work, &on_host, 1}, 2, stats);
  lane.set_chunks_per_step(1);
  auto hand = [&](std::uint32_t c) {
    lane.begin_step();
    tide::offload::ready_chunk<tide::sealed, float> r{c, {grads, n}, tide::chunk::tier::device, &computed};
    lane.hand(r);
  };
  hand(0);
  CHECK(lane.pending(0));
  lane.wait(0);
  std::vector<float> out(n);
  mem::read_to_host(ex, out.data(), grads, n * sizeof(float));
  CHECK(std::ranges::all_of(out, [](float x) { return x == 6.f; }));  // 3, doubled on the host, back
  CHECK(on_host == std::vector<bool>{true});

  // Chunk 1's sum fails: its wait reports it; the sink's stream and the lane's are failed.
  hand(1);
  CHECK_THROWS(lane.wait(1));
  lane.quiet();
  work = mem::stream<tide::host>{};  // the sink starts afresh, and so does the lane
  lane.abandon();
  hand(0);
  lane.wait(0);
  mem::read_to_host(ex, out.data(), grads, n * sizeof(float));
  CHECK(out[0] == 12.f);
  compute.synchronize();
  arena.deallocate(grads, n * sizeof(float));
}

namespace {

// The tier store's owner, as a test writes it: it answers what the store asks, records it, and
// fills a parameter chunk with a plain copy on the store's copy stream (as host_source does).
struct store_owner {
  using store_t = tide::offload::detail::chunk_store<tide::sealed, float, store_owner>;
  store_t* store = nullptr;
  std::vector<std::string> calls;
  std::optional<std::uint32_t> victim;
  bool fail_fill = false;
  std::optional<std::uint32_t> pick_victim(std::size_t, std::span<std::uint32_t const>, std::size_t) {
    calls.push_back(victim ? said("victim", *victim) : "no victim");
    return victim;
  }
  void before_fetch(std::uint32_t id) { calls.push_back(said("before_fetch", id)); }
  void fetched(std::uint32_t id) { calls.push_back(said("fetched", id)); }
  bool param_on_file(std::uint32_t) { return false; }
  bool param_in_file(std::uint32_t) { return false; }
  std::byte* read_param_file(std::uint32_t) { return nullptr; }
  void fill_chunk(std::uint32_t c, std::byte* dev, std::byte const* host, std::size_t bytes, bool handed_over) {
    calls.push_back(said(handed_over ? "fill handed" : "fill", c));
    if (fail_fill) throw std::runtime_error("source failed");
    store->engine_.copy_async(dev, host, bytes, tide::memory::copy_direction::host_to_device, store->ready_[c]);
  }
  bool holds_parameters(std::uint32_t) { return true; }
  void before_copy_out(std::uint32_t id) { calls.push_back(said("before_copy_out", id)); }
  void released(std::uint32_t c) noexcept { calls.push_back(said("released", c)); }
  bool reclaim_ring_block(std::byte*) noexcept { return false; }
};

}  // namespace

TEST_CASE("chunk_store on sealed: fetch, copy out and hand-over move the bytes; a refused block asks the owner; "
          "a failed fill leaves the chunk where it was") {
  namespace mem = tide::memory;
  model m;
  REQUIRE(m.layout.chunks() == 4);
  tide::thread_pool pool{1};
  mem::stream<tide::sealed> compute;
  tide::exec<tide::sealed> const ex{pool, compute};
  std::size_t const block = tide::round_up(m.lists[2].chunk_bytes(), 256);
  mem::device_arena<tide::sealed> arena{{.budget = 2 * block}};  // room for two chunks
  tide::block_uses uses{0, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}};
  store_owner owner;
  store_owner::store_t st(owner, ex, arena, m.params, uses, m.layout, 0, {}, {.lock_pages = false});
  owner.store = &st;
  std::size_t const elems = st.param_[0].capacity() / sizeof(float);
  auto host_of = [&](std::uint32_t c) { return reinterpret_cast<float*>(st.param_[c].payload()); };
  for (std::uint32_t c = 0; c < 4; ++c)  // host tier: the host writes it
    for (std::size_t k = 0; k < elems; ++k) host_of(c)[k] = static_cast<float>(100 * c + k);
  auto device_values = [&](std::uint32_t c) {
    std::vector<float> out(elems);
    mem::read_to_host(ex, out.data(), st.param_[c].payload(), elems * sizeof(float));
    return out;
  };
  auto expected = [&](std::uint32_t c, float plus) {
    std::vector<float> v(elems);
    for (std::size_t k = 0; k < elems; ++k) v[k] = static_cast<float>(100 * c + k) + plus;
    return v;
  };

  // Chunk 0 to the device: the fill copies on the copy stream; the host copy is kept (clean).
  ids const protect0{0};
  st.fetch(0, 0, protect0);
  st.settle(0);
  CHECK(owner.calls == strings{"before_fetch 0", "fill 0", "fetched 0"});
  CHECK(st.on_device(0));
  CHECK(device_values(0) == expected(0, 0));

  // A failed fill: the device block goes back to the arena, the chunk keeps its host block.
  owner.calls.clear();
  owner.fail_fill = true;
  std::size_t const in_use = arena.stats().in_use;
  ids const protect1{1};
  CHECK_THROWS_AS(st.fetch(1, 0, protect1), std::runtime_error);
  owner.fail_fill = false;
  CHECK_FALSE(st.on_device(1));
  CHECK(arena.stats().in_use == in_use);
  CHECK(std::equal(host_of(1), host_of(1) + elems, expected(1, 0).begin()));

  // Chunk 1 fetched; a kernel then changes it on the device (queued on the compute stream).
  st.fetch(1, 0, protect1);
  st.settle(1);
  std::vector<float> const changed = expected(1, 0.5f);
  compute.launch_owned([a = tide::unseal(reinterpret_cast<float*>(st.param_[1].payload())), &changed] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a late kernel
    std::copy(changed.begin(), changed.end(), a);
  });
  st.drop_shadow(1);  // its host copy is stale now

  // Chunk 2: the arena is full, so the store asks its owner, which names chunk 1. Chunk 1 is
  // copied out after the compute stream's write (an event, not the host having waited), and
  // chunk 0, clean, would have needed no copy.
  owner.calls.clear();
  owner.victim = 1;
  ids const protect2{2};
  st.fetch(2, 0, protect2);
  st.settle(1);
  st.settle(2);
  CHECK(owner.calls == strings{"before_fetch 2", "victim 1", "before_copy_out 1", "released 1", "fill 2",
                               "fetched 2"});
  CHECK_FALSE(st.on_device(1));
  CHECK(std::equal(host_of(1), host_of(1) + elems, changed.begin()));
  CHECK(device_values(2) == expected(2, 0));

  // A hand-over: chunk 0 (clean: dropped, no copy) is evicted and its stale block taken for chunk
  // 3, whose fill is told it was handed one.
  owner.calls.clear();
  st.evict(0);
  std::byte* const handed = st.take_stale(0, 3);
  ids const protect3{3};
  st.fetch_into(3, 0, protect3, 0, handed);
  st.settle(3);
  CHECK(owner.calls == strings{"before_copy_out 0", "released 0", "before_fetch 3", "fill handed 3", "fetched 3"});
  CHECK(st.cur_.clean_drops == 1);
  CHECK(device_values(3) == expected(3, 0));
  CHECK(std::equal(host_of(0), host_of(0) + elems, expected(0, 0).begin()));

  // abort(): every tensor back to HOLD.
  st.param_.transition(0, tide::chunk::tensor_state::compute);
  st.abort();
  CHECK(st.param_.tensor(0).state == tide::chunk::tensor_state::hold);
  compute.synchronize();
  st.free_all();
  CHECK(arena.stats().in_use == 0);
}
