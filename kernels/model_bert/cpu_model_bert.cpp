// model_bert on the CPU: every GEMM a oneDNN matmul primitive created at setup (the dense layers with
// their bias; the attention's per-head GEMMs as 4-D [batch, heads, rows, cols] matmuls on strided views
// of the QKV, context and gradient buffers, so no head split or merge copies), the rest OpenMP loops:
// softmax forward/backward over rows, bias-free GELU forward/backward (erf), residual + LayerNorm
// forward/backward, column sums for the bias and LayerNorm gradients, the MSE loss, one AdamW pass.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/model_bert/model_bert.h"

namespace hotops::model_bert {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using dims = memory::dims;

class ThreadScope {
 public:
  explicit ThreadScope(int threads) : previous_(cpu::threads()), set_(threads > 0) {
    if (set_) cpu::set_threads(threads);
  }
  ~ThreadScope() {
    if (set_) cpu::set_threads(previous_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;
  bool set_;
};

memory::desc md(std::int64_t rows, std::int64_t cols, bool transposed = false) {
  return transposed ? memory::desc({rows, cols}, dt::f32, dims{1, rows}) : memory::desc({rows, cols}, dt::f32, dims{cols, 1});
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

// dst = scale * src . wei (+ bias): 2-D or 4-D descriptors.
Matmul make_matmul(const memory::desc& src, const float* s, const memory::desc& wei, const float* w, const float* bias,
                   const memory::desc& dst, float* d, float scale = 1.f) {
  dnnl::engine& eng = cpu::engine();
  dnnl::primitive_attr attr;
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  const memory::dim n = dst.dims().back();
  const memory::desc bias_md = bias ? memory::desc({1, n}, dt::f32, dims{n, 1}) : memory::desc();
  const auto desc = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(src, wei, bias_md, dst));
  const auto pd = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(desc, attr, eng));
  Matmul m;
  m.prim = HOTOPS_CHECK_DNNL(dnnl::matmul(pd));
  m.src = memory(src, eng, const_cast<float*>(s));
  m.wei = memory(wei, eng, const_cast<float*>(w));
  if (bias) m.bias = memory(bias_md, eng, const_cast<float*>(bias));
  m.dst = memory(dst, eng, d);
  return m;
}

// A [batch, heads, rows, cols] view: element (b, h, r, c) at b * sb + h * sh + r * sr + c * sc.
memory::desc view4(std::int64_t B, std::int64_t NH, std::int64_t rows, std::int64_t cols, std::int64_t sb, std::int64_t sh,
                   std::int64_t sr, std::int64_t sc) {
  return memory::desc({B, NH, rows, cols}, dt::f32, dims{sb, sh, sr, sc});
}

float gelu(float z) { return 0.5f * z * (1.f + std::erf(z * 0.70710678118654752f)); }
float gelu_grad(float z) {
  return 0.5f * (1.f + std::erf(z * 0.70710678118654752f)) + z * 0.39894228040143268f * std::exp(-0.5f * z * z);
}

class CpuLayer final : public LayerCase {
 public:
  explicit CpuLayer(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, p.seed())),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    ThreadScope scope(threads_);
    const Arch& a = s_.arch;
    const std::int64_t T = s_.tokens(), H = a.hidden, F = a.ffn, S = a.seq, NH = a.heads, D = a.head_dim(), B = s_.batch;
    HOTOPS_CHECK(D * NH == H, "model_bert: hidden must be heads x head_dim");
    x_ = seeded_.x, target_ = seeded_.target, params_ = seeded_.params, m_ = seeded_.m, v_ = seeded_.v;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);
    auto buf = [](std::int64_t n) { return HostBuffer(DType::f32, static_cast<std::size_t>(n)); };
    u1_ = buf(a.pre_ln ? T * H : 1), qkv_ = buf(T * 3 * H), prob_ = buf(B * NH * S * S), ctx_ = buf(T * H), attn_ = buf(T * H);
    s1_ = buf(T * H), h1_ = buf(T * H), z_ = buf(T * F), f_ = buf(T * F), o_ = buf(T * H), s2_ = buf(T * H), y_ = buf(T * H);
    mean1_ = buf(T), rstd1_ = buf(T), mean2_ = buf(T), rstd2_ = buf(T);
    const float scale = static_cast<float>(1 / std::sqrt(static_cast<double>(D)));
    float* P = params_.as<float>();
    float* G = grads_.as<float>();
    const float* u1 = a.pre_ln ? u1_.as<float>() : x_.as<float>();
    const float* u2 = h1_.as<float>();  // the FFN's input: bert LN1's output, vit LN2's (both kept in h1_)
    const float* q = qkv_.as<float>();
    // The attention's views of qkv [T, 3H] and ctx [T, H] per (sample, head).
    const memory::desc q_v = view4(B, NH, S, D, S * 3 * H, D, 3 * H, 1);    // Q, K or V [S, D]
    const memory::desc kt_v = view4(B, NH, D, S, S * 3 * H, D, 1, 3 * H);   // K^T or V^T [D, S]
    const memory::desc ctx_v = view4(B, NH, S, D, S * H, D, H, 1);
    const memory::desc p_v = view4(B, NH, S, S, NH * S * S, S * S, S, 1);
    const memory::desc pt_v = view4(B, NH, S, S, NH * S * S, S * S, 1, S);  // P^T
    fwd_.push_back(make_matmul(md(T, H), u1, md(H, 3 * H), P + l_.wqkv, P + l_.bqkv, md(T, 3 * H), qkv_.as<float>()));
    fwd_.push_back(make_matmul(q_v, q, kt_v, q + H, nullptr, p_v, prob_.as<float>(), scale));
    fwd_.push_back(make_matmul(p_v, prob_.as<float>(), q_v, q + 2 * H, nullptr, ctx_v, ctx_.as<float>()));
    fwd_.push_back(make_matmul(md(T, H), ctx_.as<float>(), md(H, H), P + l_.wo, P + l_.bo, md(T, H), attn_.as<float>()));
    fwd_.push_back(make_matmul(md(T, H), u2, md(H, F), P + l_.w1, P + l_.b1, md(T, F), z_.as<float>()));
    fwd_.push_back(make_matmul(md(T, F), f_.as<float>(), md(F, H), P + l_.w2, P + l_.b2, md(T, H), o_.as<float>()));
    if (!s_.train()) return;
    dy_ = buf(T * H), df_ = buf(T * F), du2_ = buf(T * H), ds1_ = buf(T * H), dctx_ = buf(T * H), dqkv_ = buf(T * 3 * H);
    dp_ = buf(B * NH * S * S), du1_ = buf(a.pre_ln ? T * H : 1);
    // backward, in order of use; w: weight gradient a^T . dz, d: data gradient dz . W^T
    auto wgrad = [&](const float* in, std::int64_t k_in, const float* dz, std::int64_t k_out, std::size_t at) {
      return make_matmul(md(k_in, T, true), in, md(T, k_out), dz, nullptr, md(k_in, k_out), G + at);
    };
    auto dgrad = [&](const float* dz, std::int64_t k_out, std::size_t at, std::int64_t k_in, float* out) {
      return make_matmul(md(T, k_out), dz, md(k_out, k_in, true), P + at, nullptr, md(T, k_in), out);
    };
    const float* ds2 = a.pre_ln ? dy_.as<float>() : s2grad();
    bwd_.push_back(wgrad(f_.as<float>(), F, ds2, H, l_.w2));
    bwd_.push_back(dgrad(ds2, H, l_.w2, F, df_.as<float>()));
    bwd_.push_back(wgrad(u2, H, df_.as<float>(), F, l_.w1));
    bwd_.push_back(dgrad(df_.as<float>(), F, l_.w1, H, du2_.as<float>()));
    bwd_.push_back(wgrad(ctx_.as<float>(), H, ds1_.as<float>(), H, l_.wo));
    bwd_.push_back(dgrad(ds1_.as<float>(), H, l_.wo, H, dctx_.as<float>()));
    float* dq = dqkv_.as<float>();
    bwd_.push_back(make_matmul(ctx_v, dctx_.as<float>(), kt_v, q + 2 * H, nullptr, p_v, dp_.as<float>()));  // dP
    bwd_.push_back(make_matmul(pt_v, prob_.as<float>(), ctx_v, dctx_.as<float>(), nullptr, q_v, dq + 2 * H));  // dV
    attn_bwd_ = bwd_.size();
    bwd_.push_back(make_matmul(p_v, dp_.as<float>(), q_v, q + H, nullptr, q_v, dq, scale));            // dQ
    bwd_.push_back(make_matmul(pt_v, dp_.as<float>(), q_v, q, nullptr, q_v, dq + H, scale));           // dK
    bwd_.push_back(wgrad(u1, H, dq, 3 * H, l_.wqkv));
    if (a.pre_ln) bwd_.push_back(dgrad(dq, 3 * H, l_.wqkv, H, du1_.as<float>()));
  }

  void run() override {
    ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    loss_ = loss_and_dy();
    backward();
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
    return std::string(s_.arch.pre_ln ? "pre-LN" : "post-LN") +
           " encoder layer: oneDNN matmul (dense + 4-D strided attention GEMMs), OpenMP softmax, GELU, LayerNorm" +
           (s_.train() ? ", MSE, backward loops, AdamW 1 flat pass" : "") + ", " +
           std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }

 private:
  static void copy_into(HostBuffer& dst, const HostBuffer& src) { std::copy_n(src.as<float>(), src.count(), dst.as<float>()); }
  const HostBuffer* out() const { return s_.arch.pre_ln ? &s2_ : &y_; }
  // bert: the gradient of s2 = h1 + o (LN2's input) lives in ds2_ (allocated on first use).
  float* s2grad() {
    ds2_ = HostBuffer(DType::f32, static_cast<std::size_t>(s_.tokens() * s_.arch.hidden));
    return ds2_.as<float>();
  }
  int team() const { return cpu::threads(); }

  // y = LN(a + b) rows of H (b may be null); keeps the sum in `sum` when given, mean and rstd per row.
  void add_layernorm(const float* a, const float* b, float* sum, const float* g, const float* beta, float* y, float* mean,
                     float* rstd) {
    const std::int64_t T = s_.tokens(), H = s_.arch.hidden;
    const double eps = s_.arch.ln_eps;
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t r = 0; r < T; ++r) {
      const float* ar = a + r * H;
      float* sr = sum ? sum + r * H : nullptr;
      double m = 0;
      for (std::int64_t c = 0; c < H; ++c) {
        const float v = b ? ar[c] + b[r * H + c] : ar[c];
        if (sr) sr[c] = v;
        m += v;
      }
      const float* in = sr ? sr : ar;
      m /= static_cast<double>(H);
      double var = 0;
      for (std::int64_t c = 0; c < H; ++c) var += (in[c] - m) * (in[c] - m);
      const float rs = static_cast<float>(1 / std::sqrt(var / static_cast<double>(H) + eps));
      const auto mf = static_cast<float>(m);
      mean[r] = mf, rstd[r] = rs;
      for (std::int64_t c = 0; c < H; ++c) y[r * H + c] = (in[c] - mf) * rs * g[c] + beta[c];
    }
  }

  // dx = LN backward of (dy1 + dy2) (+ dres); dgamma, dbeta column sums. x is LN's input.
  void layernorm_back(const float* dy1, const float* dy2, const float* x, const float* mean, const float* rstd, const float* g,
                      float* dg, float* db, float* dx, const float* dres) {
    const std::int64_t T = s_.tokens(), H = s_.arch.hidden;
    const int nt = team();
    std::vector<float> part(static_cast<std::size_t>(nt * 2 * H), 0.f);
#pragma omp parallel num_threads(nt)
    {
      float* pg = part.data() + static_cast<std::size_t>(omp_get_thread_num() * 2 * H);
      float* pb = pg + H;
      std::vector<float> d(static_cast<std::size_t>(H));
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < T; ++r) {
        const float m = mean[r], rs = rstd[r];
        float m1 = 0, m2 = 0;
        for (std::int64_t c = 0; c < H; ++c) {
          const std::int64_t i = r * H + c;
          const float dv = dy2 ? dy1[i] + dy2[i] : dy1[i];
          const float xh = (x[i] - m) * rs;
          d[static_cast<std::size_t>(c)] = dv;
          pg[c] += dv * xh, pb[c] += dv;
          m1 += dv * g[c], m2 += dv * g[c] * xh;
        }
        m1 /= static_cast<float>(H), m2 /= static_cast<float>(H);
        if (dx)
          for (std::int64_t c = 0; c < H; ++c) {
            const std::int64_t i = r * H + c;
            const float xh = (x[i] - m) * rs;
            dx[i] = rs * (d[static_cast<std::size_t>(c)] * g[c] - m1 - xh * m2) + (dres ? dres[i] : 0.f);
          }
      }
    }
    for (std::int64_t c = 0; c < 2 * H; ++c) {
      float sum = 0;
      for (int t = 0; t < nt; ++t) sum += part[static_cast<std::size_t>(t * 2 * H + c)];
      (c < H ? dg[c] : db[c - H]) = sum;
    }
  }

  void colsum(const float* x, std::int64_t cols, float* out) {
    const std::int64_t T = s_.tokens();
    constexpr std::int64_t kCols = 64;
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t c0 = 0; c0 < cols; c0 += kCols) {
      const std::int64_t c1 = std::min(cols, c0 + kCols);
      float acc[kCols] = {};
      for (std::int64_t r = 0; r < T; ++r)
        for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += x[r * cols + c];
      for (std::int64_t c = c0; c < c1; ++c) out[c] = acc[c - c0];
    }
  }

  void forward() {
    const Arch& a = s_.arch;
    const std::int64_t T = s_.tokens(), H = a.hidden, F = a.ffn, S = a.seq, rows = s_.batch * a.heads * S;
    float* P = params_.as<float>();
    if (a.pre_ln) add_layernorm(x_.as<float>(), nullptr, nullptr, P + l_.ln1g, P + l_.ln1b, u1_.as<float>(), mean1_.as<float>(), rstd1_.as<float>());
    fwd_[0].execute();
    fwd_[1].execute();
    cpu::stream().wait();
    float* pr = prob_.as<float>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = pr + r * S;
      const float mx = *std::max_element(row, row + S);
      float sum = 0;
      for (std::int64_t j = 0; j < S; ++j) sum += (row[j] = std::exp(row[j] - mx));
      const float inv = 1.f / sum;
      for (std::int64_t j = 0; j < S; ++j) row[j] *= inv;
    }
    fwd_[2].execute();
    fwd_[3].execute();
    cpu::stream().wait();
    if (a.pre_ln)  // s1 = x + attn (the FFN block's residual), h1 = LN2(s1) the FFN's input
      add_layernorm(x_.as<float>(), attn_.as<float>(), s1_.as<float>(), P + l_.ln2g, P + l_.ln2b, h1_.as<float>(), mean2_.as<float>(), rstd2_.as<float>());
    else
      add_layernorm(x_.as<float>(), attn_.as<float>(), s1_.as<float>(), P + l_.ln1g, P + l_.ln1b, h1_.as<float>(), mean1_.as<float>(), rstd1_.as<float>());
    fwd_[4].execute();
    cpu::stream().wait();
    const float* z = z_.as<float>();
    float* f = f_.as<float>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < T * F; ++i) f[i] = gelu(z[i]);
    fwd_[5].execute();
    cpu::stream().wait();
    const float* resid = a.pre_ln ? s1_.as<float>() : h1_.as<float>();
    const float* o = o_.as<float>();
    float* s2 = s2_.as<float>();
    if (a.pre_ln) {
#pragma omp parallel for num_threads(team()) schedule(static)
      for (std::int64_t i = 0; i < T * H; ++i) s2[i] = resid[i] + o[i];
    } else {
      add_layernorm(resid, o, s2, P + l_.ln2g, P + l_.ln2b, y_.as<float>(), mean2_.as<float>(), rstd2_.as<float>());
    }
  }

  double loss_and_dy() {
    const std::int64_t n = s_.tokens() * s_.arch.hidden;
    const float* y = out()->as<float>();
    const float* t = target_.as<float>();
    float* dy = dy_.as<float>();
    const float k = 2.f / static_cast<float>(n);
    double total = 0;
#pragma omp parallel for num_threads(team()) reduction(+ : total) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float e = y[i] - t[i];
      dy[i] = k * e;
      total += static_cast<double>(e) * e;
    }
    return total / static_cast<double>(n);
  }

  void backward() {
    const Arch& a = s_.arch;
    const std::int64_t T = s_.tokens(), H = a.hidden, F = a.ffn, S = a.seq, rows = s_.batch * a.heads * S;
    float* P = params_.as<float>();
    float* G = grads_.as<float>();
    const float* ds2 = dy_.as<float>();
    if (!a.pre_ln) {
      layernorm_back(dy_.as<float>(), nullptr, s2_.as<float>(), mean2_.as<float>(), rstd2_.as<float>(), P + l_.ln2g, G + l_.ln2g,
                     G + l_.ln2b, ds2_.as<float>(), nullptr);
      ds2 = ds2_.as<float>();
    }
    colsum(ds2, H, G + l_.b2);
    bwd_[0].execute();
    bwd_[1].execute();
    cpu::stream().wait();
    float* df = df_.as<float>();
    const float* z = z_.as<float>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < T * F; ++i) df[i] *= gelu_grad(z[i]);
    colsum(df, F, G + l_.b1);
    bwd_[2].execute();
    bwd_[3].execute();
    cpu::stream().wait();
    if (a.pre_ln)  // ds1 = LN2'(du2) + dy
      layernorm_back(du2_.as<float>(), nullptr, s1_.as<float>(), mean2_.as<float>(), rstd2_.as<float>(), P + l_.ln2g, G + l_.ln2g,
                     G + l_.ln2b, ds1_.as<float>(), ds2);
    else  // ds1 = LN1'(du2 + ds2)
      layernorm_back(du2_.as<float>(), ds2, s1_.as<float>(), mean1_.as<float>(), rstd1_.as<float>(), P + l_.ln1g, G + l_.ln1g,
                     G + l_.ln1b, ds1_.as<float>(), nullptr);
    colsum(ds1_.as<float>(), H, G + l_.bo);
    for (std::size_t k = 4; k < attn_bwd_; ++k) bwd_[k].execute();
    cpu::stream().wait();
    float* dp = dp_.as<float>();
    const float* pr = prob_.as<float>();
#pragma omp parallel for num_threads(team()) schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* d = dp + r * S;
      const float* p = pr + r * S;
      float dot = 0;
      for (std::int64_t j = 0; j < S; ++j) dot += d[j] * p[j];
      for (std::int64_t j = 0; j < S; ++j) d[j] = p[j] * (d[j] - dot);
    }
    for (std::size_t k = attn_bwd_; k < bwd_.size(); ++k) bwd_[k].execute();
    cpu::stream().wait();
    colsum(dqkv_.as<float>(), 3 * H, G + l_.bqkv);
    if (a.pre_ln)
      layernorm_back(du1_.as<float>(), nullptr, x_.as<float>(), mean1_.as<float>(), rstd1_.as<float>(), P + l_.ln1g, G + l_.ln1g,
                     G + l_.ln1b, nullptr, nullptr);
  }

  void adamw_step() {
    const adamw::StepScalars sc = adamw::scalars_for(hyper(), ++step_);
    float* p = params_.as<float>();
    const float* g = grads_.as<float>();
    float* m = m_.as<float>();
    float* v = v_.as<float>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) adamw::step_element(p[i], g[i], m[i], v[i], sc, [](float x) { return std::sqrt(x); });
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  int threads_;
  HostBuffer x_, target_, params_, grads_, m_, v_;
  HostBuffer u1_, qkv_, prob_, ctx_, attn_, s1_, h1_, z_, f_, o_, s2_, y_, mean1_, rstd1_, mean2_, rstd2_;
  HostBuffer dy_, ds2_, df_, du2_, ds1_, dctx_, dqkv_, dp_, du1_;
  std::vector<Matmul> fwd_, bwd_;
  std::size_t attn_bwd_ = 0;
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<LayerCase> make_cpu(const Problem& p) { return std::make_unique<CpuLayer>(p); }

}  // namespace hotops::model_bert
