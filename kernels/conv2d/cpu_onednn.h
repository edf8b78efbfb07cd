// The conv2d CPU plan's oneDNN side, for a CPU caller that allocates and reorders around the plan
// (model_cnn's layers): the layouts its primitive took and the implementation oneDNN chose, and a plan
// that takes x in a layout of the caller's.
#pragma once
#include <string>

#include <dnnl.hpp>

#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d {

// The layout in which the plan's primitive takes tensor `t` (x: x or dx, w: w or dw, y: y or dy):
// what a caller's buffer holds with Shape::onednn_layouts, or a fixed x_pick / y_pick. Throws
// hotops::Error for a plan that is not a CPU conv2d plan.
dnnl::memory::desc onednn_desc(const Plan& p, Tensor t);
// A plan (Shape::onednn_layouts) whose x is in the caller's layout `x` (a layout another primitive
// wrote, e.g. the pool before it), reordered by the run into the primitive's where the two differ.
std::unique_ptr<Plan> make_cpu_plan(const Shape& s, const dnnl::memory::desc& x);
// oneDNN's name of the implementation the plan runs (e.g. "brg:avx512_core").
std::string onednn_impl(const Plan& p);

}  // namespace hotops::conv2d
