// batchnorm_relu_maxpool and batchnorm_relu on the CPU: OpenMP loops over the rows (n, h, w),
// channels innermost (NHWC and nc: contiguous, vectorized over the channels; NCHW strided by a plane). The batch statistics are per-thread
// double sums shifted by each channel's first value, added in thread order; the activations are f32
// math over f32 or bf16 storage.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu_vector.h"
#include "hotops/dtype.h"
#include "kernels/batchnorm/relu_maxpool.h"

namespace hotops::batchnorm::relu_maxpool {
namespace {

using bf16 = std::uint16_t;
inline float load(float v) { return v; }
inline float load(bf16 v) { return bf16_to_float(v); }
template <class T>
T store(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return float_to_bf16(v);
}

// relu(z scale + shift): the forward's value of an element, and what cpu_activation gives.
inline float activation(float z, float scale, float shift) { return std::max(z * scale + shift, 0.f); }

// The contiguous-row loops (NHWC, nc), each over one row's C channels, compiled three times
// (HOTOPS_CPU_CLONES: AVX-512, AVX2, baseline) for f32 (D f32) and bf16 storage.
namespace kernel {

using vec::Elem;

// The batch statistics' sums of a row of z, shifted by k0.
template <DType D>
HOTOPS_VECTOR_INLINE void stats(const void* zv, const float* __restrict k0, double* __restrict x1, double* __restrict x2,
                                std::int64_t C) {
  const auto* __restrict z = static_cast<const typename Elem<D>::T*>(zv);
  for (std::int64_t c = 0; c < C; ++c) {
    const double d = static_cast<double>(Elem<D>::load(z[c])) - k0[c];
    x1[c] += d, x2[c] += d * d;
  }
}

// One pooled row: the first maximum of relu(z scale + shift) over the k x k window whose corner row
// is zv (rows `stride` elements apart), its index into at, then dropout (keep: the mask's key, e0
// the row's first element in its sample, hi the sample's mask word) into out.
template <DType D>
HOTOPS_VECTOR_INLINE void pool(const void* zv, std::int64_t k, std::int64_t stride, std::int64_t C, const float* __restrict sc,
                               const float* __restrict sh, const pointwise::DropoutKey* key, std::uint32_t e0, std::uint32_t hi,
                               void* outv, std::uint8_t* __restrict at, float* __restrict best) {
  using T = typename Elem<D>::T;
  const T* z = static_cast<const T*>(zv);
  T* __restrict out = static_cast<T*>(outv);
  for (std::int64_t c = 0; c < C; ++c) best[c] = -1.f, at[c] = 0;
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j) {
      const T* __restrict zr = z + i * stride + j * C;
      const auto q = static_cast<std::uint8_t>(i * k + j);
      for (std::int64_t c = 0; c < C; ++c) {
        const float y = std::max(Elem<D>::load(zr[c]) * sc[c] + sh[c], 0.f);
        const bool more = y > best[c];
        best[c] = more ? y : best[c];
        at[c] = more ? q : at[c];
      }
    }
  if (key) {
    const pointwise::DropoutKey kk = *key;
    for (std::int64_t c = 0; c < C; ++c)
      out[c] = Elem<D>::store(best[c] * vec::if_set(pointwise::dropout_keep(kk, e0 + static_cast<std::uint32_t>(c), hi), kk.scale, 0.f));
  } else {
    for (std::int64_t c = 0; c < C; ++c) out[c] = Elem<D>::store(best[c]);
  }
}

// Where each window element lies from its corner (arg's values index it; the channel adds c): row
// i, column j of the window at i stride + j C, for `grad`.
HOTOPS_VECTOR_INLINE void window_offsets(std::int64_t k, std::int64_t stride, std::int64_t C, std::int32_t* at) {
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j) at[i * k + j] = static_cast<std::int32_t>(i * stride + j * C);
}

// The backward's first stage on one pooled row: the gradient reaching each channel's argmax (the
// window's corner row zv, its elements at `at` from it (window_offsets); arg null: k = 1), through
// dropout and the ReLU, into g, and the sums of it and of it times xhat (bn); zw: C floats of scratch.
template <DType D>
HOTOPS_VECTOR_INLINE void grad(const void* zv, const std::uint8_t* __restrict arg, const std::int32_t* __restrict at,
                               std::int64_t C, const float* __restrict sc, const float* __restrict sh, const float* __restrict mean,
                               const float* __restrict rstd, const void* doutv, const pointwise::DropoutKey* key, std::uint32_t e0,
                               std::uint32_t hi, float* __restrict g, double* __restrict x1, double* __restrict x2,
                               float* __restrict zw) {
  using T = typename Elem<D>::T;
  const T* z = static_cast<const T*>(zv);
  const T* __restrict dout = static_cast<const T*>(doutv);
  const pointwise::DropoutKey kk = key ? *key : pointwise::DropoutKey{};
  // The argmax elements gathered into zw first, in a loop of their own: there is no vector gather of
  // 2-byte elements, and with it in the main loop GCC left that loop scalar.
  if (arg)
    for (std::int64_t c = 0; c < C; ++c) zw[c] = Elem<D>::load(z[at[arg[c]] + c]);
  // The loops unswitched on the window (arg), dropout (key) and batch norm (mean), so that each is
  // one straight vector loop.
  const auto loop = [&](auto pooled, auto drops, auto bn) HOTOPS_LAMBDA_INLINE {
    for (std::int64_t c = 0; c < C; ++c) {
      float zv1;
      if constexpr (decltype(pooled)::value) zv1 = zw[c];
      else zv1 = Elem<D>::load(z[c]);
      float d = vec::if_set(zv1 * sc[c] + sh[c] > 0.f, Elem<D>::load(dout[c]), 0.f);
      if constexpr (decltype(drops)::value)
        d *= vec::if_set(pointwise::dropout_keep(kk, e0 + static_cast<std::uint32_t>(c), hi), kk.scale, 0.f);
      g[c] = d;
      x1[c] += d;
      if constexpr (decltype(bn)::value) x2[c] += static_cast<double>(d * (zv1 - mean[c]) * rstd[c]);
    }
  };
  using Y = std::true_type;
  using N = std::false_type;
  const auto with_bn = [&](auto pooled, auto drops) HOTOPS_LAMBDA_INLINE { mean ? loop(pooled, drops, Y{}) : loop(pooled, drops, N{}); };
  const auto with_drops = [&](auto pooled) HOTOPS_LAMBDA_INLINE { key ? with_bn(pooled, Y{}) : with_bn(pooled, N{}); };
  arg ? with_drops(Y{}) : with_drops(N{});
}

// The backward's last stage on one row of z: dz = A dy + b0 + c0 xhat (bn: mean non-null), dy the
// row's pooled gradient g where the element is its window's argmax q (arg null: every element), else 0.
template <DType D>
HOTOPS_VECTOR_INLINE void dz_row(const void* zv, const float* __restrict g, const std::uint8_t* __restrict arg, std::uint8_t q,
                                 std::int64_t C, const float* __restrict A, const float* __restrict B0, const float* __restrict C0,
                                 const float* __restrict mean, const float* __restrict rstd, void* dzv) {
  using T = typename Elem<D>::T;
  const T* __restrict z = static_cast<const T*>(zv);
  T* __restrict dz = static_cast<T*>(dzv);
  // Unswitched: where dy comes from (none: outside every window; g at every element; g at the argmax)
  // and whether batch norm adds its terms.
  const auto loop = [&](auto from, auto bn) HOTOPS_LAMBDA_INLINE {
    for (std::int64_t c = 0; c < C; ++c) {
      float d = 0.f;
      if constexpr (decltype(from)::value == 1) d = g[c];
      if constexpr (decltype(from)::value == 2) d = arg[c] == q ? g[c] : 0.f;
      float v = A[c] * d;
      if constexpr (decltype(bn)::value) v += B0[c] + C0[c] * (Elem<D>::load(z[c]) - mean[c]) * rstd[c];
      dz[c] = Elem<D>::store(v);
    }
  };
  const auto with_bn = [&](auto from) HOTOPS_LAMBDA_INLINE { mean ? loop(from, std::true_type{}) : loop(from, std::false_type{}); };
  if (!g) with_bn(std::integral_constant<int, 0>{});
  else if (!arg) with_bn(std::integral_constant<int, 1>{});
  else with_bn(std::integral_constant<int, 2>{});
}

// The clones take runs of rows, so that a call (an indirect one, through the clones' resolver) and
// its index arithmetic are paid once a run, not once a row of a few channels.
// stats: `rows` contiguous rows of z. grad: `rows` pooled rows of one pooled image row (their
// windows' corners k C apart, their dropout elements C apart). dz: one image row of z (W rows): its
// pooled row's gradient gp and argmax bytes ap (null: the row lies below the last window), q0 the
// argmax value of its first element in its window.
#define RELU_MAXPOOL_CLONES(SUFFIX, D)                                                                                     \
  HOTOPS_CPU_CLONES void stats_##SUFFIX(const void* z, const float* k0, double* x1, double* x2, std::int64_t C,            \
                                        std::int64_t rows) {                                                               \
    for (std::int64_t r = 0; r < rows; ++r) stats<D>(static_cast<const typename Elem<D>::T*>(z) + r * C, k0, x1, x2, C);   \
  }                                                                                                                        \
  HOTOPS_CPU_CLONES void pool_##SUFFIX(const void* z, std::int64_t k, std::int64_t stride, std::int64_t C, const float* sc, \
                                       const float* sh, const pointwise::DropoutKey* key, std::uint32_t e0, std::uint32_t hi, \
                                       void* out, std::uint8_t* at, float* best) {                                         \
    pool<D>(z, k, stride, C, sc, sh, key, e0, hi, out, at, best);                                                          \
  }                                                                                                                        \
  HOTOPS_CPU_CLONES void grad_##SUFFIX(const void* z, const std::uint8_t* arg, std::int64_t k, std::int64_t stride,         \
                                       std::int64_t C, const float* sc, const float* sh, const float* mean, const float* rstd, \
                                       const void* dout, const pointwise::DropoutKey* key, std::uint32_t e0, std::uint32_t hi, \
                                       float* g, double* x1, double* x2, std::int64_t rows, float* zw) {                   \
    using T = typename Elem<D>::T;                                                                                         \
    std::int32_t at[256];                                                                                                  \
    if (arg) window_offsets(k, stride, C, at);                                                                             \
    for (std::int64_t r = 0; r < rows; ++r)                                                                                \
      grad<D>(static_cast<const T*>(z) + r * k * C, arg ? arg + r * C : nullptr, at, C, sc, sh, mean, rstd,                \
              static_cast<const T*>(dout) + r * C, key, e0 + static_cast<std::uint32_t>(r * C), hi, g + r * C, x1, x2, zw); \
  }                                                                                                                        \
  HOTOPS_CPU_CLONES void dz_##SUFFIX(const void* z, const float* gp, const std::uint8_t* ap, std::int64_t W, std::int64_t PW, \
                                     std::int64_t k, std::int64_t q0, std::int64_t C, const float* A, const float* B0,     \
                                     const float* C0, const float* mean, const float* rstd, void* dz) {                    \
    using T = typename Elem<D>::T;                                                                                         \
    for (std::int64_t w = 0, pw = 0, t = 0; w < W; ++w) {                                                                  \
      const bool inside = gp && pw < PW;                                                                                   \
      dz_row<D>(static_cast<const T*>(z) + w * C, inside ? gp + pw * C : nullptr, inside && ap ? ap + pw * C : nullptr,    \
                static_cast<std::uint8_t>(q0 + t), C, A, B0, C0, mean, rstd, static_cast<T*>(dz) + w * C);                 \
      if (++t == k) t = 0, ++pw;                                                                                           \
    }                                                                                                                      \
  }
RELU_MAXPOOL_CLONES(f32, DType::f32)
RELU_MAXPOOL_CLONES(bf16, DType::bf16)
#undef RELU_MAXPOOL_CLONES

// The clones of storage type T.
template <class T>
struct Rows {
  static constexpr bool low = !std::is_same_v<T, float>;
  static constexpr auto stats = low ? stats_bf16 : stats_f32;
  static constexpr auto pool = low ? pool_bf16 : pool_f32;
  static constexpr auto grad = low ? grad_bf16 : grad_f32;
  static constexpr auto dz = low ? dz_bf16 : dz_f32;
};

}  // namespace kernel

// Per-channel sums s1, s2 over `rows` rows, f(first, end, a, b) adding rows [first, end) into a and
// b, per thread in double (each thread one range), then added in thread order (deterministic for a
// thread count; a team of all threads even for fewer rows, cpu.h says why).
template <class F>
void row_sums(std::int64_t rows, std::int64_t C, std::vector<double>& s1, std::vector<double>& s2, F f) {
  const int nt = omp_get_max_threads();
  std::vector<double> part(static_cast<std::size_t>(2 * C * nt), 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    double* __restrict a = part.data() + 2 * C * t;
    double* __restrict b = a + C;
    f(rows * t / nt, rows * (t + 1) / nt, a, b);
  }
  s1.assign(static_cast<std::size_t>(C), 0.0), s2.assign(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t c = 0; c < C; ++c)
    for (int t = 0; t < nt; ++t)
      s1[static_cast<std::size_t>(c)] += part[static_cast<std::size_t>(2 * C * t + c)],
          s2[static_cast<std::size_t>(c)] += part[static_cast<std::size_t>(2 * C * t + C + c)];
}

template <class T>
class CpuReluMaxpool final : public Plan {
 public:
  explicit CpuReluMaxpool(const Shape& s)
      : s_(s), cs_(s.layout == Layout::nchw ? s.H * s.W : 1), pcs_(s.pooled_layout == Layout::nchw ? s.PH() * s.PW() : 1) {
    HOTOPS_CHECK(s_.k * s_.k <= 256, std::string(s_.pool ? kOp : kReluOp) + ": a window's argmax is one byte: pools up to 16");
    if (s_.dir == Direction::bwd && rows_contiguous()) dy_.assign(static_cast<std::size_t>(s_.pooled()), 0.f);
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::bwd) return rows_contiguous() ? backward_rows(a) : backward(a);
    affine(a);
    if (rows_contiguous()) return pool_rows(a);
    pool(a);
  }
  std::string label() const override { return "hotops OpenMP loops (double batch statistics, f32 math)"; }

 private:
  float drop(const Args& a, std::int64_t n, std::int64_t e) const {
    if (!s_.drops()) return 1.f;
    const auto hi = static_cast<std::uint32_t>((a.first_sample + n) % *a.period);
    return pointwise::dropout_keep(s_.key, static_cast<std::uint32_t>(e), hi) ? s_.key.scale : 0.f;
  }

  // The storage index of z's row r = (n, h, w) (its channel 0; channel c at + c cs_), and of the
  // pooled row r = (n, ph, pw) (channel c at + c pcs_).
  std::int64_t z_row(std::int64_t r) const {
    const std::int64_t plane = s_.H * s_.W;
    return cs_ == 1 ? r * s_.C : r / plane * s_.C * plane + r % plane;
  }
  std::int64_t pooled_row(std::int64_t r) const {
    const std::int64_t plane = s_.PH() * s_.PW();
    return pcs_ == 1 ? r * s_.C : r / plane * s_.C * plane + r % plane;
  }

  // scale and shift (and fwd's statistics and running update), per channel.
  void affine(const Args& a) const {
    const std::int64_t C = s_.C;
    if (!s_.bn) {
      for (std::int64_t c = 0; c < C; ++c) a.scale[c] = 1.f, a.shift[c] = a.bias[c];
      return;
    }
    if (s_.dir == Direction::infer) {
      for (std::int64_t c = 0; c < C; ++c) {
        const float sc = a.gamma[c] / std::sqrt(a.running_var[c] + static_cast<float>(s_.eps));
        a.scale[c] = sc;
        a.shift[c] = (a.bias[c] - a.running_mean[c]) * sc + a.beta[c];
      }
      return;
    }
    const T* z = static_cast<const T*>(a.z);
    const std::int64_t rows = s_.N * s_.H * s_.W;
    std::vector<float> k0(static_cast<std::size_t>(C));
    const std::int64_t cs = cs_;
    for (std::int64_t c = 0; c < C; ++c) k0[static_cast<std::size_t>(c)] = load(z[c * cs]);
    std::vector<double> s1, s2;
    if (rows_contiguous())
      row_sums(rows, C, s1, s2, [&](std::int64_t r0, std::int64_t r1, double* x1, double* x2) {
        kernel::Rows<T>::stats(z + r0 * C, k0.data(), x1, x2, C, r1 - r0);
      });
    else
      row_sums(rows, C, s1, s2, [&](std::int64_t r0, std::int64_t r1, double* __restrict x1, double* __restrict x2) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const T* __restrict zr = z + z_row(r);
          const float* __restrict k = k0.data();
#pragma omp simd
          for (std::int64_t c = 0; c < C; ++c) {
            const double d = static_cast<double>(load(zr[c * cs])) - k[c];
            x1[c] += d, x2[c] += d * d;
          }
        }
      });
    const double M = static_cast<double>(rows);
    for (std::int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<std::size_t>(c);
      const double d = s1[k] / M, var = std::max(s2[k] / M - d * d, 0.0), m = k0[k] + d;
      const double rs = 1 / std::sqrt(var + s_.eps), sc = a.gamma[c] * rs;
      a.scale[c] = static_cast<float>(sc);
      a.shift[c] = static_cast<float>(a.beta[c] - m * sc);
      a.mean[c] = static_cast<float>(m);
      a.rstd[c] = static_cast<float>(rs);
      a.running_mean[c] = static_cast<float>((1 - s_.momentum) * a.running_mean[c] + s_.momentum * (m + a.bias[c]));
      a.running_var[c] = static_cast<float>((1 - s_.momentum) * a.running_var[c] + s_.momentum * var * M / (M - 1));
    }
  }

  // NHWC and nc (z and the pooled tensors): each row's channels contiguous, the loops vectorized over them.
  bool rows_contiguous() const { return cs_ == 1 && pcs_ == 1; }

  // The dropout factor of pooled element c of the pooled row at e0 = (ph PW + pw) C of sample n.
  static float keep(const pointwise::DropoutKey& key, std::int64_t e0, std::int64_t c, std::uint32_t hi) {
    return pointwise::dropout_keep(key, static_cast<std::uint32_t>(e0 + c), hi) ? key.scale : 0.f;
  }

  // pool() on contiguous rows: per pooled row, the window's rows of z in turn, each channel's running
  // first maximum and its index in per-thread arrays, then dropout and the stores.
  void pool_rows(const Args& a) const {
    const T* z = static_cast<const T*>(a.z);
    T* out = static_cast<T*>(a.out);
    const std::int64_t C = s_.C, k = s_.k, H = s_.H, W = s_.W, PH = s_.PH(), PW = s_.PW(), rows = s_.N * PH * PW;
    const std::int64_t period = s_.drops() ? *a.period : 1, first = a.first_sample;
    const pointwise::DropoutKey* key = s_.drops() ? &s_.key : nullptr;
#pragma omp parallel
    {
      std::vector<float> best(static_cast<std::size_t>(C));
      std::vector<std::uint8_t> at(static_cast<std::size_t>(C));
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t pw = r % PW, ph = (r / PW) % PH, n = r / (PW * PH);
        std::uint8_t* arg = s_.pool ? a.arg + r * C : at.data();
        kernel::Rows<T>::pool(z + ((n * H + ph * k) * W + pw * k) * C, k, W * C, C, a.scale, a.shift, key,
                              static_cast<std::uint32_t>((ph * PW + pw) * C), static_cast<std::uint32_t>((first + n) % period), out + r * C, arg,
                              best.data());
      }
    }
  }

  // backward() on contiguous rows. Stage 1 over the pooled rows: the gradient reaching each window's
  // argmax (dout, dropout, the ReLU there), kept in dy_, and its sums; stage 2 the per-channel
  // coefficients; stage 3 over z's rows: dz = A dy + b0 + c0 xhat, dy from dy_ where the element is
  // its window's argmax, else 0.
  void backward_rows(const Args& a) {
    const T* z = static_cast<const T*>(a.z);
    const T* dout = static_cast<const T*>(a.dout);
    const std::int64_t C = s_.C, k = s_.k, H = s_.H, W = s_.W, PH = s_.PH(), PW = s_.PW();
    const bool drops = s_.drops(), bn = s_.bn, pool = s_.pool;
    const std::int64_t period = drops ? *a.period : 1, first = a.first_sample;
    const pointwise::DropoutKey key = s_.key;
    const float* __restrict sc = a.scale;
    const float* __restrict sh = a.shift;
    const float* __restrict mean = a.mean;
    const float* __restrict rstd = a.rstd;
    const std::uint8_t* arg = a.arg;
    float* gd = dy_.data();
    std::vector<double> s1, s2;
    const pointwise::DropoutKey* kp = drops ? &key : nullptr;
    const float* mb = bn ? mean : nullptr;
    row_sums(s_.N * PH * PW, C, s1, s2, [&](std::int64_t r0, std::int64_t r1, double* x1, double* x2) {
      std::vector<float> zw(static_cast<std::size_t>(C));
      for (std::int64_t r = r0; r < r1;) {  // the range's pieces of pooled image rows
        const std::int64_t pw = r % PW, ph = (r / PW) % PH, n = r / (PW * PH), rows = std::min(r1 - r, PW - pw);
        kernel::Rows<T>::grad(z + ((n * H + ph * k) * W + pw * k) * C, pool ? arg + r * C : nullptr, k, W * C, C, sc, sh, mb, rstd,
                              dout + r * C, kp, static_cast<std::uint32_t>((ph * PW + pw) * C),
                              static_cast<std::uint32_t>((first + n) % period), gd + r * C, x1, x2, rows, zw.data());
        r += rows;
      }
    });
    std::vector<float> A(static_cast<std::size_t>(C), 1.f), B0(A.size(), 0.f), C0(A.size(), 0.f);
    coefficients(a, s1, s2, A, B0, C0);
    T* dz = static_cast<T*>(a.dz);
    const std::int64_t image_rows = s_.N * H;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < image_rows; ++r) {  // z's image row (n, h), its pooled row ph
      const std::int64_t h = r % H, n = r / H, ph = h / k;
      const std::int64_t pr = ((n * PH + ph) * PW) * C;
      kernel::Rows<T>::dz(z + r * W * C, ph < PH ? gd + pr : nullptr, pool && ph < PH ? arg + pr : nullptr, W, PW, k, (h % k) * k, C,
                          A.data(), B0.data(), C0.data(), mb, rstd, dz + r * W * C);
    }
  }

  // The per-channel gradients from the sums of dy (s1) and dy xhat (s2), and dz's coefficients.
  void coefficients(const Args& a, const std::vector<double>& s1, const std::vector<double>& s2, std::vector<float>& A,
                    std::vector<float>& B0, std::vector<float>& C0) const {
    const double M = static_cast<double>(s_.N * s_.H * s_.W);
    for (std::int64_t c = 0; c < s_.C; ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (!s_.bn) {
        a.dbias[c] = static_cast<float>(s1[i]);
        continue;
      }
      a.dgamma[c] = static_cast<float>(s2[i]), a.dbeta[c] = static_cast<float>(s1[i]), a.dbias[c] = 0.f;
      const double g = a.gamma[c] * static_cast<double>(a.rstd[c]);
      A[i] = static_cast<float>(g), B0[i] = static_cast<float>(-g * s1[i] / M), C0[i] = static_cast<float>(-g * s2[i] / M);
    }
  }

  // Each pooled row (n, ph, pw): the first maximum of relu(z scale + shift) over the window, its
  // index, then dropout (without the pool, k = 1: relu(z scale + shift), then dropout).
  void pool(const Args& a) const {
    const T* z = static_cast<const T*>(a.z);
    T* out = static_cast<T*>(a.out);
    const std::int64_t C = s_.C, k = s_.k, PH = s_.PH(), PW = s_.PW(), rows = s_.N * PH * PW;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pw = r % PW, ph = (r / PW) % PH, n = r / (PW * PH), o = pooled_row(r);
      const T* win = z + z_row((n * s_.H + ph * k) * s_.W + pw * k);
      for (std::int64_t c = 0; c < C; ++c) {
        const float s = a.scale[c], t = a.shift[c];
        float best = -1.f;
        std::uint8_t at = 0;
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) {
            const float y = activation(load(win[z_row(i * s_.W + j) + c * cs_]), s, t);
            if (y > best) best = y, at = static_cast<std::uint8_t>(i * k + j);
          }
        out[o + c * pcs_] = store<T>(best * drop(a, n, (ph * PW + pw) * C + c));
        if (s_.pool) a.arg[o + c * pcs_] = at;
      }
    }
  }

  // The gradient reaching z's element (n, h, w, c) through dropout, the pool and the ReLU.
  float dy(const Args& a, std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, float zv) const {
    const std::int64_t k = s_.k, ph = h / k, pw = w / k;
    if (ph >= s_.PH() || pw >= s_.PW() || !(activation(zv, a.scale[c], a.shift[c]) > 0.f)) return 0.f;
    const std::int64_t j = pooled_row((n * s_.PH() + ph) * s_.PW() + pw) + c * pcs_;
    if (s_.pool && a.arg[j] != (h % k) * k + w % k) return 0.f;
    return load(static_cast<const T*>(a.dout)[j]) * drop(a, n, (ph * s_.PW() + pw) * s_.C + c);
  }

  // Stage 1, the sums of dy and dy xhat over the pooled rows (each window's argmax); stage 2 the
  // per-channel gradients and dz = A dy + b0 + c0 xhat (or dy); stage 3 dz over every element.
  void backward(const Args& a) const {
    const T* z = static_cast<const T*>(a.z);
    const std::int64_t C = s_.C, k = s_.k, PH = s_.PH(), PW = s_.PW();
    std::vector<double> s1, s2;
    row_sums(s_.N * PH * PW, C, s1, s2, [&](std::int64_t r0, std::int64_t r1, double* x1, double* x2) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t pw = r % PW, ph = (r / PW) % PH, n = r / (PW * PH);
        const std::int64_t o = pooled_row(r);
        for (std::int64_t c = 0; c < C; ++c) {
          const std::int64_t q = s_.pool ? a.arg[o + c * pcs_] : 0, h = ph * k + q / k, w = pw * k + q % k;
          const float zv = load(z[z_row((n * s_.H + h) * s_.W + w) + c * cs_]);
          const float d = dy(a, n, h, w, c, zv);
          x1[c] += d;
          if (s_.bn) x2[c] += static_cast<double>(d * (zv - a.mean[c]) * a.rstd[c]);
        }
      }
    });
    std::vector<float> A(static_cast<std::size_t>(C), 1.f), B0(A.size(), 0.f), C0(A.size(), 0.f);
    coefficients(a, s1, s2, A, B0, C0);
    T* dz = static_cast<T*>(a.dz);
    const std::int64_t rows = s_.N * s_.H * s_.W;
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t w = r % s_.W, h = (r / s_.W) % s_.H, n = r / (s_.W * s_.H), zr = z_row(r);
      for (std::int64_t c = 0; c < C; ++c) {
        const auto i = static_cast<std::size_t>(c);
        const float zv = load(z[zr + c * cs_]);
        float o = A[i] * dy(a, n, h, w, c, zv);
        if (s_.bn) o += B0[i] + C0[i] * (zv - a.mean[c]) * a.rstd[c];
        dz[zr + c * cs_] = store<T>(o);
      }
    }
  }

  Shape s_;
  std::int64_t cs_, pcs_;  // the distance between channels of z and of the pooled tensors
  std::vector<float> dy_;  // bwd on contiguous rows: the gradient reaching each window's argmax
};

}  // namespace

void cpu_activation(const Shape& s, const void* z, const float* scale, const float* shift, float* out) {
  const std::int64_t n = s.count(), C = s.C, plane = s.layout == Layout::nchw ? s.H * s.W : 1;
  auto act = [&](auto* zt) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t c = (i / plane) % C;
      out[i] = activation(load(zt[i]), scale[c], shift[c]);
    }
  };
  if (s.dtype == DType::bf16) act(static_cast<const bf16*>(z));
  else act(static_cast<const float*>(z));
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuReluMaxpool<bf16>>(s);
  return std::make_unique<CpuReluMaxpool<float>>(s);
}

}  // namespace hotops::batchnorm::relu_maxpool
