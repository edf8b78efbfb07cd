// conv2d on CUDA: cuDNN 9's legacy convolution API, one call per direction on the user's NCHW or
// NHWC tensors (cudnnConvolutionForward / BackwardData / BackwardFilter), with the bias added by
// cudnnAddTensor (fwd) and its gradient by cudnnConvolutionBackwardBias (bwd_weight). A grouped
// convolution is the same calls with the filter [K, C / groups, R, S] and the descriptor's
// cudnnSetConvolutionGroupCount: cuDNN's Find then ranks its grouped (and depthwise) algorithms.
//
// The algorithm is chosen when the plan is built, by gpu::find_conv_algo (cudnnFind*AlgorithmEx,
// its usable results re-timed unless Shape::retime is off; once per problem per process), PyTorch's
// cudnn.benchmark = True; f32 runs CUDNN_FMA_MATH, tf32 and bf16 tensor-op math (docs/ops.md).
// Where cudnnAddTensor or cudnnConvolutionBackwardBias cannot do a case (both deprecated in cuDNN 9),
// a hotops kernel does that part, and the label says so. A forward pass that hotops' direct kernel
// takes (cuda_direct.h: a first layer's 1 or 3 input channels) times it against cuDNN's choice and
// keeps it where it is faster by more than a near tie (gpu::kRetimeTie); the label gives both times.
#include <cuda_bf16.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "hotops/cudnn_util.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/conv2d/cuda_direct.h"

namespace hotops::conv2d {
namespace {

using gpu::cudnn;
using gpu::ConvDesc;
using gpu::FilterDesc;
using gpu::TensorDesc;

// hotops' direct kernel against cuDNN's choice for one problem (choose_direct), with the two times
// that decided it: once per problem per process, or from --hotops_choices' file, so that processes
// sharing one file run the same kernel, as they run the same cuDNN algorithm.
struct DirectChoice {
  int kept = 0;
  float direct_ms = -1, cudnn_ms = -1;
};
gpu::ChoiceCache<DirectChoice>& direct_cache() {
  static gpu::ChoiceCache<DirectChoice> cache("direct");
  return cache;
}

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

// ---- the plan ---------------------------------------------------------------------------------

class CudaConv2d final : public Plan {
 public:
  explicit CudaConv2d(const Shape& s) : s_(s) {
    const cudnnDataType_t dt = data_type(s_.dtype);
    const cudnnTensorFormat_t fmt = tensor_format(s_.layout);
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(x_desc_.h, fmt, dt, dim(s_.N), dim(s_.C), dim(s_.H), dim(s_.W)));
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(y_desc_.h, fmt, dt, dim(s_.N), dim(s_.K), dim(s_.P()), dim(s_.Q())));
    HOTOPS_CHECK_CUDNN(cudnnSetFilter4dDescriptor(w_desc_.h, dt, fmt, dim(s_.K), dim(s_.Cg()), dim(s_.R), dim(s_.S)));
    HOTOPS_CHECK_CUDNN(cudnnSetTensor4dDescriptor(b_desc_.h, CUDNN_TENSOR_NCHW, dt, 1, dim(s_.K), 1, 1));
    gpu::set_conv2d(conv_.h, dim(s_.pad_h), dim(s_.pad_w), dim(s_.stride_h), dim(s_.stride_w), dim(s_.dil_h),
                    dim(s_.dil_w), s_.dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
    HOTOPS_CHECK_CUDNN(cudnnSetConvolutionGroupCount(conv_.h, dim(s_.groups)));
    int n = 0, k = 0, h = 0, w = 0;
    HOTOPS_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(conv_.h, x_desc_.h, w_desc_.h, &n, &k, &h, &w));
    HOTOPS_CHECK(k == s_.K && h == s_.P() && w == s_.Q(), "conv2d: cuDNN's output size differs from PyTorch's");

    // The search times each algorithm on tensors of this problem's sizes and values: seeded inputs
    // and outputs of its own, freed once the algorithm is chosen (the runs get the caller's).
    const Inputs in = make_inputs(s_, 0);
    const Outputs out = make_outputs(s_);
    const gpu::DeviceBuffer x(in.x), wt(in.w), b(in.b), dy(in.dy), out_d(out.primary.bytes()), db(out.db.bytes());
    // Each direction reads two of x, w, dy and writes out (gpu::ConvCall).
    call_ = gpu::ConvCall{s_.dir, x_desc_.h, w_desc_.h, y_desc_.h, conv_.h, nullptr, nullptr, nullptr, nullptr};
    gpu::ConvCall search = call_;
    search.x = x.get(), search.w = wt.get(), search.y = dy.get(), search.out = out_d.get();
    const gpu::ConvMath math = s_.dtype == DType::f32 ? gpu::ConvMath::fma
                               : s_.tensor_ops_only    ? gpu::ConvMath::tensor_ops
                                                       : gpu::ConvMath::any;
    const gpu::ConvPick pick = s_.retime ? gpu::ConvPick::retimed : gpu::ConvPick::find_fastest;
    const std::string key = gpu::conv_search_key(search, math, pick);  // before the search sets the math type
    choice_ = gpu::find_conv_algo(search, math, pick, std::string("conv2d ") + dtype_name(s_.dtype));
    workspace_ = gpu::DeviceBuffer(choice_.workspace);
    ws_ = workspace_.get(), ws_bytes_ = workspace_.bytes();
    std::string how = s_.retime ? "cudnnFind: " + ms(choice_.find_ms) + "; kept of " + std::to_string(choice_.retimed) +
                                         " re-timed: " + ms(choice_.retimed_ms)
                                   : "cudnnFind's fastest: " + ms(choice_.find_ms) + ", not re-timed";
    if (choice_.from_file) how = "from --hotops_choices, as a search found it: " + how;
    label_ = std::string("cuDNN ") + direction_name(s_.dir) + " " + gpu::conv_algo_name(s_.dir, choice_.algo) + " (" + how +
             "), ws " + mib(choice_.workspace) + ", " + math_name(choice_.math);
    const Args seeded{x.get(), wt.get(), b.get(), dy.get(), out_d.get(), db.get()};
    if (s_.bias && s_.dir != Direction::bwd_data) probe_bias(seeded);
    if (direct::takes(s_)) choose_direct(key.empty() ? key : key + "|bias " + std::to_string(s_.bias), seeded);
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run(const Args& a) override {
    if (direct_) return direct::run(s_, a);
    gpu::ConvCall call = call_;
    call.x = a.x, call.w = a.w, call.y = a.dy, call.out = a.out;
    HOTOPS_CHECK_CUDNN(gpu::convolve(call, choice_.algo, ws_, ws_bytes_));
    if (s_.bias && s_.dir != Direction::bwd_data) bias_step(a);
  }

  std::string label() const override { return label_; }

  CudaChoice choice() const {
    if (direct_) return CudaChoice{kCudaDirectAlgo, 0, direct_ms_};
    return cudnn_choice();
  }

  void use_workspace(void* ws, std::size_t bytes) {
    HOTOPS_CHECK(bytes >= choice().workspace && (ws || !bytes), "conv2d: a caller's workspace smaller than the algorithm's");
    workspace_ = gpu::DeviceBuffer();
    ws_ = ws, ws_bytes_ = bytes;
  }

 private:
  CudaChoice cudnn_choice() const {
    return CudaChoice{choice_.algo, choice_.workspace, choice_.retimed_ms >= 0 ? choice_.retimed_ms : choice_.find_ms};
  }

  // The direct kernel timed as the search re-times cuDNN's candidates (a warm-up call, then
  // gpu::best_batch_ms), against cuDNN's kept time; kept where faster by more than a near tie, and
  // then the plan frees cuDNN's workspace. The choice is kept under `key` (direct_cache).
  void choose_direct(const std::string& key, const Args& seeded) {
    DirectChoice c;
    bool from_file = false;
    if (!direct_cache().find(key, &c, &from_file)) {
      direct::run(s_, seeded);
      c.direct_ms = gpu::best_batch_ms([&] { direct::run(s_, seeded); });
      c.cudnn_ms = cudnn_choice().ms;
      c.kept = c.direct_ms * (1 + gpu::kRetimeTie) < c.cudnn_ms ? 1 : 0;
      direct_cache().add(key, c);
    }
    direct_ms_ = c.direct_ms;
    const std::string versus = std::string(from_file ? "from --hotops_choices, as a search found it: " : "timed at setup: ") +
                               ms(c.direct_ms) + " against cuDNN " + gpu::conv_algo_name(s_.dir, choice_.algo) + " " +
                               ms(c.cudnn_ms);
    if (c.kept) {
      direct_ = true;
      workspace_ = gpu::DeviceBuffer();
      ws_ = nullptr, ws_bytes_ = 0;
      label_ = direct::label(s_) + ", " + versus;
    } else {
      label_ += "; hotops direct conv " + versus + ", not kept";
    }
  }

  // The bias step through cuDNN: y += b (fwd) or db = sum dy (bwd_weight).
  cudnnStatus_t cudnn_bias(const Args& a) {
    const float one = 1.f, zero = 0.f;
    if (s_.dir == Direction::fwd) return cudnnAddTensor(cudnn(), &one, b_desc_.h, a.b, &one, y_desc_.h, a.out);
    return cudnnConvolutionBackwardBias(cudnn(), &one, y_desc_.h, a.dy, &zero, b_desc_.h, a.db);
  }

  // Tries cuDNN's bias call once; where cuDNN cannot do it, the hotops kernel does, and says so.
  void probe_bias(const Args& a) {
    const char* call = s_.dir == Direction::fwd ? "cudnnAddTensor" : "cudnnConvolutionBackwardBias";
    const cudnnStatus_t st = cudnn_bias(a);
    if (st == CUDNN_STATUS_SUCCESS) {
      label_ += std::string(" + ") + call;
      return;
    }
    if (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM) HOTOPS_CHECK_CUDNN(st);
    own_bias_kernel_ = true;
    label_ += std::string(" + hotops ") + (s_.dir == Direction::fwd ? "add_bias" : "bias_grad") + " kernel (" +
              call + ": " + cudnnGetErrorString(st) + ")";
  }

  void bias_step(const Args& a) {
    if (!own_bias_kernel_) {
      HOTOPS_CHECK_CUDNN(cudnn_bias(a));
      return;
    }
    const std::int64_t PQ = s_.P() * s_.Q();
    const bool nhwc = s_.layout == Layout::nhwc;
    const cudaStream_t st = gpu::stream();
    if (s_.dtype == DType::bf16) {
      using T = __nv_bfloat16;
      launch_bias(static_cast<T*>(a.out), static_cast<const T*>(a.b), static_cast<const T*>(a.dy), static_cast<T*>(a.db),
                  PQ, nhwc, st);
    } else {
      launch_bias(static_cast<float*>(a.out), static_cast<const float*>(a.b), static_cast<const float*>(a.dy),
                  static_cast<float*>(a.db), PQ, nhwc, st);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  // The hotops bias kernel of the pass: add_bias into y (fwd) or bias_grad into db (bwd_weight).
  template <class T>
  void launch_bias(T* y, const T* b, const T* dy, T* db, std::int64_t PQ, bool nhwc, cudaStream_t st) const {
    if (s_.dir == Direction::fwd) {
      const std::int64_t count = s_.N * s_.K * PQ, inner = nhwc ? 1 : PQ;
      const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + 255) / 256, 4096));
      add_bias<<<blocks, 256, 0, st>>>(y, b, count, s_.K, inner);
    } else {
      bias_grad<<<static_cast<unsigned>(s_.K), 256, 0, st>>>(dy, db, s_.N, s_.K, PQ, nhwc);
    }
  }

  Shape s_;
  TensorDesc x_desc_, y_desc_, b_desc_;
  FilterDesc w_desc_;
  ConvDesc conv_;
  gpu::DeviceBuffer workspace_;  // the plan's own, unless the caller's (use_cuda_workspace)
  void* ws_ = nullptr;           // the workspace a run passes to cuDNN
  std::size_t ws_bytes_ = 0;
  gpu::ConvCall call_;
  gpu::ConvAlgo choice_;
  bool own_bias_kernel_ = false;
  bool direct_ = false;    // the direct kernel runs the pass (choose_direct)
  float direct_ms_ = -1;   // its setup time, ms a call (choose_direct)
  std::string label_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaConv2d>(s); }

CudaChoice cuda_choice(const Plan& p) {
  const auto* cuda = dynamic_cast<const CudaConv2d*>(&p);
  HOTOPS_CHECK(cuda, "conv2d: cuda_choice of a plan that is not a CUDA conv2d plan");
  return cuda->choice();
}

void use_cuda_workspace(Plan& p, void* workspace, std::size_t bytes) {
  auto* cuda = dynamic_cast<CudaConv2d*>(&p);
  HOTOPS_CHECK(cuda, "conv2d: use_cuda_workspace on a plan that is not a CUDA conv2d plan");
  cuda->use_workspace(workspace, bytes);
}

}  // namespace hotops::conv2d
