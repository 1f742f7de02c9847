#pragma once
// Every kernel on tide::sealed, the test device the host cannot read (core/sealed.hpp): the host
// kernel, enqueued on the compute stream and run by its worker over the aliases of its views.
//
//   tide::memory::stream<tide::sealed> compute;
//   tide::thread_pool pool{2};                       // the worker's own
//   tide::exec<tide::sealed> ex{pool, compute};
//   tide::tensor_view<float, tide::sealed> out{...}, in{...};
//   tide::kernels::gelu_forward(ex, out, in);       // returns at once; runs on the worker
//   compute.synchronize();                           // the host waits, as after a CUDA kernel
//
// Arguments are taken by value when the call is made (views, scalars, hyperparameters), as a
// CUDA launch takes them; every tensor_view<T, sealed> becomes the host view of its alias, a
// row_table of sealed rows the table of their aliases, and a list of records (adamw_tensor,
// sgd_tensor, grad_tensor) a copy of the list with every pointer at its alias. A host view (tensor_view<T>) passed to a
// sealed kernel is used as it is: if it names device memory, the worker faults, which is the
// point. The reductions that return a value to the host (global_grad_norm, any_non_finite)
// enqueue, then wait for the stream, as a copy of the result back from a GPU would.
// A kernel that throws on the worker makes the stream's failure sticky: the next synchronize
// reports it (a CUDA error behaves the same).
//
// Kernels that need scratch take a kernels::scratch<sealed> last (device memory, e.g. from the
// arena: kernels/scratch.hpp), sized by their *_scratch_bytes query, which answers on sealed
// what the host kernel it runs needs. A call without it does not compile: the host kernels'
// overloads that allocate their own would put it in host memory the device budget never sees.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/sealed.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adam/adam.hpp"
#include "tide/kernels/adamw/adamw.hpp"
#include "tide/kernels/attention/attention.hpp"
#include "tide/kernels/cast/cast.hpp"
#include "tide/kernels/classifier/classifier.hpp"
#include "tide/kernels/embedding/embedding.hpp"
#include "tide/kernels/gelu/gelu.hpp"
#include "tide/kernels/grad_norm/grad_norm.hpp"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/matmul/matmul.hpp"
#include "tide/kernels/residual/residual.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/sgd/sgd.hpp"
#include "tide/kernels/softmax/softmax.hpp"
#include "tide/memory/stream.hpp"

namespace tide::kernels {

namespace detail {

// What the worker passes to the host kernel in place of an argument.
template <class A>
A to_alias(A const& a) noexcept {
  return a;
}
template <class T>
tensor_view<T> to_alias(tensor_view<T, sealed> const& v) noexcept {
  return unseal(v);
}
inline scratch<host> to_alias(scratch<sealed> const& s) noexcept { return {unseal(s.data), s.bytes}; }
template <class T>
row_table<T> to_alias(row_table<T> const& t) noexcept {
  row_table<T> r = t;
  for (int j = 0; j < t.pieces; ++j) r.piece[j] = unseal(t.piece[j]);
  return r;
}

// The records of the list entries (optimizers, grad norm): every pointer to its alias.
template <class G, class W>
adamw_tensor<G, W> alias_record(adamw_tensor<G, W> r) noexcept {
  r.p = unseal(r.p), r.g = unseal(r.g), r.m = unseal(r.m), r.v = unseal(r.v), r.working = unseal(r.working);
  r.prev_p = unseal(r.prev_p), r.prev_m = unseal(r.prev_m), r.prev_v = unseal(r.prev_v);
  r.prev_working = unseal(r.prev_working);
  r.src_p = unseal(r.src_p), r.src_m = unseal(r.src_m), r.src_v = unseal(r.src_v);
  return r;
}
template <class G, class W>
sgd_tensor<G, W> alias_record(sgd_tensor<G, W> r) noexcept {
  r.p = unseal(r.p), r.g = unseal(r.g), r.buf = unseal(r.buf), r.working = unseal(r.working);
  r.prev_p = unseal(r.prev_p), r.prev_buf = unseal(r.prev_buf), r.prev_working = unseal(r.prev_working);
  r.src_p = unseal(r.src_p), r.src_buf = unseal(r.src_buf);
  return r;
}
template <class G>
grad_tensor<G> alias_record(grad_tensor<G> r) noexcept {
  r.g = unseal(r.g);
  return r;
}

// A list of records: copied when the call is made (the caller's list may go before the kernel
// runs), each record with its aliases.
template <std::ranges::contiguous_range L>
  requires requires(std::ranges::range_value_t<L> const& r) { alias_record(r); }
auto to_alias(L const& list) {
  std::vector<std::ranges::range_value_t<L>> out;
  out.reserve(static_cast<std::size_t>(std::ranges::size(list)));
  for (auto const& r : list) out.push_back(alias_record(r));
  return out;
}

// f(exec<host>, aliases...) on the compute stream's worker; returns at once.
template <class F, class... A>
void enqueue_on(exec<sealed> const& ex, F f, A const&... args) {
  ex.stream.launch_owned([pool = &ex.pool, f, ... a = to_alias(args)]() { f(exec<host>{*pool}, a...); });
}

// f(exec<host>, aliases...) on the worker, its result back on the host once it ran.
template <class F, class... A>
auto result_of(exec<sealed> const& ex, F f, A const&... args) {
  using R = decltype(f(std::declval<exec<host> const&>(), to_alias(args)...));
  auto out = std::make_shared<R>();
  ex.stream.launch_owned([pool = &ex.pool, out, f, ... a = to_alias(args)]() { *out = f(exec<host>{*pool}, a...); });
  ex.stream.synchronize();
  return *out;
}

// Whether a sealed kernel call passes its scratch last.
template <class... A>
consteval bool ends_with_scratch() {
  if constexpr (sizeof...(A) == 0)
    return false;
  else
    return std::is_same_v<std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>, scratch<sealed>>;
}

}  // namespace detail

// One overload per kernel entry: the sealed exec first, everything else as the host entry takes it.
#define TIDE_SEALED_KERNEL(name)                                                                      \
  template <class... A>                                                                               \
  void name(exec<sealed> const& ex, A const&... args) {                                               \
    detail::enqueue_on(                                                                               \
        ex, [](exec<host> const& h, auto const&... a) { name(h, a...); }, args...);                   \
  }
#define TIDE_SEALED_REDUCTION(name)                                                                   \
  template <class... A>                                                                               \
  auto name(exec<sealed> const& ex, A const&... args) {                                               \
    return detail::result_of(                                                                         \
        ex, [](exec<host> const& h, auto const&... a) { return name(h, a...); }, args...);            \
  }

// A kernel with scratch: the call must pass a kernels::scratch<sealed> last.
#define TIDE_SEALED_SCRATCH_KERNEL(name, query)                                                       \
  template <class... A>                                                                               \
  void name(exec<sealed> const& ex, A const&... args) {                                               \
    static_assert(detail::ends_with_scratch<A...>(),                                                  \
                  "tide::kernels::" #name " on tide::sealed takes its scratch last: pass a "          \
                  "tide::kernels::scratch<tide::sealed> of " #query "(ex, ...) bytes of device "      \
                  "memory (from the arena)");                                                         \
    detail::enqueue_on(                                                                               \
        ex, [](exec<host> const& h, auto const&... a) { name(h, a...); }, args...);                   \
  }
// A query: what the host kernel that runs on the worker needs.
#define TIDE_SEALED_QUERY(query)                                                                      \
  template <class... A>                                                                               \
  std::size_t query(exec<sealed> const& ex, A const&... args) {                                       \
    return query(exec<host>{ex.pool}, detail::to_alias(args)...);                                     \
  }

TIDE_SEALED_KERNEL(adam)
TIDE_SEALED_KERNEL(adamw)
TIDE_SEALED_KERNEL(sgd)
TIDE_SEALED_SCRATCH_KERNEL(attention_forward, attention_forward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(attention_backward, attention_backward_scratch_bytes)
TIDE_SEALED_KERNEL(cast)
TIDE_SEALED_SCRATCH_KERNEL(fused_classifier, fused_classifier_scratch_bytes)
TIDE_SEALED_KERNEL(crossentropy_forward)
TIDE_SEALED_KERNEL(crossentropy_softmax_backward)
TIDE_SEALED_KERNEL(encoder_forward)
TIDE_SEALED_SCRATCH_KERNEL(encoder_backward, encoder_backward_scratch_bytes)
TIDE_SEALED_KERNEL(gelu_forward)
TIDE_SEALED_KERNEL(gelu_backward)
TIDE_SEALED_KERNEL(bias_gelu_forward)
TIDE_SEALED_SCRATCH_KERNEL(bias_gelu_backward, bias_gelu_backward_scratch_bytes)
TIDE_SEALED_KERNEL(layernorm_forward)
TIDE_SEALED_SCRATCH_KERNEL(layernorm_backward, layernorm_backward_scratch_bytes)
TIDE_SEALED_KERNEL(layernorm_backward_input)
TIDE_SEALED_SCRATCH_KERNEL(layernorm_backward_weight, layernorm_backward_scratch_bytes)
TIDE_SEALED_KERNEL(residual_layernorm_forward)
TIDE_SEALED_SCRATCH_KERNEL(matmul_forward, matmul_forward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_forward_gelu, matmul_forward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_backward, matmul_backward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_backward_gelu, matmul_backward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_backward_input, matmul_backward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_backward_weight, matmul_backward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(matmul_backward_gelu_input, matmul_backward_scratch_bytes)
TIDE_SEALED_KERNEL(residual_forward)
TIDE_SEALED_KERNEL(residual_backward)
TIDE_SEALED_SCRATCH_KERNEL(softmax_forward, softmax_forward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(softmax_forward_causal, softmax_forward_scratch_bytes)
TIDE_SEALED_SCRATCH_KERNEL(softmax_forward_masked, softmax_forward_scratch_bytes)
TIDE_SEALED_KERNEL(softmax_backward)
TIDE_SEALED_REDUCTION(any_non_finite)

TIDE_SEALED_QUERY(attention_forward_scratch_bytes)
TIDE_SEALED_QUERY(attention_backward_scratch_bytes)
TIDE_SEALED_QUERY(fused_classifier_scratch_bytes)
TIDE_SEALED_QUERY(encoder_backward_scratch_bytes)
TIDE_SEALED_QUERY(bias_gelu_backward_scratch_bytes)
TIDE_SEALED_QUERY(layernorm_backward_scratch_bytes)
TIDE_SEALED_QUERY(softmax_forward_scratch_bytes)
TIDE_SEALED_QUERY(global_grad_norm_scratch_bytes)

// The matmul queries take the element type.
template <Element T>
std::size_t matmul_forward_scratch_bytes(exec<sealed> const& ex, index_t N, index_t C, index_t OC) {
  return matmul_forward_scratch_bytes<T>(exec<host>{ex.pool}, N, C, OC);
}
template <Element T>
std::size_t matmul_backward_scratch_bytes(exec<sealed> const& ex, index_t N, index_t C, index_t OC) {
  return matmul_backward_scratch_bytes<T>(exec<host>{ex.pool}, N, C, OC);
}

// The gradient norm, its scratch last; the norm comes back to the host.
template <class... A>
double global_grad_norm(exec<sealed> const& ex, A const&... args) {
  static_assert(detail::ends_with_scratch<A...>(),
                "tide::kernels::global_grad_norm on tide::sealed takes its scratch last: pass a "
                "tide::kernels::scratch<tide::sealed> of global_grad_norm_scratch_bytes(ex, grads) bytes of device "
                "memory (from the arena)");
  return detail::result_of(
      ex, [](exec<host> const& h, auto const&... a) { return global_grad_norm(h, a...); }, args...);
}

#undef TIDE_SEALED_KERNEL
#undef TIDE_SEALED_SCRATCH_KERNEL
#undef TIDE_SEALED_QUERY
#undef TIDE_SEALED_REDUCTION

}  // namespace tide::kernels
