// The attention family: scaled dot-product multi-head attention over the heads of a transformer
// layer's packed QKV buffer, as BERT's and ViT's encoder layers run it (no mask, no dropout):
//
//   fwd  per (sample, head): P = softmax(Q K^T / sqrt(head_dim)) over the keys, O = P V
//   bwd  from dO: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
//        dQ = dS K / sqrt(head_dim), dK = dS^T Q / sqrt(head_dim)
//
// Layouts, as the layer holds them: qkv [batch, seq, 3, heads, head_dim] (Q | K | V of each token),
// ctx and dctx [batch, seq, heads, head_dim], dqkv as qkv. On the CPU the op is the matmul family's
// strided-head GEMMs and the softmax family's plan, in sequence (cpu_attention.cpp); on CUDA hotops'
// fused kernels where they take the case (bf16, head_dim 64, seq <= 256: cuda_fused.h), else the same
// composition of the CUDA matmul and softmax plans.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::attention {

struct Shape {
  Direction dir = Direction::fwd;  // fwd or bwd
  DType dtype = DType::f32;        // f32 or bf16; every sum accumulates in f32
  std::int64_t batch = 1, seq = 1, heads = 1, head_dim = 1;
  std::int64_t hidden() const { return heads * head_dim; }
  std::int64_t tokens() const { return batch * seq; }
  std::size_t qkv_elements() const { return static_cast<std::size_t>(tokens() * 3 * hidden()); }
  std::size_t ctx_elements() const { return static_cast<std::size_t>(tokens() * hidden()); }
  // The probabilities of every head, [batch, heads, seq, seq].
  std::size_t probability_elements() const { return static_cast<std::size_t>(batch * heads * seq * seq); }
};
// Elements after the output (ctx or dqkv) in the benchmark's buffer that no op may write.
constexpr std::size_t kGuard = 8;

Shape shape_of(const Problem& p);

// The tensors of one attention, each in the shape's dtype (saved: as the plan lays it out).
//   fwd reads qkv; writes ctx and `saved`, what the backward needs;
//   bwd reads qkv, ctx, saved (which it may also use as scratch) and dctx; writes all of dqkv
//       (the Q, K and V slots of every token).
struct Args {
  const void* qkv = nullptr;
  void* ctx = nullptr;
  void* saved = nullptr;
  const void* dctx = nullptr;  // bwd
  void* dqkv = nullptr;        // bwd
};
// The bytes the caller allocates for `saved` on backend `b`: the probabilities
// (probability_elements() in the dtype) where the op is composed of GEMMs and a softmax (the CPU; CUDA
// where the fused kernels do not take the shape), else the fused kernels' (fused::saved_bytes).
std::size_t saved_bytes(const Shape& s, Backend b);

HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: matmul + softmax plans; CUDA: fused kernels, or those plans
// The op as the matmul family's strided-head GEMM plans and the softmax family's plan on backend `b`
// (CPU: the CPU plan; CUDA: where the fused kernels do not take the shape, `why_not_fused` saying why).
std::unique_ptr<Plan> make_composed_plan(const Shape& s, Backend b, const std::string& why_not_fused = "");

// Inputs, seeded from the problem name so every backend sees the same numbers: qkv uniform in
// [-2, 2) (the scores' standard deviation is then 4/3 whatever head_dim is); bwd: dctx uniform in
// [-1, 1). The backward's ctx and saved come from the backend's own forward, at setup.
struct Inputs {
  HostBuffer qkv;
  HostBuffer dctx;  // bwd
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // ctx (fwd) or dqkv (bwd), + kGuard elements

// The reference in double over one head: q, k, v, o, dout, dq, dk, dv are [seq, head_dim] row-major,
// p [seq, seq]. fwd writes p and o; bwd takes p from fwd and writes dq, dk, dv.
void reference_fwd(const double* q, const double* k, const double* v, std::size_t seq, std::size_t head_dim, double* p,
                   double* o);
void reference_bwd(const double* q, const double* k, const double* v, const double* p, const double* dout, std::size_t seq,
                   std::size_t head_dim, double* dq, double* dk, double* dv);

// Checks the heads (all of them, or a seeded sample that always has the first and last) against the
// reference within the bounds attention.cpp derives, and that the kGuard elements after the output
// are still poisoned (NaN).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

std::string cpu_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::attention
