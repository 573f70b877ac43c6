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
#define NN_ENONFINITE (-3)      /* an inf or NaN among the numbers given */

/* The signatures of issue 26's C API: a state is nn_state_size() bytes the
 * caller owns (an NNState). */
HIDDEN size_t nn_state_size(void);
/* Allocate a state's arrays: the constants, the exported weights (if any),
 * zero gradients, one thread. NN_OK, NN_ENOMEM or NN_EKERNELS. */
HIDDEN int nn_init(void *state);
HIDDEN void nn_release(void *state);                              /* what nn_init allocated */
HIDDEN void nn_set_input(void *state, const double *x);           /* N_INPUTS values */
/* The loss: a sequence runs its first n positions (1..POSITIONS; n <= 0: all),
 * the outputs of later positions then read as NaN. */
HIDDEN double nn_forward(void *state, int n);
HIDDEN int nn_has_forward(const void *state);   /* whether nn_backward has the values it needs */
HIDDEN void nn_backward(void *state);           /* nothing without the values of an nn_forward */
HIDDEN void nn_zero_grad(void *state);
HIDDEN void nn_update(void *state, double lr);                    /* p -= lr * grad */
HIDDEN void nn_step(void *state, double lr);                      /* the compiled optimizer */
/* Zero the gradients, forward and backward on every row of X [rows,
 * N_INPUTS] (in row order), one step on their mean; *mean_loss. Checks X
 * first: NN_ENONFINITE (*bad: the index of the first inf or NaN) changes
 * nothing. */
HIDDEN int nn_train_batch(void *state, long rows, const double *X, double lr, double *mean_loss, long *bad);
/* Forward on every row of X [rows, N_INPUTS], the outputs into out [rows,
 * N_OUTPUTS]; NN_OK. nn_predict_columns: X has `cols` columns, N_INPUTS or
 * N_FEATURES (only the inputs the outputs depend on). */
HIDDEN int nn_predict(void *state, long rows, const double *X, double *out);
HIDDEN int nn_predict_columns(void *state, long rows, int cols, const double *X, double *out);
HIDDEN void nn_read_params(const void *state, double *out);       /* N_PARAMS */
HIDDEN void nn_write_params(void *state, const double *in);
HIDDEN void nn_read_grads(const void *state, double *out);        /* N_PARAMS */
HIDDEN void nn_read_input_grads(const void *state, double *out);  /* N_INPUTS */
HIDDEN void nn_read_outputs(const void *state, double *out);      /* N_OUTPUTS */
HIDDEN void nn_read_state(const void *state, double *out);        /* STATE_SIZE: t, then vectors */
HIDDEN void nn_write_state(void *state, const double *in);
HIDDEN void nn_read_data(const void *state, double *out);         /* ROW_VALUES + N_SHARED */
HIDDEN int nn_get_threads(const void *state);
/* Let nn_train_batch and nn_predict use up to n threads (1..MAX_THREADS; 1
 * with -DNN_NO_THREADS): the same bits for every n. NN_OK or NN_ENOMEM. */
HIDDEN int nn_set_threads(void *state, int n);
/* The instruction set of the MatVec loops this state runs ("none": no MatVec). */
HIDDEN const char *nn_kernels(const void *state);
#endif
