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
