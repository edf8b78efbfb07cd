// relu_dbias and relu_bias on the CPU, hand-written. relu_dbias: dx = x > 0 ? dy : 0 and db =
// colsum(dx) in one pass; OpenMP threads take blocks of 16 columns, each running down the rows with
// 16 f32 accumulators, so a column's sum is one chain in row order whatever the thread count; a
// block's loop is compiled per x86-64 level (HOTOPS_CPU_CLONES).
// relu_bias: y = max(x + b, 0) row by row, OpenMP over rows. Both on one thread below a grain of
// work, where forking costs more than it saves.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace {

// Below this many elements the loop runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;
constexpr std::int64_t kCols = 16;  // columns per thread's block

// The columns [c0, c0 + width) of every row: dx, and their sums into db. width: kCols (a whole
// block: a constant trip count, which the compiler vectorises) or the last block's fewer.
// kInPlace: dx is dy, read and written through one pointer, so that the compiler sees the loop's
// only possible overlap (x with dx) as the one it checks for at run time and still vectorises.
template <DType D, bool kInPlace, class Width>
HOTOPS_VECTOR_INLINE void column_block(const void* x_v, const void* dy_v, void* dx_v, float* db, std::int64_t rows, std::int64_t n,
                                       std::int64_t c0, Width width) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* x = static_cast<const T*>(x_v) + c0;
  const T* dy = static_cast<const T*>(dy_v) + c0;
  T* dx = static_cast<T*>(dx_v) + c0;
  float acc[kCols] = {};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < width; ++c) {
      // dx is dy's element or zero, stored as it is: no rounding to do (a bf16 store's is most of
      // the loop's instructions).
      const T g = (kInPlace ? dx : dy)[r * n + c];  // read whatever x says: a select, not a branch
      const T d = E::load(x[r * n + c]) > 0.f ? g : T{};
      dx[r * n + c] = d;
      acc[c] += E::load(d);
    }
  for (std::int64_t c = 0; c < width; ++c) db[c0 + c] = acc[c];
}

// A block of columns, compiled per x86-64 level (bf16's conversions want AVX2 or AVX-512 to vectorise).
#define HOTOPS_RELU_DBIAS_BLOCK(NAME, D, IN_PLACE)                                                               \
  HOTOPS_CPU_CLONES void NAME(const void* x, const void* dy, void* dx, float* db, std::int64_t rows, std::int64_t n, \
                              std::int64_t c0) {                                                                 \
    if (n - c0 >= kCols)                                                                                         \
      column_block<DType::D, IN_PLACE>(x, dy, dx, db, rows, n, c0, std::integral_constant<std::int64_t, kCols>{}); \
    else                                                                                                         \
      column_block<DType::D, IN_PLACE>(x, dy, dx, db, rows, n, c0, n - c0);                                      \
  }
HOTOPS_RELU_DBIAS_BLOCK(block_f32, f32, false)
HOTOPS_RELU_DBIAS_BLOCK(block_f32_in_place, f32, true)
HOTOPS_RELU_DBIAS_BLOCK(block_bf16, bf16, false)
HOTOPS_RELU_DBIAS_BLOCK(block_bf16_in_place, bf16, true)
#undef HOTOPS_RELU_DBIAS_BLOCK

using BlockFn = void (*)(const void*, const void*, void*, float*, std::int64_t, std::int64_t, std::int64_t);

void relu_dbias(BlockFn block, const void* x, const void* dy, void* dx, float* db, std::int64_t rows, std::int64_t n) {
  // All threads, or one where there are fewer than 4 blocks (mlp_tiny's 32 columns are two): at most
  // that many threads would work, and waking a whole team for them costs more than they save (a team
  // of just those threads costs more again: cpu.h, cpu::threads()).
  const std::int64_t blocks = (n + kCols - 1) / kCols;
  const int team = rows * n >= kParallelGrain && blocks >= 4 ? cpu::threads() : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (std::int64_t c0 = 0; c0 < n; c0 += kCols) block(x, dy, dx, db, rows, n, c0);
}

class CpuReluDbias final : public Plan {
 public:
  explicit CpuReluDbias(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    const std::size_t eoff = static_cast<std::size_t>(s_.offset) * dtype_size(s_.dtype);
    const auto* x = static_cast<const std::byte*>(a.x) + eoff;
    const auto* dy = static_cast<const std::byte*>(a.dy) + eoff;
    auto* dx = static_cast<std::byte*>(a.out) + eoff;
    const bool in_place = dx == dy;
    const BlockFn block = s_.dtype == DType::bf16 ? (in_place ? block_bf16_in_place : block_bf16)
                                                  : (in_place ? block_f32_in_place : block_f32);
    relu_dbias(block, x, dy, dx, a.db, s_.rows(), s_.cols);
  }

  std::string label() const override {
    return cpu::with_threads(std::string("hotops relu_dbias loop (OpenMP over 16-column blocks, f32 sums), ") + vec::clone_name());
  }

 private:
  Shape s_;
};

// y = act(x + b) over the shape's [rows, cols] tensor of `a`.
template <DType D>
void relu_bias(const Shape& s, const Args& a) {
  using T = typename vec::Elem<D>::T;
  const T* x = static_cast<const T*>(a.x) + s.offset;
  T* y = static_cast<T*>(a.out) + s.offset;
  const T* b = static_cast<const T*>(a.b);
  const std::int64_t n = s.cols, rows = s.rows();
#pragma omp parallel for num_threads(rows * n >= kParallelGrain ? cpu::threads() : 1) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const float v = vec::Elem<D>::load(x[r * n + c]) + vec::Elem<D>::load(b[c]);
      y[r * n + c] = vec::Elem<D>::store(s.relu ? std::max(v, 0.f) : v);
    }
}

class CpuReluBias final : public Plan {
 public:
  explicit CpuReluBias(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    if (s_.dtype == DType::bf16) relu_bias<DType::bf16>(s_, a);
    else relu_bias<DType::f32>(s_, a);
  }

  std::string label() const override { return cpu::with_threads("hotops relu_bias loop (OpenMP over rows)"); }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_relu_dbias_plan(const Shape& s) { return std::make_unique<CpuReluDbias>(s); }
std::unique_ptr<Plan> make_cpu_relu_bias_plan(const Shape& s) { return std::make_unique<CpuReluBias>(s); }

}  // namespace hotops::pointwise
