/* ---- state.h: the state of one model, owned by its caller ------------------
 *
 * Everything a model changes lives in an NNState (no process globals): two
 * states of one program, or two programs, run side by side. core.h declares
 * the functions on it. */
#ifndef NN_STATE_H
#define NN_STATE_H
#ifndef NN_AMALGAMATION
#include "program.h"
#endif

/* ---- the compiled optimizer: its kind and numbers come from the prologue */
#define OPT_NONE 0
#define OPT_SGD 1
#define OPT_ADAM 2
#define OPT_ADAMW 3
#ifndef OPT_KIND
#define OPT_KIND OPT_NONE
#define OPT_NAME "none"
#define OPT_LR 0.0
#define OPT_MOMENTUM 0.0
#define OPT_HAS_MOMENTUM 0
#define OPT_WEIGHT_DECAY 0.0
#define OPT_HAS_WEIGHT_DECAY 0
#define OPT_STATE_VECTORS 0
#endif
#define STATE_VECTORS OPT_STATE_VECTORS   /* Adam: m, v; SGD with momentum: its buffer */
#define STATE_SIZE (1 + STATE_VECTORS * N_PARAMS)   /* as nn_read_state sees it: t, then vectors */

/* ---- threads (pool.c) ----------------------------------------------------- */

/* A job runs on the calling thread (t = 0) and T - 1 helpers; pool_barrier()
 * waits for all T. Every part of a job writes only what it owns (its rows,
 * its share of the parameters), so the results are the same bits for any T. */
typedef void (*Job)(void *ctx, int t, int T);

/* The floating-point operations worth a thread of their own (batch.c,
 * core.c); -DMICROGRAD_MIN_WORK_PER_THREAD=0 deals out any work (the tests) */
#ifndef MICROGRAD_MIN_WORK_PER_THREAD
#define MICROGRAD_MIN_WORK_PER_THREAD 2000000.0
#endif
#define MIN_WORK_PER_THREAD ((double)MICROGRAD_MIN_WORK_PER_THREAD)

#ifndef NN_NO_THREADS
/* Helper threads, started when a call first wants them (as many as it wants:
 * the array grows). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, idle, turn;
    pthread_t *helper;        /* helper[0:started] run */
    int capacity;             /* of helper[] */
    int started;
    int stop;
    unsigned long job_no;
    unsigned long poke_no;    /* pool_poke: helpers asleep wake and spin a while */
    int spins;                /* how long a waiting thread spins before it sleeps (pool.c) */
    int cpus;                 /* online: more threads than these spin less */
    int running;              /* helpers still in the current job */
    Job job;
    void *ctx;
    int T;
    int waiting;              /* barrier */
    unsigned long phase;
    pid_t pid;                /* after a fork, the child has no helpers */
} Pool;
#else
typedef struct {
    int T;
} Pool;
#endif

static void pool_init(Pool *pl);
static void pool_run(Pool *pl, Job job, void *ctx, int T);
static void pool_barrier(Pool *pl, int T);
static void pool_poke(Pool *pl);
static int pool_spins_for(const Pool *pl, int T);
static void pool_stop(Pool *pl);

/* ---- the state ------------------------------------------------------------ */

typedef struct NNState {
    double *p, *gp, *aux;
    double *gp_next;          /* nn_train_batch's gradients, swapped with gp when the batch is whole */
    double *one_v, *one_g;    /* the row of nn_set_input, nn_forward, nn_backward */
    double *v, *g;            /* BLOCK rows for nn_train_batch and nn_predict */
    double *state;            /* the optimizer's: t, then vectors of N_PARAM_SPAN */
    char *scratch;            /* SCRATCH_BYTES per thread, for `capacity` threads */
    long *first;              /* per thread: where it found a non-finite number */
    void *raw[9];             /* what was allocated (the arrays above are 64-byte aligned in it) */
    void *raw_scratch;
    int capacity;             /* threads the scratch memory is for */
    int threads;              /* what nn_set_threads() asked for */
    int forward_done;         /* nn_backward() needs the values of an nn_forward() */
    int upto;                 /* the positions of the last nn_forward() (a sequence) */
    int grads_clear;          /* one_g's gradients are 0 where nn_backward adds (zeroed beside
                               * the nn_forward(): core.c) */
    int bgx_behind;           /* some input-gradient packs lag p (nn_backward_step): bgx_late[i] */
    char bgx_late[N_WEIGHT_BLOCKS > 0 ? N_WEIGHT_BLOCKS : 1];
    const MatVecKernels *kernels;   /* the MatVec loops for this CPU (NULL: none) */
    int vector_level;         /* the optimizer's loops: vector_level() at nn_init */
    Pool pool;
} NNState;

#define SCRATCH_OF(st, t) ((void *)((st)->scratch + (ptrdiff_t)(t) * SCRATCH_BYTES))

/* optimizer.c: one step on the gradients / divisor, on T threads (zero: the
 * gradients zeroed as it goes), then the packed copies of the new weights */
static void optimizer_step(NNState *st, double lr, double divisor, int T, int zero);
/* aux from p (pack_weights for every block, then refresh_rest) */
static void refresh_aux(const double *restrict p, double *restrict aux);
/* the input-gradient packs that lag p (bgx_late): block i's, all of them now;
 * and: none lags (all were made) */
static void pack_late_block(NNState *st, int i);
static void packs_current(NNState *st);
static void all_packed(NNState *st);

/* batch.c */
static long first_non_finite(const double *x, long n);
static Block block_of(NNState *st, double *v, double *g);
static int threads_for(const NNState *st, long rows, int training);
static long batch_train(NNState *st, const double *X, long rows, double *losses, int T, double *total);
static void batch_predict(NNState *st, const double *X, long rows, int cols, double *out, int T);
#endif
