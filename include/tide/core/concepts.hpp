#pragma once
// The concepts the memory layer and the schedulers are written against.

#include <concepts>
#include <cstddef>

#include "tide/core/backend.hpp"

namespace tide {

// Allocates and frees bytes in one memory space; the shape of cuda::mr's synchronous resource.
template <class R>
concept MemoryResource = requires(R& r, void* p, std::size_t bytes, std::size_t alignment) {
  typename R::backend;
  requires Backend<typename R::backend>;
  { r.allocate(bytes, alignment) } -> std::same_as<void*>;
  { r.deallocate(p, bytes, alignment) } -> std::same_as<void>;
};

// An in-order queue of work on one backend.
template <class S>
concept Stream = requires(S& s) {
  typename S::backend;
  requires Backend<typename S::backend>;
  { s.synchronize() } -> std::same_as<void>;
  { s.query() } -> std::same_as<bool>;  // true when all work enqueued so far has finished
};

// A marker in a stream: record it on one stream, wait for it on another or on the host.
template <class E>
concept Event = requires(E& e, typename E::stream_type& s) {
  requires Stream<typename E::stream_type>;
  { e.record(s) } -> std::same_as<void>;
  { s.wait(e) } -> std::same_as<void>;
  { e.query() } -> std::same_as<bool>;
  { e.synchronize() } -> std::same_as<void>;
};

}  // namespace tide
