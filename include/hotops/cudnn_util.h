// cuDNN helpers shared by the families that call it: handle, descriptor owners, convolution search.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "hotops/cuda_util.h"
#include "hotops/problem.h"

namespace hotops::gpu {

// One cuDNN handle for the process, bound to gpu::stream(); created on first use (outside timing).
cudnnHandle_t cudnn();

// Owns a cuDNN tensor descriptor.
struct TensorDesc {
  cudnnTensorDescriptor_t h = nullptr;
  TensorDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateTensorDescriptor(&h)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(h); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

// ---- the convolution API (kernels/conv2d, kernels/model_cnn) -----------------------------------

// Owners of the convolution API's filter and convolution descriptors.
struct FilterDesc {
  cudnnFilterDescriptor_t h = nullptr;
  FilterDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateFilterDescriptor(&h)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(h); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t h = nullptr;
  ConvDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&h)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(h); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// d becomes PyTorch's Conv2d (cuDNN's cross-correlation) with an f32 compute type whatever the data
// type (bf16 data accumulates in f32), and math type `math` until an algorithm search sets its own.
void set_conv2d(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int stride_h, int stride_w, int dil_h,
                int dil_w, cudnnMathType_t math);

inline bool is_tensor_op_math(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// One pass of the convolution y = conv(x, w), as cuDNN's calls take it. `pass` is fwd (reads x, w,
// writes y), bwd_data (reads w and y as dy, writes dx) or bwd_weight (reads x and y as dy, writes
// dw); `out` is the buffer written, with the descriptor of y, x or w respectively. The pointer a
// pass does not read is ignored. The algorithm search overwrites `out`.
struct ConvCall {
  Direction pass = Direction::fwd;
  cudnnTensorDescriptor_t x_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnTensorDescriptor_t y_desc = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  void* out = nullptr;
};

// The pass with algorithm `algo` (a cudnnConvolution*Algo_t of its pass), alpha 1 and beta 0.
cudnnStatus_t convolve(const ConvCall& c, int algo, void* workspace, std::size_t workspace_bytes);

// cuDNN's name of algorithm `algo` of a pass (the enum's name without its prefix), "?" if unknown.
const char* conv_algo_name(Direction pass, int algo);

// Which of the search's results a caller takes, by the math type each ran with. The descriptor's
// math type during the search is the caller's (set_conv2d): CUDNN_FMA_MATH for f32, tensor-op math
// for tf32 and bf16.
enum class ConvMath {
  fma,         // f32 as f32: no tensor-op result (the guard that f32 stays f32); the algorithm then
               // runs with CUDNN_FMA_MATH, the math it was searched and timed with
  any,         // tensor ops allowed: Find's result with whatever math it ran (the label names it)
  tensor_ops,  // tensor-op results only, for a label that promises tensor-op convolutions
};

// How a result is chosen among those the math rule allows.
enum class ConvPick {
  // Find's fastest. cudnnFind*AlgorithmEx times each algorithm once, so close candidates or one
  // disturbed timing can make two processes pick differently: the convnet steps, which took it,
  // ran algorithms 10-20% apart in step time from one process to the next on the H100
  // (docs/timing.md). Nothing timed takes it now.
  find_fastest,
  // The first kRetimeCandidates of Find's usable results are timed again (one warm-up call, then
  // gpu::best_batch_ms) and pick_retimed keeps one: two runs of conv2d had picked algorithms up to
  // 60% apart for the same convolution on the H100 with Find's choice alone.
  retimed,
};
constexpr int kRetimeCandidates = 4;

// The chosen algorithm, the workspace it needs, Find's time for it and, for ConvPick::retimed, how
// many candidates were re-timed and its re-timed time (ms per call).
struct ConvAlgo {
  int algo = -1;
  std::size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float find_ms = 0;
  int retimed = 0;
  float retimed_ms = -1;
  bool from_file = false;  // read from --hotops_choices' file: the times are the search's that wrote it
};

// The choice among re-timed candidates (those with retimed_ms < 0 did not run again and are
// skipped; none re-timed throws Error, naming `context`): of those within kRetimeTie of the
// fastest, the one that needs the least workspace, then the lowest algorithm number. A near tie is decided by what does
// not move between processes rather than by which timing came out lower: the re-timings of
// algorithms a few percent apart in isolation swap order from one process to the next, and inside a
// model step such algorithms can differ by more (cnn_mnist's f32 step at batch 32 took 261 or 268 µs
// on the H100 by its second convolution's choice between two algorithms that re-timed alike).
ConvAlgo pick_retimed(const std::vector<ConvAlgo>& timed, const std::string& context = "pick_retimed");

// The algorithm search, at setup, on the caller's own buffers: cudnnFind*AlgorithmEx, run twice
// (with CUDA's lazy loading the first search also times each algorithm's module load and can rank a
// slow algorithm first), with a workspace as large as the hungriest algorithm asks, capped at half
// the free device memory (cudnn_conv.cu says why). Sets c.conv's math type to the chosen
// algorithm's. Throws Error (unsupported) when no result qualifies, naming `context`, the pass and
// every result's status. The caller allocates the returned workspace.
// One search per problem per process: a later call for the same pass, rules, descriptors, operand
// alignments and device takes the first one's choice (while its workspace fits half the free
// memory), so every variant of a problem (a model's plain, e2e:1 and graph:1 steps, an op's
// repetitions) runs the same algorithms, computes the same outputs and shares one reference.
ConvAlgo find_conv_algo(const ConvCall& c, ConvMath math, ConvPick pick, const std::string& context);
// How many searches find_conv_algo has run in this process (not those it answered from its cache).
int conv_algo_searches();
// The text find_conv_algo keeps a search's choice under: the pass, the caller's rules, every
// descriptor's type, dimensions and strides, the geometry, groups and math, and the operands'
// placement; "" where a descriptor cannot be read back. A choice a plan times beside cuDNN's (the
// direct kernel of conv2d's first layers) is kept under it too.
std::string conv_search_key(const ConvCall& c, ConvMath math, ConvPick pick);

// cuDNN's RNN algorithm for an LSTM of hidden size `hidden`: the persistent small-hidden kernels
// (CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H: the recurrent weights stay on chip for all time steps, one
// launch per direction instead of a GEMM and a pointwise kernel per step) where cuDNN offers them:
// hidden <= 192 for a forward pass alone, <= 128 when a backward pass follows (PyTorch's bounds too);
// the standard per-step algorithm otherwise. Callers fall back to standard where cuDNN refuses the
// persistent one for a configuration, and say in the label which one ran (rnn_algo_name).
inline cudnnRNNAlgo_t lstm_algo(int hidden, bool backward) {
  return hidden <= (backward ? 128 : 192) ? CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H : CUDNN_RNN_ALGO_STANDARD;
}
inline const char* rnn_algo_name(cudnnRNNAlgo_t a) {
  switch (a) {
    case CUDNN_RNN_ALGO_STANDARD: return "STANDARD";
    case CUDNN_RNN_ALGO_PERSIST_STATIC: return "PERSIST_STATIC";
    case CUDNN_RNN_ALGO_PERSIST_DYNAMIC: return "PERSIST_DYNAMIC";
    case CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H: return "PERSIST_STATIC_SMALL_H";
    default: return "unknown";
  }
}

// Owners of the cuDNN RNN API's descriptors (kernels/lstm, kernels/model_bilstm).
struct RnnDesc {
  cudnnRNNDescriptor_t h = nullptr;
  RnnDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateRNNDescriptor(&h)); }
  ~RnnDesc() { cudnnDestroyRNNDescriptor(h); }
  RnnDesc(const RnnDesc&) = delete;
  RnnDesc& operator=(const RnnDesc&) = delete;
};
struct DataDesc {
  cudnnRNNDataDescriptor_t h = nullptr;
  DataDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateRNNDataDescriptor(&h)); }
  ~DataDesc() { cudnnDestroyRNNDataDescriptor(h); }
  DataDesc(const DataDesc&) = delete;
  DataDesc& operator=(const DataDesc&) = delete;
};
struct DropoutDesc {
  cudnnDropoutDescriptor_t h = nullptr;
  DropoutDesc() { HOTOPS_CHECK_CUDNN(cudnnCreateDropoutDescriptor(&h)); }
  ~DropoutDesc() { cudnnDestroyDropoutDescriptor(h); }
  DropoutDesc(const DropoutDesc&) = delete;
  DropoutDesc& operator=(const DropoutDesc&) = delete;
};

}  // namespace hotops::gpu
