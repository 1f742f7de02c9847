#pragma once
// A copy on one of the offload engine's copy lanes, as the timeline shows it (chunk_store opens
// them; the engine's activation copies too).

#include <cstddef>
#include <deque>
#include <string>
#include <utility>

#include "tide/core/backend.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::offload::detail {

// One copy on a copy lane: two host functions on its stream stamp its start and end, so the
// span is when the copy ran, not when it was issued. Kept until the engine drains.
template <Backend B>
struct copy_span {
  trace_recorder* recorder = nullptr;
  std::string name;
  std::size_t bytes = 0;
  double start = 0;
  lane where = lane::copy;
  memory::stream<B>* on = nullptr;
  struct begin_stamp {
    copy_span* s;
    void operator()() const { s->start = trace_recorder::now_us(); }
  } begin{this};
  struct end_stamp {
    copy_span* s;
    void operator()() const {
      s->recorder->complete(s->name, "copy", s->where, s->start, trace_recorder::now_us(), s->bytes);
    }
  } end{this};
};

// A span opened in `spans` (stable addresses: the stream holds a pointer into it) for a copy about
// to be issued on `on`; close_span after issuing it.
template <Backend B>
copy_span<B>* open_span(std::deque<copy_span<B>>& spans, trace_recorder* recorder, std::string name,
                        std::size_t bytes, lane where, memory::stream<B>& on) {
  copy_span<B>& sp = spans.emplace_back();
  sp.recorder = recorder;
  sp.name = std::move(name);
  sp.bytes = bytes;
  sp.where = where;
  sp.on = &on;
  memory::launch(on, sp.begin);
  return &sp;
}
template <Backend B>
void close_span(copy_span<B>* sp) {
  if (sp != nullptr) memory::launch(*sp->on, sp->end);
}

}  // namespace tide::offload::detail
