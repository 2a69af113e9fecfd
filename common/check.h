// RL_CHECK: aborts the process when an internal invariant is broken, i.e. where going on would
// corrupt state. Never for what input or the environment can cause: those are absl::Status.
// (Debian's Abseil 20220623 predates absl/log, so this is the project's one CHECK.)
#pragma once

#include <cstdio>
#include <cstdlib>

#define RL_CHECK(cond)                                                                 \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: RL_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
