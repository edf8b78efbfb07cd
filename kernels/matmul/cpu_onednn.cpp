// matmul on the CPU: oneDNN's matmul primitive on the row-major operands as PyTorch holds them
// (transposes are strided views, not copies); addmm's dbias is a second, GEMV-shaped matmul; a
// residual is a binary add post-op; a bmm over strided views (attention's heads) is one 4-D matmul.
// Below kCpuLoopMacs multiply-adds the plan is hand-written loops instead (cpu_loops.cpp).
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/dtype.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// A row-major [B, rows, cols] operand of type t, or its transpose ([B, cols, rows] viewed through strides).
memory::desc md(memory::dim B, std::int64_t rows, std::int64_t cols, memory::data_type t, bool transposed) {
  if (!transposed) return memory::desc({B, rows, cols}, t, memory::dims{rows * cols, cols, 1});
  return memory::desc({B, cols, rows}, t, memory::dims{rows * cols, 1, cols});
}
// The same without the batch axis (a b_packed product: oneDNN 2.6 packs weights for 2-D matmuls only,
// a 3-D one's format_tag::any stays row-major).
memory::desc md2(std::int64_t rows, std::int64_t cols, memory::data_type t, bool transposed) {
  if (!transposed) return memory::desc({rows, cols}, t, memory::dims{cols, 1});
  return memory::desc({cols, rows}, t, memory::dims{1, cols});
}
// The same in the problem's dtype.
memory::desc md(const Shape& s, std::int64_t rows, std::int64_t cols, bool transposed = false) {
  return md(s.batch_count, rows, cols, cpu::dnnl_type(s.dtype), transposed);
}

// The [B, rows, cols] view of an operand read as stored, or as the transpose of what is stored.
memory::desc view(const Shape& s, std::int64_t rows, std::int64_t cols, bool transposed) {
  return transposed ? md(s, cols, rows, true) : md(s, rows, cols);
}
// The same without the batch axis.
memory::desc view2(std::int64_t rows, std::int64_t cols, memory::data_type t, bool transposed) {
  return transposed ? md2(cols, rows, t, true) : md2(rows, cols, t, false);
}

// A strided operand's [samples, heads, rows, cols] view (a transformer layer's heads, read and
// written in place), read as stored or as the transpose of what is stored.
memory::desc heads_view(const Shape& s, const View& v, std::int64_t rows, std::int64_t cols, bool transposed) {
  const memory::dim heads = s.views.heads;
  const memory::dims strides = transposed ? memory::dims{v.per_sample, v.per_head, 1, v.ld}
                                          : memory::dims{v.per_sample, v.per_head, v.ld, 1};
  return memory::desc({s.batch_count / heads, heads, rows, cols}, cpu::dnnl_type(s.dtype), strides);
}

// The View of a direction's input, and of its output (dA in A's, dB in B's, out in dOut's).
const View& view_of(const Shape& s, Operand o) {
  return o == Operand::a ? s.views.a : o == Operand::b ? s.views.b : s.views.out;
}
const View& output_view(const Shape& s) {
  return s.dir == Direction::bwd_data ? s.views.a : s.dir == Direction::bwd_weight ? s.views.b : s.views.out;
}

// Post-ops: times `factor` (where not 1), then (with `residual`, a tensor of dst's layout) the
// residual added, then a ReLU (where asked).
dnnl::primitive_attr scaled(double factor, const memory::desc& residual = memory::desc(), bool relu = false) {
  dnnl::primitive_attr attr;
  dnnl::post_ops po;
  if (factor != 1.0) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, static_cast<float>(factor), 0.0f);
  if (!residual.is_zero()) po.append_binary(dnnl::algorithm::binary_add, residual);
  if (relu) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (po.len() > 0) attr.set_post_ops(po);
  return attr;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for what this CPU cannot do.
struct Descriptors {
  Product product;
  dnnl::matmul::primitive_desc gemm;
  dnnl::matmul::primitive_desc dbias;  // addmm bwd_weight only
  bool has_dbias = false;
};

// bmm over strided views: one 4-D matmul, alpha as oneDNN's output scale.
Descriptors strided_descriptors(const Shape& s) {
  Descriptors d;
  const Product& p = d.product = product(s);
  const auto g = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(heads_view(s, view_of(s, p.x), p.rows, p.depth, p.x_t),
                                                      heads_view(s, view_of(s, p.y), p.depth, p.cols, p.y_t),
                                                      memory::desc(), heads_view(s, output_view(s), p.rows, p.cols, false)));
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(s.alpha)});
  d.gemm = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(g, attr, cpu::engine()));
  return d;
}

Descriptors descriptors(const Shape& s) {
  if (s.strided()) return strided_descriptors(s);
  dnnl::engine& eng = cpu::engine();
  Descriptors d;
  const Product& p = d.product = product(s);
  // D = X . Y; addmm fwd: dst = alpha * (X.Y + (beta / alpha) bias), the bias scaled by the plan
  // where beta != alpha.
  const bool bias = s.op == Op::addmm && s.dir == Direction::fwd;
  HOTOPS_CHECK(!s.residual || s.dir != Direction::bwd_weight, "matmul: a residual is added in fwd or bwd_data only");
  const memory::data_type t = cpu::dnnl_type(s.dtype);
  memory::desc x_md, y_md, bias_md, dst_md;
  if (s.b_packed) {  // 2-D, the weights in the layout the primitive picks
    x_md = view2(p.rows, p.depth, t, p.x_t);
    y_md = memory::desc({p.depth, p.cols}, t, tag::any);
    if (bias) bias_md = cpu::md({1, s.N}, s.dtype, tag::ab);
    dst_md = md2(p.rows, p.cols, cpu::dnnl_type(out_dtype(s)), false);
  } else if (s.batch_count == 1) {
    // One GEMM is a 2-D matmul. oneDNN 2.6.3's AMX bf16 kernel gets a 3-D [1, M, K] x [1, K, N]
    // wrong on several threads where N has a tail (lstm_textgen's N = 57: errors of 0.4 of the
    // output's rms), and right as 2-D (MatmulPlan.OneBf16GemmWithAnNTailOnEveryThread).
    x_md = view2(p.rows, p.depth, t, p.x_t);
    y_md = view2(p.depth, p.cols, t, p.y_t);
    if (bias) bias_md = cpu::md({1, s.N}, s.dtype, tag::ab);
    dst_md = md2(p.rows, p.cols, cpu::dnnl_type(out_dtype(s)), false);
  } else {
    x_md = view(s, p.rows, p.depth, p.x_t);
    y_md = view(s, p.depth, p.cols, p.y_t);
    if (bias) bias_md = cpu::md({1, 1, s.N}, s.dtype, tag::abc);
    dst_md = md(s.batch_count, p.rows, p.cols, cpu::dnnl_type(out_dtype(s)), false);
  }
  const auto g = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(x_md, y_md, bias_md, dst_md));
  d.gemm = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(g, scaled(s.alpha, s.residual ? dst_md : memory::desc(), s.relu), eng));
  if (s.op == Op::addmm && s.dir == Direction::bwd_weight) {
    // dbias[1,N] = beta * ones[1,M] . dOut[M,N]: a GEMV through oneDNN's matmul, which is
    // jit-compiled for every shape (oneDNN 2.6's reduction falls back to its reference code
    // when reducing over rows).
    const std::int64_t M = s.M, N = s.N;
    const auto r = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(cpu::md({1, M}, s.dtype, tag::ab), cpu::md({M, N}, s.dtype, tag::ab),
                                                        cpu::md({1, N}, s.dtype, tag::ab)));
    d.dbias = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(r, scaled(s.beta), eng));
    d.has_dbias = true;
  }
  return d;
}

class CpuMatmul final : public Plan {
 public:
  explicit CpuMatmul(const Shape& s) : s_(s), d_(descriptors(s)) {
    const auto& pd = d_.gemm;
    std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}};
    has_bias_ = s_.op == Op::addmm && s_.dir == Direction::fwd;
    if (has_bias_) {
      args.push_back({DNNL_ARG_BIAS, pd.bias_desc()});
      bias_scale_ = s_.beta / s_.alpha;
      if (bias_scale_ != 1.0) scaled_bias_ = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.N));
    }
    args.push_back({DNNL_ARG_DST, pd.dst_desc()});
    // The residual is the last post-op: after the output scaling where alpha != 1.
    if (s_.residual) args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(s_.alpha != 1.0 ? 1 : 0) | DNNL_ARG_SRC_1, pd.dst_desc()});
    gemm_ = cpu::Primitive(dnnl::matmul(pd), args);
    if (d_.has_dbias) {
      ones_ = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.M));
      for (std::size_t i = 0; i < ones_.count(); ++i) ones_.set(i, 1.0);
      const auto& r = d_.dbias;
      dbias_ = cpu::Primitive(dnnl::matmul(r), {{DNNL_ARG_SRC, r.src_desc()},
                                                {DNNL_ARG_WEIGHTS, r.weights_desc()},
                                                {DNNL_ARG_DST, r.dst_desc()}});
    }
  }

  void run(const Args& a) override {
    const void* x = operand(a, d_.product.x);
    const void* y = operand(a, d_.product.y);
    if (s_.residual) {
      HOTOPS_CHECK(a.c && a.c != a.out, "matmul: a residual GEMM needs its C, apart from its output");
      if (has_bias_) gemm_.run({x, y, bias(a.bias), a.out, a.c});
      else gemm_.run({x, y, a.out, a.c});
    } else if (has_bias_) {
      gemm_.run({x, y, bias(a.bias), a.out});
    } else {
      gemm_.run({x, y, a.out});
    }
    if (d_.has_dbias) dbias_.run({ones_.data(), a.dout, a.dbias});
  }

  std::string label() const override {
    std::string l = "oneDNN matmul " + std::string(d_.gemm.impl_info_str());
    if (s_.residual) l += ", residual as binary add post-op";
    if (s_.strided()) l += ", 4-D on strided heads";
    if (s_.b_packed) l += ", weights prepacked in its layout";
    if (d_.has_dbias) l += " + dbias as ones.dOut " + std::string(d_.dbias.impl_info_str());
    return cpu::with_threads(l);
  }

 private:
  // The bias the primitive adds before its alpha scaling: the caller's, or (beta / alpha) times it.
  const void* bias(const void* b) {
    if (bias_scale_ == 1.0) return b;
    for (std::size_t n = 0; n < scaled_bias_.count(); ++n) {
      const double v = s_.dtype == DType::bf16 ? bf16_to_float(static_cast<const std::uint16_t*>(b)[n])
                                               : static_cast<const float*>(b)[n];
      scaled_bias_.set(n, v * bias_scale_);
    }
    return scaled_bias_.data();
  }

  Shape s_;
  Descriptors d_;
  bool has_bias_ = false;
  double bias_scale_ = 1.0;
  HostBuffer scaled_bias_, ones_;
  cpu::Primitive gemm_, dbias_;
};

}  // namespace

std::size_t cpu_packed_b_bytes(const Shape& s) {
  HOTOPS_CHECK(s.b_packed, "matmul: cpu_packed_b_bytes is for a shape with b_packed");
  return descriptors(s).gemm.weights_desc().get_size();
}

void cpu_pack_b(const Shape& s, const void* b, DType from, void* packed) {
  HOTOPS_CHECK(s.b_packed, "matmul: cpu_pack_b is for a shape with b_packed");
  const Descriptors d = descriptors(s);
  dnnl::engine& eng = cpu::engine();
  // B as stored: [K, N], or with trans_b [N, K] read transposed (view()'s descriptor in `from`)
  const memory::desc stored = s.trans_b ? md2(s.N, s.K, cpu::dnnl_type(from), true) : md2(s.K, s.N, cpu::dnnl_type(from), false);
  memory src(stored, eng, const_cast<void*>(b));
  memory dst(d.gemm.weights_desc(), eng, packed);
  HOTOPS_CHECK_DNNL(dnnl::reorder(src, dst).execute(cpu::stream(), src, dst));
  HOTOPS_CHECK_DNNL(cpu::stream().wait());
}

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " matmul";
  if (shape_of(p).blocked()) return "";  // hotops' loop: any CPU
  if (cpu_runs_loops(shape_of(p))) return "";
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, std::string(dtype_name(p.dtype)) + " " + p.op);
}

std::string cpu_unsupported_reason(const Shape& s) {
  if (s.blocked()) return "";
  if (cpu_runs_loops(s)) return "";
  return cpu::onednn_unsupported_reason([&] { descriptors(s); }, std::string(dtype_name(s.dtype)) + " matmul");
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  HOTOPS_CHECK(s.dtype == DType::f32 || s.dtype == DType::bf16,
               std::string("the CPU backend has no ") + dtype_name(s.dtype) + " matmul");
  if (s.blocked()) return make_cpu_blocks_plan(s);
  if (cpu_runs_loops(s)) return make_cpu_loop_plan(s);
  return std::make_unique<CpuMatmul>(s);
}

}  // namespace hotops::matmul
