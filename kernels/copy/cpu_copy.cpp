// copy on the CPU: memcpy as std::memcpy over OpenMP thread chunks (the host's copy bandwidth), the
// layouts as oneDNN reorders between plain memory descriptors or as hotops' own cache-blocked
// transpose, the dtype conversions as hotops' own vectorised loop or oneDNN reorders. hotops' loops
// stream outputs of cpu::kStreamMinBytes or more past the caches, as glibc's memcpy does.
#include <omp.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/copy/copy.h"

namespace hotops::copy {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// Bytes below which another thread costs more than it saves: PyTorch's grain for copy_
// (at::internal::GRAIN_SIZE, 32768 elements) in f32 bytes.
constexpr std::size_t kGrainBytes = 32768 * 4;

// How many threads copy `bytes`: all of them from two grains of work, else one (never a team in
// between, cpu.h says why: a model step's cast runs between oneDNN's full teams).
int threads_for(std::size_t bytes) {
  return bytes >= 2 * kGrainBytes ? cpu::threads() : 1;
}

// dst[0, bytes) = src[0, bytes): each thread of the team one contiguous, 64-byte-aligned chunk.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const auto team = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t chunk = ((bytes + team - 1) / team + 63) / 64 * 64;
    const std::size_t begin = std::min(bytes, static_cast<std::size_t>(omp_get_thread_num()) * chunk);
    const std::size_t end = std::min(bytes, begin + chunk);
    if (end > begin) std::memcpy(static_cast<std::byte*>(dst) + begin, static_cast<const std::byte*>(src) + begin, end - begin);
  }
}

class CpuMemcpy final : public Plan {
 public:
  explicit CpuMemcpy(const Shape& s) : s_(s), threads_(threads_for(s_.src_bytes())) {}

  void run(const Args& a) override { parallel_memcpy(a.dst, a.src, s_.src_bytes(), threads_); }

  std::string label() const override {
    return "std::memcpy in " + std::to_string(threads_) + " OpenMP chunk" + (threads_ > 1 ? "s" : "") + " of " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  int threads_;
};

// ---- hotops' transpose ----------------------------------------------------------------------------
// A layout change is, per image, the transpose of a row-major [R, K] matrix into [K, R]. The images'
// matrices are cut into tiles of about kTileElems^2 elements; the OpenMP threads share the
// (image, tile row, tile column) blocks in contiguous static chunks, so that a thread walks along
// the source's rows from tile to tile. A tile is transposed in BxB register blocks (SSE2 unpacks:
// the x86-64 baseline, so no -march is needed), reading B source rows at a time, into a compact
// buffer in L1, which is then written out row by row, each destination row a contiguous run. (Writing
// the blocks straight to the destination keeps a tile's worth of destination lines half-written,
// and when R is a power of two, e.g. H*W = 65536 for NHWC -> NCHW, those lines all fall in one
// cache set: half the speed on 2 AVX2 cores.) Tile edges that are not a multiple of B go element by
// element. A tile whose output is one contiguous run (it spans whole output rows, e.g. C = 32 to NHWC)
// leaves the L1 buffer through streaming stores when the output is cpu::kStreamMinBytes or more: on
// the 16-core Xeon that took f32 [32,32,256,256] to NHWC from 0.67 to 1.3 of the copy bandwidth.
// Tiles written as many short row pieces use ordinary stores: streamed, those pieces outnumbered the
// core's write-combining buffers and ran at a quarter of the copy bandwidth.

// The tile edge in elements: 256 bytes, four cache lines per tile row (on 2 AVX2 cores, 256 bytes
// beat 128 and 512 for both element sizes).
template <typename T>
constexpr std::int64_t kTileElems = 256 / sizeof(T);

// The BxB register block: d[j*ldd + i] = s[i*lds + j] for i, j < B.
template <typename T>
struct Block;

template <>
struct Block<std::uint32_t> {
  static constexpr std::int64_t B = 4;
  static void move(const std::uint32_t* __restrict__ s, std::size_t lds, std::uint32_t* __restrict__ d, std::size_t ldd) {
#if defined(__SSE2__)
    const auto load = [&](std::size_t i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * lds)); };
    const auto store = [&](std::size_t j, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j * ldd), v); };
    const __m128i r0 = load(0), r1 = load(1), r2 = load(2), r3 = load(3);
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);  // a0 b0 a1 b1 | a2 b2 a3 b3
    const __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);  // c0 d0 c1 d1 | c2 d2 c3 d3
    store(0, _mm_unpacklo_epi64(t0, t2));
    store(1, _mm_unpackhi_epi64(t0, t2));
    store(2, _mm_unpacklo_epi64(t1, t3));
    store(3, _mm_unpackhi_epi64(t1, t3));
#else
    for (std::size_t j = 0; j < std::size_t{B}; ++j)
      for (std::size_t i = 0; i < std::size_t{B}; ++i) d[j * ldd + i] = s[i * lds + j];
#endif
  }
};

template <>
struct Block<std::uint16_t> {
  static constexpr std::int64_t B = 8;
  static void move(const std::uint16_t* __restrict__ s, std::size_t lds, std::uint16_t* __restrict__ d, std::size_t ldd) {
#if defined(__SSE2__)
    __m128i r[8], u[8];
    for (std::size_t i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * lds));
    // Pairs of rows interleaved by 16, then by 32, then by 64 bits: u[k] holds columns 2k, 2k+1 of
    // rows 0-3 (k < 4) or rows 4-7 (k >= 4).
    for (std::size_t h = 0; h < 2; ++h) {
      const __m128i* q = r + 4 * h;
      const __m128i s0 = _mm_unpacklo_epi16(q[0], q[1]), s1 = _mm_unpackhi_epi16(q[0], q[1]);
      const __m128i s2 = _mm_unpacklo_epi16(q[2], q[3]), s3 = _mm_unpackhi_epi16(q[2], q[3]);
      u[4 * h + 0] = _mm_unpacklo_epi32(s0, s2);
      u[4 * h + 1] = _mm_unpackhi_epi32(s0, s2);
      u[4 * h + 2] = _mm_unpacklo_epi32(s1, s3);
      u[4 * h + 3] = _mm_unpackhi_epi32(s1, s3);
    }
    for (std::size_t k = 0; k < 4; ++k) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k) * ldd), _mm_unpacklo_epi64(u[k], u[k + 4]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * ldd), _mm_unpackhi_epi64(u[k], u[k + 4]));
    }
#else
    for (std::size_t j = 0; j < std::size_t{B}; ++j)
      for (std::size_t i = 0; i < std::size_t{B}; ++i) d[j * ldd + i] = s[i * lds + j];
#endif
  }
};

// A tile's elements at most (see tile_of).
template <typename T>
constexpr std::size_t kMaxTileElems = static_cast<std::size_t>(kTileElems<T> * (kTileElems<T> + Block<T>::B));

#if defined(__SSE2__)
constexpr const char* kBlockKind = "SSE2 register";
#else
constexpr const char* kBlockKind = "scalar";
#endif

// One tile: d[j*ldd + i] = s[i*lds + j] for i < rows, j < cols.
template <typename T>
void move_tile(const T* __restrict__ s, std::size_t lds, T* __restrict__ d, std::size_t ldd, std::size_t rows,
               std::size_t cols) {
  constexpr auto B = static_cast<std::size_t>(Block<T>::B);
  const std::size_t rb = rows / B * B, cb = cols / B * B;
  for (std::size_t i = 0; i < rb; i += B) {
    for (std::size_t j = 0; j < cb; j += B) Block<T>::move(s + i * lds + j, lds, d + j * ldd + i, ldd);
    for (std::size_t j = cb; j < cols; ++j)
      for (std::size_t ii = i; ii < i + B; ++ii) d[j * ldd + ii] = s[ii * lds + j];
  }
  for (std::size_t i = rb; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) d[j * ldd + i] = s[i * lds + j];
}

// d[0, n) = s[0, n), for rows of a tile.
template <typename T>
void copy_row(const T* __restrict__ s, T* __restrict__ d, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
}

// The per-image matrix of a layout problem: [R, K] -> [K, R].
std::pair<std::int64_t, std::int64_t> matrix_of(const Shape& s) {
  const std::int64_t hw = s.H * s.W;
  return s.kind == Kind::nchw_to_nhwc ? std::make_pair(s.C, hw) : std::make_pair(hw, s.C);
}

// Tile rows x columns for an [R, K] matrix: T0 x T0 (T0 = kTileElems), or, along an axis shorter than
// that, the whole axis, with the other axis lengthened (in register blocks) to about T0^2 elements,
// so that C = 3 or H*W = 7 still moves long runs. At most T0^2 + B*T0 elements: kMaxTileElems.
template <typename T>
std::pair<std::int64_t, std::int64_t> tile_of(std::int64_t R, std::int64_t K) {
  constexpr std::int64_t T0 = kTileElems<T>, B = Block<T>::B;
  const auto longer = [](std::int64_t shorter) { return (T0 * T0 / shorter + B - 1) / B * B; };
  if (R >= T0 && K >= T0) return {T0, T0};
  if (R <= K) return {R, std::min(K, longer(R))};
  return {std::min(R, longer(K)), K};
}

template <typename T>
void transpose_images(const T* src, T* dst, std::int64_t N, std::int64_t R, std::int64_t K, int threads, bool stream) {
  const auto [tr, tk] = tile_of<T>(R, K);
  const std::int64_t rows = (R + tr - 1) / tr, cols = (K + tk - 1) / tk;
  const auto r = static_cast<std::size_t>(R), k = static_cast<std::size_t>(K);
  HOTOPS_CHECK(static_cast<std::size_t>(tr * tk) <= kMaxTileElems<T>, "transpose tile larger than its buffer");
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#pragma omp for collapse(3) schedule(static)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t a = 0; a < rows; ++a)
        for (std::int64_t b = 0; b < cols; ++b) {
          const auto i0 = static_cast<std::size_t>(a * tr), j0 = static_cast<std::size_t>(b * tk);
          const std::size_t image = static_cast<std::size_t>(n) * r * k;
          const std::size_t th = std::min<std::size_t>(tr, r - i0), tw = std::min<std::size_t>(tk, k - j0);
          // Transposed into the L1-resident buffer (rows of th elements), then out row by row, or,
          // when the tile spans whole output rows, in one piece that may be streamed.
          alignas(64) T buf[kMaxTileElems<T>];
          move_tile(src + image + i0 * k + j0, k, buf, th, th, tw);
          T* d = dst + image + j0 * r + i0;
          if (stream && th == r) cpu::stream_copy(d, buf, tw * th * sizeof(T));
          else
            for (std::size_t j = 0; j < tw; ++j) copy_row(buf + j * th, d + j * r, th);
        }
    if (stream) cpu::stream_fence();
  }
}

// ---- hotops' dtype conversion -------------------------------------------------------------------
// One pass in OpenMP chunks; each chunk a plain loop that GCC vectorises, compiled for AVX-512, AVX2
// and baseline x86-64 (target_clones; see kernels/gelu/cpu_hotops.cpp), rounding to nearest even
// with NaN kept quiet (hotops::float_to_bf16's rule). Large outputs go through an L1 block and
// streaming stores.

HOTOPS_CPU_CLONES void f32_to_bf16_span(const float* __restrict__ in, std::uint16_t* __restrict__ out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = vec::f32_to_bf16(in[i]);
}
HOTOPS_CPU_CLONES void bf16_to_f32_span(const std::uint16_t* __restrict__ in, float* __restrict__ out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = vec::bf16_to_f32(in[i]);
}

constexpr std::size_t kConvertChunk = std::size_t(1) << 15;  // elements per OpenMP chunk
constexpr std::size_t kConvertBlock = std::size_t(1) << 11;  // elements per L1 block when streaming

template <typename In, typename Out>
void convert_chunks(const In* src, Out* dst, std::size_t n, int threads, bool stream,
                    void (*span)(const In*, Out*, std::size_t)) {
  const auto chunks = static_cast<std::int64_t>((n + kConvertChunk - 1) / kConvertChunk);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    alignas(64) Out block[kConvertBlock];
#pragma omp for schedule(static)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::size_t begin = static_cast<std::size_t>(c) * kConvertChunk, end = std::min(n, begin + kConvertChunk);
      if (!stream) {
        span(src + begin, dst + begin, end - begin);
        continue;
      }
      for (std::size_t b = begin; b < end; b += kConvertBlock) {
        const std::size_t count = std::min(kConvertBlock, end - b);
        span(src + b, block, count);
        cpu::stream_copy(dst + b, block, count * sizeof(Out));
      }
    }
    if (stream) cpu::stream_fence();
  }
}

class CpuConvert final : public Plan {
 public:
  explicit CpuConvert(const Shape& s) : s_(s), threads_(threads_for(s_.src_bytes())) {}

  void run(const Args& a) override { convert_dtype(s_, a.src, a.dst, threads_); }

  std::string label() const override {
    return std::string("hotops ") + kind_name(s_.kind) + " loop, " + vec::clone_name() +
           (s_.dst_bytes() >= cpu::kStreamMinBytes ? ", streaming stores, " : ", ") + std::to_string(threads_) +
           " of " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  int threads_;
};

class CpuTranspose final : public Plan {
 public:
  explicit CpuTranspose(const Shape& s) : s_(s), threads_(threads_for(s_.src_bytes())) {}

  void run(const Args& a) override { transpose_layout(s_, a.src, a.dst, threads_); }

  std::string label() const override {
    const auto [tr, tk] = transpose_tile(s_);
    const bool streamed = s_.dst_bytes() >= cpu::kStreamMinBytes && tr == matrix_of(s_).first;
    return "hotops tiled transpose, " + std::to_string(tr) + "x" + std::to_string(tk) + " tiles of " +
           (dtype_size(s_.src) == 4 ? "4x4 " : "8x8 ") + kBlockKind + " blocks, " +
           (streamed ? "streaming stores, " : "") + std::to_string(threads_) +
           " of " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  int threads_;
};

// The reorder's source and destination descriptors: [N,C,H,W] in two plain layouts, or a vector
// of `count` elements in two dtypes.
dnnl::reorder::primitive_desc descriptors(const Shape& s) {
  memory::desc src, dst;
  if (s.is_layout()) {
    const memory::dims dims{s.N, s.C, s.H, s.W};
    const bool to_nhwc = s.kind == Kind::nchw_to_nhwc;
    src = cpu::md(dims, s.src, to_nhwc ? tag::nchw : tag::nhwc);
    dst = cpu::md(dims, s.dst, to_nhwc ? tag::nhwc : tag::nchw);
  } else {
    const memory::dims dims{static_cast<memory::dim>(s.count)};
    src = cpu::md(dims, s.src, tag::a);
    dst = cpu::md(dims, s.dst, tag::a);
  }
  dnnl::engine& eng = cpu::engine();
  return HOTOPS_CHECK_DNNL(dnnl::reorder::primitive_desc(eng, src, eng, dst));
}

class CpuReorder final : public Plan {
 public:
  explicit CpuReorder(const Shape& s)
      : pd_(descriptors(s)),
        prim_(dnnl::reorder(pd_), {{DNNL_ARG_FROM, pd_.src_desc()}, {DNNL_ARG_TO, pd_.dst_desc()}}) {}

  void run(const Args& a) override { prim_.run({a.src, a.dst}); }

  std::string label() const override {
    return cpu::with_threads("oneDNN reorder " + std::string(pd_.impl_info_str()));
  }

 private:
  dnnl::reorder::primitive_desc pd_;
  cpu::Primitive prim_;
};

}  // namespace

void convert_dtype(const Shape& s, const void* src, void* dst, int threads) {
  const bool stream = s.dst_bytes() >= cpu::kStreamMinBytes;
  if (s.kind == Kind::f32_to_bf16)
    convert_chunks(static_cast<const float*>(src), static_cast<std::uint16_t*>(dst), s.count, threads, stream,
                   f32_to_bf16_span);
  else if (s.kind == Kind::bf16_to_f32)
    convert_chunks(static_cast<const std::uint16_t*>(src), static_cast<float*>(dst), s.count, threads, stream,
                   bf16_to_f32_span);
  else
    throw Error(std::string("hotops' conversion does f32 <-> bf16 only, not ") + kind_name(s.kind));
}

void transpose_layout(const Shape& s, const void* src, void* dst, int threads) {
  HOTOPS_CHECK(s.is_layout() && s.src == s.dst, std::string("hotops' transpose does layouts only, not ") + kind_name(s.kind));
  const auto [R, K] = matrix_of(s);
  const bool stream = s.dst_bytes() >= cpu::kStreamMinBytes;
  if (dtype_size(s.src) == 4)
    transpose_images(static_cast<const std::uint32_t*>(src), static_cast<std::uint32_t*>(dst), s.N, R, K, threads, stream);
  else if (dtype_size(s.src) == 2)
    transpose_images(static_cast<const std::uint16_t*>(src), static_cast<std::uint16_t*>(dst), s.N, R, K, threads, stream);
  else
    throw Error(std::string("hotops' transpose has no ") + dtype_name(s.src) + " version", ErrorKind::unsupported);
}

std::pair<std::int64_t, std::int64_t> transpose_tile(const Shape& s) {
  const auto [R, K] = matrix_of(s);
  return dtype_size(s.src) == 4 ? tile_of<std::uint32_t>(R, K) : tile_of<std::uint16_t>(R, K);
}

std::string cpu_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  if (s.is_raw() || (has_cpu_impls(s.kind) && s.impl == CpuImpl::hotops)) return "";
  const std::string what = std::string(dtype_name(s.src)) + " -> " + dtype_name(s.dst) + " " + kind_name(s.kind);
  return cpu::onednn_unsupported_reason([&] { descriptors(s); }, what + " reorder");
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.kind == Kind::memcpy) return std::make_unique<CpuMemcpy>(s);
  HOTOPS_CHECK(!s.is_raw(), std::string("copy kind ") + kind_name(s.kind) + " has no CPU version");
  if (s.impl == CpuImpl::hotops) {
    if (s.is_layout()) return std::make_unique<CpuTranspose>(s);
    return std::make_unique<CpuConvert>(s);
  }
  return std::make_unique<CpuReorder>(s);
}

}  // namespace hotops::copy
