/* ---- args.h: what args.c gives the CPython module ---------------------------- */
#ifndef NN_ARGS_H
#define NN_ARGS_H
#ifndef NN_AMALGAMATION
#define NN_PYTHON 1
#include "state.h"
#endif

/* A TypeError naming func unless least <= nargs <= most. */
static int check_nargs(const char *func, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most);
/* A C-contiguous float64 buffer of ndim dimensions, rows x cols (or cols2). */
static int get_float64_buffer(PyObject *obj, Py_buffer *view, const char *func, const char *arg,
                              int ndim, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t cols2, int writable);
/* A finite learning rate >= 0 (None, when allowed: the optimizer's own). */
static int get_lr(const char *func, PyObject *obj, double *lr, int none_ok);
/* An int (not a bool) from least to most. */
static int get_count(const char *func, const char *arg, PyObject *obj, long least, long most, long *n);
/* N_INPUTS numbers from a list or tuple. */
static int get_number_list(PyObject *obj, double *out);
#endif
