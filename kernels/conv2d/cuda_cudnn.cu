// conv2d on CUDA: cuDNN 9's legacy convolution API, one call per direction on the user's NCHW or
// NHWC tensors (cudnnConvolutionForward / BackwardData / BackwardFilter), with the bias added by
// cudnnAddTensor (fwd) and its gradient by cudnnConvolutionBackwardBias (bwd_weight).
//
// The algorithm is chosen once at setup by cudnnFind*AlgorithmEx on the case's own buffers, with a
// workspace as large as the hungriest algorithm wants (capped at half the free memory): this is
// PyTorch's torch.backends.cudnn.benchmark = True. PyTorch's default (benchmark = False) takes
// cuDNN's heuristic first choice (cudnnGet*Algorithm_v7) instead, which can be slower. Then only
// the chosen algorithm's workspace is kept. Math: f32 is CUDNN_FMA_MATH (no tensor cores, really
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
#include <vector>

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

bool is_tensor_op(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return "FMA math (no tensor ops)";
    case CUDNN_TENSOR_OP_MATH: return "tensor ops";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor ops, allow conversion";
    default: return "default math";
  }
}

const char* algo_name(Direction d, int a) {
  static const char* const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                    "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                       "FFT_TILING"};
  if (d == Direction::fwd && a >= 0 && a < 8) return fwd[a];
  if (d == Direction::bwd_data && a >= 0 && a < 6) return data[a];
  if (d == Direction::bwd_weight && a >= 0 && a < 7) return filter[a];
  return "?";
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

// An algorithm cudnnFind offered, with the workspace and math it needs, its time in the search and,
// once re-timed, hotops' own time.
struct Choice {
  int algo = 0;
  std::size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float find_ms = 0;
  float retimed_ms = 0;
};

// Runs cudnnFind*AlgorithmEx for one direction and returns its usable results, fastest first, at
// most gpu::kRetimeCandidates. ws_size(algo, &bytes) asks one algorithm's workspace; find(count, &n,
// perf, ws, ws_bytes) runs the search. f32 rejects any result that ran on tensor cores (FMA math
// should already exclude them: this is the guard that f32 stays f32).
template <class Perf, class WsSize, class Find>
std::vector<Choice> find_algorithms(Direction dir, DType t, int count, WsSize ws_size, Find find) {
  std::size_t want = 0;
  for (int a = 0; a < count; ++a) {
    std::size_t bytes = 0;
    if (ws_size(a, &bytes) == CUDNN_STATUS_SUCCESS) want = std::max(want, bytes);
  }
  std::size_t free_b = 0, total_b = 0;
  HOTOPS_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const std::size_t ws_bytes = std::min(want, free_b / 2);
  gpu::DeviceBuffer ws(ws_bytes);
  Perf perf[16] = {};
  int n = 0;
  // Twice: with CUDA's lazy loading, the first search also times each algorithm's module load and
  // can rank a slow algorithm first. The second search ranks warm kernels.
  for (int pass = 0; pass < 2; ++pass) HOTOPS_CHECK_CUDNN(find(std::min(count, 16), &n, perf, ws.get(), ws_bytes));
  std::string tried;
  std::vector<Choice> usable;
  for (int i = 0; i < n; ++i) {
    const Perf& r = perf[i];
    const int a = static_cast<int>(r.algo);
    tried += std::string(i ? ", " : "") + algo_name(dir, a) + " " + cudnnGetErrorString(r.status);
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > ws_bytes) continue;
    if (t == DType::f32 && is_tensor_op(r.mathType)) continue;
    if (static_cast<int>(usable.size()) < gpu::kRetimeCandidates)
      usable.push_back(Choice{a, r.memory, t == DType::f32 ? CUDNN_FMA_MATH : r.mathType, r.time, 0.f});
  }
  if (!usable.empty()) return usable;
  throw Error(std::string("cuDNN has no ") + direction_name(dir) + " algorithm for this case (" + dtype_name(t) +
                  "; tried: " + (tried.empty() ? "none" : tried) + ")",
              ErrorKind::unsupported);
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
    HOTOPS_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(conv_.h, dim(s_.pad_h), dim(s_.pad_w), dim(s_.stride_h),
                                                       dim(s_.stride_w), dim(s_.dil_h), dim(s_.dil_w),
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(
        conv_.h, s_.dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    int n = 0, k = 0, h = 0, w = 0;
    HOTOPS_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(conv_.h, x_desc_.h, w_desc_.h, &n, &k, &h, &w));
    HOTOPS_CHECK(h == s_.P() && w == s_.Q(), "conv2d: cuDNN's output size differs from PyTorch's");

    x_ = gpu::DeviceBuffer(in_.x);
    w_ = gpu::DeviceBuffer(in_.w);
    b_ = gpu::DeviceBuffer(in_.b);
    dy_ = gpu::DeviceBuffer(in_.dy);
    out_d_ = gpu::DeviceBuffer(out_.primary.bytes());
    db_d_ = gpu::DeviceBuffer(out_.db.bytes());

    const std::vector<Choice> candidates = find_candidates();
    choice_ = retime(candidates);
    HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(conv_.h, choice_.math));
    workspace_ = gpu::DeviceBuffer(choice_.workspace);
    label_ = std::string("cuDNN ") + direction_name(s_.dir) + " " + algo_name(s_.dir, choice_.algo) +
             " (cudnnFind: " + ms(choice_.find_ms) + "; fastest of " + std::to_string(candidates.size()) +
             " re-timed: " + ms(choice_.retimed_ms) + "), ws " + mib(choice_.workspace) + ", " + math_name(choice_.math);
    if (s_.bias && s_.dir != Direction::bwd_data) probe_bias();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    HOTOPS_CHECK_CUDNN(convolve(choice_.algo));
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
  // The convolution alone (no bias) with algorithm `algo`, in workspace_.
  cudnnStatus_t convolve(int algo) {
    const float one = 1.f, zero = 0.f;
    cudnnHandle_t h = cudnn();
    switch (s_.dir) {
      case Direction::fwd:
        return cudnnConvolutionForward(h, &one, x_desc_.h, x_.get(), w_desc_.h, w_.get(), conv_.h,
                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), workspace_.get(),
                                       workspace_.bytes(), &zero, y_desc_.h, out_d_.get());
      case Direction::bwd_data:
        return cudnnConvolutionBackwardData(h, &one, w_desc_.h, w_.get(), y_desc_.h, dy_.get(), conv_.h,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), workspace_.get(),
                                            workspace_.bytes(), &zero, x_desc_.h, out_d_.get());
      default:
        return cudnnConvolutionBackwardFilter(h, &one, x_desc_.h, x_.get(), y_desc_.h, dy_.get(), conv_.h,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace_.get(),
                                              workspace_.bytes(), &zero, w_desc_.h, out_d_.get());
    }
  }

  // Each usable candidate is timed again (gpu::retime_ms) and the fastest is kept. A candidate that
  // errors is dropped; one is always left, since Find ran it successfully.
  Choice retime(std::vector<Choice> candidates) {
    std::size_t ws = 0;
    for (const Choice& c : candidates) ws = std::max(ws, c.workspace);
    workspace_ = gpu::DeviceBuffer(ws);
    Choice best;
    best.retimed_ms = -1;
    for (Choice& c : candidates) {
      HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(conv_.h, c.math));
      c.retimed_ms = gpu::retime_ms([&] { return convolve(c.algo); });
      if (c.retimed_ms < 0) continue;
      if (best.retimed_ms < 0 || c.retimed_ms < best.retimed_ms) best = c;
    }
    HOTOPS_CHECK(best.retimed_ms >= 0, "conv2d: no cuDNN algorithm that cudnnFind offered runs again");
    return best;
  }

  std::vector<Choice> find_candidates() {
    cudnnHandle_t h = cudnn();
    const DType t = s_.dtype;
    switch (s_.dir) {
      case Direction::fwd:
        return find_algorithms<cudnnConvolutionFwdAlgoPerf_t>(
            s_.dir, t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
            [&](int a, std::size_t* bytes) {
              return cudnnGetConvolutionForwardWorkspaceSize(h, x_desc_.h, w_desc_.h, conv_.h, y_desc_.h,
                                                             static_cast<cudnnConvolutionFwdAlgo_t>(a), bytes);
            },
            [&](int count, int* n, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, std::size_t ws_bytes) {
              return cudnnFindConvolutionForwardAlgorithmEx(h, x_desc_.h, x_.get(), w_desc_.h, w_.get(), conv_.h,
                                                            y_desc_.h, out_d_.get(), count, n, perf, ws, ws_bytes);
            });
      case Direction::bwd_data:
        return find_algorithms<cudnnConvolutionBwdDataAlgoPerf_t>(
            s_.dir, t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            [&](int a, std::size_t* bytes) {
              return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_desc_.h, y_desc_.h, conv_.h, x_desc_.h,
                                                                  static_cast<cudnnConvolutionBwdDataAlgo_t>(a), bytes);
            },
            [&](int count, int* n, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, std::size_t ws_bytes) {
              return cudnnFindConvolutionBackwardDataAlgorithmEx(h, w_desc_.h, w_.get(), y_desc_.h, dy_.get(), conv_.h,
                                                                 x_desc_.h, out_d_.get(), count, n, perf, ws,
                                                                 ws_bytes);
            });
      default:
        return find_algorithms<cudnnConvolutionBwdFilterAlgoPerf_t>(
            s_.dir, t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
            [&](int a, std::size_t* bytes) {
              return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                  h, x_desc_.h, y_desc_.h, conv_.h, w_desc_.h, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), bytes);
            },
            [&](int count, int* n, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, std::size_t ws_bytes) {
              return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, x_desc_.h, x_.get(), y_desc_.h, dy_.get(),
                                                                   conv_.h, w_desc_.h, out_d_.get(), count, n, perf,
                                                                   ws, ws_bytes);
            });
    }
  }

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
  Choice choice_;
  bool own_bias_kernel_ = false;
  std::string label_;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaConv2d>(p); }

}  // namespace hotops::conv2d
