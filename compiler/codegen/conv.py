"""C of a ``Conv`` (a kernel applied at every position): per op, tables of
where its numbers live (``templates/conv.c``'s ``ConvOp``) and calls of the
fixed loops (``templates/conv_body.c``, built once per instruction set with
the register tiles the program's ops need, chosen at first use by
``templates/conv_choose.c``).

The tables carry every order the interpreter fixes: the forward adds each
window's terms in offset order after the head; the input gradient's lists
give each input its contributions in the interpreter's backward order (rows
by descending rank, each row's offsets last to first); the weight gradient
runs the positions in descending rank, row after row of a block.
"""
import numpy as np

from compiler.ir import Conv
from compiler.templates import read_template

LANES = 8       # the forward loop's lanes: channels


def _round_up(n, m):
    return (n + m - 1) // m * m


def _table(name, values):
    values = [int(v) for v in values] or [0]
    lines = [', '.join(map(str, values[i:i + 20])) for i in range(0, len(values), 20)]
    return '\n'.join([f'static const int {name}[{len(values)}] = {{', *[f'    {line},' for line in lines], '};'])


# The register tiles of the forward (templates/conv_body.c, fwd_NP_OV) and
# the weight gradient (bgw_TK_OV): per instruction set (CV_LEVEL: -1 plain C,
# 0 the baseline, 1 AVX2, 2 AVX-512), the vector registers and how many of
# them 8 lanes take. A tile of N positions (or offsets) by OV vectors of
# channels holds N * OV sums, OV vectors of weights (or gy) and a broadcast,
# with two registers to spare.
TILE_REGISTERS = {-1: (32, 4), 0: (16, 4), 1: (16, 2), 2: (32, 1)}
TILE_MAX_OV = {-1: 1, 0: 1, 1: 2, 2: 4}
MIN_TILES = 4      # the weight gradient's tiles per op at least (threads split them), where K allows
BGX_IMAGES = 32    # the input gradient's images in the lanes at once, at most (8 * CV_BGX_NV)
LEVELS = (-1, 0, 1, 2)


def register_tiles(n, O, level, min_tiles=1):
    """Tiles of ``n`` positions or offsets by ``O`` channels on one
    instruction set: ``(i0, len, v0, ov)`` each, the ``n`` in near-equal
    runs (at least ``min_tiles`` where ``n`` allows), the channels in chunks
    of at most ``TILE_MAX_OV`` vectors of 8."""
    regs, units = TILE_REGISTERS[level]
    vectors = _round_up(O, LANES) // LANES
    tiles = []
    for v0 in range(0, vectors, TILE_MAX_OV[level]):
        ov = min(TILE_MAX_OV[level], vectors - v0)
        most = max(1, (regs - 3 - ov * units) // (ov * units))
        runs = min(n, max(-(-n // most), min_tiles))
        tiles += [(n * i // runs, n * (i + 1) // runs - n * i // runs, v0, ov) for i in range(runs)]
    return tiles


def bgw_tiles(K, O, level):
    """The weight gradient's tiles: offsets by channels."""
    return register_tiles(K, O, level, MIN_TILES)


def fwd_tiles(op, level):
    """The forward's tiles: whole windows (the op's ``full`` positions, in order) by channels."""
    return register_tiles(int(np.all(op.x >= 0, axis=1).sum()), op.weights.shape[0], level)


def _pull_lists(rows, ids, O, P):
    """The input gradient's lists for pulling (templates/conv_body.c,
    bgx_pull), or None where the rows' order (``rows``: o * P + p in backward
    order) is not channel by channel with the same order of positions in
    every channel: ``(oorder, jstart, jp, jk)``, each input's positions in
    that order with their offset (``ids[p, k]``: the input's index, or -1)."""
    o, p = np.divmod(rows.reshape(O, P), P)
    if not (np.all(o == o[:, :1]) and np.all(p == p[:1])):
        return None
    turn = np.empty(P, dtype=np.int64)
    turn[p[0]] = np.arange(P)             # a position's place in the order
    pos, off = np.nonzero(ids >= 0)
    j = ids[pos, off]
    order = np.lexsort((turn[pos], j))
    jstart = np.searchsorted(j[order], np.arange(int(ids.max(initial=-1)) + 2))
    return o[:, 0], jstart, pos[order], off[order]


def fixed_loops(ops=()):
    """The Conv loops' C: what they share, the loops once per instruction
    set this build may meet (with the register tiles ``ops`` need), and the
    choice of one."""
    body = read_template('conv_body.c')

    def built_for(isa, level):
        def shapes(tiles):
            return ' '.join(f'X({n}, {ov})' for n, ov in sorted({(n, ov) for _, n, _, ov in tiles}))
        bgw = [t for op in ops for t in bgw_tiles(op.weights.shape[1], op.weights.shape[0], level)]
        fwd = [t for op in ops for t in fwd_tiles(op, level)]
        return '\n'.join([f'#define CV_ISA {isa}', f'#define CV_LEVEL {level}',
                          f'#define CV_FWD_SHAPES(X) {shapes(fwd)}', f'#define CV_BGW_SHAPES(X) {shapes(bgw)}', body,
                          '#undef CV_FWD_SHAPES', '#undef CV_BGW_SHAPES', '#undef CV_LEVEL', '#undef CV_ISA'])
    return '\n'.join([read_template('conv.c'),
                      '#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))',
                      built_for('plain', -1),
                      '#else', '#if defined(__x86_64__)', built_for('avx512', 2), built_for('avx2', 1), '#endif',
                      built_for('base', 0),
                      '#endif', read_template('conv_choose.c')])


class ConvRenderer:
    """Names, tables and calls of a program's ``Conv`` ops."""

    def __init__(self, program, layout, flags):
        self.program, self.layout, self.flags = program, layout, flags
        self.ops = program.lifted_of(Conv)
        self.name = {id(op): f'conv{i + 1}' for i, op in enumerate(self.ops)}
        grad_ops = set(map(id, program.grad_ops)) if self.ops else set()
        self.in_cone = [op for op in self.ops if id(op) in grad_ops]
        self._bgx = {id(op) for op in self.in_cone if op.grad_x}

    def _rows(self, slots):
        return np.array([self.layout.row_index(int(s)) for s in slots.ravel()], dtype=np.int64).reshape(slots.shape)

    def _shared(self, slots):
        return np.array([self.layout.shared_index(int(s)) for s in slots.ravel()],
                        dtype=np.int64).reshape(slots.shape)

    def functions(self):
        """The loops and, per op, its tables and its ``ConvOp``."""
        if not self.ops:
            return []
        out = [fixed_loops(self.ops)]
        for op in self.ops:
            out.append(self._tables(op))
        return out

    def _tables(self, op):
        name = self.name[id(op)]
        O, K = op.weights.shape
        P = len(op.x)
        x = np.where(op.x >= 0, self._rows(np.maximum(op.x, 0)), -1)
        full = np.all(op.x >= 0, axis=1)
        lines = [f'/* {op} */',
                 _table(f'{name}_w', self._shared(op.weights).ravel()),
                 _table(f'{name}_h', self._shared(op.heads)),
                 _table(f'{name}_x', x.ravel()),
                 _table(f'{name}_y', self._rows(op.y).T.ravel()),
                 _table(f'{name}_full', np.flatnonzero(full)),
                 _table(f'{name}_part', np.flatnonzero(~full)),
                 f'static const unsigned char {name}_is_full[{P}] = {{{", ".join("1" if f else "0" for f in full)}}};']
        # the input gradient: the rows in backward order, the inputs whose gradient is needed
        flags = np.frombuffer(bytes(self.flags), dtype=np.uint8).astype(bool)
        needed = (op.x >= 0) & flags[np.maximum(op.x, 0)]
        xg = np.where(needed, x, -1) if id(op) in self._bgx else np.full_like(x, -1)
        xlist, xid = np.unique(xg[xg >= 0], return_inverse=True)
        ids = np.full(xg.shape, -1, dtype=np.int64)
        ids[xg >= 0] = xid
        rows = np.argsort(-op.rank.ravel(), kind='stable')
        lines += [_table(f'{name}_rows', rows),
                  _table(f'{name}_xg', xg.ravel()), _table(f'{name}_xlist', xlist), _table(f'{name}_xid', ids.ravel())]
        pull = _pull_lists(rows, ids, O, P)
        oorder, jstart, jp, jk = pull or ([], [0], [], [])
        lines += [_table(f'{name}_oorder', oorder), _table(f'{name}_jstart', jstart), _table(f'{name}_jp', jp),
                  _table(f'{name}_jk', jk)]
        tiles = [bgw_tiles(K, O, level) for level in LEVELS]
        lines += [_table(f'{name}_tiles_{i}', [n for tile in t for n in tile]) for i, t in enumerate(tiles)]
        ftiles = [fwd_tiles(op, level) for level in LEVELS]
        lines += [_table(f'{name}_ftiles_{i}', [n for tile in t for n in tile]) for i, t in enumerate(ftiles)]
        lines.append(_table(f'{name}_xk', x[full].T.ravel()))
        lines.append(f'static const ConvOp {name} = {{{O}, {_round_up(O, LANES)}, {K}, {P}, {name}_w, {name}_h, '
                     f'{name}_x, {name}_y, {int(full.sum())}, {int((~full).sum())}, {name}_full, {name}_part, '
                     f'{name}_is_full, {name}_rows, {name}_xg, {len(xlist)}, {name}_xlist, {name}_xid, '
                     f'{{{", ".join(str(len(t)) for t in tiles)}}}, '
                     f'{{{", ".join(f"{name}_tiles_{i}" for i in range(4))}}}, '
                     f'{int(pull is not None)}, {name}_oorder, {name}_jstart, {name}_jp, {name}_jk, {name}_xk, '
                     f'{{{", ".join(str(len(t)) for t in ftiles)}}}, '
                     f'{{{", ".join(f"{name}_ftiles_{i}" for i in range(4))}}}}};')
        return '\n'.join(lines)

    def step(self, op, forward):
        """The calls running ``op`` over rows r0..r1 in one direction."""
        name = self.name[id(op)]
        if forward:
            return [f'conv_kernels()->fwd(&{name}, b, r0, r1, scratch);   /* {op} */']
        if id(op) not in self._bgx:
            return []
        call = f'conv_kernels()->bgx(&{name}, b, r0, r1, scratch);   /* input gradient of {name} */'
        if int(op.x.max()) < self.program.n_inputs:
            return ['if (b->input_grads)', '    ' + call]
        return [call]

    def weight_grad_calls(self):
        return [f'conv_kernels()->bgw(&{self.name[id(op)]}, b, rows, part, parts, scratch);'
                for op in self.in_cone]

    def scratch_bytes(self):
        need = 0
        for op in self.ops:
            O, K = op.weights.shape
            n_x = len(np.unique(op.x[op.x >= 0]))
            OP, P = _round_up(O, LANES), len(op.x)
            need = max(need, 8 * (K * OP + OP), 8 * (K * OP + P * OP + O),
                       8 * (_round_up(O * K, LANES) + BGX_IMAGES * (O * len(op.x) + n_x)))
        return _round_up(need + 64, 64)
