// The gradient all-reduce of a data-parallel train step (data_parallel.h): NCCL on a second stream,
// forked from hotops' stream at each bucket's event and joined back, bucket by bucket, before that
// bucket's optimizer (or, for a bucket updated during the backward, its optimizer on a third stream
// joined back after the backward), so that the whole step (every stream) can be captured in one
// CUDA graph.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "hotops/cuda_util.h"
#include "hotops/gpu.h"
#include "hotops/nccl_util.h"
#include "hotops/trace.h"
#include "kernels/copy/copy.h"
#include "kernels/models/data_parallel.h"

namespace hotops::models {

struct GradSync::Impl {
  Replica replica;
  DType wire;                           // the all-reduce's dtype
  float* grads = nullptr;
  gpu::DeviceBuffer wire16;             // bf16 wire: a bucket's gradients as sent (one bucket at a time)
  BucketPlan plan;
  std::size_t cap;                      // the buckets' least size, floats
  ncclComm_t comm = nullptr;
  cudaStream_t side = nullptr;          // the all-reduces' stream
  cudaStream_t opt = nullptr;           // the optimizer's, for the buckets updated during the backward
  std::vector<cudaEvent_t> events;      // up to four per bucket of a step; reused every step
  std::size_t used = 0;                 // events used in the step in progress
  struct Issued {
    Bucket bucket;
    cudaEvent_t reduced;                // on the side stream, after the bucket's all-reduce
    cudaEvent_t updated = nullptr;      // on the optimizer's stream, after its update there (params_done)
  };
  std::vector<Issued> issued;           // the step's buckets so far, in the order of their all-reduces
  // params_done in the step in progress: the parameters [unread_from, total) are no longer read, as of
  // the event `unread` on hotops' stream, and `early` updates the buckets there.
  std::size_t unread_from = SIZE_MAX;
  cudaEvent_t unread = nullptr;
  GradSync::Update early;
  int buckets = 0, last_buckets = 0;    // in the step in progress, in the last complete one
  int early_buckets = 0, last_early = 0;  // of those, updated during the backward
  gpu::DeviceBuffer scratch;            // the barrier's element; verification's exchanges

  Impl(const Replica& r, DType w, float* g, std::size_t total, std::size_t c)
      : replica(r), wire(w), grads(g), plan(total, c), cap(c) {}
  ~Impl() {  // also where the constructor stopped part way
    if (side) cudaStreamSynchronize(side);
    if (opt) cudaStreamSynchronize(opt);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (side) cudaStreamDestroy(side);
    if (opt) cudaStreamDestroy(opt);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The events are made up front, none while a step is being captured: at most total / cap + 1
  // buckets (each but the last has cap floats or more), four each: its fork and join, its update's
  // join and a params_done event (at most one a bucket: each that counts names a new bucket's range).
  void make_events(std::size_t total) {
    issued.reserve(total / cap + 1);
    for (std::size_t n = 4 * (total / cap + 1); events.size() < n;) {
      cudaEvent_t e;
      HOTOPS_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events.push_back(e);
    }
  }
  cudaEvent_t next_event() {
    HOTOPS_CHECK(used < events.size(), "a data-parallel step used more gradient buckets than its size allows");
    return events[used++];
  }

  // The bucket's all-reduce on the side stream, after the work queued on hotops' stream so far, and
  // the event its optimizer waits on. A bf16 wire: the bucket cast to bf16, all-reduced, and cast
  // back into the f32 gradients, all on the side stream (whose order keeps the buckets' casts apart,
  // so that they share one buffer).
  void reduce(const Bucket& b) {
    const cudaEvent_t at = next_event(), reduced = next_event();
    HOTOPS_CHECK_CUDA(cudaEventRecord(at, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamWaitEvent(side, at, 0));
    const std::size_t n = b.end - b.begin;
    if (wire == DType::bf16) {
      copy::cuda_convert(copy::Kind::f32_to_bf16, grads + b.begin, wire16.get(), n, side);
      HOTOPS_CHECK_NCCL(ncclAllReduce(wire16.get(), wire16.get(), n, ncclBfloat16, ncclAvg, comm, side));
      copy::cuda_convert(copy::Kind::bf16_to_f32, wire16.get(), grads + b.begin, n, side);
    } else {
      HOTOPS_CHECK_NCCL(ncclAllReduce(grads + b.begin, grads + b.begin, n, ncclFloat32, ncclAvg, comm, side));
    }
    HOTOPS_CHECK_CUDA(cudaEventRecord(reduced, side));
    issued.push_back({b, reduced});
    ++buckets;
    update_early(issued.back());
  }

  // The bucket's update on the optimizer's stream, once its all-reduce is done and its parameters are
  // no longer read; never the step's last bucket (the one that reaches 0), whose update advances the
  // step count after every other one.
  void update_early(Issued& i) {
    if (i.updated || !early || i.bucket.begin < unread_from || i.bucket.begin == 0) return;
    HOTOPS_CHECK_CUDA(cudaStreamWaitEvent(opt, i.reduced, 0));
    HOTOPS_CHECK_CUDA(cudaStreamWaitEvent(opt, unread, 0));
    early(i.bucket, false, opt);
    i.updated = next_event();
    HOTOPS_CHECK_CUDA(cudaEventRecord(i.updated, opt));
    ++early_buckets;
  }
};

GradSync::GradSync(const Replica& r, DType wire, float* grads, std::size_t total, std::size_t cap)
    : impl_(std::make_unique<Impl>(r, wire, grads, total, cap)) {
  Impl& s = *impl_;
  HOTOPS_CHECK(wire == DType::f32 || wire == DType::bf16, "a data-parallel step all-reduces f32 or bf16 gradients");
  if (wire == DType::bf16) s.wire16 = gpu::DeviceBuffer(total * sizeof(std::uint16_t));
  if (comm::world_size() == 1) comm::prepare(r.gpus);  // a process alone: its own communicator (gpus 1)
  s.comm = comm::get(r.gpus);
  HOTOPS_CHECK(s.comm, "rank " + std::to_string(r.rank) + " is not among the " + std::to_string(r.gpus) +
                           " ranks of this data-parallel step");
  int n = 0;
  HOTOPS_CHECK_NCCL(ncclCommCount(s.comm, &n));
  HOTOPS_CHECK(n == r.gpus, "the communicator of " + std::to_string(r.gpus) + " GPUs has " + std::to_string(n) + " ranks");
  // The all-reduces' stream has the device's highest priority: a bucket's NCCL kernel takes the next
  // free SMs instead of queueing behind the backward's pending blocks, so that it starts on every rank
  // at about the same time (its blocks on a rank that started it first only wait for the others).
  int least = 0, greatest = 0;
  HOTOPS_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  HOTOPS_CHECK_CUDA(cudaStreamCreateWithPriority(&s.side, cudaStreamNonBlocking, greatest));
  HOTOPS_CHECK_CUDA(cudaStreamCreateWithFlags(&s.opt, cudaStreamNonBlocking));
  s.make_events(total);
  s.scratch = gpu::DeviceBuffer(sizeof(double) * static_cast<std::size_t>(r.gpus));
  HOTOPS_CHECK_CUDA(cudaMemsetAsync(s.scratch.get(), 0, s.scratch.bytes(), gpu::stream()));
}

GradSync::~GradSync() = default;

void GradSync::ready(std::size_t from) {
  if (const auto b = impl_->plan.ready(from)) impl_->reduce(*b);
}

void GradSync::params_done(std::size_t from, const Update& update) {
  Impl& s = *impl_;
  if (from >= s.unread_from) return;
  s.unread_from = from;
  s.unread = s.next_event();
  HOTOPS_CHECK_CUDA(cudaEventRecord(s.unread, gpu::stream()));
  s.early = update;
  for (Impl::Issued& i : s.issued) s.update_early(i);
}

void GradSync::finish(const Update& update) {
  Impl& s = *impl_;
  if (const auto b = s.plan.finish()) s.reduce(*b);
  // Every event the waits name was recorded in this step: a captured step's waits are edges of its
  // graph. The side stream's last event and every update on the optimizer's stream are among them,
  // so hotops' stream joins both before the end (the optimizer's stream waits only before its work).
  for (std::size_t k = 0; k < s.issued.size(); ++k) {
    const Impl::Issued& i = s.issued[k];
    if (i.updated) {
      trace::op("adamw");
      HOTOPS_CHECK_CUDA(cudaStreamWaitEvent(gpu::stream(), i.updated, 0));
      continue;
    }
    trace::op("allreduce");
    HOTOPS_CHECK_CUDA(cudaStreamWaitEvent(gpu::stream(), i.reduced, 0));
    update(i.bucket, k + 1 == s.issued.size(), gpu::stream());
  }
  s.issued.clear();
  s.last_buckets = s.buckets, s.buckets = 0, s.used = 0;
  s.last_early = s.early_buckets, s.early_buckets = 0;
  s.unread_from = SIZE_MAX, s.unread = nullptr, s.early = nullptr;
}

void GradSync::align() {
  Impl& s = *impl_;
  HOTOPS_CHECK_NCCL(ncclAllReduce(s.scratch.get(), s.scratch.get(), 1, ncclFloat32, ncclSum, s.comm, gpu::stream()));
}

void GradSync::all_gather(const void* mine, void* all, std::size_t bytes) {
  HOTOPS_CHECK_NCCL(ncclAllGather(mine, all, bytes, ncclUint8, impl_->comm, gpu::stream()));
  gpu::synchronize();
}

double GradSync::mean_over_ranks(double mine) {
  Impl& s = *impl_;
  std::vector<double> all(static_cast<std::size_t>(s.replica.gpus));
  double* d = s.scratch.as<double>();
  HOTOPS_CHECK_CUDA(cudaMemcpyAsync(d + s.replica.rank, &mine, sizeof mine, cudaMemcpyHostToDevice, gpu::stream()));
  all_gather(d + s.replica.rank, d, sizeof mine);
  HOTOPS_CHECK_CUDA(cudaMemcpy(all.data(), d, all.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (double x : all) sum += x;
  return sum / static_cast<double>(all.size());
}

Check GradSync::replicas_agree(const std::vector<std::pair<std::string, const HostBuffer*>>& tensors) {
  Impl& s = *impl_;
  const std::size_t G = static_cast<std::size_t>(s.replica.gpus);
  Check c;
  for (const auto& [what, t] : tensors) {
    // The hash as a double's bytes: the scratch holds one per rank.
    const std::uint64_t mine = bytes_hash(t->data(), t->bytes());
    std::vector<std::uint64_t> all(G);
    auto* d = s.scratch.as<std::uint64_t>();
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(d + s.replica.rank, &mine, sizeof mine, cudaMemcpyHostToDevice, gpu::stream()));
    all_gather(d + s.replica.rank, d, sizeof mine);
    HOTOPS_CHECK_CUDA(cudaMemcpy(all.data(), d, G * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
    c.checked += t->count();
    for (std::size_t r = 1; r < G; ++r)
      if (all[r] != all[0] && c.ok) {
        c.ok = false;
        c.message = "the replicas differ after one step: rank " + std::to_string(r) + "'s " + what +
                    " are not bitwise rank 0's (" + std::to_string(t->count()) + " values hashed)";
      }
  }
  return c;
}

int GradSync::buckets() const { return impl_->last_buckets; }

std::string GradSync::label() const {
  const Impl& s = *impl_;
  char text[400];
  std::snprintf(text, sizeof text,
                "; data parallel over %d GPU%s: NCCL %s all-reduce (avg) of the %s in %d bucket%s "
                "(%.3g MiB of f32 or more but the last), on a second stream (high priority) overlapping the backward, AdamW a "
                "launch per bucket after its all-reduce",
                s.replica.gpus, s.replica.gpus == 1 ? "" : "s", comm::nccl_version().c_str(),
                s.wire == DType::bf16 ? "gradients in bf16 (cast from f32 and back)" : "f32 gradients", s.last_buckets,
                s.last_buckets == 1 ? "" : "s", static_cast<double>(s.cap) * sizeof(float) / 1048576.0);
  std::string l = text;
  if (s.last_early)
    l += " (" + std::to_string(s.last_early) + " of them during the backward, on a third stream, once it no longer reads their parameters)";
  return l;
}

}  // namespace hotops::models
