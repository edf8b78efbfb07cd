// Host buffers: typed element access, counter-based random fill, NaN poisoning.
#include "hotops/buffer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>

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

[[noreturn]] void throw_out_of_host_memory(double bytes) {
  const HostMemory m = host_memory();
  char buf[200];
  std::snprintf(buf, sizeof buf, "out of host memory: allocating %.2f GiB with %.2f GiB available of %.2f GiB", bytes / 1073741824.0,
                m.available / 1073741824.0, m.total / 1073741824.0);
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
  std::byte* p = new (std::nothrow) std::byte[bytes];
  if (!p) throw_out_of_host_memory(double(bytes));
  return p;
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  m.total = read_key("/proc/meminfo", "MemTotal:") << 10;  // kB
  m.available = read_key("/proc/meminfo", "MemAvailable:") << 10;
  // In a container the cgroup limit is what counts; its page cache (inactive files) is reclaimable.
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  std::string limit_text;
  unsigned long long current = 0;
  if (max_file >> limit_text && limit_text != "max" && current_file >> current) {
    const auto limit = static_cast<std::size_t>(std::strtoull(limit_text.c_str(), nullptr, 10));
    const std::size_t used = current - std::min<std::size_t>(current, read_key("/sys/fs/cgroup/memory.stat", "inactive_file"));
    if (limit > 0 && (m.total == 0 || limit < m.total)) m.total = limit;
    const std::size_t left = limit > used ? limit - used : 0;
    if (m.available == 0 || left < m.available) m.available = left;
  }
  return m;
}

std::uint64_t global_seed() { return g_seed; }
void set_global_seed(std::uint64_t seed) { g_seed = seed; }

HostBuffer::HostBuffer(DType dtype, std::size_t count)
    : dtype_(storage_of(dtype)), count_(count), bytes_(allocate(count, dtype)) {}

HostBuffer::HostBuffer(const HostBuffer& o) : HostBuffer(o.dtype_, o.count_) {
  if (o.bytes() > 0) std::memcpy(bytes_.get(), o.bytes_.get(), o.bytes());  // an empty buffer has no storage
}

HostBuffer& HostBuffer::operator=(const HostBuffer& o) {
  if (this != &o) *this = HostBuffer(o);
  return *this;
}

double HostBuffer::get(std::size_t i) const {
  switch (dtype_) {
    case DType::bf16: return bf16_to_float(as<std::uint16_t>()[i]);
    case DType::f16: return f16_to_float(as<std::uint16_t>()[i]);
    default: return as<float>()[i];
  }
}

void HostBuffer::set(std::size_t i, double v) {
  const auto f = static_cast<float>(v);
  switch (dtype_) {
    case DType::bf16: as<std::uint16_t>()[i] = float_to_bf16(f); break;
    case DType::f16: as<std::uint16_t>()[i] = float_to_f16(f); break;
    default: as<float>()[i] = f;
  }
}

void HostBuffer::fill_uniform(std::uint64_t seed, std::uint64_t stream, float lo, float hi) {
  const std::uint64_t key = mix(seed ^ mix(stream + 0x51ed27ull));
  const auto n = static_cast<std::int64_t>(count_);
  const double scale = (static_cast<double>(hi) - lo) * 0x1.0p-53;
  auto value = [&](std::int64_t i) {
    return static_cast<float>(lo + scale * static_cast<double>(mix(key + static_cast<std::uint64_t>(i)) >> 11));
  };
  // One loop per storage type: this runs over every input of every case, up to gigabytes.
  if (dtype_ == DType::f32) {
    float* p = as<float>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t i = 0; i < n; ++i) p[i] = value(i);
  } else {
    std::uint16_t* p = as<std::uint16_t>();
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
