/* The one persistent thread pool shared by every kernel. The calling thread is thread 0 and runs
 * its share of each job; workers spin for a short while after a job (so back-to-back ops of one
 * decode step do not pay a wake-up) and then sleep on a condition variable.
 */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#if defined(LLE_X86)
#include <immintrin.h>
#define LLE_PAUSE() _mm_pause()
#elif defined(LLE_ARM64)
#define LLE_PAUSE() __asm__ __volatile__("yield")
#else
#define LLE_PAUSE() ((void)0)
#endif

#define LLE_MAX_THREADS 256

typedef struct {
    pthread_t threads[LLE_MAX_THREADS];
    int n_threads;
    /* job */
    lle_task_fn fn;
    void *ctx;
    uint64_t generation;      /* bumped (seq_cst) when a job is published */
    int pending;              /* workers still running the current job */
    int stop;
    int n_sleeping;
    int spin_us;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
} lle_pool;

static lle_pool g_pool = {.n_threads = 1, .spin_us = 1000,
                          .mutex = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

typedef struct { int ith; uint64_t gen0; } worker_arg;
static worker_arg g_args[LLE_MAX_THREADS];

static void *worker_main(void *arg) {
    const int ith = ((worker_arg *)arg)->ith;
    uint64_t seen = ((worker_arg *)arg)->gen0;
    for (;;) {
        /* spin, then sleep until a new generation is published */
        uint64_t gen = __atomic_load_n(&g_pool.generation, __ATOMIC_ACQUIRE);
        if (gen == seen) {
            const uint64_t t0 = now_us();
            const int spin_us = __atomic_load_n(&g_pool.spin_us, __ATOMIC_RELAXED);
            int iter = 0;
            while ((gen = __atomic_load_n(&g_pool.generation, __ATOMIC_ACQUIRE)) == seen) {
                LLE_PAUSE();
                if (++iter == 256) {
                    iter = 0;
                    if (now_us() - t0 >= (uint64_t)spin_us) break;
                }
            }
            if (gen == seen) {
                pthread_mutex_lock(&g_pool.mutex);
                __atomic_add_fetch(&g_pool.n_sleeping, 1, __ATOMIC_SEQ_CST);
                while ((gen = __atomic_load_n(&g_pool.generation, __ATOMIC_SEQ_CST)) == seen)
                    pthread_cond_wait(&g_pool.cond, &g_pool.mutex);
                __atomic_sub_fetch(&g_pool.n_sleeping, 1, __ATOMIC_SEQ_CST);
                pthread_mutex_unlock(&g_pool.mutex);
            }
        }
        seen = gen;
        if (__atomic_load_n(&g_pool.stop, __ATOMIC_ACQUIRE)) break;
        g_pool.fn(g_pool.ctx, ith, g_pool.n_threads);
        __atomic_sub_fetch(&g_pool.pending, 1, __ATOMIC_ACQ_REL);
    }
    return NULL;
}

static void publish(void) {
    __atomic_add_fetch(&g_pool.generation, 1, __ATOMIC_SEQ_CST);
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
    __atomic_store_n(&g_pool.pending, nth - 1, __ATOMIC_RELEASE);
    publish();
    fn(ctx, 0, nth);
    while (__atomic_load_n(&g_pool.pending, __ATOMIC_ACQUIRE) != 0) LLE_PAUSE();
}

int lle_pool_threads(void) { return g_pool.n_threads; }

void lle_pool_destroy(void) {
    if (g_pool.n_threads <= 1) return;
    __atomic_store_n(&g_pool.stop, 1, __ATOMIC_RELEASE);
    publish();
    for (int i = 1; i < g_pool.n_threads; i++) pthread_join(g_pool.threads[i], NULL);
    g_pool.n_threads = 1;
    __atomic_store_n(&g_pool.stop, 0, __ATOMIC_RELEASE);
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
            /* keep the workers that did start */
            g_pool.n_threads = i;
            break;
        }
    }
    return g_pool.n_threads;
}

void lle_pool_set_spin_us(int us) { __atomic_store_n(&g_pool.spin_us, us < 0 ? 0 : us, __ATOMIC_RELAXED); }

/* after fork() only the calling thread exists in the child: run single-threaded there until
 * lle_init is called again */
static void atfork_child(void) {
    g_pool.n_threads = 1;
    g_pool.n_sleeping = 0;
    g_pool.pending = 0;
    pthread_mutex_init(&g_pool.mutex, NULL);
    pthread_cond_init(&g_pool.cond, NULL);
}

void lle_pool_register_atfork(void) {
    static int done = 0;
    if (!done) {
        pthread_atfork(NULL, NULL, atfork_child);
        done = 1;
    }
}
