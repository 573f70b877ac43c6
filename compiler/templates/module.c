/* ---- module.c: nn, one compiled micrograd graph, as a CPython extension module
 *
 * The glue between Python and the C core (core.h): it converts and checks
 * the arguments (args.c), waits for the model, and calls the core. The
 * module's API, in Python terms (every vector is in the order of the lists
 * the graph was compiled with; buffers are anything with the buffer protocol
 * holding C-contiguous float64, numpy not required):
 *
 *   n_inputs, n_params, n_outputs, n_features   ints
 *   features                            tuple: the inputs the outputs depend on
 *   program_hash                        str: names what this module computes (graph,
 *                                       optimizer, gradients)
 *   graph_hash                          str: names the graph alone (its weights fit)
 *   max_threads                         int: the most set_threads accepts
 *   set_input(values)                   the inputs: n_inputs numbers (a list, tuple or buffer)
 *   forward(n=None) -> float            run the graph on them; returns the loss. A sequence
 *                                       runs its first n positions: the outputs of later
 *                                       positions then read as NaN
 *   backward()                          add d loss / d param to the parameter gradients
 *                                       (and d loss / d input, if compiled with input gradients)
 *   zero_grad()                         set those gradients to 0
 *   update(lr)                          p -= lr * grad (plain SGD)
 *   step(lr=None)                       one step of the compiled optimizer on the gradients
 *   train_batch(X, lr=None) -> float    zero the gradients, forward and backward on every row
 *                                       of X [rows, n_inputs], one step on their mean
 *                                       (p -= lr * (grad / rows) without an optimizer);
 *                                       returns the mean loss
 *   predict(X, out)                     forward on every row of X (n_inputs or n_features
 *                                       columns), the outputs into the rows of out [rows, n_outputs]
 *   read_params(out), write_params(values), read_grads(out)        n_params numbers
 *   read_input_grads(out), read_outputs(out)
 *   read_state(out), write_state(values)  the optimizer's state (state_size numbers)
 *   get_threads(), set_threads(n)       threads train_batch and predict may use
 *
 * Threads: a call waits while another thread uses the model (train_batch and
 * predict release the GIL while they run; so does the wait). A process
 * forked while another thread used the model finds it free.
 *
 * Floating point: nn.c must be compiled with IEEE double semantics (no FMA
 * contraction, no reassociation, no fast-math), whatever the flags:
 * contract.h says so to clang and gcc, and a fast-math build is an error.
 * Then every compiler and optimisation level gives the interpreter's bits.
 */
#ifndef NN_AMALGAMATION
#define NN_PYTHON 1
#include "core.h"
#include "args.h"
#endif
#include <pthread.h>

/* The module's state: the model, and who may use it. */
typedef struct {
    NNState nn;
    int open;                 /* nn_init succeeded */
    pthread_mutex_t lock;     /* held by the call using nn */
    pid_t pid;                /* the process that initialised `lock` */
} ModuleState;

/* The model, once no other thread uses it: the GIL is released while this
 * thread waits. Take it only after converting the arguments (a conversion
 * can run Python code, which could call this module again), and give it
 * back (release_model) on every path. In a child forked while another thread
 * held it, the lock starts afresh: that thread does not exist there. */
static NNState *
take_model(PyObject *module)
{
    ModuleState *ms = (ModuleState *)PyModule_GetState(module);
    if (ms == NULL)
        return NULL;
    if (!ms->open) {
        PyErr_SetString(PyExc_RuntimeError, "nn: this module's state is not initialised");
        return NULL;
    }
    if (ms->pid != getpid()) {
        pthread_mutex_init(&ms->lock, NULL);
        ms->pid = getpid();
    }
    if (pthread_mutex_trylock(&ms->lock) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&ms->lock);
        Py_END_ALLOW_THREADS
    }
    return &ms->nn;
}

static void
release_model(PyObject *module)
{
    ModuleState *ms = (ModuleState *)PyModule_GetState(module);
    pthread_mutex_unlock(&ms->lock);
}

/* ---- entry points ------------------------------------------------------------ */

PyDoc_STRVAR(set_input_doc, "set_input(values)\n--\n\n"
             "Copy n_inputs numbers (a list, tuple or float64 buffer) into the inputs.");

static PyObject *
py_set_input(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("set_input", nargs, 1, 1))
        return NULL;
    PyObject *obj = args[0];
    NNState *st;
    if (PyList_Check(obj) || PyTuple_Check(obj)) {
        /* Convert into a scratch copy first: a bad item leaves the inputs as they were. */
        double *tmp = (double *)PyMem_Malloc(sizeof(double) * (N_INPUTS > 0 ? N_INPUTS : 1));
        if (tmp == NULL)
            return PyErr_NoMemory();
        if (get_number_list(obj, tmp) < 0 || (st = take_model(module)) == NULL) {
            PyMem_Free(tmp);
            return NULL;
        }
        nn_set_input(st, tmp);
        release_model(module);
        PyMem_Free(tmp);
    } else {
        Py_buffer view;
        if (get_float64_buffer(obj, &view, "set_input", "values", 1, -1, N_INPUTS, -1, 0) < 0)
            return NULL;
        if ((st = take_model(module)) == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        nn_set_input(st, (const double *)view.buf);
        release_model(module);
        PyBuffer_Release(&view);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(forward_doc, "forward(n=None)\n--\n\n"
             "Run the graph on the inputs; return the loss. A sequence (a list of per-position\n"
             "losses) runs its first n positions only, its loss then the mean of theirs, and the\n"
             "outputs of the positions it did not run read as NaN.");

static PyObject *
py_forward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NNState *st;
    long n = -1;
    if (!check_nargs("forward", nargs, 0, 1))
        return NULL;
    if (nargs && args[0] != Py_None) {
        if (POSITIONS == 0) {     /* a count of any size is still not for this graph */
            if (get_count("forward", "n", args[0], LONG_MIN, LONG_MAX, &n) < 0 &&
                !PyErr_ExceptionMatches(PyExc_ValueError))
                return NULL;
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "forward(): n is for a sequence's losses (compile() given "
                            "a list of losses); this graph has one loss");
            return NULL;
        }
        if (get_count("forward", "n", args[0], 1, POSITIONS, &n) < 0)
            return NULL;
    }
    if ((st = take_model(module)) == NULL)
        return NULL;
    const double loss = nn_forward(st, (int)n);
    release_model(module);
    return PyFloat_FromDouble(loss);
}

PyDoc_STRVAR(backward_doc, "backward()\n--\n\n"
             "Add d loss / d param (and d loss / d input, if compiled with input gradients)\n"
             "to the gradients, for the values of the last forward().");

static PyObject *
py_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NNState *st;
    if (!check_nargs("backward", nargs, 0, 0) || (st = take_model(module)) == NULL)
        return NULL;
    const int ready = nn_has_forward(st);
    nn_backward(st);
    release_model(module);
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError,
                        "backward() needs the values of forward(): call forward() after "
                        "set_input(), write_params(), update(), step() or train_batch()");
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(zero_grad_doc, "zero_grad()\n--\n\nSet the parameter (and input) gradients to 0.");

static PyObject *
py_zero_grad(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NNState *st;
    if (!check_nargs("zero_grad", nargs, 0, 0) || (st = take_model(module)) == NULL)
        return NULL;
    nn_zero_grad(st);
    release_model(module);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(update_doc, "update(lr)\n--\n\nPlain SGD: p -= lr * grad for every parameter.");

static PyObject *
py_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double lr;
    NNState *st;
    if (!check_nargs("update", nargs, 1, 1) || get_lr("update", args[0], &lr, 0) < 0 ||
        (st = take_model(module)) == NULL)
        return NULL;
    nn_update(st, lr);
    release_model(module);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(step_doc, "step(lr=None, zero_grad=False)\n--\n\n"
             "One step of the compiled optimizer on the gradients; lr overrides its learning rate. "
             "zero_grad=True then zeroes the gradients as zero_grad() does, in the same pass over "
             "the parameters.");

/* step's (func's) arguments by position or by name: lr, zero_grad (a bool). */
static int
get_step_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **lr,
              int *zero)
{
    static const char *const names[2] = {"lr", "zero_grad"};
    PyObject *given[2] = {Py_None, Py_False};
    const Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (!check_nargs(func, nargs, 0, 2))
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GetItem(kwnames, i);
        int at = -1;
        for (int j = 0; j < 2 && at < 0; j++)
            if (PyUnicode_CompareWithASCIIString(name, names[j]) == 0)
                at = j;
        if (at < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", func, name);
            return -1;
        }
        if (at < nargs) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", func, names[at]);
            return -1;
        }
        given[at] = args[nargs + i];
    }
    if (!PyBool_Check(given[1])) {
        PyErr_Format(PyExc_TypeError, "%s(): zero_grad must be True or False, not %R", func, given[1]);
        return -1;
    }
    *lr = given[0];
    *zero = given[1] == Py_True;
    return 0;
}

static PyObject *
py_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    double lr;
    int zero;
    PyObject *lr_arg;
    NNState *st;
    if (get_step_args("step", args, nargs, kwnames, &lr_arg, &zero) < 0 || get_lr("step", lr_arg, &lr, 1) < 0 ||
        (st = take_model(module)) == NULL)
        return NULL;
    if (zero)
        nn_step_zero_grad(st, lr);
    else
        nn_step(st, lr);
    release_model(module);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(backward_step_doc, "backward_step(lr=None, zero_grad=False)\n--\n\n"
             "backward() then step(lr, zero_grad), the same numbers to the bit, faster: the step of "
             "each weight matrix that only one lifted MatMat reads begins on the helper threads as "
             "soon as the backward has made its gradient, while the rest of the backward runs.");

static PyObject *
py_backward_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    double lr;
    int zero;
    PyObject *lr_arg;
    NNState *st;
    if (get_step_args("backward_step", args, nargs, kwnames, &lr_arg, &zero) < 0 ||
        get_lr("backward_step", lr_arg, &lr, 1) < 0 || (st = take_model(module)) == NULL)
        return NULL;
    if (!nn_has_forward(st)) {
        release_model(module);
        PyErr_SetString(PyExc_RuntimeError,
                        "backward_step() needs the values of forward(): call forward() after "
                        "set_input(), write_params(), update(), step() or train_batch()");
        return NULL;
    }
    nn_backward_step(st, lr, zero);
    release_model(module);
    Py_RETURN_NONE;
}

/* Copy between the model and the caller's float64 vector `arg` of n numbers
 * (to_caller: into it; else from it, refusing inf and NaN). */
static PyObject *
copy_vector(PyObject *module, PyObject *const *args, Py_ssize_t nargs, const char *func,
            const char *arg, int to_caller, Py_ssize_t n, void (*read)(const void *, double *),
            void (*write)(void *, const double *))
{
    NNState *st;
    Py_buffer view;
    if (!check_nargs(func, nargs, 1, 1) ||
        get_float64_buffer(args[0], &view, func, arg, 1, -1, n, -1, to_caller) < 0)
        return NULL;
    if (!to_caller) {
        const long i = first_non_finite((const double *)view.buf, (long)n);
        if (i >= 0) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "%s(): %s[%ld] is not finite", func, arg, i);
            return NULL;
        }
    }
    if ((st = take_model(module)) == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (to_caller)
        read(st, (double *)view.buf);
    else
        write(st, (const double *)view.buf);
    release_model(module);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

#define COPY_ENTRY(name, arg, n, read, write, doc)                                        \
    PyDoc_STRVAR(name##_doc, #name "(" arg ")\n--\n\n" doc);                              \
    static PyObject *                                                                     \
    py_##name(PyObject *module, PyObject *const *args, Py_ssize_t nargs)                  \
    {                                                                                     \
        return copy_vector(module, args, nargs, #name, arg, (read) != NULL, n, read, write); \
    }

COPY_ENTRY(read_params, "out", N_PARAMS, nn_read_params, NULL, "Copy the parameters into out.")
COPY_ENTRY(write_params, "values", N_PARAMS, NULL, nn_write_params, "Set the parameters (finite numbers).")
COPY_ENTRY(read_grads, "out", N_PARAMS, nn_read_grads, NULL, "Copy the parameter gradients into out.")
COPY_ENTRY(read_input_grads, "out", N_INPUTS, nn_read_input_grads, NULL,
           "Copy the inputs' gradients into out (0 unless compiled with input gradients).")
COPY_ENTRY(read_outputs, "out", N_OUTPUTS, nn_read_outputs, NULL,
           "Copy the outputs of the last forward() into out (NaN for the positions of a\n"
           "sequence it did not run).")
COPY_ENTRY(read_state, "out", STATE_SIZE, nn_read_state, NULL,
           "Copy the optimizer's state (its step count, then its vectors) into out.")
COPY_ENTRY(write_state, "values", STATE_SIZE, NULL, nn_write_state, "Set the optimizer's state.")
COPY_ENTRY(read_data, "out", ROW_VALUES + N_SHARED, nn_read_data, NULL,
           "Copy the row's values, then the parameters and constants, into out (for debugging).")

PyDoc_STRVAR(train_batch_doc, "train_batch(X, lr=None)\n--\n\n"
             "Zero the gradients, run forward and backward on every row of X [rows, n_inputs]\n"
             "(adding the gradients in row order), then take one step on their mean:\n"
             "p -= lr * (grad / rows), or the compiled optimizer's step. Returns the mean loss.\n"
             "Refuses rows that are not finite. The GIL is released while it runs.");

static PyObject *
py_train_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double lr, loss = 0.0;
    long bad = -1;
    int status;
    Py_buffer view;
    NNState *st;
    if (!check_nargs("train_batch", nargs, 1, 2) ||
        get_lr("train_batch", nargs > 1 ? args[1] : Py_None, &lr, 1) < 0 ||
        get_float64_buffer(args[0], &view, "train_batch", "X", 2, -1, N_INPUTS, -1, 0) < 0)
        return NULL;
    const long rows = (long)view.shape[0];
    if (rows == 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "train_batch(): X has no rows");
        return NULL;
    }
    if ((st = take_model(module)) == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = nn_train_batch(st, rows, (const double *)view.buf, lr, &loss, &bad);
    Py_END_ALLOW_THREADS
    release_model(module);
    PyBuffer_Release(&view);
    if (status == NN_ENOMEM)
        return PyErr_NoMemory();
    if (status == NN_ENONFINITE) {
        PyErr_Format(PyExc_ValueError, "train_batch(): X[%ld, %ld] is not finite; "
                     "nothing was changed", bad / (N_INPUTS > 0 ? N_INPUTS : 1), bad % (N_INPUTS > 0 ? N_INPUTS : 1));
        return NULL;
    }
    return PyFloat_FromDouble(loss);
}

PyDoc_STRVAR(predict_doc, "predict(X, out)\n--\n\n"
             "Forward on every row of X [rows, n_inputs or n_features], the outputs into the\n"
             "rows of out [rows, n_outputs]. The GIL is released while it runs.");

static PyObject *
py_predict(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer xv, ov;
    NNState *st;
    if (!check_nargs("predict", nargs, 2, 2) ||
        get_float64_buffer(args[0], &xv, "predict", "X", 2, -1, N_INPUTS, N_FEATURES, 0) < 0)
        return NULL;
    if (get_float64_buffer(args[1], &ov, "predict", "out", 2, xv.shape[0], N_OUTPUTS, -1, 1) < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    if ((st = take_model(module)) == NULL) {
        PyBuffer_Release(&ov);
        PyBuffer_Release(&xv);
        return NULL;
    }
    const long rows = (long)xv.shape[0];
    const int cols = (int)xv.shape[1];
    Py_BEGIN_ALLOW_THREADS
    nn_predict_columns(st, rows, cols, (const double *)xv.buf, (double *)ov.buf);
    Py_END_ALLOW_THREADS
    release_model(module);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&xv);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_threads_doc, "get_threads()\n--\n\nThe threads train_batch and predict may use.");

static PyObject *
py_get_threads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NNState *st;
    if (!check_nargs("get_threads", nargs, 0, 0) || (st = take_model(module)) == NULL)
        return NULL;
    const int n = nn_get_threads(st);
    release_model(module);
    return PyLong_FromLong(n);
}

PyDoc_STRVAR(set_threads_doc, "set_threads(n)\n--\n\n"
             "Let train_batch and predict use up to n threads (1 to max_threads); the results\n"
             "are the same bits for every n. Small batches use fewer.");

static PyObject *
py_set_threads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    NNState *st;
    long n;
    if (!check_nargs("set_threads", nargs, 1, 1) || get_count("set_threads", "n", args[0], 1, MAX_THREADS, &n) < 0 ||
        (st = take_model(module)) == NULL)
        return NULL;
    const int status = nn_set_threads(st, (int)n);
    release_model(module);
    if (status != NN_OK)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(kernel_macs_doc, "kernel_macs()\n--\n\n"
             "(forward, input_grad, weight_grad): the multiply-adds the MatVec loops ran since\n"
             "the last call (after skipping zeros), then set to 0. For benchmarks.");

static PyObject *
py_kernel_macs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long n[3] = {0, 0, 0};
    if (!check_nargs("kernel_macs", nargs, 0, 0) || take_model(module) == NULL)
        return NULL;
#ifdef HAVE_MATVEC
    for (int i = 0; i < 3; i++) {
        n[i] = mv_macs[i];
        mv_macs[i] = 0;
    }
#endif
    release_model(module);
    return Py_BuildValue("(KKK)", n[0], n[1], n[2]);
}

/* ---- module definition ------------------------------------------------------------------------ */

#define METHOD(name) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, name##_doc}
#define METHOD_KW(name) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL | METH_KEYWORDS, name##_doc}

static PyMethodDef nn_methods[] = {
    METHOD(set_input), METHOD(forward), METHOD(backward), METHOD(zero_grad), METHOD(update),
    METHOD_KW(step), METHOD_KW(backward_step), METHOD(train_batch), METHOD(predict), METHOD(read_params),
    METHOD(write_params), METHOD(read_grads), METHOD(read_input_grads), METHOD(read_outputs),
    METHOD(read_state), METHOD(write_state), METHOD(read_data), METHOD(get_threads),
    METHOD(set_threads), METHOD(kernel_macs),
    {NULL, NULL, 0, NULL}
};

static int
nn_exec(PyObject *module)
{
    ModuleState *ms = (ModuleState *)PyModule_GetState(module);
    const int status = nn_init(&ms->nn);
    if (status == NN_EKERNELS) {
        PyErr_Format(PyExc_ValueError, "MICROGRAD_KERNELS must be one of %s (or unset), not '%s'",
                     NN_KERNELS_ALLOWED, getenv("MICROGRAD_KERNELS"));
        return -1;
    }
    if (status == NN_ENARROWER) {
        PyErr_SetString(PyExc_ValueError, "this module's loops were built for wider instruction sets than "
                        "this CPU or $MICROGRAD_KERNELS allows: compile the model again where and as it runs "
                        "(compiler.compile() builds the loops it picks)");
        return -1;
    }
    if (status != NN_OK) {
        PyErr_NoMemory();
        return -1;
    }
    ms->open = 1;
    pthread_mutex_init(&ms->lock, NULL);
    ms->pid = getpid();
    NNState *st = &ms->nn;
    if (PyModule_AddIntConstant(module, "n_inputs", N_INPUTS) < 0 ||
        PyModule_AddIntConstant(module, "n_params", N_PARAMS) < 0 ||
        PyModule_AddIntConstant(module, "n_outputs", N_OUTPUTS) < 0 ||
        PyModule_AddIntConstant(module, "n_features", N_FEATURES) < 0 ||
        PyModule_AddIntConstant(module, "n_data", ROW_VALUES + N_SHARED) < 0 ||
        PyModule_AddIntConstant(module, "positions", POSITIONS) < 0 ||
        PyModule_AddIntConstant(module, "max_threads", MAX_THREADS) < 0 ||
        PyModule_AddStringConstant(module, "kernels", nn_kernels(st)) < 0 ||
        PyModule_AddIntConstant(module, "state_size", STATE_SIZE) < 0 ||
        PyModule_AddStringConstant(module, "optimizer", OPT_NAME) < 0 ||
        PyModule_AddStringConstant(module, "program_hash", NN_PROGRAM_HASH) < 0 ||
        PyModule_AddStringConstant(module, "graph_hash", NN_GRAPH_HASH) < 0)
        return -1;
    PyObject *features = PyTuple_New(N_FEATURES);
    if (features == NULL)
        return -1;
    for (int j = 0; j < N_FEATURES; j++) {
        PyObject *item = PyLong_FromLong(FEATURES[j]);
        if (item == NULL || PyTuple_SetItem(features, j, item) < 0) {
            Py_DECREF(features);
            return -1;
        }
    }
    if (PyModule_AddObject(module, "features", features) < 0) {
        Py_DECREF(features);
        return -1;
    }
    return 0;
}

static void
nn_free(void *module)
{
    ModuleState *ms = (ModuleState *)PyModule_GetState((PyObject *)module);
    if (ms == NULL || !ms->open)
        return;
    nn_release(&ms->nn);
    ms->open = 0;
}

static PyModuleDef_Slot nn_slots[] = {
    {Py_mod_exec, (void *)nn_exec},
    {0, NULL}
};

PyDoc_STRVAR(nn_doc, "One compiled micrograd graph: forward, backward and training over flat float64 arrays.");

static struct PyModuleDef nn_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "nn",
    .m_doc = nn_doc,
    .m_size = sizeof(ModuleState),
    .m_methods = nn_methods,
    .m_slots = nn_slots,
    .m_free = nn_free,
};

PyMODINIT_FUNC
PyInit_nn(void)
{
    return PyModuleDef_Init(&nn_module);
}
