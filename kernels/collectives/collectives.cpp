// The collectives family: names and shapes, work (algbw and busbw), exact inputs and their check.
//
// Names: <allreduce|reduce_scatter|allgather|broadcast>/cuda/<f32|bf16>/fwd/bytes:B/gpus:G/inplace:0|1,
// B from 8 B to 1 GiB in steps of 2 (those a reduce-scatter or all-gather can split into G equal
// parts), G in {2, 4, 8}. An entry runs when the run has at least G GPUs (bench --hotops_gpus=G, or
// a launcher's G ranks); otherwise it says why. Test problems: gpus:1, a communicator of one process.
#include "kernels/collectives/collectives.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "hotops/check.h"
#include "hotops/comm.h"
#include "hotops/gpu.h"
#include "hotops/ranks.h"

namespace hotops::collectives {
namespace {

constexpr Kind kKinds[] = {Kind::allreduce, Kind::reduce_scatter, Kind::allgather, Kind::broadcast};
constexpr DType kDTypes[] = {DType::f32, DType::bf16};
constexpr int kGpuCounts[] = {2, 4, 8};
constexpr std::size_t kMinBytes = 8, kMaxBytes = std::size_t(1) << 30;

// The op as the benchmark runs it: a PlanCase over this rank's buffers.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static std::unique_ptr<Plan> plan(const Shape& s, Backend b) {
    HOTOPS_CHECK(b == Backend::cuda, "the collectives run on CUDA only");
#ifdef HOTOPS_HAVE_NCCL
    if (comm::world_size() == 1) comm::prepare(s.gpus);  // a process alone: its own communicator (gpus 1)
    return make_nccl_plan(s);
#else
    std::string why;
    comm::built(&why);
    throw Error(why, ErrorKind::unsupported);
#endif
  }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    if (!s.inplace) return {b.in(io.in.data), b.out(io.out)};
    // In place: one buffer; NCCL reads this rank's part and writes its result where its in-place
    // convention says (reduce-scatter: recv = send + rank x recvcount; all-gather: send = recv +
    // rank x sendcount).
    auto* whole = static_cast<std::byte*>(b.inout(io.in.data, io.out));
    const std::size_t e = dtype_size(s.dtype), at = static_cast<std::size_t>(s.rank);
    if (s.op == Kind::reduce_scatter) return {whole, whole + at * s.recv_count() * e};
    if (s.op == Kind::allgather) return {whole + at * s.send_count() * e, whole};
    return {whole, whole};
  }
};

std::optional<Kind> parse_kind(const std::string& op) {
  for (Kind k : kKinds)
    if (op == kind_name(k)) return k;
  return std::nullopt;
}

// Whether a reduce-scatter or all-gather of `bytes` splits into `gpus` equal parts of whole elements.
bool splits(Kind k, std::size_t bytes, DType t, int gpus) {
  const std::size_t parts = k == Kind::reduce_scatter || k == Kind::allgather ? static_cast<std::size_t>(gpus) : 1;
  return bytes % (dtype_size(t) * parts) == 0 && bytes >= dtype_size(t) * parts;
}

Problem problem(Kind k, DType t, std::size_t bytes, int gpus, bool inplace) {
  return Problem{kind_name(k), Backend::cuda, t, Direction::fwd,
                 {{"bytes", std::to_string(bytes)}, {"gpus", std::to_string(gpus)}, {"inplace", inplace ? "1" : "0"}}};
}

class CollectivesFamily final : public Family {
 public:
  std::string name() const override { return "collectives"; }

  // Grouped by GPU count, so that a run's entries of one communicator come together.
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>&) const override {
    std::vector<Problem> out;
    for (int g : kGpuCounts)
      for (Kind k : kKinds)
        for (DType t : kDTypes)
          for (bool inplace : {false, true})
            for (std::size_t b = kMinBytes; b <= kMaxBytes; b *= 2)
              if (splits(k, b, t, g)) out.push_back(problem(k, t, b, g, inplace));
    return out;
  }

  // One GPU (a communicator of this process alone): every op, dtype and placement at a size below
  // a vector, an odd one and 1 MiB.
  std::vector<Problem> test_problems() const override {
    std::vector<Problem> out;
    for (Kind k : kKinds)
      for (DType t : kDTypes)
        for (bool inplace : {false, true})
          for (std::size_t b : {std::size_t(8), std::size_t(1000), std::size_t(1) << 20}) out.push_back(problem(k, t, b, 1, inplace));
    return out;
  }

  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    Work w;
    w.bytes = static_cast<double>(s.bytes);  // algbw's numerator
    w.bus_bytes = static_cast<double>(s.bytes) * busbw_factor(s.op, s.gpus);
    return w;
  }

  std::string unsupported_reason(const Problem& p) const override {
    std::string why;
    if (!gpu::available(&why)) return why;
    if (!comm::built(&why)) return why;
    return gpus_unsupported_reason(static_cast<int>(p.get_int("gpus")), ranks::layout(), gpu::device_count());
  }

  std::unique_ptr<Case> make(const Problem& p) const override { return make_plan_case<Op>(p); }
};

}  // namespace

HOTOPS_DEFINE_FAMILY(CollectivesFamily);

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::allreduce: return "allreduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::allgather: return "allgather";
    case Kind::broadcast: return "broadcast";
  }
  return "?";
}

std::size_t Shape::send_count() const {
  return op == Kind::allgather ? elements() / static_cast<std::size_t>(gpus) : elements();
}
std::size_t Shape::recv_count() const {
  return op == Kind::reduce_scatter ? elements() / static_cast<std::size_t>(gpus) : elements();
}
std::size_t Shape::recv_offset() const {
  return inplace && op == Kind::reduce_scatter ? static_cast<std::size_t>(rank) * recv_count() : 0;
}

Shape shape_of(const Problem& p) {
  const auto k = parse_kind(p.op);
  HOTOPS_CHECK(k.has_value(), "not a collective: " + p.name());
  HOTOPS_CHECK(p.backend == Backend::cuda, "the collectives run on CUDA only: " + p.name());
  HOTOPS_CHECK(p.dir == Direction::fwd, "a collective has the direction fwd only: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "the collectives have f32 and bf16: " + p.name());
  Shape s;
  s.op = *k;
  s.dtype = p.dtype;
  s.bytes = static_cast<std::size_t>(p.get_int("bytes"));
  s.gpus = static_cast<int>(p.get_int("gpus"));
  s.inplace = p.get_int("inplace") != 0;
  s.rank = ranks::layout().rank;
  HOTOPS_CHECK(s.gpus >= 1 && s.gpus <= 1024, "bad GPU count: " + p.name());
  HOTOPS_CHECK(splits(s.op, s.bytes, s.dtype, s.gpus),
               "bytes must split into whole elements, one part per GPU where the op splits: " + p.name());
  HOTOPS_CHECK(s.rank < s.gpus, "rank " + std::to_string(s.rank) + " is not among the " + std::to_string(s.gpus) +
                                    " ranks of " + p.name());
  return s;
}

std::string gpus_unsupported_reason(int gpus, const ranks::Layout& l, int devices) {
  if (gpus <= l.world) return "";
  const std::string g = std::to_string(gpus);
  if (l.world > 1) return "needs " + g + " GPUs; the run has " + std::to_string(l.world) + " (" + l.source + ")";
  return "needs " + g + " GPUs in the run; start bench with --hotops_gpus=" + g +
         (devices < gpus ? " on a machine with " + g + " GPUs (this one has " + std::to_string(devices) + ")" : "");
}

double busbw_factor(Kind k, int gpus) {
  const double n = gpus;
  switch (k) {
    case Kind::allreduce: return 2 * (n - 1) / n;
    case Kind::reduce_scatter:
    case Kind::allgather: return (n - 1) / n;
    case Kind::broadcast: return 1;
  }
  return 0;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  in.seed = seed;
  const auto rank = s.rank;
  if (!s.inplace) {
    in.data = HostBuffer(s.dtype, s.send_count());
    const auto n = static_cast<std::int64_t>(s.send_count());
#pragma omp parallel for
    for (std::int64_t i = 0; i < n; ++i)
      in.data.set(static_cast<std::size_t>(i), input_value(s.dtype, seed, rank, static_cast<std::size_t>(i)));
    return in;
  }
  // In place: the whole buffer. A rank's own input where NCCL reads it; NaN where only the
  // collective can put the right values (all-gather's other parts, broadcast on the other ranks).
  in.data = HostBuffer(s.dtype, s.elements());
  in.data.poison();
  const std::size_t offset = s.op == Kind::allgather ? static_cast<std::size_t>(rank) * s.send_count() : 0;
  const bool has_input = s.op != Kind::broadcast || rank == 0;
  const auto n = static_cast<std::int64_t>(has_input ? s.send_count() : 0);
#pragma omp parallel for
  for (std::int64_t i = 0; i < n; ++i)
    in.data.set(offset + static_cast<std::size_t>(i), input_value(s.dtype, seed, rank, static_cast<std::size_t>(i)));
  return in;
}

HostBuffer make_output(const Shape& s) { return HostBuffer(s.dtype, s.inplace ? s.elements() : s.recv_count()); }

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const std::size_t n = s.recv_count(), at = s.recv_offset();
  HOTOPS_CHECK(out.count() >= at + n, "the collective's output buffer is smaller than its result");
  std::size_t wrong = 0, first = n;
  double worst = 0;
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for reduction(+ : wrong) reduction(min : first) reduction(max : worst)
  for (std::int64_t j = 0; j < count; ++j) {
    const auto i = static_cast<std::size_t>(j);
    const double got = out.get(at + i), want = expected(s, in.seed, i);
    if (got == want) continue;  // exact: NaN never passes
    ++wrong;
    first = std::min(first, i);
    worst = std::max(worst, std::isnan(got) ? INFINITY : std::fabs(got - want));
  }
  Check c;
  c.checked = n;
  c.max_err = worst;
  c.tol = 0;
  c.ok = wrong == 0;
  if (!c.ok) {
    char text[320];
    std::snprintf(text, sizeof text,
                  "%zu of %zu elements of rank %d's %s result are not exact: element %zu is %.9g where %.9g is exact "
                  "(%s of %d ranks%s)",
                  wrong, n, s.rank, kind_name(s.op), first, out.get(at + first), expected(s, in.seed, first),
                  kind_name(s.op), s.gpus, s.inplace ? ", in place" : "");
    c.message = text;
  }
  return c;
}

}  // namespace hotops::collectives
