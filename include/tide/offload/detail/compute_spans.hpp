#pragma once
// The offload engine's spans on the timeline's compute lane: each block's forward and backward,
// and each optimizer step on the device.
//
// tide::host: the calling thread is the compute timeline, so a span is two readings of the
// trace clock around the work. A device backend: the host only enqueues the kernels, and two
// readings would time the launches. A span there is two events recorded on the compute stream,
// put on the trace clock once the engine has drained: an anchor event, recorded when the stream
// was idle at a known trace time (once per drain, at the first span: this one wait is the cost of
// tracing), plus each event's time since the anchor (cudaEventElapsedTime). An evaluation's
// spans reach the recorder when it ends (end_evaluation drains while tracing). Copy spans are
// stamped on the same clock by their streams (detail/copy_span.hpp), so the lanes line up.

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::offload::detail {

template <Backend B>
class compute_spans {
 public:
  // A span begins here, in compute order. `like`: a stream on the compute stream's device, where
  // the events are made.
  void open(exec<B> const& ex, memory::stream<B> const& like) {
    if constexpr (B::is_device) {
      if (!spans_.empty() && spans_.back().to == nullptr) spans_.pop_back();  // its block threw
      if (!anchor_) {
        memory::synchronize(ex);
        memory::event<B> anchor = event_like(like);
        memory::record(ex, anchor);
        anchor_us_ = trace_recorder::now_us();
        anchor_.emplace(std::move(anchor));
      }
      memory::record(ex, spans_.emplace_back(event_like(like), event_like(like)).begin);
    } else {
      start_us_ = trace_recorder::now_us();
    }
    open_ = true;
  }
  // The open span ends here, in compute order; on a device it reaches `to` at drained(). Nothing
  // is open when tracing began inside the block, or a drain inside it took the span.
  void close(exec<B> const& ex, trace_recorder& to, std::string name, char const* category, std::size_t bytes = 0) {
    if (!open_) return;
    open_ = false;
    if constexpr (B::is_device) {
      span& s = spans_.back();
      memory::record(ex, s.end);
      s.to = &to;
      s.name = std::move(name);
      s.category = category;
      s.bytes = bytes;
    } else {
      to.complete(std::move(name), category, lane::compute, start_us_, trace_recorder::now_us(), bytes);
    }
  }
  // The compute stream finished everything recorded: the device's spans go to their recorders.
  // They leave this object first, so a failure here drops them rather than leaving them half read.
  void drained() {
    if constexpr (B::is_device) {
      std::deque<span> spans = std::exchange(spans_, {});
      std::optional<memory::event<B>> anchor = std::exchange(anchor_, std::nullopt);
      open_ = false;
      for (span& s : spans) {
        if (s.to == nullptr) continue;  // opened, never closed (a block that threw)
        double const begin = anchor_us_ + 1e3 * elapsed_ms(*anchor, s.begin);
        double const end = anchor_us_ + 1e3 * elapsed_ms(*anchor, s.end);
        s.to->complete(std::move(s.name), s.category, lane::compute, begin, end, s.bytes);
      }
    }
  }
  // A failed drain: the events may never pass.
  void forget() noexcept {
    spans_.clear();
    anchor_.reset();
    open_ = false;
  }

 private:
  struct span {
    memory::event<B> begin, end;
    trace_recorder* to = nullptr;
    std::string name;
    char const* category = "";
    std::size_t bytes = 0;
  };
  double start_us_ = 0;                     // tide::host: the open span's start
  bool open_ = false;                       // a span was opened and not yet closed
  std::optional<memory::event<B>> anchor_;  // a device: recorded on an idle stream at anchor_us_
  double anchor_us_ = 0;
  std::deque<span> spans_;                  // a device: recorded, not yet on the timeline
};

}  // namespace tide::offload::detail
