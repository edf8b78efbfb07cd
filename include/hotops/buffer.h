// Host tensors of any dtype with seeded random init, poisoning, and element access as double.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hotops/dtype.h"

namespace hotops {

// Returns a HostBuffer's storage and takes its bytes off the live count (begin_case_memory).
struct HostStorageRelease {
  std::size_t bytes;
  void operator()(std::byte* p) const;
};

// While one is alive (on any thread), allocations of 32 MiB and more by operator new come on 2 MiB
// transparent huge pages faulted in on every thread, whose first touch costs a fraction of 4 KiB
// pages' (src/host_pages.cpp): for what a verification makes and drops (its reference), never for
// what an entry times.
class HugePageScope {
 public:
  HugePageScope();
  ~HugePageScope();
  HugePageScope(const HugePageScope&) = delete;
  HugePageScope& operator=(const HugePageScope&) = delete;
  static bool active();
};

// Copies and zeroes `bytes` bytes; a large span in parts in parallel, so that its pages (fresh ones
// faulted in and zeroed by the kernel) are touched by every thread at once, not by one: a model's
// state is GBs.
void copy_bytes(void* to, const void* from, std::size_t bytes);
void zero_bytes(void* to, std::size_t bytes);
// Writes one byte of each `page` bytes of [p, p + bytes) (`page` a power of two), on every thread:
// each page's first touch, its fault, taken in parallel; the contents are the caller's to write.
void touch_pages(void* p, std::size_t bytes, std::size_t page);

class HostBuffer {
 public:
  HostBuffer() = default;
  // Uninitialised: fill or poison before use (a large one's pages are touched on every thread as it
  // is made, so that its first writer does not take their page faults alone). A buffer larger than
  // the host memory available is an out_of_memory Error that says how much was asked for and how
  // much is available.
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

  // Element i as double, and set from double (rounded to the dtype); inline: the references read
  // their operands through these, element by element.
  double get(std::size_t i) const {
    switch (dtype_) {
      case DType::bf16: return bf16_to_float(as<std::uint16_t>()[i]);
      case DType::f16: return f16_to_float(as<std::uint16_t>()[i]);
      default: return as<float>()[i];
    }
  }
  void set(std::size_t i, double v) {
    const auto f = static_cast<float>(v);
    switch (dtype_) {
      case DType::bf16: as<std::uint16_t>()[i] = float_to_bf16(f); break;
      case DType::f16: as<std::uint16_t>()[i] = float_to_f16(f); break;
      default: as<float>()[i] = f;
    }
  }

  // Uniform in [lo, hi), a pure function of (seed, stream, index): reproducible and parallel.
  // Values are rounded to the dtype, so the reference sees exactly what the op sees.
  void fill_uniform(std::uint64_t seed, std::uint64_t stream, float lo = -1.f, float hi = 1.f);
  // Elements [at, at + count) as fill_uniform fills a buffer of `count` elements (a tensor of a flat
  // buffer seeded as if alone).
  void fill_uniform_range(std::size_t at, std::size_t count, std::uint64_t seed, std::uint64_t stream, float lo = -1.f,
                          float hi = 1.f);
  // Every element NaN, so an element the op fails to write cannot pass verification.
  void poison();

 private:
  DType dtype_ = DType::f32;
  std::size_t count_ = 0;
  std::unique_ptr<std::byte[], HostStorageRelease> bytes_;
};

// Host memory as this process can use it: MemAvailable of /proc/meminfo, lowered to what the limits
// of the memory cgroups it is in leave: every level from its own cgroup up to the root, in the
// unified hierarchy (v2, wherever it is mounted) and in v1's memory controller, each level's use
// less its reclaimable page cache. Zeros when unknown.
struct HostMemory {
  std::size_t available = 0;
  std::size_t total = 0;
};
HostMemory host_memory();

// Accounts one case's host memory as a whole: from this call on, the HostBuffers allocated and
// still alive add up, and an allocation that takes them past what was available at this call is
// refused with an out-of-memory Error naming both (instead of the kernel killing the process when
// buffers that fit one by one do not fit together). Call it before a case sets up.
void begin_case_memory();
void end_case_memory();  // back to checking each allocation on its own

// The seed that every input of every case derives from (--hotops_seed).
std::uint64_t global_seed();
void set_global_seed(std::uint64_t seed);

}  // namespace hotops
