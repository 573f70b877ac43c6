"""The MatVec loops alone (forward and weight gradient of a 784 x R layer over
256 Fashion-MNIST rows), this checkout against another, alternating, in CPU
time: the A/B of a kernel change without the rest of a training step.

    python benchmarks/bench_kernels.py --data /usr/share/datasets/fashion-mnist \\
        --against /path/to/other/checkout [--sizes 50,128,256] [--isa avx512,avx2] [--rounds 3]

Prints per size and instruction set each checkout's best milliseconds and
dense-equivalent GMAC/s, and the ratio (other / this). Both checkouts must
give the same checksum of the outputs (the same bits).
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
            'from compiler.codegen import _kernels; from compiler.templates import read_template;'
            'a, c = _kernels(True); sys.stdout.write(read_template("prelude.c") + "\\n" + a + "\\n" + c)')
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
    p.add_argument('--data', type=Path, required=True, help='folder with Fashion-MNIST (or MNIST) IDX files')
    p.add_argument('--against', type=Path, required=True, help='another checkout of this project')
    p.add_argument('--sizes', default='50,128,256')
    p.add_argument('--isa', default='avx512,avx2')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--cc', default='clang')
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import mnist_data
    images, _ = mnist_data.load(args.data)['train']
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
                        fwd, bgw, checksum = float(out[2]), float(out[4]), out[6].strip()
                        b = best.setdefault((isa, int(R), who), [fwd, bgw, checksum])
                        b[0], b[1] = min(b[0], fwd), min(b[1], bgw)
                        if b[2] != checksum:
                            raise SystemExit(f'{who} {isa} R={R}: the outputs changed between runs')
    print('isa     R   fwd ms this / other (ratio)     bgw ms this / other (ratio)   same bits')
    for isa in args.isa.split(','):
        for R in map(int, args.sizes.split(',')):
            t, o = best[isa, R, 'this'], best[isa, R, 'other']
            print(f'{isa:7} {R:3}   {t[0]:6.3f} / {o[0]:6.3f} ({o[0] / t[0]:.2f}x)'
                  f'      {t[1]:6.3f} / {o[1]:6.3f} ({o[1] / t[1]:.2f}x)    {"yes" if t[2] == o[2] else "NO"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
