// The maxpool CPU plan's oneDNN side, for a caller whose tensors are in layouts oneDNN primitives
// chose (model_cnn's inference: x in the layout its conv picked, y in the next conv's or NHWC).
#pragma once
#include <memory>

#include <dnnl.hpp>

#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {

// A forward plan (s.dir fwd) on x in layout `x` and y in layout `y` (their dims: the shape's input
// and output, NCHW order). The pooling primitive takes x as it is and writes y in the layout it
// picks for that x; where `y` differs (format_tag::any: never), the run reorders its output into
// `y` from the plan's own buffer.
std::unique_ptr<Plan> make_cpu_plan(const Shape& s, const dnnl::memory::desc& x, const dnnl::memory::desc& y);
// The layout the plan writes y in: `y`, or with format_tag::any the one the primitive picked.
dnnl::memory::desc onednn_y_desc(const Plan& p);

}  // namespace hotops::maxpool
