// The maxpool family: problem names and shapes, work, inputs and verification.
//
// Names: maxpool/<backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:N/C:../H:../W:../k:K/s:S/
// pad:P/layout:<nchw|nhwc>; test problems have shape:test and no batch arg (N is `N:`).
#include "kernels/maxpool/maxpool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::maxpool {
namespace {

struct NamedShape {
  const char* name;
  std::int64_t C, H, W, k, s, pad, batch;
};

constexpr NamedShape kNamedShapes[] = {
    // The TensorFlow 2 comparison's Keras CNN: 256x256x3 images, batch 64; MaxPooling2D((3, 3))
    // after the 32-channel conv (256 -> 85), then (2, 2) after the 64- and 128-channel blocks (85 -> 42 -> 21).
    {"keras_cnn.pool1", 32, 256, 256, 3, 3, 0, 64},
    {"keras_cnn.pool2", 64, 85, 85, 2, 2, 0, 64},
    {"keras_cnn.pool3", 128, 42, 42, 2, 2, 0, 64},
    // The VGG-like CIFAR-10 net (Keras' cifar10_cnn.py): 2x2 pools on 32x32x32 and 16x16x64, batch 128.
    {"cifar_vgg.pool1", 32, 32, 32, 2, 2, 0, 128},
    {"cifar_vgg.pool2", 64, 16, 16, 2, 2, 0, 128},
    // ResNet-50's stem: 3x3 stride 2 padding 1 on 112x112x64 (-> 56x56), batch 32.
    {"resnet50.stem_pool", 64, 112, 112, 3, 2, 1, 32},
};

constexpr const char* kLayouts[] = {"nchw", "nhwc"};

std::vector<Arg> args_of(const char* shape, const char* batch_key, std::int64_t n, std::int64_t C, std::int64_t H,
                         std::int64_t W, std::int64_t k, std::int64_t s, std::int64_t pad, const char* layout) {
  return {{"shape", shape},           {batch_key, std::to_string(n)}, {"C", std::to_string(C)},
          {"H", std::to_string(H)},   {"W", std::to_string(W)},       {"k", std::to_string(k)},
          {"s", std::to_string(s)},   {"pad", std::to_string(pad)},   {"layout", layout}};
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("maxpool", args, out); }

// The op as the benchmark runs it: a PlanCase over the problem's inputs and output. A backward reads
// what its forward saved (oneDNN's workspace on the CPU, y on CUDA): the forward plan runs once here,
// at setup, on this problem's x.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    const bool cpu = b.backend() == Backend::cpu;
    Args a;
    a.x = b.in(io.in.x);
    if (cpu) a.workspace = b.scratch(cpu_workspace_bytes(s));
    if (s.dir == Direction::fwd) {
      a.out = b.out(io.out);
      return a;
    }
    Shape fwd = s;
    fwd.dir = Direction::fwd;
    void* y = b.scratch(s.out_elements() * dtype_size(s.dtype));
    const auto forward = make_plan(fwd, b.backend());
    forward->run(Args{a.x, nullptr, nullptr, y, a.workspace});
    if (!cpu) gpu::synchronize();  // done before the forward plan's descriptors go
    a.y = y;
    a.dy = b.in(io.in.dy);
    a.out = b.out(io.out);
    return a;
  }
};

class MaxpoolFamily final : public PlanFamily<Op> {
 public:
  MaxpoolFamily() : PlanFamily("maxpool", onednn_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(kNamedShapes, batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      for (const char* layout : kLayouts)
        expand(args_of(ns.name, "batch", b, ns.C, ns.H, ns.W, ns.k, ns.s, ns.pad, layout), out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // Odd sizes with a ragged last window (floor mode drops it); overlapping 3x3/2 windows with
    // padding 1 (the ResNet stem's); non-overlapping 3x3/3 and 2x2/2; NCHW and NHWC.
    struct T {
      std::int64_t N, C, H, W, k, s, pad;
      const char* layout;
    };
    constexpr T kShapes[] = {
        {2, 3, 7, 9, 2, 2, 0, "nchw"},
        {1, 5, 11, 10, 3, 3, 0, "nchw"},
        {2, 4, 9, 7, 3, 2, 1, "nchw"},
        {3, 17, 8, 5, 3, 2, 1, "nhwc"},
        {2, 16, 6, 6, 2, 2, 0, "nhwc"},
    };
    std::vector<Problem> out;
    for (const T& t : kShapes) expand(args_of("test", "N", t.N, t.C, t.H, t.W, t.k, t.s, t.pad, t.layout), out);
    return out;
  }

  // FLOPs: k^2 compares per output in both directions (bwd finds or replays the argmax), a
  // convention: the op is memory-bound. Bytes: fwd reads x and writes y; bwd reads dy and writes
  // all of dx. What each library saves for bwd (oneDNN's workspace; cuDNN's x and y) is not
  // counted: it is the implementation's choice, and the fewest is one small index per output.
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double e = static_cast<double>(dtype_size(s.dtype));
    const double in = static_cast<double>(s.in_elements()), out = static_cast<double>(s.out_elements());
    Work w;
    w.flops = out * static_cast<double>(s.k * s.k);
    w.bytes = (in + out) * e;
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, "maxpool");
  const std::string& layout = p.get("layout");
  HOTOPS_CHECK(layout == "nchw" || layout == "nhwc", "maxpool layout is nchw or nhwc: " + p.name());
  s.layout = layout == "nchw" ? Layout::nchw : Layout::nhwc;
  s.N = p.batch() ? *p.batch() : p.get_int("N");
  s.C = p.get_int("C"), s.H = p.get_int("H"), s.W = p.get_int("W");
  s.k = p.get_int("k"), s.s = p.get_int("s"), s.pad = p.get_int("pad");
  HOTOPS_CHECK(s.N > 0 && s.C > 0 && s.k > 0 && s.s > 0 && s.pad >= 0 && 2 * s.pad <= s.k && s.H + 2 * s.pad >= s.k &&
                   s.W + 2 * s.pad >= s.k,
               "bad maxpool shape (nn.MaxPool2d needs pad <= k / 2): " + p.name());
  // The tie-free inputs need k^2 distinct low parts and at least 2 levels above them in the
  // dtype's exact integers (2^8 for bf16).
  HOTOPS_CHECK(s.k <= 11, "maxpool inputs support k <= 11: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const std::int64_t kk = s.k * s.k;
  // x = (m k^2 + low - half) / half with v = m k^2 + low < 2^bits: an integer times a power of two,
  // exact in the dtype (8 significant bits in bf16, 24 in f32).
  const int bits = s.dtype == DType::bf16 ? 8 : 22;
  const std::int64_t levels = (std::int64_t(1) << bits) / kk;
  const double half = static_cast<double>(std::int64_t(1) << (bits - 1));
  Inputs in;
  HostBuffer u(DType::f32, s.in_elements());
  u.fill_uniform(seed, 0, 0.f, 1.f);
  in.x = HostBuffer(s.dtype, s.in_elements());
  const std::int64_t rows = s.N * s.C * s.H;  // one (n, c, h) at a time, whatever the layout
#pragma omp parallel for
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t h = r % s.H, c = (r / s.H) % s.C, n = r / (s.H * s.C);
    for (std::int64_t w = 0; w < s.W; ++w) {
      const std::size_t i = s.offset(n, c, h, w, s.H, s.W);
      const auto m = std::min(levels - 1, static_cast<std::int64_t>(u.as<float>()[i] * static_cast<float>(levels)));
      const std::int64_t v = m * kk + (h % s.k) * s.k + (w % s.k);
      in.x.set(i, (static_cast<double>(v) - half) / half);
    }
  }
  if (s.dir == Direction::bwd) {
    in.dy = HostBuffer(s.dtype, s.out_elements());
    in.dy.fill_uniform(seed, 1);
  }
  return in;
}

HostBuffer make_output(const Shape& s) {
  return HostBuffer(s.dtype, s.dir == Direction::fwd ? s.out_elements() : s.in_elements());
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const std::vector<std::size_t> idx = sample_indices(out.count(), std::size_t(1) << 18, 23);
  if (s.dir == Direction::fwd)
    return compare(out, idx, [&](std::size_t i) { return reference_fwd(s, in.x, i); }, 0.0);
  // dx sums the gradients of every window whose maximum an element is: up to ceil(k/s)^2 of them when
  // windows overlap, and the libraries add them in the dtype, rounding after each add, while the
  // reference sums in double. The bound is the dtype's tolerance once per possible contribution
  // (cuDNN's bf16 stem-pool dx, 3x3 stride 2, measured 0.054 against the single-rounding bound 0.04).
  const double overlaps = std::pow(static_cast<double>((s.k + s.s - 1) / s.s), 2.0);
  return compare(out, idx, [&](std::size_t i) { return reference_bwd(s, in.x, in.dy, i); },
                 tolerance(s.dtype) * overlaps);
}

HOTOPS_DEFINE_FAMILY(MaxpoolFamily);

}  // namespace hotops::maxpool
