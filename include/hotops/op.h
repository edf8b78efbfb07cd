// The op interface every family implements, and the one registry that bench/ and test/ walk.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "hotops/problem.h"
#include "hotops/verify.h"

namespace hotops {

// One problem on one backend, set up and ready to run. Construction does everything that is
// outside timing: allocation, seeded input init, descriptors, plans, algorithm choice, workspace.
class Case {
 public:
  virtual ~Case() = default;
  // One execution. CPU: returns when the result is complete. CUDA: enqueues on gpu::stream().
  virtual void run() = 0;
  // Poisons the outputs, runs once, and compares them with the reference.
  virtual Check verify() = 0;
  // The library and algorithm that does the work, e.g. "cublasLt algo 21 tile 256x128".
  virtual std::string label() const = 0;
  // CUDA cases: whether run() can be captured in a CUDA graph (no host synchronisation inside).
  virtual bool capturable() const { return true; }
  // CUDA cases: whether run() is timed by the host's clock instead of CUDA events: end-to-end
  // variants that include what a user's program pays (transfers, launches), whose run() returns only
  // when the work is complete (it synchronises).
  virtual bool host_timed() const { return false; }
  // CUDA cases run by several ranks together (collectives): enqueues on gpu::stream() what brings
  // the ranks' GPUs together before a timed sample (a barrier between them), so that the sample
  // does not time one rank waiting for another to arrive. Nothing for a case of one process.
  virtual void align() {}
};

// One op family (e.g. matmul: mm, addmm, bmm): its problems, their work, their implementations.
class Family {
 public:
  virtual ~Family() = default;
  virtual std::string name() const = 0;
  // The benchmark problems: named shapes from real models; `batches`, when not empty, replaces
  // the batch axis of every problem that has one (--hotops_batch).
  virtual std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const = 0;
  // Small and odd shapes covering every op x backend x dtype x direction, for the unit tests.
  virtual std::vector<Problem> test_problems() const = 0;
  virtual Work work(const Problem& p) const = 0;
  // Empty when this machine can run the problem, else the reason it cannot (checked before setup).
  virtual std::string unsupported_reason(const Problem& p) const { return ""; }
  virtual std::unique_ptr<Case> make(const Problem& p) const = 0;
};

// The CUDA factory of a family, or nullptr in a build without CUDA (make_cuda declared, not defined).
#ifdef HOTOPS_HAVE_CUDA
#define HOTOPS_CUDA_FACTORY(f) (f)
#else
#define HOTOPS_CUDA_FACTORY(f) nullptr
#endif

[[noreturn]] void throw_no_cuda_backend(const Problem& p);  // the unsupported Error below

// Makes the case with its backend's factory; a CUDA problem in a build without CUDA is an
// unsupported Error. The factories return a Case or a family's own subclass of it (the models'
// ModelCase); `cuda` is nullptr where HOTOPS_CUDA_FACTORY has no CUDA.
template <class C>
std::unique_ptr<Case> make_on_backend(const Problem& p, std::unique_ptr<C> (*cpu)(const Problem&),
                                      typename std::common_type<std::unique_ptr<C> (*)(const Problem&)>::type cuda) {
  if (p.backend == Backend::cpu) return cpu(p);
  if (!cuda) throw_no_cuda_backend(p);
  return cuda(p);
}

// Why the problem's backend cannot run it here ("" when it can): the CPU's own reason from
// `cpu_reason` (e.g. a oneDNN probe), or the GPU's absence.
std::string backend_unsupported_reason(const Problem& p, std::string (*cpu_reason)(const Problem&));

// Every family hotops has: the op families by name, then the model families by name. A family is
// in it by registering itself (HOTOPS_REGISTER_FAMILY in its own folder): no list to keep elsewhere.
const std::vector<const Family*>& families();

// Adds the family that `get` returns to families(); use HOTOPS_REGISTER_FAMILY, once per family,
// at namespace scope in the family's own .cpp file.
bool register_family(const Family& (*get)());
#define HOTOPS_REGISTER_FAMILY(get) \
  [[maybe_unused]] static const bool hotops_family_registered_ = ::hotops::register_family(get)

// Defines a family's family(), its one `FamilyClass`, and registers it: at namespace scope in the
// family's own .cpp file, in place of a hand-written family() and HOTOPS_REGISTER_FAMILY.
#define HOTOPS_DEFINE_FAMILY(FamilyClass) \
  const ::hotops::Family& family() {      \
    static const FamilyClass f;           \
    return f;                             \
  }                                       \
  HOTOPS_REGISTER_FAMILY(family)

}  // namespace hotops
