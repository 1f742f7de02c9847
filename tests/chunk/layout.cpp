#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/chunk/layout.hpp>
#include <tide/nn/gpt.hpp>

using tide::dtype;
using tide::chunk::chunk_layout;
using tide::chunk::pack;
using tide::chunk::pack_mode;
using tide::parameter_list;

namespace {

parameter_list small_gpt() {
  return tide::nn::gpt_parameters({.layers = 4, .heads = 4, .channels = 64, .vocab = 256, .max_seq = 64}, dtype::f32);
}

std::size_t numel(parameter_list const& ps, std::size_t i) { return static_cast<std::size_t>(ps[i].numel()); }

// Elements a layer's block spans from offset 0 (aligned offsets, the last tensor unpadded).
std::size_t span_of(parameter_list const& ps, int layer, std::size_t align) {
  std::size_t end = 0;
  for (auto const& p : ps.layer(layer)) end = tide::round_up(end, align) + static_cast<std::size_t>(p.numel());
  return end;
}

// What every layout must satisfy, whatever the mode.
void check_invariants(parameter_list const& ps, chunk_layout const& l) {
  std::size_t const n = ps.size(), C = l.chunk_elements, a = l.alignment_elements;
  REQUIRE(l.chunk_of.size() == n);
  REQUIRE(l.offset_of.size() == n);
  REQUIRE(l.first_param.size() == l.chunks() + 1);
  CHECK(l.first_param.front() == 0);
  CHECK(l.first_param.back() == n);
  std::size_t used = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(ps[i].name());
    used += numel(ps, i);
    CHECK(l.chunk_of[i] < l.chunks());
    CHECK(l.offset_of[i] % a == 0);
    CHECK(l.offset_of[i] + numel(ps, i) <= C);  // inside its chunk
    CHECK(l.first_param[l.chunk_of[i]] <= i);
    CHECK(i < l.first_param[l.chunk_of[i] + 1]);
    if (i == 0) {
      CHECK(l.chunk_of[i] == 0);
      CHECK(l.offset_of[i] == 0);
    } else if (l.chunk_of[i] == l.chunk_of[i - 1]) {
      CHECK(l.offset_of[i] >= l.offset_of[i - 1] + numel(ps, i - 1));  // no overlap, registration order
    } else {
      CHECK(l.chunk_of[i] == l.chunk_of[i - 1] + 1);  // chunks in order, none empty
      CHECK(l.offset_of[i] == 0);
    }
  }
  CHECK(l.used_elements == used);
  CHECK(l.padding() == doctest::Approx(1.0 - static_cast<double>(used) / static_cast<double>(l.chunks() * C)));
}

// layers_together: blocks that fit a chunk are never split, and a new chunk opens only when the
// next block (or, for an oversized block, the next tensor) does not fit the open one.
void check_layers_together(parameter_list const& ps, chunk_layout const& l) {
  std::size_t const C = l.chunk_elements, a = l.alignment_elements;
  for (std::size_t b = 0; b < ps.size();) {
    int const layer = ps[b].layer;
    std::size_t const e = b + ps.layer(layer).size();
    std::size_t const span = span_of(ps, layer, a);
    CAPTURE(layer);
    if (span <= C)
      for (std::size_t i = b; i < e; ++i) CHECK(l.chunk_of[i] == l.chunk_of[b]);
    for (std::size_t i = std::max<std::size_t>(b, 1); i < e; ++i) {
      if (l.chunk_of[i] == l.chunk_of[i - 1]) continue;
      std::size_t const open_end = tide::round_up(l.offset_of[i - 1] + numel(ps, i - 1), a);
      std::size_t const needed = (i == b && span <= C) ? span : numel(ps, i);
      CHECK(open_end + needed > C);  // it did not fit: the new chunk was necessary
    }
    b = e;
  }
}

// The search's candidates, packed one by one: the least capacity (= least padding), ties to the smaller.
struct brute_result {
  std::size_t chunk_elements = 0, capacity = std::numeric_limits<std::size_t>::max(), candidates = 0;
};
brute_result brute(parameter_list const& ps, std::size_t min, std::size_t max, std::size_t step, std::size_t align,
                   std::size_t two_chunk_budget = 0, std::size_t element_bytes = 4, pack_mode mode = pack_mode::layers_together) {
  brute_result r;
  for (std::size_t c = min; c <= max; c += step) {
    if (two_chunk_budget != 0 && 2 * c * element_bytes > two_chunk_budget) break;
    ++r.candidates;
    auto const l = pack(ps, c, align, mode);
    if (l.capacity() < r.capacity) r = {c, l.capacity(), r.candidates};
  }
  return r;
}

}  // namespace

TEST_CASE("pack: a hand-made list, every branch, padding by hand") {
  parameter_list ps;
  ps.add("a", -1, {3}, dtype::f32);
  ps.add("b", -1, {5}, dtype::f32);
  ps.add("c", 0, {4}, dtype::f32);
  ps.add("d", 1, {2}, dtype::f32);
  ps.add("e", 1, {1}, dtype::f32);
  ps.add("f", 2, {7}, dtype::f32);  // layer 2 spans 8 + 8 + 3 = 19 > 12: tensor by tensor
  ps.add("g", 2, {8}, dtype::f32);
  ps.add("h", 2, {3}, dtype::f32);
  ps.add("i", 3, {1}, dtype::f32);

  SUBCASE("layers_together") {
    auto const l = pack(ps, 12, 4);
    // chunk 0: a@0 b@4 | chunk 1: c@0, then layer 1 fits after it: d@4 e@8 | chunk 2: f@0 (did not
    // fit at 12) | chunk 3: g@0 h@8 | chunk 4: i@0 (12 + 1 > 12).
    CHECK(l.chunk_of == std::vector<std::uint32_t>{0, 0, 1, 1, 1, 2, 3, 3, 4});
    CHECK(l.offset_of == std::vector<std::size_t>{0, 4, 0, 4, 8, 0, 0, 8, 0});
    CHECK(l.first_param == std::vector<std::uint32_t>{0, 2, 5, 6, 8, 9});
    CHECK(l.chunks() == 5);
    CHECK(l.used_elements == 34);
    CHECK(l.padding() == doctest::Approx(1.0 - 34.0 / 60.0));
    check_invariants(ps, l);
    check_layers_together(ps, l);
  }
  SUBCASE("layers_together, no alignment") {
    auto const l = pack(ps, 12, 1);
    // a@0 b@3 c@8 | d@0 e@2 f@3 (layer 1 + f fit: 2 + 1 + 7 = 10) | g@0 h@8 | i@0 (11 + 1 = 12 fits) -> 3 chunks
    CHECK(l.chunk_of == std::vector<std::uint32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2});
    CHECK(l.offset_of == std::vector<std::size_t>{0, 3, 8, 0, 2, 3, 0, 8, 11});
    CHECK(l.padding() == doctest::Approx(1.0 - 34.0 / 36.0));
    check_invariants(ps, l);
    check_layers_together(ps, l);
  }
  SUBCASE("one_layer_per_chunk") {
    auto const l = pack(ps, 20, 4, pack_mode::one_layer_per_chunk);
    CHECK(l.chunk_of == std::vector<std::uint32_t>{0, 0, 1, 2, 2, 3, 3, 3, 4});
    CHECK(l.offset_of == std::vector<std::size_t>{0, 4, 0, 0, 4, 0, 8, 16, 0});
    CHECK(l.padding() == doctest::Approx(1.0 - 34.0 / 100.0));
    check_invariants(ps, l);
    try {
      (void)pack(ps, 18, 4, pack_mode::one_layer_per_chunk);  // layer 2 spans 19
      FAIL("a block larger than a chunk did not throw");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      // In bytes, as chunk_bytes is given (f32: 4 B per element), the elements beside.
      CHECK(e.message().find("layer 2") != std::string::npos);
      CHECK(e.message().find("\"f\"") != std::string::npos);
      CHECK(e.message().find("spans 76 B (19 elements of f32)") != std::string::npos);
      CHECK(e.message().find("chunk_bytes = 72 B (18 elements of f32)") != std::string::npos);
      CHECK(e.message().find("pass chunk_bytes >= 76 B") != std::string::npos);
    }
  }
  SUBCASE("a tensor larger than a chunk") {
    try {
      (void)pack(ps, 7, 4);
      FAIL("a tensor larger than a chunk did not throw");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      CHECK(e.message().find("\"g\" takes 32 B (8 elements of f32)") != std::string::npos);
      CHECK(e.message().find("but chunk_bytes = 28 B (7 elements of f32)") != std::string::npos);
      CHECK(e.message().find("pass chunk_bytes >= 32 B") != std::string::npos);
    }
    parameter_list half;  // the same shapes in bf16: 2 B per element
    for (auto const& p : ps) half.add(p.name(), p.layer, p.shape, dtype::bf16);
    try {
      (void)pack(half, 7, 4);
      FAIL("a tensor larger than a chunk did not throw");
    } catch (tide::error const& e) {
      CHECK(e.message().find("\"g\" takes 16 B (8 elements of bf16)") != std::string::npos);
      CHECK(e.message().find("but chunk_bytes = 14 B (7 elements of bf16)") != std::string::npos);
      CHECK(e.message().find("pass chunk_bytes >= 16 B") != std::string::npos);
    }
    CHECK_NOTHROW((void)pack(ps, 8, 4));
    CHECK_THROWS_AS((void)pack(ps, 12, 0), tide::error);  // alignment 0
  }
  SUBCASE("an empty list packs into no chunks") {
    auto const l = pack(parameter_list{}, 0);
    CHECK(l.chunks() == 0);
    CHECK(l.padding() == 0.0);
  }
}

TEST_CASE("pack: a small GPT, many chunk sizes and alignments") {
  auto const ps = small_gpt();
  for (std::size_t align : {std::size_t{1}, std::size_t{64}, std::size_t{100}})
    for (std::size_t C : {std::size_t{16384}, std::size_t{20000}, std::size_t{50000}, std::size_t{65536},
                          std::size_t{1} << 17, std::size_t{1} << 20}) {
      CAPTURE(align);
      CAPTURE(C);
      std::size_t const rounded = tide::round_up(C, align);  // 16384 is not a multiple of 100 etc.
      if (rounded != C && align == 100) continue;            // keep sizes the test states
      auto const l = pack(ps, C, align);
      CHECK(l.chunk_elements == C);
      CHECK(l.alignment_elements == align);
      check_invariants(ps, l);
      check_layers_together(ps, l);
    }
  // A chunk of the whole model holds everything in one.
  CHECK(pack(ps, 1 << 20).chunks() == 1);

  SUBCASE("too small: names the largest tensor and the smallest valid size") {
    try {
      (void)pack(ps, 1000);
      FAIL("a too-small chunk did not throw");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      CHECK(e.message().find("\"wte\" takes 65536 B (64.00 KiB; 16384 elements of f32)") != std::string::npos);
      CHECK(e.message().find("but chunk_bytes = 4000 B (3.91 KiB; 1000 elements of f32)") != std::string::npos);
      CHECK(e.message().find("pass chunk_bytes >= 65536 B") != std::string::npos);
    }
  }
  SUBCASE("one_layer_per_chunk: each layer in its own chunk") {
    std::size_t largest = 0;
    for (int layer = -1; layer <= 4; ++layer) largest = std::max(largest, span_of(ps, layer, 64));
    auto const l = pack(ps, largest, 64, pack_mode::one_layer_per_chunk);
    check_invariants(ps, l);
    CHECK(l.chunks() == 6);  // embeddings, 4 blocks, head
    for (std::size_t i = 1; i < ps.size(); ++i)
      CHECK((l.chunk_of[i] == l.chunk_of[i - 1]) == (ps[i].layer == ps[i - 1].layer));
    CHECK_THROWS_AS((void)pack(ps, largest - 1, 64, pack_mode::one_layer_per_chunk), tide::error);
    // With room for two blocks, layers_together shares chunks between layers; this mode does not.
    CHECK(pack(ps, 2 * largest, 64, pack_mode::one_layer_per_chunk).chunks() == 6);
    CHECK(pack(ps, 2 * largest, 64).chunks() < 6);
  }
}

TEST_CASE("search_chunk_size: the least padding among explicit candidates, as a brute-force loop finds") {
  auto const ps = small_gpt();
  tide::chunk::chunk_search_options const o{.min_elements = 16384, .max_elements = 16384 + 300 * 256, .step_elements = 256};
  auto const found = tide::chunk::search_chunk_size(ps, o);
  auto const expect = brute(ps, 16384, 16384 + 300 * 256, 256, 64);
  CHECK(found.layout.chunk_elements == expect.chunk_elements);
  CHECK(found.layout.capacity() == expect.capacity);
  CHECK(found.candidates == 301);
  CHECK(found.padding == doctest::Approx(found.layout.padding()));
  check_invariants(ps, found.layout);
  // No candidate does better.
  for (std::size_t c = 16384; c <= 16384 + 300 * 256; c += 256) CHECK(pack(ps, c).padding() >= found.padding - 1e-12);
}

TEST_CASE("search_chunk_size: ties go to the smaller size") {
  parameter_list ps;
  for (char const* name : {"a", "b", "c", "d"}) ps.add(name, name[0] - 'a', {4}, dtype::f32);
  // Capacities: 4 -> 4 x 4, 8 -> 2 x 8, 12 -> 2 x 12, 16 -> 1 x 16: three sizes without padding.
  auto const found = tide::chunk::search_chunk_size(
      ps, {.min_elements = 4, .max_elements = 16, .step_elements = 4, .alignment_elements = 1});
  CHECK(found.layout.chunk_elements == 4);
  CHECK(found.padding == 0.0);
  CHECK(found.candidates == 4);
  auto const from8 = tide::chunk::search_chunk_size(
      ps, {.min_elements = 8, .max_elements = 16, .step_elements = 4, .alignment_elements = 1});
  CHECK(from8.layout.chunk_elements == 8);
}

TEST_CASE("search_chunk_size: defaults sweep from the largest tensor to the whole model") {
  auto const ps = small_gpt();
  auto const found = tide::chunk::search_chunk_size(ps, {});
  // Brute force on the default grid (from 16384, the largest tensor, in steps of 64 * 16) until one
  // chunk holds the model: larger sizes only add padding.
  brute_result best;
  for (std::size_t c = 16384; c <= (std::size_t{1} << 20); c += 1024) {  // the model is < 2^20 elements
    auto const l = pack(ps, c);
    if (l.capacity() < best.capacity) best = {c, l.capacity(), 0};
    if (l.chunks() == 1) break;
  }
  CHECK(found.layout.chunk_elements == best.chunk_elements);
  CHECK(found.layout.capacity() == best.capacity);
  CHECK(found.padding <= 0.05);
  MESSAGE("small GPT {4,4,64,256,max_seq 64}, no budget: ", found.layout.chunk_elements, " elements x ",
          found.layout.chunks(), " chunks, padding ", found.padding * 100, " %");
}

TEST_CASE("search_chunk_size: two_chunk_budget bounds the size") {
  auto const ps = small_gpt();
  std::size_t const budget = 2 * 4 * 40000;  // f32 chunks of at most 40000 elements
  auto const found = tide::chunk::search_chunk_size(ps, {.element_bytes = 4, .two_chunk_budget = budget});
  CHECK(2 * found.layout.chunk_elements * 4 <= budget);
  auto const expect = brute(ps, 16384, std::numeric_limits<std::size_t>::max() / 2, 1024, 64, budget, 4);
  CHECK(found.layout.chunk_elements == expect.chunk_elements);
  CHECK(found.layout.capacity() == expect.capacity);
  CHECK(found.candidates == expect.candidates);
  // The budget mattered: unbounded, the search picks a larger chunk.
  CHECK(tide::chunk::search_chunk_size(ps, {}).layout.chunk_elements > 40000);
  MESSAGE("small GPT, two chunks <= 320000 B: ", found.layout.chunk_elements, " elements, padding ",
          found.padding * 100, " %");

  SUBCASE("bf16 lists: half the bytes per element allow twice the elements") {
    auto const bf = tide::chunk::search_chunk_size(ps, {.element_bytes = 2, .two_chunk_budget = budget});
    CHECK(2 * bf.layout.chunk_elements * 2 <= budget);
    CHECK(bf.layout.capacity() <= found.layout.capacity());
  }
  SUBCASE("one_layer_per_chunk") {
    auto const l = tide::chunk::search_chunk_size(ps, {.step_elements = 512, .mode = pack_mode::one_layer_per_chunk});
    CHECK(l.layout.chunks() == 6);
    auto const b = brute(ps, tide::round_up(span_of(ps, 0, 64), 64), l.layout.chunk_elements + 4096, 512, 64, 0, 4,
                         pack_mode::one_layer_per_chunk);
    CHECK(l.layout.chunk_elements == b.chunk_elements);
  }
}

TEST_CASE("search_chunk_size: errors say why no candidate fits") {
  auto const ps = small_gpt();
  try {
    (void)tide::chunk::search_chunk_size(ps, {.element_bytes = 4, .two_chunk_budget = 2 * 4 * 16384 - 1});
    FAIL("a budget below two of the smallest chunk did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(e.message().find("\"wte\"") != std::string::npos);
    CHECK(e.message().find("smallest valid chunk is chunk_bytes = 65536 B") != std::string::npos);
    CHECK(e.message().find("take 131072 B (128.00 KiB) but two_chunk_budget is 131071 B") != std::string::npos);
    CHECK(e.message().find("raise two_chunk_budget to at least 131072 B") != std::string::npos);
    CHECK(e.message().find("set chunk_bytes >= 65536 B") != std::string::npos);
  }
  CHECK_NOTHROW((void)tide::chunk::search_chunk_size(ps, {.element_bytes = 4, .two_chunk_budget = 2 * 4 * 16384}));
  try {
    (void)tide::chunk::search_chunk_size(ps, {.max_elements = 10000});
    FAIL("a max below the largest tensor did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("max_elements = 10000 (40000 B of f32)") != std::string::npos);
    CHECK(e.message().find("chunk_bytes = 65536 B (64.00 KiB; 16384 elements of f32)") != std::string::npos);
    CHECK(e.message().find("\"wte\" needs 65536 B") != std::string::npos);
  }
  CHECK_THROWS_AS((void)tide::chunk::search_chunk_size(parameter_list{}, {}), tide::error);
  CHECK_THROWS_AS((void)tide::chunk::search_chunk_size(ps, {.alignment_elements = 0}), tide::error);
}

TEST_CASE("search_chunk_size: GPT-2 124M pads at most 5%") {
  auto const ps = tide::nn::gpt_parameters({12, 12, 768, 50257, 50304, 1024}, dtype::bf16);
  auto const found = tide::chunk::search_chunk_size(ps, {.element_bytes = 4});
  check_invariants(ps, found.layout);
  check_layers_together(ps, found.layout);
  CHECK(found.padding <= 0.05);
  CHECK(found.layout.chunk_elements >= 50304 * 768);  // wte
  MESSAGE("GPT-2 124M: ", found.layout.chunk_elements, " elements x ", found.layout.chunks(), " chunks, padding ",
          found.padding * 100, " %, ", found.candidates, " candidates");
}
