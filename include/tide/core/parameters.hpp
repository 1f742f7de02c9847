#pragma once
// parameter_list: the named tensors of a model, in registration order, as offsets into ONE flat
// buffer (and the same offsets into its gradient buffer). Each layer's tensors are registered
// together, so a layer is a contiguous run of the list and a contiguous byte range of the
// buffer: what a chunk packer needs.
//
//   tide::parameter_list params;                         // offsets aligned to 256 B
//   params.add("wte", -1, {Vp, C}, tide::dtype::f32);
//   params.add("h0.ln1.w", 0, {C}, tide::dtype::f32);
//   for (tide::parameter const& p : params) ... p.name(), p.shape, p.offset, p.bytes;
//   params.layer(0);                                         // std::span<parameter const>
//   params | ranges::views::chunk_by([](auto& a, auto& b) { return layer_of(a) == layer_of(b); })
//
// A parameter is a plain, trivially copyable record (its name is stored inline), so views and
// copies of the list never dangle. The list is a contiguous range: std::ranges and range-v3
// adaptors apply directly.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide {

// One named tensor of a flat parameter buffer.
struct parameter {
  static constexpr std::size_t max_name = 39;

  char label[max_name + 1] = {};  // the full name, NUL-terminated: "h3.attn.qkv.w"
  int layer = 0;                  // the block that owns it (a model defines the numbering)
  tide::shape shape{};
  dtype type = dtype::f32;
  std::size_t offset = 0;  // bytes from the start of the buffer; a multiple of the list's alignment
  std::size_t bytes = 0;   // numel * size_of(type), without padding
  // Its tie group (parameter_list::tie), or -1: every copy of a tied parameter, wherever it lives
  // (pipeline stages that both read it keep one each), holds the same values; their gradients are
  // summed and every copy takes the same step.
  int tie = -1;

  [[nodiscard]] constexpr std::string_view name() const noexcept { return label; }
  [[nodiscard]] constexpr index_t numel() const noexcept { return shape.numel(); }
  // One past the last byte: offset + bytes.
  [[nodiscard]] constexpr std::size_t end() const noexcept { return offset + bytes; }
};

static_assert(std::is_trivially_copyable_v<parameter>);

// The block a parameter belongs to (its layer index).
[[nodiscard]] constexpr int layer_of(parameter const& p) noexcept { return p.layer; }

// A byte range of the flat buffer: [offset, offset + bytes).
struct byte_range {
  std::size_t offset = 0;
  std::size_t bytes = 0;
  friend constexpr bool operator==(byte_range, byte_range) noexcept = default;
};

class parameter_list {
 public:
  static constexpr std::size_t default_alignment = 256;

  explicit parameter_list(std::size_t alignment = default_alignment) : alignment_(alignment) {
    TIDE_REQUIRE(is_power_of_two(alignment), "parameter_list: alignment ", alignment,
                 " is not a power of two; use ", default_alignment, " (the default) or another power of two");
  }

  // Appends a tensor at the next aligned offset. Layers must not decrease (a layer's tensors are
  // registered together) and names must be unique. Strong guarantee: a throw changes nothing.
  parameter const& add(std::string_view name, int layer, tide::shape shape, dtype type) {
    TIDE_REQUIRE(!name.empty() && name.size() <= parameter::max_name, "parameter_list::add(\"", name,
                 "\"): a name needs 1 to ", parameter::max_name, " characters");
    TIDE_REQUIRE(shape.rank >= 1 && shape.numel() >= 1, "parameter_list::add(\"", name,
                 "\"): a parameter needs rank >= 1 and at least one element");
    TIDE_REQUIRE(params_.empty() || layer >= params_.back().layer, "parameter_list::add(\"", name, "\"): layer ",
                 layer, " after layer ", params_.back().layer,
                 "; register each layer's tensors together, in increasing layer order");
    TIDE_REQUIRE(!contains(name), "parameter_list::add(\"", name, "\"): the name is already registered");
    parameter p;
    std::copy(name.begin(), name.end(), p.label);
    p.layer = layer;
    p.shape = shape;
    p.type = type;
    p.offset = round_up(bytes_, alignment_);
    p.bytes = static_cast<std::size_t>(shape.numel()) * size_of(type);
    params_.push_back(p);  // may throw: nothing changed yet
    bytes_ = p.end();
    count_ += shape.numel();
    return params_.back();
  }

  // Ties parameter `name` (its own group, numbered from 0): copies of it may live apart, as when
  // a pipeline puts the blocks that read it on different stages (a GPT's wte, read by the
  // embedding and the tied LM head), and stay one parameter: summed gradients, the same step. A
  // parameter read on two stages without a tie is refused there (pipeline::part_of). Returns the
  // group. Strong guarantee.
  int tie(std::string_view name) {
    auto const it = std::find_if(params_.begin(), params_.end(), [&](parameter const& p) { return p.name() == name; });
    if (it == params_.end()) (void)find(name);  // throws, naming the list's names
    if (it->tie < 0) it->tie = ties_++;
    return it->tie;
  }
  // The tie groups: each tied parameter's group is below this.
  [[nodiscard]] int ties() const noexcept { return ties_; }

  // ---- the range ----------------------------------------------------------------------------
  [[nodiscard]] auto begin() const noexcept { return params_.data(); }
  [[nodiscard]] auto end() const noexcept { return params_.data() + params_.size(); }
  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  [[nodiscard]] bool empty() const noexcept { return params_.empty(); }
  [[nodiscard]] parameter const& operator[](std::size_t i) const noexcept { return params_[i]; }
  [[nodiscard]] std::span<parameter const> all() const noexcept { return params_; }

  // ---- totals -------------------------------------------------------------------------------
  // Bytes of the flat buffer: the end of the last tensor, rounded up to the alignment.
  [[nodiscard]] std::size_t bytes() const noexcept { return round_up(bytes_, alignment_); }
  // Elements over all tensors (padding not counted).
  [[nodiscard]] index_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }

  // ---- lookups ------------------------------------------------------------------------------
  [[nodiscard]] bool contains(std::string_view name) const noexcept {
    return std::any_of(params_.begin(), params_.end(), [&](parameter const& p) { return p.name() == name; });
  }

  // Throws tide::error(usage) naming a few registered names if there is no such parameter.
  [[nodiscard]] parameter const& find(std::string_view name) const {
    for (parameter const& p : params_)
      if (p.name() == name) return p;
    TIDE_FAIL(usage, "parameter_list::find(\"", name, "\"): no such parameter among ", params_.size(),
              " (first: \"", params_.empty() ? std::string_view{} : params_.front().name(), "\", last: \"",
              params_.empty() ? std::string_view{} : params_.back().name(), "\"); names look like \"h0.attn.qkv.w\"");
  }

  // The tensors of one layer: a contiguous run of the list (empty if the layer has none).
  [[nodiscard]] std::span<parameter const> layer(int l) const noexcept {
    auto const first = std::lower_bound(params_.begin(), params_.end(), l,
                                        [](parameter const& p, int v) { return p.layer < v; });
    auto const last = std::upper_bound(first, params_.end(), l, [](int v, parameter const& p) { return v < p.layer; });
    return {params_.data() + (first - params_.begin()), static_cast<std::size_t>(last - first)};
  }

  // The bytes one layer spans in the flat buffer, from its first tensor's offset to its last
  // tensor's end ({0, 0} if the layer has none). Layers' ranges never overlap.
  [[nodiscard]] byte_range layer_bytes(int l) const noexcept {
    auto const run = layer(l);
    if (run.empty()) return {};
    return {run.front().offset, run.back().end() - run.front().offset};
  }

 private:
  std::size_t alignment_;
  std::vector<parameter> params_;
  std::size_t bytes_ = 0;
  index_t count_ = 0;
  int ties_ = 0;
};

// The parameters each block of a model reads (what an offload scheduler makes resident around
// the block): params[b - first_block] lists parameter indices. A block reads its own layer's
// parameters and, for a tied head, others.
struct block_uses {
  int first_block = 0;
  std::vector<std::vector<std::uint32_t>> params;
  // The runs of blocks that backward visits apart, as {first, last}, ascending (a pipeline stage
  // of several pieces; the blocks between runs are other stages', never visited). Empty: one run,
  // first_block .. last_block().
  std::vector<std::pair<int, int>> runs{};
  [[nodiscard]] int last_block() const noexcept { return first_block + static_cast<int>(params.size()) - 1; }
  [[nodiscard]] std::span<std::uint32_t const> of(int block) const {
    TIDE_REQUIRE(block >= first_block && block <= last_block(), "block_uses::of(", block, "): blocks are ",
                 first_block, " .. ", last_block());
    return params[static_cast<std::size_t>(block - first_block)];
  }
};

}  // namespace tide
