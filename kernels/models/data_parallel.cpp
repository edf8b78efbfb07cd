// Data-parallel train steps: names, shards of the global batch, the gradient buckets (CPU logic), and
// the GradSync of a build without NCCL (nccl_data_parallel.cu has the one with NCCL).
#include "kernels/models/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "hotops/check.h"
#include "hotops/comm.h"
#include "hotops/gpu.h"
#include "hotops/ranks.h"
#include "kernels/collectives/collectives.h"

namespace hotops::models {

Replica replica_of(const Problem& p) {
  Replica r;
  r.gpus = static_cast<int>(p.get_int("gpus"));
  r.rank = ranks::layout().rank;
  HOTOPS_CHECK(r.gpus >= 1 && (r.gpus & (r.gpus - 1)) == 0,
               "a data-parallel step takes a power of two GPUs (its gradient average is exact then): " + p.name());
  HOTOPS_CHECK(r.rank < r.gpus, "rank " + std::to_string(r.rank) + " is not among the " + std::to_string(r.gpus) +
                                    " ranks of " + p.name());
  return r;
}

Problem global_problem(const Problem& p) {
  Problem q = p;
  const std::int64_t global = p.get_int("batch") * p.get_int("gpus");
  q.args.erase(std::remove_if(q.args.begin(), q.args.end(), [](const Arg& a) { return a.key == "gpus"; }), q.args.end());
  for (Arg& a : q.args)
    if (a.key == "batch") a.value = std::to_string(global);
  return q;
}

namespace {
void add_at(const std::string& model, std::int64_t batch, int gpus, std::vector<Problem>& out, const std::vector<Arg>& leading) {
  std::vector<Arg> args = leading;
  args.push_back({"batch", std::to_string(batch)});
  args.push_back({"gpus", std::to_string(gpus)});
  for (DType t : {DType::f32, DType::bf16}) out.push_back(Problem{"model." + model, Backend::cuda, t, Direction::train, args});
}
}  // namespace

void add_data_parallel_problems(const std::string& model, std::int64_t batch, std::vector<Problem>& out,
                                const std::vector<Arg>& leading) {
  for (int g : kDataParallelGpus) add_at(model, batch, g, out, leading);
}

void add_data_parallel_test_problems(const std::string& model, std::int64_t batch, std::vector<Problem>& out,
                                     const std::vector<Arg>& leading) {
  add_at(model, batch, 1, out, leading);
}

Work over_replicas(const Problem& p, Work w) {
  if (!p.has("gpus")) return w;
  const auto g = static_cast<double>(p.get_int("gpus"));
  w.flops *= g, w.bytes *= g, w.items *= g;
  return w;
}

std::string data_parallel_reason(const Problem& p) {
  std::string why;
  if (!gpu::available(&why) || !comm::built(&why)) return why;
  return collectives::gpus_unsupported_reason(static_cast<int>(p.get_int("gpus")), ranks::layout(), gpu::device_count());
}

HostBuffer shard(const HostBuffer& global, std::size_t per_sample, const Replica& r, std::int64_t batch) {
  const std::size_t n = static_cast<std::size_t>(batch) * per_sample, e = dtype_size(global.dtype());
  HOTOPS_CHECK(global.count() >= static_cast<std::size_t>(r.rank + 1) * n, "a shard beyond its global batch");
  HostBuffer out(global.dtype(), n);
  std::memcpy(out.data(), static_cast<const std::byte*>(global.data()) + static_cast<std::size_t>(r.rank) * n * e, n * e);
  return out;
}

std::optional<Bucket> BucketPlan::ready(std::size_t from) {
  HOTOPS_CHECK(from <= reduced_from_, "gradients said final at " + std::to_string(from) + " after those from " +
                                          std::to_string(reduced_from_) + " were reduced");
  if (from == reduced_from_ || (reduced_from_ - from < cap_ && from > 0)) return std::nullopt;
  const Bucket b{from, reduced_from_};
  reduced_from_ = from;
  return b;
}

std::optional<Bucket> BucketPlan::finish() {
  const std::size_t left = reduced_from_;
  reduced_from_ = total_;  // the next step starts
  if (left == 0) return std::nullopt;
  return Bucket{0, left};
}

std::uint64_t bytes_hash(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 8 bytes at a time
  const auto* b = static_cast<const unsigned char*>(data);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

#ifndef HOTOPS_HAVE_NCCL
struct GradSync::Impl {};
GradSync::GradSync(const Replica&, DType, float*, std::size_t, std::size_t) {
  std::string why;
  comm::built(&why);
  throw Error(why, ErrorKind::unsupported);
}
GradSync::~GradSync() = default;
void GradSync::ready(std::size_t) {}
void GradSync::params_done(std::size_t, const Update&) {}
void GradSync::finish(const Update&) {}
void GradSync::align() {}
double GradSync::mean_over_ranks(double mine) { return mine; }
void GradSync::all_gather(const void*, void*, std::size_t) {}
Check GradSync::replicas_agree(const std::vector<std::pair<std::string, const HostBuffer*>>&) { return Check{}; }
int GradSync::buckets() const { return 0; }
std::string GradSync::label() const { return ""; }
#endif

}  // namespace hotops::models
