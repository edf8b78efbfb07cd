// The one registry of op families: bench/ registers its benchmarks from it, test/ its tests.
#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "kernels/adamw/adamw.h"
#include "kernels/batchnorm/batchnorm.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/copy/copy.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gelu/gelu.h"
#include "kernels/layernorm/layernorm.h"
#include "kernels/loss/loss.h"
#include "kernels/lstm/lstm.h"
#include "kernels/lstm_cell/lstm_cell.h"
#include "kernels/matmul/matmul.h"
#include "kernels/maxpool/maxpool.h"
#include "kernels/model_bilstm/model_bilstm.h"
#include "kernels/model_bert/model_bert.h"
#include "kernels/model_cnn/model_cnn.h"
#include "kernels/models/models.h"
#include "kernels/pointwise/pointwise.h"
#include "kernels/softmax/softmax.h"

namespace hotops {

void throw_no_cuda_backend(const Problem& p) {
  throw Error("this build of hotops has no CUDA backend: " + p.name(), ErrorKind::unsupported);
}

std::string backend_unsupported_reason(const Problem& p, std::string (*cpu_reason)(const Problem&)) {
  if (p.backend == Backend::cpu) return cpu_reason(p);
  std::string why;
  return gpu::available(&why) ? "" : why;
}

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {
      &matmul::family(), &conv2d::family(), &batchnorm::family(), &gelu::family(), &copy::family(),
      &lstm_cell::family(), &lstm::family(), &adamw::family(), &layernorm::family(), &softmax::family(),
      &loss::family(),
      &pointwise::family(),
      &models::family(),
      &model_bert::family(),
      &maxpool::family(),
      &embedding::family(),
      &model_bilstm::family(),
      &model_cnn::family(),
  };
  return all;
}

}  // namespace hotops
