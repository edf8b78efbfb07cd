// cuDNN helpers shared by the families that call it: the process-wide handle and descriptor owners.
#pragma once
#include <cudnn.h>

#include "hotops/cuda_util.h"

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

// Owners of the convolution API's filter and convolution descriptors (kernels/conv2d, kernels/model_cnn).
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

// cudnnFind*AlgorithmEx times each algorithm once, so where two candidates are close, or one timing
// was disturbed, two runs picked different algorithms for the same convolution (up to 60% apart on
// the H100). conv2d times Find's usable candidates again with this: `call()` makes one cuDNN call
// and returns its status; one warm-up call, then gpu::best_batch_ms. Returns ms per call, or -1 when
// the warm-up call fails (the caller drops that candidate).
template <class Call>
float retime_ms(Call call) {
  if (call() != CUDNN_STATUS_SUCCESS) return -1;
  return best_batch_ms([&] { HOTOPS_CHECK_CUDNN(call()); });
}
// How many of Find's usable results are re-timed. (model_cnn keeps Find's choice: with its passes
// re-timed as eager calls, its graph-replayed vgg_cifar train step took 834 us at batch 32 on the
// H100, against 778 us measured earlier with Find's choice, and 4147 against 4160 us at 512.)
constexpr int kRetimeCandidates = 4;

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
