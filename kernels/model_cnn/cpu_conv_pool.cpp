// The fused first layer of model_cnn's CPU inference (cpu_conv_pool.h). One pooled output row of one
// sample per call: for each pooled pixel, each conv output under its window is the bias plus 9 C
// products per channel, accumulated over the K channels at once (GCC vectors: K / 16 zmm on AVX-512,
// K / 8 ymm on AVX2), then the window's maximum and the ReLU.
// The body is one always-inline template, compiled three times as the other hand-written CPU loops
// are (x86-64-v4 = AVX-512, x86-64-v3 = AVX2, baseline), each with its own vector width (so by hand,
// not target_clones); the dispatcher picks by __builtin_cpu_supports once.
#include "kernels/model_cnn/cpu_conv_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hotops/check.h"

namespace hotops::model_cnn {
namespace {

// The channels as GCC vectors of L floats, the target's register width (Lanes: 16 for AVX-512, 8 for
// AVX2, 4 for SSE), or K when smaller (4 and 8 for the test models); wider vectors than the target's
// registers were lowered element by element through the stack, 10x slower. Loads and stores through
// memcpy (any alignment; no helper function, which would be compiled for the default target).
template <int K, int Lanes>
__attribute__((always_inline)) inline void row_body(const ConvPoolShape& s, const float* __restrict__ x, const float* __restrict__ w,
                                                   const float* __restrict__ bias, float* __restrict__ out, std::int64_t n,
                                                   std::int64_t ph) {
  constexpr int L = K < Lanes ? K : Lanes, NV = K / L;
  typedef float Vec __attribute__((vector_size(L * sizeof(float))));
  const std::int64_t C = s.C, H = s.H, W = s.W;
  const float* xs = x + n * C * H * W;
  float* orow = out + (n * s.PH + ph) * s.PW * K;
  Vec b[NV];
  for (int j = 0; j < NV; ++j) std::memcpy(&b[j], bias + j * L, sizeof(Vec));
  for (std::int64_t pw = 0; pw < s.PW; ++pw) {
    Vec best[NV];
    for (int j = 0; j < NV; ++j) best[j] = Vec{} - std::numeric_limits<float>::infinity();
    for (std::int64_t dy = 0; dy < s.pool; ++dy) {
      const std::int64_t oh = ph * s.pool + dy;
      const std::int64_t kh0 = std::max<std::int64_t>(0, s.pad - oh), kh1 = std::min<std::int64_t>(3, H + s.pad - oh);
      for (std::int64_t dx = 0; dx < s.pool; ++dx) {
        const std::int64_t ow = pw * s.pool + dx;
        const std::int64_t kw0 = std::max<std::int64_t>(0, s.pad - ow), kw1 = std::min<std::int64_t>(3, W + s.pad - ow);
        Vec acc[NV];
        for (int j = 0; j < NV; ++j) acc[j] = b[j];
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t kh = kh0; kh < kh1; ++kh) {
            const float* xr = xs + (c * H + oh + kh - s.pad) * W + ow - s.pad;
            const float* wr = w + (c * 3 + kh) * 3 * K;
            for (std::int64_t kw = kw0; kw < kw1; ++kw) {
              const Vec v = Vec{} + xr[kw];
              for (int j = 0; j < NV; ++j) {
                Vec wv;
                std::memcpy(&wv, wr + kw * K + j * L, sizeof wv);
                acc[j] += v * wv;
              }
            }
          }
        for (int j = 0; j < NV; ++j) best[j] = best[j] > acc[j] ? best[j] : acc[j];
      }
    }
    for (int j = 0; j < NV; ++j) {
      const Vec r = best[j] > Vec{} ? best[j] : Vec{};  // ReLU (after the max: the same, ReLU being monotone)
      std::memcpy(orow + pw * K + j * L, &r, sizeof r);
    }
  }
}

using RowFn = void (*)(const ConvPoolShape&, const float*, const float*, const float*, float*, std::int64_t, std::int64_t);

template <int K>
__attribute__((target("arch=x86-64-v4"))) void row_avx512(const ConvPoolShape& s, const float* x, const float* w, const float* b,
                                                           float* o, std::int64_t n, std::int64_t ph) {
  row_body<K, 16>(s, x, w, b, o, n, ph);
}
template <int K>
__attribute__((target("arch=x86-64-v3"))) void row_avx2(const ConvPoolShape& s, const float* x, const float* w, const float* b, float* o,
                                                         std::int64_t n, std::int64_t ph) {
  row_body<K, 8>(s, x, w, b, o, n, ph);
}
template <int K>
void row_generic(const ConvPoolShape& s, const float* x, const float* w, const float* b, float* o, std::int64_t n, std::int64_t ph) {
  row_body<K, 4>(s, x, w, b, o, n, ph);
}

enum class Isa { avx512, avx2, generic };
Isa isa() {
  static const Isa i = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return Isa::avx512;
    if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
    return Isa::generic;
  }();
  return i;
}

template <int K>
RowFn row_for() {
  switch (isa()) {
    case Isa::avx512: return row_avx512<K>;
    case Isa::avx2: return row_avx2<K>;
    default: return row_generic<K>;
  }
}

RowFn row_fn(std::int64_t K) {
  switch (K) {
    case 4: return row_for<4>();
    case 8: return row_for<8>();
    case 16: return row_for<16>();
    case 32: return row_for<32>();
    case 64: return row_for<64>();
    default: return nullptr;
  }
}

}  // namespace

bool conv_pool_supported(const ConvPoolShape& s) {
  const std::int64_t P = s.H + 2 * s.pad - 2, Q = s.W + 2 * s.pad - 2;
  return row_fn(s.K) && s.C > 0 && s.pad >= 0 && s.pad <= 2 && s.pool > 0 && s.PH > 0 && s.PW > 0 && s.PH * s.pool <= P &&
         s.PW * s.pool <= Q;
}

std::vector<float> conv_pool_filters(const float* krsc, std::int64_t K, std::int64_t C) {
  std::vector<float> w(static_cast<std::size_t>(C * 9 * K));
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t rs = 0; rs < 9; ++rs)
      for (std::int64_t c = 0; c < C; ++c) w[static_cast<std::size_t>((c * 9 + rs) * K + k)] = krsc[(k * 9 + rs) * C + c];
  return w;
}

void conv_pool(const ConvPoolShape& s, const float* x, const float* w, const float* bias, float* out) {
  HOTOPS_CHECK(conv_pool_supported(s), "model_cnn: the fused conv + pool does not take this shape");
  const RowFn row = row_fn(s.K);
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < s.B; ++n)
    for (std::int64_t ph = 0; ph < s.PH; ++ph) row(s, x, w, bias, out, n, ph);
}

std::string conv_pool_isa() {
  switch (isa()) {
    case Isa::avx512: return "x86-64-v4 (AVX-512)";
    case Isa::avx2: return "x86-64-v3 (AVX2)";
    default: return "baseline x86-64";
  }
}

}  // namespace hotops::model_cnn
