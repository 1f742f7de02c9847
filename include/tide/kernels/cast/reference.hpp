#pragma once
// The scalar oracle for tide::kernels::cast: one element at a time through tensor_view's
// indexing, so any strides work. Tests compare the host and CUDA paths with it bit for bit.

#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::reference {

// dst(i...) = To(float(src(i...))) for every index; same shape required. The same element
// type copies the bits (a signalling NaN stays signalling, as memcpy keeps it).
template <class From, class To>
  requires Element<std::remove_const_t<From>> && Element<To>
void cast(tensor_view<From> src, tensor_view<To> dst) {
  TIDE_REQUIRE(src.extents() == dst.extents(), "reference::cast needs equal shapes, got ", src.size(),
               " and ", dst.size(), " elements (ranks ", src.rank(), " and ", dst.rank(), ")");
  // Pad to rank 4 so one loop nest covers every rank: (D0, D1, D2, D3).
  index_t e[4] = {1, 1, 1, 1}, ss[4] = {0, 0, 0, 0}, ds[4] = {0, 0, 0, 0};
  int const pad = 4 - src.rank();
  for (int d = 0; d < src.rank(); ++d) {
    e[pad + d] = src.extent(d);
    ss[pad + d] = src.stride(d);
    ds[pad + d] = dst.stride(d);
  }
  for (index_t a = 0; a < e[0]; ++a)
    for (index_t b = 0; b < e[1]; ++b)
      for (index_t c = 0; c < e[2]; ++c)
        for (index_t d = 0; d < e[3]; ++d) {
          auto const x = src.data()[a * ss[0] + b * ss[1] + c * ss[2] + d * ss[3]];
          auto& y = dst.data()[a * ds[0] + b * ds[1] + c * ds[2] + d * ds[3]];
          if constexpr (std::is_same_v<std::remove_const_t<From>, To>)
            y = x;
          else
            y = from_float<To>(to_float(x));
        }
}

}  // namespace tide::kernels::reference
