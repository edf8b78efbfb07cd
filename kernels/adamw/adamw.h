// The adamw family and the one AdamW implementation per backend: one torch.optim.AdamW step over a
// model's parameters laid out in one flat, zero-padded arena per quantity, in one flat pass:
// cpu_step (OpenMP over contiguous parts) and cuda_step (one grid-stride launch). The op family times
// exactly these, and every model family's train step calls them. The formula, the bf16 master copy
// and the step count that advances with every run (in device memory on CUDA): docs/ops.md, "adamw".
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

#ifdef HOTOPS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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

// Where the tensors lie in one arena per quantity (p, g, m, v, bf16 p): each tensor starts on a
// 256-byte boundary, as a caching allocator would place it. The step is one flat pass over the first
// `span` elements (up to the end of the last tensor), the zero padding between tensors included;
// the kGuard elements after the last tensor (and its padding) are never touched.
constexpr std::size_t kAlignElements = 64;
constexpr std::size_t kGuard = 64;
struct Layout {
  std::vector<std::size_t> offset;  // arena index of each tensor's first element
  std::size_t span = 0;             // elements the flat pass covers
  std::size_t arena = 0;            // elements per arena, padding and guard included
};
Layout layout_of(const std::vector<std::int64_t>& sizes);

// The optimizer's state and inputs in host memory, laid out by layout_of.
struct State {
  HostBuffer p;    // f32: the parameters (bf16 dtype: the f32 master)
  HostBuffer g;    // the problem's dtype
  HostBuffer m, v; // f32
  HostBuffer p16;  // bf16 dtype only: the bf16 parameters, an output
};
State make_state(const Shape& s, const Layout& l);
// The seeded starting state (step count 0): in the tensors p, g in [-1, 1), m in [-0.5, 0.5),
// v in [0.01, 0.5); every element outside them 0 in p, g, m and v (the padding a flat pass needs);
// p16 NaN (it is an output). A pure function of the seed: verification restores it before checking.
void restore(const Shape& s, State& st, std::uint64_t seed);

// The f32 scalars of step t, computed in double from the hyperparameters: both backends use them
// (on CUDA a device kernel computes them, where the step count lives).
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
// with the reciprocal). `Sqrt` is the square root, correctly rounded on both backends (the CPU's
// std::sqrt, CUDA's IEEE sqrtf), so that the two agree to the bit where their arithmetic does.
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
// The same with step t's bias corrections worked out once (for many elements at one step): the same
// operations, the same bits.
struct Corrections {
  double bc1, sqrt_bc2;  // 1 - beta1^t, sqrt(1 - beta2^t)
};
Corrections corrections(const Hyper& h, std::int64_t t);
inline void reference_step(const Hyper& h, const Corrections& c, double g, Element& e) {
  e.p *= 1 - h.lr * h.wd;
  e.m = h.beta1 * e.m + (1 - h.beta1) * g;
  e.v = h.beta2 * e.v + (1 - h.beta2) * g * g;
  const double denom = std::sqrt(e.v) / c.sqrt_bc2 + h.eps;
  e.p -= (h.lr / c.bc1) * e.m / denom;
}

// Verification, in two halves around the runs being checked. snapshot() records, from the restored
// state, the starting values of a seeded sample of elements (always both ends of every tensor) and
// every element outside the tensors; check() compares the state after `steps` runs with `steps`
// reference steps from that start: p (as the change p - p0, see adamw.cpp), m, v, the bf16 p, and the
// padding and guard (p, m, v still 0; the bf16 p there 0 within the span, untouched after it).
constexpr int kVerifySteps = 3;
struct Snapshot {
  std::vector<std::size_t> idx;  // arena indices
  std::vector<Element> start;
  std::vector<double> g;
  std::vector<std::size_t> gap_idx;
  std::vector<float> gap_p, gap_m, gap_v;
  std::size_t span = 0;  // the layout's: padding below it is in the pass, the guard above is not
};
Snapshot snapshot(const Shape& s, const Layout& l, const State& st, std::uint64_t seed);
Check check(const Shape& s, const Snapshot& snap, const State& st, int steps);

// "199 tensors, 109.5M params": for labels.
std::string describe(const Shape& s);

// The CPU step over n contiguous elements (p, m, v f32; g f32, or bf16 with the updated p rounded to
// bf16 into p16) by a team of `threads` OpenMP threads, each taking one contiguous part of equal size
// (1: the calling thread alone; 0: OpenMP's default team). Elementwise, so the result does not depend
// on the team.
void cpu_step(float* p, const float* g, float* m, float* v, std::int64_t n, const StepScalars& s, int threads);
void cpu_step(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* p16, std::int64_t n,
              const StepScalars& s, int threads);
// The f32 step of a model that keeps a bf16 copy of its f32 master for its bf16 GEMMs: the updated p
// also rounded to bf16 into p16 (null: none, the f32 step above), so that the copy never needs a cast
// of its own between steps.
void cpu_step(float* p, const float* g, float* m, float* v, std::uint16_t* p16, std::int64_t n, const StepScalars& s,
              int threads);
const char* cpu_clone_name();  // the instruction set the loop runs in on this CPU, for labels

// The optimizer's step count, which every step advances. On CUDA it lives in device memory, where a
// step launch reads its scalars from `s`. Either another kernel of the train step advances it before
// the launch (a model's loss kernel: step + 1 and its scalars), or the launch advances it itself
// (cuda_step's `advance`): every block reads `s`, takes a ticket (`arrived`), and the block that takes
// the last one writes step + 1 and the next step's scalars and resets the ticket. Zeroed memory is a
// valid start for the first way; the second starts from first_step(h). The CPU plan keeps its count
// in host memory in the same struct: it takes step `step` + 1 and counts it.
struct DeviceStep {
  std::int64_t step;  // steps taken
  unsigned arrived;
  unsigned pad;
  StepScalars s;      // the scalars of the step the next launch takes
};
inline DeviceStep first_step(const Hyper& h) { return DeviceStep{0, 0, 0, scalars_for(h, 1)}; }
// Whether `after` counts `steps` steps: a failed Check that says what it counts otherwise.
Check check_step(const DeviceStep& after, std::int64_t steps);

// The tensors of one optimizer step over Shape::sizes laid out by layout_of: the flat pass covers
// the layout's `span` elements. Host memory on the CPU; device memory, each 16-byte aligned, on CUDA.
struct Args {
  float* p = nullptr;           // the parameters (bf16 dtype: the f32 master), updated in place
  const void* g = nullptr;      // the gradients, in the shape's dtype
  float* m = nullptr;           // the first moments, updated in place
  float* v = nullptr;           // the second moments, updated in place
  std::uint16_t* p16 = nullptr; // bf16 dtype only: the parameters rounded to bf16, written
  DeviceStep* step = nullptr;   // the step count, advanced by every run (start: first_step(hyper))
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: cpu_step; CUDA: cuda_step, advancing the step count itself

#ifdef HOTOPS_HAVE_CUDA
constexpr unsigned kCudaThreads = 256;
constexpr unsigned kCudaMaxBlocks = 1024;  // at most; fewer where the GPU holds fewer blocks at once

// The CUDA step: one launch on `stream` over n contiguous elements of device memory (p, m, v f32; g
// f32, or bf16 with the updated p rounded to bf16 into p16), every pointer on the boundary of its
// 4-element vectors (16 bytes for f32, 8 for bf16): min(n / 4 / kCudaThreads, max_blocks, the blocks
// the GPU holds at once) blocks (at least 1) of kCudaThreads threads striding over the 16-byte
// vectors, the at most 3 elements after the last whole vector one per thread. `advance`: null when
// another kernel advanced `state`, else the hyperparameters with which the launch advances it.
void cuda_step(float* p, const float* g, float* m, float* v, std::int64_t n, DeviceStep* state,
               const Hyper* advance, cudaStream_t stream, unsigned max_blocks = kCudaMaxBlocks);
void cuda_step(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* p16, std::int64_t n,
               DeviceStep* state, const Hyper* advance, cudaStream_t stream, unsigned max_blocks = kCudaMaxBlocks);
// The f32 step that also writes the updated p rounded to bf16 into p16 (null: none), the bf16 copy
// that a model's bf16 GEMMs read (as cpu_step's overload).
void cuda_step(float* p, const float* g, float* m, float* v, std::uint16_t* p16, std::int64_t n, DeviceStep* state,
               const Hyper* advance, cudaStream_t stream, unsigned max_blocks = kCudaMaxBlocks);

// Whether the device step count is `steps` after that many steps (synchronises): a failed Check that
// says what it is otherwise, e.g. when a train step's launches did not all run.
Check check_device_step(const DeviceStep* state, std::int64_t steps);

// The CUDA kernel's own code, run on the host thread by thread of a grid of `blocks` (step t given),
// over elements [begin, end) of the flat pass (end 0: up to its span; begin a multiple of 4, as the
// device's 16-byte vectors need); f32 with a p16 arena in `st`: the overload that writes the bf16 copy.
// Lets the tests check its strides, vectors, tails and sub-ranges (a
// data-parallel step's per-bucket launches) without a GPU. Works on `st` in place.
void run_cuda_kernel_on_host(const Shape& s, State& st, std::int64_t t, unsigned blocks, std::size_t begin = 0,
                             std::size_t end = 0);
#endif

const Family& family();

}  // namespace hotops::adamw
