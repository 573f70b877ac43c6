"""C of a ``MatMat`` (one matrix applied at every position of a sequence):
the positions run are the loop kernels' rows.

The MatVec loop kernels (``templates/kernels_body.c``, through ``b->k``) run
``y = heads + W x`` over rows ``r0..r1`` whose ``x`` and ``y`` are ``ldx``
and ``ldy`` doubles apart, keeping each panel of W in L1 while every row's
sums run over it. When the positions' ``x`` (and ``y``) lie a constant
distance apart in a row (the layout puts each position's blocks in the
same order), one call with that distance as the stride and the positions
run (``b->upto``, at most the op's) as the rows computes every position
and reads W once; each output is the same left fold as the ``MatVec``'s,
so the bits are its bits. The input gradient is the same, over the
positions' ``gy`` and ``gx``. The weight gradient is the ``MatVec``
renderer's: one reduction over a block's rows and the uses, in backward
order (compiler/codegen/matvec.py).

Where the blocks are not evenly spaced, or the uses differ in what they
share (their heads), each use runs as its own ``MatVec`` when its
position does.
"""
import numpy as np

from compiler.codegen.layout import PANEL, round_up
from compiler.codegen.matvec import is_strided, weight_groups
from compiler.constants import MV_BGW_MK as GROUP
from compiler.ir import MatMat, read_slots


class MatMatRenderer:
    """Names, wrappers and calls of a program's ``MatMat`` ops; ``matvecs``
    (a ``MatVecRenderer``) names their uses and holds their aux places."""

    def __init__(self, program, layout, flags, matvecs):
        self.program, self.layout, self.flags, self.matvecs = program, layout, flags, matvecs
        self.ops = program.lifted_of(MatMat)
        self.name = {id(op): f'matmat{i + 1}' for i, op in enumerate(self.ops)}
        self.plan = {id(op): self._plan(op) for op in self.ops}
        # the gradients of the weights that only a MatMat running as one uses:
        # over the positions run (the MatVec renderer's would add all of them)
        self.weights = [op for op in self.ops if self.plan[id(op)] is not None
                        and matvecs.uses.get(op.uses[0].wt0) == list(reversed(op.uses))]
        matvecs.taken.update(op.uses[0].wt0 for op in self.weights)
        self.pipelined = self._pipelined()

    def _pipelined(self):
        """The ``MatMat`` ops whose weights' gradient is final as soon as
        their backward has run, and whose weights nothing after it reads:
        those whose weights only they read (no scalar op, no other lifted
        op, no output) and whose weight gradient adds to no head's
        (constant heads, or heads in the rows). ``nn_backward_step`` steps
        their weights while the rest of the backward runs
        (templates/core.c). In the order their backwards run (the last op
        first)."""
        lay = self.layout
        candidates = [op for op in self.weights if self.flags[op.uses[0].wt0]
                      and not any(not lay.is_row(h) and self.flags[h] for u in op.uses for h in u.heads or ())]
        if not candidates:
            return []
        program = self.program
        lifted = {id(op): read_slots(op) for _, op in program.lifted}
        reads = [np.asarray([program.loss, *program.outputs], dtype=np.int64), *lifted.values()]
        if program.arrays is not None:
            reads += [program.arrays.a, program.arrays.b[program.arrays.b >= 0]]
        count = np.bincount(np.concatenate(reads), minlength=program.n_slots)
        kept = []
        for op in candidates:       # read by anything but op itself?
            first = op.uses[0]
            w0, w1 = first.wt0, first.wt0 + first.rows * first.cols
            own = lifted[id(op)]
            own = np.bincount(own[(own >= w0) & (own < w1)] - w0, minlength=w1 - w0)
            if not (count[w0:w1] - own).any():
                kept.append(op)
        return kept[::-1]

    def _plan(self, op):
        """How ``op`` runs: ``None`` (use by use), else the row places and
        strides of its x and y and what its uses share."""
        lay, uses = self.layout, op.uses
        x = is_strided([lay.row_index(u.x0) for u in uses])
        y = is_strided([lay.row_index(u.y0) for u in uses])
        aux = {lay.aux[id(u)] for u in uses}
        row_heads = bool(uses[0].heads) and lay.aux[id(uses[0])].heads < 0
        backward = {id(u) in self.matvecs.has_backward for u in uses}
        inputs = {u.x0 < self.program.n_inputs for u in uses}
        if not (x and y) or len(backward) != 1 or len(inputs) != 1:
            return None
        if len({(a.heads, a.skip) for a in aux}) != 1 and not row_heads and not self._same_heads(uses):
            return None
        # the input gradient's calls: one per run of positions with one
        # backward order of rows (microgpt's first position has its own)
        bgx = []
        for t, u in enumerate(uses):
            if bgx and lay.aux[id(u)].bgx == lay.aux[id(bgx[-1][2])].bgx:
                bgx[-1][1] = t + 1
            else:
                bgx.append([t, t + 1, u])
        return dict(x=x, y=y, row_heads=row_heads, backward=backward.pop(), bgx=bgx)

    def _same_heads(self, uses):
        """Whether the uses' heads always hold the same numbers: the same
        slots, or constants of the same value (each ``sum()`` starts from a
        constant 0 of its own), so that the first use's padded heads and
        skip flag serve them all."""
        constants = self.program.constants

        def key(h):
            return ('constant', constants[h].hex()) if h in constants else ('slot', h)
        first = [key(h) for h in uses[0].heads]
        return all([key(h) for h in u.heads] == first for u in uses[1:])

    def inside(self):
        """The ids of the uses that the ``MatMat`` ops running as one run in
        their own calls (the uses' own wrappers are never called)."""
        return {id(u) for op in self.ops if self.plan[id(op)] is not None for u in op.uses}

    def functions(self):
        """The C wrappers of every ``MatMat`` that runs as one."""
        out = []
        for op in self.ops:
            plan = self.plan[id(op)]
            if plan is None:
                continue
            out.append(self._forward(op, plan))
            if plan['backward']:
                out.append(self._backward(op, plan))
        return out + [self._weight_grad(op) for op in self.weights]

    def _weight_grad(self, op):
        """The gradients of W (and of parameter heads) over a block's rows
        and, within a row, over the positions run in backward order (the
        last first), as ``MatVecRenderer._weight_grad`` over all the uses;
        this part's share of them."""
        first, T, name = op.uses[0], len(op.uses), self.name[id(op)]
        R, C, RP = first.rows, first.cols, round_up(first.rows, PANEL)
        groups = weight_groups(C)
        uses = list(reversed(op.uses))
        pairs = ', '.join(f'{self.layout.row_index(u.x0)}, {self.layout.row_index(u.y0)}' for u in uses)
        lines = [f'static const int {name}_groups[{len(groups) * GROUP}] = {{'
                 + ', '.join(str(c) for g in groups for c in g) + '};',
                 f'static void\n{name}_weight_grad(const Block *b, int rows, int part, int parts, void *scratch)\n{{',
                 f'    static const int uses[{2 * T}] = {{{pairs}}};   /* x, y of each position, the last first */',
                 self._count(op), f'    const int U0 = {T} - n, PANELS = {RP // PANEL}, GROUPS = {len(groups)};',
                 '    const double **xrow = (const double **)scratch, **gyrow = xrow + rows * n;',
                 '    void *rest = (void *)(gyrow + rows * n);',
                 '    for (int r = 0; r < rows; r++)',
                 '        for (int u = 0; u < n; u++) {',
                 '            xrow[r * n + u] = ROW(b->v, r) + uses[2 * (U0 + u)];',
                 '            gyrow[r * n + u] = ROW(b->g, r) + uses[2 * (U0 + u) + 1];',
                 '        }']
        if self.flags[first.wt0]:
            base = self.layout.weight_base[first.wt0]
            lines += ['    if (GROUPS < 2 * parts && PANELS >= parts)   /* split the neurons */',
                      f'        b->k->bgw({R}, {C}, rows * n, xrow, gyrow, b->gp + {base}, {RP}, {name}_groups, '
                      '0, GROUPS, PANELS * part / parts, PANELS * (part + 1) / parts, rest);',
                      '    else                   /* split the groups of inputs */',
                      f'        b->k->bgw({R}, {C}, rows * n, xrow, gyrow, b->gp + {base}, {RP}, {name}_groups, '
                      'GROUPS * part / parts, GROUPS * (part + 1) / parts, 0, PANELS, rest);']
        for i, u in enumerate(uses):
            heads = [h for h in u.heads or () if not self.layout.is_row(h) and self.flags[h]]
            if not heads:
                continue
            lines += [f'    if (n > {T - 1 - i} && part == {i} % parts) {{   /* heads of position {T - 1 - i} */',
                      '        const double **gy = xrow;   /* reused: this use\'s gy rows */',
                      f'        for (int r = 0; r < rows; r++) gy[r] = ROW(b->g, r) + {self.layout.row_index(u.y0)};']
            for k, h in enumerate(u.heads):
                if h in heads:
                    at = self.layout.shared_index(h)
                    lines.append(f'        {{ double a = b->gp[{at}]; for (int r = 0; r < rows; r++) '
                                 f'a += gy[r][{k}]; b->gp[{at}] = a; }}')
            lines.append('    }')
        lines += ['    (void)rest; (void)PANELS; (void)GROUPS; (void)U0;', '}']
        return '\n'.join(lines)

    def weight_grad_calls(self):
        """``param_grads``' calls: a pipelined op's gradient is made by
        ``pipeline_grad`` instead when the backward runs as
        ``nn_backward_step``'s (``b->pipe``)."""
        piped = {id(op) for op in self.pipelined}
        return [('if (b->pipe == NULL) ' if id(op) in piped else '')
                + f'{self.name[id(op)]}_weight_grad(b, rows, part, parts, scratch);' for op in self.weights]

    def pipeline_functions(self, block_of):
        """``pipeline_grad`` (the weight gradient of pipelined op j, on one
        row, all on the calling thread) and ``PIPELINE_BLOCK`` (each one's
        weight block: ``block_of(wt0)``, an index into ``WEIGHT_SPANS``)."""
        lines = ['static void\npipeline_grad(const Block *b, int j, void *scratch)\n{', '    switch (j) {']
        for j, op in enumerate(self.pipelined):
            lines.append(f'    case {j}: {self.name[id(op)]}_weight_grad(b, 1, 0, 1, scratch); break;')
        lines += ['    }', '    (void)b; (void)scratch;', '}']
        blocks = [str(block_of(op.uses[0].wt0)) for op in self.pipelined] or ['0']
        lines.append(f'static const int PIPELINE_BLOCK[] = {{{", ".join(blocks)}}};   /* pipelined op j\'s WEIGHT_SPANS */')
        return '\n'.join(lines)

    def _count(self, op):
        T = len(op.uses)
        return f'    const int n = b->upto < {T} ? b->upto : {T};   /* the positions run */'

    def _forward(self, op, plan):
        lay, first = self.layout, op.uses[0]
        name, a = self.name[id(op)], lay.aux[id(first)]
        (x0, xs), (y0, ys) = plan['x'], plan['y']
        lines = [f'/* {op} */', f'static void\n{name}_forward(const Block *b, int r0, int r1, void *scratch)\n{{',
                 self._count(op), '    const double *restrict p = b->p;',
                 '    for (int r = r0; r < r1; r++) {', '        double *restrict v = ROW(b->v, r);']
        if not first.heads:
            start, hp = 1, 'NULL'
        elif not plan['row_heads']:
            start, hp = 0, f'b->aux + {a.heads}'
        else:   # heads in the rows: each position's sums start from what its y holds
            start, hp = 2, 'NULL'
            for t, u in enumerate(op.uses):
                y = lay.row_index(u.y0)
                lines += [f'        if (n > {t}) {{',
                          *[f'            v[{y + k}] = {lay.value[h]};' for k, h in enumerate(u.heads)],
                          '        }']
        lines += [f'        b->k->fwd({self.matvecs.forward_panels(first.wt0)}, {hp}, {first.rows}, {first.cols}, {start}, '
                  f'b->aux[{a.skip}] != 0.0, v + {x0}, {xs}, v + {y0}, {ys}, 0, n, scratch);',
                  '    }', '    (void)p;', '}']
        return '\n'.join(lines)

    def _backward(self, op, plan):
        """Per row: the gradients of heads in the rows, then of every position's x."""
        lay, first = self.layout, op.uses[0]
        name, wa = self.name[id(op)], lay.weight_aux[first.wt0]
        (x0, xs), (y0, ys) = plan['x'], plan['y']
        lines = [f'static void\n{name}_backward(const Block *b, int r0, int r1, void *scratch)\n{{',
                 self._count(op), '    for (int r = r0; r < r1; r++) {',
                 '        double *restrict g = ROW(b->g, r);', '        (void)g;']
        for t, u in enumerate(op.uses):
            heads = [(k, h) for k, h in enumerate(u.heads or ()) if lay.is_row(h) and self.flags[h]]
            if heads:
                y = lay.row_index(u.y0)
                lines += [f'        if (n > {t}) {{', *[f'            {lay.grad[h]} += g[{y + k}];' for k, h in heads],
                          '        }']
        if first.grad_x:
            guard = '        if (b->input_grads)\n    ' if first.x0 < self.program.n_inputs else ''
            for t0, t1, u in plan['bgx']:    # (rows t0..t1 run none when n <= t0)
                rows = 'n' if t1 == len(op.uses) else f'(n < {t1} ? n : {t1})'
                lines.append(f'{guard}        b->k->bgx(b->aux + {lay.aux[id(u)].bgx}, {self.matvecs.name[id(u)]}_order, '
                             f'{first.rows}, {first.cols}, b->aux[{wa.finite}] != 0.0, g + {y0}, {ys}, g + {x0}, '
                             f'{xs}, {t0}, {rows}, scratch);')
        lines += ['    }', '}']
        return '\n'.join(lines)

    def forward_call(self, op):
        """The statements running ``op`` forward over rows r0..r1."""
        if self.plan[id(op)] is None:
            return self._each_use(op, lambda u: [self.matvecs.forward_call(u)])
        return [f'{self.name[id(op)]}_forward(b, r0, r1, scratch);   /* {len(op.uses)} positions at once */']

    def backward_call(self, op):
        plan = self.plan[id(op)]
        if plan is None:
            return self._each_use(op, lambda u: [self.matvecs.backward_call(u)]
                                  if id(u) in self.matvecs.has_backward else [], reverse=True)
        ready = [f'weight_ready(b, {j});   /* its weights\' gradient may be made and stepped */'
                 for j, o in enumerate(self.pipelined) if o is op]
        if not plan['backward']:
            return ready
        return [f'{self.name[id(op)]}_backward(b, r0, r1, scratch);   /* backward of {self.name[id(op)]} */', *ready]

    def _each_use(self, op, calls, reverse=False):
        steps = []
        order = reversed(list(enumerate(op.uses))) if reverse else enumerate(op.uses)
        for t, u in order:
            body = calls(u)
            if body:
                steps += [f'if (b->upto > {t}) {{', *['    ' + s for s in body], '}']
        return steps
