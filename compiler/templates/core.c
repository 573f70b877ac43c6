/* ---- core.c: the model's entry points in C (core.h) ------------------------ */
#ifndef NN_AMALGAMATION
#include "core.h"
#endif

/* n zeroed doubles (or bytes, with size 1), 64-byte aligned; *raw is what to free. */
static void *
alloc_aligned(size_t n, size_t size, void **raw)
{
    *raw = calloc(n * size + 64, 1);
    if (*raw == NULL)
        return NULL;
    return (void *)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}

static void
params_to_user(const double *restrict internal, double *restrict user)
{
    for (int i = 0; i < N_PARAM_RUNS; i++) {
        const int *run = PARAM_RUNS[i];
        for (int j = 0; j < run[0]; j++)
            user[run[1] + j * run[2]] = internal[run[3] + j * run[4]];
    }
}

static void
params_from_user(const double *restrict user, double *restrict internal)
{
    for (int i = 0; i < N_PARAM_RUNS; i++) {
        const int *run = PARAM_RUNS[i];
        for (int j = 0; j < run[0]; j++)
            internal[run[3] + j * run[4]] = user[run[1] + j * run[2]];
    }
}

NN_API size_t
nn_state_size(void)
{
    return sizeof(NNState);
}

/* Scratch memory (and the per-thread slots of batch_check) for n threads. */
static int
reserve_threads(NNState *st, int n)
{
    if (n <= st->capacity)
        return NN_OK;
    void *raw = NULL;
    char *scratch = (char *)alloc_aligned((size_t)n * SCRATCH_BYTES, 1, &raw);
    long *first = (long *)calloc((size_t)n, sizeof(long));
    if (scratch == NULL || first == NULL) {
        free(raw);
        free(first);
        return NN_ENOMEM;
    }
    free(st->raw_scratch);
    free(st->first);
    st->raw_scratch = raw;
    st->scratch = scratch;
    st->first = first;
    st->capacity = n;
    return NN_OK;
}

NN_API int
nn_init(void *state)
{
    NNState *st = (NNState *)state;
    memset(st, 0, sizeof *st);
    pool_init(&st->pool);
    if (kernels_request() < 0)
        return NN_EKERNELS;
#ifdef HAVE_MATVEC
    const MatVecKernels *kernels = mv_choose_kernels();
    if (kernels == NULL)
        return NN_ENARROWER;
#endif
    st->p = (double *)alloc_aligned(N_SHARED, sizeof(double), &st->raw[0]);
    st->gp = (double *)alloc_aligned(N_PARAM_SPAN, sizeof(double), &st->raw[1]);
    st->aux = (double *)alloc_aligned(N_AUX, sizeof(double), &st->raw[2]);
    st->one_v = (double *)alloc_aligned(ROW_STRIDE, sizeof(double), &st->raw[3]);
    st->one_g = (double *)alloc_aligned(ROW_STRIDE, sizeof(double), &st->raw[4]);
    st->v = (double *)alloc_aligned((size_t)BLOCK * ROW_STRIDE, sizeof(double), &st->raw[5]);
    st->g = (double *)alloc_aligned((size_t)BLOCK * ROW_STRIDE, sizeof(double), &st->raw[6]);
    st->state = (double *)alloc_aligned(1 + (size_t)STATE_VECTORS * N_PARAM_SPAN, sizeof(double), &st->raw[7]);
    if (!st->p || !st->gp || !st->aux || !st->one_v || !st->one_g || !st->v || !st->g || !st->state ||
        reserve_threads(st, 1) != NN_OK) {
        nn_release(st);
        return NN_ENOMEM;
    }
#ifdef HAVE_MATVEC
    st->kernels = kernels;
#endif
#ifdef HAVE_VECTOR_LEVEL
    st->vector_level = vector_level();
#endif
    st->threads = 1;
    st->upto = POSITIONS;
    init_constants(st->p);
#ifdef HAVE_INITIAL_PARAMS
    params_from_user(INITIAL_PARAMS, st->p);
#endif
    init_aux(st->p, st->aux);
    refresh_aux(st->p, st->aux);
    return NN_OK;
}

NN_API void
nn_release(void *state)
{
    NNState *st = (NNState *)state;
    pool_stop(&st->pool);
    for (size_t i = 0; i < sizeof(st->raw) / sizeof(st->raw[0]); i++) {
        free(st->raw[i]);
        st->raw[i] = NULL;
    }
    free(st->raw_scratch);
    free(st->first);
    st->raw_scratch = NULL;
    st->first = NULL;
    st->capacity = 0;
    st->p = st->gp = st->gp_next = NULL;
}

NN_API void
nn_set_input(void *state, const double *x)
{
    NNState *st = (NNState *)state;
    memcpy(st->one_v, x, sizeof(double) * N_INPUTS);
    st->forward_done = 0;
}

/* Zeroes what a backward over the row's first `upto` positions adds into:
 * the gradients of the values computed there, and the contributions (the
 * others are read by no one; the inputs' gradients accumulate). */
static void
clear_row_grads(NNState *st, int upto)
{
    const int end = POSITIONS > 0 ? GRAD_ZERO[upto] : ROW_VALUES;
    memset(st->one_g + N_INPUTS, 0, sizeof(double) * (end - N_INPUTS));
    memset(st->one_g + ROW_VALUES, 0, sizeof(double) * (ROW_STRIDE - ROW_VALUES));
}

/* A row's gradients of at least this many doubles are zeroed on a helper
 * while the forward runs (about 10 us of memset; dealing out the job costs
 * a few. The tests' -DMICROGRAD_MIN_WORK_PER_THREAD=0 deals out any). */
#define MIN_CLEAR_BESIDE (MIN_WORK_PER_THREAD > 0 ? 32768 : 0)

/* nn_backward_step's pipeline (below) is built where helpers spin for work */
#if !defined(NN_NO_THREADS) && POOL_SPINS > 0 && N_PIPELINED > 0 && OPT_KIND != OPT_NONE
#define HAVE_PIPELINE 1
#endif

typedef struct {
    NNState *st;
    const Block *b;
    int clear;                /* clear_row_grads too, on the last part */
    int *next;                /* the next block whose late packs a part takes (NULL: none late) */
} ForwardJob;

/* The input-gradient packs that lag p (only nn_backward_step leaves any),
 * each block's made by the first part free. */
static void
pack_late_shared(NNState *st, int *next)
{
#ifdef HAVE_PIPELINE
    for (int i; (i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < N_WEIGHT_BLOCKS;)
        pack_late_block(st, i);
#else
    (void)next;
    packs_current(st);
#endif
}

/* The forward on the caller; the backward's zeroing on a helper meanwhile
 * (or after it, when the pool had no helper to give), and the packs that
 * lag on whichever part is free first: the forward reads none of them. */
static void
forward_job(void *ctx, int part, int parts)
{
    const ForwardJob *j = (const ForwardJob *)ctx;
    if (part == 0) {
        forward_rows(j->b, 0, 1, SCRATCH_OF(j->st, 0));
        if (j->next != NULL)
            pack_late_shared(j->st, j->next);
    }
    if (part == parts - 1) {
        if (j->clear)
            clear_row_grads(j->st, j->b->upto);
        if (j->next != NULL)
            pack_late_shared(j->st, j->next);
    }
}

NN_API double
nn_forward(void *state, int n)
{
    NNState *st = (NNState *)state;
    Block b = block_of(st, st->one_v, st->one_g);
    b.upto = n >= 1 && n <= POSITIONS ? n : POSITIONS;
    const int helper = threads_for(st, 1, 0) > 1 && pool_spins_for(&st->pool, 2);
    const int beside = helper && ROW_STRIDE - N_INPUTS >= MIN_CLEAR_BESIDE;
    int next = 0;
    ForwardJob job = {st, &b, beside, st->bgx_behind ? &next : NULL};
    pool_run(&st->pool, forward_job, &job, beside || (helper && st->bgx_behind) ? 2 : 1);
    st->grads_clear = beside;
    st->bgx_behind = 0;
    st->forward_done = 1;
    st->upto = b.upto;
    return LOSS_OF(st->one_v, st->p);
}

NN_API int
nn_has_forward(const void *state)
{
    return ((const NNState *)state)->forward_done;
}

typedef struct {
    NNState *st;
    const Block *b;
} RowJob;

/* One row's parameter gradients: each part its share (param_grads). */
static void
param_grads_job(void *ctx, int part, int parts)
{
    const RowJob *j = (const RowJob *)ctx;
    param_grads(j->b, 1, part, parts, SCRATCH_OF(j->st, part));
}

/* The row's block for its backward (nn_forward's values), its gradients
 * zeroed where the backward adds and the packs it reads current. */
static Block
backward_block(NNState *st)
{
    packs_current(st);
    Block b = block_of(st, st->one_v, st->one_g);
    b.input_grads = 1;
    b.upto = st->upto;
    if (!st->grads_clear)
        clear_row_grads(st, b.upto);
    st->grads_clear = 0;
    return b;
}

NN_API void
nn_backward(void *state)
{
    NNState *st = (NNState *)state;
    if (!st->forward_done)
        return;
    /* the parameter gradients go on the helpers when they are worth it:
     * wake them now, while the row's backward runs, not when they are due */
    const int T = threads_for(st, 1, 0);
    if (T > 1)
        pool_poke(&st->pool);
    Block b = backward_block(st);
    backward_rows(&b, 0, 1, SCRATCH_OF(st, 0));
    RowJob job = {st, &b};
    pool_run(&st->pool, param_grads_job, &job, T);
}

/* ---- nn_backward_step: the step of a weight block begun while the backward runs
 *
 * A MatMat whose weights nothing else reads gives their whole gradient in
 * its weight gradient, which needs only its forward values and its output
 * gradient: both final once the backward has run the MatMat's own backward
 * (weight_ready, called right after it), and nothing after that reads its
 * weights. So while the caller runs the rest of the backward, the helpers
 * make that gradient, step the block and pack it, op after op; then every
 * thread takes the blocks left, and the other parameters once the caller
 * has made their gradients. Each number is computed by the same operations
 * as nn_backward then nn_step: the same bits, at any thread count. */
typedef struct Pipeline {
    int ready[N_PIPELINED > 0 ? N_PIPELINED : 1];   /* op j's backward has run */
    int next;                 /* the next piece of work a thread takes (pipelined ops, then blocks) */
    int rest;                 /* every other gradient is made */
} Pipeline;

static void
weight_ready(const Block *b, int j)
{
#ifdef HAVE_PIPELINE
    if (b->pipe != NULL)
        POOL_WRITE(b->pipe->ready[j], 1);
#endif
    (void)b;
    (void)j;
}

#ifdef HAVE_PIPELINE
typedef struct {
    NNState *st;
    const Block *b;
    OptimizerJob o;
} BackwardStepJob;

static void
wait_set(const int *flag)
{
    while (!POOL_READ(*flag))
        POOL_PAUSE();
}

/* Weight block i's step, then its forward's packs (as optimizer_job does);
 * its input gradient's packs are left to the next forward, which makes them
 * beside its own work (the next backward reads them first; whatever reads
 * them without a forward first makes them: packs_current). */
static void
step_block(const OptimizerJob *o, int i)
{
    pack_weights_fwd(o->st->p, o->st->aux, i, step_range(o, WEIGHT_SPANS[i][0], WEIGHT_SPANS[i][1]));
    o->st->bgx_late[i] = 1;
}

static int
block_pipelined(int i)
{
    for (int j = 0; j < N_PIPELINED; j++)
        if (PIPELINE_BLOCK[j] == i)
            return 1;
    return 0;
}

static void
backward_step_job(void *ctx, int part, int parts)
{
    const BackwardStepJob *job = (const BackwardStepJob *)ctx;
    Pipeline *pl = job->b->pipe;
    void *scratch = SCRATCH_OF(job->st, part);
    if (part == 0) {
        backward_rows(job->b, 0, 1, scratch);
        for (int j = 0; j < N_PIPELINED; j++)      /* (each is set already: never waited for in vain) */
            POOL_WRITE(pl->ready[j], 1);
        param_grads(job->b, 1, 0, 1, scratch);    /* every gradient but the pipelined ops' */
        POOL_WRITE(pl->rest, 1);
    }
    for (;;) {      /* the pipelined ops in the order their backwards run, then the other blocks */
        const int k = __atomic_fetch_add(&pl->next, 1, __ATOMIC_ACQ_REL);
        if (k >= N_PIPELINED + N_WEIGHT_BLOCKS)
            break;
        if (k < N_PIPELINED) {
            wait_set(&pl->ready[k]);
            pipeline_grad(job->b, k, scratch);
            step_block(&job->o, PIPELINE_BLOCK[k]);
        } else if (!block_pipelined(k - N_PIPELINED)) {
            wait_set(&pl->rest);
            step_block(&job->o, k - N_PIPELINED);
        }
    }
    wait_set(&pl->rest);
    long total = 0;
    for (int i = 0; i < N_OTHER_SPANS; i++)
        total += OTHER_SPANS[i][1] - OTHER_SPANS[i][0];
    const long from = (total * part / parts) & ~7L, upto = part == parts - 1 ? total : (total * (part + 1) / parts) & ~7L;
    step_other_share(&job->o, from, upto);
}
#endif

NN_API void
nn_backward_step(void *state, double lr, int zero)
{
    NNState *st = (NNState *)state;
    if (!st->forward_done)
        return;
#ifdef HAVE_PIPELINE
    const int T = threads_for(st, 1, 0);      /* (a small model's step stays on the caller) */
    if (T > 1 && pool_spins_for(&st->pool, T)) {
        Block b = backward_block(st);
        Pipeline pl;
        memset(&pl, 0, sizeof pl);
        b.pipe = &pl;
        BackwardStepJob job = {st, &b, {st, lr, 1.0, st->state[0] + 1.0, zero}};
        pool_run(&st->pool, backward_step_job, &job, T);
        st->bgx_behind = 1;
        refresh_rest(st->p, st->aux);
        st->state[0] = job.o.t;
        if (zero)
            memset(st->one_g, 0, sizeof(double) * N_INPUTS);
        st->forward_done = 0;
        return;
    }
#endif
    nn_backward(st);
    if (zero)
        nn_step_zero_grad(st, lr);
    else
        nn_step(st, lr);
}

NN_API void
nn_zero_grad(void *state)
{
    NNState *st = (NNState *)state;
    memset(st->gp, 0, sizeof(double) * N_PARAM_SPAN);
    memset(st->one_g, 0, sizeof(double) * N_INPUTS);
}

NN_API void
nn_update(void *state, double lr)
{
    NNState *st = (NNState *)state;
    for (int j = 0; j < N_PARAM_SPAN; j++)
        st->p[j] -= lr * st->gp[j];
    refresh_aux(st->p, st->aux);
    all_packed(st);
    st->forward_done = 0;
}

NN_API void
nn_step(void *state, double lr)
{
    NNState *st = (NNState *)state;
    optimizer_step(st, lr, 1.0, st->threads, 0);
    st->forward_done = 0;
}

NN_API void
nn_step_zero_grad(void *state, double lr)
{
    NNState *st = (NNState *)state;
    optimizer_step(st, lr, 1.0, st->threads, 1);
    memset(st->one_g, 0, sizeof(double) * N_INPUTS);
    st->forward_done = 0;
}

NN_API int
nn_train_batch(void *state, long rows, const double *X, double lr, double *mean_loss, long *bad)
{
    NNState *st = (NNState *)state;
    double *losses = (double *)malloc(sizeof(double) * (size_t)(rows > 0 ? rows : 1));
    if (losses == NULL)
        return NN_ENOMEM;
    if (st->gp_next == NULL &&
        (st->gp_next = (double *)alloc_aligned(N_PARAM_SPAN, sizeof(double), &st->raw[8])) == NULL) {
        free(losses);
        return NN_ENOMEM;
    }
    const int T = threads_for(st, rows, 1);
    double total;
    *bad = batch_train(st, X, rows, losses, T, &total);
    if (*bad >= 0) {
        free(losses);
        return NN_ENONFINITE;
    }
    optimizer_step(st, lr, (double)rows, T, 0);
    free(losses);
    *mean_loss = total / (double)rows;
    st->forward_done = 0;
    return NN_OK;
}

NN_API int
nn_predict_columns(void *state, long rows, int cols, const double *X, double *out)
{
    NNState *st = (NNState *)state;
    batch_predict(st, X, rows, cols, out, threads_for(st, rows, 0));
    return NN_OK;
}

NN_API int
nn_predict(void *state, long rows, const double *X, double *out)
{
    return nn_predict_columns(state, rows, N_INPUTS, X, out);
}

NN_API void
nn_read_params(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    params_to_user(st->p, out);
}

NN_API void
nn_write_params(void *state, const double *in)
{
    NNState *st = (NNState *)state;
    params_from_user(in, st->p);
    refresh_aux(st->p, st->aux);
    all_packed(st);
    st->forward_done = 0;
}

NN_API void
nn_read_grads(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    params_to_user(st->gp, out);
}

NN_API void
nn_read_input_grads(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    memcpy(out, st->one_g, sizeof(double) * N_INPUTS);
}

/* The outputs of the last nn_forward; those of positions it did not run are NaN. */
NN_API void
nn_read_outputs(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    for (int i = 0; i < N_OUTPUTS; i++)
        out[i] = OUTPUT_POSITION[i] > st->upto ? NAN
               : OUTPUT_AT[i] >= 0 ? st->one_v[OUTPUT_AT[i]] : st->p[-OUTPUT_AT[i] - 1];
}

/* The optimizer's state: the step count, then its vectors in the user's order. */
NN_API void
nn_read_state(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    out[0] = st->state[0];
    for (int k = 0; k < STATE_VECTORS; k++)
        params_to_user(st->state + 1 + (ptrdiff_t)k * N_PARAM_SPAN, out + 1 + (ptrdiff_t)k * N_PARAMS);
}

NN_API void
nn_write_state(void *state, const double *in)
{
    NNState *st = (NNState *)state;
    st->state[0] = in[0];
    for (int k = 0; k < STATE_VECTORS; k++)
        params_from_user(in + 1 + (ptrdiff_t)k * N_PARAMS, st->state + 1 + (ptrdiff_t)k * N_PARAM_SPAN);
}

/* For debugging: the values of nn_set_input's row, then p (compiler/codegen/
 * layout.py says where each IR slot is); the row's values that depend on p
 * alone are computed once per change of p, not per row: those of the current p. */
NN_API void
nn_read_data(const void *state, double *out)
{
    const NNState *st = (const NNState *)state;
    memcpy(out, st->one_v, sizeof(double) * ROW_VALUES);
    once_values(st->aux, out);
    memcpy(out + ROW_VALUES, st->p, sizeof(double) * N_SHARED);
}

NN_API const char *
nn_kernels(const void *state)
{
#ifdef HAVE_MATVEC
    return ((const NNState *)state)->kernels->isa;
#else
    (void)state;
    return "none";
#endif
}

NN_API int
nn_get_threads(const void *state)
{
    const NNState *st = (const NNState *)state;
    return st->threads;
}

NN_API int
nn_set_threads(void *state, int n)
{
    NNState *st = (NNState *)state;
#ifdef NN_NO_THREADS
    n = 1;
#endif
    if (reserve_threads(st, n) != NN_OK)
        return NN_ENOMEM;
    st->threads = n;
    return NN_OK;
}
