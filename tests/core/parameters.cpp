#include <doctest/doctest.h>

#include <cstddef>
#include <iterator>
#include <ranges>
#include <string>
#include <vector>

#include <range/v3/view/chunk_by.hpp>
#include <range/v3/view/transform.hpp>

#include <tide/nn/gpt.hpp>
#include <tide/core/parameters.hpp>

using tide::dtype;
using tide::index_t;
using tide::nn::gpt_config;
using tide::layer_of;
using tide::parameter;
using tide::parameter_list;

static_assert(std::ranges::contiguous_range<parameter_list const&>);
static_assert(std::ranges::sized_range<parameter_list const&>);

TEST_CASE("parameter_list: aligned offsets, contiguous layers, lookups") {
  parameter_list list(64);
  list.add("a", -1, {3, 5}, dtype::f32);       // 60 bytes
  list.add("h0.w", 0, {7}, dtype::f32);        // at 64
  list.add("h0.b", 0, {1}, dtype::bf16);       // at 128, 2 bytes
  list.add("tail", 1, {16}, dtype::f32);       // at 192
  CHECK(list.size() == 4);
  CHECK(list[0].offset == 0);
  CHECK(list[0].bytes == 60);
  CHECK(list[1].offset == 64);
  CHECK(list[2].offset == 128);
  CHECK(list[2].bytes == 2);
  CHECK(list[3].offset == 192);
  CHECK(list.bytes() == 256);
  CHECK(list.count() == 15 + 7 + 1 + 16);
  CHECK(list.find("h0.b").shape == tide::shape(1));
  CHECK(list.layer(0).size() == 2);
  CHECK(list.layer(0).front().name() == "h0.w");
  CHECK(list.layer(5).empty());
  CHECK(list.layer_bytes(0) == tide::byte_range{64, 66});
  CHECK(list.layer_bytes(-1) == tide::byte_range{0, 60});

  SUBCASE("tie groups: one per tied parameter, numbered from 0; tying again changes nothing") {
    CHECK(list.ties() == 0);
    CHECK(list.find("a").tie == -1);
    CHECK(list.tie("tail") == 0);
    CHECK(list.tie("a") == 1);
    CHECK(list.tie("tail") == 0);
    CHECK(list.ties() == 2);
    CHECK(list.find("tail").tie == 0);
    CHECK(list.find("h0.w").tie == -1);
    CHECK_THROWS_AS((void)list.tie("nope"), tide::error);
    CHECK(list.ties() == 2);
  }

  SUBCASE("bad registrations throw and change nothing") {
    CHECK_THROWS_AS(list.add("a", 2, {1}, dtype::f32), tide::error);              // duplicate name
    CHECK_THROWS_AS(list.add("back", 0, {1}, dtype::f32), tide::error);           // layer decreases
    CHECK_THROWS_AS(list.add(std::string(40, 'x'), 2, {1}, dtype::f32), tide::error);  // name too long
    CHECK_THROWS_AS(list.add("empty", 2, {0}, dtype::f32), tide::error);
    CHECK_THROWS_AS((void)list.find("nope"), tide::error);
    CHECK(list.size() == 4);
    CHECK(list.bytes() == 256);
  }
  CHECK_THROWS_AS(parameter_list(48), tide::error);
}

TEST_CASE("gpt_parameters: names, order, shapes and layers of a tiny config") {
  gpt_config const c{.layers = 2, .heads = 2, .channels = 8, .vocab = 16, .padded_vocab = 24, .max_seq = 8};
  parameter_list const list = tide::nn::gpt_parameters(c, dtype::f32);
  std::vector<std::string> names;
  for (parameter const& p : list) names.emplace_back(p.name());
  std::vector<std::string> const expect = {
      "wte",          "wpe",          "h0.ln1.w",     "h0.ln1.b",     "h0.attn.qkv.w", "h0.attn.qkv.b",
      "h0.attn.proj.w", "h0.attn.proj.b", "h0.ln2.w", "h0.ln2.b",     "h0.mlp.fc.w",   "h0.mlp.fc.b",
      "h0.mlp.proj.w", "h0.mlp.proj.b", "h1.ln1.w",   "h1.ln1.b",     "h1.attn.qkv.w", "h1.attn.qkv.b",
      "h1.attn.proj.w", "h1.attn.proj.b", "h1.ln2.w", "h1.ln2.b",     "h1.mlp.fc.w",   "h1.mlp.fc.b",
      "h1.mlp.proj.w", "h1.mlp.proj.b", "lnf.w",      "lnf.b"};
  CHECK(names == expect);
  CHECK(list.find("wte").shape == tide::shape(24, 8));
  CHECK(list.find("wpe").shape == tide::shape(8, 8));
  CHECK(list.find("h1.attn.qkv.w").shape == tide::shape(24, 8));
  CHECK(list.find("h1.attn.qkv.b").shape == tide::shape(24));
  CHECK(list.find("h0.attn.proj.w").shape == tide::shape(8, 8));
  CHECK(list.find("h0.mlp.fc.w").shape == tide::shape(32, 8));
  CHECK(list.find("h0.mlp.fc.b").shape == tide::shape(32));
  CHECK(list.find("h0.mlp.proj.w").shape == tide::shape(8, 32));
  CHECK(list.find("lnf.b").shape == tide::shape(8));
  CHECK(layer_of(list.find("wte")) == tide::nn::embedding_block);
  CHECK(layer_of(list.find("h1.ln2.b")) == 1);
  CHECK(layer_of(list.find("lnf.w")) == tide::nn::head_block(c));
  CHECK(list.count() == tide::nn::parameter_count(c));
  // wte is tied (the embedding and the LM head read it), nothing else.
  CHECK(list.ties() == 1);
  for (parameter const& p : list) CHECK(p.tie == (p.name() == "wte" ? 0 : -1));

  // Offsets strictly increase and are aligned; each layer is one run of the list and one byte
  // range, and the ranges of consecutive layers do not overlap.
  for (std::size_t i = 0; i < list.size(); ++i) {
    CHECK(list[i].offset % list.alignment() == 0);
    CHECK(list[i].bytes == static_cast<std::size_t>(list[i].numel()) * 4);
    if (i > 0) CHECK(list[i].offset >= list[i - 1].end());
  }
  for (int l = -1; l < 2; ++l) {
    auto const a = list.layer_bytes(l), b = list.layer_bytes(l + 1);
    CHECK(a.offset + a.bytes <= b.offset);
  }
  CHECK(list.layer(0).size() == 12);
  CHECK(list.layer(-1).size() == 2);
  CHECK(list.layer(2).size() == 2);
}

TEST_CASE("gpt_parameters: range-v3 groups the list by layer") {
  gpt_config const c{.layers = 3, .heads = 2, .channels = 8, .vocab = 16, .max_seq = 8};
  parameter_list const list = tide::nn::gpt_parameters(c, dtype::f32);
  auto groups = list | ranges::views::chunk_by([](parameter const& a, parameter const& b) {
                        return layer_of(a) == layer_of(b);
                      });
  std::vector<int> layers, sizes;
  std::vector<std::size_t> bytes;
  for (auto const& g : groups) {
    layers.push_back(layer_of(*ranges::begin(g)));
    sizes.push_back(static_cast<int>(ranges::distance(g)));
    std::size_t sum = 0;
    for (parameter const& p : g) sum += p.bytes;
    bytes.push_back(sum);
  }
  CHECK(layers == std::vector<int>{-1, 0, 1, 2, 3});
  CHECK(sizes == std::vector<int>{2, 12, 12, 12, 2});
  // Every block of a config has the same bytes (12 C^2 + 13 C floats).
  CHECK(bytes[1] == (12 * 64 + 13 * 8) * 4);
  CHECK(bytes[1] == bytes[2]);
  CHECK(bytes[2] == bytes[3]);
}

TEST_CASE("parameter_count: GPT-2 124M without allocating its tensors") {
  gpt_config const gpt2{.layers = 12, .heads = 12, .channels = 768, .vocab = 50257, .max_seq = 1024};
  CHECK(tide::nn::padded_vocab_of(gpt2) == 50304);
  CHECK(tide::nn::parameter_count(gpt2) == 124'475'904);
  // The list is records only (150 of them): its count and byte size agree with the formula, and
  // GPT-2's shapes are all multiples of 64 floats, so 256-byte alignment adds no padding.
  parameter_list const list = tide::nn::gpt_parameters(gpt2, dtype::f32);
  CHECK(list.size() == 2 + 12 * 12 + 2);
  CHECK(list.count() == 124'475'904);
  CHECK(list.bytes() == 124'475'904ull * 4);
  CHECK(tide::nn::parameter_count({.layers = 48, .heads = 25, .channels = 1600, .vocab = 50257, .max_seq = 1024}) ==
        1'557'686'400);  // GPT-2 1.5B (Vp = 50304), as llm.c counts it
  CHECK(tide::nn::gpt_parameters(gpt2, dtype::bf16).bytes() == 124'475'904ull * 2);
}

TEST_CASE("gpt_config: impossible configs are refused") {
  CHECK_THROWS_AS((void)tide::nn::resolve({.layers = 0}), tide::error);
  CHECK_THROWS_AS((void)tide::nn::resolve({.heads = 5, .channels = 768}), tide::error);
  CHECK_THROWS_AS((void)tide::nn::resolve({.vocab = 100, .padded_vocab = 64}), tide::error);
  CHECK(tide::nn::resolve({.vocab = 256}).padded_vocab == 256);
  CHECK(tide::nn::resolve({.vocab = 257}).padded_vocab == 384);
}
