// Large allocations on transparent huge pages while a verification computes its reference. A fresh
// page is a page fault at its first touch, and a reference makes and drops buffers of hundreds of
// megabytes (a model's parameters and gradients in double, a convolution's activations over the
// verification samples), zeroed by one thread (std::vector's value-initialisation). On the GPU
// host's 16-core VM, 232 MB of 4 KiB pages took 0.15 s to fault in on one thread and 0.045 s as 2
// MiB pages (its kernel grants huge pages where a program asks: transparent_hugepage "madvise").
// So while a HugePageScope is alive, every operator new of kLargeBytes or more is 2 MiB-aligned,
// asks for huge pages and has them faulted in on every thread. Outside one, and below that size,
// memory is malloc's (aligned_alloc's), as the standard library's own operator new gives it: the
// buffers that entries time are left as a user's program would have them. Every replaceable form
// is replaced, and all of them free with std::free. Left to the sanitizers' own allocator where one
// is built in.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "hotops/buffer.h"

namespace {
std::atomic<int> g_huge_scopes{0};
}  // namespace

hotops::HugePageScope::HugePageScope() { ++g_huge_scopes; }
hotops::HugePageScope::~HugePageScope() { --g_huge_scopes; }
bool hotops::HugePageScope::active() { return g_huge_scopes.load(std::memory_order_relaxed) > 0; }

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HOTOPS_OWN_OPERATOR_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HOTOPS_OWN_OPERATOR_NEW 0
#endif
#endif
#ifndef HOTOPS_OWN_OPERATOR_NEW
#define HOTOPS_OWN_OPERATOR_NEW 1
#endif

#if HOTOPS_OWN_OPERATOR_NEW
namespace {
constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kLargeBytes = std::size_t(32) << 20;

// `align`: 0 for malloc's own; a power of two (the aligned forms) otherwise.
void* allocate(std::size_t n, std::size_t align = 0) noexcept {
  if (n == 0) n = 1;
  if (n < kLargeBytes || !hotops::HugePageScope::active())
    return align <= alignof(std::max_align_t) ? std::malloc(n) : std::aligned_alloc(align, (n + align - 1) / align * align);
  const std::size_t alignment = std::max(kHugePage, align);  // powers of two: a multiple of both
  const std::size_t rounded = (n + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p) return nullptr;
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without it the pages are small ones
  // Each page's first touch on every thread: the kernel zeroes a huge page at its fault, and the
  // caller's own first pass (a vector's zeros) is one thread's.
  hotops::touch_pages(p, rounded, kHugePage);
  return p;
}

// operator new's contract: on failure, the new-handler until it gives up, then std::bad_alloc.
void* allocate_or_throw(std::size_t n, std::size_t align = 0) {
  for (;;) {
    if (void* p = allocate(n, align)) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) throw std::bad_alloc();
    h();
  }
}

void* allocate_or_null(std::size_t n, std::size_t align = 0) noexcept {
  try {
    return allocate_or_throw(n, align);
  } catch (...) {
    return nullptr;
  }
}
}  // namespace

void* operator new(std::size_t n) { return allocate_or_throw(n); }
void* operator new[](std::size_t n) { return allocate_or_throw(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate_or_null(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
// The aligned forms (over-aligned types, and HostBuffer's storage).
void* operator new(std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate_or_null(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return allocate_or_null(n, static_cast<std::size_t>(a)); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#endif
