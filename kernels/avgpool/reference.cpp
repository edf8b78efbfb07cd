// The global_avgpool reference: sums in double, one output element at a time.
#include "kernels/avgpool/avgpool.h"

namespace hotops::avgpool {

double reference_fwd(const Shape& s, const HostBuffer& x, std::size_t out_index) {
  const auto i = static_cast<std::int64_t>(out_index);
  const std::int64_t n = i / s.C, c = i % s.C;
  double sum = 0;
  for (std::int64_t l = 0; l < s.L; ++l) sum += x.get(s.x_at(n, l, c));
  return sum / static_cast<double>(s.L);
}

double reference_bwd(const Shape& s, const HostBuffer& dy, std::size_t in_index) {
  const auto i = static_cast<std::int64_t>(in_index);
  const std::int64_t n = s.layout == Layout::nlc ? i / (s.L * s.C) : i / (s.C * s.L);
  const std::int64_t c = s.layout == Layout::nlc ? i % s.C : (i / s.L) % s.C;
  return dy.get(static_cast<std::size_t>(n * s.C + c)) / static_cast<double>(s.L);
}

}  // namespace hotops::avgpool
