// The one registry of op families: bench/ registers its benchmarks from it, test/ its tests.
#include "hotops/op.h"
#include "kernels/matmul/matmul.h"

namespace hotops {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {
      &matmul::family(),
  };
  return all;
}

}  // namespace hotops
