"""Numbers and names shared by the code generator, the build and the C template.

The generated C is shaped by these; ``compiler/build.py`` picks flags to
match them, and ``templates/module.c`` receives them through placeholders.
Nothing here depends on a particular program.
"""

# Rows whose running sums a vector-op loop keeps in registers at once: 8
# AVX-512 registers. Each row's sum is a chain of dependent additions, so the
# loop is only as fast as it has independent rows in flight (benchmarks: 64
# trains 5-20% faster than 16 with AVX2 and AVX-512).
ROW_BLOCK = 64

# Columns of x tested at once for zeros.
ZERO_GROUP = 8

# Input rows whose weight gradients train_batch records before adding them up
# (each weight's contributions then go in row order, its running sum in a
# register).
DEFER_ROWS = 64

# Terms per C statement of a long Sum: keeps expression trees shallow.
TERMS_PER_LINE = 32

# Statements per generated function. clang and gcc are superlinear in the
# size of one function; chunks of this size keep them near-linear.
CHUNK = 2000

# The C parameters of the program's functions, and the names to pass on:
# (parameter list, argument list).
FORWARD_PARAMS = ('double *restrict data, const double *restrict aux, int *restrict index',
                  'data, aux, index')
# place: -1 adds the weight gradients of vector ops at once; train_batch
# passes each input row's place among the DEFER_ROWS it records for flush.
BACKWARD_PARAMS = ('double *restrict data, double *restrict grad, const double *restrict aux, '
                   'int *restrict index, double *restrict defer, int place',
                   'data, grad, aux, index, defer, place')
