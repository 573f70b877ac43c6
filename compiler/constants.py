"""Numbers and names shared by the code generator, the build and the C template.

The generated C is shaped by these; ``compiler/build.py`` picks flags to
match them, and ``templates/module.c`` receives them through placeholders.
Nothing here depends on a particular program.
"""

# Outputs whose running sums a vector-op loop keeps in registers at once: 8
# AVX-512 registers. Each sum is a chain of dependent additions, so the loop
# is only as fast as it has independent sums in flight (benchmarks: 64
# trains 5-20% faster than 16 with AVX2 and AVX-512).
OUT_BLOCK = 64

# Columns of x tested at once for zeros.
ZERO_GROUP = 8

# Input rows a module runs through forward and backward together (a block):
# its threads share a block's rows, and parameter gradients are added up
# over a block's rows (in row order) after its backward. A block's values and
# gradients take at most BLOCK_BYTES (fewer rows when rows are large).
BLOCK_ROWS = 256
BLOCK_BYTES = 16 << 20

# Each row's values and gradients start on a multiple of this many doubles
# (64 bytes: a cache line, an AVX-512 vector).
ROW_ALIGN = 8

# Terms per C statement of a long Sum: keeps expression trees shallow.
TERMS_PER_LINE = 32

# Statements per translation unit of straight-line code: the units build in
# parallel (and a change to one rebuilds only it).
PART = 4000
# At most this many units: each is a compiler process forked from Python,
# and forking a process that holds a million-node graph costs tens of
# milliseconds (602 units of a 2.4 M-statement program: 22 s of tcc time
# that was mostly forking, against about 8 s in 32 units).
MAX_PARTS = 32

# Statements per generated function. clang and gcc are superlinear in the
# size of one function; chunks of this size keep them near-linear.
CHUNK = 2000

# The C parameters of the per-row functions of scalar code, and the names
# to pass on: (parameter list, argument list). v, g: one row's values and
# gradients; p, gp: the shared parameters and constants, and the parameter
# gradients.
FORWARD_PARAMS = ('double *restrict v, const double *restrict p', 'v, p')
BACKWARD_PARAMS = ('const double *restrict v, double *restrict g, const double *restrict p, '
                   'double *restrict gp', 'v, g, p, gp')
