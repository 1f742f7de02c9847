#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include <tide/memory/lifetime_planner.hpp>

// Every global operator new in this program is counted, so a test can prove a replan allocates
// nothing. new[] and the nothrow forms forward to these two.
namespace {
std::atomic<std::size_t> allocations{0};
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t n, std::align_val_t al) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  auto const a = static_cast<std::size_t>(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using tide::memory::find_conflict;
using tide::memory::lifetime_planner;
using tide::memory::memory_plan;
using tide::memory::op_index;
using tide::memory::tensor_id;

namespace {

// splitmix64: the same cases on every platform.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
};

tensor_id id(std::uint32_t i) { return tensor_id{i}; }

// prefix + i + suffix, by append: g++ 12 -O3 warns falsely on "t" + std::to_string(i).
std::string numbered(char const* prefix, int i, char const* suffix = "") {
  std::string s(prefix);
  s.append(std::to_string(i)).append(suffix);
  return s;
}

// The optimal footprint: the minimum over insertion orders of first fit at the lowest offset.
// Exact: first fit in the order of an optimal placement's offsets puts each tensor no higher
// than that placement did (the tensors below it ended below its offset); repeating this
// reaches a placement that first fit reproduces from its own offset order, so only orders in
// which first-fit offsets never decrease need searching. Depth-first with pruning, on plain
// arrays (the planner's accessors check ids, slow in a search of up to 7! orders).
struct brute_force {
  std::size_t n;
  std::size_t lower_bound;
  std::vector<std::size_t> bytes, alignment;
  std::vector<std::vector<char>> overlap;  // of lifetimes
  std::size_t best = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> best_offsets{}, offsets = std::vector<std::size_t>(n);
  std::vector<std::uint32_t> placed{};
  std::vector<bool> used = std::vector<bool>(n);

  brute_force(lifetime_planner const& p, std::size_t peak_live)
      : n(p.size()), lower_bound(peak_live), bytes(n), alignment(n), overlap(n, std::vector<char>(n)) {
    for (std::uint32_t i = 0; i < n; ++i) {
      bytes[i] = p.bytes(id(i));
      alignment[i] = p.alignment(id(i));
      for (std::uint32_t j = 0; j < n; ++j) overlap[i][j] = p.lifetimes_overlap(id(i), id(j));
    }
    search(0, 0);
  }

  // The lowest feasible offset for t is 0 or the end of a placed tensor rounded up to t's
  // alignment, so those candidates suffice.
  std::size_t first_fit(std::uint32_t t) const {
    auto fits = [&](std::size_t o) {
      for (std::uint32_t j : placed)
        if (overlap[t][j] && o < offsets[j] + bytes[j] && offsets[j] < o + bytes[t]) return false;
      return true;
    };
    if (fits(0)) return 0;
    std::size_t lowest = std::numeric_limits<std::size_t>::max();
    for (std::uint32_t j : placed) {
      std::size_t const o = tide::round_up(offsets[j] + bytes[j], alignment[t]);
      if (o < lowest && overlap[t][j] && fits(o)) lowest = o;
    }
    return lowest;
  }

  void search(std::size_t footprint, std::size_t floor) {
    if (footprint >= best || best == lower_bound) return;
    if (placed.size() == n) {
      best = footprint;
      best_offsets = offsets;
      return;
    }
    for (std::uint32_t t = 0; t < n; ++t) {
      if (used[t]) continue;
      offsets[t] = first_fit(t);
      if (offsets[t] < floor) continue;
      used[t] = true;
      placed.push_back(t);
      search(std::max(footprint, offsets[t] + bytes[t]), offsets[t]);
      placed.pop_back();
      used[t] = false;
    }
  }
};

// Sizes of random tensors: multiples of 64 B; any number of bytes; any number of bytes with a
// per-tensor alignment of 1 B to 512 B.
enum class sizes { multiples_of_64, any, any_with_own_alignment };

// n random tensors over ops [0, ops), 1 B to 2 KiB each, lifetimes up to half the ops.
void random_tensors(lifetime_planner& p, rng& r, int n, op_index ops, sizes kind) {
  p.clear();
  for (int i = 0; i < n; ++i) {
    auto const first = static_cast<op_index>(r.between(0, ops - 1));
    auto const last = static_cast<op_index>(std::min<std::int64_t>(ops - 1, first + r.between(0, ops / 2)));
    std::size_t const bytes = kind == sizes::multiples_of_64 ? 64 * static_cast<std::size_t>(r.between(1, 32))
                                                             : static_cast<std::size_t>(r.between(1, 2048));
    std::size_t const alignment = kind == sizes::any_with_own_alignment ? std::size_t{1} << r.between(0, 9) : 0;
    p.add({.name = numbered("t", i), .bytes = bytes, .first_use = first, .last_use = last, .alignment = alignment});
  }
}

}  // namespace

TEST_CASE("disjoint lifetimes share offset 0") {
  lifetime_planner p;
  auto a = p.add("a", 1000, 0, 1);
  auto b = p.add("b", 500, 2, 3);
  auto c = p.add("c", 2000, 4, 5);
  memory_plan const plan = p.plan();
  CHECK(plan.offset(a) == 0);
  CHECK(plan.offset(b) == 0);
  CHECK(plan.offset(c) == 0);
  CHECK(plan.footprint() == 2000);
  CHECK(plan.peak_live() == 2000);
  CHECK(plan.ratio() == doctest::Approx(1.0));
  CHECK_NOTHROW(check(plan));
}

TEST_CASE("nested lifetimes: the inner ones share the space above the outer one") {
  lifetime_planner p;
  auto outer = p.add("outer", 1024, 0, 10);
  auto in1 = p.add("inner.1", 512, 2, 3);
  auto in2 = p.add("inner.2", 512, 5, 6);
  auto in3 = p.add("inner.3", 256, 3, 5);  // overlaps both inner ones
  memory_plan const plan = p.plan();
  CHECK(plan.offset(outer) == 0);
  CHECK(plan.offset(in1) == 1024);
  CHECK(plan.offset(in2) == 1024);
  CHECK(plan.offset(in3) == 1536);
  CHECK(plan.footprint() == 1792);
  CHECK(plan.peak_live() == 1792);  // ops 3 and 5: outer + one inner + inner.3
  CHECK_NOTHROW(check(plan));
}

TEST_CASE("offsets respect the planner's alignment and each tensor's own") {
  lifetime_planner p;  // 256 B
  auto a = p.add("a", 100, 0, 1);
  auto b = p.add("b", 100, 0, 1);
  auto c = p.add({.name = "c", .bytes = 10, .first_use = 0, .last_use = 1, .alignment = 1024});
  auto d = p.add({.name = "d", .bytes = 300, .first_use = 1, .last_use = 1, .alignment = 1});
  memory_plan const plan = p.plan();
  // Largest first: d at 0 (its alignment is 1), then a at 512 = round_up(300, 256), b at 768,
  // c above all of them at a multiple of 1024.
  CHECK(plan.offset(d) == 0);
  CHECK(plan.offset(a) == 512);
  CHECK(plan.offset(b) == 768);
  CHECK(plan.offset(c) == 1024);
  CHECK(plan.footprint() == 1034);
  CHECK(plan.peak_live() == 510);
  CHECK_NOTHROW(check(plan));

  lifetime_planner unaligned(1);
  unaligned.add("x", 3, 0, 0);
  auto y = unaligned.add("y", 3, 0, 0);
  CHECK(unaligned.plan().offset(y) == 3);
}

TEST_CASE("a tensor goes to the smallest gap that holds it, not the lowest") {
  lifetime_planner p(1);
  auto t0 = p.add("t0", 600, 1, 2);
  auto t1 = p.add("t1", 100, 1, 3);
  auto t2 = p.add("t2", 300, 0, 1);
  auto t3 = p.add("t3", 100, 2, 2);
  auto t4 = p.add("t4", 1000, 0, 1);
  memory_plan const plan = p.plan();
  CHECK(plan.offset(t4) == 0);
  CHECK(plan.offset(t0) == 1000);
  CHECK(plan.offset(t2) == 1600);
  CHECK(plan.offset(t1) == 1900);
  // At op 2 the gaps are [0, 1000) and [1600, 1900): best fit takes the second; first fit
  // would take offset 0.
  CHECK(plan.offset(t3) == 1600);
  CHECK(plan.footprint() == 2000);
  CHECK_NOTHROW(check(plan));
}

TEST_CASE("an empty planner plans an empty buffer") {
  lifetime_planner p;
  memory_plan const plan = p.plan();
  CHECK(plan.size() == 0);
  CHECK(plan.footprint() == 0);
  CHECK(plan.peak_live() == 0);
  CHECK(plan.ratio() == 1.0);
}

TEST_CASE("bad input is a usage error naming the tensor, and changes nothing") {
  lifetime_planner p;
  p.add("kept", 64, 0, 0);
  auto expect_usage = [&](auto&& f, char const* fragment) {
    try {
      f();
      FAIL("did not throw");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      CHECK_MESSAGE(e.message().find(fragment) != std::string::npos, e.message());
    }
    CHECK(p.size() == 1);
    CHECK(p.name(id(0)) == "kept");
  };
  expect_usage([&] { p.add("attn.qkv", 64, 5, 3); }, "\"attn.qkv\"): last_use 3 is before first_use 5");
  expect_usage([&] { p.add("ln1.mean", 0, 0, 1); }, "\"ln1.mean\"): 0 bytes");
  expect_usage([&] { p.add({.name = "fch", .bytes = 8, .first_use = 0, .last_use = 1, .alignment = 96}); },
               "\"fch\"): alignment 96 is not a power of two");
  expect_usage([&] { p.resize(id(0), 0); }, "resize(\"kept\"): 0 bytes");
  expect_usage([&] { p.resize(id(7), 8); }, "tensor id 7 but the planner holds 1");
  expect_usage([&] { (void)p.replan(std::vector<std::size_t>{1, 2}); }, "2 sizes for 1 tensors");
  expect_usage([&] { (void)p.replan(std::vector<std::size_t>{0}); }, "0 bytes for \"kept\"");
  CHECK(p.bytes(id(0)) == 64);

  try {
    lifetime_planner bad(100);
    FAIL("did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("alignment 100 is not a power of two") != std::string::npos);
  }
}

TEST_CASE("find_conflict and check catch broken placements") {
  lifetime_planner p;
  p.add("a", 512, 0, 2);
  p.add("b", 512, 2, 4);
  p.add("c", 512, 3, 4);
  std::vector<std::size_t> offsets{0, 0, 512};  // a and b share op 2 and bytes [0, 512)
  auto conflict = find_conflict(p, offsets);
  REQUIRE(conflict.has_value());
  CHECK(conflict->first == id(0));
  CHECK(conflict->second == id(1));

  offsets = {0, 512, 0};  // valid: a and c never live together
  CHECK_FALSE(find_conflict(p, offsets).has_value());
  offsets = {0, 512, 1100};  // c clear of b but off its 256 B alignment
  conflict = find_conflict(p, offsets);
  REQUIRE(conflict.has_value());
  CHECK(conflict->first == id(2));
  CHECK(conflict->second == id(2));
  CHECK_THROWS_AS((void)find_conflict(p, std::vector<std::size_t>{0}), tide::error);
}

TEST_CASE("greedy against the brute-force optimum on small random instances") {
  // 450 instances of 2 to 7 tensors over 8 ops, in three kinds (by `k % 3`):
  //   0: alignment 1, multiples of 64 B: the pure interval problem
  //   1: alignment 256, any size: the realistic case
  //   2: any size, each tensor with its own alignment of 1 B to 512 B
  // With alignment, most misses are which tensor's padding ends up on top, so kinds 1 and 2
  // are also counted "within one alignment" (the largest of the instance) of the optimum.
  rng r{42};
  int cases[3] = {}, optimal[3] = {}, near[3] = {};
  double worst = 1.0;
  for (int k = 0; k < 450; ++k) {
    int const kind = k % 3;
    lifetime_planner p(kind == 1 ? 256 : 1);
    random_tensors(p, r, static_cast<int>(r.between(2, 7)), 8, static_cast<sizes>(kind));
    memory_plan const plan = p.plan();
    REQUIRE_FALSE(find_conflict(p, plan.offsets()).has_value());
    std::size_t const greedy = plan.footprint();
    std::size_t const peak = plan.peak_live();

    brute_force const bf(p, peak);
    REQUIRE_FALSE(find_conflict(p, bf.best_offsets).has_value());
    CHECK(bf.best >= peak);    // the lower bound holds for any placement
    CHECK(greedy >= bf.best);  // nothing beats the optimum (checks the brute force too)
    std::size_t alignment = 1;
    for (std::uint32_t i = 0; i < p.size(); ++i) alignment = std::max(alignment, p.alignment(id(i)));
    ++cases[kind];
    optimal[kind] += greedy == bf.best;
    near[kind] += greedy <= bf.best + alignment;
    worst = std::max(worst, static_cast<double>(greedy) / static_cast<double>(bf.best));
  }
  MESSAGE("greedy = optimum in ", optimal[0], ", ", optimal[1], ", ", optimal[2], " of ", cases[0],
          " per kind; within one alignment in ", near[1], ", ", near[2], "; worst greedy/optimum ", worst);
  // Measured: optimum in 146, 70, 61 of 150; within one alignment 142, 143; worst 1.45.
  // Stated bounds, with margin:
  CHECK(optimal[0] * 100 >= cases[0] * 90);
  CHECK(near[1] * 100 >= cases[1] * 90);
  CHECK(near[2] * 100 >= cases[2] * 90);
  CHECK(worst <= 1.75);
}

TEST_CASE("randomized: every plan is valid, never below peak live, footprint is the highest end") {
  rng r{7};
  lifetime_planner p;
  for (int k = 0; k < 3000; ++k) {
    random_tensors(p, r, static_cast<int>(r.between(1, 40)), static_cast<op_index>(r.between(1, 60)),
                   static_cast<sizes>(k % 3));
    memory_plan const plan = p.plan();
    REQUIRE_FALSE(find_conflict(p, plan.offsets()).has_value());
    std::size_t top = 0, sum = 0;
    for (std::uint32_t i = 0; i < p.size(); ++i) {
      top = std::max(top, plan.offset(id(i)) + p.bytes(id(i)));
      sum += p.bytes(id(i));
    }
    REQUIRE(plan.footprint() == top);
    REQUIRE(plan.footprint() >= plan.peak_live());
    REQUIRE(plan.peak_live() <= sum);
  }
}

TEST_CASE("peak_live is the largest sum of bytes live at one op") {
  lifetime_planner p;
  p.add("a", 100, 0, 3);
  p.add("b", 200, 4, 5);  // starts the op after a ends: never live together
  p.add("c", 50, 3, 4);
  p.add("d", 30, -2, 0);  // negative op indices are fine
  // op 0: a+d = 130; op 3: a+c = 150; op 4: b+c = 250; op 5: b = 200.
  CHECK(p.plan().peak_live() == 250);
}

TEST_CASE("replan and re-adding the same number of tensors allocate nothing") {
  lifetime_planner p;
  std::vector<std::string> names;  // built outside the counted region
  for (int l = 0; l < 12; ++l)
    for (char const* suffix : {".ln1", ".attn.qkv", ".attn.scores"})
      names.push_back(numbered("transformer.layer.", l, suffix));
  auto add_all = [&] {
    for (int l = 0; l < 12; ++l) {
      auto const k = static_cast<std::size_t>(3 * l);
      p.add(names[k], 1000, 3 * l, 3 * l + 90);
      p.add(names[k + 1], 3000, 3 * l + 1, 3 * l + 80);
      p.add(names[k + 2], 5000, 3 * l + 1, 3 * l + 2);
    }
  };
  add_all();
  std::vector<std::size_t> sizes_a, sizes_b;
  for (std::size_t i = 0; i < p.size(); ++i) {
    sizes_a.push_back(100 + 37 * i);
    sizes_b.push_back(5000 - 11 * i);
  }
  memory_plan first = p.plan();
  std::size_t const footprint_first = first.footprint();

  std::size_t const before = allocations.load();
  memory_plan const a = p.replan(sizes_a);  // a new sequence length
  bool const a_valid = !find_conflict(p, a.offsets()).has_value();
  memory_plan const b = p.replan(sizes_b);
  bool const b_valid = !find_conflict(p, b.offsets()).has_value();
  p.resize(id(0), 77);
  (void)p.plan();
  p.clear();
  add_all();  // the same tensors again: names, records and scratch fit the kept storage
  memory_plan const again = p.plan();
  std::size_t const after = allocations.load();

  CHECK(after == before);
  CHECK(a_valid);
  CHECK(b_valid);
  CHECK(again.footprint() == footprint_first);

  // The counter does see the planner's allocations: growing past the kept capacity allocates.
  for (int i = 0; i < 40; ++i) p.add("extra", 64, 0, 1);
  CHECK(allocations.load() > after);
}

TEST_CASE("reserve up front: the first plan allocates nothing") {
  lifetime_planner p;
  p.reserve(64, 64 * 8);
  std::size_t const before = allocations.load();
  for (int i = 0; i < 64; ++i) p.add("t", 256 * static_cast<std::size_t>(i % 5 + 1), i, i + i % 7);
  memory_plan const plan = p.plan();
  std::size_t const after = allocations.load();
  CHECK(after == before);
  CHECK(plan.size() == 64);
  CHECK_NOTHROW(check(plan));
}
