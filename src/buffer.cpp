// Host buffers: typed element access, counter-based random fill, NaN poisoning.
#include "hotops/buffer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "hotops/check.h"

namespace hotops {
namespace {

std::uint64_t g_seed = 20261122;

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A value of a "key value" file (/proc/meminfo, memory.stat); 0 when absent.
std::size_t read_key(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  unsigned long long v = 0;
  while (f >> k >> v) {
    if (k == key) return static_cast<std::size_t>(v);
    f.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// Below this size an allocation does not ask the kernel what is available: that costs a file read.
constexpr std::size_t kCheckedAllocationBytes = std::size_t(64) << 20;
constexpr std::size_t kTouchedAllocationBytes = std::size_t(16) << 20;  // and larger: pages touched in parallel
constexpr std::size_t kTouchedAllocationMax = std::size_t(2) << 30;
constexpr std::size_t kSmallPage = 4096;
// Every host buffer starts on a cache line, as oneDNN's own memory does: its AVX-512 and AMX kernels
// load 64-byte rows, and a row that straddles two lines costs two loads (the new[] default is 16).
constexpr std::align_val_t kHostAlignment{64};

// The bytes of the HostBuffers alive now, and what begin_case_memory saw.
std::atomic<std::size_t> g_live_bytes{0};
struct CaseMemory {
  bool on = false;
  std::size_t live_at_begin = 0;
  std::size_t available_at_begin = 0;
};
CaseMemory g_case;

double gib(double bytes) { return bytes / 1073741824.0; }

[[noreturn]] void throw_out_of_host_memory(double bytes) {
  const HostMemory m = host_memory();
  char buf[200];
  std::snprintf(buf, sizeof buf, "out of host memory: allocating %.2f GiB with %.2f GiB available of %.2f GiB", gib(bytes),
                gib(m.available), gib(m.total));
  throw Error(buf, ErrorKind::out_of_memory);
}

std::byte* allocate(std::size_t count, DType dtype) {
  const std::size_t size = dtype_size(dtype);
  if (count > std::numeric_limits<std::size_t>::max() / size) throw_out_of_host_memory(double(count) * double(size));
  const std::size_t bytes = count * size;
  // Linux overcommits: an allocation larger than what is available often succeeds and the process
  // is killed when it touches the pages. Refusing it up front turns that into a clear error.
  if (bytes >= kCheckedAllocationBytes) {
    const HostMemory m = host_memory();
    if (m.available > 0 && bytes > m.available) throw_out_of_host_memory(double(bytes));
  }
  // The case as a whole: its buffers alive together against what it started with.
  const std::size_t live = g_live_bytes.load();
  const std::size_t together = live - std::min(live, g_case.live_at_begin) + bytes;
  if (g_case.on && g_case.available_at_begin > 0 && together > g_case.available_at_begin) {
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "out of host memory: the case needs %.2f GiB together (this buffer %.2f GiB) and %.2f GiB were available "
                  "when it started",
                  gib(double(together)), gib(double(bytes)), gib(double(g_case.available_at_begin)));
    throw Error(buf, ErrorKind::out_of_memory);
  }
  auto* p = static_cast<std::byte*>(::operator new[](bytes, kHostAlignment, std::nothrow));
  if (!p) throw_out_of_host_memory(double(bytes));
  g_live_bytes += bytes;
  // A page's first touch is a page fault, and a buffer's first writer is often one thread (a CUDA
  // download, a fill, a copy): on the GPU host's 16-core VM, 232 MB faulted in on one thread took
  // 0.15 s, on all of them 0.012 s. A large buffer's pages are touched on every thread here, as it
  // is made. (Up to kTouchedAllocationMax: a larger one is left to its writer, so that making it
  // commits no memory before the case uses it.)
  if (bytes >= kTouchedAllocationBytes && bytes <= kTouchedAllocationMax) touch_pages(p, bytes, kSmallPage);
  return p;
}

// A line's fields split on spaces.
std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream s(line);
  for (std::string f; s >> f;) out.push_back(f);
  return out;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A number file of a cgroup ("max", or a v1 limit of 2^62 and more, is no limit: 0).
std::size_t read_number(const std::string& path) {
  std::ifstream f(path);
  std::string t;
  if (!(f >> t) || t == "max") return 0;
  const unsigned long long v = std::strtoull(t.c_str(), nullptr, 10);
  return v >= (1ull << 62) ? 0 : static_cast<std::size_t>(v);
}

// The memory that every level of one hierarchy leaves this process: the smallest limit less use
// (reclaimable page cache not counted as use), from `dir` up to `top`, and the smallest limit.
void lower_by_cgroup(std::string dir, const std::string& top, bool v2, HostMemory& m) {
  const char* limit_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const char* usage_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
  const char* cache_key = v2 ? "inactive_file" : "total_inactive_file";
  for (;;) {
    const std::size_t limit = read_number(dir + limit_file);
    if (limit > 0) {
      const std::size_t usage = read_number(dir + usage_file);
      const std::size_t used = usage - std::min(usage, read_key((dir + "/memory.stat").c_str(), cache_key));
      const std::size_t left = limit > used ? limit - used : 0;
      if (m.total == 0 || limit < m.total) m.total = limit;
      if (m.available == 0 || left < m.available) m.available = left;
    }
    if (dir.size() <= top.size()) return;
    dir = dir.substr(0, dir.rfind('/'));
    if (dir.size() < top.size()) dir = top;
  }
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  m.total = read_key("/proc/meminfo", "MemTotal:") << 10;  // kB
  m.available = read_key("/proc/meminfo", "MemAvailable:") << 10;
  // Where the hierarchies are mounted (mountinfo: root is field 4, mount point field 5, the file
  // system type and super options after the " - " separator).
  struct Mount {
    std::string root, point;
  };
  Mount v2, v1;
  std::ifstream mounts("/proc/self/mountinfo");
  for (std::string line; std::getline(mounts, line);) {
    const std::vector<std::string> f = fields_of(line);
    const auto sep = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || sep == f.end() || sep + 1 == f.end()) continue;
    const std::string& type = *(sep + 1);
    const std::string super = sep + 3 < f.end() ? *(sep + 3) : "";
    if (type == "cgroup2" && v2.point.empty()) v2 = {f[3], f[4]};
    if (type == "cgroup" && v1.point.empty() && ("," + super + ",").find(",memory,") != std::string::npos) v1 = {f[3], f[4]};
  }
  // This process's cgroup in each (/proc/self/cgroup: "0::<path>" for v2, "N:<controllers>:<path>").
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool is_v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    const bool is_v1 = ("," + controllers + ",").find(",memory,") != std::string::npos;
    const Mount& mount = is_v2 ? v2 : v1;
    if ((!is_v2 && !is_v1) || mount.point.empty()) continue;
    // The path is relative to the hierarchy's root; the mount may show a subtree of it.
    if (mount.root != "/" && path.compare(0, mount.root.size(), mount.root) == 0) path = path.substr(mount.root.size());
    std::string dir = mount.point + (path == "/" ? "" : path);
    if (!is_dir(dir)) dir = mount.point;  // a namespace that hides the path: the mount's own level
    lower_by_cgroup(dir, mount.point, is_v2, m);
  }
  return m;
}

void begin_case_memory() {
  g_case.on = true;
  g_case.live_at_begin = g_live_bytes.load();
  g_case.available_at_begin = host_memory().available;
}

void end_case_memory() { g_case.on = false; }

void HostStorageRelease::operator()(std::byte* p) const {
  g_live_bytes -= std::min(bytes, g_live_bytes.load());
  ::operator delete[](p, kHostAlignment);
}

std::uint64_t global_seed() { return g_seed; }
void set_global_seed(std::uint64_t seed) { g_seed = seed; }

HostBuffer::HostBuffer(DType dtype, std::size_t count)
    : dtype_(storage_of(dtype)), count_(count), bytes_(allocate(count, dtype), HostStorageRelease{count * dtype_size(dtype)}) {}

namespace {
constexpr std::size_t kPart = std::size_t(4) << 20;  // bytes each thread takes at a time
std::int64_t parts_of(std::size_t bytes) { return static_cast<std::int64_t>((bytes + kPart - 1) / kPart); }
}  // namespace

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  const std::int64_t parts = parts_of(bytes);
#pragma omp parallel for schedule(static) if (parts > 4)
  for (std::int64_t k = 0; k < parts; ++k) {
    const std::size_t at = static_cast<std::size_t>(k) * kPart;
    std::memcpy(static_cast<std::byte*>(to) + at, static_cast<const std::byte*>(from) + at, std::min(kPart, bytes - at));
  }
}

void zero_bytes(void* to, std::size_t bytes) {
  const std::int64_t parts = parts_of(bytes);
#pragma omp parallel for schedule(static) if (parts > 4)
  for (std::int64_t k = 0; k < parts; ++k) {
    const std::size_t at = static_cast<std::size_t>(k) * kPart;
    std::memset(static_cast<std::byte*>(to) + at, 0, std::min(kPart, bytes - at));
  }
}

void touch_pages(void* p, std::size_t bytes, std::size_t page) {
  const auto pages = static_cast<std::int64_t>((bytes + page - 1) / page);
#pragma omp parallel for schedule(static) if (pages > 1)
  for (std::int64_t k = 0; k < pages; ++k) static_cast<volatile std::byte*>(p)[static_cast<std::size_t>(k) * page] = std::byte{0};
}

HostBuffer::HostBuffer(const HostBuffer& o) : HostBuffer(o.dtype_, o.count_) {
  if (o.bytes() > 0) copy_bytes(bytes_.get(), o.bytes_.get(), o.bytes());  // an empty buffer has no storage
}

HostBuffer& HostBuffer::operator=(const HostBuffer& o) {
  if (this != &o) *this = HostBuffer(o);
  return *this;
}

void HostBuffer::fill_uniform(std::uint64_t seed, std::uint64_t stream, float lo, float hi) {
  fill_uniform_range(0, count_, seed, stream, lo, hi);
}

void HostBuffer::fill_uniform_range(std::size_t at, std::size_t count, std::uint64_t seed, std::uint64_t stream, float lo,
                                    float hi) {
  HOTOPS_CHECK(at <= count_ && count <= count_ - at, "fill_uniform_range: elements beyond the buffer");
  const std::uint64_t key = mix(seed ^ mix(stream + 0x51ed27ull));
  const auto n = static_cast<std::int64_t>(count);
  const double scale = (static_cast<double>(hi) - lo) * 0x1.0p-53;
  auto value = [&](std::int64_t i) {
    return static_cast<float>(lo + scale * static_cast<double>(mix(key + static_cast<std::uint64_t>(i)) >> 11));
  };
  // One loop per storage type: this runs over every input of every case, up to gigabytes.
  if (dtype_ == DType::f32) {
    float* p = as<float>() + at;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t i = 0; i < n; ++i) p[i] = value(i);
  } else {
    std::uint16_t* p = as<std::uint16_t>() + at;
    const bool bf16 = dtype_ == DType::bf16;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t i = 0; i < n; ++i) p[i] = bf16 ? float_to_bf16(value(i)) : float_to_f16(value(i));
  }
}

void HostBuffer::poison() {
  const auto n = static_cast<std::int64_t>(count_);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) set(static_cast<std::size_t>(i), std::numeric_limits<double>::quiet_NaN());
}

}  // namespace hotops
