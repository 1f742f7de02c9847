#pragma once
// tide::kernels::cast: convert a tensor between f32, bf16 and f16 (round to nearest even, NaN
// stays NaN), on the backend of the exec<B> passed first.
//
//   tide::exec<tide::host> ex{pool};
//   tide::kernels::cast(ex, x, y);   // x: (B, T, C) float, y: (B, T, C) bf16
//   // exec<tide::cuda>{stream}: tide/kernels/cast/cuda.cuh (nvcc), enqueued on the stream
//
// Both views must be contiguous, have the same shape, and not overlap. Converting to the same
// element type copies the bits.

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/cast/host.hpp"

namespace tide::kernels {

namespace detail {

inline std::string shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

// The checks both backends make before touching memory, so a bad call changes nothing.
template <class From, class To, class Space>
void check_cast(tensor_view<From, Space> const& src, tensor_view<To, Space> const& dst) {
  TIDE_REQUIRE(src.extents() == dst.extents(), "cast needs equal shapes, got source ", shape_text(src.extents()),
               " and destination ", shape_text(dst.extents()), "; reshape one of them first");
  TIDE_REQUIRE(src.is_contiguous() && dst.is_contiguous(), "cast needs contiguous views, got a ",
               src.is_contiguous() ? "contiguous" : "strided", " source and a ",
               dst.is_contiguous() ? "contiguous" : "strided", " destination; copy the strided one first");
  auto const s = reinterpret_cast<std::uintptr_t>(src.data());
  auto const d = reinterpret_cast<std::uintptr_t>(dst.data());
  TIDE_REQUIRE(src.empty() || s + src.bytes() <= d || d + dst.bytes() <= s,
               "cast cannot write over its own source (", src.bytes(), " bytes at ", static_cast<void const*>(src.data()), ", ", dst.bytes(),
               " bytes at ", static_cast<void const*>(dst.data()), "); use a separate destination");
}

}  // namespace detail

// dst = To(src) element by element, threaded over ex.pool; returns when done.
template <class From, class To>
  requires Element<std::remove_const_t<From>> && Element<To>
void cast(exec<host> const& ex, tensor_view<From, host> src, tensor_view<To, host> dst) {
  detail::check_cast(src, dst);
  detail::cast_host(ex.pool, src.data(), dst.data(), src.size());
}

}  // namespace tide::kernels
