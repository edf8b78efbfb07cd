// The oneDNN plan of the elementwise families (gelu, relu): one eltwise primitive over the tensor.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

#include "hotops/cpu.h"
#include "hotops/plan.h"

namespace hotops::cpu {

// A family's oneDNN eltwise plan over its Shape (dir, dtype, offset) and Args (x, dy for a bwd,
// out): each tensor starts `offset` elements into the buffer run() is given, and the label is
// `label` followed by oneDNN's implementation.
template <class Shape, class Args>
class EltwisePlan : public Plan<Args> {
 public:
  EltwisePlan(const Shape& s, Eltwise e, std::string label)
      : offset_(static_cast<std::size_t>(s.offset) * dtype_size(s.dtype)), e_(std::move(e)), label_(std::move(label)) {
    if (!e_.backward)
      prim_ = Primitive(dnnl::eltwise_forward(e_.fwd), {{DNNL_ARG_SRC, e_.tensor}, {DNNL_ARG_DST, e_.tensor}});
    else
      prim_ = Primitive(dnnl::eltwise_backward(e_.bwd),
                        {{DNNL_ARG_SRC, e_.tensor}, {DNNL_ARG_DIFF_DST, e_.tensor}, {DNNL_ARG_DIFF_SRC, e_.tensor}});
  }

  void run(const Args& a) override {
    if (!e_.backward)
      prim_.run({at(a.x), at(a.out)});
    else
      prim_.run({at(a.x), at(a.dy), at(a.out)});
  }

  std::string label() const override { return with_threads(label_ + e_.impl_info_str()); }

 private:
  const void* at(const void* buffer) const { return static_cast<const std::byte*>(buffer) + offset_; }

  std::size_t offset_;  // bytes
  Eltwise e_;
  std::string label_;
  Primitive prim_;
};

}  // namespace hotops::cpu
