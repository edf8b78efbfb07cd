// The oneDNN case of the elementwise families (gelu, relu): one eltwise primitive over the tensor.
#pragma once
#include <string>
#include <utility>

#include "hotops/buffer.h"
#include "hotops/cpu.h"
#include "hotops/op.h"

namespace hotops::cpu {

// A family's oneDNN eltwise case over its Shape (dir, dtype, offset) and Inputs (x, and dy for a
// bwd): the output is checked by `check`, and the label is `label` followed by oneDNN's
// implementation.
template <class Shape, class Inputs>
class EltwiseCase : public Case {
 public:
  using Checker = Check (*)(const Shape&, const Inputs&, const HostBuffer&);

  EltwiseCase(const Shape& s, Eltwise plan, Inputs in, HostBuffer out, Checker check, std::string label)
      : s_(s), plan_(std::move(plan)), in_(std::move(in)), out_(std::move(out)), check_(check), label_(std::move(label)) {
    // The tensors start `offset` elements into their buffers.
    call_ = plan_.bind(in_.x.data(), in_.dy.data(), out_.data(), s_.offset * dtype_size(s_.dtype));
  }

  void run() override { call_.run(); }

  Check verify() override {
    out_.poison();
    run();
    return check_(s_, in_, out_);
  }

  std::string label() const override { return with_threads(label_ + plan_.impl_info_str()); }

 private:
  Shape s_;
  Eltwise plan_;
  Inputs in_;
  HostBuffer out_;
  Checker check_;
  std::string label_;
  Call call_;
};

}  // namespace hotops::cpu
