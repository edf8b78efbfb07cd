// The copy family: problem names and their parsing, work, and the benchmark and test problem lists.
#include "kernels/copy/copy.h"

#include <algorithm>
#include <cstring>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::copy {
namespace {

// Which CPU implementation runs a problem named without `impl`: per kind, hotops' own loop or
// oneDNN's reorder. The other one is benchmarked too, named with `impl:<its name>`. Measured on the
// 16-core Xeon of the H100 host (fractions of its copy bandwidth over the 12 layout benchmarks): hotops'
// transpose 0.70-1.40, oneDNN's reorder 0.49-1.17; bf16 -> f32 1.72 against oneDNN's 0.85, f32 -> bf16
// 1.10 against 1.02.
constexpr CpuImpl kDefaultLayoutImpl = CpuImpl::hotops;
constexpr CpuImpl kDefaultConvertImpl = CpuImpl::hotops;

CpuImpl other(CpuImpl i) { return i == CpuImpl::hotops ? CpuImpl::onednn : CpuImpl::hotops; }

constexpr std::int64_t KiB = 1024, MiB = KiB * KiB, GiB = KiB * MiB;

// Raw copies: from one page (latency) to 1 GiB (bandwidth, far beyond any cache).
const std::int64_t kRawBytes[] = {4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB};
// dtype conversions: the f32 side is 4 KiB ... 256 MiB.
const std::int64_t kConvertElements[] = {KiB, 16 * KiB, 256 * KiB, 4 * MiB, 16 * MiB, 64 * MiB};

// Activations whose layout frameworks change inside copy_ (e.g. PyTorch channels_last, TF/Keras
// NHWC handed to a NCHW library), with their default batches.
struct Activation {
  const char* source;  // where the shape comes from (documentation only)
  std::int64_t C, H, W;
  std::vector<std::int64_t> batches;
};
const std::vector<Activation>& activations() {
  static const std::vector<Activation> a = {
      {"ResNet-50 stage 1, 64 channels (conv2_x in)", 64, 56, 56, {1, 32}},
      {"ResNet-50 stage 1, 256 channels (conv2_x out)", 256, 56, 56, {32}},
      {"TensorFlow 2 comparison's Keras CNN, first conv output (None, 256, 256, 32)", 32, 256, 256, {32}},
  };
  return a;
}

Problem raw(Backend b, Kind k, Host h, std::int64_t bytes) {
  Problem p{"copy", b, DType::f32, Direction::fwd, {{"kind", kind_name(k)}}};
  if (h != Host::none) p.args.push_back({"host", h == Host::pinned ? "pinned" : "pageable"});
  p.args.push_back({"bytes", std::to_string(bytes)});
  return p;
}

// A layout problem; on the CPU, run by implementation `impl` (named only when it is not the default).
Problem layout(Backend b, DType t, Kind k, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W,
               CpuImpl impl = kDefaultLayoutImpl) {
  Problem p{"copy", b, t, Direction::fwd,
            {{"kind", kind_name(k)}, {"batch", std::to_string(N)}, {"C", std::to_string(C)},
             {"H", std::to_string(H)}, {"W", std::to_string(W)}}};
  if (b == Backend::cpu && impl != kDefaultLayoutImpl) p.args.push_back({"impl", impl_name(impl)});
  return p;
}

Problem convert(Backend b, Kind k, std::int64_t elements, CpuImpl impl = kDefaultConvertImpl) {
  const DType src = k == Kind::f32_to_bf16 ? DType::f32 : DType::bf16;
  Problem p{"copy", b, src, Direction::fwd, {{"kind", kind_name(k)}, {"elements", std::to_string(elements)}}};
  if (b == Backend::cpu && impl != kDefaultConvertImpl) p.args.push_back({"impl", impl_name(impl)});
  return p;
}

// Every raw-copy kind a backend has: memcpy everywhere, the host<->device transfers on CUDA only.
void add_raw(Backend b, std::int64_t bytes, std::vector<Problem>& out) {
  out.push_back(raw(b, Kind::memcpy, Host::none, bytes));
  if (b != Backend::cuda) return;
  for (Kind k : {Kind::h2d, Kind::d2h})
    for (Host h : {Host::pinned, Host::pageable}) out.push_back(raw(b, k, h, bytes));
}

// Both dtypes and directions of a shape; on the CPU, by both implementations (or by `only`).
void add_layouts(Backend b, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, std::vector<Problem>& out,
                 const CpuImpl* only = nullptr) {
  std::vector<CpuImpl> impls{kDefaultLayoutImpl};
  if (b == Backend::cpu) impls.push_back(other(kDefaultLayoutImpl));
  if (only) impls = {*only};
  for (CpuImpl impl : impls)
    for (DType t : {DType::f32, DType::bf16})
      for (Kind k : {Kind::nchw_to_nhwc, Kind::nhwc_to_nchw}) out.push_back(layout(b, t, k, N, C, H, W, impl));
}

// Both conversions; on the CPU, by both implementations.
void add_converts(Backend b, std::int64_t elements, std::vector<Problem>& out) {
  for (Kind k : {Kind::f32_to_bf16, Kind::bf16_to_f32}) {
    out.push_back(convert(b, k, elements));
    if (b == Backend::cpu) out.push_back(convert(b, k, elements, other(kDefaultConvertImpl)));
  }
}

// The op as the benchmark runs it: a PlanCase over the seeded source and the destination, each in
// the memory its kind names (see Args).
struct Op {
  using Shape = copy::Shape;
  using Args = copy::Args;
  struct Io {
    HostBuffer src;  // the seeded source
    HostBuffer out;  // the destination, or the host image of a device destination (not for pinned d2h)
    std::shared_ptr<void> pinned;  // pinned h2d: the source's copy there; pinned d2h: the destination
  };

  static bool pinned_d2h(const Shape& s) { return s.kind == Kind::d2h && s.host == Host::pinned; }

  static Shape shape(const Problem& p) { return shape_of(p); }

  static Io io(const Shape& s, std::uint64_t seed) {
    Io io{make_source(s, seed), {}, {}};
    if (!pinned_d2h(s)) {
      io.out = HostBuffer(s.dst, s.count);
      io.out.poison();  // first touch of its pages, outside timing
    }
    if (s.host == Host::pinned) {
#ifdef HOTOPS_HAVE_CUDA
      io.pinned = pinned_host(s.src_bytes());
      if (s.kind == Kind::h2d) std::memcpy(io.pinned.get(), io.src.data(), s.src_bytes());
#else
      throw Error("pinned host memory needs CUDA", ErrorKind::unsupported);
#endif
    }
    return io;
  }

  static Args bind(const Shape& s, Io& io, Binder& b) {
    switch (s.kind) {
      case Kind::h2d: return {s.host == Host::pinned ? io.pinned.get() : b.host_in(io.src), b.out(io.out)};
      case Kind::d2h: return {b.in(io.src), pinned_d2h(s) ? io.pinned.get() : b.host_out(io.out)};
      default: return {b.in(io.src), b.out(io.out)};
    }
  }

  static std::unique_ptr<Plan> plan(const Shape& s, Backend b) { return make_plan(s, b); }

  // Pinned memory is the Io's own, not the Binder's: poisoned here (NaN in every f32 word).
  static void before_check(const Shape& s, Io& io, hotops::Plan<Args>&, const Args&) {
    if (pinned_d2h(s)) std::memset(io.pinned.get(), 0xff, s.src_bytes());
  }

  // Raw copies: the destination's bytes are the source's. Layouts and conversions: every element
  // holds the bits of its reference value.
  static Check check(const Shape& s, const Io& io) {
    if (!s.is_raw()) return verify_exact(s, io.src, io.out);
    const void* got = pinned_d2h(s) ? io.pinned.get() : io.out.data();
    return verify_bitwise(got, io.src.data(), s.src_bytes(), s.src);
  }
};

class CopyFamily final : public PlanFamily<Op> {
 public:
  CopyFamily() : PlanFamily("copy", cpu_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out;
    for (Backend b : kAllBackends) {
      for (std::int64_t bytes : kRawBytes) add_raw(b, bytes, out);
      for (const Activation& a : activations())
        for (std::int64_t n : batches.empty() ? a.batches : batches) add_layouts(b, n, a.C, a.H, a.W, out);
      for (std::int64_t e : kConvertElements) add_converts(b, e, out);
    }
    return out;
  }

  std::vector<Problem> test_problems() const override {
    std::vector<Problem> out;
    for (Backend b : kAllBackends) {
      // One element; odd, not a multiple of 16 bytes; several thread chunks with a remainder.
      for (std::int64_t bytes : {4, 4100, (1 << 20) + 12}) {
        if (b == Backend::cpu) out.push_back(raw(b, Kind::memcpy, Host::none, bytes));
        else if (bytes > 4) add_raw(b, bytes, out);
      }
      // Channel and spatial sizes that are odd (scalar path), partial tiles, several tiles per axis.
      add_layouts(b, 2, 3, 5, 7, out);
      add_layouts(b, 2, 40, 6, 12, out);
      add_layouts(b, 1, 96, 17, 16, out);
      if (b == Backend::cpu) {
        // hotops' transpose: one channel, one pixel, and tiles with partial register blocks on both
        // axes (67 channels, 9*15 = 135 pixels) over several threads.
        const CpuImpl hotops = CpuImpl::hotops;
        add_layouts(b, 3, 1, 4, 9, out, &hotops);
        add_layouts(b, 2, 5, 1, 1, out, &hotops);
        add_layouts(b, 3, 67, 9, 15, out, &hotops);
      }
      // The vectorised body alone and with a tail; on the CPU, outputs large enough to be streamed
      // past the caches (cpu::kStreamMinBytes) on both sides of an OpenMP chunk boundary.
      for (std::int64_t e : {1003, 65544}) add_converts(b, e, out);
      if (b == Backend::cpu) add_converts(b, (std::int64_t{1} << 24) + 1003, out);
    }
    return out;
  }

  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    Work w;
    w.flops = 0;  // a copy does no arithmetic
    const bool one_way = s.kind == Kind::h2d || s.kind == Kind::d2h;
    w.bytes = static_cast<double>(one_way ? s.src_bytes() : s.src_bytes() + s.dst_bytes());
    w.items = s.is_layout() ? static_cast<double>(s.N) : 1.0;
    return w;
  }

  std::string unsupported_reason(const Problem& p) const override {
    const Shape s = shape_of(p);
    if (p.backend == Backend::cpu && (s.kind == Kind::h2d || s.kind == Kind::d2h))
      return std::string("copy kind ") + kind_name(s.kind) + " exists only on the cuda backend";
    return OpFamily::unsupported_reason(p);
  }
};

}  // namespace

const char* impl_name(CpuImpl i) { return i == CpuImpl::hotops ? "hotops" : "onednn"; }

bool has_cpu_impls(Kind k) {
  return k == Kind::nchw_to_nhwc || k == Kind::nhwc_to_nchw || k == Kind::f32_to_bf16 || k == Kind::bf16_to_f32;
}

CpuImpl default_cpu_impl(Kind k) {
  return k == Kind::f32_to_bf16 || k == Kind::bf16_to_f32 ? kDefaultConvertImpl : kDefaultLayoutImpl;
}

CpuImpl cpu_impl(const Problem& p) { return shape_of(p).impl; }


const char* kind_name(Kind k) {
  switch (k) {
    case Kind::memcpy: return "memcpy";
    case Kind::h2d: return "h2d";
    case Kind::d2h: return "d2h";
    case Kind::nchw_to_nhwc: return "nchw_to_nhwc";
    case Kind::nhwc_to_nchw: return "nhwc_to_nchw";
    case Kind::f32_to_bf16: return "f32_to_bf16";
    case Kind::bf16_to_f32: return "bf16_to_f32";
  }
  return "?";
}

Shape shape_of(const Problem& p) {
  Shape s;
  const std::string& kind = p.get("kind");
  bool known = false;
  for (Kind k : {Kind::memcpy, Kind::h2d, Kind::d2h, Kind::nchw_to_nhwc, Kind::nhwc_to_nchw, Kind::f32_to_bf16,
                 Kind::bf16_to_f32})
    if (kind == kind_name(k)) s.kind = k, known = true;
  HOTOPS_CHECK(known, "unknown copy kind '" + kind + "' in " + p.name());
  s.src = s.dst = storage_of(p.dtype);
  HOTOPS_CHECK(!p.has("impl") || (has_cpu_impls(s.kind) && p.backend == Backend::cpu),
               "only CPU layout copies and conversions name an impl: " + p.name());

  if (s.is_raw()) {
    HOTOPS_CHECK(p.dtype == DType::f32, "raw copies are named f32: " + p.name());
    const std::int64_t bytes = p.get_int("bytes");
    HOTOPS_CHECK(bytes > 0 && bytes % 4 == 0, "copy bytes must be a positive multiple of 4: " + p.name());
    s.count = static_cast<std::size_t>(bytes / 4);
    if (s.kind != Kind::memcpy) {
      const std::string& h = p.get("host");
      HOTOPS_CHECK(h == "pinned" || h == "pageable", "host must be pinned or pageable: " + p.name());
      s.host = h == "pinned" ? Host::pinned : Host::pageable;
    }
  } else if (s.is_layout()) {
    HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "layout copies are f32 or bf16: " + p.name());
    s.N = p.get_int("batch"), s.C = p.get_int("C"), s.H = p.get_int("H"), s.W = p.get_int("W");
    HOTOPS_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0, "dimensions must be positive: " + p.name());
    s.count = static_cast<std::size_t>(s.N * s.C * s.H * s.W);
  } else {
    const bool to_bf16 = s.kind == Kind::f32_to_bf16;
    HOTOPS_CHECK(p.dtype == (to_bf16 ? DType::f32 : DType::bf16),
                 "the dtype segment of a conversion is its source dtype: " + p.name());
    s.dst = to_bf16 ? DType::bf16 : DType::f32;
    const std::int64_t e = p.get_int("elements");
    HOTOPS_CHECK(e > 0, "elements must be positive: " + p.name());
    s.count = static_cast<std::size_t>(e);
  }
  if (p.has("impl")) {  // a known implementation, named only when it is not the default
    const std::string& v = p.get("impl");
    HOTOPS_CHECK(v == impl_name(CpuImpl::onednn) || v == impl_name(CpuImpl::hotops),
                 "copy: unknown impl '" + v + "' (onednn or hotops) in " + p.name());
    HOTOPS_CHECK(v != impl_name(default_cpu_impl(s.kind)), "impl:" + v + " is the default, named without impl: " + p.name());
  }
  s.impl = !p.has("impl") ? default_cpu_impl(s.kind)
           : p.get("impl") == impl_name(CpuImpl::hotops) ? CpuImpl::hotops : CpuImpl::onednn;
  return s;
}

HostBuffer make_source(const Shape& s, std::uint64_t seed) {
  HostBuffer src(s.src, s.count);
  src.fill_uniform(seed, 1);
  return src;
}

HOTOPS_DEFINE_FAMILY(CopyFamily);

}  // namespace hotops::copy
