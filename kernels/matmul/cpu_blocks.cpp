// matmul with A in blocks (Shape::a_blocks) on the CPU: hotops' loops for a small dense head (N at
// most kBlocksMaxN, a few thousand multiply-adds at a model's batch, where a oneDNN call's fixed cost
// would be most of the time), f32 sums, each output rounded once to its dtype:
//   fwd        out[m, n] = alpha sum_k A(m, k) B[k, n] + beta bias[n]: a row of N sums per m
//   bwd_data   dA(m, k)  = alpha sum_n dOut[m, n] B[k, n], written in A's blocks
//   bwd_weight dB[k, n]  = alpha sum_m A(m, k) dOut[m, n], m ascending (addmm: dbias[n] = beta sum_m dOut[m, n])
// OpenMP over rows (fwd, bwd_data) or over k (bwd_weight) above a grain of work, else one thread.
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hotops/cpu.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

constexpr std::int64_t kParallelGrain = 1 << 16;  // multiply-adds

template <class T> float ld(const T* p, std::int64_t i);
template <> float ld<float>(const float* p, std::int64_t i) { return p[i]; }
template <> float ld<std::uint16_t>(const std::uint16_t* p, std::int64_t i) { return bf16_to_float(p[i]); }
template <class T> T narrow(float v);
template <> float narrow<float>(float v) { return v; }
template <> std::uint16_t narrow<std::uint16_t>(float v) { return float_to_bf16(v); }

class CpuBlocks final : public Plan {
 public:
  explicit CpuBlocks(const Shape& s) : s_(s) {
    product(s);  // checks the shape
    if (s_.dir == Direction::bwd_weight) acc_.resize(static_cast<std::size_t>(s_.K * s_.N));
  }

  void run(const Args& a) override {
    const bool bf16 = s_.dtype == DType::bf16;
    if (bf16 && !s_.f32_out) return run_as<std::uint16_t, std::uint16_t>(a);
    if (bf16) return run_as<std::uint16_t, float>(a);
    run_as<float, float>(a);
  }

  std::string label() const override {
    return "hotops " + std::to_string(s_.a_blocks) + "-block small dense loop (f32 sums, one rounding" +
           std::string(s_.f32_out ? ", f32 output" : "") + "), " + std::to_string(team()) + " threads";
  }

 private:
  int team() const { return s_.M * s_.N * s_.K >= kParallelGrain ? cpu::threads() : 1; }

  template <class T, class TO>
  void run_as(const Args& a) {
    const std::int64_t M = s_.M, N = s_.N, K = s_.K, kb = K / s_.a_blocks;
    const auto alpha = static_cast<float>(s_.alpha), beta = static_cast<float>(s_.beta);
    const auto at = [&](std::int64_t m, std::int64_t k) { return (k / kb * M + m) * kb + k % kb; };
    switch (s_.dir) {
      case Direction::fwd: {
        const T* A = static_cast<const T*>(a.a);
        const T* B = static_cast<const T*>(a.b);
        const T* bias = s_.op == Op::addmm ? static_cast<const T*>(a.bias) : nullptr;
        TO* out = static_cast<TO*>(a.out);
#pragma omp parallel for num_threads(team()) schedule(static)
        for (std::int64_t m = 0; m < M; ++m) {
          float acc[kBlocksMaxN] = {};
          for (std::int64_t k = 0; k < K; ++k) {
            const float x = ld(A, at(m, k));
            for (std::int64_t n = 0; n < N; ++n) acc[n] += x * ld(B, k * N + n);
          }
          for (std::int64_t n = 0; n < N; ++n) out[m * N + n] = narrow<TO>(alpha * acc[n] + (bias ? beta * ld(bias, n) : 0.f));
        }
        break;
      }
      case Direction::bwd_data: {
        const T* dout = static_cast<const T*>(a.dout);
        const T* B = static_cast<const T*>(a.b);
        TO* dA = static_cast<TO*>(a.out);
#pragma omp parallel for num_threads(team()) schedule(static)
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t k = 0; k < K; ++k) {
            float acc = 0.f;
            for (std::int64_t n = 0; n < N; ++n) acc += ld(dout, m * N + n) * ld(B, k * N + n);
            dA[at(m, k)] = narrow<TO>(alpha * acc);
          }
        break;
      }
      default: {
        const T* A = static_cast<const T*>(a.a);
        const T* dout = static_cast<const T*>(a.dout);
        TO* dB = static_cast<TO*>(a.out);
        float* acc = acc_.data();
#pragma omp parallel for num_threads(team()) schedule(static)
        for (std::int64_t k = 0; k < K; ++k) {
          float* row = acc + k * N;
          std::fill_n(row, N, 0.f);
          for (std::int64_t m = 0; m < M; ++m) {
            const float x = ld(A, at(m, k));
            for (std::int64_t n = 0; n < N; ++n) row[n] += x * ld(dout, m * N + n);
          }
          for (std::int64_t n = 0; n < N; ++n) dB[k * N + n] = narrow<TO>(alpha * row[n]);
        }
        if (s_.op == Op::addmm) {
          T* db = static_cast<T*>(a.dbias);
          for (std::int64_t n = 0; n < N; ++n) {
            float sum = 0.f;
            for (std::int64_t m = 0; m < M; ++m) sum += ld(dout, m * N + n);
            db[n] = narrow<T>(beta * sum);
          }
        }
      }
    }
  }

  Shape s_;
  std::vector<float> acc_;  // bwd_weight: dB's f32 sums
};

}  // namespace

std::unique_ptr<Plan> make_cpu_blocks_plan(const Shape& s) { return std::make_unique<CpuBlocks>(s); }

}  // namespace hotops::matmul
