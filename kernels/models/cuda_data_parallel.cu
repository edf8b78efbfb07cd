// The AdamW step of the train steps that may run data parallel (data_parallel.h): one launch over the
// flat arrays on one GPU, a launch per gradient bucket after its all-reduce over several.
#include <cstdint>

#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/models/data_parallel.h"

namespace hotops::models {

void adamw_step(const std::unique_ptr<GradSync>& sync, float* p, const float* g, float* m, float* v, std::uint16_t* p16,
                std::size_t total, adamw::DeviceStep* state, const adamw::Hyper* advance) {
  auto update = [&](std::size_t begin, std::size_t end, const adamw::Hyper* advancing) {
    trace::op("adamw");
    adamw::cuda_step(p + begin, g + begin, m + begin, v + begin, p16 ? p16 + begin : nullptr,
                     static_cast<std::int64_t>(end - begin), state, advancing, gpu::stream());
  };
  if (!sync) return update(0, total, advance);
  // The launches before the last read the step's scalars as the last one does, which then advances
  // the count (the stream runs them in order): one step number for every bucket, one step counted.
  sync->finish([&](const Bucket& b, bool last) { update(b.begin, b.end, last ? advance : nullptr); });
}

}  // namespace hotops::models
