"""LeNet training and predict throughput: our compiled model against PyTorch.

    python benchmarks/bench_conv.py                   # LeNet, embedded digits, clang and gcc
    python benchmarks/bench_conv.py --fashion         # Fashion-MNIST (Debian's package)
    python benchmarks/bench_conv.py --json conv.json  # also the whole report as JSON
    python benchmarks/bench_conv.py --quick           # a small LeNet, tcc: the test's smoke run

The model is ``mnist_data.lenet_graph`` (conv 5x5x6, ReLU, max-pool 2, conv
5x5x16, ReLU, max-pool 2, 256-120-84-10, softmax cross-entropy, float64).
Each system trains ``--images`` images in mini-batches of ``--batch`` (SGD
on the mean gradient) and predicts them, at 1 thread and at all threads
(``--threads``); the systems and thread counts take turns pass by pass,
``--repeats`` times, and the best pass counts (a shared machine only ever
slows a pass down). Reported: images/s and seconds per 60,000-image epoch,
the compile time (no build cache: ``MICROGRAD_CACHE=0``), and the ratio to
PyTorch at the same thread count.

PyTorch runs the same network as a PyTorch user writes it (``nn.Conv2d``,
``nn.MaxPool2d``, ``nn.Linear``, ``F.cross_entropy`` on the batch,
``optim.SGD``) in float64 from our initial weights. Our convolutions are
lifted by the conv pass (``compiler/conv.py``: one ``Conv`` op per layer);
the ReLUs and max-pools between them stay scalar code.

Checks (exit status 1 when one fails): the loss of image 0 at the initial
weights equals the interpreter's bit for bit for each of our builds, and is
within 1e-12 for PyTorch; each build's first-batch loss and parameters after
it are the same bits at 1 thread and at all threads.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ['MICROGRAD_CACHE'] = '0'     # compile times are real, never a cache hit

import numpy as np  # noqa: E402

import compiler  # noqa: E402
import mnist_data  # noqa: E402
from benchmarks.bench_machine import machine, usable_cores  # noqa: E402
from mnist_data.model import LENET_CHANNELS, LENET_HIDDEN, input_rows, lenet_graph  # noqa: E402

EPOCH_IMAGES = 60_000
DEFAULT_BUILDS = ('clang', 'gcc')
QUICK = {'builds': ('tcc',), 'channels': (2, 4), 'hidden': (16,), 'images': 128, 'repeats': 1}
TORCH_LOSS_TOLERANCE = 1e-12     # PyTorch sums in its own order: close, not the same bits


def log(message):
    print(message, file=sys.stderr, flush=True)


def load_rows(args):
    source, data = mnist_data.load_source(fashion=args.fashion)
    images, labels = data['train']
    n = min(args.images, len(images))
    return source, np.ascontiguousarray(input_rows(images[:n], labels[:n]))


def batches(X, batch):
    return [X[i:i + batch] for i in range(0, len(X), batch)]


# -- the systems: each can reset its weights, train one pass and predict one pass ----------

class Ours:
    def __init__(self, cc, args, init):
        self.name, self.init = cc, init
        graph = lenet_graph(seed=args.seed, channels=args.channels, hidden=args.hidden)
        started = time.perf_counter()
        self.model = compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params,
                                      outputs=graph.logits, cc=cc, timeout=args.compile_timeout)
        self.compile_s = time.perf_counter() - started
        build = self.model.build
        self.build = f"{build.toolchain.family} [{build.flags_text()}]"
        # the size of the program: its ops and lines of C
        self.size = {'ops': len(self.model.program.ops), 'c_lines': self.model.source.count('\n'),
                     'timings': dict(self.model.timings)}

    def loss0(self, row):
        self.model.set_params(self.init)
        self.model.set_input(list(row))
        return self.model.forward()

    def set_threads(self, n):
        self.model.threads = n

    def reset(self):
        self.model.set_params(self.init)

    def train(self, X, batch, lr):
        return [self.model.train_batch(b, lr) for b in batches(X, batch)]

    def params(self):
        return self.model.params()

    def predict(self, X):
        return self.model.predict(X)


class Torch:
    """The same LeNet in PyTorch float64, its weights set from our parameter
    order (``LeNetGraph``'s docstring): per conv output channel its weights,
    then its bias; per neuron its weights, then its bias."""

    def __init__(self, args, init):
        import torch
        from torch import nn
        self.torch, self.name, self.compile_s, self.build = torch, 'torch', None, f'torch {torch.__version__}'
        self.size = {}
        c1, c2 = args.channels
        sizes = [c2 * 16, *args.hidden, 10]
        linear = []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            linear += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
        self.net = nn.Sequential(nn.Conv2d(1, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), *linear).double()
        self.layers = [m for m in self.net if isinstance(m, (nn.Conv2d, nn.Linear))]
        self.init = init
        self.reset()

    def reset(self):
        at = 0
        with self.torch.no_grad():
            for layer in self.layers:
                out, n = layer.weight.shape[0], layer.weight[0].numel()
                block = self.init[at:at + out * (n + 1)].reshape(out, n + 1)
                layer.weight.copy_(self.torch.from_numpy(block[:, :n].reshape(layer.weight.shape)))
                layer.bias.copy_(self.torch.from_numpy(block[:, n].copy()))
                at += out * (n + 1)
        assert at == len(self.init), f"PyTorch's LeNet has {at} parameters, ours {len(self.init)}"

    def set_threads(self, n):
        self.torch.set_num_threads(n)

    def _split(self, X):
        t = self.torch.from_numpy(X)
        return t[:, :784].reshape(-1, 1, 28, 28), t[:, 784:].argmax(dim=1)

    def loss0(self, row):
        self.reset()
        x, y = self._split(np.asarray(row)[None, :])
        with self.torch.no_grad():
            return float(self.torch.nn.functional.cross_entropy(self.net(x), y))

    def train(self, X, batch, lr):
        opt, losses = self.torch.optim.SGD(self.net.parameters(), lr=lr), []
        for b in batches(X, batch):
            x, y = self._split(b)
            opt.zero_grad()
            loss = self.torch.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def params(self):
        cat = self.torch.cat
        return cat([cat([layer.weight.detach().reshape(layer.weight.shape[0], -1),
                         layer.bias.detach()[:, None]], dim=1).ravel() for layer in self.layers]).numpy()

    def predict(self, X):
        with self.torch.no_grad():
            return self.net(self._split(X)[0]).numpy()


# -- the run -------------------------------------------------------------------------------

def interpreter_loss0(args, row):
    started = time.perf_counter()
    graph = lenet_graph(seed=args.seed, channels=args.channels, hidden=args.hidden, row=row)
    return graph.loss.data, np.array([p.data for p in graph.params]), time.perf_counter() - started


def measure(systems, X, args, thread_counts):
    """Best pass of train and predict per (system, threads), taking turns."""
    best = {(s.name, t): {'train_s': float('inf'), 'predict_s': float('inf')}
            for s in systems for t in thread_counts}
    first = {}
    for s in systems:       # warm-up: first calls allocate, load libraries, start threads
        for t in thread_counts:
            s.set_threads(t)
            s.train(X[:args.batch], args.batch, args.lr)
            s.predict(X[:args.batch])
    for repeat in range(args.repeats):
        for s in systems:
            for t in thread_counts:
                s.set_threads(t)
                s.reset()
                started = time.perf_counter()
                losses = s.train(X, args.batch, args.lr)
                train_s = time.perf_counter() - started
                started = time.perf_counter()
                s.predict(X)
                predict_s = time.perf_counter() - started
                cell = best[s.name, t]
                cell['train_s'], cell['predict_s'] = min(cell['train_s'], train_s), min(cell['predict_s'], predict_s)
                if repeat == 0:
                    first[s.name, t] = (losses[0], s.params())
                log(f"  {s.name} {t}t pass {repeat + 1}: train {len(X) / train_s:.1f} img/s, "
                    f"predict {len(X) / predict_s:.1f} img/s")
    return best, first


def run(args):
    source, X = load_rows(args)
    threads = sorted({1, args.threads})
    report = {'machine': machine(), 'config': {
        'data': source, 'images': len(X), 'batch': args.batch, 'lr': args.lr, 'seed': args.seed,
        'repeats': args.repeats, 'threads': threads, 'builds': list(args.builds),
        'channels': list(args.channels), 'hidden': list(args.hidden), 'quick': args.quick},
        'rows': [], 'failures': []}
    log(f"interpreter: the loss of image 0 ({args.channels} channels, hidden {args.hidden})")
    loss0, init, interp_s = interpreter_loss0(args, X[0])
    report['interpreter'] = {'loss0': loss0, 'seconds': interp_s, 'params': len(init)}
    systems = []
    if not args.no_torch:
        try:
            systems.append(Torch(args, init))
        except ImportError:
            log("torch is not importable: no PyTorch row")
    for cc in args.builds:
        log(f"compiling with {cc}")
        try:
            systems.append(Ours(cc, args, init))
        except compiler.BuildError as e:
            report['failures'].append(f"{cc}: the build failed: {str(e).splitlines()[0]}")
    for s in systems:
        got = s.loss0(X[0])
        ok = got == loss0 if s.name != 'torch' else abs(got - loss0) <= TORCH_LOSS_TOLERANCE
        if not ok:
            report['failures'].append(f"{s.name}: loss of image 0 {got!r}, the interpreter's {loss0!r}")
        s.check = {'loss0': got, 'loss0_ok': ok}
    best, first = measure(systems, X, args, threads)
    for s in systems:
        if s.name != 'torch' and len(threads) > 1:
            (l1, p1), (la, pa) = first[s.name, threads[0]], first[s.name, threads[-1]]
            if l1 != la or not np.array_equal(p1, pa):
                report['failures'].append(f"{s.name}: 1 thread and {threads[-1]} threads differ")
        for t in threads:
            cell = best[s.name, t]
            report['rows'].append({
                'system': s.name, 'build': s.build, 'threads': t, 'compile_s': s.compile_s, **s.check, **s.size,
                'train_images_per_s': len(X) / cell['train_s'],
                's_per_epoch': cell['train_s'] / len(X) * EPOCH_IMAGES,
                'predict_images_per_s': len(X) / cell['predict_s']})
    torch_rate = {r['threads']: r['train_images_per_s'] for r in report['rows'] if r['system'] == 'torch'}
    for r in report['rows']:
        r['vs_torch'] = r['train_images_per_s'] / torch_rate[r['threads']] if torch_rate else None
    return report


def table(report):
    m, c = report['machine'], report['config']
    lines = [f"machine: {m['cpu']}, {m['cores_usable']} cores; torch {m['torch']}",
             f"data: {c['data']}, {c['images']} images, batch {c['batch']}, best of {c['repeats']} "
             f"pass(es); LeNet channels {c['channels']}, hidden {c['hidden']}; interpreter loss of "
             f"image 0 {report['interpreter']['loss0']!r}",
             '', '| system | threads | train img/s | s per 60k epoch | predict img/s | train vs PyTorch '
                 '| compile s | image 0 loss |',
             '|---|---:|---:|---:|---:|---:|---:|---|']
    for r in report['rows']:
        check = ('bit-identical' if r['system'] != 'torch' else 'within 1e-12') if r['loss0_ok'] else 'MISMATCH'
        vs = f"{r['vs_torch']:.2f}x" if r['vs_torch'] else '–'
        compile_s = f"{r['compile_s']:.1f}" if r['compile_s'] is not None else '–'
        lines.append(f"| {r['system']} | {r['threads']} | {r['train_images_per_s']:.1f} | "
                     f"{r['s_per_epoch']:.0f} | {r['predict_images_per_s']:.1f} | {vs} | {compile_s} | {check} |")
    lines.append('')
    lines += [f"{r['system']}: {r['build']}, {r['ops']:,} ops, {r['c_lines']:,} lines of C"
              for r in report['rows'] if r['system'] != 'torch' and r['threads'] == 1]
    lines.append('checks: all passed' if not report['failures'] else 'FAILED: ' + '; '.join(report['failures']))
    return '\n'.join(lines)


def whole_tuple(text):
    try:
        sizes = tuple(int(x) for x in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 6,16, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return sizes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true',
                   help=f"smoke run: LeNet with channels {QUICK['channels']} and hidden {QUICK['hidden']}, "
                        f"{QUICK['images']} images, builds {','.join(QUICK['builds'])}, 1 pass")
    p.add_argument('--builds', help=f"comma-separated C compilers (default: {','.join(DEFAULT_BUILDS)})")
    p.add_argument('--fashion', action='store_true', help="Fashion-MNIST from Debian's package")
    p.add_argument('--images', type=int, help='training images per pass (default 512)')
    p.add_argument('--batch', type=int, default=64, help='images per SGD step (default 64)')
    p.add_argument('--repeats', type=int, help='passes per system and thread count (default 2)')
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--seed', type=int, default=0, help='initial weights (lenet_graph seed)')
    p.add_argument('--threads', type=int, default=usable_cores(), help='"all threads" (default: every usable core)')
    p.add_argument('--channels', type=whole_tuple, help=f'the two convs\' channels (default {LENET_CHANNELS})')
    p.add_argument('--hidden', type=whole_tuple, help=f'hidden linear layers (default {LENET_HIDDEN})')
    p.add_argument('--compile-timeout', type=float, default=600.0, help='seconds per build (default 600)')
    p.add_argument('--no-torch', action='store_true', help='skip PyTorch')
    p.add_argument('--json', type=Path, help='also write the whole report here')
    args = p.parse_args(argv)
    quick = QUICK if args.quick else {'builds': DEFAULT_BUILDS, 'channels': LENET_CHANNELS,
                                      'hidden': LENET_HIDDEN, 'images': 512, 'repeats': 2}
    args.builds = tuple(b for b in args.builds.split(',') if b) if args.builds else quick['builds']
    for name in ('channels', 'hidden', 'images', 'repeats'):
        if getattr(args, name) is None:
            setattr(args, name, quick[name])
    if len(args.channels) != 2:
        p.error('--channels takes two numbers, like 6,16')
    if min(args.images, args.batch, args.repeats, args.threads) < 1:
        p.error('--images, --batch, --repeats and --threads must be at least 1')
    return args


def main(argv=None):
    args = parse_args(argv)
    report = run(args)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + '\n')
    return 1 if report['failures'] else 0


if __name__ == '__main__':
    sys.exit(main())
