// 03_layer_window: more layers than fit on the device, streamed through a window.
//
// A stack of L dense layers y = tanh(x W^T) keeps its weights in pinned host memory. The device
// (tide::host's budgeted arena) has room for only `window` layers. While layer i computes, the
// copy stream fetches layer i + window - 1 into the slot layer i - 1 used: STRONGHOLD's sliding
// window in forty lines. Events order each computation after the copy it needs; the result is
// checked bit-for-bit against the same computation with every layer resident.
//
//   example_03_layer_window [--layers 12] [--dim 1024] [--rows 64] [--steps 4] [--window 3]

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include <tide/tide.hpp>

using namespace tide::literals;
namespace mem = tide::memory;

struct options {
  int layers = 12, dim = 1024, rows = 64, steps = 4, window = 3;
};

static options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view const k = argv[i];
    int const v = std::atoi(argv[i + 1]);
    if (k == "--layers") o.layers = v;
    else if (k == "--dim") o.dim = v;
    else if (k == "--rows") o.rows = v;
    else if (k == "--steps") o.steps = v;
    else if (k == "--window") o.window = v;
    else TIDE_FAIL(usage, "unknown flag ", k, "; flags: --layers --dim --rows --steps --window");
  }
  TIDE_REQUIRE(o.layers >= 1 && o.dim >= 1 && o.rows >= 1 && o.steps >= 1, "sizes must be positive");
  TIDE_REQUIRE(o.window >= 2, "--window must be at least 2 (one layer computing, one arriving), got ", o.window);
  return o;
}

// y (rows, dim) = tanh(x (rows, dim) @ w^T (dim, dim)), threaded over rows; the per-row math is
// serial, so the result does not depend on the thread count.
static void layer_forward(tide::exec<tide::host> const& ex, tide::tensor_view<float> y,
                          tide::tensor_view<float const> x, tide::tensor_view<float const> w) {
  auto const dim = x.extent(1);
  tide::parallel_for(ex.pool, static_cast<std::size_t>(x.extent(0)), [&](std::size_t b, std::size_t e) {
    for (auto r = static_cast<tide::index_t>(b); r < static_cast<tide::index_t>(e); ++r) {
      float const* xr = &x(r, 0);
      for (tide::index_t o = 0; o < dim; ++o) {
        float const* wr = &w(o, 0);
        float acc = 0.f;
        for (tide::index_t k = 0; k < dim; ++k) acc += xr[k] * wr[k];
        y(r, o) = std::tanh(acc);
      }
    }
  });
}

int main(int argc, char** argv) try {
  options const opt = parse(argc, argv);
  std::size_t const layer_bytes = std::size_t(opt.dim) * std::size_t(opt.dim) * sizeof(float);
  std::size_t const act_bytes = std::size_t(opt.rows) * std::size_t(opt.dim) * sizeof(float);
  std::size_t const budget = std::size_t(opt.window) * layer_bytes + 2 * act_bytes + 4_KiB;

  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  mem::device_arena<tide::host> device{{.budget = budget}};
  mem::pinned_pool<tide::host> pinned;
  mem::device_streams<tide::host> streams;
  mem::transfer_engine<tide::host> engine{streams.copy, {.max_in_flight = 2}};

  // Model data on the host tier: L weight matrices (dim, dim), deterministic.
  std::vector<float*> host_w(std::size_t(opt.layers));
  for (int l = 0; l < opt.layers; ++l) {
    host_w[std::size_t(l)] = static_cast<float*>(pinned.allocate(layer_bytes));
    float const scale = 1.5f / std::sqrt(float(opt.dim));
    std::uint32_t s = 2654435761u * std::uint32_t(l + 1);
    for (std::size_t i = 0; i < std::size_t(opt.dim) * std::size_t(opt.dim); ++i) {
      s = s * 1664525u + 1013904223u;
      host_w[std::size_t(l)][i] = (float(s >> 8) / float(1u << 24) - 0.5f) * 2.f * scale;
    }
  }
  std::printf("layers: %d x (%d, %d) fp32 = %.1f MiB of weights in pinned host memory\n", opt.layers, opt.dim,
              opt.dim, double(layer_bytes) * opt.layers / double(1_MiB));
  std::printf("device budget: %.1f MiB = %d layer slots + 2 activation buffers\n", double(budget) / double(1_MiB),
              opt.window);

  // Device memory: `window` layer slots and two activation buffers, all from the budgeted arena.
  std::vector<float*> slot(std::size_t(opt.window));
  for (auto& s : slot) s = static_cast<float*>(device.allocate(layer_bytes));
  auto* act0 = static_cast<float*>(device.allocate(act_bytes));
  auto* act1 = static_cast<float*>(device.allocate(act_bytes));
  std::vector<mem::event<tide::host>> fetched(std::size_t(opt.window));

  auto fetch = [&](int layer) {
    auto const s = std::size_t(layer % opt.window);
    engine.copy_async(slot[s], host_w[std::size_t(layer)], layer_bytes, mem::copy_direction::host_to_device,
                      fetched[s]);
  };
  auto fill_input = [&](float* x, int step) {
    for (std::size_t i = 0; i < std::size_t(opt.rows) * std::size_t(opt.dim); ++i)
      x[i] = std::sin(0.001f * float(i) + float(step));
  };

  std::vector<float> result(std::size_t(opt.rows) * std::size_t(opt.dim) * std::size_t(opt.steps));
  int stalls = 0, computes = 0;
  for (int step = 0; step < opt.steps; ++step) {
    float* x = act0;
    float* y = act1;
    fill_input(x, step);
    for (int l = 0; l < std::min(opt.window - 1, opt.layers); ++l) fetch(l);
    for (int l = 0; l < opt.layers; ++l) {
      // The slot of layer l-1 is free now (its compute finished on this thread): refill it.
      if (l + opt.window - 1 < opt.layers) fetch(l + opt.window - 1);
      auto& ready = fetched[std::size_t(l % opt.window)];
      if (!ready.query()) ++stalls;  // compute would have waited for this copy
      ready.synchronize();
      ++computes;
      tide::tensor_view<float const> w{slot[std::size_t(l % opt.window)], {opt.dim, opt.dim}};
      layer_forward(ex, {y, {opt.rows, opt.dim}}, tide::tensor_view<float const>{x, {opt.rows, opt.dim}}, w);
      std::swap(x, y);
    }
    std::memcpy(&result[std::size_t(step) * std::size_t(opt.rows) * std::size_t(opt.dim)], x, act_bytes);
    auto const st = engine.stats();
    std::printf("step %d/%d  host->device %.1f MiB  copies %zu  arena peak %.1f / %.1f MiB  waited for %d of %d layers\n",
                step + 1, opt.steps, double(st.host_to_device_bytes) / double(1_MiB), st.copies,
                double(device.stats().peak) / double(1_MiB), double(budget) / double(1_MiB), stalls, computes);
  }
  engine.synchronize();

  // The same computation with every layer resident (plain host memory, no budget).
  std::vector<float> x(std::size_t(opt.rows) * std::size_t(opt.dim)), y(x.size());
  bool identical = true;
  for (int step = 0; step < opt.steps; ++step) {
    fill_input(x.data(), step);
    for (int l = 0; l < opt.layers; ++l) {
      layer_forward(ex, {y.data(), {opt.rows, opt.dim}}, tide::tensor_view<float const>{x.data(), {opt.rows, opt.dim}},
                    tide::tensor_view<float const>{host_w[std::size_t(l)], {opt.dim, opt.dim}});
      std::swap(x, y);
    }
    identical = identical &&
                std::memcmp(x.data(), &result[std::size_t(step) * x.size()], act_bytes) == 0;
  }
  auto const st = engine.stats();
  std::printf("moved %.1f MiB in %zu copies (%.1f ms copying on the copy stream)\n",
              double(st.host_to_device_bytes) / double(1_MiB), st.copies, st.copy_ms);
  std::printf("windowed result %s the all-resident result\n", identical ? "is bit-identical to" : "DIFFERS from");

  // A budget that cannot hold the window is refused up front, with the numbers.
  try {
    mem::device_arena<tide::host> small{{.budget = layer_bytes}};
    void* a = small.allocate(layer_bytes);
    void* b = small.allocate(layer_bytes);  // the second slot does not fit
    (void)a, (void)b;
  } catch (tide::error const& e) {
    std::printf("a budget of one layer is refused: %s\n", e.message().c_str());
  }

  for (auto* w : host_w) pinned.deallocate(w, layer_bytes);
  for (auto* s : slot) device.deallocate(s, layer_bytes);
  device.deallocate(act0, act_bytes);
  device.deallocate(act1, act_bytes);
  return identical ? 0 : 1;
} catch (tide::error const& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
