// conv2d on CUDA: cuDNN 9's legacy convolution API, one call per direction on the user's NCHW or
// NHWC tensors (cudnnConvolutionForward / BackwardData / BackwardFilter), with the bias added by
// cudnnAddTensor (fwd) and its gradient by cudnnConvolutionBackwardBias (bwd_weight).
//
// The algorithm is chosen once at setup by gpu::find_conv_algo (cudnnFind*AlgorithmEx on the case's
// own buffers, its usable results re-timed: ConvPick::retimed): this is PyTorch's
// torch.backends.cudnn.benchmark = True. PyTorch's default (benchmark = False) takes cuDNN's
// heuristic first choice (cudnnGet*Algorithm_v7) instead, which can be slower. Then only the chosen
// algorithm's workspace is kept. Math: f32 is CUDNN_FMA_MATH (no tensor cores, really
// f32, as PyTorch with allow_tf32 = False), tf32 and bf16 are CUDNN_TENSOR_OP_MATH (bf16 data,
// f32 compute type). The label names the algorithm, its workspace and the math it ran with.
//
// Where cudnnAddTensor or cudnnConvolutionBackwardBias answers that it cannot do a case (both are
// deprecated in cuDNN 9; bf16 support is not documented), a hotops kernel does that part instead,
// and the label says so.
#include <cuda_bf16.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "hotops/cudnn_util.h"
#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d {
namespace {

using gpu::cudnn;
using gpu::ConvDesc;
using gpu::FilterDesc;
using gpu::TensorDesc;

// ---- the fallback kernels: bias add and bias gradient -----------------------------------------

// y[i] += b[channel of i]; `inner` is P*Q for NCHW and 1 for NHWC.
template <class T>
__global__ void add_bias(T* __restrict__ y, const T* __restrict__ b, std::int64_t count, std::int64_t K,
                         std::int64_t inner) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = static_cast<T>(static_cast<float>(y[i]) + static_cast<float>(b[(i / inner) % K]));
}

// db[k] = sum over n, p, q of dy[n,k,p,q], accumulated in f32; one block of 256 threads per channel.
template <class T>
__global__ void bias_grad(const T* __restrict__ dy, T* __restrict__ db, std::int64_t N, std::int64_t K,
                          std::int64_t PQ, bool nhwc) {
  const std::int64_t k = blockIdx.x;
  float acc = 0.f;
  for (std::int64_t j = threadIdx.x; j < N * PQ; j += blockDim.x)
    acc += static_cast<float>(dy[nhwc ? j * K + k : ((j / PQ) * K + k) * PQ + j % PQ]);
  __shared__ float part[256];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[k] = static_cast<T>(part[0]);
}

// ---- cuDNN setup ------------------------------------------------------------------------------

cudnnDataType_t data_type(DType t) { return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT; }
cudnnTensorFormat_t tensor_format(Layout l) { return l == Layout::nchw ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC; }

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return "FMA math (no tensor ops)";
    case CUDNN_TENSOR_OP_MATH: return "tensor ops";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor ops, allow conversion";
    default: return "default math";
  }
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string ms(float t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g ms", static_cast<double>(t));
  return buf;
}

int dim(std::int64_t v) {
  HOTOPS_CHECK(v <= 0x7fffffff, "conv2d: a dimension does not fit cuDNN's int");
  return static_cast<int>(v);
}

// ---- the case ---------------------------------------------------------------------------------

class CudaConv2d final : public Case {
 public:
  explicit CudaConv2d(const Problem& p) : s_(shape_of(p)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)) {
    const cudnnDataType_t dt = data_type(s_.dtype);
    const cudnnTensorFormat_t fmt = tensor_format(s_.layout);
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(x_desc_.h, fmt, dt, dim(s_.N), dim(s_.C), dim(s_.H), dim(s_.W)));
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(y_desc_.h, fmt, dt, dim(s_.N), dim(s_.K), dim(s_.P()), dim(s_.Q())));
    HOTOPS_CHECK_CUDNN(cudnnSetFilter4dDescriptor(w_desc_.h, dt, fmt, dim(s_.K), dim(s_.C), dim(s_.R), dim(s_.S)));
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(b_desc_.h, CUDNN_TENSOR_NCHW, dt, 1, dim(s_.K), 1, 1));
    gpu::set_conv2d(conv_.h, dim(s_.pad_h), dim(s_.pad_w), dim(s_.stride_h), dim(s_.stride_w), dim(s_.dil_h),
                    dim(s_.dil_w), s_.dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
    int n = 0, k = 0, h = 0, w = 0;
    HOTOPS_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(conv_.h, x_desc_.h, w_desc_.h, &n, &k, &h, &w));
    HOTOPS_CHECK(h == s_.P() && w == s_.Q(), "conv2d: cuDNN's output size differs from PyTorch's");

    x_ = gpu::DeviceBuffer(in_.x);
    w_ = gpu::DeviceBuffer(in_.w);
    b_ = gpu::DeviceBuffer(in_.b);
    dy_ = gpu::DeviceBuffer(in_.dy);
    out_d_ = gpu::DeviceBuffer(out_.primary.bytes());
    db_d_ = gpu::DeviceBuffer(out_.db.bytes());

    // Each direction reads two of x, w, dy and writes out_d_ (gpu::ConvCall).
    call_ = gpu::ConvCall{s_.dir, x_desc_.h, w_desc_.h, y_desc_.h, conv_.h, x_.get(), w_.get(), dy_.get(), out_d_.get()};
    choice_ = gpu::find_conv_algo(call_, s_.dtype == DType::f32 ? gpu::ConvMath::fma : gpu::ConvMath::any,
                                  gpu::ConvPick::retimed, std::string("conv2d ") + dtype_name(s_.dtype));
    workspace_ = gpu::DeviceBuffer(choice_.workspace);
    label_ = std::string("cuDNN ") + direction_name(s_.dir) + " " + gpu::conv_algo_name(s_.dir, choice_.algo) +
             " (cudnnFind: " + ms(choice_.find_ms) + "; fastest of " + std::to_string(choice_.retimed) +
             " re-timed: " + ms(choice_.retimed_ms) + "), ws " + mib(choice_.workspace) + ", " + math_name(choice_.math);
    if (s_.bias && s_.dir != Direction::bwd_data) probe_bias();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    HOTOPS_CHECK_CUDNN(gpu::convolve(call_, choice_.algo, workspace_.get(), workspace_.bytes()));
    if (s_.bias && s_.dir != Direction::bwd_data) bias_step();
  }

  Check verify() override {
    out_d_.poison();
    if (out_.db.count()) db_d_.poison();
    run();
    out_d_.download(out_.primary);
    if (out_.db.count()) db_d_.download(out_.db);
    return conv2d::verify(s_, in_, out_);
  }

  std::string label() const override { return label_; }

 private:
  // The bias step through cuDNN: y += b (fwd) or db = sum dy (bwd_weight).
  cudnnStatus_t cudnn_bias() {
    const float one = 1.f, zero = 0.f;
    if (s_.dir == Direction::fwd)
      return cudnnAddTensor(cudnn(), &one, b_desc_.h, b_.get(), &one, y_desc_.h, out_d_.get());
    return cudnnConvolutionBackwardBias(cudnn(), &one, y_desc_.h, dy_.get(), &zero, b_desc_.h, db_d_.get());
  }

  // Tries cuDNN's bias call once; where cuDNN cannot do it, the hotops kernel does, and says so.
  void probe_bias() {
    const char* call = s_.dir == Direction::fwd ? "cudnnAddTensor" : "cudnnConvolutionBackwardBias";
    const cudnnStatus_t st = cudnn_bias();
    if (st == CUDNN_STATUS_SUCCESS) {
      label_ += std::string(" + ") + call;
      return;
    }
    if (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM) HOTOPS_CHECK_CUDNN(st);
    own_bias_kernel_ = true;
    label_ += std::string(" + hotops ") + (s_.dir == Direction::fwd ? "add_bias" : "bias_grad") + " kernel (" +
              call + ": " + cudnnGetErrorString(st) + ")";
  }

  void bias_step() {
    if (!own_bias_kernel_) {
      HOTOPS_CHECK_CUDNN(cudnn_bias());
      return;
    }
    const std::int64_t PQ = s_.P() * s_.Q();
    const bool nhwc = s_.layout == Layout::nhwc;
    const cudaStream_t st = gpu::stream();
    if (s_.dir == Direction::fwd) {
      const std::int64_t count = s_.N * s_.K * PQ, inner = nhwc ? 1 : PQ;
      const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + 255) / 256, 4096));
      if (s_.dtype == DType::bf16)
        add_bias<<<blocks, 256, 0, st>>>(out_d_.as<__nv_bfloat16>(), b_.as<const __nv_bfloat16>(), count, s_.K, inner);
      else
        add_bias<<<blocks, 256, 0, st>>>(out_d_.as<float>(), b_.as<const float>(), count, s_.K, inner);
    } else {
      const auto blocks = static_cast<unsigned>(s_.K);
      if (s_.dtype == DType::bf16)
        bias_grad<<<blocks, 256, 0, st>>>(dy_.as<const __nv_bfloat16>(), db_d_.as<__nv_bfloat16>(), s_.N, s_.K, PQ,
                                          nhwc);
      else
        bias_grad<<<blocks, 256, 0, st>>>(dy_.as<const float>(), db_d_.as<float>(), s_.N, s_.K, PQ, nhwc);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  Inputs in_;
  Outputs out_;
  TensorDesc x_desc_, y_desc_, b_desc_;
  FilterDesc w_desc_;
  ConvDesc conv_;
  gpu::DeviceBuffer x_, w_, b_, dy_, out_d_, db_d_, workspace_;
  gpu::ConvCall call_;
  gpu::ConvAlgo choice_;
  bool own_bias_kernel_ = false;
  std::string label_;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaConv2d>(p); }

}  // namespace hotops::conv2d
