/* The tracer's walk over a micrograd ``Value`` graph, in C (compiler/walk.py
 * builds it once, cached like the generated modules, and compiler/trace.py
 * uses it when it loads; its Python twin is ``trace._Walk``).
 *
 * Python API (the module is loaded as ``nn``, the name compiler/load.py and
 * the build's load check give every module they build):
 *
 *     walk(value_type, constant_type, declared, loss, outputs, op_codes, arities, pow_code,
 *          lookup, want_slots) -> tuple or None
 *
 * It numbers the Values reachable from ``loss``, then from ``outputs``,
 * exactly as ``micrograd.engine.topological_order`` orders them (depth
 * first, children in ``_prev`` order, post-order; a Value is visited when
 * it is first met), and returns
 *
 *     (code: bytes of int8, a: bytes of int64, b: bytes of int64, k: {op index: exponent},
 *      constants: bytes of double, made_leaves: [Value], n_cone: int,
 *      looked_up: bytes of int64 (the number of each Value of ``lookup``),
 *      labels: [(number, label)], slots: {Value: number} or None)
 *
 * over ``trace._Walk``'s provisional numbers: a leaf is ``-1 - slot`` (the
 * ``declared`` inputs and parameters first, then the constants as they are
 * met), the i-th computed Value is i, a unary op's ``b`` is NO_OPERAND.
 *
 *     leaves_ok(value_type, constant_type, values) -> bool
 *
 * says whether every Value of ``values`` is a leaf as ``trace._check_leaves``
 * wants it, none listed twice (False: that function looks, and says what is
 * wrong).
 *
 *     mark_readers(flags, out, a, b, start, stop) -> None
 *     cones_hold(live, out, a, b, cuts) -> bool
 *     mark_operands(live, out, a, b, start, stop) -> None
 *     reads_out_of_order(matters, a, b, pos) -> list
 *     loop_periods(...), min_index_order(order, ptr, deps) -> int
 *     fold_chains(plus, a, b, producer, uses, members, terms, starts) -> int
 *     count_reads(uses, a, b) -> None
 *     hex_repr(values, first) -> bytes
 *
 * are loops of the passes over the program's arrays (see below).
 *
 * It reads only the happy path: Values of exactly ``value_type`` or
 * ``constant_type`` (their ``__slots__`` read at their offsets), a tuple
 * ``_prev``, a str ``_op`` of ``op_codes`` of the right arity, a float
 * ``_data``, a float or int exponent. Anything else (a node of another type,
 * a cycle, an unknown op, a leaf with an op, ...) returns None, and the
 * Python walk runs instead, so that every error is the Python walk's own.
 * No Python code of the user's runs in here (no attribute lookup, no
 * __hash__: Values are told apart by address, as the interpreter's sets of
 * Values without __eq__ do), so the graph cannot change under the walk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <sys/mman.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__TINYC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

#define PENDING ((int64_t)1 << 62)          /* on the stack: met as an operand, a cycle */
#define NO_OPERAND (-((int64_t)1 << 62))

/* -- a table of numbers by address (open addressing, linear probing) ----- */

typedef struct {
    PyObject *key;
    int64_t number;
} Entry;

typedef struct {
    Entry *entries;
    size_t mask, used;
    size_t grown;             /* times it grew: entries moved */
} Table;

static size_t
hash_address(const PyObject *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p >> 4;
    return (size_t)(x ^ (x >> 22));
}

static Entry *
table_find(const Table *t, const PyObject *key)
{
    size_t i = hash_address(key) & t->mask;
    while (t->entries[i].key != NULL && t->entries[i].key != key)
        i = (i + 1) & t->mask;
    return &t->entries[i];
}

static int
table_init(Table *t, size_t capacity)
{
    size_t n = 1024;
    while (n < 2 * capacity)
        n *= 2;
    t->entries = NULL;
#ifdef MADV_HUGEPAGE
    /* A large table on huge pages: its probes land anywhere in it (16
       bytes an entry, twice the Values: 256 MB for 6.5 million), and with
       4 KB pages most of them missed the TLB too. 10-30% of the walk. */
    const size_t bytes = n * sizeof(Entry), huge = (size_t)2 << 20;
    void *p;
    if (bytes >= huge && posix_memalign(&p, huge, bytes) == 0) {
        madvise(p, bytes, MADV_HUGEPAGE);
        t->entries = memset(p, 0, bytes);
    }
#endif
    if (t->entries == NULL)
        t->entries = calloc(n, sizeof(Entry));
    t->mask = n - 1;
    t->used = 0;
    return t->entries ? 0 : -1;
}

/* Enter ``key`` (not yet present) with ``number``: its entry, or NULL (no
   memory). Keeps the load below 1/2: growing moves every entry. */
static Entry *
table_put(Table *t, PyObject *key, int64_t number)
{
    if (2 * (t->used + 1) > t->mask + 1) {
        Table bigger;
        if (table_init(&bigger, 2 * (t->mask + 1)) < 0)
            return NULL;
        for (size_t i = 0; i <= t->mask; i++)
            if (t->entries[i].key != NULL)
                *table_find(&bigger, t->entries[i].key) = t->entries[i];
        bigger.used = t->used;
        bigger.grown = t->grown + 1;
        free(t->entries);
        *t = bigger;
    }
    Entry *e = table_find(t, key);
    e->key = key;
    e->number = number;
    t->used++;
    return e;
}

static int
table_add(Table *t, PyObject *key, int64_t number)
{
    return table_put(t, key, number) ? 0 : -1;
}

/* -- growable arrays ------------------------------------------------------ */

/* In malloc'd memory, or (``owner``) in a bytearray that is handed to
   Python as it is: numpy then reads the walk's op arrays in place, and no
   copy of them is made (each would be fresh memory the kernel zeroes page
   by page, 52 MB an array at microgpt 64/4/4). */
typedef struct {
    char *data;
    size_t size, capacity;     /* in bytes */
    PyObject *owner;           /* the bytearray holding data, or NULL */
} Buffer;

static int
buffer_grow(Buffer *b, size_t need)
{
    size_t capacity = b->capacity ? 2 * b->capacity : 4096;
    while (capacity < need)
        capacity *= 2;
    if (b->owner != NULL) {
        if (PyByteArray_Resize(b->owner, (Py_ssize_t)capacity) < 0) {
            PyErr_Clear();
            return -1;
        }
        b->data = PyByteArray_AS_STRING(b->owner);
    } else {
        char *data = realloc(b->data, capacity);
        if (data == NULL)
            return -1;
        b->data = data;
    }
    b->capacity = capacity;
    return 0;
}

static int
buffer_push(Buffer *b, const void *item, size_t n)
{
    if (b->size + n > b->capacity && buffer_grow(b, b->size + n) < 0)
        return -1;
    memcpy(b->data + b->size, item, n);
    b->size += n;
    return 0;
}

/* A buffer whose items go to Python in a bytearray; -1: no memory. */
static int
buffer_for_python(Buffer *b)
{
    b->owner = PyByteArray_FromStringAndSize(NULL, 0);
    return b->owner != NULL ? 0 : -1;
}

/* The bytearray of ``b``'s items (a new reference; ``b`` is left empty),
   or NULL with an exception set. */
static PyObject *
buffer_take(Buffer *b)
{
    PyObject *owner = b->owner;
    if (PyByteArray_Resize(owner, (Py_ssize_t)b->size) < 0)
        return NULL;
    b->owner = NULL;
    b->data = NULL;
    b->size = b->capacity = 0;
    return owner;
}

static void
buffer_free(Buffer *b)
{
    if (b->owner != NULL)
        Py_DECREF(b->owner);
    else
        free(b->data);
}

#define PUSH(buffer, type, value) do { type item_ = (value); \
        if (buffer_push(&(buffer), &item_, sizeof item_) < 0) goto no_memory; } while (0)

/* -- the walk ----------------------------------------------------------- */

typedef struct {
    PyTypeObject *value_type, *constant_type;
    Py_ssize_t prev, op, arg, data, label;     /* offsets of the __slots__ */
    PyObject *op_codes;                        /* {name: code} */
    int arities[64];
    Py_ssize_t n_codes;
    long pow_code;
    int64_t n_declared;
    Table seen;                                /* Value -> provisional number */
    int want_slots;
    Buffer order;                              /* the Values in the order they were met (want_slots) */
    Buffer labels;                             /* Label: the labelled Values' numbers and labels */
    Buffer code, a, b, constants;
    PyObject *k, *made_leaves;
    Buffer frames;                             /* Frame: the walk's stack */
} Walk;

/* A Value on the walk's stack. */
typedef struct {
    PyObject *v;
    Entry *entry;             /* its entry in the table (found again when the table grows) */
    Py_ssize_t next;          /* its next operand to look at */
    int64_t operand[2];       /* the numbers of its first two operands, as they are found */
} Frame;

#define SLOT(v, offset) (*(PyObject **)((char *)(v) + (offset)))

typedef struct {
    int64_t number;
    PyObject *label;          /* a new reference */
} Label;

/* Notes ``v``'s label, if it is a str that is not empty (as trace.py's
   ``v.label and type(v.label) is str``), while ``v`` is at hand. */
static int
note_label(Walk *w, PyObject *v, int64_t number)
{
    PyObject *label = SLOT(v, w->label);
    if (label == NULL || !PyUnicode_CheckExact(label) || PyUnicode_GET_LENGTH(label) == 0)
        return 0;
    Label item = {number, label};
    if (buffer_push(&w->labels, &item, sizeof item) < 0)
        return -1;
    Py_INCREF(label);
    return 0;
}

static int
is_value(const Walk *w, PyObject *v)
{
    return Py_IS_TYPE(v, w->value_type) || Py_IS_TYPE(v, w->constant_type);
}

/* The offset of the __slots__ member ``name`` of ``type``, or -1. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    Py_ssize_t offset = -1;
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if ((m->type == T_OBJECT_EX || m->type == T_OBJECT) && !(m->flags & READONLY))
            offset = m->offset;
    }
    Py_DECREF(d);
    return offset;
}

/* Reads the offsets of the Value type's own slots (a subclass such as
   Constant has them at the same offsets); 0 when they are not all plain
   writable object slots. */
static int
knows_value_type(Walk *w)
{
    w->prev = slot_offset(w->value_type, "_prev");
    w->op = slot_offset(w->value_type, "_op");
    w->arg = slot_offset(w->value_type, "_arg");
    w->data = slot_offset(w->value_type, "_data");
    w->label = slot_offset(w->value_type, "label");
    return w->prev >= 0 && w->op >= 0 && w->arg >= 0 && w->data >= 0 && w->label >= 0
           && PyType_IsSubtype(w->constant_type, w->value_type);
}

/* 1 when the walk read ``v`` as the Python walk would; 0: leave it to Python;
   -1: out of memory (an exception is set). */
typedef int Status;

/* ``v`` met for the first time: numbered PENDING until it finishes, and
   pushed on the stack. */
static Status
meet(Walk *w, PyObject *v)
{
    if (!is_value(w, v))
        return 0;
    PyObject *prev = SLOT(v, w->prev);
    if (prev == NULL || !PyTuple_CheckExact(prev))
        return 0;
    size_t grown = w->seen.grown;
    Frame frame = {v, table_put(&w->seen, v, PENDING), 0, {NO_OPERAND, NO_OPERAND}};
    if (frame.entry == NULL)
        return -1;
    if (w->seen.grown != grown) {       /* the entries moved: find the stack's again */
        Frame *frames = (Frame *)w->frames.data;
        for (size_t i = 0; i < w->frames.size / sizeof(Frame); i++)
            frames[i].entry = table_find(&w->seen, frames[i].v);
    }
    if (buffer_push(&w->frames, &frame, sizeof frame) < 0)
        return -1;
    /* Its operands, and their places in the table, are read soon: the
       graph's Values lie anywhere in memory, so start fetching them now. */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prev); i++) {
        PyObject *c = PyTuple_GET_ITEM(prev, i);
        PREFETCH(c);
        PREFETCH(&w->seen.entries[hash_address(c) & w->seen.mask]);
    }
    if (w->want_slots && buffer_push(&w->order, &v, sizeof v) < 0)
        return -1;
    return 1;
}

/* A real number as ``trace._real`` reads it, or 0 to leave it to Python. */
static int
real(PyObject *x, double *out)
{
    if (x != NULL && PyFloat_CheckExact(x)) {
        *out = PyFloat_AS_DOUBLE(x);
        return 1;
    }
    if (x != NULL && PyLong_CheckExact(x)) {
        double d = PyLong_AsDouble(x);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        *out = d;
        return 1;
    }
    return 0;
}

/* ``f``'s Value has its operands numbered (``f->operand``): number it (``*number``). */
static Status
finish(Walk *w, const Frame *f, int64_t *number)
{
    PyObject *v = f->v, *prev = SLOT(v, w->prev), *name = SLOT(v, w->op);
    Py_ssize_t n = PyTuple_GET_SIZE(prev);
    Entry *e = f->entry;
    if (n == 0) {
        double data;
        if (name == NULL || !PyUnicode_CheckExact(name) || PyUnicode_GET_LENGTH(name) != 0)
            return 0;
        if (!real(SLOT(v, w->data), &data) || !PyFloat_CheckExact(SLOT(v, w->data)))
            return 0;
        PUSH(w->constants, double, data);
        if (!Py_IS_TYPE(v, w->constant_type) && PyList_Append(w->made_leaves, v) < 0)
            return -1;
        e->number = *number = -1 - (w->n_declared + (int64_t)(w->constants.size / sizeof(double)) - 1);
        return note_label(w, v, e->number) < 0 ? -1 : 1;
    }
    if (name == NULL || !PyUnicode_CheckExact(name))
        return 0;
    PyObject *found = PyDict_GetItemWithError(w->op_codes, name);
    if (found == NULL) {
        if (PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    long code = PyLong_AsLong(found);
    if (code < 0 || code >= w->n_codes || w->arities[code] != n)
        return 0;
    int64_t x = f->operand[0], y = n == 2 ? f->operand[1] : NO_OPERAND;
    int64_t index = (int64_t)w->code.size;
    if (code == w->pow_code) {
        double k;
        if (!real(SLOT(v, w->arg), &k))
            return 0;
        PyObject *key = PyLong_FromLongLong(index), *value = PyFloat_FromDouble(k);
        int failed = key == NULL || value == NULL || PyDict_SetItem(w->k, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed)
            return -1;
    }
    PUSH(w->code, int8_t, (int8_t)code);
    PUSH(w->a, int64_t, x);
    PUSH(w->b, int64_t, y);
    e->number = *number = index;
    return note_label(w, v, index) < 0 ? -1 : 1;
no_memory:
    PyErr_NoMemory();
    return -1;
}

/* Walk from each root of ``roots`` (a list) in turn. Each operand is
   looked up once, as it is met: its number (if it has one) goes straight
   into its user's frame, or, once it finishes, from its own frame. */
static Status
walk_from(Walk *w, PyObject *roots)
{
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(roots); r++) {
        PyObject *root = PyList_GET_ITEM(roots, r);
        if (table_find(&w->seen, root)->key != NULL)
            continue;
        w->frames.size = 0;
        Status s = meet(w, root);
        if (s <= 0)
            return s;
        while (w->frames.size) {
            Frame *f = (Frame *)(w->frames.data + w->frames.size) - 1;
            PyObject *prev = SLOT(f->v, w->prev), *child = NULL;
            Py_ssize_t n = PyTuple_GET_SIZE(prev);
            while (f->next < n) {
                Py_ssize_t i = f->next++;
                PyObject *c = PyTuple_GET_ITEM(prev, i);
                const Entry *e = table_find(&w->seen, c);
                if (e->key == NULL) {
                    child = c;
                    break;
                }
                if (e->number == PENDING)
                    return 0;           /* on the stack: a cycle (the Python walk says so) */
                if (i < 2)
                    f->operand[i] = e->number;
            }
            if (child != NULL) {
                s = meet(w, child);     /* (f may move) */
                if (s <= 0)
                    return s;
                continue;
            }
            Frame done = *f;
            int64_t number;
            w->frames.size -= sizeof(Frame);
            s = finish(w, &done, &number);
            if (s <= 0)
                return s;
            if (w->frames.size) {       /* its user: the frame below, at the operand just taken */
                Frame *user = (Frame *)(w->frames.data + w->frames.size) - 1;
                if (user->next - 1 < 2)
                    user->operand[user->next - 1] = number;
            }
        }
    }
    return 1;
}

static PyObject *
bytes_of(const Buffer *b)
{
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->size);
}

/* The walk's results (see the header), or NULL with an exception set. */
static PyObject *
results(Walk *w, Py_ssize_t n_cone, PyObject *lookup, int want_slots)
{
    PyObject *labels = NULL, *slots = NULL, *looked_up = NULL, *out = NULL;
    Buffer numbers = {0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lookup); i++) {
        Entry *e = table_find(&w->seen, PyList_GET_ITEM(lookup, i));
        PUSH(numbers, int64_t, e->key != NULL ? e->number : PENDING);
    }
    looked_up = bytes_of(&numbers);
    labels = PyList_New(0);
    slots = want_slots ? PyDict_New() : (Py_INCREF(Py_None), Py_None);
    if (looked_up == NULL || labels == NULL || slots == NULL)
        goto done;
    Label *noted = (Label *)w->labels.data;
    for (size_t i = 0; i < w->labels.size / sizeof(Label); i++) {
        PyObject *pair = Py_BuildValue("(LO)", (long long)noted[i].number, noted[i].label);
        if (pair == NULL || PyList_Append(labels, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
    }
    PyObject **order = (PyObject **)w->order.data;
    for (size_t i = 0; want_slots && i < w->order.size / sizeof(PyObject *); i++) {
        PyObject *v = order[i], *n = PyLong_FromLongLong(table_find(&w->seen, v)->number);
        if (n == NULL || PyDict_SetItem(slots, v, n) < 0) {
            Py_XDECREF(n);
            goto done;
        }
        Py_DECREF(n);
    }
    PyObject *code = buffer_take(&w->code), *a = buffer_take(&w->a), *b = buffer_take(&w->b);
    if (code != NULL && a != NULL && b != NULL) {
        out = Py_BuildValue("(NNNONOnNOO)", code, a, b, w->k, bytes_of(&w->constants), w->made_leaves,
                            n_cone, looked_up, labels, slots);
        looked_up = NULL;
    } else {
        Py_XDECREF(code);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
done:
    free(numbers.data);
    Py_XDECREF(looked_up);
    Py_XDECREF(labels);
    Py_XDECREF(slots);
    return out;
no_memory:
    free(numbers.data);
    return PyErr_NoMemory();
}

static PyObject *
walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 10 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyList_CheckExact(args[2])
            || !PyList_CheckExact(args[4]) || !PyDict_CheckExact(args[5]) || !PyList_CheckExact(args[6])
            || !PyList_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError, "walk(value_type, constant_type, declared: list, loss, outputs: list, "
                        "op_codes: dict, arities: list, pow_code, lookup: list, want_slots)");
        return NULL;
    }
    Walk w;
    memset(&w, 0, sizeof w);
    w.value_type = (PyTypeObject *)args[0];
    w.constant_type = (PyTypeObject *)args[1];
    PyObject *declared = args[2], *loss = args[3], *outputs = args[4], *lookup = args[8];
    w.op_codes = args[5];
    w.n_codes = PyList_GET_SIZE(args[6]);
    w.pow_code = PyLong_AsLong(args[7]);
    int want_slots = PyObject_IsTrue(args[9]);
    w.want_slots = want_slots;
    if (w.n_codes > 64 || (w.pow_code == -1 && PyErr_Occurred()) || want_slots < 0) {
        PyErr_SetString(PyExc_ValueError, "walk: at most 64 op codes, an int pow_code");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < w.n_codes; i++)
        w.arities[i] = (int)PyLong_AsLong(PyList_GET_ITEM(args[6], i));
    if (PyErr_Occurred())
        return NULL;
    if (!knows_value_type(&w))
        Py_RETURN_NONE;         /* not the Value this walk knows: the Python walk reads it */

    PyObject *out = NULL;
    Status s = -1;
    w.k = PyDict_New();
    w.made_leaves = PyList_New(0);
    if (w.k == NULL || w.made_leaves == NULL || buffer_for_python(&w.code) < 0
            || buffer_for_python(&w.a) < 0 || buffer_for_python(&w.b) < 0
            || table_init(&w.seen, 2 * (size_t)PyList_GET_SIZE(declared) + 4096) < 0)
        goto done;
    w.n_declared = PyList_GET_SIZE(declared);
    for (Py_ssize_t i = 0; i < w.n_declared; i++) {
        PyObject *v = PyList_GET_ITEM(declared, i);
        if (!is_value(&w, v) || table_find(&w.seen, v)->key != NULL) {
            s = 0;              /* not a Value, or listed twice */
            goto done;
        }
        if (table_add(&w.seen, v, -1 - (int64_t)i) < 0 || note_label(&w, v, -1 - (int64_t)i) < 0
                || (want_slots && buffer_push(&w.order, &v, sizeof v) < 0))
            goto done;
    }
    PyObject *roots = PyList_New(1);
    if (roots == NULL)
        goto done;
    Py_INCREF(loss);
    PyList_SET_ITEM(roots, 0, loss);
    s = walk_from(&w, roots);
    Py_DECREF(roots);
    Py_ssize_t n_cone = (Py_ssize_t)w.code.size;
    if (s > 0)
        s = walk_from(&w, outputs);
    if (s > 0)
        out = results(&w, n_cone, lookup, want_slots);
done:
    if (s < 0 && !PyErr_Occurred())
        PyErr_NoMemory();
    free(w.seen.entries);
    free(w.order.data);
    for (size_t i = 0; i < w.labels.size / sizeof(Label); i++)
        Py_DECREF(((Label *)w.labels.data)[i].label);
    free(w.labels.data);
    buffer_free(&w.code);
    buffer_free(&w.a);
    buffer_free(&w.b);
    free(w.constants.data);
    free(w.frames.data);
    Py_XDECREF(w.k);
    Py_XDECREF(w.made_leaves);
    if (s == 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return out;
}

/* leaves_ok(value_type, constant_type, values: list) -> bool: whether every
   Value of ``values`` is a leaf as ``trace._check_leaves`` wants it (exactly
   of ``value_type`` or ``constant_type``, no operands, no op, float data) and
   none is listed twice. False: ``_check_leaves`` reads them and says what is
   wrong. */
static PyObject *
leaves_ok(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "leaves_ok(value_type, constant_type, values: list)");
        return NULL;
    }
    Walk w;
    memset(&w, 0, sizeof w);
    w.value_type = (PyTypeObject *)args[0];
    w.constant_type = (PyTypeObject *)args[1];
    PyObject *values = args[2];
    if (!knows_value_type(&w))
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (table_init(&w.seen, (size_t)n) < 0)
        return PyErr_NoMemory();
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        PyObject *v = PyList_GET_ITEM(values, i), *prev, *op, *data;
        ok = is_value(&w, v) && (prev = SLOT(v, w.prev)) != NULL && PyTuple_CheckExact(prev)
             && PyTuple_GET_SIZE(prev) == 0 && (op = SLOT(v, w.op)) != NULL && PyUnicode_CheckExact(op)
             && PyUnicode_GET_LENGTH(op) == 0 && (data = SLOT(v, w.data)) != NULL && PyFloat_CheckExact(data)
             && table_find(&w.seen, v)->key == NULL;
        if (ok && table_add(&w.seen, v, i) < 0) {
            free(w.seen.entries);
            return PyErr_NoMemory();
        }
    }
    free(w.seen.entries);
    return PyBool_FromLong(ok);
}

/* -- loops of the passes over the program's arrays ------------------------
 *
 * Loops the passes run over every scalar op of a large program, here
 * because Python spends about 0.1 us an op on them (compiler/ir.py and
 * compiler/vectorize.py hold their Python twins, which run for small
 * programs and without C). Their
 * arrays arrive as buffers: ``flags`` / ``live`` one byte a slot, writable;
 * ``out``, ``a``, ``b`` and ``cuts`` int64, C-contiguous. A slot outside
 * ``flags`` or an index outside the ops is a ValueError, never a stray write. */

typedef struct {
    Py_buffer view[5];
    int held;
} Buffers;

static void
buffers_release(Buffers *b)
{
    for (int i = 0; i < b->held; i++)
        PyBuffer_Release(&b->view[i]);
    b->held = 0;
}

/* Holds args[0] as writable bytes and args[1..n-1] as int64 arrays of the
   same length as args[1] (the last one's length is its own when
   ``last_free``). 0, or -1 with an exception set and nothing held. */
static int
buffers_get(Buffers *b, PyObject *const *args, int n, int last_free)
{
    b->held = 0;
    for (int i = 0; i < n; i++) {
        if (PyObject_GetBuffer(args[i], &b->view[i], i == 0 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
            buffers_release(b);
            return -1;
        }
        b->held++;
        Py_ssize_t len = b->view[i].len;
        if (i > 0 && (len % 8 != 0 || (!(last_free && i == n - 1) && len != b->view[1].len))) {
            buffers_release(b);
            PyErr_SetString(PyExc_ValueError, "the op arrays must be int64 arrays of one length");
            return -1;
        }
    }
    return 0;
}

/* buffers_get for a function of exactly n arguments (``usage`` names them:
   the TypeError otherwise). */
static int
buffers_of_args(Buffers *b, PyObject *const *args, Py_ssize_t nargs, int n, int last_free, const char *usage)
{
    if (nargs != n) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    return buffers_get(b, args, n, last_free);
}

/* The loop of mark_readers (forward: flags[out[i]] = 1 when flags[a[i]] or
   flags[b[i]]) or of mark_operands (backward: marks a[i] and b[i] when
   out[i] is marked) over the ops [start, stop) of args (marks, out, a, b,
   start, stop). */
static PyObject *
mark_loop(PyObject *const *args, Py_ssize_t nargs, const char *name, int forward)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "%s(marks, out, a, b, start, stop)", name);
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[4]), stop = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Buffers b;
    if (buffers_get(&b, args, 4, 0) < 0)
        return NULL;
    unsigned char *mark = b.view[0].buf;
    const int64_t *out = b.view[1].buf, *x = b.view[2].buf, *y = b.view[3].buf;
    int64_t n_slots = (int64_t)b.view[0].len, n_ops = (int64_t)(b.view[1].len / 8);
    int ok = 0 <= start && start <= stop && stop <= n_ops;
    for (Py_ssize_t n = 0; ok && n < stop - start; n++) {
        Py_ssize_t i = forward ? start + n : stop - 1 - n;
        int64_t o = out[i], s = x[i], t = y[i];
        ok = (uint64_t)o < (uint64_t)n_slots && (uint64_t)s < (uint64_t)n_slots && (uint64_t)t < (uint64_t)n_slots;
        if (!ok)
            break;
        if (forward && (mark[s] | mark[t]))
            mark[o] = 1;
        else if (!forward && mark[o])
            mark[s] = mark[t] = 1;
    }
    buffers_release(&b);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: an op index or a slot out of range", name);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* mark_readers(flags, out, a, b, start, stop) -> None: for each op i of
   [start, stop), in order, flags[out[i]] = 1 when flags[a[i]] or flags[b[i]]
   (``ir.needs_grad``'s loop; b holds a unary op's a). */
static PyObject *
mark_readers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return mark_loop(args, nargs, "mark_readers", 1);
}

/* mark_operands(live, out, a, b, start, stop) -> None: for each op i of
   [start, stop), last to first, live[a[i]] = live[b[i]] = 1 when
   live[out[i]] (``ir._live``'s loop). */
static PyObject *
mark_operands(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return mark_loop(args, nargs, "mark_operands", 0);
}

/* cones_hold(live, out, a, b, cuts) -> bool: whether each position's ops
   (after the previous cut, up to and including its own) all lie in the cone
   of the op at its cut, walking back from the cut and marking what each
   live op reads (``ir.prefixes_hold``'s loop; ``live`` starts all zero). */
static PyObject *
cones_hold(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Buffers b;
    if (buffers_of_args(&b, args, nargs, 5, 1, "cones_hold(live, out, a, b, cuts)") < 0)
        return NULL;
    unsigned char *live = b.view[0].buf;
    const int64_t *out = b.view[1].buf, *x = b.view[2].buf, *y = b.view[3].buf, *cuts = b.view[4].buf;
    int64_t n_slots = (int64_t)b.view[0].len, n_ops = (int64_t)(b.view[1].len / 8);
    int64_t n_cuts = (int64_t)(b.view[4].len / 8), start = 0;
    int bad = 0, holds = 1;
    for (int64_t c = 0; c < n_cuts && holds && !bad; c++) {
        int64_t cut = cuts[c];
        bad = cut < start || cut >= n_ops;
        for (int64_t i = cut; !bad && holds && i >= start; i--) {
            int64_t o = out[i], s = x[i], t = y[i];
            bad = (uint64_t)o >= (uint64_t)n_slots || (uint64_t)s >= (uint64_t)n_slots
                  || (uint64_t)t >= (uint64_t)n_slots;
            if (bad)
                break;
            if (i == cut)
                live[o] = 1;
            holds = live[o];
            live[s] = 1;
            live[t] = 1;
        }
        start = cut + 1;
    }
    buffers_release(&b);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "cones_hold: a cut or a slot out of range");
        return NULL;
    }
    return PyBool_FromLong(holds);
}

/* reads_out_of_order(matters, a, b, pos) -> [(slot, earlier, later)]: for
   each slot s with matters[s] (one byte a slot, taken writable as the other
   loops' marks are, only read), its readers in op order (op i reads a[i],
   then b[i]; a negative slot is no operand), each pair of consecutive
   readers whose new positions pos[] decrease
   (``ir.reads_out_of_order``'s loop: a dict-free scan where Python sorts). */
static PyObject *
reads_out_of_order(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Buffers b;
    if (buffers_of_args(&b, args, nargs, 4, 0, "reads_out_of_order(matters, a, b, pos)") < 0)
        return NULL;
    PyObject *found = NULL;
    int64_t *last = NULL;
    const unsigned char *matters = b.view[0].buf;
    const int64_t *x = b.view[1].buf, *y = b.view[2].buf, *pos = b.view[3].buf;
    const int64_t n_slots = (int64_t)b.view[0].len, n_ops = (int64_t)(b.view[1].len / 8);
    last = malloc(sizeof(int64_t) * (size_t)(n_slots ? n_slots : 1));
    found = PyList_New(0);
    if (last == NULL || found == NULL) {
        if (last == NULL)
            PyErr_NoMemory();
        Py_CLEAR(found);
        goto done;
    }
    for (int64_t s = 0; s < n_slots; s++)
        last[s] = -1;                       /* no reader yet */
    for (int64_t i = 0; i < n_ops; i++)
        for (int k = 0; k < 2; k++) {
            const int64_t s = k ? y[i] : x[i];
            if (s < 0)
                continue;
            if (s >= n_slots) {
                PyErr_SetString(PyExc_ValueError, "reads_out_of_order: a slot out of range");
                Py_CLEAR(found);
                goto done;
            }
            if (!matters[s])
                continue;
            const int64_t r = last[s];
            if (r >= 0 && pos[i] < pos[r]) {
                PyObject *t = Py_BuildValue("(LLL)", (long long)s, (long long)r, (long long)i);
                if (t == NULL || PyList_Append(found, t) < 0) {
                    Py_XDECREF(t);
                    Py_CLEAR(found);
                    goto done;
                }
                Py_DECREF(t);
            }
            last[s] = i;
        }
done:
    free(last);
    buffers_release(&b);
    return found;
}

/* loop_periods(sig, hashed, loopable_to, best, best_p, max_period,
   min_iterations) -> None: ``loops._find_loops``'s scan over the periods
   p = 1..max_period, with its arrays (int64; hashed uint64; n ops,
   loopable_to n + 1): op j repeats op j - p where sig[j] == sig[j - p] >= 0,
   and its step repeats where hashed[j] - hashed[j - p] == hashed[j - p] -
   hashed[j - 2p] (mod 2**64); a stretch from s runs while both hold (from s +
   p and s + 2p on); where it covers min_iterations periods or more, within
   loopable_to[s], and more ops than best[s] so far, best[s] and best_p[s]
   take it. */
static PyObject *
loop_periods(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "loop_periods(sig, hashed, loopable_to, best, best_p, max_period, min_iterations)");
        return NULL;
    }
    const long max_period = PyLong_AsLong(args[5]), min_iterations = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer v[5];
    int held = 0, ok = 0;
    int64_t *same_to = NULL, *step_to = NULL;
    for (; held < 5; held++)
        if (PyObject_GetBuffer(args[held], &v[held], held >= 3 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
            goto done;
    const Py_ssize_t len = v[0].len;
    if (len % 8 || v[1].len != len || v[2].len != len + 8 || v[3].len != len || v[4].len != len
            || max_period < 0 || min_iterations < 1) {
        PyErr_SetString(PyExc_ValueError, "loop_periods: n ops in sig, hashed, best and best_p, n + 1 in "
                        "loopable_to (int64), a period and iterations >= 1");
        goto done;
    }
    const int64_t n = (int64_t)(len / 8);
    const int64_t *sig = v[0].buf, *loopable_to = v[2].buf;
    const uint64_t *hashed = v[1].buf;
    int64_t *best = v[3].buf, *best_p = v[4].buf;
    same_to = malloc(sizeof(int64_t) * (size_t)(n + 1));
    step_to = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (same_to == NULL || step_to == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t p = 1; p <= max_period; p++) {
        /* same_to[j], step_to[j]: the first index >= j where the op (its step) does not repeat */
        same_to[n] = step_to[n] = n;
        for (int64_t j = n - 1; j >= 0; j--) {
            const int same = j >= p && sig[j] == sig[j - p] && sig[j] >= 0;
            const int step = j >= 2 * p && hashed[j] - hashed[j - p] == hashed[j - p] - hashed[j - 2 * p];
            same_to[j] = same ? same_to[j + 1] : j;
            step_to[j] = step ? step_to[j + 1] : j;
        }
        for (int64_t s = 0; s < n; s++) {
            const int64_t a = same_to[s + p < n ? s + p : n], b = step_to[s + 2 * p < n ? s + 2 * p : n];
            const int64_t iterations = ((a < b ? a : b) - s) / p;
            const int64_t cover = iterations >= min_iterations && loopable_to[s] >= s + p ? iterations * p : 0;
            if (cover > best[s]) {
                best[s] = cover;
                best_p[s] = p;
            }
        }
    }
    ok = 1;
done:
    free(same_to);
    free(step_to);
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* The binary min-heap of min_index_order: heap[0..*n) */
static void
heap_push(int64_t *heap, int64_t *n, int64_t v)
{
    int64_t i = (*n)++;
    while (i > 0 && heap[(i - 1) / 2] > v) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = v;
}

static int64_t
heap_pop(int64_t *heap, int64_t *n)
{
    int64_t top = heap[0], last = heap[--*n], i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap[c + 1] < heap[c])
            c++;
        if (heap[c] >= last)
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0)
        heap[i] = last;
    return top;
}

/* min_index_order(order, ptr, deps) -> nodes run: Kahn's algorithm over
   the nodes 0..n-1 of a graph, node u waiting for the nodes
   deps[ptr[u]:ptr[u + 1]] (int64; one listed twice is waited for twice),
   the ready node of the lowest number first (a binary heap). order (n
   int64, written) takes the nodes as they run; fewer than n run where
   there is a cycle (``ir.min_index_order``'s loop). */
static PyObject *
min_index_order(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Buffers b;
    if (buffers_of_args(&b, args, nargs, 3, 1, "min_index_order(order, ptr, deps)") < 0)
        return NULL;
    int64_t *order = b.view[0].buf;
    const int64_t *ptr = b.view[1].buf, *deps = b.view[2].buf;
    const int64_t n = (int64_t)(b.view[1].len / 8) - 1, m = (int64_t)(b.view[2].len / 8);
    int64_t *waiting = NULL, *uptr = NULL, *users = NULL, *heap = NULL, run = 0, ready = 0;
    const char *bad = NULL;
    if (n < 0 || b.view[0].len != 8 * (Py_ssize_t)n)
        bad = "min_index_order: order must hold one int64 per node";
    else if (ptr[0] != 0 || ptr[n] != m)
        bad = "min_index_order: ptr must run from 0 to len(deps)";
    for (int64_t u = 0; u < n && !bad; u++)
        if (ptr[u] > ptr[u + 1])
            bad = "min_index_order: ptr must not decrease";
    for (int64_t e = 0; e < m && !bad; e++)
        if (deps[e] < 0 || deps[e] >= n)
            bad = "min_index_order: a dependency out of range";
    if (bad) {
        buffers_release(&b);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    waiting = calloc((size_t)n + 1, sizeof(int64_t));
    uptr = calloc((size_t)n + 2, sizeof(int64_t));
    users = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
    heap = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (waiting == NULL || uptr == NULL || users == NULL || heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* each node's users, by counting: uptr[d + 1] counts d's, then the
       prefix sums; heap is the fill cursor until the walk needs it */
    for (int64_t u = 0; u < n; u++)
        for (int64_t e = ptr[u]; e < ptr[u + 1]; e++) {
            uptr[deps[e] + 1]++;
            waiting[u]++;
        }
    for (int64_t d = 0; d < n; d++)
        uptr[d + 1] += uptr[d];
    for (int64_t d = 0; d < n; d++)
        heap[d] = uptr[d];
    for (int64_t u = 0; u < n; u++)
        for (int64_t e = ptr[u]; e < ptr[u + 1]; e++)
            users[heap[deps[e]]++] = u;
    for (int64_t u = 0; u < n; u++)      /* in order: each push stays a leaf */
        if (waiting[u] == 0)
            heap[ready++] = u;
    while (ready > 0) {
        const int64_t u = heap_pop(heap, &ready);
        order[run++] = u;
        for (int64_t e = uptr[u]; e < uptr[u + 1]; e++)
            if (--waiting[users[e]] == 0)
                heap_push(heap, &ready, users[e]);
    }
done:
    free(waiting);
    free(uptr);
    free(users);
    free(heap);
    buffers_release(&b);
    return PyErr_Occurred() ? NULL : PyLong_FromLongLong((long long)run);
}

/* count_reads(uses, a, b) -> None: uses[s] += 1 for each operand slot s of
   each op (a[i], and b[i] unless negative: a unary op's), uses an int64 a
   slot (``vectorize._Graph``'s use counts, without the concatenated copy
   of a and b that numpy's bincount needs). */
static PyObject *
count_reads(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Buffers b;
    if (buffers_of_args(&b, args, nargs, 3, 0, "count_reads(uses, a, b)") < 0)
        return NULL;
    int64_t *uses = b.view[0].buf;
    const int64_t *x = b.view[1].buf, *y = b.view[2].buf;
    const int64_t n_slots = (int64_t)(b.view[0].len / 8), n_ops = (int64_t)(b.view[1].len / 8);
    int ok = b.view[0].len % 8 == 0;
    for (int64_t i = 0; i < n_ops && ok; i++)       /* first: a refusal changes nothing */
        ok = (uint64_t)x[i] < (uint64_t)n_slots && y[i] < n_slots;
    for (int64_t i = 0; i < n_ops && ok; i++) {
        uses[x[i]]++;
        if (y[i] >= 0)
            uses[y[i]]++;
    }
    buffers_release(&b);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "count_reads: uses must be int64, and every slot inside it");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The '+' a '+' op i folds (its a's producer when that is a '+' read only
   there, else its b's, else -1; *via_a says which), or -2 for arrays that
   are not a program's (an operand out of range, a producer not before i). */
static int64_t
fold_child(const unsigned char *plus, const int64_t *x, const int64_t *y, const int64_t *producer,
           int64_t n_producer, const int64_t *uses, int64_t n_slots, int64_t i, int *via_a)
{
    const int64_t s = x[i], t = y[i];
    if ((uint64_t)s >= (uint64_t)n_slots || (uint64_t)t >= (uint64_t)n_slots || s >= n_producer || t >= n_producer)
        return -2;
    const int64_t ps = producer[s], pt = producer[t];
    if (ps >= i || pt >= i || ps < -1 || pt < -1)
        return -2;
    *via_a = ps >= 0 && plus[ps] && uses[s] == 1;
    if (*via_a)
        return ps;
    return pt >= 0 && plus[pt] && uses[t] == 1 ? pt : -1;
}

/* fold_chains(plus, a, b, producer, uses, members, terms, starts) -> chains:
   the chains of '+' of ``vectorize._flatten_sums``. plus: one byte an op,
   set for the '+' ops that may fold; a, b: the ops' operand slots; producer:
   each slot's op (-1 for a leaf); uses: each slot's reads. A '+' extends
   the chain of the '+' its a comes from when that a is read only there,
   else that of its b's (``fold_child``). Chains ordered by their last '+'
   (the root), each from its first '+' up: members[] their op indices,
   terms[] the first's a and b, then each later '+''s other operand,
   starts[] where each chain's members start (its terms start that many
   plus its index further). members and starts hold one int64 per '+',
   terms two. */
static PyObject *
fold_chains(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "fold_chains(plus, a, b, producer, uses, members, terms, starts)");
        return NULL;
    }
    Py_buffer v[8];
    int held = 0;
    const char *bad = NULL;
    for (; held < 8; held++)
        if (PyObject_GetBuffer(args[held], &v[held], held >= 5 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
            break;
    unsigned char *extended = NULL;
    int64_t chains = 0;
    if (held < 8)
        goto done;
    const unsigned char *plus = v[0].buf;
    const int64_t *x = v[1].buf, *y = v[2].buf, *producer = v[3].buf, *uses = v[4].buf;
    int64_t *members = v[5].buf, *terms = v[6].buf, *starts = v[7].buf;
    const int64_t n = (int64_t)v[0].len, n_producer = (int64_t)(v[3].len / 8), n_slots = (int64_t)(v[4].len / 8);
    int64_t n_plus = 0;
    for (int64_t i = 0; i < n; i++)
        n_plus += plus[i] != 0;
    for (int i = 1; i < 8; i++)
        if (v[i].len % 8)
            bad = "fold_chains: the arrays after plus must be int64";
    if (!bad && (v[1].len != 8 * n || v[2].len != 8 * n))
        bad = "fold_chains: a and b need one slot per op of plus";
    else if (!bad && (v[5].len < 8 * n_plus || v[6].len < 16 * n_plus || v[7].len < 8 * n_plus))
        bad = "fold_chains: members and starts need one int64 per '+', terms two";
    if (bad)
        goto done;
    extended = calloc((size_t)n + 1, 1);
    if (extended == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int via_a;
    for (int64_t i = 0; i < n && !bad; i++) {
        if (!plus[i])
            continue;
        const int64_t c = fold_child(plus, x, y, producer, n_producer, uses, n_slots, i, &via_a);
        if (c == -2)
            bad = "fold_chains: an operand out of range, or made at or after its reader";
        else if (c >= 0)
            extended[c] = 1;
    }
    /* each root (a '+' no '+' extends), lowest first: down its chain to
       count it, then down again writing it from its last '+' back */
    int64_t m = 0, t = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        if (!plus[i] || extended[i])
            continue;
        int64_t length = 1, j = i;
        while ((j = fold_child(plus, x, y, producer, n_producer, uses, n_slots, j, &via_a)) >= 0)
            length++;
        if (m + length > n_plus) {   /* uses[] undercounts: a '+' in two chains */
            bad = "fold_chains: a '+' folded twice (uses must count every read)";
            break;
        }
        starts[chains++] = m;
        j = i;
        for (int64_t k = length - 1; k > 0; k--) {
            const int64_t c = fold_child(plus, x, y, producer, n_producer, uses, n_slots, j, &via_a);
            members[m + k] = j;
            terms[t + 1 + k] = via_a ? y[j] : x[j];
            j = c;
        }
        members[m] = j;
        terms[t] = x[j];
        terms[t + 1] = y[j];
        m += length;
        t += length + 1;
    }
done:
    free(extended);
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&v[i]);
    if (bad)
        PyErr_SetString(PyExc_ValueError, bad);
    return PyErr_Occurred() ? NULL : PyLong_FromLongLong((long long)chains);
}

/* x in decimal at p; returns the end. */
static char *
put_decimal(char *p, long long x)
{
    unsigned long long u = x < 0 ? 0 - (unsigned long long)x : (unsigned long long)x;
    char digits[24];
    int n = 0;
    if (x < 0)
        *p++ = '-';
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = digits[--n];
    return p;
}

/* x as CPython's float.hex() writes it (repr's "inf", "-inf", "nan" where
   it is not finite) at p; returns the end. */
static char *
put_float_hex(char *p, double x)
{
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    const int negative = (int)(bits >> 63), biased = (int)(bits >> 52 & 0x7ff);
    const uint64_t fraction = bits & (((uint64_t)1 << 52) - 1);
    if (biased == 0x7ff) {
        const char *name = fraction ? "nan" : negative ? "-inf" : "inf";
        size_t n = strlen(name);
        memcpy(p, name, n);
        return p + n;
    }
    if (negative)
        *p++ = '-';
    if (biased == 0 && fraction == 0) {
        memcpy(p, "0x0.0p+0", 8);
        return p + 8;
    }
    *p++ = '0';
    *p++ = 'x';
    *p++ = biased ? '1' : '0';              /* a subnormal: 0.<fraction> * 2**-1022 */
    *p++ = '.';
    for (int shift = 48; shift >= 0; shift -= 4)
        *p++ = "0123456789abcdef"[fraction >> shift & 0xf];
    const int e = biased ? biased - 1023 : -1022;
    *p++ = 'p';
    if (e >= 0)
        *p++ = '+';
    return put_decimal(p, e);
}

/* hex_repr(values, first) -> bytes: ``repr([v.hex() for v in values])``,
   or with an int ``first`` ``repr([(first + i, v.hex()) for i, v in
   enumerate(values)])``, encoded: the text ``ir.graph_hash`` hashes for a
   program's constants and exponents (``ir._constants_repr`` and
   ``ir._hexes_repr`` are its Python twins). values: a buffer of doubles.
   The digits follow CPython's float.hex: 13 hexadecimal digits after the
   point, "0x0.0p+0" for zero, subnormals as "0x0.<digits>p-1022". */
static PyObject *
hex_repr(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "hex_repr(values, first)");
        return NULL;
    }
    long long first = 0;
    const int pairs = args[1] != Py_None;
    if (pairs && ((first = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred()))
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0)
        return NULL;
    if (v.len % 8 != 0) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "hex_repr: values must be a buffer of doubles");
        return NULL;
    }
    const Py_ssize_t n = v.len / 8;
    /* an entry: "(" + 20 characters + ", '" + 24 characters + "')" + ", " */
    PyObject *out = PyBytes_FromStringAndSize(NULL, 2 + n * 56);
    if (out == NULL) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char *start = PyBytes_AS_STRING(out), *p = start;
    *p++ = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        double x;
        memcpy(&x, (const char *)v.buf + 8 * i, sizeof x);
        if (i) {
            *p++ = ',';
            *p++ = ' ';
        }
        if (pairs) {
            *p++ = '(';
            p = put_decimal(p, first + (long long)i);
            *p++ = ',';
            *p++ = ' ';
        }
        *p++ = '\'';
        p = put_float_hex(p, x);
        *p++ = '\'';
        if (pairs)
            *p++ = ')';
    }
    *p++ = ']';
    PyBuffer_Release(&v);
    if (_PyBytes_Resize(&out, p - start) < 0)
        return NULL;
    return out;
}

PyDoc_STRVAR(walk_doc, "walk(value_type, constant_type, declared, loss, outputs, op_codes, arities, pow_code, "
             "lookup, want_slots)\n--\n\nThe tracer's walk of a Value graph (see compiler/templates/walk.c), "
             "or None where the Python walk must read the graph.");

static PyMethodDef walk_methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {"leaves_ok", (PyCFunction)(void (*)(void))leaves_ok, METH_FASTCALL, NULL},
    {"mark_readers", (PyCFunction)(void (*)(void))mark_readers, METH_FASTCALL, NULL},
    {"cones_hold", (PyCFunction)(void (*)(void))cones_hold, METH_FASTCALL, NULL},
    {"mark_operands", (PyCFunction)(void (*)(void))mark_operands, METH_FASTCALL, NULL},
    {"reads_out_of_order", (PyCFunction)(void (*)(void))reads_out_of_order, METH_FASTCALL, NULL},
    {"loop_periods", (PyCFunction)(void (*)(void))loop_periods, METH_FASTCALL, NULL},
    {"min_index_order", (PyCFunction)(void (*)(void))min_index_order, METH_FASTCALL, NULL},
    {"fold_chains", (PyCFunction)(void (*)(void))fold_chains, METH_FASTCALL, NULL},
    {"count_reads", (PyCFunction)(void (*)(void))count_reads, METH_FASTCALL, NULL},
    {"hex_repr", (PyCFunction)(void (*)(void))hex_repr, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot walk_slots[] = {
    {0, NULL},
};

static struct PyModuleDef walk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "nn",
    .m_doc = "The tracer's native walk over a micrograd Value graph (compiler/walk.py).",
    .m_size = 0,
    .m_methods = walk_methods,
    .m_slots = walk_slots,
};

PyMODINIT_FUNC
PyInit_nn(void)
{
    return PyModuleDef_Init(&walk_module);
}
