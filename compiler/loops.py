"""The loop pass: dot products of computed values fused into ``Dot`` ops,
then periodic stretches of a program re-rolled into ``Loop`` ops, keeping
its results bit for bit.

1. Dots (``fuse_dots``): a ``Sum`` whose terms, after an optional head, are
   products ``a * b`` used by it alone becomes one ``Dot`` (attention's
   ``q . k`` over a head, its weighted sums over the values, rmsnorm's sum
   of squares), where moving the products to the fold moves no gradient
   contribution (see ``fuse_dots``). Its C is a loop ``acc += a * b``.
2. Loops: a stretch of consecutive ops is periodic when it is ``n``
   repetitions of a body of ``p`` ops (scalar ops, ``Sum`` and ``Dot``) in
   which each op is the same op as the one ``p`` before it (name, exponent,
   operand count) and every slot moves by the same step from one
   repetition to the next: an elementwise run (``p = 1``: residual adds,
   ``exp`` over a softmax's logits, rmsnorm's scaling), a chain (``max``
   over logits: each op reads the one before), or a pattern of several ops
   (attention's ``q . k`` dot, its scaling and the running max, once per
   earlier position; the weighted sums over ``v``, once per head dimension).

Exactness of loops: a ``Loop`` runs exactly the ops it replaces in exactly
their order (forward first to last, backward last to first), so no
rounding and no gradient contribution moves: there is nothing to
reschedule, and the order of every slot's gradient contributions is the
interpreter's by construction (``vectorize._same_gradient_order`` is not
needed). A stretch is lifted only where the C can be uniform over its
iterations: each body slot needs a gradient in every iteration or in none,
and is of one kind throughout (an input, a constant or a computed value).
Ops reading a parameter stay scalar (their gradient contributions may be
recorded per row, ``codegen/layout.py``); so do the ops writing the loss
or a sequence's partial sums (``prefix_cuts`` finds those by their op), and
no stretch crosses from the loss's cone into the outputs-only ops. Equal
constants are one constant here: a body may read the first slot holding
the same double where the op read another.

How: the ops as arrays (one row of slots per op), and for every period
``p`` up to ``MAX_PERIOD`` numpy finds, at every start, how far the
repetition goes (an op equal to the one ``p`` before, a step equal to the
one ``p`` before); then one greedy scan in op order takes at each op the
period covering the most ops. Dots: the folds' terms in one array, the
readers of every slot sorted by position (``searchsorted`` counts the
readers between a product and its fold).
"""

import numpy as np

from compiler.ir import (OP_CODES, OP_NAMES, Dot, Loop, MatVec, Op, Program, ScalarArrays, Sum, loop_slots,
                         native_loops, needs_grad, with_slots)

MAX_PERIOD = 32         # ops per body at most
MAX_TERMS = 32          # terms (products) of a Sum (Dot) a body may hold
MIN_ITERATIONS = 3      # fewer repetitions stay as they are
MIN_OPS = 4             # and so do shorter stretches
MAX_CELLS = 1 << 24     # slots of the ops' table at most (int64: 128 MiB)

_SUM = len(OP_NAMES)    # the kinds of a Sum and a Dot (after the scalar ops' codes)
_DOT = _SUM + 1
_INPUT, _PARAM, _CONST, _COMPUTED, _NONE = range(5)


def lift_loops(program):
    """``Program -> Program`` with periodic stretches of ops as ``Loop`` ops."""
    if 'loops' in program.passes or program.n_ops < MIN_OPS:
        return program
    # A sequence's positions stay self-contained (ir.prefixes_hold): a fold
    # and its products lie in one position (a product is in its fold's cone
    # only), and no loop crosses the op writing a partial sum.
    program = fuse_dots(program)
    units = _Units(program)
    loops = _find_loops(units)
    if loops:
        return _rebuild(program, units, loops)
    if 'dots' in program.passes:
        program.passes += ('loops',)       # (fuse_dots made it: ours to name)
    return program


class _Units:
    """The program's ops as arrays: ``kind`` (an op code, ``_SUM``, or -1:
    never in a loop), ``slots`` (the output, then the operands; unused
    columns 0, constants as the first slot of their value) and ``sig`` (ops
    that may repeat each other have the same; -1: none). ``slots`` has a
    scalar op's three columns; a fold's whole row (``row``) is in
    ``fold_slots``, at its place in ``fold_at`` (the folds in a body are a
    few: a million ops kept one row as wide as the widest fold)."""

    def __init__(self, program):
        self.program = program
        arrays, lifted = _parts(program)
        self.arrays, self.lifted = arrays, lifted
        n_scalar = len(arrays.code)
        self.n = n = n_scalar + len(lifted)
        at_lifted = np.array([i for i, _ in lifted], dtype=np.int64)
        is_scalar = np.ones(n, dtype=bool)
        is_scalar[at_lifted] = False
        self.scalar_at = np.flatnonzero(is_scalar)       # position of each scalar op
        self.lifted_at = dict(lifted)
        folds = [(i, op, len(loop_slots(op))) for i, op in lifted if type(op) in (Sum, Dot)]
        width = 2 + 2 * MAX_TERMS            # a fold in a body has at most this many slots
        while width > 3 and n * width > MAX_CELLS:
            width //= 2                      # (a huge program: only shorter folds in bodies)
        sums = [(i, op) for i, op, w in folds if w <= width]
        width = max([3] + [w for _, _, w in folds if w <= width])
        slots = np.zeros((n, 3), dtype=np.int64)
        used = np.zeros((n, 3), dtype=bool)
        kind = np.full(n, -1, dtype=np.int64)
        # the scalar ops
        binary = arrays.b >= 0
        kind[self.scalar_at] = arrays.code
        slots[self.scalar_at, 0] = arrays.out
        slots[self.scalar_at, 1] = arrays.a
        slots[self.scalar_at, 2] = np.where(binary, arrays.b, 0)
        used[:, 0] = used[:, 1] = is_scalar
        used[self.scalar_at, 2] = binary
        exponent = np.zeros(n, dtype=np.int64)          # which exponent of '**' (0: none)
        if arrays.k:                                    # numbered by their bits
            which = np.fromiter(arrays.k.keys(), dtype=np.int64, count=len(arrays.k))
            bits = np.fromiter(arrays.k.values(), dtype=np.float64, count=len(which)).view(np.uint64)
            exponent[self.scalar_at[which]] = 1 + np.unique(bits, return_inverse=True)[1].reshape(-1)
        # the short folds
        self.fold_at = np.array([i for i, _ in sums], dtype=np.int64)
        fold_slots = np.zeros((len(sums), width), dtype=np.int64)
        fold_used = np.zeros((len(sums), width), dtype=bool)
        for f, (i, op) in enumerate(sums):
            kind[i] = _SUM if type(op) is Sum else _DOT
            row = loop_slots(op)
            fold_slots[f, :len(row)] = row
            fold_used[f, :len(row)] = True
        slots[self.fold_at] = fold_slots[:, :3]
        used[self.fold_at] = fold_used[:, :3]
        # what each slot is, whether it needs a gradient; constants as the
        # first slot of their value, unused cells 0
        first_of_value, needs = _first_of_value(program), np.frombuffer(bytes(needs_grad(program)), dtype=np.uint8)
        code = _cells(program, slots, used, first_of_value, needs)
        fold_code = _cells(program, fold_slots, fold_used, first_of_value, needs)
        # never in a loop: a parameter read, the loss and the partial sums
        kind[_any_cell(code >> 1 == _PARAM)] = -1
        kind[self.fold_at[_any_cell(fold_code >> 1 == _PARAM)]] = -1
        ends = np.array([program.loss, *program.prefix_sums], dtype=np.int64)
        kind[np.isin(slots[:, 0], ends) & (kind >= 0)] = -1
        cone = np.arange(n) < program.n_grad_ops
        self.sig = _signatures(kind, (kind + 1) | cone << 8 | exponent << 9, code,
                               fold_code[kind[self.fold_at] >= _SUM])
        self.kind, self.slots, self.used = kind, slots, used
        self.fold_slots, self.fold_used = fold_slots, fold_used

    def row(self, i):
        """Unit ``i``'s slots: a fold's whole row, else its three columns."""
        if self.kind[i] >= _SUM:
            return self.fold_slots[int(np.searchsorted(self.fold_at, i))]
        return self.slots[i]

    def op(self, i, at):
        """Unit ``i`` as an ``Op``, ``Sum`` or ``Dot`` over the slots ``at`` (a ``row``)."""
        if self.kind[i] >= _SUM:
            return with_slots(self.lifted_at[i], [int(s) for s in at[:self.width(i)]])
        j = int(np.searchsorted(self.scalar_at, i))
        arrays = self.arrays
        args = (int(at[1]), int(at[2])) if arrays.b[j] >= 0 else (int(at[1]),)
        return Op(OP_NAMES[arrays.code[j]], int(at[0]), args, arrays.k.get(j))

    def width(self, i):
        if self.kind[i] >= _SUM:
            return int(self.fold_used[int(np.searchsorted(self.fold_at, i))].sum())
        return int(self.used[i].sum())


def _any_cell(mask):
    """``mask.any(axis=1)`` a column at a time (several times faster on a
    few columns)."""
    out = np.zeros(len(mask), dtype=bool)
    for c in range(mask.shape[1]):
        out |= mask[:, c]
    return out


def _cells(program, slots, used, first_of_value, needs):
    """Each cell's code, ``what it is * 2 + whether it needs a gradient``
    (``_INPUT``, ``_PARAM``, ``_CONST``, ``_COMPUTED``, ``_NONE`` unused:
    one byte a cell, the ranges below each bound counted); then ``slots``
    in place: a constant as the first slot of its value, unused cells 0."""
    leaves, p0, p1 = program.n_leaves, program.param_start, program.param_end
    cls = (slots >= program.n_inputs).view(np.int8) + (slots >= p1).view(np.int8)
    cls += (slots >= leaves).view(np.int8)
    cls[~used] = _NONE
    flag = np.where(used, needs[slots], 0).astype(np.int8)
    const = cls == _CONST
    slots[const] = first_of_value[slots[const] - p0]
    slots[~used] = 0
    return cls * 2 + flag


def _row_ranks(columns):
    """Each row's rank among the distinct rows of ``columns`` (int64 arrays of
    one length) in lexicographic order: ``np.unique(np.column_stack(columns),
    axis=0, return_inverse=True)[1]``, a column at a time (1-d sorts; a sort
    of rows as bytes is several times slower)."""
    _, rank = np.unique(columns[0], return_inverse=True)
    for column in columns[1:]:
        _, ids = np.unique(column, return_inverse=True)
        _, rank = np.unique(rank * (int(ids.max(initial=0)) + 1) + ids, return_inverse=True)
    return rank.reshape(-1)


def _signatures(kind, head, code, fold_code):
    """Each op's signature (-1: never in a loop): the same for ops that may
    repeat each other (the same ``head``, and the same code in every cell:
    4 bits each; ``code`` has a scalar op's three cells, ``fold_code`` the
    whole row of each op of a fold's kind, in order). A scalar op's cells
    and its head (numbered first) fit one small int64, numbered through a
    table; only the folds (a few) rank their rows of cells, a column of 15
    cells at a time."""
    key = _ids(head) << 12 | code[:, 0] | code[:, 1].astype(np.int64) << 4 | code[:, 2].astype(np.int64) << 8
    scalar = (kind >= 0) & (kind < _SUM)
    sig = np.where(scalar, _ids(np.where(scalar, key, 0)), -1)
    folds = np.flatnonzero(kind >= _SUM)
    if len(folds):
        cells = fold_code.astype(np.int64)
        packed = [(cells[:, c:c + 15] << (4 * np.arange(cells[:, c:c + 15].shape[1]))).sum(axis=1)
                  for c in range(0, cells.shape[1], 15)]
        sig[folds] = int(sig.max(initial=-1)) + 1 + _row_ranks([head[folds], *packed])
    return sig


def _ids(key):
    """Numbers from 0 for the distinct values of ``key`` (int64, >= 0), equal
    where the keys are: through a table of every value up to the largest
    when that is small (no sort), else by ``np.unique``."""
    top = int(key.max(initial=0))
    if top < 4 * len(key) + 1024:
        present = np.zeros(top + 1, dtype=np.int64)
        present[key] = 1
        return (np.cumsum(present) - 1)[key]
    return np.unique(key, return_inverse=True)[1].reshape(-1)


def _first_of_value(program):
    """For each constant (slot - param_start; parameters map to themselves),
    the first constant slot holding the same double (the same bits)."""
    p0, p1 = program.param_start, program.param_end
    assert p1 - p0 == program.n_params
    out = np.arange(p0, program.n_leaves, dtype=np.int64)
    if program.constants:
        at = np.fromiter(program.constants.keys(), dtype=np.int64, count=len(program.constants))
        bits = np.fromiter(program.constants.values(), dtype=np.float64, count=len(at)).view(np.uint64)
        order = np.lexsort((at, bits))                  # by value, then slot
        first = np.r_[True, bits[order][1:] != bits[order][:-1]]
        out[at[order] - p0] = at[order][np.flatnonzero(first)[np.cumsum(first) - 1]]
    return out


def _next_false(mask):
    """``out[j]``: the first index ``>= j`` where ``mask`` is false (``len(mask)``
    if none), with ``out[len(mask)] = len(mask)``."""
    n = len(mask)
    at = np.where(mask, n, np.arange(n))
    return np.r_[np.minimum.accumulate(at[::-1])[::-1], n]


def _find_loops(units):
    """``[(start, period, iterations)]``: the stretches to lift, in order.

    A step of one op from the op ``p`` before it is a row of slot
    differences; rows are compared by a linear hash (``H(x - y) = H(x) -
    H(y)``, modulo 2**64: one subtraction a period), and each stretch taken
    is then checked row by row and cut where the hash was wrong."""
    n, sig = units.n, units.sig
    weights = np.array(_hash_weights(units.fold_slots.shape[1]), dtype=np.uint64)
    hashed = units.slots.view(np.uint64) @ weights[:3]        # (no copy of the slots)
    hashed[units.fold_at] = units.fold_slots.view(np.uint64) @ weights
    best, best_p = _periods(sig, hashed, min(MAX_PERIOD, n // MIN_ITERATIONS))
    loops, at = [], 0
    for s in np.flatnonzero(best >= MIN_OPS).tolist():
        if s < at:
            continue
        p = int(best_p[s])
        k = _checked(units, s, p, int(best[s]) // p)
        if k >= MIN_ITERATIONS and k * p >= MIN_OPS:
            loops.append((s, p, k))
            at = s + k * p
    return loops


def _hash_weights(count):
    """``count`` odd 64-bit weights that look random: splitmix64's outputs
    (numpy.random would cost its import, 6 ms, in a process that has not
    loaded it)."""
    out, x, mask = [], 0, (1 << 64) - 1
    for _ in range(count):
        x = (x + 0x9E3779B97F4A7C15) & mask
        z = ((x ^ x >> 30) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ z >> 27) * 0x94D049BB133111EB) & mask
        out.append((z ^ z >> 31) | 1)
    return out


def _periods(sig, hashed, max_period):
    """For each op ``s``, the most ops a stretch from it covers (``best``, 0
    for none) and its period (``best_p``), over the periods up to
    ``max_period``: op ``j`` repeats op ``j - p`` where their signatures are
    equal (not -1), its step from it where the hashes' differences are
    (modulo 2**64); a stretch runs while both hold, for ``MIN_ITERATIONS``
    periods or more, and ends before an op of signature -1."""
    n = len(sig)
    loopable_to = _next_false(sig >= 0)
    best = np.zeros(n, dtype=np.int64)
    best_p = np.zeros(n, dtype=np.int64)
    native = native_loops(n)
    if native is not None:           # the same scan in C (walk.c: loop_periods)
        native.loop_periods(np.ascontiguousarray(sig, dtype=np.int64), np.ascontiguousarray(hashed, dtype=np.uint64),
                            loopable_to, best, best_p, max_period, MIN_ITERATIONS)
        return best, best_p
    starts = np.arange(n)
    for p in range(1, max_period + 1):
        same = np.zeros(n, dtype=bool)
        same[p:] = (sig[p:] == sig[:-p]) & (sig[p:] >= 0)
        step = hashed[p:] - hashed[:-p]
        same_step = np.zeros(n, dtype=bool)
        same_step[2 * p:] = step[p:] == step[:-p]
        end = np.minimum(_next_false(same)[np.minimum(starts + p, n)],
                         _next_false(same_step)[np.minimum(starts + 2 * p, n)])
        iterations = (end - starts) // p
        cover = np.where((iterations >= MIN_ITERATIONS) & (loopable_to[:n] >= starts + p), iterations * p, 0)
        better = cover > best
        best[better], best_p[better] = cover[better], p
    return best, best_p


def _checked(units, s, p, k):
    """How many of the ``k`` iterations from ``s`` repeat the first's steps
    exactly (each iteration has its folds at the same places: the ops
    repeat)."""
    def good(rows):
        rows = rows.reshape(k, -1)
        steps = rows[1:] - rows[:-1]
        return np.all(steps == steps[0], axis=1)
    f0, f1 = np.searchsorted(units.fold_at, [s, s + k * p])
    ok = good(units.slots[s:s + k * p]) & good(units.fold_slots[f0:f1])
    return 1 + int(np.argmin(ok)) if not ok.all() else k


def _rebuild(program, units, loops):
    """The program with each stretch replaced by its ``Loop``."""
    n = units.n
    inside = np.zeros(n + 1, dtype=np.int64)
    for s, p, k in loops:
        inside[s] += 1
        inside[s + p * k] -= 1
    absorbed = np.cumsum(inside[:n]) > 0
    loop_at = {s: (p, k) for s, p, k in loops}
    lifted_at = units.lifted_at
    keep = ~absorbed
    keep[[s for s, _, _ in loops]] = True       # each loop takes its first op's place
    new_position = np.cumsum(keep) - 1
    # scalar ops that stay
    arrays = units.arrays
    stays = ~absorbed[units.scalar_at]
    where = np.flatnonzero(stays)
    scalar = arrays.taken(where)
    lifted = []
    for i in np.flatnonzero(keep & ~np.isin(np.arange(n), units.scalar_at[where])).tolist():
        if i in loop_at:
            p, k = loop_at[i]
            body = tuple(units.op(j, units.row(j)) for j in range(i, i + p))
            steps = tuple(tuple((units.row(j + p) - units.row(j))[:units.width(j)].tolist())
                          for j in range(i, i + p))
            op = Loop(k, body, steps)
        else:
            op = lifted_at[i]
        lifted.append((int(new_position[i]), op))
    n_grad_ops = int(keep[:program.n_grad_ops].sum())
    out = Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                  constants=program.constants, arrays=scalar, lifted=tuple(lifted), n_grad_ops=n_grad_ops,
                  loss=program.loss, outputs=program.outputs, passes=program.passes + ('loops',),
                  slot_map=program.slot_map, param_order=program.param_order, graph_hash=program.graph_hash,
                  input_grads=program.input_grads, labels=program.labels, prefix_sums=program.prefix_sums)
    out.known_needs_grad = bytes(needs_grad(program))
    return out


# -- dot products of activations ---------------------------------------------------

_TIMES = OP_CODES['*']


def _parts(program):
    """``(scalar arrays, [(position, lifted op)])`` of any program."""
    if program.arrays is not None:
        return program.arrays, list(program.lifted)
    ops = program.ops
    return (ScalarArrays.from_ops([op for op in ops if type(op) is Op]),
            [(i, op) for i, op in enumerate(ops) if type(op) is not Op])


def fuse_dots(program):
    """``Program -> Program`` with each ``Sum`` of products ``a * b`` (after
    an optional head) fused with those products into a ``Dot``, where that
    moves no gradient contribution: each product is used by the fold alone,
    reads no parameter, the products come in the fold's order, and no other
    op between a product and the fold reads the product's operands (where
    they need a gradient). Backward then reaches every operand in the order
    the ``*`` ops did (see ``Dot``)."""
    arrays, lifted = _parts(program)
    n_scalar = len(arrays.code)
    n = n_scalar + len(lifted)
    is_scalar = np.ones(n, dtype=bool)
    is_scalar[[i for i, _ in lifted]] = False
    scalar_at = np.flatnonzero(is_scalar)
    # the slots each op reads (a MatVec's weights are parameters: no product reads them)
    reads = [np.arange(op.x0, op.x0 + op.cols).tolist() + list(op.heads or ()) if type(op) is MatVec else op.reads
             for _, op in lifted]
    binary = arrays.b >= 0
    slots = np.concatenate([arrays.a, arrays.b[binary], np.fromiter((s for r in reads for s in r), dtype=np.int64)])
    ends = np.array([program.loss, *program.outputs, *program.prefix_sums], dtype=np.int64)
    uses = np.bincount(np.r_[slots, ends], minlength=program.n_slots)
    needs = np.frombuffer(bytes(needs_grad(program)), dtype=np.uint8).astype(bool)
    producer = np.full(program.n_slots, -1, dtype=np.int64)      # scalar op index of each slot
    producer[arrays.out] = np.arange(n_scalar)
    p0, p1 = program.param_start, program.param_end
    product = np.zeros(program.n_slots, dtype=bool)              # a fusable product's slot
    product[arrays.out] = ((arrays.code == _TIMES) & (uses[arrays.out] == 1)
                           & ~((arrays.a >= p0) & (arrays.a < p1)) & ~((arrays.b >= p0) & (arrays.b < p1)))
    not_fused = set(program.prefix_sums)         # prefix_cuts finds these by their Op or Sum
    folds = [(i, op) for i, op in lifted if type(op) is Sum and op.out not in not_fused]
    if not folds or not product.any():
        return program
    # every fold's terms in one array; a fold is a candidate when all its
    # terms but a first one (the head, not a parameter) are products
    lengths = np.array([len(op.terms) for _, op in folds])
    start = np.cumsum(lengths) - lengths
    terms = np.concatenate([op.terms for _, op in folds]).astype(np.int64)
    fold_of = np.repeat(np.arange(len(folds)), lengths)
    is_product = product[terms]
    head = ~is_product[start]
    first_product = start + head
    ok = (lengths - head >= 2) & ~(head & (terms[start] >= p0) & (terms[start] < p1))
    position = np.arange(len(terms))
    in_products = position >= first_product[fold_of]
    ok &= np.add.reduceat(in_products & ~is_product, start) == 0
    # the products in the fold's order, and nothing between a product and the
    # fold reading its operands but the fold's later products
    k = np.where(in_products & is_product, producer[terms], 0)
    q = scalar_at[k]
    fold_at = np.array([i for i, _ in folds], dtype=np.int64)
    later = (np.r_[q[1:] > q[:-1], True] | ~in_products | ~np.r_[in_products[1:], False]
             | (np.r_[fold_of[1:], -1] != fold_of))
    ok &= np.logical_and.reduceat(later, start)
    entry = np.flatnonzero(in_products & ok[fold_of])
    if len(entry):
        fold_e = np.r_[fold_of[entry], fold_of[entry]]
        q_e = np.r_[q[entry], q[entry]]
        x_e = np.r_[arrays.a[k[entry]], arrays.b[k[entry]]]
        s_e = fold_at[fold_e]
        # the readers of those operands, by slot then position (runs: timsort)
        operand = np.zeros(program.n_slots, dtype=bool)
        operand[x_e] = True
        read = operand[slots]
        where = np.concatenate([scalar_at, scalar_at[binary],
                                np.repeat(np.array([i for i, _ in lifted], dtype=np.int64), [len(r) for r in reads])])
        key = np.sort(slots[read] * (n + 1) + where[read], kind='stable')
        total = np.searchsorted(key, x_e * (n + 1) + s_e, 'left') - np.searchsorted(key, x_e * (n + 1) + q_e, 'right')
        # reads of x by this fold's products after this one
        _, group = np.unique(fold_e * program.n_slots + x_e, return_inverse=True)
        span = int(q_e.max()) + 2
        c = group.reshape(-1) * span + q_e
        c_sorted = np.sort(c)
        same = (np.searchsorted(c_sorted, group.reshape(-1) * span + span - 1, 'left')
                - np.searchsorted(c_sorted, c, 'right'))
        bad = needs[x_e] & (total != same)
        ok[fold_e[bad]] = False
    fused, absorbed = {}, []
    for f in np.flatnonzero(ok).tolist():
        i, op = folds[f]
        ks = k[first_product[f]:start[f] + lengths[f]]
        fused[i] = Dot(op.out, int(terms[start[f]]) if head[f] else None, arrays.a[ks].tolist(), arrays.b[ks].tolist())
        absorbed.append(ks)
    if not fused:
        return program
    gone = np.zeros(n_scalar, dtype=bool)
    gone[np.concatenate(absorbed)] = True
    keep = np.ones(n, dtype=bool)
    keep[scalar_at[gone]] = False
    new_position = np.cumsum(keep) - 1
    scalar = arrays.taken(np.flatnonzero(~gone))
    new_lifted = tuple((int(new_position[i]), fused.get(i, op)) for i, op in lifted)
    out = Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                  constants=program.constants, arrays=scalar, lifted=new_lifted,
                  n_grad_ops=int(keep[:program.n_grad_ops].sum()), loss=program.loss, outputs=program.outputs,
                  passes=program.passes + ('dots',), slot_map=program.slot_map,
                  param_order=program.param_order, graph_hash=program.graph_hash,
                  input_grads=program.input_grads, labels=program.labels, prefix_sums=program.prefix_sums)
    out.known_needs_grad = bytes(needs_grad(program))
    return out
