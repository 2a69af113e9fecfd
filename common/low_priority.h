// RunAtLowPriority: runs `fn` on a short-lived thread of its own whose scheduling priority is
// lowered by `nice` (Linux nice values are per thread), and waits for it. For background work that
// shares the cores with latency-bound work in the same process: a worker's staging read (a
// checkpoint read, hashed and scanned while the engine decodes) yields the core to the engine
// thread when both want it, and takes whatever is idle otherwise. A fresh thread rather than the
// caller's: raising a thread's nice value cannot be undone without CAP_SYS_NICE, and the caller
// is usually a pooled thread. Cost: one thread start and join per call (tens of microseconds);
// the work itself runs no slower on an idle core. When the priority cannot be changed the work
// runs anyway, at the caller's.
#pragma once

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace rl {

// The calling thread's nice value (per thread on Linux).
inline int CurrentThreadNice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

// Lowers the calling thread's priority by `nice` levels from `base` (its own nice value unless
// given), capped at 19; nothing for `nice` <= 0. Best effort: a refusal leaves it unchanged. For
// a thread that runs background work for the rest of its life (it cannot be raised back).
inline void LowerThreadPriority(int nice, int base = CurrentThreadNice()) {
  if (nice <= 0) return;
  const int target = base + nice > 19 ? 19 : base + nice;
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), target);
}

template <typename Fn>
auto RunAtLowPriority(int nice, Fn&& fn) -> decltype(fn()) {
  using Result = decltype(fn());
  const int base = CurrentThreadNice();  // the caller's: the new thread is lowered from it
  auto lowered = [&] { LowerThreadPriority(nice, base); };
  if constexpr (std::is_void_v<Result>) {
    std::thread t([&] {
      lowered();
      std::forward<Fn>(fn)();
    });
    t.join();
  } else {
    std::optional<Result> out;
    std::thread t([&] {
      lowered();
      out.emplace(std::forward<Fn>(fn)());
    });
    t.join();
    return *std::move(out);
  }
}

}  // namespace rl
