"""The compiler's IR: a flat, ordered list of ops over dense integer slots.

A *slot* is the index of one IR value, and nothing else. Layout: inputs
``[0, n_inputs)``, then parameters (in ``params`` order, unless a pass
permuted them: ``Program.param_order``), then constants, then one slot per
computed value. Every op writes one slot (a vector op: one contiguous block)
from slots written earlier. The first ``n_grad_ops`` ops are the loss's cone,
the ones ``backward`` walks; the rest compute extra ``outputs`` only.

This module says *what* is computed and imports nothing of the compiler's
other stages: how an op becomes C is ``compiler/codegen``'s business.

Ops:
- ``Op``: one scalar operation of the interpreter (``SCALAR_OPS`` lists them).
- ``Sum``: a left fold ``t0 + t1 + ... + tn`` (the vectorizing pass lifts
  chains of ``+`` into it).
- ``MatVec``: ``y = heads + W x`` with each row summed in column order (the
  vectorizing pass lifts neuron rows into it).
"""
from dataclasses import dataclass, field


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


@dataclass(eq=False)
class Program:
    n_slots: int
    n_inputs: int
    n_params: int
    constants: dict          # slot -> float
    ops: list
    n_grad_ops: int
    loss: int
    outputs: tuple
    passes: tuple = field(default=())
    slot_map: list = None    # after a renumbering pass: old slot -> new slot (None: eliminated)
    param_order: tuple = None   # the slot of each parameter, in ``params`` order (None: in order)

    @property
    def param_start(self):
        return self.n_inputs

    @property
    def param_end(self):
        return self.n_inputs + self.n_params

    @property
    def n_leaves(self):
        """Inputs, parameters and constants come first: slots below this are leaves."""
        return self.n_inputs + self.n_params + len(self.constants)

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
        lines = [f'program: {self.n_slots} slots, {len(self.ops)} ops'
                 + (f' (passes: {", ".join(self.passes)})' if self.passes else ''),
                 f'  inputs  %0..%{self.n_inputs - 1}' if self.n_inputs else '  inputs  none',
                 f'  params  %{self.param_start}..%{self.param_end - 1}' if self.n_params else '  params  none']
        for slot, value in self.constants.items():
            lines.append(f'  const   %{slot} = {value!r}')
        for i, op in enumerate(self.ops):
            if i == self.n_grad_ops:
                lines.append('  -- outputs only (not differentiated) --')
            lines.append(f'  {op}')
        lines.append(f'  loss    %{self.loss}')
        if self.outputs:
            lines.append(f'  outputs {", ".join(f"%{s}" for s in self.outputs)}')
        return '\n'.join(lines)


def needs_grad(program):
    """``flags[s]`` is true when the gradient of slot ``s`` reaches a parameter."""
    flags = bytearray(program.n_slots)
    flags[program.param_start:program.param_end] = b'\x01' * program.n_params
    for op in program.grad_ops:
        if type(op) is Op:
            if any(map(flags.__getitem__, op.args)):
                flags[op.out] = 1
        elif any(map(flags.__getitem__, op.reads)):
            for o in op.writes:
                flags[o] = 1
    return flags
