// The shared start, bounds and CPU check of the model steps trained with the MSE against a target.
#include "kernels/models/regression.h"

#include "hotops/cpu.h"
#include "kernels/matmul/matmul.h"

namespace hotops::models::regression {

State seeded_start(DType t, std::size_t n, std::size_t total, std::uint64_t seed) {
  State st;
  st.x = HostBuffer(t, n);
  st.x.fill_uniform(seed, 1);
  st.target = HostBuffer(t, n);
  st.target.fill_uniform(seed, 2);
  st.params = HostBuffer(DType::f32, total);
  zero_bytes(st.params.data(), st.params.bytes());
  zero_moments(st.m, st.v, total);
  return st;
}

State periodic_start(const State& seeded, DType t, std::size_t per, std::int64_t batch) {
  State st = seeded;
  const std::size_t bytes = per * dtype_size(t);
  repeat_samples(st.x, bytes, kVerifyPeriod, batch);
  repeat_samples(st.target, bytes, kVerifyPeriod, batch);
  return st;
}

StepBounds bounds(DType t) {
  if (t == DType::bf16) return {5e-2, 1e-3, 3e-1, 1e-2, 2e-2};
  return {1e-4, 1e-4, 1e-3};
}

std::string cpu_bf16_reason() {
  static const std::string reason = [] {
    try {
      // A bf16 addmm large enough for oneDNN (the matmul plans' own loops take those below kCpuLoopMacs).
      matmul::Shape m;
      m.op = matmul::Op::addmm, m.dtype = DType::bf16, m.M = m.N = m.K = 64;
      static_assert(64 * 64 * 64 >= matmul::kCpuLoopMacs);
      matmul::make_cpu_plan(m);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      return "oneDNN has no bf16 matmul for this CPU (ISA " + cpu::isa_name() + ")";
    }
    return std::string();
  }();
  return reason;
}

}  // namespace hotops::models::regression
