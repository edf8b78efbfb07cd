// The matmul family: mm (A·B), addmm (beta·bias + alpha·A·B, PyTorch semantics) and bmm (batched),
// forward and both backward directions, on oneDNN (CPU; hand-written loops for the smallest) and
// cuBLASLt (CUDA); and a dense layer's bias gradient on its own, bias_grad (bias_grad.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::matmul {

enum class Op { mm, addmm, bmm };

// Row-major operands, in PyTorch's terms:
//   fwd        out[b,m,n] = alpha * sum_k A[b,m,k] * B[b,k,n] + beta * bias[n]     (bias: addmm only)
//   bwd_data   dA[b,m,k]  = alpha * sum_n dOut[b,m,n] * B[b,k,n]
//   bwd_weight dB[b,k,n]  = alpha * sum_m A[b,m,k] * dOut[b,m,n];  dbias[n] = beta * sum_m dOut[m,n]
// mm and bmm have no bias; addmm has batch_count 1 (a Linear layer's rows are M). An operand stored
// transposed (trans_a: A as [b,k,m]; trans_b: B as [b,n,k], a PyTorch Linear's weight) has its
// gradient written in the same layout. A Linear layer y = x W^T + bias (W [N, K]) is addmm with
// trans_b: fwd gives y, bwd_data dx, bwd_weight dW and dbias.
// Where the matrices of a batched operand lie in its buffer: matrix (sample, head), batch item
// sample * heads + head, starts at sample * per_sample + head * per_head elements, its rows (as
// stored) ld elements apart, each row contiguous.
struct View {
  std::int64_t per_sample = 0, per_head = 0, ld = 0;
};
// bmm over strided views: batch_count = samples x heads, and each operand a View (A and dA share
// a's, B and dB b's, out and dOut out's). heads 0: every operand packed.
struct Views {
  std::int64_t heads = 0;
  View a, b, out;
};

struct Shape {
  Op op = Op::mm;
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // f32, bf16, or tf32 (f32 storage, TF32 tensor cores; CUDA only)
  std::int64_t batch_count = 1, M = 1, N = 1, K = 1;
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 1;
  // addmm fwd: a ReLU after the bias, in the same GEMM (a hidden dense layer's activation: cublasLt's
  // bias + ReLU epilogue, oneDNN's ReLU post-op).
  bool relu = false;
  // mm: the output written in f32 (a weight gradient for f32 master weights), A and B in the dtype.
  bool f32_out = false;
  // fwd and bwd_data: out += C, C (Args::c) in out's layout and dtype, added unscaled after alpha and
  // the bias; the residual a model folds into its GEMM (cublasLt's beta = 1 C, oneDNN's binary add
  // post-op). No named problem sets it.
  bool residual = false;
  // CUDA: split-K partial sums reduced in f32 only, never rounded to a bf16 output
  // (gpu::GemmDesc::reduce_in_compute), for a mixed-precision model's GEMMs.
  bool reduce_in_compute = false;
  // bmm: operands as strided views (the heads of multi-head attention's fused buffers); see Views.
  Views views;
  // A's K columns stored as a_blocks row-major [M, K / a_blocks] matrices one after another, dA so
  // too: a dense layer over the concatenation of a_blocks tensors along their features, read where
  // they lie (a bidirectional RNN's final hidden states [2, batch, hidden]; `a_blocks:2` in a name).
  // mm and addmm, batch 1, no transposes, N at most kBlocksMaxN: hotops' kernels on both backends
  // (a small head that a library call's fixed cost would dominate; one pass, f32 sums, the output
  // rounded once). 1: A packed.
  std::int64_t a_blocks = 1;
  // fwd, mm or addmm, batch 1, CPU: B (the weights) held in the layout oneDNN's matmul prefers for
  // this product (format_tag::any: blocked for its kernels), written from B as stored by cpu_pack_b
  // once, where the weights stay fixed (an inference step's dense layer; `w:packed` in a name).
  // Args::b then points at that copy.
  bool b_packed = false;
  bool strided() const { return views.heads > 0; }
  bool blocked() const { return a_blocks > 1; }
};
constexpr std::int64_t kBlocksMaxN = 16;  // N at most, with a_blocks > 1

Shape shape_of(const Problem& p);
// The dtype of the output: f32 with f32_out, else the dtype (tf32: f32 storage).
DType out_dtype(const Shape& s);

// The tensors of one matmul direction (see Shape for each one's layout); each direction reads and
// writes only its own, the others stay null.
struct Args {
  const void* a = nullptr;     // A        fwd, bwd_weight
  const void* b = nullptr;     // B        fwd, bwd_data
  const void* bias = nullptr;  // bias[N]  addmm fwd (the plan applies beta)
  const void* dout = nullptr;  // dOut     bwd_data, bwd_weight
  void* out = nullptr;         // out (fwd), dA (bwd_data) or dB (bwd_weight)
  void* dbias = nullptr;       // dbias[N] addmm bwd_weight
  const void* c = nullptr;     // residual: added to out (fwd, bwd_data), out's layout; not out itself
};

// Multi-head attention's batched GEMMs on the heads of its buffers, as a transformer layer holds
// them: qkv [samples, seq, 3, heads, head_dim] (Q | K | V per token), the probabilities packed
// [samples, heads, seq, seq], the context [samples, seq, heads, head_dim]. Each GEMM is a bmm over
// strided views, its tensors pointed at the first element of their view (K at qkv + hidden, V at
// qkv + 2 hidden, their gradients likewise in dqkv):
//   scores   P = Q . K^T / sqrt(head_dim)  fwd;  bwd_data: dQ = dS . K / sqrt(head_dim);
//                                                bwd_weight: dK = dS^T . Q / sqrt(head_dim)
//   context  C = P . V                     fwd;  bwd_data: dP = dC . V^T;  bwd_weight: dV = P^T . dC
enum class AttentionGemm { scores, context };
Shape attention_gemm(AttentionGemm g, Direction d, DType t, std::int64_t samples, std::int64_t seq, std::int64_t heads,
                     std::int64_t head_dim);
// A transformer layer's attention buffers, whole (null where a direction does not use one).
struct AttentionTensors {
  void* qkv = nullptr;   // [tokens, 3 hidden]
  void* prob = nullptr;  // [samples, heads, seq, seq]
  void* ctx = nullptr;   // [tokens, hidden]
  void* dqkv = nullptr;  // their gradients, laid out alike (dprob: dP, or dS = softmax's backward of it)
  void* dprob = nullptr;
  void* dctx = nullptr;
};
// The tensors of attention_gemm(g, d, t, ...): the first element of each view in the layer's buffers.
Args attention_args(AttentionGemm g, Direction d, DType t, std::int64_t hidden, const AttentionTensors& x);

// Inputs, seeded from the problem name so every backend sees the same numbers.
struct Inputs {
  HostBuffer a;     // [B,M,K]  fwd, bwd_weight ([B,K,M] with trans_a)
  HostBuffer b;     // [B,K,N]  fwd, bwd_data   ([B,N,K] with trans_b)
  HostBuffer bias;  // [N]      addmm fwd
  HostBuffer dout;  // [B,M,N]  bwd_data, bwd_weight
  HostBuffer b_packed;  // b_packed: b in the CPU plan's layout (cpu_pack_b)
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

enum class Operand { a, b, dout };  // which of a direction's inputs
const HostBuffer& operand(const Inputs& in, Operand o);
const void* operand(const Args& a, Operand o);

// The product a direction computes, in row-major terms with its output dense as stored:
// D[b][r][c] = alpha * sum_q X[b][r][q] * Y[b][q][c], where X ([rows, depth]) and Y ([depth, cols])
// are inputs read as stored or as the transpose of what is stored (x_t, y_t). An output stored
// transposed (dA with trans_a, dB with trans_b) is computed as D^T = Y^T X^T. Every operand of a
// batch is packed (each matrix right after the previous), or where the shape is strided, in its View.
struct Product {
  Operand x = Operand::a, y = Operand::b;
  bool x_t = false, y_t = false;
  std::int64_t rows = 0, cols = 0, depth = 0;
};
Product product(const Shape& s);

// The primary output of a direction (out, dA or dB) and, for addmm bwd_weight, dbias.
struct Outputs {
  HostBuffer primary;
  HostBuffer dbias;
};
Outputs make_outputs(const Shape& s);
std::size_t primary_count(const Shape& s);
// Strided views: where element `i` of the primary output (counted densely: item, row, column as
// stored) lies in its buffer; packed: i.
std::size_t primary_at(const Shape& s, std::size_t i);
// a_blocks: where A[m, k] (and dA's) lies in its blocks.
std::size_t blocked_at(const Shape& s, std::int64_t m, std::int64_t k);
// The elements an operand's buffer holds: its matrices, packed or as its View lays them out.
std::size_t operand_count(const Shape& s, Operand o);

// Reference, double accumulation: element i of the primary output (counted densely, as
// primary_at) / of dbias.
double reference_primary(const Shape& s, const Inputs& in, std::size_t idx);
double reference_dbias(const Shape& s, const Inputs& in, std::size_t n);
// Every element, for the tests.
void reference(const Shape& s, const Inputs& in, Outputs& out);

// Verifies outputs (sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// Named shapes from real models, with the batch axis (see shapes.cpp).
struct NamedShape {
  std::string name;                     // e.g. "bert.ffn_up"
  std::vector<Op> ops;                  // which ops it is benchmarked for
  std::int64_t rows_per_sample;         // M = batch * rows_per_sample (mm/addmm); 0: no batch axis
  std::int64_t heads;                   // bmm: batch_count = batch * heads
  std::int64_t M, N, K;                 // M is used when there is no batch axis, or for bmm
  std::vector<std::int64_t> batches;    // default batch sizes
  bool cuda_only = false;               // too slow to be worth a CPU run in every sweep
  std::string view = "";                // bmm: also run on attention's views: "qkv.scores", "qkv.context" ("": not)
  std::int64_t a_blocks = 1;            // > 1: only as Shape::a_blocks, in the directions a model step runs
  bool step_only = false;               // only in the ops and directions a model step runs (as a_blocks > 1)
  bool packed = false;                  // also addmm fwd on the CPU with B prepacked (Shape::b_packed)
};
const std::vector<NamedShape>& named_shapes();

HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN matmul, or the loops below; CUDA: cublasLt (gpu::LtGemm); a_blocks: hotops'
// The plans of a_blocks shapes (cpu_blocks.cpp, cuda_blocks.cu).
std::unique_ptr<Plan> make_cpu_blocks_plan(const Shape& s);
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<Plan> make_cuda_blocks_plan(const Shape& s);
#endif

// The CPU plan of an mm or addmm below this many multiply-adds (M x N x K), on packed operands as
// stored (no transposes, no residual), is hand-written single-thread loops (cpu_loops.cpp): there a
// oneDNN primitive's fixed cost per call is most of the time (a tiny MLP's layers).
constexpr std::int64_t kCpuLoopMacs = 64 * 1024;
bool cpu_runs_loops(const Shape& s);
std::unique_ptr<Plan> make_cpu_loop_plan(const Shape& s);  // make_cpu_plan's choice where cpu_runs_loops

// b_packed: the bytes of B in the CPU plan's layout for `s`, and B as stored (dtype `from`: f32 or
// the shape's) reordered into it (oneDNN's reorder, made for the call: setup, not a step).
std::size_t cpu_packed_b_bytes(const Shape& s);
void cpu_pack_b(const Shape& s, const void* b, DType from, void* packed);

// Why the CPU cannot run `p` ("" when it can): a dtype it has no matmul for, or oneDNN's answer
// (none asked where the loops run it).
std::string cpu_unsupported_reason(const Problem& p);
// The same for a plan's shape (a model's layer), from the descriptors alone: no primitive is made.
std::string cpu_unsupported_reason(const Shape& s);
const Family& family();

}  // namespace hotops::matmul
