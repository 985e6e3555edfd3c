/*
 * dispatch.c - chooses the instruction set of the float32 dense kernels at
 * run time: AVX-512 ("avx512"), AVX2 + FMA ("avx2") or portable C
 * ("generic").
 *
 * Detection uses cpuid and xgetbv directly (not __builtin_cpu_supports),
 * because the relocatable object linked into TVM modules must not depend
 * on libgcc. An instruction set counts only when the OS also saves its
 * register state (XCR0), e.g. AVX-512 may be disabled by the kernel or a
 * hypervisor on a CPU that has it.
 *
 * The choice is made on first use, capped by the environment variable
 * TIRBYOC_ISA=generic|avx2|avx512, and can be changed with tirbyoc_set_isa.
 * It is one atomic int: racing first uses compute the same value.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TB_X86 1
#endif

#include "dense_f32_internal.h"

#ifdef TIRBYOC_NO_AVX512
/* built without the AVX-512 code: an AVX-512 CPU runs the AVX2 level */
enum { LEVEL_GENERIC, LEVEL_AVX2, LEVEL_COUNT, LEVEL_AVX512 = LEVEL_AVX2 };
#else
enum { LEVEL_GENERIC, LEVEL_AVX2, LEVEL_AVX512, LEVEL_COUNT };
#endif

static const tb_isa *const isa_table[LEVEL_COUNT] = {
    &tb_isa_generic, &tb_isa_avx2,
#ifndef TIRBYOC_NO_AVX512
    &tb_isa_avx512,
#endif
};

#ifdef TB_X86
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    /* xgetbv with ecx = 0; encoded as bytes for old assemblers. */
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* Highest level this CPU and OS support. */
static int detect_level(void)
{
#ifdef TB_X86
    unsigned int eax, ebx, ecx, edx;
    uint64_t xcr0;
    int fma, avx, osxsave, avx2, avx512f;

    if (!__get_cpuid_count(1, 0, &eax, &ebx, &ecx, &edx))
        return LEVEL_GENERIC;
    fma = (ecx >> 12) & 1;
    osxsave = (ecx >> 27) & 1;
    avx = (ecx >> 28) & 1;
    if (!osxsave || !avx || !fma)
        return LEVEL_GENERIC;
    xcr0 = read_xcr0();
    /* XMM (bit 1) and YMM (bit 2) state enabled by the OS. */
    if ((xcr0 & 0x6) != 0x6)
        return LEVEL_GENERIC;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return LEVEL_GENERIC;
    avx2 = (ebx >> 5) & 1;
    avx512f = (ebx >> 16) & 1;
    if (!avx2)
        return LEVEL_GENERIC;
    /* Opmask (bit 5), upper ZMM0-15 (bit 6), ZMM16-31 (bit 7). */
    if (avx512f && (xcr0 & 0xe0) == 0xe0)
        return LEVEL_AVX512;
    return LEVEL_AVX2;
#else
    return LEVEL_GENERIC;
#endif
}

static int level_by_name(const char *name)
{
    int level;
    if (name == NULL)
        return -1;
    for (level = 0; level < LEVEL_COUNT; ++level)
        if (strcmp(name, isa_table[level]->name) == 0)
            return level;
    return -1;
}

/* -1 until first computed; detection is pure, so races are harmless. */
static int cpu_level = -1;
static int active_level = -1;

static int supported_level(void)
{
    int level = __atomic_load_n(&cpu_level, __ATOMIC_ACQUIRE);
    if (level < 0) {
        level = detect_level();
        __atomic_store_n(&cpu_level, level, __ATOMIC_RELEASE);
    }
    return level;
}

const tb_isa *tb_active_isa(void)
{
    int level = __atomic_load_n(&active_level, __ATOMIC_ACQUIRE);
    if (level < 0) {
        int expected = -1;
        int cap = level_by_name(getenv("TIRBYOC_ISA"));
        level = supported_level();
        if (cap >= 0 && cap < level)
            level = cap;
        /* A concurrent tirbyoc_set_isa wins over the default. */
        if (!__atomic_compare_exchange_n(&active_level, &expected, level, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            level = expected;
    }
    return isa_table[level];
}

int32_t tirbyoc_set_isa(const char *name)
{
    int level = level_by_name(name);
    if (level < 0 || level > supported_level())
        return TIRBYOC_EINVAL;
    __atomic_store_n(&active_level, level, __ATOMIC_RELEASE);
    return TIRBYOC_OK;
}

const char *tirbyoc_isa(void) { return tb_active_isa()->name; }

/* ---- cache sizes ---- */

/* The defaults where cpuid does not describe the caches (a hypervisor that
 * hides them, another architecture): the smallest of the x86 CPUs tirbyoc
 * is fast on (32 KiB 8-way L1d; 256 KiB 4-way L2 of Intel's client cores). */
static const tb_caches default_caches = {32 * 1024, 8, 256 * 1024, 4, 64};
static tb_caches caches;
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

#ifdef TB_X86
/* Level `level` data (1) or unified (3) cache from the deterministic cache
 * parameters leaf (`leaf`: 4 or 0x8000001D); 0 if not listed. */
static int read_cache_leaf(unsigned int leaf, int level, int64_t *bytes,
                           int64_t *ways, int64_t *line)
{
    unsigned int eax, ebx, ecx, edx, sub;
    for (sub = 0; sub < 16; ++sub) {
        int type;
        if (!__get_cpuid_count(leaf, sub, &eax, &ebx, &ecx, &edx))
            return 0;
        type = (int)(eax & 31);
        if (type == 0)
            return 0;
        if ((type == 1 || type == 3) && (int)((eax >> 5) & 7) == level) {
            *ways = (int64_t)((ebx >> 22) & 1023) + 1;
            *line = (int64_t)(ebx & 4095) + 1;
            *bytes = *ways * ((int64_t)((ebx >> 12) & 1023) + 1) * *line *
                     ((int64_t)ecx + 1);
            return 1;
        }
    }
    return 0;
}
#endif

static void read_caches_into(tb_caches *out)
{
    *out = default_caches;
#ifdef TB_X86
    {
        unsigned int eax, ebx, ecx, edx, leaf = 4;
        tb_caches c = default_caches;
        if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) &&
            ebx == 0x68747541 /* "Auth"enticAMD */) {
            if (!__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) ||
                eax < 0x8000001D)
                return;
            leaf = 0x8000001D;
        } else if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx) || eax < 4) {
            return;
        }
        if (!read_cache_leaf(leaf, 1, &c.l1_bytes, &c.l1_ways, &c.line) ||
            !read_cache_leaf(leaf, 2, &c.l2_bytes, &c.l2_ways, &c.line))
            return;
        /* Implausible answers (a hypervisor's zeros) keep the defaults. */
        if (c.l1_bytes < 8 * 1024 || c.l2_bytes < c.l1_bytes ||
            c.l1_ways < 2 || c.l2_ways < 2 || c.line < 32 || c.line > 256)
            return;
        *out = c;
    }
#endif
}

/* The size at *p: decimal digits, then optionally K or M (KiB, MiB); 0 if
 * there is none. *p moves past it. */
static int64_t parse_size(const char **p)
{
    int64_t v = 0;
    int digits = 0;
    while (**p >= '0' && **p <= '9' && digits < 12) {
        v = v * 10 + (**p - '0');
        ++*p;
        ++digits;
    }
    if (digits == 0 || (**p >= '0' && **p <= '9'))
        return 0;
    if (**p == 'K' || **p == 'k') {
        v *= 1024;
        ++*p;
    } else if (**p == 'M' || **p == 'm') {
        v *= 1024 * 1024;
        ++*p;
    }
    return v;
}

/* TIRBYOC_CACHES="L1,L2" (e.g. "48K,2M") replaces the sizes cpuid gives
 * (the ways stay): to see, on one machine, the blocking another CPU's
 * caches give. 1 if it is set and unreadable or implausible (the detected
 * sizes stay; tirbyoc_cache_sizes reports it). */
static int caches_env_bad;

static void read_caches(void)
{
    const char *env = getenv("TIRBYOC_CACHES");
    read_caches_into(&caches);
    if (env != NULL) {
        const char *p = env;
        const int64_t l1 = parse_size(&p);
        const int64_t l2 = *p == ',' ? (++p, parse_size(&p)) : 0;
        if (*p != '\0' || l1 < 8 * 1024 || l1 > 1024 * 1024 || l2 < l1 ||
            l2 > 64 * 1024 * 1024)
            caches_env_bad = 1;
        else {
            caches.l1_bytes = l1;
            caches.l2_bytes = l2;
        }
    }
}

const tb_caches *tb_cache_sizes(void)
{
    pthread_once(&caches_once, read_caches);
    return &caches;
}

int32_t tirbyoc_cache_sizes(int64_t *sizes)
{
    const tb_caches *c = tb_cache_sizes();
    if (sizes == NULL)
        return TIRBYOC_ENULL;
    sizes[0] = c->l1_bytes;
    sizes[1] = c->l1_ways;
    sizes[2] = c->l2_bytes;
    sizes[3] = c->l2_ways;
    sizes[4] = c->line;
    return caches_env_bad ? TIRBYOC_EINVAL : TIRBYOC_OK;
}

int64_t tb_l2_half_floats(void)
{
    const int64_t f = tb_cache_sizes()->l2_bytes / 2 / (int64_t)sizeof(float);
    return f < 16 * 1024 ? 16 * 1024 : f > 128 * 1024 ? 128 * 1024 : f;
}

int64_t tb_rows_per_ablock(int64_t kc, int mr, int nr)
{
    const tb_caches *c = tb_cache_sizes();
    const int64_t way = c->l2_bytes / c->l2_ways; /* bytes per way */
    const int64_t w_ways = ((int64_t)nr * kc * 4 + way - 1) / way;
    int64_t ways = c->l2_ways - 1 - w_ways, rows;
    if (ways < 1)
        ways = 1;
    rows = ways * way / (kc * 4) / mr * mr;
    if (rows > TB_MC_MAX)
        rows = TB_MC_MAX / mr * mr;
    return rows < mr ? mr : rows;
}
