// Page-locked (pinned) host memory, which the GPU's copy engines read and write by DMA directly;
// CUDA code only. Ordinary (pageable) host memory is a HostBuffer.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <utility>

#include "hotops/check.h"

namespace hotops::gpu {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ptr_ = nullptr;
      char buf[120];
      std::snprintf(buf, sizeof buf, "out of pinned host memory: cudaHostAlloc of %.2f GiB failed",
                    static_cast<double>(bytes) / 1073741824.0);
      throw Error(buf, ErrorKind::out_of_memory);
    }
    HOTOPS_CHECK_CUDA(e);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    // A destructor cannot throw: a failure here (a sticky error from an earlier fault) is reported.
    if (!ptr_) return;
    const cudaError_t e = cudaFreeHost(ptr_);
    if (e != cudaSuccess) std::fprintf(stderr, "hotops: cudaFreeHost failed: %s\n", cudaGetErrorString(e));
  }

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace hotops::gpu
