// The one registry of op families: bench/ registers its benchmarks from it, test/ its tests.
#include "hotops/op.h"
#include "kernels/batchnorm/batchnorm.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/copy/copy.h"
#include "kernels/gelu/gelu.h"
#include "kernels/matmul/matmul.h"

namespace hotops {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {
      &matmul::family(), &conv2d::family(), &batchnorm::family(), &gelu::family(), &copy::family(),
  };
  return all;
}

}  // namespace hotops
