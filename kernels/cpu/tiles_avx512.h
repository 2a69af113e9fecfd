// The AVX-512 matmul tiles' k loops in inline asm (x86-64, GCC/Clang syntax), for BF16 weights:
// the exact mode's 6 x 4, 2 x 8 and 1 x 8 tiles (matmul.cc, Highway's AVX3 target) and the
// bf16-products mode's 8 x 3 tile (matmul_bf16.cc). Each accumulator gets exactly the operations
// of the intrinsics these loops replace, in the same order, so results are bit-identical; only
// register allocation and scheduling are fixed. Why asm: with 24 accumulators live, GCC 12's
// allocation of these loops depends on unrelated code around them (a branch added for the
// prefetch order made it keep a weight row pointer and a weight vector on the stack in every
// step: -15% on Zen 5), and in an 8 x 3 tile it spilled accumulators.
//
// Registers: accumulators from zmm0 (row-major), weights or their widened halves above them, x
// in zmm30, the exact mode's odd-half mask in zmm31. An exact step covers 32 elements of k: x is
// the paired copy (16 even elements, then the 16 odd ones) and each weight vector holds 16
// (even, odd) bf16 pairs, widened as even = pairs << 16 and odd = pairs & 0xFFFF0000, each
// FMA'd into the accumulator in that order. A products step covers 32 bf16 elements with one
// vdpbf16ps per (row, column). Each step prefetches lines of the next tile, then pf += pa. The
// accumulators start from acc_in (null: zero) and end in acc_out ([rows][cols][16] floats).
// Callers check that the CPU has AVX-512 (and AVX512-BF16 for the products tile).
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define RL_HAVE_ASM_TILES 1
#else
#define RL_HAVE_ASM_TILES 0
#endif

namespace rl::kernels::cpu::avx512 {

struct TileLoopArgs {
  const void* x0 = nullptr;      // row 0 of x at the span's first element
  int64_t xs = 0;                // bytes between rows of x
  const uint16_t* w0 = nullptr;  // weight row 0 at the span's first element
  int64_t ws = 0;                // bytes between weight rows
  const char* pf = nullptr;      // the step's first line to prefetch
  int64_t ps = 0;                // bytes between a step's prefetched lines (6 x 4, 8 x 3)
  int64_t pa = 0;                // bytes pf advances per step (6 x 4, 8 x 3; else 512)
  int64_t steps = 0;
  const float* acc_in = nullptr;
  float* acc_out = nullptr;
};

#if RL_HAVE_ASM_TILES

inline constexpr uint32_t kOddMask = 0xFFFF0000u;

// The exact 6 x 4 tile (accumulators zmm0-23, widened weights zmm24-27): each weight vector is
// read twice from L1, shifted then ANDed (keeping both halves plus the raw vectors would need 33
// registers). Prefetches pf + {0, 1, 2, 3} ps.
__attribute__((target("avx512f"))) inline void Exact6x4(const TileLoopArgs& a) {
  const char* xa = static_cast<const char*>(a.x0);
  const char* xb = xa + 3 * a.xs;
  const char* wa = reinterpret_cast<const char*>(a.w0);
  const char* wb = wa + 2 * a.ws;
  const char* pf = a.pf;
  const char* pf3 = a.pf + 3 * a.ps;
  int64_t n = a.steps;
  __asm__ volatile(
      "test %[in], %[in]\n\t"
      "jz 3f\n\t"
      "vmovaps 0(%[in]), %%zmm0\n\t"
      "vmovaps 64(%[in]), %%zmm1\n\t"
      "vmovaps 128(%[in]), %%zmm2\n\t"
      "vmovaps 192(%[in]), %%zmm3\n\t"
      "vmovaps 256(%[in]), %%zmm4\n\t"
      "vmovaps 320(%[in]), %%zmm5\n\t"
      "vmovaps 384(%[in]), %%zmm6\n\t"
      "vmovaps 448(%[in]), %%zmm7\n\t"
      "vmovaps 512(%[in]), %%zmm8\n\t"
      "vmovaps 576(%[in]), %%zmm9\n\t"
      "vmovaps 640(%[in]), %%zmm10\n\t"
      "vmovaps 704(%[in]), %%zmm11\n\t"
      "vmovaps 768(%[in]), %%zmm12\n\t"
      "vmovaps 832(%[in]), %%zmm13\n\t"
      "vmovaps 896(%[in]), %%zmm14\n\t"
      "vmovaps 960(%[in]), %%zmm15\n\t"
      "vmovaps 1024(%[in]), %%zmm16\n\t"
      "vmovaps 1088(%[in]), %%zmm17\n\t"
      "vmovaps 1152(%[in]), %%zmm18\n\t"
      "vmovaps 1216(%[in]), %%zmm19\n\t"
      "vmovaps 1280(%[in]), %%zmm20\n\t"
      "vmovaps 1344(%[in]), %%zmm21\n\t"
      "vmovaps 1408(%[in]), %%zmm22\n\t"
      "vmovaps 1472(%[in]), %%zmm23\n\t"
      "jmp 4f\n\t"
      "3:\n\t"
      "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
      "vmovaps %%zmm31, %%zmm0\n\t"
      "vmovaps %%zmm31, %%zmm1\n\t"
      "vmovaps %%zmm31, %%zmm2\n\t"
      "vmovaps %%zmm31, %%zmm3\n\t"
      "vmovaps %%zmm31, %%zmm4\n\t"
      "vmovaps %%zmm31, %%zmm5\n\t"
      "vmovaps %%zmm31, %%zmm6\n\t"
      "vmovaps %%zmm31, %%zmm7\n\t"
      "vmovaps %%zmm31, %%zmm8\n\t"
      "vmovaps %%zmm31, %%zmm9\n\t"
      "vmovaps %%zmm31, %%zmm10\n\t"
      "vmovaps %%zmm31, %%zmm11\n\t"
      "vmovaps %%zmm31, %%zmm12\n\t"
      "vmovaps %%zmm31, %%zmm13\n\t"
      "vmovaps %%zmm31, %%zmm14\n\t"
      "vmovaps %%zmm31, %%zmm15\n\t"
      "vmovaps %%zmm31, %%zmm16\n\t"
      "vmovaps %%zmm31, %%zmm17\n\t"
      "vmovaps %%zmm31, %%zmm18\n\t"
      "vmovaps %%zmm31, %%zmm19\n\t"
      "vmovaps %%zmm31, %%zmm20\n\t"
      "vmovaps %%zmm31, %%zmm21\n\t"
      "vmovaps %%zmm31, %%zmm22\n\t"
      "vmovaps %%zmm31, %%zmm23\n\t"
      "4:\n\t"
      "vpbroadcastd %[mask], %%zmm31\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n\t"
      "1:\n\t"
      "prefetcht0 (%[pf])\n\t"
      "prefetcht0 (%[pf],%[ps],1)\n\t"
      "prefetcht0 (%[pf],%[ps],2)\n\t"
      "prefetcht0 (%[pf3])\n\t"
      "vpslld $16, (%[wa]), %%zmm24\n\t"
      "vpslld $16, (%[wa],%[ws],1), %%zmm25\n\t"
      "vpslld $16, (%[wb]), %%zmm26\n\t"
      "vpslld $16, (%[wb],%[ws],1), %%zmm27\n\t"
      "vmovups (%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm3\n\t"
      "vmovups (%[xa],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm7\n\t"
      "vmovups (%[xa],%[xs],2), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm8\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm9\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm10\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm11\n\t"
      "vmovups (%[xb]), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm12\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm13\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm14\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm15\n\t"
      "vmovups (%[xb],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm16\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm17\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm18\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm19\n\t"
      "vmovups (%[xb],%[xs],2), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm20\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm21\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm22\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm23\n\t"
      "vpandd (%[wa]), %%zmm31, %%zmm24\n\t"
      "vpandd (%[wa],%[ws],1), %%zmm31, %%zmm25\n\t"
      "vpandd (%[wb]), %%zmm31, %%zmm26\n\t"
      "vpandd (%[wb],%[ws],1), %%zmm31, %%zmm27\n\t"
      "vmovups 64(%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm3\n\t"
      "vmovups 64(%[xa],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm7\n\t"
      "vmovups 64(%[xa],%[xs],2), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm8\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm9\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm10\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm11\n\t"
      "vmovups 64(%[xb]), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm12\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm13\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm14\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm15\n\t"
      "vmovups 64(%[xb],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm16\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm17\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm18\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm19\n\t"
      "vmovups 64(%[xb],%[xs],2), %%zmm30\n\t"
      "vfmadd231ps %%zmm24, %%zmm30, %%zmm20\n\t"
      "vfmadd231ps %%zmm25, %%zmm30, %%zmm21\n\t"
      "vfmadd231ps %%zmm26, %%zmm30, %%zmm22\n\t"
      "vfmadd231ps %%zmm27, %%zmm30, %%zmm23\n\t"
      "add $128, %[xa]\n\t"
      "add $128, %[xb]\n\t"
      "add $64, %[wa]\n\t"
      "add $64, %[wb]\n\t"
      "add %[pa], %[pf]\n\t"
      "add %[pa], %[pf3]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovaps %%zmm0, 0(%[out])\n\t"
      "vmovaps %%zmm1, 64(%[out])\n\t"
      "vmovaps %%zmm2, 128(%[out])\n\t"
      "vmovaps %%zmm3, 192(%[out])\n\t"
      "vmovaps %%zmm4, 256(%[out])\n\t"
      "vmovaps %%zmm5, 320(%[out])\n\t"
      "vmovaps %%zmm6, 384(%[out])\n\t"
      "vmovaps %%zmm7, 448(%[out])\n\t"
      "vmovaps %%zmm8, 512(%[out])\n\t"
      "vmovaps %%zmm9, 576(%[out])\n\t"
      "vmovaps %%zmm10, 640(%[out])\n\t"
      "vmovaps %%zmm11, 704(%[out])\n\t"
      "vmovaps %%zmm12, 768(%[out])\n\t"
      "vmovaps %%zmm13, 832(%[out])\n\t"
      "vmovaps %%zmm14, 896(%[out])\n\t"
      "vmovaps %%zmm15, 960(%[out])\n\t"
      "vmovaps %%zmm16, 1024(%[out])\n\t"
      "vmovaps %%zmm17, 1088(%[out])\n\t"
      "vmovaps %%zmm18, 1152(%[out])\n\t"
      "vmovaps %%zmm19, 1216(%[out])\n\t"
      "vmovaps %%zmm20, 1280(%[out])\n\t"
      "vmovaps %%zmm21, 1344(%[out])\n\t"
      "vmovaps %%zmm22, 1408(%[out])\n\t"
      "vmovaps %%zmm23, 1472(%[out])\n\t"
      : [xa] "+r"(xa), [xb] "+r"(xb), [wa] "+r"(wa), [wb] "+r"(wb), [pf] "+r"(pf), [pf3] "+r"(pf3),
        [n] "+r"(n)
      : [xs] "r"(a.xs), [ws] "r"(a.ws), [ps] "r"(a.ps), [pa] "r"(a.pa), [mask] "m"(kOddMask),
        [in] "r"(a.acc_in), [out] "r"(a.acc_out)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
        "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30",
        "xmm31", "memory", "cc");
}

// The exact 2 x 8 tile (decode of two sequences; accumulators zmm0-15, widened weights
// zmm16-23, each weight vector read twice from L1). Over a whole k only: prefetches the 8 lines at
// pf (the next tile's, in address order), pf += 512.
__attribute__((target("avx512f"))) inline void Exact2x8(const TileLoopArgs& a) {
  const char* xa = static_cast<const char*>(a.x0);
  const char* wa = reinterpret_cast<const char*>(a.w0);
  const char* wb = wa + 3 * a.ws;
  const char* wc = wa + 6 * a.ws;
  const char* pf = a.pf;
  int64_t n = a.steps;
  __asm__ volatile(
      "test %[in], %[in]\n\t"
      "jz 3f\n\t"
      "vmovaps 0(%[in]), %%zmm0\n\t"
      "vmovaps 64(%[in]), %%zmm1\n\t"
      "vmovaps 128(%[in]), %%zmm2\n\t"
      "vmovaps 192(%[in]), %%zmm3\n\t"
      "vmovaps 256(%[in]), %%zmm4\n\t"
      "vmovaps 320(%[in]), %%zmm5\n\t"
      "vmovaps 384(%[in]), %%zmm6\n\t"
      "vmovaps 448(%[in]), %%zmm7\n\t"
      "vmovaps 512(%[in]), %%zmm8\n\t"
      "vmovaps 576(%[in]), %%zmm9\n\t"
      "vmovaps 640(%[in]), %%zmm10\n\t"
      "vmovaps 704(%[in]), %%zmm11\n\t"
      "vmovaps 768(%[in]), %%zmm12\n\t"
      "vmovaps 832(%[in]), %%zmm13\n\t"
      "vmovaps 896(%[in]), %%zmm14\n\t"
      "vmovaps 960(%[in]), %%zmm15\n\t"
      "jmp 4f\n\t"
      "3:\n\t"
      "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
      "vmovaps %%zmm31, %%zmm0\n\t"
      "vmovaps %%zmm31, %%zmm1\n\t"
      "vmovaps %%zmm31, %%zmm2\n\t"
      "vmovaps %%zmm31, %%zmm3\n\t"
      "vmovaps %%zmm31, %%zmm4\n\t"
      "vmovaps %%zmm31, %%zmm5\n\t"
      "vmovaps %%zmm31, %%zmm6\n\t"
      "vmovaps %%zmm31, %%zmm7\n\t"
      "vmovaps %%zmm31, %%zmm8\n\t"
      "vmovaps %%zmm31, %%zmm9\n\t"
      "vmovaps %%zmm31, %%zmm10\n\t"
      "vmovaps %%zmm31, %%zmm11\n\t"
      "vmovaps %%zmm31, %%zmm12\n\t"
      "vmovaps %%zmm31, %%zmm13\n\t"
      "vmovaps %%zmm31, %%zmm14\n\t"
      "vmovaps %%zmm31, %%zmm15\n\t"
      "4:\n\t"
      "vpbroadcastd %[mask], %%zmm31\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n\t"
      "1:\n\t"
      "prefetcht0 0(%[pf])\n\t"
      "prefetcht0 64(%[pf])\n\t"
      "prefetcht0 128(%[pf])\n\t"
      "prefetcht0 192(%[pf])\n\t"
      "prefetcht0 256(%[pf])\n\t"
      "prefetcht0 320(%[pf])\n\t"
      "prefetcht0 384(%[pf])\n\t"
      "prefetcht0 448(%[pf])\n\t"
      "vpslld $16, (%[wa]), %%zmm16\n\t"
      "vpslld $16, (%[wa],%[ws],1), %%zmm17\n\t"
      "vpslld $16, (%[wa],%[ws],2), %%zmm18\n\t"
      "vpslld $16, (%[wb]), %%zmm19\n\t"
      "vpslld $16, (%[wb],%[ws],1), %%zmm20\n\t"
      "vpslld $16, (%[wb],%[ws],2), %%zmm21\n\t"
      "vpslld $16, (%[wc]), %%zmm22\n\t"
      "vpslld $16, (%[wc],%[ws],1), %%zmm23\n\t"
      "vmovups (%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm3\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm7\n\t"
      "vmovups (%[xa],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm8\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm9\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm10\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm11\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm12\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm13\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm14\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm15\n\t"
      "vpandd (%[wa]), %%zmm31, %%zmm16\n\t"
      "vpandd (%[wa],%[ws],1), %%zmm31, %%zmm17\n\t"
      "vpandd (%[wa],%[ws],2), %%zmm31, %%zmm18\n\t"
      "vpandd (%[wb]), %%zmm31, %%zmm19\n\t"
      "vpandd (%[wb],%[ws],1), %%zmm31, %%zmm20\n\t"
      "vpandd (%[wb],%[ws],2), %%zmm31, %%zmm21\n\t"
      "vpandd (%[wc]), %%zmm31, %%zmm22\n\t"
      "vpandd (%[wc],%[ws],1), %%zmm31, %%zmm23\n\t"
      "vmovups 64(%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm3\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm7\n\t"
      "vmovups 64(%[xa],%[xs],1), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm8\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm9\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm10\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm11\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm12\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm13\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm14\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm15\n\t"
      "add $128, %[xa]\n\t"
      "add $64, %[wa]\n\t"
      "add $64, %[wb]\n\t"
      "add $64, %[wc]\n\t"
      "add $512, %[pf]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovaps %%zmm0, 0(%[out])\n\t"
      "vmovaps %%zmm1, 64(%[out])\n\t"
      "vmovaps %%zmm2, 128(%[out])\n\t"
      "vmovaps %%zmm3, 192(%[out])\n\t"
      "vmovaps %%zmm4, 256(%[out])\n\t"
      "vmovaps %%zmm5, 320(%[out])\n\t"
      "vmovaps %%zmm6, 384(%[out])\n\t"
      "vmovaps %%zmm7, 448(%[out])\n\t"
      "vmovaps %%zmm8, 512(%[out])\n\t"
      "vmovaps %%zmm9, 576(%[out])\n\t"
      "vmovaps %%zmm10, 640(%[out])\n\t"
      "vmovaps %%zmm11, 704(%[out])\n\t"
      "vmovaps %%zmm12, 768(%[out])\n\t"
      "vmovaps %%zmm13, 832(%[out])\n\t"
      "vmovaps %%zmm14, 896(%[out])\n\t"
      "vmovaps %%zmm15, 960(%[out])\n\t"
      : [xa] "+r"(xa), [wa] "+r"(wa), [wb] "+r"(wb), [wc] "+r"(wc), [pf] "+r"(pf), [n] "+r"(n)
      :
      [xs] "r"(a.xs), [ws] "r"(a.ws), [mask] "m"(kOddMask), [in] "r"(a.acc_in), [out] "r"(a.acc_out)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
        "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30",
        "xmm31", "memory", "cc");
}

// The exact 1 x 8 tile (decode of one sequence; accumulators zmm0-7, raw weights zmm8-15 read
// once, widened halves zmm16-23). Over a whole k only: prefetches the 8 lines at pf, pf += 512.
__attribute__((target("avx512f"))) inline void Exact1x8(const TileLoopArgs& a) {
  const char* xa = static_cast<const char*>(a.x0);
  const char* wa = reinterpret_cast<const char*>(a.w0);
  const char* wb = wa + 3 * a.ws;
  const char* wc = wa + 6 * a.ws;
  const char* pf = a.pf;
  int64_t n = a.steps;
  __asm__ volatile(
      "test %[in], %[in]\n\t"
      "jz 3f\n\t"
      "vmovaps 0(%[in]), %%zmm0\n\t"
      "vmovaps 64(%[in]), %%zmm1\n\t"
      "vmovaps 128(%[in]), %%zmm2\n\t"
      "vmovaps 192(%[in]), %%zmm3\n\t"
      "vmovaps 256(%[in]), %%zmm4\n\t"
      "vmovaps 320(%[in]), %%zmm5\n\t"
      "vmovaps 384(%[in]), %%zmm6\n\t"
      "vmovaps 448(%[in]), %%zmm7\n\t"
      "jmp 4f\n\t"
      "3:\n\t"
      "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
      "vmovaps %%zmm31, %%zmm0\n\t"
      "vmovaps %%zmm31, %%zmm1\n\t"
      "vmovaps %%zmm31, %%zmm2\n\t"
      "vmovaps %%zmm31, %%zmm3\n\t"
      "vmovaps %%zmm31, %%zmm4\n\t"
      "vmovaps %%zmm31, %%zmm5\n\t"
      "vmovaps %%zmm31, %%zmm6\n\t"
      "vmovaps %%zmm31, %%zmm7\n\t"
      "4:\n\t"
      "vpbroadcastd %[mask], %%zmm31\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n\t"
      "1:\n\t"
      "prefetcht0 0(%[pf])\n\t"
      "prefetcht0 64(%[pf])\n\t"
      "prefetcht0 128(%[pf])\n\t"
      "prefetcht0 192(%[pf])\n\t"
      "prefetcht0 256(%[pf])\n\t"
      "prefetcht0 320(%[pf])\n\t"
      "prefetcht0 384(%[pf])\n\t"
      "prefetcht0 448(%[pf])\n\t"
      "vmovdqu64 (%[wa]), %%zmm8\n\t"
      "vmovdqu64 (%[wa],%[ws],1), %%zmm9\n\t"
      "vmovdqu64 (%[wa],%[ws],2), %%zmm10\n\t"
      "vmovdqu64 (%[wb]), %%zmm11\n\t"
      "vmovdqu64 (%[wb],%[ws],1), %%zmm12\n\t"
      "vmovdqu64 (%[wb],%[ws],2), %%zmm13\n\t"
      "vmovdqu64 (%[wc]), %%zmm14\n\t"
      "vmovdqu64 (%[wc],%[ws],1), %%zmm15\n\t"
      "vpslld $16, %%zmm8, %%zmm16\n\t"
      "vpslld $16, %%zmm9, %%zmm17\n\t"
      "vpslld $16, %%zmm10, %%zmm18\n\t"
      "vpslld $16, %%zmm11, %%zmm19\n\t"
      "vpslld $16, %%zmm12, %%zmm20\n\t"
      "vpslld $16, %%zmm13, %%zmm21\n\t"
      "vpslld $16, %%zmm14, %%zmm22\n\t"
      "vpslld $16, %%zmm15, %%zmm23\n\t"
      "vmovups (%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm3\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm7\n\t"
      "vpandd %%zmm8, %%zmm31, %%zmm16\n\t"
      "vpandd %%zmm9, %%zmm31, %%zmm17\n\t"
      "vpandd %%zmm10, %%zmm31, %%zmm18\n\t"
      "vpandd %%zmm11, %%zmm31, %%zmm19\n\t"
      "vpandd %%zmm12, %%zmm31, %%zmm20\n\t"
      "vpandd %%zmm13, %%zmm31, %%zmm21\n\t"
      "vpandd %%zmm14, %%zmm31, %%zmm22\n\t"
      "vpandd %%zmm15, %%zmm31, %%zmm23\n\t"
      "vmovups 64(%[xa]), %%zmm30\n\t"
      "vfmadd231ps %%zmm16, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm17, %%zmm30, %%zmm1\n\t"
      "vfmadd231ps %%zmm18, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm19, %%zmm30, %%zmm3\n\t"
      "vfmadd231ps %%zmm20, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm21, %%zmm30, %%zmm5\n\t"
      "vfmadd231ps %%zmm22, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm23, %%zmm30, %%zmm7\n\t"
      "add $128, %[xa]\n\t"
      "add $64, %[wa]\n\t"
      "add $64, %[wb]\n\t"
      "add $64, %[wc]\n\t"
      "add $512, %[pf]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovaps %%zmm0, 0(%[out])\n\t"
      "vmovaps %%zmm1, 64(%[out])\n\t"
      "vmovaps %%zmm2, 128(%[out])\n\t"
      "vmovaps %%zmm3, 192(%[out])\n\t"
      "vmovaps %%zmm4, 256(%[out])\n\t"
      "vmovaps %%zmm5, 320(%[out])\n\t"
      "vmovaps %%zmm6, 384(%[out])\n\t"
      "vmovaps %%zmm7, 448(%[out])\n\t"
      : [xa] "+r"(xa), [wa] "+r"(wa), [wb] "+r"(wb), [wc] "+r"(wc), [pf] "+r"(pf), [n] "+r"(n)
      : [ws] "r"(a.ws), [mask] "m"(kOddMask), [in] "r"(a.acc_in), [out] "r"(a.acc_out)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
        "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30",
        "xmm31", "memory", "cc");
}

// The bf16-products 8 x 3 tile (accumulators zmm0-23, weights zmm24-26; rows 0-2 of x from xa,
// 3-5 from xb, 6-7 from xc). Prefetches pf + {0, 1, 2} ps. Needs AVX512-BF16.
__attribute__((target("avx512f"))) inline void Products8x3(const TileLoopArgs& a) {
  const char* xa = static_cast<const char*>(a.x0);
  const char* xb = xa + 3 * a.xs;
  const char* xc = xa + 6 * a.xs;
  const char* wa = reinterpret_cast<const char*>(a.w0);
  const char* pf = a.pf;
  int64_t n = a.steps;
  __asm__ volatile(
      "test %[in], %[in]\n\t"
      "jz 3f\n\t"
      "vmovaps 0(%[in]), %%zmm0\n\t"
      "vmovaps 64(%[in]), %%zmm1\n\t"
      "vmovaps 128(%[in]), %%zmm2\n\t"
      "vmovaps 192(%[in]), %%zmm3\n\t"
      "vmovaps 256(%[in]), %%zmm4\n\t"
      "vmovaps 320(%[in]), %%zmm5\n\t"
      "vmovaps 384(%[in]), %%zmm6\n\t"
      "vmovaps 448(%[in]), %%zmm7\n\t"
      "vmovaps 512(%[in]), %%zmm8\n\t"
      "vmovaps 576(%[in]), %%zmm9\n\t"
      "vmovaps 640(%[in]), %%zmm10\n\t"
      "vmovaps 704(%[in]), %%zmm11\n\t"
      "vmovaps 768(%[in]), %%zmm12\n\t"
      "vmovaps 832(%[in]), %%zmm13\n\t"
      "vmovaps 896(%[in]), %%zmm14\n\t"
      "vmovaps 960(%[in]), %%zmm15\n\t"
      "vmovaps 1024(%[in]), %%zmm16\n\t"
      "vmovaps 1088(%[in]), %%zmm17\n\t"
      "vmovaps 1152(%[in]), %%zmm18\n\t"
      "vmovaps 1216(%[in]), %%zmm19\n\t"
      "vmovaps 1280(%[in]), %%zmm20\n\t"
      "vmovaps 1344(%[in]), %%zmm21\n\t"
      "vmovaps 1408(%[in]), %%zmm22\n\t"
      "vmovaps 1472(%[in]), %%zmm23\n\t"
      "jmp 4f\n\t"
      "3:\n\t"
      "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
      "vmovaps %%zmm31, %%zmm0\n\t"
      "vmovaps %%zmm31, %%zmm1\n\t"
      "vmovaps %%zmm31, %%zmm2\n\t"
      "vmovaps %%zmm31, %%zmm3\n\t"
      "vmovaps %%zmm31, %%zmm4\n\t"
      "vmovaps %%zmm31, %%zmm5\n\t"
      "vmovaps %%zmm31, %%zmm6\n\t"
      "vmovaps %%zmm31, %%zmm7\n\t"
      "vmovaps %%zmm31, %%zmm8\n\t"
      "vmovaps %%zmm31, %%zmm9\n\t"
      "vmovaps %%zmm31, %%zmm10\n\t"
      "vmovaps %%zmm31, %%zmm11\n\t"
      "vmovaps %%zmm31, %%zmm12\n\t"
      "vmovaps %%zmm31, %%zmm13\n\t"
      "vmovaps %%zmm31, %%zmm14\n\t"
      "vmovaps %%zmm31, %%zmm15\n\t"
      "vmovaps %%zmm31, %%zmm16\n\t"
      "vmovaps %%zmm31, %%zmm17\n\t"
      "vmovaps %%zmm31, %%zmm18\n\t"
      "vmovaps %%zmm31, %%zmm19\n\t"
      "vmovaps %%zmm31, %%zmm20\n\t"
      "vmovaps %%zmm31, %%zmm21\n\t"
      "vmovaps %%zmm31, %%zmm22\n\t"
      "vmovaps %%zmm31, %%zmm23\n\t"
      "4:\n\t"
      "test %[n], %[n]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n\t"
      "1:\n\t"
      "vmovdqu64 (%[wa]), %%zmm24\n\t"
      "vmovdqu64 (%[wa],%[ws],1), %%zmm25\n\t"
      "vmovdqu64 (%[wa],%[ws],2), %%zmm26\n\t"
      "prefetcht0 (%[pf])\n\t"
      "prefetcht0 (%[pf],%[ps],1)\n\t"
      "prefetcht0 (%[pf],%[ps],2)\n\t"
      "vmovups (%[xa]), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm0\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm1\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm2\n\t"
      "vmovups (%[xa],%[xs],1), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm3\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm4\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm5\n\t"
      "vmovups (%[xa],%[xs],2), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm6\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm7\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm8\n\t"
      "vmovups (%[xb]), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm9\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm10\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm11\n\t"
      "vmovups (%[xb],%[xs],1), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm12\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm13\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm14\n\t"
      "vmovups (%[xb],%[xs],2), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm15\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm16\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm17\n\t"
      "vmovups (%[xc]), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm18\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm19\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm20\n\t"
      "vmovups (%[xc],%[xs],1), %%zmm30\n\t"
      "vdpbf16ps %%zmm24, %%zmm30, %%zmm21\n\t"
      "vdpbf16ps %%zmm25, %%zmm30, %%zmm22\n\t"
      "vdpbf16ps %%zmm26, %%zmm30, %%zmm23\n\t"
      "add $64, %[xa]\n\t"
      "add $64, %[xb]\n\t"
      "add $64, %[xc]\n\t"
      "add $64, %[wa]\n\t"
      "add %[pa], %[pf]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "vmovaps %%zmm0, 0(%[out])\n\t"
      "vmovaps %%zmm1, 64(%[out])\n\t"
      "vmovaps %%zmm2, 128(%[out])\n\t"
      "vmovaps %%zmm3, 192(%[out])\n\t"
      "vmovaps %%zmm4, 256(%[out])\n\t"
      "vmovaps %%zmm5, 320(%[out])\n\t"
      "vmovaps %%zmm6, 384(%[out])\n\t"
      "vmovaps %%zmm7, 448(%[out])\n\t"
      "vmovaps %%zmm8, 512(%[out])\n\t"
      "vmovaps %%zmm9, 576(%[out])\n\t"
      "vmovaps %%zmm10, 640(%[out])\n\t"
      "vmovaps %%zmm11, 704(%[out])\n\t"
      "vmovaps %%zmm12, 768(%[out])\n\t"
      "vmovaps %%zmm13, 832(%[out])\n\t"
      "vmovaps %%zmm14, 896(%[out])\n\t"
      "vmovaps %%zmm15, 960(%[out])\n\t"
      "vmovaps %%zmm16, 1024(%[out])\n\t"
      "vmovaps %%zmm17, 1088(%[out])\n\t"
      "vmovaps %%zmm18, 1152(%[out])\n\t"
      "vmovaps %%zmm19, 1216(%[out])\n\t"
      "vmovaps %%zmm20, 1280(%[out])\n\t"
      "vmovaps %%zmm21, 1344(%[out])\n\t"
      "vmovaps %%zmm22, 1408(%[out])\n\t"
      "vmovaps %%zmm23, 1472(%[out])\n\t"
      : [xa] "+r"(xa), [xb] "+r"(xb), [xc] "+r"(xc), [wa] "+r"(wa), [pf] "+r"(pf), [n] "+r"(n)
      : [xs] "r"(a.xs), [ws] "r"(a.ws), [ps] "r"(a.ps), [pa] "r"(a.pa), [in] "r"(a.acc_in),
        [out] "r"(a.acc_out)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20",
        "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30",
        "xmm31", "memory", "cc");
}

#endif  // RL_HAVE_ASM_TILES

}  // namespace rl::kernels::cpu::avx512
