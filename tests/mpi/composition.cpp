// The composition matrix (composition.hpp): all 225 combinations of offload, comm, compression and
// pipeline checked at compile time with train::Composes; the covering rows trained on 4 ranks
// (rows 0 .. 13 here, the rest in composition_rows.cpp) and checked against their references:
//   - without compression, bit for bit: the losses of every step and every parameter this rank
//     holds equal the dense reference's (resident, no pipeline, data parallel over the replicas
//     or each replica alone): offload, ZeRO and the pipeline change where the sums run, not their
//     order (two replicas: a + b is the same in any order). Top-k over one rank too: with nothing
//     to send, its sink sums densely;
//   - with compression, within bounds: each step's loss within 1 % of the dense reference's, and
//     the parameters nearer to the reference's than the start was (under 0.95 of the start's
//     distance; measured 0.70 to 0.91). Top-k at density 0.1 and PowerSGD at rank 2 drop most of
//     a step's gradient, so the bits differ; what must hold is that the run trains close to the
//     dense one;
//   - always: a stage's replicas hold the same bits (data parallel), and both ends of a pipeline
//     the same wte.
// The table docs/trainer.md shows is generated here: with TIDE_WRITE_DOCS=1 rank 0 writes it into
// the page; otherwise the test fails when the page's table differs from this one.

#include "composition.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tide::test::matrix {

// ---- all 225 at compile time ------------------------------------------------------------------

// A refused combination fails here; the template arguments in the compiler's "required from" name it.
template <int O, int C, int X, int P>
struct composes_check {
  static_assert(tide::train::Composes<spec_t, offload_t<O>, tide::optim::adamw, comm_t<C>, compression_t<X>,
                                      pipeline_t<P>>,
                "composition matrix: make_trainer refuses offload O, comm C, compression X, pipeline P "
                "(the template arguments above; indices into composition.hpp's *_names)");
  static constexpr bool value = true;
};
template <std::size_t... I>
constexpr bool all_compose(std::index_sequence<I...>) {
  return (composes_check<static_cast<int>(I / 75), static_cast<int>(I / 15 % 5), static_cast<int>(I / 5 % 3),
                         static_cast<int>(I % 5)>::value && ...);
}
static_assert(all_compose(std::make_index_sequence<225>{}));
// The concept can say no: a slot of the wrong kind, a compression policy that adapts nothing.
struct adapts_nothing {
  static constexpr std::string_view name = "adapts nothing";
};
static_assert(!tide::train::Composes<spec_t, int, tide::optim::adamw>);
static_assert(!tide::train::Composes<spec_t, tide::offload::resident, tide::optim::adamw, tide::train::no_comm,
                                     adapts_nothing>);
static_assert(!tide::train::Composes<spec_t, tide::offload::resident, tide::optim::adamw, tide::train::no_comm,
                                     tide::train::no_compress, int>);

// ---- references and checks ----------------------------------------------------------------------

outcome const& reference(bool data_parallel) {
  static outcome const alone = [] {
    auto& s = shared_setup();
    return run<0, 0, 0, 0>(s);
  }();
  static outcome const replicas = [] {
    auto& s = shared_setup();
    return run<0, 1, 0, 0>(s);
  }();
  return data_parallel ? replicas : alone;
}
outcome const& start() {
  static outcome const before = [] {
    auto t = tide::train::make_trainer(
        spec_t{.config = pipeline_gpt, .options = {.seed = 5, .in_flight = 1, .separate_tied_grad = true}},
        tide::offload::resident{}, shared_setup().opt);
    outcome o;
    auto const& list = t.scheduler().parameters();
    for (std::uint32_t i = 0; i < list.size(); ++i)
      o.params.emplace_back(std::string(list[i].name()), t.scheduler().read_param(i));
    return o;
  }();
  return before;
}

namespace {
std::vector<float> const* named(outcome const& o, std::string const& name) {
  for (auto const& [n, v] : o.params)
    if (n == name) return &v;
  return nullptr;
}
// Whether every rank of `c` passes the same values (a CRC per entry).
bool same_on(mpi& c, std::vector<std::int64_t> v) {
  auto lo = v;
  c.all_reduce(std::span<std::int64_t>(v), tide::comm::reduce_op::max);
  c.all_reduce(std::span<std::int64_t>(lo), tide::comm::reduce_op::min);
  return v == lo;
}
}  // namespace

void check(row r, outcome const& got) {
  auto& s = shared_setup();
  outcome const& want = reference(r.comm > 0);
  outcome const& before = start();
  REQUIRE(got.losses.size() == want.losses.size());
  REQUIRE(!got.params.empty());
  // A pipeline stage holds its own parameters only; every one has its reference.
  int missing = 0;
  for (auto const& [name, v] : got.params) missing += named(want, name) == nullptr;
  CHECK(missing == 0);
  // Top-k over one rank (comm none) sends nothing either way, so its sink takes the dense path:
  // the dense run's bits. PowerSGD still factors each matrix there.
  bool const exact = r.compression == 0 || (r.comm == 0 && r.compression == 1);
  if (exact) {
    CHECK(got.losses == want.losses);
    int differ = 0;
    for (auto const& [name, v] : got.params)
      if (auto const* w = named(want, name)) differ += *w != v;
    CHECK(differ == 0);
  } else {
    double worst = 0, moved = 0, left = 0;
    for (std::size_t k = 0; k < got.losses.size(); ++k)
      worst = std::max(worst, std::abs(double(got.losses[k]) - want.losses[k]) / std::abs(double(want.losses[k])));
    for (auto const& [name, v] : got.params) {
      auto const* w = named(want, name);
      auto const* b = named(before, name);
      if (w == nullptr || b == nullptr) continue;
      for (std::size_t i = 0; i < v.size(); ++i) {
        left += (double(v[i]) - (*w)[i]) * (double(v[i]) - (*w)[i]);
        moved += (double((*b)[i]) - (*w)[i]) * (double((*b)[i]) - (*w)[i]);
      }
    }
    double const ratio = std::sqrt(left / moved);
    if (tide::test::world().rank() == 0)
      std::printf("composition row %d %d %d %d: loss within %.5f, distance %.4f\n", r.offload, r.comm,
                  r.compression, r.pipeline, worst, ratio);
    CHECK(worst < 0.01);
    CHECK(ratio < 0.95);
  }
  // The same bits where they must be: a stage's replicas (data parallel), both ends' wte.
  std::vector<std::int64_t> crcs;
  for (auto const& [name, v] : got.params) crcs.push_back(crc_of(v));
  if (r.comm > 0) CHECK(same_on(s.g.data, crcs));
  bool const tied_across = r.pipeline >= 1 && r.pipeline <= 3;  // DualPipeV: both ends on the first stage
  auto const* wte = named(got, "wte");
  std::vector<std::int64_t> one{wte != nullptr ? std::int64_t{crc_of(*wte)} : -1};
  if (tied_across) {
    CHECK(wte != nullptr);
    CHECK(same_on(s.g.pipeline, one));
  }
}

// ---- the table in docs/trainer.md ---------------------------------------------------------------

namespace {
std::string table() {
  std::ostringstream t;
  t << "| comm + compression \\ pipeline |";
  for (auto p : pipeline_names) t << " " << p << " |";
  t << "\n|---|";
  for (std::size_t p = 0; p < pipeline_names.size(); ++p) t << "---|";
  t << "\n";
  for (int c = 0; c < 5; ++c)
    for (int x = 0; x < 3; ++x) {
      t << "| " << comm_names[static_cast<std::size_t>(c)] << " + " << compression_names[static_cast<std::size_t>(x)]
        << " |";
      for (int p = 0; p < 5; ++p) {
        std::string ran;
        for (row r : rows)
          if (r.comm == c && r.compression == x && r.pipeline == p)
            ran += std::string(ran.empty() ? "" : ", ") + std::string(offload_names[static_cast<std::size_t>(r.offload)]);
        // Every cell composes with every offload policy: the static_assert above stops the build otherwise.
        t << " ✓" << (ran.empty() ? "" : " ran: " + ran) << " |";
      }
      t << "\n";
    }
  return t.str();
}
constexpr std::string_view begin_mark = "<!-- composition matrix: generated by tests/mpi/composition.cpp -->\n";
constexpr std::string_view end_mark = "<!-- end of the composition matrix -->";
}  // namespace

}  // namespace tide::test::matrix

TEST_CASE("composition matrix: docs/trainer.md shows the table this test generates") {
  using namespace tide::test::matrix;
  if (tide::test::world().rank() != 0) return;
  std::string const path = std::string(TIDE_SOURCE_DIR) + "/docs/trainer.md";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream all;
  all << in.rdbuf();
  std::string page = all.str();
  auto const b = page.find(begin_mark), e = page.find(end_mark);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  std::string const now = page.substr(b + begin_mark.size(), e - b - begin_mark.size());
  std::string const want = table();
  if (now != want && std::getenv("TIDE_WRITE_DOCS") != nullptr) {
    page.replace(b + begin_mark.size(), e - b - begin_mark.size(), want);
    std::ofstream(path) << page;
    MESSAGE("wrote the composition matrix into ", path);
    return;
  }
  CHECK_MESSAGE(now == want, "docs/trainer.md's composition matrix is stale; run test_mpi with TIDE_WRITE_DOCS=1 on "
                             "4 ranks to rewrite it:\n", want);
}

TEST_CASE("composition matrix: rows 0 .. 13 train as their references say") {
  auto& world = tide::test::world();
  if (world.size() != 4) {
    if (world.rank() == 0) MESSAGE("skipped on ", world.size(), " ranks: the matrix runs on 4 (mpi/np4)");
    return;
  }
  tide::test::matrix::run_rows<0>(std::make_index_sequence<14>{});
}
