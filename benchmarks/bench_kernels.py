"""The MatVec loops alone (forward and weight gradient of a 784 x R layer over
256 Fashion-MNIST rows, and an input gradient of the same shape), this
checkout against another, alternating, in CPU time: the A/B of a kernel
change without the rest of a training step.

    python benchmarks/bench_kernels.py --data /usr/share/datasets/fashion-mnist \\
        --against /path/to/other/checkout [--sizes 50,128,256] [--isa avx512,avx2] [--rounds 3]

Prints per size and instruction set each checkout's best milliseconds, the
ratio (other / this) and the GMAC/s the loops executed (after skipping
zeros). Both checkouts must give the same checksum of the outputs (the same
bits).
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HARNESS = Path(__file__).resolve().parent / 'kernel_loops.c'


def kernels_source(checkout):
    """The kernels' C of a checkout (its prelude, interface and loops)."""
    code = ('import sys; sys.path.insert(0, sys.argv[1]);'
            'from compiler.codegen.module import _kernels, prologue; from compiler.constants import C_DEFINES;'
            'from compiler.templates import read_template;'
            'defs = "\\n".join(f"#define {k} {v}" for k, v in C_DEFINES.items());'
            'sys.stdout.write("\\n".join([prologue(defs, python=False), read_template("contract.h"),'
            ' read_template("kernels_api.c"), _kernels()]))')
    return subprocess.run([sys.executable, '-c', code, str(checkout)], check=True, capture_output=True,
                          text=True, cwd=checkout).stdout


def build(checkout, tmp, name, cc):
    src = Path(tmp) / f'{name}_kernels.c'
    src.write_text(kernels_source(checkout))
    exe = Path(tmp) / name
    subprocess.run([cc, '-O2', '-ffp-contract=off', f'-DKERNELS="{src}"', str(HARNESS), '-o', str(exe), '-lm',
                    '-lpthread'], check=True)
    return exe


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--data', type=Path, help='folder with Fashion-MNIST (or MNIST) IDX files (default: the '
                   'embedded digits)')
    p.add_argument('--against', type=Path, required=True, help='another checkout of this project')
    p.add_argument('--sizes', default='50,128,256')
    p.add_argument('--isa', default='avx512,avx2')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--cc', default='clang')
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import mnist_data
    images, _ = (mnist_data.load(args.data) if args.data else mnist_data.load_embedded())['train']
    import numpy as np
    rows = np.asarray(images[:256], dtype=np.float64).reshape(256, -1) / 255.0
    with tempfile.TemporaryDirectory(prefix='kernels-') as tmp:
        data = Path(tmp) / 'rows.bin'
        rows.tofile(data)
        exes = {'this': build(REPO, tmp, 'this', args.cc), 'other': build(args.against, tmp, 'other', args.cc)}
        best = {}
        for _ in range(args.rounds):
            for isa in args.isa.split(','):
                for R in args.sizes.split(','):
                    for who, exe in exes.items():
                        out = subprocess.run([str(exe), str(data), R, isa], check=True, capture_output=True,
                                             text=True).stdout.split('\t')
                        ms = [float(out[2]), float(out[4]), float(out[9]) if len(out) > 9 else float('nan')]
                        rate = [float(out[7]), float(out[8]), float(out[10])] if len(out) > 9 else [0.0] * 3
                        checksum = out[6].strip()
                        b = best.setdefault((isa, int(R), who), [ms, rate, checksum])
                        for i in range(3):
                            if ms[i] < b[0][i]:
                                b[0][i], b[1][i] = ms[i], rate[i]
                        if b[2] != checksum:
                            raise SystemExit(f'{who} {isa} R={R}: the outputs changed between runs')
    print('ms this / other (ratio) [executed GMAC/s this / other]')
    print('isa     R   forward                           weight gradient                   input gradient'
          '                    same bits')
    for isa in args.isa.split(','):
        for R in map(int, args.sizes.split(',')):
            t, o = best[isa, R, 'this'], best[isa, R, 'other']
            cells = [f'{t[0][i]:6.3f} / {o[0][i]:6.3f} ({o[0][i] / t[0][i]:.2f}x) [{t[1][i]:4.1f}/{o[1][i]:4.1f}]'
                     for i in range(3)]
            print(f'{isa:7} {R:3}   ' + '   '.join(cells) + f'   {"yes" if t[2] == o[2] else "NO"}')
    return best


if __name__ == '__main__':
    main()
