"""The compiler's IR: a flat, ordered list of ops over dense integer slots.

A *slot* is the index of one IR value, and nothing else. Layout: inputs
``[0, n_inputs)``, then parameters (in ``params`` order, unless a pass
permuted them: ``Program.param_order``), then constants, then one slot per
computed value. Every op writes one slot (a vector op: one contiguous block)
from slots written earlier. The first ``n_grad_ops`` ops are the loss's cone,
the ones ``backward`` walks; the rest compute extra ``outputs`` only.

This module says *what* is computed and imports nothing of the compiler's
other stages: how an op becomes C is ``compiler/codegen``'s business. (Three
analyses run their loops over a large program's arrays in the tracer's C
module when ``compiler.trace`` has installed it: ``use_native_loops``.)

Ops:
- ``Op``: one scalar operation of the interpreter (``SCALAR_OPS`` lists them).
- ``Sum``: a left fold ``t0 + t1 + ... + tn`` (the vectorizing pass lifts
  chains of ``+`` into it).
- ``MatVec``: ``y = heads + W x`` with each row summed in column order (the
  vectorizing pass lifts neuron rows into it).
"""
import array
import hashlib
import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalarOp:
    """What the IR knows of an interpreter op: its operand count, and whether
    it carries a numeric parameter ``k`` (the exponent of ``**``)."""
    arity: int
    has_k: bool = False


# Every op of ``micrograd/engine.py``; the C of each is in compiler/codegen/scalar.py.
SCALAR_OPS = {
    '+': ScalarOp(2), '-': ScalarOp(2), '*': ScalarOp(2), '/': ScalarOp(2),
    'neg': ScalarOp(1), '**': ScalarOp(1, has_k=True), 'relu': ScalarOp(1),
    'tanh': ScalarOp(1), 'exp': ScalarOp(1), 'log': ScalarOp(1),
    'sigmoid': ScalarOp(1), 'max': ScalarOp(2),
}


@dataclass(eq=False, slots=True)
class Op:
    """``out = name(args...)``; ``k`` is the exponent of ``**``."""
    name: str
    out: int
    args: tuple
    k: float = None

    @property
    def reads(self):
        return self.args

    @property
    def writes(self):
        return (self.out,)

    def __str__(self):
        args = ', '.join(f'%{a}' for a in self.args)
        if self.k is not None:
            args += f', {self.k!r}'
        return f'%{self.out} = {self.name}({args})'


@dataclass(eq=False)
class Sum:
    """``out = terms[0] + terms[1] + ...``, added left to right."""
    out: int
    terms: list

    @property
    def reads(self):
        return self.terms

    @property
    def writes(self):
        return (self.out,)

    def __str__(self):
        return f'%{self.out} = sum({", ".join(f"%{t}" for t in self.terms)})'


@dataclass(eq=False)
class MatVec:
    """``y[0:R] = heads + W x``: ``y[r] = heads[r] + W[r][0]*x[0] + ... + W[r][C-1]*x[C-1]``,
    added left to right (without heads, row ``r`` starts from ``W[r][0]*x[0]``).

    ``W`` is stored column by column: ``W[r][c]`` is slot ``wt0 + c * R + r``
    (parameters, permuted into that order by the pass). ``x[c]`` is slot
    ``x0 + c``, ``y[r]`` slot ``y0 + r``. ``heads[r]`` is the slot row ``r``
    starts from (a bias), or ``heads`` is ``None``. ``bwd_rows`` is the order
    in which the interpreter's backward pass reaches the rows, which decides
    the order of the contributions to the gradient of ``x``; ``grad_x`` says
    whether that gradient is needed at all.
    """
    y0: int
    rows: int
    cols: int
    wt0: int
    x0: int
    heads: list
    bwd_rows: list
    grad_x: bool

    @property
    def reads(self):
        return (list(range(self.wt0, self.wt0 + self.rows * self.cols))
                + list(range(self.x0, self.x0 + self.cols)) + list(self.heads or ()))

    def reads_array(self):
        """``reads`` as an int64 numpy array, made without the list."""
        import numpy as np
        return np.concatenate([np.arange(self.wt0, self.wt0 + self.rows * self.cols, dtype=np.int64),
                               np.arange(self.x0, self.x0 + self.cols, dtype=np.int64),
                               np.asarray(list(self.heads or ()), dtype=np.int64)])

    @property
    def writes(self):
        return range(self.y0, self.y0 + self.rows)

    def strided_heads(self):
        """``(first, stride)`` when the head slots are in arithmetic progression, else None."""
        h = self.heads
        stride = h[1] - h[0] if len(h) > 1 else 1
        if all(h[r] == h[0] + r * stride for r in range(len(h))):
            return h[0], stride
        return None

    def __str__(self):
        heads = f', heads={slot_list(self.heads)}' if self.heads else ''
        ys = f'%{self.y0}' if self.rows == 1 else f'%{self.y0}..%{self.y0 + self.rows - 1}'
        return (f'{ys} = matvec(W=%{self.wt0}[{self.rows}x{self.cols}, by column], '
                f'x=%{self.x0}..%{self.x0 + self.cols - 1}{heads})')


VECTOR_OPS = (Sum, MatVec)


def slot_list(slots):
    """``%a..%b`` for a range, ``%a+sr`` for slots ``s`` apart, else each slot."""
    step = slots[1] - slots[0] if len(slots) > 1 else None
    if step and all(s == slots[0] + r * step for r, s in enumerate(slots)):
        return f'%{slots[0]}..%{slots[-1]}' if step == 1 else f'%{slots[0]}+{step}r'
    return '[' + ', '.join(f'%{s}' for s in slots) + ']'


# Each scalar op's code in the array form (``Program.code``): its index in ``SCALAR_OPS``.
OP_NAMES = tuple(SCALAR_OPS)
OP_CODES = {name: code for code, name in enumerate(OP_NAMES)}
POW = OP_CODES['**']


@dataclass(eq=False)
class ScalarArrays:
    """A program of scalar ops only, as flat arrays (what ``trace`` builds):
    op ``i`` is ``out[i] = OP_NAMES[code[i]](a[i], b[i])`` (``b[i]`` is -1
    for a unary op), ``k`` maps the index of each ``**`` op to its exponent.
    The analyses below read these instead of ``Op`` objects."""
    code: object      # numpy int8
    out: object       # numpy int64, increasing
    a: object         # numpy int64
    b: object         # numpy int64, -1 where none
    k: dict

    def ops(self):
        """The ``Op`` objects (a compatibility view: built on first use of ``Program.ops``)."""
        names = [OP_NAMES[c] for c in self.code.tolist()]
        k = self.k
        ops = [Op(name, o, (x, y) if y >= 0 else (x,)) for name, o, x, y in
               zip(names, self.out.tolist(), self.a.tolist(), self.b.tolist())]
        for i, v in k.items():
            ops[i].k = v
        return ops

    def taken(self, ops, rename=None):
        """The arrays of the ops at ``ops`` (indices into these, in that
        order), each ``**`` with its exponent, and their slots renamed by
        ``rename`` (an array indexed by slot) when it is given."""
        import numpy as np
        ops = np.asarray(ops, dtype=np.int64)
        k = {}
        if self.k:
            where = np.full(len(self.code), -1, dtype=np.int64)
            where[ops] = np.arange(len(ops))
            moved = where[np.fromiter(self.k, dtype=np.int64, count=len(self.k))]
            kept = moved >= 0
            k = dict(zip(moved[kept].tolist(), itertools.compress(self.k.values(), kept.tolist())))
        code, out, a, b = self.code[ops], self.out[ops], self.a[ops], self.b[ops]
        if rename is not None:
            out, a, b = rename[out], rename[a], np.where(b >= 0, rename[np.maximum(b, 0)], -1)
        return ScalarArrays(code=code, out=out, a=a, b=b, k=k)

    @classmethod
    def from_ops(cls, ops):
        """The arrays of a list of scalar ``Op`` objects."""
        import numpy as np
        return cls(code=np.array([OP_CODES[op.name] for op in ops], dtype=np.int8),
                   out=np.array([op.out for op in ops], dtype=np.int64),
                   a=np.array([op.args[0] for op in ops], dtype=np.int64),
                   b=np.array([op.args[1] if len(op.args) == 2 else -1 for op in ops], dtype=np.int64),
                   k={i: op.k for i, op in enumerate(ops) if op.k is not None})

    def either(self):
        """``b`` with a unary op's ``a`` in place of -1: the operands as two
        lists a tight loop can index without a branch."""
        import numpy as np
        return np.where(self.b < 0, self.a, self.b)


class SlotMap:
    """Where a renumbering pass moved each slot: ``m[s]`` is slot ``s``'s new
    slot, or None where the pass eliminated it (inside a lifted op). One
    int64 array (-1: eliminated) rather than a list: a program of millions
    of slots gets no list of millions of Python ints."""
    __slots__ = ('array',)
    __hash__ = None

    def __init__(self, array):
        self.array = array

    def __len__(self):
        return len(self.array)

    def __getitem__(self, s):
        n = int(self.array[s])
        return None if n < 0 else n

    def __iter__(self):
        return (None if n < 0 else n for n in self.array.tolist())

    def __eq__(self, other):
        return list(self) == list(other)

    def then(self, new):
        """This map, then a later pass's ``new`` (int64 array, -1: eliminated)."""
        import numpy as np
        return SlotMap(np.where(self.array >= 0, new[self.array], -1))


def moved_labels(labels, new):
    """``labels`` (slot -> label) at their slots ``new[slot]`` after a
    renumbering pass (``new``: int64 array), without those eliminated (-1)."""
    if not labels:
        return {}
    import numpy as np
    moved = new[np.fromiter(labels, dtype=np.int64, count=len(labels))].tolist()
    return {s: label for s, label in zip(moved, labels.values()) if s >= 0}


class Program:
    """A traced program (see the module's docstring for its slots). ``ops`` is
    the list of ops; a program from ``trace`` or a pass holds its scalar ops
    as ``arrays`` (``ScalarArrays``), the lifted ones as ``lifted`` (``(index
    in ops, op)``, in order), and builds the ``Op`` objects only when
    something reads ``ops``."""

    def __init__(self, n_slots, n_inputs, n_params, constants, ops=None, n_grad_ops=0, loss=0,
                 outputs=(), passes=(), slot_map=None, param_order=None, graph_hash='',
                 input_grads=False, labels=None, prefix_sums=(), arrays=None, lifted=()):
        self.n_slots = n_slots
        self.n_inputs = n_inputs
        self.n_params = n_params
        self.constants = constants        # slot -> float
        self._ops = ops
        self.arrays = arrays              # ScalarArrays of the scalar ops, or None (see ops)
        self.lifted = lifted              # ((index in ops, lifted op), ...) beside arrays
        self.n_grad_ops = n_grad_ops
        self.loss = loss
        self.outputs = outputs
        self.passes = passes
        self.slot_map = slot_map          # after a renumbering pass: SlotMap, old slot -> new slot
        self.param_order = param_order    # the slot of each parameter, in ``params`` order (None: in order)
        self.graph_hash = graph_hash      # names the traced graph; passes keep it (see graph_hash())
        self.input_grads = input_grads    # backward also computes d loss / d input
        self.labels = labels              # slot -> the user's label of its Value (for printing only)
        self.prefix_sums = prefix_sums    # a sequence's partial loss sums, one per position (see trace)
        self.known_needs_grad = None      # needs_grad's answer, where a pass already knows it
        self.not_lifted = ()              # NotLifted: what the vectorizing pass left scalar, and why
        self.position_runs = None         # a sequence scheduled layer by layer (see positions_of_ops)

    @property
    def ops(self):
        if self._ops is None:
            scalar = self.arrays.ops() if self.arrays is not None else []
            ops, taken = [], 0
            for i, op in self.lifted:       # op goes to index i: the scalar ops before it first
                more = scalar[taken:taken + i - len(ops)]
                ops += more
                taken += len(more)
                ops.append(op)
            ops += scalar[taken:]
            self._ops = ops
        return self._ops

    @ops.setter
    def ops(self, ops):
        self._ops, self.arrays, self.lifted = ops, None, ()

    def outs_of(self, indices):
        """The output slot of each op of ``indices`` (op indices), without
        building the scalar ops' ``Op`` objects."""
        if self.arrays is None or self._ops is not None:
            ops = self.ops
            return [ops[i].out for i in indices]
        import numpy as np
        idx = np.asarray(list(indices), dtype=np.int64)
        at = np.array([i for i, _ in self.lifted], dtype=np.int64)
        before = np.searchsorted(at, idx)                # lifted ops before each index
        lifted = (before < len(at)) & (at[np.minimum(before, len(at) - 1)] == idx) if len(at) else idx < 0
        out = self.arrays.out[np.where(lifted, 0, idx - before)]
        ops = dict(self.lifted)
        return [ops[i].out if is_lifted else int(o) for i, is_lifted, o in
                zip(idx.tolist(), lifted.tolist(), out.tolist())]

    def lifted_of(self, kind):
        """The ops of type ``kind`` (a lifted op: ``MatMat``, ``Conv``...), in
        order, without building the scalar ops' ``Op`` objects."""
        if self.arrays is not None and self._ops is None:
            return [op for _, op in self.lifted if type(op) is kind]
        return [op for op in self.ops if type(op) is kind]

    @property
    def scalar_arrays(self):
        """``arrays`` when they are the whole program (no lifted ops): what
        the analyses read instead of ``ops``."""
        return self.arrays if not self.lifted else None

    @property
    def n_ops(self):
        if self._ops is None and self.arrays is not None:
            return len(self.arrays.code) + len(self.lifted)
        return len(self.ops)

    def __setattr__(self, name, value):
        # param_start, param_end and n_leaves are plain attributes (codegen
        # reads them per slot), kept in step with what they derive from
        object.__setattr__(self, name, value)
        if name in ('n_inputs', 'n_params', 'constants') and 'constants' in self.__dict__:
            d = self.__dict__
            d['param_start'] = d['n_inputs']
            d['param_end'] = d['n_inputs'] + d['n_params']
            # inputs, parameters and constants come first: slots below this are leaves
            d['n_leaves'] = d['param_end'] + len(d['constants'])

    @property
    def param_slots(self):
        """The slot of each parameter, in ``params`` order: a permutation of
        ``[param_start, param_end)``."""
        return self.param_order or range(self.param_start, self.param_end)

    @property
    def grad_ops(self):
        """The loss's cone: the ops ``backward`` walks (in reverse)."""
        return self.ops[:self.n_grad_ops]

    def __str__(self):
        """The program, runs of identical scalar ops over consecutive slots
        folded into one line (``%a..%b = relu(%c..%d)``), the user's labels
        as comments."""
        labels = self.labels or {}

        def leaves(name, first, n):
            if not n:
                return f'  {name}  none'
            named = [labels[s] for s in range(first, first + n) if s in labels]
            shown = f'  # {", ".join(named[:6])}{", ..." if len(named) > 6 else ""}' if named else ''
            return f'  {name}  {_span(first, first + n - 1)}{shown}'
        lines = [f'program: {self.n_slots} slots, {len(self.ops)} ops'
                 + (f' (passes: {", ".join(self.passes)})' if self.passes else ''),
                 leaves('inputs', 0, self.n_inputs), leaves('params', self.param_start, self.n_params)]
        for slot, value in self.constants.items():
            lines.append(f'  const   %{slot} = {value!r}')
        for part, ops in (('', self.ops[:self.n_grad_ops]), ('outputs', self.ops[self.n_grad_ops:])):
            if part and ops:
                lines.append('  -- outputs only (not differentiated) --')
            for run in scalar_runs(ops):
                named = [labels[o] for op in run for o in op.writes if o in labels]
                note = f'  # {named[0]}' + (f' .. {named[-1]}' if len(named) > 1 else '') if named else ''
                lines.append(f'  {_run_text(run)}{note}')
        lines.append(f'  loss    %{self.loss}' + (f'  # {labels[self.loss]}' if self.loss in labels else ''))
        if self.outputs:
            lines.append(f'  outputs {", ".join(f"%{s}" for s in self.outputs)}')
        return '\n'.join(lines)


def scalar_runs(ops):
    """``ops`` in maximal runs: scalar ops of one name (and exponent) whose
    outputs are consecutive slots and whose operands are, position by
    position, either consecutive slots or one slot throughout. Every other op
    is a run of its own."""
    runs = []
    for op in ops:
        if runs and _extends(runs[-1], op):
            runs[-1].append(op)
        else:
            runs.append([op])
    return runs


def _extends(run, op):
    first, last = run[0], run[-1]
    if type(op) is not Op or type(first) is not Op or op.name != first.name or op.k != first.k:
        return False
    if op.out != last.out + 1 or any(first.out <= a < op.out for a in op.args):
        return False      # not consecutive, or a chain reading the run itself
    steps = [b - a for a, b in zip(last.args, op.args)]
    if len(run) == 1:
        return all(step in (0, 1) for step in steps)
    return steps == [b - a for a, b in zip(run[0].args, run[1].args)]


def _span(a, b):
    return f'%{a}' if a == b else f'%{a}..%{b}'


def _run_text(run):
    if len(run) == 1:
        return str(run[0])
    first, last = run[0], run[-1]
    args = ', '.join(_span(a, b) for a, b in zip(first.args, last.args))
    if first.k is not None:
        args += f', {first.k!r}'
    return f'{_span(first.out, last.out)} = {first.name}({args})'


HASH_CHUNK_OPS = 1 << 16


def graph_hash(program):
    """A name for a traced program's graph: its ops, constants, inputs,
    parameters, loss and outputs. Passes keep it, so weights saved from one
    build of a graph fit every other build of it. (The bytes hashed are the
    same whether the ops are arrays or ``Op`` objects.)"""
    head = array.array('q', [program.n_inputs, program.n_params, program.loss, *program.outputs])
    h = hashlib.sha256(head.tobytes())
    arrays = program.scalar_arrays
    if arrays is not None:
        import numpy as np
        # (code, a[, b]) of each op, a chunk of ops at a time (no copies of
        # the whole program: the bytes are the same)
        for i in range(0, len(arrays.a), HASH_CHUNK_OPS):
            j = i + HASH_CHUNK_OPS
            rows = np.stack([arrays.code[i:j].astype(np.int64), arrays.a[i:j], arrays.b[i:j]], axis=1)
            keep = np.ones(rows.shape, dtype=bool)
            keep[:, 2] = arrays.b[i:j] >= 0
            h.update(rows[keep])
        ks = [arrays.k[i] for i in sorted(arrays.k)]
    else:
        flat = array.array('q')
        for op in program.ops:
            flat.append(OP_CODES[op.name])
            flat.extend(op.args)
        h.update(flat.tobytes())
        ks = [op.k for op in program.ops if op.k is not None]
    native = native_loops(program.n_ops)
    h.update(_constants_repr(program.constants, native))
    h.update(_hexes_repr(ks, native))
    return h.hexdigest()[:16]


def _constants_repr(constants, native):
    """``repr([(slot, value.hex()), ...])`` of the constants, encoded; in C
    (``native.hex_repr``, the same bytes) where their slots are a run."""
    slots = list(constants)
    if native is None or not slots or slots != list(range(slots[0], slots[0] + len(slots))):
        return repr([(s, v.hex()) for s, v in constants.items()]).encode()
    return native.hex_repr(array.array('d', constants.values()), slots[0])


def _hexes_repr(values, native):
    """``repr([v.hex(), ...])`` of floats, encoded; in C where there is ``native``."""
    if native is None:
        return repr([v.hex() for v in values]).encode()
    return native.hex_repr(array.array('d', values), None)


# Where the analyses' loops over a large program's arrays run in C: a
# function of the number of ops giving the module with ``mark_readers``,
# ``mark_operands``, ``cones_hold``, ``reads_out_of_order``,
# ``loop_periods`` and ``hex_repr`` (the loops of ``needs_grad``, ``_live``,
# ``prefixes_hold``, ``reads_out_of_order``, ``loops._find_loops`` and the
# text ``graph_hash`` hashes, same results), or None for the Python loops.
# compiler.trace installs ``walk.native_loops`` (the tracer's C module,
# loaded anyway for programs that large); ir itself imports nothing.
_native_loops_of = None


def use_native_loops(provider):
    """Run the analyses' loops in C where ``provider(n_ops)`` gives the module."""
    global _native_loops_of
    _native_loops_of = provider


def native_loops(n_ops):
    """The module of C loops for a program of ``n_ops`` ops, or None (the Python loops)."""
    return None if _native_loops_of is None else _native_loops_of(n_ops)


def int64_arrays(*arrays):
    """The arrays as the C loops read them: C-contiguous int64 (no copy when they are)."""
    import numpy as np
    return [np.ascontiguousarray(x, dtype=np.int64) for x in arrays]


def _loop_operands(arrays, native):
    """``out``, ``a`` and ``either()`` of ``arrays`` as the loops index them:
    int64 arrays for the C loops (``native``), lists for the Python ones."""
    out, a, b = arrays.out, arrays.a, arrays.either()
    return int64_arrays(out, a, b) if native is not None else (out.tolist(), a.tolist(), b.tolist())


def needs_grad(program):
    """``flags[s]`` is true when the gradient of slot ``s`` reaches a parameter
    (or, with ``program.input_grads``, an input)."""
    if program.known_needs_grad is not None:
        return bytearray(program.known_needs_grad)
    flags = bytearray(program.n_slots)
    flags[program.param_start:program.param_end] = b'\x01' * program.n_params
    if program.input_grads:
        flags[:program.n_inputs] = b'\x01' * program.n_inputs
    if program._ops is None and program.arrays is not None:
        # the scalar ops from the arrays, the lifted ones between them (no Op objects)
        arrays, n = program.arrays, program.n_grad_ops
        native = native_loops(len(arrays.out))
        out, a, b = _loop_operands(arrays, native)
        done = 0
        for rank, (position, op) in enumerate([*[(i, op) for i, op in program.lifted if i < n], (n, None)]):
            upto = position - rank        # the scalar ops before this one
            if native is not None:
                native.mark_readers(flags, out, a, b, done, upto)
            else:
                for o, x, y in zip(out[done:upto], a[done:upto], b[done:upto]):
                    if flags[x] or flags[y]:
                        flags[o] = 1
            done = upto
            if op is not None and any(map(flags.__getitem__, op.reads)):
                for o in op.writes:
                    flags[o] = 1
        return flags
    for op in program.grad_ops:
        if type(op) is Op:
            if any(map(flags.__getitem__, op.args)):
                flags[op.out] = 1
        elif any(map(flags.__getitem__, op.reads)):
            for o in op.writes:
                flags[o] = 1
    return flags


def prefix_cuts(program):
    """For a sequence program, the index of the op writing each partial sum:
    forward over ``n`` positions runs ``ops[:cuts[n - 1] + 1]``."""
    arrays = program.scalar_arrays
    if arrays is not None:
        import numpy as np
        at = np.searchsorted(arrays.out, program.prefix_sums).tolist()
        return [i if i < len(arrays.out) and arrays.out[i] == s else None
                for i, s in zip(at, program.prefix_sums)]
    at = {op.out: i for i, op in enumerate(program.ops) if type(op) is Op or type(op) is Sum}
    return [at.get(s) for s in program.prefix_sums]


def prefixes_hold(program):
    """Whether every position's ops are exactly what its partial sum needs:
    the ops after position ``j - 1``'s cut, up to and including position
    ``j``'s, all lie in the cone of ``prefix_sums[j]``. Then running the
    first ``n`` positions computes nothing a shorter sequence does not use,
    and its backward adds nothing to any gradient the interpreter's does not."""
    if program._ops is None and program.arrays is not None and program.lifted:
        return _lifted_prefixes_hold(program)
    cuts = prefix_cuts(program)
    if len(cuts) != len(program.prefix_sums) or None in cuts or cuts != sorted(cuts):
        return False
    n_ops = program.n_ops
    if program.n_grad_ops != n_ops or not n_ops or cuts[-1] != n_ops - 2:
        return False
    arrays = program.scalar_arrays
    if arrays is not None:
        if arrays.out[-1] != program.loss:
            return False
        # one mark array serves every position: a position's ops only read
        # slots written before it, so earlier positions' marks never reach it
        live = bytearray(program.n_slots)
        native = native_loops(len(arrays.out))
        out, a, b = _loop_operands(arrays, native)
        if native is not None:
            return native.cones_hold(live, out, a, b, *int64_arrays(cuts))
        start = 0
        for cut in cuts:
            live[out[cut]] = 1
            for i in range(cut, start - 1, -1):
                if not live[out[i]]:
                    return False
                live[a[i]] = 1
                live[b[i]] = 1
            start = cut + 1
        return True
    if program.ops[-1].out != program.loss:
        return False
    start = 0
    for cut in cuts:
        live = {program.ops[cut].out}
        for op in reversed(program.ops[start:cut + 1]):
            if not any(o in live for o in op.writes):
                return False
            live.update(op.reads)
        start = cut + 1
    return True


def _lifted_prefixes_hold(program):
    """``prefixes_hold`` of a program of scalar arrays with lifted ops between
    them, without building the scalar ops' ``Op`` objects (microgpt 64/4/4's
    132,704 ops in Python sets took 0.55-0.73 s): each position's scalar
    stretches marked by the C loop (or its Python twin), its lifted ops in
    Python, then every scalar op of the position checked at once. That is
    the same answer: a slot is written once, so only later ops of the
    position mark an op's output, and all of them ran before the check."""
    import numpy as np
    arrays, lifted = program.arrays, list(program.lifted)
    n_ops, n_scalar = program.n_ops, len(arrays.out)
    at = np.array([i for i, _ in lifted], dtype=np.int64)        # op index of each lifted op
    before = at - np.arange(len(lifted))                           # the scalar ops before it
    where = np.full(program.n_slots, -1, dtype=np.int64)
    where[arrays.out] = np.arange(n_scalar)
    writer = {op.out: i for i, op in lifted if type(op) is Sum}
    cuts = []
    for s in program.prefix_sums:
        k = int(where[s])
        if k < 0 and s not in writer:
            return False
        cuts.append(k + int(np.searchsorted(before, k, side='right')) if k >= 0 else writer[s])
    if cuts != sorted(cuts) or program.n_grad_ops != n_ops or cuts[-1] != n_ops - 2:
        return False
    last = n_ops - 1
    if (int(arrays.out[-1]) if not len(at) or at[-1] != last else getattr(lifted[-1][1], 'out', None)) \
            != program.loss:
        return False
    live = bytearray(program.n_slots)
    native = native_loops(n_scalar)
    out, a, b = _loop_operands(arrays, native)
    marks = np.frombuffer(live, dtype=np.uint8)

    def scalar_index(i):          # the scalar ops before op index i
        return i - int(np.searchsorted(at, i))
    start = 0
    for cut in cuts:
        lo, hi = int(np.searchsorted(at, start)), int(np.searchsorted(at, cut, side='right'))
        cut_at = int(np.searchsorted(at, cut))
        live[lifted[cut_at][1].out if cut_at < len(at) and at[cut_at] == cut else out[scalar_index(cut)]] = 1
        first, end = scalar_index(start), scalar_index(cut + 1)    # the position's scalar ops
        done = end
        for rank in reversed(range(lo, hi)):       # its lifted ops, last to first, each after the ops behind it
            i, op = lifted[rank]
            _mark_operands(native, live, out, a, b, i - rank, done)
            done = i - rank
            if not any(live[o] for o in op.writes):
                return False
            _mark_reads(live, op)
        _mark_operands(native, live, out, a, b, first, done)
        if not marks[arrays.out[first:end]].all():
            return False
        start = cut + 1
    return True


def _mark_operands(native, live, out, a, b, start, stop):
    """``live[a[i]] = live[b[i]] = 1`` for the scalar ops ``start <= i <
    stop`` with ``live[out[i]]``, last to first (``_loop_operands``' arrays)."""
    if native is not None:
        native.mark_operands(live, out, a, b, start, stop)
        return
    for o, x, y in zip(reversed(out[start:stop]), reversed(a[start:stop]), reversed(b[start:stop])):
        if live[o]:
            live[x] = 1
            live[y] = 1


def reads_out_of_order(a, b, pos, matters):
    """For the ops ``i`` reading slots ``a[i]`` and ``b[i]`` (int64 arrays;
    negative: no operand) and moved to positions ``pos[i]``: each pair of
    consecutive readers of a slot ``s`` with ``matters[s]`` (bool per slot),
    in op order, that the new positions put the other way round. Three int64
    arrays (slot, earlier reader, later reader), sorted by slot, then reader."""
    import numpy as np
    native = native_loops(len(a))
    if native is not None:
        found = np.array(native.reads_out_of_order(np.ascontiguousarray(matters, dtype=np.uint8),
                                                   *int64_arrays(a, b, pos)), dtype=np.int64).reshape(-1, 3)
        found = found[np.lexsort((found[:, 1], found[:, 0]))]
        return found[:, 0], found[:, 1], found[:, 2]
    ops = np.arange(len(a), dtype=np.int64)
    slots, reader = np.concatenate([a, b]), np.concatenate([ops, ops])
    keep = slots >= 0
    keep[keep] = matters[slots[keep]]
    slots, reader = slots[keep], reader[keep]
    order = np.argsort(slots * max(len(a), 1) + reader)   # each slot's readers in op order
    slots, reader = slots[order], reader[order]
    at = np.flatnonzero((slots[1:] == slots[:-1]) & (pos[reader[1:]] < pos[reader[:-1]]))
    return slots[at], reader[at], reader[at + 1]


def min_index_order(ptr, deps, size=0):
    """A topological order of the nodes ``0..n-1`` of a graph in which node
    ``u`` waits for the nodes ``deps[ptr[u]:ptr[u + 1]]`` (int64 arrays):
    of the nodes ready, the lowest first (Kahn's algorithm with a min-heap),
    so that the order is the numbering wherever the dependencies allow. An
    int64 array; ``ValueError`` where there is a cycle. ``size``: the ops
    of the program it is for (the C loop runs for programs as large as the C
    walk reads)."""
    import heapq
    import numpy as np
    n = len(ptr) - 1
    native = native_loops(size)
    if native is not None:
        order = np.empty(n, dtype=np.int64)
        ran = native.min_index_order(order, *int64_arrays(ptr, deps))
    else:
        # the nodes in order, each run as soon as it is ready; one that must
        # wait joins a heap when the last node it waits for has run
        ptr, deps = np.asarray(ptr).tolist(), np.asarray(deps).tolist()
        done, waiting, users, heap, out = bytearray(n), {}, {}, [], []

        def run(u):
            out.append(u)
            done[u] = 1
            for v in users.pop(u, ()):
                waiting[v] -= 1
                if not waiting[v]:
                    del waiting[v]
                    heapq.heappush(heap, v)
        for u in range(n):
            while heap and heap[0] < u:
                run(heapq.heappop(heap))
            pending = [d for d in deps[ptr[u]:ptr[u + 1]] if not done[d]]
            if not pending:
                run(u)
                continue
            waiting[u] = len(pending)
            for d in pending:
                users.setdefault(d, []).append(u)
        while heap:
            run(heapq.heappop(heap))
        order, ran = np.array(out, dtype=np.int64), len(out)
    if ran != n:
        raise ValueError(f"min_index_order: a cycle ({n - ran} of {n} nodes never ready)")
    return order


def features(program):
    """The inputs the outputs depend on, in order: what ``predict`` needs."""
    live = _live(program, program.outputs)
    return [s for s in range(program.n_inputs) if live[s]]


def inputs_used(program):
    """The inputs the loss or the outputs depend on, in order."""
    live = _live(program, (program.loss, *program.outputs))
    return [s for s in range(program.n_inputs) if live[s]]


def read_slots(op):
    """The slots a lifted ``op`` reads, as ``op.reads`` lists them (order and
    repeats), in an int64 numpy array: from the op's own ``reads_array``
    where it has one (a ``MatMat`` reads hundreds of thousands of slots),
    without building the list."""
    import numpy as np
    reads_array = getattr(op, 'reads_array', None)
    return reads_array() if reads_array is not None else np.asarray(op.reads, dtype=np.int64)


def all_slots(ops, which='reads'):
    """The slots that each of ``ops`` reads (``which='reads'``, as
    ``read_slots``) or writes (``'writes'``), one op's after the other, as
    one int64 array; and how many each op has. Thousands of small ops (a
    graph's Sums) make one array, not one each."""
    import itertools
    import numpy as np
    pieces, run, counts = [], [], []

    def flush():
        if run:
            pieces.append(np.fromiter(itertools.chain.from_iterable(run), dtype=np.int64))
            run.clear()
    for op in ops:
        if which == 'reads' and hasattr(op, 'reads_array'):     # (a block of slots: its own array)
            flush()
            pieces.append(op.reads_array())
            counts.append(len(pieces[-1]))
        else:
            run.append(getattr(op, which))
            counts.append(len(run[-1]))
    flush()
    slots = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return slots, np.array(counts, dtype=np.int64)


def _mark_reads(marks, op):
    """``marks[x] = 1`` (a bytearray) for every slot ``op`` reads."""
    import numpy as np
    np.frombuffer(marks, dtype=np.uint8)[read_slots(op)] = 1


def _live(program, roots):
    """``live[s]``: whether a slot of ``roots`` depends on slot ``s``."""
    live = bytearray(program.n_slots)
    for s in roots:
        live[s] = 1
    if program._ops is None and program.arrays is not None:
        # the scalar ops from the arrays, the lifted ones between them (no Op objects)
        arrays = program.arrays
        native = native_loops(len(arrays.out))
        out, a, b = _loop_operands(arrays, native)

        done, lifted = len(out), list(program.lifted)
        for rank in reversed(range(len(lifted))):
            position, op = lifted[rank]
            start = position - rank       # the scalar ops after this one: [start, done)
            _mark_operands(native, live, out, a, b, start, done)
            done = start
            if any(live[o] for o in op.writes):
                _mark_reads(live, op)
        _mark_operands(native, live, out, a, b, 0, done)
        return live
    for op in reversed(program.ops):
        if type(op) is Op:          # most of them: no tuple of writes to build
            if live[op.out]:
                for a in op.args:
                    live[a] = 1
        elif any(live[o] for o in op.writes):
            _mark_reads(live, op)
    return live


@dataclass(frozen=True)
class NotLifted:
    """Rows that look like a layer (``rows`` dot products over one vector of
    ``cols`` values, writing ``outs``, slots of the program the pass
    returned) but stay scalar, and why, in one line (``Program.not_lifted``)."""
    rows: int
    cols: int
    outs: tuple
    reason: str


@dataclass(eq=False)
class Loop:
    """``n`` iterations of ``body`` (``Op`` and ``Sum`` ops): iteration ``i``
    runs every op of ``body`` in order with each of its slots ``s`` moved to
    ``s + i * step``; ``steps[j]`` holds one step per slot of ``body[j]``, its
    output's first, then its operands' (``args`` or ``terms``). It stands for
    exactly the ``n * len(body)`` ops it replaces, in their order: forward
    runs the iterations first to last, backward last to first (each
    iteration's ops in reverse), so every rounding and every gradient
    contribution comes in the interpreter's order. (The lifting pass is
    ``compiler/loops.py``.)"""
    n: int
    body: tuple
    steps: tuple

    def ops(self):
        """The ops it stands for, in order."""
        out = []
        for i in range(self.n):
            for op, step in zip(self.body, self.steps):
                out.append(with_slots(op, [slot + i * d for slot, d in zip(loop_slots(op), step)]))
        return out

    def _all(self, first, last):
        """Slots ``first`` to ``last - 1`` of each body op in every iteration,
        in order (a new list; the passes and codegen ask a loop for them
        several times, and its body never changes: made once)."""
        made = self.__dict__.setdefault('_slots', {})
        if (first, last) not in made:
            made[first, last] = self._make_all(first, last)
        return list(made[first, last])

    def _make_all(self, first, last):
        import numpy as np
        base, step = [], []
        for op, steps in zip(self.body, self.steps):
            slots = loop_slots(op)[first:last]
            base += slots
            step += steps[first:first + len(slots)]
        i = np.arange(self.n, dtype=np.int64)[:, None]
        return (np.array(base, dtype=np.int64) + i * np.array(step, dtype=np.int64)).ravel().tolist()

    @property
    def reads(self):
        return self._all(1, 1 << 30)

    @property
    def writes(self):
        return self._all(0, 1)

    def __str__(self):
        def slot(s, d):
            return f'%{s}' if not d else f'%{s}{"+" if d > 0 else "-"}{abs(d) if abs(d) != 1 else ""}i'
        lines = [f'loop i < {self.n}:']
        for op, step in zip(self.body, self.steps):
            s = [slot(a, d) for a, d in zip(loop_slots(op), step)]
            name = op.name if type(op) is Op else type(op).__name__.lower()
            k = f', {op.k!r}' if type(op) is Op and op.k is not None else ''
            lines.append(f'      {s[0]} = {name}({", ".join(s[1:])}{k})')
        return '\n'.join(lines)


def loop_slots(op):
    """The slots of a ``Loop``'s body op: its output, then its operands
    (a ``Dot``'s head, if any, then ``a``, then ``b``)."""
    if type(op) is Op:
        return (op.out, *op.args)
    if type(op) is Sum:
        return (op.out, *op.terms)
    return (op.out, *([op.head] if op.head is not None else []), *op.a, *op.b)


def with_slots(op, slots):
    """``op`` over other slots (``slots`` as ``loop_slots`` lists them)."""
    if type(op) is Op:
        return Op(op.name, slots[0], tuple(slots[1:]), op.k)
    if type(op) is Sum:
        return Sum(slots[0], list(slots[1:]))
    h = 1 if op.head is not None else 0
    n = len(op.a)
    return Dot(slots[0], slots[1] if h else None, list(slots[1 + h:1 + h + n]), list(slots[1 + h + n:]))


@dataclass(eq=False)
class Dot:
    """``out = head + a[0] * b[0] + a[1] * b[1] + ...``, each product rounded,
    added left to right (without a head, from ``a[0] * b[0]``): a ``Sum`` of
    products that the loop pass (``compiler/loops.py``) fused into it, both
    sides computed values (activations) or inputs. Backward adds the
    gradient to the head's, then to each product's operands, last product
    first, ``a``'s before ``b``'s: the order of the ``Sum`` and ``*`` ops it
    replaces (the pass fuses only products whose operands no op between
    them and the fold reads)."""
    out: int
    head: object
    a: list
    b: list

    @property
    def reads(self):
        return ([self.head] if self.head is not None else []) + list(self.a) + list(self.b)

    @property
    def writes(self):
        return (self.out,)

    def __str__(self):
        head = f'%{self.head} + ' if self.head is not None else ''
        return f'%{self.out} = {head}dot({slot_list(self.a)}, {slot_list(self.b)})'


@dataclass(eq=False)
class MatMat:
    """One matrix applied at every position of a sequence at once: ``uses[t]``
    is the ``MatVec`` of position ``t`` (all of one weight block and shape).
    It computes what its uses compute, each output the same left fold, but
    reads W once for all of them; a forward over the first ``n`` positions
    runs ``uses[:n]``. The gradient of W takes the uses' contributions in the
    interpreter's backward order: the last position's first."""
    uses: tuple

    @property
    def reads(self):
        return [s for u in self.uses for s in u.reads]

    def reads_array(self):
        """``reads`` as an int64 numpy array, made without the list."""
        import numpy as np
        return np.concatenate([u.reads_array() for u in self.uses])

    @property
    def writes(self):
        return [s for u in self.uses for s in u.writes]

    def __str__(self):
        first, last = self.uses[0], self.uses[-1]
        return (f'%{first.y0}..%{last.y0 + last.rows - 1} = matmat(W=%{first.wt0}[{first.rows}x{first.cols}, '
                f'by column], {len(self.uses)} positions, x=%{first.x0}, %{self.uses[1].x0}, ..., %{last.x0})')


def unfolded(ops):
    """``ops`` with each ``MatMat`` replaced by its uses, in position order:
    the ``MatVec`` ops it computes."""
    for op in ops:
        if type(op) is MatMat:
            yield from op.uses
        else:
            yield op


def positions_of_ops(program):
    """For a sequence program, the position each op belongs to: op ``i`` runs
    in a forward over ``n`` positions when ``position[i] < n`` (-1: an op
    over positions, a ``MatMat``, which runs the first ``n`` itself); None
    for a program that is not a sequence.

    Two schedules: position by position (as traced: ``prefix_cuts``), or,
    after the positions pass, layer by layer, where ``program.position_runs``
    lists ``(start, end, position)``: ``ops[start:end]`` belong to that
    position. The last op (the mean of the losses) runs only when every
    position does: it belongs to the last position."""
    if not program.prefix_sums:
        return None
    if program.position_runs is not None:
        position = [0] * program.n_ops
        for start, end, p in program.position_runs:
            position[start:end] = [p] * (end - start)
        return position
    cuts = prefix_cuts(program)
    import numpy as np
    at = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(program.n_ops))
    return np.minimum(at, len(cuts) - 1).tolist()


def positions_of_writes(program):
    """``{slot: position}`` for each slot an op of a sequence program writes
    (a ``MatMat`` writes each use's outputs at that use's position)."""
    out = {}
    for op, p in zip(program.ops, positions_of_ops(program)):
        if type(op) is MatMat:
            for t, u in enumerate(op.uses):
                out.update(dict.fromkeys(u.writes, t))
        else:
            out.update(dict.fromkeys(op.writes, p))
    return out


@dataclass(eq=False)
class Conv:
    """A kernel applied at every position: ``y[o][p] = heads[o] + W[o][k0]*x[p][k0] + W[o][k1]*x[p][k1] + ...``
    over the kernel offsets ``k`` with ``x[p][k] >= 0``, in ascending ``k``,
    added left to right (a window cut by the padding leaves offsets out).

    ``weights[o][k]`` is the parameter slot of channel ``o``'s weight ``k``
    (``O x K``), ``heads[o]`` its head (a parameter slot), ``x[p][k]`` the slot
    of position ``p``'s input at offset ``k`` (``P x K``, -1: none),
    ``y[o][p]`` the output slot (``O x P``); numpy arrays of int64.
    ``rank[o][p]`` is the place of row ``(o, p)`` in the interpreter's
    forward order: its backward reaches the rows in descending rank, each
    row's terms last to first, which fixes the order of the contributions to
    the gradient of each weight, head and input. ``grad_x`` says whether the
    inputs' gradient is needed (each input is then read by this op alone).
    """
    weights: object
    heads: object
    x: object
    y: object
    rank: object
    grad_x: bool

    @property
    def reads(self):
        x = self.x
        return x[x >= 0].tolist() + self.weights.ravel().tolist() + self.heads.tolist()

    @property
    def writes(self):
        return self.y.ravel().tolist()

    @property
    def macs(self):
        """Multiply-adds of one forward."""
        return int((self.x >= 0).sum()) * len(self.weights)

    def __str__(self):
        O, K = self.weights.shape
        return (f'{slot_list(self.y.ravel().tolist()[:4])}.. = conv({O} channels x {len(self.x)} positions, '
                f'W=[{O}x{K}] %{self.weights.min()}.., heads={slot_list(self.heads.tolist())})')
