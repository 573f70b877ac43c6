"""The scalar op table: a large irregular program's scalar ops as arrays in
the module, run by one C loop each way (``vm_forward``, ``vm_backward``)
instead of one C statement per op.

Millions of straight-line statements cost the C compiler seconds (tcc) to
minutes (clang); the same ops as four ``int`` arrays cost it a fraction of
that, and the loop runs each op with the same IEEE operations in the same
order as its statement would: the loop's cases are the op table
(``scalar.SCALAR_C``) rendered on the operands the loop loaded, so there is
no second copy of any op's C. Forward runs entries ``i0..i1-1`` in order;
backward runs them in reverse, each operand's contribution as its statement
would add it (to the row's gradient, to ``gp``, or recorded for
``param_grads``, where ``layout`` says).

The four int arrays reach C as one hex blob (compiler/codegen/blob.py),
unpacked once by ``vm_unpack`` (``init_constants`` calls it). An entry:
``vm_info[i]`` the op's code (``ir.OP_NAMES``) plus 2 bits per
operand saying where its gradient goes (0: nowhere, 1: ``g[x]``, 2:
``gp[-1 - x]``, 3: recorded, at ``vm_recorded(2 i + operand)``); ``vm_out``,
``vm_a``, ``vm_b`` where the result and operands live (``x >= 0``: ``v[x]``,
else ``p[-1 - x]``); for ``**``, ``vm_b`` indexes its exponent in
``vm_k`` (and ``k - 1.0`` in ``vm_k1``).

The pass's small ``Sum`` folds (an irregular graph has thousands of three-
and four-term chains) are entries of the table too, with the code
``VM_SUM``: ``vm_a`` the first of its terms in ``vm_term`` (their places)
and ``vm_term_to`` (where each term's gradient goes: ``kind | index << 2``,
the kinds above), ``vm_b`` how many. Forward adds them left to right,
backward adds the sum's gradient to each, last term first: what the
statements of ``compiler/codegen/sums.py`` do. As functions of statements
(one per fold, between the table's ranges) the 6,900 folds of a 1M-op graph
cost the C compiler more than the rest of the program.
"""
import numpy as np

from compiler.codegen import blob
from compiler.codegen.scalar import SCALAR_C, Exponent, c_double
from compiler.ir import OP_CODES, OP_NAMES, SCALAR_OPS, Sum

# Scalar ops from which the program's scalar code is an op table rather than
# statements (compiler/codegen/program.py decides; tests lower it).
TABLE_MIN_OPS = 200_000

# A plan of more steps than this runs from a table of them (OpTable.plan_steps).
PLAN_LOOPS = 16
# The arguments of a per-row function (and of the table's loops after the
# range) for row r of a block: [backward, forward]
ROW_ARGS = ('ROW(b->v, r), ROW(b->g, r), b->p, b->gp', 'ROW(b->v, r), b->p')

_POW = OP_CODES['**']
_KIND_SHIFT = 4          # vm_info: the op's code in the low 4 bits, then 2 bits per operand
VM_SUM = len(OP_NAMES)   # vm_info's code of a Sum entry


class OpTable:
    """The table of a program's scalar ops and ``Sum`` folds (every ``Op``
    and ``Sum`` of ``program.ops``, in order: entry ``i`` is the ``i``-th of
    them); ``n`` counts the scalar ops, ``sums`` the folds."""

    def __init__(self, program, layout, flags):
        part = layout.scalar_part
        arrays = part.arrays
        loc = layout.loc          # where each slot lives: v[x] for x >= 0, p[-1 - x] below
        needs = np.frombuffer(bytes(flags), dtype=np.uint8).astype(bool)
        sums = [(i, op) for i, op in part.lifted if type(op) is Sum and loc[op.out] >= 0]
        in_table = {i for i, _ in sums}
        self.others = np.array([i for i, _ in part.lifted if i not in in_table], dtype=np.int64)
        n = len(arrays.code)
        code = arrays.code.astype(np.int64)
        binary = arrays.b >= 0
        b_slot = np.where(binary, arrays.b, 0)
        out, a, b = loc[arrays.out], loc[arrays.a], np.where(binary, loc[b_slot], 0)
        # the exponents of '**': one entry of vm_k per distinct exponent (told
        # apart by their bits: -0.0 is not 0.0, nor one NaN another)
        pows = np.flatnonzero(code == _POW)
        ks = np.fromiter(map(arrays.k.__getitem__, pows.tolist()), dtype=np.float64, count=len(pows))
        bits, index = np.unique(ks.view(np.int64), return_inverse=True)
        self.k = bits.view(np.float64).tolist()
        b[pows] = index.reshape(-1)
        # where each operand's gradient goes
        grads = np.zeros((len(OP_NAMES), 2), dtype=bool)
        for name, row in SCALAR_C.items():
            for operand, _, _ in row.grads:
                grads[OP_CODES[name], operand] = True
        out_needs = needs[arrays.out]
        kinds = []
        for operand, slots, where in ((0, arrays.a, a), (1, b_slot, b)):
            wanted = out_needs & needs[slots] & grads[code, operand]
            if operand == 1:
                wanted &= binary
            kinds.append(np.where(wanted, np.where(where >= 0, 1, 2), 0))
        # the entries: a Sum's is its position less the other ops before it;
        # the scalar ops fill the rest, in order
        sum_at = np.array([i for i, _ in sums], dtype=np.int64)
        sum_at -= np.searchsorted(self.others, sum_at)
        is_sum = np.zeros(n + len(sums), dtype=bool)
        is_sum[sum_at] = True
        scalar_at = np.flatnonzero(~is_sum)
        # a parameter's contribution goes where the layout says: added, or recorded
        self.recorded = {}
        if layout.recorded:
            for operand, kind in enumerate(kinds):
                for i in np.flatnonzero(kind == 2).tolist():
                    at = layout.recorded_at(int(arrays.out[i]), operand)
                    if at is not None:
                        kind[i] = 3
                        self.recorded[2 * int(scalar_at[i]) + operand] = at
        entries = np.zeros((4, len(is_sum)), dtype=np.int64)
        for row, values in enumerate((code | kinds[0] << _KIND_SHIFT | kinds[1] << (_KIND_SHIFT + 2), out, a, b)):
            entries[row, scalar_at] = values
        self.term, self.term_to = self._sums(sums, sum_at, entries, layout, needs)
        self.info, self.out, self.a, self.b = entries
        self.n, self.sums = n, len(sums)

    @staticmethod
    def _sums(sums, sum_at, entries, layout, needs):
        """The ``Sum`` entries (into ``entries``) and their terms: the places
        (``vm_term``) and where each term's gradient goes (``vm_term_to``)."""
        loc, program = layout.loc, layout.program
        terms = [t for _, op in sums for t in op.terms]
        counts = np.array([len(op.terms) for _, op in sums], dtype=np.int64)
        first = np.cumsum(counts) - counts
        term = loc[np.array(terms, dtype=np.int64)]
        # a term's gradient: the sum's, added to its row's (1) or to gp (2),
        # or recorded (3) for the parameter; none where either needs none
        outs = np.repeat(np.array([op.out for _, op in sums], dtype=np.int64), counts)
        wanted = needs[outs] & needs[np.array(terms, dtype=np.int64)]
        kind = np.where(wanted, np.where(term >= 0, 1, 2), 0)
        index = np.where(term >= 0, term, -1 - term)
        if layout.recorded:
            operands = np.arange(len(terms)) - np.repeat(first, counts)
            for j in np.flatnonzero(kind == 2).tolist():
                at = layout.recorded_at(int(outs[j]), int(operands[j]))
                if at is not None:
                    kind[j], index[j] = 3, at
        any_grad = np.add.reduceat(kind > 0, first) > 0 if len(sums) else np.zeros(0, dtype=bool)
        entries[:, sum_at] = [VM_SUM | any_grad.astype(np.int64) << _KIND_SHIFT,
                              loc[np.array([op.out for _, op in sums], dtype=np.int64)], first, counts]
        assert program.n_slots < 1 << 29     # an index << 2 fits an int
        return term, kind | index << 2

    def entry(self, position):
        """The entry of the op at ``position`` in ``program.ops``."""
        return position - int(np.searchsorted(self.others, position))

    def row_loop(self, step, forward):
        """A step of a plan (see ``plan_steps``) as a loop over a block's rows."""
        i0, i1, fn = step
        args = ROW_ARGS[forward] if fn else f'{i0}, {i1}, {ROW_ARGS[forward]}'
        return f'for (int r = r0; r < r1; r++) {fn or ("vm_forward" if forward else "vm_backward")}({args});'

    def plan_steps(self, plan, forward, name):
        """The steps running ``plan`` (``[(i0, i1, None)]`` for the table's
        entries ``i0..i1-1``, ``[(0, 0, function)]`` for a per-row function of
        statements; in order) over a block's rows: a loop each when the plan is
        short, else one call of the plan runner over a table of them, ``name``
        (clang's loop passes take about 1.4 ms per loop at -O2: the 11,600
        loops of a 400k-op table program took 28 s, its plans 2 s)."""
        if len(plan) <= PLAN_LOOPS:
            return [self.row_loop(step, forward) for step in plan]
        kind = 'Forward' if forward else 'Backward'
        lines = ', '.join(f'{{{i0}, {i1}, {fn or "NULL"}}}' for i0, i1, fn in plan)
        return [f'static const Vm{kind}Step {name}[{len(plan)}] = {{{lines}}};',
                f'vm_{kind.lower()}_plan({name}, {len(plan)}, b, r0, r1);']

    def c_text(self):
        """The table (four int arrays, from one blob unpacked by ``vm_unpack``,
        which ``init_constants`` calls) and its two loops."""
        def ints(name, values):
            values = list(values) or [0]
            lines = [', '.join(map(str, values[i:i + 24])) for i in range(0, len(values), 24)]
            return f'static const int {name}[{len(values)}] = {{\n' + ',\n'.join(lines) + '\n};'

        def doubles(name, values):
            values = [c_double(x) for x in values] or ['0.0']
            return f'static const double {name}[{len(values)}] = {{' + ', '.join(values) + '};'
        keys = sorted(self.recorded)
        n, t = max(1, len(self.info)), max(1, len(self.term))
        packed = np.zeros(4 * n + 2 * t, dtype=np.int64)
        for i, values in enumerate((self.info, self.out, self.a, self.b)):
            packed[i * n:i * n + len(values)] = values
        packed[4 * n:4 * n + len(self.term)] = self.term
        packed[4 * n + t:4 * n + t + len(self.term)] = self.term_to
        arrays = [('vm_info', n), ('vm_out', n), ('vm_a', n), ('vm_b', n), ('vm_term', t), ('vm_term_to', t)]
        starts = np.cumsum([0] + [size for _, size in arrays]).tolist()
        out = [f'/* the scalar op table: {self.n:,} ops and {self.sums:,} sums (compiler/codegen/table.py) */',
               f'#define VM_SUM {VM_SUM}   /* the code of a Sum entry */',
               f'static int vm_info[{n}], vm_out[{n}], vm_a[{n}], vm_b[{n}];   /* unpacked by vm_unpack */',
               f'static int vm_term[{t}], vm_term_to[{t}];   /* the Sums\' terms */',
               blob.literal('vm_packed', blob.little_endian(packed, 'int')),
               '',
               'static void\nvm_unpack(void)\n{',
               '    static int done;   /* once: the first state\'s init_constants, before any row runs */',
               '    if (done)\n        return;',
               *[f'    {blob.unpack_statement(f"vm_packed + {2 * 4 * start}", name, "int", size)}'
                 for (name, size), start in zip(arrays, starts)],
               '    done = 1;\n}',
               doubles('vm_k', self.k), doubles('vm_k1', [k - 1.0 for k in self.k]),
               ints('vm_rec_key', keys), ints('vm_rec_at', [self.recorded[k] for k in keys]),
               _LOOPS.replace('@N_REC@', str(len(keys)))
                     .replace('@FORWARD@', _forward_cases()).replace('@BACKWARD@', _backward_cases())]
        return '\n'.join(out)


def _forward_cases():
    k = Exponent('vm_k[y]', 'vm_k1[y]')
    cases = []
    for name, row in SCALAR_C.items():
        binary = SCALAR_OPS[name].arity == 2
        expr = row.forward('A', 'B' if binary else '', k)
        load = 'const double B = VM_V(y); ' if binary else ''
        cases.append(f'        case {OP_CODES[name]}: {{ {load}v[vm_out[i]] = {expr}; break; }}   /* {name} */')
    return '\n'.join(cases)


def _backward_cases():
    k = Exponent('vm_k[y]', 'vm_k1[y]')
    cases = []
    for name, row in SCALAR_C.items():
        binary = SCALAR_OPS[name].arity == 2
        lines = [f'        case {OP_CODES[name]}: {{   /* {name} */']
        if binary:
            lines.append('            const double B = VM_V(y);')
        for operand, contribution, condition in row.grads:
            expr = contribution('A', 'B' if binary else '', 'O', 'G', k)
            cond = condition('A', 'B') if condition else '1'
            lines.append(f'            VM_GRAD({operand}, {"x" if operand == 0 else "y"}, {expr}, {cond});')
        lines.append('            break; }')
        cases.append('\n'.join(lines))
    return '\n'.join(cases)


_LOOPS = r'''
#define VM_V(x) ((x) >= 0 ? v[x] : p[-1 - (x)])

static int
vm_recorded(int key)
{
    int lo = 0, hi = @N_REC@ - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (vm_rec_key[mid] < key) lo = mid + 1; else hi = mid;
    }
    return vm_rec_at[lo];
}

HIDDEN NOINLINE void
vm_forward(int i0, int i1, double *restrict v, const double *restrict p)
{
    for (int i = i0; i < i1; i++) {
        const int x = vm_a[i], y = vm_b[i];
        if ((vm_info[i] & 15) == VM_SUM) {      /* its y terms, from vm_term[x], left to right */
            double acc = VM_V(vm_term[x]);
            for (int k = 1; k < y; k++)
                acc += VM_V(vm_term[x + k]);
            v[vm_out[i]] = acc;
            continue;
        }
        const double A = VM_V(x);
        switch (vm_info[i] & 15) {
@FORWARD@
        }
        (void)y;
    }
}

/* a contribution to operand n (slot x): added where the statement would
   add it (only if cond holds), or recorded (0.0 where cond does not hold) */
#define VM_GRAD(n, x, e, cond) do { \
        switch ((info >> (4 + 2 * (n))) & 3) { \
        case 1: if (cond) g[x] += (e); break; \
        case 2: if (cond) gp[-1 - (x)] += (e); break; \
        case 3: g[vm_recorded(2 * i + (n))] = (cond) ? (e) : 0.0; break; \
        } } while (0)

HIDDEN NOINLINE void
vm_backward(int i0, int i1, const double *restrict v, double *restrict g, const double *restrict p,
            double *restrict gp)
{
    for (int i = i1 - 1; i >= i0; i--) {
        const int info = vm_info[i];
        if (!(info >> 4))
            continue;               /* no operand needs this op's gradient */
        const int x = vm_a[i], y = vm_b[i], o = vm_out[i];
        if ((info & 15) == VM_SUM) {    /* the sum's gradient to each term, last term first */
            const double G = g[o];
            for (int k = y - 1; k >= 0; k--) {
                const int to = vm_term_to[x + k];
                switch (to & 3) {
                case 1: g[to >> 2] += G; break;
                case 2: gp[to >> 2] += G; break;
                case 3: g[to >> 2] = G; break;       /* recorded, added in row order by param_grads */
                }
            }
            continue;
        }
        const double A = VM_V(x), O = v[o], G = g[o];
        switch (info & 15) {
@BACKWARD@
        }
        (void)y; (void)O; (void)A;
    }
}

/* A plan: steps run in order over a block's rows, each a range of the
   table's entries (fn NULL) or a per-row function of statements. */
typedef struct {
    int i0, i1;
    void (*fn)(double *restrict v, const double *restrict p);
} VmForwardStep;
typedef struct {
    int i0, i1;
    void (*fn)(const double *restrict v, double *restrict g, const double *restrict p, double *restrict gp);
} VmBackwardStep;

UNUSED static void
vm_forward_plan(const VmForwardStep *s, int n, const Block *b, int r0, int r1)
{
    for (int k = 0; k < n; k++)
        for (int r = r0; r < r1; r++) {
            if (s[k].fn)
                s[k].fn(ROW(b->v, r), b->p);
            else
                vm_forward(s[k].i0, s[k].i1, ROW(b->v, r), b->p);
        }
}

UNUSED static void
vm_backward_plan(const VmBackwardStep *s, int n, const Block *b, int r0, int r1)
{
    for (int k = 0; k < n; k++)
        for (int r = r0; r < r1; r++) {
            if (s[k].fn)
                s[k].fn(ROW(b->v, r), ROW(b->g, r), b->p, b->gp);
            else
                vm_backward(s[k].i0, s[k].i1, ROW(b->v, r), ROW(b->g, r), b->p, b->gp);
        }
}
'''
