/*
 * threads.c - the worker pool, the thread-count setting and per-thread
 * scratch buffers of the kernel library.
 *
 * The pool is created on first use and then kept: workers wait for work by
 * spinning briefly and then sleeping on a condition variable. It serves one
 * caller at a time; it is taken with a try-lock, so a call that finds it
 * busy (the library called concurrently from several threads) simply runs
 * on its own thread. Because kernels split their work the same way for any
 * thread count, results do not depend on who got the pool, nor on which
 * thread runs which part of a job.
 *
 * Fork: the lock word holds the pid of the process that took it, and the
 * pool records the pid that created its workers. A child process (whose
 * copy of the pool has no threads, and may even look locked) takes over a
 * lock held by another pid and builds a fresh pool, leaking the parent's
 * small bookkeeping block instead of touching its possibly inconsistent
 * mutexes.
 *
 * Only libc (with pthreads) is used; no libgcc helpers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dense_f32_internal.h"

#define TB_MAX_THREADS 64
/* How long an idle worker spins before it sleeps, unless TIRBYOC_SPIN_US
 * says otherwise (spin_ns). */
#define TB_SPIN_NS 200000L
/* The most TIRBYOC_SPIN_US takes: 1 s. */
#define TB_SPIN_US_MAX 1000000L

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __asm__ volatile("pause" ::: "memory")
#else
#define cpu_relax() __asm__ volatile("" ::: "memory")
#endif

/* ---- sharing the cores with TVM's thread pool ----
 *
 * TVM's own workers run the fallback schedules between two kernel calls;
 * after each parallel loop they spin before they sleep, on the cores this
 * pool's workers need next (and this pool's workers spin for spin_ns(),
 * yielding as they do). The Python package sets TVM_THREAD_POOL_SPIN_COUNT
 * to 0 on import, unless it is set; a model library exported with these
 * kernels linked in, loaded in a process with only TVM's runtime, does the
 * same when it is loaded. TVM reads the variable once, when its pool starts
 * its workers, after the library is loaded. */
/* The CPUs the process may run on, read when the library is loaded. TVM's
 * pool, when it starts with fewer threads than CPUs (TVM_NUM_THREADS=2 on 16
 * cores), binds the thread that starts it to its first CPUs; this pool's
 * workers, created later by that thread, inherited the binding, all of them
 * on those few CPUs, and the count of CPUs read from that thread capped the
 * pool there (measured on a 16-core Xeon: the workers' CPU list read "0-1").
 * So TVM_BIND_THREADS is set to 0 here, unless it is set (each model library
 * carries its own copy of these kernels, and one loaded after TVM bound the
 * thread would read the bound set), and the workers are created with this
 * set, and the count is this set's. */
static cpu_set_t process_cpus;
static int have_process_cpus;

__attribute__((constructor)) static void share_cores_with_tvm(void)
{
    setenv("TVM_THREAD_POOL_SPIN_COUNT", "0", 0);
    setenv("TVM_BIND_THREADS", "0", 0);
    have_process_cpus = sched_getaffinity(0, sizeof(process_cpus), &process_cpus) == 0 &&
                        CPU_COUNT(&process_cpus) > 0;
}

/* ---- thread count ---- */

static int configured_threads; /* 0: not yet read */
static int pool_limit;         /* 0: not yet read */

/* The CPUs this process may run on (at most TB_MAX_THREADS): as at load
 * time, else the calling thread's. */
static int available_cpus(void)
{
    cpu_set_t set;
    long n;
    if (have_process_cpus)
        n = CPU_COUNT(&process_cpus);
    else if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    else
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > TB_MAX_THREADS ? TB_MAX_THREADS : (int)n;
}

/* How long an idle worker spins before it sleeps: TIRBYOC_SPIN_US (read
 * once; 0 to 1000000 microseconds: another value keeps the default here,
 * and tirbyoc.kernels.load() refuses it), else TB_SPIN_NS. Longer keeps a
 * core busy after each call, which small calls that come a while apart
 * gain from where idle cores come back slowly (docs/kernels.md). */
static long spin_ns(void)
{
    static long value = -1;
    long ns = __atomic_load_n(&value, __ATOMIC_RELAXED);
    if (ns < 0) {
        const char *env = getenv("TIRBYOC_SPIN_US");
        ns = TB_SPIN_NS;
        if (env != NULL && *env != '\0') {
            char *end;
            const long us = strtol(env, &end, 10);
            if (*end == '\0' && us >= 0 && us <= TB_SPIN_US_MAX)
                ns = us * 1000;
        }
        __atomic_store_n(&value, ns, __ATOMIC_RELAXED);
    }
    return ns;
}

static int default_threads(void)
{
    const char *env = getenv("TIRBYOC_NUM_THREADS");
    long n;
    if (env != NULL && *env != '\0') {
        char *end;
        n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1)
            return n > TB_MAX_THREADS ? TB_MAX_THREADS : (int)n;
    }
    return available_cpus();
}

/* How many threads the pool runs at once: at most the CPUs this process may
 * run on, and calls plan their units for that many (tb_threads_for; the
 * results are the same for any count). More threads than CPUs only take
 * turns: a worker preempted in the middle of its part holds the call up
 * for a time slice (the two-block ResNet with 16 threads on 2 CPUs: 6.6 ms
 * a run against 3.3 ms with 2). TIRBYOC_OVERSUBSCRIBE=1 (read once) lifts
 * the limit: the tests run the pool at 64 threads on any machine. */
static int max_pool_threads(void)
{
    int n = __atomic_load_n(&pool_limit, __ATOMIC_ACQUIRE);
    if (n == 0) {
        const char *env = getenv("TIRBYOC_OVERSUBSCRIBE");
        n = env != NULL && env[0] == '1' ? TB_MAX_THREADS : available_cpus();
        __atomic_store_n(&pool_limit, n, __ATOMIC_RELEASE);
    }
    return n;
}

int tb_num_threads(void)
{
    int n = __atomic_load_n(&configured_threads, __ATOMIC_ACQUIRE);
    if (n == 0) {
        int expected = 0;
        n = default_threads();
        if (!__atomic_compare_exchange_n(&configured_threads, &expected, n, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            n = expected;
    }
    return n;
}

int32_t tirbyoc_set_num_threads(int32_t n)
{
    if (n < 1)
        return TIRBYOC_EINVAL;
    __atomic_store_n(&configured_threads, n > TB_MAX_THREADS ? TB_MAX_THREADS : n,
                     __ATOMIC_RELEASE);
    return TIRBYOC_OK;
}

int32_t tirbyoc_num_threads(void) { return tb_num_threads(); }

int tb_threads_for(double work, double two_from, int64_t units)
{
    const double per_thread = two_from / 2;
    int n = tb_num_threads();
    if (n > max_pool_threads())
        n = max_pool_threads(); /* plans for threads that run at once */
    if (per_thread > 0 && work < per_thread * n)
        n = work >= per_thread ? (int)(work / per_thread) : 1;
    if (units < n)
        n = units < 1 ? 1 : (int)units;
    return n;
}

/* ---- per-thread buffers: the scratch, and the workspace ----
 *
 * Each is a 64-byte aligned block under its own thread-specific key,
 * allocated on the thread's first request, replaced by a larger one when a
 * request outgrows it (contents not kept), freed when the thread exits. */

typedef struct {
    float *p;
    size_t floats;
} tls_buf_t;

static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static pthread_key_t scratch_key, workspace_key, ablock_key;
static int keys_ok;

static void tls_buf_free(void *v)
{
    tls_buf_t *b = (tls_buf_t *)v;
    free(b->p);
    free(b);
}

static void keys_init(void)
{
    keys_ok = pthread_key_create(&scratch_key, tls_buf_free) == 0 &&
              pthread_key_create(&workspace_key, tls_buf_free) == 0 &&
              pthread_key_create(&ablock_key, tls_buf_free) == 0;
}

/* The calling thread's buffer under key, at least floats floats. */
static float *tls_buf(pthread_key_t *key, size_t floats)
{
    tls_buf_t *b;
    void *p;
    pthread_once(&keys_once, keys_init);
    if (!keys_ok)
        return NULL;
    b = (tls_buf_t *)pthread_getspecific(*key);
    if (b == NULL) {
        b = (tls_buf_t *)calloc(1, sizeof(*b));
        if (b == NULL)
            return NULL;
        if (pthread_setspecific(*key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->floats >= floats && b->p != NULL)
        return b->p;
    if (floats > SIZE_MAX / sizeof(float) ||
        posix_memalign(&p, 64, floats * sizeof(float)) != 0)
        return NULL;
    free(b->p);
    b->p = (float *)p;
    b->floats = floats;
    return b->p;
}

float *tb_scratch(void) { return tls_buf(&scratch_key, TB_SCRATCH_FLOATS); }

float *tb_workspace(size_t floats) { return tls_buf(&workspace_key, floats); }

float *tb_ablock(size_t floats) { return tls_buf(&ablock_key, floats); }

/* ---- worker pool ---- */

/* One worker's mailbox, on its own cache line. */
typedef struct {
    unsigned long gen; /* bumped by the caller to post a job */
    char pad[64 - sizeof(unsigned long)];
} slot_t;

/*
 * A job is split into parts 0 .. nparts - 1: the caller runs part 0, then
 * the caller and the workers take the other parts from the claim word until
 * none is left, and the caller waits only until every part is finished. A
 * worker that wakes late (a busy machine) finds nothing left and goes back to
 * waiting: no one waits for a thread that has not started, and parts 1 ..
 * nparts - 1 are run by whichever thread gets there first.
 *
 * The claim word is seq << 16 | nparts << 8 | next (nparts <= 64): a thread
 * takes part `next` by compare-and-swap, then reads fn and arg, which the
 * caller wrote before it published the word and keeps until every part is
 * finished (so they are the claimed part's job's).
 */
#define CLAIM_PARTS(w) ((int)(((w) >> 8) & 0xFF))
#define CLAIM_NEXT(w) ((int)((w)&0xFF))

typedef struct {
    pid_t pid; /* process whose threads these are */
    int nworkers;
    tb_task_fn fn; /* the current job, valid while its parts are claimable */
    void *arg;
    unsigned long claim; /* see above */
    unsigned long seq;
    int finished; /* parts of the current job finished */
    int sleepers; /* workers blocked (or about to block) on cv */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot_t slot[TB_MAX_THREADS];
} pool_t;

typedef struct {
    pool_t *pool;
    int id; /* 1 .. nworkers */
} worker_arg_t;

static pid_t pool_lock_word; /* 0 or the pid holding the pool */
static pool_t *the_pool;

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Runs parts of the current job until none is left. */
static void run_parts(pool_t *pool)
{
    for (;;) {
        unsigned long w = __atomic_load_n(&pool->claim, __ATOMIC_ACQUIRE);
        int part, nparts;
        do {
            nparts = CLAIM_PARTS(w);
            part = CLAIM_NEXT(w);
            if (part >= nparts)
                return;
        } while (!__atomic_compare_exchange_n(&pool->claim, &w, w + 1, 0,
                                              __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
        pool->fn(pool->arg, part, nparts);
        __atomic_add_fetch(&pool->finished, 1, __ATOMIC_RELEASE);
    }
}

static void *worker_main(void *p)
{
    worker_arg_t *wa = (worker_arg_t *)p;
    pool_t *pool = wa->pool;
    const int id = wa->id;
    /* A new worker's slot has never been posted: jobs are only posted to
     * workers that exist. */
    unsigned long seen = 0;
    free(wa);
    for (;;) {
        unsigned long gen = __atomic_load_n(&pool->slot[id].gen, __ATOMIC_ACQUIRE);
        if (gen == seen) {
            const long until = now_ns() + spin_ns();
            int spins = 0;
            while ((gen = __atomic_load_n(&pool->slot[id].gen,
                                          __ATOMIC_ACQUIRE)) == seen) {
                cpu_relax();
                /* Yield now and then: a spinning worker must not keep another
                 * runnable thread off its core (TVM's own workers run the
                 * code between two kernel calls, often pinned to one core). */
                if (++spins % 16 == 0) {
                    if (now_ns() > until)
                        break;
                    sched_yield();
                }
            }
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->mu);
            __atomic_add_fetch(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
            while ((gen = __atomic_load_n(&pool->slot[id].gen,
                                          __ATOMIC_SEQ_CST)) == seen)
                pthread_cond_wait(&pool->cv, &pool->mu);
            __atomic_sub_fetch(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool->mu);
        }
        seen = gen;
        run_parts(pool);
    }
    return NULL;
}

static pool_t *pool_new(void)
{
    pool_t *pool = (pool_t *)calloc(1, sizeof(pool_t));
    if (pool == NULL)
        return NULL;
    pool->pid = getpid();
    if (pthread_mutex_init(&pool->mu, NULL) != 0) {
        free(pool);
        return NULL;
    }
    if (pthread_cond_init(&pool->cv, NULL) != 0) {
        pthread_mutex_destroy(&pool->mu);
        free(pool);
        return NULL;
    }
    return pool;
}

/* Starts workers until there are `want` of them; returns how many exist. */
static int pool_grow(pool_t *pool, int want)
{
    sigset_t all, old;
    pthread_attr_t attr;
    int affine = 0;
    if (want <= pool->nworkers)
        return pool->nworkers;
    if (pthread_attr_init(&attr) != 0)
        return pool->nworkers;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Workers run on any of the process's CPUs, not only the creating
     * thread's (see process_cpus); where that set is no longer allowed (the
     * process moved to other CPUs since), as the creating thread. */
    if (have_process_cpus)
        affine = pthread_attr_setaffinity_np(&attr, sizeof(process_cpus), &process_cpus) == 0;
    /* Workers inherit a full signal mask: signals go to the caller's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool->nworkers < want) {
        pthread_t th;
        worker_arg_t *wa = (worker_arg_t *)malloc(sizeof(*wa));
        if (wa == NULL)
            break;
        wa->pool = pool;
        wa->id = pool->nworkers + 1;
        if (pthread_create(&th, &attr, worker_main, wa) != 0) {
            pthread_attr_t plain;
            int ok = 0;
            if (affine && pthread_attr_init(&plain) == 0) {
                pthread_attr_setdetachstate(&plain, PTHREAD_CREATE_DETACHED);
                ok = pthread_create(&th, &plain, worker_main, wa) == 0;
                pthread_attr_destroy(&plain);
            }
            if (!ok) {
                free(wa);
                break;
            }
        }
        pool->nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return pool->nworkers;
}

/* Takes the pool lock (or returns 0); steals it from a parent process. */
static int pool_trylock(pid_t self)
{
    pid_t owner = __atomic_load_n(&pool_lock_word, __ATOMIC_RELAXED);
    if (owner == self)
        return 0; /* busy in this process */
    return __atomic_compare_exchange_n(&pool_lock_word, &owner, self, 0,
                                       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void pool_unlock(void)
{
    __atomic_store_n(&pool_lock_word, 0, __ATOMIC_RELEASE);
}

void tb_parallel(tb_task_fn fn, void *arg, int want)
{
    pool_t *pool;
    pid_t self;
    int nt, t, spins;

    if (want > max_pool_threads())
        want = max_pool_threads();
    if (want <= 1) {
        fn(arg, 0, 1);
        return;
    }
    self = getpid();
    if (!pool_trylock(self)) {
        fn(arg, 0, 1);
        return;
    }
    pool = the_pool;
    if (pool == NULL || pool->pid != self) {
        /* First use, or first use in a forked child: start afresh. */
        pool = pool_new();
        the_pool = pool;
    }
    nt = pool == NULL ? 1 : pool_grow(pool, want - 1) + 1;
    if (nt > want)
        nt = want;
    if (nt <= 1) {
        pool_unlock();
        fn(arg, 0, 1);
        return;
    }

    pool->fn = fn;
    pool->arg = arg;
    __atomic_store_n(&pool->finished, 0, __ATOMIC_RELAXED);
    pool->seq++;
    /* Part 0 is the caller's own (next starts at 1): the calling thread
     * runs the same part of every job, so a kernel that gives part t the
     * t-th share of its output (tb_units' home ranges) has that share
     * written by the same thread call after call. */
    __atomic_store_n(&pool->claim,
                     pool->seq << 16 | (unsigned long)nt << 8 | 1ul,
                     __ATOMIC_RELEASE);
    for (t = 1; t < nt; ++t)
        __atomic_add_fetch(&pool->slot[t].gen, 1, __ATOMIC_SEQ_CST);
    /* Pairs with the sleeper count a worker publishes before its last check. */
    if (__atomic_load_n(&pool->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }

    fn(arg, 0, nt);
    __atomic_add_fetch(&pool->finished, 1, __ATOMIC_RELEASE);
    run_parts(pool);

    /* Only parts that a worker has taken are left to wait for. */
    spins = 0;
    while (__atomic_load_n(&pool->finished, __ATOMIC_ACQUIRE) < nt) {
        cpu_relax();
        /* A descheduled worker (busy machine): let it run. */
        if (++spins > 20000)
            sched_yield();
    }
    pool_unlock();
}

/* tb_units: home ranges, then stealing.
 *
 * The units are split into nt contiguous home ranges, range t for part t
 * (part 0 is always the calling thread's). A thread takes the units of its
 * own range in order, then those left in the other ranges (t + 1, t + 2,
 * ...), each range through its own atomic counter, so every unit runs once
 * and a thread that wakes late only finds less of its range left.
 *
 * Why home ranges: kernels number their units in the order of the memory
 * they write (an image's channels, or its rows), so consecutive calls give
 * each thread about the same share of every tensor, and what one call writes
 * the next one mostly reads on the same core. With units handed out from
 * one counter, about half of every activation crossed between the cores at
 * each call: measured on a 2-vCPU VM whose vCPUs sat on distant cores (a
 * cache line's round trip 440 ns instead of 120 ns), memory-bound phases ran
 * 2 to 3 times slower. */
typedef struct {
    int64_t next; /* the range's next unit (atomic) */
    int64_t end;
} __attribute__((aligned(64))) home_t; /* one cache line each */

typedef struct {
    tb_unit_fn fn;
    void *arg;
    int nhome; /* the ranges: the threads asked for (fewer may come) */
    home_t home[TB_MAX_THREADS];
} units_job_t;

static void units_task(void *arg, int tid, int nt)
{
    units_job_t *job = (units_job_t *)arg;
    float *scratch = tb_scratch();
    int i;
    (void)nt;
    if (scratch == NULL)
        return; /* the calling thread (which has scratch) takes the units */
    for (i = 0; i < job->nhome; ++i) {
        home_t *h = &job->home[(tid + i) % job->nhome];
        for (;;) {
            const int64_t u = __atomic_fetch_add(&h->next, 1, __ATOMIC_RELAXED);
            if (u >= h->end)
                break;
            job->fn(job->arg, u, scratch);
        }
    }
}

void tb_units(tb_unit_fn fn, void *arg, int64_t units, int want)
{
    units_job_t job;
    int t, nt;
    job.fn = fn;
    job.arg = arg;
    if (want > units)
        want = (int)units;
    if (want > TB_MAX_THREADS)
        want = TB_MAX_THREADS;
    nt = want < 1 ? 1 : want;
    job.nhome = nt;
    for (t = 0; t < nt; ++t) {
        job.home[t].next = units * t / nt;
        job.home[t].end = units * (t + 1) / nt;
    }
    tb_parallel(units_task, &job, nt);
}
