#pragma once
// The trainer's view of tensor parallelism (TensorParallelSpec, train/model.hpp): the group, and
// per parameter how it splits and its whole shape. Without a tensor-parallel spec, one rank that
// holds every tensor whole (the same answers, so the trainer's code reads the same either way).
//
// In a checkpoint, a tensor each rank holds a shard of is written by every rank of the group as
// "<name>[r/t]"; a replicated one by tensor rank 0 alone, under its own name; so a checkpoint of
// group size t loads at another size by gathering the shards (tp::put_shard) and cutting again
// (tp::take_shard).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"
#include "tide/train/model.hpp"
#include "tide/tp/shard.hpp"

namespace tide::train {

namespace detail {

// The name of parameter `name`'s shard r of t in a checkpoint: "h0.attn.qkv.w[1/2]".
inline std::string shard_name(std::string_view name, int r, int t) {
  std::string out(name);
  return out.append("[").append(std::to_string(r)).append("/").append(std::to_string(t)).append("]");
}

template <class Spec>
struct tensor_part {  // no tensor parallelism
  explicit tensor_part(Spec const&) noexcept {}
  [[nodiscard]] static constexpr int rank() noexcept { return 0; }
  [[nodiscard]] static constexpr int size() noexcept { return 1; }
  [[nodiscard]] static constexpr bool sharded(std::size_t) noexcept { return false; }
  [[nodiscard]] static constexpr bool counts(std::size_t) noexcept { return true; }
  [[nodiscard]] static constexpr bool all(bool ok) noexcept { return ok; }
  [[nodiscard]] static constexpr std::int64_t of_rank0(std::int64_t v) noexcept { return v; }
  [[nodiscard]] static constexpr double sum(double x) noexcept { return x; }
};

template <TensorParallelSpec Spec>
struct tensor_part<Spec> {
  using group_type = std::remove_cvref_t<decltype(std::declval<Spec const&>().tensor_group())>;
  explicit tensor_part(Spec const& spec)
      : group(&spec.tensor_group()), splits(spec.tensor_splits()), whole(spec.whole_shapes()) {
    TIDE_REQUIRE(splits.size() == spec.parameters().size() && whole.size() == splits.size(), "make_trainer: the "
                 "tensor-parallel spec gives ", splits.size(), " splits and ", whole.size(), " whole shapes for ",
                 spec.parameters().size(), " parameters; give one of each per parameter");
  }
  [[nodiscard]] int rank() const { return group->rank(); }
  [[nodiscard]] int size() const { return group->size(); }
  // Whether parameter i is cut over the group (else every rank holds it whole, the same bits).
  [[nodiscard]] bool sharded(std::size_t i) const { return splits[i] != tp::split::replicated; }
  // Whether this rank counts parameter i in the gradient norm: its shard, or a replicated tensor on rank 0.
  [[nodiscard]] bool counts(std::size_t i) const { return sharded(i) || rank() == 0; }
  [[nodiscard]] bool all(bool ok) const { return comm::all_ranks(*group, ok); }
  [[nodiscard]] std::int64_t of_rank0(std::int64_t v) const { return comm::of_rank0(*group, v); }
  [[nodiscard]] double sum(double x) const { return comm::sum_over_ranks(*group, x); }
  // Rows and columns of parameter i's whole tensor (a vector: one column).
  [[nodiscard]] std::pair<index_t, index_t> extents(std::size_t i) const {
    return {whole[i][0], whole[i].rank == 2 ? whole[i][1] : 1};
  }
  // Parameter i's shard at group size t, f32 elements.
  [[nodiscard]] std::size_t shard_numel(std::size_t i, int t) const {
    auto const [rows, cols] = extents(i);
    auto const s = tp::shape_of(splits[i], rows, cols, t);
    return static_cast<std::size_t>(s.rows * s.cols);
  }
  // Whether every split tensor cuts into t shards of whole rows, columns or heads' rows.
  [[nodiscard]] bool splits_over(int t) const {
    if (t < 1) return false;
    for (std::size_t i = 0; i < splits.size(); ++i) {
      auto const [rows, cols] = extents(i);
      index_t const parts = splits[i] == tp::split::qkv_rows ? 3 * t : t;
      index_t const cut = splits[i] == tp::split::columns ? cols : rows;
      if (sharded(i) && cut % parts != 0) return false;
    }
    return true;
  }
  // This rank's shard of parameter i, from the t shards of a group of t (f32): gathered whole,
  // then cut for this group. `shard(k, bytes)` reads shard k.
  template <class ReadShard>
  void reshard(std::size_t i, int t, ReadShard&& shard, std::span<float> out) {
    auto const [rows, cols] = extents(i);
    std::size_t const n = shard_numel(i, t);
    pieces.resize(n * static_cast<std::size_t>(t));
    for (int k = 0; k < t; ++k)
      shard(k, std::as_writable_bytes(std::span<float>(pieces).subspan(n * static_cast<std::size_t>(k), n)));
    buffer.assign(static_cast<std::size_t>(rows * cols), 0.f);
    tp::put_shards(splits[i], std::span<float const>(pieces), std::span<float>(buffer), rows, cols, t);
    tp::take_shard(splits[i], std::span<float const>(buffer), out, rows, cols, rank(), size());
  }

  group_type* group;
  std::vector<tp::split> splits;
  std::vector<shape> whole;
  std::vector<float> buffer, pieces;  // a whole tensor, and every shard of it, while a load re-shards
};

}  // namespace detail
}  // namespace tide::train
