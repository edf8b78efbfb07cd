// cuBLAS and cublasLt are opened at their first call (src/cublas_loader.cpp), not when a process
// starts. Host tests: they need a CUDA build, not a GPU.
#include <gtest/gtest.h>

#ifdef HOTOPS_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Whether a library whose file name contains `name` is loaded in this process.
bool loaded(const char* name) {
  struct Search {
    const char* name;
    bool found;
  } s{name, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* search = static_cast<Search*>(data);
        if (info->dlpi_name && std::strstr(info->dlpi_name, search->name)) search->found = true;
        return 0;
      },
      &s);
  return s.found;
}

// Run as a process of its own by the test below (HOTOPS_LOADER_CHILD set): prints whether
// libcublasLt was loaded before its first call and after it, and what that call returned.
TEST(CublasLoader, ChildReport) {
  if (!std::getenv("HOTOPS_LOADER_CHILD")) GTEST_SKIP() << "run by CublasLoader.OpensTheLibrariesAtTheirFirstCall";
  const bool before = loaded("libcublasLt.so");
  const std::size_t version = cublasLtGetVersion();
  std::printf("loader: before=%d after=%d version=%zu status=%s\n", before, loaded("libcublasLt.so"), version,
              cublasGetStatusName(CUBLAS_STATUS_SUCCESS));
}

TEST(CublasLoader, OpensTheLibrariesAtTheirFirstCall) {
  const std::string cmd = "HOTOPS_LOADER_CHILD=1 /proc/" + std::to_string(getpid()) +
                          "/exe --gtest_filter=CublasLoader.ChildReport 2>&1";
  FILE* child = popen(cmd.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, child)) out += buf;
  ASSERT_EQ(pclose(child), 0) << out;
  // A fresh process has not loaded libcublasLt; its first call loads it and answers from it.
  const std::size_t at = out.find("loader: ");
  ASSERT_NE(at, std::string::npos) << out;
  int before = -1, after = -1;
  std::size_t version = 0;
  char status[64] = {};
  ASSERT_EQ(std::sscanf(out.c_str() + at, "loader: before=%d after=%d version=%zu status=%63s", &before, &after, &version, status), 4)
      << out;
  EXPECT_EQ(before, 0) << out;
  EXPECT_EQ(after, 1) << out;
  EXPECT_EQ(version / 10000, static_cast<std::size_t>(CUBLAS_VER_MAJOR)) << out;  // e.g. 130100: 13.1.0
  EXPECT_STREQ(status, "CUBLAS_STATUS_SUCCESS") << out;
}

}  // namespace
#endif
