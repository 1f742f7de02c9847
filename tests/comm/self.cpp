// comm::self: the one-rank communicator, through the same calls as comm::mpi.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tide/comm/self.hpp"
#include "tide/memory/stream.hpp"

using tide::comm::reduce_op;

static_assert(tide::comm::Communicator<tide::comm::self>);
static_assert(!tide::comm::Communicator<int>);

TEST_CASE("one rank: reductions keep the data, gathers copy, a send waits for its receive") {
  tide::comm::self c;
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  std::vector<float> g{1.f, -2.f, 3.5f};
  c.all_reduce(std::span<float>(g), reduce_op::sum);
  CHECK(g == std::vector<float>{1.f, -2.f, 3.5f});
  std::vector<float> out(3, 0.f);
  c.reduce_scatter(std::span<float const>(g), std::span<float>(out), reduce_op::max);
  CHECK(out == g);
  std::vector<tide::bf16> h(4, tide::bf16(0.5f)), h2(4, tide::bf16(0.f));
  c.all_gather(std::span<tide::bf16 const>(h), std::span<tide::bf16>(h2));
  for (auto x : h2) CHECK(static_cast<float>(x) == 0.5f);
  std::vector<tide::index_t> counts{3};
  std::vector<float> v(3, 0.f);
  c.all_gatherv(std::span<float const>(g), std::span<float>(v), std::span<tide::index_t const>(counts));
  CHECK(v == g);
  c.broadcast(std::span<float>(g), 0);
  c.send(std::span<float const>(g), 0, 5);
  std::vector<float> got(3, 0.f);
  c.recv(std::span<float>(got), 0, 5);
  CHECK(got == g);
  c.barrier();
  CHECK(c.operations() == 8);
  auto sub = c.split(3, 1);
  CHECK(sub.size() == 1);
}

TEST_CASE("asynchronous operations wait for the events their lane was told to wait for") {
  tide::comm::self c;
  tide::memory::stream<tide::host> producer;
  tide::memory::event<tide::host> filled;
  std::vector<std::int32_t> data(4, 0), copy(4, -1);
  struct fill {
    std::vector<std::int32_t>* d;
    void operator()() const {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      for (auto& x : *d) x = 7;
    }
  } job{&data};
  tide::memory::launch(producer, job);
  filled.record(producer);
  c.lane().wait(filled);
  auto const r = c.all_gather_async(std::span<std::int32_t const>(data), std::span<std::int32_t>(copy));
  c.wait(r);
  CHECK(c.test(r));
  for (auto x : copy) CHECK(x == 7);  // the gather ran after the fill
}

TEST_CASE("bad arguments are usage errors; a receive with no send fails the lane, and it stays failed") {
  tide::comm::self c;
  std::vector<float> a(4), b(3);
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (tide::error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message_of([&] { c.all_gather(std::span<float const>(a), std::span<float>(b)); })
            .find("all_gather: the output holds 3 elements; it must hold size() x the input's 4 = 4") != std::string::npos);
  CHECK(message_of([&] { c.broadcast(std::span<float>(a), 1); }).find("broadcast root 1 is not a rank") != std::string::npos);
  std::vector<tide::index_t> two{4, 4};
  CHECK(message_of([&] {
          c.all_gatherv(std::span<float const>(a), std::span<float>(a), std::span<tide::index_t const>(two));
        }).find("counts holds 2 entries; it must hold one per rank (1)") != std::string::npos);
  c.barrier();  // still fine: nothing was submitted
  CHECK(message_of([&] { c.recv(std::span<float>(a), 0, 9); }).find("has no matching send") != std::string::npos);
  CHECK_THROWS_AS(c.barrier(), tide::error);
}
