// model_cnn on the CPU: a step is a sequence of op families' plans over the model's buffers: conv2d
// (oneDNN convolutions), the batchnorm family's batchnorm_relu_maxpool and batchnorm_relu (batch
// norm or bias, ReLU, max-pool, dropout, forward and backward), matmul (the hidden dense layer's GEMMs);
// OpenMP loops for the last layer, the loss and AdamW. The step, the inference folding and the bf16
// form: docs/models.md, "How each model step runs".
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
#include "kernels/batchnorm/relu_maxpool.h"
#include "kernels/conv2d/cpu_onednn.h"
#include "kernels/copy/copy.h"
#include "kernels/loss/loss.h"
#include "kernels/matmul/matmul.h"
#include "kernels/maxpool/cpu_onednn.h"
#include "kernels/model_cnn/model_cnn.h"

namespace hotops::model_cnn {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

memory::desc nhwc(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, dt t = dt::f32) {
  return memory::desc({N, C, H, W}, t, tag::nhwc);
}

// Storage <-> f32 for the loops over activations: f32 as is, bf16 widened exactly, narrowed to nearest even.
using bf16 = std::uint16_t;
inline float load(float v) { return v; }
inline float load(bf16 v) { return bf16_to_float(v); }
template <class T> inline T store(float v);
template <> inline float store<float>(float v) { return v; }
template <> inline bf16 store<bf16>(float v) { return float_to_bf16(v); }

namespace rmp = batchnorm::relu_maxpool;

// Everything of one conv layer.
struct ConvPrims {
  // The conv2d plans (conv_shape): forward; weight gradient (train); input gradient (train, layers
  // after the first).
  std::unique_ptr<conv2d::Plan> fwd, filter, data;
  const float* w = nullptr;  // the forward's weights: the f32 OHWI parameters, or (f32 infer) w_packed
  memory in;                 // the layer's input (infer: in the layout the layer before wrote it)
  memory w_packed;           // f32 infer: the weights in the forward's layout, reordered once at setup
  // train: batch norm (or the bias) + ReLU (+ max-pool + dropout) of z, forward and backward: the
  // batchnorm family's plans (act_shape), and what the forward saves for the backward.
  std::unique_ptr<rmp::Plan> act_fwd, act_bwd;
  rmp::Shape act;
  std::vector<float> scale, shift, mean, rstd;  // [K]
  std::vector<std::uint8_t> arg;                // pooled: each pooled element's argmax in its window
  // infer: the maxpool plan on the conv's output (forward_inference, in the conv's layout; the last
  // pool writes NHWC for the flatten)
  std::unique_ptr<maxpool::Plan> pool;
  // train: z the conv's output, the layer's output a (unpooled) or p (pooled); infer: a the conv's
  // output (bias and ReLU fused), p the pooled one
  memory z, a, p;
  // infer, a pooled first layer: its conv and pool run over `chunk` samples at a time (a holds one
  // chunk's conv output, which the pool reads back from cache); else the whole batch at once.
  std::int64_t chunk = 0;
};

class CpuCnn final : public ModelCase {
 public:
  explicit CpuCnn(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(seeded_state(s_, l_, models::step_seed(p))),
        keys_(dropout_keys(s_.arch, models::step_seed(p))), threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch;
    const dt at = adt();  // the activations' type
    // infer with a pooled first conv reads the images in nchw (conv_shape): they are held in that
    // order, converted here, as the CUDA NCHW path holds them, so the step reorders nothing.
    x_nchw_ = !s_.train() && s_.convs.front().pool > 0;
    x_ = images(seeded_->x);
    labels_ = seeded_->labels;
    params_ = seeded_->params;
    stats_ = seeded_->stats;
    if (s_.train()) {  // the optimizer's state and the gradients: train only (keras_cnn's are 230 MB each)
      m_ = seeded_->m;
      v_ = seeded_->v;
      grads_ = HostBuffer(DType::f32, l_.total);
      zero_bytes(grads_.data(), grads_.bytes());
    }
    period_ = static_cast<int>(B);
    if (!s_.train() && a.bn) fold_batch_norms();

    // The state above is copied on every core (keras_cnn's is 4 x 230 MB); the plans below are made
    // for the thread count they run with.
    cpu::ThreadScope scope(threads_);
    dnnl::engine& eng = cpu::engine();
    float* P = infer_params();
    std::int64_t max_out = 0;
    for (const ConvLayer& c : s_.convs) max_out = std::max(max_out, c.out_count());
    if (s_.train()) dz_ = memory(nhwc(B, 1, 1, max_out, at), eng);
    x_mem_ = memory(x_nchw_ ? memory::desc({B, a.C, a.H, a.W}, at, tag::nchw) : nhwc(B, a.C, a.H, a.W, at), eng, x_.data());
    memory in = x_mem_;
    for (std::size_t i = 0; i < s_.convs.size(); ++i) {
      const ConvLayer& c = s_.convs[i];
      ConvPrims& cp = conv_.emplace_back();
      plan_conv(i, cp, in, P);
      const memory::desc dst = conv2d::onednn_desc(*cp.fwd, conv2d::Tensor::y);  // NHWC (train), or the conv's own layout (infer)
      if (s_.train()) {
        cp.z = memory(dst, eng);
        cp.act = act_shape(i);
        cp.act_fwd = rmp::make_cpu_plan(cp.act);
        rmp::Shape back = cp.act;
        back.dir = Direction::bwd;
        cp.act_bwd = rmp::make_cpu_plan(back);
        for (std::vector<float>* v : {&cp.scale, &cp.shift, &cp.mean, &cp.rstd}) v->assign(static_cast<std::size_t>(c.K), 0.f);
        if (c.pool) cp.arg.assign(static_cast<std::size_t>(cp.act.pooled()), 0);
        (c.pool ? cp.p : cp.a) = memory(c.pool ? nhwc(B, c.K, c.PH, c.PW, at) : dst, eng);
        // The gradient of this layer's input: the previous layer's output.
        d_in_.push_back(i == 0 ? memory() : memory(nhwc(B, c.C, c.H, c.W, at), eng));
        in = c.pool ? cp.p : cp.a;
        continue;
      }
      const std::int64_t n = cp.chunk ? cp.chunk : B;  // the samples each run of the conv (and pool) takes
      if (dst != nhwc(n, c.K, c.P, c.Q, at)) own_layouts_ = true;
      cp.a = memory(dst, eng);
      in = cp.a;
      if (!c.pool) continue;
      maxpool::Shape ps;
      ps.dir = Direction::fwd, ps.dtype = s_.dtype, ps.layout = maxpool::Layout::nhwc, ps.inference = true;
      ps.N = n, ps.C = c.K, ps.H = c.P, ps.W = c.Q, ps.k = ps.s = c.pool;
      // NHWC where the flatten reads it, or where a chunk's pool writes its part of the batch's output;
      // else the layout the pool picks (the next conv reorders where its differs).
      const bool nhwc_out = cp.chunk || i + 1 == s_.convs.size();
      cp.pool = maxpool::make_cpu_plan(ps, dst, nhwc_out ? nhwc(n, c.K, c.PH, c.PW, at) : memory::desc({B, c.K, c.PH, c.PW}, at, tag::any));
      cp.p = memory(cp.chunk ? nhwc(B, c.K, c.PH, c.PW, at) : maxpool::onednn_y_desc(*cp.pool), eng);
      in = cp.p;
    }
    HOTOPS_CHECK(s_.convs.back().pool > 0, "model_cnn: the last conv layer must be pooled (the flatten reads the pooled output, NHWC)");
    flat_ = in;
    if (s_.bf16() && s_.train()) {  // the dense layers' bf16 copy at the start; AdamW keeps it from then on
      low_ = HostBuffer(DType::bf16, l_.total);
      cast_params();
    }
    setup_dense();
    setup_last_layer();
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    forward();
    if (s_.train()) {
      trace::op("cross_entropy");
      loss::Args xa;
      xa.logits = logits_.data(), xa.labels = labels_.data(), xa.dlogits = dlogits_.data();
      xa.loss = &xent_loss_, xa.db = grads_.as<float>() + l_.dense2.b;
      xent_->run(xa);
      loss_ = xent_loss_;
      backward();
      trace::op("adamw");
      adamw_step();
    }
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
  }

  Check verify() override {
    const State start = verification_state(s_, *seeded_);
    restore(start, verify_period(s_));
    if (s_.train())
      for (const auto& [at, n] : l_.tensors) std::fill_n(grads_.as<float>() + at, n, std::numeric_limits<float>::quiet_NaN());
    for (ConvPrims& cp : conv_) {  // NaN: an output a step did not write shows
      memory& m = cp.p.get(true) ? cp.p : cp.a;
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
      // The post-ReLU activations the forward decided its ReLU and pool on, recomputed from z and the
      // affine the batchnorm family's plan saved, by the family's own expression: of the leading
      // verify_period samples, the distinct ones the reference computes.
      for (ConvPrims& cp : conv_) {
        rmp::Shape lead = cp.act;
        lead.pool = false, lead.k = 1, lead.N = verify_period(s_);
        o.relu.push_back(HostBuffer(DType::f32, static_cast<std::size_t>(lead.count())));
        rmp::cpu_activation(lead, cp.z.get_data_handle(), cp.scale.data(), cp.shift.data(), o.relu.back().as<float>());
      }
      rmp::Shape lead = hact_;
      lead.N = verify_period(s_);
      o.hidden = HostBuffer(DType::f32, static_cast<std::size_t>(lead.count()));
      rmp::cpu_activation(lead, h_.data(), hscale_.data(), hshift_.data(), o.hidden.as<float>());
    }
    Check c = verify_outcome(s_, l_, keys_, start, o);
    restore(*seeded_, s_.batch);
    return c;
  }

  std::string label() const override {
    cpu::ThreadScope scope(threads_);  // the plans' labels count the threads their runs get
    const char* precision = !s_.bf16() ? ""
                       : s_.train() ? "bf16 autocast (the AdamW step writes the dense layers' bf16 copy of the f32 master weights, the "
                                      "convolutions cast theirs; bf16 activations, f32 accumulation); "
                                    : "bf16 autocast (the dense layers' bf16 weights cast once, the convolutions cast theirs; bf16 "
                                      "activations, f32 accumulation); ";
    std::string l = std::string(precision) +
                    "oneDNN convolution (" + conv_impl_ + ")";
    const std::string dense = "; dense: " + dense1_->label() + (w1_cast_ ? " (W1 cast: " + w1_cast_->label() + ")" : "");
    if (s_.train())
      l += std::string(", ") + (s_.arch.bn ? "batch norm" : "bias") + " + ReLU (+ max-pool + dropout): " + conv_.back().act_fwd->label() +
           dense + "; last layer: " + dense2_->label() + "; cross_entropy_dbias plan; AdamW; NHWC; ";
    else
      l += ", pooling max: " + conv_.back().pool->label() + dense + "; last layer: " + dense2_->label() +
           (own_layouts_ ? "; the conv and pool layers in the layouts oneDNN picked, NHWC at the flatten; " : "; NHWC; ");
    l += std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
    if (!s_.train() && s_.arch.bn) l += "; batch norms folded into the weights at setup";
    if (x_nchw_) l += "; the images held NCHW";
    if (!conv_.empty() && conv_.front().chunk)
      l += "; the first conv and its pool " + std::to_string(conv_.front().chunk) + " sample" + (conv_.front().chunk > 1 ? "s" : "") +
           " at a time, the pool writing NHWC";
    return l;
  }

  double last_loss() override { return loss_; }
  Check bf16_copy_check() override {
    if (w1_low_.count()) return models::bf16_copy_of(infer_params() + l_.dense1.w, w1_low_.as<bf16>(), w1_low_.count());  // infer's W1
    if (!low_.count()) return {};
    return models::bf16_copy_of(params_.as<float>(), low_.as<bf16>(), l_.total);
  }

 private:
  dt adt() const { return s_.bf16() ? dt::bf16 : dt::f32; }

  // The shape of conv layer i's conv2d pass `dir`: a 3x3 stride-1 convolution over the batch, with
  // the f32 OHWI parameters as weights (bf16 casts them in each run). train: NHWC activations, z
  // alone (the batchnorm family's plan adds the bias or normalizes); infer: forward_inference with
  // the bias and a ReLU post-op, each activation in the layout oneDNN picks except a first conv with
  // a pool after it, which reads the images NCHW; f32 takes the weights reordered once at setup,
  // bf16 casts them in each run.
  conv2d::Shape conv_shape(std::size_t i, Direction dir) const {
    const ConvLayer& c = s_.convs[i];
    conv2d::Shape cs;
    cs.dir = dir, cs.dtype = s_.dtype, cs.layout = conv2d::Layout::nhwc;
    cs.N = s_.batch, cs.C = c.C, cs.H = c.H, cs.W = c.W, cs.K = c.K, cs.R = cs.S = 3, cs.pad_h = cs.pad_w = c.pad;
    cs.bias = cs.relu = !s_.train();
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

  // train: conv layer i's batch norm (or bias) + ReLU, with the max-pool and its dropout where the
  // stage ends (batchnorm_relu_maxpool), else alone (batchnorm_relu), over the conv's NHWC z.
  rmp::Shape act_shape(std::size_t i) const {
    const ConvLayer& c = s_.convs[i];
    rmp::Shape r;
    r.dir = Direction::fwd, r.dtype = s_.dtype;
    r.N = s_.batch, r.C = c.K, r.H = c.P, r.W = c.Q;
    r.pool = c.pool > 0, r.k = c.pool > 0 ? c.pool : 1;
    r.dropout = c.pool > 0 ? c.dropout : 0;
    r.key = keys_[stage_of(i)];
    r.bn = s_.arch.bn, r.eps = kBnEps, r.momentum = kBnMomentum;
    r.layout = r.pooled_layout = batchnorm::Layout::nhwc;
    return r;
  }

  // The tensors of conv layer i's batchnorm-family plans: fwd from z to its output, bwd from the
  // gradient of that output (dout) to dz and the layer's bias and batch-norm gradients.
  rmp::Args act_args(std::size_t i, Direction dir, const void* dout = nullptr) {
    ConvPrims& cp = conv_[i];
    const Layer& ly = l_.conv[i];
    const bool bn = s_.arch.bn;
    float* P = params_.as<float>();
    rmp::Args r;
    r.z = cp.z.get_data_handle();
    r.gamma = bn ? P + ly.gamma : nullptr;
    r.period = &period_;
    r.arg = cp.arg.empty() ? nullptr : cp.arg.data();
    r.scale = cp.scale.data(), r.shift = cp.shift.data(), r.mean = cp.mean.data(), r.rstd = cp.rstd.data();
    if (dir == Direction::bwd) {
      float* G = grads_.as<float>();
      r.dout = dout, r.dz = dz_.get_data_handle();
      r.dgamma = bn ? G + ly.gamma : nullptr, r.dbeta = bn ? G + ly.beta : nullptr, r.dbias = G + ly.b;
      return r;
    }
    float* S = stats_.as<float>();
    r.beta = bn ? P + ly.beta : nullptr, r.bias = P + ly.b;
    r.running_mean = bn ? S + ly.mean : nullptr, r.running_var = bn ? S + ly.var : nullptr;
    r.out = (cp.act.pool ? cp.p : cp.a).get_data_handle();
    return r;
  }

  // infer, a pooled first layer: the samples its conv and pool take at a time, the most that divide
  // the batch and whose conv output (bias and ReLU fused, before the pool) fits kChunkBytes, at least
  // one; 0 (the whole batch at once) for every other layer and in train. The full-resolution output
  // of the first conv is the step's largest tensor (keras_cnn: 8 MiB a sample in f32): written whole
  // and read back by the pool it costs two trips through memory, chunk by chunk it stays in cache.
  static constexpr std::size_t kChunkBytes = std::size_t(16) << 20;
  std::int64_t first_layer_chunk(std::size_t i) const {
    const ConvLayer& c = s_.convs[i];
    if (s_.train() || i != 0 || c.pool == 0) return 0;
    const auto per_sample = static_cast<std::size_t>(c.out_count()) * dtype_size(s_.dtype);
    std::int64_t chunk = 1;
    for (std::int64_t n = 2; n <= s_.batch; ++n)
      if (s_.batch % n == 0 && static_cast<std::size_t>(n) * per_sample <= kChunkBytes) chunk = n;
    return chunk;
  }

  // Conv layer i's conv2d plans and the forward's input and weights; `in` is the layer's input.
  void plan_conv(std::size_t i, ConvPrims& cp, const memory& in, const float* P) {
    cp.chunk = first_layer_chunk(i);
    conv2d::Shape fs = conv_shape(i, Direction::fwd);
    if (cp.chunk) fs.N = cp.chunk;
    // infer: x as the layer before wrote it (the images, or the previous pool's or conv's own layout),
    // reordered by the plan's run where the conv picked another
    const memory::desc x_desc = cp.chunk ? memory::desc({cp.chunk, fs.C, fs.H, fs.W}, adt(), tag::nchw) : in.get_desc();
    cp.fwd = s_.train() ? conv2d::make_cpu_plan(fs) : conv2d::make_cpu_plan(fs, x_desc);
    conv_impl_ += std::string(conv_impl_.empty() ? "" : ", ") + conv2d::onednn_impl(*cp.fwd);
    cp.in = in;
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
    // Output k's weights scaled by gamma_k / sqrt(var_k + eps), its bias shifted; the weights in
    // memory order (a row of the dense layer's [fan_in, n] holds one input's weight to every output),
    // rows in parallel: keras_cnn's 56448 x 1024 W1 took a second column by column.
    auto fold = [&](const Layer& y, std::int64_t n, std::int64_t fan_in, bool out_major) {
      std::vector<double> sc(static_cast<std::size_t>(n));
      for (std::int64_t k = 0; k < n; ++k) sc[static_cast<std::size_t>(k)] = F[y.gamma + k] / std::sqrt(static_cast<double>(S[y.var + k]) + kBnEps);
      const std::int64_t rows = out_major ? n : fan_in, cols = out_major ? fan_in : n;
      float* W = F + y.w;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          float& w = W[r * cols + c];
          w = static_cast<float>(w * sc[static_cast<std::size_t>(out_major ? r : c)]);
        }
      for (std::int64_t k = 0; k < n; ++k)
        F[y.b + k] = static_cast<float>((F[y.b + k] - S[y.mean + k]) * sc[static_cast<std::size_t>(k)] + F[y.beta + k]);
    };
    for (std::size_t i = 0; i < s_.convs.size(); ++i) fold(l_.conv[i], s_.convs[i].K, 9 * s_.convs[i].C, true);
    fold(l_.dense1, s_.arch.hidden, flat_width(s_.arch), false);
  }

  // The hidden dense layer h = flat . W1 [+ b1] through matmul plans: train an mm, its output z of
  // the batchnorm_relu plan (batch norm or the bias, ReLU, dropout), and the mm gradients dW1 =
  // flat^T . dh (f32: the master weights' gradient) and dflat = dh . W1^T; infer an addmm with the
  // (folded) bias and the ReLU post-op. bf16 infer: W1 and the folded bias cast once here from the
  // folded f32 parameters; bf16 train: W1 read from the copy the AdamW step writes.
  void setup_dense() {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch, F = flat_width(a), Hd = a.hidden;
    matmul::Shape g;
    g.op = s_.train() ? matmul::Op::mm : matmul::Op::addmm, g.dir = Direction::fwd, g.dtype = s_.dtype;
    g.M = B, g.K = F, g.N = Hd;
    g.relu = !s_.train();
    // f32 infer: the weights are fixed, so the matmul takes them prepacked in its own layout, packed
    // once here (as the convs' weights are): keras_cnn's 16 x 56448 x 1024 product took 12 ms
    // prepacked against 30 ms from the row-major [F, Hd] on one thread (bf16: 6 against 16).
    g.b_packed = !s_.train() && !s_.bf16();
    dense1_ = matmul::make_cpu_plan(g);
    if (g.b_packed) {
      w1_packed_ = HostBuffer(DType::f32, (matmul::cpu_packed_b_bytes(g) + 3) / 4);
      matmul::cpu_pack_b(g, infer_params() + l_.dense1.w, DType::f32, w1_packed_.data());
    }
    h_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * Hd));
    if (s_.bf16() && !s_.train()) {
      // W1's bf16 copy, cast from the (folded) f32 parameters by the copy family's plan: oneDNN's
      // reorder (`impl:onednn`), which converts with the CPU's bf16 instructions where it has them:
      // keras_cnn's 57.8M weights took 9.5 ms on one thread against hotops' loop's 15 ms.
      w1_low_ = HostBuffer(DType::bf16, static_cast<std::size_t>(F * Hd));
      copy::Shape cs;
      cs.kind = copy::Kind::f32_to_bf16, cs.src = DType::f32, cs.dst = DType::bf16, cs.count = w1_low_.count();
      cs.impl = copy::CpuImpl::onednn;
      w1_cast_ = copy::make_cpu_plan(cs);
      cast_dense1_weights();  // once: infer's weights do not change (autocast's weight cache holds them)
    }
    if (!s_.train()) {
      const float* b1 = infer_params() + l_.dense1.b;
      if (s_.bf16()) {
        b1_low_ = HostBuffer(DType::bf16, static_cast<std::size_t>(Hd));
        for (std::int64_t o = 0; o < Hd; ++o) b1_low_.as<bf16>()[o] = float_to_bf16(b1[o]);
      }
      return;
    }
    hact_.dir = Direction::fwd, hact_.dtype = s_.dtype, hact_.layout = hact_.pooled_layout = batchnorm::Layout::nc;
    hact_.N = B, hact_.C = Hd, hact_.pool = false, hact_.k = 1;
    hact_.dropout = a.hidden_dropout, hact_.key = keys_.back();
    hact_.bn = a.bn, hact_.eps = kBnEps, hact_.momentum = kBnMomentum;
    hact_fwd_ = rmp::make_cpu_plan(hact_);
    rmp::Shape back = hact_;
    back.dir = Direction::bwd;
    hact_bwd_ = rmp::make_cpu_plan(back);
    for (std::vector<float>* v : {&hscale_, &hshift_, &hmean_, &hrstd_}) v->assign(static_cast<std::size_t>(Hd), 0.f);
    hd_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * Hd));
    dhd_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * Hd));
    dh_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * Hd));
    dflat_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * F));
    g.op = matmul::Op::mm, g.relu = false;
    g.dir = Direction::bwd_weight, g.f32_out = true;
    dense1_dw_ = matmul::make_cpu_plan(g);
    g.dir = Direction::bwd_data, g.f32_out = false;
    dense1_dx_ = matmul::make_cpu_plan(g);
  }

  // The last layer logits = hd . W2 + b2 through matmul plans in the step's dtype (bf16: W2 and b2
  // from the copy the AdamW step writes in train, cast once for infer), its train loss, dlogits and
  // db2 the loss family's cross_entropy_dbias plan, and dW2 (f32) and dhd the mm gradients; infer
  // widens the logits into the f32 output.
  void setup_last_layer() {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch, Hd = a.hidden, C = a.classes;
    matmul::Shape g;
    g.op = matmul::Op::addmm, g.dir = Direction::fwd, g.dtype = s_.dtype, g.M = B, g.K = Hd, g.N = C;
    dense2_ = matmul::make_cpu_plan(g);
    logits_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * C));
    auto cast = [](DType from, DType to, std::size_t n) {
      copy::Shape cs;
      cs.kind = from == to ? copy::Kind::memcpy : to == DType::bf16 ? copy::Kind::f32_to_bf16 : copy::Kind::bf16_to_f32;
      cs.src = from, cs.dst = to, cs.count = n;
      return copy::make_cpu_plan(cs);
    };
    if (s_.bf16() && !s_.train()) {
      w2_low_ = HostBuffer(DType::bf16, static_cast<std::size_t>(Hd * C));
      b2_low_ = HostBuffer(DType::bf16, static_cast<std::size_t>(C));
      w2_cast_ = cast(DType::f32, DType::bf16, w2_low_.count());
      b2_cast_ = cast(DType::f32, DType::bf16, b2_low_.count());
      cast_dense2_weights();
    }
    if (!s_.train()) {
      logits_out_ = HostBuffer(DType::f32, static_cast<std::size_t>(B * C));
      logits_widen_ = cast(s_.dtype, DType::f32, logits_out_.count());
      return;
    }
    dlogits_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * C));
    xent_ = loss::make_cpu_plan(loss::dbias_shape(s_.dtype, B, C));
    g.op = matmul::Op::mm, g.dir = Direction::bwd_weight, g.f32_out = true;
    dense2_dw_ = matmul::make_cpu_plan(g);
    g.dir = Direction::bwd_data, g.f32_out = false;
    dense2_dx_ = matmul::make_cpu_plan(g);
  }
  const void* dense2_weights() { return s_.bf16() ? low_param(l_.dense2.w, w2_low_) : static_cast<const void*>(infer_params() + l_.dense2.w); }
  const void* dense2_bias() { return s_.bf16() ? low_param(l_.dense2.b, b2_low_) : static_cast<const void*>(infer_params() + l_.dense2.b); }
  // bf16: a dense parameter at flat offset `at`: train's copy written by the AdamW step, or infer's own cast.
  const void* low_param(std::size_t at, const HostBuffer& infer_copy) const {
    return s_.train() ? static_cast<const void*>(low_.as<bf16>() + at) : infer_copy.data();
  }
  // bf16 train: the copy of the whole f32 parameters, once at the start (restore's).
  void cast_params() {
    const float* p = params_.as<float>();
    bf16* low = low_.as<bf16>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) low[i] = float_to_bf16(p[i]);
  }
  void cast_dense2_weights() {
    w2_cast_->run({infer_params() + l_.dense2.w, w2_low_.data()});
    b2_cast_->run({infer_params() + l_.dense2.b, b2_low_.data()});
  }

  // W1 as the matmuls take it: the f32 parameters, f32 infer's prepacked copy of the folded ones, or the bf16 copy.
  const void* dense1_weights() const {
    if (w1_packed_.count()) return w1_packed_.data();
    return s_.bf16() ? low_param(l_.dense1.w, w1_low_) : (folded_.count() ? folded_ : params_).as<float>() + l_.dense1.w;
  }

  // bf16 infer: W1 cast from the folded f32 parameters into w1_low_.
  void cast_dense1_weights() { w1_cast_->run({infer_params() + l_.dense1.w, w1_low_.data()}); }

  // The hidden layer's batchnorm_relu plans' tensors (see act_args).
  rmp::Args hidden_args(Direction dir) {
    const Layer& ly = l_.dense1;
    const bool bn = s_.arch.bn;
    float* P = params_.as<float>();
    rmp::Args r;
    r.z = h_.data();
    r.gamma = bn ? P + ly.gamma : nullptr;
    r.period = &period_;
    r.scale = hscale_.data(), r.shift = hshift_.data(), r.mean = hmean_.data(), r.rstd = hrstd_.data();
    if (dir == Direction::bwd) {
      float* G = grads_.as<float>();
      r.dout = dhd_.data(), r.dz = dh_.data();
      r.dgamma = bn ? G + ly.gamma : nullptr, r.dbeta = bn ? G + ly.beta : nullptr, r.dbias = G + ly.b;
      return r;
    }
    float* S = stats_.as<float>();
    r.beta = bn ? P + ly.beta : nullptr, r.bias = P + ly.b;
    r.running_mean = bn ? S + ly.mean : nullptr, r.running_var = bn ? S + ly.var : nullptr;
    r.out = hd_.data();
    return r;
  }

  void forward() {
    for (std::size_t i = 0; i < conv_.size(); ++i) {
      ConvPrims& cp = conv_[i];
      const ConvLayer& c = s_.convs[i];
      if (s_.train()) {
        trace::op("conv2d");  // with the weights' reorder from the parameters
        cp.fwd->run({cp.in.get_data_handle(), cp.w, nullptr, nullptr, cp.z.get_data_handle(), nullptr});
        trace::op(c.pool ? rmp::kOp : rmp::kReluOp);
        cp.act_fwd->run(act_args(i, Direction::fwd));
        continue;
      }
      const float* b = infer_params() + l_.conv[i].b;
      if (cp.chunk) {  // the first layer chunk by chunk: images NCHW in, pooled NHWC out
        const std::size_t in_bytes = static_cast<std::size_t>(cp.chunk * c.in_count()) * dtype_size(s_.dtype);
        const std::size_t out_bytes = static_cast<std::size_t>(cp.chunk * c.pooled_count()) * dtype_size(s_.dtype);
        for (std::int64_t n = 0; n < s_.batch; n += cp.chunk) {
          const auto at = static_cast<std::size_t>(n / cp.chunk);
          trace::op("conv2d");  // bf16: with the weights' reorder from the parameters
          cp.fwd->run({static_cast<const std::byte*>(cp.in.get_data_handle()) + at * in_bytes, cp.w, b, nullptr,
                       cp.a.get_data_handle(), nullptr});
          trace::op("maxpool");
          cp.pool->run({cp.a.get_data_handle(), nullptr, nullptr, static_cast<std::byte*>(cp.p.get_data_handle()) + at * out_bytes, nullptr});
        }
        continue;
      }
      trace::op("conv2d");  // bf16: with the weights' reorder from the parameters
      cp.fwd->run({cp.in.get_data_handle(), cp.w, b, nullptr, cp.a.get_data_handle(), nullptr});
      if (c.pool) trace::op("maxpool"), cp.pool->run({cp.a.get_data_handle(), nullptr, nullptr, cp.p.get_data_handle(), nullptr});
    }
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    trace::op(s_.train() ? "mm" : "addmm");
    const void* b1 = s_.train() ? nullptr : s_.bf16() ? b1_low_.data() : static_cast<const void*>(infer_params() + l_.dense1.b);
    dense1_->run({flat_.get_data_handle(), dense1_weights(), b1, nullptr, h_.data(), nullptr, nullptr});
    if (s_.train()) trace::op(rmp::kReluOp), hact_fwd_->run(hidden_args(Direction::fwd));
    // logits = hd . W2 + b2 (train: hd after the hidden layer's dropout)
    trace::op("addmm");
    dense2_->run({(s_.train() ? hd_ : h_).data(), dense2_weights(), dense2_bias(), nullptr, logits_.data(), nullptr, nullptr});
    if (!s_.train()) logits_widen_->run({logits_.data(), logits_out_.data()});
  }

  void backward() {
    float* G = grads_.as<float>();
    trace::op("mm");  // dW2 = hd^T dlogits (f32), dhd = dlogits W2^T
    dense2_dw_->run({hd_.data(), nullptr, nullptr, dlogits_.data(), G + l_.dense2.w, nullptr, nullptr});
    dense2_dx_->run({nullptr, dense2_weights(), nullptr, dlogits_.data(), dhd_.data(), nullptr, nullptr});
    trace::op(rmp::kReluOp);
    hact_bwd_->run(hidden_args(Direction::bwd));
    trace::op("mm");
    dense1_dw_->run({flat_.get_data_handle(), nullptr, nullptr, dh_.data(), G + l_.dense1.w, nullptr, nullptr});
    dense1_dx_->run({nullptr, dense1_weights(), nullptr, dh_.data(), dflat_.data(), nullptr, nullptr});
    for (std::size_t i = conv_.size(); i-- > 0;) {
      ConvPrims& cp = conv_[i];
      const void* d_next = i + 1 < conv_.size() ? d_in_[i + 1].get_data_handle() : dflat_.data();
      trace::op(cp.act.pool ? "batchnorm_relu_maxpool_bwd" : "batchnorm_relu_bwd");
      cp.act_bwd->run(act_args(i, Direction::bwd, d_next));
      trace::op("conv2d_bwd_weight");  // with dw's reorder into the gradients
      cp.filter->run({cp.in.get_data_handle(), nullptr, nullptr, dz_.get_data_handle(), G + l_.conv[i].w, nullptr});
      if (i > 0) {
        trace::op("conv2d_bwd_data");  // with the weights' reorder from the parameters
        cp.data->run({nullptr, cp.w, nullptr, dz_.get_data_handle(), d_in_[i].get_data_handle(), nullptr});
      }
    }
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                    low_.count() ? low_.as<bf16>() : nullptr, n, adamw::scalars_for(hyper(), ++step_), 0);
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
    copy_bytes(params_.data(), st.params.data(), l_.total * sizeof(float));
    if (low_.count()) cast_params();
    if (s_.train()) {
      copy_bytes(m_.data(), st.m.data(), l_.total * sizeof(float));
      copy_bytes(v_.data(), st.v.data(), l_.total * sizeof(float));
    }
    std::copy_n(st.stats.as<float>(), st.stats.count(), stats_.as<float>());
    step_ = 0;
    period_ = static_cast<int>(period);
  }

  Shape s_;
  ParamLayout l_;
  std::shared_ptr<const State> seeded_;
  std::vector<pointwise::DropoutKey> keys_;
  int threads_;
  int period_ = 1;  // the dropout masks' sample period (the batch, or the verification's)
  HostBuffer x_, params_, grads_, m_, v_, stats_, folded_;
  std::vector<std::int32_t> labels_;
  std::vector<ConvPrims> conv_;
  std::vector<memory> d_in_;  // train: per conv layer, the gradient of its input (none for the first)
  bool x_nchw_ = false;       // x_ holds the images nchw (infer with a pooled first conv), else nhwc
  memory x_mem_, flat_, dz_;
  // The hidden layer: the matmul plans, batchnorm_relu's (train) and their tensors.
  std::unique_ptr<matmul::Plan> dense1_, dense1_dw_, dense1_dx_;
  std::unique_ptr<copy::Plan> w1_cast_;  // bf16: W1's cast (copy f32_to_bf16)
  rmp::Shape hact_;
  std::unique_ptr<rmp::Plan> hact_fwd_, hact_bwd_;
  std::vector<float> hscale_, hshift_, hmean_, hrstd_;
  HostBuffer h_;                    // flat . W1 (train: z of batchnorm_relu; infer: + b1, ReLU)
  HostBuffer hd_, dhd_, dh_, dflat_;  // train: after dropout, its gradient, dz's, the flatten's
  HostBuffer w1_low_, b1_low_;        // bf16 infer: W1's copy and the folded b1's (cast once)
  HostBuffer low_;                    // bf16 train: the copy of params_ (same layout) the dense layers read, written by AdamW
  HostBuffer w1_packed_;              // f32 infer: the folded W1 in the matmul's layout (packed once)
  HostBuffer logits_, dlogits_, logits_out_;
  std::unique_ptr<loss::Plan> xent_;  // train: the loss, dlogits and db2
  std::unique_ptr<matmul::Plan> dense2_, dense2_dw_, dense2_dx_;  // the last layer, train: its gradients
  std::unique_ptr<copy::Plan> w2_cast_, b2_cast_, logits_widen_;  // bf16: W2, b2 cast; infer: logits to f32
  HostBuffer w2_low_, b2_low_;
  float xent_loss_ = 0;
  std::string conv_impl_;
  bool own_layouts_ = false;  // infer: some layer runs in a layout of its primitives' own
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::bf16) return "";
  try {  // oneDNN's bf16 convolution (a small conv2d plan) and matmul (a small matmul plan's) on this CPU (the ISA decides, not the shape)
    conv2d::Shape cs;
    cs.dtype = DType::bf16, cs.layout = conv2d::Layout::nhwc, cs.x_pick = cs.y_pick = conv2d::Shape::Pick::nhwc;
    cs.N = 2, cs.C = cs.K = 16, cs.H = cs.W = 8, cs.R = cs.S = 3, cs.pad_h = cs.pad_w = 1;
    conv2d::make_cpu_plan(cs);
    matmul::Shape g;
    g.dtype = DType::bf16, g.M = 2, g.K = g.N = 16;
    if (const std::string why = matmul::cpu_unsupported_reason(g); !why.empty()) throw Error(why, ErrorKind::unsupported);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported) return "oneDNN has no bf16 convolution or matmul for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuCnn>(p); }

}  // namespace hotops::model_cnn
