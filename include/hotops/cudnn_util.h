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

}  // namespace hotops::gpu
