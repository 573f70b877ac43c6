"""MNIST training throughput: compiled graph (per build), interpreter, PyTorch.

    python benchmarks/bench_mnist.py                      # embedded 4,000 digits, every build
    python benchmarks/bench_mnist.py --quick              # CI smoke run, < 2 minutes
    python benchmarks/bench_mnist.py --builds tcc,clang-O1 --json out.json
    python benchmarks/bench_mnist.py --data ~/mnist --images 10000

The model is the one of the issue: a 784-50-10 MLP (ReLU), softmax
cross-entropy against a one-hot label, float64, SGD with batch 1000. The
compiled graph's inputs are the 784 pixels and the 10 label entries, so one
build serves every image.

Every throughput is also given as a speedup over PyTorch per-sample measured
in the same run (``torch_per_sample_seconds / this_seconds``): PyTorch
per-sample does the same arithmetic as the compiled graph (one image at a
time, gradients summed over the batch, then the step). On a shared machine
trust those ratios more than the seconds.

Each build runs in its own worker process and session: a compile that runs
past ``--compile-timeout`` is recorded as a timeout, and whatever the compiler
left running (gcc's ``cc1`` outlives its killed driver) is killed with the
session. Compile times are real (``MICROGRAD_CACHE=0``, never a cache hit).
"""
import argparse
import gc
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import compiler  # noqa: E402
import mnist_data  # noqa: E402
from compiler.files import kill_process_group  # noqa: E402
from micrograd import Value, cross_entropy  # noqa: E402
from mnist_data import N_CLASSES, N_PIXELS, input_rows, mnist_graph  # noqa: E402

HIDDEN = 50
EPOCH = 60_000  # images in a full MNIST training epoch

# Build name -> keyword arguments of ``compiler.compile`` (beyond the graph).
# Only the keywords an entry names are passed. ``cc`` says which compiler must
# be installed; the benchmark adds ``timeout`` unless an entry sets its own.
# A keyword that ``compiler.compile`` does not accept makes the row
# "unsupported" (the run goes on), except a switch set to ``False``: turning
# off a feature the compiler does not have asks for nothing, so it is dropped.
# The plain rows are the straight-line program (``vectorize=False``).
BUILDS = {
    'tcc': {'cc': 'tcc', 'vectorize': False},
    'clang-O0': {'cc': 'clang', 'opt': '-O0', 'vectorize': False},
    'clang-O1': {'cc': 'clang', 'opt': '-O1', 'vectorize': False},
    'clang-O2': {'cc': 'clang', 'opt': '-O2', 'vectorize': False},
    'gcc-O2': {'cc': 'gcc', 'opt': '-O2', 'vectorize': False},
    'tcc-vec': {'cc': 'tcc', 'vectorize': True},
    'clang-O2-vec': {'cc': 'clang', 'opt': '-O2', 'vectorize': True},
    'gcc-O3-vec': {'cc': 'gcc', 'opt': '-O3', 'vectorize': True},   # gcc's default level
    'clang-O2-vec-native': {'cc': 'clang', 'opt': '-O2', 'vectorize': True, 'native': True},
}
QUICK_BUILDS = ('tcc', 'clang-O0')
TOOLCHAINS = ('tcc', 'clang', 'gcc')

# Every result row has these keys (None where they do not apply).
ROW_FIELDS = (
    'name', 'kind', 'status', 'note',
    'compile_s', 'images', 'repeats', 'pass_seconds',
    'images_per_s', 's_per_epoch', 'speedup_vs_torch_per_sample', 'speedup_vs_torch_batched',
    'loss0', 'first_batch_loss', 'trained_loss',
)
# Extra keys of a compiled row.
BUILD_FIELDS = ('kwargs', 'toolchain', 'version', 'flags', 'passes', 'trace_s', 'passes_s',
                'codegen_s', 'load_s', 'c_lines', 'c_bytes', 'compiler_peak_mb')


def row(name, kind, status='ok', **values):
    out = dict.fromkeys(ROW_FIELDS + (BUILD_FIELDS if kind == 'compiled' else ()))
    out.update(name=name, kind=kind, status=status, **values)
    return out


# -- the model and the data ------------------------------------------------------


def load_images(data_dir, n_images, batch):
    """Rows ``[pixels / 255, one-hot label]`` (float64 [N, 794]) and the labels.

    ``N`` is ``n_images`` (default: all training images), rounded down to
    whole batches.
    """
    if data_dir:
        images, labels = mnist_data.load(data_dir)['train']
        source = str(data_dir)
    else:
        images, labels = mnist_data.load_embedded()['train']
        source = 'embedded'
    n = len(images) if n_images is None else min(n_images, len(images))
    n -= n % batch
    if n == 0:
        raise SystemExit(f'need at least one batch of {batch} images, have {len(images)}')
    return input_rows(images[:n], labels[:n]), labels[:n].astype(np.int64), source


def batches(X, batch):
    return [X[i:i + batch] for i in range(0, len(X), batch)]


def throughput(name, kind, n_images, pass_seconds, **values):
    """A row from the seconds of each timed pass over ``n_images`` (median of passes)."""
    median = statistics.median(pass_seconds)
    per_s = n_images / median
    return row(name, kind, images=n_images, repeats=len(pass_seconds),
               pass_seconds=pass_seconds, images_per_s=per_s, s_per_epoch=EPOCH / per_s, **values)


# -- the machine ---------------------------------------------------------------------


def cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags(wanted=('avx2', 'fma', 'avx512f')):
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    have = set(line.split(':', 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def mem_total_gb():
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemTotal:'):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def git_commit():
    try:
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ('+dirty' if dirty else '')) or None


def machine():
    torch = import_torch()
    compilers = {}
    for name in TOOLCHAINS:
        try:
            compilers[name] = compiler.find_compiler(name).version
        except compiler.CompilerNotFound:
            compilers[name] = None
    return {
        'cpu': cpu_model(),
        'cpu_flags': cpu_flags(),
        'cores': os.cpu_count(),
        'cores_usable': len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
        'mem_gb': mem_total_gb(),
        'loadavg': [round(x, 2) for x in os.getloadavg()],
        'os': platform.platform(),
        'python': platform.python_version(),
        'numpy': np.__version__,
        'torch': torch.__version__ if torch else None,
        'compilers': compilers,
        'git': git_commit(),
    }


def import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


# -- the graph ---------------------------------------------------------------------


def measure_graph():
    """Seconds to build, trace and emit the graph, and the size of the program and C."""
    t0 = time.perf_counter()
    g = mnist_graph([HIDDEN])
    t1 = time.perf_counter()
    program = compiler.trace(g.loss, g.inputs, g.params, g.logits)
    t2 = time.perf_counter()
    source = compiler.emit_module(program)
    t3 = time.perf_counter()
    return {
        'build_s': t1 - t0, 'trace_s': t2 - t1, 'codegen_s': t3 - t2,
        'ops': len(program.ops), 'slots': program.n_slots, 'params': program.n_params,
        'c_lines': source.count('\n'), 'c_bytes': len(source.encode()),
    }


# -- the interpreter -------------------------------------------------------------------


def measure_interpreter(X, n_images, lr):
    """micrograd as a user runs it: per image a new graph (the forward), then ``backward``.

    Parameter gradients accumulate over the images, then one SGD step on
    their mean, as ``train_batch`` does. Includes the garbage collection of
    the previous image's graph (its ``_backward`` closures form cycles).
    """
    model = mnist_graph([HIDDEN]).model
    params = model.parameters()
    losses = []
    t0 = time.perf_counter()
    for r in X[:n_images]:
        pixels = r.tolist()
        xs = [Value(v) for v in pixels[:N_PIXELS]]
        ys = [Value(v) for v in pixels[N_PIXELS:]]
        loss = cross_entropy(model(xs), ys)
        loss.backward()
        losses.append(loss.data)
    for p in params:
        p.data -= lr * (p.grad / n_images)
        p.grad = 0.0
    seconds = time.perf_counter() - t0
    return throughput('micrograd', 'interpreter', n_images, [seconds], loss0=losses[0],
                      note='graph rebuilt per image')


# -- PyTorch ---------------------------------------------------------------------------


def initial_weights():
    """The model's initial weights as arrays (W1 [50, 784], b1, W2 [10, 50], b2)."""
    model = mnist_graph([HIDDEN]).model
    out = []
    for layer in model.layers:
        out.append(np.array([[w.data for w in n.w] for n in layer.neurons]))
        out.append(np.array([n.b.data for n in layer.neurons]))
    return out


def measure_torch(torch, X, labels, batch, repeats, lr):
    """PyTorch float64 on one thread: per-sample (the compiled graph's arithmetic) and batched."""
    import torch.nn.functional as F
    torch.set_num_threads(1)
    Xt = torch.from_numpy(X)
    pixels, onehot = Xt[:, :N_PIXELS], Xt[:, N_PIXELS:]
    dense = torch.from_numpy(np.ascontiguousarray(X[:, :N_PIXELS]))
    targets = torch.from_numpy(labels)
    n = len(X)

    def fresh_params():
        return [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in initial_weights()]

    def logits(params, x):
        W1, b1, W2, b2 = params
        return F.linear(F.relu(F.linear(x, W1, b1)), W2, b2)

    def sgd(params, divisor):
        # the compiled update: p -= lr * (sum of gradients / rows)
        with torch.no_grad():
            for p in params:
                p -= lr * (p.grad / divisor)
                p.grad = None

    def per_sample_step(params, start):
        total = 0.0
        for i in range(start, start + batch):
            loss = -(onehot[i] * F.log_softmax(logits(params, pixels[i]), dim=0)).sum()
            loss.backward()
            total += loss.item()
        sgd(params, batch)
        return total / batch

    def batched_step(params, start):
        loss = F.cross_entropy(logits(params, dense[start:start + batch]), targets[start:start + batch])
        loss.backward()
        sgd(params, 1.0)  # the loss is already the batch mean
        return loss.item()

    rows = []
    for name, step in (('torch per-sample', per_sample_step), ('torch batched', batched_step)):
        params = fresh_params()
        with torch.no_grad():
            loss0 = -(onehot[0] * F.log_softmax(logits(params, pixels[0]), dim=0)).sum().item()
        first = step(params, 0)  # warm-up, from the initial weights
        passes = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for start in range(0, n, batch):
                last = step(params, start)
            passes.append(time.perf_counter() - t0)
        rows.append(throughput(name, 'torch', n, passes, loss0=loss0,
                               first_batch_loss=first, trained_loss=last))
    return rows


# -- compiled builds (each in a worker process) -------------------------------------------


def _accepts(name):
    parameters = inspect.signature(compiler.compile).parameters
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                     for p in parameters.values())


def unsupported_kwargs(entry):
    """The keywords of a build entry that ``compiler.compile`` cannot honour."""
    return [k for k, v in entry.items() if not _accepts(k) and v is not False]


def compile_kwargs(entry, timeout):
    """The keyword arguments for one build: the entry's own, plus the timeout.

    A switch set to ``False`` that the compiler does not know is left out.
    """
    kwargs = {k: v for k, v in entry.items() if _accepts(k) or v is not False}
    kwargs.setdefault('timeout', timeout)
    return kwargs


def compiler_installed(entry):
    try:
        compiler.find_compiler(entry.get('cc'))
    except compiler.CompilerNotFound:
        return False
    return True


def run_build(name, entry, args):
    """Compile one build and time ``train_batch``; runs inside the worker process."""
    import resource
    X, _, _ = load_images(args.data, args.images, args.batch)
    g = mnist_graph([HIDDEN])
    kwargs = compile_kwargs(entry, args.compile_timeout)
    base = row(name, 'compiled', kwargs=entry)
    try:
        m = compiler.compile(g.loss, inputs=g.inputs, params=g.params, outputs=g.logits, **kwargs)
    except compiler.CompileTimeout:
        return dict(base, status='timeout', compile_s=kwargs['timeout'],
                    compiler_peak_mb=_children_peak_mb(resource),
                    note=f"compile did not finish within {kwargs['timeout']:g} s")
    except compiler.BuildError as e:
        return dict(base, status='error', note=str(e).splitlines()[0])
    del g
    gc.collect()

    t = m.timings
    details = dict(kwargs=entry, toolchain=m.build.toolchain.family, version=m.build.toolchain.version,
                   flags=list(m.build.flags), passes=list(m.program.passes), trace_s=t['trace'],
                   passes_s=t.get('passes'), codegen_s=t['codegen'], load_s=t['load'],
                   c_lines=m.source.count('\n'), c_bytes=len(m.source.encode()),
                   compiler_peak_mb=_children_peak_mb(resource))
    if m.build.cached:
        details['note'] = 'cache hit: compile time is not real'

    m.set_input(X[0])
    loss0 = m.forward()
    parts = batches(X, args.batch)
    first = m.train_batch(parts[0], args.lr)  # warm-up, from the initial weights
    passes = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for part in parts:
            last = m.train_batch(part, args.lr)
        passes.append(time.perf_counter() - t0)
    return throughput(name, 'compiled', len(X), passes, compile_s=t['compile'], loss0=loss0,
                      first_batch_loss=first, trained_loss=last, **details)


def _children_peak_mb(resource):
    """Peak resident memory of the largest child so far (the C compiler), or None.

    A child's peak counts from its fork, when it shares this process's memory,
    so a peak not above our own says only "less than this process".
    """
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(child / 1024, 1) if child > own else None


def measure_build(name, args, scratch):
    """Run one build in a worker process in its own session; kill the session afterwards."""
    entry = BUILDS[name]
    if not compiler_installed(entry):
        return row(name, 'compiled', 'not installed', kwargs=entry, note=f"{entry.get('cc')} not found")
    missing = unsupported_kwargs(entry)
    if missing:
        return row(name, 'compiled', 'unsupported', kwargs=entry,
                   note=f"compiler.compile() has no argument {', '.join(map(repr, missing))}")

    out_path = os.path.join(scratch, f'{name}.json')
    cmd = [sys.executable, __file__, '--worker', name, '--worker-out', out_path,
           '--images', str(args.n_images), '--batch', str(args.batch),
           '--repeats', str(args.repeats), '--lr', repr(args.lr),
           '--compile-timeout', repr(args.compile_timeout)]
    if args.data:
        cmd += ['--data', str(args.data)]
    # The compiler's temporary files go to our scratch folder, removed at the end
    # (a timed-out build leaves its folder behind); no build cache.
    env = dict(os.environ, MICROGRAD_CACHE='0', TMPDIR=scratch)
    # A backstop only: the worker enforces the compile timeout itself.
    backstop = args.compile_timeout + 120 + (args.repeats + 1) * args.n_images * 0.01
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=backstop)
    except subprocess.TimeoutExpired:
        kill_process_group(proc)
        proc.communicate()
        return row(name, 'compiled', 'timeout', kwargs=entry,
                   note=f'worker killed after {backstop:.0f} s')
    finally:
        kill_process_group(proc)  # whatever the worker's compiler left running
    if proc.returncode != 0 or not os.path.exists(out_path):
        last = (stderr.strip().splitlines() or [f'exit status {proc.returncode}'])[-1]
        return row(name, 'compiled', 'error', kwargs=entry, note=f'worker failed: {last}')
    with open(out_path) as f:
        return json.load(f)


# -- the report --------------------------------------------------------------------------


def add_ratios(rows):
    """Speedup of each row over PyTorch per-sample and over PyTorch batched."""
    for field, name in (('speedup_vs_torch_per_sample', 'torch per-sample'),
                        ('speedup_vs_torch_batched', 'torch batched')):
        ref = next((r for r in rows if r['name'] == name and r['images_per_s']), None)
        for r in rows:
            if ref and r['images_per_s']:
                r[field] = r['images_per_s'] / ref['images_per_s']


def fmt(x, spec, empty='–'):
    return empty if x is None else format(x, spec)


def ratio(x):
    return fmt(x, '.3g') + 'x' if x else '–'


def table(report):
    m, g, c = report['machine'], report['graph'], report['config']
    versions = ', '.join(f'{k} {v}' for k, v in m['compilers'].items() if v) or 'none'
    lines = [
        f"machine: {m['cpu']} ({', '.join(m['cpu_flags']) or 'no AVX'}), {m['cores']} cores, "
        f"{m['mem_gb']} GB, load {m['loadavg'][0]}",
        f"python {m['python']}, numpy {m['numpy']}, torch {m['torch'] or 'not installed'}, git {m['git']}",
        f"compilers: {versions}",
        f"data: {c['data']}, {c['images']} images, batch {c['batch']}, lr {c['lr']}, "
        f"median of {c['repeats']} passes after one warm-up batch"
        + (' (quick)' if c['quick'] else ''),
        f"graph: build {g['build_s']:.2f} s, trace {g['trace_s']:.2f} s, codegen {g['codegen_s']:.2f} s; "
        f"{g['ops']:,} ops, {g['slots']:,} slots, {g['params']:,} params; "
        f"C {g['c_lines']:,} lines, {g['c_bytes'] / 1e6:.1f} MB",
        '',
    ]
    ref = next((r for r in report['results'] if r['kind'] == 'interpreter'), None)
    head = (f"{'system':<20} {'status':<13} {'C lines':>8} {'compile s':>9} {'cc MB':>6} {'images/s':>10} "
            f"{'s/epoch':>10} {'vs torch/sample':>15} {'vs batched':>10}  {'loss0 - interp':>14}")
    lines += [head, '-' * len(head)]
    for r in report['results']:
        dloss = None
        if ref and ref['loss0'] is not None and r['loss0'] is not None:
            dloss = r['loss0'] - ref['loss0']
        lines.append(
            f"{r['name']:<20} {r['status']:<13} {fmt(r.get('c_lines'), '8,d'):>8} {fmt(r['compile_s'], '9.2f'):>9} "
            f"{fmt(r.get('compiler_peak_mb'), '6.0f'):>6} {fmt(r['images_per_s'], '10,.0f'):>10} "
            f"{fmt(r['s_per_epoch'], '10,.2f'):>10} "
            f"{ratio(r['speedup_vs_torch_per_sample']):>15} {ratio(r['speedup_vs_torch_batched']):>10}  "
            f"{fmt(dloss, '14.2g'):>14}")
    notes = [f"  {r['name']}: {r['note']}" for r in report['results'] if r['note']]
    if notes:
        lines += ['', 'notes:'] + notes
    lines += ['', 's/epoch: 60,000 images extrapolated; vs torch/sample, vs batched: the torch row\'s '
              'seconds / these seconds (same run);',
              'cc MB: peak memory of the C compiler (– when below the worker\'s own); loss0: loss of image 0 at the initial weights; '
              '-vec: the vectorizing pass.']
    return '\n'.join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true',
                   help='CI smoke run: 1,000 images, 2 passes, 1 interpreter image, tcc and clang -O0')
    p.add_argument('--builds', help=f"comma-separated, from: {', '.join(BUILDS)} (default: all; "
                   f"--quick: {', '.join(QUICK_BUILDS)})")
    p.add_argument('--data', type=Path, help='folder with full-size MNIST IDX files (default: embedded set)')
    p.add_argument('--images', type=int, help='training images per pass (default: all; --quick: 1000)')
    p.add_argument('--batch', type=int, default=1000)
    p.add_argument('--repeats', type=int, help='timed passes over the images (default 5; --quick: 2)')
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--interp-images', type=int, help='images through the interpreter (default 3; --quick: 1)')
    p.add_argument('--compile-timeout', type=float, default=300.0, help='seconds per build (default 300)')
    p.add_argument('--no-torch', action='store_true', help='skip PyTorch even if it is installed')
    p.add_argument('--json', type=Path, help='also write the report here')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--worker-out', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.interp_images is None:
        args.interp_images = 1 if args.quick else 3
    if args.images is None and args.quick:
        args.images = 1000
    if args.builds:
        names = [b.strip() for b in args.builds.split(',') if b.strip()]
        unknown = [b for b in names if b not in BUILDS]
        if unknown:
            p.error(f"unknown build {', '.join(unknown)}; choose from {', '.join(BUILDS)}")
        args.builds = names
    else:
        args.builds = list(QUICK_BUILDS if args.quick else BUILDS)
    if args.repeats < 1 or args.batch < 1 or args.interp_images < 1:
        p.error('--repeats, --batch and --interp-images must be at least 1')
    return args


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        result = run_build(args.worker, BUILDS[args.worker], args)
        with open(args.worker_out, 'w') as f:
            json.dump(result, f)
        return 0

    X, labels, source = load_images(args.data, args.images, args.batch)
    args.n_images = len(X)
    report = {'machine': machine(),
              'config': {'data': source, 'images': len(X), 'batch': args.batch, 'repeats': args.repeats,
                         'lr': args.lr, 'interp_images': args.interp_images, 'quick': args.quick,
                         'compile_timeout': args.compile_timeout, 'builds': args.builds,
                         'model': f'{N_PIXELS}-{HIDDEN}-{N_CLASSES} MLP, ReLU, softmax cross-entropy, float64'}}
    log('graph: building, tracing, emitting C')
    report['graph'] = measure_graph()
    gc.collect()
    results = []
    log(f"interpreter: {args.interp_images} image(s)")
    results.append(measure_interpreter(X, args.interp_images, args.lr))
    gc.collect()
    torch = None if args.no_torch else import_torch()
    if torch:
        log(f"torch: per-sample and batched, {len(X)} images x {args.repeats + 1}")
        results.extend(measure_torch(torch, X, labels, args.batch, args.repeats, args.lr))
    else:
        note = 'skipped (--no-torch)' if args.no_torch else 'torch is not importable'
        results += [row(n, 'torch', 'skipped', note=note) for n in ('torch per-sample', 'torch batched')]
    with tempfile.TemporaryDirectory(prefix='bench-mnist-') as scratch:
        for name in args.builds:
            log(f"build {name}: compiling (timeout {args.compile_timeout:g} s) and training")
            t0 = time.perf_counter()
            r = measure_build(name, args, scratch)
            log(f"build {name}: {r['status']} in {time.perf_counter() - t0:.0f} s")
            results.append(r)
    add_ratios(results)
    report['results'] = results
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
