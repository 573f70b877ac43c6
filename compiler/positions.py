"""The positions pass: a matrix applied at every position of a sequence runs
as one ``MatMat``, and the sequence runs layer by layer.

As traced (and after ``vectorize``), a sequence runs position by position:
each position's ops, then the next position's, so that a forward over ``n``
positions is a prefix of the program. A weight matrix applied at every
position (microgpt's attention and MLP matrices, its ``lm_head``) is then
one ``MatVec`` per position, and each of them streams the whole matrix
again. Yet within a layer every position's products depend only on that
layer's inputs: run layer by layer, the positions' products can all be done
at once, reading the matrix once.

1. Groups: the ``MatVec`` ops of one weight block, one at each of the
   positions ``0..k-1`` (in order), of one shape.
2. Stages: for each op, the number of groups on the longest path of data
   that reaches it, a group counting once for all its positions (it runs
   when its last position's input is ready). A group on a path to one of
   its own uses (a recurrence, ``h[t] = W h[t-1]``) stays per position.
3. Schedule: stage by stage; in a stage, its ops position by position (each
   position's in their traced order), then its groups, each one ``MatMat``.
   ``Program.position_runs`` records which position each run of ops belongs
   to: a forward over ``n`` positions runs the runs of positions below
   ``n``, and each ``MatMat`` on its first ``n`` uses; backward the same in
   reverse (compiler/codegen/program.py).
4. Check: the backward pass reaches the readers of every slot that needs a
   gradient in the traced order (a ``MatMat`` is one reader; the uses of a
   weight block, and scalar reads of its weights, count as reads of the
   block), so every gradient gets its contributions in the interpreter's
   order. If not, the pass returns the program unchanged.

Exactness: a ``MatMat`` computes each use's sums as its ``MatVec`` does;
only the order in which independent ops run changes, and the check above
keeps the order of every gradient's contributions. Running the first ``n``
positions runs exactly the ops the traced program runs for ``n`` (a
subsequence of the schedule), so a shorter sequence keeps its gradient
order too.
"""
from collections import defaultdict

import numpy as np

from compiler.ir import MatMat, MatVec, Op, Program, ScalarArrays, Sum, needs_grad


def positions(program):
    """``Program -> Program``: each matrix applied at every position of a
    sequence lifted into one ``MatMat``, the ops scheduled layer by layer."""
    if 'positions' in program.passes or not program.prefix_sums or program.position_runs is not None:
        return program
    seq = _Sequence.of(program)
    if seq is None:
        return program
    groups = seq.groups()
    while groups:
        op_stage, group_stage, cyclic = seq.stages(groups)
        if cyclic:          # those stay one MatVec per position
            groups = [g for i, g in enumerate(groups) if i not in cyclic]
            continue
        order, runs = seq.schedule(groups, op_stage, group_stage)
        if not seq.same_gradient_order(groups, order):
            return program
        return seq.rebuilt(groups, order, runs)
    return program


class _Sequence:
    """A sequence program as the pass reads it: its scalar ops as arrays, its
    lifted ops, and the position of every op."""

    def __init__(self, program, arrays, lifted, position):
        self.program, self.arrays, self.lifted = program, arrays, lifted
        self.position = position
        self.n_ops = len(position)
        self.lifted_at = np.array([i for i, _ in lifted], dtype=np.int64)
        self.scalar_at = np.delete(np.arange(self.n_ops), self.lifted_at)   # op index of each scalar op
        self.lifted_op = dict(lifted)

    @classmethod
    def of(cls, program):
        """The sequence, or None when there is nothing to do (no ``MatVec``)
        or the program does not run position by position."""
        arrays = program.arrays
        if arrays is not None:
            lifted = list(program.lifted)
        else:
            lifted = [(i, op) for i, op in enumerate(program.ops) if type(op) is not Op]
            arrays = ScalarArrays.from_ops([op for op in program.ops if type(op) is Op])
        if not any(type(op) is MatVec for _, op in lifted):
            return None
        n_ops = len(arrays.code) + len(lifted)
        if program.n_grad_ops != n_ops:
            return None
        producer = np.full(program.n_slots, -1, dtype=np.int64)
        lifted_at = np.array([i for i, _ in lifted], dtype=np.int64)
        producer[arrays.out] = np.delete(np.arange(n_ops), lifted_at)
        for i, op in lifted:
            producer[np.asarray(op.writes, dtype=np.int64)] = i
        cuts = producer[np.array(program.prefix_sums, dtype=np.int64)]
        if (cuts < 0).any() or (np.diff(cuts) <= 0).any() or cuts[-1] != n_ops - 2:
            return None
        # op i belongs to the first position whose cut is at or after it; the
        # last op (the mean of the losses) runs with the last position only
        position = np.minimum(np.searchsorted(cuts, np.arange(n_ops)), len(cuts) - 1)
        return cls(program, arrays, lifted, position)

    # -- 1. groups ----------------------------------------------------------------

    def groups(self):
        """Op indices of each group's uses, in position order."""
        by_block = defaultdict(list)
        for i, op in self.lifted:
            if type(op) is MatVec:
                by_block[op.wt0].append(i)
        # a block whose weights or parameter heads other ops read too (a
        # regulariser, a tied weight) takes its gradient row by row from
        # codegen/shared_grads.py: it stays one MatVec per position
        a = self.arrays
        other = set(np.concatenate([a.a, a.b[a.b >= 0]]).tolist())
        for _, op in self.lifted:
            if type(op) is not MatVec:
                other.update(op.reads)
        p0, p1 = self.program.param_start, self.program.param_end
        groups = []
        for members in by_block.values():
            ops = [self.lifted_op[i] for i in members]
            first = ops[0]
            heads = [h for op in ops for h in op.heads or () if p0 <= h < p1]
            if (other.intersection(range(first.wt0, first.wt0 + first.rows * first.cols))
                    or other.intersection(heads) or len(set(heads)) < len(heads)):
                continue
            if (len(members) >= 2 and self.position[members].tolist() == list(range(len(members)))
                    and all(op.rows == first.rows and op.cols == first.cols and op.grad_x == first.grad_x
                            and (op.heads is None) == (first.heads is None) for op in ops)):
                groups.append(members)
        return groups

    # -- 2. stages ----------------------------------------------------------------

    def stages(self, groups):
        """``(stage of each op, stage of each group, groups on a cycle)``: an
        op's stage is the most groups on a path of data to it, a group's the
        most before any of its uses. Found by sweeps in the traced order
        (each op after its operands) until the groups' stages settle;
        groups still rising after as many sweeps as there are groups lie on
        a cycle."""
        group_of = np.full(self.n_ops, -1, dtype=np.int64)
        for g, members in enumerate(groups):
            group_of[members] = g
        a = self.arrays
        out, x, y = a.out.tolist(), a.a.tolist(), a.either().tolist()
        stops = np.searchsorted(self.scalar_at, self.lifted_at).tolist() + [len(out)]
        lifted = [(i, op, int(group_of[i]), _inputs(op)) for i, op in self.lifted]
        gstage = [0] * len(groups)
        for sweep in range(len(groups) + 2):
            before = list(gstage)
            d = [0] * self.program.n_slots
            op_stage = [0] * len(out)
            lifted_stage = []
            j = 0
            for (i, op, g, reads), stop in zip(lifted, stops):
                for k in range(j, stop):
                    s, t = d[x[k]], d[y[k]]
                    d[out[k]] = op_stage[k] = s if s > t else t
                j = stop
                m = max(map(d.__getitem__, reads), default=0)
                if g >= 0:
                    if m > gstage[g]:
                        gstage[g] = m
                    m_out = gstage[g] + 1
                else:
                    m_out = m
                lifted_stage.append(m)
                for o in op.writes:
                    d[o] = m_out
            for k in range(j, len(out)):
                s, t = d[x[k]], d[y[k]]
                d[out[k]] = op_stage[k] = s if s > t else t
            if gstage == before:
                stage = np.empty(self.n_ops, dtype=np.int64)
                stage[self.scalar_at] = op_stage
                stage[self.lifted_at] = lifted_stage
                return stage, gstage, set()
        return None, None, {g for g in range(len(groups)) if gstage[g] != before[g]}

    # -- 3. schedule ----------------------------------------------------------------

    def schedule(self, groups, op_stage, group_stage):
        """The new order (op indices; a group by its first use) and its runs
        ``(start, end, position)`` (-1: a ``MatMat``)."""
        key_stage = 2 * op_stage
        key_position = self.position.copy()
        keep = np.ones(self.n_ops, dtype=bool)
        for g, members in enumerate(groups):
            key_stage[members[0]] = 2 * group_stage[g] + 1     # after the stage's ops
            key_position[members[0]] = -1
            keep[members[1:]] = False
        units = np.flatnonzero(keep)
        order = units[np.lexsort((units, key_position[units], key_stage[units]))]
        s, p = key_stage[order], key_position[order]
        starts = np.flatnonzero(np.r_[True, (s[1:] != s[:-1]) | (p[1:] != p[:-1]) | (p[1:] < 0)])
        ends = np.r_[starts[1:], len(order)]
        runs = tuple((int(a), int(b), int(p[a])) for a, b in zip(starts, ends))
        return order, runs

    # -- 4. check -------------------------------------------------------------------

    def same_gradient_order(self, groups, order):
        """Whether the readers of every slot that needs a gradient keep their
        order (see the module's docstring)."""
        program, a = self.program, self.arrays
        flags = needs_grad(program)
        needs = np.frombuffer(bytes(flags), dtype=np.uint8).astype(bool)
        block = np.full(program.n_slots, -1, dtype=np.int64)      # weight slot -> its block's first slot
        for _, op in self.lifted:
            if type(op) is MatVec:
                block[op.wt0:op.wt0 + op.rows * op.cols] = op.wt0
        slots, readers = [a.a, a.b[a.b >= 0]], [self.scalar_at, self.scalar_at[a.b >= 0]]
        for i, op in self.lifted:
            reads = np.asarray(_inputs(op), dtype=np.int64)
            if type(op) is MatVec:
                reads = np.r_[reads, op.wt0]
            slots.append(reads)
            readers.append(np.full(len(reads), i, dtype=np.int64))
        slots, readers = np.concatenate(slots), np.concatenate(readers)
        in_block = block[slots] >= 0
        slots = np.r_[slots, block[slots[in_block]]]                # a weight's reads are its block's too
        readers = np.r_[readers, readers[in_block]]
        keep = needs[slots]
        slots, readers = slots[keep], readers[keep]
        new_position = np.empty(self.n_ops, dtype=np.int64)
        new_position[order] = np.arange(len(order))
        for members in groups:
            new_position[members] = new_position[members[0]]
        at = np.lexsort((readers, slots))
        slots, pos = slots[at], new_position[readers[at]]
        same = slots[1:] == slots[:-1]
        return not np.any(same & (pos[1:] < pos[:-1]))

    # -- the program ------------------------------------------------------------------

    def rebuilt(self, groups, order, runs):
        program, a = self.program, self.arrays
        matmat = {members[0]: MatMat(tuple(self.lifted_op[i] for i in members)) for members in groups}
        is_lifted = np.zeros(self.n_ops, dtype=bool)
        is_lifted[self.lifted_at] = True
        scalar_index = np.full(self.n_ops, -1, dtype=np.int64)
        scalar_index[self.scalar_at] = np.arange(len(self.scalar_at))
        perm = scalar_index[order[~is_lifted[order]]]
        arrays = a.taken(perm)
        lifted = tuple((n, matmat.get(i) or self.lifted_op[i])
                       for n, i in zip(np.flatnonzero(is_lifted[order]).tolist(), order[is_lifted[order]].tolist()))
        out = Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                      constants=program.constants, arrays=arrays, lifted=lifted, n_grad_ops=len(order),
                      loss=program.loss, outputs=program.outputs, passes=program.passes + ('positions',),
                      slot_map=program.slot_map, param_order=program.param_order,
                      graph_hash=program.graph_hash, input_grads=program.input_grads, labels=program.labels,
                      prefix_sums=program.prefix_sums)
        out.known_needs_grad = bytes(needs_grad(program))
        out.position_runs = runs
        return out


def _inputs(op):
    """The slots a lifted op reads that may be computed: a ``MatVec``'s
    ``x`` and heads, not its weights (parameters)."""
    if type(op) is MatVec:
        return list(range(op.x0, op.x0 + op.cols)) + list(op.heads or ())
    if type(op) is Sum:
        return op.terms
    return list(op.reads)
