/* CPU features, read once per process (src/cpu.c). Reading CPUID is not state a caller sees:
 * the answer is the same on every call. The ISA cap for tests (SDPA_MAX_ISA) is applied by the
 * dispatcher, not here: these are the raw facts of the CPU and the operating system. */
#ifndef SDPA_CPU_H
#define SDPA_CPU_H

#include <stdbool.h>

/* Instruction-set levels of the micro-kernel and conversion tables, in increasing order within
 * an architecture: x86-64 has PORTABLE < AVX2 < AVX512, aarch64 PORTABLE < NEON. A CPU has only
 * its own architecture's levels (sdpa__cpu_has_isa), so a walk down from any level meets no
 * table of the other architecture (those tables are not compiled in). */
enum {
    SDPA__ISA_PORTABLE = 0,
    SDPA__ISA_AVX2 = 1,   /* AVX2 + FMA (+ F16C for the conversions) */
    SDPA__ISA_AVX512 = 2, /* AVX-512 F + BW (+ VL) */
    SDPA__ISA_NEON = 3,   /* aarch64 Advanced SIMD (ASIMD: f32 FMA, fcvtl/fcvtn of f16) */
    SDPA__ISA_COUNT = 4
};

/* Each flag is set only if the CPU reports the feature AND the OS saves the register state it
 * needs (XCR0: YMM for AVX*, opmask/ZMM for AVX-512, XTILECFG/XTILEDATA for AMX). AMX also needs
 * a per-process permission from Linux before its first use; `amx_tile`/`amx_bf16` do not say
 * whether it was granted (see sdpa_amx_available()). */
typedef struct sdpa__cpu {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl;
    bool avx512bf16; /* VCVTNE2PS2BF16, VCVTNEPS2BF16, VDPBF16PS */
    bool avx512fp16;
    bool avx512vnni; /* VPDPBUSD (0.6: REDUCED q8_0 key scores) */
    bool amx_tile, amx_bf16;
    /* aarch64 (Linux getauxval(AT_HWCAP / AT_HWCAP2)): ASIMD (NEON); FEAT_FP16 arithmetic
     * (HWCAP_FPHP and HWCAP_ASIMDHP); FEAT_BF16 (HWCAP2_BF16: BFDOT, BFMMLA, BFCVT); FEAT_DotProd
     * (HWCAP_ASIMDDP). Only asimd selects tables today; the others are reported (tests, docs)
     * for the FP16 / BF16 columns a later change may add. */
    bool asimd, fp16, bf16, dotprod;
} sdpa__cpu;

/* The features of this CPU; one CPUID/XGETBV read per process (pthread_once), never NULL. */
const sdpa__cpu *sdpa__cpu_features(void);

/* Whether the CPU has what table level `isa` (SDPA__ISA_*) needs: AVX2 = avx2 + fma + f16c,
 * AVX512 = that + avx512f + avx512bw + avx512vl, NEON = asimd. PORTABLE is always available. */
bool sdpa__cpu_has_isa(int isa);

/* Name of an ISA level for messages and test output: "portable", "avx2", "avx512", "neon". */
const char *sdpa__isa_name(int isa);

#endif
