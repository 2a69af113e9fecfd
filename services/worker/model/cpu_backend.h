// The CPU backend (cpu_backend.cc): the Backend ops on the kernels of kernels/cpu, over one
// thread pool. CreateCpuBackend(int) / (int, bool) in backend.h are shorthands for the options
// below. The kernels are chosen per CPU at run time (kernels/cpu/cpu_info.h), the same for
// every backend of the process.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/op_profile.h"
#include "services/worker/model/backend.h"

namespace rl::model {

struct CpuBackendOptions {
  int num_threads = 0;  // 0: hardware concurrency
  // Matmuls of BF16 weights round x to bf16 and add bf16 products (kernels/cpu/matmul_bf16.h:
  // faster, not exact); FAILED_PRECONDITION without AVX512-BF16.
  bool bf16_products = false;
  // When set (not owned; it must outlive the backend), every op's wall time, shape and rates
  // are added to it (runner_bench --op-profile).
  kernels::cpu::OpProfile* profile = nullptr;
  // The KV cache in 2 MiB pages (AllocateKvCache: MADV_HUGEPAGE before its pages are committed).
  // Decode attention reads one KV head's slice of each slot's row, in 4 KiB pages a TLB miss
  // per position: 8-10% of the attention's time (attention_bench --huge-pages=false).
  bool huge_page_kv_cache = false;
};

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

}  // namespace rl::model
