// The models family: the CPU-vs-GPU studies' dense models, names, work, the learnable task and verification.
//
// Names: model.<name>/<cpu|cuda>/<f32|bf16>/<infer|train>/batch:B, then at most one variant arg:
//   threads:T  CPU, T OpenMP threads (oneDNN follows OpenMP) instead of all of them;
//   e2e:1      CUDA, host time of the step as a user's program pays it: the batch copied from
//              pageable host memory, the kernels launched one by one, the loss (train) or the logits
//              (infer) copied back, cudaStreamSynchronize;
//   graph:1    CUDA train, as e2e with the device part of the step one CUDA graph captured at setup.
// Without a variant arg a CUDA step is device time (the batch already on the device), the same
// problem as the CPU's all-threads one: the two names differ only in the backend segment.
// bf16 is mixed precision as torch.autocast runs it (models.h); every problem exists in both dtypes.
#include "kernels/models/models.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>

#include "hotops/check.h"
#include "kernels/models/data_parallel.h"

namespace hotops::models {
namespace {


// FLOPs per parameter of the AdamW step (adamw.cpp's count: each operation of the formula once).
constexpr double kAdamwFlopsPerParam = 14;

std::string cpu_reason(const Problem& p) {
  if (std::string why = threads_reason(step_args(p, "models", true, true)); !why.empty()) return why;
  return cpu_bf16_reason(p);
}

class ModelsFamily final : public DataParallelModelFamily<> {
 public:
  ModelsFamily() : DataParallelModelFamily("models", cpu_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return steps_and_data_parallel_problems(models(), batches);
  }

  std::vector<Problem> test_problems() const override {
    // Tiny batches (CI has 2 cores): every model, both backends, both directions, every variant.
    std::vector<Problem> out;
    expand_step_problems("mlp_tiny", 3, {1}, true, out, true);
    expand_step_problems("mlp_tiny", 10, {}, true, out, true);
    expand_step_problems("mlp_mnist", 5, {}, true, out, true);
    expand_step_problems("classifierdl", 7, {2}, true, out, true);
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    add_data_parallel_test_problems("mlp_tiny", 3, out);
    add_data_parallel_test_problems("mlp_mnist", 5, out);
    return out;
  }

  // FLOPs: the GEMMs, 2 x batch x in x out per layer forward; bias adds, ReLU and the loss (under
  // 1% of it) are not counted. train: 3x the forward GEMMs (forward, data and weight gradients; the
  // first layer's data gradient, which is not needed, is not computed but counted, as is standard)
  // plus AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the parameters and x and writes the logits;
  // train reads x and the labels, reads and writes the parameters and AdamW's m and v. bf16 keeps
  // f32 parameters (the per-step bf16 copy is not counted: it could be fused away); x and the logits
  // are bf16.
  Work one_gpu_work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const ParamLayout l = param_layout(s.widths);
    const double B = static_cast<double>(s.batch), P = static_cast<double>(l.parameters);
    double macs = 0;
    for (std::size_t k = 0; k < s.layers(); ++k) macs += static_cast<double>(s.in(k) * s.out(k));
    const double fwd = 2 * B * macs;
    const double e = static_cast<double>(dtype_size(s.dtype));
    const double x_bytes = e * B * static_cast<double>(s.widths[0]);
    if (!s.train()) return {fwd, 4 * P + x_bytes + e * B * static_cast<double>(s.classes()), B};
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + x_bytes + 4 * B, B};
  }

};

}  // namespace

const std::vector<Model>& models() {
  static const std::vector<Model> all = {
      // The PyTorch tiny-MLP notebook: the 13 features of the UCI heart-disease data, batch 10 in the
      // notebook; swept up to 4096 to find where the GPU starts to pay.
      {"mlp_tiny", {13, 32, 16, 2}, {10, 64, 256, 1024, 4096}},
      // Max Woolf's benchmarks: Keras' mnist_mlp example (Dense 512 relu, Dropout 0.2, Dense 512 relu,
      // Dropout 0.2, Dense 10 softmax; batch_size 128 in the script he ran). Dropout is left out here.
      {"mlp_mnist", {784, 512, 512, 10}, {128, 1024}},
      // The Spark NLP ClassifierDL study: 768-d BERT sentence embeddings into a dense classifier,
      // batch sizes 32/64/256/1024 as in the study.
      {"classifierdl", {768, 512, 2}, {32, 64, 256, 1024}},
  };
  return all;
}

const Model& model_named(const std::string& name) { return entry_named(models(), name, "models: unknown model "); }

void expand_step_problems(const std::string& model, std::int64_t batch, const std::vector<int>& thread_sweep,
                          bool has_graph, std::vector<Problem>& out, bool with_bf16) {
  const auto args = [batch](const char* key = nullptr, int value = 0) {
    std::vector<Arg> a{{"batch", std::to_string(batch)}};
    if (key) a.push_back({key, std::to_string(value)});
    return a;
  };
  const std::string op = "model." + model;
  std::vector<DType> dtypes{DType::f32};
  if (with_bf16) dtypes.push_back(DType::bf16);
  for (Direction d : {Direction::infer, Direction::train})
    for (DType t : dtypes) {
      out.push_back(Problem{op, Backend::cpu, t, d, args()});
      for (int n : thread_sweep) out.push_back(Problem{op, Backend::cpu, t, d, args("threads", n)});
      out.push_back(Problem{op, Backend::cuda, t, d, args()});
      out.push_back(Problem{op, Backend::cuda, t, d, args("e2e", 1)});
      if (has_graph && d == Direction::train) out.push_back(Problem{op, Backend::cuda, t, d, args("graph", 1)});
    }
}

std::string threads_reason(const StepArgs& a) {
  if (a.variant == Variant::threads && a.threads > omp_get_num_procs())
    return "threads:" + std::to_string(a.threads) + " needs " + std::to_string(a.threads) + " cores; this machine has " +
           std::to_string(omp_get_num_procs());
  return "";
}

// Verification of a scalar or a tensor: max|out - ref| / scale against tol.
namespace {
// within() over out[0, n), whose element 0 is element `first` of what the message names.
Check within_from(const std::string& what, const double* out, const double* ref, std::size_t n, double scale, double tol,
                  std::size_t first) {
  Check c;
  c.tol = tol;
  c.checked = n;
  std::size_t worst = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double e = std::fabs(out[k] - ref[k]) / scale;
    if (!(e <= c.max_err)) c.max_err = std::isfinite(e) ? e : std::numeric_limits<double>::infinity(), worst = k;
  }
  if (!(c.max_err <= tol)) {
    char buf[280];
    std::snprintf(buf, sizeof buf, "%s: max|out-ref|/%.3g = %.3g > tol %.3g at index %zu (out %.9g, ref %.9g)", what.c_str(),
                  scale, c.max_err, tol, first + worst, out[worst], ref[worst]);
    c.ok = false;
    c.message = buf;
  }
  return c;
}

// rms(out - ref) / scale against tol, from the sum of the n squared differences.
Check rms_from(const std::string& what, double sum_sq, std::size_t n, double scale, double tol) {
  Check c;
  c.tol = tol;
  c.checked = n;
  const double e = std::sqrt(sum_sq / static_cast<double>(std::max<std::size_t>(1, n))) / scale;
  c.max_err = std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
  if (!(c.max_err <= tol)) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s: rms(out-ref)/%.3g = %.3g > tol %.3g", what.c_str(), scale, c.max_err, tol);
    c.ok = false;
    c.message = buf;
  }
  return c;
}
}  // namespace

Check within(const std::string& what, const double* out, const double* ref, std::size_t n, double scale, double tol) {
  return within_from(what, out, ref, n, scale, tol, 0);
}

Checks within_by_chunks(const std::string& what, std::size_t n, double scale, double tol, double rms_tol,
                        const std::function<void(std::size_t at, std::size_t k, double* out, double* ref)>& fill) {
  // The chunks in parallel (keras_cnn's 58M gradients are seconds on one core), each thread with a
  // pair of chunk buffers; each chunk's check and squared sum kept, then taken in chunk order, so
  // that the outcome does not depend on the thread count.
  // (An exception cannot leave a parallel region: the first one is kept and thrown after it.)
  const auto chunks = static_cast<std::int64_t>((n + kCheckChunk - 1) / kCheckChunk);
  std::vector<Check> part(static_cast<std::size_t>(chunks));
  std::vector<double> part_sq(static_cast<std::size_t>(chunks), 0.0);
  std::exception_ptr failed;
#pragma omp parallel if (chunks > 1)
  {
    std::vector<double> out(std::min(n, kCheckChunk)), ref(out.size());
#pragma omp for schedule(dynamic)
    for (std::int64_t c = 0; c < chunks; ++c) {
      try {
        const std::size_t at = static_cast<std::size_t>(c) * kCheckChunk, k = std::min(kCheckChunk, n - at);
        fill(at, k, out.data(), ref.data());
        part[static_cast<std::size_t>(c)] = within_from(what, out.data(), ref.data(), k, scale, tol, at);
        double sq = 0;
        if (rms_tol > 0)
          for (std::size_t i = 0; i < k; ++i) sq += (out[i] - ref[i]) * (out[i] - ref[i]);
        part_sq[static_cast<std::size_t>(c)] = sq;
      } catch (...) {
#pragma omp critical(within_by_chunks_failed)
        if (!failed) failed = std::current_exception();
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
  Checks c;
  c.max.tol = tol;
  double sum_sq = 0;
  for (std::size_t i = 0; i < part.size(); ++i) {
    if (i == 0 || !(part[i].max_err <= c.max.max_err)) c.max = part[i];  // the first largest, as within() keeps
    sum_sq += part_sq[i];
  }
  c.max.checked = n;
  if (rms_tol > 0) c.rms = rms_from(what, sum_sq, n, scale, rms_tol);
  return c;
}

Check within(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref, double scale, double tol) {
  return within(what, out.data(), ref.data(), out.size(), scale, tol);
}

Check rms_within(const std::string& what, const double* out, const double* ref, std::size_t n, double scale, double tol) {
  double e2 = 0;
  for (std::size_t k = 0; k < n; ++k) e2 += (out[k] - ref[k]) * (out[k] - ref[k]);
  return rms_from(what, e2, n, scale, tol);
}

Check rms_within(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref, double scale,
                 double tol) {
  return rms_within(what, out.data(), ref.data(), out.size(), scale, tol);
}

double rms(const double* v, std::size_t n) {
  // Sums of fixed blocks in parallel, added in block order: the same value on any thread count.
  constexpr std::size_t kBlock = std::size_t(1) << 16;
  const auto blocks = static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
  std::vector<double> part(static_cast<std::size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (blocks > 16)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t from = static_cast<std::size_t>(b) * kBlock, to = std::min(n, from + kBlock);
    double s = 0;
    for (std::size_t k = from; k < to; ++k) s += v[k] * v[k];
    part[static_cast<std::size_t>(b)] = s;
  }
  double s = 0;
  for (double x : part) s += x;
  return std::sqrt(s / static_cast<double>(std::max<std::size_t>(1, n)));
}

double rms(const std::vector<double>& v) { return rms(v.data(), v.size()); }

std::vector<double> as_doubles(const HostBuffer& b, std::size_t from, std::size_t n) {
  if (n == 0) n = b.count() - from;
  std::vector<double> d(n);
  const auto count = static_cast<std::int64_t>(n);
  if (b.dtype() == DType::f32) {  // most of a step's tensors: the f32 parameters and gradients
    const float* f = b.as<float>() + from;
#pragma omp parallel for schedule(static) if (count > (std::int64_t(1) << 16))
    for (std::int64_t i = 0; i < count; ++i) d[static_cast<std::size_t>(i)] = f[i];
    return d;
  }
#pragma omp parallel for schedule(static) if (count > (std::int64_t(1) << 16))
  for (std::int64_t i = 0; i < count; ++i) d[static_cast<std::size_t>(i)] = b.get(from + static_cast<std::size_t>(i));
  return d;
}

Check close_to(bool bf16, const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
               double tol, double rms_tol) {
  Check c = within(what, out, ref, std::max(rms(ref), 1e-30), tol);
  if (bf16) c.merge(rms_within(what, out, ref, std::max(rms(ref), 1e-30), rms_tol), what + " (rms)");
  return c;
}

void fill_uniform_at(HostBuffer& params, std::size_t at, std::int64_t n, std::uint64_t seed, std::uint64_t stream, float lo,
                     float hi) {
  HOTOPS_CHECK(params.dtype() == DType::f32, "fill_uniform_at: f32 parameters");
  params.fill_uniform_range(at, static_cast<std::size_t>(n), seed, stream, lo, hi);
}

void zero_moments(HostBuffer& m, HostBuffer& v, std::size_t n) {
  m = HostBuffer(DType::f32, n);
  v = HostBuffer(DType::f32, n);
  zero_bytes(m.data(), m.bytes());
  zero_bytes(v.data(), v.bytes());
}

void repeat_samples(HostBuffer& t, std::size_t sample_bytes, std::int64_t period, std::int64_t batch) {
  auto* base = static_cast<std::byte*>(t.data());
  for (std::int64_t b = period; b < batch; ++b)
    std::memcpy(base + static_cast<std::size_t>(b) * sample_bytes, base + static_cast<std::size_t>(b % period) * sample_bytes,
                sample_bytes);
}

std::vector<double> slice(const std::vector<double>& v, std::size_t at, std::size_t n) {
  return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n));
}

Check adamw_first_step(const HostBuffer& p0, const HostBuffer& g, const HostBuffer& m0,
                       const HostBuffer& v0, const HostBuffer& params, std::size_t count) {
  const adamw::Hyper h = hyper();
  const adamw::Corrections first = adamw::corrections(h, 1);
  // Read as f32 where every buffer is (the usual case: no per-element dtype switch), else by get().
  const bool f32 = p0.dtype() == DType::f32 && g.dtype() == DType::f32 && m0.dtype() == DType::f32 &&
                   v0.dtype() == DType::f32 && params.dtype() == DType::f32;
  const auto chunk = [&](auto read, std::size_t at, std::size_t k, double* change, double* ref_change) {
    const auto n = static_cast<std::int64_t>(k);
#pragma omp parallel for schedule(static) if (n > (std::int64_t(1) << 16))
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t i = at + static_cast<std::size_t>(j);
      const double start = read(p0, i);
      adamw::Element e{start, read(m0, i), read(v0, i)};
      adamw::reference_step(h, first, read(g, i), e);
      ref_change[j] = e.p - start;
      change[j] = read(params, i) - start;
    }
  };
  return within_by_chunks("AdamW step (p - p0)", count, h.lr, 1e-3, 0,
                          [&](std::size_t at, std::size_t k, double* change, double* ref_change) {
                            if (f32)
                              chunk([](const HostBuffer& b, std::size_t i) { return static_cast<double>(b.as<float>()[i]); }, at, k,
                                    change, ref_change);
                            else
                              chunk([](const HostBuffer& b, std::size_t i) { return b.get(i); }, at, k, change, ref_change);
                          })
      .max;
}

Check bf16_copy_of(const float* master, const std::uint16_t* copy, std::size_t n) {
  Check c;
  c.checked = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (copy[i] == float_to_bf16(master[i])) continue;
    c.ok = false;
    char at[160];
    std::snprintf(at, sizeof at, "bf16 copy element %zu of %zu is 0x%04x, the master %.9g rounds to 0x%04x", i, n,
                  static_cast<unsigned>(copy[i]), static_cast<double>(master[i]), static_cast<unsigned>(float_to_bf16(master[i])));
    c.message = at;
    break;
  }
  return c;
}

Check bf16_copy_of(const gpu::DeviceBuffer& master, const gpu::DeviceBuffer& copy, std::size_t n, std::size_t from) {
  HostBuffer m(DType::f32, master.bytes() / sizeof(float)), c(DType::bf16, copy.bytes() / sizeof(std::uint16_t));
  gpu::synchronize();
  master.download(m);
  copy.download(c);
  HOTOPS_CHECK(from <= n && n <= m.count() && n <= c.count(), "models: a bf16 copy check beyond its buffers");
  return bf16_copy_of(m.as<float>() + from, c.as<std::uint16_t>() + from, n - from);
}

std::uint64_t step_seed(const Problem& p) {
  if (p.has("gpus")) return step_seed(global_problem(p));  // the global batch's, shared by every replica
  Problem q = p;
  q.args.erase(std::remove_if(q.args.begin(), q.args.end(),
                              [](const Arg& a) { return a.key == "threads" || a.key == "e2e" || a.key == "graph"; }),
               q.args.end());
  return q.seed();
}

std::string reference_key(const std::string& model, DType dtype, Direction dir, std::int64_t batch,
                          std::initializer_list<const void*> data, std::initializer_list<std::size_t> bytes) {
  HOTOPS_CHECK(data.size() == bytes.size(), "reference_key: one size per buffer");
  std::vector<std::pair<const void*, std::size_t>> buffers;
  auto n = bytes.begin();
  for (const void* d : data) buffers.emplace_back(d, *n++);
  return reference_key(model, dtype, dir, batch, buffers);
}

std::string reference_key(const std::string& model, DType dtype, Direction dir, std::int64_t batch,
                          const std::vector<std::pair<const void*, std::size_t>>& buffers) {
  std::string key = model + "/" + dtype_name(dtype) + "/" + direction_name(dir) + "/batch:" + std::to_string(batch);
  for (const auto& [data, bytes] : buffers) {
    // The hash of each 1 MiB chunk (in parallel: a train step's activations are GBs), then of those.
    constexpr std::size_t kChunk = std::size_t(1) << 20;
    const auto chunks = static_cast<std::int64_t>((bytes + kChunk - 1) / kChunk);
    std::vector<std::uint64_t> h(static_cast<std::size_t>(chunks));
    const auto* b = static_cast<const unsigned char*>(data);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::size_t at = static_cast<std::size_t>(c) * kChunk;
      h[static_cast<std::size_t>(c)] = bytes_hash(b + at, std::min(kChunk, bytes - at));
    }
    key += "/" + std::to_string(bytes) + ":" + std::to_string(bytes_hash(h.data(), h.size() * sizeof(h[0])));
  }
  return key;
}

StepArgs step_args(const Problem& p, const std::string& family, bool has_graph, bool allow_bf16) {
  HOTOPS_CHECK(p.op.rfind("model.", 0) == 0, family + ": not a model problem: " + p.name());
  if (allow_bf16)
    HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, family + ": f32 or bf16: " + p.name());
  else
    HOTOPS_CHECK(p.dtype == DType::f32, family + ": only f32 for now: " + p.name());
  HOTOPS_CHECK(p.dir == Direction::infer || p.dir == Direction::train, family + ": infer or train: " + p.name());
  StepArgs a;
  a.model = p.op.substr(6);
  a.backend = p.backend;
  a.dtype = p.dtype;
  a.dir = p.dir;
  a.batch = p.get_int("batch");
  HOTOPS_CHECK(a.batch >= 1, family + ": batch must be positive: " + p.name());
  HOTOPS_CHECK(p.has("threads") + p.has("e2e") + p.has("graph") + p.has("gpus") <= 1,
               family + ": one variant at most: " + p.name());
  if (p.has("gpus")) {
    a.gpus = static_cast<int>(p.get_int("gpus"));
    HOTOPS_CHECK(p.backend == Backend::cuda && p.dir == Direction::train && a.gpus >= 1,
                 family + ": gpus:G is a CUDA train step: " + p.name());
  } else if (p.has("threads")) {
    a.variant = Variant::threads;
    a.threads = static_cast<int>(p.get_int("threads"));
    HOTOPS_CHECK(p.backend == Backend::cpu && a.threads >= 1, family + ": threads:T is a CPU variant: " + p.name());
  } else if (p.has("e2e")) {
    a.variant = Variant::e2e;
    HOTOPS_CHECK(p.backend == Backend::cuda, family + ": e2e is a CUDA variant: " + p.name());
  } else if (p.has("graph")) {
    a.variant = Variant::graph;
    HOTOPS_CHECK(has_graph && p.backend == Backend::cuda && p.dir == Direction::train,
                 family + ": graph is a CUDA train variant" + (has_graph ? "" : " that this family does not have") +
                     ": " + p.name());
  }
  return a;
}

Shape shape_of(const Problem& p) {
  const StepArgs a = step_args(p, "models", true, true);
  Shape s;
  s.model = a.model;
  s.widths = model_named(s.model).widths;
  copy_step_args(a, s);
  return s;
}

namespace {
matmul::Shape layer_gemm(const Shape& s, std::size_t k, matmul::Op op, Direction dir) {
  matmul::Shape g;
  g.op = op, g.dir = dir, g.dtype = s.dtype;
  g.M = s.batch, g.K = s.in(k), g.N = s.out(k);
  return g;
}
}  // namespace

matmul::Shape forward_gemm(const Shape& s, std::size_t k) {
  matmul::Shape g = layer_gemm(s, k, matmul::Op::addmm, Direction::fwd);
  g.relu = k + 1 < s.layers();
  return g;
}

matmul::Shape weight_grad_gemm(const Shape& s, std::size_t k) {
  matmul::Shape g = layer_gemm(s, k, matmul::Op::mm, Direction::bwd_weight);
  g.f32_out = s.bf16();
  return g;
}

matmul::Shape data_grad_gemm(const Shape& s, std::size_t k) { return layer_gemm(s, k, matmul::Op::mm, Direction::bwd_data); }

namespace {
pointwise::Shape dense_pointwise(const Shape& s, std::size_t k, pointwise::Op op, Direction dir) {
  pointwise::Shape r;
  r.op = op, r.dir = dir, r.dtype = s.dtype;
  r.cols = s.out(k);
  r.elements = s.batch * r.cols;
  return r;
}
}  // namespace

pointwise::Shape relu_dbias_shape(const Shape& s, std::size_t k) {
  return dense_pointwise(s, k, pointwise::Op::relu_dbias, Direction::bwd);
}

pointwise::Shape relu_bias_shape(const Shape& s, std::size_t k) {
  pointwise::Shape r = dense_pointwise(s, k, pointwise::Op::relu_bias, Direction::fwd);
  r.relu = k + 1 < s.layers();
  return r;
}

ParamLayout param_layout(const std::vector<std::int64_t>& widths) {
  ParamLayout l;
  auto place = [&](std::int64_t n) { return place_aligned(l.total, l.parameters, n); };
  for (std::size_t k = 0; k + 1 < widths.size(); ++k) {
    l.w.push_back(place(widths[k] * widths[k + 1]));
    l.b.push_back(place(widths[k + 1]));
  }
  return l;
}

void init_params(const Shape& s, const ParamLayout& l, std::uint64_t seed, HostBuffer& params) {
  params = HostBuffer(DType::f32, l.total);
  zero_bytes(params.data(), params.bytes());
  for (std::size_t k = 0; k < s.layers(); ++k) {
    const float bound = static_cast<float>(1 / std::sqrt(static_cast<double>(s.in(k))));
    for (int wb = 0; wb < 2; ++wb)
      fill_uniform_at(params, wb == 0 ? l.w[k] : l.b[k], wb == 0 ? s.in(k) * s.out(k) : s.out(k), seed,
                      100 + 2 * k + static_cast<std::uint64_t>(wb), -bound, bound);
  }
}

State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed) {
  State st;
  const std::int64_t in = s.widths[0], C = s.classes();
  st.x = HostBuffer(s.dtype, static_cast<std::size_t>(s.batch * in));
  st.x.fill_uniform(seed, 1);
  // The teacher depends on the model only, so that every batch size poses the same task.
  HostBuffer teacher(DType::f32, static_cast<std::size_t>(in * C));
  teacher.fill_uniform(0x7eac4e5ull, 2);
  st.labels.resize(static_cast<std::size_t>(s.batch));
  for (std::int64_t r = 0; r < s.batch; ++r) {
    std::int32_t best = 0;
    double best_score = -std::numeric_limits<double>::infinity();
    for (std::int64_t c = 0; c < C; ++c) {
      double score = 0;
      for (std::int64_t i = 0; i < in; ++i) score += st.x.get(static_cast<std::size_t>(r * in + i)) * teacher.get(static_cast<std::size_t>(i * C + c));
      if (score > best_score) best_score = score, best = static_cast<std::int32_t>(c);
    }
    st.labels[static_cast<std::size_t>(r)] = best;
  }
  init_params(s, l, seed, st.params);
  zero_moments(st.m, st.v, l.total);
  return st;
}

// Bounds, from one step at the seeded start (optimizer step 1, m = v = 0):
// - logits and loss: max|out - ref| / rms(ref) <= tolerance(f32) (1e-4): f32 sums of up to 784 terms
//   through three layers, ~1e-6 seen; a wrong weight or index is O(1).
// - gradients, per tensor, max|out - ref| / scale (below) <= 1e-3: sums over the batch (up to 4096) of
//   products carried through the chain, ~1e-5 seen. ReLUs at zero up to rounding are decided as the
//   implementation decided (`tie_hidden`): otherwise one of the ~1e-7 of hidden units that sit there
//   changes one sample's contribution, O(1/sqrt(batch)) of a column, and a correct run would fail.
// - the step: AdamW's first step is lr * g / (|g| + eps) ~ lr * sign(g), which flips for a gradient
//   that is zero up to rounding, so the reference takes the step (in double) from the gradients the
//   implementation computed, checked above; the change p - p0 is compared in units of lr with bound
//   1e-3 (the f32 rounding of p is ~2e-5 lr; a wrong step count or bias correction is O(0.1) or more).
//
// bf16 (models.h), against the same double reference, with u = 2^-9 the relative rounding of one bf16
// value. A layer's z = sum_i a_i W_i + b takes a_i and W_i rounded (u each) and stores z rounded (u);
// the rounding errors are random in sign, so they grow with the reduction as z itself does and each
// layer adds a few u of rms(z), the inputs' error carried along. Measured on the three models at
// batches 3 to 4096 (the CPU's loops; cublasLt and oneDNN round the same operands and differ only in
// the f32 accumulation order, 2^-24 per term):
// - logits: <= 0.020 (10u: three layers, the logits' own rounding at up to ~4 rms, the max over up to
//   40k outputs); bound 32u = 1/16.
// - loss: <= 4e-4 relative (the mean over the batch averages the logits' errors); bound 4u.
// - gradients, per tensor: <= 0.048 (dW = a^T.dz with a and dz rounded, dz carrying the logits' error,
//   the rounded dlogits and each rounded data gradient on its way down); bound 64u = 1/8. The scale
//   is rms(ref), or, where larger, the rms over the tensor of sqrt(sum of the terms' squares): a sum
//   of terms of random sign is about that large, and its rounding errors are relative to it, also
//   where the terms cancel (classifierdl's 2-class last bias, classes balanced: 0.67 of rms(ref)
//   seen, bf16 b256 on 8 threads).
// - ReLU ties: the implementation's z misses the reference's by up to 2u sum|a_i W_i| from its own
//   operands' rounding (its inputs' carried error adds far less relative to sum|terms|); decided as
//   the implementation decided within 4u sum|terms|. With u/4 a correct run fails (dW2 at 1.04 seen);
//   2u already gives the errors above.
// A slip exceeds these by far (ModelsVerify.Bf16BoundsCatchSlips, mlp_mnist): the second layer's bias
// left out gives logits 0.55 (9x the bound) and gradients up to 4.5 (36x); the last weight read
// transposed gives logits 4.1 and gradients up to 12.
// The AdamW step is f32 in both dtypes: the same check.
struct Bounds {
  double logits, loss, grad;  // max|out - ref| / scale
  double tie;                 // ReLU ties: |z| <= tie x sum |terms|
};
Bounds bounds_for(DType t) {
  constexpr double u = 1.0 / 512;  // bf16's unit roundoff, 2^-9
  if (t == DType::bf16) return {32 * u, 4 * u, 64 * u, 4 * u};
  return {tolerance(DType::f32), tolerance(DType::f32), 1e-3, 1e-5};
}

Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out) {
  const Bounds bound = bounds_for(s.dtype);
  const std::vector<double> p0 = as_doubles(start.params);
  std::vector<HostBuffer> hidden_f32;  // the ties read f32: bf16 activations widened exactly
  for (const HostBuffer& h : out.hidden) {
    if (h.dtype() == DType::f32) {
      hidden_f32.push_back(h);
      continue;
    }
    hidden_f32.emplace_back(DType::f32, h.count());
    for (std::size_t i = 0; i < h.count(); ++i) hidden_f32.back().set(i, h.get(i));
  }
  std::vector<const float*> tie;
  for (const HostBuffer& h : hidden_f32) tie.push_back(h.as<float>());
  const Reference ref = reference(s.widths, l, p0, as_doubles(start.x), start.labels, s.batch, s.train(), tie, bound.tie);
  if (!s.train()) {
    const std::vector<double> logits = as_doubles(out.logits);
    return within("logits", logits, ref.logits, std::max(rms(ref.logits), 1e-30), bound.logits);
  }
  Check c = within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(std::fabs(ref.loss), 1e-30), bound.loss);
  const std::vector<double> g = as_doubles(out.grads);
  for (std::size_t k = 0; k < s.layers(); ++k)
    for (int wb = 0; wb < 2; ++wb) {
      const std::size_t at = wb == 0 ? l.w[k] : l.b[k];
      const std::size_t n = static_cast<std::size_t>(wb == 0 ? s.in(k) * s.out(k) : s.out(k));
      const std::vector<double> o(g.begin() + static_cast<std::ptrdiff_t>(at), g.begin() + static_cast<std::ptrdiff_t>(at + n));
      const std::vector<double> r(ref.grad.begin() + static_cast<std::ptrdiff_t>(at), ref.grad.begin() + static_cast<std::ptrdiff_t>(at + n));
      const std::string what = std::string(wb == 0 ? "dW" : "db") + std::to_string(k + 1);
      // The scale: rms(ref), or the rms of the terms' root-sum-square where the terms cancel and the
      // gradient is far smaller than its rounding errors (the last bias's column sums of
      // softmax - onehot over a batch whose classes balance: 4.6e-5 against terms' 1e-2 seen).
      double terms_sq = 0;
      for (std::size_t i = at; i < at + n; ++i) terms_sq += ref.grad_terms_sq[i];
      const double scale = std::max({rms(r), std::sqrt(terms_sq / static_cast<double>(n)), 1e-30});
      c.merge(within(what.c_str(), o, r, scale, bound.grad), what);
    }
  c.merge(adamw_first_step(start.params, out.grads, start.m, start.v, out.params, l.total), "step");
  return c;
}

HOTOPS_DEFINE_FAMILY(ModelsFamily);

}  // namespace hotops::models
