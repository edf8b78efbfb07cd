// attention composed of other families' plans: the matmul family's GEMMs on strided heads
// (matmul::attention_gemm: oneDNN 4-D matmuls on the CPU, cublasGemmBatchedEx on CUDA) and the softmax
// family's plan, run in sequence on the caller's tensors, the probabilities in `saved`:
//   fwd  scores: saved = Q K^T / sqrt(D); softmax in place over saved; context: ctx = saved V
//   bwd  dP = dctx V^T (plan scratch); dV = saved^T dctx; softmax_bwd in place over dP (dS);
//        dQ = dS K / sqrt(D); dK = dS^T Q / sqrt(D)
// It is the CPU's plan, and CUDA's where the fused kernels do not take the shape (cuda_attention.cu).
#include <algorithm>
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "kernels/attention/attention.h"
#include "kernels/matmul/matmul.h"
#include "kernels/softmax/softmax.h"

namespace hotops::attention {
namespace {

using matmul::AttentionGemm;

// One piece of the composition: an attention GEMM, or (softmax) the softmax plan of the direction.
struct Piece {
  const char* name;
  bool softmax;
  AttentionGemm gemm;
  Direction dir;
};
constexpr Piece kForward[] = {{"scores", false, AttentionGemm::scores, Direction::fwd},
                              {"softmax", true, AttentionGemm::scores, Direction::fwd},
                              {"context", false, AttentionGemm::context, Direction::fwd}};
constexpr Piece kBackward[] = {{"dP", false, AttentionGemm::context, Direction::bwd_data},
                               {"dV", false, AttentionGemm::context, Direction::bwd_weight},
                               {"softmax_bwd", true, AttentionGemm::scores, Direction::bwd},
                               {"dQ", false, AttentionGemm::scores, Direction::bwd_data},
                               {"dK", false, AttentionGemm::scores, Direction::bwd_weight}};

template <class Run>
void for_each_piece(const Shape& s, Run run) {
  if (s.dir == Direction::fwd)
    for (const Piece& p : kForward) run(p);
  else
    for (const Piece& p : kBackward) run(p);
}

matmul::Shape gemm_shape(const Shape& s, const Piece& p) {
  return matmul::attention_gemm(p.gemm, p.dir, s.dtype, s.batch, s.seq, s.heads, s.head_dim);
}

// The softmax over each query's row of the probabilities [batch, heads, seq, seq].
softmax::Shape softmax_shape(const Shape& s) {
  softmax::Shape sm;
  sm.dir = s.dir, sm.dtype = s.dtype;
  sm.rows = s.batch * s.heads * s.seq, sm.cols = s.seq;
  return sm;
}

class ComposedAttention final : public Plan {
 public:
  ComposedAttention(const Shape& s, Backend b, std::string why_not_fused) : s_(s), why_not_fused_(std::move(why_not_fused)) {
    for_each_piece(s_, [&](const Piece& p) {
      if (p.softmax) softmax_ = softmax::make_plan(softmax_shape(s_), b);
      steps_.push_back({p, p.softmax ? nullptr : matmul::make_plan(gemm_shape(s_, p), b)});
    });
    if (s_.dir == Direction::fwd) return;
    const std::size_t bytes = s_.probability_elements() * dtype_size(s_.dtype);  // dP, then dS in place
    if (b == Backend::cpu) {
      host_dp_ = HostBuffer(s_.dtype, s_.probability_elements());
      dp_ = host_dp_.data();
    } else {
      device_dp_ = gpu::DeviceBuffer(bytes);
      dp_ = device_dp_.get();
    }
  }

  void run(const Args& a) override {
    HOTOPS_CHECK(a.qkv && a.ctx && a.saved && (s_.dir == Direction::fwd || (a.dctx && a.dqkv)),
                 "attention: a missing tensor");
    const matmul::AttentionTensors t{const_cast<void*>(a.qkv), a.saved, a.ctx, a.dqkv, dp_, const_cast<void*>(a.dctx)};
    for (const Step& st : steps_) {
      const Piece& p = st.piece;
      if (!p.softmax)
        st.gemm->run(matmul::attention_args(p.gemm, p.dir, s_.dtype, s_.hidden(), t));
      else if (s_.dir == Direction::fwd)
        softmax_->run({a.saved, nullptr, nullptr, a.saved});  // the scores into probabilities, in place
      else
        softmax_->run({nullptr, a.saved, dp_, dp_});  // dP into dS, in place
    }
  }

  // The pieces' plans, each label once after the pieces it runs: "composed: scores, context: <the
  // GEMMs'>; softmax: <the softmax's>".
  std::string label() const override {
    std::vector<std::pair<std::string, std::string>> by_label;  // (label, pieces)
    for (const Step& st : steps_) {
      const std::string l = st.piece.softmax ? softmax_->label() : st.gemm->label();
      auto same = std::find_if(by_label.begin(), by_label.end(), [&](const auto& e) { return e.first == l; });
      if (same != by_label.end()) same->second += std::string(", ") + st.piece.name;
      else by_label.emplace_back(l, st.piece.name);
    }
    std::string out = "composed: ";
    for (std::size_t i = 0; i < by_label.size(); ++i) out += (i ? "; " : "") + by_label[i].second + ": " + by_label[i].first;
    if (!why_not_fused_.empty()) out += " (not the fused kernels: " + why_not_fused_ + ")";
    return out;
  }

 private:
  Shape s_;
  std::string why_not_fused_;
  struct Step {
    Piece piece;
    std::unique_ptr<matmul::Plan> gemm;  // null for the softmax
  };
  std::vector<Step> steps_;  // in the order they run
  std::unique_ptr<softmax::Plan> softmax_;
  HostBuffer host_dp_;          // bwd, CPU: dP, then dS
  gpu::DeviceBuffer device_dp_;  // bwd, CUDA: the same
  void* dp_ = nullptr;
};

}  // namespace

std::unique_ptr<Plan> make_composed_plan(const Shape& s, Backend b, const std::string& why_not_fused) {
  return std::make_unique<ComposedAttention>(s, b, why_not_fused);
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return make_composed_plan(s, Backend::cpu); }

// What oneDNN cannot run of the composition on this CPU: a GEMM's dtype, or the softmax's.
std::string cpu_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  std::string why;
  for_each_piece(s, [&](const Piece& piece) {
    if (why.empty() && !piece.softmax) why = matmul::cpu_unsupported_reason(gemm_shape(s, piece));
  });
  if (!why.empty()) return why;
  const softmax::Shape sm = softmax_shape(s);
  return softmax::onednn_unsupported_reason(Problem{"softmax", Backend::cpu, s.dtype, s.dir,
                                                    {{"rows", std::to_string(sm.rows)}, {"cols", std::to_string(sm.cols)}}});
}

}  // namespace hotops::attention
