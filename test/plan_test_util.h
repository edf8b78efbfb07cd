// What the op families' plan tests share: one plan run on two sets of caller-owned tensors in turn,
// a CPU plan that keeps OpenMP's thread pool, the planted bugs of a bias gradient, and a misaligned
// device copy of a tensor, and the reference that the entries of one problem share.
#pragma once
#include <dirent.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/verify.h"

namespace hotops::plan_test {

// The reference of a problem is computed once for its entries (shared_reference): a second case of
// problems[0] computes none, problems[1] its own, problems[0]'s is still kept after it, and (where
// there is a GPU) problems[0]'s CUDA entry, on the same seeded inputs, computes none. Every case
// verifies.
inline void expect_entries_share_one_reference(const Family& f, const std::vector<Problem>& problems) {
  ASSERT_GE(problems.size(), 2u);
  const Problem& first = problems[0];
  const std::size_t before = shared_reference_computations();
  EXPECT_TRUE(f.make(first)->verify().ok);
  EXPECT_EQ(shared_reference_computations(), before + 1);
  EXPECT_TRUE(f.make(first)->verify().ok);
  EXPECT_EQ(shared_reference_computations(), before + 1) << "a second case of the problem computed the reference again";
  const Problem& other = problems[1];
  ASSERT_NE(other.name(), first.name());
  EXPECT_TRUE(f.make(other)->verify().ok);
  EXPECT_EQ(shared_reference_computations(), before + 2);
  EXPECT_TRUE(f.make(first)->verify().ok);
  EXPECT_EQ(shared_reference_computations(), before + 2) << "the first problem's reference was not kept";
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << "the CUDA entry: " << why;
  Problem cuda = first;
  cuda.backend = Backend::cuda;
  EXPECT_TRUE(f.make(cuda)->verify().ok);
  EXPECT_EQ(shared_reference_computations(), before + 2) << "the CUDA entry computed the reference again";
}

// Runs `plan` on the tensors of set 0, then of set 1 (`args_of(k)`: set k's Args, its outputs
// poisoned), and expects each set's outputs to pass against its own inputs (`check(k, k)`) and set
// 0's to fail against set 1's inputs (`check(1, 0)`): a plan that kept the first pointers would write
// the second result into the first. `what` names the case in a failure.
template <class P, class ArgsOf, class CheckOf>
void expect_each_run_on_its_own_tensors(P& plan, ArgsOf args_of, CheckOf check, const std::string& what) {
  for (int k = 0; k < 2; ++k) plan.run(args_of(k));
  for (int k = 0; k < 2; ++k) {
    const Check c = check(k, k);
    EXPECT_TRUE(c.ok) << what << " " << k << ": " << c.message;
  }
  EXPECT_FALSE(check(1, 0).ok) << what;
}

// The ids of this process's threads.
inline std::set<std::string> thread_ids() {
  std::set<std::string> ids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ids.insert(e->d_name);
    closedir(d);
  }
  return ids;
}

// Runs `run` (a CPU plan's run) between OpenMP regions of a full team of 4 threads, and expects the
// same threads after as before: a region of a smaller team in between would end libgomp's surplus
// threads, and the next full region would start new ones (hotops/cpu.h).
template <class Run>
void expect_keeps_thread_pool(Run run, const std::string& what) {
  cpu::ThreadScope scope(4);
  const auto full_team = [] {
    int n = 0;
#pragma omp parallel num_threads(cpu::threads()) reduction(+ : n)
    n += 1;
    return n;
  };
  ASSERT_EQ(full_team(), 4);
  const std::set<std::string> before = thread_ids();
  for (int k = 0; k < 3; ++k) {
    run();
    full_team();
  }
  EXPECT_EQ(thread_ids(), before) << what << ": a parallel region between two full ones ran on a smaller team";
}

// Wrong column sums of a row-major [rows, cols] tensor t, the planted bugs a bias gradient's check
// must catch: `sums` with column `col`'s largest |t| left out of it; and the column sums of `other`
// (the op's input in place of its output).
inline HostBuffer without_largest(const HostBuffer& t, const HostBuffer& sums, std::size_t rows, std::size_t cols, std::size_t col) {
  std::size_t largest = 0;
  for (std::size_t r = 0; r < rows; ++r)
    if (std::fabs(t.get(r * cols + col)) > std::fabs(t.get(largest * cols + col))) largest = r;
  HostBuffer out = sums;
  out.set(col, sums.get(col) - t.get(largest * cols + col));
  return out;
}
inline HostBuffer column_sums_of(const HostBuffer& other, std::size_t rows, std::size_t cols) {
  HostBuffer out(DType::f32, cols);
  for (std::size_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (std::size_t r = 0; r < rows; ++r) sum += other.get(r * cols + c);
    out.set(c, sum);
  }
  return out;
}

// A device copy of t whose first element sits `shift` elements past the allocation's start (a
// misaligned tensor: a CUDA kernel's path without 16-byte vectors); data() is that element.
class ShiftedOnDevice {
 public:
  ShiftedOnDevice(const HostBuffer& t, std::size_t shift) : offset_(shift * dtype_size(t.dtype())), dev_(padded(t, shift)) {}
  void* data() const { return static_cast<std::byte*>(dev_.get()) + offset_; }

 private:
  static HostBuffer padded(const HostBuffer& t, std::size_t shift) {
    HostBuffer out(t.dtype(), t.count() + shift);
    std::memcpy(static_cast<std::byte*>(out.data()) + shift * dtype_size(t.dtype()), t.data(), t.bytes());
    return out;
  }
  std::size_t offset_;
  gpu::DeviceBuffer dev_;
};

}  // namespace hotops::plan_test

// Two tests of a plan, Suite.Cpu<Name> and Suite.Cuda<Name> (the latter only in a CUDA build, skipped
// with the reason where no GPU can run it), each calling `check(backend)`.
#ifdef HOTOPS_HAVE_CUDA
#define HOTOPS_CUDA_PLAN_TEST(Suite, Name, check)    \
  TEST(Suite, Cuda##Name) {                          \
    std::string why;                                 \
    if (!::hotops::gpu::available(&why)) GTEST_SKIP() << why; \
    check(::hotops::Backend::cuda);                  \
  }
#else
#define HOTOPS_CUDA_PLAN_TEST(Suite, Name, check)
#endif
#define HOTOPS_PLAN_TESTS(Suite, Name, check)                              \
  TEST(Suite, Cpu##Name) { check(::hotops::Backend::cpu); }                \
  HOTOPS_CUDA_PLAN_TEST(Suite, Name, check)
