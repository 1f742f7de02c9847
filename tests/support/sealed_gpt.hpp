#pragma once
// What the tests on tide::sealed train (offload/sealed.cpp, train/sealed.cpp): a 3-layer GPT
// (C 32, V 64), (B, T) = (2, 16), 4 steps, 20 KiB chunks (several per layer).

#include <cstddef>

#include "tide/core/bytes.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::test::sealed_gpt {

inline constexpr nn::gpt_config config{.layers = 3, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
inline constexpr index_t batch = 2, seq = 16;
inline constexpr int steps = 4;
inline constexpr std::size_t chunk_bytes = std::size_t{20} << 10;

}  // namespace tide::test::sealed_gpt
