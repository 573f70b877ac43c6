"""Numbers and names shared by the code generator, the build and the C
templates: each has its home here. Those the fixed C needs reach it as
``#define`` lines of the generated prologue (``C_DEFINES``, written by
``compiler/codegen/module.py``), never as copies. Nothing here depends on a
particular program.
"""

# Threads a module may run at most (helpers, and scratch memory per thread,
# are allocated for the threads in use; this only bounds a request).
# compile(threads=None) and load() cap at the cores this process may use.
MAX_THREADS = 1024

# The MatVec loop kernels' tile sizes (templates/kernels_body.c): neurons per
# forward panel and per weight-gradient tile (the padding of a weight
# block's rows, compiler/codegen/layout.py) and inputs per group of the
# weight gradient's split (they share one list of rows).
MV_NR = 16
MV_BGW_MK = 16
# The one sparse micro-kernel's sizes (templates/kernels_body.c): lanes per
# packed panel of W (forward: neurons, input gradient: inputs) and of gy
# (weight gradient); rows whose lists of nonzeros are built together; a panel
# block that stays in L1 (32 KiB of doubles); most rows per block of the
# weight gradient. codegen/matvec.py sizes each thread's scratch by them.
MV_PW = 64
MV_BGW_PW = 64
MV_RCH = 64
MV_L1_DOUBLES = 4096
MV_RB_MAX = 256

# Input rows a module runs through forward and backward together (a block):
# its threads share a block's rows, and parameter gradients are added up
# over a block's rows (in row order) after its backward. A block's values and
# gradients take at most BLOCK_BYTES (fewer rows when rows are large).
BLOCK_ROWS = 64
BLOCK_BYTES = 16 << 20

# Values of $MICROGRAD_KERNELS: the instruction set the loops may use at most
# (every one gives the same bits; unset: the widest this CPU has).
KERNELS = ('base', 'avx2', 'avx512')

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

# The numbers above that the fixed C uses, as the prologue's #defines.
C_DEFINES = {'MAX_THREADS': MAX_THREADS, 'MV_NR': MV_NR, 'MV_BGW_MK': MV_BGW_MK, 'MV_PW': MV_PW,
             'MV_BGW_PW': MV_BGW_PW, 'MV_RCH': MV_RCH, 'MV_L1_DOUBLES': MV_L1_DOUBLES, 'MV_RB_MAX': MV_RB_MAX}
