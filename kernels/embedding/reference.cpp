// The embedding reference: a plain copy (fwd; an f32 table's rows rounded to bf16) and, for the chosen rows of dW, a double sum over
// every index that hits them in index order (bwd).
#include "kernels/embedding/embedding.h"

namespace hotops::embedding {

double reference_fwd(const Shape& s, const Inputs& in, std::size_t out_index) {
  const auto dim = static_cast<std::size_t>(s.dim);
  const auto row = static_cast<std::size_t>(in.idx[static_cast<std::size_t>(s.index_of(static_cast<std::int64_t>(out_index / dim)))]);
  const double v = in.W.get(row * dim + out_index % dim);
  return s.f32_table ? bf16_to_float(float_to_bf16(static_cast<float>(v))) : v;
}

std::vector<double> reference_bwd(const Shape& s, const Inputs& in, const std::vector<std::size_t>& rows) {
  const auto dim = static_cast<std::size_t>(s.dim);
  std::vector<std::int64_t> slot(static_cast<std::size_t>(s.vocab), -1);
  for (std::size_t k = 0; k < rows.size(); ++k) slot[rows[k]] = static_cast<std::int64_t>(k);
  std::vector<double> ref(rows.size() * dim, 0.0);
  for (std::size_t i = 0; i < in.idx.size(); ++i) {
    const std::int64_t k = slot[static_cast<std::size_t>(in.idx[i])];
    if (k < 0) continue;
    double* r = ref.data() + static_cast<std::size_t>(k) * dim;
    const auto from = static_cast<std::size_t>(s.row_of(static_cast<std::int64_t>(i))) * dim;
    for (std::size_t j = 0; j < dim; ++j) r[j] += in.dout.get(from + j);
  }
  return ref;
}

}  // namespace hotops::embedding
