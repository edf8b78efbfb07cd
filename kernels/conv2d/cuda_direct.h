// conv2d on CUDA: hotops' direct forward kernel for a network's first layer (cuda_direct.cu), which
// the CUDA plan (cuda_cudnn.cu) times against cuDNN's chosen algorithm at setup and keeps where it is
// faster. A first layer reads an image of 1 or 3 channels: cuDNN's tensor-op kernels pad those
// channels to 8 and run a GEMM whose K is the 9 or 27 taps, far below what they are built for
// (keras_cnn's first conv in bf16 took cuDNN longer than in f32).
#pragma once
#include <string>

#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d::direct {

// Whether the direct kernel computes this pass: fwd, NHWC, groups 1, C 1 or 3, K 16 or 32, dilation
// 1, R x S at most 7 x 7, f32 or bf16, the output 16-byte aligned (run's caller: cudaMalloc'd).
bool takes(const Shape& s);
// y = conv(x, w) (+ b) on gpu::stream(): a thread two neighbouring output pixels of a row, all K
// channels, the filter in shared memory as f32, f32 sums, the bias added first; deterministic.
void run(const Shape& s, const Args& a);
std::string label(const Shape& s);

}  // namespace hotops::conv2d::direct
