// The usual op family: one Case factory per backend, and the CPU's own support check.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "hotops/op.h"

namespace hotops {

// A family whose problems each run on its backend's factory, each factory returning a `C` (a Case,
// or a family's own subclass of it: the models' ModelCase). A family with checks of its own
// overrides unsupported_reason and ends it with OpFamily::unsupported_reason(p).
template <class C>
class BackendFamily : public Family {
 public:
  using Factory = std::unique_ptr<C> (*)(const Problem&);
  using Reason = std::string (*)(const Problem&);

  // `cpu_reason`: why the CPU cannot run a problem, "" when it can (e.g. a oneDNN probe); nullptr
  // where the CPU runs every problem. `cuda`: HOTOPS_CUDA_FACTORY(the CUDA factory).
  BackendFamily(std::string name, Reason cpu_reason, Factory cpu, Factory cuda)
      : name_(std::move(name)), cpu_reason_(cpu_reason ? cpu_reason : runs_everything), cpu_(cpu), cuda_(cuda) {}

  std::string name() const override { return name_; }

  std::string unsupported_reason(const Problem& p) const override { return backend_unsupported_reason(p, cpu_reason_); }
  std::unique_ptr<Case> make(const Problem& p) const override { return make_on_backend(p, cpu_, cuda_); }

 private:
  static std::string runs_everything(const Problem&) { return ""; }

  std::string name_;
  Reason cpu_reason_;
  Factory cpu_, cuda_;
};
using OpFamily = BackendFamily<Case>;

// The batches a named shape runs at by default: its `batches`, or its one `batch`.
template <class Shape>
auto default_batches(const Shape& s) -> decltype(std::vector<std::int64_t>(s.batches)) {
  return s.batches;
}
template <class Shape>
auto default_batches(const Shape& s) -> decltype(std::vector<std::int64_t>{s.batch}) {
  return {s.batch};
}

// Every named shape at each batch it runs at: `asked` (--hotops_batch) where not empty, else its
// default_batches. `add(shape, batch, out)` appends that pair's problems, shape by shape.
template <class Shapes, class Add>
std::vector<Problem> per_shape_and_batch(const Shapes& shapes, const std::vector<std::int64_t>& asked, Add add) {
  std::vector<Problem> out;
  for (const auto& ns : shapes)
    for (std::int64_t b : asked.empty() ? default_batches(ns) : asked) add(ns, b, out);
  return out;
}

// A Shape of a family that has fwd and bwd in f32 and bf16 only, its dir and dtype those of `p`
// (checked; `what` names the op in the errors).
template <class Shape>
Shape fwd_bwd_shape(const Problem& p, const std::string& what) {
  HOTOPS_CHECK(p.dir == Direction::fwd || p.dir == Direction::bwd, what + " has fwd and bwd only: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, what + " has f32 and bf16 only: " + p.name());
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  return s;
}

// Every problem of `op` over `args` for a family with fwd and bwd in f32 and bf16 (fwd_bwd_shape), in
// the order the benchmarks list them: by backend, then dtype (f32, bf16), then direction (fwd, bwd).
inline void expand_fwd_bwd(const std::string& op, const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::bwd}) out.push_back(Problem{op, be, t, d, args});
}

// The seed of a problem's inputs less its `impl` arg, for a family with several implementations on
// one backend: they all compute on the same numbers.
inline std::uint64_t seed_without_impl(const Problem& p) {
  Problem q = p;
  q.args.erase(std::remove_if(q.args.begin(), q.args.end(), [](const Arg& a) { return a.key == "impl"; }),
               q.args.end());
  return q.seed();
}

}  // namespace hotops
