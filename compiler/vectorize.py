"""The vectorizing pass: recover sums, dot products and matrix-vector
products from a scalar ``Program``, keeping its results bit for bit.

1. Flatten: a chain of ``+`` whose intermediates have one use each becomes
   the terms of one left fold.
2. Rows: a fold whose terms are an optional head followed by products
   ``a * b`` (each used once) is a dot product with a head (a bias).
3. Layers: rows whose products share one side, in the same order (the
   vector ``x``), and whose other sides are parameters (the matrix ``W``),
   become one ``MatVec``. A matrix may be applied to several vectors (at
   several positions, time steps): its ``MatVec`` ops then share one block
   of parameters, as long as every use of its weights is in such an op. Slots are renumbered so that ``x`` and the
   outputs ``y`` are contiguous, and parameters are permuted so that each
   ``W`` is one block, column by column (``Program.param_order`` records
   where each parameter went).
4. Everything else stays as scalar ops; other folds become ``Sum`` ops.

Exactness: a lifted op performs the same roundings in the same order as the
ops it replaces, and the pass only lifts where the backward pass's order of
gradient contributions is unchanged. A layer is lifted only if its heads are
used once, its weights only by layers of the same matrix, and its inputs
either need no gradient or are used by this layer alone, with the rows
reached in the same order for every column. After rescheduling, ``_same_gradient_order`` checks every slot with
more than one consumer; if any order changed, the pass gives up and returns
the program unchanged.
"""
import heapq
from collections import Counter, defaultdict
from itertools import chain

from compiler.ir import MatVec, Op, Program, Sum, needs_grad, prefixes_hold

MIN_SUM_TERMS = 3    # a 2-term fold is just a '+'
MIN_ROW_PRODUCTS = 2


def vectorize(program):
    """``Program -> Program`` with ``Sum`` and ``MatVec`` ops lifted out."""
    if 'vectorize' in program.passes:
        return program
    cone = program.ops[:program.n_grad_ops]
    producer = {op.out: i for i, op in enumerate(program.ops)}
    uses = Counter(chain.from_iterable(op.reads for op in program.ops))
    uses.update((program.loss, *program.outputs, *program.prefix_sums))   # read from outside
    flags = needs_grad(program)

    folds = _flatten_sums(cone, producer, uses)
    rows = {}
    for root, (terms, members) in list(folds.items()):
        row = _as_row(terms, cone, producer, uses)
        if row is None:
            continue
        k = row[3]
        if k < len(terms):
            # the row is a prefix of the fold (a residual or a bias added
            # after it): split it off at the '+' that completes it
            row_root = members[k - 2]
            folds[row_root] = (terms[:k], members[:k - 1])
            folds[root] = ([cone[row_root].out] + terms[k:], members[k - 1:])
            root = row_root
        rows[root] = row[:3]
    layers = _group_layers(rows, program, cone, producer, uses, flags)

    lifted = {}           # op index of a unit's representative -> lifted op (old slots)
    reads = {}            # the same -> the old slots it reads
    absorbed = {}         # op index -> representative index
    for layer in layers:
        # a layer absorbs its rows' '+' chains and their products
        members = [m for root in layer.roots for m in folds[root][1] + rows[root][2]]
        rep = max(members)
        lifted[rep] = layer
        reads[rep] = layer.reads
        for m in members:
            absorbed[m] = rep
    in_layer = {root for layer in layers for root in layer.roots}
    for root, (terms, members) in folds.items():
        if root in in_layer or len(terms) < MIN_SUM_TERMS:
            continue
        lifted[root] = Sum(cone[root].out, list(terms))
        reads[root] = terms
        for m in members:
            absorbed[m] = root
    if not lifted:
        return program

    schedule = _schedule(cone, producer, reads, absorbed)
    if not _same_gradient_order(cone, schedule, absorbed, flags, uses):
        return program
    out = _renumber(program, schedule, lifted, layers)
    if program.prefix_sums and not prefixes_hold(out):
        return program        # a lifted op would mix positions
    return out


# -- 1. flatten ------------------------------------------------------------------

def _flatten_sums(cone, producer, uses):
    """``{root op index: (terms, member op indices)}`` for every maximal fold."""
    folds = {}
    for i, op in enumerate(cone):
        if op.name != '+':
            continue
        a, b = op.args
        child = None
        for chained, other in ((a, b), (b, a)):
            j = producer.get(chained)
            if j in folds and uses[chained] == 1:
                child = j
                break
        if child is None:
            folds[i] = ([a, b], [i])
        else:
            terms, members = folds.pop(child)   # single use: taken over, not copied
            terms.append(other)                 # (chain + other) == (other + chain)
            members.append(i)
            folds[i] = (terms, members)
    return folds


# -- 2. rows ---------------------------------------------------------------------

def _as_row(terms, cone, producer, uses):
    """``(head slot or None, [(a, b) of each product], product op indices, k)``
    for the longest first ``k`` terms of a fold that are an optional head and
    then products (at least two), or None."""
    def product(t):
        j = producer.get(t)
        if j is not None and j < len(cone) and cone[j].name == '*' and uses[t] == 1:
            return j
        return None
    if len(terms) >= 2 and product(terms[0]) is not None and product(terms[1]) is None:
        terms = [terms[1], terms[0]] + terms[2:]    # the first '+' is commutative
    head = None if product(terms[0]) is not None else terms[0]
    indices = []
    for t in terms[1:] if head is not None else terms:
        j = product(t)
        if j is None:
            break
        indices.append(j)
    if len(indices) < MIN_ROW_PRODUCTS:
        return None
    return head, [cone[j].args for j in indices], indices, len(indices) + (head is not None)


# -- 3. layers -------------------------------------------------------------------

class _Layer:
    """A layer in the old numbering: its rows' slots, listed explicitly. It
    becomes a ``MatVec`` when renumbered, which makes ``x`` and ``y``
    contiguous and lays ``W`` out column by column."""

    def __init__(self, roots, vector, weights, heads, y_slots, bwd_rows, grad_x, leaves):
        self.roots, self.vector, self.weights, self.heads = roots, vector, weights, heads
        self.y_slots, self.bwd_rows, self.grad_x = y_slots, bwd_rows, grad_x
        self.x_slots = list(vector) if vector[0] >= leaves else None   # computed: to renumber
        self.reads = [s for row in weights for s in row] + list(vector) + [h for h in heads if h is not None]

    def columns(self):
        """The weight slots column by column: the order of the renumbered block."""
        return [row[c] for c in range(len(self.vector)) for row in self.weights]

    def matvec(self, new):
        R, C = len(self.weights), len(self.vector)
        wt0 = new[self.weights[0][0]]
        assert all(new[s] == wt0 + k for k, s in enumerate(self.columns())), "W is not one block"
        heads = None if self.heads[0] is None else [new[h] for h in self.heads]
        return MatVec(y0=new[self.y_slots[0]], rows=R, cols=C, wt0=wt0, x0=new[self.vector[0]],
                      heads=heads, bwd_rows=self.bwd_rows, grad_x=self.grad_x)


def _group_layers(rows, program, cone, producer, uses, flags):
    """Group rows sharing their vector operand into ``MatVec`` layers."""
    def is_param_row(slots):
        # any parameters: the renumbering lays them out as W's columns
        return all(program.param_start <= s < program.param_end for s in slots)

    candidates = defaultdict(list)   # vector slots -> [(root, weight slots)]
    for root, (head, pairs, _) in rows.items():
        left = tuple(a for a, _ in pairs)
        right = tuple(b for _, b in pairs)
        options = [(right, left)] if is_param_row(left) else []
        if is_param_row(right):
            options.append((left, right))
        for vector, weights in options:
            candidates[vector].append((root, weights))

    layers, taken, blocks = [], set(), {}
    for vector, members in sorted(candidates.items(), key=lambda kv: -len(kv[1])):
        members = [(root, w) for root, w in members if root not in taken]
        if not members:
            continue
        layer = _make_layer(vector, members, rows, cone, producer, uses, flags, program)
        if layer is None or not _claim_blocks(blocks, layer):
            continue
        taken.update(layer.roots)
        layers.append(layer)
    return _consistent_weights(layers, uses)


def _consistent_weights(layers, uses):
    """The layers whose weights are used by lifted layers alone, each weight
    matrix the same wherever it is used (a matrix applied at several
    positions): its uses then share one block of parameters, laid out once.
    Layers that break this are dropped until none does."""
    while True:
        count = Counter(s for layer in layers for row in layer.weights for s in row)
        matrix = {}
        bad = set()
        for i, layer in enumerate(layers):
            key = tuple(map(tuple, layer.weights))
            for row in layer.weights:
                for s in row:
                    if count[s] != uses[s] or matrix.setdefault(s, key) != key:
                        bad.add(i)
        if not bad:
            return layers
        layers = [layer for i, layer in enumerate(layers) if i not in bad]


def _make_layer(vector, members, rows, cone, producer, uses, flags, program):
    members.sort(key=lambda m: m[1][0])        # rows in the weights' order
    R, C = len(members), len(vector)
    if len(set(vector)) != C:
        return None
    weights = [s for _, w in members for s in w]
    if len(set(weights)) != len(weights):      # each weight in one row, once (it may be
        return None                            # shared with other layers: _consistent_weights)
    heads = [rows[root][0] for root, _ in members]
    if any(h is None for h in heads) != all(h is None for h in heads):
        return None
    operands = set(vector).union(weights)
    for h in heads:
        if h is not None and (flags[h] and uses[h] != 1 or h in operands):
            return None
    x_needs_grad = any(flags[s] for s in vector)
    if x_needs_grad and any(uses[s] != R for s in vector):
        return None       # x feeds something else: its gradient order could change
    # the order in which backward reaches the rows: latest product first, and
    # the same order for every column
    position = [rows[root][2] for root, _ in members]
    bwd_rows = sorted(range(R), key=lambda r: -position[r][0])
    if x_needs_grad:
        for c in range(C):
            if any(position[bwd_rows[k]][c] < position[bwd_rows[k + 1]][c] for k in range(R - 1)):
                return None
    leaves = program.n_leaves
    if not (all(s < leaves for s in vector) and all(s == vector[0] + c for c, s in enumerate(vector))
            or all(s >= leaves for s in vector)):
        return None       # x must be contiguous leaves, or computed slots we can renumber
    roots = [root for root, _ in members]
    y_slots = [cone[root].out for root in roots]
    return _Layer(roots, vector, [w for _, w in members], heads, y_slots, bwd_rows,
                  x_needs_grad, leaves)


def _claim_blocks(blocks, layer):
    """Reserve contiguous blocks for ``y`` (and computed ``x``); False on a conflict."""
    wanted = [layer.y_slots] + ([layer.x_slots] if layer.x_slots else [])
    for block in wanted:
        key = tuple(block)
        for s in block:
            if s in blocks and blocks[s] != key:
                return False
    for block in wanted:
        for s in block:
            blocks[s] = tuple(block)
    return True


# -- 4. schedule and check ---------------------------------------------------------

def _schedule(cone, producer, reads, absorbed):
    """Units (op indices of scalar ops and lifted reps) in a topological order
    that stays as close to the original as dependencies allow."""
    units = [i for i in range(len(cone)) if i not in absorbed or i in reads]
    unit_of = {}
    for i in range(len(cone)):
        unit_of[i] = absorbed.get(i, i)
    deps = {}
    for u in units:
        slots = reads[u] if u in reads else cone[u].args
        deps[u] = {unit_of[producer[a]] for a in slots if a in producer} - {u}
    waiting = {u: len(d) for u, d in deps.items()}
    users = defaultdict(list)
    for u, d in deps.items():
        for p in d:
            users[p].append(u)
    ready = [u for u, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in users[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, v)
    assert len(order) == len(units), "the lifted program has a cycle"
    return order


def _same_gradient_order(cone, schedule, absorbed, flags, uses):
    """Every slot with several consumers gets its gradient contributions in
    the original order (a lifted unit counts as one consumer)."""
    shared = {a for a, n in uses.items() if n > 1 and flags[a]}
    new_pos = {u: k for k, u in enumerate(schedule)}
    last = {}
    for i, op in enumerate(cone):
        for a in op.args:
            if a in shared:
                unit = new_pos[absorbed.get(i, i)]
                prev = last.get(a)
                if prev is not None and unit < prev:
                    return False
                last[a] = unit
    return True


# -- 5. renumber -------------------------------------------------------------------

def _renumber(program, schedule, lifted, layers):
    """The lifted program over new slots: each layer's ``x`` and ``y`` become
    contiguous, and the parameters are permuted so that each layer's ``W`` is
    one block, column by column, followed by its heads where they are
    parameters of their own. Inputs and constants keep their slots."""
    leaves = program.n_leaves
    new = [None] * program.n_slots
    new[:program.n_inputs] = range(program.n_inputs)
    new[program.param_end:leaves] = range(program.param_end, leaves)
    nxt = program.param_start

    def place(block):
        nonlocal nxt
        for s in block:
            if new[s] is None:
                new[s] = nxt
                nxt += 1
    starts = {min(s for row in layer.weights for s in row): layer for layer in layers}
    for s in range(program.param_start, program.param_end):
        layer = starts.get(s)
        if layer is not None:
            place(layer.columns())
            heads = layer.heads
            if heads[0] is not None and len(set(heads)) == len(heads) and all(
                    program.param_start <= h < program.param_end and new[h] is None for h in heads):
                place(heads)
        place([s])
    assert nxt == program.param_end

    nxt = leaves
    for layer in layers:
        place(layer.x_slots or ())
        place(layer.y_slots)
    cone = program.ops[:program.n_grad_ops]
    units = [lifted[u] if u in lifted else cone[u] for u in schedule]
    tail = program.ops[program.n_grad_ops:]
    for op in units + tail:
        if not isinstance(op, _Layer):      # a layer's y is placed above
            place(op.writes)

    ops = []
    for op in units + tail:
        if isinstance(op, Op):
            ops.append(Op(op.name, new[op.out], tuple(new[a] for a in op.args), op.k))
        elif isinstance(op, Sum):
            ops.append(Sum(new[op.out], [new[t] for t in op.terms]))
        else:
            ops.append(op.matvec(new))
    param_slots = tuple(new[s] for s in program.param_slots)
    return Program(n_slots=nxt, n_inputs=program.n_inputs, n_params=program.n_params,
                   constants=program.constants, ops=ops, n_grad_ops=len(units),
                   loss=new[program.loss], outputs=tuple(new[s] for s in program.outputs),
                   passes=program.passes + ('vectorize',), slot_map=new, param_order=param_slots,
                   graph_hash=program.graph_hash, input_grads=program.input_grads,
                   labels={new[s]: label for s, label in (program.labels or {}).items()
                           if new[s] is not None},
                   prefix_sums=tuple(new[s] for s in program.prefix_sums))
