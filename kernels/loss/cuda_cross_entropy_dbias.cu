// cross_entropy_dbias on CUDA: one block of 512 threads running the block's code of
// cross_entropy_dbias.cuh (at most kDbiasMaxClasses classes).
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/adamw/adamw.h"
#include "kernels/loss/cross_entropy_dbias.cuh"
#include "kernels/loss/loss.h"

namespace hotops::loss {
namespace {

template <class T>
__global__ void __launch_bounds__(kDbiasThreads) cross_entropy_dbias(const T* __restrict__ logits,
                                                                     const std::int32_t* __restrict__ labels,
                                                                     T* __restrict__ dlogits, float* __restrict__ dbias,
                                                                     float* __restrict__ loss, int B, int C,
                                                                     adamw::DeviceStep* advance, adamw::Hyper h) {
  cross_entropy_dbias_block(logits, labels, dlogits, dbias, loss, B, C);
  if (advance != nullptr && threadIdx.x == 0) {
    const std::int64_t t = advance->step + 1;
    advance->step = t;
    advance->s = adamw::scalars_for(h, t);
  }
}

class CudaCrossEntropyDbias final : public Plan {
 public:
  explicit CudaCrossEntropyDbias(const Shape& s) : s_(s) {
    if (s.classes > kDbiasMaxClasses)
      throw Error("cross_entropy_dbias: the CUDA kernel takes at most " + std::to_string(kDbiasMaxClasses) + " classes",
                  ErrorKind::unsupported);
    HOTOPS_CHECK(s.rows < (std::int64_t{1} << 31) / kDbiasMaxClasses, "cross_entropy_dbias: too many rows");
  }

  void run(const Args& a) override {
    const int B = static_cast<int>(s_.rows), C = static_cast<int>(s_.classes);
    float* loss = static_cast<float*>(a.loss);
    HOTOPS_CHECK((a.advance == nullptr) == (a.hyper == nullptr), "cross_entropy_dbias: a step to advance needs its hyper-parameters");
    const adamw::Hyper h = a.hyper ? *a.hyper : adamw::Hyper{};
    if (s_.dtype == DType::bf16)
      cross_entropy_dbias<<<1, kDbiasThreads, 0, gpu::stream()>>>(static_cast<const __nv_bfloat16*>(a.logits), a.labels,
                                                                 static_cast<__nv_bfloat16*>(a.dlogits), a.db, loss, B, C,
                                                                 a.advance, h);
    else
      cross_entropy_dbias<<<1, kDbiasThreads, 0, gpu::stream()>>>(static_cast<const float*>(a.logits), a.labels,
                                                                 static_cast<float*>(a.dlogits), a.db, loss, B, C, a.advance,
                                                                 h);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    return std::string("hotops cross_entropy_dbias<") + dtype_name(s_.dtype) +
           ">, 1 block of 512 threads (rows strided), loss and db through warp sums in a fixed order";
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_dbias_plan(const Shape& s) { return std::make_unique<CudaCrossEntropyDbias>(s); }

}  // namespace hotops::loss
