/* Run-time ISA selection: the build compiles every path the target
 * architecture has; this file decides which one the CPU can run. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

static int g_isa = -1;
/* AVX-VNNI (VEX vpdpbusd / vpdpwssd on ymm) under the AVX2 kernels: -1 not
 * probed yet, else 0/1 (KVQ_ISA=avx2 turns it off, avxvnni asks for it). */
static int g_avxvnni = -1;

#if defined(__x86_64__)
#include <cpuid.h>
/* CPUID directly: clang's __builtin_cpu_supports does not know "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
/* CPUID.(EAX=7, ECX=1):EAX bit 4; the AVX state the OS saves is already
 * implied by the AVX2 check that gates every use. */
static int cpu_avxvnni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_max(0, NULL) >= 7 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
#endif

int kvq_cpu_isa_available(kvq_isa isa) {
    switch (isa) {
    case KVQ_ISA_SCALAR: return 1;
#if defined(__x86_64__)
    case KVQ_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case KVQ_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               kvq_cpu_isa_available(KVQ_ISA_AVX2);
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON: return 1;
#endif
    default: return 0;
    }
}

const char *kvq_isa_name(kvq_isa isa) {
    switch (isa) {
    case KVQ_ISA_SCALAR: return "scalar";
    case KVQ_ISA_AVX2: return "avx2";
    case KVQ_ISA_AVX512: return "avx512";
    case KVQ_ISA_NEON: return "neon";
    }
    return "?";
}

static kvq_isa detect(void) {
    kvq_isa best = KVQ_ISA_SCALAR;
    const kvq_isa order[] = {KVQ_ISA_NEON, KVQ_ISA_AVX2, KVQ_ISA_AVX512};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (kvq_cpu_isa_available(order[i])) best = order[i];
    /* KVQ_ISA caps the choice (e.g. KVQ_ISA=avx2 on an AVX-512 machine). */
    const char *env = getenv("KVQ_ISA");
    if (env) {
        kvq_isa want = KVQ_ISA_SCALAR;
        int known = 0;
        if (strcmp(env, "avxvnni") == 0) /* AVX2's kernels with AVX-VNNI (an Alder Lake-class laptop) */
            want = KVQ_ISA_AVX2, known = 1;
        for (int i = KVQ_ISA_SCALAR; i <= KVQ_ISA_NEON && !known; i++)
            if (strcmp(env, kvq_isa_name((kvq_isa)i)) == 0) want = (kvq_isa)i, known = 1;
        if (known && kvq_cpu_isa_available(want)) best = want;
    }
    return best;
}

kvq_isa kvq_cpu_isa(void) {
    int v = __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
    if (v < 0) {
        v = (int)detect();
        __atomic_store_n(&g_isa, v, __ATOMIC_RELEASE);
    }
    return (kvq_isa)v;
}

int kvq_cpu_has_avxvnni(void) {
    int v = __atomic_load_n(&g_avxvnni, __ATOMIC_ACQUIRE);
    if (v < 0) {
#if defined(__x86_64__)
        const char *env = getenv("KVQ_ISA");
        /* KVQ_ISA=avx2 is the class without it (Zen 2/3, Intel before Alder Lake) */
        v = kvq_cpu_isa_available(KVQ_ISA_AVX2) && cpu_avxvnni() && !(env && strcmp(env, "avx2") == 0);
#else
        v = 0;
#endif
        __atomic_store_n(&g_avxvnni, v, __ATOMIC_RELEASE);
    }
    return v && kvq_cpu_isa() != KVQ_ISA_SCALAR && kvq_cpu_isa() != KVQ_ISA_NEON;
}

int kvq_cpu_set_avxvnni(int on) {
    int prev = kvq_cpu_has_avxvnni();
#if defined(__x86_64__)
    __atomic_store_n(&g_avxvnni, on && kvq_cpu_isa_available(KVQ_ISA_AVX2) && cpu_avxvnni(), __ATOMIC_RELEASE);
#else
    (void)on;
#endif
    return prev;
}

const char *kvq_cpu_class_name(void) {
    switch (kvq_cpu_isa()) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX2: return kvq_cpu_has_avxvnni() ? "avx2+avxvnni" : "avx2";
    case KVQ_ISA_AVX512: return kvq_cpu_has_vnni() ? "avx512+vnni" : "avx512";
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON: return kvq_cpu_has_dotprod() ? "neon+dotprod" : "neon";
#endif
    default: return kvq_isa_name(kvq_cpu_isa());
    }
}

kvq_isa kvq_cpu_set_isa(kvq_isa isa) {
    kvq_isa prev = kvq_cpu_isa();
    if (kvq_cpu_isa_available(isa)) __atomic_store_n(&g_isa, (int)isa, __ATOMIC_RELEASE);
    return prev;
}

/* Extensions the int8 kernels need beyond their ISA level, probed once. */
#if defined(__x86_64__)
int kvq_cpu_has_vnni(void) {
    static int vnni = -1;
    int v = __atomic_load_n(&vnni, __ATOMIC_ACQUIRE);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vnni") != 0;
        __atomic_store_n(&vnni, v, __ATOMIC_RELEASE);
    }
    return v;
}
#endif
#if defined(__aarch64__)
int kvq_cpu_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#endif
