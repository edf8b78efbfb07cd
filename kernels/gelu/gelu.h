// The gelu family: PyTorch's gelu (fwd) and gelu_backward (bwd: dx from x and dy), exact (erf) or
// tanh-approximated, on the CPU (oneDNN's eltwise primitives and a hand-written loop, `impl:`) and
// a hand-written CUDA kernel. The family's second op, gelu_dbias (GELU backward fused with the bias
// gradient of the dense layer before it), is in gelu_dbias.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::gelu {

// PyTorch's `approximate` argument: none = x * Phi(x) through erf, tanh = the tanh formula.
enum class Approx { none, tanh };
const char* approx_name(Approx a);

// The CPU implementations: oneDNN's eltwise primitive (cpu_onednn.cpp) and hotops' own vectorised
// loop (cpu_hotops.cpp). Each dtype has a default one (problems without an `impl` arg; gelu.cpp's
// kCpuImpls table says which) and may have the other as `impl:<name>`.
enum class CpuImpl { onednn, hotops };
const char* cpu_impl_name(CpuImpl i);
CpuImpl default_cpu_impl(DType t);

// One problem: `elements` values, stored `offset` elements into their buffers (test problems use an
// offset to put the tensors off a 16-byte boundary), followed by kGuard untouched elements.
//   fwd  y[i]  = gelu(x[i])
//   bwd  dx[i] = dy[i] * gelu'(x[i])
struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;
  Approx approx = Approx::none;
  std::int64_t elements = 1;
  std::int64_t offset = 0;
  std::optional<CpuImpl> impl;  // the CPU implementation; none: the dtype's default
};
constexpr std::size_t kGuard = 8;

Shape shape_of(const Problem& p);
CpuImpl cpu_impl_of(const Problem& p);  // the `impl` arg, else the dtype's default
CpuImpl cpu_impl_of(const Shape& s);    // the shape's impl, else the dtype's default

std::size_t buffer_count(const Shape& s);  // offset + elements + kGuard

// Inputs, seeded from the problem name so every backend sees the same numbers. x is uniform in
// [-5, 5): both tails of gelu, where erf/tanh saturate, and the curved middle; dy in [-1, 1).
struct Inputs {
  HostBuffer x;
  HostBuffer dy;  // bwd only
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // y (fwd) or dx (bwd), same layout as the inputs

// Reference in double: gelu(x) (fwd) or dy * gelu'(x) (bwd).
double reference(Approx a, Direction d, double x, double dy);

// The verification bound of a problem (by dtype, direction, approximation); gelu.cpp derives each.
double error_bound(const Shape& s);

// Checks out[offset, offset + elements) against the reference (sampled when large, always both ends)
// and that the elements around that range are still poisoned (NaN), i.e. were never written.
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The tensors of one gelu, each the start of a buffer of buffer_count(shape) values in the shape's
// dtype, the tensor itself `offset` elements into it: host memory on the CPU, device memory on CUDA.
struct Args {
  const void* x = nullptr;   // the input
  const void* dy = nullptr;  // bwd: the gradient of y
  void* out = nullptr;       // y (fwd) or dx (bwd)
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: the shape's CPU implementation; CUDA: hotops' kernel

std::unique_ptr<Plan> make_cpu_onednn_plan(const Shape& s);
std::string onednn_unsupported_reason(const Problem& p);
std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s);
// hotops' loop for bf16 and f16 written for AVX-512 with BF16 (cpu_avx512.cpp): the span of a 16-bit
// problem, or nullptr for f32 or on a CPU without those extensions (the portable loop runs then).
using SpanFn = void (*)(const void* x, const void* dy, void* out, std::int64_t n);
SpanFn avx512_span_for(const Shape& s);
// The same results looked up in a table of that version's results for every 16-bit input (built
// here, on the first call for a kind of problem, outside any timing): hotops' default for bf16 and
// f16 where the CPU has AVX-512 with BF16; nullptr where avx512_span_for is.
SpanFn avx512_table_span_for(const Shape& s);
// The portable loop (the clone this CPU runs) and its table version for bf16 and f16 (nullptr for
// f32), the default where avx512_table_span_for is nullptr; here for the tests.
SpanFn portable_span_for(const Shape& s);
SpanFn portable_table_span_for(const Shape& s);
// The hand-written loop's own conversions (scalar copies of what its vectorised loop does), for
// the tests to compare with hotops' conversions in dtype.h.
float hotops_f16_to_f32(std::uint16_t h);
std::uint16_t hotops_f32_to_f16(float f);
std::uint16_t hotops_f32_to_bf16(float f);
#ifdef HOTOPS_HAVE_CUDA
// The CUDA kernel's own code, run on the host one thread at a time over a grid of `blocks` blocks:
// lets the tests check its indexing (unaligned head, vectors, tail) without a GPU.
void run_cuda_kernel_on_host(const Shape& s, const void* x, const void* dy, void* out, unsigned blocks);
#endif

const Family& family();

}  // namespace hotops::gelu
