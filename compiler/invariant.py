"""What is the same in every row: values computed from parameters and
constants alone, and gradients that reach them the same way in every row.

Karpathy's regulariser ``alpha * sum(p * p for p in params)`` in a row's
loss is the example: its value reads no input, and, the loss's gradient
being 1 in every row (``backward`` sets it), the gradient reaching each
``p * p`` is the same in every row too, and so are the two contributions
``p * g`` its backward adds to ``p.grad``. Such ops can run once per change
of the parameters instead of once per row, with the same operations in the
same order, hence the same bits; each row still reads the results
(``Hoisted``).

- A value is **invariant** when it is a parameter or a constant, or an
  ``Op``/``Sum`` all of whose operands are invariant.
- A gradient is **invariant** when it is the loss's, or every contribution
  to it is: an ``Op``/``Sum`` with an invariant gradient whose derivative
  with respect to that operand is a constant (``+``, ``-``, ``neg``,
  ``Sum``), the other operand of a ``*`` when that is invariant, or any
  derivative of an op whose value is invariant.
"""
from dataclasses import dataclass

from compiler.ir import Op, Sum

# derivatives that are constants: each contribution is the output's gradient (or its negation)
_LINEAR = frozenset(('+', '-', 'neg'))


@dataclass(frozen=True)
class Hoisted:
    """The row-invariant part of a program, by position in ``program.ops``.

    ``forward``: the ops whose value is invariant (their forward runs once);
    ``backward``: those of them whose gradient is invariant too (their
    backward runs once); ``template``: every ``Op``/``Sum`` of the loss's
    cone with an invariant gradient, whose backward, run once on one row
    (values of the ``forward`` ops only), gives the gradients reaching the
    ``backward`` ops; ``copies``: the invariant slots that per-row code
    reads (copied into each row)."""
    forward: frozenset
    backward: frozenset
    template: tuple
    copies: tuple

    def __bool__(self):
        return bool(self.forward)


NOTHING = Hoisted(frozenset(), frozenset(), (), ())


def hoisted(program, flags):
    """The ``Hoisted`` part of ``program`` (``flags``: ``needs_grad``);
    ``NOTHING`` for a sequence (its loss's gradient depends on the positions
    run) or a loss that is no computed value."""
    if program.prefix_sums or program.loss < program.n_leaves:
        return NOTHING
    ops, n_grad = program.ops, program.n_grad_ops
    p0, n_leaves = program.param_start, program.n_leaves
    invariant = set()                       # computed slots of invariant value

    def fixed(s):
        return p0 <= s < n_leaves or s in invariant
    forward = set()
    for i, op in enumerate(ops):
        if type(op) in (Op, Sum) and all(map(fixed, op.reads)):
            forward.add(i)
            invariant.add(op.out)
    if not forward:
        return NOTHING
    varying = set()                         # slots some contribution to whose gradient varies by row
    template = []
    for i in range(n_grad - 1, -1, -1):
        op = ops[i]
        if type(op) not in (Op, Sum):
            varying.update(op.reads)
            continue
        if not flags[op.out]:
            continue
        if op.out in varying:
            varying.update(op.reads)
            continue
        template.append(i)
        if i in forward:
            continue
        if type(op) is Sum or op.name in _LINEAR:
            continue
        if op.name == '*':
            a, b = op.args
            if not fixed(b):
                varying.add(a)
            if not fixed(a):
                varying.add(b)
            continue
        varying.update(op.args)
    # once, not per row: an op of invariant value and gradient whose computed
    # operands' producers run once too (a producer running per row needs every
    # contribution to its gradient in the row)
    producer = {o: i for i, op in enumerate(ops[:n_grad]) for o in op.writes}
    backward = set()
    for i in sorted(set(template) & forward):
        if all(producer[x] in backward for x in ops[i].reads if x >= n_leaves and flags[x]):
            backward.add(i)
    # what per-row code reads of the values computed once
    read = {program.loss, *program.outputs}
    for i, op in enumerate(ops):
        if i not in forward:
            read.update(op.reads)
        elif i < n_grad and i not in backward and flags[op.out]:
            read.update(op.reads)
            read.add(op.out)
    copies = tuple(sorted(s for s in read if s in invariant))
    return Hoisted(frozenset(forward), frozenset(backward), tuple(template), copies)
