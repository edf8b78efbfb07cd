// embedding on the CPU: hand-written OpenMP loops.
//   fwd: one row copy (memcpy) per index, indices split statically over the threads; an f32 table's
//        rows rounded to bf16 (f32_table), in a loop compiled per x86-64 level; an output larger than the caches
//        gathered a block of rows at a time into an L1-resident buffer and streamed out.
//   bwd: one pass over the vocabulary rows, each summed in f32 in an L1-resident row buffer in the
//        CSR's fixed position order (rows no index hits are zeros) and written once; streamed
//        (non-temporal) when dW is larger than the caches; the dout row 16 positions on in the CSR
//        prefetched before each is added. The caller builds the CSR at setup.
//   time_major: fwd writes out's rows in order (each from its index's table row); bwd has no CSR:
//        thread k of n zeroes the dW rows r with r % n == k, then walks dout's rows in order and adds
//        those whose index is one of its rows, so each row's sum runs in dout's row order whatever
//        the thread count.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/embedding/embedding.h"

namespace hotops::embedding {
namespace {

// The bf16 rows' loops, compiled per x86-64 level (HOTOPS_CPU_CLONES) so that the conversions
// vectorise: in the baseline build they ran an element at a time (the f32 table's gather into bf16
// took 2.4 times the f32 gather's time). dst[j] = src[j] rounded to bf16 (to nearest even);
// acc[j] = row[j] widened, or acc[j] += it.
HOTOPS_CPU_CLONES void round_row(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = vec::f32_to_bf16(src[j]);
}
HOTOPS_CPU_CLONES void widen_row(float* acc, const std::uint16_t* row, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) acc[j] = vec::bf16_to_f32(row[j]);
}
HOTOPS_CPU_CLONES void add_row(float* acc, const std::uint16_t* row, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) acc[j] += vec::bf16_to_f32(row[j]);
}

// acc[j] (+)= row[j], the row's elements widened to f32.
template <bool kFirst>
void accumulate(float* acc, const void* row, std::size_t dim, DType t) {
  if (t == DType::f32) {
    const float* r = static_cast<const float*>(row);
    for (std::size_t j = 0; j < dim; ++j) acc[j] = kFirst ? r[j] : acc[j] + r[j];
  } else if (kFirst) {
    widen_row(acc, static_cast<const std::uint16_t*>(row), static_cast<std::int64_t>(dim));
  } else {
    add_row(acc, static_cast<const std::uint16_t*>(row), static_cast<std::int64_t>(dim));
  }
}

// Asks for the cache lines of one dout row: a row gather's loads are misses in an order the hardware
// cannot guess.
void prefetch_row(const std::byte* row, std::size_t bytes) {
  for (std::size_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o);
  __builtin_prefetch(row + bytes - 1);
}

// How many positions ahead of the one it adds the backward asks for a row.
constexpr std::int32_t kPrefetchAhead = 16;

class CpuEmbedding final : public Plan {
 public:
  explicit CpuEmbedding(const Shape& s) : s_(s) {
    const auto rows = static_cast<std::size_t>(s_.dir == Direction::fwd ? s_.n() : s_.vocab);
    const std::size_t out_bytes =
        rows * static_cast<std::size_t>(s_.dim) * (s_.dir == Direction::fwd ? dtype_size(s_.dtype) : sizeof(float));
    // Streaming stores write whole runs of rows; a time-major gather's consecutive rows are not.
    stream_ = out_bytes >= cpu::kStreamMinBytes && !s_.time_major;
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd) forward(a);
    else if (s_.time_major) backward_by_owner(a);
    else backward(a);
  }

  std::string label() const override {
    const char* what = s_.dir == Direction::fwd
                           ? (s_.f32_table ? "row gather (f32 rows rounded to bf16)" : "row gather (memcpy per index)")
                       : s_.time_major ? "dW rows owned by thread (row mod threads), each summed in dout's row order"
                                       : "dW per vocab row from a setup-time CSR, f32 sums in fixed order";
    return std::string("hotops OpenMP ") + what + (s_.time_major ? ", time-major rows" : "") +
           (stream_ ? ", streaming stores" : "") + ", " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  void forward(const Args& a) {
    const std::size_t row_bytes = static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype);
    const auto* w = static_cast<const std::byte*>(a.W);
    auto* out = static_cast<std::byte*>(a.out);
    const std::int64_t* idx = a.idx;
    const std::int64_t n = s_.n();
    if (stream_ && !s_.f32_table) return forward_streamed(w, idx, out, row_bytes, n);
#pragma omp parallel num_threads(cpu::threads())
    {
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < n; ++r) {  // out's rows in order
        const std::int64_t i = s_.index_of(r);
        std::byte* dst = out + static_cast<std::size_t>(r) * row_bytes;
        if (s_.f32_table) {  // bf16 rows of the f32 table
          round_row(reinterpret_cast<const float*>(w) + static_cast<std::size_t>(idx[i]) * s_.dim,
                    reinterpret_cast<std::uint16_t*>(dst), s_.dim);
          continue;
        }
        std::memcpy(dst, w + static_cast<std::size_t>(idx[i]) * row_bytes, row_bytes);
      }
    }
  }

  // A gather into an output larger than the caches: each thread's contiguous run of output rows
  // gathered a block at a time into an L1-resident buffer and streamed out as one copy, so that the
  // non-temporal stores fill whole cache lines (rows of 100 or 200 bytes streamed one by one mix
  // them with ordinary stores to the same lines).
  void forward_streamed(const std::byte* w, const std::int64_t* idx, std::byte* out, std::size_t row_bytes, std::int64_t n) const {
    constexpr std::size_t kBlockBytes = 16 << 10;
    const auto block_rows = static_cast<std::int64_t>(std::max<std::size_t>(1, kBlockBytes / row_bytes));
#pragma omp parallel num_threads(cpu::threads())
    {
      std::vector<std::byte> block(static_cast<std::size_t>(block_rows) * row_bytes);
      const std::int64_t team = omp_get_num_threads(), k = omp_get_thread_num();
      const std::int64_t end = n * (k + 1) / team;
      for (std::int64_t r = n * k / team; r < end; r += block_rows) {
        const std::int64_t m = std::min(block_rows, end - r);
        for (std::int64_t j = 0; j < m; ++j)
          std::memcpy(block.data() + static_cast<std::size_t>(j) * row_bytes,
                      w + static_cast<std::size_t>(idx[s_.index_of(r + j)]) * row_bytes, row_bytes);
        cpu::stream_copy(out + static_cast<std::size_t>(r) * row_bytes, block.data(), static_cast<std::size_t>(m) * row_bytes);
      }
      cpu::stream_fence();
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
    const std::int32_t n = off[vocab];
    const DType t = s_.dtype;
    const bool stream = stream_;
#pragma omp parallel num_threads(cpu::threads())
    {
      std::vector<float> acc(dim);
#pragma omp for schedule(dynamic, 64)
      for (std::int64_t r = 0; r < vocab; ++r) {
        const std::int32_t b = off[r], e = off[r + 1];
        for (std::int32_t j = b; j < e; ++j)  // the rows kPrefetchAhead positions on (the next vocab rows' too)
          if (j + kPrefetchAhead < n) prefetch_row(dout + static_cast<std::size_t>(pos[j + kPrefetchAhead]) * row_bytes, row_bytes);
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

  void backward_by_owner(const Args& a) {
    const std::int64_t dim = s_.dim, vocab = s_.vocab, n = s_.n();
    const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(s_.dtype);
    const auto* dout = static_cast<const std::byte*>(a.dout);
    auto* dw = static_cast<float*>(a.dW);
    const std::int64_t* idx = a.idx;
    const bool f32 = s_.dtype == DType::f32;
#pragma omp parallel num_threads(cpu::threads())
    {
      const int k = omp_get_thread_num(), team = omp_get_num_threads();
      for (std::int64_t r = k; r < vocab; r += team) std::fill_n(dw + r * dim, dim, 0.f);
      for (std::int64_t q = 0; q < n; ++q) {  // dout's rows in order
        const std::int64_t r = idx[s_.index_of(q)];
        if (r % team != k) continue;
        float* acc = dw + r * dim;
        const std::byte* g = dout + static_cast<std::size_t>(q) * row_bytes;
        if (f32) {
          const float* x = reinterpret_cast<const float*>(g);
#pragma omp simd
          for (std::int64_t j = 0; j < dim; ++j) acc[j] += x[j];
        } else {
          add_row(acc, reinterpret_cast<const std::uint16_t*>(g), dim);
        }
      }
    }
  }

  Shape s_;
  bool stream_ = false;  // the output is larger than the caches
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuEmbedding>(s); }

}  // namespace hotops::embedding
