"""microgpt training speed: compiled, on the interpreter, in PyTorch float64 and in numpy.

    python benchmarks/bench_microgpt.py                          # 1,000 steps each (~3 minutes)
    python benchmarks/bench_microgpt.py --interpreter-steps 50   # the interpreter on 50 steps only
    python benchmarks/bench_microgpt.py --n-embd 64 --n-layer 4 --n-head 4 --interpreter-steps 3
    python benchmarks/bench_microgpt.py --json out.json
    python benchmarks/bench_microgpt.py --quick --cc tcc         # CI smoke run, seconds

The model and its training are ``microgpt_train.py``'s defaults: Karpathy's
microgpt (n_embd 16, 1 layer, 4 heads, block 16; ``--n-embd``, ``--n-layer``,
``--n-head`` and ``--block-size`` as in ``microgpt_train.py``), Adam (betas
0.85, 0.99, eps 1e-8) with the learning rate 1e-2 decaying linearly to 0
over 1,000 steps, one name per step, seed 42. The four systems start from
the same initial weights and see the same names:

- **ours**: the graph of 16 positions compiled once (``compiler.compile``
  with the default compiler unless ``--cc``; on a cold cache: the build
  runs in an empty temporary cache folder, as a first compile does; the
  tracer's C walk, which the first ``compile()`` on a machine builds once
  for every later graph, is built before and its time reported apart, as
  ``bench_frontend.py`` does), ``forward(n)`` on the name's positions, Adam
  in C;
- **interpreter**: microgpt on ``micrograd`` as its author runs it, a new
  graph per step, ``backward()``, Adam in plain Python with the compiler's
  formulas. Its losses must equal ours bit for bit (checked here);
- **PyTorch**: the same model as a PyTorch user writes it (``nn.Module``, one
  name per step as a ``[T, C]`` sequence with a causal mask,
  ``F.cross_entropy``, ``torch.optim.Adam`` with ``LambdaLR`` for the decay),
  float64, one thread. Its arithmetic differs (other summation orders,
  another form of Adam), so its losses only come close to ours;
- **numpy**: ``benchmarks/microgpt_numpy.py``, the same model as a numpy
  user writes it (a ``[T, C]`` float64 matrix per name, the heads as one
  batched product, the backward derived by hand, ``microgpt_train.py``'s
  Adam on the flat parameter vector), one thread. Other summation orders
  again, so its losses come close to ours, not bit for bit.

One thread for PyTorch and numpy: this script sets ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` to 1 before numpy (or
PyTorch) is imported, whatever they were, and calls
``torch.set_num_threads(1)``. Ours runs with its default threads
(``$MICROGRAD_THREADS``, else the cores it may use; the table's second line
says how many), which give the same bits at any count.

ms/step is the mean time of one training step (the name's inputs, forward,
backward, the optimizer step) over a run, the median run of ``--repeats``
for ours, PyTorch and numpy, whose runs take turns (ours, PyTorch, numpy,
ours, ...) so that the machine's changing load falls on all three (the
interpreter runs once, after them); a ratio compares two systems over the
same steps (the interpreter's, when it runs fewer). "ours faster (median
steps)" compares the runs' median steps instead: on a loaded machine a run's
mean is mostly the steps another process interrupted, its median a step
that ran through. The machine is shared and noisy: trust ratios from one
run more than seconds.
Exit status 1 when the interpreter's losses differ from ours.
"""
import os

for _threads in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ[_threads] = '1'      # before numpy's BLAS starts its threads: one thread, as the docstring says

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'benchmarks'))

import microgpt_train as gpt  # noqa: E402
from compiler import cli, walk  # noqa: E402
from bench_machine import cold_cache, machine  # noqa: E402
from microgpt_numpy import NumpyGPT  # noqa: E402

LR = 1e-2                   # microgpt's, decaying linearly to 0
# issue 23's targets for the default config, and for a larger one (n_embd 64, 4 layers, 4 heads)
TARGETS = {'vs_interpreter': 1500.0, 'vs_torch': 20.0, 'vs_numpy': 4.0, 'compile_s': 2.0, 'loss_gap': 0.05}
LARGER_TARGETS = dict(TARGETS, vs_torch=5.0, vs_numpy=3.0, compile_s=5.0)
DEFAULT_SIZE = {'n_embd': 16, 'n_layer': 1, 'n_head': 4, 'block_size': 16}    # microgpt_train.py's


# -- the four systems ----------------------------------------------------------------


def timed_run(model, setup, steps, limit=None, progress=False):
    """``microgpt_train.train`` on ``model``; the per-step seconds and losses."""
    names, tokenizer, config, _, _ = setup
    lines = (lambda total: cli.ProgressLines(sys.stderr, 'step', total, unit='steps', percent=10)) if progress else None
    result = gpt.train(model, names, tokenizer, config, steps, LR, progress=lines, limit=limit)
    if result.stopped != 'completed':
        raise RuntimeError(result.message)
    return result.step_seconds, result.losses


def alternate(systems, repeats):
    """Train each of ``systems`` (``(row, run)``: ``run()`` trains from the initial
    weights and returns the per-step seconds and losses) ``repeats`` times, in
    turn (A, B, C, A, B, C, ...) so that the machine's changing load falls on
    all of them alike; fills each row's ``runs`` and ``losses``."""
    for _ in range(repeats):
        for row, run in systems:
            seconds, losses = run()
            if row['runs'] and losses != row['losses']:
                raise RuntimeError(f"{row['name']} gave other losses when trained again from the same weights")
            row['runs'].append(seconds)
            row['losses'] = losses
    return [row for row, _ in systems]


def prepare_ours(setup, steps, cc):
    """Compile (timed from the Value graph to the loaded module); the row and
    a run that trains from the initial weights (the same losses every time)."""
    _, _, config, weights, _ = setup
    t0 = time.perf_counter()
    walk.native_walker()        # once per machine (then from the cache): not this graph's compile
    walk_s = time.perf_counter() - t0
    with cold_cache('bench-microgpt-'):
        t0 = time.perf_counter()
        ours = gpt.CompiledGPT(config, weights, LR, cc=cc)
        total = time.perf_counter() - t0
    m = ours.model

    def run():
        m.set_params(gpt.flatten(weights))
        m.set_optimizer_state([0.0] * m.module.state_size)
        m.zero_grad()
        return timed_run(ours, setup, steps)

    build = m.build
    level = [f for f in build.flags if f.startswith('-O')]
    if build.straight_flags:     # the straight-line parts' own level, or their own compiler (tcc)
        straight = [f for f in build.straight_flags if f.startswith('-O')]
        if build.straight_toolchain is not None:
            straight = [build.straight_toolchain.family, *straight]
        level += [f"(straight-line {' '.join(straight)})"]
    return {'name': f"ours ({' '.join([build.toolchain.family, *level])})", 'runs': [], 'losses': None,
            'compile_s': total, 'graph_s': total - sum(m.timings.values()), 'walk_s': walk_s,
            'timings': dict(m.timings), 'compiler': build.toolchain.version, 'flags': build.flags_text().split(' '),
            'c_lines': m.source.count('\n'), 'ops': len(m.program.ops), 'threads': m.threads}, run


def measure_interpreter(setup, steps, limit):
    _, _, config, weights, _ = setup
    model = gpt.InterpreterGPT(config, weights, LR)
    seconds, losses = timed_run(model, setup, steps, limit=limit, progress=True)
    return {'name': 'interpreter', 'runs': [seconds], 'losses': losses}


def prepare_torch(torch, setup, steps):
    """microgpt in PyTorch, float64, one thread; the row and a run that trains
    a fresh model and optimizer from the same initial weights."""
    import torch.nn as nn
    import torch.nn.functional as F

    names, tokenizer, config, weights, _ = setup
    torch.set_num_threads(1)

    def rmsnorm(x):
        return x * (x.pow(2).mean(dim=-1, keepdim=True) + gpt.RMS_EPS).rsqrt()

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            e = c.n_embd
            self.n_head = c.n_head
            self.attn_wq, self.attn_wk = nn.Linear(e, e, bias=False), nn.Linear(e, e, bias=False)
            self.attn_wv, self.attn_wo = nn.Linear(e, e, bias=False), nn.Linear(e, e, bias=False)
            self.mlp_fc1, self.mlp_fc2 = nn.Linear(e, 4 * e, bias=False), nn.Linear(4 * e, e, bias=False)
            self.register_buffer('causal', torch.tril(torch.ones(c.block_size, c.block_size, dtype=torch.bool)))

        def forward(self, x):
            T, C = x.shape
            h = rmsnorm(x)
            heads = lambda y: y.view(T, self.n_head, C // self.n_head).transpose(0, 1)   # [H, T, hd]
            q, k, v = heads(self.attn_wq(h)), heads(self.attn_wk(h)), heads(self.attn_wv(h))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
            att = att.masked_fill(~self.causal[:T, :T], float('-inf'))
            y = (F.softmax(att, dim=-1) @ v).transpose(0, 1).reshape(T, C)
            x = x + self.attn_wo(y)
            return x + self.mlp_fc2(F.relu(self.mlp_fc1(rmsnorm(x))))

    class GPT(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.wte = nn.Embedding(c.vocab_size, c.n_embd)
            self.wpe = nn.Embedding(c.block_size, c.n_embd)
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
            self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layer))

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[0]))
            x = rmsnorm(x)
            for block in self.layers:
                x = block(x)
            return self.lm_head(x)

    def one_run():
        model = GPT(config).double()
        with torch.no_grad():
            for name, rows in weights.items():
                if '.' in name:
                    layer, matrix = name.split('.')
                    module = getattr(model.layers[int(layer[len('layer'):])], matrix)
                else:
                    module = getattr(model, name)
                module.weight.copy_(torch.tensor(rows, dtype=torch.float64))
        opt = torch.optim.Adam(model.parameters(), lr=LR, betas=gpt.BETAS, eps=gpt.ADAM_EPS)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / steps)
        seconds, losses = [], []
        clock = time.perf_counter
        for step in range(steps):
            tokens = tokenizer.encode(names[step % len(names)])
            n = gpt.positions_of(tokens, config)
            t0 = clock()
            idx, targets = torch.tensor(tokens[:n]), torch.tensor(tokens[1:n + 1])
            loss = F.cross_entropy(model(idx), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            seconds.append(clock() - t0)
            losses.append(loss.item())
        return seconds, losses

    return {'name': 'PyTorch float64', 'runs': [], 'losses': None,
            'torch': torch.__version__, 'threads': torch.get_num_threads()}, one_run


def prepare_numpy(setup, steps):
    """``microgpt_numpy.NumpyGPT``; the row and a run that trains a fresh one
    from the same initial weights."""
    import numpy as np

    _, _, config, weights, _ = setup
    return {'name': 'numpy', 'runs': [], 'losses': None, 'numpy': np.__version__,
            'blas_threads': os.environ['OPENBLAS_NUM_THREADS']}, \
        lambda: timed_run(NumpyGPT(config, weights, LR), setup, steps)


# -- the report ---------------------------------------------------------------------------


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def per_step(row, steps=None, average=mean):
    """Seconds per step over the first ``steps`` steps: the median over the runs
    of each run's mean (or, with ``average=statistics.median``, its median step)."""
    return statistics.median(average(run[:steps]) for run in row['runs'])


def summarise(row, ours):
    """ms/step of ``row`` and the ratio to ours over the same steps."""
    timed = len(row['runs'][0])
    row['steps_timed'], row['repeats'] = timed, len(row['runs'])
    row['ms_per_step'] = 1e3 * per_step(row)
    row['ms_per_step_median'] = 1e3 * statistics.median(statistics.median(run) for run in row['runs'])
    row['ours_faster'] = per_step(row) / per_step(ours, timed)
    # a step that was not interrupted: steadier than the mean when the machine is loaded
    row['ours_faster_median_step'] = (per_step(row, average=statistics.median)
                                      / per_step(ours, timed, average=statistics.median))
    row['loss_first100'] = mean(row['losses'][:gpt.AVERAGE_STEPS])
    row['loss_last100'] = mean(row['losses'][-gpt.AVERAGE_STEPS:]) if len(row['losses']) >= gpt.AVERAGE_STEPS else None
    return row


def compare_losses(row, ours):
    """How ``row``'s losses relate to ours: bit-identical steps, or the largest difference."""
    pairs = list(zip(ours['losses'], row['losses']))
    row['identical_steps'] = sum(1 for a, b in pairs if gpt.same_bits(a, b))
    row['first_difference'] = next((i + 1 for i, (a, b) in enumerate(pairs) if not gpt.same_bits(a, b)), None)
    row['max_abs_loss_difference'] = max(abs(a - b) for a, b in pairs)
    row['first_loss_relative_difference'] = abs(pairs[0][0] - pairs[0][1]) / abs(pairs[0][0])


def ratio(x):
    """``2,242x`` from 100 up, ``10.9x`` and ``0.7x`` below."""
    return f"{x:,.0f}x" if x >= 100 else f"{x:.1f}x"


def fmt(x, spec, empty='–'):
    return empty if x is None else format(x, spec)


def table(report):
    c, m = report['config'], report['machine']
    ours = report['results'][0]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, load {m['loadavg'][0]}; python {m['python']}, "
             f"torch {m['torch'] or 'not installed'}, git {m['git']}",
             f"microgpt n_embd {c['n_embd']}, {c['n_layer']} layer{'s' * (c['n_layer'] != 1)}, "
             f"{c['n_head']} head{'s' * (c['n_head'] != 1)}, block {c['block_size']}, {c['params']:,} parameters; "
             f"{c['steps']} steps, seed {c['seed']}; ours: {ours['compiler']} [{' '.join(ours['flags'])}], "
             f"{ours['ops']:,} ops, {ours['c_lines']:,} lines of C, {ours['threads']} thread{'s' * (ours['threads'] != 1)}; "
             f"PyTorch and numpy one thread",
             '',
             '| system | compile s | runs x steps | ms/step | median step ms | ours faster | (median steps) '
             '| loss first 100 | loss last 100 | losses vs ours |',
             '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|']
    for r in report['results']:
        if r is ours:
            vs = '–'
        elif r['identical_steps'] == r['steps_timed']:
            vs = f"bit-identical ({r['identical_steps']} steps)"
        elif r['name'] == 'interpreter':
            vs = f"**differ** from step {r['first_difference']}"
        else:
            vs = (f"first step rel. {r['first_loss_relative_difference']:.1e}, "
                  f"max abs {r['max_abs_loss_difference']:.1e}")
        lines.append(f"| {r['name']} | {fmt(r.get('compile_s'), '.2f')} | {r['repeats']} x {r['steps_timed']:,} | "
                     f"{r['ms_per_step']:.3f} | {r['ms_per_step_median']:.3f} | "
                     f"{'1x' if r is ours else ratio(r['ours_faster'])} | "
                     f"{'1x' if r is ours else ratio(r['ours_faster_median_step'])} | "
                     f"{r['loss_first100']:.4f} | {fmt(r['loss_last100'], '.4f')} | {vs} |")
    t = ours['timings']
    lines += ['', f"ours compiled in {ours['compile_s']:.2f} s: Value graph {ours['graph_s']:.2f} s, "
              + ', '.join(f"{k} {v:.2f} s" for k, v in t.items())
              + (f" (before it, the tracer's C walk, built once per machine: {ours['walk_s']:.2f} s)"
                 if ours.get('walk_s', 0) >= 0.05 else ''), '',
              f"targets (issue 23's for {'the default config' if report['config']['default_size'] else 'a larger config'}):"]
    for name, value, target, ok in report['targets']:
        lines.append(f"- {name}: {value} (target {target}): {'met' if ok else '**missed**'}")
    return '\n'.join(lines)


def targets(results, default_size=True):
    """``(what, value, target, met)`` for each of issue 23's targets that this run measured."""
    goal = TARGETS if default_size else LARGER_TARGETS
    ours, rest = results[0], {r['name']: r for r in results[1:]}
    out = []
    interp, torch_row, numpy_row = rest.get('interpreter'), rest.get('PyTorch float64'), rest.get('numpy')
    if interp:
        out.append(('ours vs interpreter per step', f"{interp['ours_faster']:,.0f}x",
                    f">= {goal['vs_interpreter']:,.0f}x", interp['ours_faster'] >= goal['vs_interpreter']))
    if torch_row:
        out.append(('ours vs PyTorch per step', f"{torch_row['ours_faster']:,.1f}x",
                    f">= {goal['vs_torch']:g}x", torch_row['ours_faster'] >= goal['vs_torch']))
    if numpy_row:
        out.append(('ours vs numpy per step', f"{numpy_row['ours_faster']:,.2f}x",
                    f">= {goal['vs_numpy']:g}x", numpy_row['ours_faster'] >= goal['vs_numpy']))
    out.append(('everything ours compiled', f"{ours['compile_s']:.2f} s", f"<= {goal['compile_s']:g} s",
                ours['compile_s'] <= goal['compile_s']))
    if interp and interp['loss_last100'] is not None:
        gap = abs(ours['loss_last100'] - interp['loss_last100'])
        out.append(('|loss last 100, ours - interpreter|', f"{gap:.3g}", f"<= {goal['loss_gap']:g}",
                    gap <= goal['loss_gap']))
    if interp:
        out.append(("interpreter's losses equal ours", f"{interp['identical_steps']}/{interp['steps_timed']} steps",
                    'all', interp['identical_steps'] == interp['steps_timed']))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=1000, help='training steps (default: %(default)s)')
    p.add_argument('--interpreter-steps', type=int,
                   help='steps the interpreter runs, from the first (default: all; 0 skips it)')
    p.add_argument('--cc', help="C compiler for ours (default: the compiler's own default)")
    p.add_argument('--seed', type=int, default=42)
    number = cli.number     # the model's size, as microgpt_train.py takes it
    p.add_argument('--n-embd', metavar='N', type=number(int, 1), default=DEFAULT_SIZE['n_embd'],
                   help='embedding width (default: %(default)s)')
    p.add_argument('--n-layer', metavar='N', type=number(int, 0), default=DEFAULT_SIZE['n_layer'],
                   help='transformer blocks (default: %(default)s)')
    p.add_argument('--n-head', metavar='N', type=number(int, 1), default=DEFAULT_SIZE['n_head'],
                   help='attention heads; must divide --n-embd (default: %(default)s)')
    p.add_argument('--block-size', metavar='N', type=number(int, 1), default=DEFAULT_SIZE['block_size'],
                   help='most positions of a name (default: %(default)s)')
    p.add_argument('--repeats', type=int, default=5,
                   help='training runs of ours, PyTorch and numpy, in turn; ms/step is the median run '
                        '(default: %(default)s)')
    p.add_argument('--no-torch', action='store_true', help='skip PyTorch even if it is installed')
    p.add_argument('--no-numpy', action='store_true', help='skip the numpy port')
    p.add_argument('--quick', action='store_true', help='CI smoke run: 30 steps, 2 runs, 3 steps on the interpreter')
    p.add_argument('--json', type=Path, help='also write the report here')
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 30, 2
        args.interpreter_steps = 3 if args.interpreter_steps is None else args.interpreter_steps
    if args.interpreter_steps is None:
        args.interpreter_steps = args.steps
    if args.steps < 1 or args.repeats < 1 or not 0 <= args.interpreter_steps <= args.steps:
        p.error('--steps and --repeats must be at least 1, --interpreter-steps from 0 to --steps')
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}: "
                f"each head takes n_embd / n_head of the embedding")
    return args


def import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    size = {k: getattr(args, k) for k in DEFAULT_SIZE}
    setup = gpt.prepare(gpt.load_names(), args.seed, **size)
    config = setup[2]
    report = {'machine': machine(),
              'config': {'steps': args.steps, 'interpreter_steps': args.interpreter_steps, 'seed': args.seed,
                         'repeats': args.repeats,
                         'cc': args.cc, 'lr': LR, 'betas': list(gpt.BETAS), 'eps': gpt.ADAM_EPS,
                         'vocab_size': config.vocab_size, 'n_embd': config.n_embd, 'n_layer': config.n_layer,
                         'n_head': config.n_head, 'block_size': config.block_size, 'quick': args.quick,
                         'params': sum(rows * cols for _, rows, cols in gpt.matrix_shapes(config)),
                         'default_size': size == DEFAULT_SIZE}}
    log(f"ours: compiling ({args.cc or 'default compiler'})")
    systems = [prepare_ours(setup, args.steps, args.cc)]
    torch = None if args.no_torch else import_torch()
    if torch:
        systems.append(prepare_torch(torch, setup, args.steps))
    if not args.no_numpy:
        systems.append(prepare_numpy(setup, args.steps))
    log(f"{', '.join(row['name'] for row, _ in systems)}: {args.repeats} x {args.steps} steps, in turn")
    ours, *others = alternate(systems, args.repeats)
    results = [summarise(ours, ours)]
    if args.interpreter_steps:
        log(f"interpreter: {args.interpreter_steps} steps")
        results.append(summarise(measure_interpreter(setup, args.steps, args.interpreter_steps), ours))
    results += [summarise(row, ours) for row in others]
    for r in results[1:]:
        compare_losses(r, ours)
    report['results'] = results
    report['targets'] = targets(results, report['config']['default_size'])
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + '\n')
    interp = next((r for r in results if r['name'] == 'interpreter'), None)
    return 1 if interp and interp['identical_steps'] != interp['steps_timed'] else 0


if __name__ == '__main__':
    sys.exit(main())
