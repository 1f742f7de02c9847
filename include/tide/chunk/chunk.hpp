#pragma once
// chunk, chunk_list: fixed-size blocks of model data (the unit of allocation, movement and
// communication) and their tensors' states (PatrickStar). A chunk's state is derived in O(1) from
// per-state tensor counters; a chunk_list keeps the counters and the tensors' states in step.
//
//   auto params = tide::nn::gpt_parameters(config, tide::dtype::bf16);
//   auto layout = tide::chunk::pack(params, 8 << 20);                       // 8 Mi elements per chunk
//   tide::chunk::chunk_list grads{tide::chunk::chunk_role::grad, tide::dtype::bf16, layout, params};
//   grads[0].attach(pool.allocate(grads.chunk_bytes()), tide::chunk::tier::device);   // zero it first
//   grads.transition(5, tensor_state::compute);                // FREE -> COMPUTE; illegal edges throw
//   auto* g = reinterpret_cast<tide::bf16*>(grads.data(5));    // (3C, C)
//   grads.transition_chunk(0, tensor_state::hold_after_bwd);   // every tensor of chunk 0
//   if (grads[0].movable()) pool.deallocate(grads[0].detach()); // after copying it out
//
// The chunks do not own their payloads: whoever allocates (a pool, an arena) attaches and
// detaches them, so a chunk_list never frees memory and copies of it alias the same payloads.
//
// Inside namespace tide::chunk the name `chunk` is this class: spell the namespace tide::chunk::.

#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/chunk/layout.hpp"
#include "tide/chunk/tensor_state.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"

namespace tide::chunk {

enum class tier : std::uint8_t { device, host };

constexpr std::string_view to_string(tier t) noexcept {
  switch (t) {
    case tier::device: return "device";
    case tier::host: return "host";
  }
  return "?";
}

// A chunk's state: released (no payload) or the state of its highest-priority tensor.
enum class chunk_state : std::uint8_t { released, free, compute, hold, hold_after_fwd, hold_after_bwd, ready_for_reduce };

constexpr std::string_view to_string(chunk_state s) noexcept {
  return s == chunk_state::released ? "RELEASED" : to_string(static_cast<tensor_state>(static_cast<int>(s) - 1));
}

// The chunk state a tensor state maps to (the enums differ by `released` only).
constexpr chunk_state chunk_state_of(tensor_state s) noexcept {
  return static_cast<chunk_state>(static_cast<int>(s) + 1);
}

// A named slice of a chunk.
struct stateful_tensor {
  std::uint32_t param = 0;  // index in the tide::parameter_list
  std::uint32_t chunk = 0;  // index of its chunk in the list
  std::size_t offset = 0;   // bytes from the chunk payload's start
  std::size_t bytes = 0;
  tensor_state state = tensor_state::free;
};

static_assert(std::is_trivially_copyable_v<stateful_tensor>);

class chunk {
 public:
  chunk(std::uint32_t id, std::size_t capacity_bytes) noexcept : capacity_(capacity_bytes), id_(id) {}

  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }  // bytes
  // Where the payload is (of a released chunk: where it last was).
  [[nodiscard]] tide::chunk::tier tier() const noexcept { return tier_; }
  [[nodiscard]] std::byte* payload() const noexcept { return payload_; }  // nullptr: released
  [[nodiscard]] bool pinned() const noexcept { return pinned_; }
  void set_pinned(bool p) noexcept { pinned_ = p; }
  [[nodiscard]] std::size_t tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t count(tensor_state s) const noexcept { return counts_[static_cast<std::size_t>(s)]; }

  // Layout time: one more tensor, in state s.
  void add_tensor(tensor_state s = tensor_state::free) noexcept {
    ++counts_[static_cast<std::size_t>(s)];
    ++tensors_;
  }

  // One tensor went from -> to. The caller checked the edge (chunk_list::transition does) and
  // that a tensor in `from` exists.
  void on_transition(tensor_state from, tensor_state to) noexcept {
    --counts_[static_cast<std::size_t>(from)];
    ++counts_[static_cast<std::size_t>(to)];
  }

  // `payload` (capacity() bytes) becomes the chunk's storage, after an allocation or a copy.
  void attach(std::byte* payload, tide::chunk::tier t) noexcept {
    payload_ = payload;
    tier_ = t;
  }
  // Gives the payload back to the caller; the chunk becomes released.
  [[nodiscard]] std::byte* detach() noexcept { return std::exchange(payload_, nullptr); }

  // Priority COMPUTE > HOLD > HOLD_AFTER_FWD > HOLD_AFTER_BWD > READY_FOR_REDUCE > FREE: the chunk
  // takes the most constraining state any of its tensors is in. No tensors at all: FREE.
  [[nodiscard]] chunk_state state() const noexcept {
    if (payload_ == nullptr) return chunk_state::released;
    constexpr tensor_state order[] = {tensor_state::compute, tensor_state::hold, tensor_state::hold_after_fwd,
                                      tensor_state::hold_after_bwd, tensor_state::ready_for_reduce};
    for (tensor_state s : order)
      if (count(s) != 0) return chunk_state_of(s);
    return chunk_state::free;
  }

  // May be evicted (copied to the other tier): holds data nobody computes on and is not pinned.
  // An all-FREE chunk is dropped, not moved.
  [[nodiscard]] bool movable() const noexcept {
    return payload_ != nullptr && !pinned_ && count(tensor_state::compute) == 0 && state() != chunk_state::free;
  }
  // May drop its payload without a copy: no tensor holds data.
  [[nodiscard]] bool releasable() const noexcept {
    return payload_ != nullptr && count(tensor_state::free) == tensors_;
  }

 private:
  std::byte* payload_ = nullptr;
  std::size_t capacity_;
  std::array<std::uint32_t, tensor_state_count> counts_{};
  std::uint32_t id_;
  std::uint32_t tensors_ = 0;
  tide::chunk::tier tier_ = tide::chunk::tier::host;
  bool pinned_ = false;
};

// state: one of an optimizer's state lists (as many as it keeps, named by it); extra: a list a
// gradient sink declares (an error-feedback residual).
enum class chunk_role : std::uint8_t { param, grad, master, state, extra };

constexpr std::string_view to_string(chunk_role r) noexcept {
  switch (r) {
    case chunk_role::param: return "param";
    case chunk_role::grad: return "grad";
    case chunk_role::master: return "master";
    case chunk_role::state: return "state";
    case chunk_role::extra: return "extra";
  }
  return "?";
}

// One list of chunks (one role, one dtype) over a layout; the lists of one model share the layout,
// so parameter i is at the same chunk index and element offset in each.
class chunk_list {
 public:
  // Throws tide::error(usage) if the layout was not packed from a list like `params`.
  chunk_list(chunk_role role, dtype type, chunk_layout const& layout, tide::parameter_list const& params)
      : role_(role), type_(type), chunk_bytes_(layout.chunk_elements * size_of(type)) {
    std::size_t const n = params.size(), chunks = layout.chunks();
    TIDE_REQUIRE(layout.chunk_of.size() == n && layout.offset_of.size() == n && !layout.first_param.empty() &&
                     layout.first_param.front() == 0 && layout.first_param.back() == n,
                 "chunk_list(", to_string(role), "): the layout covers ", layout.chunk_of.size(),
                 " parameters but the list has ", n, "; build it with chunk::pack() on this list");
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t const c = layout.chunk_of[i];
      std::size_t const numel = static_cast<std::size_t>(params[i].numel());
      TIDE_REQUIRE(c < chunks && layout.first_param[c] <= i && i < layout.first_param[c + 1] &&
                       layout.offset_of[i] + numel <= layout.chunk_elements,
                   "chunk_list(", to_string(role), "): parameter ", i, " \"", params[i].name(), "\" (", numel,
                   " elements) is at chunk ", c, " offset ", layout.offset_of[i], " of a layout with ", chunks,
                   " chunks of ", layout.chunk_elements, " elements; build the layout with chunk::pack() on this list");
    }
    params_.assign(params.begin(), params.end());
    tensors_.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      tensors_.push_back({static_cast<std::uint32_t>(i), layout.chunk_of[i], layout.offset_of[i] * size_of(type),
                          static_cast<std::size_t>(params[i].numel()) * size_of(type), tensor_state::free});
    chunks_.reserve(chunks);
    for (std::size_t c = 0; c < chunks; ++c) {
      chunks_.emplace_back(static_cast<std::uint32_t>(c), chunk_bytes_);
      for (std::uint32_t i = layout.first_param[c]; i < layout.first_param[c + 1]; ++i) chunks_.back().add_tensor();
    }
    first_param_ = layout.first_param;
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::uint32_t{0});
  }

  [[nodiscard]] chunk_role role() const noexcept { return role_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }
  [[nodiscard]] std::size_t size() const noexcept { return chunks_.size(); }
  // Capacity of every chunk: layout.chunk_elements * size_of(type()).
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  // ---- the chunks: attach, detach, pin through these; change states through transition ------
  [[nodiscard]] chunk& operator[](std::size_t c) noexcept { return chunks_[c]; }
  [[nodiscard]] chunk const& operator[](std::size_t c) const noexcept { return chunks_[c]; }
  [[nodiscard]] chunk* begin() noexcept { return chunks_.data(); }
  [[nodiscard]] chunk* end() noexcept { return chunks_.data() + chunks_.size(); }
  [[nodiscard]] chunk const* begin() const noexcept { return chunks_.data(); }
  [[nodiscard]] chunk const* end() const noexcept { return chunks_.data() + chunks_.size(); }

  // ---- the tensors --------------------------------------------------------------------------
  [[nodiscard]] std::span<stateful_tensor const> tensors() const noexcept { return tensors_; }
  [[nodiscard]] stateful_tensor const& tensor(std::uint32_t param) const { return tensors_[checked(param)]; }
  [[nodiscard]] tide::parameter const& parameter(std::uint32_t param) const { return params_[checked(param)]; }
  // Parameter indices in chunk c (a contiguous run: packing keeps registration order).
  [[nodiscard]] std::span<std::uint32_t const> params_of(std::uint32_t c) const {
    TIDE_REQUIRE(c < chunks_.size(), "chunk_list(", to_string(role_), ")::params_of(", c, "): the list has ",
                 chunks_.size(), " chunks");
    return std::span<std::uint32_t const>(order_).subspan(first_param_[c], first_param_[c + 1] - first_param_[c]);
  }

  // Moves one tensor to `to`. Throws tide::error(usage) naming it ("h0.attn.qkv.w (grad)") for an
  // illegal edge, and then nothing changed.
  void transition(std::uint32_t param, tensor_state to) {
    stateful_tensor& t = tensors_[checked(param)];
    if (!is_legal(t.state, to)) [[unlikely]]
      check_transition(label(param), t.state, to);
    chunks_[t.chunk].on_transition(t.state, to);
    t.state = to;
  }

  // Moves every tensor of chunk c that is not in `to` already. All edges are checked first: an
  // illegal one throws (naming its tensor) before any state changes.
  void transition_chunk(std::uint32_t c, tensor_state to) {
    for (std::uint32_t p : params_of(c))
      if (tensors_[p].state != to && !is_legal(tensors_[p].state, to)) [[unlikely]]
        check_transition(label(p), tensors_[p].state, to);
    for (std::uint32_t p : params_of(c)) {
      stateful_tensor& t = tensors_[p];
      if (t.state == to) continue;
      chunks_[c].on_transition(t.state, to);
      t.state = to;
    }
  }

  // The tensor's bytes inside its chunk's payload. Throws tide::error(usage) if the chunk is released.
  [[nodiscard]] std::byte* data(std::uint32_t param) const {
    stateful_tensor const& t = tensors_[checked(param)];
    std::byte* const payload = chunks_[t.chunk].payload();
    TIDE_REQUIRE(payload != nullptr, "chunk_list::data: ", label(param), " is in chunk ", t.chunk,
                 ", which is released (no payload); attach one (fetch or allocate it) before asking for its data");
    return payload + t.offset;
  }

 private:
  std::size_t checked(std::uint32_t param) const {
    TIDE_REQUIRE(param < tensors_.size(), "chunk_list(", to_string(role_), "): parameter index ", param, " but the list has ",
                 tensors_.size(), " parameters");
    return param;
  }
  // "h0.attn.qkv.w (grad)": built only for messages.
  std::string label(std::uint32_t param) const {
    return tide::detail::concat(params_[param].name(), " (", to_string(role_), ")");
  }

  chunk_role role_;
  dtype type_;
  std::size_t chunk_bytes_;
  std::vector<chunk> chunks_;
  std::vector<stateful_tensor> tensors_;
  std::vector<tide::parameter> params_;      // names and shapes, copied: no reference to dangle
  std::vector<std::uint32_t> first_param_; // the layout's CSR
  std::vector<std::uint32_t> order_;       // 0, 1, ..., n - 1: what params_of spans over
};

}  // namespace tide::chunk
