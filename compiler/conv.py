"""The convolution pass: a kernel applied at every position of an image
becomes one ``Conv`` op, keeping the program's results bit for bit.

After ``vectorize``, each output pixel of a convolution is a ``Sum``
``b + w0*x0 + w1*x1 + ...``: a head (the bias) and products whose weight
side is a parameter and whose input side is a pixel of a window. What makes
them a convolution is that the weight side *repeats*: every position of one
output channel reads the same parameters, in the same order, while the
input side is a gather (``MatVec`` wants one vector per row, so it rejects
them). This pass:

1. Rows: finds the ``Sum`` ops whose first term is a parameter (the head)
   and whose other terms are products ``w * x`` used once, ``w`` a
   parameter and ``x`` a value of the rows (an input or a computed slot),
   and the rows of the ``MatVec`` ops ``vectorize`` made of one position
   (a window of consecutive slots) with parameter heads.
2. Channels: rows sharing one head are one output channel; its weights are
   all its rows' weights in the parameters' order, and every row reads a part of them
   in that order (a window cut by the padding leaves terms out). A channel is kept when its
   weights and head are read by its rows only.
3. Layers: channels whose rows read the same windows (the same inputs at
   the same kernel offsets) in the same order are one ``Conv``; when its
   inputs need a gradient, each of them is read by the layer alone.
4. Schedule: the layer runs where its last row was; ops that read its
   outputs earlier wait for it (Kahn's algorithm, the lowest original index
   first). If any slot with several readers would get its gradient
   contributions in another order, the pass gives up and returns the
   program unchanged.
5. Renumber: the products' slots are gone; the other computed slots keep
   their order, densely.

Exactness: the ``Conv`` op records each row's place in the original order
(``rank``); the code generator adds every sum and every gradient
contribution in the order those ranks give (``ir.Conv``).
"""
import dataclasses
import heapq
from collections import defaultdict

import numpy as np

from compiler.ir import (Conv, MatVec, OP_CODES, Program, SlotMap, Sum, all_slots, moved_labels, needs_grad,
                         read_slots)

_PLUS, _TIMES = OP_CODES['+'], OP_CODES['*']


def lift_convs(program):
    """``Program -> Program`` with convolution layers lifted into ``Conv`` ops."""
    if 'conv' in program.passes or program.prefix_sums or program.arrays is None or not program.lifted:
        return program
    if any(type(op) not in (Sum, MatVec) for _, op in program.lifted):
        return program          # another pass's op: this pass does not know its reads
    g = _Graph(program)
    rows = _rows(g)
    if not rows:
        return program
    layers = _layers(g, _channels(g, rows))
    if not layers:
        return program
    schedule = _schedule(g, layers)
    if schedule is None:
        return program
    return _rebuild(g, layers, schedule)


class _Graph:
    """The program's ops by position (scalar ops from the arrays, lifted
    ones beside them), each slot's producer and use count."""

    def __init__(self, program):
        self.program = program
        a = self.arrays = program.arrays
        self.n = program.n_ops
        self.cone = program.n_grad_ops
        lifted = np.zeros(self.n, dtype=bool)
        self.lifted = dict(program.lifted)
        lifted[list(self.lifted)] = True
        self.spos = np.flatnonzero(~lifted)           # position of each scalar op
        self.producer = np.full(program.n_slots + 1, -1, dtype=np.int64)   # [-1]: no operand
        self.producer[a.out] = self.spos
        writes, counts = all_slots(self.lifted.values(), 'writes')
        self.producer[writes] = np.repeat(np.fromiter(self.lifted, dtype=np.int64, count=len(counts)), counts)
        reads = [a.a, a.b[a.b >= 0], np.array([program.loss, *program.outputs], dtype=np.int64),
                 all_slots(self.lifted.values())[0]]
        self.uses = np.bincount(np.concatenate(reads), minlength=program.n_slots)
        self.needs = np.frombuffer(bytes(needs_grad(program)), dtype=np.uint8).astype(bool)
        self.scalar_at = np.full(self.n, -1, dtype=np.int64)   # position -> scalar op index
        self.scalar_at[self.spos] = np.arange(len(self.spos))
        self.param_index = np.zeros(program.n_slots, dtype=np.int64)    # a parameter's place in ``params``
        self.param_index[np.asarray(program.param_slots, dtype=np.int64)] = np.arange(program.n_params)

    def is_param(self, s):
        p = self.program
        return (s >= p.param_start) & (s < p.param_end)

    def is_row(self, s):
        p = self.program
        return (s < p.n_inputs) | (s >= p.n_leaves)


# -- 1. rows ---------------------------------------------------------------------

@dataclasses.dataclass
class _Row:
    pos: int          # the Sum's position (its rank)
    y: int
    head: int
    w: np.ndarray     # weight slot of each product
    x: np.ndarray     # input slot of each product
    prods: np.ndarray  # positions of the products


def _rows(g):
    """The Sums of the loss's cone that are a parameter head and then
    products ``w * x`` (``w`` a parameter, ``x`` in the rows), each used
    once; and the '+' ops of a head and one such product (a window that the
    padding cuts to one term)."""
    sums = [(i, op) for i, op in g.lifted.items() if type(op) is Sum and i < g.cone and len(op.terms) >= 2]
    rows = []
    if sums:
        terms, counts = all_slots(op for _, op in sums)
        head_at = np.cumsum(counts) - counts
        heads, flat, lengths = terms[head_at], np.delete(terms, head_at), counts - 1
        ok, pos, w, x = _products(g, flat)
        starts = np.cumsum(lengths) - lengths
        row_ok = np.logical_and.reduceat(ok, starts) & g.is_param(heads)
        for r in np.flatnonzero(row_ok).tolist():
            i, op = sums[r]
            s, e = starts[r], starts[r] + lengths[r]
            rows.append(_Row(i, op.out, int(heads[r]), w[s:e], x[s:e], pos[s:e]))
    rows += _matvec_rows(g)
    a = g.arrays
    plus = np.flatnonzero((a.code == _PLUS) & (g.spos < g.cone))
    for first in (True, False):
        head, term = (a.a[plus], a.b[plus]) if first else (a.b[plus], a.a[plus])
        ok, pos, w, x = _products(g, term)
        ok &= g.is_param(head)
        for j in np.flatnonzero(ok).tolist():
            k = plus[j]
            rows.append(_Row(int(g.spos[k]), int(a.out[k]), int(head[j]), w[j:j + 1], x[j:j + 1], pos[j:j + 1]))
        plus = plus[~ok]           # (a '+' of two such products: a row once)
    return rows


def _matvec_rows(g):
    """The rows of the ``MatVec`` ops of the cone whose heads are parameters
    and whose input needs no gradient: ``vectorize`` lifts one position of
    a convolution as a layer where its window is consecutive leaves (the
    whole image, at the centre of a padded kernel), its weights shared with
    the other positions. Each is one row per channel at the ``MatVec``'s
    position (it has no products of its own to absorb). The rows of one
    ``MatVec`` share their rank: they are rows of different channels, so no
    weight or head gets two contributions at one rank, and no input any.
    (A layer whose positions are all ``MatVec`` ops, a 1x1 kernel, is one
    matrix applied at several positions: it stays as it is.)"""
    rows = []
    for i, op in g.lifted.items():
        if type(op) is not MatVec or i >= g.cone or op.heads is None or op.grad_x:
            continue
        heads = np.asarray(op.heads, dtype=np.int64)
        if not g.is_param(heads).all() or len(np.unique(heads)) < op.rows:
            continue
        x = np.arange(op.x0, op.x0 + op.cols, dtype=np.int64)
        w = op.wt0 + np.arange(op.cols, dtype=np.int64) * op.rows    # W column by column
        none = np.empty(0, dtype=np.int64)
        rows += [_Row(i, op.y0 + r, int(heads[r]), w + r, x, none) for r in range(op.rows)]
    return rows


def _products(g, slots):
    """Whether each slot is a product ``w * x`` of the cone used once, ``w``
    a parameter and ``x`` in the rows; its position, ``w`` and ``x``."""
    pos = g.producer[slots]
    j = g.scalar_at[np.maximum(pos, 0)]
    ok = (pos >= 0) & (pos < g.cone) & (j >= 0) & (g.uses[slots] == 1)
    if not len(g.arrays.code):
        return ok, pos, slots, slots          # no scalar ops: no products
    ok[ok] &= g.arrays.code[j[ok]] == _TIMES
    j = np.where(ok, j, 0)
    a, b = g.arrays.a[j], g.arrays.b[j]
    a_param, b_param = g.is_param(a), g.is_param(b)
    ok &= a_param != b_param
    w = np.where(a_param, a, b)
    x = np.where(a_param, b, a)
    ok &= g.is_row(x)
    return ok, pos, w, x


# -- 2. channels -------------------------------------------------------------------

@dataclasses.dataclass
class _Channel:
    head: int
    weights: np.ndarray   # K slots
    rows: list            # in rank order
    ks: list              # per row: the kernel offsets of its terms


def _channels(g, rows):
    by_head = defaultdict(list)
    for row in rows:
        by_head[row.head].append(row)
    channels = []
    for head, members in by_head.items():
        members.sort(key=lambda r: r.pos)
        # the channel's weights: every row's, in the parameters' order
        # (Conv2d's offset order; vectorize may have moved a MatVec's into
        # its block); each row must read them in that order (checked below)
        full = np.unique(np.concatenate([r.w for r in members]))
        full = full[np.argsort(g.param_index[full], kind='stable')]
        index = {int(s): k for k, s in enumerate(full.tolist())}
        ks, ok, count = [], True, np.zeros(len(full), dtype=np.int64)
        for row in members:
            k = np.array([index.get(s, -1) for s in row.w.tolist()], dtype=np.int64)
            if np.any(k < 0) or np.any(k[1:] <= k[:-1]):
                ok = False
                break
            count[k] += 1
            ks.append(k)
        # the weights and the head are read by these rows alone: their
        # gradients are this channel's sums, nothing else's
        if not ok or not np.array_equal(count, g.uses[full]) or g.uses[head] != len(members):
            continue
        channels.append(_Channel(head, full, members, ks))
    return channels


# -- 3. layers ---------------------------------------------------------------------

def _layers(g, channels):
    """Channels reading the same windows in the same order, as ``Conv`` ops
    (in the old numbering)."""
    groups = defaultdict(list)
    for ch in channels:
        key = (len(ch.weights),) + tuple(k.tobytes() + b'|' + r.x.tobytes() for k, r in zip(ch.ks, ch.rows))
        groups[key].append(ch)
    layers = []
    for members in groups.values():
        members.sort(key=lambda ch: ch.rows[0].pos)
        first, K = members[0], len(members[0].weights)
        P = len(first.rows)
        if P < 2:
            continue       # one position: a dot product, not a kernel applied at several
        if all(len(row.prods) == 0 for row in first.rows):
            continue       # every position a MatVec: one matrix applied at several, lifted already
        x = np.full((P, K), -1, dtype=np.int64)
        for p, (k, row) in enumerate(zip(first.ks, first.rows)):
            x[p, k] = row.x
        grad_x = bool(g.needs[x[x >= 0]].any())
        if grad_x:
            # every reader of an input that needs a gradient is in this layer:
            # the layer alone decides the order of its contributions
            # (a MatVec reads its input once for all its rows: such a layer stays)
            used = x[x >= 0]
            slots, count = np.unique(used, return_counts=True)
            if not np.array_equal(count * len(members), g.uses[slots]):
                continue
        layers.append(_Layer(members, x, grad_x))
    return layers


class _Layer:
    def __init__(self, channels, x, grad_x):
        self.channels, self.x, self.grad_x = channels, x, grad_x
        self.rank = np.array([[r.pos for r in ch.rows] for ch in channels], dtype=np.int64)
        self.y = np.array([[r.y for r in ch.rows] for ch in channels], dtype=np.int64)
        self.members = np.concatenate([np.r_[[r.pos for r in ch.rows],
                                             np.concatenate([r.prods for r in ch.rows])]
                                       for ch in channels])
        self.rep = int(self.rank.max())        # it runs where its last row was
        self.reads = np.concatenate([x[x >= 0], *[ch.weights for ch in channels],
                                     np.array([ch.head for ch in channels], dtype=np.int64)])

    def op(self, new):
        """The ``Conv`` op, slots renumbered by ``new``."""
        x = np.where(self.x >= 0, new[np.maximum(self.x, 0)], -1)
        return Conv(weights=np.stack([ch.weights for ch in self.channels]),
                    heads=np.array([ch.head for ch in self.channels], dtype=np.int64),
                    x=x, y=new[self.y], rank=self.rank, grad_x=self.grad_x)


# -- 4. schedule and check ---------------------------------------------------------

def _reads_of(g, pos):
    op = g.lifted.get(pos)
    if op is not None:
        return read_slots(op)
    j = g.scalar_at[pos]
    b = g.arrays.b[j]
    return np.array([g.arrays.a[j]] + ([b] if b >= 0 else []), dtype=np.int64)


def _schedule(g, layers):
    """The units of the loss's cone (positions of ops not absorbed, and each
    layer's ``rep``) in a topological order as close to the original as
    dependencies allow; None when some gradient order would change."""
    cone = g.cone
    unit = np.arange(g.n)
    reads = {}
    for layer in layers:
        unit[layer.members] = layer.rep
        reads[layer.rep] = layer.reads
    units = np.flatnonzero(unit[:cone] == np.arange(cone))
    scalar_units = units[g.scalar_at[units] >= 0]
    scalar_units = scalar_units[~np.isin(scalar_units, list(reads))]
    prod_unit = np.r_[unit, -1]          # [-1]: a leaf
    j = g.scalar_at[scalar_units]
    da = prod_unit[g.producer[g.arrays.a[j]]]
    db = prod_unit[g.producer[np.where(g.arrays.b[j] >= 0, g.arrays.b[j], -1)]]
    deps = {}
    late = scalar_units[(da > scalar_units) | (db > scalar_units)]
    for u in late.tolist():
        deps[u] = None
    for u in units[g.scalar_at[units] < 0].tolist() + list(reads):
        r = reads[u] if u in reads else _reads_of(g, u)
        d = prod_unit[g.producer[r]]
        if len(d) and d.max() > u:
            deps[u] = None
    if not deps:
        order = units
    else:
        order = _kahn(g, units, unit, reads)
    position = np.empty(g.n, dtype=np.int64)
    position[order] = np.arange(len(order))
    position[cone:] = np.arange(len(order), len(order) + g.n - cone)
    if not _same_gradient_order(g, unit, position, layers):
        return None
    return order


def _kahn(g, units, unit, reads):
    prod_unit = np.r_[unit, -1]
    done, waiting, users, heap, order = set(), {}, defaultdict(list), [], []

    def emit(u):
        order.append(u)
        done.add(u)
        for v in users.pop(u, ()):
            waiting[v] -= 1
            if not waiting[v]:
                del waiting[v]
                heapq.heappush(heap, v)
    for u in units.tolist():
        while heap and heap[0] < u:
            emit(heapq.heappop(heap))
        r = reads[u] if u in reads else _reads_of(g, u)
        deps = {d for d in prod_unit[g.producer[r]].tolist() if d >= 0 and d != u and d not in done}
        if not deps:
            emit(u)
            continue
        waiting[u] = len(deps)
        for d in deps:
            users[d].append(u)
    while heap:
        emit(heapq.heappop(heap))
    assert len(order) == len(units), "the lifted program has a cycle"
    return np.array(order, dtype=np.int64)


def _same_gradient_order(g, unit, position, layers):
    """Every slot with several readers that needs a gradient gets their
    contributions in the original order (a layer counts as one reader)."""
    a = g.arrays
    slots = [a.a, a.b]
    readers = [g.spos, g.spos]
    for i, op in g.lifted.items():
        r = read_slots(op)
        slots.append(r)
        readers.append(np.full(len(r), i, dtype=np.int64))
    slots, readers = np.concatenate(slots), np.concatenate(readers)
    keep = slots >= 0
    keep[keep] = (g.uses[slots[keep]] > 1) & g.needs[slots[keep]]
    slots, readers = slots[keep], readers[keep]
    new = position[unit[readers]]
    order = np.lexsort((readers, slots))
    slots, new = slots[order], new[order]
    same = slots[1:] == slots[:-1]
    return not np.any(same & (new[1:] < new[:-1]))


# -- 5. renumber -------------------------------------------------------------------

def _rebuild(g, layers, order):
    program, arrays = g.program, g.arrays
    n_slots, leaves = program.n_slots, program.n_leaves
    absorbed = np.zeros(g.n, dtype=bool)
    for layer in layers:
        absorbed[layer.members] = True
    reps = {layer.rep: layer for layer in layers}
    # slots still written: those of ops not absorbed, and the layers' outputs
    written = np.zeros(n_slots, dtype=bool)
    written[:leaves] = True
    written[arrays.out[~absorbed[g.spos]]] = True
    for i, op in g.lifted.items():
        if not absorbed[i]:
            written[np.fromiter(op.writes, dtype=np.int64)] = True
    for layer in layers:
        written[layer.y.ravel()] = True
    new = np.full(n_slots, -1, dtype=np.int64)
    new[:leaves] = np.arange(leaves)
    computed = np.concatenate([*_blocks(g, layers, written), np.flatnonzero(written[leaves:]) + leaves])
    _, first = np.unique(computed, return_index=True)
    computed = computed[np.sort(first)]
    new[computed] = np.arange(leaves, leaves + len(computed))
    new_n_slots = int(written.sum())

    full = np.r_[order, np.arange(g.cone, g.n)]
    is_scalar = (g.scalar_at[full] >= 0) & ~np.isin(full, list(reps))
    scalar = arrays.taken(g.scalar_at[full[is_scalar]], rename=new)
    lifted = []
    for at in np.flatnonzero(~is_scalar).tolist():
        u = int(full[at])
        if u in reps:
            op = reps[u].op(new)
        else:
            op = _renumbered(g.lifted[u], new)
        lifted.append((at, op))
    flags = np.zeros(new_n_slots, dtype=np.uint8)
    flags[new[written]] = g.needs[:n_slots][written]
    slot_map = SlotMap(new) if program.slot_map is None else program.slot_map.then(new)
    out = Program(n_slots=new_n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                  constants=program.constants, arrays=scalar, lifted=tuple(lifted),
                  n_grad_ops=len(order), loss=int(new[program.loss]),
                  outputs=tuple(int(new[s]) for s in program.outputs),
                  passes=program.passes + ('conv',), slot_map=slot_map, param_order=program.param_order,
                  graph_hash=program.graph_hash, input_grads=program.input_grads,
                  labels=moved_labels(program.labels, new),
                  prefix_sums=program.prefix_sums)
    out.known_needs_grad = flags.tobytes()
    return out


def _blocks(g, layers, written):
    """Each layer's outputs (channel by channel) and its computed inputs as
    blocks of consecutive slots: a row's values a layer reads and writes
    then share few cache lines (the rows are large). The blocks of a
    ``MatVec`` that stays stay as they are."""
    leaves = g.program.n_leaves
    keep = np.zeros(g.program.n_slots, dtype=bool)
    absorbed = {int(i) for layer in layers for i in layer.members}
    for i, op in g.lifted.items():
        if type(op) is MatVec and i not in absorbed:
            keep[op.y0:op.y0 + op.rows] = True
            keep[op.x0:op.x0 + op.cols] = True
    blocks = []
    for layer in sorted(layers, key=lambda layer: layer.rep):
        x = np.unique(layer.x[layer.x >= leaves])
        for block in (layer.y.ravel(), x):
            if len(block) and not keep[block].any() and written[block].all():
                blocks.append(block)
    return blocks


def _renumbered(op, new):
    if type(op) is Sum:
        return Sum(int(new[op.out]), new[np.asarray(op.terms, dtype=np.int64)].tolist())
    heads = None if op.heads is None else new[np.asarray(op.heads, dtype=np.int64)].tolist()
    y0, x0 = int(new[op.y0]), int(new[op.x0])
    assert np.array_equal(new[op.y0:op.y0 + op.rows], np.arange(y0, y0 + op.rows)), "y is not one block"
    assert np.array_equal(new[op.x0:op.x0 + op.cols], np.arange(x0, x0 + op.cols)), "x is not one block"
    return dataclasses.replace(op, y0=y0, x0=x0, heads=heads)
