// Column sums of a row-major [rows, cols] tensor on the CPU, the bias gradient of a dense layer: f32
// accumulation, OpenMP over blocks of 64 columns, each block adding its rows in order (deterministic).
#pragma once
#include <algorithm>
#include <cstdint>

#include "hotops/cpu_vector.h"

namespace hotops::cpu {

// out[c] = sum over r of x[r * cols + c], on `threads` threads.
template <class T>
void column_sums(const T* x, std::int64_t rows, std::int64_t cols, float* out, int threads) {
  constexpr std::int64_t kCols = 64;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t c0 = 0; c0 < cols; c0 += kCols) {
    const std::int64_t c1 = std::min(cols, c0 + kCols);
    float acc[kCols] = {};
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += vec::load(x[r * cols + c]);
    for (std::int64_t c = c0; c < c1; ++c) out[c] = acc[c - c0];
  }
}

}  // namespace hotops::cpu
