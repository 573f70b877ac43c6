/* ---- args.c: the Python module's arguments, checked and converted -------------
 *
 * Every refusal names the function and the argument and changes nothing.
 * Conversions can run Python code (a __float__ method), so module.c converts
 * every argument before it takes the model. */
#ifndef NN_AMALGAMATION
#include "args.h"
#endif

static int
check_nargs(const char *func, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most)
{
    if (nargs < least || nargs > most) {
        if (least == most)
            PyErr_Format(PyExc_TypeError, "%s() takes %zd argument%s (%zd given)",
                         func, least, least == 1 ? "" : "s", nargs);
        else
            PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)",
                         func, least, most, nargs);
        return 0;
    }
    return 1;
}

/* Whether a buffer format string means a native float64. '<' and '>' name a
 * byte order, which is only acceptable when it is this machine's. */
static int
is_float64_format(const char *fmt)
{
    const unsigned one = 1;
    const int little = *(const unsigned char *)&one == 1;
    if (fmt[0] == '@' || fmt[0] == '=' || (fmt[0] == '<' && little) || (fmt[0] == '>' && !little))
        fmt++;
    return strcmp(fmt, "d") == 0;
}

/* Fill `view` with a C-contiguous float64 buffer of `ndim` dimensions: the
 * argument `arg` of `func`. `rows` (when >= 0) is the required length of
 * the first dimension; the last must be `cols`, or `cols2` when that is
 * >= 0. The buffer is released on every error path; on success the caller
 * releases it. */
static int
get_float64_buffer(PyObject *obj, Py_buffer *view, const char *func, const char *arg,
                   int ndim, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t cols2, int writable)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;     /* e.g. a released memoryview: its own ValueError says it best */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s(): %s must be a %s float64 buffer (numpy array, array('d'), memoryview)%s, not %R",
                     func, arg, ndim == 1 ? "1-D" : "2-D",
                     strcmp(func, "set_input") == 0 ? " or a list of numbers" : "",
                     (PyObject *)Py_TYPE(obj));
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (!is_float64_format(fmt) || view->itemsize != 8) {
        PyErr_Format(PyExc_TypeError,
                     "%s(): %s must hold float64 values (format 'd'), got format '%s' with itemsize %zd",
                     func, arg, fmt, view->itemsize);
        goto fail;
    }
    if (view->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must be %d-dimensional, got %d dimension%s",
                     func, arg, ndim, view->ndim, view->ndim == 1 ? "" : "s");
        goto fail;
    }
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): %s must be C-contiguous (use numpy.ascontiguousarray)", func, arg);
        goto fail;
    }
    if (writable && view->readonly) {
        PyErr_Format(PyExc_ValueError, "%s(): %s is read-only; it must be writable", func, arg);
        goto fail;
    }
    if (rows >= 0 && view->shape[0] != rows) {
        PyErr_Format(PyExc_ValueError, "%s(): %s has %zd rows, expected %zd (one per row of X)",
                     func, arg, view->shape[0], rows);
        goto fail;
    }
    const Py_ssize_t last = view->shape[ndim - 1];
    if (last != cols && (cols2 < 0 || last != cols2)) {
        if (cols2 >= 0 && cols2 != cols)
            PyErr_Format(PyExc_ValueError, "%s(): %s has %zd columns, expected %zd (every input) "
                         "or %zd (the inputs the outputs depend on)", func, arg, last, cols, cols2);
        else
            PyErr_Format(PyExc_ValueError, "%s(): %s has %zd %s, expected %zd", func, arg,
                         last, ndim == 1 ? "values" : "columns", cols);
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(view);
    return -1;
}

/* `obj` as a double. A TypeError or OverflowError from the conversion is
 * replaced by one naming the argument; anything else (an exception raised by
 * the object's own __float__, a KeyboardInterrupt) is passed on as it is. */
static int
get_double(PyObject *obj, double *x, const char *func, const char *arg, Py_ssize_t index)
{
    *x = PyFloat_AsDouble(obj);
    if (*x != -1.0 || !PyErr_Occurred())
        return 0;
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        if (index >= 0)
            PyErr_Format(PyExc_TypeError, "%s(): %s[%zd] must be a real number, not %R",
                         func, arg, index, (PyObject *)Py_TYPE(obj));
        else
            PyErr_Format(PyExc_TypeError, "%s(): %s must be a real number, not %R",
                         func, arg, (PyObject *)Py_TYPE(obj));
    } else if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s(): %s is too large for a float64", func, arg);
    }
    return -1;
}

/* A learning rate: a finite, non-negative number (not a bool: True is no
 * rate); None (when allowed) means the optimizer's own. */
static int
get_lr(const char *func, PyObject *obj, double *lr, int none_ok)
{
    if (obj == Py_None && none_ok) {
        if (OPT_KIND == OPT_NONE) {
            PyErr_Format(PyExc_TypeError, "%s(): lr is required: this module was compiled "
                         "without an optimizer", func);
            return -1;
        }
        *lr = OPT_LR;
        return 0;
    }
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): lr must be a real number, not bool", func);
        return -1;
    }
    if (get_double(obj, lr, func, "lr", -1) < 0)
        return -1;
    if (!isfinite(*lr) || *lr < 0.0) {
        PyErr_Format(PyExc_ValueError, "%s(): lr must be finite and >= 0, got %R", func, obj);
        return -1;
    }
    return 0;
}

/* A count from `least` to `most`: an int (or an object with __index__), not a
 * bool. */
static int
get_count(const char *func, const char *arg, PyObject *obj, long least, long most, long *n)
{
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, not bool", func, arg);
        return -1;
    }
    int overflow = 0;
    *n = -1;
    PyObject *index = PyNumber_Index(obj);
    if (index != NULL) {
        *n = PyLong_AsLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    }
    if (*n == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, not %R", func, arg, (PyObject *)Py_TYPE(obj));
        return -1;
    }
    if (overflow || *n < least || *n > most) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must be from %ld to %ld, got %R", func, arg, least, most, obj);
        return -1;
    }
    return 0;
}

/* Convert a list or tuple of N_INPUTS numbers into `out`. Items are held by
 * strong references while they convert: a __float__ may change the list. */
static int
get_number_list(PyObject *obj, double *out)
{
    Py_ssize_t n = PySequence_Size(obj);
    if (n < 0)
        return -1;
    if (n != N_INPUTS) {
        PyErr_Format(PyExc_ValueError, "set_input(): values has %zd values, expected %d",
                     n, N_INPUTS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        if (item == NULL) {
            if (PyErr_ExceptionMatches(PyExc_IndexError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "set_input(): values changed size while it was read");
            }
            return -1;
        }
        int failed = get_double(item, &out[i], "set_input", "values", i) < 0;
        Py_DECREF(item);
        if (failed)
            return -1;
    }
    return 0;
}
