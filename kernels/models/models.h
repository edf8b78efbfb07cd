// The models family: whole training and inference steps of the CPU-vs-GPU studies' dense models
// (dense layers y = x.W + b, ReLU between, logits out), chained from hotops' building blocks (GEMMs, a
// fused softmax cross-entropy, ReLU backward with the bias gradient, one flat AdamW pass), on the CPU
// (oneDNN matmuls + OpenMP loops, hand-written loops for tiny layers) and on CUDA (cublasLt +
// hand-written kernels). Directions, the flat parameter buffer and bf16 mixed precision:
// docs/models.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/verify.h"
#include "kernels/adamw/adamw.h"
#include "kernels/loss/loss.h"
#include "kernels/matmul/matmul.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::models {

// A model of the CPU-vs-GPU studies: its layer widths, input first, classes last.
struct Model {
  std::string name;
  std::vector<std::int64_t> widths;  // {in, hidden..., classes}
  std::vector<std::int64_t> batches; // benchmarked batch sizes
};
const std::vector<Model>& models();

// The entry of a model family's list `all` named `name`; a hotops::Error (`unknown` + name) when none is.
template <class Entry>
const Entry& entry_named(const std::vector<Entry>& all, const std::string& name, const std::string& unknown) {
  for (const Entry& e : all)
    if (e.name == name) return e;
  throw Error(unknown + name);
}
const Model& model_named(const std::string& name);  // throws hotops::Error when unknown

// How a step is run and timed (the problem's optional last arg).
enum class Variant {
  plain,    // CPU: all threads; CUDA: device time of the step, the batch already on the device
  threads,  // CPU: threads:T
  e2e,      // CUDA: host time of the step as a program pays it: batch H2D, launches, result D2H, sync
  graph,    // CUDA train: as e2e, the device part replayed as one CUDA graph captured at setup
};

// What every model problem's name says, checked the same way by every model family: op
// `model.<name>`, f32 (or bf16 where the family passes `allow_bf16`), infer or train, a positive batch, and at most one variant arg among those the
// family has (threads:T on the CPU, e2e:1 on CUDA, graph:1 for CUDA train when `has_graph`, gpus:G for
// a data-parallel CUDA train step).
struct StepArgs {
  std::string model;  // the op less "model."
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  Direction dir = Direction::infer;
  std::int64_t batch = 1;
  Variant variant = Variant::plain;
  int threads = 0;  // threads:T only
  int gpus = 0;     // gpus:G only (a data-parallel CUDA train step, data_parallel.h; batch is per GPU)
};
StepArgs step_args(const Problem& p, const std::string& family, bool has_graph, bool allow_bf16 = false);
// The seed of a step's inputs and parameters: the problem's name less its backend and its variant
// arg (threads:T, e2e:1, graph:1), so that every way of running one step computes on the same
// numbers and can share one reference (shared_reference, below).
std::uint64_t step_seed(const Problem& p);

// Copies what a model family's Shape takes from its StepArgs as is (all but the model's name).
template <class Shape>
void copy_step_args(const StepArgs& a, Shape& s) {
  s.backend = a.backend;
  s.dtype = a.dtype;
  s.dir = a.dir;
  s.batch = a.batch;
  s.variant = a.variant;
  s.threads = a.threads;
  s.gpus = a.gpus;
}

// Every problem of one model at one batch, as every model family lists them: infer and train; on the
// CPU all threads and each of `thread_sweep`; on CUDA plain and e2e:1, and graph:1 for train when
// `has_graph`; each in f32, and in bf16 too when `with_bf16`.
void expand_step_problems(const std::string& model, std::int64_t batch, const std::vector<int>& thread_sweep,
                          bool has_graph, std::vector<Problem>& out, bool with_bf16 = false);
constexpr int kThreadSweep[] = {1, 4, 8};  // the CPU thread sweep of the benchmark problems
inline std::vector<int> thread_sweep() { return {std::begin(kThreadSweep), std::end(kThreadSweep)}; }
// Why a threads:T problem cannot run on this machine ("" when it can): T beyond its cores.
std::string threads_reason(const StepArgs& a);

// Verification helpers shared by the model families: max|out - ref| / scale against tol (the message
// names `what` and the worst index), the root mean square, and AdamW's first step from p0 (with the
// start's m and v and the gradients g the step used) against the change the step made to params.
Check within(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref, double scale,
             double tol);
double rms(const std::vector<double>& v);
// rms(out - ref) / scale against tol (a non-finite error fails): the bf16 bounds' check that bf16's
// per-element rounding mostly cancels in and a systematic slip does not.
Check rms_within(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref, double scale,
                 double tol);
// The same three over the n elements at `out` and `ref`: a tensor of a flat buffer, without a copy.
Check within(const std::string& what, const double* out, const double* ref, std::size_t n, double scale, double tol);
double rms(const double* v, std::size_t n);
Check rms_within(const std::string& what, const double* out, const double* ref, std::size_t n, double scale, double tol);
// The same two checks (max and rms) over n elements that `fill(at, k, out, ref)` writes k at a time
// (elements at to at + k, at most kCheckChunk), so that no array of n doubles is made: keras_cnn's
// dense weight has 58M elements. The max check's message names the element's index among the n;
// rms_tol 0 asks for no rms check (Checks::rms stays an empty, passing Check).
constexpr std::size_t kCheckChunk = std::size_t(1) << 20;
struct Checks {
  Check max, rms;
};
Checks within_by_chunks(const std::string& what, std::size_t n, double scale, double tol, double rms_tol,
                        const std::function<void(std::size_t at, std::size_t k, double* out, double* ref)>& fill);
// Elements [from, from + n) of a buffer as doubles (n = 0: to the end), and a slice of a vector.
std::vector<double> as_doubles(const HostBuffer& b, std::size_t from = 0, std::size_t n = 0);
// A verification batch that repeats with `period`: sample b (each `sample_bytes` of t) becomes a copy
// of sample b % period, for every b from period to batch - 1.
void repeat_samples(HostBuffer& t, std::size_t sample_bytes, std::int64_t period, std::int64_t batch);
// The seeded start of a parameter tensor: n values uniform in [lo, hi) (HostBuffer::fill_uniform's
// `seed` and `stream`) at `at` of the flat f32 parameters.
void fill_uniform_at(HostBuffer& params, std::size_t at, std::int64_t n, std::uint64_t seed, std::uint64_t stream, float lo,
                     float hi);
// AdamW's moments at the start: m = v = 0, `n` f32 each.
void zero_moments(HostBuffer& m, HostBuffer& v, std::size_t n);
std::vector<double> slice(const std::vector<double>& v, std::size_t at, std::size_t n);
Check adamw_first_step(const HostBuffer& p0, const HostBuffer& g, const HostBuffer& m0,
                       const HostBuffer& v0, const HostBuffer& params, std::size_t count);

// A step's bounds, against rms(ref): the output and every gradient tensor by their largest error
// and, for bf16, their rms error too (the loss relative to itself).
struct StepBounds {
  double y, loss, grad;
  double y_rms = 0, grad_rms = 0;  // bf16 only: rms(out - ref) / rms(ref)
};
// within(), and for bf16 rms_within() too.
Check close_to(bool bf16, const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
               double tol, double rms_tol);

// The check of one step of a batch that repeats with `period` (sample b is sample b % period), from
// one reference per distinct sample (R: y, loss, grad): infer, the output sample by sample (`per`
// elements each); train, the loss and each gradient tensor against the references' means weighted by
// how often each sample occurs in the batch, and AdamW's first step from the gradients computed.
template <class R, class Layout, class Start, class Out>
Check verify_periodic_step(const std::vector<R>& refs, std::int64_t period, std::int64_t batch, std::size_t per, bool train,
                           bool bf16, const StepBounds& bound, const Layout& l, const Start& start, const Out& out) {
  if (!train) {
    std::vector<double> yo = as_doubles(out.y), yr(yo.size());
    for (std::size_t i = 0; i < yr.size(); ++i) yr[i] = refs[(i / per) % static_cast<std::size_t>(period)].y[i % per];
    return close_to(bf16, "y", yo, yr, bound.y, bound.y_rms);
  }
  double loss = 0;
  std::vector<double> grad(l.total, 0.0);
  const double w = 1.0 / static_cast<double>(batch);
  for (std::int64_t b = 0; b < batch; ++b) {
    const R& r1 = refs[static_cast<std::size_t>(b % period)];
    loss += w * r1.loss;
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] += w * r1.grad[i];
  }
  Check c = within("loss", {static_cast<double>(out.loss)}, {loss}, std::max(std::fabs(loss), 1e-30), bound.loss);
  const std::vector<double> g = as_doubles(out.grads);
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, n] = l.tensors[k];
    c.merge(close_to(bf16, "d" + l.names[k], slice(g, at, n), slice(grad, at, n), bound.grad, bound.grad_rms),
            "d" + l.names[k]);
  }
  c.merge(adamw_first_step(start.params, out.grads, start.m, start.v, out.params, l.total), "step");
  return c;
}

// What a model step's problem says besides its model (the model families' Shapes start with it).
struct StepKind {
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;          // f32 or bf16 (mixed precision: docs/models.md)
  Direction dir = Direction::infer;  // infer or train
  std::int64_t batch = 1;
  Variant variant = Variant::plain;
  int threads = 0;  // threads:T only
  int gpus = 0;     // gpus:G only: one of G data-parallel replicas, batch per GPU (data_parallel.h)
  bool train() const { return dir == Direction::train; }
  bool bf16() const { return dtype == DType::bf16; }
};

struct Shape : StepKind {
  std::string model;
  std::vector<std::int64_t> widths;

  std::size_t layers() const { return widths.size() - 1; }
  std::int64_t in(std::size_t l) const { return widths[l]; }       // layer l's input width
  std::int64_t out(std::size_t l) const { return widths[l + 1]; }  // layer l's output width
  std::int64_t classes() const { return widths.back(); }
};
Shape shape_of(const Problem& p);

// Where each tensor lies in the flat parameter buffer (offsets in floats).
constexpr std::size_t kAlignFloats = 64;
struct ParamLayout {
  std::vector<std::size_t> w, b;  // per layer: W [in, out] row-major, b [out]
  std::size_t total = 0;          // floats, padding included (a multiple of kAlignFloats)
  std::int64_t parameters = 0;    // the model's parameter count, padding excluded
};
ParamLayout param_layout(const std::vector<std::int64_t>& widths);

// The GEMMs of dense layer k (a [B, in] . W [in, out] + b, W stored [in, out] row-major: matmul's B
// as stored) as the matmul family's shapes, M = the batch, K = in, N = out:
//   forward_gemm      y = a . W + b (addmm fwd), the ReLU after the bias on every layer but the last;
//   weight_grad_gemm  dW = a^T . dz (mm bwd_weight), written f32 (bf16: for the f32 master weights);
//   data_grad_gemm    da = dz . W^T (mm bwd_data).
matmul::Shape forward_gemm(const Shape& s, std::size_t k);
matmul::Shape weight_grad_gemm(const Shape& s, std::size_t k);
matmul::Shape data_grad_gemm(const Shape& s, std::size_t k);
// The ReLU backward of hidden layer k with its bias gradient (pointwise relu_dbias over [batch, out]):
// dz = da * (a > 0) in place, db_k = colsum(dz).
pointwise::Shape relu_dbias_shape(const Shape& s, std::size_t k);
// Layer k's bias (and ReLU on every layer but the last) after a GEMM without that epilogue
// (pointwise relu_bias over [batch, out], in place).
pointwise::Shape relu_bias_shape(const Shape& s, std::size_t k);

// Places a tensor of n floats at the end of a flat parameter buffer, on a kAlignFloats boundary:
// returns its offset and grows `total` (padding included) and `parameters` (padding excluded).
inline std::size_t place_aligned(std::size_t& total, std::int64_t& parameters, std::int64_t n) {
  const std::size_t at = total;
  total += (static_cast<std::size_t>(n) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  parameters += n;
  return at;
}

// The AdamW hyperparameters of every train problem: PyTorch's defaults with wd 0.01.
inline adamw::Hyper hyper() { return adamw::Hyper{}; }

// The learnable synthetic task and the model's starting point, pure functions of the seed:
// x uniform in [-1, 1); label = argmax of a fixed random linear teacher map of x; parameters like
// PyTorch's nn.Linear init (W and b uniform in +-1/sqrt(in)), padding zero; m = v = 0.
struct State {
  HostBuffer x;                     // [batch, in] in the problem's dtype (bf16 values are what the reference sees)
  std::vector<std::int32_t> labels; // [batch]
  HostBuffer params, m, v;          // flat, ParamLayout
};
State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed);
void init_params(const Shape& s, const ParamLayout& l, std::uint64_t seed, HostBuffer& params);

// The reference in double: forward (logits), and for train the loss and the flat gradients (same
// layout as the parameters). `tie_hidden`, when given, holds the implementation's post-ReLU hidden
// activations [batch, width] per hidden layer: where the reference's pre-activation is zero up to
// the implementation's rounding (|z| <= tie_rel x sum |terms|), the ReLU is decided as the
// implementation decided (see models.cpp, verification).
struct Reference {
  std::vector<double> logits;  // [batch, classes]
  double loss = 0;
  std::vector<double> grad;    // flat, train only
  // Per gradient element, the sum of its terms' squares (sum over the batch of dz^2 for a bias,
  // (a dz)^2 for a weight): what the rounding errors of the reduction grow with, also where the
  // terms cancel and the gradient itself is far smaller. Train only.
  std::vector<double> grad_terms_sq;
};
Reference reference(const std::vector<std::int64_t>& widths, const ParamLayout& l, const std::vector<double>& params,
                    const std::vector<double>& x, const std::vector<std::int32_t>& labels, std::int64_t batch,
                    bool backward, const std::vector<const float*>& tie_hidden = {}, double tie_rel = 1e-5);

// What one implementation produced in one verified run, in host memory.
struct Outcome {
  HostBuffer logits;                    // infer (f32 or bf16)
  float loss = 0;                       // train
  HostBuffer grads, params;             // train: gradients and the parameters after the step (f32)
  std::vector<HostBuffer> hidden;       // train: post-ReLU hidden activations (f32 or bf16), for the ReLU ties
};
// Compares one run from the seeded start (step 1) with the reference (see models.cpp for the bounds).
Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out);

// A step's reference is computed once per process and shared by the ways of running it
// (hotops::shared_reference, verify.h): they start from the same numbers (step_seed) and are listed
// one after another.
using hotops::shared_reference;
using hotops::shared_reference_computations;
// The key of a step's reference: its model, dtype, direction and batch, and a hash of the contents of
// the start it runs from (parameters, batch, ...), so that a caller that verifies from a start of its
// own never gets another start's reference.
std::string reference_key(const std::string& model, DType dtype, Direction dir, std::int64_t batch,
                          std::initializer_list<const void*> data, std::initializer_list<std::size_t> bytes);
// The same over buffers given as (data, bytes) pairs (a list whose length the step decides).
std::string reference_key(const std::string& model, DType dtype, Direction dir, std::int64_t batch,
                          const std::vector<std::pair<const void*, std::size_t>>& buffers);

// Whether `copy` (bf16 bits) is `master` rounded to bf16, element for element over [0, n): a failed
// Check names the first element that differs.
Check bf16_copy_of(const float* master, const std::uint16_t* copy, std::size_t n);
// The same over the elements [from, n) of device memory (synchronises).
Check bf16_copy_of(const gpu::DeviceBuffer& master, const gpu::DeviceBuffer& copy, std::size_t n, std::size_t from = 0);

// The cases' common extras: the loss of the last train step, and for a bf16 step whether the bf16
// copy of the f32 master that its GEMMs read is the master rounded to bf16, as the AdamW step leaves
// it (train) or the cast at the start made it (infer) (ok for a step without one). Both synchronise
// on CUDA.
class ModelCase : public Case {
 public:
  virtual double last_loss() = 0;
  virtual Check bf16_copy_check() { return {}; }
};

// A step case for `p`'s dtype, each a ModelCase (or a family's subclass `Base`): Step<Bf16> for bf16
// (Bf16: the backend's bf16 storage type), Step<float> for f32.
template <template <class> class Step, class Bf16, class Base = ModelCase>
std::unique_ptr<Base> make_step_case(const Problem& p) {
  if (p.dtype == DType::bf16) return std::make_unique<Step<Bf16>>(p);
  return std::make_unique<Step<float>>(p);
}

// A model family's name, CPU check and backends' factories, as an op family's, with ModelCase factories.
using ModelFamily = BackendFamily<ModelCase>;

// Declares, in a model family's header, its entry points: make_cpu, the CPU's support check
// `cpu_reason` ("" when the CPU can run the problem), make_cuda (defined with CUDA only) and family().
#define HOTOPS_MODEL_ENTRY_POINTS(cpu_reason)                                                 \
  std::unique_ptr<::hotops::models::ModelCase> make_cpu(const ::hotops::Problem& p);  \
  std::string cpu_reason(const ::hotops::Problem& p);                                 \
  std::unique_ptr<::hotops::models::ModelCase> make_cuda(const ::hotops::Problem& p); \
  const ::hotops::Family& family()

// A model family's benchmark problems: each of `ms` (each with a name and its batches) at its
// batches, or at `asked` (--hotops_batch) where not empty, through expand_step_problems in f32 and bf16.
template <class Models>
std::vector<Problem> step_problems(const Models& ms, const std::vector<std::int64_t>& asked,
                                   const std::vector<int>& thread_sweep, bool has_graph) {
  return per_shape_and_batch(ms, asked, [&](const auto& m, std::int64_t b, std::vector<Problem>& out) {
    expand_step_problems(m.name, b, thread_sweep, has_graph, out, /*with_bf16=*/true);
  });
}

// Why this CPU cannot run the problem ("" when it can): for bf16, oneDNN's refusal of a bf16 matmul
// that one of the case's oneDNN layers needs (the matmul plans' loops take GEMMs below
// matmul::kCpuLoopMacs without oneDNN).
HOTOPS_MODEL_ENTRY_POINTS(cpu_bf16_reason);

}  // namespace hotops::models
