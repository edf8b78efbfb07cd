// mse: the mean squared error loss and its gradient in one pass, as the encoder layers' train steps
// (model.bert_layer, model.vit_layer) run it over their output y and a target t of n elements:
//   loss = sum (y - t)^2 / n   (f32), and   dy = 2 (y - t) / n   (stored in the dtype, f32 or bf16),
// PyTorch's F.mse_loss(y, t) (reduction 'mean') and its backward with an upstream gradient of 1
// (bwd only). The optimizer's step count is not the op's: a train step advances it in its AdamW launch.
// CPU: one OpenMP loop, the sum in double. CUDA: up to kCudaMaxBlocks blocks over 16-byte vectors that
// write dy and a partial sum each, then one block that adds the partials (deterministic).
// Names: mse/<backend>/<f32|bf16>/bwd/shape:<model.layer>/batch:B/tokens:T/hidden:H.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::loss::mse {

// The most blocks of 256 threads the CUDA kernel strides over the elements with (about one wave on an
// H100); each thread adds its share of the loss's terms in order (mse.cpp bounds that chain).
constexpr std::int64_t kCudaMaxBlocks = 1024;

struct Shape {
  DType dtype = DType::f32;  // of y, t and dy; the loss is f32
  std::int64_t batch = 1, tokens = 1, hidden = 1;
  std::int64_t count() const { return batch * tokens * hidden; }
};
Shape shape_of(const Problem& p);

// y and t uniform in [-1, 1) in the dtype (the models' targets are).
struct Inputs {
  HostBuffer y, target;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
struct Outputs {
  HostBuffer loss;  // one f32
  HostBuffer dy;    // [count], the dtype
};
Outputs make_outputs(const Shape& s);

// The double reference: the loss, and one element of dy.
double reference_loss(const Inputs& in);
double reference_dy(const Inputs& in, std::size_t i);
// The loss within its f32 sums' bound, each dy element within its roundings (mse.cpp derives both).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors, host memory on the CPU, device memory on CUDA.
struct Args {
  const void* y = nullptr;       // [count], the dtype
  const void* target = nullptr;  // [count], the dtype
  float* loss = nullptr;         // one f32
  void* dy = nullptr;            // [count], the dtype
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loop; CUDA: hotops' kernels

// The family's part for this op: its problems (one per backend and dtype for `args`), its work and
// its benchmark case.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out);
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::loss::mse
