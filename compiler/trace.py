"""Trace a ``Value`` graph once into a ``Program``."""
import numbers

from micrograd.engine import Value, topological_order
from compiler.ops import OPS
from compiler.program import Op, Program


class TraceError(TypeError):
    """The graph, or the lists of inputs and parameters, cannot be compiled."""


def _check_leaves(values, what):
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, Value):
            raise TraceError(f"{what}[{i}] is a {type(v).__name__}, not a Value")
        if v._prev:
            raise TraceError(f"{what}[{i}] is the result of a {v._op!r} op; {what} must be leaf Values")
    if len(set(map(id, values))) != len(values):
        raise TraceError(f"{what} lists the same Value twice")
    return values


def trace(loss, inputs=(), params=(), outputs=()):
    """The ``Program`` computing ``loss`` (and ``outputs``) from ``inputs`` and ``params``."""
    return trace_with_slots(loss, inputs, params, outputs)[0]


def trace_with_slots(loss, inputs=(), params=(), outputs=()):
    """``trace``, and the slot of every ``Value`` in the graph (for debugging and tests).

    The ``Program`` computing ``loss`` (and ``outputs``) from ``inputs`` and ``params``.

    Ops are in the interpreter's topological order from the loss, so that the
    compiled backward pass accumulates every gradient in the interpreter's
    order; ops needed only by ``outputs`` follow. Leaves not listed in
    ``inputs`` or ``params`` become constants with their current value.
    """
    if not isinstance(loss, Value):
        raise TraceError(f"loss is a {type(loss).__name__}, not a Value")
    outputs = list(outputs)
    for i, v in enumerate(outputs):
        if not isinstance(v, Value):
            raise TraceError(f"outputs[{i}] is a {type(v).__name__}, not a Value")
    inputs = _check_leaves(inputs, 'inputs')
    params = _check_leaves(params, 'params')
    if set(map(id, inputs)) & set(map(id, params)):
        raise TraceError("a Value is listed both in inputs and in params")

    slot = {}
    for v in inputs + params:
        slot[v] = len(slot)
    cone = topological_order([loss])
    in_cone = set(cone)
    order = cone + [v for v in topological_order(outputs) if v not in in_cone]

    constants = {}
    computed = []
    for v in order:
        if v._prev:
            computed.append(v)
        elif v not in slot:
            if v._op:
                raise TraceError(f"a leaf Value has op {v._op!r}; leaves have none")
            constants[len(slot)] = _constant_value(v)
            slot[v] = len(slot)

    ops = []
    n_cone = sum(1 for v in cone if v._prev)
    for v in computed:
        code = OPS.get(v._op) if isinstance(v._op, str) else None
        if code is None:
            raise TraceError(f"unknown op {v._op!r}: the compiler knows {', '.join(OPS)}")
        if len(v._prev) != code.arity:
            raise TraceError(f"op {v._op!r} has {len(v._prev)} operands, expected {code.arity}")
        k = None
        if v._op == '**':
            if isinstance(v._arg, bool) or not isinstance(v._arg, numbers.Real):
                raise TraceError(f"'**' needs a real exponent, got {v._arg!r}")
            k = float(v._arg)
        slot[v] = len(slot)
        ops.append(Op(v._op, slot[v], tuple(slot[c] for c in v._prev), k))

    program = Program(n_slots=len(slot), n_inputs=len(inputs), n_params=len(params),
                      constants=constants, ops=ops, n_grad_ops=n_cone, loss=slot[loss],
                      outputs=tuple(slot[v] for v in outputs))
    return program, slot


def _constant_value(v):
    try:
        x = float(v.data)
    except (TypeError, ValueError):
        raise TraceError(f"a constant leaf holds {v.data!r}, not a number") from None
    return x
