#pragma once
// Helpers the optimizer kernel tests (tests/kernels/adam.cpp, adamw.cpp, sgd.cpp) share: the
// FMA contraction slack of their tolerances, random optimizer state, the 1/2/3-thread identity
// check, and the reader of the PyTorch golden file (tests/golden/optim_steps.bin).

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/dtype.hpp>
#include <tide/core/exec.hpp>
#include <tide/core/parallel.hpp>
#include <tide/core/tensor_view.hpp>

#include "support/kernel_checks.hpp"

namespace tide::test {

// Where the compiler may contract a*b+c into an FMA (the target has FMA units: -march=haswell
// and later), it may contract the scalar reference and the vector host code differently; each
// sum then differs by about one rounding of its terms, more than an ulp of the result when the
// terms cancel. Without FMA units both run the same operations and must be bit-identical.
#if defined(__FMA__)
inline constexpr double contraction_slack = 0x1p-22;
#else
inline constexpr double contraction_slack = 0;
#endif

// One tensor's parameters and gradient with random contents: p and g in [-1, 1), from noise
// seeds `seed` and `seed + 1`. The optimizers' states below add their own arrays.
template <class Grad>
struct param_state {
  std::vector<float> p;
  std::vector<Grad> g;
  param_state(index_t n, unsigned seed) {
    for (index_t i = 0; i < n; ++i) {
      p.push_back(noise(seed, i));
      g.push_back(from_float<Grad>(noise(seed + 1, i)));
    }
  }
  index_t size() const { return static_cast<index_t>(p.size()); }
  tensor_view<float> pv() { return {p.data(), {size()}}; }
  tensor_view<Grad const> gv() const { return {g.data(), {size()}}; }
};

// Adam's and AdamW's state, as after a few steps: m in [-0.1, 0.1), v in [0, 0.01) (seeds
// seed + 2, seed + 3).
template <class Grad>
struct adam_state : param_state<Grad> {
  std::vector<float> m, v;
  adam_state(index_t n, unsigned seed) : param_state<Grad>(n, seed) {
    for (index_t i = 0; i < n; ++i) {
      m.push_back(0.1f * noise(seed + 2, i));
      v.push_back(0.005f * (noise(seed + 3, i) + 1.f));
    }
  }
  tensor_view<float> mv() { return {m.data(), {this->size()}}; }
  tensor_view<float> vv() { return {v.data(), {this->size()}}; }
  // Every fp32 array the step writes.
  std::vector<std::vector<float> const*> written() const { return {&this->p, &m, &v}; }
};

// SGD's state: the momentum buffer in [-1, 1) (seed + 2).
template <class Grad>
struct sgd_state : param_state<Grad> {
  std::vector<float> buf;
  sgd_state(index_t n, unsigned seed) : param_state<Grad>(n, seed) {
    for (index_t i = 0; i < n; ++i) buf.push_back(noise(seed + 2, i));
  }
  tensor_view<float> bv() { return {buf.data(), {this->size()}}; }
  std::vector<std::vector<float> const*> written() const { return {&this->p, &buf}; }
};

// Runs step(ex, state, working) on fresh State(n, seed) with 1, 2 and 3 threads; every array the
// step writes (State::written() and the Work copy) must come out bit-identical, and p must
// have moved.
template <class State, class Work, class Step>
void check_thread_count_identity(index_t n, unsigned seed, Step&& step) {
  std::vector<State> runs;
  std::vector<std::vector<Work>> working;
  for (int threads : {1, 2, 3}) {
    State s(n, seed);
    std::vector<Work> w(static_cast<std::size_t>(n));
    thread_pool pool{threads};
    step(exec<host>{pool}, s, tensor_view<Work>{w.data(), {n}});
    runs.push_back(std::move(s));
    working.push_back(std::move(w));
  }
  for (std::size_t r = 1; r < runs.size(); ++r) {
    auto const arrays = runs[r].written(), first = runs[0].written();
    for (std::size_t a = 0; a < arrays.size(); ++a) {
      CAPTURE(a);
      CHECK(std::memcmp(arrays[a]->data(), first[a]->data(), sizeof(float) * static_cast<std::size_t>(n)) == 0);
    }
    CHECK(std::memcmp(working[r].data(), working[0].data(), sizeof(Work) * static_cast<std::size_t>(n)) == 0);
  }
  CHECK(std::memcmp(runs[0].p.data(), State(n, seed).p.data(), sizeof(float) * static_cast<std::size_t>(n)) != 0);
}

// ---- the PyTorch golden file (tests/golden/make_optim_golden.py documents the layout) ----------

struct golden_run {
  int kind = 0;  // 0 Adam, 1 AdamW, 2 SGD
  float lr = 0, h1 = 0, h2 = 0, h3 = 0, weight_decay = 0;
  int nesterov = 0, states = 0;
  std::vector<std::vector<std::vector<float>>> steps;  // [step][0: p, 1..: states] (n)
};

struct golden {
  index_t n = 0;
  int steps = 0;
  std::vector<float> p0;
  std::vector<std::vector<float>> grads;  // [step] (n)
  std::vector<golden_run> runs;
};

inline golden read_golden() {
  std::string const path = std::string(TIDE_SOURCE_DIR) + "/tests/golden/optim_steps.bin";
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path, " (written by tests/golden/make_optim_golden.py)");
  std::vector<char> const bytes{std::istreambuf_iterator<char>(in), {}};
  std::size_t at = 0;
  auto const take = [&](void* out, std::size_t size) {
    REQUIRE(at + size <= bytes.size());
    std::memcpy(out, bytes.data() + at, size);
    at += size;
  };
  auto const i32 = [&] {
    std::int32_t x;
    take(&x, sizeof x);
    return x;
  };
  auto const f32 = [&] {
    float x;
    take(&x, sizeof x);
    return x;
  };
  golden gold;
  REQUIRE(bytes.size() > 8);
  REQUIRE(std::string(bytes.data(), 8) == "TIDEOPT1");
  at = 8;
  gold.n = i32();
  gold.steps = i32();
  int const runs = i32();
  REQUIRE(gold.n > 0);
  REQUIRE(gold.steps > 0);
  auto const array = [&] {
    std::vector<float> a(static_cast<std::size_t>(gold.n));
    take(a.data(), a.size() * sizeof(float));
    return a;
  };
  gold.p0 = array();
  for (int s = 0; s < gold.steps; ++s) gold.grads.push_back(array());
  for (int r = 0; r < runs; ++r) {
    golden_run run;
    run.kind = i32();
    run.lr = f32();
    run.h1 = f32();
    run.h2 = f32();
    run.h3 = f32();
    run.weight_decay = f32();
    run.nesterov = i32();
    run.states = i32();
    for (int s = 0; s < gold.steps; ++s) {
      std::vector<std::vector<float>> arrays;
      for (int a = 0; a <= run.states; ++a) arrays.push_back(array());
      run.steps.push_back(std::move(arrays));
    }
    gold.runs.push_back(std::move(run));
  }
  CHECK(at == bytes.size());
  return gold;
}

}  // namespace tide::test
