"""Karpathy's micrograd demo (demo.ipynb), compiled: an MLP(2, [16, 16, 1])
on 100 two-moons points, SVM hinge loss plus the L2 regulariser
``1e-4 * sum(p * p for p in model.parameters())``, 100 steps of SGD with
the rate going from 1.0 to 0.1.

    python examples/two_moons.py                 # both patterns, timed, checked
    python examples/two_moons.py --summary       # also m.summary() of each model

Two ways to compile it:

- **the whole batch as one graph**, as the notebook builds it: 100 copies
  of the model on 100 input rows, the mean hinge loss plus the regulariser;
  ``forward``, ``backward``, ``update`` per step. Its losses and parameters
  are the interpreter's, bit for bit (checked here on ``--check`` steps).
- **one row's graph, trained per batch** (``train_batch``): the loss of one
  point plus the regulariser, each row's gradient added up in row order;
  also without the regulariser, and with ``compiler.SGD(weight_decay=2e-4)``
  in its place (the same penalty's gradient, ``2 * 1e-4 * p``, added by the
  optimizer once per step). ``train_batch`` with the regulariser is checked
  against the interpreter doing the same on ``--check`` steps.

Times are CPU seconds of this process per step (``time.process_time``:
on a shared machine, time spent waiting for a core is not counted; with
``--threads 2`` both threads' time adds up), the least over ``--repeats``
runs of all the steps, the variants run alternately.
"""
import argparse
import math
import random
import sys
import time

import numpy as np

import compiler
from micrograd import Value
from micrograd.nn import MLP

ALPHA, STEPS = 1e-4, 100


def make_moons(n=100, noise=0.1):
    """Two interleaving half circles, following scikit-learn's ``make_moons``
    (shuffled, Gaussian noise), from numpy's global generator."""
    n_out, n_in = n // 2, n - n // 2
    outer = np.linspace(0, np.pi, n_out)
    inner = np.linspace(0, np.pi, n_in)
    X = np.vstack([np.append(np.cos(outer), 1 - np.cos(inner)),
                   np.append(np.sin(outer), 1 - np.sin(inner) - 0.5)]).T
    y = np.hstack([np.zeros(n_out), np.ones(n_in)])
    order = np.arange(n)
    np.random.shuffle(order)
    X, y = X[order], y[order]
    return X + np.random.normal(scale=noise, size=X.shape), y


def rate(k):
    return 1.0 - 0.9 * k / STEPS


def regulariser(model):
    return ALPHA * sum(p * p for p in model.parameters())


def whole_batch_graph(model, n):
    """The notebook's loss over ``n`` points: inputs x0, x1, y per point."""
    inputs = [Value(0.0) for _ in range(3 * n)]
    scores = [model(inputs[3 * i:3 * i + 2]) for i in range(n)]
    losses = [(1 + -inputs[3 * i + 2] * s).relu() for i, s in enumerate(scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    return data_loss + regulariser(model), inputs, scores


def row_graph(model, reg):
    """One point's loss (inputs x0, x1, y), with or without the regulariser."""
    inputs = [Value(0.0) for _ in range(3)]
    score = model(inputs[:2])
    loss = (1 + -inputs[2] * score).relu()
    return (loss + regulariser(model) if reg else loss), inputs, score


def interpreter_whole_batch(model, X, y, steps):
    """The notebook's loop on the interpreter: the losses of ``steps`` steps."""
    losses = []
    for k in range(steps):
        inputs = [list(map(Value, row)) for row in X]
        scores = list(map(model, inputs))
        hinge = [(1 + -yi * si).relu() for yi, si in zip(y, scores)]
        total = sum(hinge) * (1.0 / len(hinge)) + regulariser(model)
        model.zero_grad()
        total.backward()
        for p in model.parameters():
            p.data -= rate(k) * p.grad
        losses.append(total.data)
    return losses


def interpreter_per_row(model, rows, steps, reg=True):
    """``train_batch``'s arithmetic on the interpreter: every row's gradient
    added into the parameters' in row order, then ``p -= lr * grad / rows``."""
    losses = []
    for k in range(steps):
        model.zero_grad()
        total = 0.0
        for row in rows.tolist():
            loss = (1 + -row[2] * model([Value(row[0]), Value(row[1])])).relu()
            loss = loss + regulariser(model) if reg else loss
            loss.backward()
            total += loss.data
        for p in model.parameters():
            p.data -= rate(k) * (p.grad / len(rows))
        losses.append(total / len(rows))
    return losses


def fresh_model():
    random.seed(1337)
    return MLP(2, [16, 16, 1])       # the notebook's weights (random.uniform from the global random)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--check', type=int, default=STEPS, metavar='STEPS',
                    help='steps compared with the interpreter, bit for bit (default: all %(default)s; 0: none)')
    ap.add_argument('--repeats', type=int, default=5, help='timed runs of each variant (default 5)')
    ap.add_argument('--threads', type=int, default=1, help='threads of train_batch (default 1)')
    ap.add_argument('--cc', default=None, help='C compiler (default: chosen by the compiler)')
    ap.add_argument('--summary', action='store_true', help="print each model's m.summary()")
    args = ap.parse_args()

    np.random.seed(1337)
    X, y = make_moons(100, noise=0.1)
    y = y * 2 - 1
    rows = np.hstack([X, y[:, None]])

    # -- the whole batch as one graph -----------------------------------------
    model = fresh_model()
    loss, inputs, scores = whole_batch_graph(model, len(X))
    whole = compiler.compile(loss, inputs=inputs, params=model.parameters(), outputs=scores, cc=args.cc)
    start = whole.params()

    def run_whole(steps=STEPS):
        whole.set_params(start)
        whole.set_input(rows.ravel())
        out = []
        for k in range(steps):
            whole.zero_grad()
            out.append(whole.forward())
            whole.backward()
            whole.update(rate(k))
        return out

    # -- one row's graph, per batch ---------------------------------------------
    variants = {}
    for name, reg, optimizer in (('per row, no regulariser', False, None),
                                 ('per row, regulariser in the graph', True, None),
                                 ('per row, SGD(weight_decay=2e-4)', False, compiler.SGD(1.0, weight_decay=2 * ALPHA))):
        m_model = fresh_model()
        loss, inputs, score = row_graph(m_model, reg)
        variants[name] = compiler.compile(loss, inputs=inputs, params=m_model.parameters(), outputs=[score],
                                          cc=args.cc, optimizer=optimizer, threads=args.threads)

    def run_rows(m, steps=STEPS):
        m.set_params(start)
        if m.optimizer is not None:
            m.set_optimizer_state(np.zeros_like(m.optimizer_state()))
        return [m.train_batch(rows, rate(k)) for k in range(steps)]

    if args.summary:
        print('whole batch:\n' + whole.summary() + '\n')
        for name, m in variants.items():
            print(f'{name}:\n{m.summary()}\n')

    # -- bit for bit against the interpreter -------------------------------------
    status = 0
    if args.check:
        n = min(args.check, STEPS)
        t0 = time.perf_counter()
        ref = interpreter_whole_batch(fresh_model(), X.tolist(), y.tolist(), n)
        t_interp = (time.perf_counter() - t0) / n
        same = run_whole(n) == ref
        print(f'whole batch, {n} steps: losses {"identical to" if same else "DIFFER from"} the interpreter\'s '
              f'(interpreter {t_interp * 1e3:.0f} ms/step)')
        ref = interpreter_per_row(fresh_model(), rows, min(n, 3))
        same_rows = run_rows(variants['per row, regulariser in the graph'], len(ref)) == ref
        print(f'per row with the regulariser, {len(ref)} steps: losses '
              f'{"identical to" if same_rows else "DIFFER from"} the interpreter\'s')
        status = 0 if same and same_rows else 1

    # -- times, the variants alternately ---------------------------------------------
    runs = {'whole batch (forward, backward, update)': run_whole}
    runs.update({name: (lambda m=m: run_rows(m)) for name, m in variants.items()})
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            t0 = time.process_time()
            losses = run()
            times[name].append((time.process_time() - t0) / STEPS)
            assert all(math.isfinite(v) for v in losses)
    base = min(times['per row, no regulariser'])
    print(f'\n{STEPS} steps on 100 points; CPU time, best of {args.repeats} runs; '
          f'train_batch on {args.threads} thread(s)')
    print(f'{"":44}{"ms/step":>10}{"vs per row, no reg.":>22}')
    for name, ts in times.items():
        t = min(ts)
        print(f'{name:44}{t * 1e3:10.3f}{t / base:21.2f}x')
    final = run_whole()[-1]
    print(f'\nfinal loss (whole batch): {final:.6f}')
    return status


if __name__ == '__main__':
    sys.exit(main())
