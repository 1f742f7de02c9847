#pragma once
// Version, the host/device annotation, and the ABI namespace.

#define TIDE_VERSION_MAJOR 0
#define TIDE_VERSION_MINOR 1
#define TIDE_VERSION_PATCH 0
#define TIDE_VERSION (TIDE_VERSION_MAJOR * 10000 + TIDE_VERSION_MINOR * 100 + TIDE_VERSION_PATCH)

// Per-element and per-row math that both backends share is written once and marked
// TIDE_HOST_DEVICE: empty for g++, __host__ __device__ under nvcc.
#if defined(__CUDACC__)
#  define TIDE_HOST_DEVICE __host__ __device__
#  define TIDE_DEVICE __device__
#else
#  define TIDE_HOST_DEVICE
#  define TIDE_DEVICE
#endif

#if defined(NDEBUG) && !defined(TIDE_DEBUG)
#  define TIDE_DEBUG_CHECKS 0
#else
#  define TIDE_DEBUG_CHECKS 1
#endif

#define TIDE_PP_CAT_(a, b) a##b
#define TIDE_PP_CAT(a, b) TIDE_PP_CAT_(a, b)
#define TIDE_PP_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define TIDE_PP_NARGS(...) TIDE_PP_NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define TIDE_PP_JOIN_1(a) a
#define TIDE_PP_JOIN_2(a, b) a##_##b
#define TIDE_PP_JOIN_3(a, b, c) a##_##b##_##c
#define TIDE_PP_JOIN_4(a, b, c, d) a##_##b##_##c##_##d
#define TIDE_PP_JOIN_5(a, b, c, d, e) a##_##b##_##c##_##d##_##e
#define TIDE_PP_JOIN_6(a, b, c, d, e, f) a##_##b##_##c##_##d##_##e##_##f
#define TIDE_PP_JOIN_7(a, b, c, d, e, f, g) a##_##b##_##c##_##d##_##e##_##f##_##g
#define TIDE_PP_JOIN_8(a, b, c, d, e, f, g, h) a##_##b##_##c##_##d##_##e##_##f##_##g##_##h
#define TIDE_PP_JOIN(...) TIDE_PP_CAT(TIDE_PP_JOIN_, TIDE_PP_NARGS(__VA_ARGS__))(__VA_ARGS__)

// Everything that launches kernels lives in an inline namespace named after the version and,
// under nvcc, the list of target architectures (as CCCL does). Two shared libraries built with
// different -arch lists then never merge each other's kernel wrappers at link time.
#if defined(__CUDA_ARCH_LIST__)
#  define TIDE_ABI_NAME TIDE_PP_CAT(TIDE_PP_CAT(v0_1_0_sm_, TIDE_PP_JOIN(__CUDA_ARCH_LIST__)), _)
#else
#  define TIDE_ABI_NAME v0_1_0_host
#endif
#define TIDE_ABI_NAMESPACE_BEGIN inline namespace TIDE_ABI_NAME {
#define TIDE_ABI_NAMESPACE_END }
