#pragma once
// chunk_layout: which chunk and which offset each parameter gets when a model's parameters are
// packed, in registration order, into chunks of one fixed size (PatrickStar). Every chunk list of
// a model (params, grads, optimizer state) shares one layout, so tensor i sits at the same element
// offset of the same chunk index in each of them.
//
//   auto params = tide::nn::gpt_parameters({12, 12, 768, 50257, 50304, 1024}, tide::dtype::bf16);
//   auto found = tide::chunk::search_chunk_size(params, {.element_bytes = 4, .two_chunk_budget = 1_GiB});
//   found.layout.chunks();      // 3 of 42,528,768 elements: wte + wpe | h0..h5 | h6..h11 + lnf
//   found.padding;              // 0.0244: 2.4% of the chunk elements hold no tensor
//   auto fixed = tide::chunk::pack(params, 64 << 20);                    // 64 Mi elements per chunk
//   // One chunk per block (STRONGHOLD's window); the embedding block (wte + wpe) sets the size.
//   auto window = tide::chunk::pack(params, 40 << 20, 64, tide::chunk::pack_mode::one_layer_per_chunk);
//
// Sizes are in elements, so one layout serves lists of different dtypes. Packing keeps a layer's
// tensors together when they fit one chunk: the scheduler then fetches one chunk per block.
// Errors speak in bytes as the schedulers' knob does (chunk_bytes = chunk_elements x the bytes of
// the parameters' dtype), with the elements beside.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"

namespace tide::chunk {

struct chunk_layout {
  std::size_t chunk_elements = 0;         // capacity of every chunk, elements
  std::size_t alignment_elements = 64;    // tensor offsets inside a chunk are multiples of this
  std::vector<std::uint32_t> chunk_of;    // by parameter index
  std::vector<std::size_t> offset_of;     // by parameter index: element offset inside its chunk
  std::vector<std::uint32_t> first_param; // CSR: chunk c holds params [first_param[c], first_param[c+1])
  std::size_t used_elements = 0;          // sum of numel (no padding)

  [[nodiscard]] std::size_t chunks() const noexcept { return first_param.empty() ? 0 : first_param.size() - 1; }
  // Elements of all chunks together.
  [[nodiscard]] std::size_t capacity() const noexcept { return chunks() * chunk_elements; }
  // The share of chunk elements that hold no tensor (alignment gaps and chunk tails).
  [[nodiscard]] double padding() const noexcept {
    return capacity() == 0 ? 0.0 : 1.0 - static_cast<double>(used_elements) / static_cast<double>(capacity());
  }
};

enum class pack_mode : std::uint8_t {
  layers_together,      // fill chunks; a layer's block stays in one chunk when it fits one
  one_layer_per_chunk,  // each layer gets its own chunk (STRONGHOLD's window unit)
};

namespace detail {

inline std::size_t numel_of(tide::parameter const& p) noexcept { return static_cast<std::size_t>(p.numel()); }

// "65536 B (64.00 KiB; 16384 elements of f32)": the bytes of `elements` elements of `type`, exact,
// readable from 1 KiB on, and the elements.
inline std::string bytes_text(std::size_t elements, dtype type) {
  std::size_t const n = elements * size_of(type);
  return n < 1024 ? tide::detail::concat(n, " B (", elements, " elements of ", to_string(type), ")")
                  : tide::detail::concat(n, " B (", bytes_of{n}, "; ", elements, " elements of ", to_string(type), ")");
}

// Elements the tensors [b, e) span from an aligned offset (the same from any aligned offset).
inline std::size_t block_span(std::span<tide::parameter const> ps, std::size_t b, std::size_t e, std::size_t align) noexcept {
  std::size_t end = 0;
  for (std::size_t i = b; i < e; ++i) end = round_up(end, align) + numel_of(ps[i]);
  return end;
}

// One past the last tensor of the layer that starts at b.
inline std::size_t block_end(std::span<tide::parameter const> ps, std::size_t b) noexcept {
  std::size_t e = b + 1;
  while (e < ps.size() && ps[e].layer == ps[b].layer) ++e;
  return e;
}

// The smallest chunk a mode accepts: the largest tensor, or the largest layer block, [first, last).
struct smallest_chunk {
  std::size_t elements = 0;
  std::size_t first = 0, last = 0;
};

inline smallest_chunk smallest_valid_chunk(tide::parameter_list const& params, std::size_t align, pack_mode mode) noexcept {
  smallest_chunk s;
  auto const ps = params.all();
  for (std::size_t b = 0; b < ps.size();) {
    std::size_t const e = block_end(ps, b);
    if (mode == pack_mode::one_layer_per_chunk) {
      if (std::size_t const span = block_span(ps, b, e, align); span > s.elements) s = {span, b, e};
    } else {
      for (std::size_t i = b; i < e; ++i)
        if (numel_of(ps[i]) > s.elements) s = {numel_of(ps[i]), i, i + 1};
    }
    b = e;
  }
  return s;
}

// Places every tensor and returns the number of chunks; `out` null only counts them (the inner
// loop of the search). Requires chunk_elements >= smallest_valid_chunk(...).elements.
inline std::size_t place(tide::parameter_list const& params, std::size_t chunk_elements, std::size_t align, pack_mode mode,
                         chunk_layout* out) {
  auto const ps = params.all();
  std::size_t chunks = 0, fill = 0;  // fill: one past the last tensor of the open chunk
  auto open = [&](std::size_t first) {
    ++chunks;
    fill = 0;
    if (out) out->first_param.push_back(static_cast<std::uint32_t>(first));
  };
  for (std::size_t b = 0; b < ps.size();) {
    std::size_t const e = block_end(ps, b);
    std::size_t const span = block_span(ps, b, e, align);
    bool const fits_open = chunks > 0 && round_up(fill, align) + span <= chunk_elements;
    if (mode == pack_mode::one_layer_per_chunk || (!fits_open && span <= chunk_elements)) open(b);
    // The block fits from here on, or goes tensor by tensor opening chunks as they fill.
    for (std::size_t i = b; i < e; ++i) {
      std::size_t at = round_up(fill, align);
      if (chunks == 0 || at + numel_of(ps[i]) > chunk_elements) {
        open(i);
        at = 0;
      }
      if (out) {
        out->chunk_of[i] = static_cast<std::uint32_t>(chunks - 1);
        out->offset_of[i] = at;
      }
      fill = at + numel_of(ps[i]);
    }
    b = e;
  }
  if (out) out->first_param.push_back(static_cast<std::uint32_t>(ps.size()));
  return chunks;
}

inline void check_pack(tide::parameter_list const& params, std::size_t chunk_elements, std::size_t align, pack_mode mode) {
  TIDE_REQUIRE(align >= 1, "pack: alignment_elements = 0; pass 1 for no alignment (64, the default, is 256 B of f32)");
  TIDE_REQUIRE(params.size() < std::numeric_limits<std::uint32_t>::max(), "pack: ", params.size(),
               " parameters; a layout indexes at most 2^32 - 1");
  smallest_chunk const s = smallest_valid_chunk(params, align, mode);
  if (chunk_elements >= s.elements) [[likely]]  // every tensor has >= 1 element, so this is > 0 too
    return;
  tide::parameter const& first = params[s.first];
  std::size_t const need_bytes = s.elements * size_of(first.type);
  if (mode == pack_mode::layers_together)
    TIDE_FAIL(usage, "pack: tensor \"", first.name(), "\" takes ", bytes_text(s.elements, first.type),
              " but chunk_bytes = ", bytes_text(chunk_elements, first.type),
              "; every tensor must fit one chunk: pass chunk_bytes >= ", need_bytes, " B (the smallest valid chunk, ",
              s.elements, " elements), let search_chunk_size pick the size (chunk_bytes = 0 in a scheduler), or cut "
              "the tensor into pieces that fit (a GPT's wte: nn::gpt_config::wte_pieces, nn::wte_pieces_within)");
  TIDE_FAIL(usage, "pack(one_layer_per_chunk): layer ", first.layer, "'s block (", s.last - s.first, " tensors, \"",
            first.name(), "\" .. \"", params[s.last - 1].name(), "\") spans ", bytes_text(s.elements, first.type),
            " but chunk_bytes = ", bytes_text(chunk_elements, first.type), "; pass chunk_bytes >= ", need_bytes,
            " B (the smallest valid chunk, ", s.elements, " elements), or use pack_mode::layers_together");
}

}  // namespace detail

// Packs `params` in registration order into chunks of `chunk_elements`:
//   layers_together: a layer's whole block goes into the open chunk if it fits, else opens a new
//     chunk if it fits an empty one, else goes tensor by tensor (a new chunk when one does not fit).
//   one_layer_per_chunk: every layer opens a new chunk; its block must fit one.
// Throws tide::error(usage) naming the tensor (or block) that cannot fit and the smallest valid size.
inline chunk_layout pack(tide::parameter_list const& params, std::size_t chunk_elements,
                         std::size_t alignment_elements = 64, pack_mode mode = pack_mode::layers_together) {
  detail::check_pack(params, chunk_elements, alignment_elements, mode);
  chunk_layout layout;
  layout.chunk_elements = chunk_elements;
  layout.alignment_elements = alignment_elements;
  layout.chunk_of.resize(params.size());
  layout.offset_of.resize(params.size());
  layout.used_elements = static_cast<std::size_t>(params.count());
  detail::place(params, chunk_elements, alignment_elements, mode, &layout);
  return layout;
}

struct chunk_search_options {
  std::size_t element_bytes = 4;      // of the largest list per element (for the budget check)
  std::size_t two_chunk_budget = 0;   // bytes: 2 chunks (of element_bytes) must fit; 0 = no limit
  std::size_t min_elements = 0;       // 0: the smallest valid chunk (the largest tensor, or block)
  std::size_t max_elements = 0;       // 0: min + 32 Mi elements, or the whole model if smaller
  std::size_t step_elements = 0;      // 0: alignment_elements * 16
  std::size_t alignment_elements = 64;
  pack_mode mode = pack_mode::layers_together;
};

struct chunk_search_result {
  chunk_layout layout;
  double padding = 0;          // layout.padding()
  std::size_t candidates = 0;  // sizes packed (valid and within the budget)
};

// Tries min, min + step, ... up to max (min raised to the smallest valid chunk and rounded up to
// the alignment; candidates past the budget are skipped) and keeps the least padding; ties go to
// the smaller size. 32 Mi elements of 1024-element steps are 32768 packs of O(tensors) each.
// Throws tide::error(budget) when even the smallest valid chunk breaks two_chunk_budget, and
// tide::error(usage) for an empty list or a range that holds no valid size.
inline chunk_search_result search_chunk_size(tide::parameter_list const& params, chunk_search_options const& o) {
  TIDE_REQUIRE(!params.empty(), "search_chunk_size: the parameter list is empty; register the model's parameters first");
  TIDE_REQUIRE(o.alignment_elements >= 1 && o.element_bytes >= 1, "search_chunk_size: alignment_elements = ",
               o.alignment_elements, " and element_bytes = ", o.element_bytes, "; both must be >= 1");
  std::size_t const align = o.alignment_elements;
  std::size_t const step = o.step_elements != 0 ? o.step_elements : align * 16;
  detail::smallest_chunk const s = detail::smallest_valid_chunk(params, align, o.mode);
  std::size_t const min = round_up(std::max(o.min_elements, s.elements), align);
  // The whole model in one chunk: no candidate past the first grid point that holds it helps.
  std::size_t const whole = detail::block_span(params.all(), 0, params.size(), align);
  std::size_t const whole_on_grid = whole <= min ? min : min + round_up(whole - min, step);
  std::size_t const max = o.max_elements != 0 ? o.max_elements : std::min(min + (std::size_t{32} << 20), whole_on_grid);
  tide::parameter const& first = params[s.first];
  char const* const holder = o.mode == pack_mode::layers_together ? "tensor \"" : "the block from \"";
  TIDE_REQUIRE(min <= max, "search_chunk_size: max_elements = ", max, " (", max * size_of(first.type), " B of ",
               to_string(first.type), ") is below the smallest valid chunk, chunk_bytes = ",
               detail::bytes_text(min, first.type), ": ", holder, first.name(), "\" needs ",
               detail::bytes_text(s.elements, first.type), "; raise max_elements or pass 0");
  auto const within_budget = [&](std::size_t c) { return o.two_chunk_budget == 0 || 2 * c * o.element_bytes <= o.two_chunk_budget; };
  TIDE_CHECK(within_budget(min), budget, "search_chunk_size: the smallest valid chunk is chunk_bytes = ",
             detail::bytes_text(min, first.type), ": ", holder, first.name(), "\" needs ",
             detail::bytes_text(s.elements, first.type),
             "; two chunks of it at element_bytes = ", o.element_bytes, " (the widest list) take ",
             2 * min * o.element_bytes, " B (", bytes_of{2 * min * o.element_bytes}, ") but two_chunk_budget is ",
             o.two_chunk_budget, " B (", bytes_of{o.two_chunk_budget}, ")",
             "; raise two_chunk_budget to at least ", 2 * min * o.element_bytes,
             " B (a scheduler with chunk_bytes = 0 searches with a quarter of device_budget), set chunk_bytes >= ",
             min * size_of(first.type), " B yourself, or cut the largest tensor into pieces (a GPT's wte: "
             "nn::gpt_config::wte_pieces, nn::wte_pieces_within)");
  std::size_t best = min, best_capacity = std::numeric_limits<std::size_t>::max(), tried = 0;
  for (std::size_t c = min; within_budget(c); c += step) {
    ++tried;
    // Used elements are fixed, so the least capacity is the least padding (compared exactly).
    std::size_t const capacity = detail::place(params, c, align, o.mode, nullptr) * c;
    if (capacity < best_capacity) {
      best = c;
      best_capacity = capacity;
    }
    if (max - c < step) break;  // the next candidate would pass max (or wrap)
  }
  chunk_search_result r{pack(params, best, align, o.mode), 0.0, tried};
  r.padding = r.layout.padding();
  return r;
}

}  // namespace tide::chunk
