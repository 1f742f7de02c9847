#include <doctest/doctest.h>

#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tide/core/exec.hpp>
#include <tide/core/parallel.hpp>

TEST_CASE("thread_pool: slices cover [0, n) exactly once, contiguously, in order") {
  for (int threads : {1, 2, 3, 7}) {
    for (std::size_t n : {0u, 1u, 2u, 5u, 64u, 1001u}) {
      std::size_t expect = 0;
      for (int t = 0; t < threads; ++t) {
        auto const [b, e] = tide::thread_pool::slice(n, threads, t);
        CHECK(b == expect);
        CHECK(e >= b);
        if (e > b) CHECK(tide::thread_pool::slice_at(n, threads, b) == t);  // the inverse, for non-empty slices
        expect = e;
      }
      CHECK(expect == n);
    }
  }
}

TEST_CASE("parallel_for: every index visited once, on more than one thread") {
  tide::thread_pool pool{3};
  std::vector<int> hits(10007, 0);
  std::mutex m;
  std::set<std::thread::id> ids;
  for (int rep = 0; rep < 50; ++rep) {
    tide::parallel_for(pool, hits.size(), [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ++hits[i];
      std::lock_guard lock(m);
      ids.insert(std::this_thread::get_id());
    });
  }
  for (int h : hits) REQUIRE(h == 50);
  CHECK(ids.size() == 3);
}

TEST_CASE("parallel_for: fewer items than threads, and exceptions reach the caller") {
  tide::thread_pool pool{4};
  std::atomic<int> calls{0};
  tide::parallel_for(pool, 2, [&](std::size_t b, std::size_t e) {
    CHECK(e == b + 1);
    ++calls;
  });
  CHECK(calls == 2);
  CHECK_THROWS_AS(tide::parallel_for(pool, 8,
                                     [](std::size_t b, std::size_t) {
                                       if (b >= 4) throw std::runtime_error("slice failed");
                                     }),
                  std::runtime_error);
  // The pool still works after an exception.
  std::atomic<std::size_t> sum{0};
  tide::parallel_for(pool, 100, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) sum += i;
  });
  CHECK(sum == 4950);
  CHECK_THROWS_AS(tide::thread_pool{0}, tide::error);
}

TEST_CASE("exec<host> carries the pool") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  CHECK(ex.pool.threads() == 2);
}
