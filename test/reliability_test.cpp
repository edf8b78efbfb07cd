// What hotops guarantees when numbers, memory or the GPU go wrong (docs/guarantees.md): NaN and Inf
// fail verification wherever they appear, inputs follow the seed, and resource errors say what
// they need. The fault tests that lose the CUDA context run the bench binary (bench_smoke_test).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "hotops/problem.h"
#include "hotops/verify.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/cuda_util.h"
#endif

namespace hotops {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// An output equal to its reference (i * 0.25 - 3, exact in every dtype) except where a test injects
// a value, checked element by element as the families do.
struct Fixture {
  HostBuffer out;
  std::vector<double> ref;
  explicit Fixture(DType t, std::size_t n = 64) : out(t, n), ref(n) {
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = static_cast<double>(i) * 0.25 - 3;
      out.set(i, ref[i]);
    }
  }
  Check check(double tol = 1e-6) const {
    return compare(out, sample_indices(out.count(), 4096, 1), [this](std::size_t i) { return ref[i]; }, tol);
  }
};

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

TEST(Verification, ExactOutputPasses) {
  for (DType t : kDtypes) {
    const Check c = Fixture(t).check();
    EXPECT_TRUE(c.ok) << dtype_name(t) << ": " << c.message;
    EXPECT_EQ(c.checked, 64u);
  }
}

TEST(Verification, NonFiniteOutputFailsNamingTheIndex) {
  for (DType t : kDtypes) {
    for (double bad : {kNaN, kInf, -kInf}) {
      for (std::size_t at : {std::size_t(0), std::size_t(17), std::size_t(63)}) {
        Fixture f(t);
        f.out.set(at, bad);
        const Check c = f.check(1e9);  // no tolerance lets a non-finite value through
        EXPECT_FALSE(c.ok) << dtype_name(t) << " " << bad << " at " << at;
        EXPECT_TRUE(std::isnan(c.max_err));
        EXPECT_NE(c.message.find("non-finite output"), std::string::npos) << c.message;
        EXPECT_NE(c.message.find("at index " + std::to_string(at) + " "), std::string::npos) << c.message;
      }
    }
  }
}

TEST(Verification, NonFiniteReferenceFailsNamingTheIndex) {
  for (double bad : {kNaN, kInf, -kInf}) {
    Fixture f(DType::f32);
    f.ref[29] = bad;  // the output is finite there: a NaN scale would have hidden it
    const Check c = f.check(1e9);
    EXPECT_FALSE(c.ok) << bad;
    EXPECT_NE(c.message.find("non-finite reference"), std::string::npos) << c.message;
    EXPECT_NE(c.message.find("at index 29 "), std::string::npos) << c.message;
  }
}

TEST(Verification, NaNOutputAgainstNaNReferenceFails) {
  Fixture f(DType::f32);
  f.out.set(5, kNaN);
  f.ref[5] = kNaN;
  const Check c = f.check(1e9);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("at index 5 "), std::string::npos) << c.message;
}

TEST(Verification, PoisonedOutputFailsInEveryDtype) {
  // What an op that writes nothing leaves behind: the poison, which must never pass.
  for (DType t : kDtypes) {
    Fixture f(t);
    f.out.poison();
    for (std::size_t i = 0; i < f.out.count(); ++i) ASSERT_TRUE(std::isnan(f.out.get(i))) << dtype_name(t) << " " << i;
    EXPECT_FALSE(f.check(1e9).ok) << dtype_name(t);
  }
}

TEST(Verification, SampledCheckSeesNonFiniteFirstAndLastElements) {
  // Large outputs are sampled; the first and last elements are always in the sample.
  for (std::size_t at : {std::size_t(0), std::size_t(99999)}) {
    Fixture f(DType::f32, 100000);
    f.out.set(at, kNaN);
    const Check c = compare(f.out, sample_indices(f.out.count(), 4096, 3), [&f](std::size_t i) { return f.ref[i]; }, 1e-6);
    EXPECT_FALSE(c.ok) << at;
    EXPECT_NE(c.message.find("at index " + std::to_string(at) + " "), std::string::npos) << c.message;
  }
}

TEST(Verification, MergedCheckKeepsTheFailure) {
  Fixture good(DType::f32), bad(DType::f32);
  bad.out.set(3, kInf);
  Check all = good.check();
  all.merge(bad.check(), "dx");
  EXPECT_FALSE(all.ok);
  EXPECT_TRUE(std::isnan(all.max_err));
  EXPECT_NE(all.message.find("dx: non-finite output"), std::string::npos) << all.message;
}

TEST(Verification, AnRmsBoundFailsAnErrorSpreadOverEveryElement) {
  // Every element off by half the per-element bound (a wrong term, not rounding): the per-element
  // bound alone passes it; with an rms bound of a quarter of it, it fails, naming both.
  Fixture f(DType::f32);
  double sumsq = 0;
  for (double r : f.ref) sumsq += r * r;
  const double rms = std::sqrt(sumsq / static_cast<double>(f.ref.size())), tol = 0.04;
  for (std::size_t i = 0; i < f.out.count(); ++i) f.out.set(i, f.ref[i] + (i % 2 ? 0.5 : -0.5) * tol * rms);
  const auto idx = sample_indices(f.out.count(), 64, 1);
  const auto ref = [&f](std::size_t i) { return f.ref[i]; };
  EXPECT_TRUE(compare(f.out, idx, ref, tol).ok);
  const Check c = compare(f.out, idx, ref, tol, tol / 4);
  EXPECT_FALSE(c.ok);
  EXPECT_NEAR(c.rms_err, 0.5 * tol, 1e-4);
  EXPECT_NE(c.message.find("rms(out-ref)/rms(ref)"), std::string::npos) << c.message;
  // The same error at a tenth of the size is within both bounds.
  for (std::size_t i = 0; i < f.out.count(); ++i) f.out.set(i, f.ref[i] + (i % 2 ? 0.05 : -0.05) * tol * rms);
  EXPECT_TRUE(compare(f.out, idx, ref, tol, tol / 4).ok);
}

// ---- seeds -------------------------------------------------------------------------------------

struct SeedGuard {
  std::uint64_t saved = global_seed();
  ~SeedGuard() { set_global_seed(saved); }
};

std::vector<float> filled(std::uint64_t seed, std::uint64_t stream, std::size_t n = 1000) {
  HostBuffer b(DType::f32, n);
  b.fill_uniform(seed, stream);
  return std::vector<float>(b.as<float>(), b.as<float>() + n);
}

TEST(Seeds, SameSeedSameInputsDifferentSeedDifferentInputs) {
  EXPECT_EQ(filled(7, 1), filled(7, 1));
  EXPECT_NE(filled(7, 1), filled(8, 1));
  EXPECT_NE(filled(7, 1), filled(7, 2));  // each input of a case has its own stream
  // Large fills are parallel: still a pure function of (seed, stream, index).
  EXPECT_EQ(filled(7, 1, 1 << 18), filled(7, 1, 1 << 18));
}

// A range of a flat buffer is seeded as a buffer of its own (a model's tensors in one parameter array).
TEST(Seeds, ARangeIsSeededAsABufferOfItsOwn) {
  HostBuffer flat(DType::f32, 5000);
  zero_bytes(flat.data(), flat.bytes());
  flat.fill_uniform_range(1000, 3000, 7, 1);
  EXPECT_EQ(std::vector<float>(flat.as<float>() + 1000, flat.as<float>() + 4000), filled(7, 1, 3000));
  EXPECT_EQ(flat.as<float>()[999], 0.f);
  EXPECT_EQ(flat.as<float>()[4000], 0.f);
  EXPECT_THROW(flat.fill_uniform_range(4000, 1001, 7, 1), Error);
}

TEST(Seeds, ProblemSeedFollowsTheGlobalSeedAndIgnoresTheBackend) {
  // Every family seeds its inputs with Problem::seed(), which --hotops_seed sets through the global seed.
  SeedGuard guard;
  Problem cpu{"addmm", Backend::cpu, DType::f32, Direction::fwd, {{"M", "8"}}};
  Problem cuda = cpu;
  cuda.backend = Backend::cuda;
  set_global_seed(7);
  const std::uint64_t a = cpu.seed();
  EXPECT_EQ(a, cuda.seed());  // both backends compute on the same numbers
  EXPECT_EQ(a, cpu.seed());
  set_global_seed(8);
  EXPECT_NE(a, cpu.seed());
  set_global_seed(7);
  EXPECT_EQ(a, cpu.seed());
}

// ---- resources ---------------------------------------------------------------------------------

TEST(Resources, HostMemoryIsKnown) {
  const HostMemory m = host_memory();
  EXPECT_GT(m.total, 0u);
  EXPECT_GT(m.available, 0u);
  EXPECT_LE(m.available, m.total);
}

// Large copies and zeroes run in parts on several threads: every byte, the short last part too.
TEST(Resources, LargeCopiesAndZeroesAreWhole) {
  const std::size_t n = (std::size_t(40) << 20) / sizeof(float) + 3;
  HostBuffer a(DType::f32, n);
  a.fill_uniform(3, 4, 1.f, 2.f);
  const HostBuffer b = a;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0);
  zero_bytes(a.data(), a.bytes());
  EXPECT_EQ(static_cast<std::size_t>(std::count(a.as<float>(), a.as<float>() + n, 0.f)), n);
  copy_bytes(a.data(), b.data(), b.bytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0);
}

// Inside a HugePageScope, allocations of 32 MiB and more come on 2 MiB pages (src/host_pages.cpp);
// outside one, and smaller ones, and the aligned forms, as the standard library's did; one too large
// for any machine is std::bad_alloc.
TEST(Resources, LargeAllocationsInAScopeAreOnHugePages) {
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's own allocator serves operator new in this build";
#endif
  const std::size_t doubles = (std::size_t(32) << 20) / sizeof(double);
  {
    const std::vector<double> outside(doubles);  // malloc's: a fresh mapping past its header
    EXPECT_NE(reinterpret_cast<std::uintptr_t>(outside.data()) % kHuge, 0u);
    const HugePageScope pages;
    const std::vector<double> large(doubles);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHuge, 0u);
    EXPECT_EQ(static_cast<std::size_t>(std::count(large.begin(), large.end(), 0.0)), large.size());
    const HostBuffer h(DType::f32, (std::size_t(64) << 20) / sizeof(float));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(h.data()) % kHuge, 0u);
  }
  EXPECT_FALSE(HugePageScope::active());
  for (std::size_t n : {std::size_t(1), std::size_t(1000), (std::size_t(32) << 20) - 8}) {
    std::vector<char> small(n, 'x');
    EXPECT_EQ(small.back(), 'x') << n;
    struct alignas(256) Wide {
      char c[256];
    };
    std::unique_ptr<Wide[]> w(new Wide[n / 256 + 1]);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.get()) % 256, 0u) << n;
  }
  EXPECT_THROW(static_cast<void>(std::vector<char>(std::numeric_limits<std::ptrdiff_t>::max() / 2)), std::bad_alloc);
  EXPECT_EQ(::operator new(std::numeric_limits<std::size_t>::max() / 4, std::nothrow), nullptr);
}

TEST(Resources, HostBuffersStartOnACacheLine) {
  // oneDNN's AVX-512 and AMX kernels read 64-byte rows of the buffers handed to them (a plan's
  // weight space among them): a row that straddles two cache lines costs two loads.
  for (std::size_t count : {1, 3, 1000, 1 << 20}) {
    HostBuffer a(DType::bf16, count), b(DType::f32, count);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u) << count;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 64, 0u) << count;
  }
}

TEST(Resources, TooLargeHostBufferSaysWhatItNeedsAndWhatIsAvailable) {
  for (std::size_t count : {std::size_t(1) << 48, std::numeric_limits<std::size_t>::max() / 2}) {
    try {
      HostBuffer b(DType::f32, count);  // 1 PiB; and a count whose byte size overflows size_t
      ADD_FAILURE() << "allocated " << count << " floats";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::out_of_memory);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("out of host memory: allocating "), std::string::npos) << msg;
      EXPECT_NE(msg.find("GiB available of"), std::string::npos) << msg;
    }
  }
}

// Two buffers that each fit what is available but not together: the second is refused with what the
// case needs together, though neither is touched (Linux would hand out both, and kill the process
// when it wrote them). Freed buffers leave the count.
TEST(Resources, ACaseBuffersAreAccountedTogether) {
  const std::size_t available = host_memory().available;
  ASSERT_GT(available, 0u);
  const std::size_t each = available / 10 * 6 / 4;  // floats: 60% of what is available
  begin_case_memory();
  {
    HostBuffer a(DType::f32, each);
    try {
      HostBuffer b(DType::f32, each);
      ADD_FAILURE() << "two buffers of 60% of the available memory were both allocated";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::out_of_memory);
      EXPECT_NE(std::string(e.what()).find("the case needs"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("together"), std::string::npos) << e.what();
    }
  }
  HostBuffer again(DType::f32, each);  // the first one is gone: this one fits
  end_case_memory();
}

TEST(Resources, WithoutGpuNothingIsLost) {
  if (gpu::available()) GTEST_SKIP() << "a GPU is present (the GPU tests below cover it)";
  EXPECT_FALSE(gpu::context_lost());
  EXPECT_EQ(gpu::memory().total, 0u);
  EXPECT_THROW(gpu::launch_test_fault("illegal_address"), Error);
}

#ifdef HOTOPS_HAVE_CUDA
TEST(GpuFaults, StickyErrorsAreTheContextCorruptingOnes) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorMisalignedAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                        cudaErrorIllegalInstruction, cudaErrorHardwareStackError, cudaErrorInvalidPc})
    EXPECT_TRUE(gpu::is_sticky(e)) << cudaGetErrorName(e);
  for (cudaError_t e : {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidConfiguration, cudaErrorInvalidValue,
                        cudaErrorNotSupported, cudaErrorNoDevice})
    EXPECT_FALSE(gpu::is_sticky(e)) << cudaGetErrorName(e);
}

TEST(GpuFaults, FailedLaunchLeavesTheContextUsable) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  try {
    gpu::launch_test_fault("bad_launch");
    ADD_FAILURE() << "an invalid launch configuration was accepted";
  } catch (const Error& e) {
    // The name depends on the driver: cudaErrorInvalidConfiguration, or cudaErrorInvalidValue on the
    // H100 host's.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("cudaErrorInvalidConfiguration") != std::string::npos ||
                what.find("cudaErrorInvalidValue") != std::string::npos)
        << what;
  }
  EXPECT_FALSE(gpu::context_lost(&why)) << why;
  HostBuffer in(DType::f32, 256), back(DType::f32, 256);
  in.fill_uniform(1, 1);
  gpu::DeviceBuffer d(in);
  d.download(back);
  EXPECT_EQ(std::memcmp(in.data(), back.data(), in.bytes()), 0);
}

TEST(GpuFaults, TooLargeDeviceBufferSaysWhatItNeedsAndWhatIsFree) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const gpu::DeviceBuffer held(std::size_t(1) << 20);
  try {
    gpu::DeviceBuffer b(std::size_t(1) << 50);
    ADD_FAILURE() << "allocated 1 PiB of GPU memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::out_of_memory);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of GPU memory: allocating 1048576.00 GiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the case needs at least"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB free of"), std::string::npos) << msg;
  }
  EXPECT_GE(gpu::memory().held, std::size_t(1) << 20);
  EXPECT_FALSE(gpu::context_lost(&why)) << why;  // an allocation failure is not sticky
}
#endif

// --hotops_cpu_ftz: on, every thread of a team flushes a subnormal product to zero and reads a
// subnormal input as zero, also in a larger team started after the mode was set; off, IEEE
// subnormals again in every thread.
TEST(CpuSubnormals, FlushedInEveryThreadAndRestored) {
  struct Off {
    ~Off() { cpu::set_flush_subnormals(false); }
  } restore;
  const volatile float tiny = 1e-30f, small = 1e-10f, subnormal = 1e-40f;
  ASSERT_GT(subnormal, 0.f);
  // Per thread of a `team`-thread region: tiny * small (a subnormal result) and subnormal * 1.
  const auto results = [&](int team) {
    std::vector<float> product(static_cast<std::size_t>(team), -1.f), input(product);
    std::vector<int> flushes(product.size(), -1);
#pragma omp parallel num_threads(team)
    {
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      product[t] = tiny * small;
      input[t] = subnormal * 1.f;
      flushes[t] = cpu::flushes_subnormals() ? 1 : 0;
    }
    return std::make_tuple(product, input, flushes);
  };
  const int n = std::max(2, cpu::threads());
  // The pool's threads exist before the mode is set, as after any earlier case's regions.
  std::vector<int> started(static_cast<std::size_t>(n + 2), 0);
#pragma omp parallel num_threads(n + 2)
  started[static_cast<std::size_t>(omp_get_thread_num())] = 1;
  cpu::set_flush_subnormals(true);
  EXPECT_TRUE(cpu::flushes_subnormals());
  for (const int team : {n, 1, n + 2}) {
    const auto [product, input, flushes] = results(team);
    for (int t = 0; t < team; ++t) {
      const auto i = static_cast<std::size_t>(t);
      EXPECT_EQ(product[i], 0.f) << "thread " << t << " of " << team;
      EXPECT_EQ(input[i], 0.f) << "thread " << t << " of " << team;
      EXPECT_EQ(flushes[i], 1) << "thread " << t << " of " << team;
    }
  }
  cpu::set_flush_subnormals(false);
  EXPECT_FALSE(cpu::flushes_subnormals());
  const auto [product, input, flushes] = results(n + 2);
  for (int t = 0; t < n + 2; ++t) {
    const auto i = static_cast<std::size_t>(t);
    EXPECT_GT(product[i], 0.f) << "thread " << t;
    EXPECT_EQ(input[i], subnormal) << "thread " << t;
    EXPECT_EQ(flushes[i], 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace hotops
