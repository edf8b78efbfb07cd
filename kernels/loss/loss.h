// The loss family: cross_entropy, PyTorch's F.cross_entropy(logits, target) with integer class
// targets and reduction='mean' (log-softmax + NLL, no weights, no ignore_index hit, no smoothing).
//   fwd: loss = mean over rows r of (lse_r - x[r, t_r]), lse_r = log sum_j exp(x[r, j]); the per-row
//        lse is written too (f32), as fused cross-entropy kernels save it for the backward.
//   bwd: dlogits[r, j] = dloss * (exp(x[r, j] - lse_r) - [j == t_r]) / rows, from the logits, the
//        targets, the saved lse and the upstream gradient dloss (a scalar, 1 by default).
// cross_entropy_dbias (bwd only): a small classifier head's loss and gradients in one pass, as the
//   dense models and the BiLSTM train it: the mean loss, dlogits = (softmax - onehot) / rows in the
//   dtype, and the head's bias gradient db[c] = sum over rows of the rounded dlogits (f32); int32 labels.
// CPU: hand-written OpenMP loops over rows (oneDNN 2.6 has no cross-entropy primitive). CUDA:
// hand-written kernels, one warp per row (one block per row for wide rows), the mean as a
// deterministic two-stage reduction; cross_entropy_dbias one block (at most kDbiasMaxClasses).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::adamw {
struct DeviceStep;
struct Hyper;
}  // namespace hotops::adamw

namespace hotops::loss {

enum class Kind { cross_entropy, cross_entropy_dbias };
constexpr std::int64_t kDbiasMaxClasses = 16;  // cross_entropy_dbias on CUDA: its classes at most

// One problem: `rows` rows of `classes` contiguous logits. Every output is followed by kGuard
// elements that no op may write.
struct Shape {
  Kind kind = Kind::cross_entropy;
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // of the logits and dlogits; loss, lse and dloss are always f32
  std::int64_t rows = 1;
  std::int64_t classes = 1;
  std::size_t elements() const { return static_cast<std::size_t>(rows * classes); }
};
constexpr std::size_t kGuard = 8;

Shape shape_of(const Problem& p);
// The cross_entropy_dbias of a classifier head: `rows` samples of `classes` logits in dtype t.
inline Shape dbias_shape(DType t, std::int64_t rows, std::int64_t classes) {
  Shape s;
  s.kind = Kind::cross_entropy_dbias, s.dir = Direction::bwd, s.dtype = t, s.rows = rows, s.classes = classes;
  return s;
}

// Inputs, seeded from the problem name so every backend sees the same numbers.
//   logits uniform in [-4, 4) in the dtype; targets uniform in [0, classes), int64 (PyTorch's long);
//   bwd: lse from the double reference, rounded to f32 (what the forward saves), and dloss = 1.
struct Inputs {
  HostBuffer logits;
  std::vector<std::int64_t> target;
  HostBuffer lse;  // bwd: f32, rows (+ kGuard zeros)
  float dloss = 1.f;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

struct Outputs {
  HostBuffer loss;     // fwd and cross_entropy_dbias: f32, 1 + kGuard
  HostBuffer lse;      // fwd: f32, rows + kGuard
  HostBuffer dlogits;  // bwd: dtype, elements() + kGuard
  HostBuffer db;       // cross_entropy_dbias: f32, classes + kGuard
};
Outputs make_outputs(const Shape& s);
void poison(Outputs& out);

// The reference in double. reference_lse: log sum exp of one row of n; reference_fwd: the mean loss
// over all rows (lse of each row into `lse` when not null); reference_bwd: one row's gradient.
double reference_lse(const double* x, std::size_t n);
double reference_fwd(const Shape& s, const Inputs& in, double* lse);
void reference_bwd(const double* x, std::size_t n, std::int64_t target, double lse, double scale, double* dx);

// The error bounds (see loss.cpp): k of |out - ref| <= k M for the loss and lse (fwd) and for
// dlogits (bwd); cross_entropy_dbias: k of |db - sum of its dlogits| <= k sum of their magnitudes.
double fwd_error_bound();
double bwd_error_bound(DType t);
double dbias_error_bound(const Shape& s);

// Checks the outputs against the reference: fwd the scalar loss and every row's lse; bwd whole rows
// (all of them, or a seeded sample that always has the first and last); cross_entropy_dbias the
// loss, every row of dlogits and every db; and that the kGuard elements after each output are still
// poisoned (NaN).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors of one cross_entropy, in the backend's memory (host on the CPU, device on CUDA).
struct Args {
  const void* logits = nullptr;          // [rows, classes], the dtype
  const std::int64_t* target = nullptr;  // [rows], each in [0, classes)
  void* loss = nullptr;                  // fwd: f32 scalar, the mean loss
  void* lse = nullptr;                   // fwd: [rows] f32, each row's log sum exp
  const void* saved_lse = nullptr;       // bwd: [rows] f32, the lse fwd saved
  const void* dloss = nullptr;           // bwd: f32 scalar, the upstream gradient
  void* dlogits = nullptr;               // bwd: [rows, classes], the dtype
  const std::int32_t* labels = nullptr;  // cross_entropy_dbias: [rows] int32, each in [0, classes)
  float* db = nullptr;                   // cross_entropy_dbias: [classes] f32 (and loss, dlogits)
  // cross_entropy_dbias on CUDA: an AdamW step count to advance in the same launch (step + 1 and that
  // step's scalars for `hyper`), for the optimizer launch that follows in a model's train step. The
  // loss runs once a step in one block, so the advance costs nothing there; an AdamW launch that
  // advances it itself takes a ticket from each of its blocks. Null: none. The CPU plan ignores it.
  adamw::DeviceStep* advance = nullptr;
  const adamw::Hyper* hyper = nullptr;
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: hand-written OpenMP loop; CUDA: hotops' kernels
// cross_entropy_dbias's own (cpu_cross_entropy_dbias.cpp, cuda_cross_entropy_dbias.cu; the CUDA one
// unsupported beyond kDbiasMaxClasses classes).
std::unique_ptr<Plan> make_cpu_dbias_plan(const Shape& s);
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<Plan> make_cuda_dbias_plan(const Shape& s);
#endif

const Family& family();

}  // namespace hotops::loss
