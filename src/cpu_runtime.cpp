// oneDNN engine/stream singletons, the shared oneDNN steps, thread control and CPU identification.
#include "hotops/cpu.h"

#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "hotops/check.h"

namespace hotops::cpu {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

void execute(const dnnl::primitive& p, const Args& args) {
  dnnl::stream& st = stream();
  HOTOPS_CHECK_DNNL(p.execute(st, args));
  HOTOPS_CHECK_DNNL(st.wait());
}

Primitive::Primitive(dnnl::primitive p, const std::vector<std::pair<int, dnnl::memory::desc>>& args)
    : primitive_(std::move(p)), bound_(args.size(), nullptr) {
  for (const auto& [arg, desc] : args) {
    args_.emplace(arg, HOTOPS_CHECK_DNNL(dnnl::memory(desc, engine(), DNNL_MEMORY_NONE)));
    order_.push_back(arg);
  }
}

void Primitive::run(std::initializer_list<const void*> buffers) {
  HOTOPS_CHECK(buffers.size() == order_.size(), "a oneDNN primitive was given the wrong number of buffers");
  std::size_t i = 0;
  for (const void* b : buffers) {
    if (b != bound_[i]) {
      args_.at(order_[i]).set_data_handle(const_cast<void*>(b));
      bound_[i] = b;
    }
    ++i;
  }
  execute(primitive_, args_);
}

dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: return dnnl::memory::data_type::f32;
  }
}

dnnl::memory::desc md(const dnnl::memory::dims& dims, DType t, dnnl::memory::format_tag tag) {
  return HOTOPS_CHECK_DNNL(dnnl::memory::desc(dims, dnnl_type(t), tag));
}

dnnl::memory mem(const dnnl::memory::desc& d, void* data) { return HOTOPS_CHECK_DNNL(dnnl::memory(d, engine(), data)); }

void reorder(dnnl::memory from, dnnl::memory to) {
  dnnl::stream& st = stream();
  HOTOPS_CHECK_DNNL(dnnl::reorder(from, to).execute(st, from, to));
  HOTOPS_CHECK_DNNL(st.wait());
}

dnnl::memory reordered(const dnnl::memory& from, const dnnl::memory::desc& want) {
  dnnl::memory to = HOTOPS_CHECK_DNNL(dnnl::memory(want, engine()));
  reorder(from, to);
  return to;
}

Args matmul_args(const dnnl::matmul::primitive_desc& pd, void* src, void* weights, void* dst) {
  return {{DNNL_ARG_SRC, mem(pd.src_desc(), src)},
          {DNNL_ARG_WEIGHTS, mem(pd.weights_desc(), weights)},
          {DNNL_ARG_DST, mem(pd.dst_desc(), dst)}};
}

std::string onednn_unsupported_reason(const std::function<void()>& probe, const std::string& what,
                                      const std::string& suffix) {
  try {
    probe();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported)
      return "oneDNN has no " + what + " for this CPU (ISA " + isa_name() + ")" + suffix;
    throw;
  }
  return "";
}

std::string onednn_unsupported_reason(const std::function<void()>& probe, const Problem& p, const std::string& op,
                                      const std::string& suffix) {
  return onednn_unsupported_reason(probe, std::string(dtype_name(p.dtype)) + " " + op + " " + direction_name(p.dir),
                                   suffix);
}

Eltwise::Eltwise(dnnl::algorithm alg, const dnnl::memory::desc& tensor_, float alpha, bool backward_)
    : tensor(tensor_), backward(backward_) {
  dnnl::engine& eng = engine();
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, tensor, alpha));
  fwd = HOTOPS_CHECK_DNNL(dnnl::eltwise_forward::primitive_desc(fd, eng));
  if (backward) {
    const auto bd = HOTOPS_CHECK_DNNL(dnnl::eltwise_backward::desc(alg, tensor, tensor, alpha));
    bwd = HOTOPS_CHECK_DNNL(dnnl::eltwise_backward::primitive_desc(bd, eng, fwd));
  }
}

const char* Eltwise::impl_info_str() const { return backward ? bwd.impl_info_str() : fwd.impl_info_str(); }

void set_threads(int n) { omp_set_num_threads(n); }
int threads() { return omp_get_max_threads(); }

namespace {
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6)
void set_flush_here(bool on) { _mm_setcsr(on ? (_mm_getcsr() | kFtzDaz) : (_mm_getcsr() & ~kFtzDaz)); }
}  // namespace

void set_flush_subnormals(bool on) {
  set_flush_here(on);
  // As many threads as any team hotops asks for: each of them sets its own register.
#pragma omp parallel num_threads(std::max(omp_get_max_threads(), omp_get_num_procs()))
  set_flush_here(on);
}

bool flushes_subnormals() { return (_mm_getcsr() & kFtzDaz) == kFtzDaz; }

std::string with_threads(const std::string& label) { return label + ", " + std::to_string(threads()) + " threads"; }

void stream_copy(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
}

void stream_fence() { _mm_sfence(); }

std::string isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace hotops::cpu
