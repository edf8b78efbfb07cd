// A dense layer's forward on CUDA, y = act(a . W + b), as the CUDA model steps run it (kernels/models,
// kernels/model_fasttext): the matmul plan with cublasLt's bias (+ ReLU) epilogue, or, where cublasLt
// has no kernel with that epilogue for the shape, the plain GEMM's plan and the pointwise relu_bias
// plan after it (labels count those).
#pragma once
#include <memory>

#include "hotops/check.h"
#include "kernels/matmul/matmul.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::models {

struct DenseForward {
  std::unique_ptr<matmul::Plan> gemm;
  std::unique_ptr<pointwise::Plan> bias;  // null where the GEMM's epilogue adds the bias

  // `g`: the addmm forward; `bias_after`: the relu_bias pass that replaces its epilogue where needed.
  DenseForward(const matmul::Shape& g, const pointwise::Shape& bias_after) {
    try {
      gemm = matmul::make_cuda_plan(g);
      return;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
    }
    matmul::Shape plain = g;
    plain.op = matmul::Op::mm, plain.relu = false;
    gemm = matmul::make_cuda_plan(plain);
    bias = pointwise::make_cuda_plan(bias_after);
  }

  // y = act(a . W + b), device memory, queued on gpu::stream().
  void run(const void* a, const void* W, const void* b, void* y) const {
    gemm->run({a, W, b, nullptr, y, nullptr});
    if (!bias) return;
    pointwise::Args p;
    p.x = p.out = y, p.b = b;
    bias->run(p);
  }
};

}  // namespace hotops::models
