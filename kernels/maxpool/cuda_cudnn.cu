// maxpool on CUDA: cuDNN's legacy pooling API with CUDNN_POOLING_MAX (floor mode, NaN not
// propagated). fwd is cudnnPoolingForward (x -> y; cuDNN saves no indices). bwd is
// cudnnPoolingBackward, which reads x, y and dy and finds each window's argmax again from x and y;
// y comes from one cudnnPoolingForward at setup, and only the backward call is timed.
#include <cudnn.h>

#include <string>

#include "hotops/cudnn_util.h"
#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {
namespace {

using gpu::cudnn;
using gpu::TensorDesc;

struct PoolingDesc {
  cudnnPoolingDescriptor_t h = nullptr;
  PoolingDesc() { HOTOPS_CHECK_CUDNN(cudnnCreatePoolingDescriptor(&h)); }
  ~PoolingDesc() { cudnnDestroyPoolingDescriptor(h); }
  PoolingDesc(const PoolingDesc&) = delete;
  PoolingDesc& operator=(const PoolingDesc&) = delete;
};

class CudnnMaxpool final : public Case {
 public:
  explicit CudnnMaxpool(const Problem& p) : s_(shape_of(p)), in_(make_inputs(s_, p.seed())), out_(make_output(s_)) {
    const cudnnTensorFormat_t fmt = s_.layout == Layout::nchw ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
    const cudnnDataType_t t = s_.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const auto i = [](std::int64_t v) { return static_cast<int>(v); };
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(x_desc_.h, fmt, t, i(s_.N), i(s_.C), i(s_.H), i(s_.W)));
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(y_desc_.h, fmt, t, i(s_.N), i(s_.C), i(s_.OH()), i(s_.OW())));
    HOTOPS_CHECK_CUDNN(cudnnSetPooling2dDescriptor(pool_.h, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, i(s_.k),
                                                   i(s_.k), i(s_.pad), i(s_.pad), i(s_.s), i(s_.s)));
    int n, c, h, w;
    HOTOPS_CHECK_CUDNN(cudnnGetPooling2dForwardOutputDim(pool_.h, x_desc_.h, &n, &c, &h, &w));
    HOTOPS_CHECK(h == s_.OH() && w == s_.OW(), "cuDNN's pooling output size is not nn.MaxPool2d's");
    x_ = gpu::DeviceBuffer(in_.x);
    out_d_ = gpu::DeviceBuffer(out_.bytes());
    if (s_.dir == Direction::bwd) {
      dy_ = gpu::DeviceBuffer(in_.dy);
      y_ = gpu::DeviceBuffer(s_.out_elements() * dtype_size(s_.dtype));
      forward(y_.get());
      HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    }
  }

  void run() override {
    if (s_.dir == Direction::fwd) {
      forward(out_d_.get());
      return;
    }
    const float one = 1.f, zero = 0.f;
    HOTOPS_CHECK_CUDNN(cudnnPoolingBackward(cudnn(), pool_.h, &one, y_desc_.h, y_.get(), y_desc_.h, dy_.get(),
                                            x_desc_.h, x_.get(), &zero, x_desc_.h, out_d_.get()));
  }

  Check verify() override {
    gpu::poison_run_download(*this, out_d_, out_);
    return maxpool::verify(s_, in_, out_);
  }

  std::string label() const override {
    return s_.dir == Direction::fwd ? "cuDNN PoolingForward CUDNN_POOLING_MAX"
                                    : "cuDNN PoolingBackward CUDNN_POOLING_MAX (reads x, y and dy)";
  }

 private:
  void forward(void* y) {
    const float one = 1.f, zero = 0.f;
    HOTOPS_CHECK_CUDNN(cudnnPoolingForward(cudnn(), pool_.h, &one, x_desc_.h, x_.get(), &zero, y_desc_.h, y));
  }

  Shape s_;
  Inputs in_;
  HostBuffer out_;
  TensorDesc x_desc_, y_desc_;
  PoolingDesc pool_;
  gpu::DeviceBuffer x_, dy_, y_, out_d_;
};

}  // namespace

std::unique_ptr<Case> make_cudnn(const Problem& p) { return std::make_unique<CudnnMaxpool>(p); }

}  // namespace hotops::maxpool
