// The choices file (hotops/choices.h): what one process writes, the next reads; what is not its
// machine's, or not the format, is refused with one line.
#include "hotops/choices.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "hotops/check.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/cuda_util.h"
#include "hotops/cudnn_util.h"
#endif

namespace hotops {
namespace {

const std::string kMachine = "NVIDIA H200, driver 13.0, cuBLAS 13.1.0, cuDNN 9.14.0";

// A fresh file name in the temporary directory; the file is removed, and the store closed, at the end.
struct TempChoices {
  std::string path = ::testing::TempDir() + "hotops_choices_" + std::to_string(getpid()) + "_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  TempChoices() { std::remove(path.c_str()); }
  ~TempChoices() {
    open_choices("", "");
    std::remove(path.c_str());
  }
  void write(const std::string& text) const { std::ofstream(path) << text; }
};

struct Pick {
  std::int32_t algo;
  std::uint64_t workspace;
  float ms;
};

TEST(ChoicesFile, WhatOneProcessWritesTheNextReads) {
  const TempChoices f;
  ASSERT_EQ(open_choices(f.path, kMachine), "");
  Pick p{};
  EXPECT_FALSE(stored_choice("conv", "fwd|1,2,3", &p, sizeof p)) << "an empty file holds nothing";
  const Pick written{7, 1u << 20, 0.25f};
  store_choice("conv", "fwd|1,2,3", &written, sizeof written);
  store_choice("gemm", "fwd|1,2,3", &p, sizeof p);  // another kind under the same key
  ASSERT_EQ(open_choices(f.path, kMachine), "") << "a later process, reading it";
  Pick read{};
  ASSERT_TRUE(stored_choice("conv", "fwd|1,2,3", &read, sizeof read));
  EXPECT_EQ(read.algo, 7);
  EXPECT_EQ(read.workspace, 1u << 20);
  EXPECT_EQ(read.ms, 0.25f);
  EXPECT_FALSE(stored_choice("conv", "fwd|1,2,4", &read, sizeof read));
  EXPECT_THROW(stored_choice("conv", "fwd|1,2,3", &read, sizeof read - 1), Error) << "a choice of another build's size";
  open_choices("", "");
  EXPECT_FALSE(stored_choice("conv", "fwd|1,2,3", &read, sizeof read)) << "closed: nothing stored";
}

TEST(ChoicesFile, AnotherMachinesOrAMalformedFileIsRefusedInOneLine) {
  const TempChoices f;
  f.write("# made elsewhere\nmachine\tNVIDIA H100 80GB HBM3, driver 13.0, cuBLAS 13.1.0, cuDNN 9.14.0\n");
  std::string why = open_choices(f.path, kMachine);
  EXPECT_NE(why.find("timed on another machine (NVIDIA H100 80GB HBM3"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  f.write("conv\tkey\t00\n");
  why = open_choices(f.path, kMachine);
  EXPECT_NE(why.find("line 1 is not the machine line"), std::string::npos) << why;
  for (const char* line : {"conv\tkey\t0g", "conv\tkey\t012", "conv\tkey", "conv\tkey\t00\textra", "\tkey\t00"}) {
    f.write("machine\t" + kMachine + "\n" + line + "\n");
    why = open_choices(f.path, kMachine);
    EXPECT_NE(why.find("line 2 is not KIND<TAB>KEY<TAB>HEX"), std::string::npos) << line << ": " << why;
  }
  why = open_choices("/nonexistent-directory/choices", kMachine);
  EXPECT_NE(why.find("cannot write it"), std::string::npos) << why;
}

#ifdef HOTOPS_HAVE_CUDA
// The plans' caches of search results read and write the open file (no GPU needed: the cache is
// host code).
TEST(ChoicesFile, TheSearchCachesReadAndWriteIt) {
  const TempChoices f;
  ASSERT_EQ(open_choices(f.path, kMachine), "");
  gpu::ConvAlgo chosen;
  chosen.algo = 5, chosen.workspace = 4096, chosen.retimed_ms = 0.5f;
  {
    gpu::ChoiceCache<gpu::ConvAlgo> first("conv");
    first.add("fwd|32,64", chosen);
    EXPECT_EQ(first.searches(), 1);
    gpu::ConvAlgo again;
    bool from_file = true;
    ASSERT_TRUE(first.find("fwd|32,64", &again, &from_file));
    EXPECT_FALSE(from_file) << "this process's own search";
  }
  ASSERT_EQ(open_choices(f.path, kMachine), "");
  gpu::ChoiceCache<gpu::ConvAlgo> next("conv");  // a later process's
  gpu::ConvAlgo found;
  bool from_file = false;
  ASSERT_TRUE(next.find("fwd|32,64", &found, &from_file));
  EXPECT_TRUE(from_file);
  from_file = false;
  ASSERT_TRUE(next.find("fwd|32,64", &found, &from_file));
  EXPECT_TRUE(from_file) << "a variant of the problem, later in the process";
  EXPECT_EQ(found.algo, 5);
  EXPECT_EQ(found.workspace, 4096u);
  EXPECT_EQ(found.retimed_ms, 0.5f);
  EXPECT_EQ(next.searches(), 0) << "read, not searched";
  EXPECT_FALSE(next.find("fwd|32,65", &found));
  gpu::ChoiceCache<gpu::ConvAlgo> gemm("gemm");
  EXPECT_FALSE(gemm.find("fwd|32,64", &found)) << "another kind's choice";
}
#endif

}  // namespace
}  // namespace hotops
