// The copy family: what PyTorch's aten::copy_ does, the op at the top of the studies' profiles. Raw
// copies (within host or device memory, host->device, device->host) and the two conversions that
// frameworks do inside copy_: layout NCHW <-> NHWC and dtype f32 <-> bf16. Names, implementations,
// work and verification: docs/ops.md, "copy".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

#ifdef HOTOPS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hotops::copy {

enum class Kind { memcpy, h2d, d2h, nchw_to_nhwc, nhwc_to_nchw, f32_to_bf16, bf16_to_f32 };
// Where the host side of an h2d / d2h transfer lives: ordinary (pageable) memory goes through the
// driver's staging buffer and cannot be captured in a CUDA graph; pinned memory is DMA'd directly.
enum class Host { none, pageable, pinned };

const char* kind_name(Kind k);

// The two CPU implementations of the layouts and the dtype conversions: oneDNN's reorder and hotops'
// own loops. A CPU problem of those kinds without an `impl` arg runs its kind's default one
// (default_cpu_impl()); the other is named with `impl:<impl_name>` appended.
enum class CpuImpl { onednn, hotops };

// One copy problem. Counts are in elements of the source / destination dtype.
struct Shape {
  Kind kind = Kind::memcpy;
  Host host = Host::none;
  DType src = DType::f32, dst = DType::f32;
  std::int64_t N = 1, C = 1, H = 1, W = 1;  // the layouts: the logical tensor [N, C, H, W]
  std::size_t count = 0;                    // elements of the source (= of the destination)
  CpuImpl impl = CpuImpl::hotops;           // the CPU's implementation of a layout or a conversion

  bool is_raw() const { return kind == Kind::memcpy || kind == Kind::h2d || kind == Kind::d2h; }
  bool is_layout() const { return kind == Kind::nchw_to_nhwc || kind == Kind::nhwc_to_nchw; }
  std::size_t src_bytes() const { return count * dtype_size(src); }
  std::size_t dst_bytes() const { return count * dtype_size(dst); }
};

Shape shape_of(const Problem& p);  // throws hotops::Error on an ill-formed copy problem

const char* impl_name(CpuImpl i);
bool has_cpu_impls(Kind k);  // the layouts and the conversions
CpuImpl default_cpu_impl(Kind k);
CpuImpl cpu_impl(const Problem& p);  // shape_of(p).impl; throws hotops::Error on an unknown or misplaced `impl`


// hotops' CPU dtype conversion: dst = src converted (s.kind), rounding to nearest even, in blocks
// that `threads` OpenMP threads share.
void convert_dtype(const Shape& s, const void* src, void* dst, int threads);

// hotops' CPU layout change: dst = src in the other layout (s.kind), for 2- and 4-byte elements, as a
// batched 2-D transpose of [C, H*W] (to NHWC) or [H*W, C] (to NCHW) per image, cut into tiles that
// `threads` OpenMP threads share. transpose_tile() is the tile it cuts a shape into, in elements of
// the source matrix (rows x columns).
void transpose_layout(const Shape& s, const void* src, void* dst, int threads);
std::pair<std::int64_t, std::int64_t> transpose_tile(const Shape& s);

// The seeded random source of a problem (identical on every backend).
HostBuffer make_source(const Shape& s, std::uint64_t seed);

// Reference. The layouts move element source_index(i) of the source to element i of the output;
// every other kind moves element i to element i. reference() is the value of output element i in
// double; storing it in the output dtype (round to nearest even) gives the expected bits.
std::size_t source_index(const Shape& s, std::size_t i);
double reference(const Shape& s, const HostBuffer& src, std::size_t i);
void reference(const Shape& s, const HostBuffer& src, HostBuffer& out);  // every element, for tests

// Exact checks. verify_exact: every element of `out` holds the bits of reference(i) stored in out's
// dtype. verify_bitwise: the `bytes` at out equal those at ref (viewed as elements of dtype t).
Check verify_exact(const Shape& s, const HostBuffer& src, const HostBuffer& out);
Check verify_bitwise(const void* out, const void* ref, std::size_t bytes, DType t);

// The tensors of one copy: dst = src moved as it is, into the other layout, or into the other dtype;
// Shape::count elements each, src in Shape::src, dst in Shape::dst. On the CPU both are host memory.
// On CUDA both are device memory, but for the host side of a transfer (h2d's src, d2h's dst), which
// is host memory of the kind Shape::host names (pinned: see pinned_host).
struct Args {
  const void* src = nullptr;
  void* dst = nullptr;
};
// CPU: memcpy, and s.impl for layouts and conversions; CUDA: cudaMemcpyAsync and hotops' kernels
HOTOPS_PLAN_FACTORIES(Shape, Args);

#ifdef HOTOPS_HAVE_CUDA
// The dtype conversions' kernels (k: f32_to_bf16 or bf16_to_f32) over `count` elements on stream `st`,
// src and dst 16-byte aligned: what the conversion plans run on gpu::stream(), for callers with a
// stream of their own (the data-parallel steps' all-reduce stream).
void cuda_convert(Kind k, const void* src, void* dst, std::size_t count, cudaStream_t st);
// `bytes` of pinned (page-locked, cudaHostAlloc) host memory, which the GPU's copy engines read and
// write directly; freed when its last owner lets go.
std::shared_ptr<void> pinned_host(std::size_t bytes);
#endif

std::string cpu_unsupported_reason(const Problem& p);  // "" when the CPU runs p (a oneDNN probe)
const Family& family();

}  // namespace hotops::copy
