/* The float ops of a forward pass: RMS norm, RoPE (normal and NeoX), softmax, attention over an
 * F16 or F32 KV cache (causal, sliding window, grouped-query heads, soft-capping), SiLU/GELU gated
 * products, add, scale and soft-cap. Arithmetic follows ggml's CPU ops (double accumulation in
 * norms and softmax sums, the iterative RoPE theta, the F16 GELU table) so that results agree with
 * llama.cpp; the inner loops come from the selected ISA's lle_op_kernels.
 */
#include "common.h"

#include <limits.h>
#include <stdlib.h>

lle_half lle_gelu_table[65536];
const lle_op_kernels *lle_ops = &lle_ops_scalar;

/* provided by api.c */
void *lle_scratch_ops(size_t bytes);
void *lle_scratch_kv(size_t bytes);
void lle_lock(void);
void lle_unlock(void);
void lle_ensure_init(void);

/* ---------------------------------------------------------------- scalar inner loops */

static void swiglu_scalar(int n, float *y, const float *x, const float *g) {
    for (int i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

static void geglu_scalar(int n, float *y, const float *x, const float *g) {
    for (int i = 0; i < n; ++i) {
        if (x[i] <= -10.0f) {
            y[i] = 0.0f;
        } else if (x[i] >= 10.0f) {
            y[i] = x[i] * g[i];
        } else {
            y[i] = FP16(lle_gelu_table[lle_fp32_to_fp16(x[i])]) * g[i];
        }
    }
}

static double softmax_exp_scalar(int n, float *y, const float *x, float max) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        const float val = expf(x[i] - max);
        sum += (double)val;
        y[i] = val;
    }
    return sum;
}

/* Attention of one query row and head, plainly: the semantics of llama.cpp's attention without
 * flash-attention (Q rounded to the cache type, scores soft-capped then scaled, softmax, the
 * probabilities rounded to the cache type, then the weighted sum of V) in sequential float order. */
static void attn_row_scalar(const lle_attn_args *a, int64_t i, int64_t h, float *scratch) {
    const int64_t d = a->d, t = a->t;
    const int64_t g = h / (a->n_head / a->n_kv);
    const int ld16 = a->kv_f16 && !a->kv_wide;
    const size_t esz = ld16 ? 2 : 4;
    float *w = scratch;
    float *qb = w + ((t + 31) & ~(int64_t)31);
    float *acc = qb + d;
    const float *q = a->q + (i * a->n_head + h) * d;
    for (int64_t e = 0; e < d; e++) qb[e] = a->kv_f16 ? FP16(lle_fp32_to_fp16(q[e])) : q[e];
    const int qp = a->q_pos[i];
    const float inv_cap = a->softcap > 0 ? 1.0f / a->softcap : 0.0f;
    float max = -INFINITY;
    for (int64_t j = 0; j < t; j++) {
        const int kp = a->k_pos[j];
        if (kp < 0 || kp > qp || (a->window > 0 && qp - kp >= a->window)) {
            w[j] = -INFINITY;
            continue;
        }
        const uint8_t *kr = a->k + (size_t)(j * a->ks_t + g * a->ks_h) * esz;
        float s = 0;
        if (ld16) for (int64_t e = 0; e < d; e++) s += FP16(((const lle_half *)kr)[e]) * qb[e];
        else for (int64_t e = 0; e < d; e++) s += ((const float *)kr)[e] * qb[e];
        if (a->softcap > 0) s = tanhf(s * inv_cap) * a->softcap;
        w[j] = s * a->scale;
        if (w[j] > max) max = w[j];
    }
    float *o = a->out + (i * a->n_head + h) * d;
    if (max == -INFINITY) {
        memset(o, 0, (size_t)d * sizeof(float));
        return;
    }
    const float inv = (float)(1.0 / softmax_exp_scalar((int)t, w, w, max));
    memset(acc, 0, (size_t)d * sizeof(float));
    for (int64_t j = 0; j < t; j++) {
        if (w[j] == 0.0f) continue;
        const float p = a->kv_f16 ? FP16(lle_fp32_to_fp16(w[j] * inv)) : w[j] * inv;
        const uint8_t *vr = a->v + (size_t)(j * a->vs_t + g * a->vs_h) * esz;
        if (ld16) for (int64_t e = 0; e < d; e++) acc[e] += FP16(((const lle_half *)vr)[e]) * p;
        else for (int64_t e = 0; e < d; e++) acc[e] += ((const float *)vr)[e] * p;
    }
    memcpy(o, acc, (size_t)d * sizeof(float));
}

static void rope_head_scalar(const float *src, float *dst, const float *cache, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
        const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + half : i0 + 1;
        const float x0 = src[a], x1 = src[b];
        dst[a] = x0 * cache[i0] - x1 * cache[i0 + 1];
        dst[b] = x0 * cache[i0 + 1] + x1 * cache[i0];
    }
}

static void f16_to_f32_scalar(int64_t n, const lle_half *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = FP16(x[i]);
}

static void f32_to_f16_scalar(int64_t n, const float *x, lle_half *y) {
    for (int64_t i = 0; i < n; i++) y[i] = lle_fp32_to_fp16(x[i]);
}

lle_op_kernels lle_ops_scalar = {swiglu_scalar, geglu_scalar, softmax_exp_scalar, rope_head_scalar, attn_row_scalar,
                                 f16_to_f32_scalar, NULL, f32_to_f16_scalar, NULL, NULL, NULL, 8};

void lle_build_gelu_table(void) {
    const float GELU_COEF_A = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    for (int i = 0; i < 65536; ++i) {
        const float f = FP16((lle_half)i);
        /* ggml_gelu_f32 as GCC compiles it in llama.cpp's native builds: the inner 1 + a*x*x is
         * contracted to one fused multiply-add */
        const float inner = fmaf(GELU_COEF_A * f, f, 1.0f);
        const float g = 0.5f * f * (1.0f + tanhf(SQRT_2_OVER_PI * f * inner));
        lle_gelu_table[i] = lle_fp32_to_fp16(g);
    }
}

/* ---------------------------------------------------------------- row-parallel helper */

typedef void (*row_fn)(void *ctx, int64_t r0, int64_t r1);
typedef struct { row_fn fn; void *ctx; int64_t n_rows; int64_t chunk; lle_chunks chunks; } rows_ctx;

static void rows_task(void *vctx, int ith, int nth) {
    (void)nth;
    rows_ctx *c = vctx;
    for (;;) {
        const int64_t ch = lle_chunks_next(&c->chunks, ith);
        if (ch < 0) break;
        const int64_t i0 = ch * c->chunk;
        const int64_t i1 = i0 + c->chunk < c->n_rows ? i0 + c->chunk : c->n_rows;
        c->fn(c->ctx, i0, i1);
    }
}

/* split [0, n_rows) over the pool when the total work (in values) is worth it */
static void parallel_rows(row_fn fn, void *ctx, int64_t n_rows, int64_t work_per_row) {
    const int nth = lle_pool_threads();
    if (nth <= 1 || n_rows < 2 || n_rows * work_per_row < 32768) {
        fn(ctx, 0, n_rows);
        return;
    }
    int64_t chunk = n_rows / (nth * 4);
    if (chunk < 1) chunk = 1;
    rows_ctx c = {.fn = fn, .ctx = ctx, .n_rows = n_rows, .chunk = chunk};
    lle_pool_run_chunks(rows_task, &c, &c.chunks, (n_rows + chunk - 1) / chunk, 0);
}

/* ---------------------------------------------------------------- rms_norm */

typedef struct { const float *x, *w; int64_t d; float eps; float *out; } rms_ctx;

/* ggml's sum of squares (each square in float, summed in double, in order) of up to 4 rows at once:
 * each row's sum is a chain of dependent adds, so interleaving rows runs them side by side */
LLE_INLINE void sum_squares(const float *x, int64_t stride, int nr, int64_t d, double *sum) {
    if (nr == 4) {
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int64_t i = 0; i < d; i++) {
            s0 += (double)(x[i] * x[i]);
            s1 += (double)(x[stride + i] * x[stride + i]);
            s2 += (double)(x[2 * stride + i] * x[2 * stride + i]);
            s3 += (double)(x[3 * stride + i] * x[3 * stride + i]);
        }
        sum[0] = s0; sum[1] = s1; sum[2] = s2; sum[3] = s3;
        return;
    }
    for (int q = 0; q < nr; q++) {
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += (double)(x[q * stride + i] * x[q * stride + i]);
        sum[q] = s;
    }
}

static void rms_rows(void *vctx, int64_t r0, int64_t r1) {
    const rms_ctx *c = vctx;
    for (int64_t r = r0; r < r1; r += 4) {
        const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        double sum[4];
        sum_squares(c->x + r * c->d, c->d, nr, c->d, sum);
        for (int q = 0; q < nr; q++) {
            const float *x = c->x + (r + q) * c->d;
            float *y = c->out + (r + q) * c->d;
            const float mean = (float)(sum[q] / c->d);
            const float scale = 1.0f / sqrtf(mean + c->eps);
            if (c->w) {
                for (int64_t i = 0; i < c->d; i++) y[i] = (x[i] * scale) * c->w[i];
            } else {
                for (int64_t i = 0; i < c->d; i++) y[i] = x[i] * scale;
            }
        }
    }
}

void lle_rms_norm_serial(const float *x, const float *w, long long n, long long d, float eps, float *out) {
    rms_ctx c = {x, w, d, eps, out};
    rms_rows(&c, 0, n);
}

int lle_rms_norm_impl(const float *x, const float *w, long long n, long long d, float eps, float *out) {
    rms_ctx c = {x, w, d, eps, out};
    parallel_rows(rms_rows, &c, n, d);
    return 0;
}

int lle_rms_norm(const float *x, const float *w, long long n, long long d, float eps, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_rms_norm_impl(x, w, n, d, eps, out);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- rope */

/* ggml_rope_cache_init's table of one position: cos and sin (times mscale) of each rotated pair's
 * angle, the angle advancing by repeated multiplication */
typedef struct {
    int n_rot; float freq_scale, theta_scale, mscale, ext_factor, corr_lo, corr_hi;
    const float *freq_factors;
} rope_params;

static void rope_cache_row(const rope_params *p, int pos, float *cache) {
    float theta = (float)pos;
    for (int i0 = 0; i0 < p->n_rot; i0 += 2) {
        const float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        const float extrap = theta / ff;
        float th = p->freq_scale * extrap;
        if (p->ext_factor != 0.0f) {
            /* ggml rope_yarn: ramp from the extrapolated to the interpolated angle over pairs
             * [corr_lo, corr_hi] (mscale's YaRN factor is already folded into p->mscale) */
            const float y = ((float)(i0 / 2) - p->corr_lo) / fmaxf(0.001f, p->corr_hi - p->corr_lo);
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;
            th = th * (1.0f - mix) + extrap * mix;
        }
        cache[i0 + 0] = cosf(th) * p->mscale;  /* ggml rope_yarn: attn_factor scales cos and sin */
        cache[i0 + 1] = sinf(th) * p->mscale;
        theta *= p->theta_scale;
    }
}

/* The tables of a call's rows. A decode step ropes the same positions with the same parameters twice
 * per layer (q, k) in every layer, so the last tables are kept, per parameter set (two: Gemma's local
 * and global layers differ) and reused when a call's positions are the same: the same values, 2 n_rot
 * sines and cosines per row once per step instead of per call. Callers hold the lock (lle_lock). */
enum { ROPE_MEMO_SLOTS = 2 };
static struct rope_memo {
    rope_params p; float *factors;  /* p.freq_factors points to the memo's copy of them */
    int n; int *pos; float *table; size_t cap, pos_cap; unsigned long long used;
} g_rope_memo[ROPE_MEMO_SLOTS];
static unsigned long long g_rope_clock;

static int rope_params_equal(const struct rope_memo *m, const rope_params *p) {
    if (m->p.n_rot != p->n_rot || m->p.freq_scale != p->freq_scale || m->p.theta_scale != p->theta_scale ||
        m->p.mscale != p->mscale || m->p.ext_factor != p->ext_factor || m->p.corr_lo != p->corr_lo ||
        m->p.corr_hi != p->corr_hi || !m->p.freq_factors != !p->freq_factors)
        return 0;
    return !p->freq_factors || memcmp(m->factors, p->freq_factors, (size_t)(p->n_rot / 2) * sizeof(float)) == 0;
}

static const float *rope_tables(const rope_params *p, const int *pos, int64_t n) {
    struct rope_memo *m = NULL, *oldest = &g_rope_memo[0];
    for (int i = 0; i < ROPE_MEMO_SLOTS; i++) {
        struct rope_memo *e = &g_rope_memo[i];
        if (e->table && rope_params_equal(e, p)) m = e;
        if (e->used < oldest->used) oldest = e;
    }
    if (m && m->n == n && memcmp(m->pos, pos, (size_t)n * sizeof(int)) == 0) {
        m->used = ++g_rope_clock;
        return m->table;
    }
    if (!m) m = oldest;
    m->n = -1;  /* invalid until filled (an allocation below may fail) */
    const size_t want = (size_t)n * (size_t)p->n_rot;
    if (!m->factors && !(m->factors = malloc(1024 * sizeof(float)))) return NULL;  /* n_rot <= 2048 */
    if (want > m->cap || !m->table) {
        float *t = malloc((want ? want : 1) * sizeof(float));
        if (!t) return NULL;
        free(m->table);
        m->table = t;
        m->cap = want;
    }
    if ((size_t)n > m->pos_cap || !m->pos) {
        int *q = malloc((size_t)(n ? n : 1) * sizeof(int));
        if (!q) return NULL;
        free(m->pos);
        m->pos = q;
        m->pos_cap = (size_t)n;
    }
    m->p = *p;
    if (p->freq_factors) {
        memcpy(m->factors, p->freq_factors, (size_t)(p->n_rot / 2) * sizeof(float));
        m->p.freq_factors = m->factors;
    }
    for (int64_t r = 0; r < n; r++) rope_cache_row(p, pos[r], m->table + (size_t)r * p->n_rot);
    memcpy(m->pos, pos, (size_t)n * sizeof(int));
    m->n = (int)n;
    m->used = ++g_rope_clock;
    return m->table;
}

typedef struct {
    const float *x; int64_t n_head, head_dim; int n_rot, neox; const float *tables; float *out;
} rope_ctx;

static void rope_rows(void *vctx, int64_t r0, int64_t r1) {
    const rope_ctx *c = vctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *cache = c->tables + (size_t)r * c->n_rot;
        for (int64_t h = 0; h < c->n_head; h++) {
            const float *src = c->x + (r * c->n_head + h) * c->head_dim;
            float *dst = c->out + (r * c->n_head + h) * c->head_dim;
            lle_ops->rope_head(src, dst, cache, c->n_rot, c->neox);
            if (dst != src)
                for (int64_t i = c->n_rot; i < c->head_dim; i++) dst[i] = src[i];
        }
    }
}

/* the RoPE tables of n rows at positions pos (rope_tables); NULL: invalid parameters (*rc -1) or no
 * memory (*rc -2) */
static const float *rope_tables_for(const int *pos, long long n, int n_rot, float freq_base, float freq_scale,
                                    const float *freq_factors, float attn_factor, float ext_factor, float corr_lo,
                                    float corr_hi, int *rc) {
    *rc = -1;
    if (n_rot % 2 != 0 || n_rot > 2048 || n < 0 || n > INT_MAX) return NULL;
    const rope_params p = {n_rot, freq_scale, powf(freq_base, -2.0f / n_rot), attn_factor, ext_factor, corr_lo,
                           corr_hi, freq_factors};
    *rc = -2;
    return rope_tables(&p, pos, n);
}

int lle_rope_impl(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
             int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
             float attn_factor, float ext_factor, float corr_lo, float corr_hi, float *out) {
    if (n_rot > head_dim) return -1;
    int rc;
    const float *tables = rope_tables_for(pos, n, n_rot, freq_base, freq_scale, freq_factors, attn_factor,
                                          ext_factor, corr_lo, corr_hi, &rc);
    if (!tables) return rc;
    rope_ctx c = {x, n_head, head_dim, n_rot, neox, tables, out};
    parallel_rows(rope_rows, &c, n, n_head * head_dim * 8);
    return 0;
}

const float *lle_rope_table_impl(const int *pos, long long n, int n_rot, float freq_base, float freq_scale,
                                 const float *freq_factors, float attn_factor, float ext_factor, float corr_lo,
                                 float corr_hi) {
    int rc;
    if (n_rot <= 0) return NULL;
    return rope_tables_for(pos, n, n_rot, freq_base, freq_scale, freq_factors, attn_factor, ext_factor, corr_lo,
                           corr_hi, &rc);
}

int lle_rope(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
             int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
             float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_rope_impl(x, pos, n, n_head, head_dim, n_rot, freq_base, freq_scale, neox, freq_factors, 1.0f,
                                0.0f, 0.0f, 0.0f, out);
    lle_unlock();
    return r;
}

int lle_rope_ext(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
                 int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
                 float attn_factor, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_rope_impl(x, pos, n, n_head, head_dim, n_rot, freq_base, freq_scale, neox, freq_factors,
                                attn_factor, 0.0f, 0.0f, 0.0f, out);
    lle_unlock();
    return r;
}

int lle_rope_yarn(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
                  int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
                  float attn_factor, float ext_factor, float corr_lo, float corr_hi, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_rope_impl(x, pos, n, n_head, head_dim, n_rot, freq_base, freq_scale, neox, freq_factors,
                                attn_factor, ext_factor, corr_lo, corr_hi, out);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- softmax */

typedef struct { const float *x; int64_t d; float scale; float *out; } softmax_ctx;

static void softmax_rows(void *vctx, int64_t r0, int64_t r1) {
    const softmax_ctx *c = vctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->d;
        float *y = c->out + r * c->d;
        float max = -INFINITY;
        for (int64_t i = 0; i < c->d; i++) {
            y[i] = x[i] * c->scale;
            if (y[i] > max) max = y[i];
        }
        const double sum = lle_ops->softmax_exp((int)c->d, y, y, max);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < c->d; i++) y[i] *= inv;
    }
}

int lle_softmax_impl(const float *x, long long n, long long d, float scale, float *out) {
    softmax_ctx c = {x, d, scale, out};
    parallel_rows(softmax_rows, &c, n, d * 4);
    return 0;
}

int lle_softmax(const float *x, long long n, long long d, float scale, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_softmax_impl(x, n, d, scale, out);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- attention */

/* Heads per task: the largest divisor of the heads per KV head (at most LLE_ATTN_GROUP) that still
 * leaves every thread a task, so that grouping never idles a core; 1 without attn_group. E.g. 9
 * heads over 3 KV heads, 2 threads: 3 (three tasks); Gemma 3's 4 heads over 1: 2 (two tasks). */
static int attn_heads_per_task(const lle_attn_args *a, int count, int nth) {
    if (!lle_ops->attn_group) return 1;
    const int64_t hpg = a[0].n_head / a[0].n_kv;
    for (int i = 1; i < count; i++)
        if (a[i].n_head / a[i].n_kv != hpg) return 1;
    for (int nh = LLE_ATTN_GROUP; nh >= 2; nh--)
        if (hpg % nh == 0 && count * (a[0].n_head / nh) >= nth) return nh;
    return 1;
}

typedef struct {
    lle_attn_args a;
    float *scratch; int64_t scratch_per_thread, per_head;
    int64_t rows_per_task, n_blocks;   /* a task: rows_per_task query rows of nh heads */
    int nh;                            /* heads per task (sharing a KV head: attn_group), or 1 */
    lle_chunks tasks;
} attn_ctx;

/* Tasks run kv head by kv head, then block of query rows, then the groups of query heads that share
 * the kv head, so the K/V rows of one head stay in cache across consecutive tasks. Every (row, head)
 * is computed independently (attn_group: each head as attn_row), so the split changes no value. */
static void attn_task(void *vctx, int ith, int nth) {
    (void)nth;
    attn_ctx *c = vctx;
    float *scratch = c->scratch + ith * c->scratch_per_thread;
    const int64_t n = c->a.n, groups = c->a.n_head / c->a.n_kv / c->nh, per_kv = c->n_blocks * groups;
    for (;;) {
        const int64_t task = lle_chunks_next(&c->tasks, ith);
        if (task < 0) break;
        const int64_t g = task / per_kv, rem = task % per_kv;
        const int64_t h0 = g * groups * c->nh + (rem % groups) * c->nh, i0 = (rem / groups) * c->rows_per_task;
        const int64_t i1 = i0 + c->rows_per_task < n ? i0 + c->rows_per_task : n;
        for (int64_t i = i0; i < i1; i++) {
            if (c->nh == 1) lle_ops->attn_row(&c->a, i, h0, scratch);
            else lle_ops->attn_group(&c->a, i, h0, c->nh, scratch, c->per_head);
        }
    }
}

int lle_attention_impl(const float *q, long long n, long long n_head, long long d,
                  const void *k, const void *v, int kv_f16, long long t, long long n_kv,
                  long long k_stride_t, long long k_stride_h, long long v_stride_t, long long v_stride_h,
                  const int *q_pos, const int *k_pos, float scale, int window, float softcap,
                  float *out) {
    if (n_kv <= 0 || n_head % n_kv != 0 || d <= 0 || t < 0) return -1;
    if (n == 1) {  /* one query row: the one-row problems' job (its heads grouped by KV head) */
        const lle_attn_args one = {q, 1, n_head, d, k, v, kv_f16, t, n_kv, k_stride_t, k_stride_h, v_stride_t,
                                   v_stride_h, q_pos, k_pos, scale, window, softcap, out, 0};
        return lle_attention_rows_impl(&one, 1);
    }
    const int nth = lle_pool_threads();
    const int64_t per = (lle_attn_scratch_floats(t, d) + 15) & ~(int64_t)15;
    attn_ctx c = {{q, n, n_head, d, k, v, kv_f16, t, n_kv, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                   q_pos, k_pos, scale, window, softcap, out, 0},
                  NULL, 0, per, 1, n, 1, {.n = 0}};
    /* several rows leave every task rows to spare: the query heads of a KV head go together (attn_group
     * reads each K/V row once for them) whenever it takes this cache */
    const int nh = kv_f16 && d % 8 == 0 ? attn_heads_per_task(&c.a, 1, 1) : 1;
    float *scratch = lle_scratch_ops((size_t)(per * nh * nth) * sizeof(float));
    if (!scratch) {
        return -2;
    }
    c.scratch = scratch;
    c.scratch_per_thread = per * nh;
    c.nh = nh;
    /* prefill over an f16 cache: every K/V row is read by n * n_head / n_kv queries, so convert the
     * rows once into f32 copies (exact) instead of at every read; same values, same order */
    if (kv_f16 && n >= 4 && d % lle_ops->kv_wide_align == 0 && t > 0) {
        float *kf = lle_scratch_kv((size_t)(2 * n_kv * t * d) * sizeof(float));
        if (!kf) return -2;
        float *vf = kf + n_kv * t * d;
        for (int64_t g = 0; g < n_kv; g++)
            for (int64_t j = 0; j < t; j++) {
                lle_ops->f16_to_f32(d, (const lle_half *)k + j * k_stride_t + g * k_stride_h, kf + (g * t + j) * d);
                lle_ops->f16_to_f32(d, (const lle_half *)v + j * v_stride_t + g * v_stride_h, vf + (g * t + j) * d);
            }
        c.a.k = (const uint8_t *)kf;
        c.a.v = (const uint8_t *)vf;
        c.a.ks_t = c.a.vs_t = d;
        c.a.ks_h = c.a.vs_h = t * d;
        c.a.kv_wide = 1;
    }
    /* blocks of up to 32 query rows, at least ~16 tasks per thread */
    int64_t rows = n * (n_head / nh) / (16 * (int64_t)nth);
    rows = rows < 1 ? 1 : rows > 32 ? 32 : rows;
    c.rows_per_task = rows;
    c.n_blocks = (n + rows - 1) / rows;
    /* below ~100k multiply-adds the pool round trip costs more than it saves */
    lle_pool_run_chunks(attn_task, &c, &c.tasks, n_kv * c.n_blocks * (n_head / n_kv / nh),
                        n * n_head == 1 || nth == 1 || n * n_head * t * d < 100000);
    return 0;
}

/* one pool job over several one-row problems: a task is `nh` heads of one problem that share a KV
 * head (attn_group: its K/V rows read once for them), or one head when nh == 1 */
typedef struct {
    lle_attn_rows_plan plan;
    lle_chunks tasks;
} attn_rows_ctx;

/* lle_attn_prep's steps for KV head g of problem a (its query heads, then its K and V) */
static void attn_prep(const lle_attn_args *a, int64_t g) {
    const lle_attn_prep *p = a->prep;
    const int64_t d = a->d, hpg = a->n_head / a->n_kv;
    for (int64_t h = g * hpg; h < (g + 1) * hpg; h++) {
        float *q = p->q + h * d;
        lle_ops->rope_head(q, q, p->table, p->n_rot, p->neox);
        if (p->q_scale != 1.0f)
            for (int64_t e = 0; e < d; e++) q[e] = q[e] * p->q_scale;
    }
    float *k = p->k + g * d;
    lle_ops->rope_head(k, k, p->table, p->n_rot, p->neox);
    const size_t at = (size_t)p->cell * (size_t)(a->n_kv * d) + (size_t)(g * d);
    if (p->kv_f16) {
        lle_ops->f32_to_f16(d, k, (lle_half *)p->k_cells + at);
        lle_ops->f32_to_f16(d, p->v + g * d, (lle_half *)p->v_cells + at);
    } else {
        memcpy((float *)p->k_cells + at, k, (size_t)d * sizeof(float));
        memcpy((float *)p->v_cells + at, p->v + g * d, (size_t)d * sizeof(float));
    }
}

/* every problem's lle_attn_prep steps, before any attention (where no task covers exactly one KV head) */
static void attn_prep_all(const lle_attn_args *a, int count) {
    for (int i = 0; i < count; i++)
        if (a[i].prep)
            for (int64_t g = 0; g < a[i].n_kv; g++) attn_prep(&a[i], g);
}

void lle_attn_rows_task(const lle_attn_rows_plan *c, int ith, int64_t task) {
    float *scratch = c->scratch + ith * c->scratch_per_thread;
    const int64_t per_problem = c->n_head / c->nh;
    const lle_attn_args *a = &c->a[task / per_problem];
    const int64_t h0 = (task % per_problem) * c->nh;
    if (c->prep && a->prep) attn_prep(a, h0 / c->nh);  /* c->nh is the heads per KV head */
    if (c->nh == 1) lle_ops->attn_row(a, 0, h0, scratch);
    else lle_ops->attn_group(a, 0, h0, c->nh, scratch, c->per_head);
}

static void attn_rows_task(void *vctx, int ith, int nth) {
    (void)nth;
    attn_rows_ctx *c = vctx;
    for (;;) {
        const int64_t task = lle_chunks_next(&c->tasks, ith);
        if (task < 0) break;
        lle_attn_rows_task(&c->plan, ith, task);
    }
}

/* ---- decode attention over long caches (lle_attn_wide, common.h) ---- */

/* cells from which one-row problems take the wide path (every problem of the call must have them):
 * below, attn_group's one task per KV head costs less than the wide path's three pool jobs */
static int64_t g_attn_wide_min = LLE_ATTN_WIDE_MIN;

void lle_set_attn_wide_min(long long cells) { g_attn_wide_min = cells < 0 ? 0 : cells; }

int64_t lle_attn_tree_max = LLE_ATTN_TREE_MAX;

void lle_set_attn_tree_max(long long cells) { lle_attn_tree_max = cells < 0 ? -1 : cells; }

#define WIDE_MAX_PROBLEMS 64
/* the wide path runs the AVX-512 tier's ops (ggml's AVX-512 orders): softmax chunks of 16 cells, 64 V
 * partial sums per value (ggml's 4 accumulators of 16 lanes), summed by WIDE_PARTS tasks of 16 lanes
 * per KV head */
#define WIDE_CHUNK 16
#define WIDE_LANES 64
#define WIDE_PARTS (WIDE_LANES / 16)

static int attn_wide_eligible(const lle_attn_args *a, int count) {
    if (!lle_ops->wide_scores || count > WIDE_MAX_PROBLEMS || lle_pool_threads() < 2) return 0;
    for (int i = 0; i < count; i++) {
        if (a[i].n != 1 || !a[i].kv_f16 || a[i].kv_wide || a[i].d % 64 != 0 || a[i].n_kv <= 0 ||
            a[i].n_head % a[i].n_kv != 0 || a[i].n_head / a[i].n_kv > LLE_ATTN_GROUP || a[i].n_head > LLE_ATTN_WIDE_MAX_HEADS ||
            a[i].t < 1 || a[i].t < g_attn_wide_min)
            return 0;
    }
    return 1;
}

typedef struct {
    lle_attn_wide *p;
    int count;
    int phase;                              /* 0 scores, 1 exponentials (tasks: cell blocks), 2 V sums */
    int64_t first[WIDE_MAX_PROBLEMS + 1];   /* problem i's tasks are [first[i], first[i + 1]) */
    lle_chunks tasks;
} attn_wide_ctx;

static void attn_wide_task(void *vctx, int ith, int nth) {
    (void)nth;
    attn_wide_ctx *c = vctx;
    for (;;) {
        const int64_t task = lle_chunks_next(&c->tasks, ith);
        if (task < 0) break;
        int i = 0;
        while (task >= c->first[i + 1]) i++;
        lle_attn_wide *p = &c->p[i];
        const int64_t k = task - c->first[i];
        if (c->phase == 0) lle_ops->wide_scores(p, k);
        else if (c->phase == 1) lle_ops->wide_exp(p, k);
        else lle_ops->wide_v(p, k / WIDE_PARTS, (int)(k % WIDE_PARTS));
    }
}

static void attn_wide_run(attn_wide_ctx *c, int phase) {
    c->phase = phase;
    c->first[0] = 0;
    for (int i = 0; i < c->count; i++) {
        const lle_attn_wide *p = &c->p[i];
        const int64_t n = phase < 2 ? p->n_blocks : WIDE_PARTS * p->a->n_kv;
        c->first[i + 1] = c->first[i] + n;
    }
    if (c->first[c->count] > 0) lle_pool_run_chunks(attn_wide_task, c, &c->tasks, c->first[c->count], 0);
}

static int attn_wide(const lle_attn_args *a, int count) {
    static lle_attn_wide p[WIDE_MAX_PROBLEMS];
    size_t floats = 0;
    for (int i = 0; i < count; i++) {
        const int64_t tp = (a[i].t + 31) & ~(int64_t)31, nb = (a[i].t + LLE_ATTN_WIDE_CELLS - 1) / LLE_ATTN_WIDE_CELLS;
        const int64_t nh = a[i].n_head, d = a[i].d;
        floats += (size_t)(4 * nb + nh * d + nh * tp + nh * (tp / 8) + nh * WIDE_LANES * d + nb * nh + 2 * nh + a[i].n_kv + 16);
    }
    float *f = lle_scratch_ops(floats * sizeof(float));
    if (!f) return -2;
    for (int i = 0; i < count; i++) {
        lle_attn_wide *q = &p[i];
        const int64_t nh = a[i].n_head, d = a[i].d;
        q->a = &a[i];
        q->tp = (a[i].t + 31) & ~(int64_t)31;
        q->n_blocks = (a[i].t + LLE_ATTN_WIDE_CELLS - 1) / LLE_ATTN_WIDE_CELLS;
        f = (float *)(((uintptr_t)f + 63) & ~(uintptr_t)63);
        q->bjlo = (int64_t *)(void *)f; f += 2 * q->n_blocks;
        q->bjhi = (int64_t *)(void *)f; f += 2 * q->n_blocks;
        q->qc = f; f += nh * d;
        q->w = f; f += nh * q->tp;
        q->csum = f; f += nh * (q->tp / 8);
        q->acc = f; f += nh * WIDE_LANES * d;
        q->bmax = f; f += q->n_blocks * nh;
        q->inv = f; f += nh;
        q->maxv = f; f += nh;
        q->v_left = (int *)(void *)f; f += a[i].n_kv;
        lle_half q16[512];  /* Q rounded to f16, as attn_group_n */
        for (int64_t h = 0; h < nh; h++)
            for (int64_t e0 = 0; e0 < d; e0 += 512) {
                const int64_t n = d - e0 < 512 ? d - e0 : 512;
                lle_ops->f32_to_f16(n, a[i].q + h * d + e0, q16);
                lle_ops->f16_to_f32(n, q16, q->qc + h * d + e0);
            }
    }
    attn_wide_ctx c = {p, count, 0, {0}, {.n = 0}};
    attn_wide_run(&c, 0);  /* scores */
    for (int i = 0; i < count; i++) {
        lle_attn_wide *q = &p[i];
        const int64_t nh = a[i].n_head, t = a[i].t, ts = (t + WIDE_CHUNK - 1) & ~(int64_t)(WIDE_CHUNK - 1);
        q->jlo = t;
        q->jhi = -1;
        for (int64_t b = 0; b < q->n_blocks; b++) {
            if (q->bjlo[b] < q->jlo) q->jlo = q->bjlo[b];
            if (q->bjhi[b] > q->jhi) q->jhi = q->bjhi[b];
        }
        for (int64_t h = 0; h < nh; h++) {
            float m = -INFINITY;
            for (int64_t b = 0; b < q->n_blocks; b++)
                if (q->bmax[b * nh + h] > m) m = q->bmax[b * nh + h];
            q->maxv[h] = m;
            if (m != -INFINITY)
                for (int64_t j = t; j < ts; j++) q->w[h * q->tp + j] = -INFINITY;
        }
        q->c0 = q->jlo & ~(int64_t)(WIDE_CHUNK - 1);
        q->c1 = (q->jhi + WIDE_CHUNK) & ~(int64_t)(WIDE_CHUNK - 1);
        q->jb = q->jlo & ~(int64_t)(WIDE_LANES - 1);
    }
    attn_wide_run(&c, 1);  /* exponentials */
    for (int i = 0; i < count; i++) {
        lle_attn_wide *q = &p[i];
        for (int64_t h = 0; h < a[i].n_head; h++) {
            q->inv[h] = 0.0f;
            if (q->maxv[h] == -INFINITY) continue;
            double sum = 0;  /* softmax_exp's: the chunks' float sums as doubles, in order */
            for (int64_t j = q->c0; j < q->c1; j += WIDE_CHUNK) sum += (double)q->csum[h * (q->tp / 8) + j / WIDE_CHUNK];
            q->inv[h] = (float)(1.0 / sum);
        }
        for (int64_t g = 0; g < a[i].n_kv; g++) q->v_left[g] = WIDE_PARTS;
    }
    attn_wide_run(&c, 2);  /* V sums, and the outputs */
    return 0;
}

#define LLE_ATTN_ROWS_POOL_MIN 10000

int lle_attn_rows_plan_init(lle_attn_rows_plan *c, const lle_attn_args *a, int count, int whole) {
    int64_t per = 0, work = 0;
    int prep = 0;  /* some problem still needs its lle_attn_prep steps */
    for (int i = 0; i < count; i++) {
        if (a[i].n != 1 || a[i].n_kv <= 0 || a[i].n_head != a[0].n_head || a[i].n_head % a[i].n_kv != 0 ||
            a[i].d <= 0 || a[i].t < 0 || a[i].kv_wide)
            return -1;
        prep |= a[i].prep != NULL;
        const int64_t f = (lle_attn_scratch_floats(a[i].t, a[i].d) + 15) & ~(int64_t)15;
        per = f > per ? f : per;
        work += a[i].n_head * a[i].t * a[i].d;
    }
    const int nth = lle_pool_threads();
    const int nh = attn_heads_per_task(a, count, nth);
    if (whole && attn_wide_eligible(a, count)) return 1;
    float *scratch = lle_scratch_ops((size_t)(per * nh * nth) * sizeof(float));
    if (!scratch) return -2;
    /* several tasks would read one KV head: its prep steps go first, as items of their own */
    const int split = prep && nh != a[0].n_head / a[0].n_kv;
    *c = (lle_attn_rows_plan){a, count, a[0].n_head, nh, scratch, per * nh, per, prep && !split,
                              count * (a[0].n_head / nh), work, split ? count * a[0].n_kv : 0};
    return 0;
}

void lle_attn_rows_prep(const lle_attn_rows_plan *c, int64_t item) {
    const lle_attn_args *a = &c->a[item / c->a[0].n_kv];
    if (a->prep) attn_prep(a, item % c->a[0].n_kv);
}

int lle_attention_rows_impl(const lle_attn_args *a, int count) {
    if (count <= 0) return 0;
    if (attn_wide_eligible(a, count)) {
        attn_prep_all(a, count);
        return attn_wide(a, count);
    }
    attn_rows_ctx c;
    const int rc = lle_attn_rows_plan_init(&c.plan, a, count, 0);
    if (rc) return rc;
    if (c.plan.n_prep) attn_prep_all(a, count);
    /* one thread below LLE_ATTN_ROWS_POOL_MIN multiply-adds, where the pool round trip costs more than it
     * saves. It was 100k (as lle_attention_impl's), which left the decode attention of one sequence on one
     * thread up to ~170 cells (SmolLM2) and that of 4 sequences up to ~40: measured here (Zen 5, 2 threads,
     * in-process A/B alternating step by step, medians) at 10k, SmolLM2's decode step from 17 to 145 cells
     * 2.075 -> 2.034 ms for one sequence and 2.667 -> 2.638 ms for four; from 10 to 42 cells, four
     * sequences 2.536 -> 2.426 ms. Each head is computed as alone either way: the split changes no value. */
    lle_pool_run_chunks(attn_rows_task, &c, &c.tasks, c.plan.n_tasks,
                        lle_pool_threads() == 1 || c.plan.work < LLE_ATTN_ROWS_POOL_MIN);
    return 0;
}

int lle_attention(const float *q, long long n, long long n_head, long long d,
                  const void *k, const void *v, int kv_f16, long long t, long long n_kv,
                  long long k_stride_t, long long k_stride_h, long long v_stride_t, long long v_stride_h,
                  const int *q_pos, const int *k_pos, float scale, int window, float softcap,
                  float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_attention_impl(q, n, n_head, d, k, v, kv_f16, t, n_kv, k_stride_t, k_stride_h, v_stride_t, v_stride_h, q_pos, k_pos, scale, window, softcap, out);
    lle_unlock();
    return r;
}

/* ---------------------------------------------------------------- elementwise */

typedef struct { const float *a, *b; float s; int kind; float *out; int64_t row; } ew_ctx;

/* values r0..r1 of the gated product, cut at the ends of its rows of c->row values: ggml runs each row
 * through its vectorized loop from the row's start and finishes the row's last values one by one, and
 * which values take the vector exp and which libm's is part of the result */
static void glu_rows(void *vctx, int64_t r0, int64_t r1) {
    const ew_ctx *c = vctx;
    for (int64_t s = r0; s < r1;) {
        const int64_t end = c->row > 0 && (s / c->row + 1) * c->row < r1 ? (s / c->row + 1) * c->row : r1;
        if (c->kind == 0) lle_ops->swiglu((int)(end - s), c->out + s, c->a + s, c->b + s);
        else lle_ops->geglu((int)(end - s), c->out + s, c->a + s, c->b + s);
        s = end;
    }
}

/* chunks of 1024 values are the parallel unit of the elementwise ops; `row` > 0: chunks end at row ends
 * too, unless rows are a multiple of 16 values (then a chunk boundary is one of the vector loops' own) */
static void parallel_elems(row_fn fn, void *ctx, int64_t n, int64_t row) {
    const int64_t blk = 1024;
    const int nth = lle_pool_threads();
    if (nth <= 1 || n < 65536) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunk = blk * ((n / blk) / (nth * 4) + 1);
    if (row > 0 && row % 16 != 0) chunk = (chunk + row - 1) / row * row;
    rows_ctx c = {.fn = fn, .ctx = ctx, .n_rows = n, .chunk = chunk};
    lle_pool_run_chunks(rows_task, &c, &c.chunks, (n + c.chunk - 1) / c.chunk, 0);
}

void lle_glu_serial(const float *gate, const float *up, long long n, long long row, int kind, float *out) {
    ew_ctx c = {gate, up, 0, kind, out, row};
    glu_rows(&c, 0, n);
}

int lle_glu_impl(const float *gate, const float *up, long long n, long long row, int kind, float *out) {
    if (kind != 0 && kind != 1) return -1;
    if (row <= 0 || n % row != 0) return -1;
    ew_ctx c = {gate, up, 0, kind, out, row};
    parallel_elems(glu_rows, &c, n, row);
    return 0;
}

int lle_glu(const float *gate, const float *up, long long n, long long row, int kind, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_glu_impl(gate, up, n, row, kind, out);
    lle_unlock();
    return r;
}

static void add_rows(void *vctx, int64_t r0, int64_t r1) {
    const ew_ctx *c = vctx;
    for (int64_t i = r0; i < r1; i++) c->out[i] = c->a[i] + c->b[i];
}

int lle_add_impl(const float *a, const float *b, long long n, float *out) {
    ew_ctx c = {a, b, 0, 0, out};
    parallel_elems(add_rows, &c, n, 0);
    return 0;
}

int lle_add(const float *a, const float *b, long long n, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_add_impl(a, b, n, out);
    lle_unlock();
    return r;
}

static void scale_rows(void *vctx, int64_t r0, int64_t r1) {
    const ew_ctx *c = vctx;
    for (int64_t i = r0; i < r1; i++) c->out[i] = c->a[i] * c->s;
}

int lle_scale_impl(const float *x, float s, long long n, float *out) {
    ew_ctx c = {x, NULL, s, 0, out};
    parallel_elems(scale_rows, &c, n, 0);
    return 0;
}

int lle_scale(const float *x, float s, long long n, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_scale_impl(x, s, n, out);
    lle_unlock();
    return r;
}

static void softcap_rows(void *vctx, int64_t r0, int64_t r1) {
    const ew_ctx *c = vctx;
    const float inv = 1.0f / c->s;  /* ggml: scale(1/cap), tanh, scale(cap) */
    for (int64_t i = r0; i < r1; i++) c->out[i] = tanhf(c->a[i] * inv) * c->s;
}

int lle_softcap_impl(const float *x, float cap, long long n, float *out) {
    if (!(cap > 0)) return -1;
    ew_ctx c = {x, NULL, cap, 0, out};
    parallel_elems(softcap_rows, &c, n, 0);
    return 0;
}

int lle_softcap(const float *x, float cap, long long n, float *out) {
    lle_lock();
    lle_ensure_init();
    const int r = lle_softcap_impl(x, cap, n, out);
    lle_unlock();
    return r;
}
