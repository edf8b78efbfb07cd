// The JSON context of every run: what was measured, with what, on what.
#include <benchmark/benchmark.h>

#include "bench/git_revision.h"
#include "bench/roofline.h"
#include "bench/runner.h"
#include "hotops/comm.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "hotops/ranks.h"

namespace hotops::bench {

void add_context(const Options& o, const std::vector<std::string>& rank_gpus) {
  using benchmark::AddCustomContext;
  AddCustomContext("hotops_version", HOTOPS_VERSION);
  AddCustomContext("hotops_git_revision", git_revision());
#if defined(__clang__)
  AddCustomContext("compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  AddCustomContext("compiler", "gcc " __VERSION__);
#endif
  AddCustomContext("build_type", HOTOPS_BUILD_TYPE);
  AddCustomContext("cpu_model", cpu::cpu_model());
  AddCustomContext("onednn_isa", cpu::isa_name());
  AddCustomContext("onednn_version", cpu::onednn_version());
  AddCustomContext("threads", std::to_string(cpu::threads()));
  AddCustomContext("hotops_seed", std::to_string(o.seed));
  AddCustomContext("hotops_verify", o.verify ? "1" : "0");
  AddCustomContext("hotops_cold_l2", o.cold_l2 ? "1" : "0");
  AddCustomContext("hotops_throttle_threshold", std::to_string(o.throttle_threshold));
  AddCustomContext("hotops_runs_per_sample", std::to_string(o.runs_per_sample));
  AddCustomContext("hotops_shuffle_layout", o.shuffle_layout ? "1" : "0");
  AddCustomContext("hotops_choices", o.choices.empty() ? "none" : o.choices);
  AddCustomContext("hotops_cpu_ftz", o.cpu_ftz ? "1" : "0");
  AddCustomContext("hotops_max_noise", std::to_string(o.max_noise));  // 0: the stopping rule is off
  if (o.max_noise > 0) {
    AddCustomContext("hotops_min_samples", std::to_string(o.min_samples));
    AddCustomContext("hotops_timeout", std::to_string(o.timeout));
  }
  // How entries were sampled: hotops' own loop for at least this long, or Google Benchmark's loop
  // (--benchmark_min_time=<N>x).
  AddCustomContext("hotops_min_time", o.own_loop ? std::to_string(o.min_seconds) : "google benchmark's loop");
  for (const auto& [backend, c] : roofline().ceilings) {
    const std::string prefix = std::string("roofline_") + backend_name(backend);
    if (c.bytes_per_second > 0) AddCustomContext(prefix + "_copy_GBps", std::to_string(c.bytes_per_second / 1e9));
    for (const auto& [t, f] : c.flops) AddCustomContext(prefix + "_" + dtype_name(t) + "_gemm_TFLOPs", std::to_string(f / 1e12));
  }
  if (comm::built()) AddCustomContext("nccl_version", comm::nccl_version());
  // A run over several GPUs: how many, and each rank's machine and GPU.
  const ranks::Layout& l = ranks::layout();
  AddCustomContext("gpus_in_run", std::to_string(l.world));
  if (l.world > 1) AddCustomContext("gpus_in_run_from", l.source);
  for (std::size_t r = 0; r < rank_gpus.size(); ++r) AddCustomContext("rank_" + std::to_string(r) + "_gpu", rank_gpus[r]);
  std::string why;
  if (!gpu::available(&why)) {
    AddCustomContext("gpu", "none: " + why);
    return;
  }
  const gpu::Info g = gpu::info();
  AddCustomContext("gpu_name", g.name);
  AddCustomContext("gpu_sm_count", std::to_string(g.sm_count));
  AddCustomContext("gpu_memory_mib", std::to_string(g.memory_bytes >> 20));
  AddCustomContext("gpu_l2_kib", std::to_string(g.l2_bytes >> 10));
  AddCustomContext("gpu_sm_clock_mhz", std::to_string(g.sm_clock_mhz));
  AddCustomContext("gpu_mem_clock_mhz", std::to_string(g.mem_clock_mhz));
  AddCustomContext("cuda_driver_version", g.driver_version);
  AddCustomContext("cuda_runtime_version", g.runtime_version);
  AddCustomContext("cublas_version", g.cublas_version);
  AddCustomContext("cudnn_version", g.cudnn_version);
}

}  // namespace hotops::bench
