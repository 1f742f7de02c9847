#pragma once
// Host kernels' scratch memory, kept between calls: thread_scratch<Tag, U>(n) returns n
// uninitialised U of a buffer owned by the calling thread, one buffer per (thread, Tag, U). The
// buffer grows to the largest n asked for and is never shrunk, so a training loop that repeats
// its shapes allocates only on the first step (nn::gpt's steady-state step allocates nothing).
// The price: each thread holds its largest scratch until it exits (docs/kernels/*.md give the
// sizes; bf16 matmul copies are the big ones).
//
// A kernel may share its buffer with the pool's workers for the length of its parallel_for (the
// memory is the caller's; the pool's hand-off orders the accesses). Tags keep apart buffers that
// are live at once on one thread: a pointer is valid until the next call with the same Tag and
// U on that thread, so a kernel must not call another kernel that takes the same tag meanwhile.

#include <cstddef>
#include <memory>

namespace tide::kernels::detail {

template <class Tag, class U = float>
[[nodiscard]] U* thread_scratch(std::size_t n) {
  struct buffer {
    std::unique_ptr<U[]> data;
    std::size_t size = 0;
  };
  thread_local buffer b;
  if (b.size < n) {
    b.data.reset();  // the old and the new buffer are never held at once
    b.size = 0;
    b.data = std::make_unique_for_overwrite<U[]>(n);
    b.size = n;
  }
  return b.data.get();
}

}  // namespace tide::kernels::detail
