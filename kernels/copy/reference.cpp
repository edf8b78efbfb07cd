// The copy reference: where each output element comes from, its value in double, and the exact
// (bitwise) checks every copy backend is verified with.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "kernels/copy/copy.h"

namespace hotops::copy {
namespace {

// The stored bits of element i of a buffer of dtype t (f32: 4 bytes, bf16/f16: 2 bytes).
std::uint32_t bits_at(const void* data, DType t, std::size_t i) {
  if (dtype_size(t) == 4) {
    std::uint32_t u;
    std::memcpy(&u, static_cast<const std::byte*>(data) + 4 * i, 4);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, static_cast<const std::byte*>(data) + 2 * i, 2);
  return h;
}

// The bits that value v has once stored in dtype t (round to nearest even, as HostBuffer::set does).
std::uint32_t bits_of(double v, DType t) {
  const auto f = static_cast<float>(v);
  switch (storage_of(t)) {
    case DType::bf16: return float_to_bf16(f);
    case DType::f16: return float_to_f16(f);
    default: {
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
  }
}

double value_of(std::uint32_t bits, DType t) {
  switch (storage_of(t)) {
    case DType::bf16: return bf16_to_float(static_cast<std::uint16_t>(bits));
    case DType::f16: return f16_to_float(static_cast<std::uint16_t>(bits));
    default: {
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}

Check mismatch(std::size_t first, std::size_t count, std::size_t n, std::uint32_t out, std::uint32_t ref, DType t) {
  Check c;
  c.ok = false;
  c.checked = n;
  const double o = value_of(out, t), r = value_of(ref, t);
  c.max_err = std::isfinite(o) ? std::fabs(o - r) / std::max(std::fabs(r), std::numeric_limits<double>::min())
                               : std::nan("");
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "%zu of %zu elements differ bitwise; first at index %zu: out %.9g (0x%0*" PRIx32 "), ref %.9g (0x%0*" PRIx32 ")",
                count, n, first, o, static_cast<int>(2 * dtype_size(t)), out, r, static_cast<int>(2 * dtype_size(t)), ref);
  c.message = buf;
  return c;
}

}  // namespace

std::size_t source_index(const Shape& s, std::size_t i) {
  const auto C = static_cast<std::size_t>(s.C), HW = static_cast<std::size_t>(s.H * s.W);
  switch (s.kind) {
    case Kind::nchw_to_nhwc: {  // out[n][hw][c] = in[n][c][hw]
      const std::size_t n = i / (HW * C), hw = (i / C) % HW, c = i % C;
      return (n * C + c) * HW + hw;
    }
    case Kind::nhwc_to_nchw: {  // out[n][c][hw] = in[n][hw][c]
      const std::size_t n = i / (C * HW), c = (i / HW) % C, hw = i % HW;
      return (n * HW + hw) * C + c;
    }
    default: return i;
  }
}

double reference(const Shape& s, const HostBuffer& src, std::size_t i) { return src.get(source_index(s, i)); }

void reference(const Shape& s, const HostBuffer& src, HostBuffer& out) {
  for (std::size_t i = 0; i < out.count(); ++i) out.set(i, reference(s, src, i));
}

Check verify_exact(const Shape& s, const HostBuffer& src, const HostBuffer& out) {
  const DType t = out.dtype();
  const auto n = static_cast<std::int64_t>(out.count());
  std::int64_t first = n, count = 0;
  // Expected bits: a pure move keeps the source bits; a conversion stores the value in dtype t.
  const bool same_dtype = src.dtype() == t;
#pragma omp parallel for schedule(static) reduction(min : first) reduction(+ : count) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const std::uint32_t want = same_dtype ? bits_at(src.data(), t, source_index(s, u)) : bits_of(reference(s, src, u), t);
    if (bits_at(out.data(), t, u) != want) first = std::min(first, i), ++count;
  }
  if (count == 0) {
    Check c;
    c.checked = out.count();
    return c;
  }
  const auto f = static_cast<std::size_t>(first);
  const std::uint32_t want = same_dtype ? bits_at(src.data(), t, source_index(s, f)) : bits_of(reference(s, src, f), t);
  return mismatch(f, static_cast<std::size_t>(count), out.count(), bits_at(out.data(), t, f), want, t);
}

Check verify_bitwise(const void* out, const void* ref, std::size_t bytes, DType t) {
  const std::size_t e = dtype_size(t), n = bytes / e;
  if (std::memcmp(out, ref, bytes) == 0) {
    Check c;
    c.checked = n;
    return c;
  }
  std::size_t first = n, count = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (bits_at(out, t, i) != bits_at(ref, t, i)) first = std::min(first, i), ++count;
  return mismatch(first, count, n, bits_at(out, t, first), bits_at(ref, t, first), t);
}

}  // namespace hotops::copy
