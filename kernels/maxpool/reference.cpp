// The maxpool reference: plain loops over one window (or the windows covering one input element),
// in double. The inputs have no ties within a window, so every answer is exact.
#include <algorithm>
#include <limits>

#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {

void reference_argmax(const Shape& s, const HostBuffer& x, std::int64_t n, std::int64_t c, std::int64_t oh,
                      std::int64_t ow, std::int64_t* h, std::int64_t* w) {
  double best = -std::numeric_limits<double>::infinity();
  *h = *w = -1;
  for (std::int64_t i = 0; i < s.k; ++i)
    for (std::int64_t j = 0; j < s.k; ++j) {
      const std::int64_t ih = oh * s.s - s.pad + i, iw = ow * s.s - s.pad + j;
      if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;  // padding never wins
      const double v = x.get(s.offset(n, c, ih, iw, s.H, s.W));
      if (v > best) best = v, *h = ih, *w = iw;
    }
}

namespace {
// (n, c, h, w) of a flat index into a tensor of spatial size hh x ww in the shape's layout.
void coords(const Shape& s, std::size_t i, std::int64_t hh, std::int64_t ww, std::int64_t* n, std::int64_t* c,
            std::int64_t* h, std::int64_t* w) {
  auto r = static_cast<std::int64_t>(i);
  if (s.layout == Layout::nchw) {
    *w = r % ww, r /= ww;
    *h = r % hh, r /= hh;
    *c = r % s.C, *n = r / s.C;
  } else {
    *c = r % s.C, r /= s.C;
    *w = r % ww, r /= ww;
    *h = r % hh, *n = r / hh;
  }
}
}  // namespace

double reference_fwd(const Shape& s, const HostBuffer& x, std::size_t out_index) {
  std::int64_t n, c, oh, ow, h, w;
  coords(s, out_index, s.OH(), s.OW(), &n, &c, &oh, &ow);
  reference_argmax(s, x, n, c, oh, ow, &h, &w);
  return x.get(s.offset(n, c, h, w, s.H, s.W));
}

double reference_bwd(const Shape& s, const HostBuffer& x, const HostBuffer& dy, std::size_t in_index) {
  std::int64_t n, c, h, w;
  coords(s, in_index, s.H, s.W, &n, &c, &h, &w);
  // The windows oh covering row h: oh s - pad <= h <= oh s - pad + k - 1.
  const std::int64_t oh_lo = std::max<std::int64_t>(0, (h + s.pad - s.k + s.s) / s.s);
  const std::int64_t oh_hi = std::min<std::int64_t>(s.OH() - 1, (h + s.pad) / s.s);
  const std::int64_t ow_lo = std::max<std::int64_t>(0, (w + s.pad - s.k + s.s) / s.s);
  const std::int64_t ow_hi = std::min<std::int64_t>(s.OW() - 1, (w + s.pad) / s.s);
  double dx = 0;
  for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
    for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
      std::int64_t ah, aw;
      reference_argmax(s, x, n, c, oh, ow, &ah, &aw);
      if (ah == h && aw == w) dx += dy.get(s.offset(n, c, oh, ow, s.OH(), s.OW()));
    }
  return dx;
}

}  // namespace hotops::maxpool
