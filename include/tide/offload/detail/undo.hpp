#pragma once
// The undo journals of the offload engine (scheduler_options::undo_on_error): each chunk the
// optimizer steps in a step first keeps a host copy of its parameters, fp32 master and optimizer
// state (those on the host or device: the NVMe tier's file keeps its own lists' old slot, and
// gradient-slot reuse rounds the parameters back from the master), and each chunk handed to a
// sink with extra lists a copy of those, so a step that throws can be put back (abort_step). The
// host blocks are acquired before the update runs; the copies are taken by whoever runs it (the
// optimizer worker for host steps).
//
// Three ways to keep the values before an update, cheapest first:
// - swap: a chunk whose blocks all live on the host takes new blocks of the chunk's size; the
//   update reads the old ones and writes the new ones (optim::out_of_place_v), and once it ran
//   the chunk's blocks and the journal's swap (swap_in): the journal holds the old values without
//   a byte copied. Until the swap the chunk holds the values before the step, so a failure before
//   it has nothing to undo.
// - fold: the update writes the old values beside the new ones in its own pass (attach).
// - copy: save() before the update.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/chunk/chunk.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/optim/optimizer.hpp"

namespace tide::offload::detail {

// Where one chunk's updated values live: the parameter chunk (T), the master (fp32; T = float:
// the parameter chunk itself) and the optimizer's N lists.
template <class T, std::size_t N>
struct update_targets {
  T* param = nullptr;
  float* master = nullptr;  // null when T = float
  std::array<float*, N> state{};
};

template <std::size_t N>
struct undo_record {
  std::uint32_t c = 0;
  std::size_t elements = 0;
  std::array<std::byte*, 2 + N> copy{};  // param, master, state...
  bool saved = false;  // the copies hold the values before the step (restore puts them back)
  // Swap: the copies are blocks of the chunks' own sizes, for the update's new values; `ran` is
  // set by whoever ran the update, swap_in (this thread, after it) exchanges them with the chunks.
  bool swap = false;
  bool ran = false;
  std::array<std::size_t, 2 + N> block{};  // each copy's size
};

// N: the optimizer's state lists.
template <Backend B, Element T, std::size_t N>
class undo_journal {
 public:
  using record = undo_record<N>;
  using targets = update_targets<T, N>;
  using tensor = optim::update_tensor<T, N>;

  undo_journal(memory::pinned_pool<B>& host, std::size_t chunks) : host_(&host) {
    records_.reserve(chunks);  // one record per chunk and step: a step never reallocates
  }
  undo_journal(undo_journal const&) = delete;
  undo_journal& operator=(undo_journal const&) = delete;
  ~undo_journal() { discard(); }

  // Host blocks for chunk c's copies, acquired before its update: one per list the chunk has in
  // `x` (under ZeRO a chunk another rank steps has no master and no state here).
  record* begin(std::uint32_t c, std::size_t elements, targets const& x) {
    return add({c, elements}, x, [&](std::size_t k) { return bytes(k, elements); });
  }
  // Swap: blocks of the chunks' sizes (`param_bytes` for the parameters, `fp32_bytes` for the
  // master and each state list), for the update to write into; the chunks keep theirs until
  // swap_in.
  record* begin_swap(std::uint32_t c, std::size_t elements, targets const& x, std::size_t param_bytes,
                          std::size_t fp32_bytes) {
    record r{c, elements};
    r.swap = true;
    return add(r, x, [&](std::size_t k) {
      std::size_t const size = k == 0 ? param_bytes : fp32_bytes;
      TIDE_ASSERT(size >= bytes(k, elements));
      return size;
    });
  }
  // Points u at r's blocks (swap), reading from the chunks', and gives each block the chunk's
  // bytes past the update's elements (never touched: they travel with the block). Runs where the
  // update runs, on the host. False when an array u updates is not one r keeps.
  [[nodiscard]] bool redirect(record const& r, targets const& x, tensor& u) const {
    if (r.elements != static_cast<std::size_t>(u.n)) return false;
    tensor with = u;
    for (std::size_t k = 0; k < slots(); ++k) {
      if (r.copy[k] == nullptr) continue;
      void const* const a = address(x, k);
      bool const fp32 = bytes(k, 1) == sizeof(float);
      if (fp32 && a == u.master && with.src_master == nullptr) {
        with.src_master = u.master;
        with.master = reinterpret_cast<float*>(r.copy[k]);
      } else if (k == 0 && u.working != nullptr && a == u.working) {
        with.working = reinterpret_cast<T*>(r.copy[k]);  // written from the master, never read
      } else {
        std::size_t j = 0;
        while (j < N && !(fp32 && u.state[j] != nullptr && a == u.state[j])) ++j;
        if (j == N) return false;
        with.src_state[j] = u.state[j];
        with.state[j] = reinterpret_cast<float*>(r.copy[k]);
      }
    }
    for (std::size_t k = 0; k < slots(); ++k)
      if (r.copy[k] != nullptr) {
        std::size_t const n = bytes(k, r.elements);
        std::memcpy(r.copy[k] + n, static_cast<std::byte const*>(address(x, k)) + n, r.block[k] - n);
      }
    u = with;
    return true;
  }
  static void mark_ran(record& r) noexcept { r.ran = true; }
  // Once a swap record's update ran (and this thread synchronized with whoever ran it): the
  // chunks take the blocks with the new values, the journal keeps theirs, which restore() puts
  // back. `chunk(k)` is chunk::chunk& of list k (param, master, state...), on the host. Returns
  // the bytes swapped (0: nothing to swap).
  template <class ChunkOf>
  std::size_t swap_in(record& r, ChunkOf&& chunk_of) noexcept {
    if (!r.swap || !r.ran || r.saved) return 0;
    std::size_t swapped = 0;
    for (std::size_t k = 0; k < slots(); ++k) {
      if (r.copy[k] == nullptr) continue;
      chunk::chunk& ch = chunk_of(k);
      TIDE_ASSERT(ch.tier() == chunk::tier::host && ch.capacity() == r.block[k]);
      std::byte* const old = ch.detach();
      ch.attach(r.copy[k], chunk::tier::host);
      r.copy[k] = old;
      swapped += r.block[k];
    }
    r.saved = true;
    return swapped;
  }

  // Points u's prev_* arrays at r's copies, so an optimizer that keeps them (optim::keeps_prev_v)
  // writes them in its own pass: each list the journal keeps must be one of the arrays u updates
  // (master, working copy, a state list). False when one is not: then save() before the update.
  // Either way the caller marks r saved (mark_saved) once the update returned.
  [[nodiscard]] bool attach(record const& r, targets const& x, tensor& u) const noexcept {
    if (r.elements != static_cast<std::size_t>(u.n)) return false;
    tensor with = u;
    for (std::size_t k = 0; k < slots(); ++k) {
      if (r.copy[k] == nullptr) continue;
      void const* const a = address(x, k);
      bool const fp32 = bytes(k, 1) == sizeof(float);  // the list's element: fp32, or T (the parameters)
      if (fp32 && a == u.master) {
        with.prev_master = reinterpret_cast<float*>(r.copy[k]);
        continue;
      }
      if (k == 0 && u.working != nullptr && a == u.working) {
        with.prev_working = reinterpret_cast<T*>(r.copy[k]);
        continue;
      }
      std::size_t j = 0;
      while (j < N && !(fp32 && u.state[j] != nullptr && a == u.state[j])) ++j;
      if (j == N) return false;
      with.prev_state[j] = reinterpret_cast<float*>(r.copy[k]);
    }
    u = with;
    return true;
  }
  static void mark_saved(record& r) noexcept { r.saved = true; }

  // Copies the values before the update into r's host blocks, after the work `ex` ran so far
  // (the tier's exec: exec<host> for a host step, the engine's for a device one). Throws only
  // for a device whose stream failed.
  template <Backend E>
  void save(record& r, targets const& x, exec<E> const& ex) const {
    for (std::size_t k = 0; k < slots(); ++k)
      if (r.copy[k] != nullptr) memory::read_to_host(ex, r.copy[k], address(x, k), bytes(k, r.elements));
    r.saved = true;
  }
  // Puts the values back wherever the chunks are now, in ex's order (a device: the caller
  // synchronizes before the host reads them).
  template <Backend E>
  void restore(record const& r, targets const& x, exec<E> const& ex) const {
    if (!r.saved) return;  // the update never ran
    for (std::size_t k = 0; k < slots(); ++k)
      if (r.copy[k] != nullptr)
        memory::write_from_host(ex, const_cast<void*>(address(x, k)), r.copy[k], bytes(k, r.elements));
  }
  [[nodiscard]] std::span<record const> records() const noexcept { return records_; }
  // The bytes r keeps (a copy record: what its copies write).
  [[nodiscard]] std::size_t bytes_of(record const& r) const noexcept {
    std::size_t total = 0;
    for (std::size_t k = 0; k < slots(); ++k)
      if (r.copy[k] != nullptr) total += r.block[k];
    return total;
  }
  void discard() noexcept {
    for (record& r : records_) release(r);
    records_.clear();
  }

 private:
  static constexpr bool has_master = !std::is_same_v<T, float>;
  [[nodiscard]] static constexpr std::size_t slots() noexcept { return 2 + N; }
  [[nodiscard]] static bool used(std::size_t k) noexcept { return k != 1 || has_master; }
  [[nodiscard]] static std::size_t bytes(std::size_t k, std::size_t elements) noexcept {
    return elements * (k == 0 ? sizeof(T) : sizeof(float));
  }
  [[nodiscard]] static void const* address(targets const& x, std::size_t k) noexcept {
    if (k == 0) return x.param;
    if (k == 1) return x.master;
    return x.state[k - 2];
  }
  // r with a block for each list the chunk has in x, of size(k) bytes, kept in the journal.
  template <class Size>
  record* add(record r, targets const& x, Size&& size) {
    try {
      for (std::size_t k = 0; k < slots(); ++k)
        if (used(k) && address(x, k) != nullptr) {
          r.block[k] = size(k);
          r.copy[k] = static_cast<std::byte*>(host_->allocate(r.block[k], 256));
        }
    } catch (...) {
      release(r);
      throw;
    }
    TIDE_ASSERT(records_.size() < records_.capacity());
    records_.push_back(r);
    return &records_.back();
  }
  void release(record& r) noexcept {
    for (std::size_t k = 0; k < r.copy.size(); ++k)
      if (r.copy[k] != nullptr) host_->deallocate(std::exchange(r.copy[k], nullptr), r.block[k], 256);
  }

  memory::pinned_pool<B>* host_;
  std::vector<record> records_;
};

// Host copies of the extra lists (a sink's residual) of the chunks handed to the sink in a step,
// taken before the sink runs, put back by a failed step.
template <Backend B>
class extra_journal {
 public:
  extra_journal(memory::pinned_pool<B>& host, std::size_t chunks) : host_(&host) { records_.reserve(chunks); }
  extra_journal(extra_journal const&) = delete;
  extra_journal& operator=(extra_journal const&) = delete;
  ~extra_journal() { discard(); }

  void save(std::uint32_t c, std::span<chunk::chunk_list> lists) {
    record r{c, {}, {}};
    try {
      for (std::size_t k = 0; k < lists.size(); ++k) {
        r.bytes[k] = lists[k][c].capacity();
        r.copy[k] = static_cast<std::byte*>(host_->allocate(r.bytes[k], 256));
      }
    } catch (...) {
      release(r);
      throw;
    }
    for (std::size_t k = 0; k < lists.size(); ++k) std::memcpy(r.copy[k], lists[k][c].payload(), r.bytes[k]);
    TIDE_ASSERT(records_.size() < records_.capacity());
    records_.push_back(r);
  }
  void restore(std::span<chunk::chunk_list> lists) const noexcept {
    for (record const& r : records_)
      for (std::size_t k = 0; k < lists.size(); ++k) std::memcpy(lists[k][r.c].payload(), r.copy[k], r.bytes[k]);
  }
  void discard() noexcept {
    for (record& r : records_) release(r);
    records_.clear();
  }

 private:
  struct record {
    std::uint32_t c = 0;
    std::array<std::byte*, max_extra_lists> copy{};
    std::array<std::size_t, max_extra_lists> bytes{};
  };
  void release(record& r) noexcept {
    for (std::size_t k = 0; k < r.copy.size(); ++k)
      if (r.copy[k] != nullptr) host_->deallocate(std::exchange(r.copy[k], nullptr), r.bytes[k], 256);
  }
  memory::pinned_pool<B>* host_;
  std::vector<record> records_;
};

}  // namespace tide::offload::detail
