#pragma once
// tensor_view<T, Space>: a non-owning view of up to 4 dimensions with shape and strides in
// elements. Space is the backend whose memory the pointer refers to (tide::host memory can be
// read here; tide::cuda memory only in device code). Indexing is bounds-checked in debug builds.
//
//   float* p = ...;
//   tide::tensor_view<float> x{p, {B, T, C}};      // (B, T, C), row-major
//   x(b, t, c) = 1.f;
//   auto xb = x[b];                               // (T, C)

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/backend.hpp"
#include "tide/core/config.hpp"
#include "tide/core/error.hpp"

namespace tide {

using index_t = std::int64_t;

// The extents of a tensor, rank 0 to 4.
struct shape {
  static constexpr int max_rank = 4;
  int rank = 0;
  index_t dims[max_rank] = {1, 1, 1, 1};

  constexpr shape() = default;
  template <std::integral... I>
    requires(sizeof...(I) >= 1 && sizeof...(I) <= max_rank)
  TIDE_HOST_DEVICE constexpr shape(I... d) noexcept : rank(static_cast<int>(sizeof...(I))), dims{static_cast<index_t>(d)...} {
    for (int i = rank; i < max_rank; ++i) dims[i] = 1;
  }

  TIDE_HOST_DEVICE constexpr index_t operator[](int d) const noexcept { return dims[d]; }
  TIDE_HOST_DEVICE constexpr index_t numel() const noexcept {
    index_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  friend constexpr bool operator==(shape const& a, shape const& b) noexcept {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.dims[i] != b.dims[i]) return false;
    return true;
  }
};

namespace detail {
[[noreturn]] TIDE_HOST_DEVICE inline void index_out_of_bounds(int dim, index_t index, index_t extent) {
#if defined(__CUDA_ARCH__)
  (void)dim, (void)index, (void)extent;
  __trap();
#else
  TIDE_FAIL(usage, "tensor_view index ", index, " out of bounds for dimension ", dim, " of extent ", extent);
#endif
}
}  // namespace detail

template <class T, Backend Space = host>
class tensor_view {
 public:
  using element_type = T;
  using space = Space;
  static constexpr int max_rank = shape::max_rank;

  constexpr tensor_view() = default;

  // Contiguous, row-major.
  TIDE_HOST_DEVICE constexpr tensor_view(T* data, shape s) noexcept : data_(data), shape_(s) {
    index_t stride = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
      strides_[d] = stride;
      stride *= s.dims[d];
    }
  }

  // Explicit strides, in elements.
  TIDE_HOST_DEVICE constexpr tensor_view(T* data, shape s, std::array<index_t, max_rank> const& strides) noexcept
      : data_(data), shape_(s) {
    for (int d = 0; d < max_rank; ++d) strides_[d] = strides[d];
  }

  // tensor_view<T> converts to tensor_view<T const>.
  template <class U>
    requires(std::is_same_v<T, U const>)
  TIDE_HOST_DEVICE constexpr tensor_view(tensor_view<U, Space> const& other) noexcept
      : data_(other.data()), shape_(other.extents()) {
    for (int d = 0; d < max_rank; ++d) strides_[d] = other.stride(d);
  }

  TIDE_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  TIDE_HOST_DEVICE constexpr int rank() const noexcept { return shape_.rank; }
  TIDE_HOST_DEVICE constexpr shape const& extents() const noexcept { return shape_; }
  TIDE_HOST_DEVICE constexpr index_t extent(int d) const noexcept { return shape_.dims[d]; }
  TIDE_HOST_DEVICE constexpr index_t stride(int d) const noexcept { return strides_[d]; }
  TIDE_HOST_DEVICE constexpr index_t size() const noexcept { return shape_.numel(); }
  TIDE_HOST_DEVICE constexpr std::size_t bytes() const noexcept { return static_cast<std::size_t>(size()) * sizeof(T); }
  TIDE_HOST_DEVICE constexpr bool empty() const noexcept { return size() == 0; }

  TIDE_HOST_DEVICE constexpr bool is_contiguous() const noexcept {
    index_t expect = 1;
    for (int d = shape_.rank - 1; d >= 0; --d) {
      if (shape_.dims[d] != 1 && strides_[d] != expect) return false;
      expect *= shape_.dims[d];
    }
    return true;
  }

  // x(i, j, ...) with exactly rank() indices.
  template <std::integral... I>
  TIDE_HOST_DEVICE constexpr T& operator()(I... idx) const {
    index_t const is[] = {static_cast<index_t>(idx)...};
#if TIDE_DEBUG_CHECKS
    if (static_cast<int>(sizeof...(I)) != shape_.rank) detail::index_out_of_bounds(-1, sizeof...(I), shape_.rank);
    for (int d = 0; d < static_cast<int>(sizeof...(I)); ++d)
      if (is[d] < 0 || is[d] >= shape_.dims[d]) detail::index_out_of_bounds(d, is[d], shape_.dims[d]);
#endif
    index_t off = 0;
    for (int d = 0; d < static_cast<int>(sizeof...(I)); ++d) off += is[d] * strides_[d];
    return data_[off];
  }

  // x[i]: the sub-tensor at index i of the first dimension, one rank lower.
  TIDE_HOST_DEVICE constexpr tensor_view operator[](index_t i) const {
#if TIDE_DEBUG_CHECKS
    if (shape_.rank == 0) detail::index_out_of_bounds(0, i, 0);
    if (i < 0 || i >= shape_.dims[0]) detail::index_out_of_bounds(0, i, shape_.dims[0]);
#endif
    tensor_view r;
    r.data_ = data_ + i * strides_[0];
    r.shape_.rank = shape_.rank - 1;
    for (int d = 1; d < max_rank; ++d) {
      r.shape_.dims[d - 1] = shape_.dims[d];
      r.strides_[d - 1] = strides_[d];
    }
    r.shape_.dims[max_rank - 1] = 1;
    r.strides_[max_rank - 1] = 1;
    return r;
  }

  // Rows [begin, end) of the first dimension, same rank.
  TIDE_HOST_DEVICE constexpr tensor_view slice(index_t begin, index_t end) const {
#if TIDE_DEBUG_CHECKS
    if (shape_.rank == 0 || begin < 0 || end < begin || end > shape_.dims[0])
      detail::index_out_of_bounds(0, end, shape_.rank ? shape_.dims[0] : 0);
#endif
    tensor_view r = *this;
    r.data_ = data_ + begin * strides_[0];
    r.shape_.dims[0] = end - begin;
    return r;
  }

  // The same elements under a new shape; the view must be contiguous and the sizes equal.
  constexpr tensor_view reshape(shape s) const {
    TIDE_REQUIRE(is_contiguous(), "reshape needs a contiguous tensor_view");
    TIDE_REQUIRE(s.numel() == size(), "reshape from ", size(), " to ", s.numel(), " elements");
    return tensor_view(data_, s);
  }

 private:
  template <class, Backend>
  friend class tensor_view;

  T* data_ = nullptr;
  shape shape_{};
  index_t strides_[max_rank] = {1, 1, 1, 1};
};

}  // namespace tide
