"""The module's assembly: the C of one program (``_Program``) inside the
fixed C of ``compiler/templates/``, as one file (``nn.c``) and as the
translation units that build in parallel.

Codegen writes one *prologue*: ``#define`` lines of the program's sizes and
hashes, the optimizer's numbers, and the numbers the C shares with Python
(``compiler.constants.C_DEFINES``). The templates are real C: none is
filled in; each includes what it needs (``nn_prologue.h``, ``contract.h``,
...) unless the prologue says ``NN_AMALGAMATION``, so each also compiles on
its own against a stub prologue. In ``nn.c`` they follow the prologue in
the order of ``_MODULE``:

- ``contract.h``  headers, the floating-point contract, $MICROGRAD_KERNELS
- ``program.h``   ``Block`` and what the generated program provides
- ``state.h``     ``NNState`` (one model; no process globals), the optimizer's kind
- ``pool.c``      helper threads
- ``optimizer.c`` the compiled optimizer's step
- the program     (generated) and its tables
- ``batch.c``     many rows at once, on the state's threads
- ``core.h``, ``core.c``  the ``nn_`` functions on a caller-owned state: no Python
- ``args.c``, ``module.c``  the CPython module (under ``NN_PYTHON``)

``nn.c`` is plain C: ``cc -c nn.c`` builds the ``nn_`` library without
Python's headers. The CPython module is opt-in: its builds pass
``-DNN_PYTHON`` beside the headers' folder (``compiler/build/run.py``).
"""
import hashlib
import re

import numpy as np

from compiler import cpu
from compiler.codegen import optimizer as optimizer_c
from compiler.codegen.program import _Program
from compiler.codegen.matvec import row_input_runs
from compiler.codegen.scalar import c_double
from compiler.constants import C_DEFINES, KERNELS
from compiler.ir import features, positions_of_writes
from compiler.templates import read_template

__all__ = ['emit_module', 'emit_header', 'Source', 'prologue', 'GENERATOR_VERSION', 'TEMPLATES']

GENERATOR_VERSION = '5'   # 5: nn.c is plain C; its CPython module needs -DNN_PYTHON
# The numbers of compiler/constants.py the fixed C uses: (name, value, why);
# the loop kernels' unit sees these only, none of a program's
_FIXED_DEFINES = [(name, value, 'compiler/constants.py') for name, value in C_DEFINES.items()]


def _defines_c(defines):
    """``#define`` lines of ``(name, value, why)`` (why: a comment, or None)."""
    return '\n'.join(f'#define {name} {value}' + (f'   /* {why} */' if why else '') for name, value, why in defines)

# The fixed C of the module unit, in order: before the program, after it, and the Python glue.
_BEFORE = ('contract.h', 'kernels_api.c', 'program.h', 'state.h', 'pool.c', 'optimizer.c')
_AFTER = ('batch.c', 'core.h', 'core.c')
_PYTHON = ('args.h', 'args.c', 'module.c')
# Every template that is a C file of its own (the kernels' loops are built per instruction set).
TEMPLATES = _BEFORE + _AFTER + _PYTHON


class Source(str):
    """The C source of a module: as one file (the string itself: what
    ``export`` writes, what a user builds by hand), and as translation units
    that build in parallel and are cached one by one (``parts``: ``[(name,
    text)]``; the loop kernels' part is the same for every program).
    ``statements``: the straight-line statements, what compile time grows
    with; ``straight``: the names of the parts that hold them; ``table_ops``:
    the scalar ops that run from the op table (compiler/codegen/table.py)."""

    def __new__(cls, text, parts=(), statements=0, straight=(), table_ops=0):
        source = super().__new__(cls, text)
        source.parts = list(parts)
        source.statements = statements
        source.straight = frozenset(straight)
        source.table_ops = table_ops
        return source


def _kernels(sets=cpu.ALL_SETS):
    """The loop kernels' code: what they share, then the loops of each
    instruction set of ``sets`` (of ``ALL_SETS``; the vector sets are
    x86-64's, tcc builds plain loops only, and the baseline is built
    wherever the vector sets are not), and the choice of one at load time
    (the widest of them the CPU runs; ``MV_HAS_<SET>`` says which were
    built). The same for every program: built as a unit of its own, after a
    prologue of the fixed numbers only, its object is cached once for all
    programs."""
    body = read_template('kernels_body.c')

    def built_for(isa):
        level = KERNELS.index(isa) if isa in KERNELS else -1      # -1: 'plain', tcc's C loops
        has = [f'#define MV_HAS_{isa.upper()} 1'] if level >= 0 else []
        return '\n'.join([f'#define MV_ISA {isa}', f'#define MV_LEVEL {level}', body, '#undef MV_LEVEL',
                          '#undef MV_ISA', *has])
    vector = [built_for(isa) for isa in cpu.VECTOR_SETS if isa in sets]
    base = built_for(KERNELS[0])
    return '\n'.join([read_template('kernels.c'),
                      '#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))',
                      built_for('plain'),
                      '#else', '#if defined(__x86_64__)', *vector,
                      *(['#endif', base] if KERNELS[0] in sets else ['#else', base, '#endif']),
                      '#endif', read_template('kernels_choose.c')])


def kernels_unit(sets=None):
    """The loop kernels' translation unit, ``(name, text)``, with the
    instruction sets ``sets`` (default: those this machine's modules pick,
    ``compiler.cpu.kernel_sets``): it sees only the fixed numbers, so its
    object is one for every program (and can be built before the program is
    known: ``compiler.build.ahead``)."""
    fixed = '\n'.join([prologue(_defines_c(_FIXED_DEFINES), python=False), read_template('contract.h'),
                       read_template('kernels_api.c')])
    return 'kernels', fixed + '\n' + _kernels(cpu.kernel_sets() if sets is None else sets)


def _runs(program, layout):
    """``PARAM_RUNS``: where each parameter (in the user's order) is in ``p``,
    as runs ``{count, user start, user step, p start, p step}`` (found with
    numpy: a run continues while the step between neighbours stays the same)."""
    at = -1 - layout.loc[np.asarray(program.param_slots, dtype=np.int64)]
    n = len(at)
    if not n:
        return ['{0, 0, 1, 0, 1}']
    runs, i, steps = [], 0, np.diff(at)
    # where the step changes: a run starting at i takes i + 1 (its step) and
    # every later parameter while the step stays steps[i]
    change = np.flatnonzero(np.diff(steps) != 0) + 1 if len(steps) > 1 else np.zeros(0, dtype=np.int64)
    change = change.tolist()
    at = at.tolist()
    k = 0
    while i < n:
        step = at[i + 1] - at[i] if i + 1 < n else 1
        while k < len(change) and change[k] <= i:
            k += 1
        j = change[k] + 1 if k < len(change) else n      # steps[i..j-2] all equal step
        runs.append(f'{{{j - i}, {i}, 1, {at[i]}, {step}}}')
        i = j
    return runs


def _output_positions(program, cuts, part, at=None):
    """For each output, the position of a sequence from which forward
    computes it (ops[:cuts[n - 1] + 1] run for n positions; after the last
    cut: only all of them), 0 when every forward does (a leaf, the loss).
    ``part``: the program's ``layout.ScalarPart`` (where the scalar ops are);
    ``at``: ``positions_of_writes`` of a program scheduled layer by layer
    (found here when not given)."""
    if not cuts:
        return [0] * len(program.outputs)
    if program.position_runs is not None:     # scheduled layer by layer (compiler/positions.py)
        at = positions_of_writes(program) if at is None else at
        return [0 if s == program.loss or s not in at else at[s] + 1 for s in program.outputs]
    at = {slot: i for i, op in part.lifted for slot in op.writes}
    # (the scalar ops' outputs, indexed by slot: a pass may leave them in any order)
    where = np.full(program.n_slots, -1, dtype=np.int64)
    where[part.arrays.out] = part.positions
    for slot in program.outputs:
        if where[slot] >= 0:
            at[slot] = int(where[slot])

    def position(slot):
        if slot not in at or slot == program.loss:
            return 0
        return next((n for n, cut in enumerate(cuts, 1) if at[slot] <= cut), len(cuts))
    return [position(s) for s in program.outputs]


def _gradient_ends(program, layout, cuts, at):
    """``GRAD_ZERO[n]``: a backward over ``n`` positions adds into the row's
    gradients below it (and into the contributions): the gradients of the
    values that the ops of the positions run write (``at``, for a program
    scheduled layer by layer: its ops read only what earlier positions'
    write) and of the inputs. The layout puts values in the order traced,
    position by position, so that is a prefix of the row. Every entry is
    the row's values' end where that is not known (index 0 unused)."""
    ends = np.full(len(cuts) + 1, layout.n_row, dtype=np.int64)
    if not cuts or program.position_runs is None or not at:
        return ends.tolist()
    slots = np.fromiter(at.keys(), dtype=np.int64, count=len(at))
    position = np.fromiter(at.values(), dtype=np.int64, count=len(at))
    row = (slots < program.n_inputs) | (slots >= program.n_leaves)
    last = np.full(len(cuts), program.n_inputs, dtype=np.int64)      # past each position's last value
    np.maximum.at(last, position[row], layout.loc[slots[row]] + 1)
    ends[1:] = np.maximum.accumulate(last)
    return ends.tolist()


def _table(ctype, name, values):
    """A table the fixed C declares in program.h (HIDDEN extern)."""
    lines = [', '.join(values[i:i + 12]) for i in range(0, len(values), 12)] or ['0']
    return '\n'.join([f'HIDDEN const {ctype} {name} = {{', *[f'    {line},' for line in lines], '};'])


def prologue(numbers_c, python):
    """The generated prologue: the ``#define`` lines ``numbers_c``, after those
    that say what follows. ``python``: this unit holds the CPython module,
    built when ``-DNN_PYTHON`` is given; the other units never include
    ``Python.h``, whatever the command line."""
    head = [f'/* ---- generated by micrograd-compiler {GENERATOR_VERSION}: the prologue, the numbers of one',
            ' * program (compiler/codegen/module.py); the fixed C of compiler/templates/ follows ---- */',
            '#define NN_AMALGAMATION 1   /* the templates follow in this file: they #include nothing */']
    if python:
        head += ['/* -DNN_PYTHON (the compiler\'s own builds): the CPython module too (module.c);',
                 ' * without it, plain C: the nn_ functions of nn.h */']
    else:
        head += ['#undef NN_PYTHON          /* a part of the program only: no Python.h */']
    return '\n'.join(head) + '\n' + numbers_c + '\n'


# A unit without vector intrinsics: immintrin.h alone costs a compiler 0.1-0.3 s
_NO_INTRINSICS = '#define NN_NO_INTRINSICS 1   /* no vector intrinsics here: no immintrin.h */'


def _section(names):
    return '\n'.join(read_template(name) for name in names)


def emit_module(program, optimizer=None, initial_params=None, kernel_sets=None):
    """The C source of the ``nn`` extension module (a ``Source``: one file,
    and its translation units).

    ``optimizer`` (``compiler.SGD``/``Adam``/``AdamW``) is compiled in for
    ``step`` and ``train_batch`` (``program.input_grads`` makes ``backward``
    also produce d loss / d input); ``initial_params`` (in the user's order) are
    the parameters a fresh import of the module starts from (an export).
    ``kernel_sets``: the instruction sets of the loop kernels' unit (of
    ``compiler.cpu.ALL_SETS``; default: this machine's,
    ``compiler.cpu.kernel_sets``); the one file has them all."""
    prog = _Program(program)
    body, numbers = prog.emit()
    layout = prog.layout
    optimizer_defines = optimizer_c.defines(optimizer)
    segments = prog.functions.parts()
    # program_hash names all the module computes: the graph, its optimizer,
    # its gradients (the graph alone: program.graph_hash)
    digest = hashlib.sha256('\n'.join([body, *(t for part in segments for t in part),
                                       optimizer_defines]).encode()).hexdigest()[:16]
    feats = features(program)
    runs = _runs(program, layout)
    row_inputs = row_input_runs(program, layout, prog.matvecs.direct)
    uses_matvec = bool(layout.matvecs)
    defines = [
        ('NN_GENERATOR_VERSION', f'"{GENERATOR_VERSION}"', 'micrograd-compiler\'s C generator'),
        ('NN_PROGRAM_HASH', f'"{digest}"', 'names what this module computes (graph, optimizer, gradients)'),
        ('NN_GRAPH_HASH', f'"{program.graph_hash or "none"}"', 'names the graph alone (its weights fit)'),
        ('NN_KERNELS_ALLOWED', '"' + ', '.join(KERNELS) + '"', 'the values of $MICROGRAD_KERNELS'),
        ('N_INPUTS', program.n_inputs, None), ('N_PARAMS', program.n_params, None),
        ('N_OUTPUTS', len(program.outputs), None),
        ('N_FEATURES', len(feats), 'the inputs the outputs depend on'),
        ('N_SHARED', numbers['n_shared'], 'parameters (with padding), then constants'),
        ('N_PARAM_SPAN', numbers['param_span'], 'p[0:N_PARAM_SPAN]: the parameters and their padding'),
        ('N_AUX', numbers['n_aux'], 'packed copies of the weights'),
        ('ROW_VALUES', numbers['row_values'], 'inputs, then computed values'),
        ('ROW_STRIDE', numbers['row_stride'], 'doubles from one row to the next (with contributions)'),
        ('ROW_ZERO', numbers['row_zero'], "a row's gradients that train_batch zeroes"),
        ('BLOCK', numbers['block_rows'], 'rows run together'),
        ('SCRATCH_BYTES', numbers['scratch_bytes'], 'per thread, for the loop kernels'),
        ('POSITIONS', numbers['positions'], "a sequence's positions (0: not a sequence)"),
        ('N_PIPELINED', numbers['pipelined'], "MatMats whose weights nn_backward_step steps during the backward"),
        ('RECORDED', numbers['recorded'], 'scalar parameter contributions recorded per row'),
        ('WORK_PER_ROW', numbers['work_per_row'], 'about this many floating-point operations'),
        ('N_PARAM_RUNS', len(runs), 'rows of PARAM_RUNS'),
        ('N_ROW_INPUT_RUNS', len(row_inputs), 'rows of ROW_INPUT_RUNS'),
        ('N_WEIGHT_BLOCKS', len(numbers['weight_spans']), 'rows of WEIGHT_SPANS'),
        ('N_OTHER_SPANS', len(numbers['other_spans']), 'rows of OTHER_SPANS'),
        *_FIXED_DEFINES]
    if uses_matvec:
        defines.append(('HAVE_MATVEC', 1, 'MatVec ops: the loop kernels are built in'))
    if initial_params is not None:
        defines.append(('HAVE_INITIAL_PARAMS', 1, 'an export: its weights are built in'))
    numbers_c = _defines_c(defines)
    if optimizer_defines:
        numbers_c += '\n' + optimizer_defines
    at = positions_of_writes(program) if prog.cuts and program.position_runs is not None else None
    tables = [_table('int', 'PARAM_RUNS[N_PARAM_RUNS][5]', runs),
              _table('int', 'OUTPUT_AT[]', [str(layout.row_index(s)) if layout.is_row(s)
                                           else str(-layout.shared_index(s) - 1) for s in program.outputs]),
              _table('int', 'OUTPUT_POSITION[]',
                     [str(n) for n in _output_positions(program, prog.cuts, layout.scalar_part, at)]),
              _table('int', 'GRAD_ZERO[]', [str(n) for n in _gradient_ends(program, layout, prog.cuts, at)]),
              _table('int', 'FEATURES[]', [str(f) for f in feats]),
              _table('int', 'ROW_INPUT_RUNS[][2]', [f'{{{k}, {n}}}' for k, n in row_inputs] or ['{0, 0}']),
              *[_table('int', f'{name}[][2]', [f'{{{lo}, {hi}}}' for lo, hi in numbers[key]] or ['{0, 0}'])
                for name, key in (('WEIGHT_SPANS', 'weight_spans'), ('OTHER_SPANS', 'other_spans'))]]
    if initial_params is not None:
        tables.append(_table('double', 'INITIAL_PARAMS[]', [c_double(x) for x in initial_params] or ['0.0']))
    tables_c = '/* ---- tables ---- */\n' + '\n'.join(tables)

    def module_unit(program_c, kernel_code, intrinsics=True):
        head = prologue(numbers_c, python=True)
        if not intrinsics:
            head += _NO_INTRINSICS + '\n'
        before = [_section(['contract.h']), read_template('kernels_api.c') if uses_matvec else '',
                  kernel_code, _section(['program.h', 'state.h', 'pool.c', 'optimizer.c'])]
        return '\n'.join([head, *before, '/* ---- the program (compiler/codegen) ---- */', program_c, tables_c,
                          _section(_AFTER), '#ifdef NN_PYTHON', _section(_PYTHON), '#endif   /* NN_PYTHON */', ''])
    kernel_code = _kernels() if uses_matvec else ''
    every_segment = '\n'.join(t for part in segments for t in part)
    single = module_unit(every_segment + '\n' + body, kernel_code)
    if not kernel_code and len(segments) <= 1:
        return Source(single, [('module', single)], prog.functions.statements,   # small: one unit
                      table_ops=prog.table.n if prog.table else 0)
    # the module's own unit reads immintrin.h only for Adam's vector steps (the Conv
    # loops are written with vector types of the compiler's own)
    parts = [('module', module_unit(body, '', intrinsics=optimizer_c.uses_intrinsics(optimizer)))]
    common = '\n'.join([prologue(numbers_c, python=False), _NO_INTRINSICS, read_template('contract.h')])
    if kernel_code:
        parts.append(kernels_unit(kernel_sets))
    straight = [(f'segments{i + 1}', common + '\n' + '\n'.join(part)) for i, part in enumerate(segments)]
    return Source(single, parts + straight, prog.functions.statements, [name for name, _ in straight],
                  table_ops=prog.table.n if prog.table else 0)


# core.h's names, as nn.h spells them (a user's program sees only nn.h)
_HEADER_NAMES = ('N_INPUTS', 'N_PARAMS', 'N_OUTPUTS', 'N_FEATURES', 'POSITIONS', 'STATE_SIZE', 'MAX_THREADS')


def emit_header(source):
    """``nn.h``: the C API of the plain C build of ``source`` (an
    ``emit_module`` result), for C programs and other languages' FFI: its
    sizes as ``NN_`` macros and ``core.h``'s declarations, copied."""
    def number(name):
        return re.search(rf'^#define {name} (\S+)', source, re.M).group(1)
    core = read_template('core.h')
    api = core[core.index('/* nn.h begins'):core.index('/* nn.h ends */')]
    api = api[api.index('\n') + 1:].replace('NN_API ', '')
    api = re.sub(r'\b(%s)\b' % '|'.join(_HEADER_NAMES), r'NN_\1', api)
    optimizer = re.search(r'^#define OPT_NAME "(\w+)"', source, re.M)
    vectors = number('OPT_STATE_VECTORS') if optimizer else 0
    sizes = [('NN_N_INPUTS', number('N_INPUTS'), 'inputs, in the order given to compile()'),
             ('NN_N_PARAMS', number('N_PARAMS'), 'parameters, in the order given to compile()'),
             ('NN_N_OUTPUTS', number('N_OUTPUTS'), 'outputs'),
             ('NN_N_FEATURES', number('N_FEATURES'), 'the inputs the outputs depend on'),
             ('NN_POSITIONS', number('POSITIONS'), "a sequence's positions (0: one loss)"),
             ('NN_STATE_SIZE', f'(1 + {vectors} * NN_N_PARAMS)', "the optimizer's state: t, then its vectors"),
             ('NN_MAX_THREADS', number('MAX_THREADS'), None)]
    return '\n'.join([
        f'/* nn.h: the C API of nn.c, one compiled micrograd graph (program {number("NN_PROGRAM_HASH")[1:-1]},',
        f' * optimizer {optimizer.group(1) if optimizer else "none"}). Build nn.c as plain C, without Python:',
        ' *     cc -O2 -c nn.c                   (then link with -lm -lpthread)',
        ' *     cc -O2 -c -DNN_NO_THREADS nn.c   (one thread, no pthreads: -lm)',
        ' * Its floating-point contract is in nn.c: every compiler and level gives the',
        ' * interpreter\'s bits. Nothing is global: each state is a model of its own. */',
        '#ifndef NN_H', '#define NN_H', '#include <stddef.h>', '#ifdef __cplusplus', 'extern "C" {', '#endif', '',
        *[f'#define {name} {value}' + (f'   /* {why} */' if why else '') for name, value, why in sizes],
        api.rstrip(), '', '#ifdef __cplusplus', '}', '#endif', '#endif', ''])
