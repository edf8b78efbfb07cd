// model_bert on the CPU: every GEMM a oneDNN matmul primitive created at setup (the dense layers with
// their bias; the attention's per-head GEMMs as 4-D [batch, heads, rows, cols] matmuls on strided views
// of the QKV, context and gradient buffers, so no head split or merge copies), the softmax family's
// plans (oneDNN softmax forward and backward, in place), the rest OpenMP loops: bias-free GELU
// forward/backward (erf), residual + LayerNorm forward/backward, column sums for the bias and LayerNorm gradients, the MSE loss, one AdamW pass.
// The loops are templates over the activations' storage (float, or bf16 as its uint16 bits) and
// compute in f32; bf16's matmuls take bf16 operands (a per-step bf16 copy of the f32 master
// parameters) and write bf16 activations or f32 weight gradients.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "hotops/trace.h"
#include "kernels/model_bert/model_bert.h"

namespace hotops::model_bert {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using dims = memory::dims;

using bf16 = std::uint16_t;  // bf16's bits

// Storage <-> f32: f32 as is; bf16 rounded to nearest even (cpu_vector.h).
inline float ld(float v) { return v; }
inline float ld(bf16 v) { return vec::bf16_to_f32(v); }
template <class T> T st(float v);
template <> inline float st<float>(float v) { return v; }
template <> inline bf16 st<bf16>(float v) { return vec::f32_to_bf16(v); }
template <class T> constexpr dt dnnl_type() { return std::is_same_v<T, bf16> ? dt::bf16 : dt::f32; }

memory::desc md(std::int64_t rows, std::int64_t cols, bool transposed = false, dt type = dt::f32) {
  return transposed ? memory::desc({rows, cols}, type, dims{1, rows}) : memory::desc({rows, cols}, type, dims{cols, 1});
}

struct Matmul {
  dnnl::matmul prim;
  memory src, wei, bias, dst;
  void execute() {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias) args.insert({DNNL_ARG_BIAS, bias});
    prim.execute(cpu::stream(), args);
  }
};

// dst = scale * src . wei (+ bias, of the weights' type): 2-D or 4-D descriptors.
Matmul make_matmul(const memory::desc& src, const void* s, const memory::desc& wei, const void* w, const void* bias,
                   const memory::desc& dst, void* d, float scale = 1.f) {
  dnnl::engine& eng = cpu::engine();
  dnnl::primitive_attr attr;
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  const memory::dim n = dst.dims().back();
  const memory::desc bias_md = bias ? memory::desc({1, n}, wei.data_type(), dims{n, 1}) : memory::desc();
  const auto desc = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(src, wei, bias_md, dst));
  const auto pd = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(desc, attr, eng));
  Matmul m;
  m.prim = HOTOPS_CHECK_DNNL(dnnl::matmul(pd));
  m.src = memory(src, eng, const_cast<void*>(s));
  m.wei = memory(wei, eng, const_cast<void*>(w));
  if (bias) m.bias = memory(bias_md, eng, const_cast<void*>(bias));
  m.dst = memory(dst, eng, d);
  return m;
}

// A [batch, heads, rows, cols] view: element (b, h, r, c) at b * sb + h * sh + r * sr + c * sc.
memory::desc view4(std::int64_t B, std::int64_t NH, std::int64_t rows, std::int64_t cols, std::int64_t sb, std::int64_t sh,
                   std::int64_t sr, std::int64_t sc, dt type) {
  return memory::desc({B, NH, rows, cols}, type, dims{sb, sh, sr, sc});
}

float gelu(float z) { return 0.5f * z * (1.f + std::erf(z * 0.70710678118654752f)); }
float gelu_grad(float z) {
  return 0.5f * (1.f + std::erf(z * 0.70710678118654752f)) + z * 0.39894228040143268f * std::exp(-0.5f * z * z);
}

// T: the activations' storage, float (f32) or bf16 (bf16's mixed precision, model_bert.h).
template <class T>
class CpuLayer final : public LayerCase {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;

 public:
  explicit CpuLayer(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, p.seed())),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    const Arch& a = s_.arch;
    const std::int64_t T_ = s_.tokens(), H = a.hidden, F = a.ffn, S = a.seq, NH = a.heads, D = a.head_dim(), B = s_.batch;
    HOTOPS_CHECK(D * NH == H, "model_bert: hidden must be heads x head_dim");
    x_ = seeded_.x, target_ = seeded_.target, params_ = seeded_.params, m_ = seeded_.m, v_ = seeded_.v;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);
    if (kBf16) weights_ = HostBuffer(DType::bf16, l_.total);
    auto buf = [](std::int64_t n) { return HostBuffer(DType::f32, static_cast<std::size_t>(n)); };
    auto act = [this](std::int64_t n) { return HostBuffer(s_.dtype, static_cast<std::size_t>(n)); };
    u1_ = act(a.pre_ln ? T_ * H : 1), qkv_ = act(T_ * 3 * H), prob_ = act(B * NH * S * S), ctx_ = act(T_ * H), attn_ = act(T_ * H);
    s1_ = act(T_ * H), h1_ = act(T_ * H), z_ = act(T_ * F), f_ = act(T_ * F), o_ = act(T_ * H), s2_ = act(T_ * H), y_ = act(T_ * H);
    mean1_ = buf(T_), rstd1_ = buf(T_), mean2_ = buf(T_), rstd2_ = buf(T_);
    const float scale = static_cast<float>(1 / std::sqrt(static_cast<double>(D)));
    constexpr dt t = dnnl_type<T>();
    const T* W = gemm_weights();
    float* G = grads_.as<float>();
    const T* u1 = a.pre_ln ? u1_.as<T>() : x_.as<T>();
    const T* u2 = h1_.as<T>();  // the FFN's input: bert LN1's output, vit LN2's (both kept in h1_)
    const T* q = qkv_.as<T>();
    // The attention's views of qkv [T, 3H] and ctx [T, H] per (sample, head).
    const memory::desc q_v = view4(B, NH, S, D, S * 3 * H, D, 3 * H, 1, t);    // Q, K or V [S, D]
    const memory::desc kt_v = view4(B, NH, D, S, S * 3 * H, D, 1, 3 * H, t);   // K^T or V^T [D, S]
    const memory::desc ctx_v = view4(B, NH, S, D, S * H, D, H, 1, t);
    const memory::desc p_v = view4(B, NH, S, S, NH * S * S, S * S, S, 1, t);
    const memory::desc pt_v = view4(B, NH, S, S, NH * S * S, S * S, 1, S, t);  // P^T
    auto amd = [t](std::int64_t rows, std::int64_t cols, bool transposed = false) { return md(rows, cols, transposed, t); };
    fwd_.push_back(make_matmul(amd(T_, H), u1, amd(H, 3 * H), W + l_.wqkv, W + l_.bqkv, amd(T_, 3 * H), qkv_.as<T>()));
    fwd_.push_back(make_matmul(q_v, q, kt_v, q + H, nullptr, p_v, prob_.as<T>(), scale));
    fwd_.push_back(make_matmul(p_v, prob_.as<T>(), q_v, q + 2 * H, nullptr, ctx_v, ctx_.as<T>()));
    fwd_.push_back(make_matmul(amd(T_, H), ctx_.as<T>(), amd(H, H), W + l_.wo, W + l_.bo, amd(T_, H), attn_.as<T>()));
    fwd_.push_back(make_matmul(amd(T_, H), u2, amd(H, F), W + l_.w1, W + l_.b1, amd(T_, F), z_.as<T>()));
    fwd_.push_back(make_matmul(amd(T_, F), f_.as<T>(), amd(F, H), W + l_.w2, W + l_.b2, amd(T_, H), o_.as<T>()));
    softmax_ = softmax::make_cpu_plan(attention_softmax(s_, Direction::fwd));
    if (!s_.train()) return;
    softmax_bwd_ = softmax::make_cpu_plan(attention_softmax(s_, Direction::bwd));
    dy_ = act(T_ * H), df_ = act(T_ * F), du2_ = act(T_ * H), ds1_ = act(T_ * H), dctx_ = act(T_ * H), dqkv_ = act(T_ * 3 * H);
    dp_ = act(B * NH * S * S), du1_ = act(a.pre_ln ? T_ * H : 1);
    // backward, in order of use; w: weight gradient a^T . dz (f32 out), d: data gradient dz . W^T
    auto wgrad = [&](const T* in, std::int64_t k_in, const T* dz, std::int64_t k_out, std::size_t at) {
      return make_matmul(amd(k_in, T_, true), in, amd(T_, k_out), dz, nullptr, md(k_in, k_out), G + at);
    };
    auto dgrad = [&](const T* dz, std::int64_t k_out, std::size_t at, std::int64_t k_in, T* out) {
      return make_matmul(amd(T_, k_out), dz, amd(k_out, k_in, true), W + at, nullptr, amd(T_, k_in), out);
    };
    const T* ds2 = a.pre_ln ? dy_.as<T>() : s2grad();
    bwd_.push_back(wgrad(f_.as<T>(), F, ds2, H, l_.w2));
    bwd_.push_back(dgrad(ds2, H, l_.w2, F, df_.as<T>()));
    bwd_.push_back(wgrad(u2, H, df_.as<T>(), F, l_.w1));
    bwd_.push_back(dgrad(df_.as<T>(), F, l_.w1, H, du2_.as<T>()));
    bwd_.push_back(wgrad(ctx_.as<T>(), H, ds1_.as<T>(), H, l_.wo));
    bwd_.push_back(dgrad(ds1_.as<T>(), H, l_.wo, H, dctx_.as<T>()));
    T* dq = dqkv_.as<T>();
    bwd_.push_back(make_matmul(ctx_v, dctx_.as<T>(), kt_v, q + 2 * H, nullptr, p_v, dp_.as<T>()));  // dP
    bwd_.push_back(make_matmul(pt_v, prob_.as<T>(), ctx_v, dctx_.as<T>(), nullptr, q_v, dq + 2 * H));  // dV
    attn_bwd_ = bwd_.size();
    bwd_.push_back(make_matmul(p_v, dp_.as<T>(), q_v, q + H, nullptr, q_v, dq, scale));            // dQ
    bwd_.push_back(make_matmul(pt_v, dp_.as<T>(), q_v, q, nullptr, q_v, dq + H, scale));           // dK
    bwd_.push_back(wgrad(u1, H, dq, 3 * H, l_.wqkv));
    if (a.pre_ln) bwd_.push_back(dgrad(dq, 3 * H, l_.wqkv, H, du1_.as<T>()));
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    if constexpr (kBf16) trace::op("cast"), cast_weights();
    forward();
    if (!s_.train()) return;
    trace::op("mse_loss");
    loss_ = loss_and_dy();
    backward();
    trace::op("adamw");
    adamw_step();
  }

  Check verify() override {
    const State start = verification_state(s_, seeded_);
    copy_into(x_, start.x), copy_into(target_, start.target);
    copy_into(params_, start.params), copy_into(m_, start.m), copy_into(v_, start.v);
    step_ = 0;
    y_.poison();
    s2_.poison();
    for (const auto& [at, n] : l_.tensors) std::fill_n(grads_.as<float>() + at, n, std::nanf(""));
    run();
    Outcome o;
    if (!s_.train()) o.y = *out();
    else o.loss = static_cast<float>(loss_), o.grads = grads_, o.params = params_;
    Check c = verify_outcome(s_, l_, start, o);
    copy_into(x_, seeded_.x), copy_into(target_, seeded_.target);  // the timed runs take the seeded batch
    return c;
  }

  std::string label() const override {
    return std::string(s_.arch.pre_ln ? "pre-LN" : "post-LN") + " encoder layer: oneDNN " + (kBf16 ? "bf16 " : "") +
           "matmul (dense + 4-D strided attention GEMMs), oneDNN softmax, OpenMP GELU, LayerNorm" +
           (kBf16 ? ", bf16 activations, f32 master weights cast to bf16 each step" : "") +
           (s_.train() ? ", MSE, backward loops, AdamW 1 flat pass" : "") + ", " +
           std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }

 private:
  static void copy_into(HostBuffer& dst, const HostBuffer& src) { std::memcpy(dst.data(), src.data(), src.bytes()); }
  const HostBuffer* out() const { return s_.arch.pre_ln ? &s2_ : &y_; }
  // What the matmuls read their weights and biases from: the f32 parameters, or for bf16 their copy.
  T* gemm_weights() {
    if constexpr (kBf16) return weights_.as<bf16>();
    else return params_.as<float>();
  }
  // bert: the gradient of s2 = h1 + o (LN2's input) lives in ds2_ (allocated on first use).
  T* s2grad() {
    ds2_ = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.tokens() * s_.arch.hidden));
    return ds2_.as<T>();
  }
  int team() const { return cpu::threads(); }

  void cast_weights() {
    const float* p = params_.as<float>();
    bf16* w = weights_.as<bf16>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) w[i] = vec::f32_to_bf16(p[i]);
  }

  // y = LN(a + b) rows of H (b may be null); keeps the sum in `sum` when given, mean and rstd per row.
  void add_layernorm(const T* a, const T* b, T* sum, const float* g, const float* beta, T* y, float* mean, float* rstd) {
    const std::int64_t T_ = s_.tokens(), H = s_.arch.hidden;
    const double eps = s_.arch.ln_eps;
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t r = 0; r < T_; ++r) {
      const T* ar = a + r * H;
      T* sr = sum ? sum + r * H : nullptr;
      double m = 0;
      for (std::int64_t c = 0; c < H; ++c) {
        const float v = b ? ld(st<T>(ld(ar[c]) + ld(b[r * H + c]))) : ld(ar[c]);  // the sum as stored
        if (sr) sr[c] = st<T>(v);
        m += v;
      }
      const T* in = sr ? sr : ar;
      m /= static_cast<double>(H);
      double var = 0;
      for (std::int64_t c = 0; c < H; ++c) var += (ld(in[c]) - m) * (ld(in[c]) - m);
      const float rs = static_cast<float>(1 / std::sqrt(var / static_cast<double>(H) + eps));
      const auto mf = static_cast<float>(m);
      mean[r] = mf, rstd[r] = rs;
      for (std::int64_t c = 0; c < H; ++c) y[r * H + c] = st<T>((ld(in[c]) - mf) * rs * g[c] + beta[c]);
    }
  }

  // dx = LN backward of (dy1 + dy2) (+ dres); dgamma, dbeta column sums. x is LN's input.
  void layernorm_back(const T* dy1, const T* dy2, const T* x, const float* mean, const float* rstd, const float* g, float* dg,
                      float* db, T* dx, const T* dres) {
    const std::int64_t T_ = s_.tokens(), H = s_.arch.hidden;
    const int nt = team();
    std::vector<float> part(static_cast<std::size_t>(nt * 2 * H), 0.f);
#pragma omp parallel num_threads(nt)
    {
      float* pg = part.data() + static_cast<std::size_t>(omp_get_thread_num() * 2 * H);
      float* pb = pg + H;
      std::vector<float> d(static_cast<std::size_t>(H));
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < T_; ++r) {
        const float m = mean[r], rs = rstd[r];
        float m1 = 0, m2 = 0;
        for (std::int64_t c = 0; c < H; ++c) {
          const std::int64_t i = r * H + c;
          const float dv = dy2 ? ld(dy1[i]) + ld(dy2[i]) : ld(dy1[i]);
          const float xh = (ld(x[i]) - m) * rs;
          d[static_cast<std::size_t>(c)] = dv;
          pg[c] += dv * xh, pb[c] += dv;
          m1 += dv * g[c], m2 += dv * g[c] * xh;
        }
        m1 /= static_cast<float>(H), m2 /= static_cast<float>(H);
        if (dx)
          for (std::int64_t c = 0; c < H; ++c) {
            const std::int64_t i = r * H + c;
            const float xh = (ld(x[i]) - m) * rs;
            dx[i] = st<T>(rs * (d[static_cast<std::size_t>(c)] * g[c] - m1 - xh * m2) + (dres ? ld(dres[i]) : 0.f));
          }
      }
    }
    for (std::int64_t c = 0; c < 2 * H; ++c) {
      float sum = 0;
      for (int t = 0; t < nt; ++t) sum += part[static_cast<std::size_t>(t * 2 * H + c)];
      (c < H ? dg[c] : db[c - H]) = sum;
    }
  }

  void colsum(const T* x, std::int64_t cols, float* out) {
    const std::int64_t T_ = s_.tokens();
    constexpr std::int64_t kCols = 64;
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t c0 = 0; c0 < cols; c0 += kCols) {
      const std::int64_t c1 = std::min(cols, c0 + kCols);
      float acc[kCols] = {};
      for (std::int64_t r = 0; r < T_; ++r)
        for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += ld(x[r * cols + c]);
      for (std::int64_t c = c0; c < c1; ++c) out[c] = acc[c - c0];
    }
  }

  void forward() {
    const Arch& a = s_.arch;
    const std::int64_t T_ = s_.tokens(), H = a.hidden, F = a.ffn;
    float* P = params_.as<float>();
    if (a.pre_ln) trace::op("layernorm"), add_layernorm(x_.as<T>(), nullptr, nullptr, P + l_.ln1g, P + l_.ln1b, u1_.as<T>(), mean1_.as<float>(), rstd1_.as<float>());
    trace::op("addmm");
    fwd_[0].execute();
    trace::op("bmm");
    fwd_[1].execute();
    cpu::stream().wait();
    trace::op("softmax");
    softmax_->run({prob_.data(), nullptr, nullptr, prob_.data()});  // in place
    trace::op("bmm");
    fwd_[2].execute();
    trace::op("addmm");
    fwd_[3].execute();
    cpu::stream().wait();
    trace::op("layernorm");
    if (a.pre_ln)  // s1 = x + attn (the FFN block's residual), h1 = LN2(s1) the FFN's input
      add_layernorm(x_.as<T>(), attn_.as<T>(), s1_.as<T>(), P + l_.ln2g, P + l_.ln2b, h1_.as<T>(), mean2_.as<float>(), rstd2_.as<float>());
    else
      add_layernorm(x_.as<T>(), attn_.as<T>(), s1_.as<T>(), P + l_.ln1g, P + l_.ln1b, h1_.as<T>(), mean1_.as<float>(), rstd1_.as<float>());
    trace::op("addmm");
    fwd_[4].execute();
    cpu::stream().wait();
    trace::op("gelu");
    const T* z = z_.as<T>();
    T* f = f_.as<T>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < T_ * F; ++i) f[i] = st<T>(gelu(ld(z[i])));
    trace::op("addmm");
    fwd_[5].execute();
    cpu::stream().wait();
    trace::op(a.pre_ln ? "add" : "layernorm");
    const T* resid = a.pre_ln ? s1_.as<T>() : h1_.as<T>();
    const T* o = o_.as<T>();
    T* s2 = s2_.as<T>();
    if (a.pre_ln) {
#pragma omp parallel for num_threads(team()) schedule(static)
      for (std::int64_t i = 0; i < T_ * H; ++i) s2[i] = st<T>(ld(resid[i]) + ld(o[i]));
    } else {
      add_layernorm(resid, o, s2, P + l_.ln2g, P + l_.ln2b, y_.as<T>(), mean2_.as<float>(), rstd2_.as<float>());
    }
  }

  double loss_and_dy() {
    const std::int64_t n = s_.tokens() * s_.arch.hidden;
    const T* y = out()->template as<T>();
    const T* t = target_.as<T>();
    T* dy = dy_.as<T>();
    const float k = 2.f / static_cast<float>(n);
    double total = 0;
#pragma omp parallel for num_threads(team()) reduction(+ : total) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float e = ld(y[i]) - ld(t[i]);
      dy[i] = st<T>(k * e);
      total += static_cast<double>(e) * e;
    }
    return total / static_cast<double>(n);
  }

  void backward() {
    const Arch& a = s_.arch;
    const std::int64_t T_ = s_.tokens(), H = a.hidden, F = a.ffn;
    float* P = params_.as<float>();
    float* G = grads_.as<float>();
    const T* ds2 = dy_.as<T>();
    if (!a.pre_ln) {
      trace::op("layernorm_bwd");
      layernorm_back(dy_.as<T>(), nullptr, s2_.as<T>(), mean2_.as<float>(), rstd2_.as<float>(), P + l_.ln2g, G + l_.ln2g,
                     G + l_.ln2b, ds2_.as<T>(), nullptr);
      ds2 = ds2_.as<T>();
    }
    trace::op("sum");
    colsum(ds2, H, G + l_.b2);
    trace::op("mm");
    bwd_[0].execute();
    bwd_[1].execute();
    cpu::stream().wait();
    trace::op("gelu_bwd");
    T* df = df_.as<T>();
    const T* z = z_.as<T>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < T_ * F; ++i) df[i] = st<T>(ld(df[i]) * gelu_grad(ld(z[i])));
    trace::op("sum");
    colsum(df, F, G + l_.b1);
    trace::op("mm");
    bwd_[2].execute();
    bwd_[3].execute();
    cpu::stream().wait();
    trace::op("layernorm_bwd");
    if (a.pre_ln)  // ds1 = LN2'(du2) + dy
      layernorm_back(du2_.as<T>(), nullptr, s1_.as<T>(), mean2_.as<float>(), rstd2_.as<float>(), P + l_.ln2g, G + l_.ln2g,
                     G + l_.ln2b, ds1_.as<T>(), ds2);
    else  // ds1 = LN1'(du2 + ds2)
      layernorm_back(du2_.as<T>(), ds2, s1_.as<T>(), mean1_.as<float>(), rstd1_.as<float>(), P + l_.ln1g, G + l_.ln1g,
                     G + l_.ln1b, ds1_.as<T>(), nullptr);
    trace::op("sum");
    colsum(ds1_.as<T>(), H, G + l_.bo);
    // The output projection's two GEMMs, then the context's two batched ones (dP, dV).
    for (std::size_t k = 4; k < attn_bwd_; ++k) trace::op(k < 6 ? "mm" : "bmm"), bwd_[k].execute();
    cpu::stream().wait();
    trace::op("softmax_bwd");
    softmax_bwd_->run({nullptr, prob_.data(), dp_.data(), dp_.data()});  // in place over dP
    // The scores' two batched GEMMs (dQ, dK), then the QKV projection's.
    for (std::size_t k = attn_bwd_; k < bwd_.size(); ++k) trace::op(k < attn_bwd_ + 2 ? "bmm" : "mm"), bwd_[k].execute();
    cpu::stream().wait();
    trace::op("sum");
    colsum(dqkv_.as<T>(), 3 * H, G + l_.bqkv);
    if (a.pre_ln)
      trace::op("layernorm_bwd"), layernorm_back(du1_.as<T>(), nullptr, x_.as<T>(), mean1_.as<float>(), rstd1_.as<float>(), P + l_.ln1g, G + l_.ln1g,
                     G + l_.ln1b, nullptr, nullptr);
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(), n,
                    adamw::scalars_for(hyper(), ++step_), team());
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  int threads_;
  HostBuffer x_, target_, params_, weights_, grads_, m_, v_;
  HostBuffer u1_, qkv_, prob_, ctx_, attn_, s1_, h1_, z_, f_, o_, s2_, y_, mean1_, rstd1_, mean2_, rstd2_;
  HostBuffer dy_, ds2_, df_, du2_, ds1_, dctx_, dqkv_, dp_, du1_;
  std::vector<Matmul> fwd_, bwd_;
  std::unique_ptr<softmax::Plan> softmax_, softmax_bwd_;
  std::size_t attn_bwd_ = 0;
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::string cpu_bf16_reason() {
  // A small bf16 matmul with a bias, as the dense layers use: oneDNN 2.6 implements bf16 from
  // AVX-512 on and refuses it (unimplemented) below.
  static const std::string reason = [] {
    try {
      const memory::desc a = md(16, 16, false, dt::bf16);
      const memory::desc bias({1, 16}, dt::bf16, dims{16, 1});
      HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, bias, a), cpu::engine()));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      return "oneDNN has no bf16 matmul for this CPU (ISA " + cpu::isa_name() + ")";
    }
    return std::string();
  }();
  return reason;
}

std::unique_ptr<LayerCase> make_cpu(const Problem& p) {
  if (p.dtype == DType::bf16) return std::make_unique<CpuLayer<bf16>>(p);
  return std::make_unique<CpuLayer<float>>(p);
}

}  // namespace hotops::model_bert
