// model_cnn on the CPU: oneDNN convolutions through conv2d plans, oneDNN batch norm, pooling and
// matmul primitives, OpenMP loops for the rest; the step, the inference folding and the bf16 form:
// docs/models.md, "How each model step runs".
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/trace.h"
#include "kernels/conv2d/cpu_onednn.h"
#include "kernels/model_cnn/cpu_conv_pool.h"
#include "kernels/model_cnn/model_cnn.h"

namespace hotops::model_cnn {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;
using cpu::Args;

memory::desc nhwc(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, dt t = dt::f32) {
  return memory::desc({N, C, H, W}, t, tag::nhwc);
}
memory::desc vec(std::int64_t n) { return memory::desc({n}, dt::f32, tag::x); }
// A row-major [rows, cols] operand, or the transpose of one stored [cols, rows].
memory::desc mat(std::int64_t rows, std::int64_t cols, bool transposed = false, dt t = dt::f32) {
  return transposed ? memory::desc({rows, cols}, t, memory::dims{1, rows})
                    : memory::desc({rows, cols}, t, memory::dims{cols, 1});
}

// Storage <-> f32 for the loops over activations: f32 as is, bf16 widened exactly, narrowed to nearest even.
using bf16 = std::uint16_t;
inline float load(float v) { return v; }
inline float load(bf16 v) { return bf16_to_float(v); }
template <class T> inline T store(float v);
template <> inline float store<float>(float v) { return v; }
template <> inline bf16 store<bf16>(float v) { return float_to_bf16(v); }

struct Step {
  dnnl::primitive prim;
  Args args;
  void run() { HOTOPS_CHECK_DNNL(prim.execute(cpu::stream(), args)); }
};

// Everything of one conv layer.
struct ConvPrims {
  // The conv2d plans (conv_shape): forward; weight and bias gradient (train); input gradient (train,
  // layers after the first).
  std::unique_ptr<conv2d::Plan> fwd, filter, data;
  const float* w = nullptr;  // the forward's weights: the f32 OHWI parameters, or (f32 infer) w_packed
  memory in, conv_in;        // the layer's input; the forward's (infer: in_to_conv's copy where they differ)
  memory w_packed;           // f32 infer: the weights in the forward's layout, reordered once at setup
  Step bn_fwd, pool_fwd, bn_bwd, pool_bwd;
  Step in_to_conv;                            // infer: the layer's input to the conv's layout (when they differ)
  Step p_to_nhwc;                             // infer, own layouts: the last pooled output to NHWC
  memory z, a, p, bn_ws, pool_ws, mean, var;  // activations and saved state (a: post-ReLU)
  memory p_blocked;                           // infer, own layouts: the last pool's own output
  memory da, dz;                              // gradients of a and z (shared scratch)
};

class CpuCnn final : public ModelCase {
 public:
  explicit CpuCnn(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, models::step_seed(p))),
        keys_(dropout_keys(s_.arch, models::step_seed(p))), threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch;
    const dt at = adt();  // the activations' type
    // infer with a pooled first conv reads the images in nchw (see the file comment): they are held in
    // that order, converted here, as the CUDA NCHW path holds them, so the step reorders nothing.
    x_nchw_ = !s_.train() && s_.convs.front().pool > 0;
    x_ = images(seeded_.x);
    labels_ = seeded_.labels;
    params_ = seeded_.params;
    m_ = seeded_.m;
    v_ = seeded_.v;
    stats_ = seeded_.stats;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);
    mask_period_ = B;
    if (!s_.train() && a.bn) fold_batch_norms();

    dnnl::engine& eng = cpu::engine();
    const auto fwd_kind = s_.train() ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                       dnnl::normalization_flags::fuse_norm_relu;
    float* P = infer_params();
    float* G = grads_.as<float>();
    std::int64_t max_out = 0;
    for (const ConvLayer& c : s_.convs) max_out = std::max(max_out, c.out_count());
    if (s_.train()) da_ = memory(nhwc(B, 1, 1, max_out, at), eng), dz_ = memory(nhwc(B, 1, 1, max_out, at), eng);
    x_mem_ = memory(x_nchw_ ? memory::desc({B, a.C, a.H, a.W}, at, tag::nchw) : nhwc(B, a.C, a.H, a.W, at), eng, x_.data());
    memory in = x_mem_;
    {
      const ConvLayer& c = s_.convs.front();
      fused_ = {B, c.C, c.H, c.W, c.K, c.pad, c.pool, c.PH, c.PW};
      fuse_first_ = x_nchw_ && !s_.bf16() && conv_pool_supported(fused_);
    }
    for (std::size_t i = 0; i < s_.convs.size(); ++i) {
      const ConvLayer& c = s_.convs[i];
      const Layer& ly = l_.conv[i];
      ConvPrims& cp = conv_.emplace_back();
      if (i == 0 && fuse_first_) {  // conv + bias + ReLU + pool in one pass (cpu_conv_pool.h), into nhwc
        fused_w_ = conv_pool_filters(P + ly.w, c.K, c.C);
        fused_b_ = P + ly.b;
        cp.p = memory(nhwc(B, c.K, c.PH, c.PW, at), eng);
        in = cp.p;
        continue;
      }
      const memory::desc src = nhwc(B, c.C, c.H, c.W, at), dst_user = nhwc(B, c.K, c.P, c.Q, at);
      const bool own_layout = !s_.train(), last = i + 1 == s_.convs.size();
      plan_conv(i, cp, in, P);
      const memory::desc dst = conv2d::onednn_desc(*cp.fwd, conv2d::Tensor::y);  // dst_user, or the conv's own layout (infer)
      if (own_layout && dst != dst_user) own_layouts_ = true;
      const bool bn_train = s_.train() && a.bn;
      (bn_train ? cp.z : cp.a) = memory(dst, eng);
      dnnl::batch_normalization_forward::primitive_desc bpd;
      if (bn_train) {
        // The forward normalizes with the batch statistics batch_stats() computed (use_global_stats:
        // mean and variance are inputs); the backward, made from the plain training forward, still
        // differentiates through them.
        const auto bd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, dst,
                                                                                  static_cast<float>(kBnEps), flags));
        bpd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(bd, eng));
        const auto gd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::desc(
            dnnl::prop_kind::forward_training, dst, static_cast<float>(kBnEps), flags | dnnl::normalization_flags::use_global_stats));
        const auto gpd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(gd, eng));
        HOTOPS_CHECK(gpd.workspace_desc() == bpd.workspace_desc(), "model_cnn: oneDNN's batch-norm workspaces differ with given statistics");
        cp.a = memory(dst, eng);
        cp.bn_ws = memory(bpd.workspace_desc(), eng);
        cp.mean = memory(vec(c.K), eng);
        cp.var = memory(vec(c.K), eng);
        cp.bn_fwd = {HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward(gpd)),
                     {{DNNL_ARG_SRC, cp.z}, {DNNL_ARG_DST, cp.a}, {DNNL_ARG_SCALE, memory(vec(c.K), eng, P + ly.gamma)},
                      {DNNL_ARG_SHIFT, memory(vec(c.K), eng, P + ly.beta)}, {DNNL_ARG_MEAN, cp.mean},
                      {DNNL_ARG_VARIANCE, cp.var}, {DNNL_ARG_WORKSPACE, cp.bn_ws}}};
      }
      memory next = cp.a;
      dnnl::pooling_forward::primitive_desc ppd;
      const memory::dims pk{c.pool, c.pool}, pz{0, 0};
      if (c.pool) {
        const memory::desc pdst = nhwc(B, c.K, c.PH, c.PW, at);
        const memory::desc pool_dst = own_layout ? memory::desc({B, c.K, c.PH, c.PW}, at, tag::any) : pdst;
        const auto pd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::desc(fwd_kind, dnnl::algorithm::pooling_max, dst, pool_dst, pk, pk, pz, pz));
        ppd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(pd, eng));
        // NHWC where the flatten (or the train step's loops) read it, else the pool's own layout.
        cp.p = memory(own_layout && !last ? ppd.dst_desc() : pdst, eng);
        memory pooled = cp.p;
        if (ppd.dst_desc() != cp.p.get_desc()) {
          cp.p_blocked = pooled = memory(ppd.dst_desc(), eng);
          cp.p_to_nhwc = {HOTOPS_CHECK_DNNL(dnnl::reorder(cp.p_blocked, cp.p)), {{DNNL_ARG_FROM, cp.p_blocked}, {DNNL_ARG_TO, cp.p}}};
        }
        cp.pool_fwd = {HOTOPS_CHECK_DNNL(dnnl::pooling_forward(ppd)), {{DNNL_ARG_SRC, cp.a}, {DNNL_ARG_DST, pooled}}};
        if (s_.train()) cp.pool_ws = memory(ppd.workspace_desc(), eng), cp.pool_fwd.args[DNNL_ARG_WORKSPACE] = cp.pool_ws;
        next = cp.p;
      }
      if (s_.train()) {
        cp.da = memory(dst, eng, da_.get_data_handle());
        cp.dz = memory(dst, eng, dz_.get_data_handle());
        // The gradient of this layer's input: the previous layer's pooled output or its a.
        memory d_in = i == 0 ? memory() : memory(src, eng);
        d_in_.push_back(d_in);
        if (c.pool) {
          const auto pbd = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, dst, nhwc(B, c.K, c.PH, c.PW, at), pk, pk, pz, pz));
          const auto pbpd = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(pbd, eng, ppd));
          cp.pool_bwd = {HOTOPS_CHECK_DNNL(dnnl::pooling_backward(pbpd)),
                         {{DNNL_ARG_DIFF_SRC, cp.da}, {DNNL_ARG_WORKSPACE, cp.pool_ws}}};  // DIFF_DST set below
        }
        if (bn_train) {
          const auto bbd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, dst, dst,
                                                                                      static_cast<float>(kBnEps), flags));
          const auto bbpd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::primitive_desc(bbd, eng, bpd));
          cp.bn_bwd = {HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward(bbpd)),
                       {{DNNL_ARG_SRC, cp.z}, {DNNL_ARG_MEAN, cp.mean}, {DNNL_ARG_VARIANCE, cp.var},
                        {DNNL_ARG_DIFF_DST, cp.da}, {DNNL_ARG_SCALE, memory(vec(c.K), eng, P + ly.gamma)},
                        {DNNL_ARG_SHIFT, memory(vec(c.K), eng, P + ly.beta)}, {DNNL_ARG_WORKSPACE, cp.bn_ws},
                        {DNNL_ARG_DIFF_SRC, cp.dz}, {DNNL_ARG_DIFF_SCALE, memory(vec(c.K), eng, G + ly.gamma)},
                        {DNNL_ARG_DIFF_SHIFT, memory(vec(c.K), eng, G + ly.beta)}}};
        }
      }
      in = next;
    }
    HOTOPS_CHECK(s_.convs.back().pool > 0, "model_cnn: the last conv layer must be pooled (the flatten reads the pooled output, NHWC)");
    flat_ = in;
    setup_dense(P, G);
    if (s_.train()) wire_backward();
    if (!s_.train()) logits_out_ = HostBuffer(DType::f32, static_cast<std::size_t>(B * a.classes));
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    forward();
    if (s_.train()) {
      trace::op("cross_entropy");
      loss_ = loss_and_dlogits();
      backward();
      trace::op("adamw");
      adamw_step();
    }
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
  }

  Check verify() override {
    const State start = verification_state(s_, seeded_);
    restore(start, verify_period(s_));
    for (const auto& [at, n] : l_.tensors) std::fill_n(grads_.as<float>() + at, n, std::numeric_limits<float>::quiet_NaN());
    for (ConvPrims& cp : conv_) {  // NaN: an output a step did not write shows (the fused layer's: its pooled p)
      memory& m = cp.a.get(true) ? cp.a : cp.p;
      std::memset(m.get_data_handle(), 0xff, m.get_desc().get_size());
    }
    run();
    Outcome o;
    if (!s_.train()) {
      o.logits = logits_out_;
    } else {
      o.loss = static_cast<float>(loss_);
      o.grads = grads_;
      o.params = params_;
      o.stats = stats_;
      for (ConvPrims& cp : conv_) o.relu.push_back(widened(cp.a));
      o.hidden = widened(hr_);
    }
    Check c = verify_outcome(s_, l_, keys_, start, o);
    restore(seeded_, s_.batch);
    return c;
  }

  std::string label() const override {
    std::string l = std::string(s_.bf16() ? "bf16 autocast (f32 master weights cast each step; bf16 activations, f32 accumulation); " : "") +
                    (fuse_first_ ? "conv 1 + bias + ReLU + max-pool: one hotops pass (" + conv_pool_isa() + "); conv 2 on: " : "") +
                    "oneDNN convolution (" + conv_impl_ + "), " + (s_.arch.bn && s_.train() ? "batch_normalization + ReLU, " : "") +
                    "pooling max, matmul; hotops loops for the last layer" + (s_.train() ? ", dropout, loss, AdamW" : "") +
                    (own_layouts_ ? "; the conv and pool layers in the layouts oneDNN picked, NHWC at the flatten; " : "; NHWC; ") +
                    std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
    if (!s_.train() && s_.arch.bn) l += "; batch norms folded into the weights at setup";
    if (x_nchw_) l += "; the images held NCHW";
    return l;
  }

  double last_loss() override { return loss_; }

 private:
  dt adt() const { return s_.bf16() ? dt::bf16 : dt::f32; }

  // An activation memory (NHWC or [rows, cols], f32 or bf16) as f32.
  static HostBuffer widened(const memory& m) {
    const bool low = m.get_desc().data_type() == dt::bf16;
    const std::size_t n = m.get_desc().get_size() / (low ? 2 : 4);
    HostBuffer h(DType::f32, n);
    if (!low) std::memcpy(h.data(), m.get_data_handle(), h.bytes());
    for (std::size_t i = 0; low && i < n; ++i) h.as<float>()[i] = bf16_to_float(static_cast<const bf16*>(m.get_data_handle())[i]);
    return h;
  }

  // The shape of conv layer i's conv2d pass `dir`: a 3x3 stride-1 convolution over the batch, with
  // the f32 OHWI parameters as weights (bf16 casts them in each run). train: NHWC activations, and
  // the bias and a ReLU post-op unless batch norm follows (the backward passes' forward hint has them
  // too); infer: forward_inference with both, each activation in the layout oneDNN picks except a
  // first conv with a pool after it, which reads the images NCHW; f32 takes the weights reordered once
  // at setup, bf16 casts them in each run.
  conv2d::Shape conv_shape(std::size_t i, Direction dir) const {
    const ConvLayer& c = s_.convs[i];
    const bool bn_train = s_.train() && s_.arch.bn;
    conv2d::Shape cs;
    cs.dir = dir, cs.dtype = s_.dtype, cs.layout = conv2d::Layout::nhwc;
    cs.N = s_.batch, cs.C = c.C, cs.H = c.H, cs.W = c.W, cs.K = c.K, cs.R = cs.S = 3, cs.pad_h = cs.pad_w = c.pad;
    cs.bias = cs.relu = !bn_train;
    cs.f32_params = true;
    if (s_.train()) {
      cs.x_pick = cs.y_pick = conv2d::Shape::Pick::nhwc;
    } else {
      cs.inference = cs.onednn_layouts = true;
      cs.w_from_user = s_.bf16();
      if (i == 0 && c.pool) cs.x_pick = conv2d::Shape::Pick::nchw;
    }
    return cs;
  }

  // Conv layer i's conv2d plans and the forward's input and weights; `in` is the layer's input.
  void plan_conv(std::size_t i, ConvPrims& cp, const memory& in, const float* P) {
    const conv2d::Shape fs = conv_shape(i, Direction::fwd);
    cp.fwd = conv2d::make_cpu_plan(fs);
    conv_impl_ += std::string(conv_impl_.empty() ? "" : ", ") + conv2d::onednn_impl(*cp.fwd);
    cp.in = cp.conv_in = in;
    const memory::desc src = conv2d::onednn_desc(*cp.fwd, conv2d::Tensor::x);
    if (!s_.train() && src != in.get_desc()) {  // the images, or the previous layer's output
      cp.conv_in = memory(src, cpu::engine());
      cp.in_to_conv = {HOTOPS_CHECK_DNNL(dnnl::reorder(in, cp.conv_in)), {{DNNL_ARG_FROM, in}, {DNNL_ARG_TO, cp.conv_in}}};
    }
    cp.w = P + l_.conv[i].w;
    if (!s_.train() && !s_.bf16()) {  // the weights are fixed: reorder once here (bf16 casts in the step)
      cp.w_packed = memory(conv2d::onednn_desc(*cp.fwd, conv2d::Tensor::w), cpu::engine());
      conv2d::to_onednn_layout(fs, conv2d::Tensor::w, cp.w, cp.w_packed.get_data_handle());
      cp.w = static_cast<const float*>(cp.w_packed.get_data_handle());
    }
    if (!s_.train()) return;
    cp.filter = conv2d::make_cpu_plan(conv_shape(i, Direction::bwd_weight));
    if (i > 0) cp.data = conv2d::make_cpu_plan(conv_shape(i, Direction::bwd_data));
  }

  // The parameters the forward reads: the flat buffer, or (infer with batch norm) its folded copy.
  float* infer_params() { return folded_.count() ? folded_.as<float>() : params_.as<float>(); }

  // W' = W gamma / sqrt(var + eps) per output channel, b' = (b - mean) gamma / sqrt(var + eps) + beta.
  void fold_batch_norms() {
    folded_ = params_;
    float* F = folded_.as<float>();
    const float* S = stats_.as<float>();
    auto fold = [&](const Layer& y, std::int64_t n, std::int64_t fan_in, bool out_major) {
      for (std::int64_t k = 0; k < n; ++k) {
        const double sc = F[y.gamma + k] / std::sqrt(static_cast<double>(S[y.var + k]) + kBnEps);
        for (std::int64_t j = 0; j < fan_in; ++j) {
          float& w = out_major ? F[y.w + static_cast<std::size_t>(k * fan_in + j)] : F[y.w + static_cast<std::size_t>(j * n + k)];
          w = static_cast<float>(w * sc);
        }
        F[y.b + k] = static_cast<float>((F[y.b + k] - S[y.mean + k]) * sc + F[y.beta + k]);
      }
    };
    for (std::size_t i = 0; i < s_.convs.size(); ++i) fold(l_.conv[i], s_.convs[i].K, 9 * s_.convs[i].C, true);
    fold(l_.dense1, s_.arch.hidden, flat_width(s_.arch), false);
  }

  void setup_dense(float* P, float* G) {
    const Arch& a = s_.arch;
    dnnl::engine& eng = cpu::engine();
    const std::int64_t B = s_.batch, F = flat_width(a), Hd = a.hidden;
    const bool bn_train = s_.train() && a.bn;
    const dt at = adt();
    flat2d_ = memory(mat(B, F, false, at), eng, flat_.get_data_handle());
    // W1 as the matmuls take it: the f32 parameters, or (bf16) their copy cast in each step.
    memory w1_user(mat(F, Hd), eng, P + l_.dense1.w), w1 = w1_user;
    if (s_.bf16()) {
      w1 = memory(mat(F, Hd, false, at), eng);
      w1_cast_ = {HOTOPS_CHECK_DNNL(dnnl::reorder(w1_user, w1)), {{DNNL_ARG_FROM, w1_user}, {DNNL_ARG_TO, w1}}};
    }
    dnnl::post_ops po;
    if (!bn_train) po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    const memory::desc bias_md({1, Hd}, dt::f32, memory::dims{Hd, 1});
    // f32 infer: the weights are fixed, so the matmul takes them in its own format (format_tag::any),
    // reordered once here (as conv weights are). keras_cnn's M = 64, K = 56448 product took 10.2 ms
    // from the plain [F, Hd] layout and 8.7 ms prepacked on the H100 host's Xeon (oneDNN verbose, two
    // runs). train reads the flat buffer as it changes; bf16 casts it in each step (w1_cast_).
    const bool prepack = !s_.train() && !s_.bf16();
    const memory::desc w1_md = prepack ? memory::desc({F, Hd}, dt::f32, tag::any) : mat(F, Hd, false, at);
    const auto d1 = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(mat(B, F, false, at), w1_md, bn_train ? memory::desc() : bias_md,
                                                         mat(B, Hd, false, at)));
    const auto pd1 = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(d1, attr, eng));
    hr_ = memory(mat(B, Hd, false, at), eng);
    h_ = bn_train ? memory(mat(B, Hd, false, at), eng) : hr_;
    if (prepack && pd1.weights_desc() != w1_user.get_desc()) {
      w1_packed_ = memory(pd1.weights_desc(), eng);
      HOTOPS_CHECK_DNNL(dnnl::reorder(w1_user, w1_packed_).execute(cpu::stream(), w1_user, w1_packed_));
      HOTOPS_CHECK_DNNL(cpu::stream().wait());
      w1 = w1_packed_;
    }
    dense1_ = {HOTOPS_CHECK_DNNL(dnnl::matmul(pd1)), {{DNNL_ARG_SRC, flat2d_}, {DNNL_ARG_WEIGHTS, w1}, {DNNL_ARG_DST, h_}}};
    if (!bn_train) dense1_.args[DNNL_ARG_BIAS] = memory(bias_md, eng, P + l_.dense1.b);
    hd_ = HostBuffer(DType::f32, static_cast<std::size_t>(B * Hd));
    logits_ = HostBuffer(DType::f32, static_cast<std::size_t>(B * a.classes));
    if (!s_.train()) return;
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                       dnnl::normalization_flags::fuse_norm_relu;
    dh_ = memory(mat(B, Hd, false, at), eng);
    dhr_ = memory(mat(B, Hd, false, at), eng);
    if (bn_train) {
      const memory::desc nc({B, Hd}, at, tag::nc);
      const auto bd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, nc,
                                                                                static_cast<float>(kBnEps), flags));
      const auto bpd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(bd, eng));
      hmean_ = memory(vec(Hd), eng), hvar_ = memory(vec(Hd), eng), hws_ = memory(bpd.workspace_desc(), eng);
      memory gamma(vec(Hd), eng, P + l_.dense1.gamma), beta(vec(Hd), eng, P + l_.dense1.beta);
      hbn_fwd_ = {HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward(bpd)),
                  {{DNNL_ARG_SRC, h_}, {DNNL_ARG_DST, hr_}, {DNNL_ARG_SCALE, gamma}, {DNNL_ARG_SHIFT, beta},
                   {DNNL_ARG_MEAN, hmean_}, {DNNL_ARG_VARIANCE, hvar_}, {DNNL_ARG_WORKSPACE, hws_}}};
      const auto bbd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, nc, nc,
                                                                                  static_cast<float>(kBnEps), flags));
      const auto bbpd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::primitive_desc(bbd, eng, bpd));
      hbn_bwd_ = {HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward(bbpd)),
                  {{DNNL_ARG_SRC, h_}, {DNNL_ARG_MEAN, hmean_}, {DNNL_ARG_VARIANCE, hvar_}, {DNNL_ARG_DIFF_DST, dhr_},
                   {DNNL_ARG_SCALE, gamma}, {DNNL_ARG_SHIFT, beta}, {DNNL_ARG_WORKSPACE, hws_}, {DNNL_ARG_DIFF_SRC, dh_},
                   {DNNL_ARG_DIFF_SCALE, memory(vec(Hd), eng, G + l_.dense1.gamma)},
                   {DNNL_ARG_DIFF_SHIFT, memory(vec(Hd), eng, G + l_.dense1.beta)}}};
    }
    // dW1 = flat^T . dh, dflat = dh . W1^T
    // (bf16: dW1 written f32 from the f32 accumulators)
    const auto dw = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(mat(F, B, true, at), mat(B, Hd, false, at), mat(F, Hd)));
    dense1_dw_ = {HOTOPS_CHECK_DNNL(dnnl::matmul(dnnl::matmul::primitive_desc(dw, eng))),
                  {{DNNL_ARG_SRC, memory(mat(F, B, true, at), eng, flat_.get_data_handle())}, {DNNL_ARG_WEIGHTS, dh_},
                   {DNNL_ARG_DST, memory(mat(F, Hd), eng, G + l_.dense1.w)}}};
    const auto dx = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(mat(B, Hd, false, at), mat(Hd, F, true, at), mat(B, F, false, at)));
    dflat_ = memory(mat(B, F, false, at), eng);
    dense1_dx_ = {HOTOPS_CHECK_DNNL(dnnl::matmul(dnnl::matmul::primitive_desc(dx, eng))),
                  {{DNNL_ARG_SRC, dh_}, {DNNL_ARG_WEIGHTS, memory(mat(Hd, F, true, at), eng, w1.get_data_handle())}, {DNNL_ARG_DST, dflat_}}};
    dlogits_ = HostBuffer(DType::f32, static_cast<std::size_t>(B * a.classes));
  }

  // The gradient each conv layer's backward starts from: the next layer's input gradient (or dflat).
  // A pooled layer's goes through dropout (in place) and the pool's backward into da; an unpooled
  // layer's is its da.
  void wire_backward() {
    for (std::size_t i = 0; i < conv_.size(); ++i) {
      ConvPrims& cp = conv_[i];
      const memory d_next = i + 1 < conv_.size() ? d_in_[i + 1] : dflat_;
      if (s_.convs[i].pool) {
        cp.pool_bwd.args[DNNL_ARG_DIFF_DST] = d_next;
        continue;
      }
      cp.da = d_next;
      if (s_.arch.bn) cp.bn_bwd.args[DNNL_ARG_DIFF_DST] = d_next;
    }
  }

  // In place over a pooled tensor [batch, n] of the activations' type: v *= keep(key, e, b mod period) ? scale : 0.
  void dropout(void* v, std::int64_t n, const pointwise::DropoutKey& key) const {
    if (s_.bf16()) return dropout_on(static_cast<bf16*>(v), n, key);
    dropout_on(static_cast<float*>(v), n, key);
  }
  template <class T>
  void dropout_on(T* v, std::int64_t n, const pointwise::DropoutKey& key) const {
    const std::int64_t B = s_.batch, period = mask_period_;
    const pointwise::DropoutKey k = key;
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t e0 = 0; e0 < n; e0 += 4096) {
        T* row = v + b * n;
        const auto hi = static_cast<std::uint32_t>(b % period);
        const std::int64_t e1 = std::min(n, e0 + 4096);
#pragma omp simd
        for (std::int64_t e = e0; e < e1; ++e)
          row[e] = store<T>(load(row[e]) * (pointwise::dropout_keep(k, static_cast<std::uint32_t>(e), hi) ? k.scale : 0.f));
      }
  }

  void forward() {
    const Arch& a = s_.arch;
    const bool bn_train = s_.train() && a.bn;
    for (std::size_t i = 0; i < conv_.size(); ++i) {
      ConvPrims& cp = conv_[i];
      if (i == 0 && fuse_first_) {
        trace::op("conv2d_relu_maxpool");
        conv_pool(fused_, x_.as<float>(), fused_w_.data(), fused_b_, static_cast<float*>(cp.p.get_data_handle()));
        continue;
      }
      trace::op("reorder");
      if (cp.in_to_conv.prim) cp.in_to_conv.run();
      trace::op("conv2d");  // bf16 and train: with the weights' reorder from the parameters
      const float* b = s_.train() && s_.arch.bn ? nullptr : infer_params() + l_.conv[i].b;
      cp.fwd->run({cp.conv_in.get_data_handle(), cp.w, b, nullptr, (bn_train ? cp.z : cp.a).get_data_handle(), nullptr});
      if (bn_train) {
        trace::op("batchnorm");
        HOTOPS_CHECK_DNNL(cpu::stream().wait());
        batch_stats(cp, s_.batch * s_.convs[i].P * s_.convs[i].Q, s_.convs[i].K);
        cp.bn_fwd.run();
      }
      if (s_.convs[i].pool) {
        trace::op("maxpool");
        cp.pool_fwd.run();
        if (cp.p_to_nhwc.prim) cp.p_to_nhwc.run();
        if (s_.train()) {
          HOTOPS_CHECK_DNNL(cpu::stream().wait());
          trace::op("dropout");
          dropout(cp.p.get_data_handle(), s_.convs[i].pooled_count(), keys_[stage_of(i)]);
        }
      }
    }
    trace::op("addmm");
    if (w1_cast_.prim) w1_cast_.run();
    dense1_.run();
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    if (bn_train) trace::op("batchnorm"), hbn_fwd_.run();
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    if (bn_train) update_running_stats();
    trace::op("dropout");
    const std::int64_t B = s_.batch, Hd = a.hidden, C = a.classes;
    float* hd = hd_.as<float>();
    if (s_.bf16()) {
      const bf16* hr = static_cast<const bf16*>(hr_.get_data_handle());
      for (std::int64_t i = 0; i < B * Hd; ++i) hd[i] = bf16_to_float(hr[i]);
    } else {
      std::copy_n(static_cast<const float*>(hr_.get_data_handle()), B * Hd, hd);
    }
    if (s_.train()) dropout_on(hd, Hd, keys_.back());  // hd is f32 in both dtypes
    // logits = hd . W2 + b2 (a [hidden, classes] layer: a loop)
    trace::op("addmm");
    const float* W2 = infer_params() + l_.dense2.w;
    const float* b2 = infer_params() + l_.dense2.b;
    float* z = logits_.as<float>();
#pragma omp parallel for schedule(static)
    for (std::int64_t b = 0; b < B; ++b) {
      float acc[16] = {};
      for (std::int64_t o = 0; o < Hd; ++o)
        for (std::int64_t c = 0; c < C; ++c) acc[c] += hd[b * Hd + o] * W2[o * C + c];
      for (std::int64_t c = 0; c < C; ++c) z[b * C + c] = acc[c] + b2[c];
    }
    if (!s_.train()) std::copy_n(z, B * C, logits_out_.as<float>());
  }

  double loss_and_dlogits() {
    const std::int64_t B = s_.batch, C = s_.arch.classes;
    const float* z = logits_.as<float>();
    float* dz = dlogits_.as<float>();
    const float inv_b = 1.f / static_cast<float>(B);
    double total = 0;
    for (std::int64_t r = 0; r < B; ++r) {
      const float* zr = z + r * C;
      float* dr = dz + r * C;
      const float mx = *std::max_element(zr, zr + C);
      float sum = 0.f;
      for (std::int64_t c = 0; c < C; ++c) sum += (dr[c] = std::exp(zr[c] - mx));
      const float inv = 1.f / sum;
      for (std::int64_t c = 0; c < C; ++c) dr[c] = dr[c] * inv * inv_b;
      const std::int32_t y = labels_[static_cast<std::size_t>(r)];
      dr[y] -= inv_b;
      total += static_cast<double>(std::log(sum) - (zr[y] - mx));
    }
    return total / static_cast<double>(B);
  }

  void backward() {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch;
    float* G = grads_.as<float>();
    if (s_.bf16()) head_backward<bf16>();
    else head_backward<float>();
    trace::op("mm");
    dense1_dw_.run();
    dense1_dx_.run();
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    for (std::size_t i = conv_.size(); i-- > 0;) {
      const ConvLayer& c = s_.convs[i];
      ConvPrims& cp = conv_[i];
      if (c.pool) {
        HOTOPS_CHECK_DNNL(cpu::stream().wait());
        trace::op("dropout_bwd");
        const memory& d_next = cp.pool_bwd.args.at(DNNL_ARG_DIFF_DST);
        dropout(d_next.get_data_handle(), c.pooled_count(), keys_[stage_of(i)]);
        trace::op("maxpool_bwd");
        cp.pool_bwd.run();
      }
      if (a.bn) {
        trace::op("batchnorm_bwd");
        cp.bn_bwd.run();
        std::fill_n(G + l_.conv[i].b, c.K, 0.f);  // before batch norm: zero by construction
      } else {
        HOTOPS_CHECK_DNNL(cpu::stream().wait());
        trace::op("relu_bwd");
        if (s_.bf16())
          relu_backward(static_cast<const bf16*>(cp.a.get_data_handle()), static_cast<const bf16*>(cp.da.get_data_handle()),
                        static_cast<bf16*>(cp.dz.get_data_handle()), B * c.out_count());
        else
          relu_backward(static_cast<const float*>(cp.a.get_data_handle()), static_cast<const float*>(cp.da.get_data_handle()),
                        static_cast<float*>(cp.dz.get_data_handle()), B * c.out_count());
      }
      trace::op("conv2d_bwd_weight");  // with dw's reorder into the gradients
      const Layer& ly = l_.conv[i];
      cp.filter->run({cp.in.get_data_handle(), nullptr, nullptr, cp.dz.get_data_handle(), G + ly.w, a.bn ? nullptr : G + ly.b});
      if (i > 0) {
        trace::op("conv2d_bwd_data");  // with the weights' reorder from the parameters
        cp.data->run({nullptr, cp.w, nullptr, cp.dz.get_data_handle(), d_in_[i].get_data_handle(), nullptr});
      }
    }
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
  }

  // The head's backward on activations of type T (the loops in f32): dense 2's dW2 = hd^T dlogits,
  // db2, dhd = dlogits W2^T; then dropout and ReLU (or BN + ReLU) into dh.
  template <class T>
  void head_backward() {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch, Hd = a.hidden, C = a.classes;
    float* P = params_.as<float>();
    float* G = grads_.as<float>();
    const float* dl = dlogits_.as<float>();
    const float* hd = hd_.as<float>();
    float* dW2 = G + l_.dense2.w;
    T* dhr = static_cast<T*>(dhr_.get_data_handle());
    const float* W2 = P + l_.dense2.w;
    trace::op("mm");
#pragma omp parallel for schedule(static)
    for (std::int64_t o = 0; o < Hd; ++o) {
      for (std::int64_t c = 0; c < C; ++c) {
        float acc = 0.f;
        for (std::int64_t b = 0; b < B; ++b) acc += hd[b * Hd + o] * dl[b * C + c];
        dW2[o * C + c] = acc;
      }
      for (std::int64_t b = 0; b < B; ++b) {
        float acc = 0.f;
        for (std::int64_t c = 0; c < C; ++c) acc += dl[b * C + c] * W2[o * C + c];
        dhr[b * Hd + o] = store<T>(acc);
      }
    }
    for (std::int64_t c = 0; c < C; ++c) {
      float acc = 0.f;
      for (std::int64_t b = 0; b < B; ++b) acc += dl[b * C + c];
      G[l_.dense2.b + static_cast<std::size_t>(c)] = acc;
    }
    trace::op("dropout_bwd");
    dropout_on(dhr, Hd, keys_.back());
    T* dh = static_cast<T*>(dh_.get_data_handle());
    trace::op(a.bn ? "batchnorm_bwd" : "relu_bwd");
    if (a.bn) {
      hbn_bwd_.run();
      std::fill_n(G + l_.dense1.b, Hd, 0.f);  // before batch norm: zero by construction
    } else {
      // The bias gradient sums the stored (rounded) dh that dW1 also uses.
      const T* hr = static_cast<const T*>(hr_.get_data_handle());
      for (std::int64_t o = 0; o < Hd; ++o) G[l_.dense1.b + static_cast<std::size_t>(o)] = 0.f;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t o = 0; o < Hd; ++o) {
          const T d = load(hr[b * Hd + o]) > 0.f ? dhr[b * Hd + o] : store<T>(0.f);
          dh[b * Hd + o] = d;
          G[l_.dense1.b + static_cast<std::size_t>(o)] += load(d);
        }
    }
  }

  // A conv layer's batch statistics (mean, biased variance) of z [rows, K], accumulated in double:
  // oneDNN's own, in f32, drift from the true ones by up to 1.6e-3 (relative) over keras_cnn's 2.1M
  // values a channel at batch 32 on one thread, and every gradient below carries that. One pass of
  // sums shifted by the channel's first value (no cancellation where the mean is large); the threads'
  // partial sums are added in thread order.
  void batch_stats(ConvPrims& cp, std::int64_t rows, std::int64_t K) const {
    if (s_.bf16()) return batch_stats_on(static_cast<const bf16*>(cp.z.get_data_handle()), rows, K, cp);
    batch_stats_on(static_cast<const float*>(cp.z.get_data_handle()), rows, K, cp);
  }
  template <class T>
  static void batch_stats_on(const T* z, std::int64_t rows, std::int64_t K, ConvPrims& cp) {
    const int nt = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(rows)));
    std::vector<double> part(static_cast<std::size_t>(2 * K * nt), 0.0);
    std::vector<float> shift(static_cast<std::size_t>(K));
    for (std::int64_t c = 0; c < K; ++c) shift[static_cast<std::size_t>(c)] = load(z[c]);
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num();
      double* __restrict s1 = part.data() + 2 * K * t;
      double* __restrict s2 = s1 + K;
      const float* __restrict k0 = shift.data();
      for (std::int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {
        const T* __restrict zr = z + r * K;
#pragma omp simd
        for (std::int64_t c = 0; c < K; ++c) {
          const double d = static_cast<double>(load(zr[c])) - k0[c];
          s1[c] += d, s2[c] += d * d;
        }
      }
    }
    float* mean = static_cast<float*>(cp.mean.get_data_handle());
    float* var = static_cast<float*>(cp.var.get_data_handle());
    for (std::int64_t c = 0; c < K; ++c) {
      double a = 0, b = 0;
      for (int t = 0; t < nt; ++t) a += part[static_cast<std::size_t>(2 * K * t + c)], b += part[static_cast<std::size_t>(2 * K * t + K + c)];
      const double d = a / static_cast<double>(rows);
      mean[c] = static_cast<float>(shift[static_cast<std::size_t>(c)] + d);
      var[c] = static_cast<float>(std::max(b / static_cast<double>(rows) - d * d, 0.0));
    }
  }

  template <class T>
  static void relu_backward(const T* a, const T* da, T* dz, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) dz[i] = load(a[i]) > 0.f ? da[i] : store<T>(0.f);
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(), n,
                    adamw::scalars_for(hyper(), ++step_), 0);
  }

  // The running statistics from the batch statistics: oneDNN's variance is the biased one, the running
  // one takes the unbiased; the conv ran without its bias, so the batch mean of conv + b is mean + b.
  void update_running_stats() {
    float* S = stats_.as<float>();
    const float* P = params_.as<float>();
    auto update = [&](const Layer& y, const memory& mean, const memory& var, std::int64_t n_ch, double count) {
      const float* bm = static_cast<const float*>(mean.get_data_handle());
      const float* bv = static_cast<const float*>(var.get_data_handle());
      const auto mo = static_cast<float>(kBnMomentum);
      const auto unbias = static_cast<float>(count / (count - 1));
      for (std::int64_t c = 0; c < n_ch; ++c) {
        const std::size_t k = static_cast<std::size_t>(c);
        S[y.mean + k] = (1 - mo) * S[y.mean + k] + mo * (bm[c] + P[y.b + k]);
        S[y.var + k] = (1 - mo) * S[y.var + k] + mo * bv[c] * unbias;
      }
    };
    for (std::size_t i = 0; i < conv_.size(); ++i)
      update(l_.conv[i], conv_[i].mean, conv_[i].var, s_.convs[i].K,
             static_cast<double>(s_.batch * s_.convs[i].P * s_.convs[i].Q));
    update(l_.dense1, hmean_, hvar_, s_.arch.hidden, static_cast<double>(s_.batch));
  }

  std::size_t stage_of(std::size_t i) const {
    std::size_t st = 0;
    for (std::size_t j = 0; j < i; ++j) st += s_.convs[j].pool ? 1 : 0;
    return st;
  }

  // The images [batch, H, W, C] in the order x_ holds them.
  HostBuffer images(const HostBuffer& x) const {
    const Arch& a = s_.arch;
    return x_nchw_ ? nhwc_to_nchw(x, static_cast<std::int64_t>(x.count()) / (a.H * a.W * a.C), a.H, a.W, a.C) : x;
  }

  void restore(const State& st, std::int64_t period) {
    const HostBuffer x = images(st.x);
    std::memcpy(x_.data(), x.data(), x.bytes());
    labels_ = st.labels;
    std::copy_n(st.params.as<float>(), l_.total, params_.as<float>());
    std::copy_n(st.m.as<float>(), l_.total, m_.as<float>());
    std::copy_n(st.v.as<float>(), l_.total, v_.as<float>());
    std::copy_n(st.stats.as<float>(), st.stats.count(), stats_.as<float>());
    step_ = 0;
    mask_period_ = period;
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  std::vector<pointwise::DropoutKey> keys_;
  int threads_;
  std::int64_t mask_period_ = 1;
  HostBuffer x_, params_, grads_, m_, v_, stats_, folded_;
  std::vector<std::int32_t> labels_;
  std::vector<ConvPrims> conv_;
  std::vector<memory> d_in_;
  bool x_nchw_ = false;  // x_ holds the images nchw (infer with a pooled first conv), else nhwc
  // infer f32: the first layer (conv, bias, ReLU, pool) as one hotops pass, where conv_pool takes it
  bool fuse_first_ = false;
  ConvPoolShape fused_{};
  std::vector<float> fused_w_;  // [C][3][3][K], from the folded weights
  const float* fused_b_ = nullptr;
  memory x_mem_, flat_, flat2d_, da_, dz_, h_, hr_, dh_, dhr_, dflat_, hmean_, hvar_, hws_;
  Step w1_cast_;    // bf16: dense 1's weight to its bf16 copy
  Step dense1_, hbn_fwd_, hbn_bwd_, dense1_dw_, dense1_dx_;
  memory w1_packed_;  // infer: dense 1's weights in the matmul's own format
  HostBuffer hd_, logits_, dlogits_, logits_out_;
  std::string conv_impl_;
  bool own_layouts_ = false;  // infer: some layer runs in a layout of its primitives' own
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::bf16) return "";
  try {  // oneDNN's bf16 convolution (a small conv2d plan) and matmul on this CPU (the ISA decides, not the shape)
    dnnl::engine& eng = cpu::engine();
    conv2d::Shape cs;
    cs.dtype = DType::bf16, cs.layout = conv2d::Layout::nhwc, cs.x_pick = cs.y_pick = conv2d::Shape::Pick::nhwc;
    cs.N = 2, cs.C = cs.K = 16, cs.H = cs.W = 8, cs.R = cs.S = 3, cs.pad_h = cs.pad_w = 1;
    conv2d::make_cpu_plan(cs);
    const auto md = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(mat(2, 16, false, dt::bf16), mat(16, 16, false, dt::bf16), mat(2, 16, false, dt::bf16)));
    HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(md, eng));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported) return "oneDNN has no bf16 convolution or matmul for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuCnn>(p); }

}  // namespace hotops::model_cnn
