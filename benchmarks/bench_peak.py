"""The machine's ceiling for the exact kernels: double multiply-adds per second
of benchmarks/peak.c (independent products into register accumulators), as
mul then add (what the exact kernels may do) and as FMA (what a BLAS does),
for AVX-512 and AVX2, on 1 thread and on all.

    python benchmarks/bench_peak.py [--threads N] [--seconds S]

bench_mnist.py prints these peaks at the top of its report and each training
row's GMAC/s as a share of the mul+add peak. Each figure is the best timing
round of S seconds: other work on a shared machine only lowers it.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / 'peak.c'
FLAGS = ['-O2', '-ffp-contract=off', '-pthread']


def find_cc():
    for cc in (os.environ.get('CC'), 'clang', 'gcc', 'cc'):
        if cc and subprocess.run(['sh', '-c', f'command -v {cc}'], capture_output=True).returncode == 0:
            return cc
    return None


def measure(threads, seconds=0.3, cc=None):
    """``{'avx512 mul+add': {1: GMAC/s, threads: GMAC/s}, ...}`` for the
    variants this CPU runs, or ``{}`` when there is no C compiler or no x86."""
    cc = cc or find_cc()
    if cc is None:
        return {}
    with tempfile.TemporaryDirectory(prefix='peak-') as tmp:
        exe = Path(tmp) / 'peak'
        built = subprocess.run([cc, *FLAGS, str(SOURCE), '-o', str(exe)], capture_output=True, text=True)
        if built.returncode != 0:
            return {}
        out = subprocess.run([str(exe), str(threads), str(seconds)], capture_output=True, text=True,
                             timeout=60 + 20 * seconds * threads)
    peaks = {}
    for line in out.stdout.splitlines():
        name, t, rate = line.split('\t')
        peaks.setdefault(name, {})[int(t)] = float(rate)
    return peaks


def describe(peaks):
    """One line per variant: ``avx512 mul+add: 1T 21.3, 2T 42.0 GMAC/s``."""
    return [f"{name}: " + ', '.join(f'{t}T {rate:.1f}' for t, rate in sorted(by_t.items())) + ' GMAC/s'
            for name, by_t in peaks.items()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--threads', type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument('--seconds', type=float, default=0.5)
    args = p.parse_args(argv)
    peaks = measure(args.threads, args.seconds)
    if not peaks:
        print('no C compiler, or not an x86-64 CPU: no peaks', file=sys.stderr)
        return 1
    print('\n'.join(describe(peaks)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
