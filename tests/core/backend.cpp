#include <doctest/doctest.h>

#include <tide/core/backend.hpp>
#include <tide/core/concepts.hpp>

#include <string_view>

namespace {
struct not_a_backend {
  int x;
};
struct not_a_resource {
  using backend = tide::host;
  void* allocate(std::size_t);  // missing the alignment parameter
};
}  // namespace

TEST_CASE("backend tags and concepts") {
  static_assert(tide::Backend<tide::host>);
  static_assert(tide::Backend<tide::cuda>);
  static_assert(!tide::Backend<not_a_backend>);
  static_assert(!tide::Backend<int>);
  static_assert(!tide::MemoryResource<not_a_resource>);
  CHECK(std::string_view(tide::host::name) == "host");
  CHECK(tide::cuda::is_device);
}
