// comm::mpi on real ranks (ctest launches this with mpiexec -n 2 and -n 4): every operation against
// values each rank can compute for itself, sub-communicators, the lane's ordering, and errors.
// Values are small integers so that every sum is exact in every element type.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tide/comm/hierarchical.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/memory/stream.hpp"
#include "tide/train/interrupt.hpp"
#include "support/mpi_world.hpp"

namespace {

using tide::comm::reduce_op;
using tide::test::world;

template <class T>
std::span<T const> ro(std::vector<T> const& v) {
  return {v.data(), v.size()};
}

template <class T>
void check_all_reduce() {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  std::vector<T> sum(37), big(37), small(37);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    sum[i] = static_cast<T>(static_cast<float>(r + 1) * static_cast<float>(i % 5));
    big[i] = small[i] = static_cast<T>(static_cast<float>((r * 7 + static_cast<int>(i)) % 11));
  }
  c.all_reduce(std::span<T>(sum), reduce_op::sum);
  c.all_reduce(std::span<T>(big), reduce_op::max);
  c.all_reduce(std::span<T>(small), reduce_op::min);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    float const want = static_cast<float>(w * (w + 1) / 2) * static_cast<float>(i % 5);
    CHECK(static_cast<float>(sum[i]) == want);
    float hi = 0, lo = 100;
    for (int q = 0; q < w; ++q) {
      auto const v = static_cast<float>((q * 7 + static_cast<int>(i)) % 11);
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
    CHECK(static_cast<float>(big[i]) == hi);
    CHECK(static_cast<float>(small[i]) == lo);
  }
}

}  // namespace

TEST_CASE("ranks: size() is the job's, and every rank has its own number") {
  auto& c = world();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(c.size() == size);
  std::vector<std::int32_t> mine{c.rank()}, all(static_cast<std::size_t>(c.size()));
  c.all_gather(ro(mine), std::span<std::int32_t>(all));
  for (int q = 0; q < c.size(); ++q) CHECK(all[static_cast<std::size_t>(q)] == q);
}

TEST_CASE("all_reduce: sum, max and min in every element type, bf16 and f16 through tide's MPI operations") {
  check_all_reduce<float>();
  check_all_reduce<double>();
  check_all_reduce<std::int32_t>();
  check_all_reduce<std::int64_t>();
  check_all_reduce<tide::bf16>();
  check_all_reduce<tide::f16>();
}

TEST_CASE("all_reduce above 32 MiB runs in 16 MiB segments: every element summed once, the last segment short") {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  // 40 MiB of int32, 2.5 segments: the tail is half a segment; sums of small integers are exact.
  std::size_t const n = (std::size_t{40} << 20) / sizeof(std::int32_t);
  std::vector<std::int32_t> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<std::int32_t>((r + 1) * static_cast<int>(i % 1000));
  REQUIRE(n * sizeof(std::int32_t) > (std::size_t{32} << 20));
  c.all_reduce(std::span<std::int32_t>(x), reduce_op::sum);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += x[i] != static_cast<std::int32_t>(w * (w + 1) / 2 * static_cast<int>(i % 1000));
  CHECK(wrong == 0);
}

TEST_CASE("reduce_scatter, all_gather, all_gatherv and broadcast move what MPI's definitions say") {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  constexpr int n = 5;
  std::vector<float> in(static_cast<std::size_t>(n * w)), out(n);
  std::iota(in.begin(), in.end(), static_cast<float>(r));  // in[k] = r + k
  c.reduce_scatter(ro(in), std::span<float>(out), reduce_op::sum);
  for (int j = 0; j < n; ++j)  // sum over ranks q of (q + r n + j)
    CHECK(out[static_cast<std::size_t>(j)] == static_cast<float>(w * (w - 1) / 2 + w * (r * n + j)));

  std::vector<std::int64_t> mine(n), all(static_cast<std::size_t>(n * w));
  for (int j = 0; j < n; ++j) mine[static_cast<std::size_t>(j)] = r * 10 + j;
  c.all_gather(ro(mine), std::span<std::int64_t>(all));
  for (int q = 0; q < w; ++q)
    for (int j = 0; j < n; ++j) CHECK(all[static_cast<std::size_t>(q * n + j)] == q * 10 + j);

  // Rank q sends q + 1 copies of q.
  std::vector<tide::index_t> counts(static_cast<std::size_t>(w));
  std::iota(counts.begin(), counts.end(), tide::index_t{1});
  std::vector<std::uint8_t> part(static_cast<std::size_t>(r + 1), static_cast<std::uint8_t>(r));
  std::vector<std::uint8_t> gathered(static_cast<std::size_t>(w * (w + 1) / 2));
  c.all_gatherv(ro(part), std::span<std::uint8_t>(gathered), std::span<tide::index_t const>(counts));
  std::size_t at = 0;
  for (int q = 0; q < w; ++q)
    for (int k = 0; k <= q; ++k) CHECK(gathered[at++] == q);

  std::vector<double> b(9, r == w - 1 ? 2.5 : -1.0);
  c.broadcast(std::span<double>(b), w - 1);
  for (double v : b) CHECK(v == 2.5);
  c.barrier();
}

TEST_CASE("send and recv around a ring; a receive that gets fewer elements than it takes is an error") {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  std::vector<float> out(1000, static_cast<float>(r)), in(1000, -1.f);
  int const next = (r + 1) % w, prev = (r + w - 1) % w;
  // One lane completes its operations in order: pair them as blocking sends and receives.
  if (r % 2 == 0) {
    c.send(ro(out), next, 7);
    c.recv(std::span<float>(in), prev, 7);
  } else {
    c.recv(std::span<float>(in), prev, 7);
    c.send(ro(out), next, 7);
  }
  for (float v : in) CHECK(v == static_cast<float>(prev));

  // On a copy of the world, so that its failure stays there.
  auto pair = c.split(0, r);
  std::vector<float> three(3, 1.f), four(4, 0.f);
  if (r == 0) pair.send(ro(three), 1, 3);
  if (r == 1) {
    try {
      pair.recv(std::span<float>(four), 0, 3);
      FAIL("a short message was taken");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::mpi);
      CHECK(std::string(e.what()).find("recv #1 (16 B of f32 from rank 0, tag 3) received 3 elements") !=
            std::string::npos);
    }
    CHECK_THROWS_AS(pair.barrier(), tide::error);  // a failed communicator stays failed
  }
  c.barrier();
}

TEST_CASE("split: colors make sub-communicators, keys order them") {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  auto half = c.split(r % 2, -r);  // even and odd ranks, highest first
  int members = 0;
  for (int q = r % 2; q < w; q += 2) ++members;
  CHECK(half.size() == members);
  int higher = 0;  // ranks of my color above me come first
  for (int q = r % 2; q < w; q += 2) higher += q > r ? 1 : 0;
  CHECK(half.rank() == higher);
  std::vector<std::int32_t> v{r};
  half.all_reduce(std::span<std::int32_t>(v), reduce_op::sum);
  int want = 0;
  for (int q = r % 2; q < w; q += 2) want += q;
  CHECK(v[0] == want);
}

TEST_CASE("asynchronous operations run on the lane in call order, after the events the lane waits for") {
  auto& c = world();
  int const w = c.size();
  std::vector<float> g(1 << 20, 0.f);  // 4 MiB
  // A producer on another stream fills g late; the all-reduce must see the filled values.
  tide::memory::stream<tide::host> producer;
  tide::memory::event<tide::host> filled;
  struct fill {
    std::vector<float>* g;
    void operator()() const {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (float& x : *g) x = 1.f;
    }
  } job{&g};
  tide::memory::launch(producer, job);
  filled.record(producer);
  c.lane().wait(filled);
  auto const r1 = c.all_reduce_async(std::span<float>(g), reduce_op::sum);
  std::vector<float> second(8, 1.f);
  auto const r2 = c.all_reduce_async(std::span<float>(second), reduce_op::sum);
  tide::memory::event<tide::host> both;
  both.record(c.lane());
  both.synchronize();
  CHECK(c.test(r1));
  CHECK(c.test(r2));
  c.wait(r1);
  for (std::size_t i = 0; i < g.size(); i += 4099) CHECK(g[i] == static_cast<float>(w));
  for (float v : second) CHECK(v == static_cast<float>(w));
}

TEST_CASE("sizes that cannot work are refused on the caller's thread, before anything is sent") {
  auto& c = world();
  std::vector<float> a(10), b(3);
  CHECK_THROWS_AS(c.reduce_scatter(ro(a), std::span<float>(b), reduce_op::sum), tide::error);
  CHECK_THROWS_AS(c.all_gather(ro(a), std::span<float>(b)), tide::error);
  CHECK_THROWS_AS(c.broadcast(std::span<float>(a), c.size()), tide::error);
  std::vector<tide::index_t> counts(static_cast<std::size_t>(c.size()), 10);
  CHECK_THROWS_AS(c.all_gatherv(ro(a), std::span<float>(b), std::span<tide::index_t const>(counts)), tide::error);
  // The communicator goes on.
  std::vector<std::int32_t> one{1};
  c.all_reduce(std::span<std::int32_t>(one), reduce_op::sum);
  CHECK(one[0] == c.size());
}

TEST_CASE("reduce lands at the root; hierarchical all-reduce (reduce, leaders, broadcast) equals the flat one") {
  auto& c = world();
  int const w = c.size(), r = c.rank();
  std::vector<std::int64_t> v(6, r + 1);
  c.reduce(std::span<std::int64_t>(v), w - 1, reduce_op::sum);
  for (auto x : v) CHECK(x == (r == w - 1 ? w * (w + 1) / 2 : r + 1));  // only the root's changed

  CHECK(tide::comm::node_size(c) == w);  // one machine: every rank on one node
  for (int per_node : {1, 2}) {
    CAPTURE(per_node);
    tide::comm::hierarchical<tide::comm::mpi> h{c, per_node};
    CHECK(h.nodes() == w / per_node);
    CHECK(h.node().size() == per_node);
    // Integers in float: exact in any order, so hierarchical and flat agree bit for bit.
    std::vector<float> a(1000), b(1000);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<float>((r * 31 + static_cast<int>(i)) % 97);
    h.all_reduce(std::span<float>(a), reduce_op::sum);
    c.all_reduce(std::span<float>(b), reduce_op::sum);
    CHECK(a == b);
    std::vector<tide::bf16> m(64, tide::bf16(static_cast<float>(r)));
    h.all_reduce(std::span<tide::bf16>(m), reduce_op::max);
    for (auto x : m) CHECK(static_cast<float>(x) == static_cast<float>(w - 1));
    // reduce through the hierarchy lands on each root, a node's first rank or not.
    for (int root = 0; root < w; ++root) {
      std::vector<std::int64_t> x(5, r + 1);
      h.reduce(std::span<std::int64_t>(x), root, reduce_op::sum);
      if (r == root)
        for (auto y : x) CHECK(y == w * (w + 1) / 2);
    }
    std::vector<std::int32_t> mine{r, 2 * r}, all(static_cast<std::size_t>(2 * w));
    h.all_gather(std::span<std::int32_t const>(mine), std::span<std::int32_t>(all));
    for (int k = 0; k < w; ++k) CHECK((all[static_cast<std::size_t>(2 * k)] == k && all[static_cast<std::size_t>(2 * k + 1)] == 2 * k));
    std::vector<float> from(3, static_cast<float>(r));
    h.broadcast(std::span<float>(from), w - 1);
    CHECK(from == std::vector<float>(3, static_cast<float>(w - 1)));
  }
  CHECK_THROWS_AS((tide::comm::hierarchical<tide::comm::mpi>{c, w + 1}), tide::error);
}

TEST_CASE("agreed_stop: every rank takes the signal any rank was asked to stop by") {
  auto& c = world();
  // Rank 1 got SIGTERM, the last rank SIGINT, the others none: every rank stops, by SIGTERM.
  int const mine = c.rank() == 1 ? SIGTERM : c.rank() == c.size() - 1 ? SIGINT : 0;
  CHECK(tide::train::agreed_stop(c, mine) == SIGTERM);
  CHECK(tide::train::agreed_stop(c, 0) == 0);  // none asked: none stops
}
