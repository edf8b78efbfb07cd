// copy on the CPU: memcpy as std::memcpy over OpenMP thread chunks (the host's copy bandwidth), the
// layout and dtype conversions as oneDNN reorders between plain memory descriptors.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/copy/copy.h"

namespace hotops::copy {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// Bytes below which another thread costs more than it saves: PyTorch's grain for copy_
// (at::internal::GRAIN_SIZE, 32768 elements) in f32 bytes.
constexpr std::size_t kGrainBytes = 32768 * 4;

// How many threads copy `bytes`: all of them, once each has at least a grain of work.
int threads_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>(bytes / kGrainBytes, 1, static_cast<std::size_t>(cpu::threads())));
}

// dst[0, bytes) = src[0, bytes): each thread of the team one contiguous, 64-byte-aligned chunk.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const auto team = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t chunk = ((bytes + team - 1) / team + 63) / 64 * 64;
    const std::size_t begin = std::min(bytes, static_cast<std::size_t>(omp_get_thread_num()) * chunk);
    const std::size_t end = std::min(bytes, begin + chunk);
    if (end > begin) std::memcpy(static_cast<std::byte*>(dst) + begin, static_cast<const std::byte*>(src) + begin, end - begin);
  }
}

class CpuMemcpy final : public Case {
 public:
  explicit CpuMemcpy(const Problem& p)
      : s_(shape_of(p)), src_(make_source(s_, p.seed())), dst_(s_.dst, s_.count), threads_(threads_for(s_.src_bytes())) {
    dst_.poison();  // first touch of the destination's pages, outside timing
  }

  void run() override { parallel_memcpy(dst_.data(), src_.data(), src_.bytes(), threads_); }

  Check verify() override {
    dst_.poison();
    run();
    return verify_bitwise(dst_.data(), src_.data(), src_.bytes(), s_.src);
  }

  std::string label() const override {
    return "std::memcpy in " + std::to_string(threads_) + " OpenMP chunk" + (threads_ > 1 ? "s" : "") + " of " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  HostBuffer src_, dst_;
  int threads_;
};

memory::data_type dnnl_type(DType t) { return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

// The reorder's source and destination descriptors: [N,C,H,W] in two plain layouts, or a vector
// of `count` elements in two dtypes.
dnnl::reorder::primitive_desc plan(const Shape& s) {
  memory::desc src, dst;
  if (s.is_layout()) {
    const memory::dims dims{s.N, s.C, s.H, s.W};
    const bool to_nhwc = s.kind == Kind::nchw_to_nhwc;
    src = memory::desc(dims, dnnl_type(s.src), to_nhwc ? tag::nchw : tag::nhwc);
    dst = memory::desc(dims, dnnl_type(s.dst), to_nhwc ? tag::nhwc : tag::nchw);
  } else {
    const memory::dims dims{static_cast<memory::dim>(s.count)};
    src = memory::desc(dims, dnnl_type(s.src), tag::a);
    dst = memory::desc(dims, dnnl_type(s.dst), tag::a);
  }
  dnnl::engine& eng = cpu::engine();
  return HOTOPS_CHECK_DNNL(dnnl::reorder::primitive_desc(eng, src, eng, dst));
}

class CpuReorder final : public Case {
 public:
  explicit CpuReorder(const Problem& p)
      : s_(shape_of(p)), pd_(plan(s_)), src_(make_source(s_, p.seed())), dst_(s_.dst, s_.count) {
    dst_.poison();
    reorder_ = dnnl::reorder(pd_);
    src_mem_ = memory(pd_.src_desc(), cpu::engine(), src_.data());
    dst_mem_ = memory(pd_.dst_desc(), cpu::engine(), dst_.data());
  }

  void run() override {
    dnnl::stream& st = cpu::stream();
    HOTOPS_CHECK_DNNL(reorder_.execute(st, src_mem_, dst_mem_));
    HOTOPS_CHECK_DNNL(st.wait());
  }

  Check verify() override {
    dst_.poison();
    run();
    return verify_exact(s_, src_, dst_);
  }

  std::string label() const override {
    return "oneDNN reorder " + std::string(pd_.impl_info_str()) + ", " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  dnnl::reorder::primitive_desc pd_;
  HostBuffer src_, dst_;
  dnnl::reorder reorder_;
  memory src_mem_, dst_mem_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  if (s.is_raw()) return "";
  try {
    plan(s);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported)
      return std::string("oneDNN has no ") + dtype_name(s.src) + " -> " + dtype_name(s.dst) + " " + kind_name(s.kind) +
             " reorder for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<Case> make_cpu(const Problem& p) {
  const Shape s = shape_of(p);
  if (s.kind == Kind::memcpy) return std::make_unique<CpuMemcpy>(p);
  HOTOPS_CHECK(!s.is_raw(), std::string("copy kind ") + kind_name(s.kind) + " has no CPU version");
  return std::make_unique<CpuReorder>(p);
}

}  // namespace hotops::copy
