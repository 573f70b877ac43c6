"""Rendering: a ``Program`` becomes the C source of the generated ``nn``
extension module.

Every line of C comes from this package: ``scalar.py`` (the op table),
``sum.py`` and ``matvec.py`` (one file per kind of vector op), ``layout.py``
(the scratch arrays), and the fixed boilerplate in the ``templates/`` folder,
filled with ``string.Template``. Only numbers this package formats itself and
integer slot indices reach the C text: op names select rows of the op
table, they are never copied.
"""
import hashlib
from string import Template

from compiler.codegen import matvec, sum as sum_c
from compiler.codegen.layout import ScratchLayout
from compiler.codegen.scalar import ScalarRenderer, c_double
from compiler.constants import BACKWARD_PARAMS, CHUNK, DEFER_ROWS, FORWARD_PARAMS
from compiler.ir import MatVec, Op, Sum, needs_grad
from compiler.templates import read_template

__all__ = ['emit_module', 'emit_program', 'c_double', 'GENERATOR_VERSION']

GENERATOR_VERSION = '2'

# The renderer of each kind of vector op.
RENDERERS = {Sum: sum_c, MatVec: matvec}


class Loops:
    """The vector ops that are loops, each direction a function of its own,
    built for several instruction sets (``LOOPS`` in the template): the
    straight-line code around them is compiled once."""

    def __init__(self):
        self.functions = []
        self.names = {}

    def call(self, op, direction, params, body):
        """A call of ``op``'s ``direction`` (a function with ``params`` and the
        block ``body``), defining that function."""
        if op not in self.names:
            self.names[op] = f'{type(op).__name__.lower()}{len(self.names) + 1}'
        name = f'{self.names[op]}_{direction}'
        self.functions.append(f'static LOOPS void\n{name}({params[0]})\n' + '\n'.join(body) + '\n')
        return f'{name}({params[1]});   /* {op} */'


def _vector_op(op, direction, body, loops):
    """A vector op's ``body`` for one direction: a call of a loop function, or
    the straight-line block itself."""
    params = FORWARD_PARAMS if direction == 'forward' else BACKWARD_PARAMS
    return loops.call(op, direction, params, body) if RENDERERS[type(op)].LOOPS else '\n'.join(body)


def _forward(program, scalar, layout, loops):
    lines = []
    for op in program.ops:
        if type(op) is Op:
            lines.append(scalar.forward(op))
        else:
            body = RENDERERS[type(op)].forward(op, scalar, layout.get(op))
            lines.append(_vector_op(op, 'forward', body, loops))
    return lines


def _backward(program, scalar, layout, flags, loops):
    """Reverse-mode sweep over the loss's cone, skipping dead gradients."""
    lines = []
    for op in reversed(program.grad_ops):
        if type(op) is Op:
            if flags[op.out]:
                lines.extend(scalar.backward(op, flags))
        elif any(flags[o] for o in op.writes):
            body = RENDERERS[type(op)].backward(op, flags, layout.get(op))
            lines.append(_vector_op(op, 'backward', body, loops))
    return lines


def _chunked(name, params, lines, prologue=()):
    """``name`` as a function calling ``noinline`` chunks of the statements
    ``lines`` (a vector op's block, newlines and all, is one statement)."""
    out = []
    calls = []
    for n, start in enumerate(range(0, len(lines), CHUNK)):
        out.append(f'static NOINLINE void\n{name}_{n}({params[0]})\n{{')
        out.append('    ' + '\n'.join(lines[start:start + CHUNK]).replace('\n', '\n    '))
        out.append('}\n')
        calls.append(f'    {name}_{n}({params[1]});')
    out.append(f'static void\n{name}({params[0]})\n{{')
    out.extend('    ' + line for line in prologue)
    out.extend(calls)
    out.append('    (void)data;')
    out.append('}\n')
    return out


def emit_program(program):
    """The C functions of the program: ``init_constants``, ``refresh_aux``,
    ``forward``, ``backward``, ``flush``, and the loops they call; and the
    scratch layout they use."""
    scalar = ScalarRenderer(program.n_slots)
    layout = ScratchLayout(program)
    flags = needs_grad(program)
    vector_ops = [op for op in program.ops if type(op) is not Op]
    out = ['static void\ninit_constants(double *restrict data)\n{']
    out.extend(f'    data[{s}] = {c_double(v)};' for s, v in program.constants.items())
    out.append('    (void)data;\n}\n')

    out.append('static void\nrefresh_aux(const double *restrict data, double *restrict aux)\n{')
    for op in vector_ops:
        out.extend('    ' + line for line in RENDERERS[type(op)].refresh_aux(op, layout.get(op)))
    out.append('    (void)data; (void)aux;\n}\n')

    loops = Loops()
    forward = _forward(program, scalar, layout, loops)
    backward = _backward(program, scalar, layout, flags, loops)
    out.extend(loops.functions)
    out.extend(_chunked('forward', FORWARD_PARAMS, forward))
    # only computed values carry gradients besides the parameters
    leaves = program.n_leaves
    zero = [f'memset(grad + {leaves}, 0, sizeof(double) * {program.n_slots - leaves});',
            f'grad[{program.loss}] = 1.0;']
    out.extend(_chunked('backward', BACKWARD_PARAMS, backward, prologue=zero))
    flush = [line for op in vector_ops
             for line in RENDERERS[type(op)].flush(op, layout.get(op))]
    out.append(f'static {"LOOPS" if flush else "NOINLINE"} void\n'
               'flush(double *restrict grad, int *restrict index, double *restrict defer)\n{')
    out.extend('    ' + line for line in flush)
    out.append('    (void)grad; (void)index; (void)defer;\n}\n')
    return '\n'.join(out), layout


def emit_module(program):
    """The complete C source of the ``nn`` extension module."""
    kernels, layout = emit_program(program)
    outputs = ', '.join(map(str, program.outputs)) or '0'
    digest = hashlib.sha256(kernels.encode()).hexdigest()[:16]
    return Template(read_template('module.c')).substitute(
        generator_version=GENERATOR_VERSION, n_slots=program.n_slots,
        n_inputs=program.n_inputs, param_start=program.param_start,
        n_params=program.n_params, n_outputs=len(program.outputs),
        n_aux=layout.n_aux, n_index=layout.n_index, n_defer=layout.n_defer,
        defer_rows=DEFER_ROWS, loss=program.loss, output_slots=outputs,
        program_hash=digest, kernels=kernels)
