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

/* nn.h begins: compiler/codegen/module.py copies from here to "nn.h ends" */
#define NN_OK 0
#define NN_ENOMEM (-1)          /* out of memory */
#define NN_EKERNELS (-2)        /* $MICROGRAD_KERNELS names no instruction set */
#define NN_ENONFINITE (-3)      /* an inf or NaN among the numbers given */
#define NN_ENARROWER (-4)       /* the loops were built for wider instruction sets than
                                   this CPU or $MICROGRAD_KERNELS allows */

/* A state is nn_state_size() bytes the caller owns (memory aligned for a
 * pointer, e.g. from malloc); nn_init fills it, nn_release frees what nn_init
 * allocated. */
NN_API size_t nn_state_size(void);
/* Allocate a state's arrays: the constants, the exported weights (if any),
 * zero gradients, one thread. NN_OK, NN_ENOMEM, NN_EKERNELS or NN_ENARROWER. */
NN_API int nn_init(void *state);
NN_API void nn_release(void *state);                              /* what nn_init allocated */
NN_API void nn_set_input(void *state, const double *x);           /* N_INPUTS values */
/* The loss: a sequence runs its first n positions (1..POSITIONS; n <= 0: all),
 * the outputs of later positions then read as NaN. */
NN_API double nn_forward(void *state, int n);
NN_API int nn_has_forward(const void *state);   /* whether nn_backward has the values it needs */
NN_API void nn_backward(void *state);           /* nothing without the values of an nn_forward */
NN_API void nn_zero_grad(void *state);
NN_API void nn_update(void *state, double lr);                    /* p -= lr * grad */
NN_API void nn_step(void *state, double lr);                      /* the compiled optimizer */
NN_API void nn_step_zero_grad(void *state, double lr);            /* nn_step then nn_zero_grad, in one pass */
NN_API void nn_backward_step(void *state, double lr, int zero);   /* nn_backward then nn_step (zero: _zero_grad),
                                                                   * a weight's step begun once its gradient is made */
/* Zero the gradients, forward and backward on every row of X [rows,
 * N_INPUTS] (in row order), one step on their mean; *mean_loss. An inf or
 * NaN anywhere in X: NN_ENONFINITE (*bad: the index of the first) and
 * nothing changed (not the parameters, not the gradients). NN_ENOMEM: the
 * first call could not allocate its second gradient buffer. */
NN_API int nn_train_batch(void *state, long rows, const double *X, double lr, double *mean_loss, long *bad);
/* Forward on every row of X [rows, N_INPUTS], the outputs into out [rows,
 * N_OUTPUTS]; NN_OK. nn_predict_columns: X has `cols` columns, N_INPUTS or
 * N_FEATURES (only the inputs the outputs depend on). */
NN_API int nn_predict(void *state, long rows, const double *X, double *out);
NN_API int nn_predict_columns(void *state, long rows, int cols, const double *X, double *out);
NN_API void nn_read_params(const void *state, double *out);       /* N_PARAMS */
NN_API void nn_write_params(void *state, const double *in);
NN_API void nn_read_grads(const void *state, double *out);        /* N_PARAMS */
NN_API void nn_read_input_grads(const void *state, double *out);  /* N_INPUTS */
NN_API void nn_read_outputs(const void *state, double *out);      /* N_OUTPUTS */
NN_API void nn_read_state(const void *state, double *out);        /* STATE_SIZE: t, then vectors */
NN_API void nn_write_state(void *state, const double *in);
NN_API void nn_read_data(const void *state, double *out);         /* ROW_VALUES + N_SHARED */
NN_API int nn_get_threads(const void *state);
/* Let nn_train_batch and nn_predict use up to n threads (1..MAX_THREADS; 1
 * with -DNN_NO_THREADS): the same bits for every n. NN_OK or NN_ENOMEM. */
NN_API int nn_set_threads(void *state, int n);
/* The instruction set of the MatVec loops this state runs ("none": no MatVec). */
NN_API const char *nn_kernels(const void *state);
/* nn.h ends */
#endif
