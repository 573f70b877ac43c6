"""Trace a ``Value`` graph once into a ``Program``."""
import numbers

from micrograd.engine import Constant, Value, topological_order
from compiler.ir import SCALAR_OPS, Op, Program, graph_hash, prefixes_hold


class TraceError(TypeError):
    """The graph, or the lists of inputs and parameters, cannot be compiled."""


def _check_leaves(values, what):
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, Value):
            raise TraceError(f"{what}[{i}] is a {type(v).__name__}, not a Value")
        if v._prev:
            raise TraceError(f"{what}[{i}] is the result of a {v._op!r} op; {what} must be leaf Values")
        if v._op:
            raise TraceError(f"{what}[{i}] is a leaf with op {v._op!r}; leaves have none")
        _real(v.data, f"{what}[{i}].data")
    if len(set(map(id, values))) != len(values):
        raise TraceError(f"{what} lists the same Value twice")
    return values


def trace(loss, inputs=(), params=(), outputs=(), input_grads=False):
    """The ``Program`` computing ``loss`` (and ``outputs``) from ``inputs`` and ``params``
    (and, with ``input_grads``, the gradients of the inputs too)."""
    return trace_graph(loss, inputs, params, outputs, input_grads=input_grads)[0]


def trace_with_slots(loss, inputs=(), params=(), outputs=()):
    """``trace``, and the slot of every ``Value`` in the graph (for debugging and tests)."""
    return trace_graph(loss, inputs, params, outputs)[:2]


def trace_graph(loss, inputs=(), params=(), outputs=(), constants=(), input_grads=False):
    """``(program, slot of every Value, undeclared leaves)``.

    The ``Program`` computes ``loss`` (and ``outputs``) from ``inputs`` and
    ``params``. Ops are in the interpreter's topological order from the loss,
    so that the compiled backward pass accumulates every gradient in the
    interpreter's order; ops needed only by ``outputs`` follow. Leaves not
    listed in ``inputs`` or ``params`` become constants with their current
    value; the *undeclared* ones are those the user created (not numbers an
    op wrapped, ``micrograd.engine.Constant``) and did not list in
    ``constants`` either: perhaps parameters or inputs left out by mistake.

    ``loss`` may be a list of Values, one loss per position of a sequence:
    the program's loss is then their mean as Karpathy's microgpt computes it,
    ``(1 / n) * sum(losses)``, and it can run the first ``n`` positions alone
    (``Program.prefix_sums``: the partial sums, one per position).
    """
    prefix = None
    if isinstance(loss, (list, tuple)):
        loss, prefix = _sequence_loss(loss)
    if not isinstance(loss, Value):
        raise TraceError(f"loss is a {type(loss).__name__}, not a Value")
    outputs = list(outputs)
    for i, v in enumerate(outputs):
        if not isinstance(v, Value):
            raise TraceError(f"outputs[{i}] is a {type(v).__name__}, not a Value")
    inputs = _check_leaves(inputs, 'inputs')
    params = _check_leaves(params, 'params')
    declared = set(map(id, _check_leaves(constants, 'constants')))
    if set(map(id, inputs)) & set(map(id, params)):
        raise TraceError("a Value is listed both in inputs and in params")

    slot = {}
    for v in inputs + params:
        slot[v] = len(slot)
    visited = set()
    try:
        cone = topological_order([loss], visited)
        order = cone + topological_order(outputs, visited)
    except (AttributeError, TypeError):
        raise TraceError("the graph holds an operand that is not a Value") from None

    constants = {}
    undeclared = []
    computed = []
    for v in order:
        prev = getattr(v, '_prev', None)
        if type(prev) is not tuple or not isinstance(v, Value):
            raise TraceError(f"the graph holds a {type(v).__name__} with operands "
                             f"{type(prev).__name__}: nodes must be Values "
                             "whose operands are a tuple of Values")
        if prev:
            computed.append(v)
        elif v not in slot:
            if v._op:
                raise TraceError(f"a leaf Value has op {v._op!r}; leaves have none")
            constants[len(slot)] = _real(v.data, "a constant leaf's data")
            slot[v] = len(slot)
            if type(v) is not Constant and id(v) not in declared:
                undeclared.append(v)

    # the hot loop (hundreds of thousands of ops): one dict lookup per op for its arity
    arity = {name: (info.arity, info.has_k) for name, info in SCALAR_OPS.items()}
    ops = []
    append = ops.append
    n_cone = sum(1 for v in cone if v._prev)
    n = len(slot)
    try:
        for v in computed:
            name, prev = v._op, v._prev
            expected, has_k = arity.get(name, (None, False)) if type(name) is str else (None, False)
            if len(prev) != expected:
                if expected is None:
                    raise TraceError(f"unknown op {name!r}: the compiler knows {', '.join(SCALAR_OPS)}")
                raise TraceError(f"op {name!r} has {len(prev)} operands, expected {expected}")
            if len(prev) == 2:
                args = (slot[prev[0]], slot[prev[1]])
            elif len(prev) == 1:
                args = (slot[prev[0]],)
            else:
                args = tuple([slot[c] for c in prev])
            slot[v] = n
            append(Op(name, n, args, _real(v._arg, "the exponent of '**'") if has_k else None))
            n += 1
    except KeyError:
        raise TraceError(f"the graph has a cycle through a {name!r} op") from None

    program = Program(n_slots=len(slot), n_inputs=len(inputs), n_params=len(params),
                      constants=constants, ops=ops, n_grad_ops=n_cone, loss=slot[loss],
                      outputs=tuple(slot[v] for v in outputs), input_grads=bool(input_grads))
    if prefix is not None:
        if n_cone != len(ops):
            raise TraceError("outputs of a sequence (a list of losses) must be values its losses use: "
                             "each position's ops run only with that position")
        program.prefix_sums = tuple(slot[v] for v in prefix)
        # the depth-first order makes each position's ops follow the earlier
        # ones', all in the cone of its partial sum: checked all the same
        assert prefixes_hold(program), 'a sequence traced out of position order'

    program.graph_hash = graph_hash(program)
    program.labels = {s: v.label for v, s in slot.items() if v.label and type(v.label) is str}
    return program, slot, undeclared


def _sequence_loss(losses):
    """``(1 / n) * sum(losses)`` built as Python builds it (``0 + l0``, then
    ``+ l1``...), and its partial sums: the interpreter's loss of a sequence,
    and where each shorter one stops."""
    losses = list(losses)
    if not losses:
        raise TraceError("loss is an empty list: give one loss Value per position")
    for i, v in enumerate(losses):
        if not isinstance(v, Value):
            raise TraceError(f"loss[{i}] is a {type(v).__name__}, not a Value")
    if len(set(map(id, losses))) != len(losses):
        raise TraceError("loss lists the same Value twice")
    total = 0 + losses[0]
    partial = [total]
    for v in losses[1:]:
        total = total + v
        partial.append(total)
    return (1 / len(losses)) * total, partial


def _real(x, what):
    """``x`` as a float, if it is a real number (numpy scalars included; not a
    bool, a string or anything else ``float()`` would also accept)."""
    if type(x) is float:       # the common case, without the ABC check below
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TraceError(f"{what} must be a real number, not {type(x).__name__} {x!r:.60}")
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceError(f"{what} ({type(x).__name__}) does not convert to a float: {e}") from None
