/* ---- core.h: the model in C, without Python ---------------------------------
 *
 * Functions on a caller-owned NNState (state.h): nothing global, so several
 * states live in one process. Every vector is in the order of the lists the
 * graph was compiled with. A state is used by one thread at a time (the
 * Python module waits for it: module.c); nn_train_batch and nn_predict run on
 * the state's own helper threads. */
#ifndef NN_CORE_H
#define NN_CORE_H
#ifndef NN_AMALGAMATION
#include "state.h"
#endif

#define NN_OK 0
#define NN_ENOMEM (-1)          /* out of memory */
#define NN_EKERNELS (-2)        /* $MICROGRAD_KERNELS names no instruction set */
#define NN_ENOFORWARD (-3)      /* nn_backward without the values of an nn_forward */
#define NN_ENONFINITE (-4)      /* an inf or NaN among the numbers given */

HIDDEN size_t nn_state_size(void);
/* Allocate a state's arrays: the constants, the exported weights (if any),
 * zero gradients, one thread. NN_OK, NN_ENOMEM or NN_EKERNELS. */
HIDDEN int nn_open(NNState *st);
HIDDEN void nn_close(NNState *st);
HIDDEN void nn_set_input(NNState *st, const double *x);          /* N_INPUTS values */
/* The loss: a sequence runs its first n positions (1..POSITIONS; n <= 0: all),
 * the outputs of later positions then read as NaN. */
HIDDEN double nn_forward(NNState *st, int n);
HIDDEN int nn_backward(NNState *st);                              /* NN_OK or NN_ENOFORWARD */
HIDDEN void nn_zero_grad(NNState *st);
HIDDEN void nn_update(NNState *st, double lr);                    /* p -= lr * grad */
HIDDEN void nn_step(NNState *st, double lr);                      /* the compiled optimizer */
/* Zero the gradients, forward and backward on every row of X [rows,
 * N_INPUTS] (in row order), one step on their mean; *mean_loss. Checks X
 * first: NN_ENONFINITE (*bad: the index of the first inf or NaN) changes
 * nothing. */
HIDDEN int nn_train_batch(NNState *st, long rows, const double *X, double lr, double *mean_loss, long *bad);
/* Forward on every row of X [rows, cols: N_INPUTS or N_FEATURES], the
 * outputs into out [rows, N_OUTPUTS]. */
HIDDEN void nn_predict(NNState *st, long rows, int cols, const double *X, double *out);
HIDDEN void nn_read_params(const NNState *st, double *out);       /* N_PARAMS */
HIDDEN void nn_write_params(NNState *st, const double *in);
HIDDEN void nn_read_grads(const NNState *st, double *out);        /* N_PARAMS */
HIDDEN void nn_read_input_grads(const NNState *st, double *out);  /* N_INPUTS */
HIDDEN void nn_read_outputs(const NNState *st, double *out);      /* N_OUTPUTS */
HIDDEN void nn_read_state(const NNState *st, double *out);        /* STATE_SIZE: t, then vectors */
HIDDEN void nn_write_state(NNState *st, const double *in);
HIDDEN void nn_read_data(const NNState *st, double *out);         /* ROW_VALUES + N_SHARED */
HIDDEN int nn_get_threads(const NNState *st);
/* The instruction set of the MatVec loops this state runs ("none": no MatVec). */
HIDDEN const char *nn_kernels(const NNState *st);
/* Let nn_train_batch and nn_predict use up to n threads (1..MAX_THREADS; 1
 * with -DNN_NO_THREADS): the same bits for every n. NN_OK or NN_ENOMEM. */
HIDDEN int nn_set_threads(NNState *st, int n);
#endif
