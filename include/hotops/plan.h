// Plans: an op set up once for one problem and run on tensors its caller owns; and the one op case
// that every op family's benchmark is (its buffers, seeded inputs, the plan, one verification).
//
// A plan makes every descriptor, algorithm choice and workspace when it is built; `run` then works
// on the pointers it is given: host memory on the CPU (complete on return), device memory on CUDA
// (queued on gpu::stream()). A model step holds the plans of its ops and calls them on its own
// buffers; the op benchmark calls the same plan on the buffers of a PlanCase.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/op_family.h"

namespace hotops {

// The plan of one problem of an op whose tensors are named by `Args` (a family's struct of pointers).
template <class Args>
class Plan {
 public:
  virtual ~Plan() = default;
  virtual void run(const Args& a) = 0;
  // The library and algorithm that does the work, e.g. "cublasLt algo 21 tile 256x128".
  virtual std::string label() const = 0;
  // CUDA: whether run() can be captured in a CUDA graph (no host synchronisation inside).
  virtual bool capturable() const { return true; }
  // CUDA: whether run() includes what a user's program pays (transfers, launches) and returns
  // only when the work is complete; it is then timed by the host's clock (see Case::host_timed).
  virtual bool host_timed() const { return false; }
  // CUDA plans run by several ranks together: see Case::align.
  virtual void align() {}
};

// The plan for `s` on backend `b`, from the family's CPU and CUDA plan factories; `cuda` is
// HOTOPS_CUDA_FACTORY(the CUDA factory) (a CUDA problem in a build without CUDA: unsupported).
template <class P, class Shape>
std::unique_ptr<P> plan_on_backend(
    Backend b, const Shape& s, std::unique_ptr<P> (*cpu)(const Shape&),
    typename std::common_type<std::unique_ptr<P> (*)(const Shape&)>::type cuda) {  // not deduced: may be nullptr
  if (b == Backend::cpu) return cpu(s);
  if (!cuda) throw Error("no CUDA backend in this build", ErrorKind::unsupported);
  return cuda(s);
}

// Declares, in a family's header, its `Plan` (a hotops::Plan of its `Args`) and the plan factories
// of its `Shape`: make_cpu_plan and make_cuda_plan (the family defines them; the CUDA one only where
// CUDA is built) and make_plan, the one for a backend.
#define HOTOPS_PLAN_FACTORIES(Shape, Args)                                                      \
  std::unique_ptr<::hotops::Plan<Args>> make_cpu_plan(const Shape& s);                          \
  std::unique_ptr<::hotops::Plan<Args>> make_cuda_plan(const Shape& s);                         \
  inline std::unique_ptr<::hotops::Plan<Args>> make_plan(const Shape& s, ::hotops::Backend b) { \
    return ::hotops::plan_on_backend(b, s, make_cpu_plan, HOTOPS_CUDA_FACTORY(make_cuda_plan)); \
  }                                                                                             \
  using Plan = ::hotops::Plan<Args>

// Test only: a bug planted between every PlanCase and its plan, so that tests can show that each
// family's verification catches it (bench: HOTOPS_TEST_MUTATION=<name>). Off (empty) by default.
//   shift_output: every output lands 16 bytes off (an indexing error by one vector);
//   zero_input:   the last input the op reads is all zeros (a dropped term: the bias, dy, ...);
//   swap_inputs:  the first two inputs of equal size are swapped (an operand mixed up or transposed).
const std::vector<std::string>& test_mutation_names();
void set_test_mutation(const std::string& name);  // throws an Error for an unknown name
const std::string& test_mutation();

// The memory a PlanCase's plan runs on. A family's `bind` names each of its host tensors here and
// gets the pointer to pass in its Args: the host buffer itself on the CPU, a device copy on CUDA.
class Binder {
 public:
  explicit Binder(Backend backend) : backend_(backend) {}
  Binder(const Binder&) = delete;
  Binder& operator=(const Binder&) = delete;

  // Where the plan runs (an op whose inputs come from one of its own runs at setup needs to know).
  Backend backend() const { return backend_; }

  // An input: read, never written (on CUDA uploaded once, here).
  const void* in(const HostBuffer& h);
  // An input of integer indices (targets, token ids, offsets) held in a HostBuffer's bytes: as
  // `in`, but the test mutations leave it alone (a mixed-up index reads out of bounds; it does not
  // compute a wrong number for the check to catch).
  const void* indices(const HostBuffer& h);
  // An output: poisoned before the verification run, so that an element the op fails to write
  // shows, and read back into `h` after it.
  void* out(HostBuffer& h);
  // A tensor the op updates in place (e.g. AdamW's parameters): starts as `initial` and is set to
  // it again before the verification run; read back into `result` after it.
  void* inout(const HostBuffer& initial, HostBuffer& result);
  // Scratch that the op needs but nobody checks (not poisoned, not read back).
  void* scratch(std::size_t bytes);
  // Host memory on either backend (an op that reads or writes the host's memory, e.g. a copy to
  // or from the GPU): the buffer itself; an output is poisoned before the verification run.
  const void* host_in(const HostBuffer& h) { return h.data(); }
  void* host_out(HostBuffer& h);

  void before_check();  // outputs poisoned, in-out tensors reset
  void after_check();   // waits for the run and reads the outputs back
  // Applies test_mutation() to the pointers bound so far: call once, after the last bind.
  template <class Args>
  Args mutated(Args a) {
    mutate(reinterpret_cast<const void**>(&a), sizeof(Args) / sizeof(void*));
    return a;
  }

 private:
  void mutate(const void** pointers, std::size_t n);
  struct Slot {
    HostBuffer* result = nullptr;          // out and inout: where the verification run's values go
    bool on_host = false;                  // host_out: `result` is the tensor itself
    const HostBuffer* initial = nullptr;   // inout: the values it starts from
    gpu::DeviceBuffer device;              // CUDA: the tensor
    HostBuffer host;                       // CPU: scratch, or an input or output that a mutation moved
    const void* bound = nullptr;           // the pointer handed to the op
    std::size_t bytes = 0;
    bool input = false;
  };
  Backend backend_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

// The benchmark case of every op family: one problem's host tensors (seeded inputs, outputs), the
// plan, and the verification that every op shares (poison the outputs, run once, compare with the
// reference). `Op` is a family's description of its op:
//   using Shape;  using Args;  using Io;   (Io: the host tensors, the family's inputs and outputs)
//   static Shape shape(const Problem&);
//   static Io io(const Shape&, std::uint64_t seed);       // inputs seeded, outputs allocated
// (the seed is the problem's less its `impl` arg: every implementation computes on the same numbers)
//   static Args bind(const Shape&, Io&, Binder&);           // each tensor named in, out or inout
//   static std::unique_ptr<Plan<Args>> plan(const Shape&, Backend);
//   static Check check(const Shape&, Io&);                 // the outputs against the reference
// and where the op needs them:
//   static int check_runs(const Shape&);          // runs before the check (default 1; e.g. AdamW's steps)
//   static void before_check(const Shape&, Io&, Plan<Args>&, const Args&);
//       // more to do before them: e.g. pinned memory poisoned, the LSTM's training forward run again
//       // (its backward changes the state the forward saved)
template <class Op, class = void>
struct CheckRuns {
  static int of(const typename Op::Shape&) { return 1; }
};
template <class Op>
struct CheckRuns<Op, std::void_t<decltype(Op::check_runs(std::declval<const typename Op::Shape&>()))>> {
  static int of(const typename Op::Shape& s) { return Op::check_runs(s); }
};
template <class Op, class = void>
struct BeforeCheck {
  static void run(const typename Op::Shape&, typename Op::Io&, Plan<typename Op::Args>&, const typename Op::Args&) {}
};
template <class Op>
struct BeforeCheck<Op, std::void_t<decltype(Op::before_check(std::declval<const typename Op::Shape&>(),
                                                             std::declval<typename Op::Io&>(),
                                                             std::declval<Plan<typename Op::Args>&>(),
                                                             std::declval<const typename Op::Args&>()))>> {
  static void run(const typename Op::Shape& s, typename Op::Io& io, Plan<typename Op::Args>& plan,
                  const typename Op::Args& a) {
    Op::before_check(s, io, plan, a);
  }
};

template <class Op>
class PlanCase final : public Case {
 public:
  explicit PlanCase(const Problem& p)
      : shape_(Op::shape(p)),
        plan_(Op::plan(shape_, p.backend)),
        io_(Op::io(shape_, seed_without_impl(p))),
        binder_(p.backend),
        args_(binder_.mutated(Op::bind(shape_, io_, binder_))) {}

  void run() override { plan_->run(args_); }
  Check verify() override {
    binder_.before_check();
    BeforeCheck<Op>::run(shape_, io_, *plan_, args_);
    for (int i = CheckRuns<Op>::of(shape_); i > 0; --i) run();
    binder_.after_check();
    return Op::check(shape_, io_);
  }
  std::string label() const override { return plan_->label(); }
  bool capturable() const override { return plan_->capturable(); }
  bool host_timed() const override { return plan_->host_timed(); }
  void align() override { plan_->align(); }

 private:
  typename Op::Shape shape_;
  std::unique_ptr<Plan<typename Op::Args>> plan_;
  typename Op::Io io_;
  Binder binder_;
  typename Op::Args args_;
};

// The case factory of a family whose benchmark is a PlanCase<Op>, on either backend.
template <class Op>
std::unique_ptr<Case> make_plan_case(const Problem& p) {
  return std::make_unique<PlanCase<Op>>(p);
}

// A family whose every problem is a PlanCase<Op>, on either backend; `cpu_reason` as OpFamily's.
template <class Op>
class PlanFamily : public OpFamily {
 public:
  PlanFamily(std::string name, Reason cpu_reason)
      : OpFamily(std::move(name), cpu_reason, make_plan_case<Op>, HOTOPS_CUDA_FACTORY(make_plan_case<Op>)) {}
};

// The Op of a family whose host tensors are its `Inputs` and `Outputs` (a struct of them, or one
// HostBuffer): Io holds one of each, seeded and allocated by the family's make_inputs(shape, seed)
// and make_outputs(shape) (make_output where `Outputs` is one HostBuffer); the plan is its
// make_plan(shape, backend) and the check its verify(shape, in, out). Those functions are the
// family's own, found in the namespace of its `Shape`. A family's Op derives from this, adds
// shape() and bind(), and defines again any member where its op differs.
template <class ShapeT, class ArgsT, class Inputs, class Outputs>
struct OpOf {
  using Shape = ShapeT;
  using Args = ArgsT;
  struct Io {
    Inputs in;
    Outputs out;
  };
  static Io io(const Shape& s, std::uint64_t seed) {
    if constexpr (std::is_same_v<Outputs, HostBuffer>)
      return {make_inputs(s, seed), make_output(s)};
    else
      return {make_inputs(s, seed), make_outputs(s)};
  }
  static std::unique_ptr<Plan<Args>> plan(const Shape& s, Backend b) { return make_plan(s, b); }
  static Check check(const Shape& s, const Io& io) { return verify(s, io.in, io.out); }
};

}  // namespace hotops
