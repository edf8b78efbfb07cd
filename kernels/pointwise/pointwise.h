// The pointwise family: support ops of the composite models that touch each element once.
//   relu     fwd  y[i]  = max(x[i], 0)
//            bwd  dx[i] = x[i] > 0 ? dy[i] : 0           (PyTorch's threshold_backward on the input)
//   dropout  fwd  y[i]  = x[i] * keep(i) / (1 - p), and mask[i] = keep(i) as one uint8 for bwd
//            bwd  dx[i] = dy[i] * mask[i] / (1 - p)
//   relu_dbias  bwd  relu bwd over [rows, cols] row-major, and db[c] = sum over rows of dx[r, c] (f32):
//            a dense layer's ReLU and bias gradient in one pass (x may be the ReLU's output)
//   relu_bias   fwd  y[r, c] = max(x[r, c] + b[c], 0) over [rows, cols]: a dense layer's bias and ReLU
//            where no GEMM epilogue adds them (in place allowed)
// relu: oneDNN's eltwise primitive on the CPU, a hand-written CUDA kernel; the others hand-written
// on both. The dropout mask is a pure function of (seed, element index) through the counter-based
// hash below, one piece of code for the host and the device, so every backend and the reference
// draw the same mask.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

#ifdef __CUDACC__
#define POINTWISE_HD __host__ __device__ __forceinline__
#else
#define POINTWISE_HD [[gnu::always_inline]] inline
#endif

namespace hotops::pointwise {

enum class Op { relu, dropout, relu_dbias, relu_bias };

// One problem: `elements` values stored `offset` elements into their buffers (test problems use an
// offset to put the tensors off a 16-byte boundary), followed by kGuard elements that must stay
// untouched. The mask has the same layout, one byte per element. relu_dbias and relu_bias: the
// elements are [rows, cols] row-major, cols the last of the name's dims; db (cols f32) and b (cols
// in the dtype) are followed by kGuard.
struct Shape {
  Op op = Op::relu;
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;
  std::int64_t elements = 1;
  std::int64_t offset = 0;
  double p = 0;           // dropout: the probability of zeroing an element
  std::int64_t cols = 1;  // relu_dbias, relu_bias: the bias's length
  bool relu = true;       // relu_bias: false adds the bias alone (a layer with no activation; no entry)
  std::int64_t rows() const { return elements / cols; }
};
constexpr std::size_t kGuard = 8;

Shape shape_of(const Problem& p);
std::size_t buffer_count(const Shape& s);  // offset + elements + kGuard

// ---- The dropout mask: one definition for the CPU loop, the CUDA kernel and the reference ----

// Chris Wellons' lowbias32 finaliser: a bijection of 32-bit words with good avalanche. 32-bit
// multiplies only, so the CPU loop vectorises on AVX2 as well as AVX-512.
POINTWISE_HD std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// What a dropout mask depends on: the seed's two key words, the keep threshold and the scale.
// Element i is kept when the high 24 bits of its hash are >= threshold (24 bits so that the compare
// is a signed one, which every SIMD ISA has): P(keep) = 1 - threshold / 2^24, p rounded to 2^-24.
struct DropoutKey {
  std::uint32_t k0 = 0, k1 = 0;
  std::uint32_t threshold = 0;  // round(p * 2^24)
  float scale = 1;              // 1 / (1 - p) in f32, as PyTorch's scale in its f32 accumulate type
};
DropoutKey dropout_key(std::uint64_t seed, double p);

// The hash of element i = hi * 2^32 + lo: two keyed rounds, a bijection of lo for fixed (hi, key).
POINTWISE_HD std::uint32_t dropout_hash(const DropoutKey& k, std::uint32_t lo, std::uint32_t hi) {
  return mix32(mix32(lo ^ k.k0) + (hi ^ k.k1));
}
POINTWISE_HD bool dropout_keep(const DropoutKey& k, std::uint32_t lo, std::uint32_t hi) {
  return static_cast<std::int32_t>(dropout_hash(k, lo, hi) >> 8) >= static_cast<std::int32_t>(k.threshold);
}
POINTWISE_HD bool dropout_keep(const DropoutKey& k, std::uint64_t i) {
  return dropout_keep(k, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32));
}

// The mask's seed of a problem's inputs seeded by `seed`, and the key of a problem: every backend
// of the same problem (same name less the backend) draws the same mask.
std::uint64_t dropout_seed(std::uint64_t seed);
DropoutKey dropout_key(const Problem& p);

// ---- Inputs, reference, verification ----

// Inputs, from the problem's seed so every backend sees the same numbers: x and dy uniform in
// [-1, 1); the dropout bwd mask is drawn from the problem's key (element i of the tensor is
// mask[offset + i]; the guard bytes are 1).
struct Inputs {
  HostBuffer x;              // relu and relu_dbias, dropout fwd
  HostBuffer dy;             // bwd
  HostBuffer mask;           // dropout bwd (see make_mask)
  HostBuffer b;              // relu_bias: cols + kGuard, uniform in [-1, 1)
  std::uint64_t seed = 0;    // dropout: the mask's seed
  DropoutKey key;            // dropout: dropout_key(seed, p)
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // y (fwd) or dx (bwd), same layout as the inputs
HostBuffer make_dbias(const Shape& s);   // relu_dbias: db, cols + kGuard f32
constexpr std::uint8_t kMaskPoison = 0xff;  // what an unwritten mask byte holds
// A mask: buffer_count(s) bytes (held in 4-byte elements, the last rounded up), every byte
// kMaskPoison; its bytes are as<std::uint8_t>().
HostBuffer make_mask(const Shape& s);

// The reference of element i of the tensor (index i of the tensor, not of the buffer), rounded to
// the dtype as the op's output is: relu is exact; dropout is the f32 product x * scale (or dy *
// scale) rounded to the dtype, which is what PyTorch computes, so both compare exactly.
double reference(const Shape& s, const Inputs& in, std::size_t i);
// The dropout mask the reference draws for element i of the tensor.
bool reference_keep(const Shape& s, const Inputs& in, std::size_t i);

// Checks out (and, for dropout fwd, the mask, `mask` bytes laid out as the tensors) exactly against
// the reference, sampled when large with both ends always in, and that the guard elements around
// the tensor are still poisoned (never written).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out, const std::uint8_t* mask = nullptr);
// relu_dbias: db[c] in double, and the sum of its terms' magnitudes (what its rounding grows with).
void reference_dbias(const Shape& s, const Inputs& in, std::vector<double>& db, std::vector<double>& db_abs);
double dbias_error_bound(const Shape& s);  // k of |db - ref| <= k sum |terms| (see pointwise.cpp)
// relu_dbias: every db element against reference_dbias, and its guard still poisoned.
Check verify_dbias(const Shape& s, const Inputs& in, const HostBuffer& db);

// ---- Implementations ----

// The tensors of one relu or dropout, each the start of a buffer of buffer_count(shape) elements in
// the shape's dtype (a mask: bytes), the tensor itself `offset` elements into it: host memory on the
// CPU, device memory on CUDA.
struct Args {
  const void* x = nullptr;                // relu; dropout fwd
  const void* dy = nullptr;               // bwd
  const std::uint8_t* mask_in = nullptr;  // dropout bwd: 1 keeps the element, 0 drops it
  void* out = nullptr;                    // y (fwd) or dx (bwd)
  std::uint8_t* mask_out = nullptr;       // dropout fwd: the mask it draws
  std::uint64_t seed = 0;                 // dropout fwd: the mask's seed (dropout_key(seed, p))
  float* db = nullptr;                    // relu_dbias: [cols] f32 (a buffer of its own, no offset)
  const void* b = nullptr;                // relu_bias: [cols] in the dtype (a buffer of its own, no offset)
};
// relu_dbias may run in place (out == dy), relu_bias too (out == x).
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: the op's own (below); CUDA: hotops' kernels

std::unique_ptr<Plan> make_cpu_relu_plan(const Shape& s);  // oneDNN eltwise_relu (cpu_onednn.cpp)
std::string relu_onednn_unsupported_reason(const Problem& p);
std::unique_ptr<Plan> make_cpu_dropout_plan(const Shape& s);  // hotops' loop (cpu_dropout.cpp)
std::unique_ptr<Plan> make_cpu_relu_dbias_plan(const Shape& s);  // hotops' loop (cpu_relu_dbias.cpp)
std::unique_ptr<Plan> make_cpu_relu_bias_plan(const Shape& s);  // hotops' loop (cpu_relu_dbias.cpp)
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<Plan> make_cuda_relu_dbias_plan(const Shape& s);  // hotops' kernels (cuda_relu_dbias.cu)
std::unique_ptr<Plan> make_cuda_relu_bias_plan(const Shape& s);
#endif
// The CPU dropout loop on one span of the tensor (element `first` onwards), for the tests.
void cpu_dropout_span(const Shape& s, const DropoutKey& k, std::uint64_t first, const void* in, const std::uint8_t* mask_in,
                      void* out, std::uint8_t* mask_out, std::int64_t n);
#ifdef HOTOPS_HAVE_CUDA
// The CUDA kernels' own code, run on the host one thread at a time over a grid of at most `blocks`
// blocks: lets the tests check its indexing (unaligned head, vectors, tail) without a GPU. The
// pointers are those of the tensors (buffer + offset).
void run_cuda_kernel_on_host(const Shape& s, const DropoutKey& k, const void* x, const void* dy,
                             const std::uint8_t* mask_in, void* out, std::uint8_t* mask_out, unsigned blocks);
#endif

const Family& family();

}  // namespace hotops::pointwise
