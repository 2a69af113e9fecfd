#include "bench/router/heap_counter.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace rl::bench {
namespace {

constexpr int64_t kChunkHeader = 8;
std::atomic<int64_t> live_bytes{0};

void* Allocate(size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) return nullptr;
  live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(p)) + kChunkHeader,
                       std::memory_order_relaxed);
  return p;
}

void Free(void* p) {
  if (p == nullptr) return;
  live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)) + kChunkHeader,
                       std::memory_order_relaxed);
  std::free(p);
}

}  // namespace

int64_t LiveHeapBytes() { return live_bytes.load(std::memory_order_relaxed); }

}  // namespace rl::bench

void* operator new(size_t size) {
  void* p = rl::bench::Allocate(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t size) {
  void* p = rl::bench::Allocate(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  return rl::bench::Allocate(size);
}
void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return rl::bench::Allocate(size);
}
void operator delete(void* p) noexcept { rl::bench::Free(p); }
void operator delete[](void* p) noexcept { rl::bench::Free(p); }
void operator delete(void* p, size_t) noexcept { rl::bench::Free(p); }
void operator delete[](void* p, size_t) noexcept { rl::bench::Free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { rl::bench::Free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { rl::bench::Free(p); }
