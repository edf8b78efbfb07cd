// bce_logits: binary cross-entropy on logits, PyTorch's F.binary_cross_entropy_with_logits(z, y)
// (reduction 'mean') and Keras' Dense(1, sigmoid) + binary_crossentropy, over n = batch x outputs
// logits z and targets y in [0, 1], in the numerically stable form:
//   fwd: loss = Σ (max(z, 0) − z·y + log1p(exp(−|z|))) / n   (f32)
//   bwd: dlogits = (sigmoid(z) − y) / n                        (stored in the dtype; upstream gradient 1)
// The logits and dlogits are f32 or bf16; the targets and the loss are f32 in both.
// CPU: one OpenMP loop, the loss summed in double. CUDA: fwd up to 256 blocks of 256 threads that
// write a partial sum each, then one block that adds them (deterministic); bwd one grid-stride kernel.
// Names: bce_logits/<backend>/<f32|bf16>/<fwd|bwd>/shape:<model>/batch:B/outputs:K.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::loss::bce {

struct Shape {
  Direction dir = Direction::fwd;  // fwd (the loss) or bwd (dlogits)
  DType dtype = DType::f32;        // of the logits and dlogits
  std::int64_t batch = 1, outputs = 1;
  std::int64_t count() const { return batch * outputs; }
};
Shape shape_of(const Problem& p);

// z uniform in [-8, 8) in the dtype (both signs, and |z| where exp(−|z|) is small); y uniform in
// [0, 1) f32 (soft targets: 0/1 labels are their special case).
struct Inputs {
  HostBuffer logits, target;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
struct Outputs {
  HostBuffer loss;     // fwd: one f32
  HostBuffer dlogits;  // bwd: [count], the dtype
};
Outputs make_outputs(const Shape& s);

// The double reference: one element's loss term, the mean loss, and one element of dlogits.
double reference_term(double z, double y);
double reference_loss(const Inputs& in);
double reference_dlogits(const Inputs& in, std::size_t i);
// The loss within its f32 terms' and sums' bound, each dlogits element within its roundings (bce.cpp
// derives both).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors, host memory on the CPU, device memory on CUDA.
struct Args {
  const void* logits = nullptr;  // [count], the dtype
  const float* target = nullptr; // [count] f32
  float* loss = nullptr;         // fwd: one f32
  void* dlogits = nullptr;       // bwd: [count], the dtype
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loop; CUDA: hotops' kernels

// The family's part for this op: its problems (every backend, dtype and direction for `args`), its
// work and its benchmark case.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out);
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::loss::bce
