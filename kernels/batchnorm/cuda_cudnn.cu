// batchnorm on cuDNN (the `impl:cudnn` variant), called as PyTorch calls it: the Ex training
// forward and backward (bnOps = BN, no activation) and the plain inference forward. The mode is
// PyTorch's choice: PER_ACTIVATION for the 1-D layout ([N, C, 1, 1], one value per channel either
// way), SPATIAL_PERSISTENT for channels-last training, SPATIAL otherwise. cuDNN updates the running
// statistics itself (with the unbiased variance) and saves the mean and invstd.
#include <cudnn.h>

#include <algorithm>
#include <string>

#include "hotops/cudnn_util.h"
#include "hotops/cuda_util.h"
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {
namespace {

using gpu::cudnn;
using gpu::TensorDesc;

cudnnBatchNormMode_t mode_of(const Shape& s) {
  if (s.layout == Layout::nc) return CUDNN_BATCHNORM_PER_ACTIVATION;
  if (s.layout == Layout::nhwc && s.dir != Direction::infer) return CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  return CUDNN_BATCHNORM_SPATIAL;
}

const char* mode_name(cudnnBatchNormMode_t m) {
  switch (m) {
    case CUDNN_BATCHNORM_PER_ACTIVATION: return "PER_ACTIVATION";
    case CUDNN_BATCHNORM_SPATIAL: return "SPATIAL";
    case CUDNN_BATCHNORM_SPATIAL_PERSISTENT: return "SPATIAL_PERSISTENT";
  }
  return "?";
}


class CudnnBatchnorm final : public Plan {
 public:
  explicit CudnnBatchnorm(const Shape& s) : s_(s), mode_(mode_of(s_)) {
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(
        x_desc_.h, s_.layout == Layout::nchw ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC,
        s_.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT, static_cast<int>(s_.N),
        static_cast<int>(s_.C), static_cast<int>(s_.H), static_cast<int>(s_.W)));
    HOTOPS_CHECK_CUDNN(cudnnDeriveBNTensorDescriptor(bn_desc_.h, x_desc_.h, mode_));

    if (s_.dir == Direction::infer) return;  // no workspace, no reserve

    const cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
    std::size_t fwd_ws = 0, bwd_ws = 0, reserve = 0;
    HOTOPS_CHECK_CUDNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnn(), mode_, ops, nullptr,
                                                                            x_desc_.h, &reserve));
    HOTOPS_CHECK_CUDNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        cudnn(), mode_, ops, x_desc_.h, nullptr, x_desc_.h, bn_desc_.h, nullptr, &fwd_ws));
    if (s_.dir == Direction::bwd)
      HOTOPS_CHECK_CUDNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
          cudnn(), mode_, ops, x_desc_.h, nullptr, x_desc_.h, nullptr, x_desc_.h, bn_desc_.h, nullptr, &bwd_ws));
    // bwd may also run the forward once at setup (below), so its workspace fits both.
    const std::size_t ws = std::max(fwd_ws, bwd_ws);
    if (ws) workspace_ = gpu::DeviceBuffer(ws);
    if (reserve) reserve_ = gpu::DeviceBuffer(reserve);

    if (s_.dir == Direction::bwd && reserve) {
      // The backward reads what the training forward left in the reserve space: run that forward
      // once here, on scratch tensors of the problem's shape (every input zero), so the reserve holds
      // what a training step's forward leaves there.
      const std::size_t xbytes = static_cast<std::size_t>(s_.count()) * dtype_size(s_.dtype);
      const std::size_t cbytes = static_cast<std::size_t>(s_.C) * sizeof(float);
      gpu::DeviceBuffer x(xbytes), y(xbytes), gb(2 * cbytes), rm(cbytes), rv(cbytes), sm(cbytes), si(cbytes);
      for (gpu::DeviceBuffer* b : {&x, &gb, &rm, &rv})
        HOTOPS_CHECK_CUDA(cudaMemsetAsync(b->get(), 0, b->bytes(), gpu::stream()));
      const auto* g = gb.as<const float>();
      forward_training(x.get(), g, g + s_.C, y.get(), rm.get(), rv.get(), sm.get(), si.get());
      HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));  // before the scratch tensors go
      filled_reserve_ = true;
    }
  }

  void run(const Args& a) override {
    const float one = 1.f, zero = 0.f;
    switch (s_.dir) {
      case Direction::infer:
        HOTOPS_CHECK_CUDNN(cudnnBatchNormalizationForwardInference(
            cudnn(), mode_, &one, &zero, x_desc_.h, a.x, x_desc_.h, a.out, bn_desc_.h, a.gamma, a.beta,
            a.running_mean, a.running_var, kEps));
        break;
      case Direction::bwd:
        HOTOPS_CHECK_CUDNN(cudnnBatchNormalizationBackwardEx(
            cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &zero, x_desc_.h, a.x, nullptr, nullptr,
            x_desc_.h, a.dy, nullptr, nullptr, x_desc_.h, a.out, bn_desc_.h, a.gamma, nullptr, a.dgamma, a.dbeta, kEps,
            a.save_mean, a.save_invstd, nullptr, workspace_.get(), workspace_.bytes(), reserve_.get(),
            reserve_.bytes()));
        break;
      default:
        forward_training(a.x, a.gamma, a.beta, a.out, a.running_mean, a.running_var, a.save_mean, a.save_invstd);
    }
  }

  std::string label() const override {
    std::string l = "cuDNN ";
    l += s_.dir == Direction::infer ? "BatchNormalizationForwardInference"
         : s_.dir == Direction::bwd ? "BatchNormalizationBackwardEx"
                                    : "BatchNormalizationForwardTrainingEx";
    l += std::string(" ") + mode_name(mode_);
    if (filled_reserve_) l += " (reserve space filled by one training forward at setup)";
    return l;
  }

 private:
  void forward_training(const void* x, const float* gamma, const float* beta, void* y, void* running_mean,
                        void* running_var, void* save_mean, void* save_invstd) {
    const float one = 1.f, zero = 0.f;
    HOTOPS_CHECK_CUDNN(cudnnBatchNormalizationForwardTrainingEx(
        cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, x_desc_.h, x, nullptr, nullptr, x_desc_.h, y,
        bn_desc_.h, gamma, beta, kMomentum, running_mean, running_var, kEps, save_mean, save_invstd, nullptr,
        workspace_.get(), workspace_.bytes(), reserve_.get(), reserve_.bytes()));
  }

  Shape s_;
  cudnnBatchNormMode_t mode_;
  TensorDesc x_desc_, bn_desc_;
  gpu::DeviceBuffer workspace_, reserve_;
  bool filled_reserve_ = false;
};

}  // namespace

std::unique_ptr<Plan> make_cudnn_plan(const Shape& s) { return std::make_unique<CudnnBatchnorm>(s); }

}  // namespace hotops::batchnorm
