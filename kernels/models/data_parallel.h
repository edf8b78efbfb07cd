// Data-parallel train steps over several GPUs, as PyTorch DDP runs them: every rank (one process per
// GPU) holds the same parameters, runs the model's own train step on its shard of a global batch, and
// all-reduces the gradients (NCCL, averaged over the ranks) in buckets, in backward order, on a
// second stream while the rest of the backward runs; AdamW updates each bucket's range of the flat
// parameters as soon as that bucket's all-reduce is done: during the backward where the step no
// longer reads those parameters (params_done), else after it.
// Names: model.<m>/cuda/<f32|bf16>/train/batch:B/gpus:G, B per GPU (weak scaling), G in {2, 4, 8};
// test problems have gpus:1 (a communicator of one process). docs/scaling.md, "Data-parallel steps".
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/problem.h"
#include "hotops/verify.h"
#include "kernels/adamw/adamw.h"
#include "kernels/models/models.h"

struct CUstream_st;  // cudaStream_t is a CUstream_st*

namespace hotops::models {

constexpr int kDataParallelGpus[] = {2, 4, 8};  // the GPU counts of the benchmark problems (the collectives')

// Where this process stands in a data-parallel step: one of `gpus` replicas.
struct Replica {
  int gpus = 1;
  int rank = 0;
};
// The replica of a problem with a gpus:G arg, this process's rank from ranks::layout().
Replica replica_of(const Problem& p);

// The single-GPU problem whose batch is the data-parallel step's global batch: the name less its
// gpus arg, batch G x B. Its seed seeds the global batch and the parameters, so that a data-parallel
// step and that single-GPU step start from the same numbers (and share one reference).
Problem global_problem(const Problem& p);

// The data-parallel train problems of one model at one per-GPU batch: every G of kDataParallelGpus,
// f32 and bf16, appended to `out`; `leading`: args named before the batch (e.g. shape:S).
void add_data_parallel_problems(const std::string& model, std::int64_t batch, std::vector<Problem>& out,
                                const std::vector<Arg>& leading = {});

// The data-parallel problems of every model of `ms` (each with a name and its batches) at its
// batches, or at `asked` (--hotops_batch) where not empty: the per-GPU batches of its own train steps.
template <class Models>
std::vector<Problem> data_parallel_problems(const Models& ms, const std::vector<std::int64_t>& asked) {
  std::vector<Problem> out;
  for (const auto& m : ms)
    for (std::int64_t b : asked.empty() ? std::vector<std::int64_t>(m.batches) : asked) add_data_parallel_problems(m.name, b, out);
  return out;
}
// The benchmark problems of a family whose train steps also run data-parallel: every model of `ms`'s
// single-GPU and CPU steps (step_problems, with the thread sweep and the graph variants), then its
// data-parallel train steps at the same per-GPU batches.
template <class Models>
std::vector<Problem> steps_and_data_parallel_problems(const Models& ms, const std::vector<std::int64_t>& asked) {
  std::vector<Problem> out = step_problems(ms, asked, thread_sweep(), true);
  for (const Problem& p : data_parallel_problems(ms, asked)) out.push_back(p);
  return out;
}

// The test problems: gpus:1 (a communicator of this process alone), f32 and bf16.
void add_data_parallel_test_problems(const std::string& model, std::int64_t batch, std::vector<Problem>& out,
                                     const std::vector<Arg>& leading = {});
// The work of a data-parallel problem: G times `one_gpu` (flops, bytes and items); `one_gpu` as is
// for any other problem.
Work over_replicas(const Problem& p, Work one_gpu);

// Why a data-parallel problem cannot run here ("" when it can): no GPU, no NCCL in the build, or fewer
// GPUs in the run than it needs (what the collectives say).
std::string data_parallel_reason(const Problem& p);

// A model family with data-parallel train steps, its cases C: a problem with a gpus arg can run where
// data_parallel_reason says so; the others as the family's CPU and CUDA steps can.
// Its work: a data-parallel step (gpus:G) does G replicas' work, G times one GPU's (items: the global
// batch), one_gpu_work the family's count for one step on one device.
template <class C = ModelCase>
class DataParallelModelFamily : public BackendFamily<C> {
 public:
  using BackendFamily<C>::BackendFamily;
  std::string unsupported_reason(const Problem& p) const override {
    if (p.has("gpus")) return data_parallel_reason(p);
    return BackendFamily<C>::unsupported_reason(p);
  }
  Work work(const Problem& p) const final { return over_replicas(p, one_gpu_work(p)); }
  virtual Work one_gpu_work(const Problem& p) const = 0;
};

// Rank r's shard of a global batch of tensors whose samples are `per_sample` elements each: samples
// r x batch .. (r + 1) x batch - 1, where `batch` is the per-GPU batch.
HostBuffer shard(const HostBuffer& global, std::size_t per_sample, const Replica& r, std::int64_t batch);
template <class T>
std::vector<T> shard(const std::vector<T>& global, std::size_t per_sample, const Replica& r, std::int64_t batch) {
  const std::size_t n = static_cast<std::size_t>(batch) * per_sample, at = static_cast<std::size_t>(r.rank) * n;
  return std::vector<T>(global.begin() + static_cast<std::ptrdiff_t>(at), global.begin() + static_cast<std::ptrdiff_t>(at + n));
}

// The gradient buckets of one step, over a flat f32 gradient buffer of `total` floats whose tensors
// the backward completes from the end towards the start (the models' layouts put the first layer
// first). The step says where the gradients are final (ready: [from, total) is), and the plan answers
// with the bucket to all-reduce now: every final gradient not yet in a bucket, once there are at
// least `cap` floats of them or the last (from = 0) has come, as DDP's buckets of bucket_cap_mb.
// CPU logic only: the tests run it here.
constexpr std::size_t kBucketFloats = std::size_t(1) << 18;  // 1 MiB of f32 gradients
struct Bucket {
  std::size_t begin = 0, end = 0;  // floats [begin, end) of the flat gradients
};
class BucketPlan {
 public:
  BucketPlan(std::size_t total, std::size_t cap) : total_(total), cap_(cap), reduced_from_(total) {}
  std::optional<Bucket> ready(std::size_t from);  // throws an Error when `from` goes backwards
  // At the end of every step: the rest of its gradients, in one bucket, when its last ready() was not
  // at 0; the plan then starts the next step.
  std::optional<Bucket> finish();

 private:
  std::size_t total_, cap_, reduced_from_;
};

// The gradient all-reduce of a data-parallel step on CUDA (NCCL): buckets of `grads` (device memory,
// `total` f32) all-reduced in place with ncclAvg (the sum over the ranks times 1/G; G is a power of
// two, so the scaling is exact) on a stream of its own, in `wire`: f32, or bf16 for the bf16 steps
// (each bucket cast to bf16, all-reduced, and cast back into `grads`, as PyTorch DDP's
// bf16_compress_hook does: half the bytes on the links and through memory), each after an event on gpu::stream() where
// the step said the bucket's gradients are final, and each followed by an event of its own that the
// optimizer of that bucket waits on. Everything is queued: a step with it can be captured in a CUDA
// graph. In a build without NCCL making one throws an unsupported Error.
class GradSync {
 public:
  GradSync(const Replica& r, DType wire, float* grads, std::size_t total, std::size_t cap = kBucketFloats);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // The optimizer over one bucket's range, queued on `stream` (a cudaStream_t); `last`: the step's
  // last bucket, whose update runs after every other one's.
  using Update = std::function<void(const Bucket&, bool last, CUstream_st* stream)>;

  // The step: gradients [from, total) are final on gpu::stream() (BucketPlan::ready).
  void ready(std::size_t from);
  // The step: from here on gpu::stream() reads none of the parameters [from, total) (its backward has
  // passed the last GEMM and LayerNorm that read them). Every bucket in that range but the step's last
  // is then updated as soon as its all-reduce is done, by `update` on a stream of the optimizer's own,
  // while the backward goes on (also the buckets whose all-reduce this step issues later).
  void params_done(std::size_t from, const Update& update);
  // The step, after its backward: the rest of its gradients in a last bucket; then, for every bucket
  // of the step in the order of their all-reduces, gpu::stream() waits for that all-reduce (marked
  // "allreduce" in the per-op breakdown) and `update` queues the optimizer over its range on
  // gpu::stream(), or, for a bucket updated during the backward (params_done), waits for that update
  // (marked "adamw"). The buckets reduced during the backward are thus updated while the last one's
  // all-reduce is still in flight.
  void finish(const Update& update);
  // A barrier of the ranks' GPUs on gpu::stream() (Case::align).
  void align();

  // Verification (synchronises): the mean over the ranks of a value of each rank's; every rank's
  // `bytes` of device memory at `mine` gathered into `all` (G x bytes, by rank); and whether every
  // rank holds the same bytes in each of `tensors` (a hash of each, gathered: a failed Check names
  // the first rank that differs from rank 0).
  double mean_over_ranks(double mine);
  void all_gather(const void* mine, void* all, std::size_t bytes);
  Check replicas_agree(const std::vector<std::pair<std::string, const HostBuffer*>>& tensors);

  int buckets() const;  // all-reduces in the last complete step
  std::string label() const;  // ", data parallel over G GPUs: NCCL x.y.z all-reduce (avg) of N buckets, ..."

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A train step's calls, nothing more for a single-GPU step (`sync` null): gradients [from, total)
// are final (GradSync::ready).
inline void grads_ready(const std::unique_ptr<GradSync>& sync, std::size_t from) {
  if (sync) sync->ready(from);
}
#ifdef HOTOPS_HAVE_CUDA
// The step's AdamW over its flat f32 arrays of `total` floats (adamw::cuda_step's arguments; the
// tensors' offsets, the buckets' bounds, on 16-byte boundaries), marked "adamw": for a single-GPU
// step one launch over all of them; for a data-parallel one a launch per bucket over exactly its
// range, each after its all-reduce (GradSync::finish). Every launch takes the same step: where the
// step advances the count itself (`advance` not null) only the last launch does. AdamW is elementwise,
// so the per-bucket update is bitwise the whole one. `p16` (bf16 steps; null for f32): the bf16 copy
// of p that the step's GEMMs read, same offsets, which every launch writes over its range.
struct AdamwArrays {
  float* p = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::uint16_t* p16 = nullptr;
  std::size_t total = 0;
  adamw::DeviceStep* state = nullptr;
  const adamw::Hyper* advance = nullptr;
  unsigned max_blocks = adamw::kCudaMaxBlocks;
};
void adamw_step(const std::unique_ptr<GradSync>& sync, const AdamwArrays& a);
// A data-parallel step, during its backward: it reads none of the parameters [from, total) any more,
// so the AdamW of the buckets there may run as soon as their all-reduces are done, on the optimizer's
// stream (GradSync::params_done), without the step-count advance, which the last bucket's launch
// makes. Nothing for a single-GPU step (`sync` null), whose AdamW is one launch after the backward.
void params_done(const std::unique_ptr<GradSync>& sync, std::size_t from, const AdamwArrays& a);

// Verification of a data-parallel step: the first `count` samples of the global batch of a per-sample
// tensor (`per_sample` elements of type `t` a sample) whose rank-local part, `batch` samples, lies in
// device memory at `mine`, in global order (rank r of `r.gpus` holds samples r x batch ..). Each rank sends its
// first min(batch, count) samples (a periodic verification batch needs no more: count <= 16 there,
// where the whole tensor can be gigabytes); every rank gets them (synchronises).
HostBuffer leading_samples(GradSync& sync, const Replica& r, const void* mine, DType t, std::size_t per_sample, std::int64_t batch,
                           std::int64_t count);
// The whole per-sample tensor of a step for its verification (synchronises): `batch` samples at
// `mine` for a single-GPU step (`sync` null); for a data-parallel one the global batch's
// `global_batch` samples, gathered from the ranks in sample order (leading_samples).
HostBuffer step_samples(GradSync* sync, const Replica& r, const void* mine, DType t, std::size_t per_sample, std::int64_t batch,
                        std::int64_t global_batch);
#endif

// The check of a data-parallel step after one step from the seeded start, on every rank: the
// replicas' parameters and gradients (Outcome's `params` and `grads`) are rank 0's bitwise, and on
// rank 0 `global_check(o)` compares them with the reference of the global batch, `o.loss` set to the
// mean of the ranks' losses (each the mean over its shard, of equal size). Every rank makes the same
// exchanges in the same order (they are collectives).
template <class Outcome, class GlobalCheck>
Check verify_replicas(GradSync& sync, const Replica& r, Outcome& o, GlobalCheck global_check) {
  Check c = sync.replicas_agree({{"parameters", &o.params}, {"gradients", &o.grads}});
  o.loss = static_cast<float>(sync.mean_over_ranks(o.loss));
  if (r.rank == 0) c.merge(global_check(o), "the global batch");
  return c;
}

// Rank r's shard of a seeded start whose per-sample tensors are `x` and `target`, `per_sample`
// elements a sample each (the encoder layers, the ConvNeXt block): `out`'s set to those of `global`.
struct XTargetShard {
  template <class State>
  void operator()(State& out, const State& global, std::size_t per_sample, const Replica& r, std::int64_t batch) const {
    out.x = shard(global.x, per_sample, r, batch);
    out.target = shard(global.target, per_sample, r, batch);
  }
};

// The data-parallel side of a step whose seeded start (`State`) holds per-sample tensors, which
// `Shard` cuts into this rank's shard (XTargetShard: `x` and `target`): this replica, the global
// batch's shape and seeded start, and the gradients' all-reduce.
template <class Shape, class State, class Shard = XTargetShard>
struct BatchReplica {
  Replica replica;
  Shape global;
  State global_seeded;
  std::size_t per_sample = 0;  // the first per-sample tensor's elements a sample (Shard's)
  std::unique_ptr<GradSync> sync;

  // For problem `p` of shape `s` (batch per GPU): the global batch seeded by `make(global shape)`
  // (the family's make_state, with the seed of the single-GPU step at batch G x B), `mine` (the
  // step's own seeded start) set to this rank's shard of it, and the all-reduce of `grads`.
  template <class MakeState>
  void start(const Problem& p, const Shape& s, std::size_t per, MakeState make, State& mine, float* grads, std::size_t total) {
    replica = replica_of(p);
    global = s;
    global.batch = s.batch * replica.gpus, global.gpus = 0;
    global_seeded = make(global);
    per_sample = per;
    Shard{}(mine, global_seeded, per, replica, s.batch);
    sync = std::make_unique<GradSync>(replica, p.dtype, grads, total);
  }
  // This rank's shard of `start`, a start of the global batch (verification's); `batch` per GPU.
  State shard_of(const State& start, std::int64_t batch) const {
    State out = start;
    Shard{}(out, start, per_sample, replica, batch);
    return out;
  }
  // The position of this rank's first sample in the global batch (0 for a single-GPU step).
  std::int64_t first_sample(std::int64_t batch) const { return sync ? replica.rank * batch : 0; }
#ifdef HOTOPS_HAVE_CUDA
  // Verification: the step's per-sample tensor at `mine` (device; `elements` of type t a sample,
  // `batch` of them on this rank), for a data-parallel step the global batch's, gathered from the
  // ranks in sample order (step_samples).
  HostBuffer samples(const void* mine, DType t, std::size_t elements, std::int64_t batch) const {
    return step_samples(sync.get(), replica, mine, t, elements, batch, global.batch);
  }
#endif

  // Verification's start for the step of shape `s` seeded with `seeded`: `verification(shape, seeded)`
  // (the family's verification_state) for a single-GPU step; for a data-parallel one this rank's shard
  // of the global batch's, that one in *global_start.
  template <class Verification>
  State verification_start(const Shape& s, const State& seeded, Verification verification, State* global_start) const {
    if (!sync) return verification(s, seeded);
    *global_start = verification(global, global_seeded);
    return shard_of(*global_start, s.batch);
  }
  // The check of one step from that start: `verify_outcome(shape, start, o)` (the family's) for a
  // single-GPU step; for a data-parallel one verify_replicas with it over the global batch.
  template <class Outcome, class VerifyOutcome>
  Check check(const Shape& s, const State& start, const State& global_start, Outcome& o, VerifyOutcome verify_outcome) const {
    if (!sync) return verify_outcome(s, start, o);
    return verify_replicas(*sync, replica, o, [&](const Outcome& out) { return verify_outcome(global, global_start, out); });
  }
};
template <class Shape, class State>
using XTargetReplica = BatchReplica<Shape, State, XTargetShard>;

// FNV-1a over the bytes of a tensor: the replicas' parameters compared across ranks.
std::uint64_t bytes_hash(const void* data, std::size_t bytes);

}  // namespace hotops::models
