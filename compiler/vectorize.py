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
   of parameters; its weights' other uses stay scalar. Slots are renumbered so that ``x`` and the
   outputs ``y`` are contiguous, and parameters are permuted so that each
   ``W`` is one block, column by column (``Program.param_order`` records
   where each parameter went).
4. Everything else stays as scalar ops; other folds become ``Sum`` ops.

Exactness: a lifted op performs the same roundings in the same order as the
ops it replaces, and the pass only lifts where the backward pass's order of
gradient contributions is unchanged. A layer is lifted only if its computed
heads are used once, every layer using its weights uses them as the same
matrix, and its inputs either need no gradient or are used by this layer
alone, with the rows reached in the same order for every column. Weights
(and parameter heads) may have other uses: a regulariser, a weight tied
into scalar code (``codegen/shared_grads.py`` orders their gradients). After
rescheduling, ``_gradient_order_breaks`` checks every slot with more than
one consumer; the lifted units that would change its order of gradient
contributions stay scalar, and the rest is scheduled again. What looks like
a layer but stays scalar is listed in ``Program.not_lifted`` with the
reason.

How: every step reads the program's flat arrays (``ir.ScalarArrays``):
use counts by ``np.bincount``, ``+`` chains by parent pointers (pointer
jumping to their roots), rows by run detection over the chains' terms,
layers by grouping rows on their vector operand's bytes. Python loops only
over folds, rows and layers; where lifting moved a layer past one of its
readers, the schedule is ``ir.min_index_order`` over the units (a C loop for
programs the C walk reads).
"""
from collections import defaultdict

import numpy as np

from compiler.ir import (MatVec, NotLifted, Op, OP_CODES, Program, ScalarArrays, SlotMap, Sum, int64_arrays,
                        min_index_order, moved_labels, native_loops, needs_grad, prefixes_hold, reads_out_of_order)

MIN_SUM_TERMS = 3    # a 2-term fold is just a '+'
MIN_ROW_PRODUCTS = 2

_PLUS, _TIMES = OP_CODES['+'], OP_CODES['*']


def vectorize(program):
    """``Program -> Program`` with ``Sum`` and ``MatVec`` ops lifted out.
    What looks like a layer but stays scalar is listed, with the reason, in
    the result's ``not_lifted``."""
    if 'vectorize' in program.passes:
        return program
    arrays = program.scalar_arrays
    if arrays is None:
        if not all(type(op) is Op for op in program.ops):
            return program
        arrays = ScalarArrays.from_ops(program.ops)
    g = _Graph(program, arrays)
    folds = _flatten_sums(g)
    layers, not_lifted = _group_layers(_rows(g, folds), g)      # (the rows: not kept past it)
    dropped = set()        # folds whose Sum changed an order of gradient contributions
    for _ in range(MAX_ORDER_RETRIES):
        lifted, reads, members_of = _units(g, folds, layers, dropped)
        if not lifted:
            return _unchanged(program, not_lifted)
        rep_of = np.arange(g.cone)
        for rep, members in members_of.items():
            rep_of[members] = rep
        schedule = _schedule(g, rep_of, reads)
        breaks = _gradient_order_breaks(g, schedule, rep_of, lifted)
        if breaks is None:
            return _unchanged(program, not_lifted + _given_up(layers, 'lifting would move scalar ops past '
                                                              'each other: order of gradient accumulation'))
        if not breaks:
            break
        # lifting these units would change the order in which some slot's
        # gradient gets its contributions: they stay scalar, and the rest is
        # tried again. Layers first: a layer moves its rows' products, and the
        # Sums it put out of order may keep theirs once it stays scalar (the
        # rows of a convolution, whose one position with a consecutive window
        # looked like a layer); a Sum stays scalar when it breaks an order alone.
        broken_layers = {layer.rep for layer in layers if layer.rep in breaks}
        for layer in layers:
            if layer.rep in broken_layers:
                not_lifted.append(_order_reason(layer, *breaks[layer.rep], g))
        layers = [layer for layer in layers if layer.rep not in broken_layers]
        if not broken_layers:
            dropped.update(rep for rep in breaks if isinstance(lifted[rep], Sum))
    else:
        return _unchanged(program, not_lifted + _given_up(layers, 'order of gradient accumulation'))
    del folds, reads, members_of     # op-sized arrays _renumber does not read: not held through it
    out = _renumber(program, g, schedule, rep_of, lifted, layers)
    if program.prefix_sums and not prefixes_hold(out):
        # a lifted op would mix positions
        return _unchanged(program, not_lifted + _given_up(layers, "a lifted op would mix a sequence's positions"))
    new = out.slot_map
    out.not_lifted = _not_lifted(not_lifted, layers, lambda s: new[s])
    return out


MAX_ORDER_RETRIES = 8     # rounds of dropping the units that change a gradient's order


def _units(g, folds, layers, dropped):
    """The lifted units: ``(lifted, reads, members_of)``, each keyed by the
    op index of the unit's representative (its last op): the lifted op (a
    ``_Layer`` or a ``Sum``, in old slots), the old slots it reads, and the
    op indices it absorbs (numpy)."""
    lifted, reads, members_of = {}, {}, {}
    for layer in layers:
        # a layer absorbs its rows' '+' chains and their products
        members = np.concatenate([m for root in layer.roots for m in (folds[root][1], layer.products[root])])
        layer.rep = rep = int(members.max())
        lifted[rep], reads[rep], members_of[rep] = layer, layer.reads, members
    in_layer = {root for layer in layers for root in layer.roots}
    for root, (terms, members) in folds.items():
        if root in in_layer or root in dropped or len(terms) < MIN_SUM_TERMS:
            continue
        lifted[root] = Sum(int(g.out[root]), terms.tolist())
        reads[root], members_of[root] = terms, members
    return lifted, reads, members_of


def _given_up(layers, why):
    """The reasons of layers the pass gave up on as a whole."""
    return [_Reason(*layer.weights.shape, layer.y_slots, lambda name: why) for layer in layers]


def _unchanged(program, not_lifted):
    """``program`` itself, nothing lifted, with what was not lifted and why."""
    program.not_lifted = _not_lifted(not_lifted, [], lambda s: s)
    return program


class _Graph:
    """The arrays the pass reads: ops (``code``, ``out``, ``a``, ``b``), the
    producer of each slot (op index, -1 for a leaf), use counts (reads by
    ops and from outside), and which slots need a gradient."""

    def __init__(self, program, arrays):
        self.program = program
        self.arrays = arrays
        self.code, self.out, self.a, self.b = arrays.code, arrays.out, arrays.a, arrays.b
        self.n, self.cone = len(self.code), program.n_grad_ops
        self.producer = np.full(program.n_slots + 1, -1, dtype=np.int64)   # [-1]: b of a unary op
        self.producer[self.out] = np.arange(self.n)
        self.uses = _count_reads(program.n_slots, self.a, self.b)
        np.add.at(self.uses, np.array([program.loss, *program.outputs, *program.prefix_sums], dtype=np.int64), 1)
        self.flags = needs_grad(program)
        self.needs = np.frombuffer(bytes(self.flags), dtype=np.uint8).astype(bool)
        self.leaves = program.n_leaves

    def products(self, slots):
        """Whether each slot is a product ``a * b`` in the loss's cone used once."""
        j = self.producer[slots]
        ok = (j >= 0) & (j < self.cone)
        ok[ok] &= self.code[j[ok]] == _TIMES
        return ok & (self.uses[slots] == 1)


def _count_reads(n_slots, a, b):
    """How many times the ops read each slot (``a``; ``b`` where not
    negative): an int64 array of ``n_slots``. In C for large programs."""
    native = native_loops(len(a))
    if native is None:
        return np.bincount(np.concatenate([a, b[b >= 0]]), minlength=n_slots)
    uses = np.zeros(n_slots, dtype=np.int64)
    native.count_reads(uses, *int64_arrays(a, b))
    return uses


# -- 1. flatten ------------------------------------------------------------------

def _flatten_sums(g):
    """``{root op index: (terms, member op indices)}`` (numpy arrays, members
    from the chain's first '+' up) for every maximal fold of three or more
    terms, and every two-term fold of two products (a row's shortest form)."""
    plus = np.zeros(g.n + 1, dtype=bool)           # [-1] stays False: "no producer"
    plus[:g.cone] = g.code[:g.cone] == _PLUS
    members, terms, starts = _fold_chains(g, plus)
    if not len(members):
        return {}
    sizes = np.diff(np.r_[starts, len(members)])
    t_start = starts + np.arange(len(starts))      # a chain of k '+' has k + 1 terms
    t_end = np.r_[t_start[1:], len(terms)]
    products = g.products(terms)
    wanted = (sizes >= MIN_SUM_TERMS - 1) | products[t_start] & products[t_start + 1]
    folds = {}
    for k in np.flatnonzero(wanted).tolist():
        s, n = int(starts[k]), int(sizes[k])
        folds[int(members[s + n - 1])] = (terms[t_start[k]:t_end[k]], members[s:s + n])
    return folds


def _fold_chains(g, plus):
    """The chains of '+' ops (``plus``: one flag an op, and False at [-1]):
    a '+' extends the chain of the '+' its ``a`` comes from when that ``a``
    is read only there, else that of its ``b``'s. ``(members, terms,
    starts)``: chain by chain, ordered by their last '+', the op indices from
    the first '+' up, the terms (the first's ``a`` and ``b``, then each later
    '+''s other operand; (chain + t) == (t + chain), so the term added is
    always last), and where each chain's members start. In C for large
    programs (``fold_chains`` of the tracer's module), else numpy."""
    native = native_loops(g.n)
    if native is not None:
        n_plus = int(np.count_nonzero(plus))
        members, terms = np.empty(n_plus, dtype=np.int64), np.empty(2 * n_plus, dtype=np.int64)
        starts = np.empty(n_plus, dtype=np.int64)
        chains = native.fold_chains(plus[:g.n], *int64_arrays(g.a, g.b, g.producer, g.uses), members, terms, starts)
        return members, terms[:n_plus + chains], starts[:chains]
    P = np.flatnonzero(plus[:g.n])
    a, b = g.a[P], g.b[P]
    pa, pb = g.producer[a], g.producer[b]
    via_a = plus[pa] & (g.uses[a] == 1)
    via_b = ~via_a & plus[pb] & (g.uses[b] == 1)
    child = np.where(via_a, pa, np.where(via_b, pb, -1))      # the fold this '+' extends
    other = np.where(via_a, b, a)                               # the term it adds
    at = np.full(g.n, -1, dtype=np.int64)
    at[P] = np.arange(len(P))
    up = np.arange(len(P))                      # each '+' -> the one extending it
    has_child = child >= 0
    up[at[child[has_child]]] = np.flatnonzero(has_child)
    root = up.copy()                            # pointer jumping to the top of each chain
    while True:
        nxt = up[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
        up = up[up]
    order = np.lexsort((P, root))               # chain by chain, first '+' first
    roots_sorted = root[order]
    starts = np.flatnonzero(np.r_[True, roots_sorted[1:] != roots_sorted[:-1]])
    bottom = ~has_child[order]
    n_terms = np.where(bottom, 2, 1)
    offset = np.cumsum(n_terms) - n_terms
    terms = np.empty(int(n_terms.sum()), dtype=np.int64)
    terms[offset] = np.where(bottom, a[order], other[order])
    terms[offset[bottom] + 1] = b[order][bottom]
    return P[order], terms, starts


# -- 2. rows ---------------------------------------------------------------------

def _rows(g, folds):
    """``{root: (head slot or None, a slots, b slots, product op indices)}``:
    the folds whose first ``k`` terms are an optional head and then at least
    two products ``a * b`` (each used once); a longer fold is split at the
    '+' that completes the row (a residual or a bias added after it)."""
    if not folds:
        return {}
    roots = list(folds)
    lengths = np.array([len(folds[r][0]) for r in roots])
    starts = np.cumsum(lengths) - lengths
    flat = np.concatenate([folds[r][0] for r in roots])
    is_product = g.products(flat)
    # the first '+' is commutative: a product first and a head second swap
    swap = is_product[starts] & ~is_product[starts + 1]
    row_terms = flat.copy()
    row_terms[starts[swap]], row_terms[starts[swap] + 1] = flat[starts[swap] + 1], flat[starts[swap]]
    row_product = is_product.copy()
    row_product[starts[swap]], row_product[starts[swap] + 1] = False, True
    head = ~row_product[starts]
    # a row whose first product reads a parameter (a neuron) ends at the
    # first product that reads none (say ``alpha * penalty`` added to its output)
    program = g.program
    j = g.producer[row_terms]            # (-1 where not a product: masked)

    def is_param(slots):
        return (slots >= program.param_start) & (slots < program.param_end)
    reads_param = row_product & (is_param(g.a[j]) | is_param(g.b[j]))
    first = np.minimum(starts + head, starts + lengths - 1)
    neuron = np.repeat(reads_param[first], lengths)
    position = np.arange(len(flat))
    stop = np.where(row_product & (reads_param | ~neuron), len(flat), position)
    stop[starts[head]] = len(flat)                # the head does not end the products
    first_other = np.minimum(np.minimum.reduceat(stop, starts), starts + lengths)
    n_products = first_other - starts - head
    # every row's products at once: their op indices and operands, cut per row below
    chosen = np.flatnonzero(n_products >= MIN_ROW_PRODUCTS)
    count = n_products[chosen]
    at = np.cumsum(count) - count
    j = g.producer[row_terms[np.repeat(starts[chosen] + head[chosen] - at, count) + np.arange(int(count.sum()))]]
    ja, jb = g.a[j], g.b[j]
    rows = {}
    for i, o, n, h in zip(chosen.tolist(), at.tolist(), count.tolist(), head[chosen].tolist()):
        root, k = roots[i], n + h
        terms, members = folds[root]
        if k < len(terms):
            row_root = int(members[k - 2])
            folds[row_root] = (terms[:k], members[:k - 1])
            rest = np.empty(len(terms) - k + 1, dtype=terms.dtype)
            rest[0], rest[1:] = g.out[row_root], terms[k:]
            folds[root] = (rest, members[k - 1:])
            root = row_root
        rows[root] = (int(row_terms[starts[i]]) if h else None, ja[o:o + n], jb[o:o + n], j[o:o + n])
    return rows


# -- 3. layers -------------------------------------------------------------------

class _Layer:
    """A layer in the old numbering: its rows' slots, listed explicitly. It
    becomes a ``MatVec`` when renumbered, which makes ``x`` and ``y``
    contiguous and lays ``W`` out column by column."""

    def __init__(self, roots, vector, weights, heads, y_slots, bwd_rows, grad_x, leaves, products):
        self.roots, self.vector, self.weights, self.heads = roots, vector, weights, heads
        self.y_slots, self.bwd_rows, self.grad_x = y_slots, bwd_rows, grad_x
        self.products = products          # root -> the op indices of its row's products
        self.rep = None                   # the op index of its last op (_units)
        self.x_slots = vector if vector[0] >= leaves else None   # computed: to renumber
        self.reads = np.concatenate([weights.ravel(), vector,
                                     np.array([h for h in heads if h is not None], dtype=np.int64)])

    def columns(self):
        """The weight slots column by column: the order of the renumbered block."""
        return self.weights.T.ravel()

    def matvec(self, new):
        R, C = self.weights.shape
        cols = new[self.columns()]
        wt0 = int(cols[0])
        assert np.array_equal(cols, np.arange(wt0, wt0 + R * C)), "W is not one block"
        heads = None if self.heads[0] is None else new[np.array(self.heads)].tolist()
        return MatVec(y0=int(new[self.y_slots[0]]), rows=R, cols=C, wt0=wt0, x0=int(new[self.vector[0]]),
                      heads=heads, bwd_rows=self.bwd_rows, grad_x=self.grad_x)

    def weight_name(self, slot):
        """``W[n][k]``: where ``slot`` is in this layer's matrix."""
        n, k = np.argwhere(self.weights == slot)[0]
        return f'W[{n}][{k}]'


class _Reason:
    """Why rows that look like a layer stay scalar: ``text(name)`` is the
    line, given ``name(slot)``, a slot of the returned program (or None)."""

    def __init__(self, rows, cols, outs, text):
        self.rows, self.cols, self.outs, self.text = rows, cols, outs, text


def _not_lifted(reasons, layers, new):
    """``NotLifted`` of each candidate none of whose rows a layer took, once
    per set of rows (the first reason found), in the returned numbering."""
    taken = {int(s) for layer in layers for s in layer.y_slots}
    out, seen = [], set()

    def name(s):
        t = new(int(s))
        return '?' if t is None or t < 0 else f'%{t}'
    for r in reasons:
        key = tuple(int(s) for s in r.outs)
        if key in seen or taken.intersection(key):
            continue
        seen.add(key)
        outs = tuple(t for t in (new(s) for s in key) if t is not None and t >= 0)
        out.append(NotLifted(rows=r.rows, cols=r.cols, outs=outs, reason=r.text(name)))
    return tuple(out)


def _order_reason(layer, slot, other, g):
    """The reason a layer stays scalar: lifting it would move the gradient
    contribution of ``slot`` past that of op ``other``."""
    R, C = layer.weights.shape
    if np.any(layer.weights == slot):
        what = f'weight {layer.weight_name(slot)}'
    elif np.any(layer.vector == slot):
        what = f'input x[{int(np.flatnonzero(layer.vector == slot)[0])}]'
    else:
        what = 'head'
    at = int(g.out[other])
    return _Reason(R, C, layer.y_slots, lambda name: f'{what} ({name(slot)}) is also used at {name(at)}: '
                   'order of gradient accumulation')


def _group_layers(rows, g):
    """Group rows sharing their vector operand into ``MatVec`` layers;
    ``(layers, reasons)``, the reasons (``_Reason``) for groups left scalar."""
    if not rows:
        return [], []
    program = g.program
    roots = list(rows)
    lengths = np.array([len(rows[r][1]) for r in roots])
    starts = np.cumsum(lengths) - lengths
    left = np.concatenate([rows[r][1] for r in roots])
    right = np.concatenate([rows[r][2] for r in roots])

    def param_rows(slots):
        # any parameters: the renumbering lays them out as W's columns
        ok = (slots >= program.param_start) & (slots < program.param_end)
        return np.logical_and.reduceat(ok, starts)
    left_params, right_params = param_rows(left), param_rows(right)
    candidates = defaultdict(list)   # vector bytes -> [(root, weight slots)]
    vectors = {}
    for i, root in enumerate(roots):
        options = []
        s, e = starts[i], starts[i] + lengths[i]
        if left_params[i]:
            options.append((right[s:e], left[s:e]))
        if right_params[i]:
            options.append((left[s:e], right[s:e]))
        for vector, weights in options:
            key = vector.tobytes()
            vectors[key] = vector
            candidates[key].append((root, weights))

    layers, taken, blocks, reasons = [], set(), {}, []
    for key, members in sorted(candidates.items(), key=lambda kv: -len(kv[1])):
        members = [(root, w) for root, w in members if root not in taken]
        if not members:
            continue
        layer, why = _make_layer(vectors[key], members, rows, g)
        outs = g.out[sorted(root for root, _ in members)]
        if layer is not None and not _claim_blocks(blocks, layer):
            layer, why = None, "its outputs or computed inputs overlap another layer's"
        if layer is None:
            if why is not None:
                reasons.append(_Reason(len(members), len(vectors[key]), outs, lambda name, why=why: why))
            continue
        taken.update(layer.roots)
        layers.append(layer)
    layers = _consistent_weights(layers, program, reasons)
    return layers, reasons


def _consistent_weights(layers, program, reasons):
    """The layers whose weights are each the same matrix wherever a layer
    uses them (a matrix applied at several positions: its uses then share
    one block of parameters, laid out once), and are no layer's input or
    parameter head. Weights may have other uses (a regulariser, a tied
    weight read by scalar code): the order check decides whether their
    gradient contributions keep their order. Layers are taken in order (the
    most rows first) while they agree with those taken; the others stay
    scalar, with a ``_Reason``."""
    p0, p1 = program.param_start, program.param_end
    # over the parameters (weights are parameters; only weights are looked up):
    owner = np.full(p1 - p0, -1, dtype=np.int64)   # the matrix of the layers taken, by number
    other = np.zeros(p1 - p0, dtype=bool)          # an input or parameter head of the layers taken
    head_matrix = {}    # parameter head -> the matrix key of the layers taken
    matrices, kept, taken = {}, [], set()

    def params_of(slots):
        slots = np.asarray(slots, dtype=np.int64)
        return slots[(slots >= p0) & (slots < p1)] - p0
    for layer in layers:
        key = layer.weights.tobytes() + str(layer.weights.shape).encode()
        number = matrices.setdefault(key, len(matrices))
        # (a matrix taken before, at another position: the same slots, checked then)
        weights = params_of(()) if key in taken else layer.weights.ravel() - p0
        heads = [h for h in layer.heads if h is not None and p0 <= h < p1]
        why = None
        elsewhere = (owner[weights] >= 0) & (owner[weights] != number)
        clash = elsewhere | other[weights]
        if clash.any():
            k = int(np.argmax(clash))
            s = int(weights[k]) + p0
            why = (f'weight {layer.weight_name(s)} (%{s}) is also a weight of another layer, '
                   'in another place of its matrix' if elsewhere[k] else
                   f'weight {layer.weight_name(s)} (%{s}) is also the input or head of another layer')
        for what, slots in (('input', layer.vector), ('head', heads)):
            hit = params_of(slots)
            hit = hit[owner[hit] >= 0]
            if why is None and len(hit):
                why = f'{what} %{int(hit[0]) + p0} is also a weight of another layer'
        for h in heads:
            if why is None and head_matrix.get(h, key) != key:
                why = f'head %{h} is also the head of a layer of another matrix'
        if why is not None:
            R, C = layer.weights.shape
            reasons.append(_Reason(R, C, layer.y_slots, lambda name, why=why: why))
            continue
        kept.append(layer)
        taken.add(key)
        owner[weights] = number
        other[params_of(layer.vector)] = True
        other[params_of(heads)] = True
        for h in heads:
            head_matrix[h] = key
    return kept


def _make_layer(vector, members, rows, g):
    """``(layer, None)``, or ``(None, reason)`` (None: not a layer at all)."""
    members.sort(key=lambda m: m[1][0])        # rows in the weights' order
    R, C = len(members), len(vector)
    weights = np.stack([w for _, w in members])
    ordered, x_ordered = np.sort(weights.ravel()), np.sort(vector)   # (each sorted once, asked thrice)
    if _among(ordered, vector).any():
        return None, None       # x * x (a sum of squares): not a layer
    if _sorted_repeats(x_ordered):
        return None, 'an input appears twice in x'
    if _sorted_repeats(ordered):   # each weight in one row, once (it may be
        return None, 'a weight appears twice in W'   # shared with other layers: _consistent_weights)
    heads = [rows[root][0] for root, _ in members]
    if any(h is None for h in heads) != all(h is None for h in heads):
        return None, 'some rows start from a head (bias), others not'
    if heads[0] is not None and _repeats(np.array(heads)):
        return None, 'two rows start from the same head'
    is_operand = {}
    if heads[0] is not None:
        hs = np.array(heads, dtype=np.int64)
        is_operand = dict(zip(heads, (_among(ordered, hs) | _among(x_ordered, hs)).tolist()))
    program = g.program
    for h in heads:
        if h is None:
            continue
        if is_operand[h]:
            return None, f'head %{h} is also a weight or an input'
        # a parameter head's other uses are ordered like a weight's (the
        # order check); a computed head's gradient is added by the row
        if g.flags[h] and g.uses[h] != 1 and not program.param_start <= h < program.param_end:
            return None, f'head %{h} (a computed value) has other uses'
    x_needs_grad = bool(g.needs[vector].any())
    if x_needs_grad and np.any(g.uses[vector] != R):
        k = int(np.flatnonzero(g.uses[vector] != R)[0])
        return None, (f'input x[{k}] (%{int(vector[k])}) is also used elsewhere and needs a gradient: '
                      'order of gradient accumulation')
    # the order in which backward reaches the rows: latest product first, and
    # the same order for every column
    position = np.stack([rows[root][3] for root, _ in members])
    bwd_rows = sorted(range(R), key=lambda r: -position[r][0])
    if x_needs_grad and not np.all(position[bwd_rows][:-1] >= position[bwd_rows][1:]):
        return None, 'backward reaches the rows in another order for some column (order of x\'s gradient)'
    leaves = g.leaves
    if not (vector.max() < leaves and np.array_equal(vector, np.arange(vector[0], vector[0] + C))
            or vector.min() >= leaves):
        return None, 'x is neither consecutive leaves nor computed values'
    roots = [root for root, _ in members]
    y_slots = g.out[roots]
    return _Layer(roots, vector, weights, heads, y_slots, bwd_rows, x_needs_grad, leaves,
                  {root: rows[root][3] for root in roots}), None


def _among(ordered, slots):
    """Whether each of ``slots`` is in ``ordered`` (sorted, not empty):
    ``np.isin`` without its sort, for arrays sorted once and asked often."""
    at = np.minimum(np.searchsorted(ordered, slots), len(ordered) - 1)
    return ordered[at] == slots


def _repeats(slots):
    return _sorted_repeats(np.sort(slots))


def _sorted_repeats(ordered):
    """Whether ``ordered`` (sorted) holds a value twice."""
    return bool(np.any(ordered[1:] == ordered[:-1]))


def _claim_blocks(blocks, layer):
    """Reserve contiguous blocks for ``y`` (and computed ``x``); False on a conflict."""
    wanted = [layer.y_slots.tolist()] + ([layer.x_slots.tolist()] if layer.x_slots is not None else [])
    for block in wanted:
        key = tuple(block)
        for s in block:
            if s in blocks and blocks[s] != key:
                return False
    for block in wanted:
        key = tuple(block)
        for s in block:
            blocks[s] = key
    return True


# -- 4. schedule and check ---------------------------------------------------------

def _schedule(g, rep_of, reads):
    """Units (op indices of the cone's scalar ops and lifted reps) in a
    topological order that stays as close to the original as dependencies
    allow: the ready unit of the lowest index first (``ir.min_index_order``).
    Where no unit reads one that comes after it, that is the original order."""
    units = np.flatnonzero(rep_of == np.arange(g.cone))
    scalar = ~np.isin(units, np.fromiter(reads, dtype=np.int64, count=len(reads)))
    dep_a, dep_b = _operand_units(g, rep_of, units)     # (a lifted unit's: those of its last op)
    late = bool(np.any((np.maximum(dep_a, dep_b) > units) & scalar))
    if reads:       # each lifted unit's reads, as one array: the units they read, and the reader
        counts = np.fromiter(map(len, reads.values()), dtype=np.int64, count=len(reads))
        j = g.producer[np.concatenate(list(reads.values()))]
        known = j >= 0                  # (a leaf has no unit)
        read_unit = rep_of[j[known]]
        reader = np.repeat(np.fromiter(reads, dtype=np.int64, count=len(reads)), counts)[known]
        late = late or bool(np.any(read_unit > reader))
    if not late:
        return units
    # the general case: each unit waits for the units it reads, numbered by
    # their place in `units` (pairs (unit, dependency), grouped by unit)
    at = np.full(g.cone, -1, dtype=np.int64)
    at[units] = np.arange(len(units))
    node = np.r_[units, units]
    dep = np.r_[dep_a, dep_b]
    keep = (dep >= 0) & np.r_[scalar, scalar]
    nodes, deps = [node[keep]], [dep[keep]]
    if reads:       # each lifted unit waits once for each other unit it reads
        pair = np.unique((reader * g.cone + read_unit)[read_unit != reader])
        nodes.append(pair // g.cone)
        deps.append(pair % g.cone)
    node, dep = at[np.concatenate(nodes)], at[np.concatenate(deps)]
    by_node = np.argsort(node, kind='stable')
    ptr = np.r_[0, np.cumsum(np.bincount(node, minlength=len(units)))]
    try:
        return units[min_index_order(ptr, dep[by_node], size=g.n)]
    except ValueError:
        raise AssertionError("the lifted program has a cycle") from None


def _operand_units(g, rep_of, ops):
    """The units of the two operands of each of ``ops`` (scalar op indices):
    two arrays, -1 for a leaf or no operand."""
    unit = np.r_[rep_of, np.full(g.n - g.cone + 1, -1, dtype=np.int64)]   # [-1]: no producer
    return unit[g.producer[g.a[ops]]], unit[g.producer[g.b[ops]]]


def _gradient_order_breaks(g, schedule, rep_of, lifted):
    """Where a slot with several consumers would get its gradient
    contributions in another order than the original (a lifted unit counts
    as one consumer): ``{lifted unit: (slot, the op index of the unit of
    another reader)}``, empty when every order holds; None when two scalar
    ops would swap (a unit they wait for is not known)."""
    cone = g.cone
    position = np.empty(cone, dtype=np.int64)
    position[schedule] = np.arange(len(schedule))
    matters = (g.uses > 1) & g.needs       # slots whose readers' order counts
    own = rep_of == np.arange(cone)        # ops that are their own unit
    if np.array_equal(schedule, np.flatnonzero(own)):
        # units in their own order: only a read by an absorbed op can move
        # after a later one (to its unit), so only slots such reads reach matter
        moved = ~own
        reached = np.zeros(len(matters) + 1, dtype=bool)   # [-1]: no operand
        reached[g.a[:cone][moved]] = True
        reached[g.b[:cone][moved]] = True
        matters &= reached[:-1]
    slots, earlier, later = reads_out_of_order(g.a[:cone], g.b[:cone], position[rep_of], matters)
    breaks = {}
    for slot, first, second in zip(slots.tolist(), rep_of[earlier].tolist(), rep_of[later].tolist()):
        if first not in lifted and second not in lifted:
            return None       # two scalar ops swapped (one waited for a lifted unit): give up
        for unit, other in ((first, second), (second, first)):
            if unit in lifted:
                breaks.setdefault(unit, (slot, other))
    return breaks


# -- 5. renumber -------------------------------------------------------------------

def _renumber(program, g, schedule, rep_of, lifted, layers):
    """The lifted program over new slots: each layer's ``x`` and ``y`` become
    contiguous, and the parameters are permuted so that each layer's ``W`` is
    one block, column by column, followed by its heads where they are
    parameters of their own. Inputs and constants keep their slots."""
    leaves = program.n_leaves
    new = np.full(program.n_slots, -1, dtype=np.int64)
    new[:program.n_inputs] = np.arange(program.n_inputs)
    new[program.param_end:leaves] = np.arange(program.param_end, leaves)
    # parameters: each layer's W (column by column, then its heads where they
    # are parameters of their own) where its least weight was, every other
    # parameter in its own order
    starts = {int(layer.weights.min()): layer for layer in layers}
    placed = np.zeros(program.n_slots, dtype=bool)
    blocks = []
    for s in sorted(starts):
        layer = starts[s]
        block = layer.columns()
        block = block[~placed[block]]
        placed[block] = True
        heads = layer.heads
        if heads[0] is not None and len(set(heads)) == len(heads) and all(
                s < h < program.param_end for h in heads):
            hs = np.array(heads, dtype=np.int64)
            if not placed[hs].any():         # (a head below s was placed in its own turn)
                placed[hs] = True
                block = np.r_[block, hs]
        blocks.append(block)
    params = np.arange(program.param_start, program.param_end)
    free = params[~placed[params]]
    # the free parameters below the first block, the first block, those below the second...
    runs = np.split(free, np.searchsorted(free, sorted(starts)))
    perm = np.concatenate([x for pair in zip(runs, blocks + [free[:0]]) for x in pair])
    assert len(perm) == program.n_params
    new[perm] = np.arange(program.param_start, program.param_end)

    # computed slots: layers' x and y blocks first, then each unit's writes in order
    # (each op writes its own slot: the only repeats are blocks met twice)
    at = leaves
    for layer in layers:
        for block in ([layer.x_slots] if layer.x_slots is not None else []) + [layer.y_slots]:
            block = block[new[block] < 0]
            new[block] = np.arange(at, at + len(block))
            at += len(block)
    reps = np.array(sorted(lifted), dtype=np.int64)
    is_lifted = np.isin(schedule, reps)
    layer_reps = np.array([u for u, op in lifted.items() if isinstance(op, _Layer)], dtype=np.int64)
    writes = np.r_[g.out[schedule[~np.isin(schedule, layer_reps)]], g.out[g.cone:]]
    writes = writes[new[writes] < 0]
    new[writes] = np.arange(at, at + len(writes))
    n_slots = at + len(writes)

    # the ops: scalar ones as arrays, lifted ones beside them
    scalar_ops = np.r_[schedule[~is_lifted], np.arange(g.cone, g.n)]
    scalar = g.arrays.taken(scalar_ops, rename=new)
    lifted_ops = []
    for i in np.flatnonzero(is_lifted).tolist():
        op = lifted[int(schedule[i])]
        if isinstance(op, Sum):
            op = Sum(int(new[op.out]), new[np.array(op.terms)].tolist())
        else:
            op = op.matvec(new)
        lifted_ops.append((i, op))
    # a lifted op needs a gradient where its ops did: the flags carry over
    kept = new >= 0
    flags = np.zeros(n_slots, dtype=np.uint8)
    flags[new[kept]] = g.needs[:program.n_slots][kept]
    slot_map = SlotMap(new)
    param_slots = tuple(new[np.array(program.param_slots, dtype=np.int64)].tolist()) if program.n_params else ()
    out = Program(n_slots=n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                   constants=program.constants, arrays=scalar, lifted=tuple(lifted_ops),
                   n_grad_ops=len(schedule), loss=int(new[program.loss]),
                   outputs=tuple(new[np.array(program.outputs, dtype=np.int64)].tolist()),
                   passes=program.passes + ('vectorize',), slot_map=slot_map, param_order=param_slots,
                   graph_hash=program.graph_hash, input_grads=program.input_grads,
                   labels=moved_labels(program.labels, new),
                   prefix_sums=tuple(new[np.array(program.prefix_sums, dtype=np.int64)].tolist()))
    out.known_needs_grad = flags.tobytes()
    return out
