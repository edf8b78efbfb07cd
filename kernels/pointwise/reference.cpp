// The pointwise references in plain C++: relu and threshold_backward, dropout with its mask drawn
// from the shared hash (pointwise.h), relu_dbias's bias gradient in double, and relu_bias.
#include <cmath>
#include <vector>

#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {

bool reference_keep(const Shape& s, const Inputs& in, std::size_t i) {
  (void)s;
  return dropout_keep(in.key, static_cast<std::uint64_t>(i));
}

double reference(const Shape& s, const Inputs& in, std::size_t i) {
  const std::size_t at = static_cast<std::size_t>(s.offset) + i;
  const bool bwd = s.dir == Direction::bwd;
  if (s.op == Op::relu_bias) {
    // The f32 sum (the double sum of two floats rounded to f32 once, as an f32 add rounds it), the
    // ReLU, then the dtype's rounding: what every implementation computes, so they compare exactly.
    const float v = static_cast<float>(in.x.get(at) + in.b.get(i % static_cast<std::size_t>(s.cols)));
    const float y = s.relu && v < 0.f ? 0.f : v;
    return s.dtype == DType::bf16 ? static_cast<double>(bf16_to_float(float_to_bf16(y))) : static_cast<double>(y);
  }
  if (s.op != Op::dropout) {
    const double x = in.x.get(at);
    if (!bwd) return x > 0 ? x : 0.0;
    return x > 0 ? in.dy.get(at) : 0.0;  // threshold_backward(dy, x, 0)
  }
  // dropout: the mask is recomputed here, not read from the bwd input, so that a wrong mask given
  // to bwd fails as well. The product is PyTorch's: f32 input (bf16 exactly widened) times the f32
  // scale, rounded to f32 and then to the output's dtype.
  if (!reference_keep(s, in, i)) return 0.0;
  const float v = static_cast<float>(bwd ? in.dy.get(at) : in.x.get(at));
  const float y = v * in.key.scale;
  return s.dtype == DType::bf16 ? static_cast<double>(bf16_to_float(float_to_bf16(y))) : static_cast<double>(y);
}

void reference_dbias(const Shape& s, const Inputs& in, std::vector<double>& db, std::vector<double>& db_abs) {
  const auto rows = static_cast<std::size_t>(s.rows()), cols = static_cast<std::size_t>(s.cols);
  db.assign(cols, 0.0);
  db_abs.assign(cols, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const double d = reference(s, in, r * cols + c);
      db[c] += d;
      db_abs[c] += std::fabs(d);
    }
}

}  // namespace hotops::pointwise
