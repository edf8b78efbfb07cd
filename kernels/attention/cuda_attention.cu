// attention on CUDA: hotops' fused kernels (cuda_fused.h) where they take the shape (bf16, head_dim
// 64, seq <= fused::kMaxSeq), else the composition of the matmul family's strided-head cuBLAS GEMMs
// and the softmax family's kernels (cpu_attention.cpp), its label saying why.
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/cuda_fused.h"

namespace hotops::attention {
namespace {

// `saved` is what the fused forward keeps for the backward: each query row's log-sum-exp
// (fused::saved_bytes).
class FusedAttention final : public Plan {
 public:
  explicit FusedAttention(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    float* saved = static_cast<float*>(a.saved);
    if (s_.dir == Direction::fwd)
      fused::forward(s_.batch, s_.seq, s_.heads, a.qkv, a.ctx, saved);
    else
      fused::backward(s_.batch, s_.seq, s_.heads, a.qkv, a.ctx, a.dctx, saved, a.dqkv);
  }

  std::string label() const override {
    return "hotops fused attention (mma.sync bf16, f32 accumulate; scores in registers, log-sum-exp saved; backward in "
           "one launch)";
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  const std::string why = fused::unsupported_reason(s.dtype, s.seq, s.head_dim);
  if (why.empty()) return std::make_unique<FusedAttention>(s);
  return make_composed_plan(s, Backend::cuda, why);
}

}  // namespace hotops::attention
