/* The one persistent thread pool shared by every kernel.
 *
 * The calling thread is thread 0 and always runs the job itself; workers join a job only if it is
 * still open when they get to it. Jobs hand out work through lle_chunks (each thread its own
 * contiguous range, then the others' leftovers; below) or, for a few large tasks, one atomic counter,
 * so whatever subset of threads joins, the work gets done, and the caller never waits for a worker that has
 * not started (which on an oversubscribed machine could cost a whole scheduler time slice). After a
 * job, idle workers spin for a short while (so back-to-back ops of a decode step do not pay a
 * wake-up), yielding the CPU now and then, and then sleep on a condition variable.
 */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#define LLE_MAX_THREADS 256

/* job state word: generation (high 32 bits) | closed flag (bit 31) | active workers (bits 0-30) */
#define ST_CLOSED (UINT64_C(1) << 31)
#define ST_ACTIVE_MASK (ST_CLOSED - 1)

typedef struct {
    pthread_t threads[LLE_MAX_THREADS];
    int n_threads;
    lle_task_fn fn;
    void *ctx;
    uint64_t state;
    uint32_t generation;      /* bumped when a job is published */
    int stop;
    int n_sleeping;
    int spin_us;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
} lle_pool;

static lle_pool g_pool = {.n_threads = 1, .spin_us = 500,
                          .mutex = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns_pool(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_us(void) { return now_ns_pool() / 1000u; }

typedef struct { int ith; uint32_t gen0; } worker_arg;
static worker_arg g_args[LLE_MAX_THREADS];

/* wait until the generation differs from `seen`: spin, spin with yields, then sleep */
static uint32_t wait_for_job(uint32_t seen) {
    uint32_t gen;
    const uint64_t t0 = now_us();
    const uint64_t spin_us = (uint64_t)__atomic_load_n(&g_pool.spin_us, __ATOMIC_RELAXED);
    int iter = 0;
    while ((gen = __atomic_load_n(&g_pool.generation, __ATOMIC_ACQUIRE)) == seen) {
        LLE_PAUSE();
        if (++iter % 128 == 0) {
            const uint64_t dt = now_us() - t0;
            if (dt >= spin_us) break;
            if (dt >= 20) sched_yield();
        }
    }
    if (gen != seen) return gen;
    pthread_mutex_lock(&g_pool.mutex);
    __atomic_add_fetch(&g_pool.n_sleeping, 1, __ATOMIC_SEQ_CST);
    while ((gen = __atomic_load_n(&g_pool.generation, __ATOMIC_SEQ_CST)) == seen)
        pthread_cond_wait(&g_pool.cond, &g_pool.mutex);
    __atomic_sub_fetch(&g_pool.n_sleeping, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_pool.mutex);
    return gen;
}

/* join job `gen` if it is still open; returns 1 if joined */
static int try_join(uint32_t gen) {
    uint64_t st = __atomic_load_n(&g_pool.state, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((uint32_t)(st >> 32) != gen || (st & ST_CLOSED)) return 0;
        if (__atomic_compare_exchange_n(&g_pool.state, &st, st + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    }
}

static void *worker_main(void *arg) {
    const int ith = ((worker_arg *)arg)->ith;
    uint32_t seen = ((worker_arg *)arg)->gen0;
    for (;;) {
        const uint32_t gen = wait_for_job(seen);
        seen = gen;
        if (__atomic_load_n(&g_pool.stop, __ATOMIC_ACQUIRE)) break;
        if (!try_join(gen)) continue;
        g_pool.fn(g_pool.ctx, ith, g_pool.n_threads);
        __atomic_sub_fetch(&g_pool.state, 1, __ATOMIC_ACQ_REL);
    }
    return NULL;
}

static void publish(void) {
    if (__atomic_load_n(&g_pool.n_sleeping, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&g_pool.mutex);
        pthread_cond_broadcast(&g_pool.cond);
        pthread_mutex_unlock(&g_pool.mutex);
    }
}

void lle_pool_run(lle_task_fn fn, void *ctx) {
    const int nth = g_pool.n_threads;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    const uint32_t gen = g_pool.generation + 1;
    __atomic_store_n(&g_pool.state, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_pool.generation, gen, __ATOMIC_SEQ_CST);
    publish();
    fn(ctx, 0, nth);
    /* close the job, then wait only for the workers that joined it */
    uint64_t st = __atomic_fetch_or(&g_pool.state, ST_CLOSED, __ATOMIC_ACQ_REL) | ST_CLOSED;
    int iter = 0;
    while ((st & ST_ACTIVE_MASK) != 0) {
        LLE_PAUSE();
        if (++iter > 4096) sched_yield();
        st = __atomic_load_n(&g_pool.state, __ATOMIC_ACQUIRE);
    }
}

int lle_pool_threads(void) { return g_pool.n_threads; }

void lle_pool_destroy(void) {
    if (g_pool.n_threads <= 1) return;
    __atomic_store_n(&g_pool.stop, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&g_pool.generation, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&g_pool.mutex);
    pthread_cond_broadcast(&g_pool.cond);
    pthread_mutex_unlock(&g_pool.mutex);
    for (int i = 1; i < g_pool.n_threads; i++) pthread_join(g_pool.threads[i], NULL);
    g_pool.n_threads = 1;
    __atomic_store_n(&g_pool.stop, 0, __ATOMIC_SEQ_CST);
}

int lle_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > LLE_MAX_THREADS) n_threads = LLE_MAX_THREADS;
    lle_pool_destroy();
    g_pool.n_threads = n_threads;
    for (int i = 1; i < n_threads; i++) {
        g_args[i].ith = i;
        g_args[i].gen0 = __atomic_load_n(&g_pool.generation, __ATOMIC_SEQ_CST);
        if (pthread_create(&g_pool.threads[i], NULL, worker_main, &g_args[i]) != 0) {
            g_pool.n_threads = i; /* keep the workers that did start */
            break;
        }
    }
    return g_pool.n_threads;
}

void lle_pool_set_spin_us(int us) { __atomic_store_n(&g_pool.spin_us, us < 0 ? 0 : us, __ATOMIC_RELAXED); }

/* after fork() only the calling thread exists in the child: the pool is reset to that one thread
 * (api.c recreates the workers on the next call) */
void lle_pool_atfork_child(void) {
    g_pool.n_threads = 1;
    g_pool.n_sleeping = 0;
    g_pool.state = 0;
    g_pool.stop = 0;
    pthread_mutex_init(&g_pool.mutex, NULL);
    pthread_cond_init(&g_pool.cond, NULL);
}

/* ---------------------------------------------------------------- chunks of a job (common.h) */

void lle_chunks_init(lle_chunks *c, int64_t n_chunks, int nth) {
    int n = nth < 1 ? 1 : nth > LLE_CHUNK_RANGES ? LLE_CHUNK_RANGES : nth;
    if (n > n_chunks) n = n_chunks > 0 ? (int)n_chunks : 1;
    c->n = n;
    for (int i = 0; i < n; i++) {
        const uint64_t lo = (uint64_t)(n_chunks * i / n), hi = (uint64_t)(n_chunks * (i + 1) / n);
        c->r[i].lohi = hi << 32 | lo;
    }
}

int64_t lle_chunks_next(lle_chunks *c, int ith) {
    const int n = c->n;
    lle_chunk_range *own = &c->r[ith % n];
    uint64_t v = __atomic_load_n(&own->lohi, __ATOMIC_RELAXED);
    if ((uint32_t)v < (uint32_t)(v >> 32)) {
        /* front of the own range; an overshoot past its end (a thief took the last chunk meanwhile)
         * only leaves next > end, which reads as empty */
        v = __atomic_fetch_add(&own->lohi, 1, __ATOMIC_RELAXED);
        if ((uint32_t)v < (uint32_t)(v >> 32)) return (int64_t)(uint32_t)v;
    }
    for (int k = 1; k <= n; k++) {  /* the back of the others (and of the own range, if a thief raced) */
        lle_chunk_range *r = &c->r[(ith + k) % n];
        v = __atomic_load_n(&r->lohi, __ATOMIC_RELAXED);
        for (;;) {
            const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
            if (lo >= hi) break;
            const uint64_t nv = (uint64_t)(hi - 1) << 32 | lo;
            if (__atomic_compare_exchange_n(&r->lohi, &v, nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return (int64_t)(hi - 1);
        }
    }
    return -1;
}

void lle_pool_run_chunks(lle_task_fn fn, void *ctx, lle_chunks *chunks, int64_t n_chunks, int alone) {
    lle_chunks_init(chunks, n_chunks, alone ? 1 : lle_pool_threads());
    if (alone) fn(ctx, 0, 1);
    else lle_pool_run(fn, ctx);
}

/* ---------------------------------------------------------------- the cores' round trip (common.h) */
/* Thread 0 and the first worker to join bounce one cache line: thread 0 writes an odd count and waits for
 * the even one after it, the partner the reverse. A round trip is two transfers of the line between their
 * cores, cheap where the cores share a cache and several times dearer where the line crosses between
 * caches (e.g. two vCPUs on different CCDs of an AMD EPYC: ~400 ns against ~100 here); every phase of a
 * multi-sequence decode step ends in such hand-offs. No partner within 50 ms (the pool busy or one
 * thread): thread 0 closes the probe (partner -1) and it measures nothing. */
#define RT_BATCHES 9
typedef struct {
    _Alignas(64) int64_t line;  /* the bounced line: 2i+1 from thread 0, 2i+2 from the partner; -1 abort */
    _Alignas(64) int partner;   /* 0 open, 1 a worker took it, -1 closed */
    int rounds;
    double batch_ns[RT_BATCHES];
} round_trip_ctx;

/* spin until *p reaches want (or -1); 0 when it did, -1 on an abort or after 100 ms. No pause between
 * loads: its delay would be part of the time measured */
static int rt_wait(int64_t *p, int64_t want) {
    const uint64_t t0 = now_ns_pool();
    for (uint32_t iter = 1;; iter++) {
        const int64_t v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
        if (v == want) return 0;
        if (v == -1) return -1;
        if (iter % 4096 == 0 && now_ns_pool() - t0 > 100000000u) return -1;
    }
}

static void round_trip_task(void *vctx, int ith, int nth) {
    (void)nth;
    round_trip_ctx *c = vctx;
    const int64_t n = (int64_t)c->rounds * RT_BATCHES;
    if (ith != 0) {
        int open = 0;
        if (!__atomic_compare_exchange_n(&c->partner, &open, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
        for (int64_t i = 0; i < n; i++) {
            if (rt_wait(&c->line, 2 * i + 1)) return;
            __atomic_store_n(&c->line, 2 * i + 2, __ATOMIC_RELEASE);
        }
        return;
    }
    const uint64_t deadline = now_ns_pool() + 50000000u;
    while (__atomic_load_n(&c->partner, __ATOMIC_ACQUIRE) == 0 && now_ns_pool() < deadline) LLE_PAUSE();
    int open = 0;
    if (__atomic_compare_exchange_n(&c->partner, &open, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    for (int b = 0, i = 0; b < RT_BATCHES; b++) {
        const uint64_t t0 = now_ns_pool();
        for (int r = 0; r < c->rounds; r++, i++) {
            __atomic_store_n(&c->line, 2 * (int64_t)i + 1, __ATOMIC_RELEASE);
            if (rt_wait(&c->line, 2 * (int64_t)i + 2)) {
                __atomic_store_n(&c->line, -1, __ATOMIC_RELEASE);
                c->batch_ns[0] = -1;
                return;
            }
        }
        c->batch_ns[b] = (double)(now_ns_pool() - t0) / c->rounds;
    }
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lle_pool_round_trip_ns(int rounds) {
    if (g_pool.n_threads < 2) return 0;
    static round_trip_ctx c;
    memset(&c, 0, sizeof c);
    c.rounds = rounds < 1 ? 1 : rounds;
    lle_pool_run(round_trip_task, &c);
    if (c.partner != 1 || c.batch_ns[0] < 0) return 0;
    qsort(c.batch_ns, RT_BATCHES, sizeof c.batch_ns[0], cmp_double);
    return c.batch_ns[RT_BATCHES / 2];
}
