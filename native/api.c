/* Library state and the quantized-product entry points: CPU feature detection, the run-time
 * dispatch table (per type, the best kernel of the selected ISA, falling back to lower ISAs),
 * LLMEDGE_ISA, scratch buffers, and the matmul driver (activation quantization, then row-chunked
 * matrix-vector products for decode or row x column tiles for prefill, over the thread pool), and
 * which prefetch hint the weight streams take (lle_set_weight_prefetch).
 */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#if defined(LLE_ARM64) && defined(__linux__)
#include <sys/auxv.h>
#endif

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized = 0;
static int g_requested_threads = 1;  /* the pool size asked for; restored in a forked child */
static int g_forked = 0;
static int g_cpu = 0;
static int g_isa = ISA_SCALAR;
static lle_kernels g_active[T_COUNT];
static int g_kernel_isa[T_COUNT];

void lle_build_gelu_table(void);

/* fork(): hold the library lock across it so the child never inherits it locked mid-call */
static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void atfork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    lle_pool_atfork_child();
    g_forked = 1;
}

void lle_lock(void) { pthread_mutex_lock(&g_lock); }
void lle_unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ---------------------------------------------------------------- scratch */

typedef struct { void *p; size_t size; } scratch_buf;
static scratch_buf g_scratch_mm, g_scratch_ops, g_scratch_kv;

static void *scratch_get(scratch_buf *b, size_t bytes) {
    if (bytes <= b->size) return b->p;
    size_t want = bytes + bytes / 4 + 4096;
    want = (want + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, want);
    if (!p) return NULL;
    free(b->p);
    b->p = p;
    b->size = want;
    return p;
}

/* ---- background prefetch (see common.h): ranges cut into lines, each thread's share of them handed
 * out by that thread's own cursor */
enum { BG_LINES = 32 };  /* lines per call: a chunk of a product takes ~1 us, 32 lines of DRAM ~0.1 us of bandwidth */
#define BG_CAP ((size_t)512 * 1024)
typedef struct { _Alignas(64) int64_t line, end; } lle_bg_cursor;
static struct {
    lle_pf_range r[LLE_BG_MAX_RANGES];
    int64_t end[LLE_BG_MAX_RANGES];  /* cumulative line counts */
    int n, shares;
    int64_t total;
    lle_bg_cursor cursor[LLE_CHUNK_RANGES];
} g_bg;

void lle_bg_prefetch_set(const lle_pf_range *r, int n) {
    if (n > LLE_BG_MAX_RANGES) n = LLE_BG_MAX_RANGES;
    /* at most BG_CAP bytes in all, the start of each range (what is read first): more would evict itself
     * from a core's L2 before it is read */
    const size_t share = n ? BG_CAP / (size_t)n : 0;
    int64_t total = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].p || !r[i].bytes) continue;
        g_bg.r[k] = r[i];
        if (g_bg.r[k].bytes > share) g_bg.r[k].bytes = share;
        total += (int64_t)((g_bg.r[k].bytes + 63) / 64);
        g_bg.end[k++] = total;
    }
    g_bg.n = k;
    g_bg.total = total;
    const int nth = lle_pool_threads();
    g_bg.shares = nth < 1 ? 1 : nth > LLE_CHUNK_RANGES ? LLE_CHUNK_RANGES : nth;
    for (int t = 0; t < g_bg.shares; t++) {
        g_bg.cursor[t].end = total * (t + 1) / g_bg.shares;
        __atomic_store_n(&g_bg.cursor[t].line, total * t / g_bg.shares, __ATOMIC_RELEASE);
    }
}

void lle_bg_prefetch_some(int ith) {
    if (!g_bg.n) return;
    lle_bg_cursor *cur = &g_bg.cursor[ith % g_bg.shares];
    const int64_t end = cur->end;
    if (__atomic_load_n(&cur->line, __ATOMIC_RELAXED) >= end) return;
    int64_t line = __atomic_fetch_add(&cur->line, BG_LINES, __ATOMIC_RELAXED);
    const int64_t stop = line + BG_LINES < end ? line + BG_LINES : end;
    int i = 0;
    while (i < g_bg.n && line >= g_bg.end[i]) i++;
    for (; line < stop && i < g_bg.n; line++) {
        if (line >= g_bg.end[i]) i++;
        if (i >= g_bg.n) break;
        const int64_t first = i ? g_bg.end[i - 1] : 0;
#if defined(__GNUC__)
        __builtin_prefetch((const char *)g_bg.r[i].p + (size_t)(line - first) * 64, 0, 3);
#endif
    }
}

void *lle_scratch_ops(size_t bytes) { return scratch_get(&g_scratch_ops, bytes); }
void *lle_scratch_kv(size_t bytes) { return scratch_get(&g_scratch_kv, bytes); }

/* ---------------------------------------------------------------- CPU features */

#if defined(LLE_X86) && defined(__GNUC__)
typedef struct { unsigned int eax, ecx; } cpuid_leaf1;

/* CPUID leaf 1: EAX (family, model, stepping), ECX (feature bits) */
static cpuid_leaf1 cpuid1(void) {
    unsigned int a, b, c, d;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    return (cpuid_leaf1){a, c};
}
#endif

static int detect_cpu(void) {
    int f = 0;
#if defined(LLE_X86) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("intel")) f |= LLE_CPU_INTEL;
    if (__builtin_cpu_is("amd")) f |= LLE_CPU_AMD;
    if (__builtin_cpu_supports("avx2")) f |= LLE_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) f |= LLE_CPU_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= LLE_CPU_AVX512F;
    if (__builtin_cpu_supports("avx512bw")) f |= LLE_CPU_AVX512BW;
    if (__builtin_cpu_supports("avx512vl")) f |= LLE_CPU_AVX512VL;
    if (__builtin_cpu_supports("avx512dq")) f |= LLE_CPU_AVX512DQ;
    if (__builtin_cpu_supports("avx512vnni")) f |= LLE_CPU_AVX512VNNI;
#if defined(__clang__) || __GNUC__ >= 10
    if (__builtin_cpu_supports("avx512bf16")) f |= LLE_CPU_AVX512BF16;
#endif
    /* F16C: CPUID.1:ECX bit 29 (no __builtin_cpu_supports name in older compilers) */
    if (cpuid1().ecx & (1u << 29)) f |= LLE_CPU_F16C;
#elif defined(LLE_ARM64)
    f |= LLE_CPU_NEON;
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & (1UL << 20)) f |= LLE_CPU_DOTPROD; /* HWCAP_ASIMDDP */
    const unsigned long hw2 = getauxval(AT_HWCAP2);
    if (hw2 & (1UL << 13)) f |= LLE_CPU_I8MM;   /* HWCAP2_I8MM */
#elif defined(__APPLE__)
    f |= LLE_CPU_DOTPROD;
#endif
#endif
    return f;
}

static int isa_has_kernels(int isa) {
    const lle_kernels *t = isa == ISA_AVX2 ? lle_kernels_avx2 : isa == ISA_AVX512 ? lle_kernels_avx512
                         : isa == ISA_NEON ? lle_kernels_neon : lle_kernels_scalar;
    for (int i = 0; i < T_COUNT; i++)
        if (t[i].vec_dot || t[i].from_float) return 1;
    return 0;
}

static int g_isa_cap = -1;  /* LLMEDGE_ISA: no tier above it is available (x86: scalar < avx2 < avx512) */

static int isa_rank(int isa) { return isa == ISA_AVX512 ? 2 : isa == ISA_SCALAR ? 0 : 1; }

static int isa_supported(int isa) {
    if (g_isa_cap >= 0 && isa != g_isa_cap && (isa_rank(isa) >= isa_rank(g_isa_cap))) return 0;
    switch (isa) {
    case ISA_SCALAR: return 1;
    case ISA_AVX2:
        return (g_cpu & (LLE_CPU_AVX2 | LLE_CPU_FMA | LLE_CPU_F16C)) == (LLE_CPU_AVX2 | LLE_CPU_FMA | LLE_CPU_F16C) &&
               isa_has_kernels(ISA_AVX2);
    case ISA_AVX512:
        return isa_supported(ISA_AVX2) &&
               (g_cpu & (LLE_CPU_AVX512F | LLE_CPU_AVX512BW | LLE_CPU_AVX512VL | LLE_CPU_AVX512VNNI)) ==
                   (LLE_CPU_AVX512F | LLE_CPU_AVX512BW | LLE_CPU_AVX512VL | LLE_CPU_AVX512VNNI) &&
               isa_has_kernels(ISA_AVX512);
    case ISA_NEON: return (g_cpu & LLE_CPU_NEON) && (g_cpu & LLE_CPU_DOTPROD) && isa_has_kernels(ISA_NEON);
    default: return 0;
    }
}

static int best_isa(void) {
    if (isa_supported(ISA_AVX512)) return ISA_AVX512;
    if (isa_supported(ISA_AVX2)) return ISA_AVX2;
    if (isa_supported(ISA_NEON)) return ISA_NEON;
    return ISA_SCALAR;
}

/* the ISA chain searched for a kernel, highest first */
static int isa_chain(int isa, int *chain) {
    int n = 0;
    chain[n++] = isa;
    if (isa == ISA_AVX512) chain[n++] = ISA_AVX2;
    if (isa != ISA_SCALAR) chain[n++] = ISA_SCALAR;
    return n;
}

static const lle_kernels *table_of(int isa) {
    switch (isa) {
    case ISA_AVX2: return lle_kernels_avx2;
    case ISA_AVX512: return lle_kernels_avx512;
    case ISA_NEON: return lle_kernels_neon;
    default: return lle_kernels_scalar;
    }
}

/* activations kept as floats (f32, f16, bf16): no block scales; a rows kernel of such a type
 * reproduces its vec_dot, as the others reproduce their gemv */
static int float_act(int vt) { return vt == T_F32 || vt == T_F16 || vt == T_BF16; }

static void select_isa(int isa) {
    int chain[4];
    const int nc = isa_chain(isa, chain);
    for (int t = 0; t < T_COUNT; t++) {
        lle_kernels k = {0};
        g_kernel_isa[t] = -1;
        for (int c = 0; c < nc; c++) {
            const lle_kernels *src = &table_of(chain[c])[t];
            if (!k.to_float && src->to_float) k.to_float = src->to_float;
            if (!k.from_float && src->from_float) k.from_float = src->from_float;
            if (!k.act_scales && src->act_scales) k.act_scales = src->act_scales;
            if (!k.from_float_r8 && src->from_float_r8) k.from_float_r8 = src->from_float_r8;
            if (!k.vec_dot && src->vec_dot) {
                /* a tile is only used with the vec_dot of its own ISA (identical arithmetic) */
                k.vec_dot = src->vec_dot;
                k.tile = src->tile;
                k.tile_rows = src->tile_rows;
                k.vec_dot_batch = src->vec_dot_batch;
                k.tile_batch = src->tile_batch;
                k.batch_k = src->batch_k;
                k.gemv = src->gemv;
                k.vec_dot_r8 = src->vec_dot_r8;
                k.vec_dot_r8_gemm = src->vec_dot_r8_gemm;
                k.tile_r8_gemm = src->tile_r8_gemm;
                k.tile_tiled = src->tile_tiled;
                k.vec_dot_tiled = src->vec_dot_tiled;
                k.packed = src->packed;
                k.packed_layout = src->packed_layout;
                k.packed_prep = src->packed_prep;
                k.packed_prep_bytes = src->packed_prep_bytes;
                g_kernel_isa[t] = chain[c];
            }
            /* the x86 tiers' gemv kernels agree bit for bit, so a quantized type's rows kernel may come
             * from below; a float type's may not (AVX-512 sums F32/F16/BF16 in other orders than AVX2:
             * each tier registers its own) */
            if (!k.gemv_rows && src->gemv_rows && k.gemv)
                k.gemv_rows = src->gemv_rows;
        }
        g_active[t] = k;
    }
    lle_ops = isa == ISA_AVX512 ? &lle_ops_avx512 : isa == ISA_AVX2 ? &lle_ops_avx2 : &lle_ops_scalar;
    g_isa = isa;
}

static int isa_from_env(void) {
    const char *e = getenv("LLMEDGE_ISA");
    if (!e || !*e) return -1;
    if (!strcasecmp(e, "scalar")) return ISA_SCALAR;
    if (!strcasecmp(e, "avx2")) return ISA_AVX2;
    if (!strcasecmp(e, "avx512")) return ISA_AVX512;
    if (!strcasecmp(e, "neon")) return ISA_NEON;
    return -1;
}

static void init_locked(int n_threads) {
    if (!g_initialized) {
        g_cpu = detect_cpu();
        lle_register_scalar();
        lle_register_avx2();
        lle_register_avx512();
        lle_register_neon();
        lle_build_gelu_table();
        /* LLMEDGE_ISA forces a tier this CPU can run and hides the ones above it (so that, say,
         * LLMEDGE_ISA=avx2 on an AVX-512 machine behaves as an AVX2-only machine); others are ignored */
        const int want = isa_from_env();
        if (want >= 0 && isa_supported(want)) g_isa_cap = want;
        select_isa(best_isa());
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        g_initialized = 1;
    }
    if (n_threads > 0) g_requested_threads = n_threads;
    if (n_threads > 0 && n_threads != lle_pool_threads()) lle_pool_create(n_threads);
}

static void ensure_init(void) {
    if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE)) init_locked(0);
    if (g_forked) {  /* first call in a forked child: bring the workers back */
        g_forked = 0;
        if (g_requested_threads > 1) lle_pool_create(g_requested_threads);
    }
}

/* for ops.c: called with the library lock held */
void lle_ensure_init(void) { ensure_init(); }

int lle_init(int n_threads) {
    lle_lock();
    init_locked(n_threads > 0 ? n_threads : 1);
    const int n = lle_pool_threads();
    lle_unlock();
    return n;
}

int lle_n_threads(void) { return lle_pool_threads(); }

double lle_core_round_trip_ns(int rounds) {
    lle_lock();
    ensure_init();
    const double ns = lle_pool_round_trip_ns(rounds);
    lle_unlock();
    return ns;
}

int lle_cpu_features(void) {
    lle_lock();
    ensure_init();
    lle_unlock();
    return g_cpu;
}

int lle_isa(void) {
    lle_lock();
    ensure_init();
    lle_unlock();
    return g_isa;
}

int lle_isa_available(int isa) {
    lle_lock();
    ensure_init();
    const int r = isa_supported(isa);
    lle_unlock();
    return r;
}

int lle_set_isa(int isa) {
    lle_lock();
    ensure_init();
    int r = -1;
    if (isa >= 0 && isa < ISA_COUNT && isa_supported(isa)) {
        select_isa(isa);
        r = isa;
    }
    lle_unlock();
    return r;
}

/* self-test hook: add CPU features (the self-test runs the AVX-512 kernels compiled against SIMDe,
 * which execute anywhere, as the AVX-512 tier) */
void lle_test_add_cpu_features(int features) {
    lle_lock();
    ensure_init();
    g_cpu |= features;
    lle_unlock();
}

void lle_set_spin_us(int us) { lle_pool_set_spin_us(us); }

int lle_weights_cached = 0;

void lle_set_weight_prefetch(int keep) { __atomic_store_n(&lle_weights_cached, keep != 0, __ATOMIC_RELAXED); }

int lle_weight_prefetch(void) { return __atomic_load_n(&lle_weights_cached, __ATOMIC_RELAXED); }

int lle_kv_prefetch_on = 1;

void lle_set_kv_prefetch(int on) { __atomic_store_n(&lle_kv_prefetch_on, on != 0, __ATOMIC_RELAXED); }

int lle_kv_prefetch(void) { return __atomic_load_n(&lle_kv_prefetch_on, __ATOMIC_RELAXED); }

int lle_cpu_family(void) {
#if defined(LLE_X86) && defined(__GNUC__)
    const unsigned int a = cpuid1().eax;
    const int base = (int)((a >> 8) & 0xF);
    return base == 0xF ? base + (int)((a >> 20) & 0xFF) : base;
#else
    return 0;
#endif
}

long long lle_llc_bytes(void) {
#if defined(_SC_LEVEL3_CACHE_SIZE)
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) return l3;
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0) return l2;
#endif
    return 0;
}

int lle_act_rounding_mode(void) { return lle_act_rounding; }

int lle_set_act_rounding(int mode) {
    if (mode < LLE_ROUND_REF || mode > LLE_ROUND_ARM) return -1;
    lle_lock();
    lle_act_rounding = mode;
    lle_unlock();
    return mode;
}

/* ---------------------------------------------------------------- traits */

static int valid_type(int type) { return type >= 0 && type < T_COUNT && lle_type_traits[type].block_size > 0; }

int lle_type_supported(int type) {
    lle_lock();
    ensure_init();
    const int r = valid_type(type) && g_active[type].vec_dot != NULL && g_active[type].to_float != NULL;
    lle_unlock();
    return r;
}

int lle_block_size(int type) { return valid_type(type) ? lle_type_traits[type].block_size : -1; }
int lle_type_size(int type) { return valid_type(type) ? lle_type_traits[type].type_size : -1; }
int lle_vec_type(int type) { return valid_type(type) ? lle_type_traits[type].vec_type : -1; }

int lle_kernel_isa(int type) {
    lle_lock();
    ensure_init();
    const int r = valid_type(type) ? g_kernel_isa[type] : -1;
    lle_unlock();
    return r;
}

long long lle_row_size(int type, long long k) {
    if (!valid_type(type)) return -1;
    const lle_traits *tr = &lle_type_traits[type];
    if (k % tr->block_size) return -1;
    return k / tr->block_size * tr->type_size;
}

/* ---------------------------------------------------------------- matmul */

/* the type's packed kernel computes its vec_dot order (Q4_1), not only a repacked or tiled one */
static int packed_plain(const lle_kernels *kw) { return kw->packed && !kw->vec_dot_r8 && !kw->vec_dot_tiled; }

/* whether a packed copy of this type serves the products of every row count, one-row decodes included
 * (the r8 order takes any; a plain packed type has no other kernel), not only the tiled ones of 8+ rows.
 * With m a multiple of LLE_PACK_ROWS the products then use it for any rows, and the source is never read */
static int copy_serves_all(const lle_kernels *kw) { return kw->packed && (kw->vec_dot_r8 || packed_plain(kw)); }

/* bytes per quantized activation row (type vt, k values): the row itself, or with a packed copy whose
 * kernel reads per-block values beside it (kw->packed_prep, see common.h), the row and those values */
static size_t act_stride(const lle_kernels *kw, const void *pw, int vt, int64_t k) {
    const size_t rs = (size_t)lle_row_size(vt, k);
    if (!pw || !kw->packed_prep) return rs;
    return LLE_PK_PREP_OFF(rs) + (size_t)(k / lle_type_traits[vt].block_size) * (size_t)kw->packed_prep_bytes;
}

/* after quantizing an activation row: the values its packed kernel reads beside it, if any */
static void act_prep(const lle_kernels *kw, const void *pw, int64_t k, void *row) {
    if (pw && kw->packed_prep) kw->packed_prep((int)k, row);
}

typedef struct {
    const lle_kernels *kw;
    lle_vec_dot_fn vd;    /* the dot product of this call (its summation order) */
    lle_vec_dot_fn vd_head; int64_t n_head_rows;  /* another order for activation rows < n_head_rows */
    lle_tile_fn tile_head;                        /* its 4-row tile (NULL: vd_head per element) */
    lle_tile_fn tile;     /* NULL: vd per element */
    int tile_rows;        /* activation rows per call of `tile` (a multiple of 4) */
    lle_gemv_fn gemv;     /* NULL: vd per row */
    /* a packed copy of the weight (native/packed.c), read by kw->packed instead of vd/tiles */
    const uint8_t *pw; int64_t gbytes;
    int type;
    const uint8_t *w; size_t ws; int64_t m; int k;
    const uint8_t *a; size_t as; int64_t n;
    float *out; int64_t ldo;
    /* activation quantization */
    const float *x; lle_from_float_fn from_float;
    lle_from_float_fn from_float_head;  /* quantizer of the rows < n_head_rows (NULL: from_float) */
    lle_act_scales_fn act_scales;
    float *scales;        /* float block scales: of the activation row (gemv) or per 4-row group (tiles) */
    int64_t nb;           /* activation blocks per row */
    /* decode chunks / prefill tiles */
    int64_t chunk, n_chunks;
    int64_t tm, tn, ntm, ntn;
    int64_t counter;      /* activation rows, prefill tiles */
    lle_chunks chunks;    /* decode chunks */
} mm_ctx;

/* quantize activation row i; for tiles, also scatter its float block scales into the row's lane of
 * its 4-row group (d[nb][4], then s[nb][4]) */
static void mm_quantize_row(mm_ctx *c, int64_t i) {
    void *row = (void *)(c->a + i * c->as);
    if (i < c->n_head_rows && c->from_float_head) c->from_float_head(c->x + i * c->k, row, c->k);
    else c->from_float(c->x + i * c->k, row, c->k);
    act_prep(c->kw, c->pw, c->k, row);
    if (!c->act_scales) return;
    if (c->n == 1) {
        c->act_scales(c->k, row, c->scales);
        return;
    }
    float tmp[2 * 8192];
    const int64_t nb = c->nb;
    if (2 * nb > (int64_t)(sizeof(tmp) / sizeof(tmp[0]))) return;
    c->act_scales(c->k, row, tmp);
    float *g = c->scales + (i / 4) * 8 * nb;
    const int r = (int)(i % 4);
    for (int64_t ib = 0; ib < nb; ib++) {
        g[4 * ib + r] = tmp[ib];
        g[4 * (nb + ib) + r] = tmp[nb + ib];
    }
}

static void mm_quantize_task(void *vctx, int ith, int nth) {
    (void)ith; (void)nth;
    mm_ctx *c = vctx;
    for (;;) {
        const int64_t i = lle_next_chunk(&c->counter);
        if (i >= c->n) break;
        mm_quantize_row(c, i);
    }
}

static void mm_rows_task(void *vctx, int ith, int nth) {
    (void)nth;
    mm_ctx *c = vctx;
    const lle_vec_dot_fn vd = c->vd;
    const lle_gemv_fn gemv = c->scales ? c->gemv : NULL;
    for (;;) {
        const int64_t ch = lle_chunks_next(&c->chunks, ith);
        if (ch < 0) break;
        const int64_t j0 = ch * c->chunk;
        const int64_t j1 = j0 + c->chunk < c->m ? j0 + c->chunk : c->m;
        if (c->pw) {
            c->kw->packed(c->k, c->pw + j0 / LLE_PACK_ROWS * c->gbytes, (int)((j1 - j0) / LLE_PACK_ROWS), c->a, c->as, 1, 0,
                          c->out + j0, 0);
        } else if (gemv) {
            gemv(c->k, c->w + j0 * c->ws, c->ws, (int)(j1 - j0), c->a, c->scales, c->out + j0);
        } else {
            for (int64_t j = j0; j < j1; j++) vd(c->k, c->out + j, c->w + j * c->ws, c->a);
        }
        lle_bg_prefetch_some(ith);
    }
}

static void mm_tiles_task(void *vctx, int ith, int nth) {
    (void)ith; (void)nth;
    mm_ctx *c = vctx;
    const lle_vec_dot_fn vd = c->vd;
    const lle_tile_fn tile = c->tile;
    for (;;) {
        const int64_t t = lle_next_chunk(&c->counter);
        if (t >= c->ntm * c->ntn) break;
        const int64_t bi = t / c->ntm, bj = t % c->ntm;
        const int64_t i0 = bi * c->tn, i1 = i0 + c->tn < c->n ? i0 + c->tn : c->n;
        const int64_t j0 = bj * c->tm, j1 = j0 + c->tm < c->m ? j0 + c->tm : c->m;
        if (c->pw) {  /* one group of weight rows at a time (it stays in L1), four activation rows per call */
            for (int64_t g = j0; g < j1; g += LLE_PACK_ROWS)
                for (int64_t i = i0; i < i1; i += 4) {
                    const int nr = i1 - i < 4 ? (int)(i1 - i) : 4;
                    c->kw->packed(c->k, c->pw + g / LLE_PACK_ROWS * c->gbytes, 1, c->a + i * c->as, c->as, nr,
                                  i < c->n_head_rows, c->out + i * c->ldo + g, (size_t)c->ldo);
                }
        } else if (tile || c->tile_head) {
            for (int64_t i = i0, nr; i < i1; i += nr) {
                const lle_tile_fn ti = i < c->n_head_rows ? c->tile_head : tile;
                const int step = ti == tile ? c->tile_rows : 4;  /* head rows: groups of 4 */
                nr = i1 - i < step ? i1 - i : step;
                if (!ti) {  /* rows of an order without a tile */
                    for (int64_t r = i; r < i + nr; r++) {
                        const lle_vec_dot_fn vdi = r < c->n_head_rows ? c->vd_head : vd;
                        for (int64_t j = j0; j < j1; j++)
                            vdi(c->k, c->out + r * c->ldo + j, c->w + j * c->ws, c->a + r * c->as);
                    }
                    continue;
                }
                const float *sc = c->scales ? c->scales + (i / 4) * 8 * c->nb : NULL;
                ti(c->k, c->w + j0 * c->ws, c->ws, (int)(j1 - j0), c->a + i * c->as, c->as, sc, nr,
                   c->out + i * c->ldo + j0, (size_t)c->ldo);
            }
        } else {
            for (int64_t i = i0; i < i1; i++) {
                const lle_vec_dot_fn vdi = i < c->n_head_rows ? c->vd_head : vd;
                for (int64_t j = j0; j < j1; j++)
                    vdi(c->k, c->out + i * c->ldo + j, c->w + j * c->ws, c->a + i * c->as);
            }
        }
    }
}

int lle_matmul_impl(int type, const void *w, long long w_stride, long long m, long long k,
               const float *x, long long n, float *out, long long ldo) {
    if (!valid_type(type) || m < 0 || n < 0 || k <= 0 || k > 0x7fffffff) return -1;
    if (lle_row_size(type, k) < 0) return -1;
    if (m == 0 || n == 0) return 0;
    const lle_kernels *kw = &g_active[type];
    const int vt = lle_type_traits[type].vec_type;
    const lle_from_float_fn ff = g_active[vt].from_float;
    if (!kw->vec_dot || !ff) {
        return -1;
    }
    const int nth = lle_pool_threads();
    mm_ctx c = {0};
    c.kw = kw;
    c.type = type;
    c.w = w;
    c.ws = w_stride > 0 ? (size_t)w_stride : (size_t)lle_row_size(type, k);
    c.m = m;
    c.k = (int)k;
    c.n = n;
    c.out = out;
    c.ldo = ldo > 0 ? ldo : m;
    /* the summation order llama.cpp uses for this product (see lle_kernels) */
    const int plain = type == T_F32 || type == T_F16 || type == T_BF16;
    c.vd = kw->vec_dot;
    c.tile = kw->tile;
    c.tile_rows = kw->tile_rows > 4 ? kw->tile_rows : 4;
    c.gemv = kw->gemv;
    if (kw->vec_dot_r8 && m % 8 == 0) {
        c.vd = kw->vec_dot_r8;
        c.tile = NULL;
        c.gemv = NULL;
        if (kw->vec_dot_r8_gemm && n > 3) {
            c.vd_head = kw->vec_dot_r8_gemm;
            c.tile_head = kw->tile_r8_gemm;
            c.n_head_rows = n - n % 4;
            c.from_float_head = g_active[vt].from_float_r8;
        }
        if (kw->packed && m % LLE_PACK_ROWS == 0 && (c.pw = lle_packed_find(type, kw->packed_layout, w, c.ws, m, k)))
            c.gbytes = lle_packed_group_bytes(type, k);
    } else if (kw->vec_dot_tiled && n >= 8) {
        c.vd = kw->vec_dot_tiled;
        c.tile = kw->tile_tiled;
        c.tile_rows = 4;
        if (kw->packed && m % LLE_PACK_ROWS == 0 && (c.pw = lle_packed_find(type, kw->packed_layout, w, c.ws, m, k)))
            c.gbytes = lle_packed_group_bytes(type, k);
    } else if (n >= 2 && kw->vec_dot_batch && (!plain || (m % 4 == 0 && k % (kw->batch_k ? kw->batch_k : 8) == 0))) {
        c.vd = kw->vec_dot_batch;
        c.tile = kw->tile_batch;
        c.tile_rows = 4;
    } else if (packed_plain(kw) && m % LLE_PACK_ROWS == 0 && (c.pw = lle_packed_find(type, kw->packed_layout, w, c.ws, m, k))) {
        c.gbytes = lle_packed_group_bytes(type, k);
        c.tile = NULL;  /* the packed kernel takes every row: no float scales to prepare */
        c.gemv = NULL;
    }
    /* float activation scales for the decode kernel (one row) or the tiles (per 4-row group) */
    const int uses_tiles = n > 1 && c.tile;
    const lle_act_scales_fn asf = (n == 1 && c.gemv) || uses_tiles ? g_active[vt].act_scales : NULL;
    c.nb = k / lle_type_traits[vt].block_size;
    const size_t scale_floats = asf ? (n == 1 ? 2 * (size_t)c.nb : (size_t)((n + 3) / 4) * 8 * (size_t)c.nb) : 0;
    if (vt == T_F32) {
        c.a = (const uint8_t *)x;
        c.as = (size_t)k * sizeof(float);
    } else {
        c.as = act_stride(kw, c.pw, vt, k);
        const size_t act_bytes = (c.as * (size_t)n + 63) & ~(size_t)63;
        uint8_t *a = scratch_get(&g_scratch_mm, act_bytes + scale_floats * sizeof(float));
        if (!a) {
                return -2;
        }
        c.a = a;
        c.x = x;
        c.from_float = ff;
        if (asf) {
            c.act_scales = asf;
            c.scales = (float *)(a + act_bytes);
            if (n > 1 && n % 4) memset(c.scales, 0, scale_floats * sizeof(float));  /* unused lanes */
        }
        if (n <= 4 || nth == 1) mm_quantize_task(&c, 0, 1);
        else lle_pool_run(mm_quantize_task, &c);
        c.counter = 0;
    }
    if (n == 1) {
        int64_t chunk = m / (nth * 16);
        if (chunk < 8) chunk = 8;
        if (c.pw) chunk = (chunk + LLE_PACK_ROWS - 1) / LLE_PACK_ROWS * LLE_PACK_ROWS;
        c.chunk = chunk;
        c.n_chunks = (m + chunk - 1) / chunk;
        /* small products (under ~16 KB of weights) are not worth waking the pool */
        lle_pool_run_chunks(mm_rows_task, &c, &c.chunks, c.n_chunks,
                            nth == 1 || c.n_chunks == 1 || (int64_t)c.ws * m < 16384);
    } else {
        int64_t tm = 16384 / (int64_t)c.ws;
        if (tm < 4) tm = 4;
        if (tm > 64) tm = 64;
        if (c.pw) tm = (tm + LLE_PACK_ROWS - 1) / LLE_PACK_ROWS * LLE_PACK_ROWS;
        c.tm = tm;
        c.tn = n < 64 ? n : 64;
        c.ntm = (m + tm - 1) / tm;
        c.ntn = (n + c.tn - 1) / c.tn;
        if (nth == 1 || c.ntm * c.ntn == 1) mm_tiles_task(&c, 0, 1);
        else lle_pool_run(mm_tiles_task, &c);
    }
    return 0;
}

int lle_matmul(int type, const void *w, long long w_stride, long long m, long long k,
               const float *x, long long n, float *out, long long ldo) {
    lle_lock();
    ensure_init();
    const int r = lle_matmul_impl(type, w, w_stride, m, k, x, n, out, ldo);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- row-exact small batches */

/* Several activation rows, each multiplied exactly as lle_matmul_impl multiplies a single row (the
 * decode kernel: same activation quantization, same float scales, same gemv / vec_dot, same output
 * chunks), so every row's result is bit for bit what it would be alone. A task takes one chunk of
 * weight rows and runs it against every activation row while it is in cache: the weights are read
 * from memory once for all rows. This is what speculative verification and batched decoding use
 * (llama.cpp's multi-row kernels sum in other orders; a row's argmax could flip). */
typedef lle_mr_plan mr_ctx;

/* one chunk of weight rows against every activation row */
static void mr_chunk(const mr_ctx *c, int64_t ch) {
    const int64_t j0 = ch * c->chunk;
    const int64_t j1 = j0 + c->chunk < c->m ? j0 + c->chunk : c->m;
    if (c->pw) {  /* the chunk's groups, each against up to 4 activation rows while it is in L1 */
        for (int64_t i = 0; i < c->n; i += 4) {
            const int nr = c->n - i < 4 ? (int)(c->n - i) : 4;
            c->packed(c->k, c->pw + j0 / LLE_PACK_ROWS * c->gbytes, (int)((j1 - j0) / LLE_PACK_ROWS),
                      c->a + i * c->as, c->as, nr, 0, c->out + i * c->ldo + j0, (size_t)c->ldo);
        }
        return;
    }
    if (c->gemv_rows) {
        for (int64_t i = 0; i < c->n; i += LLE_GEMV_ROWS) {
            const int nr = c->n - i < LLE_GEMV_ROWS ? (int)(c->n - i) : LLE_GEMV_ROWS;
            c->gemv_rows(c->k, c->w + j0 * c->ws, c->ws, (int)(j1 - j0), c->a + i * c->as, c->as,
                         c->group_scales + i / LLE_GEMV_ROWS * c->group_stride, nr, c->out + i * c->ldo + j0,
                         (size_t)c->ldo);
        }
        return;
    }
    if (c->gemv) {
        for (int64_t i = 0; i < c->n; i++)
            c->gemv(c->k, c->w + j0 * c->ws, c->ws, (int)(j1 - j0), c->a + i * c->as, c->scales + i * c->scale_stride,
                    c->out + i * c->ldo + j0);
        return;
    }
    /* a type with neither a gemv nor a rows kernel (or rows kernels switched off, lle_set_gemv_rows(0)):
     * every activation row over up to 128 KB of the chunk's weight rows at a time (each dot the one-row
     * kernel's), so the rows after the first read them from L2, not memory (a chunk of a large head is
     * several MB) */
    const int64_t blk = c->ws >= (128 << 10) ? 1 : (int64_t)((128 << 10) / c->ws);
    for (int64_t b0 = j0; b0 < j1; b0 += blk) {
        const int64_t b1 = b0 + blk < j1 ? b0 + blk : j1;
        for (int64_t i = 0; i < c->n; i++) {
            const uint8_t *a = c->a + i * c->as;
            float *out = c->out + i * c->ldo;
            for (int64_t j = b0; j < b1; j++) c->vd(c->k, out + j, c->w + j * c->ws, a);
        }
    }
}

static scratch_buf g_scratch_rows;
static int g_rows_disabled = 0;  /* lle_set_gemv_rows(0): the one-row gemv per row (tests compare both) */

int lle_set_gemv_rows(int enable) {
    lle_lock();
    g_rows_disabled = !enable;
    lle_unlock();
    return 0;
}

/* Fill c for w (m x k, `type`) times the n activation rows x (n >= 2), without running it. The rows
 * are quantized into `sb`, unless `prev` (a part prepared before from the same x, of the same type and
 * k, with the same activation layout) already holds them: then c reads prev's. */
static int mr_prepare(mr_ctx *c, int type, const void *w, long long w_stride, long long m, long long k,
                      const float *x, long long n, float *out, long long ldo, scratch_buf *sb, const mr_ctx *prev) {
    if (!valid_type(type) || m < 0 || k <= 0 || k > 0x7fffffff) return -1;
    if (lle_row_size(type, k) < 0) return -1;
    memset(c, 0, sizeof(*c));
    c->type = type;
    if (m == 0) return 0;  /* no chunks */
    const lle_kernels *kw = &g_active[type];
    const int vt = lle_type_traits[type].vec_type;
    const lle_from_float_fn ff = g_active[vt].from_float;
    if (!kw->vec_dot || !ff) return -1;
    const int nth = lle_pool_threads();
    c->vd = kw->vec_dot;
    c->gemv = kw->gemv;
    if (kw->vec_dot_r8 && m % 8 == 0) {  /* as lle_matmul_impl for one row */
        c->vd = kw->vec_dot_r8;
        c->gemv = NULL;
    }
    c->w = w;
    c->ws = w_stride > 0 ? (size_t)w_stride : (size_t)lle_row_size(type, k);
    if (copy_serves_all(kw) && m % LLE_PACK_ROWS == 0 && (c->pw = lle_packed_find(type, kw->packed_layout, w, c->ws, m, k))) {
        /* every row through the packed kernel, each in the one-row order: no float scales to prepare */
        c->packed = kw->packed;
        c->gbytes = lle_packed_group_bytes(type, k);
        c->gemv = NULL;
    }
    const lle_act_scales_fn asf = c->gemv ? g_active[vt].act_scales : NULL;
    if (!asf) c->gemv = NULL;
    if (!c->pw && !g_rows_disabled && (c->gemv || (float_act(vt) && c->vd == kw->vec_dot))) c->gemv_rows = kw->gemv_rows;
    c->m = m;
    c->k = (int)k;
    c->n = n;
    c->out = out;
    c->ldo = ldo > 0 ? ldo : m;
    int64_t chunk = m / (nth * 16);  /* the one-row product's chunks (a gemv's rows group by chunk) */
    if (chunk < 8) chunk = 8;
    if (c->pw) chunk = (chunk + LLE_PACK_ROWS - 1) / LLE_PACK_ROWS * LLE_PACK_ROWS;
    c->chunk = chunk;
    c->n_chunks = (m + chunk - 1) / chunk;
    const int64_t nb = k / lle_type_traits[vt].block_size;
    if (vt == T_F32) {
        c->a = (const uint8_t *)x;
        c->as = (size_t)k * sizeof(float);
        return 0;
    }
    c->as = act_stride(kw, c->pw, vt, k);
    c->scale_stride = asf ? 2 * nb : 0;
    c->group_stride = c->gemv_rows && asf ? 2 * nb * LLE_GEMV_ROWS : 0;
    if (prev && prev->type == type && prev->k == c->k && !prev->pw == !c->pw && prev->as == c->as &&
        prev->scale_stride == c->scale_stride && prev->group_stride == c->group_stride) {
        c->a = prev->a;
        c->scales = prev->scales;
        c->group_scales = prev->group_scales;
        return 0;
    }
    const size_t act_bytes = (c->as * (size_t)n + 63) & ~(size_t)63;
    const int64_t n_groups = (n + LLE_GEMV_ROWS - 1) / LLE_GEMV_ROWS;
    const size_t scale_floats = (size_t)(c->scale_stride * n + c->group_stride * n_groups);
    uint8_t *a = scratch_get(sb, act_bytes + scale_floats * sizeof(float));
    if (!a) return -2;
    float *scales = (float *)(a + act_bytes);
    float *grouped = scales + c->scale_stride * n;
    if (c->group_stride) memset(grouped, 0, (size_t)(c->group_stride * n_groups) * sizeof(float));
    c->a = a;
    c->scales = scales;
    c->group_scales = grouped;
    c->owns_act = 1;
    if (x)
        for (int64_t i = 0; i < n; i++) lle_mr_plan_quantize(c, x + i * k, i);
    return 0;
}

void lle_mr_plan_quantize(const lle_mr_plan *c, const float *x, int64_t i) {
    const lle_kernels *kw = &g_active[c->type];
    const int vt = lle_type_traits[c->type].vec_type;
    uint8_t *a = (uint8_t *)c->a + i * c->as;
    g_active[vt].from_float(x, a, c->k);
    act_prep(kw, c->pw, c->k, a);
    if (!c->scale_stride) return;
    float *rs = (float *)c->scales + i * c->scale_stride;
    g_active[vt].act_scales(c->k, a, rs);
    if (!c->group_stride) return;
    float *g = (float *)c->group_scales + i / LLE_GEMV_ROWS * c->group_stride + i % LLE_GEMV_ROWS;
    for (int64_t b = 0; b < c->scale_stride; b++) g[b * LLE_GEMV_ROWS] = rs[b];
}

void lle_mr_plan_chunk(const lle_mr_plan *c, int64_t ch) { mr_chunk(c, ch); }

static scratch_buf g_scratch_plan[LLE_MR_SLOTS];

int lle_mr_plan_init(lle_mr_plan *c, const lle_weight *w, long long n, float *out, int slot, const lle_mr_plan *prev) {
    if (slot < 0 || slot >= LLE_MR_SLOTS) return -1;
    if (!valid_type(w->type)) return -1;
    if (lle_type_traits[w->type].vec_type == T_F32) return 1;
    return mr_prepare(c, w->type, w->data, w->row_bytes, w->m, w->k, NULL, n, out, w->m, &g_scratch_plan[slot], prev);
}

/* Several weights (as a layer's Q, K and V, or gate and up) times the same n activation rows, in one
 * pool job: each product bit for bit lle_matmul_rows_impl's (the same chunks, kernels and quantized
 * rows, which weights of one type share), with one wake-up, one quantization and one tail instead of
 * one per weight. */
typedef struct { mr_ctx p[LLE_MAX_GROUP]; int np; int64_t c0[LLE_MAX_GROUP + 1]; lle_chunks chunks; } mrg_ctx;

static scratch_buf g_scratch_rows_group[LLE_MAX_GROUP];

static void mrg_task(void *vctx, int ith, int nth) {
    (void)nth;
    mrg_ctx *c = vctx;
    for (;;) {
        const int64_t ch = lle_chunks_next(&c->chunks, ith);
        if (ch < 0) break;
        int part = 0;
        while (ch >= c->c0[part + 1]) part++;
        mr_chunk(&c->p[part], ch - c->c0[part]);
        lle_bg_prefetch_some(ith);
    }
}

int lle_matmul_rows_group_impl(const lle_weight *const *ws, int count, const float *x, long long n,
                               float *const *outs) {
    if (count < 1 || count > LLE_MAX_GROUP) return -1;
    if (n == 1) return lle_matvec_group_impl(ws, count, x, outs);
    if (n < 1) return -1;
    mrg_ctx c;
    c.np = count;
    c.c0[0] = 0;
    int64_t bytes = 0;
    for (int i = 0; i < count; i++) {
        const lle_weight *w = ws[i];
        const int rc = mr_prepare(&c.p[i], w->type, w->data, w->row_bytes, w->m, w->k, x, n, outs[i], w->m,
                                  &g_scratch_rows_group[i], i ? &c.p[i - 1] : NULL);
        if (rc) return rc;
        c.c0[i + 1] = c.c0[i] + c.p[i].n_chunks;
        bytes += (int64_t)c.p[i].ws * w->m;
    }
    lle_pool_run_chunks(mrg_task, &c, &c.chunks, c.c0[count], lle_pool_threads() == 1 || bytes < 16384);
    return 0;
}

/* one weight: a group of one */
int lle_matmul_rows_impl(int type, const void *w, long long w_stride, long long m, long long k,
                         const float *x, long long n, float *out, long long ldo) {
    if (n <= 1) return lle_matmul_impl(type, w, w_stride, m, k, x, n, out, ldo);
    mrg_ctx c;
    c.np = 1;
    c.c0[0] = 0;
    const int rc = mr_prepare(&c.p[0], type, w, w_stride, m, k, x, n, out, ldo, &g_scratch_rows, NULL);
    if (rc || c.p[0].n_chunks == 0) return rc;
    c.c0[1] = c.p[0].n_chunks;
    lle_pool_run_chunks(mrg_task, &c, &c.chunks, c.c0[1],
                        lle_pool_threads() == 1 || c.c0[1] == 1 || (int64_t)c.p[0].ws * m < 16384);
    return 0;
}

int lle_matmul_rows(int type, const void *w, long long w_stride, long long m, long long k,
                    const float *x, long long n, float *out, long long ldo) {
    lle_lock();
    ensure_init();
    const int r = lle_matmul_rows_impl(type, w, w_stride, m, k, x, n, out, ldo);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- grouped decode products */

/* Several products of one activation row (Q/K/V, gate/up) in one pool job: one thread hand-off
 * instead of one per product. Each row uses exactly the kernel lle_matmul_impl picks for n = 1. */
typedef struct {
    lle_vec_dot_fn vd; lle_gemv_fn gemv;
    lle_packed_fn packed; const uint8_t *pw; int64_t gbytes;  /* a packed copy (see mm_ctx) */
    const uint8_t *w; size_t ws; int64_t m; int k;
    const uint8_t *a; const float *scales;
    float *out; int64_t chunk, c0, c1;  /* this product's chunks are [c0, c1) of the job */
} mv_part;

typedef struct { mv_part p[LLE_MAX_GROUP]; int np; int64_t n_chunks; lle_chunks chunks; } mv_ctx;

static scratch_buf g_scratch_group[LLE_MAX_GROUP];

static void mv_task(void *vctx, int ith, int nth) {
    (void)nth;
    mv_ctx *c = vctx;
    for (;;) {
        const int64_t ch = lle_chunks_next(&c->chunks, ith);
        if (ch < 0) break;
        int i = 0;
        while (ch >= c->p[i].c1) i++;
        const mv_part *p = &c->p[i];
        const int64_t j0 = (ch - p->c0) * p->chunk;
        const int64_t j1 = j0 + p->chunk < p->m ? j0 + p->chunk : p->m;
        if (p->pw) {
            p->packed(p->k, p->pw + j0 / LLE_PACK_ROWS * p->gbytes, (int)((j1 - j0) / LLE_PACK_ROWS), p->a, 0, 1, 0,
                      p->out + j0, 0);
        } else if (p->gemv) {
            p->gemv(p->k, p->w + j0 * p->ws, p->ws, (int)(j1 - j0), p->a, p->scales, p->out + j0);
        } else {
            for (int64_t j = j0; j < j1; j++) p->vd(p->k, p->out + j, p->w + j * p->ws, p->a);
        }
        lle_bg_prefetch_some(ith);
    }
}

int lle_matvec_group_impl(const lle_weight *const *ws, int count, const float *x, float *const *outs) {
    if (count < 1 || count > LLE_MAX_GROUP) return -1;
    const int nth = lle_pool_threads();
    mv_ctx c = {0};
    c.np = count;
    int64_t bytes = 0;
    for (int i = 0; i < count; i++) {
        const lle_weight *w = ws[i];
        const int type = w->type;
        if (!valid_type(type) || w->k <= 0 || w->k > 0x7fffffff || w->m <= 0 || lle_row_size(type, w->k) < 0) return -1;
        const lle_kernels *kw = &g_active[type];
        const int vt = lle_type_traits[type].vec_type;
        const lle_from_float_fn ff = g_active[vt].from_float;
        if (!kw->vec_dot || !ff) return -1;
        mv_part *p = &c.p[i];
        p->vd = kw->vec_dot;
        p->gemv = kw->gemv;
        if (kw->vec_dot_r8 && w->m % 8 == 0) {
            p->vd = kw->vec_dot_r8;
            p->gemv = NULL;
        }
        p->w = w->data;
        p->ws = w->row_bytes > 0 ? (size_t)w->row_bytes : (size_t)lle_row_size(type, w->k);
        if (copy_serves_all(kw) && w->m % LLE_PACK_ROWS == 0 &&
            (p->pw = lle_packed_find(type, kw->packed_layout, w->data, p->ws, w->m, w->k))) {
            p->packed = kw->packed;
            p->gbytes = lle_packed_group_bytes(type, w->k);
            p->gemv = NULL;  /* no float scales to prepare */
        }
        p->m = w->m;
        p->k = (int)w->k;
        p->out = outs[i];
        const lle_act_scales_fn asf = p->gemv ? g_active[vt].act_scales : NULL;
        if (!asf) p->gemv = NULL;  /* as lle_matmul_impl: the gemv kernels need the float scales */
        if (vt == T_F32) {
            p->a = (const uint8_t *)x;
        } else {
            const size_t as = act_stride(kw, p->pw, vt, w->k);
            const int64_t nb = w->k / lle_type_traits[vt].block_size;
            const size_t act_bytes = (as + 63) & ~(size_t)63;
            uint8_t *a = scratch_get(&g_scratch_group[i], act_bytes + (asf ? 2 * (size_t)nb * sizeof(float) : 0));
            if (!a) return -2;
            ff(x, a, w->k);
            act_prep(kw, p->pw, w->k, a);
            if (asf) {
                asf(w->k, a, (float *)(a + act_bytes));
                p->scales = (const float *)(a + act_bytes);
            }
            p->a = a;
        }
        int64_t chunk = p->m / (nth * 16);
        if (chunk < 8) chunk = 8;
        if (p->pw) chunk = (chunk + LLE_PACK_ROWS - 1) / LLE_PACK_ROWS * LLE_PACK_ROWS;
        p->chunk = chunk;
        p->c0 = c.n_chunks;
        c.n_chunks += (p->m + chunk - 1) / chunk;
        p->c1 = c.n_chunks;
        bytes += (int64_t)p->ws * p->m;
    }
    lle_pool_run_chunks(mv_task, &c, &c.chunks, c.n_chunks, nth == 1 || bytes < 16384);
    return 0;
}

/* ---------------------------------------------------------------- packed weights */

int lle_pack_weight(int type, const void *w, long long w_stride, long long m, long long k, int release_source) {
    if (!valid_type(type) || m <= 0 || k <= 0 || k > 0x7fffffff || lle_row_size(type, k) < 0 || !w) return -1;
    lle_lock();
    ensure_init();
    const lle_kernels *kw = &g_active[type];
    const size_t ws = w_stride > 0 ? (size_t)w_stride : (size_t)lle_row_size(type, k);
    int r = 0;
    /* every type whose tier has packed kernels: they replace the repacked (Q4_K), tiled (Q6_K, 8+ rows)
     * or only (Q4_1) order of its products. Where the copy serves every product, the source is never read
     * again: 1, and its pages may go. Where it serves only the tiled products of 8+ rows (a decode reads the
     * source): 2, and the source stays resident. */
    if (kw->packed && m % LLE_PACK_ROWS == 0 && lle_packed_group_bytes(type, k) > 0) {
        const int all = copy_serves_all(kw);
        r = lle_packed_add(type, kw->packed_layout, w, ws, m, k, release_source && all);
        if (r == 1 && !all) r = 2;
    }
    lle_unlock();
    return r;
}

void lle_unpack_weight(const void *w) {
    lle_lock();
    lle_packed_remove(w);
    lle_unlock();
}

int lle_packed_count(void) {
    lle_lock();
    const int n = lle_packed_entries();
    lle_unlock();
    return n;
}

/* ---------------------------------------------------------------- rows, dequantize, test hooks */

int lle_get_rows(int type, const void *w, long long w_stride, long long k, const int *ids, long long n, float *out) {
    if (!valid_type(type) || lle_row_size(type, k) < 0) return -1;
    lle_lock();
    ensure_init();
    const lle_to_float_fn tf = g_active[type].to_float;
    const size_t ws = w_stride > 0 ? (size_t)w_stride : (size_t)lle_row_size(type, k);
    if (!tf) {
        lle_unlock();
        return -1;
    }
    if (!lle_packed_get_rows(type, w, ws, k, ids, n, tf, out))  /* a packed weight's rows come from its copy */
        for (long long i = 0; i < n; i++) tf((const uint8_t *)w + (size_t)ids[i] * ws, out + i * k, k);
    lle_unlock();
    return 0;
}

int lle_dequantize(int type, const void *w, long long n_rows, long long k, float *out) {
    if (!valid_type(type) || lle_row_size(type, k) < 0) return -1;
    lle_lock();
    ensure_init();
    const lle_to_float_fn tf = g_active[type].to_float;
    if (!tf) {
        lle_unlock();
        return -1;
    }
    tf(w, out, n_rows * k);
    lle_unlock();
    return 0;
}

int lle_quantize_act(int type, const float *x, long long n, long long k, void *out) {
    if (!valid_type(type) || lle_row_size(type, k) < 0) return -1;
    lle_lock();
    ensure_init();
    const lle_from_float_fn ff = g_active[type].from_float;
    if (!ff) {
        lle_unlock();
        return -1;
    }
    const size_t rs = (size_t)lle_row_size(type, k);
    for (long long i = 0; i < n; i++) ff(x + i * k, (uint8_t *)out + i * rs, k);
    lle_unlock();
    return 0;
}

int lle_vec_dot(int type, long long k, const void *w_row, const void *act_row, float *out) {
    if (!valid_type(type) || lle_row_size(type, k) < 0) return -1;
    lle_lock();
    ensure_init();
    const lle_vec_dot_fn vd = g_active[type].vec_dot;
    if (!vd) {
        lle_unlock();
        return -1;
    }
    vd((int)k, out, w_row, act_row);
    lle_unlock();
    return 0;
}

/* ---------------------------------------------------------------- loading */

long long lle_gguf_strings(const unsigned char *buf, long long size, long long pos, long long count,
                           long long *starts, long long *ends) {
    for (long long i = 0; i < count; i++) {
        if (pos < 0 || size - pos < 8) return -1 - i;
        uint64_t n;
        memcpy(&n, buf + pos, 8);  /* GGUF is little-endian, as are the hosts llmedge builds for */
        pos += 8;
        if (n > (uint64_t)(size - pos)) return -1 - i;
        starts[i] = pos;
        ends[i] = pos + (long long)n;
        pos += (long long)n;
    }
    return pos;
}
