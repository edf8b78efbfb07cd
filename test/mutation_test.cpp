// Planted bugs: each test mutation (include/hotops/plan.h) between an op case and its plan must fail
// that case's verification, the check that both the unit tests (OpTest.MatchesReference) and bench
// run, on every family listed here, on the CPU and on CUDA.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hotops/gpu.h"
#include "hotops/plan.h"

namespace hotops {
namespace {

struct Mutant {
  std::string op;
  std::string problem;  // the start of a test problem's name after its op and backend
  std::string mutation;
};

const std::vector<Mutant>& mutants() {
  static const std::vector<Mutant> m = {
      {"softmax", "f32/fwd/shape:test/rows:9/cols:128", "shift_output"},
      {"softmax", "f32/fwd/shape:test/rows:9/cols:128", "zero_input"},
      {"softmax", "bf16/bwd/shape:test/rows:9/cols:128", "swap_inputs"},
      {"softmax", "bf16/bwd/shape:test/rows:9/cols:128", "zero_input"},
      {"attention", "f32/fwd/shape:test/batch:2/seq:37/heads:2/head_dim:64", "shift_output"},
      {"attention", "f32/fwd/shape:test/batch:2/seq:37/heads:2/head_dim:64", "zero_input"},
      {"attention", "f32/bwd/shape:test/batch:2/seq:200/heads:2/head_dim:64", "shift_output"},
      {"attention", "f32/bwd/shape:test/batch:2/seq:200/heads:2/head_dim:64", "zero_input"},
      {"attention", "bf16/fwd/shape:test/batch:2/seq:128/heads:2/head_dim:64", "zero_input"},
      {"attention", "bf16/bwd/shape:test/batch:2/seq:37/heads:2/head_dim:64", "shift_output"},
      {"attention", "bf16/bwd/shape:test/batch:2/seq:37/heads:3/head_dim:16", "zero_input"},
      {"layernorm", "f32/fwd/shape:test/batch:2/tokens:5/hidden:33/", "shift_output"},
      {"layernorm", "f32/fwd/shape:test/batch:2/tokens:5/hidden:33/", "zero_input"},
      {"layernorm", "bf16/bwd/shape:test/batch:2/tokens:5/hidden:33/", "swap_inputs"},
      {"layernorm", "f32/bwd/shape:test/batch:2/tokens:5/hidden:33/", "shift_output"},
      {"layernorm_dbias", "f32/bwd/shape:test/batch:3/tokens:7/hidden:5/eps:1e-05/dres:yes", "zero_input"},
      {"layernorm_dbias", "bf16/bwd/shape:test/batch:11/tokens:97/hidden:256/eps:1e-05/dres:no", "swap_inputs"},
      {"layernorm_dbias", "f32/bwd/shape:test/batch:11/tokens:97/hidden:256/eps:1e-05/dres:yes", "shift_output"},
      {"cross_entropy", "f32/fwd/shape:test/rows:9/classes:33", "shift_output"},
      {"cross_entropy", "f32/fwd/shape:test/rows:9/classes:33", "zero_input"},
      {"cross_entropy", "bf16/bwd/shape:test/rows:9/classes:33", "zero_input"},
      {"cross_entropy", "bf16/bwd/shape:test/rows:9/classes:33", "shift_output"},
      {"mse", "f32/bwd/shape:test/batch:1/tokens:3/hidden:5", "zero_input"},
      {"mse", "bf16/bwd/shape:test/batch:3/tokens:97/hidden:256", "swap_inputs"},
      {"mse", "f32/bwd/shape:test/batch:3/tokens:97/hidden:256", "shift_output"},
      {"bce_logits", "f32/fwd/shape:test/batch:1000/outputs:1", "shift_output"},
      {"bce_logits", "f32/fwd/shape:test/batch:1000/outputs:1", "zero_input"},
      {"bce_logits", "f32/bwd/shape:test/batch:11/outputs:3", "swap_inputs"},
      {"bce_logits", "bf16/bwd/shape:test/batch:1000/outputs:1", "zero_input"},
      {"global_avgpool", "f32/fwd/shape:test/N:3/L:401/C:50/layout:nlc", "shift_output"},
      {"global_avgpool", "f32/fwd/shape:test/N:5/L:9/C:70/layout:ncl", "zero_input"},
      {"global_avgpool", "bf16/bwd/shape:test/N:3/L:401/C:50/layout:nlc", "shift_output"},
      {"embedding", "f32/fwd/shape:test/N:4/T:33/vocab:50/dim:64", "shift_output"},
      {"embedding", "f32/fwd/shape:test/N:4/T:33/vocab:50/dim:64", "zero_input"},
      {"embedding", "bf16/bwd/shape:test/N:4/T:33/vocab:50/dim:64", "shift_output"},
      {"embedding", "bf16/bwd/shape:test/N:4/T:33/vocab:50/dim:64", "zero_input"},
      {"embedding", "bf16/fwd/shape:test/N:4/T:33/vocab:50/dim:64/layout:tnc/table:f32", "shift_output"},
      {"embedding", "f32/bwd/shape:test/N:4/T:33/vocab:50/dim:64/layout:tnc", "zero_input"},
      {"embedding", "bf16/bwd/shape:test/N:4/T:33/vocab:50/dim:64/layout:tnc", "shift_output"},
      {"scale_residual", "f32/fwd/shape:test/batch:130/dims:130x70", "shift_output"},
      {"scale_residual", "f32/fwd/shape:test/batch:130/dims:130x70", "zero_input"},
      {"scale_residual", "bf16/bwd/shape:test/batch:130/dims:130x70", "swap_inputs"},
      {"scale_residual", "bf16/bwd/shape:test/batch:130/dims:130x70", "zero_input"},
      {"addmm", "f32/fwd/shape:test/M:7/N:13/K:5", "shift_output"},
      {"addmm", "f32/fwd/shape:test/M:7/N:13/K:5", "zero_input"},
      {"addmm", "bf16/bwd_weight/shape:test/M:33/N:65/K:17", "shift_output"},
      {"addmm", "bf16/fwd/shape:test/M:37/N:3/K:12/a_blocks:3", "zero_input"},
      {"mm", "f32/bwd_data/shape:test/M:37/N:3/K:12/a_blocks:3", "shift_output"},
      {"mm", "bf16/bwd_weight/shape:test/M:37/N:3/K:12/a_blocks:3/out:f32", "zero_input"},
      {"bmm", "f32/bwd_data/shape:test/batch:2/heads:3/M:33/N:65/K:17", "zero_input"},
      {"bias_grad", "f32/bwd/shape:test/M:130/N:47", "shift_output"},
      {"bias_grad", "bf16/bwd/shape:test/M:200/N:1100", "zero_input"},
      {"conv2d", "f32/fwd/shape:test/batch:2/C:3/H:7/W:9/K:4/R:3/S:3/stride:1/pad:1/dilation:1/bias:1/layout:nchw", "shift_output"},
      {"conv2d", "f32/fwd/shape:test/batch:2/C:3/H:7/W:9/K:4/R:3/S:3/stride:1/pad:1/dilation:1/bias:1/layout:nchw", "zero_input"},
      {"conv2d", "f32/bwd_weight/shape:test/batch:2/C:3/H:7/W:9/K:4/R:3/S:3/stride:1/pad:1/dilation:1/bias:1/layout:nchw", "shift_output"},
      {"conv2d", "f32/fwd/shape:test/batch:2/C:16/H:10/W:10/K:16/R:7/S:7/stride:1/pad:3/dilation:1/groups:16/bias:1/layout:nhwc", "shift_output"},
      {"conv2d", "bf16/bwd_data/shape:test/batch:2/C:16/H:10/W:10/K:16/R:7/S:7/stride:1/pad:3/dilation:1/groups:16/bias:1/layout:nchw", "zero_input"},
      {"conv2d", "f32/bwd_weight/shape:test/batch:2/C:4/H:9/W:8/K:6/R:3/S:3/stride:2/pad:1/dilation:1/groups:2/bias:0/layout:nchw", "shift_output"},
      {"batchnorm", "f32/fwd/shape:test/layout:nchw/batch:3/C:5/H:7/W:9", "shift_output"},
      {"batchnorm", "f32/fwd/shape:test/layout:nchw/batch:3/C:5/H:7/W:9", "zero_input"},
      {"batchnorm", "f32/bwd/shape:test/layout:nchw/batch:3/C:5/H:7/W:9", "swap_inputs"},
      {"maxpool", "f32/fwd/shape:test/N:2/C:3/H:7/W:9/k:2/s:2/pad:0/layout:nchw", "shift_output"},
      {"maxpool", "f32/bwd/shape:test/N:2/C:3/H:7/W:9/k:2/s:2/pad:0/layout:nchw", "zero_input"},
      {"lstm", "f32/fwd/shape:test/batch:2/T:3/input:5/hidden:7/dir:uni", "shift_output"},
      {"lstm", "f32/fwd/shape:test/batch:2/T:3/input:5/hidden:7/dir:uni", "zero_input"},
      {"lstm", "f32/bwd/shape:test/batch:2/T:3/input:5/hidden:7/dir:uni", "shift_output"},
      {"lstm_cell", "f32/fwd/shape:test/batch:3/input:5/hidden:7", "shift_output"},
      {"lstm_cell", "f32/fwd/shape:test/batch:3/input:5/hidden:7", "zero_input"},
      {"lstm_cell", "f32/bwd/shape:test/batch:3/input:5/hidden:7", "swap_inputs"},
  };
  return m;
}

// Sets a mutation for one scope.
struct MutationScope {
  explicit MutationScope(const std::string& m) { set_test_mutation(m); }
  ~MutationScope() { set_test_mutation(""); }
  MutationScope(const MutationScope&) = delete;
  MutationScope& operator=(const MutationScope&) = delete;
};

void expect_caught(const Mutant& m, Backend b) {
  const std::string want = m.op + "/" + backend_name(b) + "/" + m.problem;
  for (const Family* family : families())
    for (const Problem& p : family->test_problems()) {
      if (p.name().rfind(want, 0) != 0) continue;
      const std::string why = family->unsupported_reason(p);
      if (!why.empty()) GTEST_SKIP() << why;
      {
        const Check clean = family->make(p)->verify();
        ASSERT_TRUE(clean.ok) << p.name() << ": " << clean.message;
      }
      MutationScope scope(m.mutation);
      const Check c = family->make(p)->verify();
      EXPECT_FALSE(c.ok) << p.name() << " with the planted bug " << m.mutation << " passed verification";
      return;
    }
  FAIL() << "no test problem " << want;
}

class Mutation : public testing::TestWithParam<Mutant> {};

TEST_P(Mutation, FailsVerificationOnTheCpu) { expect_caught(GetParam(), Backend::cpu); }

TEST_P(Mutation, FailsVerificationOnCuda) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  expect_caught(GetParam(), Backend::cuda);
}

std::string mutant_name(const testing::TestParamInfo<Mutant>& info) {
  std::string n = info.param.op + "_" + info.param.problem + "_" + info.param.mutation;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Planted, Mutation, testing::ValuesIn(mutants()), mutant_name);

TEST(Mutation, AnUnknownNameIsRefused) { EXPECT_THROW(set_test_mutation("drop_everything"), Error); }

}  // namespace
}  // namespace hotops
