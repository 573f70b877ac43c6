"""Emit the C source of the ``nn`` module for a ``Program``.

Only numbers this module formats itself and integer slot indices reach the C
text: op names select entries of the op table, they are never copied.
"""
import hashlib
import math
from string import Template

from compiler.lifted import DEFER_IMAGES
from compiler.ops import OPS
from compiler.program import Op
from templates import read_template

GENERATOR_VERSION = '1'

# Statements per generated function. clang and gcc are superlinear in the
# size of one function; chunks of this size keep them near-linear.
CHUNK = 2000


def c_double(x):
    """An exact C literal for the double ``x``: no rounding in any compiler's parser.

    Small integers are written in decimal, everything else as a hex float;
    ``inf``, ``nan`` and ``-0.0`` are spelled out. Negative literals are
    parenthesised so that ``-{a}`` can never become ``--``.
    """
    x = float(x)
    if math.isnan(x):
        return 'NAN'
    if math.isinf(x):
        return 'INFINITY' if x > 0 else '(-INFINITY)'
    if x == 0.0:
        return '(-0.0)' if math.copysign(1.0, x) < 0 else '0.0'
    if x == math.floor(x) and abs(x) < 2.0 ** 53:
        text = f'{x:.1f}'
    else:
        text = x.hex()
    return f'({text})' if x < 0 else text


def needs_grad(program):
    """``flags[s]`` is true when the gradient of slot ``s`` reaches a parameter."""
    flags = bytearray(program.n_slots)
    flags[program.param_start:program.param_end] = b'\x01' * program.n_params
    for op in program.ops[:program.n_grad_ops]:
        if type(op) is Op:
            if any(map(flags.__getitem__, op.args)):
                flags[op.out] = 1
        elif any(map(flags.__getitem__, op.reads)):
            for o in op.writes:
                flags[o] = 1
    return flags


def _as_function(template, fields):
    """The op-table snippet ``template`` as a function of ``fields``: one
    f-string call per statement instead of a ``str.format`` parse. The
    templates are this package's own text, never the user's."""
    return eval(f"lambda {', '.join(fields)}: f{template!r}")


_FORWARD = {name: _as_function(
    'data[{out}] = ' + code.forward + (f'; /* {name} */' if name.isalpha() and name not in code.forward else ';'),
    ('out', 'a', 'b', 'k')) for name, code in OPS.items()}
_BACKWARD = {name: [(i, _as_function(stmt, ('a', 'b', 'o', 'g', 'ga', 'gb', 'k', 'km1')))
                    for i, stmt in code.backward] for name, code in OPS.items()}


class Emitter:
    """Formats slot reads.

    Constants are read from their slots (set once by ``init_constants``), not
    written into expressions as literals: a C compiler then cannot fold
    ``exp(2.0)`` with its own arithmetic instead of libm's, nor rewrite
    ``a >= -0.0 ? a : -0.0`` into a ``maxsd`` that returns -0.0 for +0.0
    (clang 14 does, at -O2).
    """

    def __init__(self, program):
        self.program = program
        self.data = [f'data[{s}]' for s in range(program.n_slots)]
        self.grad = [f'grad[{s}]' for s in range(program.n_slots)]

    def d(self, slot):
        return self.data[slot]

    def scalar_forward(self, op):
        args, data = op.args, self.data
        b = data[args[1]] if len(args) == 2 else ''
        k = c_double(op.k) if op.k is not None else ''
        return _FORWARD[op.name](op.out, data[args[0]], b, k)

    def scalar_backward(self, op, flags):
        args, data, grad = op.args, self.data, self.grad
        b = data[args[1]] if len(args) == 2 else ''
        k = km1 = ''
        if op.k is not None:
            k, km1 = c_double(op.k), c_double(op.k - 1.0)
        return [stmt(data[args[0]], b, data[op.out], grad[op.out], grad[args[0]], grad[args[-1]], k, km1)
                for i, stmt in _BACKWARD[op.name] if flags[args[i]]]


# The kernels' parameters: (C parameter list, the names to pass on).
FORWARD_PARAMS = ('double *restrict data, const double *restrict aux, int *restrict index',
                  'data, aux, index')
# slot: -1 adds the weight gradients of lifted layers at once; train_batch
# passes each row's place among the DEFER_IMAGES it collects for flush
BACKWARD_PARAMS = ('double *restrict data, double *restrict grad, const double *restrict aux, '
                   'int *restrict index, double *restrict defer, int slot',
                   'data, grad, aux, index, defer, slot')


class Loops:
    """The lifted ops that are loops, each direction its own function, built
    for several instruction sets (``LOOPS`` in the template): the straight-line
    code around them is compiled once."""

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


def emit_forward(program, em, loops):
    lines = []
    for op in program.ops:
        if isinstance(op, Op):
            lines.append(em.scalar_forward(op))
        elif op.loops:
            lines.append(loops.call(op, 'forward', FORWARD_PARAMS, op.c_forward(em)))
        else:
            lines.append('\n'.join(op.c_forward(em)))
    return lines


def emit_backward(program, em, flags, loops):
    """Reverse-mode sweep over the loss's cone, skipping dead gradients."""
    lines = []
    for op in reversed(program.ops[:program.n_grad_ops]):
        if isinstance(op, Op):
            if flags[op.out]:
                lines.extend(em.scalar_backward(op, flags))
        elif not any(flags[o] for o in op.writes):
            continue
        elif op.loops:
            lines.append(loops.call(op, 'backward', BACKWARD_PARAMS, op.c_backward(em, flags)))
        else:
            lines.append('\n'.join(op.c_backward(em, flags)))
    return lines


def _chunked(name, params, lines, prologue=()):
    """``name`` as a function calling ``noinline`` chunks of the statements
    ``lines`` (a lifted op's block, newlines and all, is one statement)."""
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


def emit_kernels(program):
    """The C bodies: ``init_constants``, ``refresh_aux``, ``forward``,
    ``backward``, ``flush``, and the loops they call."""
    em = Emitter(program)
    flags = needs_grad(program)
    out = ['static void\ninit_constants(double *restrict data)\n{']
    out.extend(f'    data[{s}] = {c_double(v)};' for s, v in program.constants.items())
    out.append('    (void)data;\n}\n')

    out.append('static void\nrefresh_aux(const double *restrict data, double *restrict aux)\n{')
    for op in program.ops:
        if not isinstance(op, Op):
            out.extend('    ' + line for line in op.c_refresh_aux())
    out.append('    (void)data; (void)aux;\n}\n')

    loops = Loops()
    forward = emit_forward(program, em, loops)
    backward = emit_backward(program, em, flags, loops)
    out.extend(loops.functions)
    out.extend(_chunked('forward', FORWARD_PARAMS, forward))
    # only computed values carry gradients besides the parameters
    leaves = program.n_inputs + program.n_params + len(program.constants)
    zero = [f'memset(grad + {leaves}, 0, sizeof(double) * {program.n_slots - leaves});',
            f'grad[{program.loss}] = 1.0;']
    out.extend(_chunked('backward', BACKWARD_PARAMS, backward, prologue=zero))
    flush = [line for op in program.ops if not isinstance(op, Op) for line in op.c_flush()]
    out.append(f'static {"LOOPS" if flush else "NOINLINE"} void\n'
               'flush(double *restrict grad, int *restrict index, double *restrict defer)\n{')
    out.extend('    ' + line for line in flush)
    out.append('    (void)grad; (void)index; (void)defer;\n}\n')
    return '\n'.join(out)


def scratch_size(program, kind):
    """The size of the ``kind`` scratch array (``aux``, ``index``, ``defer``):
    what the lifted ops need of it."""
    return sum(getattr(op, f'{kind}_size', 0) for op in program.ops)


def emit_module(program):
    """The complete C source of the ``nn`` extension module."""
    kernels = emit_kernels(program)
    outputs = ', '.join(map(str, program.outputs)) or '0'
    digest = hashlib.sha256(kernels.encode()).hexdigest()[:16]
    return Template(read_template()).substitute(
        generator_version=GENERATOR_VERSION, n_slots=program.n_slots,
        n_inputs=program.n_inputs, param_start=program.param_start,
        n_params=program.n_params, n_outputs=len(program.outputs),
        n_aux=scratch_size(program, 'aux'), n_index=scratch_size(program, 'index'),
        n_defer=scratch_size(program, 'defer'),
        defer_images=DEFER_IMAGES, loss=program.loss, output_slots=outputs,
        program_hash=digest, kernels=kernels)
