#pragma once
// lifetime_planner: offsets in ONE buffer for tensors whose lifetimes are known in advance (the
// activations and gradients of a training step, for one sequence length). Tensors whose
// lifetimes overlap never overlap in memory; the others share bytes.
//
//   tide::memory::lifetime_planner planner;                  // offsets aligned to 256 B
//   auto qkv = planner.add("l0.qkv", B * T * 3 * C * 4, 2, 41);  // (B, T, 3C), live ops 2..41
//   auto att = planner.add("l0.att", B * NH * T * T * 4, 4, 39);
//   auto plan = planner.plan();
//   auto* buffer = static_cast<std::byte*>(arena.allocate(plan.footprint(), 256));
//   float* q = reinterpret_cast<float*>(buffer + plan.offset(qkv));
//
// Algorithm (TurboTransformers' model-aware allocator, one chunk): tensors by size, largest
// first; each goes to the best-fitting (smallest) gap between the already-placed tensors whose
// lifetimes overlap it, else at the lowest aligned offset above all of them. A new sequence
// length is `replan(new_bytes)`: same tensors and lifetimes, new sizes; once the planner has
// held n tensors, planning n tensors again makes no system allocation.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"

namespace tide::memory {

// Op indices of a step: a tensor lives over the inclusive range [first_use, last_use].
using op_index = std::int32_t;

// The handle `add` returns; ids are dense, 0, 1, 2, ... in the order of `add`.
struct tensor_id {
  std::uint32_t index = 0;
  friend constexpr bool operator==(tensor_id, tensor_id) noexcept = default;
};

// One tensor, for `add({.name = "l0.qkv", .bytes = n, .first_use = 2, .last_use = 41})`.
struct tensor_desc {
  std::string_view name;
  std::size_t bytes = 0;
  op_index first_use = 0;
  op_index last_use = 0;
  std::size_t alignment = 0;  // of its offset; 0 takes the planner's
};

// Two tensors that break a placement: overlapping lifetimes and bytes (first != second), or
// one tensor whose offset breaks its alignment (first == second).
struct placement_conflict {
  tensor_id first;
  tensor_id second;
};

class lifetime_planner;

// The first conflict in a placement of `tensors` at `offsets` (by id), if any. O(n^2), cheap
// for the few hundred tensors of a step.
[[nodiscard]] inline std::optional<placement_conflict> find_conflict(lifetime_planner const& tensors,
                                                                     std::span<std::size_t const> offsets);

// The result of `plan()`: an offset per tensor id and the buffer size they need. A view into
// the planner: valid until the planner's next add, resize, plan, replan or clear.
class memory_plan {
 public:
  [[nodiscard]] std::size_t size() const noexcept { return offsets_.size(); }
  [[nodiscard]] std::size_t offset(tensor_id id) const {
    TIDE_REQUIRE(id.index < offsets_.size(), "memory_plan::offset: tensor id ", id.index, " of a plan of ",
                 offsets_.size(), " tensors; ids come from the planner that made this plan");
    return offsets_[id.index];
  }
  [[nodiscard]] std::span<std::size_t const> offsets() const noexcept { return offsets_; }
  // Bytes of the one buffer: the highest offset + bytes over all tensors.
  [[nodiscard]] std::size_t footprint() const noexcept { return footprint_; }
  // The lower bound of any placement: the peak over ops of the sum of live tensors' bytes.
  [[nodiscard]] std::size_t peak_live() const noexcept { return peak_live_; }
  // footprint / peak_live: 1 is ideal.
  [[nodiscard]] double ratio() const noexcept {
    return peak_live_ == 0 ? 1.0 : static_cast<double>(footprint_) / static_cast<double>(peak_live_);
  }
  // The tensors planned: names, sizes, lifetimes.
  [[nodiscard]] lifetime_planner const& tensors() const noexcept { return *planner_; }

 private:
  friend class lifetime_planner;
  memory_plan(lifetime_planner const& planner, std::span<std::size_t const> offsets, std::size_t footprint,
              std::size_t peak_live) noexcept
      : planner_(&planner), offsets_(offsets), footprint_(footprint), peak_live_(peak_live) {}

  lifetime_planner const* planner_;
  std::span<std::size_t const> offsets_;
  std::size_t footprint_;
  std::size_t peak_live_;
};

class lifetime_planner {
 public:
  static constexpr std::size_t default_alignment = 256;

  explicit lifetime_planner(std::size_t alignment = default_alignment) : alignment_(alignment) {
    TIDE_REQUIRE(is_power_of_two(alignment), "lifetime_planner: alignment ", alignment,
                 " is not a power of two; use ", default_alignment, " (the default) or another power of two");
  }

  // Storage for `tensors` tensors whose names total `name_chars` characters: planning that many
  // afterwards allocates nothing.
  void reserve(std::size_t tensors, std::size_t name_chars = 0) {
    tensors_.reserve(tensors);
    offsets_.reserve(tensors);
    order_.reserve(tensors);
    placed_.reserve(tensors);
    events_.reserve(2 * tensors);
    names_.reserve(name_chars);
  }

  // Adds a tensor of `bytes` bytes live over ops [first_use, last_use]; returns its id.
  // Strong guarantee: on error the planner is unchanged.
  tensor_id add(std::string_view name, std::size_t bytes, op_index first_use, op_index last_use) {
    return add(tensor_desc{name, bytes, first_use, last_use, 0});
  }

  tensor_id add(tensor_desc const& t) {
    TIDE_REQUIRE(t.last_use >= t.first_use, "lifetime_planner::add(\"", t.name, "\"): last_use ", t.last_use,
                 " is before first_use ", t.first_use,
                 "; a tensor lives over the inclusive op range [first_use, last_use]");
    TIDE_REQUIRE(t.bytes > 0, "lifetime_planner::add(\"", t.name,
                 "\"): 0 bytes; leave zero-size tensors out of the plan or give them at least 1 byte");
    TIDE_REQUIRE(t.alignment == 0 || is_power_of_two(t.alignment), "lifetime_planner::add(\"", t.name,
                 "\"): alignment ", t.alignment, " is not a power of two; pass 0 for the planner's ", alignment_,
                 " or a power of two");
    TIDE_REQUIRE(tensors_.size() < std::numeric_limits<std::uint32_t>::max(), "lifetime_planner::add(\"",
                 t.name, "\"): the planner already holds ", tensors_.size(), " tensors, the most it can");
    std::size_t const n = tensors_.size() + 1;
    // Grow everything first (may throw, changes nothing observable), then append (cannot throw).
    grow(tensors_, n);
    grow(offsets_, n);
    grow(order_, n);
    grow(placed_, n);
    grow(events_, 2 * n);
    grow(names_, names_.size() + t.name.size());
    names_.append(t.name);
    tensors_.push_back(record{t.bytes, t.first_use, t.last_use, t.alignment ? t.alignment : alignment_,
                              names_.size()});
    offsets_.push_back(0);
    return tensor_id{static_cast<std::uint32_t>(n - 1)};
  }

  // A new size for one tensor (a new sequence length); its lifetime stays.
  void resize(tensor_id id, std::size_t bytes) {
    require_id(id, "resize");
    TIDE_REQUIRE(bytes > 0, "lifetime_planner::resize(\"", name(id),
                 "\"): 0 bytes; leave zero-size tensors out of the plan or give them at least 1 byte");
    tensors_[id.index].bytes = bytes;
  }

  // New sizes for all tensors, by id, then `plan()`. Checks every size before changing any.
  [[nodiscard]] memory_plan replan(std::span<std::size_t const> bytes) {
    TIDE_REQUIRE(bytes.size() == tensors_.size(), "lifetime_planner::replan: ", bytes.size(),
                 " sizes for ", tensors_.size(), " tensors; pass one size per tensor, in id order");
    for (std::size_t i = 0; i < bytes.size(); ++i)
      TIDE_REQUIRE(bytes[i] > 0, "lifetime_planner::replan: 0 bytes for \"",
                   name(tensor_id{static_cast<std::uint32_t>(i)}),
                   "\"; leave zero-size tensors out of the plan or give them at least 1 byte");
    for (std::size_t i = 0; i < bytes.size(); ++i) tensors_[i].bytes = bytes[i];
    return plan();
  }

  // Places every tensor; O(n^2) in the number of tensors, no allocation.
  [[nodiscard]] memory_plan plan() {
    std::size_t const n = tensors_.size();
    order_.resize(n);
    for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
    // Largest first; ties by first use then id, so a plan is a function of its input.
    std::sort(order_.begin(), order_.end(), [this](std::uint32_t a, std::uint32_t b) {
      record const& x = tensors_[a];
      record const& y = tensors_[b];
      if (x.bytes != y.bytes) return x.bytes > y.bytes;
      if (x.first_use != y.first_use) return x.first_use < y.first_use;
      return a < b;
    });

    placed_.clear();  // ids of placed tensors, by increasing offset
    std::size_t footprint = 0;
    for (std::uint32_t const i : order_) {
      record const& t = tensors_[i];
      std::size_t const offset = best_fit(t);
      offsets_[i] = offset;
      auto const at = std::upper_bound(placed_.begin(), placed_.end(), offset,
                                       [this](std::size_t o, std::uint32_t j) { return o < offsets_[j]; });
      placed_.insert(at, i);  // within capacity: no allocation
      footprint = std::max(footprint, offset + t.bytes);
    }
    return memory_plan(*this, std::span<std::size_t const>(offsets_.data(), n), footprint, peak_live());
  }

  // Forgets the tensors, keeps the storage.
  void clear() noexcept {
    tensors_.clear();
    offsets_.clear();
    names_.clear();
  }

  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] bool empty() const noexcept { return tensors_.empty(); }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }

  [[nodiscard]] std::string_view name(tensor_id id) const {
    require_id(id, "name");
    std::size_t const begin = id.index == 0 ? 0 : tensors_[id.index - 1].name_end;
    return std::string_view(names_).substr(begin, tensors_[id.index].name_end - begin);
  }
  [[nodiscard]] std::size_t bytes(tensor_id id) const { return at(id, "bytes").bytes; }
  [[nodiscard]] op_index first_use(tensor_id id) const { return at(id, "first_use").first_use; }
  [[nodiscard]] op_index last_use(tensor_id id) const { return at(id, "last_use").last_use; }
  [[nodiscard]] std::size_t alignment(tensor_id id) const { return at(id, "alignment").alignment; }

  // True when the lifetimes of a and b share an op.
  [[nodiscard]] bool lifetimes_overlap(tensor_id a, tensor_id b) const {
    record const& x = at(a, "lifetimes_overlap");
    record const& y = at(b, "lifetimes_overlap");
    return x.first_use <= y.last_use && y.first_use <= x.last_use;
  }

 private:
  friend std::optional<placement_conflict> find_conflict(lifetime_planner const&, std::span<std::size_t const>);

  struct record {
    std::size_t bytes;
    op_index first_use;
    op_index last_use;
    std::size_t alignment;  // resolved: never 0
    std::size_t name_end;   // in names_; the name begins where the previous one ends
  };
  struct event {
    std::int64_t op;  // first_use, or last_use + 1 for a free
    bool alloc;       // frees sort first at the same op
    std::size_t bytes;
  };

  template <class Vector>
  static void grow(Vector& v, std::size_t n) {
    if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
  }

  void require_id(tensor_id id, char const* what) const {
    TIDE_REQUIRE(id.index < tensors_.size(), "lifetime_planner::", what, ": tensor id ", id.index,
                 " but the planner holds ", tensors_.size(), " tensors; use an id `add` returned since the last clear");
  }
  record const& at(tensor_id id, char const* what) const {
    require_id(id, what);
    return tensors_[id.index];
  }

  // The offset for t among the placed tensors whose lifetimes overlap it: the smallest gap that
  // holds it (lowest offset on ties), else the lowest aligned offset above all of them.
  std::size_t best_fit(record const& t) const {
    std::size_t best = 0, best_gap = std::numeric_limits<std::size_t>::max();
    std::size_t top = 0;  // highest end among overlapping tensors seen so far
    for (std::uint32_t const j : placed_) {
      record const& s = tensors_[j];
      if (s.first_use > t.last_use || t.first_use > s.last_use) continue;
      std::size_t const start = round_up(top, t.alignment);
      std::size_t const o = offsets_[j];
      if (start + t.bytes <= o && o - start < best_gap) {
        best = start;
        best_gap = o - start;
      }
      top = std::max(top, o + s.bytes);
    }
    return best_gap != std::numeric_limits<std::size_t>::max() ? best : round_up(top, t.alignment);
  }

  // Sweep over alloc/free events; a tensor freed at op k+1 no longer counts at op k+1.
  std::size_t peak_live() {
    events_.clear();
    for (record const& t : tensors_) {
      events_.push_back(event{t.first_use, true, t.bytes});
      events_.push_back(event{std::int64_t{t.last_use} + 1, false, t.bytes});
    }
    std::sort(events_.begin(), events_.end(), [](event const& a, event const& b) {
      if (a.op != b.op) return a.op < b.op;
      return a.alloc < b.alloc;
    });
    std::size_t live = 0, peak = 0;
    for (event const& e : events_) {
      if (e.alloc) {
        live += e.bytes;
        peak = std::max(peak, live);
      } else {
        live -= e.bytes;
      }
    }
    return peak;
  }

  std::size_t alignment_;
  std::vector<record> tensors_;        // by id
  std::vector<std::size_t> offsets_;   // by id: the last plan
  std::vector<std::uint32_t> order_;   // scratch: ids, largest first
  std::vector<std::uint32_t> placed_;  // scratch: placed ids by offset
  std::vector<event> events_;          // scratch: the peak-live sweep
  std::string names_;                  // all names, concatenated
};

inline std::optional<placement_conflict> find_conflict(lifetime_planner const& tensors,
                                                       std::span<std::size_t const> offsets) {
  TIDE_REQUIRE(offsets.size() == tensors.size(), "find_conflict: ", offsets.size(), " offsets for ",
               tensors.size(), " tensors; pass one offset per tensor, in id order");
  auto const& t = tensors.tensors_;
  auto const n = static_cast<std::uint32_t>(offsets.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    if (offsets[i] % t[i].alignment != 0) return placement_conflict{{i}, {i}};
    for (std::uint32_t j = i + 1; j < n; ++j) {
      bool const live_together = t[i].first_use <= t[j].last_use && t[j].first_use <= t[i].last_use;
      if (live_together && offsets[i] < offsets[j] + t[j].bytes && offsets[j] < offsets[i] + t[i].bytes)
        return placement_conflict{{i}, {j}};
    }
  }
  return std::nullopt;
}

// Throws tide::error(internal) naming the tensors if the plan is broken: a planner bug.
inline void check(memory_plan const& plan) {
  lifetime_planner const& t = plan.tensors();
  auto const c = find_conflict(t, plan.offsets());
  if (!c) return;
  if (c->first == c->second)
    TIDE_FAIL(internal, "memory_plan: tensor \"", t.name(c->first), "\" at offset ", plan.offset(c->first),
              " breaks its alignment ", t.alignment(c->first));
  auto describe = [&](tensor_id id) {
    return tide::detail::concat('"', t.name(id), "\" (ops ", t.first_use(id), "..", t.last_use(id), ", bytes ",
                          plan.offset(id), "..", plan.offset(id) + t.bytes(id), ")");
  };
  TIDE_FAIL(internal, "memory_plan: ", describe(c->first), " and ", describe(c->second),
            " are live together and overlap in memory");
}

}  // namespace tide::memory
