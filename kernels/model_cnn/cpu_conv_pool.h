// model_cnn's CPU inference, first layer: a 3x3 convolution (stride 1) + bias + ReLU + max-pool
// (window = stride = pool, no padding) in one pass over the images, f32. oneDNN runs it as a conv
// whose full-resolution output is written and read back by the pool (keras_cnn at batch 64: 528 MB
// each way); this writes only the pooled output. Vectorized over the output channels (K a template
// constant), compiled for AVX-512 and AVX2 and dispatched on the CPU, plain C++ otherwise.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hotops::model_cnn {

struct ConvPoolShape {
  std::int64_t B, C, H, W;  // the images, nchw
  std::int64_t K, pad;      // 3x3 filters; the conv output is (H + 2 pad - 2) x (W + 2 pad - 2)
  std::int64_t pool;        // max-pool window and stride
  std::int64_t PH, PW;      // the pooled output, [B][PH][PW][K] (nhwc)
};

// Whether conv_pool takes this shape (K one of 4, 8, 16, 32, 64; a pooled output that fits the conv's).
bool conv_pool_supported(const ConvPoolShape& s);

// Filters KRSC [K][3][3][C] (the model's layout) -> [C][3][3][K], the order conv_pool reads.
std::vector<float> conv_pool_filters(const float* krsc, std::int64_t K, std::int64_t C);

// out[b][ph][pw][k] = max(0, max over the window of (bias[k] + conv(x, w)[b][k][oh][ow])), OpenMP over
// samples and pooled rows. x nchw; w from conv_pool_filters.
void conv_pool(const ConvPoolShape& s, const float* x, const float* w, const float* bias, float* out);

// "x86-64-v4 (AVX-512)", "x86-64-v3 (AVX2)" or "baseline x86-64": the code conv_pool runs on this CPU.
std::string conv_pool_isa();

}  // namespace hotops::model_cnn
