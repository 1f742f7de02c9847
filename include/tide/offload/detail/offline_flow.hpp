#pragma once
// A min-cost flow on a DAG for offline_optimum: successive shortest paths, Dijkstra on reduced
// costs, the first potentials by one pass in node order (every edge goes from a lower node to a
// higher one, so there is no negative cycle even with negative costs). Integer capacities and
// costs: the flow found is integral.
//
//   tide::offload::detail::offline_flow g(4);         // nodes 0..3
//   std::size_t const e = g.add_edge(0, 2, 1, -5);    // from < to
//   g.add_edge(0, 1, 2, 0); ...
//   std::int64_t const cost = g.run(0, 3, 2);         // 2 units from 0 to 3 at the least cost
//   g.flow(e);                                        // units on edge e

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"

namespace tide::offload::detail {

class offline_flow {
 public:
  explicit offline_flow(std::size_t nodes) : out_(nodes) {}

  // An edge from < to with `capacity` units at `cost` each; returns its index for flow().
  std::size_t add_edge(std::size_t from, std::size_t to, std::int64_t capacity, std::int64_t cost) {
    TIDE_REQUIRE(from < to && to < out_.size() && capacity >= 0, "offline_flow::add_edge(", from, ", ", to, ", ",
                 capacity, "): edges go from a lower node to a higher one of ", out_.size(), ", capacity >= 0");
    std::size_t const e = arcs_.size();
    arcs_.push_back({to, capacity, cost});
    arcs_.push_back({from, 0, -cost});
    out_[from].push_back(e);
    out_[to].push_back(e + 1);
    original_.push_back(capacity);
    return e / 2;
  }

  // Sends `units` from source to sink at the least total cost and returns it; a usage error if
  // the graph cannot carry them.
  std::int64_t run(std::size_t source, std::size_t sink, std::int64_t units) {
    std::size_t const n = out_.size();
    constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max();
    // Potentials: shortest distances from the source over the edges as given (a DAG in node order).
    std::vector<std::int64_t> h(n, 0), dist(n);
    std::vector<bool> reached(n, false);
    reached[source] = true;
    for (std::size_t u = source; u < n; ++u) {
      if (!reached[u]) continue;
      for (std::size_t e : out_[u]) {
        arc const& a = arcs_[e];
        if (e % 2 != 0 || a.capacity == 0) continue;
        if (!reached[a.to] || h[u] + a.cost < h[a.to]) h[a.to] = h[u] + a.cost;
        reached[a.to] = true;
      }
    }
    std::vector<std::size_t> via(n);
    std::int64_t cost = 0;
    using item = std::pair<std::int64_t, std::size_t>;
    while (units > 0) {
      dist.assign(n, inf);
      dist[source] = 0;
      std::priority_queue<item, std::vector<item>, std::greater<>> queue;
      queue.push({0, source});
      while (!queue.empty()) {
        auto const [d, u] = queue.top();
        queue.pop();
        if (d != dist[u]) continue;
        for (std::size_t e : out_[u]) {
          arc const& a = arcs_[e];
          if (a.capacity == 0) continue;
          std::int64_t const reduced = a.cost + h[u] - h[a.to];
          TIDE_ASSERT(reduced >= 0);
          if (d + reduced < dist[a.to]) {
            dist[a.to] = d + reduced;
            via[a.to] = e;
            queue.push({dist[a.to], a.to});
          }
        }
      }
      TIDE_REQUIRE(dist[sink] != inf, "offline_flow::run: ", units, " more units cannot reach node ", sink);
      for (std::size_t v = 0; v < n; ++v)
        if (dist[v] != inf) h[v] += dist[v];
      std::int64_t push = units;
      for (std::size_t v = sink; v != source; v = arcs_[via[v] ^ 1].to) push = std::min(push, arcs_[via[v]].capacity);
      for (std::size_t v = sink; v != source; v = arcs_[via[v] ^ 1].to) {
        arcs_[via[v]].capacity -= push;
        arcs_[via[v] ^ 1].capacity += push;
        cost += push * arcs_[via[v]].cost;
      }
      units -= push;
    }
    return cost;
  }

  // Units on edge e (an index add_edge returned) after run().
  [[nodiscard]] std::int64_t flow(std::size_t e) const { return original_.at(e) - arcs_[2 * e].capacity; }

 private:
  struct arc {
    std::size_t to;
    std::int64_t capacity;  // left (a reverse arc: the units its edge carries)
    std::int64_t cost;
  };
  std::vector<arc> arcs_;                       // edge e: arcs 2e (forward) and 2e + 1 (reverse)
  std::vector<std::vector<std::size_t>> out_;   // arcs leaving each node
  std::vector<std::int64_t> original_;          // each edge's capacity as given
};

}  // namespace tide::offload::detail
