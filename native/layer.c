/* The decoder stack in one call: for every layer, RMS norm, Q/K/V products, per-head Q/K norms,
 * RoPE, the K/V cache writes, attention (each sequence over its own cache), output product and
 * residual, then the gated feed-forward and its residual, with what a models.spec.LayerSpec may
 * declare: Q/K/V/output biases, fused QKV and gate/up weights, RoPE frequency factors, YaRN and
 * attn_factor, post-norms (Gemma), residual scaling (Granite).
 *
 * The arithmetic is exactly the op-by-op path's (models.base.Decoder.layer_forward on the native
 * backend): the same kernels in the same order, so logits are bit for bit the same. What it saves
 * is the Python round trip per op (hundreds per token) and every per-op allocation.
 */
#include "common.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

/* optional per-op timing of the stack (lle_stack_profile), for "where does a token's time go" */
enum { P_NORM, P_QKV, P_ROPE, P_KV_STORE, P_ATTN, P_OUT, P_ADD, P_GATE_UP, P_GLU, P_DOWN, P_COUNT };
static int g_profile = 0;
static double g_prof_ns[P_COUNT];
static double g_prof_calls = 0;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define TIMED(slot, stmt)                                     \
    do {                                                      \
        if (g_profile) {                                      \
            const double t0_ = now_ns();                      \
            stmt;                                             \
            g_prof_ns[slot] += now_ns() - t0_;                \
        } else {                                              \
            stmt;                                             \
        }                                                     \
    } while (0)

typedef struct { float *p; size_t n; } fbuf;
static fbuf g_bufs[11];

static float *buf(int i, size_t n) {
    fbuf *b = &g_bufs[i];
    if (n > b->n) {
        const size_t want = ((n + n / 4 + 1024) + 15) & ~(size_t)15;
        float *p = aligned_alloc(64, want * sizeof(float));
        if (!p) return NULL;
        free(b->p);
        b->p = p;
        b->n = want;
    }
    return b->p;
}

/* room for n one-row attention problems (and their lle_attn_prep steps, *preps) */
static lle_attn_args *attn_rows(long long n, lle_attn_prep **preps) {
    static lle_attn_args *rows;
    static lle_attn_prep *steps;
    static long long cap;
    if (n > cap) {
        lle_attn_args *p = realloc(rows, (size_t)n * sizeof(*p));
        if (!p) return NULL;
        rows = p;
        lle_attn_prep *q = realloc(steps, (size_t)n * sizeof(*q));
        if (!q) return NULL;
        steps = q;
        cap = n;
    }
    *preps = steps;
    return rows;
}

/* set (under the lock) by lle_decoder_layers_rows: every row computed as it would be alone */
static int g_rows = 0;

static int mm(const lle_weight *w, const float *x, long long n, float *out) {
    if (g_rows) return lle_matmul_rows_impl(w->type, w->data, w->row_bytes, w->m, w->k, x, n, out, w->m);
    return lle_matmul_impl(w->type, w->data, w->row_bytes, w->m, w->k, x, n, out, w->m);
}

enum { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 };

/* store rows of K or V ([n][row_floats] float32) at their cells; q8_0 as kvcache.quantize_q8_0 does
 * (d = amax / 127 stored as f16, values round-half-even(x * 127 / amax)) */
static void store_rows(void *cells, void *scales, int type, const float *src, int n, int row_floats,
                       int cell_start, int n_first) {
    for (int r = 0; r < n; r++) {
        const int cell = r < n_first ? cell_start + r : r - n_first;
        const float *s = src + (size_t)r * row_floats;
        if (type == KV_F16) {
            lle_ops->f32_to_f16(row_floats, s, (lle_half *)cells + (size_t)cell * row_floats);
        } else if (type == KV_F32) {
            memcpy((float *)cells + (size_t)cell * row_floats, s, (size_t)row_floats * sizeof(float));
        } else {
            int8_t *q = (int8_t *)cells + (size_t)cell * row_floats;
            lle_half *dd = (lle_half *)scales + (size_t)cell * (row_floats / 32);
            for (int b = 0; b < row_floats / 32; b++) {
                const float *x = s + b * 32;
                float amax = 0.0f;
                for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
                dd[b] = lle_fp32_to_fp16(amax / 127.0f);
                const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
                for (int i = 0; i < 32; i++) q[b * 32 + i] = (int8_t)nearbyintf(x[i] * inv);
            }
        }
    }
}

/* q8_0 cells [0, n_cells) as float32 (kvcache.dequantize_q8_0: value * f32(scale)) */
static void dequantize_cells(const void *cells, const void *scales, int n_cells, int row_floats, float *out) {
    const int8_t *q = cells;
    const lle_half *d = scales;
    const size_t nb = (size_t)n_cells * (size_t)(row_floats / 32);
    for (size_t b = 0; b < nb; b++) {
        const float s = lle_fp16_to_fp32(d[b]);
        for (int i = 0; i < 32; i++) out[b * 32 + i] = (float)q[b * 32 + i] * s;
    }
}

/* rows of [a | b | c] (widths na, nb, nc) into separate contiguous arrays (c may be NULL when nc is 0) */
static void split_rows(const float *src, long long n, int na, int nb, int nc, float *a, float *b, float *c) {
    const size_t w = (size_t)na + nb + nc;
    for (long long r = 0; r < n; r++) {
        const float *s = src + (size_t)r * w;
        memcpy(a + (size_t)r * na, s, (size_t)na * sizeof(float));
        memcpy(b + (size_t)r * nb, s + na, (size_t)nb * sizeof(float));
        if (nc) memcpy(c + (size_t)r * nc, s + na + nb, (size_t)nc * sizeof(float));
    }
}

/* x[r][i] += bias[i] (float32, as NumPy's broadcast add in the op-by-op path) */
static void add_bias(float *x, const float *bias, long long n, int d) {
    for (long long r = 0; r < n; r++) {
        float *row = x + (size_t)r * d;
        for (int i = 0; i < d; i++) row[i] += bias[i];
    }
}

/* while this layer's products run, their threads pull the K/V cells of every sequence in layer il + 1
 * (`next`, NULL after the last layer) into cache (lle_bg_prefetch_set): attention then reads them from
 * cache instead of memory */
static void prefetch_next_layer(const lle_layer *next, lle_kv *const *kv, int n_seqs, int il) {
    lle_pf_range r[LLE_BG_MAX_RANGES];
    int n = 0;
    if (next && __atomic_load_n(&lle_kv_prefetch_on, __ATOMIC_RELAXED))
        for (int s = 0; s < n_seqs && n + 2 <= LLE_BG_MAX_RANGES; s++) {
            const lle_kv *c = &kv[s][il + 1];
            if (c->kv_type == KV_Q8_0) continue;
            const size_t row = (size_t)next->n_kv_head * next->head_dim * (c->kv_type == KV_F16 ? 2 : 4);
            r[n++] = (lle_pf_range){c->k, row * (size_t)c->n_cells};
            r[n++] = (lle_pf_range){c->v, row * (size_t)c->n_cells};
        }
    lle_bg_prefetch_set(r, n);
}

/* Decode rows (one per sequence) over float caches: each row's RoPE, Q scaling and K/V stores are done
 * per KV head in the attention job, by the task that reads that head (lle_attn_prep). Fills one[] and
 * prep[] for every sequence and returns 1 when that applies, 0 when not (nothing filled). */
static int fused_attn_args(const lle_layer *L, long long n, const int *pos, int n_seqs, const int *seq_rows,
                           lle_kv *const *kv, int il, float *q, float *k, float *v, float *ao, lle_attn_args *one,
                           lle_attn_prep *prep) {
    const int hd = L->head_dim, nq = L->n_head * hd, nk = L->n_kv_head * hd;
    if (L->n_rot > hd) return 0;
    for (int s = 0; s < n_seqs; s++)
        if (seq_rows[s + 1] - seq_rows[s] != 1 || kv[s][il].kv_type == KV_Q8_0) return 0;
    /* NULL (invalid parameters, no memory): the unfused path says which */
    const float *rope = lle_rope_table_impl(pos, n, L->n_rot, L->rope_base, L->rope_scale, L->rope_factors,
                                            L->rope_attn_factor, L->rope_ext_factor, L->rope_corr_lo, L->rope_corr_hi);
    if (!rope) return 0;
    for (int s = 0; s < n_seqs; s++) {  /* one row: its cell is cell_start */
        const lle_kv *c = &kv[s][il];
        const int r0 = seq_rows[s];
        prep[s] = (lle_attn_prep){rope + (size_t)r0 * L->n_rot, L->n_rot, L->neox, L->q_scale, q + (size_t)r0 * nq,
                                  k + (size_t)r0 * nk, v + (size_t)r0 * nk, c->k, c->v, c->kv_type == KV_F16,
                                  c->cell_start};
        one[s] = (lle_attn_args){q + (size_t)r0 * nq, 1, L->n_head, hd, c->k, c->v, c->kv_type == KV_F16, c->n_cells,
                                 L->n_kv_head, nk, hd, nk, hd, pos + r0, c->pos, L->attn_scale, L->window, L->softcap,
                                 ao + (size_t)r0 * nq, 0, &prep[s]};
    }
    return 1;
}

/* ---- a decode layer of several sequences as one pool job ----
 * With one decode row per sequence (row-exact), a layer is 5 pool jobs (Q/K/V, attention, output, gate and
 * up, down) with the norms, adds, GLU and activation quantizations between them run by the calling thread
 * while the others wait. Each job's start and end hand cache lines between the cores (the job, its
 * chunks, their state), which on a VM whose two vCPUs sit on different CCDs costs ~2.5 us a job instead
 * of ~1 (an empty-ish job measured both ways here, Zen 5). layer_job runs the same work as one job of
 * eight phases (nine where attention's prep steps need one of their own: tiers without attn_group): each
 * phase's items (rows, weight chunks, attention tasks) go to whichever thread takes
 * them (lle_chunks), and a phase starts once every item of the one before it is done, counted by each
 * thread on its own cache line: a thread that is late (or never joins) holds nobody up unless it holds
 * an item. Every value is the one the separate jobs give: the same kernels, chunks, attention tasks and
 * per-row norms, quantizations and GLU, only run elsewhere (a row's quantization for the output product by
 * the attention task that finishes its last heads). The down product's result is added to the residual
 * at the next layer's start (g_h_pending), or by run_layers after the last. */
#define LLE_LAYER_JOB_ROWS 64  /* sequences one layer job takes */
enum { PH_ATTN_IN, PH_QKV, PH_PREP, PH_ATTN, PH_OUT, PH_FFN_IN, PH_GATE_UP, PH_DOWN_IN, PH_DOWN, PH_COUNT };
static const int ph_slot[PH_COUNT] = {P_NORM, P_QKV, P_ATTN, P_ATTN, P_OUT, P_NORM, P_GATE_UP, P_GLU, P_DOWN};

typedef struct {
    const lle_layer *L;
    float *x, *h, *xn, *ao, *gate, *up;
    long long n;
    int rows_per_item, add_h;
    lle_mr_plan qkv[3], out, gu[2], down;
    int64_t qkv_c0[4], gu_c0[3];
    lle_attn_rows_plan attn;
    const lle_layer *next; lle_kv *const *kv; int n_seqs, il;  /* PH_ATTN's last item: next layer's K/V prefetch */
    int64_t total[PH_COUNT], tasks_per_row;
    lle_chunks items[PH_COUNT];
    struct { _Alignas(64) int32_t n; } heads_left[LLE_LAYER_JOB_ROWS];  /* per row: attention tasks to go */
} layer_job;

#define LLE_MAX_THREADS_LAYER 64
typedef struct { _Alignas(64) int32_t done[PH_COUNT]; } phase_done;  /* one thread's items done, per phase */
static phase_done g_done[LLE_MAX_THREADS_LAYER];
static int g_layer_job = 1;
static int g_h_pending = 0;  /* h holds a fused layer's last product, not yet added to x */

void lle_set_layer_job(int on) { g_layer_job = on; }

static void quantize_rows(const lle_mr_plan *p, int np, const float *x, int64_t stride, int64_t r0, int64_t r1) {
    for (int i = 0; i < np; i++)
        if (p[i].owns_act)
            for (int64_t r = r0; r < r1; r++) lle_mr_plan_quantize(&p[i], x + r * stride, r);
}

static void plan_chunk(const lle_mr_plan *p, const int64_t *c0, int64_t k) {
    int i = 0;
    while (k >= c0[i + 1]) i++;
    lle_mr_plan_chunk(&p[i], k - c0[i]);
}

static void layer_item(layer_job *j, int ph, int64_t k, int ith) {
    const lle_layer *L = j->L;
    const int d = L->n_embd;
    const int64_t r0 = k * j->rows_per_item, r1 = r0 + j->rows_per_item < j->n ? r0 + j->rows_per_item : j->n;
    switch (ph) {
    case PH_ATTN_IN:
    case PH_FFN_IN:
        if (ph == PH_FFN_IN || j->add_h)
            for (int64_t i = r0 * d; i < r1 * d; i++) j->x[i] = j->x[i] + j->h[i];
        lle_rms_norm_serial(j->x + r0 * d, ph == PH_ATTN_IN ? L->attn_norm : L->ffn_norm, r1 - r0, d, L->eps,
                            j->xn + r0 * d);
        if (ph == PH_ATTN_IN) quantize_rows(j->qkv, 3, j->xn, d, r0, r1);
        else quantize_rows(j->gu, 2, j->xn, d, r0, r1);
        break;
    case PH_DOWN_IN:
        lle_glu_serial(j->gate + r0 * L->n_ff, j->up + r0 * L->n_ff, (r1 - r0) * L->n_ff, L->n_ff, L->glu_kind,
                       j->gate + r0 * L->n_ff);
        quantize_rows(&j->down, 1, j->gate, L->n_ff, r0, r1);
        break;
    case PH_QKV: plan_chunk(j->qkv, j->qkv_c0, k); lle_bg_prefetch_some(ith); break;
    case PH_PREP: lle_attn_rows_prep(&j->attn, k); break;
    case PH_ATTN:
        if (k == j->attn.n_tasks) {
            prefetch_next_layer(j->next, j->kv, j->n_seqs, j->il);
            break;
        }
        lle_attn_rows_task(&j->attn, ith, k);
        /* the task that finishes a row's last heads quantizes that row for the output product (its
         * values are all there: the counter orders the other tasks' writes before this) */
        const int64_t r = k / j->tasks_per_row;
        if (__atomic_sub_fetch(&j->heads_left[r].n, 1, __ATOMIC_ACQ_REL) == 0)
            quantize_rows(&j->out, 1, j->ao, (int64_t)L->n_head * L->head_dim, r, r + 1);
        break;
    case PH_OUT: lle_mr_plan_chunk(&j->out, k); lle_bg_prefetch_some(ith); break;
    case PH_GATE_UP: plan_chunk(j->gu, j->gu_c0, k); lle_bg_prefetch_some(ith); break;
    default: lle_mr_plan_chunk(&j->down, k); lle_bg_prefetch_some(ith); break;
    }
}

/* wait until every item of phase ph is done (its writes visible) */
static void phase_wait(const layer_job *j, int ph, int nth) {
    for (int iter = 0;; iter++) {
        int64_t sum = 0;
        for (int t = 0; t < nth; t++) sum += __atomic_load_n(&g_done[t].done[ph], __ATOMIC_ACQUIRE);
        if (sum >= j->total[ph]) return;
        LLE_PAUSE();
        if (iter > 4096) sched_yield();
    }
}

static void layer_task(void *vctx, int ith, int nth) {
    layer_job *j = vctx;
    int32_t *done = g_done[ith].done;
    for (int ph = 0; ph < PH_COUNT; ph++) {
        const double t0 = g_profile && ith == 0 ? now_ns() : 0;
        int32_t mine = 0;
        for (int64_t k; (k = lle_chunks_next(&j->items[ph], ith)) >= 0;) {
            layer_item(j, ph, k, ith);
            __atomic_store_n(&done[ph], ++mine, __ATOMIC_RELEASE);
        }
        phase_wait(j, ph, nth);
        if (t0) g_prof_ns[ph_slot[ph]] += now_ns() - t0;
    }
}

/* layer L as one job (see above); 1: it does not apply (nothing done), else 0 or an error */
static int layer_job_run(const lle_layer *L, const lle_layer *next, float *x, long long n, lle_attn_args *one,
                         lle_kv *const *kv, int n_seqs, int il, float *xn, float *q, float *k, float *v, float *ao,
                         float *h, float *gate, float *up) {
    const int nth = lle_pool_threads();
    if (nth < 2 || nth > LLE_MAX_THREADS_LAYER || n < 2 || n > LLE_LAYER_JOB_ROWS || n_seqs != n) return 1;
    static layer_job j;
    j = (layer_job){.L = L, .x = x, .h = h, .xn = xn, .ao = ao, .gate = gate, .up = up, .n = n,
                    .add_h = g_h_pending, .next = next, .kv = kv, .n_seqs = n_seqs, .il = il};
    const lle_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
    float *oqkv[3] = {q, k, v};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        rc = lle_mr_plan_init(&j.qkv[i], wqkv[i], n, oqkv[i], i, i ? &j.qkv[i - 1] : NULL);
        j.qkv_c0[i + 1] = j.qkv_c0[i] + j.qkv[i].n_chunks;
    }
    if (!rc) rc = lle_mr_plan_init(&j.out, &L->wo, n, h, 3, NULL);
    for (int i = 0; i < 2 && !rc; i++) {
        rc = lle_mr_plan_init(&j.gu[i], i ? &L->up : &L->gate, n, i ? up : gate, 4 + i, i ? &j.gu[0] : NULL);
        j.gu_c0[i + 1] = j.gu_c0[i] + j.gu[i].n_chunks;
    }
    if (!rc) rc = lle_mr_plan_init(&j.down, &L->down, n, h, 6, NULL);
    if (!rc) rc = lle_attn_rows_plan_init(&j.attn, one, n_seqs, 1);
    if (rc) return rc;
    j.rows_per_item = (int)((n + nth - 1) / nth);
    if (j.rows_per_item > 4) j.rows_per_item = 4;
    const int64_t row_items = (n + j.rows_per_item - 1) / j.rows_per_item;
    j.tasks_per_row = j.attn.n_tasks / n;
    for (long long r = 0; r < n; r++) j.heads_left[r].n = (int32_t)j.tasks_per_row;
    const int64_t total[PH_COUNT] = {row_items, j.qkv_c0[3], j.attn.n_prep, j.attn.n_tasks + 1, j.out.n_chunks,
                                     row_items, j.gu_c0[2], row_items, j.down.n_chunks};
    for (int ph = 0; ph < PH_COUNT; ph++) {
        j.total[ph] = total[ph];
        lle_chunks_init(&j.items[ph], total[ph], nth);
    }
    for (int t = 0; t < nth; t++) memset(g_done[t].done, 0, sizeof(g_done[t].done));
    lle_pool_run(layer_task, &j);
    g_h_pending = 1;
    return 0;
}

static int layer_forward(const lle_layer *L, const lle_layer *next, float *x, long long n, const int *pos,
                         int n_seqs, const int *seq_rows, lle_kv *const *kv, int il) {
    const int d = L->n_embd, hd = L->head_dim, nq = L->n_head * hd, nk = L->n_kv_head * hd;
    float *xn = buf(0, (size_t)n * d), *q = buf(1, (size_t)n * nq), *k = buf(2, (size_t)n * nk);
    float *v = buf(3, (size_t)n * nk), *ao = buf(4, (size_t)n * nq), *h = buf(5, (size_t)n * d);
    float *gate = buf(6, (size_t)n * L->n_ff), *up = buf(7, (size_t)n * L->n_ff);
    if (!xn || !q || !k || !v || !ao || !h || !gate || !up) return -2;
    lle_attn_prep *prep = NULL;
    lle_attn_args *one = attn_rows(n, &prep);
    if (!one) return -2;
    const int fused = fused_attn_args(L, n, pos, n_seqs, seq_rows, kv, il, q, k, v, ao, one, prep);
    if (fused && g_rows && n > 1 && g_layer_job && !L->fused_qkv && !L->fused_gate_up && !L->bq && !L->bo &&
        !L->q_norm && !L->k_norm && !L->post_attn_norm && !L->post_ffn_norm && L->residual_scale == 1.0f) {
        const int r = layer_job_run(L, next, x, n, one, kv, n_seqs, il, xn, q, k, v, ao, h, gate, up);
        if (r != 1) return r;
    }
    int rc = 0;
    if (g_h_pending) {  /* the last layer ran as one job: its output product is still to be added */
        TIMED(P_ADD, rc |= lle_add_impl(x, h, n * d, x));
        g_h_pending = 0;
    }
    /* attention block */
    TIMED(P_NORM, rc |= lle_rms_norm_impl(x, L->attn_norm, n, d, L->eps, xn));
    if (L->fused_qkv) {
        float *qkv = buf(10, (size_t)n * (nq + 2 * nk));
        if (!qkv) return -2;
        TIMED(P_QKV, rc |= mm(&L->wq, xn, n, qkv); split_rows(qkv, n, nq, nk, nk, q, k, v));
    } else if (n == 1 || g_rows) {  /* one pool job for the three (each product as alone) */
        const lle_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *oqkv[3] = {q, k, v};
        TIMED(P_QKV, rc |= lle_matmul_rows_group_impl(wqkv, 3, xn, n, oqkv));
    } else {
        TIMED(P_QKV, rc |= mm(&L->wq, xn, n, q); rc |= mm(&L->wk, xn, n, k); rc |= mm(&L->wv, xn, n, v));
    }
    if (L->bq) {
        add_bias(q, L->bq, n, nq);
        add_bias(k, L->bk, n, nk);
        add_bias(v, L->bv, n, nk);
    }
    if (L->q_norm) TIMED(P_NORM, rc |= lle_rms_norm_impl(q, L->q_norm, n * L->n_head, hd, L->eps, q));
    if (L->k_norm) TIMED(P_NORM, rc |= lle_rms_norm_impl(k, L->k_norm, n * L->n_kv_head, hd, L->eps, k));
    if (!fused) {
        TIMED(P_ROPE,
              rc |= lle_rope_impl(q, pos, n, L->n_head, hd, L->n_rot, L->rope_base, L->rope_scale, L->neox,
                                  L->rope_factors, L->rope_attn_factor, L->rope_ext_factor, L->rope_corr_lo,
                                  L->rope_corr_hi, q);
              if (L->q_scale != 1.0f) rc |= lle_scale_impl(q, L->q_scale, n * nq, q);
              rc |= lle_rope_impl(k, pos, n, L->n_kv_head, hd, L->n_rot, L->rope_base, L->rope_scale, L->neox,
                                  L->rope_factors, L->rope_attn_factor, L->rope_ext_factor, L->rope_corr_lo,
                                  L->rope_corr_hi, k));
    }
    if (rc) return rc;
    /* one-row attention problems (a decode row, or any row in row-exact mode) over float caches go to
     * one pool job for every sequence and head (lle_attention_rows_impl: the same numbers per row);
     * prompt chunks and q8_0 caches (dequantized per sequence into one buffer) run per sequence */
    int n_one = fused ? n_seqs : 0;
    for (int s = 0; s < n_seqs && !fused; s++) {
        const lle_kv *c = &kv[s][il];
        const int r0 = seq_rows[s], ns = seq_rows[s + 1] - r0;
        const void *kc = c->k, *vc = c->v;
        TIMED(P_KV_STORE,
              store_rows(c->k, c->k_d, c->kv_type, k + (size_t)r0 * nk, ns, nk, c->cell_start, c->n_first);
              store_rows(c->v, c->v_d, c->kv_type, v + (size_t)r0 * nk, ns, nk, c->cell_start, c->n_first));
        if (c->kv_type != KV_Q8_0 && (g_rows || ns == 1)) {
            for (int r = r0; r < r0 + ns; r++)
                one[n_one++] = (lle_attn_args){q + (size_t)r * nq, 1, L->n_head, hd, kc, vc, c->kv_type == KV_F16,
                                               c->n_cells, L->n_kv_head, nk, hd, nk, hd, pos + r, c->pos,
                                               L->attn_scale, L->window, L->softcap, ao + (size_t)r * nq, 0, NULL};
            continue;
        }
        if (c->kv_type == KV_Q8_0) {  /* attention reads float32 copies, as the op-by-op path does */
            float *kf = buf(8, (size_t)c->n_cells * nk);
            float *vf = buf(9, (size_t)c->n_cells * nk);
            if (!kf || !vf) return -2;
            TIMED(P_KV_STORE, dequantize_cells(c->k, c->k_d, c->n_cells, nk, kf);
                  dequantize_cells(c->v, c->v_d, c->n_cells, nk, vf));
            kc = kf;
            vc = vf;
        }
        /* row-exact mode: one query row per call (the one-row kernels' summation order); the cells
         * of later rows are masked for an earlier one, as cells beyond a sequence's end are */
        const int step = g_rows ? 1 : ns;
        for (int r = r0; r < r0 + ns; r += step)
            TIMED(P_ATTN,
                  rc |= lle_attention_impl(q + (size_t)r * nq, step, L->n_head, hd, kc, vc, c->kv_type == KV_F16,
                                           c->n_cells, L->n_kv_head, nk, hd, nk, hd, pos + r, c->pos, L->attn_scale,
                                           L->window, L->softcap, ao + (size_t)r * nq));
    }
    if (n_one) TIMED(P_ATTN, rc |= lle_attention_rows_impl(one, n_one));
    prefetch_next_layer(next, kv, n_seqs, il);
    TIMED(P_OUT, rc |= mm(&L->wo, ao, n, h));
    if (L->bo) add_bias(h, L->bo, n, d);
    if (L->post_attn_norm) TIMED(P_NORM, rc |= lle_rms_norm_impl(h, L->post_attn_norm, n, d, L->eps, h));
    if (L->residual_scale != 1.0f) rc |= lle_scale_impl(h, L->residual_scale, n * d, h);
    TIMED(P_ADD, rc |= lle_add_impl(x, h, n * d, x));
    /* feed-forward block */
    TIMED(P_NORM, rc |= lle_rms_norm_impl(x, L->ffn_norm, n, d, L->eps, xn));
    if (L->fused_gate_up) {
        float *gu = buf(10, (size_t)n * 2 * L->n_ff);
        if (!gu) return -2;
        TIMED(P_GATE_UP, rc |= mm(&L->up, xn, n, gu); split_rows(gu, n, L->n_ff, L->n_ff, 0, gate, up, NULL));
    } else if (n == 1 || g_rows) {
        const lle_weight *wgu[2] = {&L->gate, &L->up};
        float *ogu[2] = {gate, up};
        TIMED(P_GATE_UP, rc |= lle_matmul_rows_group_impl(wgu, 2, xn, n, ogu));
    } else {
        TIMED(P_GATE_UP, rc |= mm(&L->gate, xn, n, gate); rc |= mm(&L->up, xn, n, up));
    }
    TIMED(P_GLU, rc |= lle_glu_impl(gate, up, n * L->n_ff, L->n_ff, L->glu_kind, gate));
    TIMED(P_DOWN, rc |= mm(&L->down, gate, n, h));
    if (L->post_ffn_norm) TIMED(P_NORM, rc |= lle_rms_norm_impl(h, L->post_ffn_norm, n, d, L->eps, h));
    if (L->residual_scale != 1.0f) rc |= lle_scale_impl(h, L->residual_scale, n * d, h);
    TIMED(P_ADD, rc |= lle_add_impl(x, h, n * d, x));
    return rc;
}

/* Claim the cells of every sequence's rows in every layer, as kvcache.LayerCache.reserve does: a
 * plain cache appends at `used`; a ring writes from `head` and wraps to cell 0. Every layer is checked
 * before any changes (-3: one has no room). */
static int kv_reserve(int n_layer, int n_seqs, const int *seq_rows, const int *pos, lle_kv *const *kv) {
    for (int s = 0; s < n_seqs; s++)
        for (int il = 0; il < n_layer; il++) {
            const lle_kv *e = &kv[s][il];
            const long long n = seq_rows[s + 1] - seq_rows[s];
            if (e->ring ? n > (long long)e->capacity - e->window + 1 : e->cursor[0] + n > e->capacity) return -3;
        }
    for (int s = 0; s < n_seqs; s++) {
        const int n = seq_rows[s + 1] - seq_rows[s];
        const int *p = pos + seq_rows[s];
        for (int il = 0; il < n_layer; il++) {
            lle_kv *e = &kv[s][il];
            long long *used = &e->cursor[0], *head = &e->cursor[1];
            if (!e->ring) {
                const int start = (int)*used;
                memcpy(e->pos + start, p, (size_t)n * sizeof(int));
                *used = *head = start + n;
                e->cell_start = start;
                e->n_first = n;
            } else {
                const int start = (int)*head, first = n < e->capacity - start ? n : e->capacity - start;
                memcpy(e->pos + start, p, (size_t)first * sizeof(int));
                if (first < n) {
                    memcpy(e->pos, p + first, (size_t)(n - first) * sizeof(int));
                    *used = e->capacity;
                } else if (start + n > *used) {
                    *used = start + n;
                }
                *head = (start + n) % e->capacity;
                e->cell_start = start;
                e->n_first = first;
            }
            e->n_cells = (int)*used;
        }
    }
    return 0;
}

static int run_layers(const lle_layer *layers, int n_layer, float *x, long long n, const int *pos, int n_seqs,
                      const int *seq_rows, lle_kv *const *kv, int rows) {
    if (n_layer < 0 || n <= 0 || n_seqs <= 0 || seq_rows[0] != 0 || seq_rows[n_seqs] != n) return -1;
    for (int s = 0; s < n_seqs; s++)
        if (seq_rows[s + 1] < seq_rows[s]) return -1;
    lle_lock();
    lle_ensure_init();
    int rc = kv_reserve(n_layer, n_seqs, seq_rows, pos, kv);
    if (g_profile) g_prof_calls += 1;
    g_rows = rows;
    for (int il = 0; il < n_layer && rc == 0; il++)
        rc = layer_forward(&layers[il], il + 1 < n_layer ? &layers[il + 1] : NULL, x, n, pos, n_seqs, seq_rows, kv, il);
    if (g_h_pending) {  /* the last layer's output product, run as one job, is still to be added */
        if (rc == 0) rc = lle_add_impl(x, g_bufs[5].p, n * layers[n_layer - 1].n_embd, x);
        g_h_pending = 0;
    }
    g_rows = 0;
    lle_bg_prefetch_set(NULL, 0);
    lle_unlock();
    return rc;
}

int lle_decoder_layers(const lle_layer *layers, int n_layer, float *x, long long n, const int *pos,
                       int n_seqs, const int *seq_rows, lle_kv *const *kv) {
    return run_layers(layers, n_layer, x, n, pos, n_seqs, seq_rows, kv, 0);
}

int lle_decoder_layers_rows(const lle_layer *layers, int n_layer, float *x, long long n, const int *pos,
                            int n_seqs, const int *seq_rows, lle_kv *const *kv) {
    return run_layers(layers, n_layer, x, n, pos, n_seqs, seq_rows, kv, 1);
}

int lle_stack_profile(int enable, double *out_ns, int n_out) {
    lle_lock();
    if (out_ns) {
        for (int i = 0; i < n_out && i < P_COUNT; i++) out_ns[i] = g_prof_ns[i];
        if (n_out > P_COUNT) out_ns[P_COUNT] = g_prof_calls;
    }
    for (int i = 0; i < P_COUNT; i++) g_prof_ns[i] = 0;
    g_prof_calls = 0;
    g_profile = enable ? 1 : 0;
    lle_unlock();
    return P_COUNT;
}
