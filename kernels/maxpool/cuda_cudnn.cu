// maxpool on CUDA: cuDNN's legacy pooling API with CUDNN_POOLING_MAX (floor mode, NaN not
// propagated). fwd is cudnnPoolingForward (x -> y; cuDNN saves no indices). bwd is
// cudnnPoolingBackward, which reads x, y and dy and finds each window's argmax again from x and y;
// x and y are the caller's (the benchmark's y comes from one forward at setup); a backward run is the
// backward call alone.
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

class CudnnMaxpool final : public Plan {
 public:
  explicit CudnnMaxpool(const Shape& s) : s_(s) {
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
  }

  void run(const Args& a) override {
    const float one = 1.f, zero = 0.f;
    if (s_.dir == Direction::fwd) {
      HOTOPS_CHECK_CUDNN(cudnnPoolingForward(cudnn(), pool_.h, &one, x_desc_.h, a.x, &zero, y_desc_.h, a.out));
      return;
    }
    HOTOPS_CHECK_CUDNN(cudnnPoolingBackward(cudnn(), pool_.h, &one, y_desc_.h, a.y, y_desc_.h, a.dy, x_desc_.h, a.x,
                                            &zero, x_desc_.h, a.out));
  }

  std::string label() const override {
    return s_.dir == Direction::fwd ? "cuDNN PoolingForward CUDNN_POOLING_MAX"
                                    : "cuDNN PoolingBackward CUDNN_POOLING_MAX (reads x, y and dy)";
  }

 private:
  Shape s_;
  TensorDesc x_desc_, y_desc_;
  PoolingDesc pool_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudnnMaxpool>(s); }

}  // namespace hotops::maxpool
