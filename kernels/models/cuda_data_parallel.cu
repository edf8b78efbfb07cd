// The AdamW step of the train steps that may run data parallel (data_parallel.h): one launch over the
// flat arrays on one GPU, a launch per gradient bucket after its all-reduce over several; and the
// verification's gather of the global batch's leading samples.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/models/data_parallel.h"

namespace hotops::models {

namespace {

// AdamW over floats [begin, end) of the arrays on `stream`, advancing the step count where `advancing`.
void adamw_range(const AdamwArrays& a, std::size_t begin, std::size_t end, const adamw::Hyper* advancing, cudaStream_t stream) {
  adamw::cuda_step(a.p + begin, a.g + begin, a.m + begin, a.v + begin, a.p16 ? a.p16 + begin : nullptr,
                   static_cast<std::int64_t>(end - begin), a.state, advancing, stream, a.max_blocks);
}

}  // namespace

void adamw_step(const std::unique_ptr<GradSync>& sync, const AdamwArrays& a) {
  if (!sync) {
    trace::op("adamw");
    return adamw_range(a, 0, a.total, a.advance, gpu::stream());
  }
  // The launches before the last read the step's scalars as the last one does, which then advances
  // the count (every earlier launch is done before it starts): one step number for every bucket,
  // one step counted.
  sync->finish([&](const Bucket& b, bool last, cudaStream_t stream) {
    trace::op("adamw");
    adamw_range(a, b.begin, b.end, last ? a.advance : nullptr, stream);
  });
}

void params_done(const std::unique_ptr<GradSync>& sync, std::size_t from, const AdamwArrays& a) {
  if (!sync) return;
  // Not traced: these launches overlap the backward on a stream of their own; the breakdown shows
  // what they cost the backward, and the wait for them before the last bucket's update ("adamw").
  sync->params_done(from, [a](const Bucket& b, bool, cudaStream_t stream) { adamw_range(a, b.begin, b.end, nullptr, stream); });
}

HostBuffer leading_samples(GradSync& sync, const Replica& r, const void* mine, DType t, std::size_t per_sample, std::int64_t batch,
                           std::int64_t count) {
  const std::int64_t gpus = r.gpus, sent = std::min(batch, count);
  HOTOPS_CHECK(count <= gpus * batch, "leading_samples: more samples than the global batch holds");
  const std::size_t sample = per_sample * dtype_size(t), part = static_cast<std::size_t>(sent) * sample;
  gpu::DeviceBuffer all(std::max<std::size_t>(1, part * static_cast<std::size_t>(gpus)));
  sync.all_gather(mine, all.get(), part);
  HostBuffer gathered(t, per_sample * static_cast<std::size_t>(sent * gpus));
  all.download(gathered);
  // Global sample g is rank g / batch's sample g % batch, which is < sent (g < count).
  HostBuffer out(t, per_sample * static_cast<std::size_t>(count));
  for (std::int64_t g = 0; g < count; ++g)
    std::memcpy(static_cast<std::byte*>(out.data()) + static_cast<std::size_t>(g) * sample,
                static_cast<const std::byte*>(gathered.data()) + static_cast<std::size_t>((g / batch) * sent + g % batch) * sample,
                sample);
  return out;
}

HostBuffer step_samples(GradSync* sync, const Replica& r, const void* mine, DType t, std::size_t per_sample, std::int64_t batch,
                        std::int64_t global_batch) {
  if (sync) return leading_samples(*sync, r, mine, t, per_sample, batch, global_batch);
  HostBuffer h(t, static_cast<std::size_t>(batch) * per_sample);
  gpu::copy(h.data(), mine, h.bytes(), cudaMemcpyDeviceToHost);
  return h;
}

}  // namespace hotops::models
