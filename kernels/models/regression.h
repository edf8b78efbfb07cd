// What the model steps that map an input to an output of its own shape, trained with the MSE against a
// target, share (model_bert's encoder layers, model_convnext's block): the seeded start, the
// reference's results, one verified run's outcome, the periodic verification batch, the bounds and the
// check of one step.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/op.h"
#include "kernels/models/models.h"

namespace hotops::models::regression {

struct State {
  HostBuffer x, target;     // [batch, a sample's elements], the problem's dtype
  HostBuffer params, m, v;  // f32
};
// x and the target, `n` values each uniform in [-1, 1) in dtype `t` (HostBuffer::fill_uniform's streams
// 1 and 2 of `seed`); `total` f32 parameters at 0, for the family to set; m = v = 0.
State seeded_start(DType t, std::size_t n, std::size_t total, std::uint64_t seed);

// Verification runs the step on a batch whose samples repeat with period kVerifyPeriod (sample b is
// sample b % period of the seeded batch, x and target alike), so that the double reference needs only
// `period` samples however large the batch: each sample's output, loss share and gradient depend on it
// alone. periodic_start() builds that start from the seeded one (`per`: a sample's elements).
constexpr std::int64_t kVerifyPeriod = 2;
State periodic_start(const State& seeded, DType t, std::size_t per, std::int64_t batch);

// The reference in double: y, and for backward the loss and the flat gradients. Verification always
// compares with the exact one (Rounding::none). Rounding::bf16 rounds, in the same double computation,
// what the bf16 implementations store in bf16 (the operands they read from the f32 masters and every
// stored activation and activation gradient): a model of a correct bf16 step, with which the tests
// show that the bf16 bounds pass it with margin.
enum class Rounding { none, bf16 };
struct Reference {
  std::vector<double> y;
  double loss = 0;
  std::vector<double> grad;
};

// What one implementation produced in one verified run, in host memory.
struct Outcome {
  HostBuffer y;              // infer: x's shape, the problem's dtype
  float loss = 0;            // train
  HostBuffer grads, params;  // train: the gradients and the parameters after the step
};

// The bounds of one step from the verification start, optimizer step 1, by dtype: model_bert.cpp
// derives them for the encoder layers, model_convnext.cpp says why the block's steps fit them.
StepBounds bounds(DType t);

// Compares one step from `start` (periodic_start's) with the references of its distinct samples,
// `sample(p0, x, target)` each (p0: the start's parameters; x and the target of one sample, `per`
// elements each), within bounds(t): one reference per distinct sample, the batch's loss and gradients
// their means weighted by how often each sample occurs. Computed once for every way of running the
// step (shared_reference, `name` in its key).
template <class Layout, class Sample>
Check verify_step(const std::string& name, DType t, Direction d, std::int64_t batch, std::size_t per, const Layout& l,
                  const State& start, const Outcome& out, Sample sample) {
  const std::int64_t period = std::min(batch, kVerifyPeriod);
  const auto shared = shared_reference<std::vector<Reference>>(
      reference_key(name, t, d, batch, {start.params.data(), start.x.data(), start.target.data()},
                    {start.params.bytes(), start.x.bytes(), start.target.bytes()}),
      [&] {  // the parameters in double only where the reference is computed
        const std::vector<double> p0 = as_doubles(start.params);
        std::vector<Reference> r;
        for (std::int64_t q = 0; q < period; ++q)
          r.push_back(sample(p0, as_doubles(start.x, per * static_cast<std::size_t>(q), per),
                             as_doubles(start.target, per * static_cast<std::size_t>(q), per)));
        return r;
      });
  return verify_periodic_step(*shared, period, batch, per, d == Direction::train, t == DType::bf16, bounds(t), l, start, out);
}

// Why this CPU cannot run the bf16 steps ("" when it can): their Linear layers' bf16 matmul, which
// oneDNN 2.6 implements from AVX-512 on and refuses (unimplemented) below.
std::string cpu_bf16_reason();

}  // namespace hotops::models::regression
