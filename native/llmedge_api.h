/* Public C API of llmedge._native (plain declarations only: this file is also the cffi cdef).
 *
 * Conventions: weights are raw GGUF blocks, one row of `k` values after another (row stride =
 * lle_row_size(type, k) bytes unless a stride is given); activations are float32, row-major.
 * Every entry point takes the library lock, so calls from several Python threads serialize.
 */

/* ---- library state ---- */
int lle_init(int n_threads);                 /* (re)create the thread pool; returns the thread count */
int lle_n_threads(void);
int lle_cpu_features(void);                  /* bit mask of LLE_CPU_* (see common.h) */
int lle_isa(void);                           /* 0 scalar, 1 avx2, 2 avx512, 3 neon */
int lle_set_isa(int isa);                    /* force an ISA no higher than the CPU's; returns it or -1 */
int lle_isa_available(int isa);
void lle_set_spin_us(int us);                /* how long idle workers spin before they sleep */
/* 1: weight-stream prefetches keep their lines in the caches (T0; the weights fit in the last-level
 * cache), 0: non-temporal (NTA, the default) */
void lle_set_weight_prefetch(int keep);
int lle_weight_prefetch(void);
long long lle_llc_bytes(void);               /* the last-level cache's bytes as the OS reports them; 0 unknown */
/* the round trip of a cache line between two of the pool's threads, in ns (median of batches of `rounds`):
 * ~100 where their cores share a cache, several times that across caches; 0 with one thread */
double lle_core_round_trip_ns(int rounds);
/* 1 (the default): during a decode step's products, their threads prefetch the next layer's K/V cells */
void lle_set_kv_prefetch(int on);
int lle_kv_prefetch(void);
int lle_cpu_family(void);                    /* x86 CPUID display family (0x19 Zen 3/4, 0x1A Zen 5); 0 elsewhere */
int lle_act_rounding_mode(void);             /* Q8_0/Q8_1 activation rounding: 0 ref, 1 x86, 2 arm */
int lle_set_act_rounding(int mode);          /* returns the mode, or -1 if invalid */

/* ---- type traits ---- */
int lle_type_supported(int type);
int lle_block_size(int type);
int lle_type_size(int type);
int lle_vec_type(int type);                  /* the activation type a weight type pairs with */
int lle_kernel_isa(int type);                /* ISA of the vec_dot kernel selected for `type` */
long long lle_row_size(int type, long long k);

/* ---- quantized products ---- */
/* out[i*ldo + j] = dot(x row i, weight row j) for i < n, j < m; x is [n, k] float32 */
int lle_matmul(int type, const void *w, long long w_stride, long long m, long long k,
               const float *x, long long n, float *out, long long ldo);
/* as lle_matmul, but every row of x multiplied exactly as lle_matmul multiplies a single row (bit for
 * bit the one-row result; the weights are still read once for all rows) */
int lle_matmul_rows(int type, const void *w, long long w_stride, long long m, long long k,
                    const float *x, long long n, float *out, long long ldo);
/* 0: lle_matmul_rows runs the one-row gemv per row instead of the shared-block rows kernel (for tests) */
int lle_set_gemv_rows(int enable);
/* rows ids[0..n) of a [*, k] weight, dequantized into out [n, k] */
int lle_get_rows(int type, const void *w, long long w_stride, long long k,
                 const int *ids, long long n, float *out);
/* dequantize `n_rows` consecutive rows */
int lle_dequantize(int type, const void *w, long long n_rows, long long k, float *out);
/* quantize float rows x [n, k] to `type` (Q8_0, Q8_1, Q8_K, F16, BF16, F32 activations) */
int lle_quantize_act(int type, const float *x, long long n, long long k, void *out);
/* one dot product of a weight row of `type` with an activation row already in vec_type */
int lle_vec_dot(int type, long long k, const void *w_row, const void *act_row, float *out);

/* ---- packed weights ---- */
/* Make a packed copy of a weight (m rows of k values) for the kernels of the selected ISA, used by
 * every later product with this exact weight (same pointer, rows and stride); results are unchanged
 * (same summation order), only faster. Returns 1 if packed and no product reads w again, 2 if packed
 * for some products only (the tiled ones of 8+ rows: the others still read w), 0 if this type, shape or
 * ISA has no packed kernels (nothing to do), < 0 on error. Each call returning 1 or 2 needs one
 * lle_unpack_weight. release_source: w lies in a read-only file mapping; when the result is 1, its pages
 * are dropped from the resident set as they are packed (they fault back in from the page cache if read). */
int lle_pack_weight(int type, const void *w, long long w_stride, long long m, long long k, int release_source);
void lle_unpack_weight(const void *w);
int lle_packed_count(void);                  /* packed copies alive (tests) */

/* ---- other ops (float32 in/out, C-contiguous unless strides are given) ---- */
int lle_rms_norm(const float *x, const float *w, long long n, long long d, float eps, float *out);
int lle_rope(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
             int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
             float *out);
/* lle_rope with ggml's attn_factor (mscale): cos and sin are multiplied by it (LongRoPE, YaRN) */
int lle_rope_ext(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
                 int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
                 float attn_factor, float *out);
/* lle_rope_ext with YaRN (ggml's rope_yarn with ext_factor != 0): pair i's angle mixes the interpolated
 * (freq_scale * theta) and extrapolated (theta) angles by ramp(i) * ext_factor, ramp going from 1 to 0
 * over pairs [corr_lo, corr_hi]; attn_factor is the final cos/sin multiplier (YaRN's mscale included) */
int lle_rope_yarn(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
                  int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
                  float attn_factor, float ext_factor, float corr_lo, float corr_hi, float *out);
int lle_softmax(const float *x, long long n, long long d, float scale, float *out);
/* cells from which one-row attention problems run as lle_attn_wide (default LLE_ATTN_WIDE_MIN; the
 * same values either way) */
void lle_set_attn_wide_min(long long cells);
/* cells up to which the AVX-512 tier's decode V sums add their 64 lanes 4 by 4 in registers (default
 * LLE_ATTN_TREE_MAX; -1: never; the same values either way) */
void lle_set_attn_tree_max(long long cells);
void lle_set_layer_job(int on);
int lle_attention(const float *q, long long n, long long n_head, long long d,
                  const void *k, const void *v, int kv_f16, long long t, long long n_kv,
                  long long k_stride_t, long long k_stride_h, long long v_stride_t, long long v_stride_h,
                  const int *q_pos, const int *k_pos, float scale, int window, float softcap,
                  float *out);
int lle_glu(const float *gate, const float *up, long long n, long long row, int kind, float *out);
int lle_add(const float *a, const float *b, long long n, float *out);
int lle_scale(const float *x, float s, long long n, float *out);
int lle_softcap(const float *x, float cap, long long n, float *out);

/* ---- a whole decoder stack in one call (the native fast path of models.base.Decoder) ---- */
typedef struct {
    int type;                  /* GGML type of the raw rows */
    const void *data;          /* m rows of k values */
    long long row_bytes, m, k;
} lle_weight;

typedef struct {
    lle_weight wq, wk, wv, wo, gate, up, down;
    /* norm weights (float32); q_norm/k_norm (per head) and the post norms are NULL when absent */
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    int n_embd, n_ff, n_head, n_kv_head, head_dim, n_rot, neox, glu_kind, window;
    float eps, rope_base, rope_scale, q_scale, attn_scale, softcap;
    /* biases added after the Q/K/V and output products (NULL when absent) */
    const float *bq, *bk, *bv, *bo;
    /* RoPE frequency factors (n_rot / 2: Llama 3's rope_freqs, LongRoPE's long or short; NULL: none)
     * and ggml's attn_factor, which scales cos and sin */
    const float *rope_factors;
    float rope_attn_factor;
    /* fused_qkv: wq holds Q, K and V rows stacked (wk, wv unused); fused_gate_up: up holds the gate
     * rows then the up rows, 2 * n_ff of them (gate unused) */
    int fused_qkv, fused_gate_up;
    float residual_scale;      /* multiplies the attention and FFN outputs before each residual add */
    /* YaRN (ext_factor 0: none): the ramp of lle_rope_yarn; rope_attn_factor then includes its mscale */
    float rope_ext_factor, rope_corr_lo, rope_corr_hi;
} lle_layer;

/* One layer's cache of one sequence (kvcache.LayerCache), described once and kept with it: the C stack
 * claims this step's cells itself (LayerCache.reserve's rules), so no Python runs per layer. */
typedef struct {
    void *k, *v;               /* cell 0 of this layer's K and V cells, [capacity][n_kv_head][head_dim] */
    void *k_d, *v_d;           /* q8_0 only: the f16 block scales, [capacity][n_kv_head][head_dim / 32] */
    int *pos;                  /* the position of every cell (-1: empty); the step's rows are written here */
    long long *cursor;         /* LayerCache's (used, head): cells [0, used) may hold data, head is written next */
    int capacity, window, ring; /* a ring (sliding window) wraps around; window is only read for rings */
    int kv_type;               /* 0: f32 cells, 1: f16, 2: q8_0 (int8 values and f16 scales per 32) */
    /* set by the call: rows [0, n_first) go to cells cell_start.., the others to cells 0..; attention
     * reads cells [0, n_cells) */
    int cell_start, n_first, n_cells;
} lle_kv;

/* Run layers [0, n_layer) over x [n, n_embd] in place. Rows of sequence s are
 * [seq_rows[s], seq_rows[s+1]), at positions pos; kv[s][il] is layer il's cache of sequence s. The
 * rows' cells are claimed in every layer first; -3 (nothing changed) when one does not have room. */
int lle_decoder_layers(const lle_layer *layers, int n_layer, float *x, long long n, const int *pos,
                       int n_seqs, const int *seq_rows, lle_kv *const *kv);
/* The same with every row computed exactly as it would be alone (one-row products and attention:
 * see lle_matmul_rows), for speculative verification and batched decoding. */
int lle_decoder_layers_rows(const lle_layer *layers, int n_layer, float *x, long long n, const int *pos,
                            int n_seqs, const int *seq_rows, lle_kv *const *kv);
/* Time the ops of lle_decoder_layers (enable 1) or stop (0). Copies the nanoseconds accumulated per
 * op kind since the last call into out_ns (norm, qkv, rope, kv_store, attention, out, add, gate_up,
 * glu, down; then the number of stack calls), resets them and returns the number of op kinds. */
int lle_stack_profile(int enable, double *out_ns, int n_out);

/* ---- loading ---- */
/* Walk `count` GGUF strings (u64 length, bytes) starting at buf[pos]: starts[i]/ends[i] are the byte
 * range of string i. Returns the position after the last one, or -1 - i if string i runs past `size`. */
long long lle_gguf_strings(const unsigned char *buf, long long size, long long pos, long long count,
                           long long *starts, long long *ends);
