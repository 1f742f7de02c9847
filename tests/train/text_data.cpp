#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include <tide/train/text_data.hpp>

namespace tt = tide::train;

TEST_CASE("window_loader: targets are the next bytes, windows come from the right split") {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  tt::byte_corpus corpus{text, 0.2};
  CHECK(corpus.part(tt::split::train).size() == 800);
  CHECK(corpus.part(tt::split::validation).size() == 200);
  int const B = 4, T = 16;
  std::vector<std::int32_t> in(B * T), tg(B * T);
  tt::window_loader train{corpus, tt::split::train, B, T, 7};
  std::set<std::int32_t> firsts;
  for (int step = 0; step < 20; ++step) {
    train.next({in.data(), {B, T}}, {tg.data(), {B, T}});
    for (int b = 0; b < B; ++b) {
      firsts.insert(in[b * T]);
      for (int t = 0; t < T; ++t) {
        int const x = in[b * T + t], y = tg[b * T + t];
        REQUIRE(y == 'a' + (x - 'a' + 1) % 26);  // the text's next letter
        if (t + 1 < T) REQUIRE(in[b * T + t + 1] == y);
      }
    }
  }
  CHECK(firsts.size() > 10);  // windows start at many places
}

TEST_CASE("window_loader: deterministic from the seed, resumable from its position") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += static_cast<char>(i * 7919 % 251);
  tt::byte_corpus corpus{text};
  int const B = 2, T = 8;
  auto draw = [&](tt::window_loader& l) {
    std::vector<std::int32_t> in(B * T), tg(B * T);
    l.next({in.data(), {B, T}}, {tg.data(), {B, T}});
    return in;
  };
  tt::window_loader a{corpus, tt::split::train, B, T, 42}, b{corpus, tt::split::train, B, T, 42},
      c{corpus, tt::split::train, B, T, 43};
  for (int i = 0; i < 5; ++i) CHECK(draw(a) == draw(b));
  CHECK(draw(a) != draw(c));
  // Resume: a fresh loader seeked to a's position draws what a draws next.
  tt::window_loader resumed{corpus, tt::split::train, B, T, 42};
  resumed.seek(a.position());
  CHECK(draw(resumed) == draw(a));
}

TEST_CASE("window_loader: W ranks of batch B draw together exactly one process's batch W B, by rows") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += static_cast<char>(i * 7919 % 251);
  tt::byte_corpus corpus{text};
  int const B = 2, T = 8;
  for (int w : {2, 3, 4}) {
    CAPTURE(w);
    tt::window_loader whole{corpus, tt::split::train, w * B, T, 42};
    std::vector<tt::window_loader> ranks;
    for (int r = 0; r < w; ++r) ranks.emplace_back(corpus, tt::split::train, B, T, 42, tt::shard{r, w});
    for (int step = 0; step < 4; ++step) {
      std::vector<std::int32_t> in(static_cast<std::size_t>(w * B * T)), tg(in.size());
      whole.next({in.data(), {w * B, T}}, {tg.data(), {w * B, T}});
      for (int r = 0; r < w; ++r) {
        std::vector<std::int32_t> rin(static_cast<std::size_t>(B * T)), rtg(rin.size());
        ranks[static_cast<std::size_t>(r)].next({rin.data(), {B, T}}, {rtg.data(), {B, T}});
        auto const at = in.begin() + r * B * T;
        CHECK(std::equal(rin.begin(), rin.end(), at));  // rows [r B, (r + 1) B)
        CHECK(std::equal(rtg.begin(), rtg.end(), tg.begin() + r * B * T));
      }
    }
  }
  CHECK_THROWS_AS((tt::window_loader{corpus, tt::split::train, B, T, 42, tt::shard{2, 2}}), tide::error);
}

TEST_CASE("bad input is refused with a clear error") {
  tt::byte_corpus tiny{"hello world", 0.5};
  CHECK_THROWS_AS((tt::window_loader{tiny, tt::split::validation, 1, 64, 0}), tide::error);
  CHECK_THROWS_AS(tt::byte_corpus::from_path("/no/such/file"), tide::error);
  tt::window_loader l{tt::byte_corpus{std::string(100, 'x')}, tt::split::train, 2, 4, 0};
  std::vector<std::int32_t> in(6), tg(6);
  CHECK_THROWS_AS(l.next({in.data(), {2, 3}}, {tg.data(), {2, 3}}), tide::error);
}

TEST_CASE("the fortunes corpus loads (./tide installs the Debian package)") {
  REQUIRE_MESSAGE(std::filesystem::exists(tt::fortunes_path()), "install the Debian package fortunes");
  auto corpus = tt::byte_corpus::from_path(tt::fortunes_path());
  CHECK(corpus.bytes().size() > 1'000'000);
  // English text: mostly printable ASCII.
  std::size_t printable = 0;
  for (unsigned char ch : corpus.bytes().substr(0, 100000)) printable += (ch >= 32 && ch < 127) || ch == '\n';
  CHECK(printable > 95000);
}

TEST_CASE("window_loader: a job resumed at another shape draws on from the windows the job drew") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += static_cast<char>(i * 7919 % 251);
  tt::byte_corpus corpus{text};
  int const T = 8;
  auto rows = [&](tt::window_loader& l, int b) {
    std::vector<std::int32_t> in(static_cast<std::size_t>(b * T)), tg(in.size());
    l.next({in.data(), {b, T}}, {tg.data(), {b, T}});
    return in;
  };
  // Two ranks of 2 rows for 3 batches: 12 windows.
  tt::window_loader r0{corpus, tt::split::train, 2, T, 42, tt::shard{0, 2}},
      r1{corpus, tt::split::train, 2, T, 42, tt::shard{1, 2}};
  for (int i = 0; i < 3; ++i) (void)rows(r0, 2), (void)rows(r1, 2);
  CHECK(r0.windows_drawn() == 12);
  CHECK(r1.windows_drawn() == 12);
  auto next = rows(r0, 2);  // what the job draws next: r0's rows, then r1's
  auto const r1_next = rows(r1, 2);
  next.insert(next.end(), r1_next.begin(), r1_next.end());
  // One process of 2 rows a batch (a pipeline's micro-batches) goes on at its 7th and 8th batch.
  tt::window_loader one{corpus, tt::split::train, 2, T, 42};
  one.seek_windows(12);
  CHECK(one.position() == 6);
  auto both = rows(one, 2);
  auto const second = rows(one, 2);
  both.insert(both.end(), second.begin(), second.end());
  CHECK(both == next);
  // Seeked by batches instead (the job's 3), it would draw windows 6 and 7 again: r1's rows of
  // the job's 2nd batch.
  tt::window_loader again{corpus, tt::split::train, 2, T, 42, tt::shard{1, 2}}, wrong{corpus, tt::split::train, 2, T, 42};
  (void)rows(again, 2);
  wrong.seek(3);
  auto const repeated = rows(wrong, 2);
  CHECK(repeated == rows(again, 2));
  CHECK(repeated != std::vector<std::int32_t>(next.begin(), next.begin() + 2 * T));
  // 12 windows are not a whole number of batches of 5: a clear error, the loader as it was.
  tt::window_loader five{corpus, tt::split::train, 5, T, 42};
  CHECK_THROWS_WITH_AS(five.seek_windows(12), doctest::Contains("not a whole number of this job's batches of 5"),
                       tide::error);
  CHECK(five.position() == 0);
}
