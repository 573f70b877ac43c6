/* ---- batch.c: many rows at once, on the state's threads -------------------------
 *
 * nn_train_batch and nn_predict run blocks of BLOCK rows; the threads share
 * each block's rows, then (training) each its share of the parameters. */
#ifndef NN_AMALGAMATION
#include "state.h"
#endif

/* The index of the first inf or NaN of x[0:n], or -1. A chunk at a time,
 * by the exponent bits, without an early exit: a loop the compiler can
 * vectorise (train_batch checks each row of X just before it runs it). */
static long
first_non_finite(const double *x, long n)
{
    const uint64_t EXP = 0x7ff0000000000000ULL, ONE = 1ULL << 52;
    for (long i0 = 0; i0 < n; i0 += 4096) {
        const long i1 = n - i0 < 4096 ? n : i0 + 4096;
        uint64_t any = 0;     /* bit 63 set by an exponent of all ones: (EXP & u) + ONE overflows into it */
        for (long i = i0; i < i1; i++) {
            uint64_t u;
            memcpy(&u, x + i, sizeof u);
            any |= (u & EXP) + ONE;
        }
        if (any >> 63)
            for (long i = i0; i < i1; i++)
                if (!isfinite(x[i]))
                    return i;
    }
    return -1;
}

/* The threads a call over `rows` rows uses: what was asked for, but no more
 * than keeps each busy with MIN_WORK_PER_THREAD, and one when scalar code
 * adds parameter gradients directly (its rows must run in order). */
static int
threads_for(const NNState *st, long rows, int training)
{
    if (training && !RECORDED)
        return 1;
    const double work = (double)rows * (double)WORK_PER_ROW;
    int T = st->threads;
    if (work < MIN_WORK_PER_THREAD * T)
        T = (int)(work / MIN_WORK_PER_THREAD);
    return T < 1 ? 1 : T;
}

static Block
block_of(NNState *st, double *v, double *g)
{
    Block b = {v, g, st->p, st->gp, st->aux, st->kernels, 0, POSITIONS, v, ROW_STRIDE, NULL};
    return b;
}

typedef struct {
    NNState *st;
    const double *X;
    long rows;
    int cols;                 /* N_INPUTS, or N_FEATURES (predict) */
    double *out;              /* predict's outputs */
    double *losses;           /* train_batch: each row's loss, in order */
} Batch;

/* Row r of X into the block row `row`: with every input given, the inputs
 * read from the rows (the MatVecs read X itself: reads_x), else the features. */
static void
load_row(const Batch *bt, long r, double *restrict row)
{
    const double *restrict x = bt->X + r * bt->cols;
    if (bt->cols == N_INPUTS) {
        for (int i = 0; i < N_ROW_INPUT_RUNS; i++)
            memcpy(row + ROW_INPUT_RUNS[i][0], x + ROW_INPUT_RUNS[i][0], sizeof(double) * ROW_INPUT_RUNS[i][1]);
    } else {
        memset(row, 0, sizeof(double) * N_INPUTS);
        for (int j = 0; j < N_FEATURES; j++)
            row[FEATURES[j]] = x[j];
    }
}

/* Where the MatVecs that read only inputs find those of the block from row
 * b0 on: in X itself when it holds every input (nothing copied), else in
 * the rows. */
static void
reads_x(Block *b, const Batch *bt, long b0)
{
    if (bt->cols == N_INPUTS) {
        b->x = bt->X + b0 * N_INPUTS;
        b->ldx = N_INPUTS;
    }
}

/* The first non-finite number of this block's rows [r0, r1) of X into
 * st->first[t] (an index into X), or -1. */
static void
check_rows(const Batch *bt, long b0, int r0, int r1, int t)
{
    const long i0 = (b0 + r0) * N_INPUTS, i = first_non_finite(bt->X + i0, (long)(r1 - r0) * N_INPUTS);
    bt->st->first[t] = i < 0 ? -1 : i0 + i;
}

/* The first non-finite number the threads found (index into X), or -1:
 * thread t's rows come before thread t + 1's (after a barrier: all have looked). */
static long
first_found(const NNState *st, int T)
{
    for (int t = 0; t < T; t++)
        if (st->first[t] >= 0)
            return st->first[t];
    return -1;
}

static void
train_job(void *ctx, int t, int T)
{
    Batch *bt = (Batch *)ctx;
    NNState *st = bt->st;
    Block b = block_of(st, st->v, st->g);
    void *scratch = SCRATCH_OF(st, t);
    for (long b0 = 0; b0 < bt->rows; b0 += BLOCK) {
        const int n = bt->rows - b0 < BLOCK ? (int)(bt->rows - b0) : BLOCK;
        const int r0 = (int)((long long)n * t / T), r1 = (int)((long long)n * (t + 1) / T);
        /* each thread checks its rows as it comes to them (they are then in
         * its cache for the forward); a block with a non-finite number
         * anywhere ends the batch after the barrier, before the step */
        check_rows(bt, b0, r0, r1, t);
        if (st->first[t] < 0) {
            reads_x(&b, bt, b0);
            /* the inputs' gradients are not computed here (b.input_grads is 0:
             * nothing reads them, scalar code may only add to them): the rest
             * of each gradient row that rows use (ROW_ZERO) starts at 0 */
            for (int r = r0; r < r1; r++) {
                load_row(bt, b0 + r, ROW(b.v, r));
                memset(ROW(b.g, r) + N_INPUTS, 0, sizeof(double) * (ROW_ZERO - N_INPUTS));
            }
            forward_rows(&b, r0, r1, scratch);
            for (int r = r0; r < r1; r++)
                bt->losses[b0 + r] = LOSS_OF(ROW(b.v, r), b.p);
            backward_rows(&b, r0, r1, scratch);
        }
        pool_barrier(&st->pool, T);
        if (first_found(st, T) >= 0)
            return;
        param_grads(&b, n, t, T, scratch);
        pool_barrier(&st->pool, T);
    }
}

/* Forward and backward on every row of X, each row's loss into losses[],
 * the parameters' gradients into st->gp. Returns the index in X of the
 * first inf or NaN (rows are checked a block at a time, as they are run),
 * or -1 and the sum of the losses in *total. On -1 the gradients were
 * summed into a buffer of their own, swapped in only now: a refused batch
 * leaves st->gp as it was. */
static long
batch_train(NNState *st, const double *X, long rows, double *losses, int T, double *total)
{
    Batch bt = {st, X, rows, N_INPUTS, NULL, losses};
    packs_current(st);          /* (the rows' backward reads the input-gradient packs) */
    double *before = st->gp;
    st->gp = st->gp_next;
    memset(st->gp, 0, sizeof(double) * N_PARAM_SPAN);
    for (int t = 0; t < T; t++)
        st->first[t] = -1;     /* (pool_run may get fewer threads than T) */
    pool_run(&st->pool, train_job, &bt, T);
    const long bad = first_found(st, T);
    if (bad >= 0) {
        st->gp = before;
        return bad;
    }
    st->gp_next = before;
    *total = 0.0;
    for (long r = 0; r < rows; r++)
        *total += losses[r];
    return -1;
}

static void
predict_job(void *ctx, int t, int T)
{
    Batch *bt = (Batch *)ctx;
    NNState *st = bt->st;
    Block b = block_of(st, st->v, st->g);
    void *scratch = SCRATCH_OF(st, t);
    /* each thread keeps to the same rows of the block buffer in every block
     * (the last one too, however short): no barrier needed */
    const int own0 = (int)((long long)BLOCK * t / T), own1 = (int)((long long)BLOCK * (t + 1) / T);
    for (long b0 = 0; b0 < bt->rows; b0 += BLOCK) {
        const int n = bt->rows - b0 < BLOCK ? (int)(bt->rows - b0) : BLOCK;
        const int r0 = own0 < n ? own0 : n, r1 = own1 < n ? own1 : n;
        reads_x(&b, bt, b0);
        for (int r = r0; r < r1; r++)
            load_row(bt, b0 + r, ROW(b.v, r));
        forward_rows(&b, r0, r1, scratch);
        for (int r = r0; r < r1; r++) {
            const double *row = ROW(b.v, r);
            double *out = bt->out + (b0 + r) * N_OUTPUTS;
            for (int i = 0; i < N_OUTPUTS; i++)
                out[i] = OUTPUT_AT[i] >= 0 ? row[OUTPUT_AT[i]] : b.p[-OUTPUT_AT[i] - 1];
        }
    }
}

static void
batch_predict(NNState *st, const double *X, long rows, int cols, double *out, int T)
{
    Batch bt = {st, X, rows, cols, out, NULL};
    if (rows > 0)
        pool_run(&st->pool, predict_job, &bt, T);
}
