// The copy family: not implemented yet, so it registers no problems.
#include "kernels/copy/copy.h"

#include "hotops/check.h"

namespace hotops::copy {
namespace {

class Pending final : public Family {
 public:
  std::string name() const override { return "copy"; }
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>&) const override { return {}; }
  std::vector<Problem> test_problems() const override { return {}; }
  Work work(const Problem&) const override { return {}; }
  std::unique_ptr<Case> make(const Problem& p) const override {
    throw Error("copy is not implemented yet: " + p.name(), ErrorKind::unsupported);
  }
};

}  // namespace

const Family& family() {
  static const Pending f;
  return f;
}

}  // namespace hotops::copy
