// Heap accounting for benchmarks: the binary that links heap_counter.cc replaces the global
// operator new/delete with versions that keep a running total of live heap bytes.
//
// A block counts as malloc_usable_size(block) + 8 bytes (glibc's chunk header), i.e. what it
// really takes from the heap, so "bytes per item" figures include allocator rounding. Aligned
// new/delete keep their default (uncounted) implementations. Thread-safe (relaxed atomics).
#pragma once

#include <cstdint>

namespace rl::bench {

// Live heap bytes allocated through operator new and not yet freed.
int64_t LiveHeapBytes();

}  // namespace rl::bench
