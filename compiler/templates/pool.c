/* ---- pool.c: the helper threads of one state ---------------------------------
 *
 * Started when a call first wants them, as many as it wants (helper[] grows),
 * stopped by pool_stop(). -DNN_NO_THREADS: every job runs on the caller alone,
 * and nn.c needs no pthreads. */
#ifndef NN_AMALGAMATION
#include "state.h"
#endif

#ifndef NN_NO_THREADS
/* What a helper thread starts with (its own allocation, freed by the helper
 * once read): its number, and the last job it must not run, however late it
 * starts. */
typedef struct {
    Pool *pl;
    int t;
    unsigned long seen;
} HelperStart;

/* Waiting: a thread first spins a while on the counter it waits for (a
 * sleeper costs a futex wake-up and a reschedule: tens of microseconds on a
 * VM, per barrier or job), then sleeps on the condition variable. The
 * counters change under the mutex and are read outside it only by these
 * spins (atomically; tcc: no spinning). POOL_SPINS pauses are about 1 ms
 * (25 ns a pause on AMD Zen 4; longer on Intel): a job often follows
 * within that (the next batch, a step's optimizer after its backward), and
 * a barrier's threads are rarely further apart. With more threads than
 * CPUs, a spinner takes the CPU of the thread it waits for: a short spin. */
#if defined(__GNUC__) && !defined(__TINYC__)
#define POOL_SPINS 40000
#define POOL_SPINS_CROWDED 400
#define POOL_READ(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define POOL_WRITE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#if defined(__x86_64__) || defined(__i386__)
#define POOL_PAUSE() __builtin_ia32_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif
#else
#define POOL_SPINS 0
#define POOL_SPINS_CROWDED 0
#define POOL_READ(x) (x)
#define POOL_WRITE(x, v) ((x) = (v))
#define POOL_PAUSE() ((void)0)
#endif

/* Spin until *counter != value (1), or give up after `spins` pauses (0). */
static int
pool_spin_while(const unsigned long *counter, unsigned long value, int spins)
{
    for (int i = 0; i < spins; i++) {
        if (POOL_READ(*counter) != value)
            return 1;
        POOL_PAUSE();
    }
    return 0;
}

/* Spin until *running is 0, or give up after `spins` pauses. */
static void
pool_spin_while_busy(const int *running, int spins)
{
    for (int i = 0; i < spins && POOL_READ(*running) > 0; i++)
        POOL_PAUSE();
}

static void *
pool_helper(void *arg)
{
    HelperStart *start = (HelperStart *)arg;
    Pool *pl = start->pl;
    const int t = start->t;
    unsigned long seen = start->seen;
    free(start);
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        if (!pl->stop && pl->job_no == seen) {
            const int spins = pl->spins;
            pthread_mutex_unlock(&pl->mu);
            pool_spin_while(&pl->job_no, seen, spins);     /* the next job often follows soon */
            pthread_mutex_lock(&pl->mu);
        }
        const unsigned long poked = pl->poke_no;
        while (!pl->stop && pl->job_no == seen && pl->poke_no == poked)
            pthread_cond_wait(&pl->wake, &pl->mu);
        if (pl->stop)
            break;
        if (pl->job_no == seen)      /* poked: a job is coming, spin for it */
            continue;
        seen = pl->job_no;
        if (t < pl->T) {
            Job job = pl->job;
            void *ctx = pl->ctx;
            const int T = pl->T;
            pthread_mutex_unlock(&pl->mu);
            job(ctx, t, T);
            pthread_mutex_lock(&pl->mu);
            POOL_WRITE(pl->running, pl->running - 1);
            if (pl->running == 0)
                pthread_cond_signal(&pl->idle);
        }
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

/* A pool without helpers. The helper array is kept (a forked child reuses it). */
static void
pool_init(Pool *pl)
{
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->wake, NULL);
    pthread_cond_init(&pl->idle, NULL);
    pthread_cond_init(&pl->turn, NULL);
    pl->started = pl->stop = pl->running = pl->waiting = 0;
    pl->job_no = pl->phase = pl->poke_no = 0;
    pl->spins = POOL_SPINS;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    pl->cpus = cpus > 0 ? (int)cpus : 1;
    pl->pid = getpid();
}

/* Start helpers until T - 1 run; returns the T that can run (fewer if a
 * thread could not be created, or memory ran out). Only the thread that owns
 * the state calls it: helper[] may move. */
static int
pool_grow(Pool *pl, int T)
{
    if (pl->pid != getpid())
        pool_init(pl);        /* forked: the helpers stayed with the parent */
    if (pl->capacity < T - 1) {
        pthread_t *more = (pthread_t *)realloc(pl->helper, sizeof(pthread_t) * (size_t)(T - 1));
        if (more != NULL) {
            pl->helper = more;
            pl->capacity = T - 1;
        }
    }
    while (pl->started < T - 1 && pl->started < pl->capacity) {
        HelperStart *start = (HelperStart *)malloc(sizeof(HelperStart));
        if (start == NULL)
            break;
        pthread_mutex_lock(&pl->mu);
        start->pl = pl;
        start->t = pl->started + 1;
        start->seen = pl->job_no;
        int failed = pthread_create(&pl->helper[pl->started], NULL, pool_helper, start) != 0;
        if (!failed)
            pl->started++;
        pthread_mutex_unlock(&pl->mu);
        if (failed) {
            free(start);
            break;
        }
    }
    return pl->started + 1 < T ? pl->started + 1 : T;
}

static void
pool_run(Pool *pl, Job job, void *ctx, int T)
{
    T = T > 1 ? pool_grow(pl, T) : 1;
    if (T > 1) {
        pthread_mutex_lock(&pl->mu);
        pl->job = job;
        pl->ctx = ctx;
        pl->T = T;
        pl->spins = pool_spins_for(pl, T) ? POOL_SPINS : POOL_SPINS_CROWDED;
        pl->running = T - 1;
        pl->waiting = 0;
        POOL_WRITE(pl->job_no, pl->job_no + 1);
        pthread_cond_broadcast(&pl->wake);
        pthread_mutex_unlock(&pl->mu);
    }
    job(ctx, 0, T);
    if (T > 1) {
        pool_spin_while_busy(&pl->running, pl->spins);
        pthread_mutex_lock(&pl->mu);
        while (pl->running > 0)
            pthread_cond_wait(&pl->idle, &pl->mu);
        pthread_mutex_unlock(&pl->mu);
    }
}

static void
pool_barrier(Pool *pl, int T)
{
    if (T == 1)
        return;
    pthread_mutex_lock(&pl->mu);
    const unsigned long phase = pl->phase;
    if (++pl->waiting == T) {
        pl->waiting = 0;
        POOL_WRITE(pl->phase, phase + 1);
        pthread_cond_broadcast(&pl->turn);
        pthread_mutex_unlock(&pl->mu);
        return;
    }
    pthread_mutex_unlock(&pl->mu);
    if (pool_spin_while(&pl->phase, phase, pl->spins))
        return;
    pthread_mutex_lock(&pl->mu);
    while (phase == pl->phase)
        pthread_cond_wait(&pl->turn, &pl->mu);
    pthread_mutex_unlock(&pl->mu);
}

/* Wake the helpers that sleep, to spin for a job that comes soon (a
 * futex wake-up costs tens of microseconds on a VM: paid now, beside the
 * caller's work, instead of when the job is due). */
static void
pool_poke(Pool *pl)
{
    if (pl->started == 0 || pl->pid != getpid())
        return;
    pthread_mutex_lock(&pl->mu);
    pl->poke_no++;
    pthread_cond_broadcast(&pl->wake);
    pthread_mutex_unlock(&pl->mu);
}

/* Whether the helpers of a job for T threads spin for it (rather than
 * sleep; pool_run spins them less otherwise): then a job of a few
 * microseconds is worth dealing out. Not with tcc (no spinning), nor with
 * more threads than CPUs. */
static int
pool_spins_for(const Pool *pl, int T)
{
    return POOL_SPINS > 0 && T <= pl->cpus;
}

/* Stop and join the helpers; free the helper array. */
static void
pool_stop(Pool *pl)
{
    if (pl->pid == getpid()) {
        pthread_mutex_lock(&pl->mu);
        pl->stop = 1;
        pthread_cond_broadcast(&pl->wake);
        pthread_mutex_unlock(&pl->mu);
        for (int i = 0; i < pl->started; i++)
            pthread_join(pl->helper[i], NULL);
    }
    pl->started = 0;
    free(pl->helper);
    pl->helper = NULL;
    pl->capacity = 0;
}
#else
static void pool_init(Pool *pl) { pl->T = 1; }
static void pool_run(Pool *pl, Job job, void *ctx, int T) { (void)pl; (void)T; job(ctx, 0, 1); }
static void pool_barrier(Pool *pl, int T) { (void)pl; (void)T; }
static void pool_poke(Pool *pl) { (void)pl; }
static void pool_stop(Pool *pl) { (void)pl; }
static int pool_spins_for(const Pool *pl, int T) { (void)pl; (void)T; return 0; }
#endif
