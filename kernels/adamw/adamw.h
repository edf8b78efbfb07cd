// The adamw family: one torch.optim.AdamW step over a whole list of parameter tensors (a model's
// parameters), in one pass: a hand-written multi-tensor loop on the CPU (OpenMP over equal chunks of
// all tensors) and one hand-written CUDA kernel launch for the whole list (a device table of tensor
// pointers and chunks, built at setup). The formula, the bf16 master copy and the step count that
// advances with every run: docs/ops.md, "adamw".
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"

// The step's scalar math is shared by the CPU loop and the CUDA kernel (adamw.h is read by both).
#ifdef __CUDACC__
#define HOTOPS_ADAMW_HD __host__ __device__
#else
#define HOTOPS_ADAMW_HD
#endif

namespace hotops::adamw {

struct Hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 1e-2;
};

// One problem: the tensor sizes of a parameter list and the hyperparameters.
struct Shape {
  DType dtype = DType::f32;  // f32 or bf16 (bf16 params and grads, f32 master, m, v)
  std::string params;        // bert_base, keras_cnn, mlp_tiny, flat, or a test list
  std::vector<std::int64_t> sizes;
  Hyper hyper;

  std::int64_t total() const;  // parameters, summed over the tensors
};

Shape shape_of(const Problem& p);

// The tensor sizes of a named parameter list (`elements` for params:flat).
std::vector<std::int64_t> tensor_sizes(const std::string& params, std::int64_t elements);

// Where the tensors lie in one host arena per quantity (p, g, m, v, bf16 p): each tensor starts on a
// 256-byte boundary, as a caching allocator would place it, and the gaps (and kGuard elements after
// the last tensor) are never touched by the step: verification checks that they keep their values.
constexpr std::size_t kAlignElements = 64;
constexpr std::size_t kGuard = 64;
struct Layout {
  std::vector<std::size_t> offset;  // arena index of each tensor's first element
  std::size_t arena = 0;            // elements per arena, gaps and guard included
};
Layout layout_of(const std::vector<std::int64_t>& sizes);

// The unit of work of both backends: a run of at most kChunk elements of one tensor. Chunks split
// every tensor at multiples of kChunk, so only a tensor's last chunk has a partial vector (its tail).
constexpr std::int64_t kChunk = 1 << 14;
struct Chunk {
  std::int32_t tensor;
  std::int32_t count;
  std::int64_t start;  // within the tensor
};
std::vector<Chunk> chunks_of(const std::vector<std::int64_t>& sizes);

// The optimizer's state and inputs in host memory, laid out by layout_of.
struct State {
  HostBuffer p;    // f32: the parameters (bf16 dtype: the f32 master)
  HostBuffer g;    // the problem's dtype
  HostBuffer m, v; // f32
  HostBuffer p16;  // bf16 dtype only: the bf16 parameters, an output
};
State make_state(const Shape& s, const Layout& l);
// The seeded starting state (step count 0): p, g in [-1, 1), m in [-0.5, 0.5), v in [0.01, 0.5);
// p16 NaN (it is an output). A pure function of the seed: verification restores it before checking.
void restore(const Shape& s, State& st, std::uint64_t seed);

// The f32 scalars of step t, computed in double from the hyperparameters: both implementations
// use them (the CUDA kernel computes them on the device, where the step count lives).
struct StepScalars {
  float decay;         // 1 - lr * wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float step_size;     // lr / bc1
  float inv_sqrt_bc2;  // 1 / sqrt(bc2)
};
HOTOPS_ADAMW_HD inline StepScalars scalars_for(const Hyper& h, std::int64_t t) {
  const double bc1 = 1 - ::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1 - ::pow(h.beta2, static_cast<double>(t));
  return {static_cast<float>(1 - h.lr * h.wd),       static_cast<float>(h.beta1),
          static_cast<float>(1 - h.beta1),           static_cast<float>(h.beta2),
          static_cast<float>(1 - h.beta2),           static_cast<float>(h.eps),
          static_cast<float>(h.lr / bc1),            static_cast<float>(1 / ::sqrt(bc2))};
}

// One element of the step in f32, in PyTorch's order of operations (sqrt(v) / sqrt(bc2) as a product
// with the reciprocal). `Sqrt` is the square root: the CUDA kernel's is the hardware's IEEE sqrtf,
// the CPU loop has its own (see cpu_adamw.cpp).
template <class Sqrt>
HOTOPS_ADAMW_HD inline void step_element(float& p, float g, float& m, float& v, const StepScalars& s, Sqrt root) {
  p *= s.decay;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * (g * g);
  const float denom = root(v) * s.inv_sqrt_bc2 + s.eps;
  p -= s.step_size * m / denom;
}

// The reference: one step t of PyTorch's formula in double, in place.
struct Element {
  double p, m, v;
};
void reference_step(const Hyper& h, std::int64_t t, double g, Element& e);

// Verification, in two halves around the runs being checked. snapshot() records, from the restored
// state, the starting values of a seeded sample of elements (always both ends of every tensor) and
// every gap element; check() compares the state after `steps` runs with `steps` reference steps from
// that start: p (as the change p - p0, see adamw.cpp), m, v, the bf16 p, and the untouched gaps.
constexpr int kVerifySteps = 3;
struct Snapshot {
  std::vector<std::size_t> idx;  // arena indices
  std::vector<Element> start;
  std::vector<double> g;
  std::vector<std::size_t> gap_idx;
  std::vector<float> gap_p, gap_m, gap_v;
};
Snapshot snapshot(const Shape& s, const Layout& l, const State& st, std::uint64_t seed);
Check check(const Shape& s, const Snapshot& snap, const State& st, int steps);

// "199 tensors, 109.5M params": for labels.
std::string describe(const Shape& s);

std::unique_ptr<Case> make_cpu(const Problem& p);
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<Case> make_cuda(const Problem& p);
// The CUDA kernel's own code, run on the host block by block, thread by thread (step t given): lets
// the tests check its chunk table, vectors and tails without a GPU. Works on `st` in place.
void run_cuda_kernel_on_host(const Shape& s, State& st, std::int64_t t);
#endif

const Family& family();

}  // namespace hotops::adamw
