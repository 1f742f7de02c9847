// Figure copy_engine_vs_copy_probe: host tier-to-tier copy bandwidth of transfer_engine<host>.
// Chunks of 64 MiB go from a device_arena<host> to pinned_pool<host> blocks and back (an evict
// of every chunk, then a fetch of every chunk), all issued through the engine onto its copy
// stream and timed until the engine is synchronized. Anchor: copy_probe_gbs(), the 2-thread
// memcpy probe on the same total size, measured in the same run before and after (averaged:
// on a shared machine the load drifts). Goal: ratio >= 0.8.
// Detail: each direction alone, the same round with the helper lane off (split_bytes = 0: one
// memcpy thread), and the bandwidth the engine's own per-copy timing reports.

#include <cstddef>
#include <cstring>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/pinned_pool.hpp>
#include <tide/memory/stream.hpp>
#include <tide/memory/transfer_engine.hpp>

#include "harness.hpp"
#include "roofline.hpp"

namespace mem = tide::memory;
using mem::copy_direction;
using namespace tide::literals;

namespace {

struct tiers {
  std::size_t chunk;
  std::size_t count;
  mem::device_arena<tide::host> arena;
  mem::pinned_pool<tide::host> pool{{.lock_pages = false}};  // ulimit -l is often small; locking does not change memcpy speed
  std::vector<void*> device, pinned;

  tiers(std::size_t chunk_bytes, std::size_t chunks)
      : chunk(chunk_bytes), count(chunks), arena({.budget = chunk_bytes * chunks}) {
    for (std::size_t i = 0; i < count; ++i) {
      device.push_back(arena.allocate(chunk));
      pinned.push_back(pool.allocate(chunk));
      std::memset(device.back(), static_cast<int>(i + 1), chunk);  // touch: no page faults timed
    }
  }
  ~tiers() {
    for (std::size_t i = 0; i < count; ++i) {
      arena.deallocate(device[i], chunk);
      pool.deallocate(pinned[i], chunk);
    }
  }
  tiers(tiers const&) = delete;
  tiers& operator=(tiers const&) = delete;
};

// GB/s of one round: `evict` moves every chunk device -> pinned, `fetch` pinned -> device.
double round_gbs(tiers& t, mem::transfer_options const& opts, bool evict, bool fetch) {
  mem::stream<tide::host> copy;
  mem::transfer_engine<tide::host> engine{copy, opts};
  double const s = tide::bench::median_seconds([&] {
    for (std::size_t i = 0; evict && i < t.count; ++i)
      engine.copy_async(t.pinned[i], t.device[i], t.chunk, copy_direction::device_to_host);
    for (std::size_t i = 0; fetch && i < t.count; ++i)
      engine.copy_async(t.device[i], t.pinned[i], t.chunk, copy_direction::host_to_device);
    engine.synchronize();
  });
  double const moved = static_cast<double>(t.chunk * t.count) * ((evict ? 1 : 0) + (fetch ? 1 : 0));
  return moved / s / 1e9;
}

}  // namespace

int main() {
  bool const quick = tide::bench::quick();
  std::size_t const chunk = quick ? 4_MiB : 64_MiB;
  std::size_t const chunks = 4;  // 256 MiB a direction: the probe's size, far beyond the caches
  tiers t(chunk, chunks);

  mem::transfer_options const lane_on{};                   // the default: split with the helper lane
  mem::transfer_options const lane_off{.split_bytes = 0};  // one memcpy thread per copy

  // The probe before and after, averaged: on a shared machine the load drifts during a run.
  std::size_t const probe_elems = chunk * chunks / sizeof(float);
  double const probe_before = tide::bench::copy_probe_gbs(probe_elems);
  double const both = round_gbs(t, lane_on, true, true);
  double const evict = round_gbs(t, lane_on, true, false);
  double const fetch = round_gbs(t, lane_on, false, true);
  double const one_thread = round_gbs(t, lane_off, true, true);
  double const probe_after = tide::bench::copy_probe_gbs(probe_elems);
  double const probe = (probe_before + probe_after) / 2;

  // The engine's own clock: bytes over the summed per-copy times (stamped on the copy worker).
  double timed = 0;
  {
    mem::stream<tide::host> copy;
    mem::transfer_engine<tide::host> engine{copy, lane_on};
    for (std::size_t i = 0; i < chunks; ++i)
      engine.copy_async(t.pinned[i], t.device[i], chunk, copy_direction::device_to_host);
    engine.synchronize();
    auto const st = engine.stats();
    timed = static_cast<double>(st.device_to_host_bytes) / (st.copy_ms * 1e-3) / 1e9;
  }

  tide::bench::figure{
      .bench = "copy_engine",
      .name = "copy_engine_vs_copy_probe",
      .value = both,
      .unit = "GB/s",
      .anchor = "copy_probe",
      .anchor_value = probe,
      .higher_is_better = true,
      .goal = 0.8,
      .detail = {{"chunk_mib", static_cast<double>(chunk >> 20)},
                 {"probe_before_gbs", probe_before},
                 {"probe_after_gbs", probe_after},
                 {"chunks", static_cast<double>(chunks)},
                 {"evict_gbs", evict},
                 {"fetch_gbs", fetch},
                 {"one_thread_gbs", one_thread},
                 {"one_thread_ratio", one_thread / probe},
                 {"engine_timed_gbs", timed}},
  }.print();
}
