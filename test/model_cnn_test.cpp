// The model_cnn family: parameter counts against the studies' tables, names and work, the reference's
// gradients against finite differences, verification failing on planted errors, the tiny models
// learning their task, and the data-parallel steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "hotops/gpu.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/cudnn_util.h"
#endif
#include "test/model_test_util.h"
#include "kernels/model_cnn/model_cnn.h"
#include "kernels/models/models.h"

namespace hotops::model_cnn {
namespace {

Problem problem(const std::string& op, Backend be, Direction d, std::int64_t batch, DType t = DType::f32) {
  return Problem{"model." + op, be, t, d, {{"batch", std::to_string(batch)}}};
}

// An outcome as a step from `st` would give it, made from the reference at parameters p (the
// verification start's, or a slipped or rounded copy): logits for every sample of the batch, the
// loss, the gradients, the statistics, AdamW's step `step` from p0 with those gradients, and the
// post-ReLU activations that decided its near-ties (as an implementation reports them).
Outcome outcome_from(const Shape& s, const ParamLayout& l, const std::vector<pointwise::DropoutKey>& keys, const State& st,
                     const std::vector<double>& p, std::int64_t step = 1) {
  const std::int64_t period = verify_period(s);
  std::vector<double> stats(st.stats.count()), x(static_cast<std::size_t>(period * s.arch.H * s.arch.W * s.arch.C));
  for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = st.stats.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
  std::vector<std::int64_t> count(static_cast<std::size_t>(period), 0);
  for (std::int64_t b = 0; b < s.batch; ++b) ++count[static_cast<std::size_t>(b % period)];
  const std::vector<std::int32_t> labels(st.labels.begin(), st.labels.begin() + period);
  const Reference ref = reference(s, l, keys, p, stats, x, labels, count, s.train(), nullptr, /*keep_acts=*/true);
  Outcome o;
  if (!s.train()) {
    const std::size_t C = static_cast<std::size_t>(s.arch.classes);
    o.logits = HostBuffer(DType::f32, static_cast<std::size_t>(s.batch) * C);
    for (std::size_t i = 0; i < o.logits.count(); ++i) o.logits.set(i, ref.logits[((i / C) % static_cast<std::size_t>(period)) * C + i % C]);
    return o;
  }
  o.loss = static_cast<float>(ref.loss);
  o.stats = HostBuffer(DType::f32, l.stats);
  for (std::size_t i = 0; i < l.stats; ++i) o.stats.set(i, ref.stats[i]);
  model_test::correct_step(ref.grad, [&](std::size_t i) { return st.params.get(i); }, l.total, step, o.grads, o.params);
  auto buffer = [](const std::vector<float>& v) {
    HostBuffer b(DType::f32, v.size());
    std::copy(v.begin(), v.end(), b.as<float>());
    return b;
  };
  for (const std::vector<float>& r : ref.relu) o.relu.push_back(buffer(r));
  o.hidden = buffer(ref.hidden);
  return o;
}

// A keras_test train step's verification start at `batch` from `seed`, its parameters as doubles.
struct TrainStart {
  Shape s;
  ParamLayout l;
  std::vector<pointwise::DropoutKey> keys;
  State st;
  std::vector<double> p0;
};
TrainStart train_start(std::int64_t batch, std::uint64_t seed) {
  TrainStart t;
  t.s = shape_of(problem("keras_test", Backend::cpu, Direction::train, batch));
  t.l = param_layout(t.s.arch);
  t.keys = dropout_keys(t.s.arch, seed);
  t.st = verification_state(t.s, make_state(t.s, t.l, seed));
  t.p0.resize(t.l.total);
  for (std::size_t i = 0; i < t.p0.size(); ++i) t.p0[i] = t.st.params.get(i);
  return t;
}

TEST(ModelCnnLayout, ParameterCountsMatchTheStudies) {
  const ParamLayout k = param_layout(arch_named("keras_cnn"));
  EXPECT_EQ(k.parameters, 58088516);  // the TensorFlow 2 comparison's "Trainable params"
  EXPECT_EQ(k.parameters + static_cast<std::int64_t>(k.stats), 58091396);  // its "Total params"
  EXPECT_EQ(flat_width(arch_named("keras_cnn")), 56448);
  EXPECT_EQ(param_layout(arch_named("vgg_cifar")).parameters, 1250858);  // Keras' cifar10_cnn.py
  EXPECT_EQ(flat_width(arch_named("vgg_cifar")), 2304);
  EXPECT_EQ(param_layout(arch_named("cnn_mnist")).parameters, 1199882);  // Keras' mnist_cnn.py
  EXPECT_EQ(flat_width(arch_named("cnn_mnist")), 9216);
  const std::vector<ConvLayer> c = conv_layers(arch_named("keras_cnn"));
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].PH, 85);
  EXPECT_EQ(c[2].PH, 42);
  EXPECT_EQ(c[4].PH, 21);
}

TEST(ModelCnnNames, NamesAndWork) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"model.keras_cnn/cuda/f32/train/batch:64", "model.keras_cnn/cpu/f32/infer/batch:64",
                        "model.keras_cnn/cuda/f32/train/batch:16/graph:1", "model.vgg_cifar/cpu/f32/train/batch:128/threads:8",
                        "model.vgg_cifar/cuda/f32/infer/batch:512/e2e:1"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  for (const std::string& n : names) EXPECT_EQ(n.find("_test"), std::string::npos) << n;
  // vgg_cifar: convs 30x30x32x(27) ... by hand.
  const double convs = 32.0 * 32 * 32 * 27 + 30.0 * 30 * 32 * 288 + 15.0 * 15 * 64 * 288 + 13.0 * 13 * 64 * 576;
  const double fwd = 2.0 * 128 * (convs + 2304.0 * 512 + 512.0 * 10);
  EXPECT_DOUBLE_EQ(family().work(problem("vgg_cifar", Backend::cpu, Direction::infer, 128)).flops, fwd);
  EXPECT_DOUBLE_EQ(family().work(problem("vgg_cifar", Backend::cuda, Direction::train, 128)).flops, 3 * fwd + 14.0 * 1250858);
}

// Central differences of the reference's own loss, every parameter of a tiny model, samples weighted.
void check_fd(const std::string& arch) {
  const Shape s = shape_of(problem(arch, Backend::cpu, Direction::train, 3));
  const ParamLayout l = param_layout(s.arch);
  const State st = make_state(s, l, 5);
  const auto keys = dropout_keys(s.arch, 5);
  std::vector<double> p(l.total), stats(st.stats.count()), x(st.x.count());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = st.params.get(i);
  for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = st.stats.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
  const std::vector<std::int64_t> count{2, 1, 3};
  const Reference ref = reference(s, l, keys, p, stats, x, st.labels, count, true);
  const double h = 1e-6;
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, n] = l.tensors[k];
    // An odd stride, so that the samples of a [in, out] matrix visit every column (some are dropped out).
    const auto [worst, biggest, checked] = model_test::finite_differences(
        p, ref.grad, [&](const std::vector<double>& q) { return reference(s, l, keys, q, stats, x, st.labels, count, true).loss; },
        h, at, at + n, std::max<std::size_t>(1, n / 12) | 1);
    EXPECT_LT(worst, 1e-7 + 1e-5 * biggest) << arch << " " << l.names[k] << ", largest |fd| " << biggest;
    if (!l.zero_grad[k]) {
      EXPECT_GT(biggest, 1e-6) << arch << " " << l.names[k];
    }
  }
}

TEST(ModelCnnReference, GradientsMatchFiniteDifferences) {
  check_fd("keras_test");
  check_fd("vgg_test");
}

// Verification passes the reference's own outcome and fails each planted error.
TEST(ModelCnnVerify, PlantedErrorsFail) {
  const TrainStart t = train_start(6, 9);
  const Shape& s = t.s;
  const ParamLayout& l = t.l;
  const auto& keys = t.keys;
  const State& st = t.st;
  const std::vector<double>& p0 = t.p0;
  auto outcome = [&](std::int64_t step) { return outcome_from(s, l, keys, st, p0, step); };
  EXPECT_TRUE(verify_outcome(s, l, keys, st, outcome(1)).ok) << verify_outcome(s, l, keys, st, outcome(1)).message;
  Outcome wrong_loss = outcome(1);
  wrong_loss.loss *= 1.01f;
  EXPECT_FALSE(verify_outcome(s, l, keys, st, wrong_loss).ok);
  Outcome wrong_grad = outcome(1);
  const std::size_t at = l.conv[1].w + 7;
  wrong_grad.grads.set(at, wrong_grad.grads.get(at) * 1.5 + 1e-3);
  EXPECT_FALSE(verify_outcome(s, l, keys, st, wrong_grad).ok);
  Outcome wrong_stats = outcome(1);
  wrong_stats.stats.set(l.conv[0].var + 1, wrong_stats.stats.get(l.conv[0].var + 1) + 0.01);
  EXPECT_FALSE(verify_outcome(s, l, keys, st, wrong_stats).ok);
  EXPECT_FALSE(verify_outcome(s, l, keys, st, outcome(2)).ok);
  // Other masks are another model: the right outcome of the wrong keys fails.
  EXPECT_FALSE(verify_outcome(s, l, dropout_keys(s.arch, 10), st, outcome(1)).ok);
}

// bf16: the bounds (model_cnn.cpp) pass a model of a correct bf16 step, the reference from the
// parameters rounded to bf16 (autocast's cast of every weight, the one rounding a bf16 step applies to
// all of them), and fail the slips a looser bound could let through: a bias left out (the last
// layer's; vgg also its first conv's, which no batch norm absorbs), the last weight read transposed,
// another dropout mask.
TEST(ModelCnnVerify, Bf16BoundsCatchSlips) {
  for (const char* arch : {"keras_test", "vgg_test"})
    for (Direction dir : {Direction::train, Direction::infer}) {
      const Shape s = shape_of(problem(arch, Backend::cuda, dir, 6, DType::bf16));
      const ParamLayout l = param_layout(s.arch);
      const auto keys = dropout_keys(s.arch, 9);
      const State st = verification_state(s, make_state(s, l, 9));
      EXPECT_EQ(st.x.dtype(), DType::bf16);
      std::vector<double> p0(l.total), rounded(l.total);
      for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
      HostBuffer low(DType::bf16, l.total);
      for (std::size_t i = 0; i < p0.size(); ++i) low.set(i, p0[i]), rounded[i] = low.get(i);
      const std::string what = std::string(arch) + " " + direction_name(dir);
      const Check good = verify_outcome(s, l, keys, st, outcome_from(s, l, keys, st, rounded));
      EXPECT_TRUE(good.ok) << what << ": " << good.message;
      std::vector<std::vector<double>> slips;
      auto slip = [&](auto change) {
        std::vector<double> p = rounded;
        change(p);
        slips.push_back(std::move(p));
      };
      slip([&](std::vector<double>& p) { std::fill_n(p.begin() + static_cast<std::ptrdiff_t>(l.dense2.b), s.arch.classes, 0.0); });
      if (!s.arch.bn) slip([&](std::vector<double>& p) { std::fill_n(p.begin() + static_cast<std::ptrdiff_t>(l.conv[0].b), s.convs[0].K, 0.0); });
      slip([&](std::vector<double>& p) {  // W2 [hidden, classes] read as if stored [classes, hidden]
        const std::int64_t Hd = s.arch.hidden, C = s.arch.classes;
        for (std::int64_t o = 0; o < Hd; ++o)
          for (std::int64_t c = 0; c < C; ++c) p[l.dense2.w + static_cast<std::size_t>(o * C + c)] = rounded[l.dense2.w + static_cast<std::size_t>(c * Hd + o)];
      });
      for (std::size_t k = 0; k < slips.size(); ++k) {
        const Check bad = verify_outcome(s, l, keys, st, outcome_from(s, l, keys, st, slips[k]));
        EXPECT_FALSE(bad.ok) << what << " slip " << k;
      }
      if (s.train()) {
        EXPECT_FALSE(verify_outcome(s, l, dropout_keys(s.arch, 10), st, outcome_from(s, l, keys, st, rounded)).ok) << what;
      }
    }
}

void expect_learns(Backend be, const std::string& arch, int steps, DType t = DType::f32) {
  const Problem p = problem(arch, be, Direction::train, 8, t);
  model_test::expect_loss_falls<ModelCase>(*family().make(p), steps, 0.7, p.name());
}

// The ways of running one inference step share its reference (computed once in the process); a
// train step's reference decides the ReLU near-ties as the run did, so it is shared only by runs
// whose activations are the same bits: the same case verified again, not the one-thread step.
TEST(ModelCnnVerify, InferVariantsShareOneReference) {
  const Problem plain = problem("keras_test", Backend::cpu, Direction::infer, 3);
  Problem one_thread = plain;
  one_thread.args.push_back({"threads", "1"});
  const std::size_t before = models::shared_reference_computations();
  EXPECT_TRUE(family().make(plain)->verify().ok);
  EXPECT_TRUE(family().make(one_thread)->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 1);
  Problem train = one_thread;
  train.dir = Direction::train;
  const auto c = family().make(train);
  EXPECT_TRUE(c->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 2);
  EXPECT_TRUE(c->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 2) << "the same activations computed the reference again";
}

// The ways of running one step start from one seeded state, made once in the process (on the
// GPU host the CUDA runs share it too); another step (here: another batch) gets its own, equal to a
// fresh make_state.
TEST(ModelCnnVerify, VariantsShareOneSeededStart) {
  const Problem plain = problem("keras_test", Backend::cpu, Direction::train, 3);
  Problem one_thread = plain;
  one_thread.args.push_back({"threads", "1"});
  const auto a = family().make(plain);  // (an earlier test may have made this start already)
  const std::size_t made = seeded_states_made();
  const auto b = family().make(one_thread);
  EXPECT_EQ(seeded_states_made(), made);
  EXPECT_TRUE(b->verify().ok);
  const Problem other = problem("keras_test", Backend::cpu, Direction::train, 4);
  const Shape s = shape_of(other);
  const ParamLayout l = param_layout(s.arch);
  const auto shared = seeded_state(s, l, models::step_seed(other));
  EXPECT_EQ(seeded_states_made(), made + 1);
  const State fresh = make_state(s, l, models::step_seed(other));
  ASSERT_EQ(shared->params.bytes(), fresh.params.bytes());
  EXPECT_EQ(std::memcmp(shared->params.data(), fresh.params.data(), fresh.params.bytes()), 0);
  EXPECT_EQ(std::memcmp(shared->x.data(), fresh.x.data(), fresh.x.bytes()), 0);
  EXPECT_EQ(shared->labels, fresh.labels);
}

// A train reference is another run's only where that run's activations are the same bits: a run
// whose ReLU decisions differ gets a reference of its own.
TEST(ModelCnnVerify, TrainReferenceIsSharedOnlyBySameActivations) {
  const TrainStart t = train_start(3, 10);
  Outcome o = outcome_from(t.s, t.l, t.keys, t.st, t.p0);
  const std::size_t before = models::shared_reference_computations();
  EXPECT_TRUE(verify_outcome(t.s, t.l, t.keys, t.st, o).ok);
  EXPECT_TRUE(verify_outcome(t.s, t.l, t.keys, t.st, o).ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 1);
  o.relu[0].as<float>()[0] += 1.f;  // another run's activations (its gradients are the same here)
  verify_outcome(t.s, t.l, t.keys, t.st, o);
  EXPECT_EQ(models::shared_reference_computations(), before + 2);
}

#ifdef HOTOPS_HAVE_CUDA
// The input gradient's path: the flipped filter's forward conv only when it beats backward data by
// more than a near tie; on a near tie, either way round, backward data. A host test: it needs a
// CUDA build, not a GPU.
TEST(ModelCnnDataGradPath, FlipOnlyBeyondANearTie) {
  const float near = 1 + gpu::kRetimeTie / 2, far = 1 + 2 * gpu::kRetimeTie;
  EXPECT_TRUE(forward_flip_is_faster(1.f, far));
  EXPECT_FALSE(forward_flip_is_faster(1.f, near));
  EXPECT_FALSE(forward_flip_is_faster(near, 1.f));
  EXPECT_FALSE(forward_flip_is_faster(1.f, 1.f));
  EXPECT_FALSE(forward_flip_is_faster(far, 1.f));
}
#endif

TEST(ModelCnnTraining, LossFallsCpu) {
  expect_learns(Backend::cpu, "keras_test", 40);
  expect_learns(Backend::cpu, "vgg_test", 60);
}

TEST(ModelCnnTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "keras_test", 40);
  expect_learns(Backend::cuda, "vgg_test", 60);
}

TEST(ModelCnnTraining, LossFallsCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "keras_test", 40, DType::bf16);
  expect_learns(Backend::cuda, "vgg_test", 60, DType::bf16);
}

// Both ways of computing a CUDA conv layer's input gradient verify (cuDNN's backward data and the
// forward conv with the flipped filter), each forced, in both activation layouts and both dtypes: the
// measured choices may take either at a test shape.
TEST(ModelCnnCuda, BothDataGradientPathsAndLayoutsVerify) {
  HOTOPS_SKIP_WITHOUT_GPU();
  struct Restore {
    ~Restore() {
      set_cuda_data_grad_path(DataGradPath::timed);
      set_cuda_layout(CudaLayout::measured);
    }
  } restore;
  for (CudaLayout layout : {CudaLayout::nhwc, CudaLayout::nchw}) {
    set_cuda_layout(layout);
    for (DataGradPath path : {DataGradPath::backward_data, DataGradPath::forward_flip}) {
      set_cuda_data_grad_path(path);
      for (const char* arch : {"keras_test", "vgg_test", "mnist_test"})
        for (Direction dir : {Direction::train, Direction::infer})
          for (DType t : {DType::f32, DType::bf16}) {
            const auto c = family().make(problem(arch, Backend::cuda, dir, 6, t));
            const Check chk = c->verify();
            EXPECT_TRUE(chk.ok) << arch << " " << dtype_name(t) << " " << c->label() << ": " << chk.message;
            const std::string label = c->label();
            EXPECT_NE(label.find(layout == CudaLayout::nchw ? "cuDNN NCHW" : "cuDNN NHWC"), std::string::npos) << label;
            if (dir == Direction::train) {
              EXPECT_EQ(label.find("data fwd-flip") != std::string::npos, path == DataGradPath::forward_flip) << label;
            }
          }
    }
  }
}

// CPU infer in the layouts oneDNN picks between the layers (a pooled first conv reading nchw
// images, keras_cnn's) verifies on both test architectures, and the label says which layouts ran:
// blocked ones where oneDNN picked them (AVX2), NHWC where it picked NHWC for every layer (its
// brgconv kernels on AVX-512 did, for vgg_test).
TEST(ModelCnnCpu, OwnLayoutsVerify) {
  for (const char* arch : {"keras_test", "vgg_test"}) {
    const auto c = family().make(problem(arch, Backend::cpu, Direction::infer, 5));
    const Check chk = c->verify();
    EXPECT_TRUE(chk.ok) << arch << ": " << chk.message;
    const std::string label = c->label();
    const bool own = label.find("; the conv and pool layers in the layouts oneDNN picked, NHWC at the flatten;") != std::string::npos;
    const bool nhwc = label.find("; NHWC;") != std::string::npos;
    EXPECT_TRUE(own != nhwc) << label;
  }
}

// keras_cnn's CPU infer runs its first conv and pool a chunk of samples at a time (each chunk's conv
// output at most 16 MiB: one sample of its 256x256x32 f32 output is 8 MiB), the pool writing each
// chunk's part of the batch's output: at batch 3 three chunks of one sample, verified.
TEST(ModelCnnCpu, FirstLayerInChunksVerifies) {
  const auto c = family().make(problem("keras_cnn", Backend::cpu, Direction::infer, 3));
  const Check chk = c->verify();
  EXPECT_TRUE(chk.ok) << chk.message;
  EXPECT_NE(c->label().find("; the first conv and its pool 1 sample at a time, the pool writing NHWC"), std::string::npos) << c->label();
  const auto small = family().make(problem("keras_test", Backend::cpu, Direction::infer, 5));
  EXPECT_NE(small->label().find("; the first conv and its pool 5 samples at a time"), std::string::npos) << small->label();
}

// ---- data-parallel train steps (gpus:G; kernels/models/data_parallel.h) ----

Problem data_parallel(const std::string& arch, std::int64_t batch, int gpus, DType t = DType::f32) {
  return model_test::model_problem(arch, Backend::cuda, Direction::train, batch, "gpus", gpus, t);
}

// vgg_cifar and cnn_mnist have data-parallel steps at their train batches (per GPU), G = 2, 4, 8, in
// both dtypes, doing G times one GPU's work; keras_cnn, with batch normalization, has none, and a
// problem of it says why; the tests' gpus:1 steps are the tiny architectures'.
TEST(ModelCnnDataParallel, NamesWorkAndTheBatchNormalizedModel) {
  model_test::expect_data_parallel_names(family(), {{"vgg_cifar", arch_named("vgg_cifar").batches}, {"cnn_mnist", arch_named("cnn_mnist").batches}});
  const std::string why = family().unsupported_reason(data_parallel("keras_cnn", 16, 2));
  EXPECT_NE(why.find("batch normalization"), std::string::npos) << why;
  EXPECT_FALSE(data_parallel_arch_reason(arch_named("keras_test")).empty());
  EXPECT_TRUE(data_parallel_arch_reason(arch_named("vgg_cifar")).empty());

  model_test::expect_gpus_only_on_cuda_train(shape_of, "vgg_cifar", 128, 4);
  // The seed: the images, the parameters and the dropout keys.
  model_test::expect_data_parallel_work_and_seed(family(), problem("vgg_cifar", Backend::cuda, Direction::train, 128), 4);

  const std::vector<std::string> tests = model_test::data_parallel_names(family().test_problems());
  for (const char* n : {"model.vgg_test/cuda/f32/train/batch:5/gpus:1", "model.mnist_test/cuda/bf16/train/batch:4/gpus:1"})
    EXPECT_NE(std::find(tests.begin(), tests.end(), n), tests.end()) << n;
}

// gpus:1 (a communicator of this process alone): the data-parallel step verified against the
// reference at its global batch, its dropout masks included; vgg_cifar's and cnn_mnist's gradients in
// two buckets (the dense layers', then the conv layers'), the tiny architectures' in one.
TEST(ModelCnnDataParallel, OneGpuBucketsAndVerifiesCuda) {
  model_test::expect_one_gpu_data_parallel(family(), problem("vgg_cifar", Backend::cuda, Direction::train, 4), "in 2 buckets");
  model_test::expect_one_gpu_data_parallel(family(), problem("cnn_mnist", Backend::cuda, Direction::train, 4, DType::bf16),
                                           "in 2 buckets");
  for (DType t : {DType::f32, DType::bf16}) {
    model_test::expect_one_gpu_data_parallel(family(), problem("vgg_test", Backend::cuda, Direction::train, 5, t), "in 1 bucket ");
    model_test::expect_one_gpu_data_parallel(family(), problem("mnist_test", Backend::cuda, Direction::train, 4, t), "in 1 bucket ");
  }
}

}  // namespace
// The bf16 train steps' copy of the master weights is written by AdamW, never cast in a step (on CUDA
// in the measured layout, NHWC for bf16: NCHW still casts the conv weights into KCRS each step).
TEST(ModelCnnBf16Copy, KeptByAdamwCpu) {
  for (const char* a : {"keras_test", "vgg_test"})
    model_test::expect_bf16_copy_kept(family(), problem(a, Backend::cpu, Direction::train, 8, DType::bf16), 3);
}
TEST(ModelCnnBf16Copy, CastOnceForInferCpu) {  // the dense layer's W1 (the convolutions cast theirs)
  for (const char* a : {"keras_test", "vgg_test"})
    model_test::expect_bf16_copy_kept(family(), problem(a, Backend::cpu, Direction::infer, 8, DType::bf16), 3);
}
TEST(ModelCnnBf16Copy, CastOnceForInferCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (const char* a : {"keras_test", "vgg_test"})
    model_test::expect_bf16_copy_kept(family(), problem(a, Backend::cuda, Direction::infer, 8, DType::bf16), 3);
}
TEST(ModelCnnBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (const char* a : {"keras_test", "vgg_test"})
    model_test::expect_bf16_copy_kept(family(), problem(a, Backend::cuda, Direction::train, 8, DType::bf16), 3);
}

}  // namespace hotops::model_cnn
