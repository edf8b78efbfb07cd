// The shared GPU helpers on their own: the cublasLt GEMM matmul, lstm_cell and the models use
// (hotops/cublaslt_gemm.h), the step graph, gpu::copy and DeviceBuffer's shuffled layout
// (hotops/cuda_util.h). Skipped without a GPU, except the GEMM's layouts, which are host data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hotops/check.h"
#include "hotops/gpu.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#endif

namespace hotops {
namespace {

#ifdef HOTOPS_HAVE_CUDA
std::vector<float> small_values(std::size_t n, int salt) {  // multiples of 1/2 in [-3, 3]: exact sums
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 7 + salt * 3) % 13) - 6) * 0.5f;
  return v;
}

gpu::DeviceBuffer upload(const std::vector<float>& v) {
  gpu::DeviceBuffer d(v.size() * sizeof(float));
  gpu::copy(d.get(), v.data(), d.bytes(), cudaMemcpyHostToDevice);
  return d;
}

std::vector<float> download(const gpu::DeviceBuffer& d) {
  std::vector<float> v(d.bytes() / sizeof(float));
  gpu::copy(v.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost);
  return v;
}

// Each operand's rows and columns follow its operation; leading dimensions and batch strides left at 0
// are the packed ones, given ones are kept.
TEST(CudaUtil, LtGemmLayoutsFollowTheOperationsAndResolvePacking) {
  gpu::GemmDesc d;
  d.m = 5, d.n = 3, d.k = 7, d.batch = 4;
  gpu::GemmLayouts l = gpu::gemm_layouts(d);
  auto expect = [](const gpu::MatrixLayout& got, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride,
                   const char* what) {
    EXPECT_EQ(got.rows, rows) << what;
    EXPECT_EQ(got.cols, cols) << what;
    EXPECT_EQ(got.ld, ld) << what;
    EXPECT_EQ(got.stride, stride) << what;
  };
  expect(l.a, 5, 7, 5, 35, "packed A");
  expect(l.b, 7, 3, 7, 21, "packed B");
  expect(l.d, 5, 3, 5, 15, "packed D");

  d.opa = CUBLAS_OP_T, d.opb = CUBLAS_OP_T, d.lda = 9, d.ldd = 8, d.stride_a = 100, d.stride_b = 50;
  l = gpu::gemm_layouts(d);
  expect(l.a, 7, 5, 9, 100, "A transposed, ld and stride given");
  expect(l.b, 3, 7, 3, 50, "B transposed, stride given");
  expect(l.d, 5, 3, 8, 24, "D with ld given");
}

// D = op(A) op(B) + bias + C (beta 1), column-major, A transposed, with leading dimensions larger
// than the rows; then the same with a ReLU epilogue and no C. Values are exact in f32.
TEST(CudaUtil, LtGemmMatchesTheHostProduct) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const std::int64_t m = 5, n = 3, k = 7, lda = k + 2, ldb = k + 1, ldd = m + 3;
  const std::vector<float> a = small_values(static_cast<std::size_t>(lda * m), 1);  // stored k x m (op T)
  const std::vector<float> b = small_values(static_cast<std::size_t>(ldb * n), 2);  // stored k x n
  const std::vector<float> bias = small_values(static_cast<std::size_t>(m), 3);
  const std::vector<float> c = small_values(static_cast<std::size_t>(ldd * n), 4);
  const gpu::DeviceBuffer da = upload(a), db = upload(b), dbias = upload(bias), dc = upload(c);
  for (const bool relu : {false, true}) {
    gpu::GemmDesc desc;
    desc.opa = CUBLAS_OP_T, desc.opb = CUBLAS_OP_N, desc.m = m, desc.n = n, desc.k = k;
    desc.lda = lda, desc.ldb = ldb, desc.ldd = ldd;
    desc.bias = dbias.get(), desc.relu = relu, desc.beta = relu ? 0.f : 1.f;
    const gpu::LtGemm g(desc, "test");
    gpu::DeviceBuffer dd(static_cast<std::size_t>(ldd * n) * sizeof(float));
    HOTOPS_CHECK_CUDA(cudaMemset(dd.get(), 0, dd.bytes()));
    g.run(da.get(), db.get(), dd.get(), relu ? nullptr : dc.get());
    const std::vector<float> d = download(dd);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        double want = bias[static_cast<std::size_t>(i)];
        for (std::int64_t p = 0; p < k; ++p)
          want += static_cast<double>(a[static_cast<std::size_t>(i * lda + p)]) * b[static_cast<std::size_t>(j * ldb + p)];
        if (relu) want = want > 0 ? want : 0;
        else want += c[static_cast<std::size_t>(j * ldd + i)];
        EXPECT_EQ(d[static_cast<std::size_t>(j * ldd + i)], static_cast<float>(want)) << "relu " << relu << " at " << i << "," << j;
      }
    EXPECT_NE(g.algo_label().find("algo "), std::string::npos) << g.algo_label();
  }
}

// An autotuned GEMM (GemmDesc::autotune: heuristic algorithms and split-K variants timed at setup)
// with a long k, where split-K is among the candidates: whatever it chose, the product is exact (the
// values' sums are exact in f32 in any order), bias and C included, and the GEMM runs again.
TEST(CudaUtil, AutotunedLtGemmIsExact) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const std::int64_t m = 96, n = 64, k = 4096;
  const std::vector<float> a = small_values(static_cast<std::size_t>(m * k), 5);  // m x k
  const std::vector<float> b = small_values(static_cast<std::size_t>(k * n), 6);  // k x n
  const std::vector<float> bias = small_values(static_cast<std::size_t>(m), 7);
  const std::vector<float> c = small_values(static_cast<std::size_t>(m * n), 8);
  const gpu::DeviceBuffer da = upload(a), db = upload(b), dbias = upload(bias), dc = upload(c);
  gpu::DeviceBuffer dd(static_cast<std::size_t>(m * n) * sizeof(float));
  gpu::GemmDesc desc;
  desc.m = m, desc.n = n, desc.k = k, desc.bias = dbias.get(), desc.beta = 1.f, desc.autotune = true;
  const gpu::BoundGemm g(desc, "test", da.get(), db.get(), dd.get(), dc.get());
  for (int pass = 0; pass < 2; ++pass) {
    HOTOPS_CHECK_CUDA(cudaMemset(dd.get(), 0xFF, dd.bytes()));  // NaN: a result not written shows
    g.run();
    const std::vector<float> d = download(dd);
    int bad = 0;
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        double want = bias[static_cast<std::size_t>(i)] + c[static_cast<std::size_t>(j * m + i)];
        for (std::int64_t p = 0; p < k; ++p)
          want += static_cast<double>(a[static_cast<std::size_t>(p * m + i)]) * b[static_cast<std::size_t>(j * k + p)];
        if (d[static_cast<std::size_t>(j * m + i)] != static_cast<float>(want) && ++bad <= 3)
          ADD_FAILURE() << "pass " << pass << " at " << i << "," << j << ": " << d[static_cast<std::size_t>(j * m + i)] << " vs " << want
                        << " (" << g.algo_label() << ")";
      }
    EXPECT_EQ(bad, 0) << g.algo_label();
  }
  EXPECT_NE(g.algo_label().find("splitK "), std::string::npos) << g.algo_label();
}

// An autotune runs once per problem per process: a second GEMM of the same description and
// operand alignments takes the first one's algorithm, another description tunes again.
TEST(CudaUtil, AutotunedLtGemmTunesOncePerProblem) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const std::int64_t m = 64, n = 48, k = 1024;
  const gpu::DeviceBuffer da = upload(small_values(static_cast<std::size_t>(m * k), 1));
  const gpu::DeviceBuffer db = upload(small_values(static_cast<std::size_t>(k * n), 2));
  gpu::DeviceBuffer dd(static_cast<std::size_t>(m * n) * sizeof(float));
  gpu::GemmDesc desc;
  desc.m = m, desc.n = n, desc.k = k, desc.autotune = true;
  const int before = gpu::lt_gemm_tunings();
  const gpu::BoundGemm first(desc, "test", da.get(), db.get(), dd.get());
  EXPECT_EQ(gpu::lt_gemm_tunings() - before, 1);
  const gpu::BoundGemm again(desc, "test", da.get(), db.get(), dd.get());
  EXPECT_EQ(gpu::lt_gemm_tunings() - before, 1);
  EXPECT_EQ(again.algo_label(), first.algo_label());
  desc.n = 32;
  const gpu::BoundGemm other(desc, "test", da.get(), db.get(), dd.get());
  EXPECT_EQ(gpu::lt_gemm_tunings() - before, 2);
}

// The autotuners' timing of one call: a call of kLongCallMs or more is timed alone (3 sizing calls,
// then 3 batches of one), a shorter one in batches of three (3 + 9 calls); either way the time is
// the call's. The call here is a spin of known device time.
TEST(CudaUtil, BestBatchTimesLongCallsAloneAndShortOnesInThrees) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (const double ms : {2.0, 0.05}) {
    int calls = 0;
    const float t = gpu::best_batch_ms([&] {
      gpu::hold(ms * 1e-3);
      ++calls;
    });
    EXPECT_EQ(calls, ms >= gpu::kLongCallMs ? 6 : 12) << ms << " ms a call";
    EXPECT_GE(t, 0.95 * ms) << ms << " ms a call";
    EXPECT_LE(t, 1.5 * ms) << ms << " ms a call";
  }
}

// A captured step replays; a body that throws, or that makes a call a capture refuses, leaves no
// graph, says why, and leaves the stream usable.
TEST(CudaUtil, StepGraphReplaysAndFailsCleanly) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  gpu::DeviceBuffer buf(256);
  gpu::StepGraph g;
  ASSERT_TRUE(g.capture([&] { HOTOPS_CHECK_CUDA(cudaMemsetAsync(buf.get(), 0x3c, buf.bytes(), gpu::stream())); }, &why)) << why;
  ASSERT_TRUE(static_cast<bool>(g));
  HOTOPS_CHECK_CUDA(cudaMemsetAsync(buf.get(), 0, buf.bytes(), gpu::stream()));
  g.launch();
  unsigned char host[256];
  gpu::copy(host, buf.get(), sizeof host, cudaMemcpyDeviceToHost);
  EXPECT_EQ(host[0], 0x3c);
  EXPECT_EQ(host[255], 0x3c);

  EXPECT_FALSE(g.capture([] { throw Error("planted failure"); }, &why));
  EXPECT_FALSE(static_cast<bool>(g));
  EXPECT_NE(why.find("planted failure"), std::string::npos) << why;

  why.clear();
  EXPECT_FALSE(g.capture([] { HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream())); }, &why));
  EXPECT_FALSE(why.empty());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  HOTOPS_CHECK_CUDA(cudaStreamIsCapturing(gpu::stream(), &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  HOTOPS_CHECK_CUDA(cudaMemsetAsync(buf.get(), 0x11, buf.bytes(), gpu::stream()));
  gpu::copy(host, buf.get(), sizeof host, cudaMemcpyDeviceToHost);
  EXPECT_EQ(host[7], 0x11);
}

// gpu::copy waits for the work queued on hotops' stream before it reads, which a plain cudaMemcpy
// (the legacy stream, which the non-blocking stream() does not synchronize with) did not: model_cnn's
// verification once read ReLU hints that a kernel had not finished writing. Some milliseconds of
// memsets, the last one writing the pattern, then the copy right behind them.
TEST(CudaUtil, CopyWaitsForTheStream) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  gpu::DeviceBuffer big(std::size_t{1} << 30);
  constexpr std::size_t kTail = 4096;
  unsigned char* tail = big.as<unsigned char>() + big.bytes() - kTail;
  for (int i = 0; i < 16; ++i) HOTOPS_CHECK_CUDA(cudaMemsetAsync(big.get(), i, big.bytes(), gpu::stream()));
  HOTOPS_CHECK_CUDA(cudaMemsetAsync(tail, 0x5a, kTail, gpu::stream()));
  std::vector<unsigned char> host(kTail, 0);
  gpu::copy(host.data(), tail, kTail, cudaMemcpyDeviceToHost);
  EXPECT_EQ(host.front(), 0x5a);
  EXPECT_EQ(host.back(), 0x5a);
  // And an upload lands before the work queued after it reads it.
  std::vector<unsigned char> pattern(kTail, 0xc3);
  gpu::copy(tail, pattern.data(), kTail, cudaMemcpyHostToDevice);
  gpu::DeviceBuffer small(kTail);
  HOTOPS_CHECK_CUDA(cudaMemcpyAsync(small.get(), tail, kTail, cudaMemcpyDeviceToDevice, gpu::stream()));
  gpu::copy(host.data(), small.get(), kTail, cudaMemcpyDeviceToHost);
  EXPECT_EQ(host[kTail / 2], 0xc3);
}
// --hotops_shuffle_layout: each buffer sits at a fresh random offset into a larger allocation (what
// hotops holds grows by more than the buffers), drawn again for every buffer; data, poison() and
// moves work as unshifted, and freeing returns every byte. Off: exactly the buffers' bytes.
// Turns the shuffled layout off again when a test ends.
struct LayoutOffAfter {
  ~LayoutOffAfter() { gpu::set_shuffle_layout(false); }
};

TEST(CudaUtil, ShuffledLayoutMovesBuffersAndKeepsTheirData) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const LayoutOffAfter off;
  constexpr std::size_t kBytes = 256 << 10;
  const std::size_t held0 = gpu::memory().held;
  {
    gpu::DeviceBuffer a(kBytes), b(kBytes);
    EXPECT_EQ(gpu::memory().held - held0, 2 * kBytes);
  }
  gpu::set_shuffle_layout(true);
  std::vector<std::size_t> extra;
  for (int i = 0; i < 8; ++i) {
    gpu::DeviceBuffer d(kBytes);
    extra.push_back(gpu::memory().held - held0 - kBytes);
    EXPECT_EQ(extra.back() % (64 << 10), 0u);
  }
  std::sort(extra.begin(), extra.end());
  EXPECT_GT(std::unique(extra.begin(), extra.end()) - extra.begin(), 1) << "eight buffers, one offset";
  EXPECT_EQ(gpu::memory().held, held0);
  {
    const std::vector<float> va = small_values(kBytes / 4, 1), vb = small_values(kBytes / 4, 2);
    gpu::DeviceBuffer a = upload(va), b = upload(vb), c(kBytes);
    EXPECT_GT(gpu::memory().held - held0, 3 * kBytes);
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(c.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, gpu::stream()));
    a.poison();
    EXPECT_EQ(download(c), va);
    EXPECT_EQ(download(b), vb);
    const std::vector<float> poisoned = download(a);
    EXPECT_TRUE(std::isnan(poisoned.front()) && std::isnan(poisoned.back()));
    gpu::DeviceBuffer moved = std::move(b);
    b = std::move(c);
    EXPECT_EQ(download(moved), vb);
    EXPECT_EQ(download(b), va);
  }
  EXPECT_EQ(gpu::memory().held, held0);
}
// The shuffled layout's draws come from the seed bench sets before each setup: the same seed
// places a sequence of buffers alike, another seed otherwise.
TEST(CudaUtil, ShuffledLayoutDrawsFromItsSeed) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const LayoutOffAfter off;
  gpu::set_shuffle_layout(true);
  constexpr std::size_t kBytes = 256 << 10;
  auto offsets = [&](std::uint64_t seed) {
    gpu::seed_layout(seed);
    const std::size_t held0 = gpu::memory().held;
    std::vector<std::size_t> out;
    for (int i = 0; i < 8; ++i) {
      gpu::DeviceBuffer d(kBytes);
      out.push_back(gpu::memory().held - held0 - kBytes);
    }
    return out;
  };
  const std::vector<std::size_t> a = offsets(7), b = offsets(7), c = offsets(8);
  EXPECT_EQ(a, b) << "one seed, two placements";
  EXPECT_NE(a, c) << "two seeds, one placement";
}
#else
TEST(CudaUtil, BuiltWithoutCuda) { GTEST_SKIP() << "this build of hotops has no CUDA backend"; }
#endif

}  // namespace
}  // namespace hotops
