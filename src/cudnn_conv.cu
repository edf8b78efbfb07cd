// cuDNN's convolution API for every caller: descriptor setup, the three passes and the algorithm search.
#include <cudnn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hotops/cudnn_util.h"

namespace hotops::gpu {
namespace {

int algo_count(Direction pass) {
  switch (pass) {
    case Direction::fwd: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Direction::bwd_data: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    default: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
}

const char* pass_name(Direction pass) {
  switch (pass) {
    case Direction::fwd: return "forward";
    case Direction::bwd_data: return "backward data";
    default: return "backward filter";
  }
}

cudnnStatus_t workspace_size(const ConvCall& c, int algo, std::size_t* bytes) {
  switch (c.pass) {
    case Direction::fwd:
      return cudnnGetConvolutionForwardWorkspaceSize(cudnn(), c.x_desc, c.w_desc, c.conv, c.y_desc,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Direction::bwd_data:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn(), c.w_desc, c.y_desc, c.conv, c.x_desc,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    default:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn(), c.x_desc, c.y_desc, c.conv, c.w_desc,
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
}

// The search's one call per pass; overloaded on the pass's result type.
cudnnStatus_t find(const ConvCall& c, int count, int* n, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws,
                   std::size_t ws_bytes) {
  return cudnnFindConvolutionForwardAlgorithmEx(cudnn(), c.x_desc, c.x, c.w_desc, c.w, c.conv, c.y_desc, c.out,
                                                count, n, perf, ws, ws_bytes);
}
cudnnStatus_t find(const ConvCall& c, int count, int* n, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
                   std::size_t ws_bytes) {
  return cudnnFindConvolutionBackwardDataAlgorithmEx(cudnn(), c.w_desc, c.w, c.y_desc, c.y, c.conv, c.x_desc, c.out,
                                                     count, n, perf, ws, ws_bytes);
}
cudnnStatus_t find(const ConvCall& c, int count, int* n, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
                   std::size_t ws_bytes) {
  return cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnn(), c.x_desc, c.x, c.y_desc, c.y, c.conv, c.w_desc,
                                                       c.out, count, n, perf, ws, ws_bytes);
}

// The search's workspace: as large as the hungriest algorithm asks, so that Find can time every
// algorithm, capped at half the free device memory. Half, not a quarter: the cap bounds only this
// temporary buffer, freed before the caller allocates anything else, and the workspace a caller then
// keeps is its chosen algorithm's own, at most this; the other half leaves room for cuDNN's own
// allocations during Find and for the caller's later ones (model_cnn sets up its whole step first
// and keeps one workspace, the largest of its layers' choices). Every case of conv2d and model_cnn
// keeps far less than either fraction (vgg_cifar's f32 train step at batch 512 keeps 328 MiB of the
// H100's 80 GB), so a smaller cap would only hide from the search algorithms that do fit, on the
// larger batches a user can ask for.
std::size_t search_workspace_bytes(const ConvCall& c) {
  std::size_t want = 0;
  for (int a = 0; a < algo_count(c.pass); ++a) {
    std::size_t bytes = 0;
    if (workspace_size(c, a, &bytes) == CUDNN_STATUS_SUCCESS) want = std::max(want, bytes);
  }
  std::size_t free_b = 0, total_b = 0;
  HOTOPS_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return std::min(want, free_b / 2);
}

// Find's results that `math` accepts and that fit the search's workspace, fastest first, at most
// `keep` of them.
template <class Perf>
std::vector<ConvAlgo> usable_results(const ConvCall& c, ConvMath math, int keep, const std::string& context) {
  const std::size_t ws_bytes = search_workspace_bytes(c);
  DeviceBuffer ws(ws_bytes);
  Perf perf[16] = {};
  int n = 0;
  for (int pass = 0; pass < 2; ++pass)
    HOTOPS_CHECK_CUDNN(find(c, std::min(algo_count(c.pass), 16), &n, perf, ws.get(), ws_bytes));
  std::string tried;
  std::vector<ConvAlgo> usable;
  for (int i = 0; i < n; ++i) {
    const Perf& r = perf[i];
    const int a = static_cast<int>(r.algo);
    tried += std::string(i ? ", " : "") + conv_algo_name(c.pass, a) + " " + cudnnGetErrorString(r.status);
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > ws_bytes) continue;
    if (math == ConvMath::fma && is_tensor_op_math(r.mathType)) continue;
    if (math == ConvMath::tensor_ops && !is_tensor_op_math(r.mathType)) continue;
    if (static_cast<int>(usable.size()) < keep) {
      ConvAlgo u;
      u.algo = a;
      u.workspace = r.memory;
      u.math = math == ConvMath::fma ? CUDNN_FMA_MATH : r.mathType;
      u.find_ms = r.time;
      usable.push_back(u);
    }
  }
  if (!usable.empty()) return usable;
  const char* kind = math == ConvMath::fma ? "FMA-math " : math == ConvMath::tensor_ops ? "tensor-op " : "";
  throw Error(context + ": cuDNN has no " + kind + pass_name(c.pass) + " algorithm (tried: " +
                  (tried.empty() ? "none" : tried) + ")",
              ErrorKind::unsupported);
}

// ms per call of one cuDNN call: one warm-up call, then gpu::best_batch_ms; -1 when the warm-up call
// fails.
template <class Call>
float retime_ms(Call call) {
  if (call() != CUDNN_STATUS_SUCCESS) return -1;
  return best_batch_ms([&] { HOTOPS_CHECK_CUDNN(call()); });
}

// ConvPick::retimed: each candidate timed again in one workspace large enough for all, then
// pick_retimed. A candidate that errors is dropped; one is usually left, since Find ran it successfully.
ConvAlgo fastest_retimed(const ConvCall& c, std::vector<ConvAlgo> candidates, const std::string& context) {
  std::size_t ws_bytes = 0;
  for (const ConvAlgo& a : candidates) ws_bytes = std::max(ws_bytes, a.workspace);
  DeviceBuffer ws(ws_bytes);
  for (ConvAlgo& a : candidates) {
    HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(c.conv, a.math));
    a.retimed_ms = retime_ms([&] { return convolve(c, a.algo, ws.get(), ws.bytes()); });
  }
  ConvAlgo best = pick_retimed(candidates, context);
  best.retimed = static_cast<int>(candidates.size());
  return best;
}

template <class Perf>
ConvAlgo choose(const ConvCall& c, ConvMath math, ConvPick pick, const std::string& context) {
  const bool retime = pick == ConvPick::retimed;
  std::vector<ConvAlgo> usable = usable_results<Perf>(c, math, retime ? kRetimeCandidates : 1, context);
  return retime ? fastest_retimed(c, std::move(usable), context) : usable.front();
}

}  // namespace

std::string conv_search_key(const ConvCall& c, ConvMath math, ConvPick pick) {
  std::string key = std::to_string(static_cast<int>(c.pass)) + "|" + std::to_string(static_cast<int>(math)) + "|" +
                    std::to_string(static_cast<int>(pick));
  const auto add = [&key](long long v) { key += "," + std::to_string(v); };
  for (cudnnTensorDescriptor_t t : {c.x_desc, c.y_desc}) {
    cudnnDataType_t type{};
    int n = 0, dims[8] = {}, strides[8] = {};
    if (cudnnGetTensorNdDescriptor(t, 8, &type, &n, dims, strides) != CUDNN_STATUS_SUCCESS) return "";
    add(type), add(n);
    for (int i = 0; i < n && i < 8; ++i) add(dims[i]), add(strides[i]);
  }
  cudnnDataType_t wtype{};
  cudnnTensorFormat_t format{};
  int wn = 0, wdims[8] = {};
  if (cudnnGetFilterNdDescriptor(c.w_desc, 8, &wtype, &format, &wn, wdims) != CUDNN_STATUS_SUCCESS) return "";
  add(wtype), add(format), add(wn);
  for (int i = 0; i < wn && i < 8; ++i) add(wdims[i]);
  int ph = 0, pw = 0, sh = 0, sw = 0, dh = 0, dw = 0, groups = 0;
  cudnnConvolutionMode_t mode{};
  cudnnDataType_t compute{};
  cudnnMathType_t math_type{};
  if (cudnnGetConvolution2dDescriptor(c.conv, &ph, &pw, &sh, &sw, &dh, &dw, &mode, &compute) != CUDNN_STATUS_SUCCESS ||
      cudnnGetConvolutionGroupCount(c.conv, &groups) != CUDNN_STATUS_SUCCESS ||
      cudnnGetConvolutionMathType(c.conv, &math_type) != CUDNN_STATUS_SUCCESS)
    return "";
  for (long long v : {ph, pw, sh, sw, dh, dw, static_cast<int>(mode), static_cast<int>(compute), groups,
                      static_cast<int>(math_type)})
    add(v);
  return key + "|" + placement_key({c.x, c.w, c.y, c.out});
}

namespace {

ChoiceCache<ConvAlgo>& search_cache() {
  static ChoiceCache<ConvAlgo> cache("conv");
  return cache;
}

}  // namespace

int conv_algo_searches() { return search_cache().searches(); }

ConvAlgo pick_retimed(const std::vector<ConvAlgo>& timed, const std::string& context) {
  float fastest = -1;
  for (const ConvAlgo& a : timed)
    if (a.retimed_ms >= 0 && (fastest < 0 || a.retimed_ms < fastest)) fastest = a.retimed_ms;
  HOTOPS_CHECK(fastest >= 0, context + ": no cuDNN algorithm that cudnnFind offered runs again");
  const ConvAlgo* pick = nullptr;
  for (const ConvAlgo& a : timed) {
    if (a.retimed_ms < 0 || a.retimed_ms > fastest * (1 + kRetimeTie)) continue;
    if (!pick || a.workspace < pick->workspace || (a.workspace == pick->workspace && a.algo < pick->algo)) pick = &a;
  }
  return *pick;
}

void set_conv2d(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int stride_h, int stride_w, int dil_h,
                int dil_w, cudnnMathType_t math) {
  HOTOPS_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(d, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(d, math));
}

cudnnStatus_t convolve(const ConvCall& c, int algo, void* workspace, std::size_t workspace_bytes) {
  const float one = 1.f, zero = 0.f;
  switch (c.pass) {
    case Direction::fwd:
      return cudnnConvolutionForward(cudnn(), &one, c.x_desc, c.x, c.w_desc, c.w, c.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), workspace, workspace_bytes, &zero,
                                     c.y_desc, c.out);
    case Direction::bwd_data:
      return cudnnConvolutionBackwardData(cudnn(), &one, c.w_desc, c.w, c.y_desc, c.y, c.conv,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), workspace,
                                          workspace_bytes, &zero, c.x_desc, c.out);
    default:
      return cudnnConvolutionBackwardFilter(cudnn(), &one, c.x_desc, c.x, c.y_desc, c.y, c.conv,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace,
                                            workspace_bytes, &zero, c.w_desc, c.out);
  }
}

const char* conv_algo_name(Direction pass, int algo) {
  static const char* const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                    "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                       "FFT_TILING"};
  if (pass == Direction::fwd && algo >= 0 && algo < 8) return fwd[algo];
  if (pass == Direction::bwd_data && algo >= 0 && algo < 6) return data[algo];
  if (pass == Direction::bwd_weight && algo >= 0 && algo < 7) return filter[algo];
  return "?";
}

ConvAlgo find_conv_algo(const ConvCall& c, ConvMath math, ConvPick pick, const std::string& context) {
  const std::string key = conv_search_key(c, math, pick);
  ConvAlgo chosen;
  std::size_t free_b = 0, total_b = 0;
  bool from_file = false;
  if (search_cache().find(key, &chosen, &from_file) && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
      chosen.workspace <= free_b / 2) {
    HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(c.conv, chosen.math));
    chosen.from_file = from_file;
    return chosen;
  }
  switch (c.pass) {
    case Direction::fwd: chosen = choose<cudnnConvolutionFwdAlgoPerf_t>(c, math, pick, context); break;
    case Direction::bwd_data: chosen = choose<cudnnConvolutionBwdDataAlgoPerf_t>(c, math, pick, context); break;
    case Direction::bwd_weight: chosen = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(c, math, pick, context); break;
    default: throw Error(context + ": a convolution pass is fwd, bwd_data or bwd_weight");
  }
  HOTOPS_CHECK_CUDNN(cudnnSetConvolutionMathType(c.conv, chosen.math));
  chosen.from_file = false;
  search_cache().add(key, chosen);
  return chosen;
}

}  // namespace hotops::gpu
