"""MNIST training and predict throughput: our compiled models against PyTorch.

    python benchmarks/bench_mnist.py                      # the three models, embedded digits
    python benchmarks/bench_mnist.py --data /usr/share/datasets/fashion-mnist --images 10000
    python benchmarks/bench_mnist.py --markdown --json bench.json   # the README's tables
    python benchmarks/bench_mnist.py --from-json bench.json --markdown
    python benchmarks/bench_mnist.py --quick              # CI smoke run, well under a minute

For each model (784-50-10, 784-128-10, 784-256-128-10 by default: the
project's MNIST graph, ReLU, softmax cross-entropy, float64), batch-1000 SGD
in seconds per 60,000-image epoch and ``predict`` in images per second, at 1
thread and at all threads (``--threads``, default the cores this process may
use), for our compiled module built by each of ``--builds`` (default clang
and gcc) and for PyTorch float64 written the way a PyTorch user writes it
(``nn.Sequential``, ``F.cross_entropy`` on the batch, ``optim.SGD``) from the
same initial weights. Ratios are taken at equal thread counts, in the same
run; on a shared machine trust them more than the seconds. The settings of
one system take turns pass by pass (1 thread, all, 1 thread, ...), and the
systems of one model take turns ``--rounds`` times, their passes pooled.

Checks, which fail the row and the run (exit status 1): each of our rows
gives the same bits (first-batch loss, parameters and predictions after it)
at 1 thread and at all threads, and the loss of image 0 at the initial
weights equals the interpreter's exactly; PyTorch starts from our weights.

Each system runs in its own worker process and session: a compile that runs
past ``--compile-timeout`` is recorded as a timeout, and whatever the compiler
left running (gcc's ``cc1`` outlives its killed driver) is killed with the
session. Compile times are real (``MICROGRAD_CACHE=0``, never a cache hit).
Also available: ``--torch-per-sample`` (PyTorch one image at a time),
``--interp-images N`` (the interpreter row, timed over N images; it always
runs one image, the reference), straight-line builds (``--builds
tcc-straight,clang-O1-straight --models 784-50-10``).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import bench_peak, bench_report  # noqa: E402
from benchmarks.bench_machine import machine, usable_cores  # noqa: E402
from benchmarks.bench_systems import (BUILDS, MIN_PREDICT_PASS_S, KINDS, compiler_installed,  # noqa: E402
                                      load_rows, merge_rounds, model_sizes, row, run_interpreter,
                                      run_system, unsupported_kwargs)
from compiler.build.process import kill_process_group  # noqa: E402

MODELS = ('784-50-10', '784-128-10', '784-256-128-10')
DEFAULT_BUILDS = ('clang', 'gcc')
QUICK_BUILDS = ('tcc', 'clang-O0')
WORKER_SECONDS_PER_IMAGE = 0.005   # the backstop's allowance per image and pass (a slow build)


def log(message):
    print(message, file=sys.stderr, flush=True)


# -- one system on one model, in a worker process ------------------------------------------


def skipped(model, system, args):
    """The row of a system that cannot run here, or None."""
    if KINDS[system] == 'torch':
        return row(model, system, 'skipped', note='torch is not importable') if find_spec('torch') is None else None
    entry = BUILDS[system]
    if not compiler_installed(entry):
        return row(model, system, 'not installed', kwargs=entry, note=f"{entry.get('cc')} not found")
    missing = unsupported_kwargs(entry)
    if missing:
        return row(model, system, 'unsupported', kwargs=entry,
                   note=f"compiler.compile() has no argument {', '.join(map(repr, missing))}")
    return None


def job(model, system, args, round_number):
    return {'model': model, 'system': system, 'round': round_number, 'data': args.data and str(args.data),
            'images': args.n_images, 'batch': args.batch, 'lr': args.lr, 'seed': args.seed,
            'repeats': args.repeats, 'threads': {'1t': 1, 'all': args.threads},
            'compile_timeout': args.compile_timeout}


def run_worker(work, scratch):
    """Run one job in a worker process in its own session; kill the session afterwards."""
    name = f"{work['model']}-{work['system']}-{work['round']}"
    job_path, out_path = (os.path.join(scratch, f'{name}.{part}.json') for part in ('job', 'out'))
    with open(job_path, 'w') as f:
        json.dump(work, f)
    cmd = [sys.executable, __file__, '--worker', job_path, '--worker-out', out_path]
    # The compiler's temporary files go to our scratch folder, removed at the end
    # (a timed-out build leaves its folder behind); no build cache.
    env = dict(os.environ, MICROGRAD_CACHE='0', TMPDIR=scratch)
    # A backstop only: the worker enforces the compile timeout itself.
    passes = 2 * (work['repeats'] + 2)
    backstop = (work['compile_timeout'] + 120 + passes * MIN_PREDICT_PASS_S
                + passes * work['images'] * WORKER_SECONDS_PER_IMAGE)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=backstop)
    except subprocess.TimeoutExpired:
        kill_process_group(proc)
        proc.communicate()
        return row(work['model'], work['system'], 'timeout', note=f'worker killed after {backstop:.0f} s')
    finally:
        kill_process_group(proc)  # whatever the worker's compiler left running
    if proc.returncode != 0 or not os.path.exists(out_path):
        last = (stderr.strip().splitlines() or [f'exit status {proc.returncode}'])[-1]
        return row(work['model'], work['system'], 'error', note=f'worker failed: {last}')
    with open(out_path) as f:
        return json.load(f)


def worker(job_path, out_path):
    with open(job_path) as f:
        work = json.load(f)
    result = run_system(work)
    with open(out_path, 'w') as f:
        json.dump(result, f)
    return 0


# -- the run -------------------------------------------------------------------------------


def systems(args):
    torch = [] if args.no_torch else ['torch', 'torch-per-sample'] if args.torch_per_sample else ['torch']
    return torch + args.builds


def summary(r):
    if r['status'] != 'ok':
        return f"{r['status']}: {r['note']}"
    per_thread = ', '.join(f"{label} {r[f'train_{label}']['s_per_epoch']:.3f}"
                           for label in bench_report.THREAD_LABELS if r.get(f'train_{label}'))
    return f"ok, s/epoch {per_thread}"


def run_model(model, X, args, scratch):
    """The rows of one model: the interpreter (here), then every system in a
    worker, all of them in turn ``--rounds`` times (so that a slow spell of
    the machine hits every system), each system's rounds merged into one row."""
    log(f"{model} interpreter: {args.interp_images} image(s)")
    rows = [run_interpreter(model, X, args.interp_images, args.seed)]
    rounds = {system: [] for system in systems(args)}
    for n in range(1, args.rounds + 1):
        for system, done in rounds.items():
            t0 = time.perf_counter()
            r = skipped(model, system, args) or run_worker(job(model, system, args, n), scratch)
            log(f"{model} {system} round {n}: {summary(r)} ({time.perf_counter() - t0:.0f} s)")
            done.append(r)
    return rows + [merge_rounds(done) for done in rounds.values()]


def config(args, n_images, source):
    return {'data': source, 'images': n_images, 'batch': args.batch, 'lr': args.lr, 'seed': args.seed,
            'repeats': args.repeats, 'rounds': args.rounds, 'threads': {'1t': 1, 'all': args.threads},
            'models': args.models,
            'builds': args.builds, 'systems': systems(args), 'interp_images': args.interp_images,
            'quick': args.quick, 'compile_timeout': args.compile_timeout,
            'min_predict_pass_s': MIN_PREDICT_PASS_S}


def run(args):
    X, source = load_rows(args.data, args.images, args.batch)
    args.n_images = len(X)
    report = {'machine': machine(), 'config': config(args, len(X), source), 'results': []}
    report['machine']['peaks'] = bench_peak.measure(args.threads, 0.1 if args.quick else 0.3)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='bench-mnist-') as scratch:
        for model in args.models:
            report['results'] += run_model(model, X, args, scratch)
    report['seconds'] = time.perf_counter() - t0
    report['machine']['loadavg_end'] = [round(x, 2) for x in os.getloadavg()]
    bench_report.analyse(report)
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true',
                   help=f"CI smoke run: {MODELS[0]}, 1,000 images, 2 passes, 1 round, builds {','.join(QUICK_BUILDS)}")
    p.add_argument('--models', help=f"comma-separated layer sizes (default: {','.join(MODELS)})")
    p.add_argument('--builds', help=f"comma-separated, from: {', '.join(BUILDS)} "
                   f"(default: {','.join(DEFAULT_BUILDS)}; --quick: {','.join(QUICK_BUILDS)})")
    p.add_argument('--data', type=Path, help='folder with full-size MNIST IDX files (default: embedded set)')
    p.add_argument('--images', type=int, help='training images per pass (default: all; --quick: 1000)')
    p.add_argument('--batch', type=int, default=1000)
    p.add_argument('--repeats', type=int, help='timed passes per thread setting and round (default 7; --quick: 2)')
    p.add_argument('--rounds', type=int, help='times every system runs on a model, in turn (default 3; --quick: 1)')
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--seed', type=int, default=0, help='initial weights (mnist_graph seed)')
    p.add_argument('--threads', type=int, default=usable_cores(),
                   help='"all threads" (default: the cores this process may use)')
    p.add_argument('--torch-per-sample', action='store_true', help='also PyTorch one image at a time')
    p.add_argument('--interp-images', type=int, default=1, help='images through the interpreter (default 1)')
    p.add_argument('--compile-timeout', type=float, default=300.0, help='seconds per build (default 300)')
    p.add_argument('--no-torch', action='store_true', help='skip PyTorch even if it is installed')
    p.add_argument('--json', type=Path, help='also write the whole report here')
    p.add_argument('--markdown', action='store_true', help="print the README's tables instead of the text table")
    p.add_argument('--from-json', type=Path, help='print the tables of a report written by --json; run nothing')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--worker-out', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.images is None and args.quick:
        args.images = 1000
    args.models = names(p, args.models, MODELS[:1] if args.quick else MODELS, check_model)
    args.builds = names(p, args.builds, QUICK_BUILDS if args.quick else DEFAULT_BUILDS, check_build)
    if min(args.repeats, args.rounds, args.batch, args.interp_images, args.threads) < 1:
        p.error('--repeats, --rounds, --batch, --interp-images and --threads must be at least 1')
    return args


def check_model(name):
    model_sizes(name)


def check_build(name):
    if name not in BUILDS:
        raise ValueError(f"unknown build {name}; choose from {', '.join(BUILDS)}")


def names(parser, given, default, check):
    """A comma-separated option as a list (``default`` when not given), each checked."""
    chosen = [s.strip() for s in given.split(',') if s.strip()] if given else list(default)
    for name in chosen:
        try:
            check(name)
        except ValueError as e:
            parser.error(str(e))
    return chosen


def render(report, markdown):
    return bench_report.markdown(report) if markdown else bench_report.text(report)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker, args.worker_out)
    if args.from_json:
        print(render(json.loads(args.from_json.read_text()), args.markdown))
        return 0
    report = run(args)
    print(render(report, args.markdown))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + '\n')
    if report['failures']:
        log('FAILED:\n  ' + '\n  '.join(report['failures']))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
