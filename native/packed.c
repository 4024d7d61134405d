/* Packed weights: copies of a weight's rows in an interleaved layout that a tier's kernels read
 * faster (16 rows side by side, so that one 512-bit register holds a few values of 16 rows and a
 * product needs no horizontal sums), and the registry that finds the copy of a weight by its
 * address. The layouts are defined in common.h; the kernels that read them live in the per-ISA
 * files (quants_avx512.c: Q4_K, Q6_K, Q4_1, Q8_0; packed_avx2.inc: Q4_1, Q8_0) and compute exactly the values of the unpacked kernels of their
 * slot (the same integers per block or quarter block, the same float operations in the same
 * order), so packing changes speed only.
 *
 * The registry is keyed by (type, address, rows, columns, row stride); for a weight in anonymous
 * memory it also keeps the first bytes and compares them on every lookup, so that a copy outliving
 * its weight (its owner forgot lle_unpack_weight and the memory was reused, or rewrote it) is not
 * applied to other data. A weight whose file pages were released is not read again (see pack_entry).
 * Calls happen under the library lock (api.c).
 */
#include "common.h"

#include <stdlib.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

/* ---------------------------------------------------------------- layouts */

/* the 6-bit scale and min of sub-block j of a Q4_K block (ggml's get_scale_min_k4) */
static void q4k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void pack_q4_K(const void *w, size_t ws, int64_t m, int64_t k, void *dst) {
    const int64_t nb = k / QK_K;
    uint8_t *o = dst;
    for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q4K_BLOCK)
            for (int l = 0; l < LLE_PACK_ROWS; l++) {
                const block_q4_K *x = (const block_q4_K *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + l) * ws) + b;
                memcpy(o + LLE_PK_Q4K_D + 2 * l, &x->d, 2);
                memcpy(o + LLE_PK_Q4K_DMIN + 2 * l, &x->dmin, 2);
                for (int s = 0; s < 8; s++) {
                    uint8_t sc, mn;
                    q4k_scale_min(s, x->scales, &sc, &mn);
                    o[LLE_PK_Q4K_SC + 16 * s + l] = sc;
                    o[LLE_PK_Q4K_MN + 32 * (s / 2) + 2 * l + s % 2] = mn;
                }
                for (int j = 0; j < 4; j++)
                    for (int i = 0; i < 8; i++)
                        memcpy(o + LLE_PK_Q4K_QS + 64 * (8 * j + i) + 4 * l, x->qs + 32 * j + 4 * i, 4);
            }
}

/* the 6-bit quant v (0..255) of a Q6_K block, unsigned (ggml's dequantize_row_q6_K before the -32) */
static uint8_t q6k_quant(const block_q6_K *x, int v) {
    const int n = v / 128, r = v % 128, quarter = r / 32, l = r % 32;
    const uint8_t *ql = x->ql + 64 * n, *qh = x->qh + 32 * n;
    const uint8_t lo = quarter == 0 ? ql[l] & 0xF : quarter == 1 ? ql[l + 32] & 0xF : quarter == 2 ? ql[l] >> 4 : ql[l + 32] >> 4;
    return (uint8_t)(lo | (((qh[l] >> (2 * quarter)) & 3) << 4));
}

static void pack_q6_K(const void *w, size_t ws, int64_t m, int64_t k, void *dst) {
    const int64_t nb = k / QK_K;
    uint8_t *o = dst;
    for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q6K_BLOCK)
            for (int l = 0; l < LLE_PACK_ROWS; l++) {
                const block_q6_K *x = (const block_q6_K *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + l) * ws) + b;
                memcpy(o + LLE_PK_Q6K_D + 2 * l, &x->d, 2);
                for (int s = 0; s < 16; s++) o[LLE_PK_Q6K_SC + 16 * s + l] = (uint8_t)x->scales[s];
                for (int v = 0; v < QK_K; v++) o[LLE_PK_Q6K_Q + 64 * (v / 4) + 4 * l + v % 4] = q6k_quant(x, v);
            }
}

static void pack_q4_1(int layout, const void *w, size_t ws, int64_t m, int64_t k, void *dst) {
    const int64_t nb = k / QK;
    uint8_t *o = dst;
    if (layout == LLE_PK_SPLIT8) {
        for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
            for (int h = 0; h < 2; h++)
                for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q41_HBLOCK)
                    for (int l = 0; l < 8; l++) {
                        const block_q4_1 *x = (const block_q4_1 *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + 8 * h + l) * ws) + b;
                        memcpy(o + 2 * l, &x->d, 2);
                        memcpy(o + 16 + 2 * l, &x->m, 2);
                        for (int c = 0; c < 4; c++) memcpy(o + 32 + 32 * c + 4 * l, x->qs + 4 * c, 4);
                    }
        return;
    }
    for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q41_BLOCK)
            for (int l = 0; l < LLE_PACK_ROWS; l++) {
                const block_q4_1 *x = (const block_q4_1 *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + l) * ws) + b;
                memcpy(o + LLE_PK_Q41_D + 2 * l, &x->d, 2);
                memcpy(o + LLE_PK_Q41_M + 2 * l, &x->m, 2);
                for (int c = 0; c < 4; c++) memcpy(o + LLE_PK_Q41_QS + 64 * c + 4 * l, x->qs + 4 * c, 4);
            }
}

static void pack_q8_0(int layout, const void *w, size_t ws, int64_t m, int64_t k, void *dst) {
    const int64_t nb = k / QK;
    uint8_t *o = dst;
    if (layout == LLE_PK_SPLIT8) {
        for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
            for (int h = 0; h < 2; h++)
                for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q80_HBLOCK)
                    for (int l = 0; l < 8; l++) {
                        const block_q8_0 *x = (const block_q8_0 *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + 8 * h + l) * ws) + b;
                        memcpy(o + 2 * l, &x->d, 2);
                        for (int c = 0; c < 8; c++) memcpy(o + 16 + 32 * c + 4 * l, x->qs + 4 * c, 4);
                    }
        return;
    }
    for (int64_t g = 0; g < m / LLE_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++, o += LLE_PK_Q80_BLOCK)
            for (int l = 0; l < LLE_PACK_ROWS; l++) {
                const block_q8_0 *x = (const block_q8_0 *)((const uint8_t *)w + (size_t)(g * LLE_PACK_ROWS + l) * ws) + b;
                memcpy(o + LLE_PK_Q80_D + 2 * l, &x->d, 2);
                for (int c = 0; c < 8; c++) {
                    uint32_t v;
                    memcpy(&v, x->qs + 4 * c, 4);
                    v ^= 0x80808080u;
                    memcpy(o + LLE_PK_Q80_QS + 64 * c + 4 * l, &v, 4);
                }
            }
}

int64_t lle_packed_group_bytes(int type, int64_t k) {
    if (k <= 0) return -1;
    if (type == T_Q8_0) return k % QK ? -1 : k / QK * LLE_PK_Q80_BLOCK;
    if (type == T_Q4_1) return k % QK || k / QK > LLE_PK_Q41_MAX_BLOCKS ? -1 : k / QK * LLE_PK_Q41_BLOCK;
    if (k % QK_K) return -1;
    if (type == T_Q4_K) return k / QK_K * LLE_PK_Q4K_BLOCK;
    if (type == T_Q6_K) return k / QK_K * LLE_PK_Q6K_BLOCK;
    return -1;
}

void lle_pack_rows(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k, void *dst) {
    if (type == T_Q4_K) pack_q4_K(w, ws, m, k, dst);
    if (type == T_Q6_K) pack_q6_K(w, ws, m, k, dst);
    if (type == T_Q4_1) pack_q4_1(layout, w, ws, m, k, dst);
    if (type == T_Q8_0) pack_q8_0(layout, w, ws, m, k, dst);
}

/* ---------------------------------------------------------------- registry */

#define FINGERPRINT 32

/* A copy is found by its weight's address and shape. A weight in anonymous memory could be rewritten
 * in place, so its copy also keeps the first bytes it was made from and is used only while they match.
 * A weight whose pages were released (a read-only file mapping, see lle_packed_add) is never read again
 * after packing: the mapping cannot be written through, it outlives the copy (the caller unpacks before
 * unmapping), and reading its head would fault the released pages back in (a whole large folio of the
 * page cache at a time). */
typedef struct {
    const void *w; int type, layout; int64_t m, k; size_t ws;
    void *packed; size_t bytes; int refs, released;
    uint8_t head[FINGERPRINT];
} pack_entry;

static int entry_current(const pack_entry *e, const void *w) {
    return e->released || memcmp(e->head, w, FINGERPRINT) == 0;
}

static pack_entry *g_packs;
static int g_n_packs, g_cap_packs;

static pack_entry *find_entry(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k) {
    for (int i = 0; i < g_n_packs; i++) {
        pack_entry *e = &g_packs[i];
        if (e->w == w && e->type == type && e->layout == layout && e->m == m && e->k == k && e->ws == ws) return e;
    }
    return NULL;
}

const void *lle_packed_find(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k) {
    if (!g_n_packs) return NULL;
    const pack_entry *e = find_entry(type, layout, w, ws, m, k);
    return e && entry_current(e, w) ? e->packed : NULL;
}

/* Copies come straight from the OS (mmap) and go straight back (munmap): malloc would keep a freed
 * model's copies in its heap (glibc's mmap threshold grows after large frees), so unloading a model
 * would not return its memory.
 *
 * On Linux the copies also end up in 2 MB pages: a decode streams every copy once per token, and with
 * 4 KB pages a 100 MB model costs 25,000 TLB misses per token. A model's many small copies (a 576x1536
 * Q4_1 is 0.5 MB) would each be too small for a huge page of their own, so copies under LARGE_COPY are
 * carved one after another, page-aligned, from 32 MB slabs aligned to 2 MB; larger ones get their own
 * aligned mapping. They are written in 4 KB pages, and each 2 MB extent is advised into a huge page
 * (MADV_HUGEPAGE) only once every byte of it is written: the kernel's khugepaged then merges it in the
 * background (about 100 MB a minute), so a long-running server gets the huge pages and a load never
 * waits for them (asking at the first write made the kernel compact memory synchronously: Gemma 3's
 * load went from 0.4 to 0.7 s). A freed copy's pages go back at once (MADV_DONTNEED), and a slab is
 * unmapped with its last copy, so unloading a model still returns all of its memory. Only the pages
 * written are resident. Elsewhere each copy is its own mapping. */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define HUGE_PAGE ((size_t)2 << 20)
#define SLAB_BYTES ((size_t)32 << 20)
#define LARGE_COPY ((size_t)4 << 20)

typedef struct {
    uint8_t *base;   /* HUGE_PAGE-aligned; SLAB_BYTES long */
    size_t used;
    size_t advised;  /* the first `advised` bytes (whole extents, all written) are advised into huge pages */
    int live;        /* copies carved from it and not yet freed */
} slab;

static slab *g_slabs;
static int g_n_slabs, g_cap_slabs;

static size_t page_round(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

/* `bytes` (a multiple of HUGE_PAGE) of fresh memory aligned to HUGE_PAGE */
static uint8_t *map_aligned(size_t bytes) {
    uint8_t *raw = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    const size_t tail = (size_t)(raw + bytes + HUGE_PAGE - (p + bytes));
    if (tail) munmap(p + bytes, tail);
    return p;
}

/* the copy's pages faulted in by one call, not one fault per page as the packer writes them */
static void populate(void *p, size_t bytes) {
#if defined(MADV_POPULATE_WRITE)
    madvise(p, bytes, MADV_POPULATE_WRITE);  /* Linux 5.14+; older kernels fault as the packer writes */
#else
    (void)p; (void)bytes;
#endif
}

static void *alloc_copy(size_t bytes) {
    bytes = page_round(bytes);
    if (bytes >= LARGE_COPY) {
        uint8_t *p = map_aligned((bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
        if (p) populate(p, bytes);
        return p;
    }
    slab *s = g_n_slabs ? &g_slabs[g_n_slabs - 1] : NULL;
    if (!s || SLAB_BYTES - s->used < bytes) {
        if (g_n_slabs == g_cap_slabs) {
            const int cap = g_cap_slabs ? 2 * g_cap_slabs : 8;
            slab *n = realloc(g_slabs, (size_t)cap * sizeof(slab));
            if (!n) return NULL;
            g_slabs = n;
            g_cap_slabs = cap;
        }
        uint8_t *base = map_aligned(SLAB_BYTES);
        if (!base) return NULL;
        s = &g_slabs[g_n_slabs++];
        s->base = base;
        s->used = 0;
        s->advised = 0;
        s->live = 0;
    }
    uint8_t *p = s->base + s->used;
    s->used += bytes;
    s->live++;
    populate(p, bytes);
    return p;
}

/* the slab the copy at p was carved from, or NULL (a large copy: its own mapping) */
static slab *slab_of(const void *p) {
    for (int i = 0; i < g_n_slabs; i++)
        if ((const uint8_t *)p >= g_slabs[i].base && (const uint8_t *)p < g_slabs[i].base + SLAB_BYTES) return &g_slabs[i];
    return NULL;
}

/* the copy at p is written: advise the huge-page extents now wholly written (see above) */
static void copy_written(void *p, size_t bytes) {
    slab *s = slab_of(p);
    if (!s) {
        const size_t whole = page_round(bytes) / HUGE_PAGE * HUGE_PAGE;
        if (whole) madvise(p, whole, MADV_HUGEPAGE);
        return;
    }
    const size_t done = s->used / HUGE_PAGE * HUGE_PAGE;  /* copies are written as soon as carved */
    if (done > s->advised) {
        madvise(s->base + s->advised, done - s->advised, MADV_HUGEPAGE);
        s->advised = done;
    }
}

static void free_copy(void *p, size_t bytes) {
    bytes = page_round(bytes);
    slab *s = slab_of(p);
    if (!s) {
        munmap(p, (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    } else if (--s->live == 0) {
        munmap(s->base, SLAB_BYTES);
        *s = g_slabs[--g_n_slabs];  /* a fresh slab is made for the next copy */
    } else {
        madvise(p, bytes, MADV_DONTNEED);  /* its pages back to the OS now; the range is not reused */
    }
}
#else
/* the copy's pages faulted in by one call, not one fault per page as the packer writes them */
#if defined(MAP_POPULATE)
#define LLE_MAP_POPULATE MAP_POPULATE
#else
#define LLE_MAP_POPULATE 0
#endif

static void *alloc_copy(size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | LLE_MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#else
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
#endif
}

static void copy_written(void *p, size_t bytes) { (void)p; (void)bytes; }

static void free_copy(void *p, size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
    munmap(p, bytes);
#else
    (void)bytes;
    free(p);
#endif
}
#endif

/* Pack in slices of about this many source bytes per pool thread; with release_source, each slice's
 * whole pages leave the resident set as soon as they are packed, so packing a large weight (Gemma 3's
 * 178 MB output head) never holds both the source and the copy resident at once. The pool's threads
 * share each slice (claiming runs of groups), so a load packs at the speed of all of them. */
#define PACK_SLICE_BYTES (1 << 20)

typedef struct {
    int type, layout;
    const uint8_t *w; size_t ws; int64_t k;
    uint8_t *dst; int64_t gbytes;
    int64_t g0, g1, per;  /* this slice's groups, claimed `per` at a time */
    int64_t counter;
} pack_job;

static void pack_task(void *vctx, int ith, int nth) {
    (void)ith; (void)nth;
    pack_job *j = vctx;
    for (;;) {
        const int64_t a = j->g0 + lle_next_chunk(&j->counter) * j->per;
        if (a >= j->g1) break;
        const int64_t b = a + j->per < j->g1 ? a + j->per : j->g1;
        lle_pack_rows(j->type, j->layout, j->w + (size_t)(a * LLE_PACK_ROWS) * j->ws, j->ws, (b - a) * LLE_PACK_ROWS,
                      j->k, j->dst + (size_t)(a * j->gbytes));
    }
}

static void pack_sliced(int type, int layout, const uint8_t *w, size_t ws, int64_t m, int64_t k, uint8_t *dst,
                        int release_source) {
    const int64_t ng = m / LLE_PACK_ROWS;
    const int nth = lle_pool_threads();
    int64_t step = (int64_t)PACK_SLICE_BYTES * nth / ((int64_t)ws * LLE_PACK_ROWS);
    if (step < 1) step = 1;
    pack_job j = {type, layout, w, ws, k, dst, lle_packed_group_bytes(type, k), 0, 0, 1, 0};
#if defined(__unix__) || defined(__APPLE__)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)w + page - 1) / page * page;  /* first page not yet released */
#else
    release_source = 0;
#endif
    for (int64_t g0 = 0; g0 < ng; g0 += step) {
        j.g0 = g0;
        j.g1 = g0 + step < ng ? g0 + step : ng;
        j.per = (j.g1 - g0 + 4 * nth - 1) / (4 * nth);  /* 4 runs per thread: none waits long for another */
        j.counter = 0;
        if (nth > 1 && j.g1 - g0 > 1) lle_pool_run(pack_task, &j);
        else pack_task(&j, 0, 1);
#if defined(__unix__) || defined(__APPLE__)
        if (!release_source) continue;
        const uintptr_t hi = ((uintptr_t)w + (size_t)(j.g1 * LLE_PACK_ROWS) * ws) / page * page;
        if (hi > lo) {
            madvise((void *)lo, hi - lo, MADV_DONTNEED);
            lo = hi;
        }
#endif
    }
}

/* 1: packed (or already), -2: out of memory. release_source: w lies in a read-only file mapping whose
 * pages may be dropped (they fault back in from the page cache when read). */
int lle_packed_add(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k, int release_source) {
    pack_entry *e = find_entry(type, layout, w, ws, m, k);
    if (e && entry_current(e, w)) {
        e->refs++;
        return 1;
    }
    const size_t bytes = (size_t)(m / LLE_PACK_ROWS) * (size_t)lle_packed_group_bytes(type, k);
    void *p = alloc_copy(bytes);
    if (!p) return -2;
    uint8_t head[FINGERPRINT];
    memcpy(head, w, FINGERPRINT);
    pack_sliced(type, layout, w, ws, m, k, p, release_source);
    copy_written(p, bytes);
    if (e) {  /* stale: the weight it was made from is gone */
        free_copy(e->packed, e->bytes);
    } else {
        if (g_n_packs == g_cap_packs) {
            const int cap = g_cap_packs ? 2 * g_cap_packs : 64;
            pack_entry *n = realloc(g_packs, (size_t)cap * sizeof(pack_entry));
            if (!n) {
                free_copy(p, bytes);
                return -2;
            }
            g_packs = n;
            g_cap_packs = cap;
        }
        e = &g_packs[g_n_packs++];
    }
    e->w = w; e->type = type; e->layout = layout; e->m = m; e->k = k; e->ws = ws;
    e->packed = p;
    e->bytes = bytes;
    e->refs = 1;
    e->released = release_source;
    memcpy(e->head, head, FINGERPRINT);
    return 1;
}

void lle_packed_remove(const void *w) {
    for (int i = 0; i < g_n_packs; i++) {
        pack_entry *e = &g_packs[i];
        if (e->w != w) continue;
        if (--e->refs > 0) return;
        free_copy(e->packed, e->bytes);
        *e = g_packs[--g_n_packs];
        return;
    }
}

int lle_packed_entries(void) { return g_n_packs; }

/* ---------------------------------------------------------------- rows back out of a copy */

/* row l (0..15) of a packed Q8_0 or Q4_1 group, as the weight's own blocks (the packers' inverse) */
static void unpack_q8_0(int layout, const uint8_t *grp, int64_t nb, int l, block_q8_0 *y) {
    for (int64_t b = 0; b < nb; b++) {
        if (layout == LLE_PK_SPLIT8) {
            const uint8_t *o = grp + ((size_t)(l / 8) * (size_t)nb + (size_t)b) * LLE_PK_Q80_HBLOCK;
            memcpy(&y[b].d, o + 2 * (l % 8), 2);
            for (int c = 0; c < 8; c++) memcpy(y[b].qs + 4 * c, o + 16 + 32 * c + 4 * (l % 8), 4);
            continue;
        }
        const uint8_t *o = grp + (size_t)b * LLE_PK_Q80_BLOCK;
        memcpy(&y[b].d, o + LLE_PK_Q80_D + 2 * l, 2);
        for (int c = 0; c < 8; c++) {
            uint32_t v;
            memcpy(&v, o + LLE_PK_Q80_QS + 64 * c + 4 * l, 4);
            v ^= 0x80808080u;
            memcpy(y[b].qs + 4 * c, &v, 4);
        }
    }
}

static void unpack_q4_1(int layout, const uint8_t *grp, int64_t nb, int l, block_q4_1 *y) {
    for (int64_t b = 0; b < nb; b++) {
        if (layout == LLE_PK_SPLIT8) {
            const uint8_t *o = grp + ((size_t)(l / 8) * (size_t)nb + (size_t)b) * LLE_PK_Q41_HBLOCK;
            memcpy(&y[b].d, o + 2 * (l % 8), 2);
            memcpy(&y[b].m, o + 16 + 2 * (l % 8), 2);
            for (int c = 0; c < 4; c++) memcpy(y[b].qs + 4 * c, o + 32 + 32 * c + 4 * (l % 8), 4);
            continue;
        }
        const uint8_t *o = grp + (size_t)b * LLE_PK_Q41_BLOCK;
        memcpy(&y[b].d, o + LLE_PK_Q41_D + 2 * l, 2);
        memcpy(&y[b].m, o + LLE_PK_Q41_M + 2 * l, 2);
        for (int c = 0; c < 4; c++) memcpy(y[b].qs + 4 * c, o + LLE_PK_Q41_QS + 64 * c + 4 * l, 4);
    }
}

/* Rows `ids` of weight w as floats (tf: its type's to_float), read back from its packed copy when it
 * has one of a type whose layout is read back (Q8_0, Q4_1): 1, or 0 with nothing done (no copy,
 * Q4_K, Q6_K). get_rows goes through it, so that a tied embedding (the output head is token_embd)
 * never faults back the file pages the packer released. Ids outside the copy read the weight. */
int lle_packed_get_rows(int type, const void *w, size_t ws, int64_t k, const int *ids, int64_t n,
                        lle_to_float_fn tf, float *out) {
    if (type != T_Q8_0 && type != T_Q4_1) return 0;
    const pack_entry *e = NULL;
    for (int i = 0; i < g_n_packs && !e; i++)
        if (g_packs[i].w == w && g_packs[i].type == type && g_packs[i].ws == ws && g_packs[i].k == k) e = &g_packs[i];
    if (!e || !entry_current(e, w)) return 0;
    uint8_t *row = malloc(ws);
    if (!row) return 0;
    const size_t gbytes = (size_t)lle_packed_group_bytes(type, k);
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = ids[i];
        const uint8_t *src = (const uint8_t *)w + (size_t)r * ws;
        if (r >= 0 && r < e->m) {
            const uint8_t *grp = (const uint8_t *)e->packed + (size_t)(r / LLE_PACK_ROWS) * gbytes;
            if (type == T_Q8_0) unpack_q8_0(e->layout, grp, k / QK, (int)(r % LLE_PACK_ROWS), (block_q8_0 *)row);
            else unpack_q4_1(e->layout, grp, k / QK, (int)(r % LLE_PACK_ROWS), (block_q4_1 *)row);
            src = row;
        }
        tf(src, out + i * k, k);
    }
    free(row);
    return 1;
}
