// Host tensors of any dtype with seeded random init, poisoning, and element access as double.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hotops/dtype.h"

namespace hotops {

class HostBuffer {
 public:
  HostBuffer() = default;
  // Uninitialised: fill or poison before use. A buffer larger than the host memory available is an
  // out_of_memory Error that says how much was asked for and how much is available.
  HostBuffer(DType dtype, std::size_t count);
  HostBuffer(const HostBuffer& o);
  HostBuffer& operator=(const HostBuffer& o);
  HostBuffer(HostBuffer&&) noexcept = default;
  HostBuffer& operator=(HostBuffer&&) noexcept = default;

  DType dtype() const { return dtype_; }
  std::size_t count() const { return count_; }
  std::size_t bytes() const { return count_ * dtype_size(dtype_); }
  void* data() { return bytes_.get(); }
  const void* data() const { return bytes_.get(); }
  template <class T> T* as() { return reinterpret_cast<T*>(bytes_.get()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(bytes_.get()); }

  double get(std::size_t i) const;
  void set(std::size_t i, double v);

  // Uniform in [lo, hi), a pure function of (seed, stream, index): reproducible and parallel.
  // Values are rounded to the dtype, so the reference sees exactly what the op sees.
  void fill_uniform(std::uint64_t seed, std::uint64_t stream, float lo = -1.f, float hi = 1.f);
  // Every element NaN, so an element the op fails to write cannot pass verification.
  void poison();

 private:
  DType dtype_ = DType::f32;
  std::size_t count_ = 0;
  std::unique_ptr<std::byte[]> bytes_;
};

// Host memory as this process can use it: MemAvailable of /proc/meminfo, lowered to what the
// cgroup (v2) limit leaves when there is one. Zeros when unknown.
struct HostMemory {
  std::size_t available = 0;
  std::size_t total = 0;
};
HostMemory host_memory();

// The seed that every input of every case derives from (--hotops_seed).
std::uint64_t global_seed();
void set_global_seed(std::uint64_t seed);

}  // namespace hotops
