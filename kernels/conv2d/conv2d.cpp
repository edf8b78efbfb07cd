// The conv2d family: not implemented yet, so it registers no problems.
#include "kernels/conv2d/conv2d.h"

#include "hotops/check.h"

namespace hotops::conv2d {
namespace {

class Pending final : public Family {
 public:
  std::string name() const override { return "conv2d"; }
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>&) const override { return {}; }
  std::vector<Problem> test_problems() const override { return {}; }
  Work work(const Problem&) const override { return {}; }
  std::unique_ptr<Case> make(const Problem& p) const override {
    throw Error("conv2d is not implemented yet: " + p.name(), ErrorKind::unsupported);
  }
};

}  // namespace

const Family& family() {
  static const Pending f;
  return f;
}

}  // namespace hotops::conv2d
