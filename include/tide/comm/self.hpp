#pragma once
// comm::self: a communicator of one rank, with no library behind it. Reductions leave the data
// as it is, gathers copy, a send is kept until this rank receives it. Asynchronous operations run
// on its lane like any communicator's, so code written for comm::mpi runs unchanged on one
// process (and tests its ordering of events).
//
//   tide::comm::self c;
//   c.all_reduce(std::span<float>(g), tide::comm::reduce_op::sum);   // g unchanged

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/comm/detail/lane.hpp"
#include "tide/core/error.hpp"

namespace tide::comm {

class self : public detail::front<self> {
 public:
  static constexpr std::string_view name = "self";

  explicit self(comm_options const& opts = {}) : state_(std::make_unique<state>(opts)) {}

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  [[nodiscard]] comm_options const& options() const noexcept { return state_->opts; }

  // One rank: every color and key gives this rank alone again.
  [[nodiscard]] self split(int color, int key) const {
    TIDE_REQUIRE(color >= 0, "comm::self split: color ", color, " must be >= 0 (key ", key, ")");
    return self{state_->opts};
  }

  // Runs the operations, on the lane.
  struct state {
    comm_options opts;
    std::deque<std::vector<std::byte>> mailbox;  // sends not yet received, oldest first
    std::deque<int> tags;                        // their tags
    detail::lane<state> ops{this};               // last: destroyed first, after its operations ran

    explicit state(comm_options const& o) : opts(o) {}
    void execute(detail::operation const& o) {
      std::size_t const bytes = detail::bytes_of_elem(o.type);
      switch (o.kind) {
        case detail::op_kind::reduce_scatter:
        case detail::op_kind::all_gather:
        case detail::op_kind::all_gatherv:
          if (o.n > 0 && o.in != o.out) std::memmove(o.out, o.in, static_cast<std::size_t>(o.n) * bytes);
          break;
        case detail::op_kind::send: {
          auto const* p = static_cast<std::byte const*>(o.in);
          mailbox.emplace_back(p, p + static_cast<std::size_t>(o.n) * bytes);
          tags.push_back(o.tag);
          break;
        }
        case detail::op_kind::recv: {
          std::size_t k = 0;
          while (k < tags.size() && tags[k] != o.tag) ++k;
          TIDE_CHECK(k < tags.size(), mpi, "comm::self: ", detail::describe(o), " has no matching send: on one rank, "
                     "send before you receive");
          TIDE_CHECK(mailbox[k].size() == static_cast<std::size_t>(o.out_n) * bytes, mpi, "comm::self: ",
                     detail::describe(o), " got ", mailbox[k].size(), " bytes from its send");
          if (!mailbox[k].empty()) std::memcpy(o.out, mailbox[k].data(), mailbox[k].size());
          mailbox.erase(mailbox.begin() + static_cast<std::ptrdiff_t>(k));
          tags.erase(tags.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
        default: break;  // all_reduce, reduce, broadcast, barrier: one rank's data is the result
      }
    }
  };
  detail::lane<state>& ops() noexcept { return state_->ops; }

 private:
  std::unique_ptr<state> state_;
};

static_assert(Communicator<self>);

}  // namespace tide::comm
