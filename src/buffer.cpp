// Host buffers: typed element access, counter-based random fill, NaN poisoning.
#include "hotops/buffer.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace hotops {
namespace {

std::uint64_t g_seed = 20261122;

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t global_seed() { return g_seed; }
void set_global_seed(std::uint64_t seed) { g_seed = seed; }

HostBuffer::HostBuffer(DType dtype, std::size_t count)
    : dtype_(storage_of(dtype)), count_(count), bytes_(new std::byte[count * dtype_size(dtype)]) {}

HostBuffer::HostBuffer(const HostBuffer& o) : HostBuffer(o.dtype_, o.count_) {
  std::memcpy(bytes_.get(), o.bytes_.get(), o.bytes());
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
