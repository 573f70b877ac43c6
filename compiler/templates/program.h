/* ---- program.h: what the generated program provides, and what it runs on --
 *
 * The program (compiler/codegen) runs over blocks of input rows: each row
 * holds its values and gradients (ROW_STRIDE doubles apart); parameters,
 * constants and their gradients are shared. */
#ifndef NN_PROGRAM_H
#define NN_PROGRAM_H
#ifndef NN_AMALGAMATION
#include "contract.h"
#endif

#define ROW(a, r) ((a) + (ptrdiff_t)(r) * ROW_STRIDE)

/* The values and gradients of a block of rows, and what they share. */
typedef struct {
    double *v, *g;            /* rows of ROW_STRIDE values, gradients */
    double *p, *gp;           /* parameters and constants; parameter gradients */
    const double *aux;        /* packed copies of the weights (refresh_aux) */
    const MatVecKernels *k;   /* the MatVec loops for this CPU (NULL: no MatVec) */
    int input_grads;          /* also compute the gradients of the inputs */
    int upto;                 /* a sequence: run its first `upto` positions (1..POSITIONS) */
    const double *x;          /* row r's inputs at x + r * ldx for the MatVecs that read only */
    long ldx;                 /* inputs (the caller's X itself, or the rows v) */
    struct Pipeline *pipe;    /* nn_backward_step's (core.c), or NULL */
} Block;

/* core.c: the backward has run pipelined op j's backward (compiler/codegen/
 * matmat.py): its weights' gradient may be made and stepped now (a no-op
 * unless b->pipe) */
static void weight_ready(const Block *b, int j);

/* Generated for each program (after this point in nn.c), with LOSS_OF(row, p),
 * the loss of a row: */
static void init_constants(double *restrict p);
/* what aux holds from the constants alone: once, after init_constants */
static void init_aux(const double *restrict p, double *restrict aux);
/* the packed copies of weight block i (of N_WEIGHT_BLOCKS) in aux, from its part of p alone
 * (finite: whether all of it is finite, 1 or 0, when the caller knows; else -1) */
static void pack_weights(const double *restrict p, double *restrict aux, int i, int finite);
/* its two parts: the forward's packs and flag, then the input gradient's */
static void pack_weights_fwd(const double *restrict p, double *restrict aux, int i, int finite);
static void pack_weights_bgx(const double *restrict p, double *restrict aux, int i);
/* the rest of aux, from p and the packs: padded heads, flags, what is computed once */
static void refresh_rest(const double *restrict p, double *restrict aux);
/* the values computed once per change of p (by refresh_rest, compiler/invariant.py) into a row */
static void once_values(const double *restrict aux, double *restrict row);
static void forward_rows(const Block *b, int r0, int r1, void *scratch);
static void backward_rows(const Block *b, int r0, int r1, void *scratch);
/* this part's share of the parameter gradients over a block's `rows` rows
 * (with b->pipe, all but the pipelined ops' weight gradients) */
static void param_grads(const Block *b, int rows, int part, int parts, void *scratch);
/* the weight gradient of pipelined op j (of N_PIPELINED) over one row, on
 * the calling thread; PIPELINE_BLOCK[j] is its weights' block */
static void pipeline_grad(const Block *b, int j, void *scratch);

/* Where each parameter (in the user's order) is in p: runs of
 * {count, user start, user step, p start, p step}. */
HIDDEN extern const int PARAM_RUNS[N_PARAM_RUNS][5];
/* Where the weight blocks are in p, heaviest first: {start, end} (pack_weights
 * reads block i from WEIGHT_SPANS[i] alone); then where the other parameters
 * (and the padding between blocks) are. Together they tile p[0:N_PARAM_SPAN]. */
HIDDEN extern const int WEIGHT_SPANS[][2];
HIDDEN extern const int OTHER_SPANS[][2];
/* Where each output is: >= 0 an index in the row, < 0 -(index in p) - 1. */
HIDDEN extern const int OUTPUT_AT[];
/* The position of a sequence from which each output is computed (0: always):
 * forward(n) leaves the outputs of later positions uncomputed. */
HIDDEN extern const int OUTPUT_POSITION[];
/* GRAD_ZERO[n]: a backward over the first n positions of a sequence adds into
 * the row's gradients below it, and into the contributions (ROW_VALUES on);
 * ROW_VALUES where not known (compiler/codegen/module.py: _gradient_ends) */
HIDDEN extern const int GRAD_ZERO[];
/* The inputs the outputs depend on, in order: predict's short rows. */
HIDDEN extern const int FEATURES[];
/* The inputs something other than those MatVecs reads from a row: runs of
 * {first, count}, N_ROW_INPUT_RUNS of them; only these are copied into the
 * rows when the MatVecs read the caller's X. */
HIDDEN extern const int ROW_INPUT_RUNS[][2];
#ifdef HAVE_INITIAL_PARAMS
HIDDEN extern const double INITIAL_PARAMS[];   /* an export's weights, in the user's order */
#endif
#endif
