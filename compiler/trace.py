"""Trace a ``Value`` graph once into a ``Program``."""
import numbers
from dataclasses import dataclass

import numpy as np

from micrograd.engine import Constant, Value
from compiler import walk as native_walk
from compiler.ir import (OP_CODES, POW, SCALAR_OPS, Program, ScalarArrays, graph_hash, prefixes_hold,
                         use_native_loops)

# the analyses of large programs loop in the tracer's C module too (compiler/ir.py)
use_native_loops(native_walk.native_loops)


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
    return trace_graph(loss, inputs, params, outputs, want_slots=True)[:2]


def trace_graph(loss, inputs=(), params=(), outputs=(), constants=(), input_grads=False, want_slots=False,
                native=None, on_large=None):
    """``(program, slot of every Value, undeclared leaves)`` (the slots only
    ``want_slots``; else None).

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

    ``native``: walk the graph in C (``compiler/walk.py``) where it can be
    read there; False: in Python; None (default): in C for graphs of more
    than ``walk.NATIVE_MIN_OPS`` computed Values, and for every graph once
    this process has loaded the C walk (the Python walk of the first
    ``NATIVE_MIN_OPS`` Values is then saved: 0.05 s at microgpt's
    defaults). Either walk gives the same program, numbers and errors.
    ``on_large()`` is called once, as soon as the graph is known to be large
    enough for the C walk, before that walk is loaded (or built, on a cold
    cache): ``compile()`` starts building the loop kernels then. Where the C
    walk was loaded already it is not called, and ``compile()`` starts them
    after the trace.
    """
    walker = _Walker(on_large)
    prefix = None
    if isinstance(loss, (list, tuple)):
        loss, prefix = _sequence_loss(loss)
    if not isinstance(loss, Value):
        raise TraceError(f"loss is a {type(loss).__name__}, not a Value")
    outputs = list(outputs)
    for i, v in enumerate(outputs):
        if not isinstance(v, Value):
            raise TraceError(f"outputs[{i}] is a {type(v).__name__}, not a Value")
    inputs, params, constants = list(inputs), list(params), list(constants)
    if not _leaves_fine(inputs + params, native, walker):
        inputs = _check_leaves(inputs, 'inputs')
        params = _check_leaves(params, 'params')
        if set(map(id, inputs)) & set(map(id, params)):
            raise TraceError("a Value is listed both in inputs and in params")
    if not _leaves_fine(constants, native, walker):
        _check_leaves(constants, 'constants')
    declared = set(map(id, constants))

    declared_values = inputs + params
    n_declared = len(declared_values)
    walked = _walk_graph(declared_values, loss, outputs, prefix or [], native, want_slots, walker)
    n_leaves = n_declared + len(walked.constants)
    fix = _slot_fixer(n_leaves)
    arrays = walked.arrays(n_leaves)
    constants = dict(zip(range(n_declared, n_leaves), walked.constants))
    undeclared = [v for v in walked.made_leaves if id(v) not in declared] if declared else walked.made_leaves
    n_cone = walked.n_cone
    roots = [fix(s) for s in walked.looked_up]
    loss_slot, output_slots, prefix_slots = roots[0], roots[1:1 + len(outputs)], roots[1 + len(outputs):]
    n_ops = len(arrays.code)
    program = Program(n_slots=n_leaves + n_ops, n_inputs=len(inputs), n_params=len(params),
                      constants=constants, arrays=arrays, n_grad_ops=n_cone, loss=loss_slot,
                      outputs=tuple(output_slots), input_grads=bool(input_grads))
    if prefix is not None:
        if n_cone != n_ops:
            raise TraceError("outputs of a sequence (a list of losses) must be values its losses use: "
                             "each position's ops run only with that position")
        program.prefix_sums = tuple(prefix_slots)
        # the depth-first order makes each position's ops follow the earlier
        # ones', all in the cone of its partial sum: checked all the same
        assert prefixes_hold(program), 'a sequence traced out of position order'

    program.graph_hash = graph_hash(program)
    program.labels = {fix(s): label for s, label in walked.labels}
    slot = {v: fix(s) for v, s in walked.slots.items()} if want_slots else None
    return program, slot, undeclared


_PENDING = 1 << 62      # a Value on the walk's stack: reading it as an operand means a cycle
_NO_OPERAND = -(1 << 62)


def _slot_fixer(n_leaves):
    """The final slot of a walk's provisional number: a leaf is ``-1 - slot``,
    the ``i``-th computed Value ``i`` (its slot: ``n_leaves + i``)."""
    def fix(s):
        return -1 - s if s < 0 else n_leaves + s
    return fix


@dataclass
class _Walked:
    """What a walk found, over provisional numbers (see ``_slot_fixer``):
    each computed Value's op (``code``, operands ``a``, ``b``; ``b`` is
    ``_NO_OPERAND`` for a unary op), the exponents ``k`` of ``**`` by op
    index, the constant leaves (values and Values) in the order met, the ops
    of the loss's cone (the first ``n_cone``), the numbers of the loss, the
    outputs and the partial sums (``looked_up``), the labels ``(number,
    label)``, and with ``want_slots`` every Value's number."""
    code: object
    a: object
    b: object
    k: dict
    constants: list
    made_leaves: list       # the constant leaves that are Values the user made (not Constants)
    n_cone: int
    looked_up: list
    labels: list
    slots: dict = None

    def arrays(self, n_leaves):
        """The ops as ``ScalarArrays`` over final slots (``a`` and ``b``
        become them: read this once)."""
        n = len(self.code)
        return ScalarArrays(code=self.code, out=np.arange(n_leaves, n_leaves + n, dtype=np.int64),
                            a=_final_slots(self.a, n_leaves), b=_final_slots(self.b, n_leaves), k=self.k)


def _final_slots(provisional, n_leaves):
    """``_slot_fixer`` over an array, ``_NO_OPERAND`` to -1, in place (with
    masks an eighth its size). Each temporary of an op's size is fresh
    memory the kernel zeroes page by page (52 MB at microgpt 64/4/4): the
    ``np.where`` form took 0.66 s there, a new array 0.39 s (0.10 s with
    ``compiler.pages.small_pages``, as ``compile()`` runs it)."""
    leaf, none = provisional < 0, provisional == _NO_OPERAND
    np.add(provisional, n_leaves, out=provisional, where=~leaf)
    np.subtract(-1, provisional, out=provisional, where=leaf)
    np.putmask(provisional, none, -1)
    return provisional


class _Walker:
    """The C walk module, for a trace that tells ``on_large`` before its first use."""

    def __init__(self, on_large):
        self.on_large = on_large

    def __call__(self):
        if self.on_large is not None:
            on_large, self.on_large = self.on_large, None
            on_large()
        return native_walk.native_walker()


def _leaves_fine(values, native, walker):
    """Whether the C walk finds every Value of ``values`` a leaf as
    ``_check_leaves`` wants it, none listed twice (False: let
    ``_check_leaves`` look, and say what is wrong). Only for long lists."""
    if native is False or len(values) < native_walk.NATIVE_MIN_LEAVES or not native_walk.native_enabled():
        return False
    module = walker()
    return module is not None and module.leaves_ok(Value, Constant, values)


class _TooLarge(Exception):
    """The Python walk met more computed Values than it walks by default."""


def _walk_graph(declared, loss, outputs, prefix, native, want_slots, walker):
    """A ``_Walked`` of the graph from ``loss``, then ``outputs``: by the C
    walk (``native`` True, or None and the graph is large or the C walk is
    loaded already) where it can read the graph, else by the Python walk."""
    use_c = native is not False and native_walk.native_enabled()
    module = native_walk.loaded_walker() if use_c else None
    if use_c and native is None and module is None:
        try:
            return _python_walk(declared, loss, outputs, prefix, want_slots, limit=native_walk.NATIVE_MIN_OPS)
        except _TooLarge:
            pass
    if use_c:
        module = module or walker()
        found = None if module is None else module.walk(
            Value, Constant, declared, loss, outputs, OP_CODES, _ARITY, POW,
            [loss, *outputs, *prefix], bool(want_slots))
        if found is not None:
            # (code, a and b: bytearrays, read in place, writable)
            code, a, b, k, constants, made_leaves, n_cone, looked_up, labels, slots = found
            return _Walked(np.frombuffer(code, dtype=np.int8), np.frombuffer(a, dtype=np.int64),
                           np.frombuffer(b, dtype=np.int64), k, np.frombuffer(constants).tolist(),
                           made_leaves, n_cone, np.frombuffer(looked_up, dtype=np.int64).tolist(),
                           labels, slots)
    return _python_walk(declared, loss, outputs, prefix, want_slots)


def _python_walk(declared, loss, outputs, prefix, want_slots, limit=-1):
    slot = {}
    for v in declared:
        slot[v] = -1 - len(slot)      # leaves: -1 - slot (see _slot_fixer)
    walk = _Walk(slot, len(declared), limit)
    try:
        walk.run([loss])
        n_cone = len(walk.code)
        walk.run(outputs)
    except (TraceError, _TooLarge):
        raise
    except (AttributeError, TypeError):
        raise TraceError("the graph holds an operand that is not a Value") from None
    labels = [(s, v.label) for v, s in slot.items() if v.label and type(v.label) is str]
    return _Walked(np.array(walk.code, dtype=np.int8), np.array(walk.a, dtype=np.int64),
                   np.array(walk.b, dtype=np.int64), walk.k, walk.constants, walk.made_leaves, n_cone,
                   [slot[v] for v in (loss, *outputs, *prefix)], labels, slot if want_slots else None)


class _Walk:
    """One depth-first walk over the ``Value`` graph in the interpreter's
    order (``micrograd.engine.topological_order``: children in ``_prev``
    order, post-order), appending each computed Value's op to flat lists as
    it finishes: no ``Op`` object, tuple or generator per op. (Its twin in
    C, for large graphs: ``compiler/templates/walk.c``.)

    ``slot`` maps each Value seen to a provisional number (see
    ``_slot_fixer``): leaves are numbered as they are met (inputs and
    parameters beforehand), computed Values in finishing order; the slots of
    computed Values are known only when the number of constants is.
    ``limit``: the walk stops (``_TooLarge``) at that many computed Values."""

    def __init__(self, slot, n_leaves, limit=-1):
        self.slot = slot
        self.n_leaves = n_leaves
        self.limit = limit
        self.code, self.a, self.b = [], [], []
        self.k = {}
        self.constants, self.made_leaves = [], []

    def run(self, roots):
        slot, codes, arity, limit = self.slot, OP_CODES, _ARITY, self.limit
        code, a, b = self.code, self.a, self.b
        code_append, a_append, b_append = code.append, a.append, b.append
        for root in roots:
            if root in slot:
                continue
            slot[root] = _PENDING
            stack = [root]
            push, pop = stack.append, stack.pop
            while stack:
                v = stack[-1]
                prev = v._prev
                for c in prev:
                    if c not in slot:
                        slot[c] = _PENDING
                        push(c)
                        break
                else:
                    pop()
                    if type(prev) is not tuple or not isinstance(v, Value):
                        raise TraceError(f"the graph holds a {type(v).__name__} with operands "
                                         f"{type(prev).__name__}: nodes must be Values "
                                         "whose operands are a tuple of Values")
                    if not prev:
                        self._leaf(v)
                        continue
                    name = v._op
                    op = codes.get(name) if type(name) is str else None
                    if op is None or arity[op] != len(prev):
                        _bad_op(name, prev)
                    x = slot[prev[0]]
                    if len(prev) == 2:
                        y = slot[prev[1]]
                        if x == _PENDING or y == _PENDING:
                            raise TraceError(f"the graph has a cycle through a {name!r} op")
                        b_append(y)
                    else:
                        if x == _PENDING:
                            raise TraceError(f"the graph has a cycle through a {name!r} op")
                        b_append(_NO_OPERAND)
                        if op == POW:
                            self.k[len(code)] = _real(v._arg, "the exponent of '**'")
                    n = len(code)
                    if n == limit:
                        raise _TooLarge()
                    slot[v] = n
                    code_append(op)
                    a_append(x)

    def _leaf(self, v):
        if v._op:
            raise TraceError(f"a leaf Value has op {v._op!r}; leaves have none")
        self.constants.append(_real(v.data, "a constant leaf's data"))
        if type(v) is not Constant:
            self.made_leaves.append(v)
        self.slot[v] = -1 - (self.n_leaves + len(self.constants) - 1)


_ARITY = [info.arity for info in SCALAR_OPS.values()]


def _bad_op(name, prev):
    info = SCALAR_OPS.get(name) if type(name) is str else None
    if info is None:
        raise TraceError(f"unknown op {name!r}: the compiler knows {', '.join(SCALAR_OPS)}")
    raise TraceError(f"op {name!r} has {len(prev)} operands, expected {info.arity}")


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
