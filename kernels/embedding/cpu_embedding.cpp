// embedding on the CPU: hand-written OpenMP loops.
//   fwd: one row copy (memcpy) per index, indices split statically over the threads.
//   bwd: one pass over the vocabulary rows, each summed in f32 in an L1-resident row buffer in the
//        CSR's fixed position order (rows no index hits are zeros) and written once; streamed
//        (non-temporal) when dW is larger than the caches. The caller builds the CSR at setup.
#include <omp.h>

#include <cstring>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/embedding/embedding.h"

namespace hotops::embedding {
namespace {

// acc[j] (+)= row[j], the row's elements widened to f32.
template <bool kFirst>
void accumulate(float* acc, const void* row, std::size_t dim, DType t) {
  if (t == DType::f32) {
    const float* r = static_cast<const float*>(row);
    for (std::size_t j = 0; j < dim; ++j) acc[j] = kFirst ? r[j] : acc[j] + r[j];
  } else {
    const std::uint16_t* r = static_cast<const std::uint16_t*>(row);
    for (std::size_t j = 0; j < dim; ++j) {
      const float v = bf16_to_float(r[j]);
      acc[j] = kFirst ? v : acc[j] + v;
    }
  }
}

class CpuEmbedding final : public Plan {
 public:
  explicit CpuEmbedding(const Shape& s) : s_(s) {
    const auto rows = static_cast<std::size_t>(s_.dir == Direction::fwd ? s_.n() : s_.vocab);
    const std::size_t out_bytes =
        rows * static_cast<std::size_t>(s_.dim) * (s_.dir == Direction::fwd ? dtype_size(s_.dtype) : sizeof(float));
    stream_ = out_bytes >= cpu::kStreamMinBytes;
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd) forward(a);
    else backward(a);
  }

  std::string label() const override {
    return std::string("hotops OpenMP ") +
           (s_.dir == Direction::fwd ? "row gather (memcpy per index)"
                                     : "dW per vocab row from a setup-time CSR, f32 sums in fixed order") +
           (stream_ ? ", streaming stores" : "") + ", " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  void forward(const Args& a) {
    const std::size_t row_bytes = static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype);
    const auto* w = static_cast<const std::byte*>(a.W);
    auto* out = static_cast<std::byte*>(a.out);
    const std::int64_t* idx = a.idx;
    const std::int64_t n = s_.n();
    const bool stream = stream_;
#pragma omp parallel num_threads(cpu::threads())
    {
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const std::byte* src = w + static_cast<std::size_t>(idx[i]) * row_bytes;
        std::byte* dst = out + static_cast<std::size_t>(i) * row_bytes;
        if (stream) cpu::stream_copy(dst, src, row_bytes);
        else std::memcpy(dst, src, row_bytes);
      }
      if (stream) cpu::stream_fence();
    }
  }

  void backward(const Args& a) {
    const auto dim = static_cast<std::size_t>(s_.dim);
    const std::size_t row_bytes = dim * dtype_size(s_.dtype);
    const auto* dout = static_cast<const std::byte*>(a.dout);
    auto* dw = static_cast<float*>(a.dW);
    const std::int32_t* off = a.offset;
    const std::int32_t* pos = a.pos;
    const std::int64_t vocab = s_.vocab;
    const DType t = s_.dtype;
    const bool stream = stream_;
#pragma omp parallel num_threads(cpu::threads())
    {
      std::vector<float> acc(dim);
#pragma omp for schedule(dynamic, 64)
      for (std::int64_t r = 0; r < vocab; ++r) {
        const std::int32_t b = off[r], e = off[r + 1];
        if (b == e) {
          std::fill(acc.begin(), acc.end(), 0.f);
        } else {
          accumulate<true>(acc.data(), dout + static_cast<std::size_t>(pos[b]) * row_bytes, dim, t);
          for (std::int32_t j = b + 1; j < e; ++j)
            accumulate<false>(acc.data(), dout + static_cast<std::size_t>(pos[j]) * row_bytes, dim, t);
        }
        float* dst = dw + static_cast<std::size_t>(r) * dim;
        if (stream) cpu::stream_copy(dst, acc.data(), dim * sizeof(float));
        else std::memcpy(dst, acc.data(), dim * sizeof(float));
      }
      if (stream) cpu::stream_fence();
    }
  }

  Shape s_;
  bool stream_ = false;  // the output is larger than the caches
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuEmbedding>(s); }

}  // namespace hotops::embedding
