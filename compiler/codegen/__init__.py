"""Rendering: a ``Program`` becomes the C source of the generated ``nn``
extension module.

Every line of C comes from this package: ``scalar.py`` (the op table),
``sums.py`` and ``matvec.py`` (one file per kind of vector op), ``layout.py``
(where each slot lives), ``optimizer.py`` (the optimizer's constants), and
the fixed C in the ``templates/`` folder (``module.c``, ``kernels.c``),
filled with ``string.Template``. Only numbers this package formats itself and
integer slot indices reach the C text: op names select rows of the op table,
they are never copied.

The program runs over blocks of rows (compiler/codegen/layout.py): its
straight-line scalar code becomes per-row functions (*segments*, split at the
vector ops), and the emitted ``forward_rows``, ``backward_rows`` and
``param_grads`` run the segments and the vector ops' loops over a range of
rows, then add the parameter gradients up over the rows in row order.
"""
import hashlib
from string import Template

from compiler.codegen import optimizer as optimizer_c
from compiler.codegen.program import _Functions, _Program   # noqa: F401 (_Functions: for tests)
from compiler.codegen.scalar import c_double
from compiler.ir import features
from compiler.templates import read_template

__all__ = ['emit_module', 'c_double', 'GENERATOR_VERSION']

GENERATOR_VERSION = '3'


class Source(str):
    """The C source of a module: as one file (the string itself: what
    ``export`` writes, what a user builds by hand), and as translation units
    that build in parallel and are cached one by one (``parts``: ``[(name,
    text)]``; the loop kernels' part is the same for every program).
    ``statements``: the straight-line statements, what compile time grows
    with; ``straight``: the names of the parts that hold them."""

    def __new__(cls, text, parts=(), statements=0, straight=()):
        source = super().__new__(cls, text)
        source.parts = list(parts)
        source.statements = statements
        source.straight = frozenset(straight)
        return source


def _kernels(uses_matvec):
    """``(interface, code)`` of the loop kernels: what the module needs to
    call them, and the kernels themselves (what they share, then the loops
    once per instruction set this build may meet, and the choice of one at
    load time). Both are the same for every program."""
    if not uses_matvec:
        return '', ''
    body = read_template('kernels_body.c')

    def built_for(isa, level):
        return '\n'.join([f'#define MV_ISA {isa}', f'#define MV_LEVEL {level}', body,
                          '#undef MV_LEVEL', '#undef MV_ISA'])
    code = [read_template('kernels.c'),
            '#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))',
            built_for('plain', -1),
            '#else', '#if defined(__x86_64__)', built_for('avx512', 2), built_for('avx2', 1), '#endif',
            built_for('base', 0),
            '#endif', read_template('kernels_choose.c')]
    return read_template('kernels_api.c'), '\n'.join(code)


def _runs(program, layout):
    """``PARAM_RUNS``: where each parameter (in the user's order) is in ``p``,
    as runs ``{count, user start, user step, p start, p step}``."""
    at = [layout.shared_index(s) for s in program.param_slots]
    runs, i = [], 0
    while i < len(at):
        step = at[i + 1] - at[i] if i + 1 < len(at) else 1
        j = i + 1
        while j < len(at) and at[j] - at[j - 1] == step:
            j += 1
        runs.append(f'{{{j - i}, {i}, 1, {at[i]}, {step}}}')
        i = j
    return ', '.join(runs) or '{0, 0, 1, 0, 1}'


def _outputs(program, layout):
    return ', '.join(str(layout.row_index(s)) if layout.is_row(s) else str(-layout.shared_index(s) - 1)
                     for s in program.outputs) or '0'


def emit_module(program, optimizer=None, initial_params=None):
    """The C source of the ``nn`` extension module (a ``Source``: one file,
    and its translation units).

    ``optimizer`` (``compiler.SGD``/``Adam``/``AdamW``) is compiled in for
    ``step`` and ``train_batch`` (``program.input_grads`` makes ``backward``
    also produce d loss / d input); ``initial_params`` (in the user's order) are
    the parameters a fresh import of the module starts from (an export)."""
    prog = _Program(program)
    body, numbers = prog.emit()
    layout = prog.layout
    optimizer_defines = optimizer_c.defines(optimizer)
    segments = prog.functions.parts()
    # program_hash names all the module computes: the graph, its optimizer,
    # its gradients (the graph alone: program.graph_hash)
    digest = hashlib.sha256('\n'.join([body, *(t for part in segments for t in part),
                                       optimizer_defines]).encode()).hexdigest()[:16]
    initial = ''
    if initial_params is not None:
        values = ', '.join(c_double(x) for x in initial_params) or '0.0'
        initial = ('#define HAVE_INITIAL_PARAMS 1\n'
                   f'static const double INITIAL_PARAMS[] = {{{values}}};   /* the user\'s order */')
    feats = features(program)
    prelude = read_template('prelude.c')
    kernel_api, kernel_code = _kernels(bool(layout.matvecs))
    module = Template(read_template('module.c'))
    fields = dict(
        generator_version=GENERATOR_VERSION, program_hash=digest, graph_hash=program.graph_hash or 'none',
        n_inputs=program.n_inputs, n_params=program.n_params, n_outputs=len(program.outputs),
        n_features=len(feats), features=', '.join(map(str, feats)) or '0',
        param_runs=_runs(program, layout), output_at=_outputs(program, layout),
        initial_params=initial, optimizer=optimizer_defines, prelude=prelude, **numbers)
    every_segment = '\n'.join(t for part in segments for t in part)
    single = module.substitute(kernels_c=kernel_api + '\n' + kernel_code, program=every_segment + '\n' + body,
                               **fields)
    if not kernel_code and len(segments) <= 1:
        return Source(single, [('module', single)], prog.functions.statements)   # small: one unit
    parts = [('module', module.substitute(kernels_c=kernel_api, program=body, **fields))]
    if kernel_code:
        parts.append(('kernels', prelude + '\n' + kernel_api + '\n' + kernel_code))
    straight = [(f'segments{i + 1}', prelude + '\n' + '\n'.join(part)) for i, part in enumerate(segments)]
    return Source(single, parts + straight, prog.functions.statements, [name for name, _ in straight])
